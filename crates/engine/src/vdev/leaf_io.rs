//! The one choke point of device I/O: every read, write and flush the engine issues to a leaf
//! device goes through [`Leaf::read`], [`Leaf::write`] and [`Leaf::flush`], which pass the
//! leaf's vdev queue (`vdev_queue.rs`) with the I/O's class and record the leaf's statistics
//! (`iostats.rs`).
//!
//! Label and uberblock I/O (`label.rs`) is the exception: it goes to the backend directly,
//! bypassing the queue and the statistics. It is a few small writes per txg on the sync
//! thread whose order the commit protocol fixes, and import reads before the pool exists;
//! queueing them behind the txg's own data writes would only delay the commit.
//!
//! None of these allocate: the futures are plain `async fn` state machines that hold the
//! backend's future, the queue admission and two timestamps. Each also loads one flag:
//! whether fault injection (`inject.rs`) has a rule on the leaf; only then does the I/O take
//! the injected path (boxed).

use crate::iostats::LeafOpStats;
use crate::vdev::inject::IoOp;
use crate::vdev::queue::IoClass;
use crate::vdev::Leaf;
use oxpool_io::{IoBuf, IoFuture, IoResult, Scatter};
use std::sync::Arc;
use std::time::Instant;

impl Leaf {
    /// Reads `buf.len()` bytes at `offset_bytes` as an I/O of `class`.
    pub async fn read(&self, class: IoClass, offset_bytes: u64, buf: IoBuf) -> IoResult<IoBuf> {
        let len_bytes = buf.len() as u64;
        let io = self.queued(class, len_bytes, &self.io_stats.read, || {
            self.backend.read(offset_bytes, buf)
        });
        if self.inject.armed() {
            let injected = self
                .inject
                .apply(self.name(), IoOp::Read, io, |b| Some(&mut b[..]));
            return Box::pin(injected).await;
        }
        io.await
    }

    /// Fills `bufs` back to back from `offset_bytes` as one I/O of `class` (see
    /// [`oxpool_io::Backend::read_scatter`]). A corrupting fault rule corrupts the first
    /// buffer, where a corrupted read of one buffer would start.
    pub async fn read_scatter(
        &self,
        class: IoClass,
        offset_bytes: u64,
        bufs: Scatter,
    ) -> IoResult<Scatter> {
        let len_bytes = bufs.len_bytes() as u64;
        let io = self.queued(class, len_bytes, &self.io_stats.read, || {
            self.backend.read_scatter(offset_bytes, bufs)
        });
        if self.inject.armed() {
            let injected = self.inject.apply(self.name(), IoOp::Read, io, |s| {
                s.bufs_mut().first_mut().map(|b| &mut b[..])
            });
            return Box::pin(injected).await;
        }
        io.await
    }

    /// Writes `buf` at `offset_bytes` as an I/O of `class`; hands the buffer back.
    pub async fn write(&self, class: IoClass, offset_bytes: u64, buf: IoBuf) -> IoResult<IoBuf> {
        let len_bytes = buf.len() as u64;
        let io = self.queued(class, len_bytes, &self.io_stats.write, || {
            self.backend.write(offset_bytes, buf)
        });
        if self.inject.armed() {
            return Box::pin(self.inject.apply(self.name(), IoOp::Write, io, |_| None)).await;
        }
        io.await
    }

    /// Writes `buf` at `offset_bytes` as an I/O of `class`, completing only once the bytes
    /// are durable (see [`oxpool_io::Backend::write_durable`]); hands the buffer back.
    pub async fn write_durable(
        &self,
        class: IoClass,
        offset_bytes: u64,
        buf: IoBuf,
    ) -> IoResult<IoBuf> {
        let len_bytes = buf.len() as u64;
        let io = self.queued(class, len_bytes, &self.io_stats.write, || {
            self.backend.write_durable(offset_bytes, buf)
        });
        if self.inject.armed() {
            return Box::pin(self.inject.apply(self.name(), IoOp::Write, io, |_| None)).await;
        }
        io.await
    }

    /// Writes `buf`, which others share read-only (see [`oxpool_io::Backend::write_shared`]),
    /// at `offset_bytes` as an I/O of `class`.
    pub async fn write_shared(
        &self,
        class: IoClass,
        offset_bytes: u64,
        buf: Arc<IoBuf>,
    ) -> IoResult<()> {
        let len_bytes = buf.len() as u64;
        let io = self.queued(class, len_bytes, &self.io_stats.write, || {
            self.backend.write_shared(offset_bytes, buf)
        });
        if self.inject.armed() {
            return Box::pin(self.inject.apply(self.name(), IoOp::Write, io, |_| None)).await;
        }
        io.await
    }

    /// Writes `bufs` back to back from `offset_bytes` as one I/O of `class` (see
    /// [`oxpool_io::Backend::write_gather`]): adjacent blocks aggregated into one write.
    pub async fn write_gather(
        &self,
        class: IoClass,
        offset_bytes: u64,
        bufs: Vec<Arc<IoBuf>>,
    ) -> IoResult<()> {
        let len_bytes = bufs.iter().map(|b| b.len() as u64).sum();
        let io = self.queued(class, len_bytes, &self.io_stats.write, || {
            self.backend.write_gather(offset_bytes, bufs)
        });
        if self.inject.armed() {
            return Box::pin(self.inject.apply(self.name(), IoOp::Write, io, |_| None)).await;
        }
        io.await
    }

    /// Passes the queue with `class`, then starts the I/O `start` makes (only then: the
    /// backend submits at the first poll) and records its total and device time in `stats`.
    async fn queued<T>(
        &self,
        class: IoClass,
        len_bytes: u64,
        stats: &LeafOpStats,
        start: impl FnOnce() -> IoFuture<T>,
    ) -> IoResult<T> {
        let started = Instant::now();
        let admission = self.queue.admit(class).await;
        // A bypassed or at-once admission waited nothing: skip a second clock read.
        let issued = if admission.waited() {
            Instant::now()
        } else {
            started
        };
        let result = start().await;
        let done = Instant::now();
        let alone = admission.ran_alone();
        // The slot first, so the next waiter is issued before we account.
        drop(admission);
        self.queue.note_disk_wait(class, done - issued, alone);
        stats.record(len_bytes, done - started, done - issued);
        result
    }

    /// Flushes the device's write cache. Never queued (as ZFS's flushes, which are issued at
    /// priority NOW): a flush orders writes that already completed, and making it wait behind
    /// queued writes would delay a commit for I/O it does not concern.
    pub async fn flush(&self) -> IoResult<()> {
        let io = async {
            let started = Instant::now();
            let result = self.backend.flush().await;
            let elapsed = started.elapsed();
            self.io_stats.flush.record(0, elapsed, elapsed);
            result
        };
        if self.inject.armed() {
            return Box::pin(self.inject.apply(self.name(), IoOp::Flush, io, |_| None)).await;
        }
        io.await
    }
}

#[cfg(test)]
mod tests {
    use crate::vdev::queue::{IoClass, SchedulerMode};
    use crate::vdev::Leaf;
    use oxpool_format::Guid;
    use oxpool_io::rt::block_on;
    use oxpool_io::{IoBuf, MemoryBackend};
    use std::sync::Arc;

    #[test]
    fn leaf_io_counts_ops_bytes_and_latency_in_every_mode() {
        let leaf = Leaf::new(Guid(1), Arc::new(MemoryBackend::new("m", 1 << 20)));
        for mode in [SchedulerMode::Off, SchedulerMode::On, SchedulerMode::Auto] {
            leaf.queue.set_mode(mode);
            block_on(async {
                let mut b = IoBuf::zeroed(4096);
                b.fill(7);
                leaf.write(IoClass::AsyncWrite, 8192, b).await.unwrap();
                let r = leaf
                    .read(IoClass::SyncRead, 8192, IoBuf::zeroed(4096))
                    .await
                    .unwrap();
                assert!(r.iter().all(|&x| x == 7));
                leaf.flush().await.unwrap();
            });
        }
        let s = leaf.io_stats.snapshot();
        assert_eq!((s.read.ops, s.write.ops, s.flush.ops), (3, 3, 3));
        assert_eq!(s.read.bytes, 3 * 4096);
        assert_eq!(s.read.total_wait.count(), 3);
        assert_eq!(s.write.disk_wait.count(), 3);
        let q = leaf.queue.snapshot();
        let queued: u64 = q.queued.iter().sum();
        let bypassed: u64 = q.bypassed.iter().sum();
        // `on` queued its two; `off` and `auto` (an idle memory device) bypassed theirs.
        assert_eq!((queued, bypassed), (2, 4));
        assert_eq!(q.active, [0; 5]);
        // Each read ran alone on an idle device: the saturation rule has its measure.
        assert!(q.sync_read_disk_wait_alone_us > 0);
    }
}
