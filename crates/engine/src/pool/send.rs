//! `oxpool send`: a snapshot of a volume as a send stream (`docs/format.md`, "Send streams"),
//! full or as the changes since an earlier snapshot, or every snapshot in between (`-I`).
//!
//! The changes come from a walk of the snapshot's tree pruned by birth txg
//! ([`crate::dsl::send::ChangeWalker`]): its cost follows the changed blocks. Blocks travel as
//! stored (compressed blocks compressed), with the checksum their pointer holds. A reader
//! thread walks the tree and reads the blocks, many at once, at most
//! [`SendOptions::prefetch_bytes_max`] of them read ahead of the writer; the calling thread
//! encodes and writes them.

use super::bookmark::IncrementalBase;
use super::Pool;
use crate::dsl::send::{Change, ChangeWalker};
use crate::dsl::snapshot::Snapshot;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_run::{read_blocks, StoredBlock};
use crate::{EngineError, Result};
use oxpool_format::stream::{
    DataRecord, ResumeToken, StreamBegin, StreamEncoder, StreamFeatures, RECORD_HEADER_BYTES,
};
use oxpool_format::{BlockPtr, Txg, VolumeId};
use std::future::{poll_fn, Future};
use std::io::Write;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;

/// Read ahead of the writer by default: as ZFS's send queue (`zfs_send_queue_length`).
pub const SEND_PREFETCH_BYTES_DEFAULT: u64 = 32 << 20;

/// What to send.
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// The base of an incremental stream: a snapshot (its name after the `@`) or a bookmark
    /// (`#NAME`); None: full.
    pub base: Option<String>,
    /// With a base: send every snapshot between it and the sent one, one stream each
    /// (`-I`), instead of one stream from the base (`-i`).
    pub intermediates: bool,
    /// Bytes of blocks read ahead of the writer at most (0: the default).
    pub prefetch_bytes_max: u64,
}

/// What to send: a snapshot, or the rest of an interrupted stream.
#[derive(Clone, Copy, Debug)]
pub enum SendWhat<'a> {
    /// `volume@snap`, with the base in [`SendOptions`].
    Snapshot {
        /// The volume.
        volume: &'a str,
        /// The snapshot's name after the `@`.
        snap: &'a str,
    },
    /// `send -t TOKEN`: the stream an interrupted `recv -s` stopped in, from where it
    /// stopped.
    Resume(&'a ResumeToken),
}

/// What a send wrote (or, estimated, would write).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Streams (one per snapshot sent).
    pub streams: u64,
    /// DATA records.
    pub data_records: u64,
    /// FREE records (adjacent freed blocks merged).
    pub free_records: u64,
    /// Bytes of DATA payloads (blocks as stored).
    pub data_bytes: u64,
    /// Stream bytes: every header and payload.
    pub stream_bytes: u64,
    /// Indirect blocks the walks read.
    pub indirect_reads: u64,
}

/// One stream to send: the snapshot, and its base.
struct Leg {
    from: Option<IncrementalBase>,
    to: Snapshot,
    /// A resumed stream (`send -t`): where it starts.
    resume_offset_bytes: Option<u64>,
}

/// The sending volume, as the walks need it.
struct Source {
    id: VolumeId,
    full_name: String,
    volblocksize_bytes: u32,
}

/// What the reader thread hands the writer.
enum Item {
    Data {
        block: u64,
        bp: BlockPtr,
        /// The block as read: its first `bp.psize_bytes` are the stored bytes. Handed over
        /// as read, not copied (a copy of every block was a third of the reader's CPU time).
        stored: StoredBlock,
    },
    Free {
        first: u64,
        count: u64,
    },
}

/// Bytes read ahead and not yet written: the reader waits while it is at the bound.
struct Budget {
    bytes: Mutex<u64>,
    freed: Condvar,
    max_bytes: u64,
    /// Set when the writer stops (done or failed): the reader stops waiting.
    writer_gone: AtomicBool,
}

impl Budget {
    /// Waits until `n` more bytes fit (a batch larger than the bound waits for an empty
    /// budget); false if the writer is gone.
    fn take(&self, n: u64) -> bool {
        let mut b = self.bytes.lock().unwrap();
        // Bounded by the writer: each batch it writes returns bytes, and it says when it stops.
        while *b > 0 && *b + n > self.max_bytes {
            if self.writer_gone.load(Ordering::Acquire) {
                return false;
            }
            b = self
                .freed
                .wait_timeout(b, std::time::Duration::from_millis(100))
                .unwrap()
                .0;
        }
        *b += n;
        true
    }

    fn give(&self, n: u64) {
        *self.bytes.lock().unwrap() -= n;
        self.freed.notify_all();
    }
}

impl Pool {
    /// The snapshots a send of `volume@snap` with `opts` covers, checked.
    fn send_legs(
        &self,
        volume: &str,
        snap: &str,
        opts: &SendOptions,
    ) -> Result<(Source, Vec<Leg>)> {
        let ds = self
            .dsl
            .get(volume)
            .filter(|d| !d.name.contains('%'))
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}", self.spa.name)))?;
        let source = Source {
            id: ds.id,
            full_name: ds.full_name.clone(),
            volblocksize_bytes: ds.props.lock().unwrap().volblocksize_bytes,
        };
        let l = ds.lineage.lock().unwrap();
        let (to_i, _) = l
            .find(snap)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}@{snap}", self.spa.name)))?;
        let Some(base) = &opts.base else {
            let to = l.snapshots()[to_i].clone();
            return Ok((
                source,
                vec![Leg {
                    from: None,
                    to,
                    resume_offset_bytes: None,
                }],
            ));
        };
        let to = l.snapshots()[to_i].clone();
        drop(l);
        let from = self.incremental_base(volume, base)?;
        let shown = match base.strip_prefix('#') {
            Some(_) => format!("{}/{volume}{base}", self.spa.name),
            None => format!("{}/{volume}@{base}", self.spa.name),
        };
        if from.txg >= to.txg {
            return Err(EngineError::invalid(format!(
                "{shown} is not earlier than @{snap}: an incremental base must be"
            )));
        }
        if !opts.intermediates {
            return Ok((
                source,
                vec![Leg {
                    from: Some(from),
                    to,
                    resume_offset_bytes: None,
                }],
            ));
        }
        if base.starts_with('#') {
            return Err(EngineError::invalid(format!(
                "{shown}: -I needs a snapshot as its base (a bookmark has no snapshots after it to send)"
            )));
        }
        let l = ds.lineage.lock().unwrap();
        let from_i = l
            .find(base)
            .ok_or_else(|| self.no_snapshot(volume, base))?
            .0;
        // The snapshots may have changed since they were looked at: checked again.
        let (to_i, _) = l.find(snap).ok_or_else(|| self.no_snapshot(volume, snap))?;
        let base_of = |s: &Snapshot| IncrementalBase {
            guid: s.guid,
            txg: s.txg,
            volsize_bytes: s.volsize_bytes,
        };
        let legs = (from_i..to_i)
            .map(|i| Leg {
                from: Some(base_of(&l.snapshots()[i])),
                to: l.snapshots()[i + 1].clone(),
                resume_offset_bytes: None,
            })
            .collect();
        Ok((source, legs))
    }

    /// The stream that continues an interrupted receive: `token` (a `receive_resume_token`)
    /// names the snapshot and base by guid and the offset the receiver stopped at.
    fn resume_legs(&self, token: &ResumeToken) -> Result<(Source, Vec<Leg>)> {
        let known = StreamFeatures::COMPRESSED.0 | StreamFeatures::RESUMING.0;
        if token.features.0 & !known != 0 || !token.features.contains(StreamFeatures::COMPRESSED) {
            return Err(EngineError::invalid(format!(
                "cannot resume send: the token's stream features ({}) are not those this \
                 sender writes",
                token.features
            )));
        }
        // Bounded by the pool's datasets.
        for ds in self.dsl.all() {
            if ds.name.contains('%') {
                continue;
            }
            let l = ds.lineage.lock().unwrap();
            let Some(to) = l.snapshots().iter().find(|s| s.guid == token.toguid) else {
                continue;
            };
            let full_name = format!("{}@{}", ds.full_name, to.name);
            let from = match token.fromguid {
                None => None,
                Some(guid) => Some(Pool::incremental_base_by_guid(&l, guid).ok_or_else(|| {
                    EngineError::NotFound(format!(
                        "cannot resume send of {full_name}: its base (guid {:016x}) is no \
                             longer a snapshot or bookmark of {}",
                        guid.0, ds.full_name
                    ))
                })?),
            };
            let bs = u64::from(ds.props.lock().unwrap().volblocksize_bytes);
            let offset = token.offset_bytes;
            if !offset.is_multiple_of(bs) || offset > to.volsize_bytes {
                return Err(EngineError::invalid(format!(
                    "cannot resume send of {full_name}: the token's offset {offset} is not a \
                     block boundary within the volume"
                )));
            }
            let source = Source {
                id: ds.id,
                full_name: ds.full_name.clone(),
                volblocksize_bytes: bs as u32,
            };
            let leg = Leg {
                from,
                to: to.clone(),
                resume_offset_bytes: Some(offset),
            };
            return Ok((source, vec![leg]));
        }
        Err(EngineError::NotFound(format!(
            "cannot resume send: pool {} has no snapshot with the token's guid {:016x} \
             (destroyed since, or the token is for another pool)",
            self.spa.name, token.toguid.0
        )))
    }

    /// The legs of a send of `what`.
    fn legs(&self, what: &SendWhat<'_>, opts: &SendOptions) -> Result<(Source, Vec<Leg>)> {
        match what {
            SendWhat::Snapshot { volume, snap } => self.send_legs(volume, snap, opts),
            SendWhat::Resume(token) => self.resume_legs(token),
        }
    }

    /// Writes the stream(s) of `volume@snap` (see [`SendOptions`]) to `out`.
    pub fn send(
        &self,
        volume: &str,
        snap: &str,
        opts: &SendOptions,
        out: &mut dyn Write,
    ) -> Result<SendStats> {
        self.send_what(&SendWhat::Snapshot { volume, snap }, opts, out)
    }

    /// Writes the stream of `what` (see [`SendOptions`]; `send -t` ignores its base) to
    /// `out`.
    pub fn send_what(
        &self,
        what: &SendWhat<'_>,
        opts: &SendOptions,
        out: &mut dyn Write,
    ) -> Result<SendStats> {
        let (source, legs) = self.legs(what, opts)?;
        let prefetch = match opts.prefetch_bytes_max {
            0 => SEND_PREFETCH_BYTES_DEFAULT,
            n => n,
        };
        let mut stats = SendStats::default();
        for leg in &legs {
            send_leg(&self.spa, &source, leg, prefetch, out, &mut stats)?;
        }
        out.flush().map_err(|e| EngineError::io("send stream", e))?;
        Ok(stats)
    }

    /// What [`Pool::send`] would write (`send -n -v`): the same walks, reading the indirect
    /// blocks but no data block, so the figures are exact, not an estimate.
    pub fn send_estimate(&self, volume: &str, snap: &str, opts: &SendOptions) -> Result<SendStats> {
        self.send_estimate_what(&SendWhat::Snapshot { volume, snap }, opts)
    }

    /// [`Pool::send_estimate`] of `what`.
    pub fn send_estimate_what(&self, what: &SendWhat<'_>, opts: &SendOptions) -> Result<SendStats> {
        let (source, legs) = self.legs(what, opts)?;
        let mut stats = SendStats::default();
        for leg in &legs {
            let begin = stream_begin(&self.spa, &source, leg);
            stats.streams += 1;
            stats.stream_bytes += RECORD_HEADER_BYTES as u64 + begin.name.len() as u64;
            if set_size(leg).is_some() {
                stats.stream_bytes += RECORD_HEADER_BYTES as u64;
            }
            let mut walker = walker(&self.spa, &source, leg);
            let mut last_free_end = None;
            oxpool_io::rt::block_on(async {
                // Bounded by the tree: the walk ends.
                while let Some(c) = walker.next().await? {
                    match c {
                        Change::Data { bp, .. } => {
                            stats.data_records += 1;
                            stats.data_bytes += u64::from(bp.psize_bytes);
                            stats.stream_bytes +=
                                RECORD_HEADER_BYTES as u64 + u64::from(bp.psize_bytes);
                            last_free_end = None;
                        }
                        Change::Free { first, count } => {
                            if last_free_end != Some(first) {
                                stats.free_records += 1;
                                stats.stream_bytes += RECORD_HEADER_BYTES as u64;
                            }
                            last_free_end = Some(first + count);
                        }
                    }
                }
                Ok::<(), EngineError>(())
            })?;
            stats.indirect_reads += walker.indirect_reads();
            stats.stream_bytes += RECORD_HEADER_BYTES as u64;
        }
        Ok(stats)
    }
}

/// The new size, if the volume was resized between the leg's snapshots.
fn set_size(leg: &Leg) -> Option<u64> {
    let from = leg.from.as_ref()?;
    (from.volsize_bytes != leg.to.volsize_bytes).then_some(leg.to.volsize_bytes)
}

fn stream_begin(spa: &Spa, source: &Source, leg: &Leg) -> StreamBegin {
    let features = match leg.resume_offset_bytes {
        Some(_) => StreamFeatures(StreamFeatures::COMPRESSED.0 | StreamFeatures::RESUMING.0),
        None => StreamFeatures::COMPRESSED,
    };
    StreamBegin {
        // Blocks travel as stored: compressed ones need a receiver that knows it.
        features,
        volsize_bytes: leg.to.volsize_bytes,
        volblocksize_bytes: source.volblocksize_bytes,
        pool_guid: spa.guid,
        volume_id: source.id,
        toguid: leg.to.guid,
        fromguid: leg.from.as_ref().map(|f| f.guid),
        creation_txg: leg.to.txg,
        creation_time_ns: leg.to.creation_s.saturating_mul(1_000_000_000),
        resume_offset_bytes: leg.resume_offset_bytes.unwrap_or(0),
        name: format!("{}@{}", source.full_name, leg.to.name),
    }
}

fn walker<'a>(spa: &'a Spa, source: &Source, leg: &Leg) -> ChangeWalker<'a> {
    let after = leg.from.as_ref().map_or(Txg(0), |f| f.txg);
    ChangeWalker::new(
        spa,
        &format!("{}@{}", source.full_name, leg.to.name),
        leg.to.root,
        leg.to.levels,
        after,
        leg.from.is_some(),
        leg.to.volsize_bytes / u64::from(source.volblocksize_bytes),
    )
    .starting_at(leg.resume_offset_bytes.unwrap_or(0) / u64::from(source.volblocksize_bytes))
}

/// Sends one stream: a reader thread walks and reads ahead; this thread writes.
fn send_leg(
    spa: &Arc<Spa>,
    source: &Source,
    leg: &Leg,
    prefetch_bytes_max: u64,
    out: &mut dyn Write,
    stats: &mut SendStats,
) -> Result<()> {
    let begin = stream_begin(spa, source, leg);
    let (mut enc, header) = StreamEncoder::new(&begin);
    put(out, &header)?;
    put(out, begin.name.as_bytes())?;
    if let Some(size) = set_size(leg) {
        put(out, &enc.set_size(size))?;
    }
    let bs = u64::from(source.volblocksize_bytes);
    let budget = Budget {
        bytes: Mutex::new(0),
        freed: Condvar::new(),
        max_bytes: prefetch_bytes_max,
        writer_gone: AtomicBool::new(false),
    };
    // One batch of reads in flight at once: a quarter of the bound, so reading goes on while
    // the batches before it are written.
    let batch_bytes_max = (prefetch_bytes_max / 4).max(bs);
    // Bounded in bytes by `budget`, not by the channel.
    let (tx, rx) = mpsc::channel::<Result<Vec<Item>>>();
    let indirect_reads = std::thread::scope(|scope| -> Result<u64> {
        let reader = scope.spawn(|| read_ahead(spa, source, leg, batch_bytes_max, &budget, tx));
        let mut written = || -> Result<()> {
            // A run of freed blocks, merged across batches, written when data follows.
            let mut free: Option<(u64, u64)> = None;
            // Bounded by the reader's batches: it ends, and closes the channel.
            for batch in rx.iter() {
                let batch = batch?;
                let mut bytes = 0u64;
                for item in batch {
                    match item {
                        Item::Data { block, bp, stored } => {
                            let stored = &stored[..bp.psize_bytes as usize];
                            if let Some((first, count)) = free.take() {
                                put(out, &enc.free(first * bs, count * bs))?;
                                stats.free_records += 1;
                            }
                            let header = enc.data(&DataRecord {
                                offset_bytes: block * bs,
                                lsize_bytes: source.volblocksize_bytes,
                                compression: bp.compression,
                                checksum_type: bp.checksum_type,
                                checksum: bp.checksum,
                                payload: stored,
                            });
                            put(out, &header)?;
                            put(out, stored)?;
                            stats.data_records += 1;
                            stats.data_bytes += stored.len() as u64;
                            bytes += stored.len() as u64;
                        }
                        Item::Free { first, count } => {
                            free = match free {
                                Some((f, c)) if f + c == first => Some((f, c + count)),
                                Some((f, c)) => {
                                    put(out, &enc.free(f * bs, c * bs))?;
                                    stats.free_records += 1;
                                    Some((first, count))
                                }
                                None => Some((first, count)),
                            };
                        }
                    }
                }
                budget.give(bytes);
            }
            if let Some((first, count)) = free {
                put(out, &enc.free(first * bs, count * bs))?;
                stats.free_records += 1;
            }
            Ok(())
        };
        let wrote = written();
        // A writer that failed stops the reader (it sees the channel closed, or the flag).
        drop(rx);
        budget.writer_gone.store(true, Ordering::Release);
        budget.give(0);
        let read = reader.join().expect("the send reader panicked");
        wrote?;
        Ok(read)
    })?;
    stats.stream_bytes += enc.written_bytes() + RECORD_HEADER_BYTES as u64;
    let (header, _) = enc.end();
    put(out, &header)?;
    stats.streams += 1;
    stats.indirect_reads += indirect_reads;
    Ok(())
}

/// One batch of changes the walk found: the changes, the bytes of their data blocks, and
/// whether the walk ended with it.
struct Batch {
    changes: Vec<Change>,
    bytes: u64,
    last: bool,
}

/// Takes changes from the walk until they hold `batch_bytes_max` of data blocks or it ends.
async fn gather(walker: &mut ChangeWalker<'_>, batch_bytes_max: u64) -> Result<Batch> {
    let mut batch = Batch {
        changes: Vec::new(),
        bytes: 0,
        last: false,
    };
    // Bounded by the batch's bytes, or the walk's end.
    while batch.bytes < batch_bytes_max {
        match walker.next().await? {
            None => {
                batch.last = true;
                break;
            }
            Some(Change::Free { first, count }) => match batch.changes.last_mut() {
                Some(Change::Free { first: f, count: c }) if *f + *c == first => *c += count,
                _ => batch.changes.push(Change::Free { first, count }),
            },
            Some(c @ Change::Data { bp, .. }) => {
                batch.bytes += u64::from(bp.psize_bytes);
                batch.changes.push(c);
            }
        }
    }
    Ok(batch)
}

/// Both futures, polled together until both are done.
async fn join2<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.is_some(), rb.is_some()) {
            (true, true) => Poll::Ready((ra.take().unwrap(), rb.take().unwrap())),
            _ => Poll::Pending,
        }
    })
    .await
}

/// The reader thread: walks the tree and reads the changed blocks a batch at a time, the
/// walk for the next batch going on while the current batch's reads are in flight (so the
/// walk's CPU and indirect reads overlap the data reads); sends the batches in order (an
/// error as the last one). Returns the indirect blocks it read.
fn read_ahead(
    spa: &Spa,
    source: &Source,
    leg: &Leg,
    batch_bytes_max: u64,
    budget: &Budget,
    tx: mpsc::Sender<Result<Vec<Item>>>,
) -> u64 {
    let mut walker = walker(spa, source, leg);
    let what = format!("{}@{}", source.full_name, leg.to.name);
    let result = oxpool_io::rt::block_on(async {
        let mut next = gather(&mut walker, batch_bytes_max).await?;
        // Bounded by the tree: each round sends one batch; the walk ends.
        loop {
            let batch = next;
            if batch.changes.is_empty() || !budget.take(batch.bytes) {
                break;
            }
            // Blocks side by side on a device are read as one request (`zio/read_run.rs`).
            let bps: Vec<BlockPtr> = batch
                .changes
                .iter()
                .filter_map(|c| match c {
                    Change::Data { bp, .. } => Some(*bp),
                    Change::Free { .. } => None,
                })
                .collect();
            let reads = read_blocks(&spa.zio, IoClass::AsyncRead, &bps, what.as_str());
            let (blocks, following) = if batch.last {
                (reads.await, None)
            } else {
                let (blocks, following) = join2(reads, gather(&mut walker, batch_bytes_max)).await;
                (blocks, Some(following?))
            };
            let mut blocks = blocks.into_iter();
            let mut items = Vec::with_capacity(batch.changes.len());
            for c in batch.changes {
                items.push(match c {
                    Change::Data { block, bp } => {
                        let stored = blocks.next().expect("one read per data change")?;
                        if stored.len() < bp.psize_bytes as usize {
                            return Err(EngineError::invalid(format!(
                                "{what}: block {block} read {} bytes, its pointer says {}",
                                stored.len(),
                                bp.psize_bytes
                            )));
                        }
                        Item::Data { block, bp, stored }
                    }
                    Change::Free { first, count } => Item::Free { first, count },
                });
            }
            if tx.send(Ok(items)).is_err() {
                // The writer is gone (its error is the one reported).
                break;
            }
            match following {
                Some(f) => next = f,
                None => break,
            }
        }
        Ok::<(), EngineError>(())
    });
    if let Err(e) = result {
        let _ = tx.send(Err(e));
    }
    walker.indirect_reads()
}

/// Writes stream bytes.
fn put(out: &mut dyn Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes)
        .map_err(|e| EngineError::io("send stream", e))
}
