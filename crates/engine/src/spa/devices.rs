//! Changing a pool's devices while it runs: attach, detach, replace, hot spares. The tree
//! change itself is `vdev/change.rs`; here are the checks of a new device, the labels, and
//! the txg that records the new tree.
//!
//! Order, so that a crash at any point leaves a pool that imports: the tree changes in
//! memory (a new member lacks every txg, so reads avoid it), the new device gets labels
//! naming the new tree, a txg records the tree in the pool's metadata (import takes the
//! metadata as the truth and finds members by guid), then the other devices' labels learn
//! it; a detached device's labels are cleared only after that txg.

use crate::spa::Spa;
use crate::vdev::alloc::VdevRole;
use crate::vdev::label::{clear_labels, read_label, write_labels};
use crate::vdev::{Detached, Leaf, LeafState, Shape};
use crate::{EngineError, Result};
use oxpool_format::{
    Guid, LabelConfig, LeafConfig, PairKind, Txg, VdevId, MIN_DEVICE_BYTES, SPARE_TOP,
};
use oxpool_io::rt::block_on;
use oxpool_io::Backend;
use std::sync::Arc;

/// Syncs `oxpool remove` of a log device waits at most for its last log block to be freed:
/// one abandons the chains on it, one frees their blocks, `DEFER_TXGS` more return the
/// space, with room for a chain that was busy at the first.
pub(crate) const REMOVE_LOG_SYNCS_MAX: usize = 12;

/// Pause between two of those syncs while blocks are left: a log block being written when
/// the chains were abandoned joins its chain only when its write completes, and on a busy
/// machine back-to-back syncs could use up the budget before the committing thread ran
/// again (a removal refused with 16 KiB left under a parallel test run).
const LEAVE_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// A member of a top-level vdev, found by name: present or not.
pub(crate) struct NamedMember {
    /// Its top-level vdev.
    pub top: VdevId,
    /// Its configuration.
    pub config: LeafConfig,
    /// Its leaf, if the device is present.
    pub leaf: Option<Arc<Leaf>>,
}

impl Spa {
    /// The member of a top-level vdev named `device` (its path, its guid in hex, or a file
    /// name only one member's path ends with), present or absent.
    pub(crate) fn member_named(&self, device: &str) -> Result<NamedMember> {
        let mut exact = Vec::new();
        let mut by_tail = Vec::new();
        let tail = format!("/{device}");
        for top in self.zio.vdevs.tops() {
            for m in top.shape().children.iter().flat_map(|c| c.members()) {
                let named = NamedMember {
                    top: top.id,
                    config: m.config.clone(),
                    leaf: m.leaf.clone(),
                };
                let path = m.leaf.as_ref().map_or(m.config.path.as_str(), |l| l.name());
                if path == device || format!("{:x}", m.config.guid.0) == device {
                    exact.push(named);
                } else if !device.contains('/') && path.ends_with(&tail) {
                    by_tail.push(named);
                }
            }
        }
        let mut found = if exact.is_empty() { by_tail } else { exact };
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(EngineError::NotFound(format!(
                "device '{device}' in pool '{}'",
                self.name
            ))),
            n => Err(EngineError::invalid(format!(
                "'{device}' names {n} devices of pool '{}': give the path",
                self.name
            ))),
        }
    }

    /// Checks a device to join the pool as `what` (in errors: "cannot WHAT: ..."): at least
    /// `min_bytes` (and the format's minimum), not another pool's unless `force`, not in
    /// this pool already (`same_path_ok`: the path of the device it replaces, swapped for a
    /// new one). Gives it a guid and a leaf.
    fn check_new_device(
        &self,
        what: &str,
        dev: Arc<dyn Backend>,
        min_bytes: u64,
        force: bool,
        same_path_ok: Option<Guid>,
    ) -> Result<(Arc<Leaf>, LeafConfig)> {
        let refuse = |why: String| Err(EngineError::invalid(format!("cannot {what}: {why}")));
        let name = dev.name().to_string();
        let size = dev.size_bytes();
        if size < min_bytes.max(MIN_DEVICE_BYTES) {
            return refuse(format!(
                "{name} is smaller ({size} bytes) than needed ({} bytes)",
                min_bytes.max(MIN_DEVICE_BYTES)
            ));
        }
        let in_pool = self.zio.vdevs.leaves().any(|l| l.name() == name)
            || self.zio.vdevs.spare_status().iter().any(|s| s.name == name);
        if let Ok(label) = block_on(read_label(dev.as_ref())) {
            if label.pool_guid == self.guid {
                return refuse(format!("{name} is already in pool '{}'", self.name));
            } else if !force {
                return refuse(format!(
                    "{name} belongs to pool '{}' (guid {:x}); use -f to overwrite it",
                    label.pool_name, label.pool_guid.0
                ));
            }
        }
        if in_pool && same_path_ok.is_none() {
            return refuse(format!("{name} is already in pool '{}'", self.name));
        }
        let guid = super::random_guid();
        let config = LeafConfig {
            guid,
            path: name,
            size_bytes: size,
        };
        Ok((Arc::new(Leaf::new(guid, dev)), config))
    }

    /// Vdev `top`'s shape now (to put back if a change of it cannot be recorded).
    fn shape_of(&self, top: VdevId) -> Option<Shape> {
        self.zio.vdevs.top(top).map(|t| t.shape().clone())
    }

    /// The label a device of this pool gets now (`top`: its vdev, or [`SPARE_TOP`]).
    fn label_now(&self, leaf_guid: Guid, top: VdevId) -> LabelConfig {
        LabelConfig {
            pool_guid: self.guid,
            pool_name: self.name.clone(),
            leaf_guid,
            top,
            create_txg: Txg(self.txg.synced().0 + 1),
            tree: self.zio.vdevs.config(),
        }
    }

    /// Records the tree changed in memory: labels of the new leaves (whole), a txg, the
    /// other devices' labels, then the labels of the detached devices cleared (spares'
    /// rewritten as spares).
    fn commit_tree_change(&self, new: &[(Arc<Leaf>, VdevId)], gone: Vec<Detached>) -> Result<()> {
        self.label_new_members(new, None)?;
        self.commit_labelled_change(new, gone)
    }

    /// The labels of the members just put in the tree (whole, flushed); on an error they are
    /// taken out again, so that nothing changed: spares from the spares, a member added to a
    /// vdev by putting back `before`, that vdev's shape before the change. Call it before any txg sync can see the
    /// new tree (`attach` and `replace` hold the sync gate from their swap through this): a
    /// txg that records a device whose labels a power cut then loses names a device no
    /// import finds (a crash test found it, the writer's commits syncing a txg between the
    /// swap and the labels).
    fn label_new_members(
        &self,
        new: &[(Arc<Leaf>, VdevId)],
        mut before: Option<Shape>,
    ) -> Result<()> {
        let labelled = block_on(async {
            for (leaf, top) in new {
                write_labels(leaf.backend.as_ref(), &self.label_now(leaf.guid, *top)).await?;
            }
            Ok::<(), EngineError>(())
        });
        if let Err(e) = labelled {
            // Nothing recorded yet: take the new members out again, so that nothing changed,
            // and clear what labels did land (best effort): labels naming this pool would
            // make a retry with the same device refused as "already in the pool".
            for (leaf, top) in new {
                // Only a device whose labels now say it is this leaf of this pool: one not
                // written yet may hold another pool's labels (taken with -f).
                let ours = block_on(read_label(leaf.backend.as_ref()))
                    .is_ok_and(|l| l.pool_guid == self.guid && l.leaf_guid == leaf.guid);
                if ours {
                    let _ = block_on(clear_labels(leaf.backend.as_ref()));
                }
                if *top == SPARE_TOP {
                    let _ = self.zio.vdevs.remove_spare(leaf.guid);
                } else if let Some(shape) = before.take() {
                    let _ = self.zio.vdevs.undo_member(*top, shape);
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// [`Spa::commit_tree_change`] once the new members are labelled.
    fn commit_labelled_change(
        &self,
        new: &[(Arc<Leaf>, VdevId)],
        gone: Vec<Detached>,
    ) -> Result<()> {
        super::apply_scheduler(self);
        self.sync_now()?;
        let skip: Vec<Arc<Leaf>> = new.iter().map(|(l, _)| l.clone()).collect();
        self.relabel(&self.zio.vdevs.config(), &skip)?;
        for d in gone {
            let Some(leaf) = d.leaf.filter(|_| !d.spare) else {
                continue;
            };
            if let Err(e) = block_on(clear_labels(leaf.backend.as_ref())) {
                tracing::warn!(
                    device = leaf.name(),
                    "detached; clearing its labels failed: {e}"
                );
            }
        }
        Ok(())
    }

    /// Attaches `new` beside `existing` (`oxpool attach`): a single device becomes a 2-way
    /// mirror, a mirror gains a side. The new side lacks every block until resilvered.
    pub(crate) fn attach(&self, existing: &str, new: Arc<dyn Backend>, force: bool) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let what = format!("attach {} to {existing}", new.name());
        let old = self.member_named(existing)?;
        let old_leaf = old.leaf.clone().ok_or_else(|| {
            EngineError::invalid(format!("cannot {what}: {existing} is not present"))
        })?;
        let (leaf, config) =
            self.check_new_device(&what, new, old.config.size_bytes, force, None)?;
        let new = [(leaf.clone(), old.top)];
        {
            // Not in the middle of a txg sync: its tree would not list the new device while
            // its writes (the uberblock's too) go to it, and one the old device failed would
            // count as written. And no sync records the new device before its labels are
            // durable.
            let _no_sync = self.sync_gate.lock().unwrap_or_else(|p| p.into_inner());
            let before = self.shape_of(old.top);
            self.zio.vdevs.attach(&old_leaf, leaf.clone(), config)?;
            self.label_new_members(&new, before)?;
        }
        self.commit_labelled_change(&new, Vec::new())?;
        self.log_vdev_joined(old.top, &leaf)
    }

    /// After `leaf` joined log vdev `v` (attach, replace) and a txg recorded it: a vdev
    /// emptied by `offline` of its last device (role Leaving, `emptied_logs`) takes log
    /// blocks again through `leaf`, once a durable txg no longer records it emptied (an
    /// import ignores what an emptied vdev holds). Else it would stay unused until `online`.
    fn log_vdev_joined(&self, v: VdevId, leaf: &Leaf) -> Result<()> {
        {
            let mut s = self.state.lock().unwrap();
            if !s.emptied_logs.contains(&v) || !leaf.health.in_service() {
                return Ok(());
            }
            debug_assert_eq!(s.alloc.roles()[v.0 as usize], VdevRole::Leaving);
            // It lacks nothing needed: the vdev held nothing since it was emptied, and has
            // taken no block since (Leaving).
            leaf.health
                .forget_missed_through(Txg(u64::MAX), leaf.health.outages());
            s.emptied_logs.retain(|&x| x != v);
        }
        self.txg.mark_dirty();
        // On an error the vdev stays Leaving: no block goes where an import may not look.
        self.sync_now()?;
        if leaf.health.in_service() {
            self.state.lock().unwrap().alloc.set_leaving(v, false);
        }
        // A replacement of the offline device ends now: the new one lacks nothing, so no
        // resilver will end it.
        let gone = self.zio.vdevs.finish_replacements();
        if !gone.is_empty() {
            self.commit_tree_change(&[], gone)?;
        }
        Ok(())
    }

    /// Replaces `old` with `new` (`oxpool replace`): the child becomes a replacing pair until
    /// `new` is resilvered, then `old` is detached. `new` may be at `old`'s path (the device
    /// was swapped).
    pub(crate) fn replace(&self, old: &str, new: Arc<dyn Backend>, force: bool) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let what = format!("replace {old} with {}", new.name());
        let member = self.member_named(old)?;
        let same_path = (new.name() == member.config.path).then_some(member.config.guid);
        // The same device, not swapped: its label is still the old member's.
        if same_path.is_some() {
            if let Ok(label) = block_on(read_label(new.as_ref())) {
                if label.pool_guid == self.guid && label.leaf_guid == member.config.guid {
                    return Err(EngineError::invalid(format!(
                        "cannot {what}: {} is still the device it replaces (swap it, or name \
                         a new device)",
                        new.name()
                    )));
                }
            }
        }
        let (leaf, config) =
            self.check_new_device(&what, new, member.config.size_bytes, force, same_path)?;
        let new = [(leaf.clone(), member.top)];
        let gone = {
            // As in `attach`: not in the middle of a txg sync, and labelled before one.
            let _no_sync = self.sync_gate.lock().unwrap_or_else(|p| p.into_inner());
            let before = self.shape_of(member.top);
            let gone = self.zio.vdevs.replace(
                member.top,
                member.config.guid,
                leaf.clone(),
                config,
                PairKind::Replacing,
            )?;
            self.label_new_members(&new, before)?;
            gone
        };
        self.commit_labelled_change(&new, gone.into_iter().collect())?;
        self.log_vdev_joined(member.top, &leaf)
    }

    /// Detaches `device` (`oxpool detach`): a mirror side, a member of a replacing pair, or
    /// a spare in use (back to AVAIL).
    pub(crate) fn detach(&self, device: &str) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let member = self.member_named(device)?;
        let gone = self.zio.vdevs.detach(member.top, member.config.guid)?;
        self.commit_tree_change(&[], vec![gone])
    }

    /// Adds hot spares (`oxpool add POOL spare DEV...`).
    pub(crate) fn add_spares(&self, devs: Vec<Arc<dyn Backend>>, force: bool) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let mut new = Vec::new();
        for dev in devs {
            let what = format!("add spare {}", dev.name());
            if new
                .iter()
                .any(|(_, c): &(Arc<Leaf>, LeafConfig)| c.path == dev.name())
            {
                return Err(EngineError::invalid(format!(
                    "cannot {what}: it is named twice"
                )));
            }
            new.push(self.check_new_device(&what, dev, 0, force, None)?);
        }
        let leaves: Vec<(Arc<Leaf>, VdevId)> =
            new.iter().map(|(l, _)| (l.clone(), SPARE_TOP)).collect();
        {
            // As in `attach`: no txg records the spares before their labels are durable (a
            // power cut then would leave the pool naming spares no import finds).
            let _no_sync = self.sync_gate.lock().unwrap_or_else(|p| p.into_inner());
            self.zio
                .vdevs
                .add_spares(new.into_iter().map(|(l, c)| (c, l)).collect());
            self.label_new_members(&leaves, None)?;
        }
        self.commit_labelled_change(&leaves, Vec::new())
    }

    /// Removes an unused hot spare (`oxpool remove POOL SPARE`).
    pub(crate) fn remove_spare(&self, device: &str) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let spare = self.zio.vdevs.spare_named(device).ok_or_else(|| {
            EngineError::NotFound(format!("spare '{device}' in pool '{}'", self.name))
        })?;
        self.zio
            .vdevs
            .remove_spare(spare.config.guid)
            .map_err(|e| {
                EngineError::invalid(format!(
                    "cannot remove {}: {}",
                    spare.config.path,
                    e.to_string()
                        .rsplit_once(": ")
                        .map_or(e.to_string(), |(_, why)| why.to_string())
                ))
            })?;
        self.commit_tree_change(
            &[],
            vec![Detached {
                leaf: spare.leaf,
                guid: spare.config.guid,
                spare: false,
            }],
        )
    }

    /// Removes a separate log device (`oxpool remove POOL LOG`): `device` names a single log
    /// device, or a log mirror by its group name (`mirror-N`). As ZFS's
    /// `spa_vdev_remove_log`: nothing new is placed on it; `leave` has every intent log
    /// abandon a chain with a place on it (as after a log write error, so commits wait for
    /// the txg until a new chain is anchored elsewhere); then syncs run until its last log
    /// block is freed, and that sync makes it a hole ([`TopVdevKind::Hole`]: its index stays,
    /// so no other vdev's blocks change). Refused, with nothing changed, if blocks are still
    /// on it after [`REMOVE_LOG_SYNCS_MAX`] syncs (an import's replay holds them). A crash
    /// before the hole's txg leaves the log device in the pool as it was.
    pub(crate) fn remove_log(&self, device: &str, leave: &dyn Fn(VdevId)) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let v = self.log_vdev_named(device)?;
        let was_leaving = {
            let mut s = self.state.lock().unwrap();
            let leaving = s.alloc.roles()[v.0 as usize] == VdevRole::Leaving;
            s.alloc.set_leaving(v, true);
            s.hole_requested = Some(v);
            leaving
        };
        // Gives up, unless a sync made the hole meanwhile (checked under the state lock,
        // under which a sync makes it): then None, and the removal goes on to its end.
        let undo = |why: String| {
            let mut s = self.state.lock().unwrap();
            if s.alloc.roles()[v.0 as usize] == VdevRole::Hole {
                return None;
            }
            s.hole_requested = None;
            s.alloc.set_leaving(v, was_leaving);
            Some(Err(EngineError::invalid(format!(
                "cannot remove {device}: {why}"
            ))))
        };
        // A chain abandoned at the next sync is freed by the one after, and its space comes
        // back DEFER_TXGS syncs later.
        for _ in 0..REMOVE_LOG_SYNCS_MAX {
            if self.zio.vdevs.top(v).is_some_and(|t| t.is_hole()) {
                break;
            }
            leave(v);
            // A failed sync suspends the pool; if it had made the hole in memory, the sync
            // below fails too, and the next import finds the log vdev as it was.
            if let Err(e) = self.sync_now() {
                if let Some(refused) = undo(e.to_string()) {
                    return refused;
                }
            }
            let left = self.state.lock().unwrap().alloc.map(v).allocated_bytes();
            if left > 0 {
                std::thread::sleep(LEAVE_PAUSE);
            }
        }
        if !self.zio.vdevs.top(v).is_some_and(|t| t.is_hole()) {
            let left = self.state.lock().unwrap().alloc.map(v).allocated_bytes();
            if let Some(refused) = undo(format!(
                "{left} bytes of intent-log blocks are still on it after \
                 {REMOVE_LOG_SYNCS_MAX} txgs (a replay or a scrub holds them); try again"
            )) {
                return refused;
            }
        }
        // The hole is made at the start of a sync, which may be one the loop did not wait
        // for (another change's, begun while the loop's last sync ended): no label may say
        // the vdev is gone before that txg is durable, or a crash would leave a pool whose
        // metadata still needs a device whose labels were cleared. The next sync comes
        // after it.
        self.sync_now()?;
        let holed = std::mem::take(&mut self.state.lock().unwrap().holed);
        self.relabel(&self.zio.vdevs.config(), &[])?;
        for leaf in holed {
            if let Err(e) = block_on(clear_labels(leaf.backend.as_ref())) {
                tracing::warn!(
                    device = leaf.name(),
                    "removed; clearing its labels failed: {e}"
                );
            }
        }
        Ok(())
    }

    /// The log vdev that taking `leaf` offline would leave with no other device in service
    /// (a single log device, or the last side of a log mirror in service), if any: its
    /// blocks must be moved off it first ([`Spa::offline_log`]), also when `leaf` is out
    /// already (faulted or gone, its chains still there).
    pub(crate) fn log_vdev_lost_with(&self, leaf: &Leaf) -> Option<VdevId> {
        let (top, _) = self.zio.vdevs.position(leaf)?;
        let others_in_service = top.leaves_in_service().any(|l| l.guid != leaf.guid);
        (top.log && !others_in_service).then_some(top.id)
    }

    /// Takes `leaf`, the last device in service of a log vdev, offline (`oxpool offline` of
    /// a single log device, as ZFS's `spa_offline_log`): nothing new is placed on the vdev,
    /// every intent log with a place there abandons its chain (as [`Spa::remove_log`] has
    /// them do), syncs run until no block is left on it, and only then does the device go
    /// out of service. Unless `temporary`, the vdev is then recorded as emptied
    /// ([`SpaState::emptied_logs`]) in the same txg as the device's offline state: an import
    /// then needs nothing from it, not even its device. Refused, with nothing changed, if
    /// blocks are still on it after [`REMOVE_LOG_SYNCS_MAX`] syncs, or if the vdev changed
    /// meanwhile (a removal).
    pub(crate) fn offline_log(
        &self,
        leaf: &Leaf,
        temporary: bool,
        leave: &dyn Fn(VdevId),
    ) -> Result<()> {
        let _one = self.config_change.lock().unwrap();
        let refuse = |why: String| {
            EngineError::invalid(format!("cannot take {} offline: {why}", leaf.name()))
        };
        // Again under the lock: a removal may have made the vdev a hole meanwhile.
        let Some(v) = self.log_vdev_lost_with(leaf) else {
            return Err(refuse(
                "its log vdev changed meanwhile; try again".to_string(),
            ));
        };
        let was_leaving = {
            let mut s = self.state.lock().unwrap();
            let role = s.alloc.roles()[v.0 as usize];
            if s.hole_requested == Some(v) || !matches!(role, VdevRole::Log | VdevRole::Leaving) {
                return Err(refuse("its log vdev is being removed".to_string()));
            }
            // Offline already, and recorded emptied: nothing to do (a second `offline`, or
            // `-t` after a lasting one, changes nothing; a lasting one after `-t` records it).
            let offline_for_good = leaf
                .health
                .record()
                .is_some_and(|r| r.state == LeafState::Offline);
            if s.emptied_logs.contains(&v)
                && leaf.health.state() == LeafState::Offline
                && (temporary || offline_for_good)
            {
                return Ok(());
            }
            s.alloc.set_leaving(v, true);
            role == VdevRole::Leaving
        };
        let left = || self.state.lock().unwrap().alloc.map(v).allocated_bytes();
        let mut result = Ok(());
        for _ in 0..REMOVE_LOG_SYNCS_MAX {
            if left() == 0 {
                break;
            }
            leave(v);
            if let Err(e) = self.sync_now() {
                result = Err(refuse(e.to_string()));
                break;
            }
            if left() > 0 {
                std::thread::sleep(LEAVE_PAUSE);
            }
        }
        if result.is_ok() && left() > 0 {
            result = Err(refuse(format!(
                "{} bytes of intent-log blocks are still on its log vdev after \
                 {REMOVE_LOG_SYNCS_MAX} txgs (a replay or a scrub holds them); try again",
                left()
            )));
        }
        let mut s = self.state.lock().unwrap();
        if let Err(e) = result {
            s.alloc.set_leaving(v, was_leaving);
            return Err(e);
        }
        // Empty, and nothing new lands on it: out of service. The device's state and the
        // emptied mark change under the state lock, under which a sync reads both, so one
        // txg records both.
        self.zio.vdevs.offline_emptied_log(leaf, temporary);
        if !temporary && !s.emptied_logs.contains(&v) {
            s.emptied_logs.push(v);
        }
        drop(s);
        self.txg.mark_dirty();
        Ok(())
    }

    /// Returns `leaf`, a device of a log vdev with no device in service (taken offline,
    /// gone), to service (`oxpool online`, `oxpool clear`, by `back`): the vdev takes no log
    /// block until a sync has recorded the device in service (and the vdev no longer
    /// emptied), or an import after a crash would leave the device out and skip the blocks
    /// placed on it. A vdev that was emptied lacks nothing (it held nothing and took
    /// nothing: no resilver). Returns false, having done nothing, if `leaf` is not such a
    /// device (the caller brings it back as any other).
    pub(crate) fn return_log_device(&self, leaf: &Leaf, back: &dyn Fn(&Leaf)) -> Result<bool> {
        let _one = self.config_change.lock().unwrap();
        let Some((top, _)) = self.zio.vdevs.position(leaf) else {
            return Ok(false);
        };
        let v = top.id;
        let mut s = self.state.lock().unwrap();
        let role = s.alloc.roles()[v.0 as usize];
        let out = role == VdevRole::Leaving || top.leaves_in_service().next().is_none();
        let usable = top.log
            && s.hole_requested != Some(v)
            && !s.discarded_logs.contains(&v)
            && matches!(role, VdevRole::Log | VdevRole::Leaving)
            && out;
        // A device in service on an emptied vdev: attached to it, and a crash came before
        // the sync that would have dropped the record (`log_vdev_joined`); returned the same
        // way.
        if !usable || (leaf.health.in_service() && !s.emptied_logs.contains(&v)) {
            return Ok(false);
        }
        s.alloc.set_leaving(v, true);
        back(leaf);
        if !leaf.health.in_service() {
            // `back` left it out (`clear` leaves an offline device offline).
            s.alloc.set_leaving(v, role == VdevRole::Leaving);
            return Ok(true);
        }
        if s.emptied_logs.contains(&v) {
            leaf.health
                .forget_missed_through(Txg(u64::MAX), leaf.health.outages());
        }
        s.emptied_logs.retain(|&x| x != v);
        drop(s);
        self.txg.mark_dirty();
        // The txg that records the device in service (and the vdev no longer emptied).
        // On an error the device is in service, not yet durably: the vdev stays Leaving (a
        // retry syncs again).
        self.sync_now()?;
        if leaf.health.in_service() {
            self.state.lock().unwrap().alloc.set_leaving(v, false);
        }
        Ok(true)
    }

    /// The log vdev `device` names: a single log device (by path, guid or file name), or a
    /// log vdev's group name (`mirror-N`). Refusals say what can be removed instead.
    fn log_vdev_named(&self, device: &str) -> Result<VdevId> {
        let refuse = |why: String| {
            Err(EngineError::invalid(format!(
                "cannot remove {device}: {why}"
            )))
        };
        if let Some(top) = self
            .zio
            .vdevs
            .tops()
            .find(|t| t.group_name().as_deref() == Some(device) && !t.is_hole())
        {
            if !top.log {
                return refuse(format!(
                    "only log devices and hot spares can be removed; {device} holds pool data"
                ));
            }
            return Ok(top.id);
        }
        let member = self.member_named(device)?;
        let top = self
            .zio
            .vdevs
            .top(member.top)
            .expect("a member's vdev exists");
        if !top.log {
            return refuse(
                "only log devices and hot spares can be removed; it holds pool data".to_string(),
            );
        }
        if let Some(group) = top.group_name() {
            return refuse(format!(
                "it is a side of log {group}: `oxpool detach` takes out one side, `oxpool \
                 remove {} {group}` the whole log vdev",
                self.name
            ));
        }
        Ok(top.id)
    }

    /// Lets hot spares stand in for faulted devices; returns whether any did (persisted).
    pub(crate) fn spares_step_in(&self) -> bool {
        let _one = self.config_change.lock().unwrap();
        // As `attach`: not in the middle of a txg sync, whose tree would not list the spare
        // while its writes go to it (session 25's reviewer).
        let stepped_in = {
            let _no_sync = self.sync_gate.lock().unwrap_or_else(|p| p.into_inner());
            self.zio.vdevs.spares_step_in()
        };
        if !stepped_in {
            return false;
        }
        if let Err(e) = self.commit_tree_change(&[], Vec::new()) {
            tracing::warn!(pool = self.name, "recording the spare that stepped in: {e}");
        }
        true
    }

    /// Detaches the old member of every replacement whose new member is resilvered (the
    /// scan calls this after it forgot what devices lacked), and records it.
    pub(crate) fn finish_replacements(&self) {
        let _one = self.config_change.lock().unwrap();
        let gone = self.zio.vdevs.finish_replacements();
        if gone.is_empty() {
            return;
        }
        if let Err(e) = self.commit_tree_change(&[], gone) {
            tracing::warn!(pool = self.name, "recording finished replacements: {e}");
        }
    }
}
