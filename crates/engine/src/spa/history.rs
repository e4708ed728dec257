//! The pool's command history (`oxpool history`, as `zpool history`): one record per command
//! that changed the pool (when, which txg wrote it, who, on which host, the command line),
//! stored in the pool, so it travels with the pool to another host.
//!
//! Records wait in memory until the next txg sync, which writes them into `History` chunks
//! of at most `TABLE_CHUNK_ENTRIES_MAX` records (format version 8): the last chunk is
//! rewritten with the new records while it has room (its old block freed in the same txg),
//! and new chunks follow. So a command's record is durable with the txg that follows it, as
//! the command's own changes are (a command syncs before it returns).
//!
//! Bounded, as ZFS bounds its history: the first chunk, which holds the pool's creation,
//! stays for good; the oldest chunks after it go once [`HISTORY_CHUNKS_MAX`] are stored. The
//! records waiting for a sync are bounded too ([`HISTORY_PENDING_MAX`]): an administrator
//! cannot queue commands faster than txgs sync, but a caller could.
//!
//! A history chunk that cannot be read (damaged on every copy) never stops the pool: the
//! listing says which chunk, and new records go into a new chunk after it.

use crate::spa::block::{write_meta_chunk, META_COPIES};
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_block;
use crate::{EngineError, Result};
use oxpool_format::{
    decode_history_chunk, encode_history_chunk, BlockPtr, BlockType, Dva, HistoryRecordMeta,
    TableChunkMeta, Txg, HISTORY_HOST_BYTES_MAX, HISTORY_LINE_BYTES_MAX, TABLE_CHUNK_ENTRIES_MAX,
};

/// Most history chunks a pool keeps (the first and the latest; about 2,000 records).
pub const HISTORY_CHUNKS_MAX: usize = 32;

/// Most records waiting for the next sync; beyond it the oldest waiting are dropped (and
/// counted in the listing).
pub const HISTORY_PENDING_MAX: usize = 256;

// A chunk of the longest records fits one allocation on any vdev: half a 256 KiB slab, the
// data share of the narrowest raidz (raidz1 of two devices). Raising a bound past it would
// make the sync's allocation fail.
const _: () = assert!(
    TABLE_CHUNK_ENTRIES_MAX * (HISTORY_LINE_BYTES_MAX + HISTORY_HOST_BYTES_MAX + 64)
        <= oxpool_format::META_PIECE_BYTES_MAX / 2
);

/// One command of the history, as [`crate::Pool::history`] lists it.
pub type HistoryRecord = HistoryRecordMeta;

/// What [`crate::Pool::history`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryListing {
    /// The records, oldest first (those waiting for the next sync last).
    pub records: Vec<HistoryRecord>,
    /// Chunks that could not be read, each with why (their records are missing above).
    pub unreadable: Vec<String>,
    /// Records dropped before they were written (more waited for a sync than the bound).
    pub dropped: u64,
}

/// The last chunk's records, which the next records join while it has room.
#[derive(Clone, Debug)]
enum Tail {
    /// Not read yet (read by the first sync that adds records).
    Unread,
    /// Read (empty: no chunk yet).
    Read(Vec<HistoryRecordMeta>),
}

/// The pool's history in memory: its chunks as stored and the records waiting.
#[derive(Debug)]
pub(crate) struct History {
    chunks: Vec<TableChunkMeta>,
    tail: Tail,
    pending: Vec<HistoryRecordMeta>,
    dropped: u64,
}

impl History {
    /// The history of a new pool: nothing stored.
    pub(crate) fn new() -> History {
        History::stored(Vec::new())
    }

    /// The history as the pool's metadata lists it at import.
    pub(crate) fn stored(chunks: Vec<TableChunkMeta>) -> History {
        let tail = if chunks.is_empty() {
            Tail::Read(Vec::new())
        } else {
            Tail::Unread
        };
        History {
            chunks,
            tail,
            pending: Vec::new(),
            dropped: 0,
        }
    }

    /// The chunks as stored now (for the pool's metadata, the audit and the scrub).
    pub(crate) fn chunks(&self) -> &[TableChunkMeta] {
        &self.chunks
    }

    /// The chunks' blocks.
    pub(crate) fn blocks(&self) -> Vec<BlockPtr> {
        self.chunks.iter().map(|c| c.chunk).collect()
    }

    /// Adds a record for the next sync to write (its txg is set then).
    pub(crate) fn record(&mut self, mut record: HistoryRecordMeta) {
        cut(&mut record.line, HISTORY_LINE_BYTES_MAX);
        cut(&mut record.host, HISTORY_HOST_BYTES_MAX);
        if self.pending.len() >= HISTORY_PENDING_MAX {
            self.pending.remove(0);
            self.dropped += 1;
        }
        self.pending.push(record);
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary, ending it with `...` if cut.
fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("...");
}

/// Reads and decodes one history chunk.
async fn read_chunk(spa: &Spa, c: &TableChunkMeta, what: &str) -> Result<Vec<HistoryRecordMeta>> {
    let buf = read_block(&spa.zio, IoClass::SyncRead, &c.chunk, what).await?;
    let psize = (c.chunk.psize_bytes as usize).min(buf.len());
    let corrupt = |source| EngineError::Corrupt {
        device: spa.name.clone(),
        what: what.into(),
        source,
    };
    let records = decode_history_chunk(&buf[..psize]).map_err(corrupt)?;
    if records.len() != c.entries as usize {
        return Err(corrupt(oxpool_format::FormatError::BadField {
            field: "history chunk records",
            value: records.len() as u64,
        }));
    }
    Ok(records)
}

/// Writes the records waiting into txg `txg`'s history chunks (see the module docs); the
/// places of the chunks replaced or dropped go to `freed`.
pub(crate) async fn sync_history(spa: &Spa, txg: Txg, freed: &mut Vec<Dva>) -> Result<()> {
    // Copied under the lock, written without it; the records written leave the waiting
    // list only once their chunks are in the list (so a listing meanwhile shows them, and a
    // failed write leaves them waiting). Records added meanwhile wait for the next sync.
    let (mut chunks, tail, pending, dropped) = {
        let h = spa.history.lock().unwrap();
        if h.pending.is_empty() {
            return Ok(());
        }
        (
            h.chunks.clone(),
            h.tail.clone(),
            h.pending.clone(),
            h.dropped,
        )
    };
    let (tail, replaced) = write_chunks(spa, txg, &mut chunks, tail, &pending).await?;
    freed.extend(replaced);
    let mut h = spa.history.lock().unwrap();
    // Records dropped meanwhile (the bound) were the oldest waiting: among those written.
    let gone = (h.dropped - dropped) as usize;
    let written = pending.len().saturating_sub(gone).min(h.pending.len());
    h.pending.drain(..written);
    h.chunks = chunks;
    h.tail = Tail::Read(tail);
    Ok(())
}

/// Appends `pending` (stamped with `txg`) to `chunks`: into the last chunk while it has
/// room, then new ones; drops the oldest after the first beyond [`HISTORY_CHUNKS_MAX`].
/// Returns the last chunk's records and the places no longer referenced.
async fn write_chunks(
    spa: &Spa,
    txg: Txg,
    chunks: &mut Vec<TableChunkMeta>,
    tail: Tail,
    pending: &[HistoryRecordMeta],
) -> Result<(Vec<HistoryRecordMeta>, Vec<Dva>)> {
    let tail = match tail {
        Tail::Read(records) => Some(records),
        Tail::Unread => match chunks.last() {
            Some(last) => match read_chunk(spa, last, "history").await {
                Ok(records) => Some(records),
                // Left as it is (the listing names it); the records go into a new chunk.
                Err(e) => {
                    tracing::warn!(
                        pool = spa.name,
                        "history: its last chunk is unreadable ({e}); new records start a new \
                         chunk"
                    );
                    None
                }
            },
            None => Some(Vec::new()),
        },
    };
    let mut replaced: Vec<Dva> = Vec::new();
    let mut records = match tail {
        Some(records) if records.len() < TABLE_CHUNK_ENTRIES_MAX && !chunks.is_empty() => {
            let last = chunks.pop().expect("checked not empty");
            replaced.extend_from_slice(last.chunk.dvas());
            records
        }
        _ => Vec::new(),
    };
    records.extend(
        pending
            .iter()
            .cloned()
            .map(|r| HistoryRecordMeta { txg, ..r }),
    );
    let mut last = Vec::new();
    // Bounded: the records fill at most HISTORY_PENDING_MAX / TABLE_CHUNK_ENTRIES_MAX + 1.
    for piece in records.chunks(TABLE_CHUNK_ENTRIES_MAX) {
        let bytes = encode_history_chunk(piece);
        let records = piece.len() as u64;
        let chunk =
            write_meta_chunk(spa, &bytes, BlockType::History, META_COPIES, txg, records).await?;
        chunks.push(TableChunkMeta {
            chunk,
            entries: piece.len() as u32,
        });
        last = piece.to_vec();
    }
    // The pool's creation stays: the oldest after it go.
    while chunks.len() > HISTORY_CHUNKS_MAX {
        let gone = chunks.remove(1);
        replaced.extend_from_slice(gone.chunk.dvas());
    }
    debug_assert!(chunks
        .iter()
        .all(|c| c.entries as usize <= TABLE_CHUNK_ENTRIES_MAX));
    Ok((last, replaced))
}

/// Reads and verifies every stored chunk (the audit): how many were read, and a line for
/// each that fails.
pub(crate) async fn verify(spa: &Spa) -> (u64, Vec<String>) {
    let chunks = spa.history.lock().unwrap().chunks.clone();
    let mut problems = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let what = format!("history chunk {} of {}", i + 1, chunks.len());
        if let Err(e) = read_chunk(spa, c, &what).await {
            problems.push(format!("{what}: {e}"));
        }
    }
    (chunks.len() as u64, problems)
}

/// The whole history (see [`crate::Pool::history`]).
pub(crate) async fn list(spa: &Spa) -> HistoryListing {
    let (chunks, tail, pending, dropped) = {
        let h = spa.history.lock().unwrap();
        (
            h.chunks.clone(),
            h.tail.clone(),
            h.pending.clone(),
            h.dropped,
        )
    };
    let mut listing = HistoryListing {
        dropped,
        ..HistoryListing::default()
    };
    let stored = chunks.len();
    for (i, c) in chunks.iter().enumerate() {
        if let (true, Tail::Read(records)) = (i + 1 == stored, &tail) {
            listing.records.extend(records.iter().cloned());
            continue;
        }
        let what = format!("history chunk {} of {stored}", i + 1);
        match read_chunk(spa, c, &what).await {
            Ok(records) => listing.records.extend(records),
            Err(e) => listing.unreadable.push(format!("{what}: {e}")),
        }
    }
    listing.records.extend(pending);
    listing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_on_a_character_boundary() {
        let mut s = "é".repeat(10);
        cut(&mut s, 8);
        assert_eq!(s, "éé...");
        assert!(s.len() <= 8);
        let mut short = "oxpool sync".to_string();
        cut(&mut short, 64);
        assert_eq!(short, "oxpool sync");
    }

    #[test]
    fn pending_records_are_bounded_and_the_oldest_dropped_are_counted() {
        let mut h = History::new();
        for i in 0..HISTORY_PENDING_MAX + 3 {
            h.record(HistoryRecordMeta {
                time_s: i as u64,
                txg: Txg(0),
                uid: 0,
                host: "h".into(),
                line: format!("oxpool sync {i}"),
            });
        }
        assert_eq!(h.pending.len(), HISTORY_PENDING_MAX);
        assert_eq!(h.dropped, 3);
        assert_eq!(h.pending[0].time_s, 3);
    }
}
