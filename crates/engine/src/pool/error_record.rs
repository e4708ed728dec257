//! A pool's error counters (`oxpool status`'s READ, WRITE, CKSUM and repaired bytes) and its
//! log of damaged data, taken out and put back.
//!
//! Both live in memory while the pool is open, as ZFS's vdev counters live while a pool is
//! imported. A host that opens a pool for one command and exports it after (`oxpool`
//! without a server) would lose them with every command: a read that repaired a mirror's bad
//! side would leave no trace for the `status` after it. So the host takes them out before it
//! lets the pool go ([`Pool::error_record`]) and puts them back at the next open
//! ([`Pool::restore_error_record`]), until `clear` zeroes them or the pool is exported.

use super::Pool;
use crate::spa::errlog::DamagedRange;
use crate::vdev::DeviceErrors;
use oxpool_format::Guid;
use std::sync::atomic::Ordering;

/// What a pool's error counters and damaged-data log hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    /// Each device with a count that is not zero, by guid (in-service members and spares).
    pub devices: Vec<(Guid, DeviceErrors)>,
    /// The damaged ranges (`oxpool status -v`).
    pub damaged: Vec<DamagedRange>,
    /// Damaged blocks beyond the log's capacity, only counted.
    pub damaged_unnamed: u64,
}

impl ErrorRecord {
    /// Nothing to keep: no count, no damage.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.damaged.is_empty() && self.damaged_unnamed == 0
    }
}

impl Pool {
    /// The error counters of its devices (those that are not all zero) and its damaged-data
    /// log, to carry to the pool's next open on this host.
    pub fn error_record(&self) -> ErrorRecord {
        let vdevs = &self.spa.zio.vdevs;
        let mut devices: Vec<(Guid, DeviceErrors)> = Vec::new();
        for leaf in vdevs.leaves().chain(vdevs.spare_leaves()) {
            if devices.iter().any(|(g, _)| *g == leaf.guid) {
                continue;
            }
            let c = &leaf.counters;
            let counts = DeviceErrors {
                read: c.read_errors.load(Ordering::Relaxed),
                write: c.write_errors.load(Ordering::Relaxed),
                checksum: c.checksum_errors.load(Ordering::Relaxed),
                repaired_bytes: c.repaired_bytes.load(Ordering::Relaxed),
            };
            if counts != DeviceErrors::default() {
                devices.push((leaf.guid, counts));
            }
        }
        devices.sort_by_key(|(g, _)| g.0);
        let (damaged, damaged_unnamed) = self.spa.error_log.ranges();
        ErrorRecord {
            devices,
            damaged,
            damaged_unnamed,
        }
    }

    /// Adds what `record` holds to the pool's counters and damaged-data log (just opened:
    /// what its import found is kept too). A device the pool no longer has (detached,
    /// replaced) is skipped: its counts went with it.
    pub fn restore_error_record(&self, record: &ErrorRecord) {
        let vdevs = &self.spa.zio.vdevs;
        for (guid, counts) in &record.devices {
            let leaf = vdevs
                .leaves()
                .find(|l| l.guid == *guid)
                .or_else(|| vdevs.spare_leaves().into_iter().find(|l| l.guid == *guid));
            let Some(leaf) = leaf else { continue };
            let c = &leaf.counters;
            c.read_errors.fetch_add(counts.read, Ordering::Relaxed);
            c.write_errors.fetch_add(counts.write, Ordering::Relaxed);
            c.checksum_errors
                .fetch_add(counts.checksum, Ordering::Relaxed);
            c.repaired_bytes
                .fetch_add(counts.repaired_bytes, Ordering::Relaxed);
        }
        self.spa
            .error_log
            .restore(&record.damaged, record.damaged_unnamed);
    }
}
