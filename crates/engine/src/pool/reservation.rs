//! Volume reservations (`refreservation`, as ZFS's), the pool's side: what `auto` means here,
//! a volume's `available`, and the checks that refuse, with nothing changed, what the pool has
//! no room for: a reservation set or grown, a volume with one created or grown, a snapshot or
//! a rollback that makes one hold all of itself again. The accounting is `dsl/reservation.rs`.
//!
//! Each such change holds [`Pool::reservation_change`] from its check until its figures count
//! (a snapshot's and a rollback's: until their sync), so two cannot pass on the same space.
//! Writers are not stopped meanwhile: what a write admitted between the check and the sync
//! takes, the reservation may lack (at most a txg's writes), as with ZFS's open-context checks.

use crate::dmu::dirty::SpaceCosts;
use crate::dmu::tree::levels_for;
use crate::dsl::dataset::Dataset;
use crate::dsl::reservation::{unused_bytes, unused_of};
use crate::pool::Pool;
use crate::props::VolumeProps;
use crate::vdev::alloc::DEFER_TXGS;
use crate::{EngineError, Result, Volume};
use oxpool_io::rt::block_on;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// The least room `auto` keeps for overwrites beyond what writing a volume whole takes:
/// enough for a client's large writes (qemu-img and nbdcopy write up to 2 MiB at a time) with
/// their indirect blocks, however full the other volumes make the pool.
const COW_HEADROOM_MIN_BYTES: u64 = 4 << 20;

/// Volumes larger than this get `auto` = their size: no pool holds them, and the worst case
/// of their blocks would overflow (512-byte blocks, three copies, up to 4E).
const AUTO_VOLSIZE_MAX_BYTES: u64 = 1 << 50;

/// Room `auto` keeps for a volume that takes `whole_bytes` written whole to overwrite itself:
/// a thirty-second of it (as ZFS's slop is of a pool), at least [`COW_HEADROOM_MIN_BYTES`] or
/// the whole if smaller. A full volume's writer admitted within it waits for the syncs that
/// return the blocks it replaced (`Spa::wait_for_space`) rather than failing, so writes go on
/// (slowly, a headroom per few txgs) while the rest of the pool is full.
fn cow_headroom_bytes(whole_bytes: u64) -> u64 {
    (whole_bytes / 32).max(whole_bytes.min(COW_HEADROOM_MIN_BYTES))
}

/// A size for a message: binary units, one decimal (`69.1M`, `2.0T`).
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["K", "M", "G", "T", "P", "E"];
    let mut value = bytes as f64;
    let mut unit = "";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    match unit {
        "" => format!("{bytes}"),
        u => format!("{value:.1}{u}"),
    }
}

impl Pool {
    /// `refreservation=auto` for a volume with `props`: what writing each of its blocks once
    /// may take, every copy and every indirect block included, inflated as the costliest data
    /// vdev inflates it (a raidz's parity): the write throttle's own worst case
    /// ([`SpaceCosts`]), so a volume that reserved it can be written whole whatever the
    /// others do. And room to overwrite it ([`cow_headroom_bytes`]): copy-on-write places a
    /// txg's new blocks before the old ones are free, and a free comes back only some txgs
    /// later. ZFS's `zvol_volsize_to_reservation` estimates the same, its way (its metadata
    /// estimate is generous, and the slack is what its overwrites use). Unlike ZFS's it
    /// depends on the pool's vdevs: adding one that inflates more raises it.
    pub fn auto_refreservation_bytes(&self, props: &VolumeProps) -> u64 {
        let nblocks = props.volsize_bytes / u64::from(props.volblocksize_bytes);
        if nblocks == 0 {
            return 0;
        }
        if props.volsize_bytes > AUTO_VOLSIZE_MAX_BYTES {
            return props.volsize_bytes;
        }
        let worst = SpaceCosts::new(props, levels_for(nblocks)).worst(0, nblocks - 1);
        let space = self.spa.state.lock().unwrap().alloc.space();
        let whole = space.inflated(&worst).total();
        whole.saturating_add(cow_headroom_bytes(whole))
    }

    /// A `refreservation` value for a volume with `props` as `VolumeProps::set` takes it:
    /// `auto` resolved ([`Pool::auto_refreservation_bytes`]), anything else as given.
    pub fn resolve_refreservation(&self, props: &VolumeProps, value: &str) -> String {
        match value {
            "auto" => self.auto_refreservation_bytes(props).to_string(),
            v => v.to_string(),
        }
    }

    /// Sets `props` on a new volume's (created or cloned) properties `p`, as
    /// `VolumeProps::set_initial` does, `refreservation` last: `auto` is then what the volume
    /// as set up (its block size, its copies) takes.
    pub(super) fn set_initial_props(
        &self,
        p: &mut VolumeProps,
        props: &[(String, String)],
    ) -> Result<()> {
        let mut reservation = None;
        for (k, v) in props {
            match k.as_str() {
                "refreservation" => reservation = Some(v.as_str()),
                _ => p.set_initial(k, v)?,
            }
        }
        if let Some(v) = reservation {
            let v = self.resolve_refreservation(p, v);
            p.set_initial("refreservation", &v)?;
        }
        Ok(())
    }

    /// The right to change what reservations hold, one change at a time (module comment).
    /// Taken before the table of volumes, never under it.
    pub(super) fn reservation_change(&self) -> MutexGuard<'_, ()> {
        self.reservation_changes.lock().unwrap()
    }

    /// Refuses a change after which `volume`'s reservation would hold `more_bytes` more
    /// unused than before ([`Pool::check_room`]).
    pub(super) fn check_reservation_growth(&self, volume: &str, more_bytes: u64) -> Result<()> {
        self.check_room(more_bytes, |more, available, not_empty| {
            format!(
                "{}/{volume}'s refreservation would take {more} more, and {available} is \
                 available{not_empty} (make room, or reserve less: refreservation=SIZE or none, \
                 create -s)",
                self.spa.name
            )
        })
    }

    /// Refuses (out of space, with `why(more, available, not_empty)` as the reason) a change
    /// after which reservations hold `more_bytes` more, when the pool has not that much
    /// available, or not in empty slabs beyond what the other reservations and the pending
    /// syncs keep there (`Spa::can_reserve`: a fragmented pool's free slots count in
    /// `available`; `not_empty` then says so).
    fn check_room(
        &self,
        more_bytes: u64,
        why: impl FnOnce(&str, &str, &str) -> String,
    ) -> Result<()> {
        if more_bytes == 0 {
            return Ok(());
        }
        let available = self.spa.available_bytes();
        let short = more_bytes > available;
        if short || !self.room_in_empty_slabs(more_bytes) {
            let not_empty = if short { "" } else { ", not in empty slabs" };
            return Err(EngineError::NoSpace {
                pool: self.spa.name.clone(),
                detail: format!(
                    "; {}",
                    why(&human(more_bytes), &human(available), not_empty)
                ),
            });
        }
        Ok(())
    }

    /// Whether reservations can hold `more_bytes` more in empty slabs (`Spa::can_reserve`),
    /// once the frees that `available` already counts are back: they return some txgs after
    /// the sync that made them (a volume just destroyed), so this syncs a bounded number of
    /// times while the answer is no.
    fn room_in_empty_slabs(&self, more_bytes: u64) -> bool {
        for _ in 0..=DEFER_TXGS + 1 {
            if self.spa.can_reserve(more_bytes) {
                return true;
            }
            if self.spa.sync_now().is_err() {
                return false;
            }
        }
        self.spa.can_reserve(more_bytes)
    }

    /// Sets `volume`'s `refreservation` (`none`, a size or `auto`); refused, with nothing
    /// changed, if what it would hold unused grows by more than the pool has room for.
    pub(super) fn set_refreservation(&self, ds: &Dataset, volume: &str, value: &str) -> Result<()> {
        let _change = self.reservation_change();
        let new_bytes = {
            let mut q = ds.props.lock().unwrap().clone();
            let v = self.resolve_refreservation(&q, value);
            q.set("refreservation", &v)?;
            q.refreservation_bytes
        };
        let written = ds.lineage.lock().unwrap().written_bytes;
        let more = unused_bytes(new_bytes, written).saturating_sub(unused_of(ds));
        self.check_reservation_growth(volume, more)?;
        ds.props.lock().unwrap().refreservation_bytes = new_bytes;
        self.dsl.update_reservations(&self.spa);
        self.spa.txg.mark_dirty();
        Ok(())
    }

    /// Resizes `vol` (named `volume`) to `value`; one that reserved `auto` keeps reserving
    /// it, as ZFS keeps a thick volume thick. A growth of the reservation is checked and
    /// applied before the resize (which waits for a sync), so the space is held meanwhile,
    /// and taken back if the resize fails; a shrink's smaller one is applied after. The
    /// caller holds the volume's resize lock.
    pub(super) fn resize_reserved(&self, vol: &Volume, volume: &str, value: &str) -> Result<()> {
        let _change = self.reservation_change();
        let ds = &vol.vol.ds;
        let (old, new) = {
            let old = ds.props.lock().unwrap().clone();
            let mut q = old.clone();
            q.set("volsize", value)?;
            VolumeProps::check_new_volsize(q.volsize_bytes)?;
            q.validate()?;
            (old, q)
        };
        let follows = old.refreservation_bytes != 0
            && old.refreservation_bytes == self.auto_refreservation_bytes(&old);
        if !follows {
            return block_on(vol.resize(new.volsize_bytes));
        }
        let reservation = self.auto_refreservation_bytes(&new);
        let set = |bytes: u64| {
            ds.props.lock().unwrap().refreservation_bytes = bytes;
            self.dsl.update_reservations(&self.spa);
            self.spa.txg.mark_dirty();
        };
        if reservation <= old.refreservation_bytes {
            block_on(vol.resize(new.volsize_bytes))?;
            set(reservation);
            return Ok(());
        }
        let written = ds.lineage.lock().unwrap().written_bytes;
        let more = unused_bytes(reservation, written).saturating_sub(unused_of(ds));
        self.check_reservation_growth(volume, more)?;
        set(reservation);
        block_on(vol.resize(new.volsize_bytes)).inspect_err(|_| set(old.refreservation_bytes))
    }

    /// Refuses `what` (a snapshot of `datasets`, or a rollback of one) when the reservations
    /// among them, which it makes hold all of themselves again (what each volume wrote since
    /// its latest snapshot is then shared), would take more than the pool has available: as
    /// ZFS refuses such a snapshot (`dsl_dataset_snapshot_reserve_space`) or rollback.
    pub(super) fn check_snapshot_reservations(
        &self,
        datasets: &[&Dataset],
        what: &str,
    ) -> Result<()> {
        let mut more_bytes = 0u64;
        let mut reserved = Vec::new();
        for ds in datasets {
            let r = ds.props.lock().unwrap().refreservation_bytes;
            if r == 0 {
                continue;
            }
            let written = ds.lineage.lock().unwrap().written_bytes;
            more_bytes = more_bytes.saturating_add(r.min(written));
            reserved.push(ds.full_name());
        }
        self.check_room(more_bytes, |more, available, not_empty| {
            format!(
                "after {what} the refreservation of {} would hold {more} more, and {available} \
                 is available{not_empty} (make room, or lower the refreservation)",
                reserved.join(", ")
            )
        })
    }

    /// `volume`'s `available`: the pool's, and what its own reservation holds unused.
    pub fn volume_available_bytes(&self, volume: &str) -> Result<u64> {
        let ds = self.dataset(volume)?;
        Ok(self
            .spa
            .available_bytes()
            .saturating_add(ds.reserved_unused_bytes.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::{cow_headroom_bytes, human};

    #[test]
    fn overwrite_room_is_a_thirty_second_at_least_4m_or_the_whole() {
        assert_eq!(cow_headroom_bytes(1 << 20), 1 << 20);
        assert_eq!(cow_headroom_bytes(64 << 20), 4 << 20);
        assert_eq!(cow_headroom_bytes(1 << 30), 32 << 20);
        assert_eq!(cow_headroom_bytes(u64::MAX), u64::MAX / 32);
    }

    #[test]
    fn sizes_in_messages_are_human() {
        assert_eq!(human(512), "512");
        assert_eq!(human(72_482_816), "69.1M");
        assert_eq!(human(15 << 60), "15.0E");
    }
}
