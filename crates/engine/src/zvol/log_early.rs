//! Early writes: a volume's log block written as soon as a write arrives, without a flush, so
//! that the commit which follows only has to flush. Only with `logearly=on` (off by default:
//! on the guest the project is measured on, the extra completion and separate flush cost
//! more than they saved; docs/durability.md, "Early writes").
//!
//! Why: a database's commit is a write followed by a FLUSH (`fsync`), one at a time. Without
//! this, the log block is built and written durably when the FLUSH arrives: the client waits
//! for the write and the flush of the device, one after the other, after its request's round
//! trip. With it, the block is written while the WRITE's reply and the FLUSH travel, and the
//! FLUSH waits for a device flush only. The kernel's page cache does the same for a file
//! (`write` starts nothing, but writeback before `fsync` is common); qemu-nbd's O_DIRECT
//! write reaches the device before its reply, so its FLUSH is a device flush too.
//!
//! When: only while the log is idle (no commit, build, open block, other early write or flush
//! in progress), for a few small pending changes, only on a volume whose last commit ran
//! alone (where commits overlap, group commit already shares writes and flushes, and a block
//! written early added a write and a flush: 0.10 log blocks per write instead of 0.06 at
//! iodepth 16), and only on a volume that committed within [`EARLY_AFTER_COMMIT`]: writes that no commit follows (a bulk copy) never pay for a log
//! block each; and at most [`EARLY_BLOCKS_PER_COMMIT`] between two commits, so that a
//! transaction of many writes gets the rest built into one block at its commit. Under load
//! the log is rarely idle and group commit works as before.
//!
//! Safety: a block written early is not durable, so it is not `done`: the durable point stays
//! below its records until a flush of its device that began after its write completed. The
//! committer that needs it flushes it (`Volume::zil_flush_early`), or a later block's flush
//! covers it (`Volume::zil_issue`). Replay stops at the first block missing or torn, as for
//! any block in flight at a crash; no record of it was answered as durable. A block written
//! early leaves the chain only once flushed, even when its records' txgs have synced: the
//! persisted head may name it, and replay reaches the blocks after it only through it.

use crate::spa::Spa;
use crate::zil::*;
use crate::zvol::Volume;
use oxpool_format::VdevId;
use oxpool_io::IoBuf;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::Instant;

impl Volume {
    /// After a change that is not committed now: starts an early write of the log's pending
    /// records if the log is idle (see the module's rules). Returns at once; the write runs
    /// as a task of this thread's executor (none under `block_on`: then nothing happens).
    pub(crate) fn zil_write_early(&self) {
        // The log's own rules first: most writes that are not committed (a bulk copy) stop
        // here, at one lock.
        let allowed = self
            .vol
            .zil
            .state
            .lock()
            .unwrap()
            .early_write_allowed(self.pool.txg.synced(), Instant::now());
        if !allowed {
            return;
        }
        let on = {
            let p = self.pool.state.lock().unwrap();
            p.props.log_early && p.props.log_group_commit
        };
        if !on {
            return;
        }
        let copied_only = {
            let p = self.vol.ds.props.lock().unwrap();
            !p.logbias_throughput && p.log_copy_max_bytes >= EARLY_PENDING_BYTES_MAX
        };
        if copied_only {
            let vol = self.clone();
            oxpool_io::rt::try_spawn_local(async move { vol.zil_early().await });
        }
    }

    /// The early write's task: builds the pending records into the open block, closes it and
    /// writes it without a flush.
    async fn zil_early(self) {
        let zil = &self.vol.zil;
        // The reply to the write that spawned this goes out first: the client's FLUSH is what
        // this write races.
        oxpool_io::rt::yield_now().await;
        if self.pool.txg.check_writable().is_err() {
            return;
        }
        let first_seq = {
            let mut s = zil.state.lock().unwrap();
            // Checked again: a commit or another write may have come since.
            if !s.early_write_allowed(self.pool.txg.synced(), Instant::now()) {
                return;
            }
            s.building = true;
            s.early_in_flight += 1;
            s.early_since_commit += 1;
            s.next_addr.map_or(0, |(_, seq)| seq)
        };
        let mut guard = EarlyGuard {
            pool: &self.pool,
            zil,
            building: true,
            first_seq,
            unfinished: Vec::new(),
        };
        // No committer: the build closes the last block at once.
        let (closed, r) = self.zil_build().await;
        let waiters = {
            let mut s = zil.state.lock().unwrap();
            s.building = false;
            guard.building = false;
            if r.is_err() {
                s.broken = true;
            }
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
        if let Err(e) = r {
            tracing::warn!(
                volume = self.vol.ds.full_name(),
                "early log write failed, commits wait for the txg: {e}"
            );
        }
        guard.unfinished = closed.iter().map(|b| b.seq).collect();
        if closed.iter().any(|b| !b.in_place.is_empty()) {
            // Records pointing at blocks written in place (the volume's properties changed
            // since the check): written and flushed as a commit's.
            self.zil_issue_all(closed).await;
            guard.unfinished.clear();
            return;
        }
        // Bounded by the build's blocks (one, for the few small changes allowed).
        for b in closed {
            let seq = b.seq;
            self.zil_write_unflushed(b).await;
            guard.unfinished.retain(|&s| s != seq);
        }
    }

    /// Writes a closed block without a flush; marks it `unflushed` (or failed: the log is then
    /// broken and its commits wait for the txg) and wakes the committers.
    async fn zil_write_unflushed(&self, mut b: OpenBlock) {
        let zil = &self.vol.zil;
        let len = self.finish_block(&mut b);
        let data = IoBuf::from_slice(&b.buf[..len]);
        // Before the write: a device that leaves service after this makes the flush that
        // covers the block not count (`service_stamp`).
        let stamp = service_stamp(&self.pool);
        let r = write_unflushed(&self.pool, &b.addr, data).await;
        let counters = &self.pool.log_counters;
        counters.blocks_written.fetch_add(1, Ordering::Relaxed);
        counters.early_blocks.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_written
            .fetch_add(len as u64, Ordering::Relaxed);
        let waiters = {
            let mut s = zil.state.lock().unwrap();
            if let Err(e) = &r {
                tracing::warn!(
                    volume = self.vol.ds.full_name(),
                    "early log block write failed: {e}"
                );
                s.broken = true;
            }
            if let Some(c) = s.chain_block_mut(b.seq) {
                debug_assert!(c.in_flight());
                match r {
                    Ok(()) => {
                        c.unflushed = true;
                        c.service_stamp = stamp;
                    }
                    Err(_) => c.failed = true,
                }
            }
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// A committer's flush of the blocks written early, `early` (all written when it was
    /// taken): they become durable, and the durable point moves past them; unless the flush
    /// failed, or a device of theirs left service since its write (the flush may then cover
    /// a copy of none of them), when the log breaks and its commits wait for the txg.
    pub(crate) async fn zil_flush_early(&self, early: Vec<EarlyBlock>) {
        let zil = &self.vol.zil;
        struct Flushing<'a>(&'a Zil);
        impl Drop for Flushing<'_> {
            fn drop(&mut self) {
                let waiters = {
                    let mut s = self.0.state.lock().unwrap();
                    s.flushing = false;
                    std::mem::take(&mut s.waiters)
                };
                waiters.into_iter().for_each(Waker::wake);
            }
        }
        let _flushing = Flushing(zil);
        let mut vdevs: Vec<VdevId> = Vec::new();
        add_vdevs_of(&early, &mut vdevs);
        let start = Instant::now();
        let r = flush_log_vdevs(&self.pool, &vdevs)
            .await
            .and_then(|()| early_blocks_in_service(&self.pool, &early));
        self.pool
            .log_counters
            .early_flush_ns_total
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Err(e) = &r {
            tracing::warn!(
                volume = self.vol.ds.full_name(),
                "log flush failed, waiting for the txg: {e}"
            );
        }
        let seqs: Vec<u64> = early.iter().map(|b| b.seq).collect();
        zil.state.lock().unwrap().flushed(&seqs, r.is_ok());
    }
}

/// Undoes what an early write's task claimed if the task is dropped before it finishes (its
/// executor stopped): the build given back (records it had taken are in no block: only the
/// txg makes them durable), blocks it had not written marked failed (the log restarts at the
/// next txg sync), and the early write counted as over.
struct EarlyGuard<'a> {
    pool: &'a Spa,
    zil: &'a Zil,
    building: bool,
    /// The seq of the first block this build could close: every block from it on that is
    /// still in flight while the build runs is this task's (no commit writes blocks while
    /// the log is being built).
    first_seq: u64,
    unfinished: Vec<u64>,
}

impl Drop for EarlyGuard<'_> {
    fn drop(&mut self) {
        let open_txg = self.pool.txg.state.lock().unwrap().open;
        let waiters = {
            let mut s = self.zil.state.lock().unwrap();
            if self.building {
                s.building = false;
                if let Some(first) = s.building_first.take() {
                    s.lose_records(first, open_txg);
                }
                // Blocks the build had closed: never written.
                for c in s.chain.iter_mut() {
                    if c.seq >= self.first_seq && c.in_flight() {
                        c.failed = true;
                    }
                }
                s.broken = true;
            }
            for &seq in &self.unfinished {
                let failed = s.chain_block_mut(seq).is_some_and(|c| {
                    let unwritten = c.in_flight();
                    c.failed |= unwritten;
                    unwritten
                });
                s.broken |= failed;
            }
            s.early_in_flight -= 1;
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}
