//! The device verbs of a pool: attach, detach, replace, hot spares, and the repair (resilver)
//! that a new or returning device starts (`spa/devices.rs` and `vdev/change.rs` do the
//! work).

use super::Pool;
use crate::dsl::Datasets;
use crate::spa::Spa;
use crate::vdev::SpareStatus;
use crate::Result;
use oxpool_io::Backend;
use std::sync::Arc;

impl Pool {
    /// Attaches `new` beside `existing` (`oxpool attach`): a single device becomes a 2-way
    /// mirror, a mirror gains a side; the new side is resilvered. Refused (one line, nothing
    /// changed) on a raidz column, for a smaller device, one of another pool (unless
    /// `force`), or one in this pool already.
    pub fn attach(&self, existing: &str, new: Arc<dyn Backend>, force: bool) -> Result<()> {
        self.spa.attach(existing, new, force)?;
        start_repair(&self.spa, &self.dsl);
        Ok(())
    }

    /// Detaches `device` (`oxpool detach`): a mirror side, either member of a replacing
    /// pair, or a hot spare in use (it returns to the spares). Refused for the last side of
    /// a mirror and for a device whose blocks exist nowhere else.
    pub fn detach(&self, device: &str) -> Result<()> {
        self.spa.detach(device)
    }

    /// Replaces `old` with `new` (`oxpool replace`) on any vdev: the child becomes a
    /// replacing pair, written on both, until `new` is resilvered; then `old` is detached
    /// and its labels cleared. `new` may be at `old`'s path when that device was swapped.
    pub fn replace(&self, old: &str, new: Arc<dyn Backend>, force: bool) -> Result<()> {
        self.spa.replace(old, new, force)?;
        start_repair(&self.spa, &self.dsl);
        Ok(())
    }

    /// Adds hot spares (`oxpool add POOL spare DEV...`).
    pub fn add_spares(&self, devices: Vec<Arc<dyn Backend>>, force: bool) -> Result<()> {
        self.spa.add_spares(devices, force)?;
        // A device may be faulted already, waiting for a spare.
        if self.spa.spares_step_in() {
            start_repair(&self.spa, &self.dsl);
        }
        Ok(())
    }

    /// Removes a hot spare that is not in use (`oxpool remove POOL SPARE`).
    pub fn remove_spare(&self, device: &str) -> Result<()> {
        self.spa.remove_spare(device)
    }

    /// Removes a hot spare, or a separate log device with its log blocks moved off it
    /// (`oxpool remove POOL DEVICE`; a log mirror by its name, `mirror-N`). Volumes keep
    /// serving; sync writes wait for the txg while their logs start new chains elsewhere.
    pub fn remove(&self, device: &str) -> Result<()> {
        if self.spa.zio.vdevs.spare_named(device).is_some() {
            return self.spa.remove_spare(device);
        }
        let dsl = &self.dsl;
        self.spa.remove_log(device, &|v| dsl.leave_log_vdev(v))
    }

    /// The hot spares and their states.
    pub fn spares(&self) -> Vec<SpareStatus> {
        self.spa.zio.vdevs.spare_status()
    }

    /// Whether any child is a replacing or spare pair whose new member is not resilvered.
    pub fn resilvering(&self) -> bool {
        self.spa.zio.vdevs.tops().any(|t| {
            t.shape().children.iter().any(|c| {
                c.new.as_ref().is_some_and(|(_, m)| {
                    m.leaf.as_ref().is_some_and(|l| l.health.missed().is_some())
                })
            })
        })
    }

    /// Has hot spares step in for faulted devices (from the I/O path, a fault calls the
    /// tree's listener, which comes here on a thread of its own), and resumes a resilver an
    /// export or crash interrupted.
    pub(super) fn wire_devices(&self) {
        let (spa, dsl) = (Arc::downgrade(&self.spa), Arc::downgrade(&self.dsl));
        self.spa.zio.vdevs.on_spare_in.set(Box::new(move || {
            let (spa, dsl) = (spa.clone(), dsl.clone());
            // Not on the I/O path that saw the fault: the step-in writes labels and syncs.
            let spawned = std::thread::Builder::new()
                .name("spare-in".into())
                .spawn(move || {
                    if let (Some(spa), Some(dsl)) = (spa.upgrade(), dsl.upgrade()) {
                        if spa.spares_step_in() {
                            start_repair(&spa, &dsl);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot start the hot spare thread: {e}");
            }
        }));
        // A replacement or spare an export or a crash interrupted resilvers again: its new
        // member lacks txgs, and the import's scan (`Datasets::scan_import`) resumes the
        // recorded resilver or starts one.
    }
}

/// Starts the repair of a new or returning device: a resilver of the txgs it lacks (a
/// running scrub is canceled, a running resilver that does not cover them restarts over both,
/// see `Datasets::resilver_start`).
fn start_repair(spa: &Arc<Spa>, dsl: &Arc<Datasets>) {
    if let Err(e) = dsl.resilver_start(spa) {
        tracing::warn!(pool = spa.name, "cannot start the resilver: {e}");
    }
}
