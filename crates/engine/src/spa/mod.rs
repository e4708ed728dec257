//! The pool (ZFS's "storage pool allocator"): its devices through the pipeline, labels and
//! uberblocks, the vdev configuration, the space allocator and the space check writers pass,
//! import and export, frees and their deferral, and the txg engine, which asks the layer
//! above (the datasets) to write each txg's changes and then commits them.
//!
//! Commit protocol of txg N (the crash argument is in docs/durability.md):
//! 1. the datasets write the txg's new data blocks, then the indirect blocks above them;
//! 2. write the changed space-map chunks and the pool's metadata block (PoolMeta);
//! 3. flush every device;
//! 4. write the uberblock for N into slot N % 32 of every label of every device;
//! 5. flush every device. N is durable; its frees become reusable after N + DEFER_TXGS.
//!
//! Nothing a durable uberblock references is ever overwritten before it is superseded.

pub mod block;
mod claim;
mod config;
mod devices;
pub mod errlog;
pub mod history;
pub mod import;
mod meta;
pub mod space;
pub mod sync;
pub mod txg;

use crate::iostats::LogCounters;
use crate::props::PoolProps;
use crate::spa::sync::sync_txg;
use crate::spa::txg::TxgControl;
use crate::vdev::alloc::Allocator;
use crate::vdev::label::write_labels;
use crate::vdev::{Leaf, VdevTree, TOP_VDEVS_MAX};
use crate::zio::Zio;
use crate::{EngineError, Result};
use oxpool_format::{
    BlockPtr, DeferredFree, Dva, Guid, LabelConfig, LeafConfig, PairKind, TopVdevKind, Txg, VdevId,
    VdevTreeConfig, SECTOR_BYTES,
};
use oxpool_io::rt::block_on;
use oxpool_io::Backend;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use config::{check_name, check_new_pool_name};
pub(crate) use space::effective_dirty_max;

/// One top-level vdev to create: a single device, a mirror of several, or a raidz.
pub struct TopSpec {
    /// Single, mirror or raidz (for raidz only `parity` counts: the rest of the record is
    /// filled in when the vdev is created; see [`TopSpec::raidz`]).
    pub kind: TopVdevKind,
    /// The devices.
    pub devices: Vec<Arc<dyn Backend>>,
    /// A separate intent-log device (holds log blocks only).
    pub log: bool,
}

impl TopSpec {
    /// A single-device vdev on `device`.
    pub fn single(device: Arc<dyn Backend>) -> TopSpec {
        TopSpec {
            kind: TopVdevKind::Single,
            devices: vec![device],
            log: false,
        }
    }

    /// A raidz vdev of `parity` parity columns (1 to 3) over `devices`.
    pub fn raidz(parity: u8, devices: Vec<Arc<dyn Backend>>) -> TopSpec {
        TopSpec {
            kind: TopVdevKind::Raidz(oxpool_format::RaidzConfig {
                parity,
                sector_shift: SECTOR_BYTES.trailing_zeros() as u8,
                epochs: Vec::new(),
            }),
            devices,
            log: false,
        }
    }
}

/// The pool's mutable state, under one lock (control plane and the sync thread; never held
/// across an await).
pub(crate) struct SpaState {
    pub props: PoolProps,
    pub alloc: Allocator,
    /// Current space-map chunk pointers per top-level vdev.
    pub chunk_ptrs: Vec<Vec<BlockPtr>>,
    /// Frees waiting for their txg to be DEFER_TXGS txgs old.
    pub deferred: Vec<DeferredFree>,
    /// The PoolMeta block of the last synced txg (or the index of its pieces).
    pub meta_ptr: BlockPtr,
    /// Every place that PoolMeta occupies (its block, or its index and pieces): freed when
    /// the next one replaces it.
    pub meta_places: Vec<Dva>,
    /// While a scrub reads a batch of blocks: no deferred free of a txg after this one is
    /// released (see `dsl/scan.rs`).
    pub scan_pin: Option<Txg>,
    /// The pool's scan (scrub or resilver) as its next txg records it, under
    /// [`SCAN_RECORD_KEY`] among the pool's properties (`dsl/scan.rs` writes and reads it).
    pub scan_record: Option<String>,
    /// A log device leaving (`oxpool remove`): the first sync that finds nothing allocated
    /// on it makes it a hole (`spa/sync.rs`).
    pub hole_requested: Option<VdevId>,
    /// The leaves of the vdev that sync made a hole, for the remover to clear their labels.
    pub holed: Vec<Arc<crate::vdev::Leaf>>,
    /// Log vdevs imported without their devices (`import -m`), recorded under
    /// [`LOG_DISCARDED_KEY`]: their records were given up, so a later import of the pool
    /// without them needs no `-m` (ZFS keeps such a pool imported; here every command
    /// imports). Until `oxpool remove` makes them holes, or their devices come back.
    pub discarded_logs: Vec<VdevId>,
    /// Log vdevs emptied and taken offline (`Spa::offline_log`), recorded under
    /// [`LOG_EMPTIED_KEY`] in the txg that records their device offline: they hold no
    /// block, so an import needs nothing from them (no `-m` if their devices are gone, and
    /// their offline devices are not taken back). Until `online` returns a device.
    pub emptied_logs: Vec<VdevId>,
}

/// The key of the emptied log vdevs' record among the pool's persisted properties: their
/// ids, comma-separated ([`SpaState::emptied_logs`]).
pub const LOG_EMPTIED_KEY: &str = "log_emptied";

/// The key of the discarded log vdevs' record among the pool's persisted properties: their
/// ids, comma-separated ([`SpaState::discarded_logs`]).
pub const LOG_DISCARDED_KEY: &str = "log_discarded";

/// The key of the scan's record among the pool's persisted properties: the position a
/// scrub or resilver resumes from after an export or a crash.
pub const SCAN_RECORD_KEY: &str = "scan_state";

/// A pool's shared state.
pub(crate) struct Spa {
    pub name: String,
    pub guid: Guid,
    /// The pipeline and what it runs on: vdevs, completion policy, data cache.
    pub zio: Zio,
    pub txg: TxgControl,
    pub state: Mutex<SpaState>,
    /// Intent-log counters (all datasets).
    pub log_counters: LogCounters,
    /// Log space allocated since the last txg sync began (a lot of it kicks a sync, which
    /// trims the chains and frees their blocks).
    pub log_alloc_bytes_since_sync: std::sync::atomic::AtomicU64,
    /// The txg whose sync has placed every block it was charged for (0: none; were txg 0
    /// ever synced, it would count as none, which only borrows less): what the sync
    /// allocates after that (space-map chunks, the PoolMeta) may borrow the slots that txg's
    /// charge kept from other blocks ([`Spa::keep`]).
    pub charged_placed_txg: std::sync::atomic::AtomicU64,
    /// What the datasets' `refreservation`s hold that they have not used (the sum of their
    /// `usedbyrefreservation`, kept by the layer above: `Datasets::update_reservations`):
    /// writers of other datasets may not fill it ([`Spa::wait_for_space`]).
    pub reserved_bytes: std::sync::atomic::AtomicU64,
    /// Log blocks allocated since the pool opened, counted under the state lock: an audit
    /// reads the logs' places, then the allocator, and reads again if this moved between.
    pub log_blocks_allocated: std::sync::atomic::AtomicU64,
    /// Held across a change of the vdev tree (`oxpool add`): one at a time.
    pub config_change: Mutex<()>,
    /// Held by the sync thread while it syncs a txg, and by an audit while it compares the
    /// pool's trees with its allocator: no sync may change either in between.
    pub sync_gate: Mutex<()>,
    /// Scrub batches and the writers waiting for one (see `space.rs`).
    pub scan_batches: space::ScanBatches,
    /// Ranges of volumes whose blocks no copy could give back (`oxpool status -v`).
    pub error_log: errlog::ErrorLog,
    /// The pool's command history (`oxpool history`). Never held across another lock's
    /// acquisition but the state lock's (audit: state, then history).
    pub history: Mutex<history::History>,
    /// Devices present at import but not taken, by guid, with why (a device smaller than
    /// the pool recorded: truncated); `oxpool status` shows it for their UNAVAIL line.
    pub import_refusals: Vec<(Guid, String)>,
}
/// One line of `oxpool status`.
#[derive(Clone, Debug)]
pub struct VdevStatus {
    /// Device path, or `mirror-N` / `raidzP-N` for a group.
    pub name: String,
    /// A leaf: ONLINE, DEGRADED, FAULTED, OFFLINE, REMOVED, or UNAVAIL (not found at
    /// import). A group: ONLINE, DEGRADED (a child is not ONLINE, or lacks txgs), or UNAVAIL
    /// (more children out than its redundancy).
    pub state: String,
    /// Why the leaf is in its state, or what it lacks (None when there is nothing to say).
    pub reason: Option<String>,
    /// Read I/O errors.
    pub read_errors: u64,
    /// Write I/O errors.
    pub write_errors: u64,
    /// Checksum mismatches.
    pub checksum_errors: u64,
    /// Bytes rewritten by self-healing.
    pub repaired_bytes: u64,
    /// Children (for a mirror).
    pub children: Vec<VdevStatus>,
}

/// What `oxpool status` and `oxpool list` show.
#[derive(Clone, Debug)]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// Pool guid.
    pub guid: u64,
    /// ONLINE, DEGRADED (a vdev runs without a child, or one lacks txgs), UNAVAIL (a vdev
    /// lacks more children than its redundancy: some blocks cannot be read), or SUSPENDED.
    pub state: String,
    /// Allocatable bytes.
    pub size_bytes: u64,
    /// Allocated bytes, as ZFS's ALLOC: without what synced txgs freed, which becomes
    /// allocatable again only `DEFER_TXGS` txgs later.
    pub allocated_bytes: u64,
    /// Last durable txg.
    pub txg: u64,
    /// Dirty bytes in memory.
    pub dirty_bytes: u64,
    /// Top-level vdevs that hold data.
    pub vdevs: Vec<VdevStatus>,
    /// Separate intent-log vdevs (`oxpool add POOL log DEV`), shown under `logs` as
    /// `zpool status` does.
    pub logs: Vec<VdevStatus>,
    /// The latest scrub since the pool was opened.
    pub scan: Option<crate::ScanStatus>,
    /// Why the pool is not ONLINE, one line per cause (ZFS's `status:`): which devices are
    /// missing from which vdev, and how many more it can lose. Empty when ONLINE.
    pub reasons: Vec<String>,
    /// Damaged ranges of volumes: blocks no copy could give back (see `spa/errlog.rs`).
    pub damaged: Vec<errlog::DamagedRange>,
    /// Damaged blocks beyond those `damaged` names.
    pub damaged_unnamed_blocks: u64,
    /// The hot spares: AVAIL, INUSE (and for whom) or UNAVAIL.
    pub spares: Vec<crate::vdev::SpareStatus>,
}

impl Spa {
    /// The pool-wide counters: the intent log's and flushes, with the write throttle's.
    pub(crate) fn pool_stats(&self) -> crate::iostats::LogStats {
        let mut stats = self.log_counters.stats();
        self.txg.throttle.fill(&mut stats);
        stats
    }

    /// A new, empty pool on `tops`: labels written, txg 1 (the empty pool's metadata and
    /// first uberblock) synced with `upper`'s part. Refuses devices that belong to a pool
    /// unless `force`.
    pub(crate) fn create(
        name: &str,
        tops: Vec<TopSpec>,
        props: PoolProps,
        force: bool,
        upper: &dyn sync::SyncClient,
    ) -> Result<Arc<Spa>> {
        check_name("pool", name)?;
        check_new_pool_name(name)?;
        if tops.is_empty() {
            return Err(EngineError::invalid("a pool needs at least one device"));
        }
        if tops.len() > TOP_VDEVS_MAX {
            return Err(EngineError::invalid(format!(
                "{} top-level vdevs: a pool has at most {TOP_VDEVS_MAX}",
                tops.len()
            )));
        }
        let pool_guid = random_guid();
        let mut config = VdevTreeConfig {
            top: Vec::new(),
            spares: Vec::new(),
        };
        let mut vdev_tops = Vec::new();
        let mut leaves_to_label = Vec::new();
        for (i, spec) in tops.into_iter().enumerate() {
            let (top, cfg, leaves) = config::prepare_top(VdevId(i as u32), spec, force, Txg(1))?;
            leaves_to_label.extend(leaves.into_iter().map(|(l, g)| (l, g, top.id)));
            config.top.push(cfg);
            vdev_tops.push(top);
        }
        let asizes: Vec<u64> = vdev_tops.iter().map(|t| t.asize_bytes).collect();
        let alloc = Allocator::for_tops(vdev_tops.iter());
        if vdev_tops.iter().all(|t| t.log) {
            return Err(EngineError::invalid(
                "a pool needs a data vdev besides its log devices",
            ));
        }
        let inner = Arc::new(Spa {
            name: name.to_string(),
            guid: pool_guid,
            zio: Zio::new(
                VdevTree::new(vdev_tops),
                props.completion,
                props.data_cache_max_bytes,
            ),
            config_change: Mutex::new(()),
            sync_gate: Mutex::new(()),
            scan_batches: Default::default(),
            error_log: Default::default(),
            history: Mutex::new(history::History::new()),
            import_refusals: Vec::new(),
            txg: TxgControl::new(
                name,
                Txg(0),
                effective_dirty_max(props.dirty_max_bytes, asizes.iter().sum()),
                Duration::from_secs(props.txg_timeout_s),
            ),
            state: Mutex::new(SpaState {
                chunk_ptrs: asizes
                    .iter()
                    .map(|&a| {
                        vec![
                            BlockPtr::HOLE;
                            a.div_ceil(SECTOR_BYTES * oxpool_format::SPACEMAP_CHUNK_SECTORS)
                                as usize
                        ]
                    })
                    .collect(),
                alloc,
                props,
                deferred: Vec::new(),
                meta_ptr: BlockPtr::HOLE,
                meta_places: Vec::new(),
                scan_pin: None,
                scan_record: None,
                hole_requested: None,
                holed: Vec::new(),
                discarded_logs: Vec::new(),
                emptied_logs: Vec::new(),
            }),
            log_counters: LogCounters::default(),
            log_alloc_bytes_since_sync: Default::default(),
            charged_placed_txg: Default::default(),
            reserved_bytes: Default::default(),
            log_blocks_allocated: Default::default(),
        });
        // Before the first I/O (an import's first reads run in `auto`: the properties are
        // on disk).
        apply_scheduler(&inner);
        apply_fault_policy(&inner);
        listen_to_records(&inner);
        block_on(async {
            for (leaf, guid, top) in &leaves_to_label {
                let cfg = LabelConfig {
                    pool_guid,
                    pool_name: name.to_string(),
                    leaf_guid: *guid,
                    top: *top,
                    create_txg: Txg(1),
                    tree: config.clone(),
                };
                write_labels(leaf.backend.as_ref(), &cfg).await?;
            }
            Ok::<(), EngineError>(())
        })?;
        // Txg 1 writes the empty pool's metadata and first uberblock.
        let txg = inner.txg.next_after_create();
        let r = block_on(sync_txg(&inner, upper, txg));
        inner.txg.finish_sync(txg, &r);
        r?;
        Ok(inner)
    }

    /// Writes everything dirty, stops the sync thread and closes the pool. A volume handle
    /// that outlives it gets errors from then on: nothing more is written to the devices,
    /// which another process may own next.
    pub(crate) fn close(&self) -> Result<()> {
        let mut s = self.txg.state.lock().unwrap();
        let result = match &s.suspended {
            Some(r) => Err(EngineError::Suspended {
                pool: self.name.clone(),
                reason: r.clone(),
            }),
            None => Ok(()),
        };
        s.suspended.get_or_insert_with(|| "exported".into());
        result
    }

    /// Clears every device's labels (the pool is destroyed; its sync thread has stopped).
    pub(crate) fn clear_labels(&self) -> Result<()> {
        block_on(async {
            // The hot spares too: a spare left labelled would name a pool that is gone, and
            // another pool could not take it without -f.
            let vdevs = &self.zio.vdevs;
            let members: Vec<Guid> = vdevs.leaves().map(|l| l.guid).collect();
            for leaf in vdevs.leaves() {
                crate::vdev::label::clear_labels(leaf.backend.as_ref()).await?;
            }
            // Best effort for a spare not in use: the pool is gone once its members' labels
            // are (a spare's failure must not leave it half destroyed and still listed).
            for spare in vdevs.spare_leaves() {
                if members.contains(&spare.guid) {
                    continue;
                }
                if let Err(e) = crate::vdev::label::clear_labels(spare.backend.as_ref()).await {
                    tracing::warn!(
                        device = spare.name(),
                        "clearing the hot spare's labels: {e}"
                    );
                }
            }
            Ok(())
        })
    }

    /// Adds top-level vdevs, e.g. a separate log device (`oxpool add POOL log PATH`), to the
    /// pool as it runs: volumes keep serving throughout. In order, so that a crash at any
    /// point leaves a pool that imports with or without the new vdevs, never with a block on
    /// a vdev its configuration lacks:
    /// 1. the new devices get labels naming the tree with them (import finds them, and
    ///    ignores vdevs the pool's metadata does not list);
    /// 2. the vdevs join the tree and the allocator, which places nothing on them yet
    ///    ([`crate::vdev::alloc::VdevRole::Pending`]): not even an intent-log block, which would be lost with
    ///    the acknowledged writes it holds if the pool crashed before step 3;
    /// 3. a txg records the new tree in the pool's metadata; once durable, the allocator may
    ///    use them;
    /// 4. the old devices' labels learn the new tree.
    pub fn add_vdevs(&self, specs: Vec<TopSpec>, force: bool) -> Result<()> {
        if specs.is_empty() {
            return Ok(());
        }
        let inner = self;
        let _one_change = inner.config_change.lock().unwrap();
        let base = inner.zio.vdevs.top_count();
        if base + specs.len() > TOP_VDEVS_MAX {
            // Holes keep their index for good (their reuse is not written yet): say so, or
            // the count would not match what status shows.
            let holes = inner.zio.vdevs.tops().filter(|t| t.is_hole()).count();
            return Err(EngineError::invalid(format!(
                "pool '{}' would have {} top-level vdevs; at most {TOP_VDEVS_MAX}{}",
                inner.name,
                base + specs.len(),
                if holes > 0 {
                    format!(
                        " ({holes} of them are the places of removed log devices, which are \
                         not reused)"
                    )
                } else {
                    String::new()
                }
            )));
        }
        // As `zpool add`: a single device beside mirrors or raidz would leave data with no
        // redundancy.
        let mirrored = inner
            .zio
            .vdevs
            .tops()
            .any(|t| !t.log && !matches!(t.kind(), TopVdevKind::Single | TopVdevKind::Hole));
        let single_data = specs
            .iter()
            .any(|s| !s.log && s.kind == TopVdevKind::Single);
        if mirrored && single_data && !force {
            return Err(EngineError::invalid(format!(
                "mismatched replication level: pool '{}' is redundant and a single device would \
                 have no redundancy (-f adds it anyway)",
                inner.name
            )));
        }
        let mut new_tops = Vec::new();
        let mut new_leaves = Vec::new();
        let mut config = inner.zio.vdevs.config();
        for (i, spec) in specs.into_iter().enumerate() {
            let first_txg = Txg(inner.txg.synced().0 + 1);
            let (top, cfg, leaves) =
                config::prepare_top(VdevId((base + i) as u32), spec, force, first_txg)?;
            new_leaves.extend(leaves.into_iter().map(|(l, g)| (l, g, top.id)));
            config.top.push(cfg);
            new_tops.push(top);
        }
        // A device named twice, or already in the pool, would be two vdevs on one disk.
        for (leaf, _, _) in &new_leaves {
            let name = leaf.name();
            let twice = new_leaves
                .iter()
                .filter(|(l, _, _)| l.name() == name)
                .count()
                > 1;
            if twice || inner.zio.vdevs.leaves().any(|l| l.name() == name) {
                return Err(EngineError::invalid(format!(
                    "{name} is named twice or already in pool '{}'",
                    inner.name
                )));
            }
        }
        self.sync_now()?;
        let synced = inner.txg.synced();
        let label = |leaf_guid: Guid, top: VdevId| LabelConfig {
            pool_guid: inner.guid,
            pool_name: inner.name.clone(),
            leaf_guid,
            top,
            create_txg: Txg(synced.0 + 1),
            tree: config.clone(),
        };
        block_on(async {
            for (leaf, guid, top) in &new_leaves {
                write_labels(leaf.backend.as_ref(), &label(*guid, *top)).await?;
            }
            Ok::<(), EngineError>(())
        })?;
        let mut added = Vec::new();
        {
            // Tree, allocator and space-map chunks change together: a sync sees all or none.
            let mut s = inner.state.lock().unwrap();
            for top in new_tops {
                let chunks = top
                    .asize_bytes
                    .div_ceil(SECTOR_BYTES * oxpool_format::SPACEMAP_CHUNK_SECTORS)
                    as usize;
                let id = s.alloc.add_vdev(top.asize_bytes, top.log);
                debug_assert_eq!(id, top.id);
                if let Some(layout) = top.raidz_layout() {
                    s.alloc.map_mut(id).set_raidz(layout);
                }
                s.chunk_ptrs.push(vec![BlockPtr::HOLE; chunks]);
                inner
                    .zio
                    .vdevs
                    .push(top)
                    .map_err(|_| EngineError::invalid("the vdev tree is full"))?;
                added.push(id);
            }
        }
        apply_scheduler(inner);
        inner.txg.mark_dirty();
        self.sync_now()?;
        {
            let mut s = inner.state.lock().unwrap();
            for id in added {
                s.alloc.activate(id);
            }
            // More data space: a larger share of it may be dirty.
            inner.txg.configure(
                effective_dirty_max(s.props.dirty_max_bytes, s.alloc.totals_bytes().0),
                Duration::from_secs(s.props.txg_timeout_s),
            );
        }
        let skip: Vec<Arc<Leaf>> = new_leaves.iter().map(|(l, _, _)| l.clone()).collect();
        self.relabel(&config, &skip)
    }

    /// The leaves whose labels name the pool, with the vdev each label names: the top-level
    /// vdevs' leaves in service and the hot spares ([`SPARE_TOP`]; a spare in use once, as
    /// its vdev's).
    ///
    /// [`SPARE_TOP`]: oxpool_format::SPARE_TOP
    fn labelled_leaves(&self) -> Vec<(Arc<Leaf>, VdevId)> {
        let mut leaves: Vec<(Arc<Leaf>, VdevId)> = Vec::new();
        for top in self.zio.vdevs.tops() {
            leaves.extend(top.leaves_in_service().map(|l| (l, top.id)));
        }
        for spare in self.zio.vdevs.spare_leaves() {
            if !leaves.iter().any(|(l, _)| Arc::ptr_eq(l, &spare)) {
                leaves.push((spare, oxpool_format::SPARE_TOP));
            }
        }
        leaves
    }

    /// The label configuration of leaf `leaf_guid` (of top-level vdev `top`) holding the
    /// tree `config`, written for `create_txg` (one txg for all of a rewrite's leaves).
    fn label_config(
        &self,
        (leaf_guid, top): (Guid, VdevId),
        config: &VdevTreeConfig,
        create_txg: Txg,
    ) -> LabelConfig {
        LabelConfig {
            pool_guid: self.guid,
            pool_name: self.name.clone(),
            leaf_guid,
            top,
            create_txg,
            tree: config.clone(),
        }
    }

    /// Rewrites the configuration half of each label of a device in service (or hot spare)
    /// that does not hold this pool's configuration of it: damaged, unreadable, or
    /// overwritten. Import calls it, as ZFS rewrites its labels at import: otherwise a
    /// device whose first labels were damaged imports and serves on the others, and a second
    /// such incident makes the pool unimportable. Only the bad labels are written, so a crash
    /// meanwhile leaves the good ones; their uberblock rings fill again with the next txg,
    /// which the caller commits. A label overwritten by another tool is rewritten too, as
    /// ZFS does: the device is this pool's by its other labels, and the pool writes its data
    /// all over it anyway. A label of this pool that names it otherwise (`oxpool import POOL
    /// NEWNAME`, or one a crash interrupted) is rewritten with the pool's name, the even
    /// labels before the odd ones, so that the device stays findable by one name or the
    /// other at every instant. Returns the devices mended with the labels that were bad; a
    /// device that cannot be written is warned about and left (its other labels still find
    /// it).
    pub(crate) fn mend_labels(&self) -> Vec<(String, Vec<usize>)> {
        let leaves = self.labelled_leaves();
        let config = self.zio.vdevs.config();
        let create_txg = Txg(self.txg.synced().0 + 1);
        block_on(async {
            let mut mended = Vec::new();
            // Bounded by the pool's devices.
            for (leaf, top) in leaves {
                if !leaf.health.in_service() {
                    continue;
                }
                let dev = leaf.backend.as_ref();
                let to_mend =
                    crate::vdev::label::labels_to_mend(dev, self.guid, leaf.guid, &self.name).await;
                if to_mend.is_empty() {
                    continue;
                }
                let bad = to_mend.all();
                let cfg = self.label_config((leaf.guid, top), &config, create_txg);
                match crate::vdev::label::mend_labels(dev, &cfg, &to_mend).await {
                    Ok(()) => {
                        // Damage is worth a warning; a name caught up with is a rename's
                        // normal end (or the end of one a crash interrupted).
                        if to_mend.damaged.is_empty() {
                            tracing::info!(
                                pool = self.name,
                                device = leaf.name(),
                                "labels {bad:?} named the pool otherwise: renamed"
                            );
                        } else {
                            tracing::warn!(
                                pool = self.name,
                                device = leaf.name(),
                                "labels {bad:?} did not hold this pool's configuration: \
                                 rewritten"
                            );
                        }
                        mended.push((leaf.name().to_string(), bad));
                    }
                    Err(e) => tracing::warn!(
                        pool = self.name,
                        device = leaf.name(),
                        "labels {bad:?} are damaged and could not be rewritten: {e}"
                    ),
                }
            }
            mended
        })
    }

    /// Writes the tree `config` into the label configs of every leaf in service (and of the
    /// hot spares), but those in `skip` (whose whole labels were just written). A leaf out
    /// of service gets no I/O; its labels keep the old tree (import takes the pool's
    /// metadata as the truth, labels only find the devices).
    pub(crate) fn relabel(&self, config: &VdevTreeConfig, skip: &[Arc<Leaf>]) -> Result<()> {
        let targets = self.labelled_leaves();
        let create_txg = Txg(self.txg.synced().0 + 1);
        block_on(async {
            for (leaf, top) in targets {
                if skip.iter().any(|s| Arc::ptr_eq(s, &leaf)) || !leaf.health.in_service() {
                    continue;
                }
                let cfg = self.label_config((leaf.guid, top), config, create_txg);
                crate::vdev::label::update_label_config(leaf.backend.as_ref(), &cfg).await?;
            }
            Ok::<(), EngineError>(())
        })
    }

    /// Names (paths as opened) of the devices the pool has open: the top-level vdevs' leaves
    /// and the hot spares not in use (a spare in use is a leaf already), so that a caller
    /// keeping their files locked keeps every one the pool may write.
    pub fn open_device_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .zio
            .vdevs
            .leaves()
            .map(|l| l.name().to_string())
            .collect();
        for spare in self.zio.vdevs.spare_leaves() {
            if !names.iter().any(|n| n == spare.name()) {
                names.push(spare.name().to_string());
            }
        }
        names
    }

    /// Paths of the pool's devices (for the cache file): where each present one was opened,
    /// else as configured; each once (a hot spare in use is both a pair's member and a
    /// spare).
    pub fn device_paths(&self) -> Vec<String> {
        // Where a device is now: import may have found it at another path (`import -d` of
        // a directory it was moved to) than the one the tree recorded.
        let member_path = |m: &crate::vdev::Member| {
            m.leaf
                .as_ref()
                .map_or_else(|| m.config.path.clone(), |l| l.name().to_string())
        };
        let mut paths: Vec<String> = Vec::new();
        let all = self
            .zio
            .vdevs
            .tops()
            .flat_map(|t| {
                t.shape()
                    .children
                    .iter()
                    .flat_map(|c| c.members().map(member_path))
                    .collect::<Vec<_>>()
            })
            .chain(
                self.zio
                    .vdevs
                    .spare_members()
                    .into_iter()
                    .map(|m| member_path(&m)),
            );
        for p in all {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
        paths
    }

    /// Asks for a sync of everything dirty now and waits until it is durable.
    pub fn sync_now(&self) -> Result<()> {
        let open = self.txg.mark_dirty_open();
        block_on(self.txg.wait_synced(open, true))
    }

    /// Asynchronous [`Spa::sync_now`], for use inside an executor.
    pub async fn sync_async(&self) -> Result<()> {
        let open = self.txg.mark_dirty_open();
        self.txg.wait_synced(open, true).await
    }

    /// The last durable txg.
    pub fn synced_txg(&self) -> Txg {
        self.txg.synced()
    }

    /// Dirty bytes held in memory.
    pub fn dirty_bytes(&self) -> u64 {
        self.txg.dirty_bytes()
    }

    /// Reads a pool property.
    pub fn get_prop(&self, name: &str) -> Result<String> {
        self.state.lock().unwrap().props.get(name)
    }

    /// Sets a pool property (persisted by the next sync).
    pub fn set_prop(&self, name: &str, value: &str) -> Result<()> {
        let mut s = self.state.lock().unwrap();
        s.props.set(name, value)?;
        self.zio
            .data_cache
            .set_max_bytes(s.props.data_cache_max_bytes);
        self.zio.completion.set(s.props.completion);
        self.txg.configure(
            effective_dirty_max(s.props.dirty_max_bytes, s.alloc.totals_bytes().0),
            Duration::from_secs(s.props.txg_timeout_s),
        );
        self.txg.mark_dirty();
        drop(s);
        apply_scheduler(self);
        apply_fault_policy(self);
        Ok(())
    }

    /// The present leaf named `device`: its path, its guid in hex, or a file name only one
    /// of the pool's device paths ends with.
    pub(crate) fn leaf_named(&self, device: &str) -> Result<Arc<Leaf>> {
        let exact = self
            .zio
            .vdevs
            .leaves()
            .find(|l| l.name() == device || format!("{:x}", l.guid.0) == device);
        if let Some(l) = exact {
            return Ok(l.clone());
        }
        let tail = format!("/{device}");
        let by_tail: Vec<Arc<Leaf>> = self
            .zio
            .vdevs
            .leaves()
            .filter(|l| !device.contains('/') && l.name().ends_with(&tail))
            .collect();
        match by_tail.as_slice() {
            [one] => Ok(one.clone()),
            [] => {
                let absent = self.zio.vdevs.tops().any(|t| {
                    t.shape()
                        .children
                        .iter()
                        .flat_map(|c| c.members())
                        .any(|m| m.leaf.is_none() && m.config.path.ends_with(device))
                });
                Err(EngineError::NotFound(if absent {
                    format!(
                        "device '{device}' of pool '{}': it was not found at import (if it \
                         is back, `oxpool export` and `oxpool import -d DIR` open it)",
                        self.name
                    )
                } else {
                    format!("device '{device}' in pool '{}'", self.name)
                }))
            }
            several => Err(EngineError::invalid(format!(
                "'{device}' names {} devices of pool '{}' ({}): give the path",
                several.len(),
                self.name,
                several
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Takes a device offline (`oxpool offline`; `temporary`: until export). Refused, with
    /// the reason, when its vdev could not give back every block without it. Persisted by
    /// the next sync.
    /// The last device in service of a log vdev is taken offline once its log blocks are
    /// moved off it ([`Spa::offline_log`]; `leave` has the intent logs abandon their chains
    /// there).
    pub fn offline(&self, device: &str, temporary: bool, leave: &dyn Fn(VdevId)) -> Result<()> {
        let leaf = self.leaf_named(device)?;
        if self.log_vdev_lost_with(&leaf).is_some() {
            return self.offline_log(&leaf, temporary, leave);
        }
        self.zio.vdevs.offline(&leaf, temporary)?;
        self.txg.mark_dirty();
        Ok(())
    }

    /// Returns a device to service (`oxpool online`): from OFFLINE, FAULTED or REMOVED. A log
    /// vdev that was out of service takes log blocks again ([`Spa::return_log_device`]).
    pub fn online(&self, device: &str) -> Result<()> {
        let leaf = self.leaf_named(device)?;
        if self.return_log_device(&leaf, &|l| self.zio.vdevs.online(l))? {
            return Ok(());
        }
        self.zio.vdevs.online(&leaf);
        self.txg.mark_dirty();
        Ok(())
    }

    /// Forgets the errors of one device or of all (`oxpool clear`): counters, DEGRADED, and
    /// FAULTED or REMOVED devices return to service.
    pub fn clear(&self, device: Option<&str>) -> Result<()> {
        let leaves: Vec<Arc<Leaf>> = match device {
            Some(d) => vec![self.leaf_named(d)?],
            None => {
                // The counts of the hot spares not in use too (no tree leaf); only the counts:
                // a REMOVED spare stays out until its device is seen again.
                let vdevs = &self.zio.vdevs;
                let all: Vec<Arc<Leaf>> = vdevs.leaves().collect();
                for s in vdevs.spare_leaves() {
                    if !all.iter().any(|l| l.guid == s.guid) {
                        s.counters.zero();
                    }
                }
                all
            }
        };
        for leaf in &leaves {
            if !self.return_log_device(leaf, &|l| self.zio.vdevs.clear(l))? {
                self.zio.vdevs.clear(leaf);
            }
        }
        self.txg.mark_dirty();
        Ok(())
    }

    /// Reads a device property (`scheduler`): the device's effective value and whether it is
    /// the device's own setting (`local`) or the pool's (`default`).
    pub fn get_device_prop(&self, device: &str, name: &str) -> Result<(String, &'static str)> {
        let leaf = self.leaf_named(device)?;
        if name != "scheduler" {
            return Err(EngineError::invalid(format!(
                "unknown device property '{name}' (device properties: scheduler)"
            )));
        }
        let s = self.state.lock().unwrap();
        let source = if s.props.scheduler_by_device.contains_key(&leaf.guid) {
            "local"
        } else {
            "default"
        };
        Ok((
            s.props.device_scheduler(leaf.guid).as_str().to_string(),
            source,
        ))
    }

    /// Sets a device property (`scheduler=auto|on|off|inherit`; persisted by the next sync,
    /// effective at once).
    pub fn set_device_prop(&self, device: &str, name: &str, value: &str) -> Result<()> {
        let leaf = self.leaf_named(device)?;
        self.state
            .lock()
            .unwrap()
            .props
            .set_device(leaf.guid, name, value)?;
        self.txg.mark_dirty();
        apply_scheduler(self);
        Ok(())
    }

    /// The data vdevs' size and ALLOC. As ZFS counts ALLOC: what a synced txg freed is not
    /// allocated, though it becomes allocatable only `DEFER_TXGS` txgs later, and an idle
    /// pool syncs none (a destroy's space showed only after later writes). The space check
    /// still counts it as taken.
    pub fn size_and_alloc_bytes(&self) -> (u64, u64) {
        let s = self.state.lock().unwrap();
        let (size, allocated) = s.alloc.totals_bytes();
        let roles = s.alloc.roles();
        let deferred: u64 = s
            .deferred
            .iter()
            .flat_map(|d| &d.dvas)
            .filter(|dva| {
                roles.get(dva.vdev.0 as usize) == Some(&crate::vdev::alloc::VdevRole::Data)
            })
            .map(|dva| u64::from(dva.asize_bytes))
            .sum();
        debug_assert!(
            deferred <= allocated,
            "deferred frees of unallocated places"
        );
        (size, allocated.saturating_sub(deferred))
    }

    /// Status of the pool and its devices; `resilvering`: a resilver is under way (it, not a
    /// scrub, which is refused meanwhile, repairs what devices lack).
    pub fn status(&self, resilvering: bool) -> PoolStatus {
        let (size, allocated) = self.size_and_alloc_bytes();
        let suspended = self.txg.state.lock().unwrap().suspended.is_some();
        let counts = |l: &Leaf| {
            let c = l.counters.snapshot();
            (c.read, c.write, c.checksum, c.repaired_bytes)
        };
        let leaf_status = |l: &Option<Arc<Leaf>>, cfg: &LeafConfig| match l {
            Some(l) => {
                let (r, w, c, rep) = counts(l);
                let state = l.health.state();
                let missed = l.health.missed().filter(|_| state.in_service());
                // What repairs it, in the words of the pool's status line below.
                let repair = if resilvering {
                    "the resilver under way repairs them"
                } else {
                    "a scrub repairs them"
                };
                let reason = match (l.health.reason(), missed) {
                    (why, None) => why,
                    (why, Some((f, t))) => Some(format!(
                        "{}lacks the blocks of txgs {}-{} (out of service or failed writes); \
                         {repair}",
                        why.map(|w| format!("{w}; ")).unwrap_or_default(),
                        f.0,
                        t.0
                    )),
                };
                VdevStatus {
                    name: l.name().to_string(),
                    state: state.as_str().into(),
                    reason,
                    read_errors: r,
                    write_errors: w,
                    checksum_errors: c,
                    repaired_bytes: rep,
                    children: vec![],
                }
            }
            None => VdevStatus {
                name: cfg.path.clone(),
                state: "UNAVAIL".into(),
                reason: Some(
                    self.import_refusals
                        .iter()
                        .find(|(g, _)| *g == cfg.guid)
                        .map_or_else(|| "not found at import".into(), |(_, why)| why.clone()),
                ),
                read_errors: 0,
                write_errors: 0,
                checksum_errors: 0,
                repaired_bytes: 0,
                children: vec![],
            },
        };
        let mut degraded = false;
        let mut unavail_any = false;
        let mut reasons = Vec::new();
        let (logs, vdevs): (Vec<_>, Vec<_>) = self
            .zio
            .vdevs
            .tops()
            .filter(|t| !t.is_hole())
            .map(|t| {
                let shape = t.shape();
                // A pair shows as a group of its two members, as ZFS's `replacing-N` and
                // `spare-N`: ONLINE once a member lacks nothing, DEGRADED until then.
                let kids: Vec<VdevStatus> = shape
                    .children
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let old = leaf_status(&c.old.leaf, &c.old.config);
                        match &c.new {
                            None => old,
                            Some((kind, m)) => VdevStatus {
                                name: match kind {
                                    PairKind::Replacing => format!("replacing-{i}"),
                                    PairKind::Spare => format!("spare-{i}"),
                                },
                                // DEGRADED until the pair is resolved (as ZFS): a member
                                // lacks blocks, or one is out (a spare stands in).
                                state: if c.whole()
                                    && c.members().all(|m| {
                                        m.leaf.as_ref().is_some_and(|l| {
                                            l.health.state() == crate::vdev::LeafState::Online
                                        })
                                    })
                                    && *kind == PairKind::Replacing
                                {
                                    "ONLINE"
                                } else {
                                    "DEGRADED"
                                }
                                .into(),
                                reason: None,
                                read_errors: 0,
                                write_errors: 0,
                                checksum_errors: 0,
                                repaired_bytes: 0,
                                children: vec![old, leaf_status(&m.leaf, &m.config)],
                            },
                        }
                    })
                    .collect();
                let out: Vec<&VdevStatus> = kids
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| shape.child_in_service(*i).is_none())
                    .map(|(_, k)| k)
                    .collect();
                let lacking: Vec<&VdevStatus> = kids
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| {
                        shape.child_in_service(*i).is_some() && !shape.children[*i].whole()
                    })
                    .map(|(_, k)| k)
                    .collect();
                let not_online = kids.iter().any(|k| k.state != "ONLINE");
                let tolerated = shape.redundancy();
                let unavail = out.len() > tolerated;
                // Without its log device the pool runs on: sync writes are logged on the
                // data vdevs (or wait for the txg).
                degraded |= not_online || !lacking.is_empty() || unavail && t.log;
                unavail_any |= unavail && !t.log;
                let vdev = t.group_name().unwrap_or_else(|| kids[0].name.clone());
                if unavail && t.log {
                    // A single log device is its vdev: named once.
                    let which = match t.group_name() {
                        Some(_) => {
                            let names: Vec<&str> = out.iter().map(|k| k.name.as_str()).collect();
                            format!("{vdev}: {}", names.join(", "))
                        }
                        None => vdev.clone(),
                    };
                    // Taken offline: `online` returns it (it holds nothing meanwhile).
                    let back = if out.iter().all(|k| k.state == "OFFLINE") {
                        let names: Vec<&str> = out.iter().map(|k| k.name.as_str()).collect();
                        format!("`oxpool online {} {}` returns it; ", self.name, names[0])
                    } else {
                        String::new()
                    };
                    reasons.push(format!(
                        "log {which} out of service; the pool runs on without it (sync \
                         writes are logged on the data vdevs or wait for the txg). {back}\
                         `oxpool remove {} {vdev}` takes it out of the pool",
                        self.name
                    ));
                } else if !out.is_empty() {
                    let names: Vec<String> = out
                        .iter()
                        .map(|k| format!("{} {}", k.name, k.state))
                        .collect();
                    reasons.push(if unavail {
                        format!(
                            "{vdev}: {} of its devices out of service ({}), more than it can lose \
                             ({tolerated}): blocks on it cannot be read",
                            out.len(),
                            names.join(", ")
                        )
                    } else {
                        format!(
                            "{vdev}: {} of its devices out of service ({}); it runs from its \
                             redundancy and can lose {} more",
                            out.len(),
                            names.join(", "),
                            tolerated.saturating_sub(out.len() + lacking.len())
                        )
                    });
                }
                if !lacking.is_empty() {
                    let names: Vec<&str> = lacking.iter().map(|k| k.name.as_str()).collect();
                    let repair = if resilvering {
                        "the resilver under way repairs them".to_string()
                    } else {
                        format!("`oxpool scrub {}` repairs them", self.name)
                    };
                    // A single device is its vdev: named once.
                    let prefix = match t.group_name() {
                        Some(_) => format!("{vdev}: "),
                        None => String::new(),
                    };
                    reasons.push(format!(
                        "{prefix}{} lacks blocks written while it was out of service or \
                         whose writes failed; {repair}",
                        names.join(", "),
                    ));
                }
                for c in shape.children.iter() {
                    match &c.new {
                        Some((PairKind::Replacing, m)) => reasons.push(format!(
                            "{vdev}: {} is replacing {}; the old device is detached once the \
                             new one is resilvered",
                            m.config.path, c.old.config.path
                        )),
                        Some((PairKind::Spare, m)) => reasons.push(format!(
                            "{vdev}: hot spare {} stands in for {}; `oxpool replace {} {} NEW` \
                             ends it (or `oxpool detach {} {}`)",
                            m.config.path,
                            c.old.config.path,
                            self.name,
                            c.old.config.path,
                            self.name,
                            m.config.path
                        )),
                        None => {}
                    }
                }
                for k in kids
                    .iter()
                    .filter(|k| k.state == "DEGRADED" && k.children.is_empty())
                {
                    reasons.push(format!(
                        "{}: DEGRADED: {}; `oxpool clear {} {}` once it is fixed",
                        k.name,
                        k.reason.as_deref().unwrap_or("too many errors"),
                        self.name,
                        k.name
                    ));
                }
                let status = match t.group_name() {
                    None => kids.into_iter().next().unwrap(),
                    Some(name) => VdevStatus {
                        name,
                        state: if unavail {
                            "UNAVAIL"
                        } else if not_online || !lacking.is_empty() {
                            "DEGRADED"
                        } else {
                            "ONLINE"
                        }
                        .into(),
                        reason: None,
                        read_errors: 0,
                        write_errors: 0,
                        checksum_errors: 0,
                        repaired_bytes: 0,
                        children: kids,
                    },
                };
                (t.log, status)
            })
            .partition(|(log, _)| *log);
        let strip = |v: Vec<(bool, VdevStatus)>| v.into_iter().map(|(_, s)| s).collect();
        let (logs, vdevs) = (strip(logs), strip(vdevs));
        let (damaged, damaged_unnamed_blocks) = self.error_log.ranges();
        PoolStatus {
            name: self.name.clone(),
            guid: self.guid.0,
            state: if suspended {
                "SUSPENDED"
            } else if unavail_any {
                "UNAVAIL"
            } else if degraded {
                "DEGRADED"
            } else {
                "ONLINE"
            }
            .into(),
            size_bytes: size,
            allocated_bytes: allocated,
            txg: self.txg.synced().0,
            dirty_bytes: self.txg.dirty_bytes(),
            vdevs,
            logs,
            scan: None,
            reasons,
            damaged,
            damaged_unnamed_blocks,
            spares: self.zio.vdevs.spare_status(),
        }
    }
}

/// Sets every leaf's vdev queue mode from the pool's properties.
pub(crate) fn apply_scheduler(inner: &Spa) {
    let s = inner.state.lock().unwrap();
    for leaf in inner.zio.vdevs.leaves() {
        leaf.queue.set_mode(s.props.device_scheduler(leaf.guid));
    }
}

/// Has a device state change that the tree makes on its own (a fault, a failed write) mark
/// the open txg dirty: the next sync records it (`vdev/states.rs`); and the txg engine tell
/// the tree when a txg closes (`VdevTree::last_written`).
pub(crate) fn listen_to_records(inner: &Arc<Spa>) {
    // The tree's missed ranges reach the open txg from the moment a txg closes.
    let _ = inner.txg.closed.set(inner.zio.vdevs.sync_started_handle());
    let weak = Arc::downgrade(inner);
    inner.zio.vdevs.on_record_change.set(Box::new(move || {
        if let Some(spa) = weak.upgrade() {
            spa.txg.mark_dirty();
        }
    }));
}

/// Sets the fault rule from the pool's properties (`fault_errors`, `fault_window`).
pub(crate) fn apply_fault_policy(inner: &Spa) {
    let s = inner.state.lock().unwrap();
    inner
        .zio
        .vdevs
        .fault_policy
        .set(s.props.fault_errors, s.props.fault_window_s);
}

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(crate) fn random_guid() -> Guid {
    // Bounded: a zero from the kernel's generator twice in a row does not happen.
    for _ in 0..8 {
        let mut g = [0u8; 8];
        // SAFETY: getrandom writes at most `g.len()` bytes into the valid buffer.
        let n = unsafe { libc::getrandom(g.as_mut_ptr().cast(), g.len(), 0) };
        let v = u64::from_le_bytes(g);
        if n == 8 && v != 0 {
            return Guid(v);
        }
    }
    panic!("getrandom failed to produce a guid")
}

impl TxgControl {
    /// Closes txg 1 of a new pool for its first sync.
    fn next_after_create(&self) -> Txg {
        let mut s = self.state.lock().unwrap();
        let t = s.open;
        s.open = Txg(t.0 + 1);
        s.syncing = Some(t);
        t
    }
}
