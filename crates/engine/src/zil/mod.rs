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

use crate::spa::PoolInner;
use crate::vdev::queue::IoClass;
use crate::vdev::Leaf;
use crate::{EngineError, Result, Volume};
use oxpool_format::{
    BlockPtr, Dva, Guid, LogBlockHeader, LogBlockWriter, LogRecord, Txg, VdevId, VolumeId,
    LOG_BLOCK_BYTES_MAX, LOG_RECORD_DATA_BYTES_MAX, LOG_RECORD_HEADER_BYTES,
};
use oxpool_io::IoBuf;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// Shortest and longest time the last block stays open for concurrent committers.
const OPEN_WINDOW_MIN: Duration = Duration::from_micros(20);
const OPEN_WINDOW_MAX: Duration = Duration::from_millis(1);
/// Sequence numbers skipped when a chain restarts, so no block of an abandoned chain can ever
/// be mistaken for one of the new chain.
pub(crate) const SEQ_RESTART_GAP: u64 = 1 << 32;
/// Closed log blocks one build collects before it stops taking records (128 KiB each at
/// most): enough for every request a connection can have in flight, and a bound on what one
/// builder holds in memory.
const BUILD_CLOSED_BLOCKS_MAX: usize = 16;
/// Bound on the waker list (waiters re-register on every poll; duplicates are dropped).
const WAITERS_MAX: usize = 1 << 16;
/// Bound on the chain of blocks written since the persisted head (a txg sync trims it).
const CHAIN_BLOCKS_MAX: usize = 1 << 20;

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
struct Itx {
    seq: u64,
    txg: Txg,
    kind: ItxKind,
}

/// The block being filled.
struct OpenBlock {
    seq: u64,
    addr: Dva,
    /// Place of the next block, allocated before this one is written.
    next: Dva,
    buf: IoBuf,
    writer: LogBlockWriter,
    /// Lowest and highest itx seq with a record in this block.
    itx_first: u64,
    itx_last: u64,
    max_txg: Txg,
    /// When the block must be issued even if not full (set when committers are concurrent).
    deadline: Option<Instant>,
    /// Vdevs holding blocks written in place for this block's indirect records: flushed with
    /// the log block, so the records never point at data that is not durable.
    flush_vdevs: Vec<VdevId>,
}

/// A block written (or being written) since the persisted head.
#[derive(Debug)]
struct ChainBlock {
    seq: u64,
    addr: Dva,
    itx_first: u64,
    max_txg: Txg,
    /// Written and flushed.
    done: bool,
    /// The write or flush failed: never durable, and the durable point never passes it.
    failed: bool,
}

/// Counters of the intent log, pool-wide.
#[derive(Debug, Default)]
pub struct LogCounters {
    /// Commit requests (FLUSH, FUA writes, sync=always writes).
    pub commits: AtomicU64,
    /// Log blocks written.
    pub blocks_written: AtomicU64,
    /// Bytes of log blocks written.
    pub bytes_written: AtomicU64,
    /// Device flushes issued by the log, durable (FUA) log-block writes included.
    pub flushes: AtomicU64,
    /// Log-block copies written durably (FUA) instead of written and flushed.
    pub durable_writes: AtomicU64,
    /// Nanoseconds log blocks took from their write's start (the block's copy and the device
    /// queue included) to durable (flush included), summed over
    /// [`LogCounters::blocks_written`]: the log's device latency, which bounds how fast a
    /// commit can be answered.
    pub write_ns_total: AtomicU64,
    /// Bytes clients wrote (every write, logged or not).
    pub client_bytes: AtomicU64,
    /// Bytes of data blocks the log wrote in place (indirect records), adopted by txg syncs.
    pub indirect_bytes: AtomicU64,
    /// Blocks written in place that a txg sync adopted instead of writing them again.
    pub adopted_blocks: AtomicU64,
    /// Device flushes of any kind (log commits and txg commits), one per leaf flushed.
    pub device_flushes: AtomicU64,
}

/// A snapshot of [`LogCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Commit requests.
    pub commits: u64,
    /// Log blocks written.
    pub blocks_written: u64,
    /// Bytes of log blocks written.
    pub bytes_written: u64,
    /// Device flushes issued by the log, durable (FUA) log-block writes included.
    pub flushes: u64,
    /// Log-block copies written durably (FUA) instead of written and flushed.
    pub durable_writes: u64,
    /// Nanoseconds from log-block write start to durable, summed.
    pub write_ns_total: u64,
    /// Bytes clients wrote.
    pub client_bytes: u64,
    /// Bytes of data blocks written in place by the log.
    pub indirect_bytes: u64,
    /// Blocks written in place that a txg sync adopted.
    pub adopted_blocks: u64,
    /// Device flushes of any kind, one per leaf flushed.
    pub device_flushes: u64,
}

impl LogStats {
    /// The counters as a one-line JSON object (for `oxpool iostat --json` and the benchmark).
    pub fn to_json(&self) -> String {
        format!(
            "{{\"commits\":{},\"log_blocks\":{},\"log_bytes\":{},\"log_flushes\":{},\"log_durable_writes\":{},\"log_write_us\":{},\"client_bytes\":{},\"indirect_bytes\":{},\"adopted_blocks\":{},\"device_flushes\":{}}}",
            self.commits,
            self.blocks_written,
            self.bytes_written,
            self.flushes,
            self.durable_writes,
            self.write_ns_total / 1000,
            self.client_bytes,
            self.indirect_bytes,
            self.adopted_blocks,
            self.device_flushes
        )
    }
}

impl LogCounters {
    /// A snapshot.
    pub fn stats(&self) -> LogStats {
        LogStats {
            commits: self.commits.load(Ordering::Relaxed),
            blocks_written: self.blocks_written.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            durable_writes: self.durable_writes.load(Ordering::Relaxed),
            write_ns_total: self.write_ns_total.load(Ordering::Relaxed),
            client_bytes: self.client_bytes.load(Ordering::Relaxed),
            indirect_bytes: self.indirect_bytes.load(Ordering::Relaxed),
            adopted_blocks: self.adopted_blocks.load(Ordering::Relaxed),
            device_flushes: self.device_flushes.load(Ordering::Relaxed),
        }
    }
}

struct ZilState {
    pending: VecDeque<Itx>,
    next_itx: u64,
    /// Every itx with a smaller seq is durable (in a durable block, or its txg synced).
    durable_itx: u64,
    open: Option<OpenBlock>,
    building: bool,
    /// Lowest itx seq of the batch a builder took out of `pending` and has not placed yet.
    building_first: Option<u64>,
    /// A build failed after taking records out of `pending`: those records are in no block,
    /// so the durable point stays below the lowest of them until the txg holding the newest
    /// of them has synced (then the pool has them).
    lost_floor: Option<(u64, Txg)>,
    /// Blocks of consecutive seqs, oldest first.
    chain: VecDeque<ChainBlock>,
    /// No block of the chain below this seq is still unwritten: where the search for the
    /// first unwritten block resumes, so advancing the durable point is O(1) amortised, not a
    /// walk over a chain of tens of thousands of blocks at every commit.
    chain_done_below_seq: u64,
    /// Where the next block to open goes, and its seq. `None` until the first commit.
    next_addr: Option<(Dva, u64)>,
    /// Seq of the chain's first block, used when `next_addr` is first allocated.
    first_seq: u64,
    /// The txg whose sync persists the place of the chain's first block: no block may be
    /// written before it is durable, or import would not find the chain.
    anchor_txg: Txg,
    waiters: Vec<Waker>,
    latency_ewma_ns: u64,
    committers: u32,
    /// A log write failed: commits wait for txg syncs until the next sync restarts the chain.
    broken: bool,
    /// `logcommit=serial`: a commit is running (one at a time).
    serial_busy: bool,
    /// Bytes used by the last blocks closed (for the size of the next ones), newest last.
    recent_used_bytes: VecDeque<u64>,
    /// Blocks no longer needed, to free at the next txg sync.
    to_free: Vec<Dva>,
    /// Test hook ([`Volume::set_log_alloc_fault`]): log-block allocations left before every
    /// further one fails as if the pool were full.
    alloc_ok_left: Option<u64>,
}

/// One volume's intent log.
pub(crate) struct Zil {
    pool_guid: Guid,
    volume: VolumeId,
    state: Mutex<ZilState>,
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
                alloc_ok_left: None,
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
        self.state.lock().unwrap().to_free.is_empty()
    }

    /// Every place the log holds (to persist: import frees them after replay).
    pub fn reserved(&self) -> Vec<Dva> {
        let s = self.state.lock().unwrap();
        let mut v: Vec<Dva> = s.chain.iter().map(|c| c.addr).collect();
        v.extend(s.open.as_ref().map(|o| o.addr));
        v.extend(s.next_addr.map(|(a, _)| a));
        v
    }

    /// The head to persist in the volume's metadata: the first block still needed, else where
    /// the next block goes.
    pub fn head(&self) -> Option<(Dva, u64)> {
        let s = self.state.lock().unwrap();
        if let Some(c) = s.chain.front() {
            return Some((c.addr, c.seq));
        }
        if let Some(o) = &s.open {
            return Some((o.addr, o.seq));
        }
        s.next_addr
    }

    /// Blocks to free in the txg being synced (no longer reachable from the head it persists).
    pub fn take_to_free(&self) -> Vec<Dva> {
        std::mem::take(&mut self.state.lock().unwrap().to_free)
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
        if !s.broken || s.building || s.chain.iter().any(|c| !c.done && !c.failed) {
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
    /// Size for the next block's place, chosen before the block it follows is written: big
    /// enough for the largest of the recent blocks' contents (commits come in similar bursts),
    /// so a queue-depth-1 writer uses small blocks and a busy one large ones (as ZFS's
    /// zil_lwb_predict, simplified).
    fn predict_block_bytes(&self) -> u64 {
        let recent = self.recent_used_bytes.iter().copied().max().unwrap_or(0);
        recent
            .next_multiple_of(oxpool_format::SECTOR_BYTES)
            .clamp(LOG_BLOCK_BYTES_MIN, LOG_BLOCK_BYTES_MAX as u64)
    }

    /// A build failed with records of seqs >= `first` (txgs up to `max_txg`) out of `pending`
    /// and in no block that will be written: the durable point must not pass them, and
    /// commits fall back to the txg. `unissued` are blocks the build closed and will not issue:
    /// marked failed, so the txg sync can restart the chain (see
    /// [`Zil::restart_if_broken`]) instead of waiting forever for them to be written.
    fn fail_batch(&mut self, first: u64, max_txg: Txg, unissued: &[OpenBlock]) {
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
    fn lose_records(&mut self, first: u64, max_txg: Txg) {
        self.lost_floor = Some(match self.lost_floor {
            Some((s, t)) => (s.min(first), t.max(max_txg)),
            None => (first, max_txg),
        });
    }

    /// Whether a commit up to itx `target` must wait for the txg: the log is broken, or some
    /// record at or below `target` is in no block that will be written.
    fn needs_txg(&self, target: u64) -> bool {
        self.broken || self.lost_floor.is_some_and(|(seq, _)| seq <= target)
    }

    /// Allocates the place of a log block (see [`alloc_log_block`]), unless the test hook says
    /// the pool is full.
    fn alloc_block(&mut self, inner: &PoolInner, size_bytes: u64) -> Option<Dva> {
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
    fn advance_durable(&mut self) {
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
    fn chain_block_mut(&mut self, seq: u64) -> Option<&mut ChainBlock> {
        let first = self.chain.front()?.seq;
        let b = self
            .chain
            .get_mut(usize::try_from(seq.checked_sub(first)?).ok()?)?;
        debug_assert_eq!(b.seq, seq, "chain seqs are consecutive");
        Some(b)
    }

    /// The chain's first block not written yet.
    fn first_unwritten(&mut self) -> Option<&ChainBlock> {
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

fn register(waiters: &mut Vec<Waker>, w: &Waker) {
    if !waiters.iter().any(|x| x.will_wake(w)) {
        assert!(waiters.len() < WAITERS_MAX, "log waiter list overflow");
        waiters.push(w.clone());
    }
}

/// Smallest log block allocated.
const LOG_BLOCK_BYTES_MIN: u64 = 8 << 10;

/// Allocates the place of one log block of `size_bytes` (one copy; on a mirror the mirror is
/// the redundancy). Log space piles up until a txg sync trims the chains, so a lot of it
/// asks for a sync. On the pool's data vdevs the block must leave the pending txg syncs the
/// space they may need ([`PoolInner::may_allocate_outside_sync`]): else None, and the commit
/// waits for the txg instead (as ZFS's ZIL when the pool is nearly full).
pub(crate) fn alloc_log_block(inner: &PoolInner, size_bytes: u64) -> Option<Dva> {
    let size = size_bytes.clamp(LOG_BLOCK_BYTES_MIN, LOG_BLOCK_BYTES_MAX as u64);
    let (dva, pool_bytes) = {
        let mut st = inner.state.lock().unwrap();
        let mut extra = crate::vdev::alloc::ClassBytes::default();
        extra.add_blocks(size, 1, 1);
        let data_ok = inner.may_allocate_outside_sync(&st.alloc, extra);
        let dva = st.alloc.alloc_log(size, data_ok)?;
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
pub(crate) struct SerialGuard<'a>(&'a Zil);

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
enum Built {
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
    fn record(&self) -> LogRecord<'_> {
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

impl Volume {
    /// Test hook: after `ok_count` more log-block allocations of this volume, every one fails
    /// as if the pool were full (`None`: never). A real full pool cannot be arranged to fail
    /// exactly in the middle of a build; this fails the same code path.
    #[doc(hidden)]
    pub fn set_log_alloc_fault(&self, ok_count: Option<u64>) {
        self.vol.zil.state.lock().unwrap().alloc_ok_left = ok_count;
    }

    /// Makes every change of this volume logged up to itx `target` durable.
    pub(crate) async fn zil_commit(&self, target: u64) -> Result<()> {
        let inner = &self.pool;
        let zil = &self.vol.zil;
        // An exported (or suspended) pool writes no log block.
        inner.txg.check_writable()?;
        inner.log_counters.commits.fetch_add(1, Ordering::Relaxed);
        let target_txg = inner.txg.state.lock().unwrap().open;
        zil.state.lock().unwrap().committers += 1;
        struct Leave<'a>(&'a Zil);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.state.lock().unwrap().committers -= 1;
            }
        }
        let _leave = Leave(zil);
        self.zil_anchor().await?;
        let serial = !inner.state.lock().unwrap().props.log_group_commit;
        if serial {
            return self.zil_commit_serial(target, target_txg).await;
        }
        // Bounded: each round builds, issues, or waits for an event that advances the log.
        loop {
            enum Next {
                Anchor,
                Done,
                Build,
                IssueAt(Instant),
                FallBack,
            }
            let next = poll_fn(|cx| {
                let mut s = zil.state.lock().unwrap();
                if inner.txg.synced() >= target_txg {
                    return Poll::Ready(Next::Done);
                }
                // A broken log may have lost records: only the txg vouches for them.
                if s.needs_txg(target) {
                    return Poll::Ready(Next::FallBack);
                }
                if s.durable_itx > target {
                    return Poll::Ready(Next::Done);
                }
                // The chain restarted since this commit anchored: anchor again first.
                if (s.next_addr.is_none() && s.open.is_none() && s.chain.is_empty())
                    || inner.txg.synced() < s.anchor_txg
                {
                    return Poll::Ready(Next::Anchor);
                }
                let ours_pending = s.pending.front().is_some_and(|i| i.seq <= target);
                if !s.building && ours_pending {
                    s.building = true;
                    return Poll::Ready(Next::Build);
                }
                // Records waiting in the open block (ours, or that ours may be behind): issue
                // it at its deadline, or decide now if it has none.
                if !s.building {
                    if let Some(o) = &s.open {
                        match o.deadline {
                            Some(d) => return Poll::Ready(Next::IssueAt(d)),
                            None => {
                                s.building = true;
                                return Poll::Ready(Next::Build);
                            }
                        }
                    }
                }
                register(&mut s.waiters, cx.waker());
                Poll::Pending
            })
            .await;
            match next {
                Next::Anchor => self.zil_anchor().await?,
                Next::Done => return Ok(()),
                Next::FallBack => return self.zil_wait_txg(target_txg).await,
                Next::Build => {
                    let (closed, r) = self.zil_build().await;
                    let waiters = {
                        let mut s = zil.state.lock().unwrap();
                        s.building = false;
                        std::mem::take(&mut s.waiters)
                    };
                    waiters.into_iter().for_each(Waker::wake);
                    // Written after the build is given up, so the next committer builds and
                    // issues its own block while these are in flight.
                    self.zil_issue_all(closed).await;
                    if let Err(e) = r {
                        tracing::warn!(
                            volume = self.vol.full_name,
                            "log commit failed, waiting for the txg: {e}"
                        );
                        zil.state.lock().unwrap().broken = true;
                    }
                }
                Next::IssueAt(deadline) => {
                    let now = Instant::now();
                    if deadline > now {
                        oxpool_io::rt::sleep(deadline - now).await;
                    }
                    // Whoever gets here first after the deadline issues the block.
                    let block = {
                        let mut s = zil.state.lock().unwrap();
                        let due = s
                            .open
                            .as_ref()
                            .is_some_and(|o| o.deadline.is_some_and(|d| d <= Instant::now()));
                        if due && !s.building {
                            take_open(&mut s)
                        } else {
                            None
                        }
                    };
                    if let Some(b) = block {
                        self.zil_issue(b).await;
                    }
                }
            }
        }
    }

    /// A commit that the log cannot answer waits for the sync of `txg`, the open txg when it
    /// began. Its records may all belong to an older txg (synced meanwhile), leaving `txg`
    /// empty: it is marked dirty so that it syncs anyway instead of waiting for the timeout.
    async fn zil_wait_txg(&self, txg: Txg) -> Result<()> {
        {
            let mut t = self.pool.txg.state.lock().unwrap();
            if t.open == txg {
                t.open_dirty = true;
            }
        }
        self.pool.txg.wait_synced(txg, true).await
    }

    /// A chain with no place yet gets one, persisted by a txg sync before any block of it is
    /// written (as OpenZFS's zil_create); every committer waits for that sync.
    async fn zil_anchor(&self) -> Result<()> {
        let inner = &self.pool;
        let zil = &self.vol.zil;
        let anchor = {
            let mut s = zil.state.lock().unwrap();
            if s.next_addr.is_none() && s.open.is_none() && s.chain.is_empty() {
                let no_space = || EngineError::NoSpace {
                    pool: inner.name.clone(),
                };
                let size = s.predict_block_bytes();
                let addr = s.alloc_block(inner, size).ok_or_else(no_space)?;
                s.next_addr = Some((addr, s.first_seq));
                // A txg whose sync has not begun: its metadata will name this place.
                inner.txg.mark_dirty();
                s.anchor_txg = inner.txg.state.lock().unwrap().open;
            }
            s.anchor_txg
        };
        if inner.txg.synced() < anchor {
            inner.txg.wait_synced(anchor, true).await?;
        }
        Ok(())
    }

    /// `logcommit=serial`: with the volume's serial lock held by the caller (see
    /// [`Volume::serial_guard`]), writes the records up to `target` in blocks of their own.
    async fn zil_commit_serial(&self, target: u64, target_txg: Txg) -> Result<()> {
        let zil = &self.vol.zil;
        let inner = &self.pool;
        let done = |s: &ZilState| s.durable_itx > target || inner.txg.synced() >= target_txg;
        let (is_done, broken) = {
            let s = zil.state.lock().unwrap();
            (done(&s), s.needs_txg(target))
        };
        if is_done {
            return Ok(());
        }
        if broken {
            return self.zil_wait_txg(target_txg).await;
        }
        zil.state.lock().unwrap().building = true;
        let (closed, r) = self.zil_build_upto(Some(target)).await;
        zil.state.lock().unwrap().building = false;
        self.zil_issue_all(closed).await;
        if let Err(e) = r {
            zil.state.lock().unwrap().broken = true;
            tracing::warn!(
                volume = self.vol.full_name,
                "log commit failed, waiting for the txg: {e}"
            );
        }
        let is_done = done(&zil.state.lock().unwrap());
        if is_done {
            Ok(())
        } else {
            self.zil_wait_txg(target_txg).await
        }
    }

    /// With `logcommit=serial`, a guard that lets one sync operation (a write and its commit, or
    /// a flush) run at a time on this volume; None otherwise.
    pub(crate) async fn serial_guard(&self) -> Option<SerialGuard<'_>> {
        if self.pool.state.lock().unwrap().props.log_group_commit {
            return None;
        }
        let zil = &self.vol.zil;
        poll_fn(|cx| {
            let mut s = zil.state.lock().unwrap();
            if !s.serial_busy {
                s.serial_busy = true;
                return Poll::Ready(());
            }
            register(&mut s.waiters, cx.waker());
            Poll::Pending
        })
        .await;
        Some(SerialGuard(zil))
    }

    /// Moves pending itxs into blocks; returns the blocks to write now, in chain order: the full
    /// ones, and the last one when this committer is alone (others committing too give it a
    /// deadline instead). The caller writes them after it has given up the build, so that
    /// nothing a new committer needs is held across a device write; an error comes with the
    /// blocks closed before it, whose records are sound.
    async fn zil_build(&self) -> (Vec<OpenBlock>, Result<()>) {
        self.zil_build_upto(None).await
    }

    /// Writes closed blocks, in chain order, at most [`BUILD_CLOSED_BLOCKS_MAX`] at a time
    /// (several log blocks may be in flight; each counts as durable only with every block
    /// before it).
    async fn zil_issue_all(&self, closed: Vec<OpenBlock>) {
        let mut closed = closed.into_iter();
        // Bounded: every round writes at least one block.
        loop {
            let window: Vec<OpenBlock> = closed.by_ref().take(BUILD_CLOSED_BLOCKS_MAX).collect();
            match window.len() {
                0 => return,
                1 => self.zil_issue(window.into_iter().next().unwrap()).await,
                _ => {
                    let futs: Vec<_> = window.into_iter().map(|b| self.zil_issue(b)).collect();
                    oxpool_io::rt::join_all(futs).await;
                }
            }
        }
    }

    /// [`Volume::zil_build`]; with `upto`, takes only itxs up to that seq and closes the last
    /// block at once (serial commits).
    async fn zil_build_upto(&self, upto: Option<u64>) -> (Vec<OpenBlock>, Result<()>) {
        let mut closed = Vec::new();
        let r = self.zil_build_into(upto, &mut closed).await;
        (closed, r)
    }

    /// The body of [`Volume::zil_build_upto`]: closed blocks go to `closed`. A group build
    /// stops taking records once [`BUILD_CLOSED_BLOCKS_MAX`] blocks wait to be written (the
    /// rest stays pending for the next builder), so one build holds at most one round of
    /// records (256) beyond that, as the build did before blocks were written after it.
    async fn zil_build_into(&self, upto: Option<u64>, closed: &mut Vec<OpenBlock>) -> Result<()> {
        let zil = &self.vol.zil;
        let synced = self.pool.txg.synced();
        // Bounded by the pending itxs, which only grow by concurrent writers; each round takes
        // what is there now.
        for _round in 0..64 {
            // A serial commit must place every record up to its target (else it falls back to
            // a txg sync): only group builds stop early, the next builder takes the rest.
            if upto.is_none() && closed.len() >= BUILD_CLOSED_BLOCKS_MAX {
                break;
            }
            let batch: Vec<Itx> = {
                let mut s = zil.state.lock().unwrap();
                let eligible = match upto {
                    Some(t) => s.pending.iter().take_while(|i| i.seq <= t).count(),
                    None => s.pending.len(),
                };
                let n = eligible.min(256);
                let batch: Vec<Itx> = s.pending.drain(..n).collect();
                s.building_first = batch.first().map(|i| i.seq);
                batch
            };
            let (batch_first, batch_max_txg) = {
                let first = batch.first().map(|i| i.seq).unwrap_or(0);
                let max_txg = batch.iter().map(|i| i.txg).max().unwrap_or(Txg(0));
                (first, max_txg)
            };
            if batch.is_empty() {
                break;
            }
            let mut built = Vec::with_capacity(batch.len());
            let props = self.vol.props.lock().unwrap().clone();
            // With a separate log device, logbias=latency copies everything into it (fast,
            // and the pool's devices see no extra random writes), as ZFS with a slog.
            let has_slog = self.pool.state.lock().unwrap().alloc.has_log_device();
            for itx in batch {
                if itx.txg <= synced {
                    built.push((itx.seq, None));
                    continue;
                }
                let rec = match itx.kind {
                    ItxKind::Write {
                        offset_bytes,
                        length_bytes,
                        data,
                    } => {
                        let data = match data {
                            Some(d) => d,
                            None => {
                                // The current content: anything newer that overlaps was
                                // appended after this itx and replays after it.
                                let mut buf = vec![0u8; length_bytes as usize];
                                if let Err(e) = self.read_uncounted(offset_bytes, &mut buf).await {
                                    // The read may have waited (for a shrink that cut the
                                    // range off, say) until the record's txg synced: then it
                                    // is durable already, and what it wrote may be gone.
                                    if itx.txg <= self.pool.txg.synced() {
                                        built.push((itx.seq, None));
                                        continue;
                                    }
                                    zil.state.lock().unwrap().fail_batch(
                                        batch_first,
                                        batch_max_txg,
                                        &[],
                                    );
                                    return Err(e);
                                }
                                Arc::from(buf)
                            }
                        };
                        let indirect = props.logbias_throughput
                            || (length_bytes > props.log_copy_max_bytes && !has_slog);
                        if indirect {
                            match self
                                .write_in_place(itx.txg, offset_bytes, &data, &props)
                                .await
                            {
                                Ok(recs) => {
                                    built.extend(recs.into_iter().map(|r| (itx.seq, Some(r))));
                                    continue;
                                }
                                Err(e) => {
                                    zil.state.lock().unwrap().fail_batch(
                                        batch_first,
                                        batch_max_txg,
                                        &[],
                                    );
                                    return Err(e);
                                }
                            }
                        }
                        Built::Write {
                            txg: itx.txg,
                            offset_bytes,
                            data,
                        }
                    }
                    ItxKind::Free {
                        offset_bytes,
                        length_bytes,
                    } => Built::Free {
                        txg: itx.txg,
                        offset_bytes,
                        length_bytes,
                    },
                    ItxKind::Zero {
                        offset_bytes,
                        length_bytes,
                    } => Built::Zero {
                        txg: itx.txg,
                        offset_bytes,
                        length_bytes,
                    },
                };
                built.push((itx.seq, Some(rec)));
            }
            // Place the records; full blocks are collected and issued after the lock.
            let mut full = Vec::new();
            {
                let mut s = zil.state.lock().unwrap();
                for (seq, rec) in built {
                    // An itx of a synced txg is durable already: it is simply dropped.
                    let Some(rec) = rec else { continue };
                    if let Err(e) = self.place(&mut s, seq, &rec, &mut full) {
                        s.fail_batch(batch_first, batch_max_txg, &full);
                        return Err(e);
                    }
                }
                s.building_first = None;
                s.advance_durable();
            }
            closed.append(&mut full);
        }
        // The last block: now, or after a short window if others are committing too.
        let issue_now = {
            let mut s = zil.state.lock().unwrap();
            let concurrent = s.committers > 1 && upto.is_none();
            let window = Duration::from_nanos(s.latency_ewma_ns / 10)
                .clamp(OPEN_WINDOW_MIN, OPEN_WINDOW_MAX);
            match s.open.as_mut() {
                Some(o) if concurrent => {
                    o.deadline.get_or_insert(Instant::now() + window);
                    None
                }
                Some(_) => take_open(&mut s),
                None => None,
            }
        };
        closed.extend(issue_now);
        Ok(())
    }

    /// Writes the whole volume blocks of a sync write in place now (data written once: the
    /// txg sync adopts them) and returns its records: indirect ones for the whole blocks,
    /// copied ones for the partial head and tail.
    async fn write_in_place(
        &self,
        txg: Txg,
        offset_bytes: u64,
        data: &Arc<[u8]>,
        props: &crate::props::VolumeProps,
    ) -> Result<Vec<Built>> {
        let bs = props.volblocksize_bytes as u64;
        let end = offset_bytes + data.len() as u64;
        let first_b = offset_bytes.div_ceil(bs);
        let end_b = end / bs;
        let mut out = Vec::new();
        if first_b >= end_b {
            out.push(Built::Write {
                txg,
                offset_bytes,
                data: data.clone(),
            });
            return Ok(out);
        }
        let head = (first_b * bs - offset_bytes) as usize;
        if head > 0 {
            out.push(Built::Write {
                txg,
                offset_bytes,
                data: Arc::from(&data[..head]),
            });
        }
        // How each block is stored (compressed, as is, or a hole) is decided here, on the
        // committer's thread, with the volume's `compression` as it is now: the block is
        // written now, as the txg sync would have written it.
        let futs: Vec<_> = (first_b..end_b)
            .map(|b| {
                let at = (b * bs - offset_bytes) as usize;
                let content = &data[at..at + bs as usize];
                let stored = crate::zio::compress::store_as(props.compression, content);
                async move {
                    crate::zio::compress::COMPRESS_COUNTERS.note_written(content.len(), &stored);
                    let nb = crate::spa::NewBlock::data(props, txg);
                    let (block, nb) = match stored {
                        // All zeros with compression on: the sync makes it a hole, so the
                        // log records a zeroing (replayed as write-zeroes: a hole too).
                        crate::zio::compress::StoreAs::Hole => {
                            return Ok::<_, EngineError>(InPlace::Zeros(b));
                        }
                        crate::zio::compress::StoreAs::AsIs => {
                            (Arc::new(crate::spa::padded(content)), nb)
                        }
                        crate::zio::compress::StoreAs::Compressed(c) => {
                            let nb = nb.compressed(&c);
                            (Arc::new(c.buf), nb)
                        }
                    };
                    // Held from its allocation on, so every txg sync accounts for it (see
                    // `VolumeInner::inplace_held`).
                    let bp = crate::spa::alloc_new_block(
                        &self.pool,
                        &block,
                        nb,
                        Some(&self.vol.inplace_held),
                    )?;
                    // A sync write's blocks: the client waits for them.
                    if let Err(e) = crate::zio::write_block_shared(
                        &self.pool.zio,
                        IoClass::SyncWrite,
                        bp.dvas(),
                        &block,
                    )
                    .await
                    {
                        // No record points at it: freed by the sync of its txg, as a
                        // replaced block.
                        self.vol.override_garbage.lock().unwrap().push((txg, bp));
                        return Err(e);
                    }
                    self.pool
                        .log_counters
                        .indirect_bytes
                        .fetch_add(block.len() as u64, Ordering::Relaxed);
                    Ok(InPlace::Written(
                        b,
                        crate::zio::compress::InPlaceBlock::new(bp, content),
                    ))
                }
            })
            .collect();
        let mut written = Vec::new();
        let mut err = None;
        for r in oxpool_io::rt::join_all(futs).await {
            match r {
                Ok(x) => written.push(x),
                Err(e) => err = Some(e),
            }
        }
        {
            // Register every block written, even on error: the sync frees what it cannot use.
            let mut o = self.vol.overrides.lock().unwrap();
            for w in &written {
                let InPlace::Written(b, block) = w else {
                    continue;
                };
                if let Some(old) = o.insert((txg, *b), *block) {
                    // Freed by the sync of its own txg (so the space maps that sync writes
                    // hold it allocated), never by whichever sync happens to run next.
                    self.vol
                        .override_garbage
                        .lock()
                        .unwrap()
                        .push((txg, old.bp));
                }
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        // In block order (join_all keeps it), so replay applies them as the write did.
        for w in written {
            out.push(match w {
                InPlace::Written(b, block) => Built::Indirect {
                    txg,
                    offset_bytes: b * bs,
                    length_bytes: bs,
                    bp: block.bp,
                },
                InPlace::Zeros(b) => Built::Zero {
                    txg,
                    offset_bytes: b * bs,
                    length_bytes: bs,
                },
            });
        }
        let tail_at = (end_b * bs - offset_bytes) as usize;
        if tail_at < data.len() {
            out.push(Built::Write {
                txg,
                offset_bytes: end_b * bs,
                data: Arc::from(&data[tail_at..]),
            });
        }
        Ok(out)
    }

    /// Puts one record into the open block (opening blocks as needed; a write larger than a
    /// block's room is split into several records).
    fn place(
        &self,
        s: &mut ZilState,
        seq: u64,
        rec: &Built,
        full: &mut Vec<OpenBlock>,
    ) -> Result<()> {
        let mut done_bytes = 0usize;
        // Bounded: each round places a non-empty piece or closes a block.
        loop {
            if s.open.is_none() {
                s.open = Some(self.open_block(s)?);
            }
            let o = s.open.as_mut().unwrap();
            let room = o.writer.free_bytes();
            let fitted = match rec {
                Built::Write {
                    txg,
                    offset_bytes,
                    data,
                } => {
                    let left = data.len() - done_bytes;
                    let piece = left
                        .min(room.saturating_sub(LOG_RECORD_HEADER_BYTES + 8) / 8 * 8)
                        .min(LOG_RECORD_DATA_BYTES_MAX);
                    if piece == 0 && left > 0 {
                        false
                    } else {
                        let r = LogRecord::Write {
                            txg: *txg,
                            offset_bytes: offset_bytes + done_bytes as u64,
                            data: &data[done_bytes..done_bytes + piece],
                        };
                        let ok = o.writer.push(&mut o.buf, &r);
                        debug_assert!(ok);
                        done_bytes += piece;
                        o.max_txg = o.max_txg.max(*txg);
                        done_bytes == data.len()
                    }
                }
                other => {
                    let r = other.record();
                    let ok = o.writer.push(&mut o.buf, &r);
                    if ok {
                        o.max_txg = o.max_txg.max(r.txg());
                        if let LogRecord::Indirect { bp, .. } = &r {
                            for d in bp.dvas() {
                                if !o.flush_vdevs.contains(&d.vdev) {
                                    o.flush_vdevs.push(d.vdev);
                                }
                            }
                        }
                    }
                    ok
                }
            };
            if fitted || done_bytes > 0 {
                o.itx_first = o.itx_first.min(seq);
                o.itx_last = o.itx_last.max(seq);
            }
            if fitted {
                return Ok(());
            }
            // Full: close it and go on in a new block.
            let o = s.open.take().unwrap();
            full.push(close(s, o));
        }
    }

    fn open_block(&self, s: &mut ZilState) -> Result<OpenBlock> {
        let no_space = || EngineError::NoSpace {
            pool: self.pool.name.clone(),
        };
        let size = s.predict_block_bytes();
        let (addr, seq) = match s.next_addr {
            Some(a) => a,
            None => (
                s.alloc_block(&self.pool, size).ok_or_else(no_space)?,
                s.first_seq,
            ),
        };
        let next = s.alloc_block(&self.pool, size).ok_or_else(no_space)?;
        s.next_addr = Some((next, seq + 1));
        Ok(OpenBlock {
            seq,
            addr,
            next,
            buf: IoBuf::zeroed(addr.asize_bytes as usize),
            writer: LogBlockWriter::with_capacity(addr.asize_bytes as usize),
            itx_first: u64::MAX,
            itx_last: 0,
            max_txg: Txg(0),
            deadline: None,
            flush_vdevs: Vec::new(),
        })
    }

    /// Writes a closed block and flushes its devices; then marks it done and advances the
    /// durable point through every consecutive done block.
    async fn zil_issue(&self, mut b: OpenBlock) {
        let zil = &self.vol.zil;
        let hdr = LogBlockHeader {
            pool_guid: zil.pool_guid,
            volume: zil.volume,
            seq: b.seq,
            next: b.next,
        };
        let len = b.writer.finish(&hdr, &mut b.buf);
        let start = Instant::now();
        let data = IoBuf::from_slice(&b.buf[..len]);
        let r = write_durably(&self.pool, &b.addr, &b.flush_vdevs, data).await;
        let counters = &self.pool.log_counters;
        counters.blocks_written.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_written
            .fetch_add(len as u64, Ordering::Relaxed);
        let ns = start.elapsed().as_nanos() as u64;
        counters.write_ns_total.fetch_add(ns, Ordering::Relaxed);
        let waiters = {
            let mut s = zil.state.lock().unwrap();
            s.latency_ewma_ns = (s.latency_ewma_ns * 7 + ns) / 8;
            match r {
                Ok(()) => {
                    if let Some(c) = s.chain_block_mut(b.seq) {
                        c.done = true;
                    }
                    s.advance_durable();
                }
                Err(e) => {
                    // Replay would stop at this block: nothing after it may count as durable.
                    // Its committers, and all later ones, wait for the txg sync instead.
                    tracing::warn!(volume = self.vol.full_name, "log block write failed: {e}");
                    if let Some(c) = s.chain_block_mut(b.seq) {
                        c.failed = true;
                    }
                    s.broken = true;
                }
            }
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// Closes the open block: from this moment it is in the chain, not yet written, so the durable
/// point cannot pass its records whatever block finishes first.
fn take_open(s: &mut ZilState) -> Option<OpenBlock> {
    let o = s.open.take()?;
    Some(close(s, o))
}

fn close(s: &mut ZilState, o: OpenBlock) -> OpenBlock {
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
    });
    o
}

/// Writes a log block (one copy, every child of its vdev) and makes it durable together with
/// the blocks its records point to.
///
/// When the block is all its commit needs (no record points at a block written in place;
/// earlier blocks of the chain are durable on their own, see `advance_durable`), every copy
/// is a durable (FUA) write and there is no flush: one I/O instead of a write, a wait, and
/// an fdatasync that io_uring hands to a kernel worker thread. Otherwise the block is written
/// plainly and every device involved is flushed, because a FUA write makes nothing else
/// durable. A durable write counts as one device flush: on a device without FUA (most
/// virtual disks, files) the kernel flushes the cache for it.
async fn write_durably(
    inner: &PoolInner,
    addr: &Dva,
    also_flush: &[VdevId],
    data: IoBuf,
) -> Result<()> {
    // Only the used part (whole sectors) is written; the rest of the place stays as it was.
    let written = Dva {
        asize_bytes: data.len() as u32,
        ..*addr
    };
    let zio = &inner.zio;
    if also_flush.is_empty() {
        crate::zio::write_block_owned(zio, IoClass::SyncWrite, &[written], data, true).await?;
        let copies = zio
            .vdevs
            .top(addr.vdev)
            .map_or(0, |top| top.leaves().count()) as u64;
        let counters = &inner.log_counters;
        counters.durable_writes.fetch_add(copies, Ordering::Relaxed);
        counters.flushes.fetch_add(copies, Ordering::Relaxed);
        counters.device_flushes.fetch_add(copies, Ordering::Relaxed);
        return Ok(());
    }
    crate::zio::write_block_owned(zio, IoClass::SyncWrite, &[written], data, false).await?;
    let mut vdevs = vec![addr.vdev];
    vdevs.extend(also_flush.iter().filter(|v| **v != addr.vdev));
    let mut leaves: Vec<Arc<Leaf>> = Vec::new();
    for v in vdevs {
        let top = inner
            .zio
            .vdevs
            .top(v)
            .ok_or_else(|| EngineError::invalid("log block on a missing vdev"))?;
        leaves.extend(top.leaves().cloned());
    }
    let futs: Vec<_> = leaves.iter().map(|l| l.flush()).collect();
    // Every device involved must have flushed: the records and the blocks they point to live
    // there. A failing device makes the log fall back to txg syncs, which tolerate it.
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
enum InPlace {
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
        // Each child of a mirror holds a copy; a torn one fails its checksum, so try each.
        let mut found = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lost floor: records a failed build took out of `pending` are in no block, so the
    /// durable point must not pass them, neither when a later block of the chain is written
    /// (it chains past them) nor when an older txg syncs; only the sync of their own txg may.
    #[test]
    fn durable_point_stays_below_records_of_a_failed_build() {
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
