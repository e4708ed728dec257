//! The engine's front door: a pool, assembled from its layers (the pool's own state and txg
//! engine in `spa`, its datasets in `dsl`, volumes over them in `zvol`), and the handles the
//! CLI and the NBD server use. The one module that may reach every layer.

use crate::dmu::object::Object;
use crate::dmu::tree::{levels_for, BlockTree};
use crate::dsl::dataset::{Dataset, REPLAY_TXG_KEY};
use crate::dsl::snapshot::Lineage;
use crate::dsl::Datasets;
use crate::iostats::LogStats;
use crate::iostats::VolumeStats;
use crate::props::{PoolProps, VolumeProps};
use crate::spa::import::{ImportOptions, PoolRef};
use crate::spa::sync::{sync_thread, SyncClient};
use crate::spa::{check_name, PoolStatus, Spa, TopSpec};
use crate::vdev::label::{holds_no_label, read_label};
use crate::vdev::{DeviceStats, InjectRule, InjectRuleStatus};
use crate::zil::{read_chain, ReplayRecord, Zil};
use crate::zio::ScrubCounts;
use crate::zvol::VolumeInner;
use crate::{EngineError, Result, ScanStatus, Volume};
use oxpool_format::{BlockPtr, Dva, Guid, LabelConfig, TopVdevKind, Txg, VolumeId};
use oxpool_io::rt::block_on;
use oxpool_io::Backend;
use recv::is_hidden;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Log records to replay, per volume name.
type Replays = Vec<(String, Vec<ReplayRecord>)>;

mod bookmark;
mod devices;
mod error_record;
#[cfg(test)]
mod heal_tests;
mod history;
#[cfg(test)]
mod log_tests;
#[cfg(test)]
mod read_damage_tests;
mod recv;
mod rename;
mod reservation;
mod send;
mod snapshot;
pub use bookmark::BookmarkInfo;
pub use error_record::{DeviceRecord, ErrorRecord};
pub use recv::{BeforeDestroy, OnKept, ReceiveOptions, Received};
pub use send::{
    LegSize, SendOptions, SendStats, SendWhat, SEND_PREFETCH_BYTES_DEFAULT,
    SEND_READS_IN_FLIGHT_BYTES_MAX,
};
pub use snapshot::{DatasetSpace, SnapshotInfo, DATASET_STAT_NAMES, SNAPSHOT_PROP_NAMES};

/// An imported pool. Dropping it without [`Pool::export`] stops its sync thread without a final
/// sync (as a process exit would): data not yet synced or flushed is lost, nothing else.
pub struct Pool {
    spa: Arc<Spa>,
    dsl: Arc<Datasets>,
    /// The volumes, by name: each over its dataset in `dsl`.
    volumes: Arc<Mutex<BTreeMap<String, Arc<VolumeInner>>>>,
    /// Held by a change that makes a reservation hold more, from its check until its figures
    /// count (`pool/reservation.rs`): two changes cannot both pass on the same space.
    reservation_changes: Mutex<()>,
    sync_thread: Option<JoinHandle<()>>,
}

/// Reads a pool's counters (see [`Pool::counters`]).
#[derive(Clone)]
pub struct PoolCounters {
    spa: Arc<Spa>,
    volumes: Arc<Mutex<BTreeMap<String, Arc<VolumeInner>>>>,
}

impl PoolCounters {
    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.spa.name
    }

    /// Intent-log, flush and write-throttle counters.
    pub fn log_stats(&self) -> LogStats {
        self.spa.pool_stats()
    }

    /// The last durable txg.
    pub fn synced_txg(&self) -> Txg {
        self.spa.txg.synced()
    }

    /// I/O statistics of every present leaf device, in vdev tree order.
    pub fn device_stats(&self) -> Vec<DeviceStats> {
        let mut out = Vec::new();
        for top in self.spa.zio.vdevs.tops() {
            for leaf in top.leaves() {
                let vdev = match top.kind() {
                    TopVdevKind::Mirror => format!("mirror-{}", top.id.0),
                    _ => leaf.name().to_string(),
                };
                out.push(DeviceStats {
                    name: leaf.name().to_string(),
                    vdev,
                    scheduler: leaf.queue.mode().as_str().to_string(),
                    io: leaf.io_stats.snapshot(),
                    queue: leaf.queue.snapshot(),
                    errors: leaf.counters.snapshot(),
                });
            }
        }
        out
    }

    /// I/O statistics of every volume, by name.
    pub fn volume_stats(&self) -> Vec<VolumeStats> {
        let volumes = self.volumes.lock().unwrap();
        volumes
            .values()
            .map(|v| VolumeStats {
                name: v.ds.name(),
                id: Some(v.ds.id),
                io: v.io_stats.snapshot(),
            })
            .collect()
    }

    /// Hits, misses and size of the data-block cache.
    pub fn data_cache_stats(&self) -> crate::zio::data_cache::DataCacheStats {
        self.spa.zio.data_cache.stats()
    }
}

/// Devices an import that found no pool names one by one, with what each held; beyond it,
/// a summary (a directory search reads every file in it).
const REJECTED_NAMED_MAX: usize = 3;

impl Pool {
    /// Creates a pool on `tops`. Refuses devices that belong to a pool unless `force`.
    pub fn create(name: &str, tops: Vec<TopSpec>, props: PoolProps, force: bool) -> Result<Pool> {
        let dsl = Arc::new(Datasets::new(name, 1));
        let spa = Spa::create(name, tops, props, force, dsl.as_ref())?;
        let pool = Pool::start(spa, dsl, BTreeMap::new());
        pool.wire_devices();
        Ok(pool)
    }

    fn start(
        spa: Arc<Spa>,
        dsl: Arc<Datasets>,
        volumes: BTreeMap<String, Arc<VolumeInner>>,
    ) -> Pool {
        crate::spa::apply_scheduler(&spa);
        crate::spa::apply_fault_policy(&spa);
        let weak = Arc::downgrade(&spa);
        let upper: std::sync::Weak<dyn SyncClient> = Arc::downgrade(&dsl) as _;
        dsl.update_reservations(&spa);
        let thread = std::thread::Builder::new()
            .name(format!("txg-sync-{}", spa.name))
            .spawn(move || sync_thread(weak, upper))
            .expect("spawn the txg sync thread");
        Pool {
            spa,
            dsl,
            volumes: Arc::new(Mutex::new(volumes)),
            reservation_changes: Mutex::new(()),
            sync_thread: Some(thread),
        }
    }

    /// Imports the pool found on `devices` (all devices of one pool, possibly others too).
    /// With `name`, only that pool is considered. Errors name each device and what was wrong.
    pub fn import(devices: Vec<Arc<dyn Backend>>, name: Option<&str>) -> Result<Pool> {
        Self::import_with(devices, name, ImportOptions::default())
    }

    /// [`Pool::import`] with options: `missing_log` imports a pool whose separate log device
    /// is gone, without its intent-log records (`oxpool import -m`).
    pub fn import_with(
        devices: Vec<Arc<dyn Backend>>,
        name: Option<&str>,
        opts: ImportOptions,
    ) -> Result<Pool> {
        let which = name.map_or(PoolRef::Any, PoolRef::Name);
        Self::import_as(devices, which, None, opts)
    }

    /// Imports the pool `which` selects among `devices`, under `new_name` if given (`oxpool
    /// import POOL NEWNAME`, as `zpool import pool newpool`), else under the name its
    /// metadata records.
    ///
    /// A pool's name lives in its metadata, written by each txg, and in every device's
    /// labels. A new name is committed in a txg first, then written to the labels, each
    /// device's even labels and then its odd ones (`Spa::mend_labels`): a crash in between
    /// leaves labels that name the old name or the new, every one of them this pool's by
    /// guid, so an import by either name (or by id) finds every device, comes up with the
    /// name of the last committed txg, and mends the labels left behind.
    pub fn import_as(
        devices: Vec<Arc<dyn Backend>>,
        which: PoolRef<'_>,
        new_name: Option<&str>,
        opts: ImportOptions,
    ) -> Result<Pool> {
        if let Some(n) = new_name {
            crate::spa::check_name("pool", n)?;
            crate::spa::check_new_pool_name(n)?;
        }
        let name = match which {
            PoolRef::Name(n) | PoolRef::NameOrId(n) => Some(n),
            PoolRef::Any | PoolRef::Id(_) => None,
        };
        let (spa, meta) = block_on(async {
            let mut found: Vec<(LabelConfig, Arc<dyn Backend>)> = Vec::new();
            let mut rejected: Vec<String> = Vec::new();
            // Other pools' names, and what the devices with no label were, apart: a search
            // of a whole directory (`import -d`) finds many files that hold no pool.
            let mut others: Vec<String> = Vec::new();
            let mut unlabelled: Vec<String> = Vec::new();
            // Devices whose label could not be read or is damaged: always named, as one may
            // be the pool's.
            let mut damaged: Vec<String> = Vec::new();
            // First the guids selected: by name, every pool one of whose labels names it.
            let mut labelled: Vec<(Result<LabelConfig>, Arc<dyn Backend>)> = Vec::new();
            for dev in devices {
                labelled.push((read_label(dev.as_ref()).await, dev));
            }
            let selected: Vec<Guid> = labelled
                .iter()
                .filter_map(|(l, _)| l.as_ref().ok())
                .filter(|c| which.matches(&c.pool_name, c.pool_guid))
                .map(|c| c.pool_guid)
                .collect();
            for (label, dev) in labelled {
                match label {
                    Ok(cfg) if selected.contains(&cfg.pool_guid) => found.push((cfg, dev)),
                    Ok(cfg) => {
                        rejected.push(format!(
                            "{}: belongs to pool '{}'",
                            dev.name(),
                            cfg.pool_name
                        ));
                        others.push(format!("'{}'", cfg.pool_name));
                    }
                    Err(e) => {
                        if holds_no_label(&e) {
                            unlabelled.push(e.to_string());
                        } else {
                            damaged.push(e.to_string());
                        }
                        rejected.push(e.to_string());
                    }
                }
            }
            let mut guids: Vec<(Guid, String)> = found
                .iter()
                .map(|(c, _)| (c.pool_guid, c.pool_name.clone()))
                .collect();
            guids.sort();
            // One pool whose labels disagree on its name (a rename a crash interrupted) is
            // one pool.
            guids.dedup_by_key(|(g, _)| *g);
            match guids.len() {
                0 => {
                    let what = match which {
                        PoolRef::Any => "no pool".to_string(),
                        PoolRef::Name(n) => format!("no pool '{n}'"),
                        PoolRef::Id(g) => format!("no pool of id {:x}", g.0),
                        // Said as before ids were taken, unless it could be one.
                        PoolRef::NameOrId(n) if crate::spa::import::parse_id(n).is_none() => {
                            format!("no pool '{n}'")
                        }
                        PoolRef::NameOrId(n) => format!("no pool named or of id '{n}'"),
                    };
                    let why = if rejected.is_empty() {
                        "no devices given".to_string()
                    } else if rejected.len() <= REJECTED_NAMED_MAX {
                        rejected.join("; ")
                    } else {
                        others.sort();
                        others.dedup();
                        let mut parts = Vec::new();
                        if !others.is_empty() {
                            parts.push(format!("other pools found: {}", others.join(", ")));
                        }
                        parts.extend(damaged.iter().take(REJECTED_NAMED_MAX).cloned());
                        if damaged.len() > REJECTED_NAMED_MAX {
                            parts.push(format!(
                                "{} more with damaged or unreadable labels",
                                damaged.len() - REJECTED_NAMED_MAX
                            ));
                        }
                        if let Some(first) = unlabelled.first() {
                            parts.push(format!(
                                "{} without a pool's label, the first {first}",
                                unlabelled.len()
                            ));
                        }
                        format!("{} devices: {}", rejected.len(), parts.join("; "))
                    };
                    return Err(EngineError::invalid(format!(
                        "{what} on the devices searched ({why})"
                    )));
                }
                1 => {}
                _ => {
                    let names: Vec<String> = guids
                        .iter()
                        .map(|(g, n)| format!("{n} ({:x})", g.0))
                        .collect();
                    // Named alike, they are told apart by id (as `oxpool import` lists them).
                    let how = if name.is_some() {
                        "give the id of the one to import (oxpool import ID [NEWNAME])"
                    } else {
                        "name the one to import"
                    };
                    return Err(EngineError::invalid(format!(
                        "several pools found: {}; {how}",
                        names.join(", ")
                    )));
                }
            }
            crate::spa::import::import_devices(found, opts, new_name).await
        })?;
        let renamed = spa.name != meta.name;
        // The datasets, and their intent logs: records newer than the committed txg are
        // replayed once the pool is up. Every place a log holds is claimed before anything
        // allocates (the sync thread starts after).
        let dsl = Arc::new(Datasets::new(&spa.name, meta.next_volume_id));
        let mut volumes = BTreeMap::new();
        let mut replays = Vec::new();
        block_on(async {
            for vm in &meta.volumes {
                // A replay a crash interrupted: its records are those after the txg it
                // started from, whatever txg a sync committed in its middle (zil::ReplayHold).
                let mut props = vm.props.clone();
                let mut replay_after = meta.txg;
                if let Some(i) = props.iter().position(|(k, _)| k == REPLAY_TXG_KEY) {
                    let (_, v) = props.remove(i);
                    replay_after = v.parse().map(Txg).map_err(|_| {
                        EngineError::invalid(format!(
                            "volume {}: bad {REPLAY_TXG_KEY} '{v}'",
                            vm.name
                        ))
                    })?;
                }
                let p = VolumeProps::from_parts(vm.volsize_bytes, vm.volblocksize_bytes, &props)?;
                // The intent log: records newer than the committed txg are replayed once the
                // pool is up. Every place the log holds (the persisted list, the chain walked,
                // and the in-place blocks its records point at) is claimed now, before anything
                // allocates, and freed once by the replay's sync (see spa/claim.rs).
                let mut walked: Vec<Dva> = Vec::new();
                let mut next_seq = vm.log_first_seq.max(1);
                let mut replaying = false;
                if vm.log_first.asize_bytes > 0 {
                    let replay = read_chain(
                        &spa.zio,
                        spa.guid,
                        vm.id,
                        vm.log_first,
                        vm.log_first_seq,
                        replay_after,
                    )
                    .await;
                    walked.extend(replay.blocks.iter().copied());
                    walked.extend(replay.indirect_blocks.iter().copied());
                    next_seq = replay.end_seq;
                    if !replay.records.is_empty() {
                        replays.push((vm.name.clone(), replay.records));
                        replaying = true;
                    }
                }
                let log_blocks = spa.claim_log_places(&vm.log_reserved, &walked);
                let next_seq = next_seq + crate::zil::SEQ_RESTART_GAP;
                let zil = if replaying {
                    let zil = Zil::new(spa.guid, vm.id, next_seq, Vec::new());
                    zil.hold_for_replay((vm.log_first, vm.log_first_seq), log_blocks, replay_after);
                    Arc::new(zil)
                } else {
                    Arc::new(Zil::new(spa.guid, vm.id, next_seq, log_blocks))
                };
                let data = Object::new(
                    BlockTree::new(vm.levels.max(1), vm.root),
                    vm.volsize_bytes,
                    vm.used_bytes,
                );
                data.compressed_bytes
                    .store(vm.compressed_bytes, Ordering::Relaxed);
                // A version 2 pool has no record: no snapshots, a guid of its own from now.
                let lineage = match meta.datasets.iter().find(|d| d.volume == vm.id) {
                    Some(d) => crate::dsl::table::load_lineage(&spa, d).await?,
                    None => {
                        let mut l = Lineage::new(crate::spa::random_guid(), Txg(0), 0);
                        // No snapshot: every block is born after "none" (txg 0).
                        l.written_bytes = vm.used_bytes;
                        l
                    }
                };
                let ds = Arc::new(Dataset::volume(
                    vm.id,
                    &spa.name,
                    &vm.name,
                    p,
                    data,
                    zil.clone(),
                    lineage,
                ));
                dsl.insert(ds.clone())?;
                volumes.insert(vm.name.clone(), Arc::new(VolumeInner::new(ds, zil)));
            }
            Ok::<(), EngineError>(())
        })?;
        dsl.link_origins();
        *dsl.freeing.lock().unwrap() = crate::dsl::freeing::FreeQueue::from_meta(&meta.freeing);
        if !meta.freeing.is_empty() {
            // Resume draining at once.
            spa.txg.mark_dirty();
        }
        let had_log = volumes
            .values()
            .any(|v| !v.zil.reserved_on_import_is_empty());
        tracing::info!(pool = spa.name, txg = meta.txg.0, "imported");
        let pool = Pool::start(spa, dsl, volumes);
        pool.replay(replays)?;
        if had_log {
            // Commit the replayed changes, then free the old chains, before serving anything.
            // Two syncs: a sync that began before the last record was applied may commit
            // after the replay ends, without it, so the chains stay held (zil::ReplayHold)
            // until a sync that began after the replay has committed.
            pool.sync()?;
            for v in pool.volumes.lock().unwrap().values() {
                v.zil.end_replay();
            }
            pool.sync()?;
        }
        pool.destroy_stale_receives()?;
        // A new name is committed before any label learns it (see `import_as`): the txg
        // writes the metadata with it; the labels follow in `mend_labels`.
        if renamed {
            pool.spa.txg.mark_dirty();
            pool.sync()?;
        }
        // Labels damaged or overwritten since the last import are written again, before a
        // second such incident could leave a device with none; a txg then puts an uberblock
        // into their rings (an import with nothing to write commits none).
        if !pool.spa.mend_labels().is_empty() {
            pool.spa.txg.mark_dirty();
            pool.sync()?;
        }
        // A replacement or spare an export or crash interrupted resilvers again.
        pool.wire_devices();
        // A scan the pool recorded resumes; a device that lacks txgs is resilvered. Not a
        // reason to refuse the import: the devices' ranges are kept, `online` or the next
        // import starts it again.
        if let Err(e) = pool.dsl.scan_import(&pool.spa) {
            tracing::warn!(pool = pool.spa.name, "no scan started at import: {e}");
        }
        Ok(pool)
    }

    /// Applies intent-log records found at import, in order, as ordinary changes.
    fn replay(&self, replays: Replays) -> Result<()> {
        for (name, records) in replays {
            let vol = self.volume(&name)?;
            let n = records.len();
            // A record past the end belongs to a write a shrink overtook: what lies beyond the
            // size is gone with it. (Size changes are durable before they return, and a grow
            // before its space is used, so no acknowledged write is clipped here.)
            let size = vol.size_bytes();
            let clip = |off: u64, len: u64| (off.min(size), len.min(size.saturating_sub(off)));
            block_on(async {
                for r in records {
                    match r {
                        ReplayRecord::Write { offset_bytes, data } => {
                            let (off, len) = clip(offset_bytes, data.len() as u64);
                            vol.write(off, &data[..len as usize], false).await?
                        }
                        ReplayRecord::Free {
                            offset_bytes,
                            length_bytes,
                        } => {
                            let (off, len) = clip(offset_bytes, length_bytes);
                            vol.trim(off, len, false).await?
                        }
                        ReplayRecord::Zero {
                            offset_bytes,
                            length_bytes,
                        } => {
                            let (off, len) = clip(offset_bytes, length_bytes);
                            vol.write_zeroes(off, len, false).await?
                        }
                    }
                }
                Ok::<(), EngineError>(())
            })?;
            tracing::info!(volume = vol.full_name(), records = n, "intent log replayed");
        }
        Ok(())
    }

    /// Intent-log, flush and write-throttle counters since the pool was opened.
    pub fn log_stats(&self) -> LogStats {
        self.spa.pool_stats()
    }

    /// A handle that reads the pool's counters from another thread while the pool is served.
    pub fn counters(&self) -> PoolCounters {
        PoolCounters {
            spa: self.spa.clone(),
            volumes: self.volumes.clone(),
        }
    }

    /// Writes everything dirty, stops the sync thread and closes the pool. A volume handle
    /// that outlives it gets errors from then on: nothing more is written to the devices,
    /// which another process may own next.
    pub fn export(self) -> Result<()> {
        self.export_then(|_| ())
    }

    /// [`Pool::export`], running `last` on the pool once its final sync is done and before
    /// its devices close: what that sync found (write errors, say) is in its counters then,
    /// for a host that keeps them ([`Pool::error_record`]).
    pub fn export_then(mut self, last: impl FnOnce(&Pool)) -> Result<()> {
        self.stop_sync_thread();
        last(&self);
        self.spa.close()
    }

    fn stop_sync_thread(&mut self) {
        // The scrub first: it waits on syncs of its own, and a closed pool has none.
        self.dsl.scan.stop();
        self.spa.txg.stop();
        if let Some(t) = self.sync_thread.take() {
            let _ = t.join();
        }
    }

    /// Destroys the pool: clears every device's labels. The data is gone for oxpool.
    pub fn destroy(mut self) -> Result<()> {
        // Stop without a final sync: nothing of it matters any more.
        self.spa.txg.state.lock().unwrap().suspended = Some("destroyed".into());
        self.stop_sync_thread();
        self.spa.clear_labels()
    }

    /// Adds top-level vdevs to the pool as it runs (see [`Spa::add_vdevs`]).
    pub fn add_vdevs(&self, specs: Vec<TopSpec>, force: bool) -> Result<()> {
        self.spa.add_vdevs(specs, force)
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        &self.spa.name
    }

    /// Pool guid.
    pub fn guid(&self) -> Guid {
        self.spa.guid
    }

    /// Names (paths as opened) of the devices the pool has open, hot spares included.
    pub fn open_device_names(&self) -> Vec<String> {
        self.spa.open_device_names()
    }

    /// [`Pool::open_device_names`], or `None` while a change of the vdev tree is under way:
    /// a change holds the tree's change lock until the devices it drops have had their
    /// labels cleared, so a device absent from the names here is one the pool is done with.
    pub fn open_device_names_settled(&self) -> Option<Vec<String>> {
        let _settled = self.spa.config_change.try_lock().ok()?;
        Some(self.spa.open_device_names())
    }

    /// Paths of the pool's devices as configured (for the cache file).
    pub fn device_paths(&self) -> Vec<String> {
        self.spa.device_paths()
    }

    /// Asks for a sync of everything dirty now and waits until it is durable.
    pub fn sync(&self) -> Result<()> {
        self.spa.sync_now()
    }

    /// Asynchronous [`Pool::sync`], for use inside an executor.
    pub async fn sync_async(&self) -> Result<()> {
        self.spa.sync_async().await
    }

    /// The last durable txg.
    pub fn synced_txg(&self) -> Txg {
        self.spa.synced_txg()
    }

    /// What writers may still fill: the `available` of every volume whose reservation holds
    /// nothing unused ([`Pool::volume_available_bytes`] adds a volume's own); see
    /// [`Spa::available_bytes`](crate::spa::Spa::available_bytes).
    pub fn available_bytes(&self) -> u64 {
        self.spa.available_bytes()
    }

    /// Dirty bytes held in memory.
    pub fn dirty_bytes(&self) -> u64 {
        self.spa.dirty_bytes()
    }

    /// Creates a volume of `size_bytes` with `props` (name=value) set at creation.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        props: &[(String, String)],
    ) -> Result<Volume> {
        check_name("volume", name)?;
        let mut p = VolumeProps::new(size_bytes);
        if props.iter().any(|(k, _)| k == "volsize") {
            return Err(EngineError::invalid("give volsize with --size"));
        }
        VolumeProps::check_new_volsize(size_bytes)?;
        self.set_initial_props(&mut p, props)?;
        p.validate()?;
        self.check_user_props_budget(name, &p)?;
        let _change = (p.refreservation_bytes != 0).then(|| self.reservation_change());
        // Nothing written yet: all of it is held unused. Before the table's lock: the check
        // may wait for syncs.
        self.check_reservation_growth(name, p.refreservation_bytes)?;
        let mut volumes = self.volumes.lock().unwrap();
        if volumes.contains_key(name) {
            return Err(EngineError::Exists(format!("{}/{name}", self.spa.name)));
        }
        let id = VolumeId(self.dsl.next_id());
        let nblocks = size_bytes / p.volblocksize_bytes as u64;
        let data = Object::new(
            BlockTree::new(levels_for(nblocks), BlockPtr::HOLE),
            size_bytes,
            0,
        );
        let zil = Arc::new(Zil::new(self.spa.guid, id, 1, Vec::new()));
        let lineage = Lineage::new(
            crate::spa::random_guid(),
            self.spa.txg.open_txg(),
            snapshot::now_s(),
        );
        let ds = Arc::new(Dataset::volume(
            id,
            &self.spa.name,
            name,
            p,
            data,
            zil.clone(),
            lineage,
        ));
        self.dsl.insert(ds.clone())?;
        self.dsl.update_reservations(&self.spa);
        let vol = Arc::new(VolumeInner::new(ds, zil));
        volumes.insert(name.to_string(), vol.clone());
        self.spa.txg.mark_dirty();
        Ok(Volume {
            pool: self.spa.clone(),
            dsl: self.dsl.clone(),
            vol,
        })
    }

    /// Why [`Pool::destroy_volume`] of `name` would be refused now (no such volume, or it
    /// has snapshots), for a caller that must know before it acts: a served volume leaves
    /// its export table first, disconnecting its clients with `-f`.
    pub fn check_destroy_volume(&self, name: &str) -> Result<()> {
        let known = self.volumes.lock().unwrap().contains_key(name);
        self.volume_destroy_refusal(known, name)
    }

    /// The refusal of a destroy of volume `name` (`known`: in the table of volumes).
    fn volume_destroy_refusal(&self, known: bool, name: &str) -> Result<()> {
        if !known || is_hidden(name) {
            return Err(EngineError::NotFound(format!("{}/{name}", self.spa.name)));
        }
        if let Some(ds) = self.dsl.get(name) {
            let snaps: Vec<String> = {
                let l = ds.lineage.lock().unwrap();
                l.snapshots().iter().map(|s| s.name.clone()).collect()
            };
            if !snaps.is_empty() {
                let (s, them) = if snaps.len() == 1 {
                    ("", "it")
                } else {
                    ("s", "them")
                };
                return Err(EngineError::Busy(format!(
                    "{}/{name} has {} snapshot{s} ({}); destroy {them} first, or use -r",
                    self.spa.name,
                    snaps.len(),
                    snaps.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Destroys a volume; its space is freed by the next sync.
    /// Refused while it has snapshots (destroy them first: `vol destroy -r`).
    pub fn destroy_volume(&self, name: &str) -> Result<()> {
        let mut volumes = self.volumes.lock().unwrap();
        self.volume_destroy_refusal(volumes.contains_key(name), name)?;
        volumes.remove(name);
        let ds = self.dsl.destroy(name)?;
        // Its reservation goes with it (its blocks with the next sync).
        self.dsl.update_reservations(&self.spa);
        self.spa.txg.mark_dirty();
        drop(volumes);
        // A clone's origin marked by `destroy -d` goes with its last clone.
        let origin = ds.lineage.lock().unwrap().origin.clone();
        if let Some(o) = origin {
            let src = self.dsl.all().into_iter().find(|d| d.id == o.volume);
            if let Some(src) = src {
                let snap = {
                    let l = src.lineage.lock().unwrap();
                    l.snapshots()
                        .iter()
                        .find(|s| s.guid == o.snapshot_guid)
                        .map(|s| s.name.clone())
                };
                if let Some(snap) = snap {
                    self.destroy_if_deferred(&src.name(), &snap)?;
                }
            }
        }
        Ok(())
    }

    /// A handle to a volume.
    pub fn volume(&self, name: &str) -> Result<Volume> {
        let vol = self
            .volumes
            .lock()
            .unwrap()
            .get(name)
            .filter(|_| !is_hidden(name))
            .ok_or_else(|| EngineError::NotFound(format!("{}/{name}", self.spa.name)))?
            .clone();
        Ok(Volume {
            pool: self.spa.clone(),
            dsl: self.dsl.clone(),
            vol,
        })
    }

    /// Every volume, by name (not the hidden ones receives write into: `VOL%recv`).
    pub fn volumes(&self) -> Vec<Volume> {
        self.volumes
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| !is_hidden(name))
            .map(|(_, v)| v)
            .map(|v| Volume {
                pool: self.spa.clone(),
                dsl: self.dsl.clone(),
                vol: v.clone(),
            })
            .collect()
    }

    /// Reads a pool property.
    pub fn get_prop(&self, name: &str) -> Result<String> {
        if name == "freeing" {
            // Not a setting: what destroyed snapshots still hold, being freed.
            return Ok(self.dsl.freeing_bytes().to_string());
        }
        self.spa.get_prop(name)
    }

    /// Sets a pool property (persisted by the next sync).
    pub fn set_prop(&self, name: &str, value: &str) -> Result<()> {
        self.spa.set_prop(name, value)
    }

    /// Reads a device property (see [`Spa::get_device_prop`]).
    pub fn get_device_prop(&self, device: &str, name: &str) -> Result<(String, &'static str)> {
        self.spa.get_device_prop(device, name)
    }

    /// Sets a device property (see [`Spa::set_device_prop`]).
    pub fn set_device_prop(&self, device: &str, name: &str, value: &str) -> Result<()> {
        self.spa.set_device_prop(device, name, value)
    }

    /// Sets a volume property. A `volsize` change is durable when this returns (a txg sync);
    /// a shrink frees the blocks past the new end, after every request in flight there is
    /// done (see `Volume::resize`).
    pub fn set_volume_prop(&self, volume: &str, name: &str, value: &str) -> Result<()> {
        let vol = self.volume(volume)?;
        if name == "volsize" {
            let _one_at_a_time = vol.vol.resizing.lock().unwrap();
            return self.resize_reserved(&vol, volume, value);
        }
        if name == "refreservation" {
            return self.set_refreservation(&vol.vol.ds, volume, value);
        }
        {
            // Checked and stored in one step: a concurrent change is not undone.
            if crate::props::is_user_prop(name) {
                // The pool's budget, checked on a copy and not under this volume's lock
                // (summing takes the other volumes'): two changes at once may pass it by a
                // value each, which the per-volume bound keeps small.
                let mut q = vol.props();
                q.set(name, value)?;
                self.check_user_props_budget(volume, &q)?;
            }
            let mut p = vol.vol.ds.props.lock().unwrap();
            let mut q = p.clone();
            q.set(name, value)?;
            q.validate()?;
            *p = q;
            if name == "nbd_allow" {
                // Under the volume's properties lock, so two changes reach the views in the
                // order they reached the volume.
                self.dsl.views_follow_nbd_allow(&vol.vol.ds, &p.nbd_allow);
            }
        }
        self.spa.txg.mark_dirty();
        Ok(())
    }

    /// Removes user property `name` (`module:property`) of `volume` (`oxpool inherit`);
    /// one not set is not an error, as with `zfs inherit`.
    pub fn unset_volume_user_prop(&self, volume: &str, name: &str) -> Result<()> {
        let vol = self.volume(volume)?;
        if vol.vol.ds.props.lock().unwrap().unset_user(name)? {
            self.spa.txg.mark_dirty();
        }
        Ok(())
    }

    /// Checks that volume `volume` (in the pool or not yet) holding `props` in place of what
    /// it holds keeps the pool's user properties within
    /// [`crate::props::USER_PROPS_POOL_BYTES_MAX`] (a change of several checks here first).
    /// Only a change that adds bytes is refused: one that keeps or lowers a volume's is not,
    /// whatever the pool holds.
    pub fn check_user_props_budget(&self, volume: &str, props: &VolumeProps) -> Result<()> {
        let mine = props.user_props_bytes();
        if mine == 0 {
            return Ok(());
        }
        let mut had = 0;
        let mut others = 0;
        for (name, v) in self.volumes.lock().unwrap().iter() {
            let bytes = v.ds.props.lock().unwrap().user_props_bytes();
            match name.as_str() == volume {
                true => had = bytes,
                false => others += bytes,
            }
        }
        if mine > had && others + mine > crate::props::USER_PROPS_POOL_BYTES_MAX {
            return Err(EngineError::invalid(format!(
                "pool {}: its volumes' user properties would take {} bytes, over the pool's \
                 {} (they are rewritten with the pool's metadata)",
                self.spa.name,
                others + mine,
                crate::props::USER_PROPS_POOL_BYTES_MAX
            )));
        }
        Ok(())
    }

    /// Status of the pool and its devices, with its latest scrub.
    pub fn status(&self) -> PoolStatus {
        let scan = self.dsl.scan_status();
        let resilvering = scan.as_ref().is_some_and(|s| {
            s.kind == crate::ScanKind::Resilver && s.state == crate::ScanState::Scanning
        });
        let mut status = self.spa.status(resilvering);
        status.scan = scan;
        status
    }

    /// Takes a device (its path, its guid in hex, or a file name unique in the pool)
    /// offline: it gets no more I/O. `temporary`: until the pool is exported; otherwise
    /// persisted. Refused, with the reason, when its vdev could not give back every block
    /// without it.
    /// The last device of a log vdev goes offline after its log blocks are moved off it:
    /// sync writes wait for the txg meanwhile, and are logged on the data vdevs after.
    pub fn offline(&self, device: &str, temporary: bool) -> Result<()> {
        let dsl = &self.dsl;
        self.spa
            .offline(device, temporary, &|v| dsl.leave_log_vdev(v))
    }

    /// Returns a device to service from OFFLINE, FAULTED or REMOVED. What was written
    /// without it, it lacks (`oxpool status` says so) until the resilver this starts
    /// repairs it.
    pub fn online(&self, device: &str) -> Result<()> {
        self.spa.online(device)?;
        // What it lacks is resilvered at once (nothing, if it lacks nothing).
        self.resilver_start()
    }

    /// Forgets the errors of a device, or of every device: zero counters, no DEGRADED, and a
    /// FAULTED or REMOVED device back in service (an OFFLINE one stays offline).
    pub fn clear(&self, device: Option<&str>) -> Result<()> {
        self.spa.clear(device)
    }

    /// The guid and path of the device `device` names (as [`Pool::offline`] takes it).
    pub fn device(&self, device: &str) -> Result<(Guid, String)> {
        let leaf = self.spa.leaf_named(device)?;
        Ok((leaf.guid, leaf.name().to_string()))
    }

    /// The path of the member of a top-level vdev that `device` names, present or not (an
    /// UNAVAIL device is named by the path the pool recorded for it), as `oxpool replace`
    /// takes its OLD.
    pub fn member_path(&self, device: &str) -> Result<String> {
        let m = self.spa.member_named(device)?;
        Ok(m.leaf
            .as_ref()
            .map_or_else(|| m.config.path.clone(), |l| l.name().to_string()))
    }

    /// Sets a fault injection rule (`oxpool inject`) on its device, from now on. Refused if
    /// the pool has no such device, the rule is not valid, or a rule has its id already.
    pub fn inject_add(&self, rule: InjectRule) -> Result<()> {
        rule.validate().map_err(EngineError::invalid)?;
        if self
            .inject_rules()
            .iter()
            .any(|(_, r)| r.rule.id == rule.id)
        {
            return Err(EngineError::Exists(format!("injection rule {}", rule.id)));
        }
        let leaf = self
            .spa
            .zio
            .vdevs
            .leaves()
            .find(|l| l.guid == rule.device)
            .ok_or_else(|| {
                EngineError::NotFound(format!(
                    "device {:x} in pool '{}'",
                    rule.device.0, self.spa.name
                ))
            })?;
        tracing::info!(device = leaf.name(), id = rule.id, "injection rule set");
        leaf.inject.add(rule);
        Ok(())
    }

    /// Every injection rule, with its device's path and the I/Os it hit, by id.
    pub fn inject_rules(&self) -> Vec<(String, InjectRuleStatus)> {
        let mut out: Vec<(String, InjectRuleStatus)> = self
            .spa
            .zio
            .vdevs
            .leaves()
            .flat_map(|l| {
                l.inject
                    .list()
                    .into_iter()
                    .map(move |r| (l.name().to_string(), r))
            })
            .collect();
        out.sort_by_key(|(_, r)| r.rule.id);
        out
    }

    /// Removes the injection rule `id`, or every rule with None; returns how many went.
    pub fn inject_clear(&self, id: Option<u64>) -> usize {
        self.spa
            .zio
            .vdevs
            .leaves()
            .map(|l| l.inject.remove(id))
            .sum()
    }

    /// Starts a scrub in the background (`oxpool scrub`); refused while one runs.
    pub fn scrub_start(&self) -> Result<()> {
        self.dsl.scrub_start(&self.spa)
    }

    /// Stops a running or paused scrub (`oxpool scrub -s`). A resilver cannot be stopped.
    pub fn scrub_cancel(&self) -> Result<()> {
        self.dsl.scrub_cancel(&self.spa)
    }

    /// Pauses a running scrub (`oxpool scrub -p`); persisted, so it stays paused across an
    /// export. [`Pool::scrub_start`] resumes it from where it stopped. A resilver cannot be
    /// paused.
    pub fn scrub_pause(&self) -> Result<()> {
        self.dsl.scrub_pause(&self.spa)
    }

    /// Starts a resilver of every device in service that lacks txgs (its missed range): it
    /// visits only the blocks born in those txgs and writes each to the devices that lack
    /// it; when it ends clean they lack nothing. Cancels a running scrub; restarts a running
    /// resilver that does not cover what the devices lack now. Does nothing if no device
    /// lacks anything. Called by `online` and at import; also for a new device (replace,
    /// attach, spare) whose missed range is everything written so far.
    pub fn resilver_start(&self) -> Result<()> {
        self.dsl.resilver_start(&self.spa)
    }

    /// The latest scan's status (scrub or resilver), if one ran since the pool was opened
    /// or the pool's record says one ran before.
    pub fn scan_status(&self) -> Option<ScanStatus> {
        self.dsl.scan_status()
    }

    /// Test hook: the scan waits before its next batch once it has visited `blocks` blocks
    /// (0: never), until this is set again or it is stopped; to export or pause a scan at a
    /// known point.
    #[doc(hidden)]
    pub fn scan_hold_after(&self, blocks: u64) {
        self.dsl
            .scan
            .hold_after_blocks
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
    }

    /// Test hook: the scan gathers at most `blocks` data blocks per batch (0: its own
    /// bound), for more batches, and so more persisted positions, in a small pool.
    #[doc(hidden)]
    pub fn scan_batch_blocks(&self, blocks: usize) {
        self.dsl
            .scan
            .batch_blocks_max
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits until the running scan (if any) ends or `limit` passes; returns its status.
    pub fn scan_wait(&self, limit: Duration) -> Option<ScanStatus> {
        self.dsl.scan_wait(limit)
    }

    /// Scrubs the pool and waits for the end: syncs, then reads and verifies every copy of
    /// every block the pool references, rewriting bad copies from good ones. Returns what it
    /// found; an error if it could not finish.
    pub fn scrub(&self) -> Result<ScrubCounts> {
        self.dsl.scrub(&self.spa)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.sync_thread.is_some() {
            // No final sync: as a process exit. Mark suspended so the thread stops at once.
            let mut s = self.spa.txg.state.lock().unwrap();
            if s.suspended.is_none() {
                s.suspended = Some("pool closed without export".into());
            }
            drop(s);
            self.stop_sync_thread();
        }
    }
}
