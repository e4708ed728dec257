//! What `oxpool iostat` and `oxpool status` show of one leaf device.

use crate::iostats::LeafIoSnapshot;
use serde::{Deserialize, Serialize};

/// One leaf device's statistics, as `oxpool iostat` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// The device's path.
    pub name: String,
    /// Its top-level vdev: `mirror-N`, or the device's own path for a single device.
    pub vdev: String,
    /// Its `scheduler` mode.
    pub scheduler: String,
    /// Operations, bytes, latencies.
    pub io: LeafIoSnapshot,
    /// Its vdev queue's counters.
    pub queue: super::queue::QueueSnapshot,
    /// Its error counters, as `oxpool status` shows them.
    #[serde(default)]
    pub errors: DeviceErrors,
}

/// A leaf's error counters (`oxpool status`'s READ, WRITE, CKSUM columns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceErrors {
    /// Reads that failed.
    pub read: u64,
    /// Writes that failed.
    pub write: u64,
    /// Reads whose data failed its checksum.
    pub checksum: u64,
    /// Bytes rewritten by self-healing.
    pub repaired_bytes: u64,
}
