//! A dataset's tables (its snapshots, its bookmarks) in blocks of their own.
//!
//! The pool's metadata block is rewritten every txg, so what it holds must stay small: a
//! dataset's records go into table chunks of at most `TABLE_CHUNK_ENTRIES_MAX` records each,
//! and the metadata holds only the chunks' pointers. A txg that changes the records rewrites
//! the chunks whose bytes changed and keeps the others' blocks: creating the thousandth
//! snapshot writes one chunk, as creating the first does (issue 16's create-time goal).
//!
//! Chunks are ranges of records by txg (records are kept oldest first): a record belongs to
//! the last chunk whose first record is not younger than it, so adding or removing one
//! record leaves every other chunk's contents, and so its bytes, as they were. A chunk that
//! outgrows the limit is split; two neighbours that together fill at most half of one are
//! joined, which bounds the chunks to about two per `TABLE_CHUNK_ENTRIES_MAX / 2` records.

use crate::dsl::snapshot::Lineage;
use crate::spa::block::write_meta_chunk;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_block;
use crate::{EngineError, Result};
use oxpool_format::{
    checksum, decode_bookmark_chunk, decode_snapshot_chunk, BlockPtr, BlockType, ChecksumType,
    DatasetMeta, Dva, TableChunkMeta, Txg, TABLE_CHUNK_ENTRIES_MAX,
};
use std::ops::Range;

/// One table's chunks as stored: each chunk's pointer, its record count, and the txg of its
/// first record (where its range of records starts).
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    chunks: Vec<(TableChunkMeta, Txg)>,
}

impl Table {
    /// A table as read at import: its chunks with their first records' txgs.
    pub(crate) fn loaded(chunks: Vec<(TableChunkMeta, Txg)>) -> Table {
        Table { chunks }
    }

    /// The chunks' records, for the pool's metadata.
    pub(crate) fn meta(&self) -> Vec<TableChunkMeta> {
        self.chunks.iter().map(|(c, _)| *c).collect()
    }

    /// The chunks' blocks (for the audit and scrub).
    pub(crate) fn blocks(&self) -> impl Iterator<Item = &BlockPtr> {
        self.chunks.iter().map(|(c, _)| &c.chunk)
    }

    /// The ranges of `txgs` (records' txgs, non-decreasing) that make the chunks when this
    /// table holds those records: every chunk's start kept, then split and joined as the
    /// module comment says.
    fn partition(&self, txgs: &[Txg]) -> Vec<Range<usize>> {
        debug_assert!(
            txgs.windows(2).all(|w| w[0] <= w[1]),
            "records out of order"
        );
        let mut ranges: Vec<Range<usize>> = Vec::new();
        let mut start = 0;
        // Each old chunk's start (after the first, which takes everything older too).
        for (_, first) in self.chunks.iter().skip(1) {
            let end = start + txgs[start..].partition_point(|t| t < first);
            ranges.push(start..end);
            start = end;
        }
        ranges.push(start..txgs.len());
        let mut out: Vec<Range<usize>> = Vec::new();
        for r in ranges.into_iter().filter(|r| !r.is_empty()) {
            // Bounded by the records: each piece takes at least one.
            let mut s = r.start;
            while s < r.end {
                let e = (s + TABLE_CHUNK_ENTRIES_MAX).min(r.end);
                match out.last_mut() {
                    Some(last) if last.len() + (e - s) <= TABLE_CHUNK_ENTRIES_MAX / 2 => {
                        last.end = e;
                    }
                    _ => out.push(s..e),
                }
                s = e;
            }
        }
        out
    }

    /// Plans the table of `records` (oldest first; `txg_of` gives each one's txg), without
    /// I/O, so that it runs under the records' lock: a chunk that holds the same records as a
    /// stored one, none of them `changed`, keeps its block without being encoded (unless
    /// `moved`: records were inserted or removed, so no chunk is known to be the same
    /// without its bytes); the others are encoded by `encode`, and keep a stored block whose
    /// bytes they equal.
    pub(crate) fn plan<R>(
        &self,
        records: &[R],
        txg_of: impl Fn(&R) -> Txg,
        changed: impl Fn(&R) -> bool,
        moved: bool,
        encode: impl Fn(&[R]) -> Vec<u8>,
    ) -> TablePlan {
        let txgs: Vec<Txg> = records.iter().map(txg_of).collect();
        let mut kept = vec![false; self.chunks.len()];
        let mut chunks = Vec::new();
        // Stored chunks in order, walked along with the ranges (both by txg).
        let mut next_old = 0;
        for range in self.partition(&txgs) {
            let first = txgs[range.start];
            let entries = range.len() as u32;
            while next_old < self.chunks.len() && self.chunks[next_old].1 < first {
                next_old += 1;
            }
            let same_place = self
                .chunks
                .get(next_old)
                .is_some_and(|(c, t)| *t == first && c.entries == entries);
            if !moved && same_place && !records[range.clone()].iter().any(&changed) {
                kept[next_old] = true;
                chunks.push((first, Planned::Keep(next_old)));
                continue;
            }
            let bytes = encode(&records[range]);
            let sum = checksum(ChecksumType::Xxh3_128, &bytes);
            let same = self.chunks.iter().enumerate().position(|(i, (c, _))| {
                !kept[i]
                    && c.chunk.checksum == sum
                    && c.chunk.psize_bytes as usize == bytes.len()
                    && c.entries == entries
            });
            match same {
                Some(i) => {
                    kept[i] = true;
                    chunks.push((first, Planned::Keep(i)));
                }
                None => chunks.push((first, Planned::New { bytes, entries })),
            }
        }
        TablePlan { chunks, kept }
    }

    /// Carries out `plan` (made by [`Table::plan`] of this table) for txg `txg`: writes its
    /// new chunks, and puts the stored ones no longer used in `freed`. Returns the new
    /// table.
    pub(crate) async fn write(
        &self,
        spa: &Spa,
        txg: Txg,
        copies: usize,
        block_type: BlockType,
        plan: TablePlan,
        freed: &mut Vec<Dva>,
    ) -> Result<Table> {
        let mut chunks = Vec::with_capacity(plan.chunks.len());
        for (first, planned) in plan.chunks {
            let (bytes, entries) = match planned {
                Planned::Keep(i) => {
                    chunks.push((self.chunks[i].0, first));
                    continue;
                }
                Planned::New { bytes, entries } => (bytes, entries),
            };
            let records = u64::from(entries);
            let chunk = write_meta_chunk(spa, &bytes, block_type, copies, txg, records).await?;
            chunks.push((TableChunkMeta { chunk, entries }, first));
        }
        for ((c, _), kept) in self.chunks.iter().zip(&plan.kept) {
            if !kept {
                freed.extend_from_slice(c.chunk.dvas());
            }
        }
        Ok(Table { chunks })
    }
}

/// A chunk of a planned table.
#[derive(Debug)]
enum Planned {
    /// The stored chunk at this index, as it is.
    Keep(usize),
    /// A new chunk of these bytes and records.
    New { bytes: Vec<u8>, entries: u32 },
}

/// What [`Table::plan`] decided: the chunks in order with their first records' txgs, and
/// which stored chunks are kept.
#[derive(Debug)]
pub(crate) struct TablePlan {
    chunks: Vec<(Txg, Planned)>,
    kept: Vec<bool>,
}

#[cfg(test)]
impl TablePlan {
    /// The chunks to write.
    pub(crate) fn new_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|(_, p)| matches!(p, Planned::New { .. }))
            .count()
    }
}

/// What the audit needs of a lineage's tables, taken under its lock (the audit reads
/// blocks without holding it).
pub(crate) struct TablesView {
    snapshot_table: Table,
    bookmark_table: Table,
    dirty: bool,
    snapshots: Vec<(oxpool_format::Guid, Txg)>,
    bookmarks: Vec<oxpool_format::BookmarkMeta>,
}

impl TablesView {
    /// `l`'s tables and records now.
    pub(crate) fn of(l: &Lineage) -> TablesView {
        TablesView {
            snapshot_table: l.snapshot_table.clone(),
            bookmark_table: l.bookmark_table.clone(),
            dirty: l.tables_dirty(),
            snapshots: l.snapshots().iter().map(|s| (s.guid, s.txg)).collect(),
            bookmarks: l.bookmarks().to_vec(),
        }
    }

    /// Every chunk's block.
    pub(crate) fn blocks(&self) -> impl Iterator<Item = &BlockPtr> {
        self.snapshot_table
            .blocks()
            .chain(self.bookmark_table.blocks())
    }

    /// Reads and decodes every chunk and, when no change waits to be written, compares the
    /// records read with those in memory. Returns the problems found, each naming `what`.
    pub(crate) async fn audit(&self, spa: &Spa, what: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let snaps = read_table(
            spa,
            &self.snapshot_table.meta(),
            "snapshot table",
            decode_snapshot_chunk,
            |r| r.txg,
        )
        .await;
        let marks = read_table(
            spa,
            &self.bookmark_table.meta(),
            "bookmark table",
            decode_bookmark_chunk,
            |r| r.txg,
        )
        .await;
        match (snaps, marks) {
            (Ok((_, snaps)), Ok((_, marks))) if !self.dirty => {
                let stored: Vec<_> = snaps.iter().map(|s| (s.guid, s.txg)).collect();
                if stored != self.snapshots {
                    problems.push(format!(
                        "{what}: snapshot table holds {} snapshots, memory {}",
                        stored.len(),
                        self.snapshots.len()
                    ));
                }
                if marks != self.bookmarks {
                    problems.push(format!(
                        "{what}: bookmark table holds {} bookmarks, memory {}",
                        marks.len(),
                        self.bookmarks.len()
                    ));
                }
            }
            (Ok(_), Ok(_)) => {}
            (Err(e), _) | (_, Err(e)) => problems.push(format!("{what}: {e}")),
        }
        problems
    }
}

/// Reads dataset record `m`'s tables and returns its lineage (a version 3 record's snapshots
/// are inline: its tables are empty, and written by the next sync).
pub(crate) async fn load_lineage(spa: &Spa, m: &DatasetMeta) -> Result<Lineage> {
    let (snapshot_table, snapshots) = read_table(
        spa,
        &m.snapshot_table,
        "snapshot table",
        decode_snapshot_chunk,
        |r| r.txg,
    )
    .await?;
    let (bookmark_table, bookmarks) = read_table(
        spa,
        &m.bookmark_table,
        "bookmark table",
        decode_bookmark_chunk,
        |r| r.txg,
    )
    .await?;
    let corrupt = |why: String| EngineError::Corrupt {
        device: spa.name.clone(),
        what: "snapshot table".into(),
        source: oxpool_format::FormatError::Payload(why),
    };
    if !snapshots.windows(2).all(|w| w[0].txg < w[1].txg) {
        return Err(corrupt("snapshots out of txg order".into()));
    }
    if !bookmarks
        .windows(2)
        .all(|w| (w[0].txg, &w[0].name) < (w[1].txg, &w[1].name))
    {
        return Err(corrupt("bookmarks out of order".into()));
    }
    Ok(Lineage::from_meta(
        m,
        snapshot_table,
        snapshots,
        bookmark_table,
        bookmarks,
    ))
}

/// Reads one table's chunks: the records, oldest first, and the table as stored.
pub(crate) async fn read_table<T>(
    spa: &Spa,
    chunks: &[TableChunkMeta],
    what: &str,
    decode: impl Fn(&[u8]) -> std::result::Result<Vec<T>, oxpool_format::FormatError>,
    txg_of: impl Fn(&T) -> Txg,
) -> Result<(Table, Vec<T>)> {
    let corrupt = |source| EngineError::Corrupt {
        device: spa.name.clone(),
        what: what.into(),
        source,
    };
    let mut table = Vec::with_capacity(chunks.len());
    let mut records = Vec::new();
    // Bounded by the chunks the metadata lists.
    for c in chunks {
        let buf = read_block(&spa.zio, IoClass::SyncRead, &c.chunk, what).await?;
        let psize = (c.chunk.psize_bytes as usize).min(buf.len());
        let mut got = decode(&buf[..psize]).map_err(corrupt)?;
        if got.len() != c.entries as usize {
            return Err(corrupt(oxpool_format::FormatError::BadField {
                field: "table chunk records",
                value: got.len() as u64,
            }));
        }
        table.push((*c, txg_of(&got[0])));
        records.append(&mut got);
    }
    Ok((Table::loaded(table), records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with_starts(starts: &[u64]) -> Table {
        Table {
            chunks: starts
                .iter()
                .map(|&t| {
                    (
                        TableChunkMeta {
                            chunk: BlockPtr::HOLE,
                            entries: 1,
                        },
                        Txg(t),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn chunks_keep_their_starts_when_records_come_and_go() {
        let max = TABLE_CHUNK_ENTRIES_MAX as u64;
        // Two full chunks: records at txgs 1..=2*max.
        let t = table_with_starts(&[1, max + 1]);
        let all: Vec<Txg> = (1..=2 * max).map(Txg).collect();
        assert_eq!(
            t.partition(&all),
            vec![0..max as usize, max as usize..2 * max as usize]
        );
        // One record of the first chunk gone: the second chunk's records are the same.
        let mut fewer = all.clone();
        fewer.remove(3);
        let p = t.partition(&fewer);
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].len(), max as usize);
        // A new record goes to the last chunk, which splits past the limit.
        let mut more = all.clone();
        more.push(Txg(2 * max + 1));
        let p = t.partition(&more);
        assert_eq!(p.len(), 3);
        assert_eq!(p[0], 0..max as usize);
        assert_eq!(p[2].len(), 1);
    }

    /// The table a plan makes, with block pointers carrying the new chunks' checksums (no
    /// I/O: what `write` would publish).
    fn published(old: &Table, plan: TablePlan) -> Table {
        let chunks = plan
            .chunks
            .into_iter()
            .map(|(first, p)| match p {
                Planned::Keep(i) => (old.chunks[i].0, first),
                Planned::New { bytes, entries } => {
                    let chunk = BlockPtr {
                        psize_bytes: bytes.len() as u32,
                        checksum: checksum(ChecksumType::Xxh3_128, &bytes),
                        ..BlockPtr::HOLE
                    };
                    (TableChunkMeta { chunk, entries }, first)
                }
            })
            .collect();
        Table { chunks }
    }

    #[test]
    fn plans_encode_and_write_only_the_chunks_that_changed() {
        // Records: (txg, value).
        let encode = |r: &[(Txg, u64)]| {
            r.iter()
                .flat_map(|(t, v)| [t.0, *v])
                .map(|x| x as u8)
                .collect::<Vec<u8>>()
        };
        let plan = |t: &Table, recs: &[(Txg, u64)], changed: &[u64], moved: bool| {
            t.plan(recs, |r| r.0, |r| changed.contains(&r.0 .0), moved, encode)
        };
        let mut recs: Vec<(Txg, u64)> = (1..=200).map(|t| (Txg(t), t)).collect();
        let p = plan(&Table::default(), &recs, &[], true);
        assert_eq!(p.new_chunks(), 200usize.div_ceil(TABLE_CHUNK_ENTRIES_MAX));
        let t = published(&Table::default(), p);
        // Nothing changed: nothing written.
        assert_eq!(plan(&t, &recs, &[], false).new_chunks(), 0);
        // One record appended: the last chunk only.
        recs.push((Txg(201), 201));
        let p = plan(&t, &recs, &[201], false);
        assert_eq!(p.new_chunks(), 1);
        let t = published(&t, p);
        // One changed in place (a hold): its chunk only.
        recs[5].1 = 999;
        let p = plan(&t, &recs, &[6], false);
        assert_eq!(p.new_chunks(), 1);
        let t = published(&t, p);
        // One removed from the middle (a destroy: records moved): its chunk only, the others
        // found equal by their bytes.
        recs.remove(100);
        let p = plan(&t, &recs, &[], true);
        assert_eq!(p.new_chunks(), 1);
        let t = published(&t, p);
        assert_eq!(
            t.chunks
                .iter()
                .map(|(c, _)| c.entries as usize)
                .sum::<usize>(),
            recs.len()
        );
    }

    #[test]
    fn small_neighbours_join_and_empty_chunks_vanish() {
        let t = table_with_starts(&[1, 10, 20, 30]);
        // Records only in the first and last ranges: two small chunks join into one.
        let txgs = [Txg(1), Txg(2), Txg(35)];
        assert_eq!(t.partition(&txgs), vec![0..3]);
        assert!(t.partition(&[]).is_empty());
        // Older records than every start go to the first chunk.
        let t = table_with_starts(&[50]);
        assert_eq!(t.partition(&[Txg(3), Txg(60)]), vec![0..2]);
    }
}
