//! The intent log: synchronous writes durable in milliseconds, in parallel, with group commit.
//!
//! Every change to a volume (write, trim, write-zeroes) appends an in-memory record (an itx)
//! tagged with its txg. A commit (FLUSH, FUA, `sync=always`) makes every itx up to a point
//! durable by writing them into log blocks, a chain on disk: each block names the next one,
//! whose place is allocated before the block is written. Replay at import applies the records
//! newer than the last committed txg.
//!
//! Group commit, as OpenZFS's ZIL after PR 10163:
//! - A committer that finds records not yet in a block becomes the builder: it moves every
//!   pending record (its own and everyone else's) into the open block. Data of a record is
//!   fetched at that moment (the volume's current content under a read range lock), so writes
//!   that are never committed cost no copy.
//! - A full block is issued at once. The last, partly filled block is issued at once when the
//!   committer is alone (queue depth 1 never waits), and otherwise left open for a short window
//!   (a tenth of the measured log-block latency, within 20 us..1 ms) so that concurrent
//!   committers share its write and its flush.
//! - Blocks are written outside the lock; several may be in flight. A block counts as durable
//!   only when it and every block before it in the chain are written and flushed, because
//!   replay stops at the first block missing.
//! - Every committer waits asynchronously on the log's waker list; no thread is held.
//! - On a log write error the committer falls back to waiting for the txg sync, and the next
//!   txg sync starts a new chain.

use crate::dsl::dataset::{DatasetLog, LogPersist};
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::vdev::Leaf;
use crate::{EngineError, Result};
use oxpool_format::{
    BlockPtr, Dva, Guid, LogBlockWriter, LogRecord, Txg, VdevId, VolumeId, LOG_BLOCK_BYTES_MAX,
    LOG_RECORD_HEADER_BYTES,
};
use oxpool_io::{DurableWriteMode, IoBuf};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

/// Shortest and longest time the last block stays open for concurrent committers.
pub(crate) const OPEN_WINDOW_MIN: Duration = Duration::from_micros(20);
pub(crate) const OPEN_WINDOW_MAX: Duration = Duration::from_millis(1);
/// Sequence numbers skipped when a chain restarts, so no block of an abandoned chain can ever
/// be mistaken for one of the new chain.
pub(crate) const SEQ_RESTART_GAP: u64 = 1 << 32;
/// Closed log blocks one build collects before it stops taking records (128 KiB each at
/// most): enough for every request a connection can have in flight, and a bound on what one
/// builder holds in memory.
pub(crate) const BUILD_CLOSED_BLOCKS_MAX: usize = 16;
/// On a device where either way to a durable log block may be faster
/// ([`DurableWriteMode::Measure`]: a pool file), the way not in use is tried again at most
/// this often, so the log notices when the other has become faster (the machine got busy or
/// quiet): often enough to follow the load, seldom enough that a trial of the slow way
/// (milliseconds per block when it is the bound-worker stall) costs about 1 % of the time.
pub(crate) const DURABLE_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// A trial of write + flush replaces durable writes only if its mean is below this share
/// (in percent) of theirs: on a quiet machine the durable write saves a wake-up (median 60
/// against 69 us) but the two means differ by a few percent, well inside the noise of
/// sixteen blocks with heavy tails, so without a margin the choice was a coin toss; on a
/// busy one write + flush is three to ten times faster and clears it easily.
pub(crate) const DURABLE_FLUSH_WINS_BELOW_PERCENT: u128 = 75;
/// Blocks of one trial of the way not in use, and the fewest blocks of the way in use a
/// trial is compared with: both ways have heavy tails under load (one block in ten, or
/// most, waiting a scheduler slice), so one block says little; the mean of sixteen does.
pub(crate) const DURABLE_TRIAL_BLOCKS: u64 = 16;
/// Early writes (`zvol/log_early.rs`) only for a volume that committed this recently: writes
/// that no commit follows (a bulk copy, a sequential fill) must not pay for a log block each.
/// A database commits every few milliseconds at most while it writes.
pub(crate) const EARLY_AFTER_COMMIT: Duration = Duration::from_millis(20);
/// Early writes between two commits: the first of a commit's writes is what a commit record
/// or a single-write transaction races; a transaction of several writes gets the rest built
/// into one block at its commit instead of a block each.
pub(crate) const EARLY_BLOCKS_PER_COMMIT: u32 = 2;
/// Early writes only for this much pending data (bytes written by clients) ...
pub(crate) const EARLY_PENDING_BYTES_MAX: u64 = 32 << 10;
/// ... in at most this many changes: the pattern of a commit record, not a burst.
pub(crate) const EARLY_PENDING_ITXS_MAX: usize = 4;
/// Bound on the waker list (waiters re-register on every poll; duplicates are dropped).
pub(crate) const WAITERS_MAX: usize = 1 << 16;
/// Bound on the chain of blocks written since the persisted head (a txg sync trims it).
pub(crate) const CHAIN_BLOCKS_MAX: usize = 1 << 20;

/// What an itx records.
#[derive(Clone, Debug)]
pub(crate) enum ItxKind {
    /// A write; data copied at write time (`Some`, for writes committed right away) or fetched
    /// from the volume when the record is built (`None`).
    Write {
        offset_bytes: u64,
        length_bytes: u64,
        data: Option<Arc<[u8]>>,
    },
    /// A trim.
    Free {
        offset_bytes: u64,
        length_bytes: u64,
    },
    /// A write of zeros.
    Zero {
        offset_bytes: u64,
        length_bytes: u64,
    },
}

#[derive(Debug)]
pub(crate) struct Itx {
    pub(crate) seq: u64,
    pub(crate) txg: Txg,
    pub(crate) kind: ItxKind,
}

/// The block being filled.
pub(crate) struct OpenBlock {
    pub(crate) seq: u64,
    pub(crate) addr: Dva,
    /// Place of the next block, allocated before this one is written.
    pub(crate) next: Dva,
    pub(crate) buf: IoBuf,
    pub(crate) writer: LogBlockWriter,
    /// Lowest and highest itx seq with a record in this block.
    pub(crate) itx_first: u64,
    pub(crate) itx_last: u64,
    pub(crate) max_txg: Txg,
    /// When the block must be issued even if not full (set when committers are concurrent).
    pub(crate) deadline: Option<Instant>,
    /// The blocks written in place for this block's indirect records: their vdevs are
    /// flushed with the log block, so the records never point at data that is not durable.
    pub(crate) in_place: Vec<InPlaceRecord>,
}

/// A block written in place that an indirect record of an open log block points at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InPlaceRecord {
    pub(crate) txg: Txg,
    /// Its index in the volume.
    pub(crate) index: u64,
    pub(crate) bp: BlockPtr,
    /// [`service_stamp`] taken before it was written.
    pub(crate) service_stamp: u64,
}

impl OpenBlock {
    /// The vdevs holding the blocks written in place for its records, each once.
    pub(crate) fn in_place_vdevs(&self) -> Vec<VdevId> {
        let mut vdevs = Vec::new();
        // Bounded by the block's records and their copies.
        for d in self.in_place.iter().flat_map(|r| r.bp.dvas()) {
            if !vdevs.contains(&d.vdev) {
                vdevs.push(d.vdev);
            }
        }
        vdevs
    }

    /// The oldest [`service_stamp`] of its blocks written in place (the figure only grows).
    pub(crate) fn in_place_stamp(&self) -> Option<u64> {
        self.in_place.iter().map(|r| r.service_stamp).min()
    }
}

/// A block written (or being written) since the persisted head.
#[derive(Debug)]
pub(crate) struct ChainBlock {
    pub(crate) seq: u64,
    pub(crate) addr: Dva,
    pub(crate) itx_first: u64,
    pub(crate) max_txg: Txg,
    /// Written and flushed.
    pub(crate) done: bool,
    /// Written without a flush (an early write, `zvol/log.rs`): durable once a flush of its
    /// device that began after the write completed has completed; until then not `done`.
    pub(crate) unflushed: bool,
    /// [`service_stamp`] taken before its early write (with `unflushed`).
    pub(crate) service_stamp: u64,
    /// The write or flush failed: never durable, and the durable point never passes it.
    pub(crate) failed: bool,
}

impl ChainBlock {
    /// Its write (or its durable write's flush) has not completed yet.
    pub(crate) fn in_flight(&self) -> bool {
        !self.done && !self.failed && !self.unflushed
    }
}

/// How one log block is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DurableWay {
    /// Every copy one durable (FUA) write.
    Fua,
    /// Every copy written, then every device involved flushed.
    WriteThenFlush,
}

impl DurableWay {
    fn other(self) -> DurableWay {
        match self {
            DurableWay::Fua => DurableWay::WriteThenFlush,
            DurableWay::WriteThenFlush => DurableWay::Fua,
        }
    }
}

/// The log's choice between the two ways to a durable block, on a device that lets it
/// choose: the way in use, whose blocks are measured, and every [`DURABLE_PROBE_INTERVAL`] a
/// trial of [`DURABLE_TRIAL_BLOCKS`] blocks the other way; the way with the lower mean time
/// from write to durable is used until the next trial, write + flush only if clearly lower
/// ([`DURABLE_FLUSH_WINS_BELOW_PERCENT`]).
#[derive(Debug)]
pub(crate) struct DurableChoice {
    pub(crate) way: DurableWay,
    /// Blocks made durable the way in use since the last decision, and their summed time.
    in_use_blocks: u64,
    in_use_ns: u64,
    trial: Option<DurableTrial>,
    /// When the last trial ended (`None`: none yet).
    decided_at: Option<Instant>,
}

#[derive(Debug)]
struct DurableTrial {
    started_at: Instant,
    issued_blocks: u64,
    measured_blocks: u64,
    measured_ns: u64,
}

impl DurableChoice {
    fn new() -> DurableChoice {
        DurableChoice {
            way: DurableWay::Fua,
            in_use_blocks: 0,
            in_use_ns: 0,
            trial: None,
            decided_at: None,
        }
    }

    /// The way for the next block, at `now`.
    fn choose(&mut self, now: Instant) -> DurableWay {
        if let Some(t) = &mut self.trial {
            if t.issued_blocks < DURABLE_TRIAL_BLOCKS {
                t.issued_blocks += 1;
                return self.way.other();
            }
            // A trial block that never reports (its write failed) must not stall the choice.
            if now.saturating_duration_since(t.started_at) >= DURABLE_PROBE_INTERVAL {
                self.decide(now);
            }
            return self.way;
        }
        let due = self
            .decided_at
            .is_none_or(|d| now.saturating_duration_since(d) >= DURABLE_PROBE_INTERVAL);
        if due && self.in_use_blocks >= DURABLE_TRIAL_BLOCKS {
            self.trial = Some(DurableTrial {
                started_at: now,
                issued_blocks: 1,
                measured_blocks: 0,
                measured_ns: 0,
            });
            return self.way.other();
        }
        self.way
    }

    /// A block made durable `way` took `took_ns`.
    fn note(&mut self, way: DurableWay, took_ns: u64, now: Instant) {
        if way == self.way {
            self.in_use_blocks += 1;
            self.in_use_ns += took_ns;
            return;
        }
        let Some(t) = &mut self.trial else {
            // A trial block finishing after its trial was decided: old news.
            return;
        };
        t.measured_blocks += 1;
        t.measured_ns += took_ns;
        if t.measured_blocks >= DURABLE_TRIAL_BLOCKS {
            self.decide(now);
        }
    }

    /// Ends the trial: the other way becomes the way in use if its blocks took less on
    /// average than those of the way in use since the last decision.
    fn decide(&mut self, now: Instant) {
        let Some(t) = self.trial.take() else {
            return;
        };
        self.decided_at = Some(now);
        // trial_ns / trial_blocks < share * in_use_ns / in_use_blocks, without division.
        let share_percent = match self.way.other() {
            DurableWay::WriteThenFlush => DURABLE_FLUSH_WINS_BELOW_PERCENT,
            DurableWay::Fua => 100,
        };
        let trial_wins = t.measured_blocks > 0
            && u128::from(t.measured_ns) * u128::from(self.in_use_blocks) * 100
                < u128::from(self.in_use_ns) * u128::from(t.measured_blocks) * share_percent;
        if trial_wins {
            self.way = self.way.other();
            self.in_use_blocks = t.measured_blocks;
            self.in_use_ns = t.measured_ns;
        } else {
            self.in_use_blocks = 0;
            self.in_use_ns = 0;
        }
    }
}

pub(crate) struct ZilState {
    pub(crate) pending: VecDeque<Itx>,
    pub(crate) next_itx: u64,
    /// Every itx with a smaller seq is durable (in a durable block, or its txg synced).
    pub(crate) durable_itx: u64,
    pub(crate) open: Option<OpenBlock>,
    pub(crate) building: bool,
    /// Lowest itx seq of the batch a builder took out of `pending` and has not placed yet.
    pub(crate) building_first: Option<u64>,
    /// A build failed after taking records out of `pending`: those records are in no block,
    /// so the durable point stays below the lowest of them until the txg holding the newest
    /// of them has synced (then the pool has them).
    pub(crate) lost_floor: Option<(u64, Txg)>,
    /// Blocks of consecutive seqs, oldest first.
    pub(crate) chain: VecDeque<ChainBlock>,
    /// No block of the chain below this seq is still unwritten: where the search for the
    /// first unwritten block resumes, so advancing the durable point is O(1) amortised, not a
    /// walk over a chain of tens of thousands of blocks at every commit.
    pub(crate) chain_done_below_seq: u64,
    /// Where the next block to open goes, and its seq. `None` until the first commit.
    pub(crate) next_addr: Option<(Dva, u64)>,
    /// Seq of the chain's first block, used when `next_addr` is first allocated.
    pub(crate) first_seq: u64,
    /// The txg whose sync persists the place of the chain's first block: no block may be
    /// written before it is durable, or import would not find the chain.
    pub(crate) anchor_txg: Txg,
    pub(crate) waiters: Vec<Waker>,
    pub(crate) latency_ewma_ns: u64,
    pub(crate) committers: u32,
    /// A log write failed: commits wait for txg syncs until the next sync restarts the chain.
    pub(crate) broken: bool,
    /// `logcommit=serial`: a commit is running (one at a time).
    pub(crate) serial_busy: bool,
    /// Bytes used by the last blocks closed (for the size of the next ones), newest last.
    pub(crate) recent_used_bytes: VecDeque<u64>,
    /// Blocks no longer needed, to free at the next txg sync.
    pub(crate) to_free: Vec<Dva>,
    /// While import replays the chain it found: that chain, persisted as the head by every
    /// sync until the replay is done (see [`ReplayHold`]).
    pub(crate) replay_hold: Option<ReplayHold>,
    /// Test hook ([`Volume::set_log_alloc_fault`]): log-block allocations left before every
    /// further one fails as if the pool were full.
    pub(crate) alloc_ok_left: Option<u64>,
    /// How blocks are made durable on a device that lets the log choose.
    pub(crate) durable: DurableChoice,
    /// Early writes (blocks written ahead of their commit, without a flush) in progress: at
    /// most one at a time.
    pub(crate) early_in_flight: u32,
    /// A committer is flushing blocks written early (one at a time; the others wait for it).
    pub(crate) flushing: bool,
    /// When the last commit began or ended: early writes are for volumes whose writes are
    /// followed by commits.
    pub(crate) last_commit: Option<Instant>,
    /// Early writes since the last commit began (at most [`EARLY_BLOCKS_PER_COMMIT`]).
    pub(crate) early_since_commit: u32,
    /// The last commit began while no other was running: its clients commit one at a time.
    /// Where commits overlap, group commit shares blocks and flushes among them, and a block
    /// written early would add a write and a flush instead of saving one.
    pub(crate) last_commit_alone: bool,
}

/// The chain import is replaying. A sync may commit in the middle of the replay (the dirty
/// data of a long replay, the txg timeout); until the last record is applied, each one
/// persists this chain as the head, its places as held, and the txg its records are newer
/// than (`dsl::dataset::REPLAY_TXG_KEY`), so a crash in the middle replays the whole chain again (records
/// overwrite ranges with fixed contents, in order: applying a prefix twice changes nothing).
/// Freeing the chain, or filtering its records by the txg the later sync committed (whose
/// numbers follow the imported txg, as the crashed run's did), would lose the records not yet
/// replayed. As OpenZFS keeps the ZIL header on the old chain, with its replay sequence,
/// until `zil_replay` is done.
pub(crate) struct ReplayHold {
    /// The chain's first block and its sequence number, as the imported txg persisted them.
    pub(crate) first: (Dva, u64),
    /// Every place of it the log owns (see spa/claim.rs), freed once the replay is done.
    pub(crate) places: Vec<Dva>,
    /// Only records of txgs after this one are replayed.
    pub(crate) txg: Txg,
}

/// One volume's intent log.
pub(crate) struct Zil {
    pub(crate) pool_guid: Guid,
    pub(crate) volume: VolumeId,
    pub(crate) state: Mutex<ZilState>,
}

impl Zil {
    /// A new, empty log whose first block will have sequence number `first_seq`; `to_free`
    /// are blocks of an older chain (replayed at import), freed by the next txg sync.
    pub fn new(pool_guid: Guid, volume: VolumeId, first_seq: u64, to_free: Vec<Dva>) -> Zil {
        Zil {
            pool_guid,
            volume,
            state: Mutex::new(ZilState {
                pending: VecDeque::new(),
                next_itx: 1,
                durable_itx: 1,
                open: None,
                building: false,
                building_first: None,
                lost_floor: None,
                chain: VecDeque::new(),
                chain_done_below_seq: 0,
                next_addr: None,
                first_seq: first_seq.max(1),
                anchor_txg: Txg(0),
                waiters: Vec::new(),
                latency_ewma_ns: 1_000_000,
                committers: 0,
                broken: false,
                serial_busy: false,
                recent_used_bytes: VecDeque::new(),
                to_free,
                replay_hold: None,
                alloc_ok_left: None,
                durable: DurableChoice::new(),
                early_in_flight: 0,
                flushing: false,
                last_commit: None,
                early_since_commit: 0,
                last_commit_alone: false,
            }),
        }
    }

    /// Records a change made in `txg`; returns its itx seq. Called with the change's range
    /// lock held, so overlapping changes are logged in the order they were made.
    pub fn append(&self, txg: Txg, kind: ItxKind) -> u64 {
        let mut s = self.state.lock().unwrap();
        let seq = s.next_itx;
        s.next_itx += 1;
        s.pending.push_back(Itx { seq, txg, kind });
        seq
    }

    /// The seq of the last itx appended (0 if none).
    pub fn last_itx(&self) -> u64 {
        self.state.lock().unwrap().next_itx - 1
    }

    /// Called by the txg sync after txg `synced` committed: itxs of that txg and older are
    /// durable through the pool and leave the log; done blocks at the front of the chain whose
    /// records all belong to such txgs are no longer needed and are freed by the next sync.
    pub fn txg_synced(&self, synced: Txg) {
        let mut s = self.state.lock().unwrap();
        s.pending.retain(|i| i.txg > synced);
        if s.lost_floor.is_some_and(|(_, t)| t <= synced) {
            s.lost_floor = None;
        }
        s.advance_durable();
        // Bounded by the chain's length.
        while let Some(front) = s.chain.front() {
            // Only a durable block leaves, even when its records are all synced: the persisted
            // head may name it, and replay reaches the blocks after it only through it. A
            // block written early stays until a flush covers it (the next commit's).
            if front.done && front.max_txg <= synced {
                let b = s.chain.pop_front().unwrap();
                s.to_free.push(b.addr);
            } else {
                break;
            }
        }
        // Committers re-check: their txg may be durable now.
        let waiters = std::mem::take(&mut s.waiters);
        drop(s);
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Whether import handed this log an old chain to free (then a sync must follow).
    pub fn reserved_on_import_is_empty(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.to_free.is_empty() && s.replay_hold.is_none()
    }

    /// Import found records to replay on the chain at `first`: until [`Zil::end_replay`],
    /// every sync persists that chain and `places` as the log's (see [`ReplayHold`]).
    pub fn hold_for_replay(&self, first: (Dva, u64), places: Vec<Dva>, txg: Txg) {
        let mut s = self.state.lock().unwrap();
        assert!(s.replay_hold.is_none(), "one replay at a time");
        s.replay_hold = Some(ReplayHold { first, places, txg });
    }

    /// Every record of the held chain is applied: its places are freed by the next sync,
    /// which also persists this log's own head.
    pub fn end_replay(&self) {
        let mut s = self.state.lock().unwrap();
        if let Some(h) = s.replay_hold.take() {
            s.to_free.extend(h.places);
        }
    }

    /// After a log error: abandon the chain (called by the txg sync that just committed
    /// `synced`). The next commit anchors a new chain at a fresh place, and that anchor's txg
    /// sync makes every record of the old chain redundant. Blocks that will never be written
    /// (the open block, whose committers all fall back to the txg, and blocks closed by a build
    /// that failed) are dropped with the rest; their records of txgs not yet synced set the
    /// lost floor, so the durable point cannot pass them before their txg has synced.
    /// Waits (does nothing) while a block is still being written or built.
    pub fn restart_if_broken(&self, synced: Txg) {
        let mut s = self.state.lock().unwrap();
        if !s.broken
            || s.building
            || s.early_in_flight > 0
            || s.chain.iter().any(ChainBlock::in_flight)
        {
            return;
        }
        let mut dropped: Vec<(u64, Txg)> = Vec::new();
        if let Some(o) = s.open.take() {
            dropped.push((o.itx_first, o.max_txg));
            s.to_free.push(o.addr);
        }
        // Replay stops at the first block not written: from there on, written or not, no
        // block's records are durable through this chain.
        let blocks: Vec<ChainBlock> = s.chain.drain(..).collect();
        let mut reachable = true;
        for c in blocks {
            reachable &= c.done;
            if !reachable {
                dropped.push((c.itx_first, c.max_txg));
            }
            s.to_free.push(c.addr);
        }
        for (first, max_txg) in dropped {
            if max_txg > synced {
                s.lose_records(first, max_txg);
            }
        }
        if let Some((addr, seq)) = s.next_addr.take() {
            s.to_free.push(addr);
            s.first_seq = seq + SEQ_RESTART_GAP;
        }
        s.broken = false;
        let waiters = std::mem::take(&mut s.waiters);
        drop(s);
        waiters.into_iter().for_each(Waker::wake);
    }
}

impl ZilState {
    /// Every place the log holds.
    pub(crate) fn reserved(&self) -> Vec<Dva> {
        let mut v: Vec<Dva> = self.chain.iter().map(|c| c.addr).collect();
        v.extend(self.open.as_ref().map(|o| o.addr));
        v.extend(self.next_addr.map(|(a, _)| a));
        v.extend(
            self.replay_hold
                .iter()
                .flat_map(|h| h.places.iter().copied()),
        );
        v
    }

    /// The head to persist in the volume's metadata: the chain being replayed, else the
    /// first block still needed, else where the next block goes.
    pub(crate) fn head(&self) -> Option<(Dva, u64)> {
        if let Some(h) = &self.replay_hold {
            return Some(h.first);
        }
        if let Some(c) = self.chain.front() {
            return Some((c.addr, c.seq));
        }
        if let Some(o) = &self.open {
            return Some((o.addr, o.seq));
        }
        self.next_addr
    }

    /// Size for the next block's place, chosen before the block it follows is written: big
    /// enough for the largest of the recent blocks' contents (commits come in similar bursts),
    /// so a queue-depth-1 writer uses small blocks and a busy one large ones (as ZFS's
    /// zil_lwb_predict, simplified).
    pub(crate) fn predict_block_bytes(&self) -> u64 {
        let recent = self.recent_used_bytes.iter().copied().max().unwrap_or(0);
        recent
            .next_multiple_of(oxpool_format::SECTOR_BYTES)
            .clamp(LOG_BLOCK_BYTES_MIN, LOG_BLOCK_BYTES_MAX as u64)
    }

    /// How to make the next block durable, at `now`, on a device that makes a write
    /// durable fastest by `device` (see [`device_durable_mode`]): as it says, or where it
    /// lets the log choose, by [`DurableChoice`].
    pub(crate) fn choose_durable_way(
        &mut self,
        device: DurableWriteMode,
        now: Instant,
    ) -> DurableWay {
        match device {
            DurableWriteMode::Fua => DurableWay::Fua,
            DurableWriteMode::WriteThenFlush => DurableWay::WriteThenFlush,
            DurableWriteMode::Measure => self.durable.choose(now),
        }
    }

    /// A block made durable `way` on a device that lets the log choose took `took_ns`
    /// from its write to durable; `now` is when it was done.
    pub(crate) fn note_durable(&mut self, way: DurableWay, took_ns: u64, now: Instant) {
        self.durable.note(way, took_ns, now);
    }

    /// A build failed with records of seqs >= `first` (txgs up to `max_txg`) out of `pending`
    /// and in no block that will be written: the durable point must not pass them, and
    /// commits fall back to the txg. `unissued` are blocks the build closed and will not issue:
    /// marked failed, so the txg sync can restart the chain (see
    /// [`Zil::restart_if_broken`]) instead of waiting forever for them to be written.
    pub(crate) fn fail_batch(&mut self, first: u64, max_txg: Txg, unissued: &[OpenBlock]) {
        self.building_first = None;
        self.broken = true;
        for b in unissued {
            if let Some(c) = self.chain_block_mut(b.seq) {
                c.failed = true;
            }
        }
        self.lose_records(first, max_txg);
    }

    /// Records of seqs >= `first` (txgs up to `max_txg`) are in no block that will be written:
    /// only the sync of `max_txg` makes them durable.
    pub(crate) fn lose_records(&mut self, first: u64, max_txg: Txg) {
        self.lost_floor = Some(match self.lost_floor {
            Some((s, t)) => (s.min(first), t.max(max_txg)),
            None => (first, max_txg),
        });
    }

    /// Whether a commit up to itx `target` must wait for the txg: the log is broken, or some
    /// record at or below `target` is in no block that will be written.
    pub(crate) fn needs_txg(&self, target: u64) -> bool {
        self.broken || self.lost_floor.is_some_and(|(seq, _)| seq <= target)
    }

    /// Allocates the place of a log block (see [`alloc_log_block`]), unless the test hook says
    /// the pool is full.
    pub(crate) fn alloc_block(&mut self, inner: &Spa, size_bytes: u64) -> Option<Dva> {
        match self.alloc_ok_left {
            Some(0) => return None,
            Some(n) => self.alloc_ok_left = Some(n - 1),
            None => {}
        }
        alloc_log_block(inner, size_bytes)
    }

    /// Moves the durable point up to the lowest itx that may still be lost: pending, being
    /// built, in the open block, or in the first block not yet written. Everything below it is
    /// in a written block or belongs to a synced txg.
    pub(crate) fn advance_durable(&mut self) {
        let mut c = self.next_itx;
        if let Some(i) = self.pending.front() {
            c = c.min(i.seq);
        }
        if let Some(b) = self.building_first {
            c = c.min(b);
        }
        if let Some((seq, _)) = self.lost_floor {
            c = c.min(seq);
        }
        if let Some(o) = &self.open {
            c = c.min(o.itx_first);
        }
        if let Some(u) = self.first_unwritten() {
            c = c.min(u.itx_first);
        }
        self.durable_itx = self.durable_itx.max(c);
    }

    /// The chain's block of sequence number `seq` (the chain's seqs are consecutive).
    pub(crate) fn chain_block_mut(&mut self, seq: u64) -> Option<&mut ChainBlock> {
        let first = self.chain.front()?.seq;
        let b = self
            .chain
            .get_mut(usize::try_from(seq.checked_sub(first)?).ok()?)?;
        debug_assert_eq!(b.seq, seq, "chain seqs are consecutive");
        Some(b)
    }

    /// Whether an early write may start now: a commit began or ended within
    /// [`EARLY_AFTER_COMMIT`] (writes on this volume are followed by commits), and began
    /// while no other commit ran (its clients commit one at a time), the log is idle (no commit, build,
    /// open block, early write or flush in progress), sound, anchored at a place named by a
    /// synced txg, and what is pending is a few small changes (copied into the block, never
    /// written in place).
    pub(crate) fn early_write_allowed(&self, synced: Txg, now: Instant) -> bool {
        let small = self.pending.len() <= EARLY_PENDING_ITXS_MAX
            && self
                .pending
                .iter()
                .map(|i| match i.kind {
                    ItxKind::Write { length_bytes, .. } => length_bytes,
                    ItxKind::Free { .. } | ItxKind::Zero { .. } => 0,
                })
                .sum::<u64>()
                <= EARLY_PENDING_BYTES_MAX;
        small
            && self.last_commit_alone
            && self.early_since_commit < EARLY_BLOCKS_PER_COMMIT
            && self
                .last_commit
                .is_some_and(|t| now.saturating_duration_since(t) <= EARLY_AFTER_COMMIT)
            && self.committers == 0
            && !self.building
            && self.open.is_none()
            && self.early_in_flight == 0
            && !self.flushing
            && !self.broken
            && !self.serial_busy
            && self.lost_floor.is_none()
            && !self.pending.is_empty()
            && self.next_addr.is_some()
            && synced >= self.anchor_txg
    }

    /// The blocks written early and not flushed since, oldest first.
    pub(crate) fn unflushed_blocks(&mut self) -> Vec<EarlyBlock> {
        let Some(first) = self.first_unwritten().map(|b| b.seq) else {
            return Vec::new();
        };
        let front = self.chain.front().map_or(first, |b| b.seq);
        // Bounded by the chain's blocks not yet durable: those in flight and those unflushed.
        self.chain
            .range((first - front) as usize..)
            .filter(|b| b.unflushed)
            .map(|b| EarlyBlock {
                seq: b.seq,
                vdev: b.addr.vdev,
                service_stamp: b.service_stamp,
            })
            .collect()
    }

    /// After a flush that began once the blocks `seqs` were written: they are durable (`ok`),
    /// or never will be (the log is broken, and its commits wait for the txg).
    pub(crate) fn flushed(&mut self, seqs: &[u64], ok: bool) {
        for &seq in seqs {
            if let Some(c) = self.chain_block_mut(seq) {
                if c.unflushed {
                    c.unflushed = false;
                    if ok {
                        c.done = true;
                    } else {
                        c.failed = true;
                    }
                }
            }
        }
        if !ok {
            self.broken = true;
        }
        self.advance_durable();
    }

    /// The chain's first block not written yet.
    pub(crate) fn first_unwritten(&mut self) -> Option<&ChainBlock> {
        let first = self.chain.front()?.seq;
        let mut seq = self.chain_done_below_seq.max(first);
        // Bounded by the chain's length; each block is passed once over its life.
        while self
            .chain
            .get((seq - first) as usize)
            .is_some_and(|b| b.done)
        {
            seq += 1;
        }
        self.chain_done_below_seq = seq;
        self.chain.get((seq - first) as usize)
    }
}

/// A block written early and not flushed since (`ZilState::unflushed_blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EarlyBlock {
    pub(crate) seq: u64,
    pub(crate) vdev: VdevId,
    /// [`service_stamp`] taken before the block's write.
    pub(crate) service_stamp: u64,
}

/// Adds the vdevs of `blocks` to `vdevs`, each once: the devices a flush covering those
/// blocks must flush.
pub(crate) fn add_vdevs_of(blocks: &[EarlyBlock], vdevs: &mut Vec<VdevId>) {
    for b in blocks {
        if !vdevs.contains(&b.vdev) {
            vdevs.push(b.vdev);
        }
    }
}

/// The pool's count of changes to which devices get I/O ([`VdevTree::service_stamp`]),
/// taken before a plain write the log depends on.
///
/// Why: a block written without FUA is durable only on the devices that wrote it and were
/// flushed after. A flush reaches the devices in service when it starts: if one that wrote
/// the block left service in between (faulted, offlined, removed, detached), the block may
/// be durable on none, for instance on a mirror whose other child failed that very write
/// (the write still counts as good with one copy). So a plain write and the flush that
/// makes it durable count only if no such change began or was under way from before the
/// write to after the flush ([`in_service_since`]); otherwise the log treats the flush as
/// failed and its commits wait for the txg sync. Pool-wide: such changes are rare, and one
/// figure covers every copy of a block wherever it is.
///
/// [`VdevTree::service_stamp`]: crate::vdev::VdevTree::service_stamp
pub(crate) fn service_stamp(inner: &Spa) -> u64 {
    inner.zio.vdevs.service_stamp()
}

/// An error if the devices that get I/O may have changed since [`service_stamp`] gave
/// `stamp` (a flush that just ended may not cover what was written after the stamp), or a
/// device added to a vdev is not yet recorded by a durable txg (a write it alone took is
/// not where an import would look).
pub(crate) fn in_service_since(inner: &Spa, stamp: u64) -> Result<()> {
    if inner.zio.vdevs.in_service_since(stamp) {
        return Ok(());
    }
    Err(EngineError::io(
        &inner.name,
        std::io::Error::other(
            "the devices that get I/O changed during a log write, or a device added is not \
             yet recorded durably",
        ),
    ))
}

/// [`in_service_since`] for each of `blocks`, from its own stamp.
pub(crate) fn early_blocks_in_service(inner: &Spa, blocks: &[EarlyBlock]) -> Result<()> {
    blocks
        .iter()
        .try_for_each(|b| in_service_since(inner, b.service_stamp))
}

pub(crate) fn register(waiters: &mut Vec<Waker>, w: &Waker) {
    if !waiters.iter().any(|x| x.will_wake(w)) {
        assert!(waiters.len() < WAITERS_MAX, "log waiter list overflow");
        waiters.push(w.clone());
    }
}

/// Smallest log block allocated.
pub(crate) const LOG_BLOCK_BYTES_MIN: u64 = 8 << 10;

/// Allocates the place of one log block of `size_bytes` (one copy; on a mirror the mirror is
/// the redundancy). Log space piles up until a txg sync trims the chains, so a lot of it
/// asks for a sync. On the pool's data vdevs the block must leave the pending txg syncs the
/// space they may need ([`Spa::may_allocate_outside_sync`]): else None, and the commit
/// waits for the txg instead (as ZFS's ZIL when the pool is nearly full).
pub(crate) fn alloc_log_block(inner: &Spa, size_bytes: u64) -> Option<Dva> {
    let size = size_bytes.clamp(LOG_BLOCK_BYTES_MIN, LOG_BLOCK_BYTES_MAX as u64);
    let (dva, pool_bytes) = {
        let mut st = inner.state.lock().unwrap();
        let mut extra = crate::vdev::alloc::ClassBytes::default();
        extra.add_blocks(size, 1, 1);
        let data_ok = inner.may_allocate_outside_sync(&mut st.alloc, extra);
        let keep = inner.keep(&st.alloc, &st.alloc.space(), false);
        // Not on a log vdev whose devices are all out of service (faulted, gone, offline):
        // the block's write would fail and the commit wait for the txg.
        let vdevs = &inner.zio.vdevs;
        let dva = st.alloc.alloc_log(size, data_ok, &keep, |v| {
            vdevs
                .top(v)
                .is_some_and(|t| t.leaves_in_service().next().is_some())
        })?;
        // Under the state lock, as the audit reads it (`dsl/audit.rs`).
        inner.log_blocks_allocated.fetch_add(1, Ordering::SeqCst);
        (dva, st.alloc.totals_bytes().0)
    };
    let since = inner
        .log_alloc_bytes_since_sync
        .fetch_add(size, Ordering::Relaxed)
        + size;
    // A quarter of dirty_max (log bytes are dirty data in all but name), and never more than
    // a sixteenth of the pool, since freed log space comes back only DEFER_TXGS syncs later.
    let dirty_max = inner.txg.state.lock().unwrap().dirty_max_bytes;
    let limit = (dirty_max / 4).max(16 << 20).min(pool_bytes / 16);
    if since > limit {
        inner.txg.kick();
    }
    Some(dva)
}

/// Releases the serial lock of `logcommit=serial`.
pub(crate) struct SerialGuard<'a>(pub(crate) &'a Zil);

impl Drop for SerialGuard<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut s = self.0.state.lock().unwrap();
            s.serial_busy = false;
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// A record ready to go into a block.
pub(crate) enum Built {
    Write {
        txg: Txg,
        offset_bytes: u64,
        data: Arc<[u8]>,
    },
    Indirect {
        txg: Txg,
        offset_bytes: u64,
        length_bytes: u64,
        bp: BlockPtr,
        /// [`service_stamp`] taken before the block was written.
        service_stamp: u64,
    },
    Free {
        txg: Txg,
        offset_bytes: u64,
        length_bytes: u64,
    },
    Zero {
        txg: Txg,
        offset_bytes: u64,
        length_bytes: u64,
    },
}

impl Built {
    /// The record as it goes into a block (a write's data is split by `place`, not here).
    pub(crate) fn record(&self) -> LogRecord<'_> {
        match *self {
            Built::Write {
                txg,
                offset_bytes,
                ref data,
            } => LogRecord::Write {
                txg,
                offset_bytes,
                data,
            },
            Built::Indirect {
                txg,
                offset_bytes,
                length_bytes,
                bp,
                ..
            } => LogRecord::Indirect {
                txg,
                offset_bytes,
                length_bytes,
                bp,
            },
            Built::Free {
                txg,
                offset_bytes,
                length_bytes,
            } => LogRecord::Free {
                txg,
                offset_bytes,
                length_bytes,
            },
            Built::Zero {
                txg,
                offset_bytes,
                length_bytes,
            } => LogRecord::Zero {
                txg,
                offset_bytes,
                length_bytes,
            },
        }
    }
}

/// Closes the open block: from this moment it is in the chain, not yet written, so the durable
/// point cannot pass its records whatever block finishes first.
pub(crate) fn take_open(s: &mut ZilState) -> Option<OpenBlock> {
    let o = s.open.take()?;
    Some(close(s, o))
}

pub(crate) fn close(s: &mut ZilState, o: OpenBlock) -> OpenBlock {
    debug_assert!(o.writer.record_count() > 0);
    // A full block means the burst was bigger than predicted: ask for the most next time.
    let used = if o.writer.free_bytes() < LOG_RECORD_HEADER_BYTES + 8 {
        LOG_BLOCK_BYTES_MAX as u64
    } else {
        o.writer.used_bytes() as u64
    };
    if s.recent_used_bytes.len() == 8 {
        s.recent_used_bytes.pop_front();
    }
    s.recent_used_bytes.push_back(used);
    assert!(
        s.chain.len() < CHAIN_BLOCKS_MAX,
        "log chain not trimmed by txg syncs"
    );
    debug_assert!(s.chain.back().is_none_or(|c| c.seq + 1 == o.seq));
    s.chain.push_back(ChainBlock {
        seq: o.seq,
        addr: o.addr,
        itx_first: o.itx_first,
        max_txg: o.max_txg,
        done: false,
        failed: false,
        unflushed: false,
        service_stamp: 0,
    });
    o
}

/// Bytes a log block at `addr` holds: its allocated size, or on a raidz vdev the largest
/// block whose data, parity and skip sectors fit there (at most `LOG_BLOCK_BYTES_MAX`).
pub(crate) fn log_block_capacity(zio: &crate::zio::Zio, addr: &Dva) -> usize {
    match raidz_log_block(zio, addr) {
        Some((_, capacity)) => capacity,
        None => addr.asize_bytes as usize,
    }
}

/// For a log block place on a raidz vdev: the place its block takes (the first part of the
/// allocation: the block of the capacity's size) and its capacity. None on other vdevs.
fn raidz_log_block(zio: &crate::zio::Zio, addr: &Dva) -> Option<(Dva, usize)> {
    let layout = zio.vdevs.top(addr.vdev)?.raidz_layout()?;
    let capacity = layout
        .psize_bytes_max(u64::from(addr.asize_bytes))
        .min(LOG_BLOCK_BYTES_MAX as u64);
    let dva = Dva {
        asize_bytes: layout.asize_bytes(capacity) as u32,
        ..*addr
    };
    (capacity > 0).then_some((dva, capacity as usize))
}

/// Reads the log block of `volume` with sequence `seq` at `addr` on a raidz vdev, rebuilding
/// what parity allows; None if the place holds no such block (the end of the chain).
async fn read_raidz_log_block(
    zio: &crate::zio::Zio,
    addr: &Dva,
    pool_guid: Guid,
    volume: VolumeId,
    seq: u64,
) -> Option<IoBuf> {
    let top = zio.vdevs.top(addr.vdev)?;
    let (dva, capacity) = raidz_log_block(zio, addr)?;
    // The decoder wants the block in one piece: each verification copies it (import only).
    let scratch = std::cell::RefCell::new(vec![0u8; capacity]);
    let verify = |cols: &crate::vdev::raidz::DataColumns<'_>| {
        let mut buf = scratch.borrow_mut();
        cols.copy_to(&mut buf[..cols.len_bytes()]);
        oxpool_format::decode_log_block(&buf[..capacity], pool_guid, volume, seq).is_ok()
    };
    let read = crate::zio::raidz::read_raidz_with(
        zio,
        IoClass::SyncRead,
        top,
        &dva,
        capacity as u64,
        None,
        verify,
        crate::vdev::raidz::ReadMode::Normal,
        false,
        "log block",
    )
    .await;
    read.ok().map(|(buf, _, _)| buf)
}

/// How the devices of `addr`'s vdev make a write durable fastest: FUA if every one says so,
/// write then flush if any says so, else measure.
pub(crate) fn device_durable_mode(inner: &Spa, addr: &Dva) -> DurableWriteMode {
    let Some(top) = inner.zio.vdevs.top(addr.vdev) else {
        return DurableWriteMode::Fua;
    };
    let mut mode = DurableWriteMode::Fua;
    for l in top.leaves_in_service() {
        match l.backend.durable_write_mode() {
            DurableWriteMode::WriteThenFlush => return DurableWriteMode::WriteThenFlush,
            DurableWriteMode::Measure => mode = DurableWriteMode::Measure,
            DurableWriteMode::Fua => {}
        }
    }
    mode
}

/// Writes a log block (one copy, every child of its vdev) and makes it durable together with
/// the blocks its records point to.
///
/// When the block is all its commit needs (no record points at a block written in place;
/// earlier blocks of the chain are durable on their own, see `advance_durable`) and `way`
/// says so, every copy is a durable (FUA) write and there is no flush: one I/O instead of a
/// write, a wait, and a flush. Otherwise the block is written plainly and every device
/// involved is flushed, because a FUA write makes nothing else durable; a pool file may ask
/// for this too ([`DurableWriteMode::Measure`]: the filesystem finishes a durable direct
/// write on a kernel worker bound to one CPU, which made commits wait milliseconds whenever
/// that CPU was busy). A durable write counts as one device flush: on a device without FUA
/// (most virtual disks, files) the kernel flushes the cache for it. A plain write and its
/// flush fail if the devices that get I/O changed between them ([`in_service_since`]).
pub(crate) async fn write_durably(
    inner: &Spa,
    addr: &Dva,
    also_flush: &[VdevId],
    data: IoBuf,
    way: DurableWay,
) -> Result<()> {
    let zio = &inner.zio;
    let (written, data) = log_block_place(zio, addr, data);
    let stamp = service_stamp(inner);
    if also_flush.is_empty() && way == DurableWay::Fua {
        crate::zio::write_block_owned(zio, IoClass::SyncWrite, &[written], data, true).await?;
        // Durable on each device that took it; but a member added meanwhile, or not yet
        // recorded durably, may be the only one that did (`VdevTree::swap_shape_adding`).
        in_service_since(inner, stamp)?;
        let copies = zio
            .vdevs
            .top(addr.vdev)
            .map_or(0, |top| top.leaves_in_service().count()) as u64;
        let counters = &inner.log_counters;
        counters.durable_writes.fetch_add(copies, Ordering::Relaxed);
        counters.flushes.fetch_add(copies, Ordering::Relaxed);
        counters.device_flushes.fetch_add(copies, Ordering::Relaxed);
        return Ok(());
    }
    crate::zio::write_block_owned(zio, IoClass::SyncWrite, &[written], data, false).await?;
    let mut vdevs = vec![addr.vdev];
    vdevs.extend(also_flush.iter().filter(|v| **v != addr.vdev));
    flush_log_vdevs(inner, &vdevs).await?;
    in_service_since(inner, stamp)
}

/// Writes a log block without making it durable (an early write, `zvol/log_early.rs`): a
/// later flush of its vdev's devices does.
pub(crate) async fn write_unflushed(inner: &Spa, addr: &Dva, data: IoBuf) -> Result<()> {
    let zio = &inner.zio;
    let (written, data) = log_block_place(zio, addr, data);
    crate::zio::write_block_owned(zio, IoClass::SyncWrite, &[written], data, false).await?;
    Ok(())
}

/// Where a log block's `data` is written and what: only the used part (whole sectors), the
/// rest of the place staying as it was; on a raidz vdev the block's whole capacity (the rest
/// zeros), because the reader knows the place only, and the columns and parity depend on the
/// block's size.
fn log_block_place(zio: &crate::zio::Zio, addr: &Dva, data: IoBuf) -> (Dva, IoBuf) {
    match raidz_log_block(zio, addr) {
        Some((dva, capacity)) => {
            debug_assert!(data.len() <= capacity);
            let mut whole = IoBuf::zeroed(capacity);
            whole[..data.len()].copy_from_slice(&data);
            (dva, whole)
        }
        None => (
            Dva {
                asize_bytes: data.len() as u32,
                ..*addr
            },
            data,
        ),
    }
}

/// Flushes every device in service of `vdevs`: each must have flushed, because the records
/// and the blocks they point to live there. A failing device makes the log fall back to txg
/// syncs, which tolerate it.
pub(crate) async fn flush_log_vdevs(inner: &Spa, vdevs: &[VdevId]) -> Result<()> {
    let mut leaves: Vec<Arc<Leaf>> = Vec::new();
    for &v in vdevs {
        let top = inner
            .zio
            .vdevs
            .top(v)
            .ok_or_else(|| EngineError::invalid("log block on a missing vdev"))?;
        leaves.extend(top.leaves_in_service());
    }
    let futs: Vec<_> = leaves.iter().map(|l| l.flush()).collect();
    let mut last = None;
    for (l, r) in leaves.iter().zip(oxpool_io::rt::join_all(futs).await) {
        inner.log_counters.flushes.fetch_add(1, Ordering::Relaxed);
        inner
            .log_counters
            .device_flushes
            .fetch_add(1, Ordering::Relaxed);
        if let Err(e) = r {
            last = Some(EngineError::io(l.name(), e));
        }
    }
    match last {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// What [`Volume::write_in_place`] did with one whole block of a sync write.
pub(crate) enum InPlace {
    /// Written in place (by index in the volume), for the txg sync to adopt.
    Written(u64, crate::zio::compress::InPlaceBlock),
    /// All zeros with compression on: nothing written, logged as a zeroing.
    Zeros(u64),
}

/// Replay of one volume's log at import: the records newer than the committed txg, in order.
pub(crate) struct Replay {
    /// Records to apply (owned copies).
    pub records: Vec<ReplayRecord>,
    /// Blocks of the chain (claimed; freed after the replay's sync).
    pub blocks: Vec<Dva>,
    /// Seq after the last valid block.
    pub end_seq: u64,
    /// Blocks written in place for replayed records (claimed; freed after the replay).
    pub indirect_blocks: Vec<Dva>,
}

/// An owned log record.
#[derive(Debug)]
pub(crate) enum ReplayRecord {
    Write {
        offset_bytes: u64,
        data: Vec<u8>,
    },
    Free {
        offset_bytes: u64,
        length_bytes: u64,
    },
    Zero {
        offset_bytes: u64,
        length_bytes: u64,
    },
}

/// Walks a volume's chain from `first` and collects the records newer than `synced`.
/// Stops at the first block that does not decode as the next of this chain.
pub(crate) async fn read_chain(
    zio: &crate::zio::Zio,
    pool_guid: Guid,
    volume: VolumeId,
    first: Dva,
    first_seq: u64,
    synced: Txg,
) -> Replay {
    let mut out = Replay {
        records: Vec::new(),
        blocks: Vec::new(),
        end_seq: first_seq,
        indirect_blocks: Vec::new(),
    };
    let mut addr = first;
    let mut seq = first_seq;
    for _ in 0..CHAIN_BLOCKS_MAX {
        if addr.asize_bytes == 0
            || zio
                .vdevs
                .top(addr.vdev)
                .is_none_or(|t| addr.end_bytes() > t.asize_bytes)
        {
            break;
        }
        // Each child of a mirror holds a copy; a torn one fails its checksum, so try each. A
        // raidz vdev holds one copy, in columns.
        let mut found = read_raidz_log_block(zio, &addr, pool_guid, volume, seq).await;
        for io in zio
            .vdevs
            .top(addr.vdev)
            .into_iter()
            .flat_map(|t| t.plan_read(&addr))
        {
            let Ok(buf) = io
                .leaf
                .backend
                .read(io.offset_bytes, IoBuf::zeroed(addr.asize_bytes as usize))
                .await
            else {
                continue;
            };
            if oxpool_format::decode_log_block(&buf, pool_guid, volume, seq).is_ok() {
                found = Some(buf);
                break;
            }
        }
        let Some(buf) = found else { break };
        let (hdr, records) = oxpool_format::decode_log_block(&buf, pool_guid, volume, seq)
            .expect("decoded just above");
        for r in oxpool_format::log_records(records) {
            let Ok(r) = r else { break };
            if r.txg() <= synced {
                continue;
            }
            out.records.push(match r {
                LogRecord::Write {
                    offset_bytes, data, ..
                } => ReplayRecord::Write {
                    offset_bytes,
                    data: data.to_vec(),
                },
                LogRecord::Indirect {
                    offset_bytes,
                    length_bytes,
                    bp,
                    ..
                } => {
                    // A block that reached the media without its flush may point at data that
                    // did not: that record was never acknowledged, and nothing after it was
                    // (a block counts only once every block before it is flushed). The log
                    // ends there.
                    // The record's length is the block's: a compressed block is decompressed to
                    // exactly that (bounded by the record decoder), never to a size the
                    // pointer alone claims.
                    let read = crate::zio::read_data_block(
                        zio,
                        IoClass::SyncRead,
                        &bp,
                        length_bytes as usize,
                        "log indirect block",
                    )
                    .await;
                    match read {
                        Ok(block) if (length_bytes as usize) <= block.content.len() => {
                            out.indirect_blocks.extend_from_slice(bp.dvas());
                            ReplayRecord::Write {
                                offset_bytes,
                                data: block.content[..length_bytes as usize].to_vec(),
                            }
                        }
                        _ => {
                            tracing::warn!(
                                "log of volume {} ends at block {seq}: an in-place block of it is unreadable",
                                volume.0
                            );
                            // Its place is the log's all the same (claimed, freed once), so
                            // that a later walk, after another crash, finds the same end.
                            out.blocks.push(addr);
                            return out;
                        }
                    }
                }
                LogRecord::Free {
                    offset_bytes,
                    length_bytes,
                    ..
                } => ReplayRecord::Free {
                    offset_bytes,
                    length_bytes,
                },
                LogRecord::Zero {
                    offset_bytes,
                    length_bytes,
                    ..
                } => ReplayRecord::Zero {
                    offset_bytes,
                    length_bytes,
                },
            });
        }
        out.blocks.push(addr);
        addr = hdr.next;
        seq += 1;
        out.end_seq = seq;
    }
    out
}

impl DatasetLog for Zil {
    fn persist(&self) -> LogPersist {
        let mut s = self.state.lock().unwrap();
        LogPersist {
            to_free: std::mem::take(&mut s.to_free),
            reserved: s.reserved(),
            head: s.head(),
            replay_txg: s.replay_hold.as_ref().map(|h| h.txg),
        }
    }

    /// With the blocks it no longer needs: still allocated until the next sync frees them.
    fn reserved(&self) -> Vec<Dva> {
        let s = self.state.lock().unwrap();
        let mut places = s.reserved();
        places.extend_from_slice(&s.to_free);
        places
    }

    fn txg_synced(&self, txg: Txg) {
        Zil::txg_synced(self, txg);
        self.restart_if_broken(txg);
    }

    /// Marks the log broken if a place it holds is on `vdev`: as after a log write error,
    /// commits wait for the txg, and the next sync abandons the chain
    /// ([`Zil::restart_if_broken`]) and frees its places; the next commit anchors a new
    /// chain where the allocator now places log blocks. The records of the abandoned chain
    /// are covered by that sync's txg. A chain import is replaying is kept until its replay
    /// ends (the remover then finds its blocks still there and says so).
    fn leave_vdev(&self, vdev: VdevId) {
        let mut s = self.state.lock().unwrap();
        if s.replay_hold.is_none() && s.reserved().iter().any(|d| d.vdev == vdev) {
            s.broken = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a device that lets the log choose (a pool file): the first blocks go the durable
    /// (FUA) way, then a trial of the other; the way with the lower mean wins; one trial of
    /// the way not in use per interval and no more; the choice follows when the other way
    /// becomes faster (the machine gets quiet); a trial whose blocks never report ends after
    /// an interval. Devices that say how are never second-guessed.
    #[test]
    fn durable_way_follows_the_lower_mean_and_tries_the_other_once_per_interval() {
        use DurableWay::{Fua, WriteThenFlush as Split};
        const N: u64 = DURABLE_TRIAL_BLOCKS;
        let zil = Zil::new(Guid(1), VolumeId(1), 1, Vec::new());
        let mut s = zil.state.lock().unwrap();
        let m = DurableWriteMode::Measure;
        let t0 = Instant::now();
        let busy = |w: DurableWay| if w == Fua { 3_500_000 } else { 150_000 };
        let quiet = |w: DurableWay| if w == Fua { 40_000 } else { 150_000 };
        // Runs `blocks` blocks one at a time over [from, from + span), each taking what
        // `cost` says; returns how many went each way.
        let run = |s: &mut ZilState,
                   from: Instant,
                   span: Duration,
                   blocks: u32,
                   cost: &dyn Fn(DurableWay) -> u64| {
            let mut ways = (0u64, 0u64);
            for k in 0..blocks {
                let now = from + span * k / blocks;
                let w = s.choose_durable_way(m, now);
                if w == Fua {
                    ways.0 += 1;
                } else {
                    ways.1 += 1;
                }
                s.note_durable(w, cost(w), now);
            }
            ways
        };
        // Busy: N durable writes, then a trial of N write + flush, which wins.
        assert_eq!(run(&mut s, t0, Duration::ZERO, 2 * N as u32, &busy), (N, N));
        assert_eq!(s.durable.way, Split);
        // Three intervals later: exactly one trial of FUA per interval, each lost.
        let ways = run(&mut s, t0, DURABLE_PROBE_INTERVAL * 3, 3000, &busy);
        assert_eq!(ways, (2 * N, 3000 - 2 * N), "trials of the slow way");
        assert_eq!(s.durable.way, Split);
        // Quiet: the next trial of FUA wins, and FUA stays in use.
        let t1 = t0 + DURABLE_PROBE_INTERVAL * 4;
        let ways = run(&mut s, t1, DURABLE_PROBE_INTERVAL / 2, 100, &quiet);
        assert_eq!(ways, (100, 0), "{:?}", s.durable);
        assert_eq!(s.durable.way, Fua);
        // Write + flush must be clearly faster to replace durable writes: 80 % is not enough.
        let t15 = t1 + DURABLE_PROBE_INTERVAL;
        let close = |w: DurableWay| if w == Fua { 100_000 } else { 80_000 };
        let ways = run(&mut s, t15, DURABLE_PROBE_INTERVAL / 2, 100, &close);
        assert_eq!(ways, (100 - N, N), "one trial");
        assert_eq!(s.durable.way, Fua, "{:?}", s.durable);
        // A trial whose blocks never report is decided after an interval, with what came.
        let t2 = t1 + DURABLE_PROBE_INTERVAL * 3;
        for _ in 0..N {
            assert_eq!(s.choose_durable_way(m, t2), Split);
        }
        assert_eq!(
            s.choose_durable_way(m, t2),
            Fua,
            "trial issued, not reported"
        );
        assert!(s.durable.trial.is_some());
        s.note_durable(Split, 150_000, t2);
        let t3 = t2 + DURABLE_PROBE_INTERVAL;
        assert_eq!(s.choose_durable_way(m, t3), Fua);
        assert!(s.durable.trial.is_none(), "the trial ended");
        assert_eq!(s.choose_durable_way(DurableWriteMode::Fua, t3), Fua);
        assert_eq!(
            s.choose_durable_way(DurableWriteMode::WriteThenFlush, t3),
            Split
        );
    }

    /// A replay's chain is persisted as the head, its places as held and its txg, in one
    /// read with the places to free; once the replay ends the places move to the frees of
    /// the same kind of read, never in neither list.
    #[test]
    fn a_held_replay_is_persisted_until_it_ends_then_freed_once() {
        let zil = Zil::new(Guid(1), VolumeId(1), 1 << 40, Vec::new());
        let place = |o: u64| Dva {
            vdev: oxpool_format::VdevId(0),
            offset_bytes: o << 12,
            asize_bytes: 8192,
        };
        let first = (place(10), 7);
        zil.hold_for_replay(first, vec![place(10), place(12)], Txg(4));
        assert!(!zil.reserved_on_import_is_empty());
        for _ in 0..2 {
            let p = DatasetLog::persist(&zil);
            assert_eq!(p.head, Some(first));
            assert_eq!(p.reserved, vec![place(10), place(12)]);
            assert_eq!(p.replay_txg, Some(Txg(4)));
            assert!(p.to_free.is_empty());
        }
        zil.end_replay();
        let p = DatasetLog::persist(&zil);
        assert_eq!((p.head, p.replay_txg), (None, None));
        assert!(p.reserved.is_empty());
        assert_eq!(p.to_free, vec![place(10), place(12)]);
        assert!(DatasetLog::persist(&zil).to_free.is_empty(), "freed twice");
        assert!(zil.reserved_on_import_is_empty());
    }

    /// The lost floor: records a failed build took out of `pending` are in no block, so the
    /// durable point must not pass them, neither when a later block of the chain is written
    /// (it chains past them) nor when an older txg syncs; only the sync of their own txg may.
    #[test]
    pub(crate) fn durable_point_stays_below_records_of_a_failed_build() {
        let zil = Zil::new(Guid(1), VolumeId(1), 1, Vec::new());
        let kind = || ItxKind::Free {
            offset_bytes: 0,
            length_bytes: 4096,
        };
        let lost = zil.append(Txg(5), kind());
        zil.append(Txg(6), kind());
        let later = zil.append(Txg(6), kind());
        {
            let mut s = zil.state.lock().unwrap();
            // A build takes the first two and fails before they are in a block.
            s.pending.drain(..2);
            s.fail_batch(lost, Txg(6), &[]);
            // The next record goes into a block that is written.
            s.pending.pop_front();
            s.chain.push_back(ChainBlock {
                seq: 1,
                addr: Dva::default(),
                itx_first: later,
                max_txg: Txg(6),
                done: true,
                failed: false,
                unflushed: false,
                service_stamp: 0,
            });
            s.advance_durable();
            assert_eq!(s.durable_itx, lost, "passed records that are in no block");
        }
        zil.txg_synced(Txg(5));
        assert_eq!(zil.state.lock().unwrap().durable_itx, lost);
        zil.txg_synced(Txg(6));
        assert_eq!(zil.state.lock().unwrap().durable_itx, later + 1);
    }
}
