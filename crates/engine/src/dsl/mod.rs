//! The dataset layer: datasets (volumes, and later their snapshots and clones, and
//! filesystems), their names and lineage, the deadlists that decide which freed blocks
//! snapshots still hold, space accounting, and the scrub. Each txg, the pool's sync asks this
//! layer (through [`SyncClient`]) to write its changes; it asks the object layer to write each
//! dataset's dirty objects.

pub mod audit;
pub mod change_map;
pub mod dataset;
pub mod deadlist;
pub mod freeing;
pub mod recv;
pub mod reservation;
pub mod resume;
pub mod scan;
pub mod send;
pub mod snapshot;
pub mod snapshot_sync;
pub mod table;
pub mod written;

use crate::dmu::tree::BlockTree;
use crate::spa::sync::{SyncClient, UpperMeta};
use crate::spa::Spa;
use crate::{EngineError, Result};
use dataset::Dataset;
use oxpool_format::{Dva, Txg, VolumeId, VolumeMeta};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The registry's state (under one lock, never held across an await).
struct DslState {
    datasets: BTreeMap<String, Arc<Dataset>>,
    /// Destroyed since the last sync: their blocks are freed by the next one.
    destroyed: Vec<Arc<Dataset>>,
    /// Destroyed ones the running sync frees (their logs' places go with its metadata).
    syncing_destroyed: Vec<Arc<Dataset>>,
    next_id: u64,
    /// Snapshot changes for the next syncs: (the open txg when asked, dataset id, change).
    /// A sync applies those asked at or before its txg, all of them in that one txg, so a
    /// command's changes to several datasets land together. By id, not name: a rename
    /// between a command's checks and its sync must neither drop its change nor hand it to
    /// the volume that took the old name.
    ops: Vec<(Txg, VolumeId, snapshot::SnapOp)>,
}

/// Live datasets, destroyed ones, the snapshot changes due, for one sync, and whether some
/// were left for the next.
type TakenForSync = (
    Vec<Arc<Dataset>>,
    Vec<Arc<Dataset>>,
    Vec<(oxpool_format::VolumeId, snapshot::SnapOp)>,
    bool,
);

/// A read-only view of a snapshot, handed out.
struct SnapshotView {
    /// The volume the snapshot belongs to (`promote` moves snapshots between volumes).
    head: oxpool_format::VolumeId,
    /// The snapshot's guid: unique within its volume, not within the pool.
    snapshot_guid: oxpool_format::Guid,
    /// The view.
    view: std::sync::Weak<Dataset>,
}

/// A pool's datasets.
pub(crate) struct Datasets {
    pool_name: String,
    state: Mutex<DslState>,
    /// The scrub, if one ran since the pool was opened.
    pub scan: scan::Scan,
    /// Read-only views of snapshots handed out: marked destroyed when their snapshot is.
    /// Pruned of dropped views as views are added.
    views: Mutex<Vec<SnapshotView>>,
    /// Blocks of destroyed snapshots still to free, drained a few per txg.
    pub(crate) freeing: Mutex<freeing::FreeQueue>,
    /// Snapshots that a running command needs until it ends (a send, by snapshot guid: how
    /// many such users), as ZFS's long holds: such a snapshot cannot be destroyed meanwhile.
    /// In memory only: no command survives a crash or an export. By guid alone, unlike views
    /// and clones: a guid can name two snapshots of the pool (a volume received from
    /// another of the same pool keeps its snapshots' guids), and a hold then also keeps the
    /// other one until the send ends, which errs on the safe side and needs no re-keying
    /// when `promote` moves a held snapshot to another volume.
    long_holds: Mutex<std::collections::HashMap<oxpool_format::Guid, usize>>,
    /// Held while the reservation figures are recomputed (`update_reservations`): by the
    /// sync thread and by whoever changed a reservation, so an older recomputation never
    /// stores its figures over a newer one's.
    reservations: Mutex<()>,
}

/// A long hold on a snapshot ([`Datasets::long_hold`]): released when dropped.
pub(crate) struct LongHold {
    dsl: Arc<Datasets>,
    guid: oxpool_format::Guid,
}

impl Drop for LongHold {
    fn drop(&mut self) {
        let mut holds = self.dsl.long_holds.lock().unwrap();
        if let Some(n) = holds.get_mut(&self.guid) {
            *n -= 1;
            if *n == 0 {
                holds.remove(&self.guid);
            }
        }
    }
}

impl Datasets {
    /// No datasets yet; the next one gets id `next_id`.
    pub(crate) fn new(pool_name: &str, next_id: u64) -> Datasets {
        Datasets {
            pool_name: pool_name.to_string(),
            state: Mutex::new(DslState {
                datasets: BTreeMap::new(),
                destroyed: Vec::new(),
                syncing_destroyed: Vec::new(),
                next_id,
                ops: Vec::new(),
            }),
            scan: scan::Scan::default(),
            views: Mutex::new(Vec::new()),
            freeing: Mutex::new(freeing::FreeQueue::default()),
            long_holds: Mutex::new(std::collections::HashMap::new()),
            reservations: Mutex::new(()),
        }
    }

    /// Holds snapshot `guid` until the returned guard is dropped: destroying it is refused
    /// meanwhile (a send holds the snapshots it reads, as ZFS's `zfs send` does).
    pub(crate) fn long_hold(self: &Arc<Self>, guid: oxpool_format::Guid) -> LongHold {
        *self.long_holds.lock().unwrap().entry(guid).or_insert(0) += 1;
        LongHold {
            dsl: Arc::clone(self),
            guid,
        }
    }

    /// Whether a running command holds snapshot `guid` ([`Datasets::long_hold`]).
    pub(crate) fn is_long_held(&self, guid: oxpool_format::Guid) -> bool {
        self.long_holds.lock().unwrap().contains_key(&guid)
    }

    /// A new id for a dataset.
    pub(crate) fn next_id(&self) -> u64 {
        let mut s = self.state.lock().unwrap();
        let id = s.next_id;
        s.next_id += 1;
        id
    }

    /// Adds `ds` (created, or loaded at import); refused if the name is taken.
    pub(crate) fn insert(&self, ds: Arc<Dataset>) -> Result<()> {
        let name = ds.name();
        let mut s = self.state.lock().unwrap();
        if s.datasets.contains_key(&name) {
            return Err(EngineError::Exists(format!("{}/{name}", self.pool_name)));
        }
        s.datasets.insert(name, ds);
        Ok(())
    }

    /// Renames dataset `from` to `to` (names inside the pool; `to` checked by the caller).
    /// Under the registry's lock it is re-keyed, the snapshot changes queued for it follow
    /// it, and so do the names of its snapshots' views: no later lookup, queued change or
    /// view finds it under `from`. The next sync persists the name, one field of the pool's
    /// metadata, read under the same lock: each txg holds the old name or the new one.
    /// Refused (nothing changed) while a receive into either name is under way (`VOL%recv`,
    /// whose end finds its target by name).
    pub(crate) fn rename(&self, from: &str, to: &str, hidden_suffix: &str) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        let full = |n: &str| format!("{}/{n}", self.pool_name);
        if !s.datasets.contains_key(from) {
            return Err(EngineError::NotFound(full(from)));
        }
        if s.datasets.contains_key(to) {
            return Err(EngineError::Exists(full(to)));
        }
        for n in [from, to] {
            if s.datasets.contains_key(&format!("{n}{hidden_suffix}")) {
                return Err(EngineError::Busy(format!(
                    "a receive into {} is under way (or resumable: `recv -A` discards it)",
                    full(n)
                )));
            }
        }
        let ds = s.datasets.remove(from).expect("checked above");
        ds.names.set(to);
        s.datasets.insert(to.to_string(), ds.clone());
        // Views are named `VOL@SNAP`: they take the new volume name.
        for e in self
            .views
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.head == ds.id)
        {
            if let Some(v) = e.view.upgrade() {
                let snap = v.name().split_once('@').map(|(_, s)| s.to_string());
                if let Some(snap) = snap {
                    v.names.set(&format!("{to}@{snap}"));
                }
            }
        }
        Ok(())
    }

    /// Snapshot `snapshot_guid` of volume `head` is now `volume@name`: its views follow.
    pub(crate) fn rename_views(
        &self,
        head: oxpool_format::VolumeId,
        snapshot_guid: oxpool_format::Guid,
        new_name: &str,
    ) {
        let v = self.views.lock().unwrap();
        for e in v.iter() {
            if e.head == head && e.snapshot_guid == snapshot_guid {
                if let Some(d) = e.view.upgrade() {
                    d.names.set(new_name);
                }
            }
        }
    }

    /// Removes dataset `name`; its blocks are freed by the next sync.
    pub(crate) fn destroy(&self, name: &str) -> Result<Arc<Dataset>> {
        let mut s = self.state.lock().unwrap();
        let ds = s
            .datasets
            .remove(name)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{name}", self.pool_name)))?;
        ds.mark_destroyed();
        s.destroyed.push(ds.clone());
        Ok(ds)
    }

    /// Every dataset, by name.
    /// Has every intent log abandon a chain with a place on log vdev `vdev`, which is
    /// leaving the pool ([`DatasetLog::leave_vdev`]).
    pub(crate) fn leave_log_vdev(&self, vdev: oxpool_format::VdevId) {
        for ds in self.all() {
            ds.log.leave_vdev(vdev);
        }
    }

    pub(crate) fn all(&self) -> Vec<Arc<Dataset>> {
        self.state
            .lock()
            .unwrap()
            .datasets
            .values()
            .cloned()
            .collect()
    }

    /// Queues snapshot changes (already checked) for the sync of the open txg `open_txg`
    /// or a later one, all in one; returns the txg they are queued for. That is `open_txg`,
    /// unless a dataset the batch snapshots has a snapshot queued already (another caller's):
    /// a dataset gets one snapshot per txg, so the whole batch goes to the txg after the last
    /// such one, and stays one txg (its snapshots atomic).
    pub(crate) fn queue_ops(&self, open_txg: Txg, ops: Vec<(VolumeId, snapshot::SnapOp)>) -> Txg {
        let is_create = |o: &snapshot::SnapOp| matches!(o, snapshot::SnapOp::Create { .. });
        let mut s = self.state.lock().unwrap();
        let txg = ops
            .iter()
            .filter(|(_, o)| is_create(o))
            .flat_map(|(d, _)| {
                s.ops
                    .iter()
                    .filter(move |(_, d2, o2)| d2 == d && is_create(o2))
                    .map(|(t, _, _)| Txg(t.0 + 1))
            })
            .fold(open_txg, Txg::max);
        s.ops.extend(ops.into_iter().map(|(ds, op)| (txg, ds, op)));
        txg
    }

    /// Queues `ops` for `txg` as they are, without [`Datasets::queue_ops`]'s check: for tests
    /// of the sync's own guard.
    #[cfg(test)]
    pub(crate) fn queue_unchecked(&self, txg: Txg, ops: Vec<(VolumeId, snapshot::SnapOp)>) {
        let mut s = self.state.lock().unwrap();
        s.ops.extend(ops.into_iter().map(|(ds, op)| (txg, ds, op)));
    }

    /// The queued snapshot changes, for checks against what is already asked.
    pub(crate) fn queued_ops(&self) -> Vec<(VolumeId, snapshot::SnapOp)> {
        let s = self.state.lock().unwrap();
        s.ops.iter().map(|(_, d, o)| (*d, o.clone())).collect()
    }

    /// Records `view`, a read-only view of snapshot `snapshot_guid` of `head`.
    pub(crate) fn add_view(
        &self,
        head: &Dataset,
        snapshot_guid: oxpool_format::Guid,
        view: &Arc<Dataset>,
    ) {
        let mut v = self.views.lock().unwrap();
        v.retain(|e| e.view.strong_count() > 0);
        v.push(SnapshotView {
            head: head.id,
            snapshot_guid,
            view: Arc::downgrade(view),
        });
    }

    /// The volume whose snapshot `view` shows (None if it is not a registered view).
    pub(crate) fn view_head(&self, view: &Dataset) -> Option<oxpool_format::VolumeId> {
        self.views
            .lock()
            .unwrap()
            .iter()
            .find(|e| std::ptr::eq(e.view.as_ptr(), view))
            .map(|e| e.head)
    }

    /// `promote` moved the snapshots `moved` of volume `from` to volume `to`: their views
    /// follow them, so that destroying one there ends them.
    fn move_views(
        &self,
        from: oxpool_format::VolumeId,
        to: oxpool_format::VolumeId,
        moved: &[oxpool_format::Guid],
    ) {
        for e in self.views.lock().unwrap().iter_mut() {
            if e.head == from && moved.contains(&e.snapshot_guid) {
                e.head = to;
            }
        }
    }

    /// Volume `head` has a new `nbd_allow`: the views of its snapshots (datasets of its id)
    /// take it too. A view copies the volume's properties when it is made and serves the
    /// volume's data: an allow list left behind would keep serving it to whoever the volume
    /// no longer allows. The caller holds `head`'s properties lock, which a view holds from
    /// its copy until it is registered here, so none is made with the old list after this.
    pub(crate) fn views_follow_nbd_allow(&self, head: &Dataset, nbd_allow: &Option<Vec<String>>) {
        let v = self.views.lock().unwrap();
        for e in v.iter().filter(|e| e.head == head.id) {
            if let Some(d) = e.view.upgrade() {
                if !std::ptr::eq(&*d, head) {
                    d.props.lock().unwrap().nbd_allow = nbd_allow.clone();
                }
            }
        }
    }

    /// Snapshot `snapshot_guid` of volume `head` is destroyed: its views read no more. Those
    /// of a snapshot of another volume with the same guid read on.
    pub(crate) fn end_views(
        &self,
        head: oxpool_format::VolumeId,
        snapshot_guid: oxpool_format::Guid,
    ) {
        let mut v = self.views.lock().unwrap();
        let ended = |e: &SnapshotView| e.head == head && e.snapshot_guid == snapshot_guid;
        for e in v.iter().filter(|e| ended(e)) {
            if let Some(d) = e.view.upgrade() {
                d.mark_destroyed();
            }
        }
        v.retain(|e| !ended(e) && e.view.strong_count() > 0);
    }

    /// Queues the buckets a destroy frees (their in-memory entries are freed at once, into
    /// `freed`).
    pub(crate) fn queue_frees(&self, d: deadlist::Deadlist, freed: &mut Vec<Dva>) {
        let mut q = self.freeing.lock().unwrap();
        for (_, bucket) in d.into_buckets() {
            q.push(bucket, freed);
        }
    }

    /// Bytes still to free (`freeing`).
    pub(crate) fn freeing_bytes(&self) -> u64 {
        self.freeing.lock().unwrap().bytes()
    }

    /// Fills in every clone's origin chain once all datasets are loaded: the snapshot txgs of its
    /// origin's chain at or before the origin (keys for the blocks it kills that only those
    /// snapshots reference).
    pub(crate) fn link_origins(&self) {
        let all = self.all();
        let by_id = |id: oxpool_format::VolumeId| all.iter().find(|d| d.id == id);
        for ds in &all {
            let origin = ds.lineage.lock().unwrap().origin.clone();
            let mut chain: Vec<Txg> = Vec::new();
            let mut next = origin;
            // Bounded: each step moves to an older dataset (ids of origins precede their
            // clones' unless promoted, which does not exist yet), at most one per dataset.
            for _ in 0..all.len() {
                let Some(o) = next.take() else { break };
                let Some(src) = by_id(o.volume) else { break };
                let l = src.lineage.lock().unwrap();
                let mut part: Vec<Txg> = l
                    .snapshots()
                    .iter()
                    .map(|s| s.txg)
                    .filter(|t| *t <= o.txg)
                    .collect();
                part.extend(chain);
                chain = part;
                next = l.origin.clone();
            }
            ds.lineage.lock().unwrap().origin_chain = chain;
        }
    }

    /// How many datasets are clones of the snapshot with guid `snapshot_guid` of volume
    /// `head`.
    pub(crate) fn clones_of(
        &self,
        head: oxpool_format::VolumeId,
        snapshot_guid: oxpool_format::Guid,
    ) -> usize {
        self.clone_names(head, snapshot_guid).len()
    }

    /// The names of the clones of the snapshot with guid `snapshot_guid` of volume `head`
    /// (not of another volume's snapshot with the same guid).
    pub(crate) fn clone_names(
        &self,
        head: oxpool_format::VolumeId,
        snapshot_guid: oxpool_format::Guid,
    ) -> Vec<String> {
        self.all()
            .iter()
            .filter(|d| {
                d.lineage
                    .lock()
                    .unwrap()
                    .origin
                    .as_ref()
                    .is_some_and(|o| o.volume == head && o.snapshot_guid == snapshot_guid)
            })
            .map(|d| d.full_name())
            .collect()
    }

    /// A dataset by name.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Dataset>> {
        self.state.lock().unwrap().datasets.get(name).cloned()
    }

    /// What the sync of `txg` works on: live and destroyed datasets, and the changes due.
    fn take_for_sync(&self, txg: Txg) -> TakenForSync {
        let mut s = self.state.lock().unwrap();
        let destroyed = std::mem::take(&mut s.destroyed);
        s.syncing_destroyed.extend(destroyed.iter().cloned());
        let (due, mut later): (Vec<_>, Vec<_>) = std::mem::take(&mut s.ops)
            .into_iter()
            .partition(|(t, _, _)| *t <= txg);
        // A volume's snapshots are ordered by txg, one per txg (the snapshot table refuses
        // two of one txg at import): a second snapshot of a dataset due in this txg waits
        // for the next. `Pool::snapshot` refuses two of one volume in one command; this
        // keeps any other way of queueing them (two callers at once) from reaching the disk.
        let mut snapshotted: Vec<VolumeId> = Vec::new();
        let mut now = Vec::with_capacity(due.len());
        let mut deferred = Vec::new();
        for (t, d, o) in due {
            if matches!(o, snapshot::SnapOp::Create { .. }) {
                if snapshotted.contains(&d) {
                    tracing::warn!(
                        dataset = d.0,
                        "second snapshot in one txg: taken in the next"
                    );
                    deferred.push((Txg(t.0.max(txg.0) + 1), d, o));
                    continue;
                }
                snapshotted.push(d);
            }
            // One whose dataset is gone (destroyed since) has nothing to apply to.
            if s.datasets.values().any(|ds| ds.id == d) {
                now.push((d, o));
            }
        }
        let any_deferred = !deferred.is_empty();
        later.extend(deferred);
        s.ops = later;
        (
            s.datasets.values().cloned().collect(),
            destroyed,
            now,
            any_deferred,
        )
    }

    /// Writes every object of every dataset for txg `txg` (destroyed ones: frees all), then
    /// applies the snapshot changes due and writes the deadlists' new entries.
    async fn sync_all(&self, spa: &Spa, txg: Txg, freed: &mut Vec<Dva>) -> Result<()> {
        let (live, destroyed, ops, deferred) = self.take_for_sync(txg);
        // A bounded part of the queue of frees; if more is left, the next sync follows at
        // once (each one short), until it is empty. So does a deferred snapshot.
        if freeing::drain(spa, &self.freeing, freed).await? || deferred {
            spa.txg.kick();
        }
        for ds in &live {
            snapshot_sync::sync_dataset(spa, ds, txg, false, freed).await?;
            for (_, op) in ops.iter().filter(|(id, _)| *id == ds.id) {
                snapshot_sync::apply(spa, self, ds, op, txg, freed).await?;
            }
        }
        // Then every dataset's new deadlist entries and changed tables, once all changes are
        // applied: a change to one dataset may change another's (a promote moves snapshots
        // from its origin's volume, a receive creates its target or snapshots it), and what
        // this txg's metadata lists must be written in this txg.
        for ds in &self.all() {
            snapshot_sync::write_deadlists(spa, ds, txg, freed).await?;
            snapshot_sync::write_tables(spa, ds, txg, freed).await?;
        }
        for ds in &destroyed {
            snapshot_sync::sync_dataset(spa, ds, txg, true, freed).await?;
        }
        Ok(())
    }
}

impl SyncClient for Datasets {
    fn sync<'a>(
        &'a self,
        spa: &'a Spa,
        txg: Txg,
        freed: &'a mut Vec<Dva>,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> {
        Box::pin(self.sync_all(spa, txg, freed))
    }

    fn meta(&self, txg: Txg, freed: &mut Vec<Dva>) -> UpperMeta {
        let (live, destroyed, next_id) = {
            let mut s = self.state.lock().unwrap();
            (
                // Names read under the registry's lock, which a rename holds: two renames
                // at once (A to C, then B to A) cannot both show here as A.
                s.datasets
                    .iter()
                    .map(|(name, ds)| (ds.clone(), name.clone()))
                    .collect::<Vec<_>>(),
                std::mem::take(&mut s.syncing_destroyed),
                s.next_id,
            )
        };
        // The logs' places, without the pool's lock (committers allocate while holding
        // their log's lock).
        for ds in &destroyed {
            let log = ds.log.persist();
            freed.extend(log.to_free);
            freed.extend(log.reserved);
        }
        let volumes = live
            .iter()
            .map(|(ds, name)| {
                let log = ds.log.persist();
                freed.extend(log.to_free);
                let mut reserved = log.reserved;
                reserved.extend(ds.data().inplace_held.lock().unwrap().iter().copied());
                let head = log.head;
                let p = ds.props.lock().unwrap();
                let data = ds.data();
                let t = data.tree.lock().unwrap();
                let mut props = p.to_pairs();
                if let Some(t) = log.replay_txg {
                    props.push((dataset::REPLAY_TXG_KEY.to_string(), t.0.to_string()));
                }
                VolumeMeta {
                    id: ds.id,
                    name: name.clone(),
                    props,
                    // Not `p`'s: a resize in the open txg goes with its frees.
                    volsize_bytes: data.tree_size_bytes.load(Ordering::Relaxed),
                    volblocksize_bytes: p.volblocksize_bytes,
                    root: t.root(),
                    levels: t.levels(),
                    used_bytes: data.used_bytes.load(Ordering::Relaxed),
                    log_first: head.map(|h| h.0).unwrap_or_default(),
                    log_first_seq: head.map(|h| h.1).unwrap_or(0),
                    log_reserved: reserved,
                    compressed_bytes: data.compressed_bytes.load(Ordering::Relaxed),
                }
            })
            .collect();
        let datasets = live
            .iter()
            .map(|(ds, _)| {
                let mut l = ds.lineage.lock().unwrap();
                if let Some(r) = &mut l.receive_resume {
                    r.settle(txg);
                }
                l.to_meta(ds.id)
            })
            .collect();
        UpperMeta {
            volumes,
            datasets,
            freeing: self.freeing.lock().unwrap().to_meta(),
            next_volume_id: next_id,
        }
    }

    fn synced(&self, spa: &Spa, txg: Txg, cache_max_bytes: u64) {
        // What each reservation holds unused follows what the txg wrote and snapshotted.
        self.update_reservations(spa);
        let live = self.all();
        let cache_blocks = (cache_max_bytes as usize / BlockTree::CACHED_BLOCK_BYTES).max(64);
        let per_dataset = (cache_blocks / live.len().max(1)).max(16);
        for ds in &live {
            for (_, obj) in ds.objset.objects() {
                obj.dirty.lock().unwrap().retire(txg);
                obj.tree.lock().unwrap().evict(per_dataset);
            }
        }
        for ds in &live {
            ds.log.txg_synced(txg);
        }
    }
}
