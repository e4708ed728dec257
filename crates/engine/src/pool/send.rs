//! `oxpool send`: a snapshot of a volume as a send stream (`docs/format.md`, "Send streams"),
//! full or as the changes since an earlier snapshot, or every snapshot in between (`-I`).
//!
//! The changes come from a walk of the snapshot's tree pruned by birth txg
//! ([`crate::dsl::send::ChangeWalker`]): its cost follows the changed blocks. Blocks travel as
//! stored (compressed blocks compressed), with the checksum their pointer holds. A reader
//! thread walks the tree and reads the blocks through a sliding window of runs (blocks side
//! by side read as one request): at most [`SEND_READS_IN_FLIGHT_BYTES_MAX`] in flight, at most
//! [`SendOptions::prefetch_bytes_max`] read ahead of the writer, each run verified as it
//! completes; the calling thread encodes and writes them, a run's records in one vectored
//! write.

use super::bookmark::IncrementalBase;
use super::recv::is_hidden;
use super::Pool;
use crate::dsl::send::{Change, ChangeWalker};
use crate::dsl::snapshot::Snapshot;
use crate::dsl::LongHold;
use crate::spa::check_name;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_run::{
    extends_run, read_run, run_bytes, RunBufs, StoredBlock, READ_RUN_BYTES_MAX,
};
use crate::{EngineError, Result};
use oxpool_format::stream::{
    DataRecord, RecordHeader, ResumeToken, StreamBegin, StreamEncoder, StreamFeatures,
    RECORD_HEADER_BYTES,
};
use oxpool_format::{BlockPtr, Txg, VolumeId};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::{IoSlice, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Read ahead of the writer by default: as ZFS's send queue (`zfs_send_queue_length`).
pub const SEND_PREFETCH_BYTES_DEFAULT: u64 = 32 << 20;

/// Bytes of data block reads on the devices at once, at most (and at most the read-ahead):
/// what fio's sequential read keeps in flight (8 requests of 1 MiB), the rate the send is
/// measured against. The reader issues a run whenever one completes, so the device's queue
/// stays this full from the first run to the last.
pub const SEND_READS_IN_FLIGHT_BYTES_MAX: u64 = 8 << 20;

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
    /// `send -t TOKEN [VOLUME]`: the stream an interrupted `recv -s` stopped in, from where
    /// it stopped.
    Resume {
        /// The receiver's token.
        token: &'a ResumeToken,
        /// The volume the interrupted stream came from, when several volumes of the pool
        /// hold a snapshot with the token's guid (copies made by a send and receive within
        /// the pool keep their guids): the token names the snapshot by guid only.
        volume: Option<&'a str>,
    },
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
    /// The most bytes of blocks read ahead of the writer at once (reads issued, blocks not
    /// yet written): at most [`SendOptions::prefetch_bytes_max`], or one run of blocks read
    /// together when that alone is larger. 0 in an estimate.
    pub read_ahead_bytes_peak: u64,
    /// The most bytes of data block reads in flight on the devices at once: at most
    /// [`SEND_READS_IN_FLIGHT_BYTES_MAX`] and the read-ahead bound, or one run when that alone
    /// is larger. 0 in an estimate.
    pub reads_in_flight_bytes_peak: u64,
    /// Each stream's own size, in the order sent: what `send -nvp` lists one line each, as
    /// `zfs send -nvP` does. Their sum is `stream_bytes`.
    pub legs: Vec<LegSize>,
}

/// One stream of a send: the snapshot it carries and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegSize {
    /// The snapshot's name (without its volume).
    pub snapshot: String,
    /// Its stream's bytes: every header and payload.
    pub stream_bytes: u64,
}

/// One stream to send: the snapshot, and its base.
struct Leg {
    from: Option<IncrementalBase>,
    to: Snapshot,
    /// A resumed stream (`send -t`): where it starts.
    resume_offset_bytes: Option<u64>,
    /// `to` cannot be destroyed while the send reads it (taken under its lineage's lock when
    /// `to` was looked up, so no destroy slips in between).
    _hold: LongHold,
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

/// Bytes read ahead and not yet written: the reader issues no further run while it is at the
/// bound, and the writer wakes it as it gives bytes back.
struct Budget {
    state: Mutex<BudgetState>,
    max_bytes: u64,
    /// Set when the writer stops (done or failed): the reader stops.
    writer_gone: AtomicBool,
}

#[derive(Default)]
struct BudgetState {
    bytes: u64,
    /// The most bytes taken at once.
    peak_bytes: u64,
    /// The reader, waiting for bytes to come back.
    waiting: Option<Waker>,
}

impl Budget {
    /// Takes `n` bytes if they fit (a run larger than the bound goes alone, into an empty
    /// budget); else false, and the writer wakes `cx`'s task when it gives bytes back or stops.
    fn try_take(&self, n: u64, cx: &Context<'_>) -> bool {
        let mut s = self.state.lock().unwrap();
        if s.bytes > 0 && s.bytes + n > self.max_bytes {
            if !s.waiting.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.waiting = Some(cx.waker().clone());
            }
            return false;
        }
        s.bytes += n;
        s.peak_bytes = s.peak_bytes.max(s.bytes);
        true
    }

    fn give(&self, n: u64) {
        let waiting = {
            let mut s = self.state.lock().unwrap();
            s.bytes -= n;
            s.waiting.take()
        };
        if let Some(w) = waiting {
            w.wake();
        }
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
            .filter(|d| !is_hidden(&d.name()))
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}", self.spa.name)))?;
        let source = Source {
            id: ds.id,
            full_name: ds.full_name(),
            volblocksize_bytes: ds.props.lock().unwrap().volblocksize_bytes,
        };
        let l = ds.lineage.lock().unwrap();
        let (to_i, _) = l
            .find(snap)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}@{snap}", self.spa.name)))?;
        let hold = |s: &Snapshot| (s.clone(), self.dsl.long_hold(s.guid));
        let Some(base) = &opts.base else {
            let (to, _hold) = hold(&l.snapshots()[to_i]);
            return Ok((
                source,
                vec![Leg {
                    from: None,
                    to,
                    resume_offset_bytes: None,
                    _hold,
                }],
            ));
        };
        let (to, to_hold) = hold(&l.snapshots()[to_i]);
        drop(l);
        let from = self.incremental_base(volume, base)?;
        let shown = match base.strip_prefix('#') {
            Some(_) => format!("{}/{volume}{base}", self.spa.name),
            None => format!("{}/{volume}@{base}", self.spa.name),
        };
        if from.txg >= to.txg {
            return Err(EngineError::invalid(format!(
                "{shown} is not earlier than @{snap}: an incremental base must be older than \
                 the snapshot sent"
            )));
        }
        if !opts.intermediates {
            return Ok((
                source,
                vec![Leg {
                    from: Some(from),
                    to,
                    resume_offset_bytes: None,
                    _hold: to_hold,
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
            .map(|i| {
                let (to, _hold) = hold(&l.snapshots()[i + 1]);
                Leg {
                    from: Some(base_of(&l.snapshots()[i])),
                    to,
                    resume_offset_bytes: None,
                    _hold,
                }
            })
            .collect();
        Ok((source, legs))
    }

    /// The stream that continues an interrupted receive: `token` (a `receive_resume_token`)
    /// names the snapshot and base by guid and the offset the receiver stopped at; `volume`,
    /// if given, the volume holding that snapshot.
    ///
    /// A guid names a snapshot within its volume, not within the pool: a copy received from
    /// another volume of the pool keeps its guids, and a stream made by hand can give any
    /// snapshot any guid. When several volumes hold the token's guid the resume is refused
    /// unless `volume` names one: continuing a receive from another volume's blocks than it
    /// started with would end in a snapshot that matches neither.
    fn resume_legs(&self, token: &ResumeToken, volume: Option<&str>) -> Result<(Source, Vec<Leg>)> {
        let known = StreamFeatures::COMPRESSED.0 | StreamFeatures::RESUMING.0;
        if token.features.0 & !known != 0 || !token.features.contains(StreamFeatures::COMPRESSED) {
            return Err(EngineError::invalid(format!(
                "cannot resume send: the token's stream features ({}) are not those this \
                 sender writes",
                token.features
            )));
        }
        if let Some(v) = volume {
            check_name("volume", v)?;
            if self.dsl.get(v).is_none() || is_hidden(v) {
                return Err(EngineError::NotFound(format!(
                    "volume {}/{v}",
                    self.spa.name
                )));
            }
        }
        // Bounded by the pool's datasets.
        let holding: Vec<_> = self
            .dsl
            .all()
            .into_iter()
            .filter(|ds| !is_hidden(&ds.name()) && volume.is_none_or(|v| ds.name() == v))
            .filter(|ds| {
                let l = ds.lineage.lock().unwrap();
                l.snapshots().iter().any(|s| s.guid == token.toguid)
            })
            .collect();
        let ds = match holding.as_slice() {
            [one] => one,
            [] => {
                // Not `NotFound`, whose ": not found" would follow the sentence.
                return Err(EngineError::invalid(match volume {
                    Some(v) => format!(
                        "cannot resume send: {}/{v} has no snapshot with the token's guid \
                         {:016x} (destroyed since, or the token is for another volume)",
                        self.spa.name, token.toguid.0
                    ),
                    None => format!(
                        "cannot resume send: pool {} has no snapshot with the token's guid \
                         {:016x} (destroyed since, or the token is for another pool)",
                        self.spa.name, token.toguid.0
                    ),
                }));
            }
            several => {
                let names: Vec<String> = several.iter().map(|ds| ds.full_name()).collect();
                return Err(EngineError::invalid(format!(
                    "cannot resume send: volumes {} each hold a snapshot with the token's guid \
                     {:016x}: name the one the interrupted send came from: oxpool send -t \
                     TOKEN {}",
                    names.join(", "),
                    token.toguid.0,
                    names[0]
                )));
            }
        };
        let l = ds.lineage.lock().unwrap();
        // Found above under an earlier hold of this lock: a destroy in between is possible.
        let Some(to) = l.snapshots().iter().find(|s| s.guid == token.toguid) else {
            return Err(EngineError::invalid(format!(
                "cannot resume send: the snapshot of {} with the token's guid {:016x} was \
                 destroyed just now",
                ds.full_name(),
                token.toguid.0
            )));
        };
        let full_name = format!("{}@{}", ds.full_name(), to.name);
        let from = match token.fromguid {
            None => None,
            Some(guid) => Some(Pool::incremental_base_by_guid(&l, guid).ok_or_else(|| {
                EngineError::invalid(format!(
                    "cannot resume send of {full_name}: its base (guid {:016x}) is no \
                         longer a snapshot or bookmark of {}",
                    guid.0,
                    ds.full_name()
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
            full_name: ds.full_name(),
            volblocksize_bytes: bs as u32,
        };
        let leg = Leg {
            from,
            to: to.clone(),
            resume_offset_bytes: Some(offset),
            _hold: self.dsl.long_hold(to.guid),
        };
        Ok((source, vec![leg]))
    }

    /// The legs of a send of `what`.
    fn legs(&self, what: &SendWhat<'_>, opts: &SendOptions) -> Result<(Source, Vec<Leg>)> {
        match what {
            SendWhat::Snapshot { volume, snap } => self.send_legs(volume, snap, opts),
            SendWhat::Resume { token, volume } => self.resume_legs(token, *volume),
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
        let sent = legs
            .iter()
            .try_for_each(|leg| {
                let before_bytes = stats.stream_bytes;
                send_leg(&self.spa, &source, leg, prefetch, out, &mut stats)?;
                stats.legs.push(LegSize {
                    snapshot: leg.to.name.clone(),
                    stream_bytes: stats.stream_bytes - before_bytes,
                });
                Ok(())
            })
            .and_then(|()| out.flush().map_err(|e| EngineError::io("send stream", e)));
        // The holds go with the legs; a `destroy -d` asked meanwhile happens now. The holds go
        // by guid, so that includes one asked of a copy of a sent snapshot within the pool.
        let guids: Vec<oxpool_format::Guid> = legs.iter().map(|leg| leg.to.guid).collect();
        drop(legs);
        for (volume, name) in self.deferred_snapshots_of(&guids) {
            if let Err(e) = self.destroy_if_deferred(&volume, &name) {
                tracing::warn!(
                    snapshot = format!("{volume}@{name}"),
                    "deferred destroy after a send: {e}"
                );
            }
        }
        sent.map(|()| stats)
    }

    /// The snapshots marked by `destroy -d` whose guid is one of `guids`, in every volume:
    /// (volume, snapshot).
    fn deferred_snapshots_of(&self, guids: &[oxpool_format::Guid]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        // Bounded by the pool's datasets and their snapshots.
        for ds in self.dsl.all() {
            if is_hidden(&ds.name()) {
                continue;
            }
            let l = ds.lineage.lock().unwrap();
            for s in l.snapshots() {
                if s.defer_destroy && guids.contains(&s.guid) {
                    out.push((ds.name(), s.name.clone()));
                }
            }
        }
        out
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
            let before_bytes = stats.stream_bytes;
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
            stats.legs.push(LegSize {
                snapshot: leg.to.name.clone(),
                stream_bytes: stats.stream_bytes - before_bytes,
            });
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
        state: Mutex::new(BudgetState::default()),
        max_bytes: prefetch_bytes_max,
        writer_gone: AtomicBool::new(false),
    };
    // Bounded in bytes by `budget`, not by the channel.
    let (tx, rx) = mpsc::channel::<Result<Handed>>();
    let read = std::thread::scope(|scope| -> Result<ReadFigures> {
        let reader = scope.spawn(|| read_ahead(spa, source, leg, prefetch_bytes_max, &budget, tx));
        let mut written = || -> Result<()> {
            // A run of freed blocks, merged across batches, written when data follows.
            let mut free: Option<(u64, u64)> = None;
            // Bounded by the reader's runs: it ends, and closes the channel.
            for handed in rx.iter() {
                let handed = handed?;
                // The records of what was handed, written together (a run's headers and
                // blocks in one system call, not two per block).
                let mut heads: Vec<RecordHeader> = Vec::with_capacity(handed.items.len() + 1);
                // Each record: its header's index in `heads`, and its payload.
                let mut records: Vec<(usize, &[u8])> = Vec::with_capacity(heads.capacity());
                for item in &handed.items {
                    match item {
                        Item::Data { block, bp, stored } => {
                            let stored = &stored[..bp.psize_bytes as usize];
                            if let Some((first, count)) = free.take() {
                                records.push((heads.len(), &[]));
                                heads.push(enc.free(first * bs, count * bs));
                                stats.free_records += 1;
                            }
                            records.push((heads.len(), stored));
                            heads.push(enc.data(&DataRecord {
                                offset_bytes: block * bs,
                                lsize_bytes: source.volblocksize_bytes,
                                compression: bp.compression,
                                checksum_type: bp.checksum_type,
                                checksum: bp.checksum,
                                payload: stored,
                            }));
                            stats.data_records += 1;
                            stats.data_bytes += stored.len() as u64;
                        }
                        &Item::Free { first, count } => {
                            free = match free {
                                Some((f, c)) if f + c == first => Some((f, c + count)),
                                Some((f, c)) => {
                                    records.push((heads.len(), &[]));
                                    heads.push(enc.free(f * bs, c * bs));
                                    stats.free_records += 1;
                                    Some((first, count))
                                }
                                None => Some((first, count)),
                            };
                        }
                    }
                }
                let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 * records.len());
                for &(head, payload) in &records {
                    slices.push(IoSlice::new(&heads[head]));
                    if !payload.is_empty() {
                        slices.push(IoSlice::new(payload));
                    }
                }
                put_all(out, &mut slices)?;
                drop(records);
                drop(handed.items);
                budget.give(handed.budget_bytes);
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
    stats.indirect_reads += read.indirect_reads;
    stats.read_ahead_bytes_peak = stats
        .read_ahead_bytes_peak
        .max(budget.state.lock().unwrap().peak_bytes);
    stats.reads_in_flight_bytes_peak = stats
        .reads_in_flight_bytes_peak
        .max(read.in_flight_bytes_peak);
    Ok(())
}

/// What the reader hands the writer at once: the items of the runs (and freed ranges) done at
/// the front of its window, in stream order, and the budget bytes they took.
struct Handed {
    items: Vec<Item>,
    budget_bytes: u64,
}

/// Changes taken from the walk: the changes, the bytes of their data blocks, and whether the
/// walk ended with them.
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

/// Data bytes one step of the walk gathers: about one run, so the first reads start at once
/// and the walk goes on in small steps between the reads' completions.
const WALK_STEP_BYTES: u64 = READ_RUN_BYTES_MAX;

/// Data bytes walked ahead of the reads at most: the walk stops at each indirect block to
/// read it (one per 255 data blocks, about 4 MiB of 16 KiB blocks), and that read waits
/// behind the data reads in flight; what was walked before it keeps the window full meanwhile.
/// Twice the window: only the changes are held (about 150 bytes per block), no data.
const WALK_AHEAD_BYTES_MAX: u64 = 2 * SEND_READS_IN_FLIGHT_BYTES_MAX;

/// One step of the walk, owning the walker until it is done (it hands it back).
type WalkStep<'a> = Pin<Box<dyn Future<Output = (ChangeWalker<'a>, Result<Batch>)> + 'a>>;

/// A run's read: its blocks' pointers back, with each block's stored bytes or error.
type RunRead<'a> = Pin<Box<dyn Future<Output = (Vec<BlockPtr>, Vec<Result<StoredBlock>>)> + 'a>>;

/// What the reader holds in stream order (its window): runs being read or read, and freed
/// ranges between them.
enum Slot<'a> {
    Run {
        /// The data blocks' indices in the volume, in order.
        blocks: Vec<u64>,
        /// Their stored bytes (`psize`), taken from the budget.
        budget_bytes: u64,
        /// Their bytes on the device, counted in flight until the read is done.
        device_bytes: u64,
        read: RunRead<'a>,
        done: Option<(Vec<BlockPtr>, Vec<Result<StoredBlock>>)>,
    },
    Free {
        first: u64,
        count: u64,
    },
}

/// What the reader reports when it ends.
#[derive(Default)]
struct ReadFigures {
    indirect_reads: u64,
    in_flight_bytes_peak: u64,
}

/// The reader thread's state: a sliding window of runs. The walk goes on in steps, a little
/// ahead of the reads; a run is issued as soon as the window has room (at most
/// [`SEND_READS_IN_FLIGHT_BYTES_MAX`] on the devices, at most the budget read ahead of the
/// writer); each run is verified as it completes (`read_run`), and the runs at the front of
/// the window that are done go to the writer in order. So the device's queue stays full
/// while this thread walks and verifies, instead of draining at the end of every batch.
struct Reader<'a> {
    spa: &'a Spa,
    what: &'a str,
    budget: &'a Budget,
    tx: mpsc::Sender<Result<Handed>>,
    bufs: Arc<RunBufs>,
    /// The walker, between steps (a step owns it while it runs).
    walker: Option<ChangeWalker<'a>>,
    walking: Option<WalkStep<'a>>,
    walk_ended: bool,
    /// Changes walked and not yet in the window, and the data bytes among them.
    walked: VecDeque<Change>,
    walked_bytes: u64,
    window: VecDeque<Slot<'a>>,
    in_flight_bytes: u64,
    in_flight_bytes_max: u64,
    /// The longest run: [`READ_RUN_BYTES_MAX`], or a quarter of the bound in flight if that
    /// is smaller (so a small read-ahead still holds several runs, and its bound holds).
    run_bytes_max: u64,
    figures: ReadFigures,
}

impl<'a> Reader<'a> {
    /// Moves everything on that can move; Ready when the walk is done and every run handed
    /// on, or the writer is gone.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        // Bounded: each round walks a step, issues, completes or hands on something, or
        // returns Pending (woken by a read, the walk, or the writer giving bytes back).
        loop {
            if self.budget.writer_gone.load(Ordering::Acquire) {
                return Poll::Ready(Ok(()));
            }
            let mut progress = false;
            if let Some(walker) = &mut self.walker {
                // Its reads ahead go on between steps (see `ChangeWalker::poll_ahead`).
                walker.poll_ahead(cx);
            }
            if self.walking.is_none()
                && !self.walk_ended
                && self.walked_bytes < WALK_AHEAD_BYTES_MAX
            {
                let mut walker = self
                    .walker
                    .take()
                    .expect("the walker is back between steps");
                self.walking = Some(Box::pin(async move {
                    let step = gather(&mut walker, WALK_STEP_BYTES).await;
                    (walker, step)
                }));
            }
            if let Some(step) = &mut self.walking {
                if let Poll::Ready((walker, batch)) = step.as_mut().poll(cx) {
                    self.walking = None;
                    self.figures.indirect_reads = walker.indirect_reads();
                    self.walker = Some(walker);
                    let batch = batch?;
                    self.walk_ended = batch.last;
                    self.walked_bytes += batch.bytes;
                    self.walked.extend(batch.changes);
                    progress = true;
                }
            }
            // Bounded by the changes walked.
            while self.issue(cx) {
                progress = true;
            }
            for slot in self.window.iter_mut() {
                if let Slot::Run {
                    read,
                    done: done @ None,
                    device_bytes,
                    ..
                } = slot
                {
                    if let Poll::Ready(r) = read.as_mut().poll(cx) {
                        *done = Some(r);
                        self.in_flight_bytes -= *device_bytes;
                        progress = true;
                    }
                }
            }
            let handed = self.take_done()?;
            if !handed.items.is_empty() {
                if self.tx.send(Ok(handed)).is_err() {
                    // The writer is gone (its error is the one reported).
                    return Poll::Ready(Ok(()));
                }
                progress = true;
            }
            if self.walk_ended
                && self.walking.is_none()
                && self.walked.is_empty()
                && self.window.is_empty()
            {
                return Poll::Ready(Ok(()));
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Puts the next walked change(s) in the window: a freed range, or a run of data blocks
    /// read as one, once the run is complete (the walk has shown what follows it) and the
    /// window has room. False if nothing could go in.
    fn issue(&mut self, cx: &mut Context<'_>) -> bool {
        let zio = &self.spa.zio;
        let first = match self.walked.front() {
            None => return false,
            Some(&Change::Free { first, count }) => {
                self.walked.pop_front();
                self.window.push_back(Slot::Free { first, count });
                return true;
            }
            Some(&Change::Data { bp, .. }) => bp,
        };
        let (mut n, mut device_bytes, mut budget_bytes) =
            (1, run_bytes(&first), u64::from(first.psize_bytes));
        let mut last = first;
        // Bounded by READ_RUN_BYTES_MAX.
        let complete = loop {
            match self.walked.get(n) {
                Some(Change::Data { bp, .. })
                    if extends_run(zio, &last, device_bytes, bp, self.run_bytes_max) =>
                {
                    device_bytes += run_bytes(bp);
                    budget_bytes += u64::from(bp.psize_bytes);
                    last = *bp;
                    n += 1;
                }
                Some(_) => break true,
                None => break self.walk_ended || device_bytes >= self.run_bytes_max,
            }
        };
        if !complete
            || (self.in_flight_bytes > 0
                && self.in_flight_bytes + device_bytes > self.in_flight_bytes_max)
            || !self.budget.try_take(budget_bytes, cx)
        {
            return false;
        }
        let (mut blocks, mut bps) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for c in self.walked.drain(..n) {
            if let Change::Data { block, bp } = c {
                blocks.push(block);
                bps.push(bp);
            }
        }
        self.walked_bytes -= budget_bytes;
        self.in_flight_bytes += device_bytes;
        self.figures.in_flight_bytes_peak =
            self.figures.in_flight_bytes_peak.max(self.in_flight_bytes);
        let (what, bufs) = (self.what, self.bufs.clone());
        let read = Box::pin(async move {
            let stored = read_run(
                zio,
                IoClass::AsyncRead,
                &bps,
                device_bytes,
                what,
                Some(&bufs),
            )
            .await;
            (bps, stored)
        });
        self.window.push_back(Slot::Run {
            blocks,
            budget_bytes,
            device_bytes,
            read,
            done: None,
        });
        true
    }

    /// The slots at the front of the window that are done, as items for the writer.
    fn take_done(&mut self) -> Result<Handed> {
        let mut handed = Handed {
            items: Vec::new(),
            budget_bytes: 0,
        };
        // Bounded by the window.
        loop {
            match self.window.front_mut() {
                Some(Slot::Free { first, count }) => {
                    handed.items.push(Item::Free {
                        first: *first,
                        count: *count,
                    });
                }
                Some(Slot::Run {
                    blocks,
                    budget_bytes,
                    done: done @ Some(_),
                    ..
                }) => {
                    let (bps, stored) = done.take().expect("matched Some");
                    handed.budget_bytes += *budget_bytes;
                    for ((&block, bp), stored) in blocks.iter().zip(bps).zip(stored) {
                        let stored = stored?;
                        if stored.len() < bp.psize_bytes as usize {
                            return Err(EngineError::invalid(format!(
                                "{}: block {block} read {} bytes, its pointer says {}",
                                self.what,
                                stored.len(),
                                bp.psize_bytes
                            )));
                        }
                        handed.items.push(Item::Data { block, bp, stored });
                    }
                }
                _ => break,
            }
            self.window.pop_front();
        }
        Ok(handed)
    }
}

/// The reader thread: walks the tree and reads the changed blocks through a sliding window
/// of runs ([`Reader`]); hands them on in order (an error as the last message). Returns the
/// indirect blocks it read and the most bytes it had in flight.
fn read_ahead(
    spa: &Spa,
    source: &Source,
    leg: &Leg,
    prefetch_bytes_max: u64,
    budget: &Budget,
    tx: mpsc::Sender<Result<Handed>>,
) -> ReadFigures {
    let what = format!("{}@{}", source.full_name, leg.to.name);
    let in_flight_bytes_max = SEND_READS_IN_FLIGHT_BYTES_MAX.min(prefetch_bytes_max);
    let run_bytes_max = READ_RUN_BYTES_MAX.min(in_flight_bytes_max / 4).max(1);
    // As many buffers as runs can be held at once: in flight, and read but not yet written
    // (a huge read-ahead keeps no more than a thousand).
    let runs_held = (in_flight_bytes_max.saturating_add(prefetch_bytes_max))
        .div_ceil(run_bytes_max)
        .saturating_add(2)
        .min(1024);
    let mut reader = Reader {
        spa,
        what: &what,
        budget,
        tx: tx.clone(),
        bufs: RunBufs::new(runs_held as usize),
        walker: Some(walker(spa, source, leg)),
        walking: None,
        walk_ended: false,
        walked: VecDeque::new(),
        walked_bytes: 0,
        window: VecDeque::new(),
        in_flight_bytes: 0,
        in_flight_bytes_max,
        run_bytes_max,
        figures: ReadFigures::default(),
    };
    let result = oxpool_io::rt::block_on(poll_fn(|cx| reader.poll(cx)));
    if let Err(e) = result {
        let _ = tx.send(Err(e));
    }
    std::mem::take(&mut reader.figures)
}

/// Most slices one vectored write is given (Linux's `IOV_MAX`).
const WRITE_SLICES_MAX: usize = 1024;

/// Writes every byte of `slices`, as few system calls as the output takes.
fn put_all(out: &mut dyn Write, mut slices: &mut [IoSlice<'_>]) -> Result<()> {
    // Bounded: every round writes at least one byte or fails.
    while !slices.is_empty() {
        let n = slices.len().min(WRITE_SLICES_MAX);
        match out.write_vectored(&slices[..n]) {
            Ok(0) => {
                return Err(EngineError::io(
                    "send stream",
                    std::io::Error::from(std::io::ErrorKind::WriteZero),
                ))
            }
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(EngineError::io("send stream", e)),
        }
    }
    Ok(())
}

/// Writes stream bytes.
fn put(out: &mut dyn Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes)
        .map_err(|e| EngineError::io("send stream", e))
}
