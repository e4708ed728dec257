//! The pool's snapshot API: snapshot, destroy, rollback, clone, holds, listings and space
//! figures, and read-only views of snapshots. Every change is checked here, in full, before
//! anything is queued (an impossible request says why and changes nothing), then applied by
//! one txg sync (dsl/snapshot_sync.rs), which this waits for.

use super::recv::is_hidden;
use super::Pool;
use crate::dmu::object::Object;
use crate::dmu::tree::BlockTree;
use crate::dsl::dataset::Dataset;
use crate::dsl::snapshot::{Lineage, SnapOp};
use crate::spa::check_name;
use crate::zil::Zil;
use crate::zvol::VolumeInner;
use crate::{EngineError, Result, Volume};
use oxpool_format::{OriginMeta, VolumeId};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A snapshot, as `oxpool list -t snapshot` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The volume's name in the pool.
    pub volume: String,
    /// The name after the `@`.
    pub name: String,
    /// Its guid.
    pub guid: u64,
    /// The txg whose end it captures.
    pub createtxg: u64,
    /// Creation time, seconds since the Unix epoch.
    pub creation_s: u64,
    /// Bytes only it references: what destroying it frees.
    pub used_bytes: u64,
    /// Bytes its tree references.
    pub referenced_bytes: u64,
    /// Bytes of its tree written since the snapshot before it.
    pub written_bytes: u64,
    /// The logical size of its data blocks: what they hold before compression, one copy,
    /// holes not counted (`logicalreferenced`).
    pub logical_referenced_bytes: u64,
    /// The volume's size then.
    pub volsize_bytes: u64,
    /// Its user holds.
    pub holds: Vec<String>,
    /// Clones made from it (`pool/volume`).
    pub clones: Vec<String>,
    /// Marked by `destroy -d`: destroyed when its last hold and clone go.
    pub defer_destroy: bool,
}

/// A volume's space and lineage figures (`used`, `referenced`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetSpace {
    /// `usedbydataset + usedbysnapshots + usedbyrefreservation`.
    pub used_bytes: u64,
    /// `usedbydataset`, as ZFS's: what its tree references that no dataset it was cloned
    /// from shares (all it references, unless it is a clone), snapshots' shares included:
    /// what destroying it with its snapshots would free, beyond `usedbysnapshots`.
    pub used_by_dataset_bytes: u64,
    /// Bytes its tree references.
    pub referenced_bytes: u64,
    /// Bytes of its tree born after its latest snapshot (or origin).
    pub written_bytes: u64,
    /// What destroying every snapshot would free.
    pub used_by_snapshots_bytes: u64,
    /// What its `refreservation` holds beyond what it wrote since its latest snapshot
    /// (`dsl/reservation.rs`), as of the last sync or change of it.
    pub used_by_refreservation_bytes: u64,
    /// For a clone, `pool/volume@snapshot` it comes from.
    pub origin: Option<String>,
    /// The txg it was created in.
    pub createtxg: u64,
    /// Its guid.
    pub guid: u64,
    /// Creation time, seconds since the Unix epoch.
    pub creation_s: u64,
    /// Its snapshots.
    pub snapshot_count: usize,
}

/// A volume's properties that come from its lineage and space accounting.
pub const DATASET_STAT_NAMES: &[&str] = &[
    "used",
    "available",
    "referenced",
    "written",
    "usedbydataset",
    "usedbysnapshots",
    "usedbyrefreservation",
    "origin",
    "createtxg",
    "creation",
    "guid",
    "snapshot_count",
    "type",
    "receive_resume_token",
];

/// A snapshot's properties.
pub const SNAPSHOT_PROP_NAMES: &[&str] = &[
    "type",
    "used",
    "available",
    "referenced",
    "logicalreferenced",
    "written",
    "volsize",
    "createtxg",
    "creation",
    "guid",
    "userrefs",
    "clones",
    "defer_destroy",
];

/// Seconds since the Unix epoch.
pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Splits `vol@snap`.
fn split_snapshot_name(full: &str) -> Result<(&str, &str)> {
    match full.split_once('@') {
        Some((v, s)) if !v.is_empty() && !s.is_empty() && !s.contains('@') => Ok((v, s)),
        _ => Err(EngineError::invalid(format!(
            "'{full}': a snapshot is named VOLUME@SNAPSHOT"
        ))),
    }
}

impl Pool {
    pub(crate) fn dataset(&self, volume: &str) -> Result<Arc<Dataset>> {
        self.dsl
            .get(volume)
            .filter(|_| !is_hidden(volume))
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}", self.spa.name)))
    }

    pub(crate) fn no_snapshot(&self, volume: &str, snap: &str) -> EngineError {
        EngineError::NotFound(format!("{}/{volume}@{snap}", self.spa.name))
    }

    /// The guid of each of `snaps` of `ds` (named `volume`), in order: what a destroy or a
    /// rollback is queued by, so a rename before the sync neither loses it nor turns it on
    /// another snapshot.
    pub(super) fn snapshot_guids(
        &self,
        ds: &Dataset,
        volume: &str,
        snaps: &[String],
    ) -> Result<Vec<oxpool_format::Guid>> {
        let l = ds.lineage.lock().unwrap();
        snaps
            .iter()
            .map(|s| {
                l.find(s)
                    .map(|(_, snap)| snap.guid)
                    .ok_or_else(|| self.no_snapshot(volume, s))
            })
            .collect()
    }

    /// Destroy ops for `snaps` of `ds` (named `volume`), in the order given.
    pub(super) fn destroy_ops(
        &self,
        ds: &Dataset,
        volume: &str,
        snaps: &[String],
    ) -> Result<Vec<(VolumeId, SnapOp)>> {
        let guids = self.snapshot_guids(ds, volume, snaps)?;
        Ok(snaps
            .iter()
            .zip(guids)
            .map(|(s, guid)| {
                (
                    ds.id,
                    SnapOp::Destroy {
                        name: s.clone(),
                        guid,
                    },
                )
            })
            .collect())
    }

    /// Queues `ops` for the open txg and waits until the txg holding them is durable.
    fn run_ops(&self, ops: Vec<(VolumeId, SnapOp)>) -> Result<()> {
        self.spa.txg.check_writable()?;
        let open = self.spa.txg.open_txg();
        let queued = self.dsl.queue_ops(open, ops);
        // Durable when this returns: through the txg they were queued for (a later one when
        // another caller's snapshot of a volume of theirs was queued first). Each round syncs
        // at least one txg.
        for _ in 0..=(queued.0.saturating_sub(open.0) + 1) {
            self.spa.sync_now()?;
            if self.spa.txg.synced() >= queued {
                return Ok(());
            }
        }
        Err(EngineError::invalid(format!(
            "pool {}: the snapshot changes queued for txg {} did not sync",
            self.spa.name, queued.0
        )))
    }

    /// Takes snapshots `volume@snap` of every name given, all in one txg: each holds every
    /// write answered before this call. Refused as a whole if any name is bad, a volume is
    /// missing, or a snapshot exists.
    pub fn snapshot(&self, names: &[String]) -> Result<()> {
        let mut ops = Vec::new();
        let mut snapped = Vec::new();
        let mut seen = BTreeSet::new();
        let queued = self.dsl.queued_ops();
        for full in names {
            let (volume, snap) = split_snapshot_name(full)?;
            check_name("snapshot", snap)?;
            let ds = self.dataset(volume)?;
            let exists = ds.lineage.lock().unwrap().find(snap).is_some()
                || queued.iter().any(|(d, o)| {
                    *d == ds.id && matches!(o, SnapOp::Create { name, .. } if name == snap)
                });
            if exists {
                return Err(EngineError::Exists(format!(
                    "{}/{volume}@{snap}",
                    self.spa.name
                )));
            }
            // One snapshot per volume per txg (snapshots are ordered by txg), as ZFS refuses
            // "multiple snapshots of same fs".
            if let Some((_, other)) = seen.iter().find(|(v, _)| v == volume) {
                return Err(EngineError::invalid(format!(
                    "cannot take {}/{volume}@{other} and @{snap} in one command: a volume gets \
                     one snapshot at a time (take them one after the other)",
                    self.spa.name
                )));
            }
            seen.insert((volume.to_string(), snap.to_string()));
            snapped.push(ds.clone());
            ops.push((
                ds.id,
                SnapOp::Create {
                    name: snap.to_string(),
                    guid: crate::spa::random_guid(),
                    creation_s: now_s(),
                },
            ));
        }
        if ops.is_empty() {
            return Err(EngineError::invalid("no snapshot named"));
        }
        let snapped: Vec<&Dataset> = snapped.iter().map(|d| d.as_ref()).collect();
        // Until the snapshot's sync has made its reservations whole again in the figures.
        let _change = self.reservation_change();
        self.check_snapshot_reservations(&snapped, "the snapshot")?;
        self.run_ops(ops)?;
        self.dsl.update_reservations(&self.spa);
        Ok(())
    }

    /// Why snapshot `snap` of `volume` cannot be destroyed, if it cannot (held, or the
    /// origin of a clone): what `destroy -d` marks instead.
    pub fn destroy_refusal(&self, volume: &str, snap: &str) -> Result<Option<String>> {
        self.refusal(volume, snap, true)
    }

    /// [`Pool::destroy_refusal`] but for its clones: what refuses `destroy -R`, which
    /// destroys them first (held, being sent).
    pub fn destroy_refusal_besides_clones(
        &self,
        volume: &str,
        snap: &str,
    ) -> Result<Option<String>> {
        self.refusal(volume, snap, false)
    }

    fn refusal(&self, volume: &str, snap: &str, clones_refuse: bool) -> Result<Option<String>> {
        let ds = self.dataset(volume)?;
        let (guid, holds) = {
            let l = ds.lineage.lock().unwrap();
            let (_, s) = l.find(snap).ok_or_else(|| self.no_snapshot(volume, snap))?;
            (s.guid, s.holds.clone())
        };
        let full = format!("{}/{volume}@{snap}", self.spa.name);
        if !holds.is_empty() {
            let tags: Vec<_> = holds.into_iter().collect();
            return Ok(Some(format!("{full} is held ({})", tags.join(", "))));
        }
        let clones = self.dsl.clone_names(ds.id, guid);
        if clones_refuse && !clones.is_empty() {
            return Ok(Some(format!(
                "{full} is the origin of {}",
                clones.join(", ")
            )));
        }
        if self.dsl.is_long_held(guid) {
            return Ok(Some(format!("{full} is being sent")));
        }
        Ok(None)
    }

    /// Destroys snapshots `snaps` of `volume`, all in one txg; refused as a whole (nothing
    /// changed) if any is missing, held, or the origin of a clone. Returns the bytes freed.
    pub fn destroy_snapshots(&self, volume: &str, snaps: &[String]) -> Result<u64> {
        let ds = self.dataset(volume)?;
        let ops = self.destroy_ops(&ds, volume, snaps)?;
        let freed = self.destroy_estimate(volume, snaps)?;
        // The checks went by name: the snapshots they checked must be those queued (by
        // guid), not others renamed in between (through the `Pool` API).
        let queued = ops.iter().map(|(_, op)| match op {
            SnapOp::Destroy { guid, .. } => Some(*guid),
            _ => None,
        });
        if !queued.eq(self
            .snapshot_guids(&ds, volume, snaps)?
            .into_iter()
            .map(Some))
        {
            return Err(EngineError::Busy(format!(
                "{}/{volume}: its snapshots were renamed while the destroy was checked; try \
                 again",
                self.spa.name
            )));
        }
        self.run_ops(ops)?;
        Ok(freed)
    }

    /// `destroy -d`: destroys each of `snaps` that can go now (all of those in one txg), and
    /// marks the others, held or the origin of a clone, for destruction when their last hold
    /// is released and their last clone destroyed. Returns (destroyed, marked).
    pub fn destroy_snapshots_deferred(
        &self,
        volume: &str,
        snaps: &[String],
    ) -> Result<(Vec<String>, Vec<String>)> {
        let mut now = Vec::new();
        let mut later = Vec::new();
        for s in snaps {
            match self.destroy_refusal(volume, s)? {
                None => now.push(s.clone()),
                Some(_) => later.push(s.clone()),
            }
        }
        if !later.is_empty() {
            let ds = self.dataset(volume)?;
            let mut l = ds.lineage.lock().unwrap();
            for s in &later {
                let i = l.find(s).ok_or_else(|| self.no_snapshot(volume, s))?.0;
                l.snapshot_mut(i).defer_destroy = true;
            }
        }
        if !now.is_empty() {
            self.destroy_snapshots(volume, &now)?;
        } else {
            self.spa.sync_now()?;
        }
        Ok((now, later))
    }

    /// Destroys snapshot `volume@snap` if it is marked for deferred destruction and nothing
    /// holds it any more (after a release or a clone's destroy).
    pub(crate) fn destroy_if_deferred(&self, volume: &str, snap: &str) -> Result<bool> {
        let marked = {
            let ds = self.dataset(volume)?;
            let l = ds.lineage.lock().unwrap();
            l.find(snap).is_some_and(|(_, s)| s.defer_destroy)
        };
        if !marked || self.destroy_refusal(volume, snap)?.is_some() {
            return Ok(false);
        }
        self.destroy_snapshots(volume, &[snap.to_string()])?;
        Ok(true)
    }

    /// What destroying `snaps` of `volume` would free (checks as [`Pool::destroy_snapshots`],
    /// changes nothing): `destroy -n -v`.
    pub fn destroy_estimate(&self, volume: &str, snaps: &[String]) -> Result<u64> {
        for s in snaps {
            if let Some(why) = self.destroy_refusal(volume, s)? {
                return Err(EngineError::Busy(why));
            }
        }
        self.freed_estimate(volume, snaps)
    }

    /// What destroying `snaps` of `volume` would free, whether or not they may go now: for
    /// `destroy -R`'s plan, which destroys their clones first (a clone's own blocks are its
    /// own, counted by its `used`).
    pub fn freed_estimate(&self, volume: &str, snaps: &[String]) -> Result<u64> {
        let ds = self.dataset(volume)?;
        let l = ds.lineage.lock().unwrap();
        let mut set = BTreeSet::new();
        for s in snaps {
            l.find(s).ok_or_else(|| self.no_snapshot(volume, s))?;
            set.insert(s.clone());
        }
        // The bytes freed by destroying a set: simulate in order on a copy of the counts.
        let mut freed = 0;
        // Runs of consecutive destroyed snapshots free what was born within the run and died
        // before the first kept snapshot after it (or the head).
        let n = l.snapshots().len();
        let mut i = 0;
        while i < n {
            if !set.contains(&l.snapshots()[i].name) {
                i += 1;
                continue;
            }
            let start = i;
            while i < n && set.contains(&l.snapshots()[i].name) {
                i += 1;
            }
            let after = l.prev_txg(start);
            let upto = l.snapshots()[i - 1].txg;
            // Died in the run or before the next kept one, born in the run.
            let mut bytes = match l.snapshots().get(i) {
                Some(next) => next.deadlist.bytes_born_in(after, upto),
                None => l.deadlist.bytes_born_in(after, upto),
            };
            for s in &l.snapshots()[start + 1..i] {
                bytes += s.deadlist.bytes_born_in(after, upto);
            }
            freed += bytes;
        }
        Ok(freed)
    }

    /// Rolls `volume` back to its snapshot `snap`: its contents become the snapshot's. With
    /// `destroy_later`, the snapshots after it are destroyed first (refused as a whole if one
    /// of them cannot be); without, `snap` must be the latest. Writes in flight during the
    /// call may land before or after it: the caller stops the volume's clients first.
    pub fn rollback(&self, volume: &str, snap: &str, destroy_later: bool) -> Result<()> {
        let ds = self.dataset(volume)?;
        let (target, later, later_marks): (_, Vec<(String, oxpool_format::Guid)>, Vec<String>) = {
            let l = ds.lineage.lock().unwrap();
            let (i, s) = l.find(snap).ok_or_else(|| self.no_snapshot(volume, snap))?;
            let target = s.guid;
            let marks = l
                .bookmarks()
                .iter()
                .filter(|b| b.txg > s.txg)
                .map(|b| format!("#{}", b.name))
                .collect();
            let snaps = l.snapshots()[i + 1..]
                .iter()
                .map(|s| (s.name.clone(), s.guid))
                .collect();
            (target, snaps, marks)
        };
        // As ZFS: later bookmarks go with -r too (the head no longer descends from them).
        if (!later.is_empty() || !later_marks.is_empty()) && !destroy_later {
            let named: Vec<String> = later
                .iter()
                .map(|(s, _)| format!("@{s}"))
                .chain(later_marks.iter().cloned())
                .collect();
            return Err(EngineError::Busy(format!(
                "{}/{volume}@{snap} is not the latest snapshot ({} later: {}); use -r to \
                 destroy them",
                self.spa.name,
                named.len(),
                named.join(", ")
            )));
        }
        for (s, _) in &later {
            if let Some(why) = self.destroy_refusal(volume, s)? {
                return Err(EngineError::Busy(why));
            }
        }
        // Everything answered before is in a txg at or before the one the rollback runs in.
        // By the guids listed with the target, under one lock: a rename since cannot turn a
        // destroy on another snapshot.
        let mut ops: Vec<(VolumeId, SnapOp)> = later
            .into_iter()
            .rev()
            .map(|(name, guid)| (ds.id, SnapOp::Destroy { name, guid }))
            .collect();
        ops.push((
            ds.id,
            SnapOp::Rollback {
                name: snap.to_string(),
                guid: target,
            },
        ));
        // The head then shares everything with the snapshot, as after a snapshot: its
        // reservation holds all of itself again while what it drops comes back only some
        // txgs later (as ZFS's rollback check).
        let _change = self.reservation_change();
        self.check_snapshot_reservations(&[ds.as_ref()], "the rollback")?;
        self.run_ops(ops)?;
        self.dsl.update_reservations(&self.spa);
        Ok(())
    }

    /// Creates volume `new_name`, a writable clone of `volume@snap` sharing every block.
    pub fn clone_snapshot(
        &self,
        volume: &str,
        snap: &str,
        new_name: &str,
        props: &[(String, String)],
    ) -> Result<Volume> {
        check_name("volume", new_name)?;
        let src = self.dataset(volume)?;
        let s = {
            let l = src.lineage.lock().unwrap();
            l.find(snap)
                .ok_or_else(|| self.no_snapshot(volume, snap))?
                .1
                .clone()
        };
        let mut p = src.props.lock().unwrap().clone();
        p.volsize_bytes = s.volsize_bytes;
        p.readonly = false;
        p.clear_user();
        // As ZFS's: a clone reserves nothing unless told to (`-o refreservation=`).
        p.refreservation_bytes = 0;
        if let Some((k, _)) = props
            .iter()
            .find(|(k, _)| k == "volsize" || k == "volblocksize")
        {
            return Err(EngineError::invalid(format!(
                "{k} of a clone is its origin's"
            )));
        }
        self.set_initial_props(&mut p, props)?;
        p.validate()?;
        self.check_user_props_budget(new_name, &p)?;
        let _change = (p.refreservation_bytes != 0).then(|| self.reservation_change());
        // A clone has written nothing of its own yet: all of its reservation is unused.
        // Before the table's lock: the check may wait for syncs.
        self.check_reservation_growth(new_name, p.refreservation_bytes)?;
        let mut volumes = self.volumes.lock().unwrap();
        if volumes.contains_key(new_name) {
            return Err(EngineError::Exists(format!("{}/{new_name}", self.spa.name)));
        }
        let id = VolumeId(self.dsl.next_id());
        let data = Object::new(
            BlockTree::new(s.levels.max(1), s.root),
            s.volsize_bytes,
            s.referenced_bytes,
        );
        data.compressed_bytes
            .store(s.compressed_bytes, Ordering::Relaxed);
        let zil = Arc::new(Zil::new(self.spa.guid, id, 1, Vec::new()));
        let mut lineage = Lineage::new(crate::spa::random_guid(), self.spa.txg.open_txg(), now_s());
        lineage.origin = Some(OriginMeta {
            volume: src.id,
            snapshot_guid: s.guid,
            txg: s.txg,
        });
        lineage.prev_snap_txg = s.txg;
        let ds = Arc::new(Dataset::volume(
            id,
            &self.spa.name,
            new_name,
            p,
            data,
            zil.clone(),
            lineage,
        ));
        self.dsl.insert(ds.clone())?;
        self.dsl.link_origins();
        self.dsl.update_reservations(&self.spa);
        let vol = Arc::new(VolumeInner::new(ds, zil));
        volumes.insert(new_name.to_string(), vol.clone());
        drop(volumes);
        self.spa.sync_now()?;
        Ok(Volume {
            pool: self.spa.clone(),
            dsl: self.dsl.clone(),
            vol,
        })
    }

    /// Promotes clone `volume`: the snapshots of its origin's volume up to its origin move
    /// to it (with their names), and that volume becomes a clone of the moved origin
    /// snapshot, so that the original volume can be destroyed. Refused if `volume` is not a
    /// clone, or a snapshot name would collide.
    pub fn promote(&self, volume: &str) -> Result<()> {
        let ds = self.dataset(volume)?;
        let origin = ds.lineage.lock().unwrap().origin.clone();
        let Some(origin) = origin else {
            return Err(EngineError::invalid(format!(
                "{}: not a clone",
                ds.full_name()
            )));
        };
        let src = self
            .dsl
            .all()
            .into_iter()
            .find(|d| d.id == origin.volume)
            .ok_or_else(|| EngineError::NotFound(format!("origin of {}", ds.full_name())))?;
        let moving: Vec<(String, oxpool_format::Guid)> = {
            let l = src.lineage.lock().unwrap();
            let i = l
                .snapshots()
                .iter()
                .position(|s| s.guid == origin.snapshot_guid)
                .ok_or_else(|| EngineError::NotFound(format!("origin of {}", ds.full_name())))?;
            l.snapshots()[..=i]
                .iter()
                .map(|s| (s.name.clone(), s.guid))
                .collect()
        };
        {
            let l = ds.lineage.lock().unwrap();
            if let Some((n, _)) = moving.iter().find(|(n, _)| l.find(n).is_some()) {
                return Err(EngineError::Busy(format!(
                    "{}@{n} exists: it would collide with {}@{n}; rename or destroy it first",
                    ds.full_name(),
                    src.full_name()
                )));
            }
            // A guid names one snapshot of a volume (views, clones and bases go by it).
            let same_guid = |(n, g): &(String, oxpool_format::Guid)| {
                let mine = l.snapshots().iter().find(|s| s.guid == *g)?;
                Some((n.clone(), mine.name.clone()))
            };
            if let Some((n, mine)) = moving.iter().find_map(same_guid) {
                return Err(EngineError::Busy(format!(
                    "{}@{mine} has the guid of {}@{n}, which the promote would move beside it; \
                     destroy one of them first",
                    ds.full_name(),
                    src.full_name()
                )));
            }
        }
        self.run_ops(vec![(ds.id, SnapOp::Promote)])
    }

    /// Places hold `tag` on `volume@snap` (it cannot be destroyed while held).
    pub fn hold(&self, tag: &str, volume: &str, snap: &str) -> Result<()> {
        check_name("hold tag", tag)?;
        let ds = self.dataset(volume)?;
        {
            let mut l = ds.lineage.lock().unwrap();
            let i = l
                .find(snap)
                .ok_or_else(|| self.no_snapshot(volume, snap))?
                .0;
            if !l.snapshot_mut(i).holds.insert(tag.to_string()) {
                return Err(EngineError::Exists(format!(
                    "hold '{tag}' on {}/{volume}@{snap}",
                    self.spa.name
                )));
            }
        }
        self.spa.sync_now()
    }

    /// Releases hold `tag` from `volume@snap`.
    pub fn release(&self, tag: &str, volume: &str, snap: &str) -> Result<()> {
        let ds = self.dataset(volume)?;
        {
            let mut l = ds.lineage.lock().unwrap();
            let i = l
                .find(snap)
                .ok_or_else(|| self.no_snapshot(volume, snap))?
                .0;
            if !l.snapshot_mut(i).holds.remove(tag) {
                return Err(EngineError::NotFound(format!(
                    "hold '{tag}' on {}/{volume}@{snap}",
                    self.spa.name
                )));
            }
        }
        // The last hold of a snapshot marked by `destroy -d`: it goes now.
        if !self.destroy_if_deferred(volume, snap)? {
            self.spa.sync_now()?;
        }
        Ok(())
    }

    /// The snapshots of `volume`, oldest first.
    pub fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotInfo>> {
        let ds = self.dataset(volume)?;
        // Fixed at creation: the same for every snapshot.
        let block_bytes = u64::from(ds.props.lock().unwrap().volblocksize_bytes);
        let list: Vec<_> = {
            let l = ds.lineage.lock().unwrap();
            l.snapshots()
                .iter()
                .enumerate()
                .map(|(i, s)| (s.clone(), l.unique_bytes(i)))
                .collect()
        };
        Ok(list
            .into_iter()
            .map(|(s, used)| SnapshotInfo {
                volume: volume.to_string(),
                name: s.name.clone(),
                guid: s.guid.0,
                createtxg: s.txg.0,
                creation_s: s.creation_s,
                used_bytes: used,
                referenced_bytes: s.referenced_bytes,
                written_bytes: s.written_bytes,
                // As a volume's: the root counts the data blocks below it.
                logical_referenced_bytes: s.root.fill.saturating_mul(block_bytes),
                volsize_bytes: s.volsize_bytes,
                holds: s.holds.iter().cloned().collect(),
                clones: self.dsl.clone_names(ds.id, s.guid),
                defer_destroy: s.defer_destroy,
            })
            .collect())
    }

    /// Every snapshot of every volume.
    pub fn all_snapshots(&self) -> Vec<SnapshotInfo> {
        let names: Vec<String> = self.dsl.all().iter().map(|d| d.name()).collect();
        names
            .iter()
            .filter_map(|n| self.snapshots(n).ok())
            .flatten()
            .collect()
    }

    /// `volume`'s space and lineage figures, as of the last sync.
    pub fn dataset_space(&self, volume: &str) -> Result<DatasetSpace> {
        let ds = self.dataset(volume)?;
        let referenced_bytes = ds.data().used_bytes.load(Ordering::Relaxed);
        let l = ds.lineage.lock().unwrap();
        let used_by_snapshots_bytes = l.used_by_snapshots_bytes();
        let origin = l.origin.as_ref().and_then(|o| {
            let src = self.dsl.all().into_iter().find(|d| d.id == o.volume)?;
            let name = if Arc::ptr_eq(&src, &ds) {
                None
            } else {
                let sl = src.lineage.lock().unwrap();
                sl.snapshots()
                    .iter()
                    .find(|s| s.guid == o.snapshot_guid)
                    .map(|s| s.name.clone())
            };
            Some(format!("{}@{}", src.full_name(), name.unwrap_or_default()))
        });
        let own_generations = 1 + l.snapshots().len();
        let is_clone = l.origin.is_some();
        let (written_bytes, createtxg, guid, creation_s) =
            (l.written_bytes, l.createtxg.0, l.guid.0, l.creation_s);
        drop(l);
        // ZFS's usedbydataset: what it references that its origin does not share, which is
        // `written@ORIGIN` (`dsl/written.rs`; the line locks every lineage in it).
        let used_by_dataset_bytes = if is_clone {
            let line = crate::dsl::written::line(&self.dsl, &ds);
            match line.len().checked_sub(own_generations + 1) {
                Some(k) => crate::dsl::written::written_since_each(&line, k)
                    .last()
                    .copied()
                    .unwrap_or(referenced_bytes),
                None => referenced_bytes,
            }
        } else {
            referenced_bytes
        };
        let used_by_refreservation_bytes = ds.reserved_unused_bytes.load(Ordering::Relaxed);
        Ok(DatasetSpace {
            used_bytes: used_by_dataset_bytes
                .saturating_add(used_by_snapshots_bytes)
                .saturating_add(used_by_refreservation_bytes),
            used_by_dataset_bytes,
            used_by_refreservation_bytes,
            referenced_bytes,
            written_bytes,
            used_by_snapshots_bytes,
            origin,
            createtxg,
            guid,
            creation_s,
            snapshot_count: own_generations - 1,
        })
    }

    /// A volume's lineage or space property (one of [`DATASET_STAT_NAMES`]), or a
    /// snapshot's (`volume` given as `vol@snap`, one of [`SNAPSHOT_PROP_NAMES`]), as
    /// `oxpool get` shows it. `None`: not such a property (ask the volume).
    pub fn get_dataset_prop(&self, volume: &str, name: &str) -> Result<Option<String>> {
        if let Some(since) = name.strip_prefix("written@") {
            return Ok(Some(self.written_since(volume, since)?.to_string()));
        }
        if name == "receive_resume_token" && !volume.contains('@') {
            // Also before a full stream's volume exists: it is made at the stream's end.
            return Ok(Some(
                self.receive_resume_token(volume)
                    .unwrap_or_else(|| "-".into()),
            ));
        }
        if let Some((v, snap)) = volume.split_once('@') {
            let s = self
                .snapshots(v)?
                .into_iter()
                .find(|s| s.name == snap)
                .ok_or_else(|| self.no_snapshot(v, snap))?;
            return Ok(Some(match name {
                "used" => s.used_bytes.to_string(),
                // As ZFS: a snapshot takes no writes.
                "available" => "-".into(),
                "referenced" => s.referenced_bytes.to_string(),
                "logicalreferenced" => s.logical_referenced_bytes.to_string(),
                "written" => s.written_bytes.to_string(),
                "createtxg" => s.createtxg.to_string(),
                "creation" => s.creation_s.to_string(),
                "guid" => s.guid.to_string(),
                "userrefs" => s.holds.len().to_string(),
                "defer_destroy" => if s.defer_destroy { "on" } else { "off" }.into(),
                "clones" => s.clones.join(","),
                "volsize" => s.volsize_bytes.to_string(),
                "type" => "snapshot".into(),
                _ => {
                    return Err(EngineError::invalid(format!(
                        "'{name}' is not a property of a snapshot ({}, written@SNAP)",
                        SNAPSHOT_PROP_NAMES.join(", ")
                    )))
                }
            }));
        }
        if !DATASET_STAT_NAMES.contains(&name) {
            return Ok(None);
        }
        let d = self.dataset_space(volume)?;
        Ok(Some(match name {
            "used" => d.used_bytes.to_string(),
            "available" => self.volume_available_bytes(volume)?.to_string(),
            "referenced" => d.referenced_bytes.to_string(),
            "written" => d.written_bytes.to_string(),
            "usedbydataset" => d.used_by_dataset_bytes.to_string(),
            "usedbysnapshots" => d.used_by_snapshots_bytes.to_string(),
            "usedbyrefreservation" => d.used_by_refreservation_bytes.to_string(),
            "origin" => d.origin.unwrap_or_else(|| "-".into()),
            "createtxg" => d.createtxg.to_string(),
            "creation" => d.creation_s.to_string(),
            "guid" => d.guid.to_string(),
            "snapshot_count" => d.snapshot_count.to_string(),
            _ => "volume".into(),
        }))
    }

    /// `written@SNAP` of `target` (`volume`, or `volume@snapshot`): the bytes it references
    /// that snapshot `since` does not, as of the last sync (ZFS's `written@`). `since` is a
    /// snapshot of the same volume (`snap`), or of the volumes it was cloned from
    /// (`volume@snap` or `pool/volume@snap`), older than `target`. Computed from space
    /// figures and deadlist totals, no block read (dsl/written.rs says why it is exact).
    pub fn written_since(&self, target: &str, since: &str) -> Result<u64> {
        let (volume, at) = match target.split_once('@') {
            Some((v, s)) => (v, Some(s)),
            None => (target, None),
        };
        let pool_prefix = format!("{}/", self.spa.name);
        let since_full = match since.strip_prefix(&pool_prefix).unwrap_or(since) {
            "" => {
                return Err(EngineError::invalid(
                    "written@: name a snapshot after the @ (written@SNAP)",
                ))
            }
            s if s.contains('@') => s.to_string(),
            s => format!("{volume}@{s}"),
        };
        let ds = self.dataset(volume)?;
        let line = crate::dsl::written::line(&self.dsl, &ds);
        // The generation asked about: the head (last), or one of its snapshots.
        let m = match at {
            None => line.len() - 1,
            Some(s) => line
                .iter()
                .rposition(|g| g.name == target)
                .ok_or_else(|| self.no_snapshot(volume, s))?,
        };
        let Some(k) = line.iter().position(|g| g.name == since_full) else {
            // Not in the line: no such snapshot, or one the target does not descend from.
            let exists = since_full.split_once('@').is_some_and(|(v, s)| {
                self.dsl
                    .get(v)
                    .is_some_and(|d| d.lineage.lock().unwrap().find(s).is_some())
            });
            if !exists {
                return Err(EngineError::NotFound(format!(
                    "{}/{since_full}",
                    self.spa.name
                )));
            }
            return Err(EngineError::invalid(format!(
                "written@{since}: {}/{target} does not descend from {}/{since_full}",
                self.spa.name, self.spa.name
            )));
        };
        if k >= m {
            return Err(EngineError::invalid(format!(
                "written@{since}: {}/{since_full} is not older than {}/{target}",
                self.spa.name, self.spa.name
            )));
        }
        Ok(crate::dsl::written::written_since_each(&line, k)[m - k - 1])
    }

    /// Audits the pool (`oxpool audit`, see dsl/audit.rs): syncs, then walks every tree and
    /// deadlist, verifies every block, recomputes the space figures and compares the places
    /// referenced with the allocator. Run it on a pool nothing writes to meanwhile.
    pub fn audit(&self) -> Result<crate::dsl::audit::AuditReport> {
        self.spa.sync_now()?;
        // No txg syncs while the trees are walked and compared with the allocator: on a
        // served pool, writes go on into memory meanwhile (up to `dirty_max`, then wait).
        let _gate = self.spa.sync_gate.lock().unwrap_or_else(|p| p.into_inner());
        oxpool_io::rt::block_on(crate::dsl::audit::audit(&self.spa, &self.dsl))
    }

    /// A read-only view of snapshot `volume@snap`, for reading (and serving over NBD).
    /// Reads fail once the snapshot is destroyed.
    pub fn snapshot_volume(&self, volume: &str, snap: &str) -> Result<Volume> {
        let head = self.dataset(volume)?;
        let s = {
            let l = head.lineage.lock().unwrap();
            l.find(snap)
                .ok_or_else(|| self.no_snapshot(volume, snap))?
                .1
                .clone()
        };
        // Held until the view is registered: a change of the volume's `nbd_allow` then
        // either comes before the copy or finds the view (`views_follow_nbd_allow`).
        let head_props = head.props.lock().unwrap();
        let mut p = head_props.clone();
        p.volsize_bytes = s.volsize_bytes;
        p.readonly = true;
        let data = Object::new(
            BlockTree::new(s.levels.max(1), s.root),
            s.volsize_bytes,
            s.referenced_bytes,
        );
        let zil = Arc::new(Zil::new(self.spa.guid, head.id, 1, Vec::new()));
        let mut lineage = Lineage::new(s.guid, s.txg, s.creation_s);
        lineage.prev_snap_txg = s.txg;
        let ds = Arc::new(Dataset::volume(
            head.id,
            &self.spa.name,
            &format!("{volume}@{snap}"),
            p,
            data,
            zil.clone(),
            lineage,
        ));
        self.dsl.add_view(&head, s.guid, &ds);
        drop(head_props);
        // A destroy that ended the snapshot's views between the lookup above and the
        // registration missed this one: its blocks are being freed, and a view not marked
        // destroyed would read (and heal) their places after reuse.
        let still_there = head
            .lineage
            .lock()
            .unwrap()
            .snapshots()
            .iter()
            .any(|x| x.guid == s.guid);
        if !still_there {
            ds.mark_destroyed();
            return Err(self.no_snapshot(volume, snap));
        }
        Ok(Volume {
            pool: self.spa.clone(),
            dsl: self.dsl.clone(),
            vol: Arc::new(VolumeInner::new(ds, zil)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::props::PoolProps;
    use crate::TopSpec;
    use oxpool_io::{Backend, MemoryBackend};

    fn create(name: &str) -> SnapOp {
        SnapOp::Create {
            name: name.into(),
            guid: crate::spa::random_guid(),
            creation_s: now_s(),
        }
    }

    /// Pool `tank` on one memory device, with volume `v` holding 16 KiB of data.
    fn tank_with_v() -> (Arc<dyn Backend>, Pool, Volume) {
        let dev: Arc<dyn Backend> = Arc::new(MemoryBackend::new("d0", 64 << 20));
        let pool = Pool::create(
            "tank",
            vec![TopSpec::single(dev.clone())],
            PoolProps::default(),
            false,
        )
        .unwrap();
        let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
        oxpool_io::rt::block_on(vol.write(0, &[7u8; 16384], true)).unwrap();
        (dev, pool, vol)
    }

    /// Two snapshots of one volume in one txg would give its snapshot table two entries of
    /// one txg, which import refuses ("snapshots out of txg order"): the pool would never
    /// open again. `snapshot` refuses them in one command, and the sync takes a second one
    /// queued some other way in the next txg; the pool imports with both, and audits clean.
    #[test]
    fn one_volume_never_gets_two_snapshots_in_one_txg() {
        let (dev, pool, vol) = tank_with_v();
        let err = pool
            .snapshot(&["v@a".to_string(), "v@b".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("one snapshot at a time"), "{err}");
        assert!(pool.snapshots("v").unwrap().is_empty(), "nothing taken");

        // Two callers at once: the second batch is queued for the txg after the first's, and
        // its call returns once that txg is durable, with the snapshot there.
        let vol_id = pool.dataset("v").unwrap().id;
        let open = pool.spa.txg.open_txg();
        assert_eq!(pool.dsl.queue_ops(open, vec![(vol_id, create("a"))]), open);
        pool.run_ops(vec![(vol_id, create("b"))]).unwrap();
        assert_eq!(
            pool.snapshots("v").unwrap().len(),
            2,
            "b returned before it was taken"
        );
        // Queued together some other way: the sync takes the second in the next txg.
        let open = pool.spa.txg.open_txg();
        pool.dsl
            .queue_unchecked(open, vec![(vol_id, create("c")), (vol_id, create("d"))]);
        for _ in 0..3 {
            pool.sync().unwrap();
        }
        let snaps = pool.snapshots("v").unwrap();
        let txgs: Vec<u64> = snaps.iter().map(|s| s.createtxg).collect();
        assert_eq!(snaps.len(), 4, "{snaps:?}");
        assert!(txgs.windows(2).all(|w| w[0] < w[1]), "{txgs:?}");
        drop(vol);
        pool.export().unwrap();
        let pool = Pool::import(vec![dev], Some("tank")).unwrap();
        assert_eq!(pool.snapshots("v").unwrap().len(), 4);
        let report = pool.audit().unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        pool.export().unwrap();
    }

    /// A command's snapshot changes are checked by name and queued later: a rename in
    /// between (through the `Pool` API: the CLI keeps verbs on one pool apart) must neither
    /// drop them nor turn them on whatever took the old names. They are queued by volume id
    /// and snapshot guid, so each lands on what the command checked.
    #[test]
    fn a_rename_between_the_checks_and_the_queue_moves_nothing_elsewhere() {
        let (_dev, pool, vol) = tank_with_v();
        pool.snapshot(&["v@a".to_string()]).unwrap();

        // `destroy v@a` checked, then (before it is queued) v@a renamed v@b and a new
        // v@a taken; and `snapshot v@c` checked, then v renamed w and a new v created.
        let ds = pool.dataset("v").unwrap();
        let destroy = pool.destroy_ops(&ds, "v", &["a".to_string()]).unwrap();
        let snapshot = vec![(ds.id, create("c"))];
        pool.rename("v@a", "v@b").unwrap();
        pool.snapshot(&["v@a".to_string()]).unwrap();
        pool.rename("v", "w").unwrap();
        let other = pool.create_volume("v", 8 << 20, &[]).unwrap();
        pool.run_ops(destroy).unwrap();
        pool.run_ops(snapshot).unwrap();

        let names = |v: &str| -> Vec<String> {
            pool.snapshots(v)
                .unwrap()
                .into_iter()
                .map(|s| s.name)
                .collect()
        };
        assert_eq!(
            names("w"),
            ["a", "c"],
            "the checked @a (now @b) destroyed, @c on w"
        );
        assert!(names("v").is_empty(), "the new v got nothing");
        let report = pool.audit().unwrap();
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        drop((vol, other));
        pool.export().unwrap();
    }
}
