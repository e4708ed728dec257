//! I/O statistics for `oxpool iostat`: operation and byte counts and latency histograms per
//! leaf device and per volume.
//!
//! Everything here is recorded on the I/O path, so recording is a handful of relaxed atomic
//! additions: no lock, no allocation. Readers take [`snapshot`](LatencyHistogram::snapshot)s
//! and subtract two of them for an interval; the counters only ever increase.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets of a [`LatencyHistogram`]: bucket `k` counts latencies in `[2^k, 2^(k+1))` us
/// (bucket 0 also counts 0 us), and the last one everything from `2^(COUNT-1)` us (16.8 s) up.
pub const LATENCY_BUCKET_COUNT: usize = 25;

/// A lock-free histogram of latencies in power-of-two microsecond buckets, plus their sum
/// (for averages).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKET_COUNT],
    sum_us: AtomicU64,
}

/// The bucket a latency of `us` microseconds falls in.
pub fn latency_bucket(us: u64) -> usize {
    // floor(log2(us)) for us >= 1; 0 for 0 and 1.
    let log2 = 63 - (us | 1).leading_zeros() as usize;
    log2.min(LATENCY_BUCKET_COUNT - 1)
}

/// The lower bound of bucket `k` in microseconds (bucket 0 starts at 0 but is labelled 1 us).
pub fn latency_bucket_floor_us(k: usize) -> u64 {
    debug_assert!(k < LATENCY_BUCKET_COUNT);
    1 << k
}

impl LatencyHistogram {
    /// Records one latency.
    pub fn record(&self, latency: Duration) {
        self.record_us(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    /// Records one latency given in microseconds.
    pub fn record_us(&self, us: u64) {
        self.buckets[latency_bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// A copy of the counts. Not atomic as a whole: a reader racing with recorders may see a
    /// bucket and the sum disagree by the I/Os in progress, which an interval report absorbs.
    pub fn snapshot(&self) -> LatencySnapshot {
        let mut buckets = [0u64; LATENCY_BUCKET_COUNT];
        for (out, b) in buckets.iter_mut().zip(&self.buckets) {
            *out = b.load(Ordering::Relaxed);
        }
        LatencySnapshot {
            buckets,
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// A point-in-time copy of a [`LatencyHistogram`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencySnapshot {
    /// Count per bucket (see [`LATENCY_BUCKET_COUNT`]).
    pub buckets: [u64; LATENCY_BUCKET_COUNT],
    /// Sum of the recorded latencies in microseconds.
    pub sum_us: u64,
}

impl LatencySnapshot {
    /// Latencies recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Average latency in microseconds (0 with nothing recorded).
    pub fn average_us(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum_us as f64 / n as f64,
        }
    }

    /// What was recorded between `earlier` and `self`.
    pub fn since(&self, earlier: &LatencySnapshot) -> LatencySnapshot {
        let mut buckets = [0u64; LATENCY_BUCKET_COUNT];
        for (k, out) in buckets.iter_mut().enumerate() {
            *out = self.buckets[k].saturating_sub(earlier.buckets[k]);
        }
        LatencySnapshot {
            buckets,
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
        }
    }
}

/// Counters of one kind of operation (read, write, flush) on a leaf device.
#[derive(Debug, Default)]
pub struct LeafOpStats {
    /// Operations completed (successfully or not).
    pub ops: AtomicU64,
    /// Bytes transferred.
    pub bytes: AtomicU64,
    /// Time from the I/O's start to its completion, queue wait included (`zpool iostat -l`'s
    /// total_wait).
    pub total_wait: LatencyHistogram,
    /// Time at the device only, from issue to completion (`disk_wait`).
    pub disk_wait: LatencyHistogram,
}

/// A point-in-time copy of [`LeafOpStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafOpSnapshot {
    /// See [`LeafOpStats::ops`].
    pub ops: u64,
    /// See [`LeafOpStats::bytes`].
    pub bytes: u64,
    /// See [`LeafOpStats::total_wait`].
    pub total_wait: LatencySnapshot,
    /// See [`LeafOpStats::disk_wait`].
    pub disk_wait: LatencySnapshot,
}

impl LeafOpStats {
    /// Records one completed operation.
    pub fn record(&self, bytes: u64, total_wait: Duration, disk_wait: Duration) {
        debug_assert!(disk_wait <= total_wait);
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.total_wait.record(total_wait);
        self.disk_wait.record(disk_wait);
    }

    /// A copy.
    pub fn snapshot(&self) -> LeafOpSnapshot {
        LeafOpSnapshot {
            ops: self.ops.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            total_wait: self.total_wait.snapshot(),
            disk_wait: self.disk_wait.snapshot(),
        }
    }
}

impl LeafOpSnapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &LeafOpSnapshot) -> LeafOpSnapshot {
        LeafOpSnapshot {
            ops: self.ops.saturating_sub(earlier.ops),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            total_wait: self.total_wait.since(&earlier.total_wait),
            disk_wait: self.disk_wait.since(&earlier.disk_wait),
        }
    }
}

/// The I/O statistics of one leaf device.
#[derive(Debug, Default)]
pub struct LeafIoStats {
    /// Reads.
    pub read: LeafOpStats,
    /// Writes.
    pub write: LeafOpStats,
    /// Cache flushes (never queued: total and disk wait are the same).
    pub flush: LeafOpStats,
}

/// A point-in-time copy of [`LeafIoStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafIoSnapshot {
    /// Reads.
    pub read: LeafOpSnapshot,
    /// Writes.
    pub write: LeafOpSnapshot,
    /// Flushes.
    pub flush: LeafOpSnapshot,
}

impl LeafIoStats {
    /// A copy.
    pub fn snapshot(&self) -> LeafIoSnapshot {
        LeafIoSnapshot {
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            flush: self.flush.snapshot(),
        }
    }
}

impl LeafIoSnapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &LeafIoSnapshot) -> LeafIoSnapshot {
        LeafIoSnapshot {
            read: self.read.since(&earlier.read),
            write: self.write.since(&earlier.write),
            flush: self.flush.since(&earlier.flush),
        }
    }
}

/// One volume's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeStats {
    /// The volume's name inside the pool.
    pub name: String,
    /// The volume's id: what it is whatever its name (a rename, or a volume destroyed and
    /// created again under its name). None in statistics written before it was recorded.
    #[serde(default)]
    pub id: Option<oxpool_format::VolumeId>,
    /// Operations, bytes, latencies of its API calls.
    pub io: VolumeIoSnapshot,
}

/// Counters of one kind of volume operation (read, write, flush, ...), measured around the
/// [`Volume`](crate::Volume) API call: everything the client waits for in the engine.
#[derive(Debug, Default)]
pub struct VolumeOpStats {
    /// Calls completed (successfully or not, or abandoned by the caller).
    pub ops: AtomicU64,
    /// Bytes the calls covered.
    pub bytes: AtomicU64,
    /// Time per call.
    pub latency: LatencyHistogram,
}

/// A point-in-time copy of [`VolumeOpStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeOpSnapshot {
    /// See [`VolumeOpStats::ops`].
    pub ops: u64,
    /// See [`VolumeOpStats::bytes`].
    pub bytes: u64,
    /// See [`VolumeOpStats::latency`].
    pub latency: LatencySnapshot,
}

impl VolumeOpStats {
    /// Records one call.
    pub fn record(&self, bytes: u64, latency: Duration) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.latency.record(latency);
    }

    /// A copy.
    pub fn snapshot(&self) -> VolumeOpSnapshot {
        VolumeOpSnapshot {
            ops: self.ops.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            latency: self.latency.snapshot(),
        }
    }
}

impl VolumeOpSnapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &VolumeOpSnapshot) -> VolumeOpSnapshot {
        VolumeOpSnapshot {
            ops: self.ops.saturating_sub(earlier.ops),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            latency: self.latency.since(&earlier.latency),
        }
    }
}

/// The I/O statistics of one volume.
#[derive(Debug, Default)]
pub struct VolumeIoStats {
    /// Reads.
    pub read: VolumeOpStats,
    /// Writes, write-zeroes and trims (everything that changes the volume).
    pub write: VolumeOpStats,
    /// Flushes.
    pub flush: VolumeOpStats,
}

/// Which counter a volume call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeOp {
    /// A read.
    Read,
    /// A write, write-zeroes or trim.
    Write,
    /// A flush.
    Flush,
}

impl VolumeIoStats {
    /// Starts timing one call; the returned guard records it when dropped (so an error or an
    /// abandoned call is counted too, with the time it took).
    pub fn start(&self, op: VolumeOp, bytes: u64) -> VolumeOpTimer<'_> {
        VolumeOpTimer {
            stats: match op {
                VolumeOp::Read => &self.read,
                VolumeOp::Write => &self.write,
                VolumeOp::Flush => &self.flush,
            },
            bytes,
            started: std::time::Instant::now(),
        }
    }

    /// A copy.
    pub fn snapshot(&self) -> VolumeIoSnapshot {
        VolumeIoSnapshot {
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            flush: self.flush.snapshot(),
        }
    }
}

/// Times one volume call (see [`VolumeIoStats::start`]).
#[derive(Debug)]
pub struct VolumeOpTimer<'a> {
    stats: &'a VolumeOpStats,
    bytes: u64,
    started: std::time::Instant,
}

impl Drop for VolumeOpTimer<'_> {
    fn drop(&mut self) {
        self.stats.record(self.bytes, self.started.elapsed());
    }
}

/// A point-in-time copy of [`VolumeIoStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeIoSnapshot {
    /// Reads.
    pub read: VolumeOpSnapshot,
    /// Writes, write-zeroes and trims.
    pub write: VolumeOpSnapshot,
    /// Flushes.
    pub flush: VolumeOpSnapshot,
}

impl VolumeIoSnapshot {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &VolumeIoSnapshot) -> VolumeIoSnapshot {
        VolumeIoSnapshot {
            read: self.read.since(&earlier.read),
            write: self.write.since(&earlier.write),
            flush: self.flush.since(&earlier.flush),
        }
    }

    /// Every call.
    pub fn ops(&self) -> u64 {
        self.read.ops + self.write.ops + self.flush.ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_of_microseconds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 0);
        assert_eq!(latency_bucket(2), 1);
        assert_eq!(latency_bucket(3), 1);
        assert_eq!(latency_bucket(4), 2);
        assert_eq!(latency_bucket(1023), 9);
        assert_eq!(latency_bucket(1024), 10);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKET_COUNT - 1);
        for k in 0..LATENCY_BUCKET_COUNT {
            assert_eq!(latency_bucket(latency_bucket_floor_us(k)), k);
        }
    }

    #[test]
    fn histogram_counts_sums_and_subtracts() {
        let h = LatencyHistogram::default();
        h.record_us(5);
        h.record_us(6);
        h.record(Duration::from_millis(3));
        let a = h.snapshot();
        assert_eq!(a.count(), 3);
        assert_eq!(a.buckets[2], 2);
        assert_eq!(a.buckets[latency_bucket(3000)], 1);
        assert_eq!(a.sum_us, 3011);
        h.record_us(100);
        let d = h.snapshot().since(&a);
        assert_eq!(d.count(), 1);
        assert_eq!(d.average_us(), 100.0);
    }

    #[test]
    fn volume_timer_records_on_drop() {
        let s = VolumeIoStats::default();
        drop(s.start(VolumeOp::Write, 4096));
        let snap = s.snapshot();
        assert_eq!(snap.write.ops, 1);
        assert_eq!(snap.write.bytes, 4096);
        assert_eq!(snap.write.latency.count(), 1);
        assert_eq!(snap.ops(), 1);
    }
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
    /// Data blocks a txg sync wrote with a checksum it did not compute: whole blocks hashed
    /// by the writer's thread on arrival (`Volume::write_blocks`), and received blocks.
    pub presummed_blocks: AtomicU64,
    /// Device flushes of any kind (log commits and txg commits), one per leaf flushed.
    pub device_flushes: AtomicU64,
    /// Log blocks written early (ahead of their commit, without a flush; counted in
    /// [`LogCounters::blocks_written`] too).
    pub early_blocks: AtomicU64,
    /// Nanoseconds commits spent flushing blocks written early, summed.
    pub early_flush_ns_total: AtomicU64,
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
    /// Data blocks a txg sync wrote with a checksum computed before it.
    pub presummed_blocks: u64,
    /// Device flushes of any kind, one per leaf flushed.
    pub device_flushes: u64,
    /// Log blocks written early.
    pub early_blocks: u64,
    /// Nanoseconds commits spent flushing blocks written early, summed.
    pub early_flush_ns_total: u64,
    /// Writers the write throttle delayed (dirty data above 60 % of `dirty_max`).
    pub throttle_delays: u64,
    /// Nanoseconds they slept, summed.
    pub throttle_delay_ns_total: u64,
    /// Writers that waited outright, dirty data being at `dirty_max`.
    pub throttle_waits: u64,
    /// Nanoseconds they waited, summed.
    pub throttle_wait_ns_total: u64,
}

impl LogStats {
    /// The counters as a one-line JSON object (for `oxpool iostat --json` and the benchmark).
    pub fn to_json(&self) -> String {
        format!(
            "{{\"commits\":{},\"log_blocks\":{},\"log_bytes\":{},\"log_flushes\":{},\"log_durable_writes\":{},\"log_write_us\":{},\"client_bytes\":{},\"indirect_bytes\":{},\"adopted_blocks\":{},\"presummed_blocks\":{},\"device_flushes\":{},\"log_early_blocks\":{},\"log_early_flush_us\":{},\"throttle_delays\":{},\"throttle_delay_us\":{},\"throttle_waits\":{},\"throttle_wait_us\":{}}}",
            self.commits,
            self.blocks_written,
            self.bytes_written,
            self.flushes,
            self.durable_writes,
            self.write_ns_total / 1000,
            self.client_bytes,
            self.indirect_bytes,
            self.adopted_blocks,
            self.presummed_blocks,
            self.device_flushes,
            self.early_blocks,
            self.early_flush_ns_total / 1000,
            self.throttle_delays,
            self.throttle_delay_ns_total / 1000,
            self.throttle_waits,
            self.throttle_wait_ns_total / 1000
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
            presummed_blocks: self.presummed_blocks.load(Ordering::Relaxed),
            device_flushes: self.device_flushes.load(Ordering::Relaxed),
            early_blocks: self.early_blocks.load(Ordering::Relaxed),
            early_flush_ns_total: self.early_flush_ns_total.load(Ordering::Relaxed),
            // The write throttle's, filled in by the pool (`ThrottleCounters::fill`).
            throttle_delays: 0,
            throttle_delay_ns_total: 0,
            throttle_waits: 0,
            throttle_wait_ns_total: 0,
        }
    }
}
