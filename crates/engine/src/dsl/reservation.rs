//! Reservations (`refreservation`, as ZFS's): space a volume is sure to have, which writers of
//! other volumes may not fill.
//!
//! A volume with `refreservation` R holds `max(0, R - written)` unused, where `written` is
//! what it references that its latest snapshot (or origin) does not: its unique bytes, as
//! ZFS's `ds_unique_bytes`. That is its `usedbyrefreservation`, part of its `used`. The pool's
//! `available` counts every volume's unused part as taken; the write throttle
//! (`Spa::wait_for_space`) keeps it in empty slabs for everyone but its volume. A snapshot
//! makes `written` 0, so the reservation holds all of R again: as in ZFS, a snapshot is
//! refused when the pool has not that much available (a reserved volume can then still
//! overwrite every block it has while the snapshot keeps the old ones).
//!
//! The figures are recomputed from the properties and the lineages after every txg sync and
//! every change of a reservation, never persisted: nothing to repair after a crash.

use crate::dsl::dataset::Dataset;
use crate::dsl::Datasets;
use crate::spa::Spa;
use std::sync::atomic::Ordering;

/// What a reservation of `refreservation_bytes` holds unused when its volume has written
/// `written_bytes` since its latest snapshot.
pub(crate) fn unused_bytes(refreservation_bytes: u64, written_bytes: u64) -> u64 {
    refreservation_bytes.saturating_sub(written_bytes)
}

/// `ds`'s unused reservation now, from its property and its lineage.
pub(crate) fn unused_of(ds: &Dataset) -> u64 {
    let reserved = ds.props.lock().unwrap().refreservation_bytes;
    if reserved == 0 {
        return 0;
    }
    let written = ds.lineage.lock().unwrap().written_bytes;
    unused_bytes(reserved, written)
}

impl Datasets {
    /// Recomputes every dataset's unused reservation
    /// ([`Dataset::reserved_unused_bytes`]) and their sum ([`Spa::reserved_bytes`]).
    /// After every txg sync, and after whatever changes a reservation or the set of datasets.
    pub(crate) fn update_reservations(&self, spa: &Spa) {
        // Reads and stores under one lock: two at once (the sync thread's and a change's)
        // would otherwise let the one that read first store last, and a reservation just set
        // would count for nothing until the next sync.
        let _one_at_a_time = self.reservations.lock().unwrap();
        let mut total = 0u64;
        for ds in self.all() {
            let unused = unused_of(&ds);
            ds.reserved_unused_bytes.store(unused, Ordering::Relaxed);
            total = total.saturating_add(unused);
        }
        spa.reserved_bytes.store(total, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::unused_bytes;

    #[test]
    fn a_reservation_holds_what_its_volume_has_not_written() {
        assert_eq!(unused_bytes(0, 5), 0);
        assert_eq!(unused_bytes(10, 4), 6);
        assert_eq!(unused_bytes(10, 10), 0);
        // Written beyond it (a reservation smaller than the data): nothing held.
        assert_eq!(unused_bytes(10, 25), 0);
    }
}
