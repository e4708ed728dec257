//! Volume reservations (`refreservation`, as ZFS's), the pool's side: what `auto` means here,
//! a volume's `available`, and the checks that refuse, with nothing changed, what the pool has
//! no room for: a reservation set or grown, a volume with one created or grown, a snapshot
//! that makes one hold all of itself again. The accounting is `dsl/reservation.rs`.
//!
//! The checks read `available` when the change is asked for; one change of a reservation at a
//! time (each holds the table of volumes while it checks and applies). What writers take in
//! between is the race ZFS's open-context checks have too: a write admitted just before may
//! leave the pool short of the reservation by what it took, never more.

use crate::dmu::dirty::SpaceCosts;
use crate::dmu::tree::levels_for;
use crate::dsl::dataset::Dataset;
use crate::dsl::reservation::{unused_bytes, unused_of};
use crate::pool::Pool;
use crate::props::VolumeProps;
use crate::{EngineError, Result};
use std::sync::atomic::Ordering;

/// The least room `auto` keeps for overwrites beyond what writing a volume whole takes:
/// enough for a client's large writes (qemu-img and nbdcopy write up to 2 MiB at a time) with
/// their indirect blocks, however full the other volumes make the pool.
const COW_HEADROOM_MIN_BYTES: u64 = 4 << 20;

/// Room `auto` keeps for a volume that takes `whole_bytes` written whole to overwrite itself:
/// a thirty-second of it (as ZFS's slop is of a pool), at least [`COW_HEADROOM_MIN_BYTES`] or
/// the whole if smaller. A full volume's writer admitted within it waits for the syncs that
/// return the blocks it replaced (`Spa::wait_for_space`) rather than failing, so writes go on
/// (slowly, a headroom per few txgs) while the rest of the pool is full.
fn cow_headroom_bytes(whole_bytes: u64) -> u64 {
    (whole_bytes / 32).max(whole_bytes.min(COW_HEADROOM_MIN_BYTES))
}

/// A size for an out-of-space message, in MiB with one decimal (as `spa::space` gives them).
fn mib(bytes: u64) -> String {
    format!("{:.1}M", bytes as f64 / f64::from(1u32 << 20))
}

impl Pool {
    /// `refreservation=auto` for a volume with `props`: what writing each of its blocks once
    /// may take, every copy and every indirect block included, inflated as the costliest data
    /// vdev inflates it (a raidz's parity): the write throttle's own worst case
    /// ([`SpaceCosts`]), so a volume that reserved it can be written whole whatever the
    /// others do. And room to overwrite it ([`cow_headroom_bytes`]): copy-on-write places a
    /// txg's new blocks before the old ones are free, and a free comes back only some txgs
    /// later. ZFS's `zvol_volsize_to_reservation` estimates the same, its way (its metadata
    /// estimate is generous, and the slack is what its overwrites use).
    pub fn auto_refreservation_bytes(&self, props: &VolumeProps) -> u64 {
        let nblocks = props.volsize_bytes / u64::from(props.volblocksize_bytes);
        if nblocks == 0 {
            return 0;
        }
        let (size_bytes, _) = self.spa.size_and_alloc_bytes();
        if props.volsize_bytes > size_bytes {
            // More than the pool holds whatever it costs (and the cost would overflow for
            // the largest volumes): refused by the space check all the same.
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

    /// Refuses a change after which `volume`'s reservation would hold `more_bytes` more
    /// unused than before, when the pool has not that much available.
    pub(super) fn check_reservation_growth(&self, volume: &str, more_bytes: u64) -> Result<()> {
        let available = self.spa.available_bytes();
        if more_bytes > available {
            return Err(EngineError::NoSpace {
                pool: self.spa.name.clone(),
                detail: format!(
                    "; {}/{volume}'s refreservation would take {} more, and {} is available \
                     (make room, or set a smaller refreservation or none)",
                    self.spa.name,
                    mib(more_bytes),
                    mib(available)
                ),
            });
        }
        Ok(())
    }

    /// Sets `volume`'s `refreservation` (`none`, a size or `auto`); refused, with nothing
    /// changed, if what it would hold unused grows by more than the pool has available.
    pub(super) fn set_refreservation(&self, ds: &Dataset, volume: &str, value: &str) -> Result<()> {
        // One reservation change at a time: the table of volumes, as create and clone hold it.
        let _one_at_a_time = self.volumes.lock().unwrap();
        let new_props = {
            let mut q = ds.props.lock().unwrap().clone();
            let v = self.resolve_refreservation(&q, value);
            q.set("refreservation", &v)?;
            q
        };
        let written = ds.lineage.lock().unwrap().written_bytes;
        let old_unused = unused_of(ds);
        let new_unused = unused_bytes(new_props.refreservation_bytes, written);
        self.check_reservation_growth(volume, new_unused.saturating_sub(old_unused))?;
        ds.props.lock().unwrap().refreservation_bytes = new_props.refreservation_bytes;
        self.dsl.update_reservations(&self.spa);
        self.spa.txg.mark_dirty();
        Ok(())
    }

    /// The `refreservation` a volume with `old` should have once resized to `new`: `auto`'s
    /// new value if it had `auto`'s old one (as ZFS keeps a volume that was thick thick),
    /// else None (unchanged).
    pub(super) fn reservation_after_resize(
        &self,
        old: &VolumeProps,
        new: &VolumeProps,
    ) -> Option<u64> {
        (old.refreservation_bytes != 0
            && old.refreservation_bytes == self.auto_refreservation_bytes(old))
        .then(|| self.auto_refreservation_bytes(new))
    }

    /// Refuses snapshots of `datasets` when the reservations among them, which a snapshot
    /// makes hold all of themselves again (what each volume wrote since its latest snapshot
    /// is then the snapshot's too), would take more than the pool has available: as ZFS
    /// refuses such a snapshot (`dsl_dataset_snapshot_reserve_space`).
    pub(super) fn check_snapshot_reservations(&self, datasets: &[&Dataset]) -> Result<()> {
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
        let available = self.spa.available_bytes();
        if more_bytes > available {
            return Err(EngineError::NoSpace {
                pool: self.spa.name.clone(),
                detail: format!(
                    "; after the snapshot the refreservation of {} would hold {} more, and {} \
                     is available (make room, or lower the refreservation)",
                    reserved.join(", "),
                    mib(more_bytes),
                    mib(available)
                ),
            });
        }
        Ok(())
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
