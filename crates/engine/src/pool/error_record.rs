//! A pool's error counters (`oxpool status`'s READ, WRITE, CKSUM and repaired bytes) and its
//! log of damaged data, taken out and put back.
//!
//! Both live in memory while the pool is open, as ZFS's vdev counters live while a pool is
//! imported. A host that opens a pool for one command and exports it after (`oxpool`
//! without a server) would lose them with every command: a read that repaired a mirror's bad
//! side would leave no trace for the `status` after it. So the host takes them out before it
//! lets the pool go ([`Pool::error_record`]) and puts them back at the next open
//! ([`Pool::restore_error_record`]), until `clear` zeroes them or the pool is exported. A
//! device DEGRADED by the fault rule (checksum errors) is carried the same way: ZFS records
//! that state in the pool's configuration; here the pool's metadata records FAULTED and
//! OFFLINE devices, and DEGRADED lives with the counts that caused it.

use super::Pool;
use crate::spa::errlog::DamagedRange;
use crate::vdev::DeviceErrors;
use oxpool_format::Guid;
use std::sync::atomic::Ordering;

/// What a pool's error counters and damaged-data log hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    /// Each device with a count that is not zero or DEGRADED, by guid (members and spares).
    pub devices: Vec<DeviceRecord>,
    /// The damaged ranges (`oxpool status -v`).
    pub damaged: Vec<DamagedRange>,
    /// Damaged blocks beyond the log's capacity, only counted.
    pub damaged_unnamed: u64,
}

/// One device's part of an [`ErrorRecord`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceRecord {
    /// The device.
    pub guid: Guid,
    /// Its counters.
    pub counts: DeviceErrors,
    /// Why it is DEGRADED (too many checksum errors, say), if it is. FAULTED and OFFLINE
    /// are in the pool's own metadata already; DEGRADED, as the counts, lives in memory.
    pub degraded: Option<String>,
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
        let mut devices: Vec<DeviceRecord> = Vec::new();
        for leaf in vdevs.leaves().chain(vdevs.spare_leaves()) {
            if devices.iter().any(|d| d.guid == leaf.guid) {
                continue;
            }
            let counts = leaf.counters.snapshot();
            // Only what the fault rule decided: a DEGRADED the import decided (a device
            // FAULTED at export that its vdev cannot do without) each import decides again.
            let degraded = leaf.health.degraded_by_rule();
            if counts != DeviceErrors::default() || degraded.is_some() {
                devices.push(DeviceRecord {
                    guid: leaf.guid,
                    counts,
                    degraded,
                });
            }
        }
        devices.sort_by_key(|d| d.guid.0);
        let (damaged, damaged_unnamed) = self.spa.error_log.ranges();
        ErrorRecord {
            devices,
            damaged,
            damaged_unnamed,
        }
    }

    /// [`Pool::error_record`], keeping from `before` (the record kept at the last open) the
    /// devices the pool still names but has not open now (missing for this import): ZFS
    /// keeps a missing device's counts while the pool is imported, and a device absent for
    /// one command must not come back clean.
    pub fn error_record_after(&self, before: &ErrorRecord) -> ErrorRecord {
        let mut now = self.error_record();
        let config = self.spa.zio.vdevs.config();
        let vdevs = &self.spa.zio.vdevs;
        let open = |g: Guid| {
            vdevs.leaves().any(|l| l.guid == g) || vdevs.spare_leaves().iter().any(|l| l.guid == g)
        };
        for d in &before.devices {
            let named = config.leaves().any(|l| l.guid == d.guid);
            if named && !open(d.guid) && !now.devices.iter().any(|n| n.guid == d.guid) {
                now.devices.push(d.clone());
            }
        }
        now.devices.sort_by_key(|d| d.guid.0);
        now
    }

    /// Adds what `record` holds to the pool's counters and damaged-data log (just opened:
    /// what its import found is kept too), and marks DEGRADED again the devices that were
    /// (those still in service). A device the pool no longer has (detached, replaced) is
    /// skipped: its counts went with it.
    pub fn restore_error_record(&self, record: &ErrorRecord) {
        let vdevs = &self.spa.zio.vdevs;
        for d in &record.devices {
            let leaf = vdevs
                .leaves()
                .find(|l| l.guid == d.guid)
                .or_else(|| vdevs.spare_leaves().into_iter().find(|l| l.guid == d.guid));
            let Some(leaf) = leaf else { continue };
            if let Some(why) = &d.degraded {
                leaf.health.degrade_by_rule(why.clone());
            }
            let counts = &d.counts;
            let c = &leaf.counters;
            // Saturating: the record comes from a file, and a count must not wrap to small.
            for (counter, n) in [
                (&c.read_errors, counts.read),
                (&c.write_errors, counts.write),
                (&c.checksum_errors, counts.checksum),
                (&c.repaired_bytes, counts.repaired_bytes),
            ] {
                let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_add(n))
                });
            }
        }
        // The record is this pool's (the host keys it by guid); a pool imported under a new
        // name since names its datasets with the new one.
        let pool = &self.spa.name;
        let damaged: Vec<DamagedRange> = record
            .damaged
            .iter()
            .map(|r| DamagedRange {
                dataset: match r.dataset.split_once('/') {
                    Some((_, rest)) => format!("{pool}/{rest}"),
                    None => r.dataset.clone(),
                },
                ..r.clone()
            })
            .collect();
        self.spa.error_log.restore(&damaged, record.damaged_unnamed);
    }
}
