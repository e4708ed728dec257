//! A dataset: a name in the pool, its properties, its object set, and the hook through which
//! its intent log (a layer above) tells the sync what the log holds.

use crate::dmu::object::{Object, ObjectId};
use crate::dsl::snapshot::Lineage;
use crate::props::VolumeProps;
use oxpool_format::{Dva, Txg, VdevId, VolumeId};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

/// The key, among a volume's persisted properties, of the txg a replay in progress replays
/// records after (`zil::ReplayHold`); import strips it before it reads the properties.
pub(crate) const REPLAY_TXG_KEY: &str = "zil_replay_txg";

/// What the txg sync needs from a dataset's intent log (which lives above this layer): the
/// head of its chain and the places it holds, to persist; and word that a txg is durable.
pub(crate) trait DatasetLog: Send + Sync {
    /// What this sync persists of the log, read at one instant (under the log's one lock:
    /// a replay ending between separate reads would leave its places neither freed nor held).
    fn persist(&self) -> LogPersist;
    /// Every place the log holds (reserved or written, not yet freed), for the audit.
    fn reserved(&self) -> Vec<Dva>;
    /// `txg` is durable (records of it and older are no longer needed).
    fn txg_synced(&self, txg: Txg);
    /// Log vdev `vdev` is leaving the pool: a chain with a place on it is abandoned by the
    /// next sync, and new blocks go elsewhere.
    fn leave_vdev(&self, vdev: VdevId);
}

/// A log's part of a txg's metadata ([`DatasetLog::persist`]).
pub(crate) struct LogPersist {
    /// Log blocks no longer needed: freed by this sync.
    pub(crate) to_free: Vec<Dva>,
    /// Every place the log holds.
    pub(crate) reserved: Vec<Dva>,
    /// The chain's first block and its sequence number (None: no chain).
    pub(crate) head: Option<(Dva, u64)>,
    /// While import replays a chain: the txg its records are newer than, persisted with the
    /// chain ([`REPLAY_TXG_KEY`]).
    pub(crate) replay_txg: Option<Txg>,
}

/// The objects of a dataset. A volume has one: its data, [`ObjectId::VOLUME_DATA`].
pub(crate) struct ObjectSet {
    data: Object,
}

impl ObjectSet {
    /// A volume's object set: its data object.
    pub(crate) fn volume(data: Object) -> ObjectSet {
        ObjectSet { data }
    }

    /// A volume's data object.
    pub(crate) fn data(&self) -> &Object {
        &self.data
    }

    /// Every object, by id.
    pub(crate) fn objects(&self) -> impl Iterator<Item = (ObjectId, &Object)> {
        std::iter::once((ObjectId::VOLUME_DATA, &self.data))
    }
}

/// A dataset's shared state.
pub(crate) struct Dataset {
    pub id: VolumeId,
    /// Its name, which `rename` changes while handles to it are in use.
    pub names: DatasetName,
    pub props: Mutex<VolumeProps>,
    pub objset: ObjectSet,
    pub destroyed: AtomicBool,
    /// Its intent log, as the sync sees it.
    pub log: Arc<dyn DatasetLog>,
    /// Its snapshots, origin and deadlist (changed by txg syncs only, except holds).
    pub lineage: Mutex<Lineage>,
    /// Its `usedbyrefreservation`: what its `refreservation` holds beyond what it has
    /// written since its latest snapshot, as of the last sync or property change
    /// (`Datasets::update_reservations`). Its writers may fill it; others may not.
    pub reserved_unused_bytes: AtomicU64,
}

impl Dataset {
    /// A volume dataset named `name` in pool `pool_name`, its data in `data`.
    pub(crate) fn volume(
        id: VolumeId,
        pool_name: &str,
        name: &str,
        props: VolumeProps,
        data: Object,
        log: Arc<dyn DatasetLog>,
        lineage: Lineage,
    ) -> Dataset {
        Dataset {
            id,
            names: DatasetName::new(pool_name, name),
            props: Mutex::new(props),
            objset: ObjectSet::volume(data),
            destroyed: AtomicBool::new(false),
            log,
            lineage: Mutex::new(lineage),
            reserved_unused_bytes: AtomicU64::new(0),
        }
    }

    /// Name inside the pool (a copy: a rename may change it at any time).
    pub(crate) fn name(&self) -> String {
        self.names.name()
    }

    /// `pool/dataset`, for messages and NBD export names (a copy, as [`Dataset::name`]).
    pub(crate) fn full_name(&self) -> String {
        self.names.full_name()
    }

    /// A volume's data object.
    pub(crate) fn data(&self) -> &Object {
        self.objset.data()
    }

    /// It is destroyed (or, for a view, its snapshot): its handles read and write no more,
    /// and its tree heals nothing it reads (`BlockTree::retire`). Before its blocks are freed.
    pub(crate) fn mark_destroyed(&self) {
        self.destroyed
            .store(true, std::sync::atomic::Ordering::Release);
        self.data().tree.lock().unwrap().retire();
    }
}

/// A dataset's name: `rename` changes it while handles to the dataset serve I/O, so it sits
/// behind a lock of its own. Read only to show or persist it: the I/O path passes
/// `&DatasetName` where a message may need the name ([`fmt::Display`], the full name), so a
/// request that succeeds neither takes this lock nor allocates a copy.
pub(crate) struct DatasetName {
    pool_name: String,
    /// (name inside the pool, `pool/name`): one lock, so a reader never sees one new and
    /// the other old.
    names: Mutex<(String, String)>,
}

impl DatasetName {
    fn new(pool_name: &str, name: &str) -> DatasetName {
        DatasetName {
            pool_name: pool_name.to_string(),
            names: Mutex::new((name.to_string(), format!("{pool_name}/{name}"))),
        }
    }

    /// Name inside the pool.
    pub(crate) fn name(&self) -> String {
        self.names.lock().unwrap().0.clone()
    }

    /// `pool/name`.
    pub(crate) fn full_name(&self) -> String {
        self.names.lock().unwrap().1.clone()
    }

    /// `f` of the name inside the pool, without a copy. `f` must take no lock a rename
    /// holds while it renames (the registry's: [`super::Datasets::rename`]).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&str) -> T) -> T {
        f(&self.names.lock().unwrap().0)
    }

    /// Renames it (the caller re-keys whatever table finds it by name, under that table's
    /// lock, so a lookup never finds it under a name it no longer has).
    pub(crate) fn set(&self, name: &str) {
        *self.names.lock().unwrap() = (name.to_string(), format!("{}/{name}", self.pool_name));
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names.lock().unwrap().1)
    }
}
