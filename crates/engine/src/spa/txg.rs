//! Transaction groups: open, quiescing, syncing.
//!
//! Writers take a hold on the open txg while they put their changes in its dirty sets. The
//! sync thread closes the open txg (the next one opens at once), waits for the holds on the old
//! one to drain (quiesce), and then writes it out (`pool::sync_txg`). A sync starts every
//! `txg_timeout`, when a txg's dirty data passes 20 % of `dirty_max` (or 32 MiB while a receive
//! asks for eager syncs, or in a dense txg: [`DENSE_WHOLE_NEW_EIGHTHS_MIN`]), or when someone
//! waits for durability (FLUSH, FUA). The write throttle follows ZFS's curve: no delay below 60 % of
//! `dirty_max`, then a delay of `scale * (d - m) / (D - d)` capped at 100 ms, and writers wait
//! outright at `dirty_max`, so dirty memory stays bounded. Delays are counted and timed
//! ([`ThrottleCounters`], shown by `oxpool iostat`).

use crate::vdev::alloc::ClassBytes;
use crate::{EngineError, Result};
use oxpool_format::{Txg, INDIRECT_FANOUT};
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// Share of `dirty_max` in one txg that starts a sync (percent).
pub const DIRTY_SYNC_PERCENT: u64 = 20;
/// Dirty bytes in one txg that start a sync while a bulk writer holds an [`EagerSyncs`] (a
/// receive), when that is less than `DIRTY_SYNC_PERCENT` of `dirty_max`. A receive knows
/// that more data follows at once, so waiting for a fifth of `dirty_max` only leaves the
/// device idle: the first 100 MiB of a receive (at the default `dirty_max` of a 4 GiB pool)
/// were read before anything was written. Once syncs run back to back, a txg holds what
/// arrived while the previous one was written, whatever this threshold is.
pub const EAGER_SYNC_BYTES: u64 = 32 << 20;
/// A txg is **dense** when it holds a stream of new whole blocks: at least seven eighths of
/// the bytes clients wrote in it went to whole blocks new to the txg (no rewrites, no partial
/// blocks), and the level-1 indirect blocks above its data are on average at least half
/// full of its blocks (`DENSE_LEVEL1_FILL_PERCENT_MIN`). A dense txg starts a sync at
/// [`EAGER_SYNC_BYTES`] already: its sync writes little besides its data and a later sync
/// would absorb nothing, so a smaller txg costs only the sync's fixed part (space maps, pool
/// metadata, two flushes: a few milliseconds), while waiting for a fifth of `dirty_max` left
/// the device idle at the start of a stream (the first 150 MiB of a 128 KiB sequential write
/// to a 6 GiB pool arrived before anything was written) and the whole txg to write at its
/// end, when a FLUSH waits for it. Other txgs wait for the fifth, as in ZFS: scattered
/// writes share each rewritten indirect block among more writes in a larger txg, and
/// writes to a hot set are absorbed (a block rewritten ten times in a txg is written once).
pub const DENSE_WHOLE_NEW_EIGHTHS_MIN: u64 = 7;
/// See [`DENSE_WHOLE_NEW_EIGHTHS_MIN`]: how full of the txg's data blocks its level-1
/// indirect blocks must be, on average, for the txg to be dense (percent).
pub const DENSE_LEVEL1_FILL_PERCENT_MIN: u64 = 50;

/// What one change made dirty in its txg (the sync's work for it, and how dense it is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dirtied {
    /// Data bytes newly dirty in the txg (whole blocks, partial ones counted whole).
    pub data_bytes: u64,
    /// Data blocks newly dirty in the txg.
    pub data_blocks: u64,
    /// Level-1 indirect blocks the txg's sync rewrites that no earlier change marked.
    pub level1_blocks: u64,
    /// Bytes the client wrote.
    pub client_bytes: u64,
    /// Of those, the bytes of whole blocks new to the txg.
    pub whole_new_bytes: u64,
}

impl std::ops::AddAssign for Dirtied {
    fn add_assign(&mut self, o: Dirtied) {
        self.data_bytes += o.data_bytes;
        self.data_blocks += o.data_blocks;
        self.level1_blocks += o.level1_blocks;
        self.client_bytes += o.client_bytes;
        self.whole_new_bytes += o.whole_new_bytes;
    }
}

impl Dirtied {
    /// A whole data block of `bs` bytes, new to the txg, written whole.
    pub fn new_whole_block(&mut self, bs: u64) {
        self.data_bytes += bs;
        self.data_blocks += 1;
        self.whole_new_bytes += bs;
    }

    /// A data block of `bs` bytes new to the txg, written in part.
    pub fn new_partial_block(&mut self, bs: u64) {
        self.data_bytes += bs;
        self.data_blocks += 1;
    }

    /// Whether a txg with this in it is dense (see [`DENSE_WHOLE_NEW_EIGHTHS_MIN`]).
    pub fn is_dense(&self) -> bool {
        let streamed = self.whole_new_bytes * 8 >= self.client_bytes * DENSE_WHOLE_NEW_EIGHTHS_MIN;
        let filled = self.data_blocks * 100
            >= self.level1_blocks * INDIRECT_FANOUT as u64 * DENSE_LEVEL1_FILL_PERCENT_MIN;
        streamed && filled
    }
}
/// Share of `dirty_max` above which writers are delayed (percent).
pub const DELAY_MIN_DIRTY_PERCENT: u64 = 60;
/// Delay scale: about 1e9 / the pool's write IOPS (ZFS's default, 500 us).
pub const DELAY_SCALE_NS: u64 = 500_000;
/// Longest delay one write is given.
pub const DELAY_MAX_NS: u64 = 100_000_000;
/// Bound on the waker list: a waiter re-registers on every poll, so duplicates are dropped.
const WAITERS_MAX: usize = 1 << 16;

pub(crate) struct TxgState {
    pub open: Txg,
    /// Holds per txg that may still have writers (open and quiescing).
    holds: Vec<(Txg, u64)>,
    /// The open txg has changes to write (data or configuration).
    pub open_dirty: bool,
    pub syncing: Option<Txg>,
    pub synced: Txg,
    /// Dirty bytes of all unsynced txgs, and per txg.
    dirty_bytes: u64,
    txg_dirty_bytes: Vec<(Txg, Dirtied)>,
    /// Space the syncs of all unsynced txgs may allocate (their blocks' slots, every copy),
    /// and per txg: charged as writers dirty blocks, released when the txg is durable (what
    /// it allocated is then in the allocator's counts). See `pool::Spa::wait_for_space`.
    space: ClassBytes,
    txg_space: Vec<(Txg, ClassBytes)>,
    /// Worst-case space of the writers that passed the space check and have not charged
    /// their txg yet (see `pool::SpaceAdmission`): counted until they have.
    pub space_admitting: ClassBytes,
    /// Writers that passed the space check, ever: whether a round of waiting for space let
    /// anyone in (see `pool::Spa::wait_for_space`).
    pub space_admissions: u64,
    kick: bool,
    /// Live [`EagerSyncs`]: while any, a txg of `EAGER_SYNC_BYTES` starts a sync.
    eager: u32,
    pub stop: bool,
    pub suspended: Option<String>,
    waiters: Vec<Waker>,
    last_sync: Instant,
    pub dirty_max_bytes: u64,
    pub timeout: Duration,
}

impl TxgState {
    /// Space the syncs of the unsynced txgs may still allocate, with what writers admitted
    /// but not yet charged.
    pub fn space_needed(&self) -> ClassBytes {
        self.space + self.space_admitting
    }

    /// [`TxgState::space_needed`] without `placed`'s charge: what is still to come once
    /// txg `placed`'s sync has placed every block it was charged for.
    pub fn space_needed_after(&self, placed: Txg) -> ClassBytes {
        let mut need = self.space_needed();
        if let Some((_, c)) = self.txg_space.iter().find(|(t, _)| *t == placed) {
            for (n, c) in need.0.iter_mut().zip(c.0) {
                debug_assert!(*n >= c, "a txg's charge is part of the total");
                *n = n.saturating_sub(c);
            }
        }
        need
    }
}

/// What the write throttle did to writers, since the pool was opened.
#[derive(Debug, Default)]
pub struct ThrottleCounters {
    /// Writers delayed above [`DELAY_MIN_DIRTY_PERCENT`] of `dirty_max`.
    pub delays: AtomicU64,
    /// Nanoseconds they slept, summed.
    pub delay_ns_total: AtomicU64,
    /// Writers that waited outright, dirty data being at `dirty_max`.
    pub waits: AtomicU64,
    /// Nanoseconds they waited, summed.
    pub wait_ns_total: AtomicU64,
}

impl ThrottleCounters {
    /// Copies the counters into `stats`.
    pub fn fill(&self, stats: &mut crate::iostats::LogStats) {
        stats.throttle_delays = self.delays.load(Ordering::Relaxed);
        stats.throttle_delay_ns_total = self.delay_ns_total.load(Ordering::Relaxed);
        stats.throttle_waits = self.waits.load(Ordering::Relaxed);
        stats.throttle_wait_ns_total = self.wait_ns_total.load(Ordering::Relaxed);
    }
}

fn add_ns(counter: &AtomicU64, d: Duration) {
    let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
    counter.fetch_add(ns, Ordering::Relaxed);
}

/// The txg state machine shared by writers and the sync thread.
pub(crate) struct TxgControl {
    pub state: Mutex<TxgState>,
    /// Wakes the sync thread (kick, dirty threshold, hold drained, stop).
    pub cv: Condvar,
    pool_name: String,
    /// Told the txg closed, under the state lock, as it closes (`next_to_sync`): from then
    /// on writers' blocks are born in the next txg, before the closed txg's sync begins.
    /// The vdev tree measures missed ranges up to the open txg from it
    /// (`VdevTree::note_sync_started`).
    pub closed: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// What the write throttle did.
    pub throttle: ThrottleCounters,
}

/// While it lives, a txg holding [`EAGER_SYNC_BYTES`] of dirty data starts a sync
/// ([`TxgControl::eager_syncs`]).
pub(crate) struct EagerSyncs<'a> {
    ctl: &'a TxgControl,
}

impl Drop for EagerSyncs<'_> {
    fn drop(&mut self) {
        self.ctl.state.lock().unwrap().eager -= 1;
    }
}

/// A writer's hold on a txg; while any hold exists, that txg cannot start syncing.
pub(crate) struct TxgHold<'a> {
    ctl: &'a TxgControl,
    txg: Txg,
}

impl TxgHold<'_> {
    /// The txg this hold is on: the writer puts its changes there.
    pub fn txg(&self) -> Txg {
        self.txg
    }

    /// Records what this writer made dirty (and that the txg has changes), and that the
    /// txg's sync will allocate `space` more for it.
    pub fn note_dirty(&self, dirtied: Dirtied, space: ClassBytes) {
        let bytes = dirtied.data_bytes;
        let mut s = self.ctl.state.lock().unwrap();
        if self.txg == s.open {
            s.open_dirty = true;
        }
        s.dirty_bytes += bytes;
        let txg = self.txg;
        if !space.is_zero() {
            s.space += space;
            match s.txg_space.iter_mut().find(|(t, _)| *t == txg) {
                Some((_, c)) => *c += space,
                None => s.txg_space.push((txg, space)),
            }
        }
        let t = match s.txg_dirty_bytes.iter().position(|(t, _)| *t == txg) {
            Some(i) => &mut s.txg_dirty_bytes[i].1,
            None => {
                s.txg_dirty_bytes.push((txg, Dirtied::default()));
                &mut s.txg_dirty_bytes.last_mut().unwrap().1
            }
        };
        *t += dirtied;
        let txg_bytes = t.data_bytes;
        let dense = t.is_dense();
        let over = txg_bytes * 100 > s.dirty_max_bytes * DIRTY_SYNC_PERCENT
            || ((s.eager > 0 || dense) && txg_bytes > EAGER_SYNC_BYTES);
        if over {
            s.kick = true;
            self.ctl.cv.notify_all();
        }
    }
}

impl Drop for TxgHold<'_> {
    fn drop(&mut self) {
        let mut s = self.ctl.state.lock().unwrap();
        let i = s
            .holds
            .iter()
            .position(|(t, _)| *t == self.txg)
            .expect("hold without a count");
        s.holds[i].1 -= 1;
        if s.holds[i].1 == 0 {
            s.holds.swap_remove(i);
            if self.txg < s.open {
                self.ctl.cv.notify_all(); // quiesce may be waiting for this txg
            }
        }
    }
}

fn register(waiters: &mut Vec<Waker>, w: &Waker) {
    if !waiters.iter().any(|x| x.will_wake(w)) {
        assert!(waiters.len() < WAITERS_MAX, "txg waiter list overflow");
        waiters.push(w.clone());
    }
}

impl TxgControl {
    pub fn new(pool_name: &str, synced: Txg, dirty_max_bytes: u64, timeout: Duration) -> Self {
        TxgControl {
            state: Mutex::new(TxgState {
                open: Txg(synced.0 + 1),
                holds: Vec::new(),
                open_dirty: false,
                syncing: None,
                synced,
                dirty_bytes: 0,
                txg_dirty_bytes: Vec::new(),
                space: ClassBytes::default(),
                txg_space: Vec::new(),
                space_admitting: ClassBytes::default(),
                space_admissions: 0,
                kick: false,
                eager: 0,
                stop: false,
                suspended: None,
                waiters: Vec::new(),
                last_sync: Instant::now(),
                dirty_max_bytes,
                timeout,
            }),
            cv: Condvar::new(),
            pool_name: pool_name.to_string(),
            closed: std::sync::OnceLock::new(),
            throttle: ThrottleCounters::default(),
        }
    }

    fn suspended_error(&self, reason: &str) -> EngineError {
        EngineError::Suspended {
            pool: self.pool_name.clone(),
            reason: reason.to_string(),
        }
    }

    /// Takes a hold on the open txg for a writer about to dirty about `bytes`, after the write
    /// throttle: waits while dirty data is at `dirty_max`, delays above 60 % of it.
    pub async fn hold(&self, bytes: u64) -> Result<TxgHold<'_>> {
        let mut waited_since: Option<Instant> = None;
        let delay_ns = poll_fn(|cx| {
            let mut s = self.state.lock().unwrap();
            if let Some(r) = &s.suspended {
                return Poll::Ready(Err(self.suspended_error(r)));
            }
            let max = s.dirty_max_bytes;
            if s.dirty_bytes > 0 && s.dirty_bytes + bytes > max {
                s.kick = true;
                self.cv.notify_all();
                register(&mut s.waiters, cx.waker());
                waited_since.get_or_insert_with(Instant::now);
                return Poll::Pending;
            }
            let min = max / 100 * DELAY_MIN_DIRTY_PERCENT;
            let d = s.dirty_bytes;
            let delay = if d > min {
                (DELAY_SCALE_NS as u128 * (d - min) as u128 / (max - d).max(1) as u128)
                    .min(DELAY_MAX_NS as u128) as u64
            } else {
                0
            };
            Poll::Ready(Ok(delay))
        })
        .await?;
        if let Some(since) = waited_since {
            self.throttle.waits.fetch_add(1, Ordering::Relaxed);
            add_ns(&self.throttle.wait_ns_total, since.elapsed());
        }
        if delay_ns > 0 {
            let start = Instant::now();
            oxpool_io::rt::sleep(Duration::from_nanos(delay_ns)).await;
            self.throttle.delays.fetch_add(1, Ordering::Relaxed);
            add_ns(&self.throttle.delay_ns_total, start.elapsed());
        }
        let mut s = self.state.lock().unwrap();
        if let Some(r) = &s.suspended {
            return Err(self.suspended_error(r));
        }
        let txg = s.open;
        match s.holds.iter_mut().find(|(t, _)| *t == txg) {
            Some((_, n)) => *n += 1,
            None => s.holds.push((txg, 1)),
        }
        Ok(TxgHold { ctl: self, txg })
    }

    /// Fails if the pool takes no more changes (suspended after a failed commit, or
    /// exported): what would write outside a txg (the intent log) checks this first.
    pub fn check_writable(&self) -> Result<()> {
        match &self.state.lock().unwrap().suspended {
            Some(r) => Err(self.suspended_error(r)),
            None => Ok(()),
        }
    }

    /// Syncs start at [`EAGER_SYNC_BYTES`] in a txg (instead of `DIRTY_SYNC_PERCENT` of
    /// `dirty_max`, when that is more) until the guard drops: for a writer that streams
    /// much data at once (a receive).
    pub fn eager_syncs(&self) -> EagerSyncs<'_> {
        self.state.lock().unwrap().eager += 1;
        EagerSyncs { ctl: self }
    }

    /// Asks for a sync of the open txg now (it is marked as having changes).
    pub fn kick(&self) {
        let mut s = self.state.lock().unwrap();
        s.open_dirty = true;
        s.kick = true;
        self.cv.notify_all();
    }

    /// The open txg: where a change made now goes.
    pub fn open_txg(&self) -> Txg {
        self.state.lock().unwrap().open
    }

    /// Marks the open txg as having changes (configuration changes: volumes, properties).
    pub fn mark_dirty(&self) {
        self.state.lock().unwrap().open_dirty = true;
    }

    /// Marks the open txg as having changes and returns it, in one step: read apart, the
    /// sync thread could close the marked txg in between (a kick left over from an earlier
    /// wait), and a caller waiting for the next, clean one would wait for ever (a clean txg
    /// never syncs). Found by import's two syncs in a row hanging in replay_crash.rs.
    pub fn mark_dirty_open(&self) -> Txg {
        let mut s = self.state.lock().unwrap();
        s.open_dirty = true;
        s.open
    }

    /// Waits until `txg` is durable; with `kick`, asks for a sync now.
    pub async fn wait_synced(&self, txg: Txg, kick: bool) -> Result<()> {
        poll_fn(|cx| {
            let mut s = self.state.lock().unwrap();
            if s.synced >= txg {
                return Poll::Ready(Ok(()));
            }
            if let Some(r) = &s.suspended {
                return Poll::Ready(Err(self.suspended_error(r)));
            }
            if kick && !s.kick {
                s.kick = true;
                self.cv.notify_all();
            }
            register(&mut s.waiters, cx.waker());
            Poll::Pending
        })
        .await
    }

    /// The sync thread's wait: returns the txg to sync next (already closed and quiesced), or
    /// None when asked to stop and nothing is left to write.
    pub fn next_to_sync(&self) -> Option<Txg> {
        let mut s = self.state.lock().unwrap();
        loop {
            // A suspended pool writes nothing more (a closed pool is a crashed process).
            if s.suspended.is_some() {
                return None;
            }
            let timed_out = s.last_sync.elapsed() >= s.timeout;
            if s.open_dirty && (s.kick || s.stop || timed_out) {
                break;
            }
            if s.stop {
                return None;
            }
            if !s.open_dirty {
                // Nothing to write: a kick asks for nothing; restart the timeout.
                s.kick = false;
                s.last_sync = Instant::now();
            }
            let wait = s.timeout.saturating_sub(s.last_sync.elapsed());
            s = self
                .cv
                .wait_timeout(s, wait.max(Duration::from_millis(1)))
                .unwrap()
                .0;
        }
        // Close the open txg; new writers go to the next one.
        let txg = s.open;
        s.open = Txg(txg.0 + 1);
        if let Some(closed) = self.closed.get() {
            closed.fetch_max(txg.0, std::sync::atomic::Ordering::SeqCst);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
        s.open_dirty = false;
        s.kick = false;
        // From here a FLUSH must wait for `txg`, even while it is still quiescing.
        s.syncing = Some(txg);
        // Quiesce: wait for the writers still holding `txg`. Bounded by their critical
        // sections, which never wait on the sync thread.
        while s.holds.iter().any(|(t, _)| *t == txg) {
            s = self.cv.wait(s).unwrap();
        }
        Some(txg)
    }

    /// Records the end of a sync: success makes `txg` durable and releases its dirty bytes;
    /// failure suspends the pool. Wakes every waiter.
    pub fn finish_sync(&self, txg: Txg, result: &Result<()>) {
        let waiters = {
            let mut s = self.state.lock().unwrap();
            s.syncing = None;
            s.last_sync = Instant::now();
            match result {
                Ok(()) => {
                    debug_assert!(txg > s.synced);
                    s.synced = txg;
                    if let Some(i) = s.txg_dirty_bytes.iter().position(|(t, _)| *t == txg) {
                        let (_, b) = s.txg_dirty_bytes.swap_remove(i);
                        s.dirty_bytes -= b.data_bytes;
                    }
                    if let Some(i) = s.txg_space.iter().position(|(t, _)| *t == txg) {
                        let (_, c) = s.txg_space.swap_remove(i);
                        s.space -= c;
                    }
                }
                Err(e) => {
                    tracing::error!(pool = self.pool_name, "txg {} sync failed: {e}", txg.0);
                    s.suspended = Some(format!("txg {} failed to sync: {e}", txg.0));
                }
            }
            std::mem::take(&mut s.waiters)
        };
        self.cv.notify_all();
        for w in waiters {
            w.wake();
        }
    }

    /// Asks the sync thread to stop after writing what is dirty.
    pub fn stop(&self) {
        self.state.lock().unwrap().stop = true;
        self.cv.notify_all();
    }

    /// The last durable txg.
    pub fn synced(&self) -> Txg {
        self.state.lock().unwrap().synced
    }

    /// Dirty bytes held in memory now.
    pub fn dirty_bytes(&self) -> u64 {
        self.state.lock().unwrap().dirty_bytes
    }

    /// The throttle limit now (the effective `dirty_max`).
    pub fn dirty_max_bytes(&self) -> u64 {
        self.state.lock().unwrap().dirty_max_bytes
    }

    /// Changes the throttle limit and the sync interval (properties were set).
    pub fn configure(&self, dirty_max_bytes: u64, timeout: Duration) {
        let mut s = self.state.lock().unwrap();
        s.dirty_max_bytes = dirty_max_bytes;
        s.timeout = timeout;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_io::rt::block_on;

    /// Whether a txg holding `dirtied` (under `DIRTY_SYNC_PERCENT` of a 1 GiB `dirty_max`)
    /// asks for a sync, with an `EagerSyncs` alive or not.
    fn kicks_at(dirtied: Dirtied, eager: bool) -> bool {
        let ctl = TxgControl::new("p", Txg(1), 1 << 30, Duration::from_secs(1000));
        let guard = eager.then(|| ctl.eager_syncs());
        let hold = block_on(ctl.hold(dirtied.data_bytes)).unwrap();
        hold.note_dirty(dirtied, ClassBytes::default());
        drop(hold);
        drop(guard);
        assert_eq!(ctl.state.lock().unwrap().eager, 0, "the guard did not end");
        let kicked = ctl.state.lock().unwrap().kick;
        kicked
    }

    const BLOCK: u64 = 16 << 10;
    const FAN: u64 = INDIRECT_FANOUT as u64;

    /// `bytes` of 4 KiB writes, each to a 16 KiB block of its own under a level-1 block of
    /// its own (scattered over a large volume).
    fn scattered(bytes: u64) -> Dirtied {
        let blocks = bytes / BLOCK;
        Dirtied {
            data_bytes: bytes,
            data_blocks: blocks,
            level1_blocks: blocks,
            client_bytes: blocks * 4096,
            whole_new_bytes: 0,
        }
    }

    /// `bytes` of whole 16 KiB blocks written in order.
    fn sequential(bytes: u64) -> Dirtied {
        let blocks = bytes / BLOCK;
        Dirtied {
            data_bytes: bytes,
            data_blocks: blocks,
            level1_blocks: blocks.div_ceil(FAN) + 1,
            client_bytes: bytes,
            whole_new_bytes: bytes,
        }
    }

    /// The throttle's counters: a writer above 60 % of `dirty_max` is delayed and counted
    /// with the time it slept; one at `dirty_max` waits for the sync and is counted apart.
    #[test]
    fn the_write_throttle_counts_its_delays_and_waits() {
        const MAX: u64 = 16 << 20;
        let ctl = TxgControl::new("p", Txg(1), MAX, Duration::from_secs(1000));
        let counts = |c: &TxgControl| {
            let mut s = crate::iostats::LogStats::default();
            c.throttle.fill(&mut s);
            (
                s.throttle_delays,
                s.throttle_delay_ns_total,
                s.throttle_waits,
            )
        };
        // 50 %: no delay.
        let hold = block_on(ctl.hold(BLOCK)).unwrap();
        hold.note_dirty(scattered(MAX / 2), ClassBytes::default());
        drop(hold);
        assert_eq!(counts(&ctl), (0, 0, 0));
        // 80 %: a delay of scale * 20 / 20, 500 us.
        let hold = block_on(ctl.hold(BLOCK)).unwrap();
        hold.note_dirty(scattered(MAX * 3 / 10), ClassBytes::default());
        drop(hold);
        let hold = block_on(ctl.hold(BLOCK)).unwrap();
        let (delays, delay_ns, waits) = counts(&ctl);
        assert_eq!((delays, waits), (1, 0));
        assert!(delay_ns >= DELAY_SCALE_NS, "slept {delay_ns} ns");
        // At dirty_max: the writer waits until the sync retires the txg.
        hold.note_dirty(scattered(MAX / 5), ClassBytes::default());
        drop(hold);
        let txg = ctl.next_to_sync().expect("a txg to sync");
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // Until the writer is waiting (bounded).
                for _ in 0..10_000 {
                    if !ctl.state.lock().unwrap().waiters.is_empty() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                ctl.finish_sync(txg, &Ok(()));
            });
            drop(block_on(ctl.hold(BLOCK)).unwrap());
        });
        assert_eq!(counts(&ctl).2, 1, "the wait at dirty_max was not counted");
    }

    #[test]
    fn eager_syncs_start_a_sync_at_their_threshold_only() {
        const { assert!((1u64 << 30) * DIRTY_SYNC_PERCENT / 100 > 2 * EAGER_SYNC_BYTES) };
        let e = EAGER_SYNC_BYTES;
        assert!(kicks_at(scattered(e + BLOCK), true));
        assert!(!kicks_at(scattered(e), true));
        assert!(!kicks_at(scattered(e + BLOCK), false));
        let fifth = (1 << 30) * DIRTY_SYNC_PERCENT / 100;
        assert!(kicks_at(scattered(fifth + BLOCK), false));
    }

    /// A dense txg (a stream of new whole blocks filling its level-1 blocks) starts a sync
    /// past `EAGER_SYNC_BYTES` without any `EagerSyncs`; scattered writes, writes to a hot
    /// set (rewrites, or blocks scattered thinly under their level-1 blocks), and partial
    /// blocks wait for the fifth of `dirty_max`.
    #[test]
    fn dense_txgs_start_a_sync_early() {
        let e = EAGER_SYNC_BYTES;
        assert!(kicks_at(sequential(e + BLOCK), false));
        assert!(
            !kicks_at(sequential(e), false),
            "at the threshold, not past it"
        );
        // Whole new blocks, but a quarter of each level-1 block: random whole-block writes.
        let thin = Dirtied {
            level1_blocks: (e * 2 / BLOCK) * 4 / FAN,
            ..sequential(e * 2)
        };
        assert!(!kicks_at(thin, false));
        // Level-1 blocks just half full: dense.
        let half = Dirtied {
            level1_blocks: (e * 2 / BLOCK) * 2 / FAN,
            ..sequential(e * 2)
        };
        assert!(kicks_at(half, false));
        // Rewrites: a fifth of the client's bytes went to blocks already dirty.
        let rewritten = Dirtied {
            client_bytes: e * 2 * 5 / 4,
            ..sequential(e * 2)
        };
        assert!(!kicks_at(rewritten, false));
        // Full level-1 blocks of partial blocks (4 KiB writes in order).
        let partial = Dirtied {
            client_bytes: e * 2 / 4,
            whole_new_bytes: 0,
            ..sequential(e * 2)
        };
        assert!(!kicks_at(partial, false));
        assert!(!kicks_at(scattered(e * 2), false));
    }

    /// Closing a txg raises the figure the vdev tree reads as the last txg whose blocks may
    /// be being written (`VdevTree::last_written`, that figure plus one) to it, before the
    /// txg's sync begins: from the close on, writers' blocks are born in the open txg, and
    /// a missed range measured in between must reach it (else it ends one txg short and a
    /// resilver skips a log block written in place; session 25's reviewer).
    #[test]
    fn closing_a_txg_raises_the_closed_figure_before_its_sync_begins() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let ctl = TxgControl::new("p", Txg(4), 1 << 30, Duration::from_secs(1000));
        let closed = std::sync::Arc::new(AtomicU64::new(4));
        assert!(ctl.closed.set(closed.clone()).is_ok());
        let open = ctl.mark_dirty_open();
        ctl.kick();
        let txg = ctl.next_to_sync().unwrap();
        assert_eq!(txg, open);
        assert_eq!(closed.load(Ordering::SeqCst), txg.0);
        assert_eq!(
            Txg(closed.load(Ordering::SeqCst) + 1),
            ctl.state.lock().unwrap().open,
            "the figure plus one is the open txg"
        );
    }

    /// What is still to come once a txg's sync has placed its charged blocks: every other
    /// txg's charge and what writers were admitted for, not that txg's.
    #[test]
    fn space_needed_after_a_txg_leaves_out_its_charge_only() {
        let ctl = TxgControl::new("p", Txg(4), 1 << 30, Duration::from_secs(1000));
        let charge = |blocks: u64| {
            let mut c = ClassBytes::default();
            c.add_blocks(4096, 1, blocks);
            c
        };
        let first = oxpool_io::rt::block_on(ctl.hold(4096)).unwrap();
        let txg = first.txg();
        first.note_dirty(Dirtied::default(), charge(3));
        drop(first);
        ctl.kick();
        assert_eq!(ctl.next_to_sync(), Some(txg));
        let later = oxpool_io::rt::block_on(ctl.hold(4096)).unwrap();
        assert_ne!(later.txg(), txg);
        later.note_dirty(Dirtied::default(), charge(5));
        let mut s = ctl.state.lock().unwrap();
        s.space_admitting += charge(7);
        assert_eq!(s.space_needed(), charge(15));
        assert_eq!(s.space_needed_after(txg), charge(12));
        assert_eq!(s.space_needed_after(Txg(txg.0 + 100)), charge(15));
        s.space_admitting = ClassBytes::default();
        drop(s);
        drop(later);
    }
}
