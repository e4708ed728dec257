//! Pools: create, import, export, destroy; volumes and properties; the txg sync.
//!
//! Commit protocol of txg N (the crash argument is in docs/durability.md):
//! 1. write the txg's new data blocks, then the indirect blocks above them, bottom up;
//! 2. write the changed space-map chunks and the pool's metadata block (PoolMeta);
//! 3. flush every device;
//! 4. write the uberblock for N into slot N % 32 of every label of every device;
//! 5. flush every device. N is durable; its frees become reusable after N + DEFER_TXGS.
//!
//! Nothing a durable uberblock references is ever overwritten before it is superseded.

mod scan;
pub mod txg;

pub use scan::{ScanState, ScanStatus};

use crate::dmu::tree::{capacity, levels_for, skip_hole, walk, BlockTree, Walk, FANOUT};
use crate::iostats::{DeviceStats, VolumeStats};
use crate::props::{PoolProps, VolumeProps};
use crate::sector_mask::SectorMask;
use crate::spa::txg::TxgControl;
use crate::vdev::alloc::{Allocator, ClassBytes, Space, CLASSES, DEFER_TXGS, SLAB_BYTES};
use crate::vdev::label::{read_label, read_uberblocks, write_labels, write_uberblock};
use crate::vdev::queue::IoClass;
use crate::vdev::{Leaf, TopVdev, VdevTree, TOP_VDEVS_MAX};
use crate::zil::{read_chain, LogCounters, LogStats, ReplayRecord, Zil};
use crate::zio::compress::stored_bytes;
use crate::zio::data_cache::CacheKey;
use crate::zio::Zio;
use crate::zio::{read_block, write_block_shared, write_blocks_shared};
use crate::zvol::{merge_partial, DirtyBlock, VolumeInner};
use crate::{EngineError, Result, Volume};
use oxpool_format::{
    checksum, data_end_bytes, decode_meta_block, decode_meta_index, encode_meta_block,
    encode_meta_index, BlockPtr, BlockType, Compression, DeferredFree, Dva, Guid, LabelConfig,
    LeafConfig, PoolMeta, SpaceMapMeta, TopVdevConfig, TopVdevKind, Txg, Uberblock, VdevId,
    VdevTreeConfig, VolumeId, VolumeMeta, DATA_START_BYTES, INDIRECT_BLOCK_BYTES,
    META_PIECE_BYTES_MAX, SECTOR_BYTES, SPACEMAP_CHUNK_PAYLOAD_BYTES,
};
use oxpool_io::rt::{block_on, join_all};
use oxpool_io::{Backend, IoBuf};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Blocks one sync handles as a batch: merged (their reads in flight together), given
/// adjacent places, written (aggregated into writes of up to 1 MiB, so a few writes in
/// flight), before the next batch. Bounds the memory of merged blocks in flight (4 MiB of
/// 16 KiB blocks) and keeps the device's queue a few large writes deep, as ZFS's async-write
/// limits do with aggregated I/Os.
const SYNC_WRITES_IN_FLIGHT_MAX: usize = 256;
/// Copies of the pool's own metadata (PoolMeta, space maps): as ZFS's MOS, the most.
const META_COPIES: usize = 3;

/// One top-level vdev to create: a single device, or a mirror of several.
pub struct TopSpec {
    /// Single or mirror.
    pub kind: TopVdevKind,
    /// The devices.
    pub devices: Vec<Arc<dyn Backend>>,
    /// A separate intent-log device (holds log blocks only).
    pub log: bool,
}

/// The pool's mutable state, under one lock (control plane and the sync thread; never held
/// across an await).
pub(crate) struct PoolState {
    pub props: PoolProps,
    pub volumes: BTreeMap<String, Arc<VolumeInner>>,
    /// Volumes destroyed since the last sync: their blocks are freed by the next one.
    pub destroyed: Vec<Arc<VolumeInner>>,
    pub alloc: Allocator,
    /// Current space-map chunk pointers per top-level vdev.
    pub chunk_ptrs: Vec<Vec<BlockPtr>>,
    /// Frees waiting for their txg to be DEFER_TXGS txgs old.
    pub deferred: Vec<DeferredFree>,
    pub next_volume_id: u64,
    /// The PoolMeta block of the last synced txg (or the index of its pieces).
    pub meta_ptr: BlockPtr,
    /// Every place that PoolMeta occupies (its block, or its index and pieces): freed when
    /// the next one replaces it.
    pub meta_places: Vec<Dva>,
    /// While a scrub reads a batch of blocks: no deferred free of a txg after this one is
    /// released (see `scan.rs`).
    pub scan_pin: Option<Txg>,
}

pub(crate) struct PoolInner {
    pub name: String,
    pub guid: Guid,
    /// The pipeline and what it runs on: vdevs, completion policy, data cache.
    pub zio: Zio,
    pub txg: TxgControl,
    pub state: Mutex<PoolState>,
    /// Intent-log counters (all volumes).
    pub log_counters: LogCounters,
    /// Log space allocated since the last txg sync began (a lot of it kicks a sync, which
    /// trims the chains and frees their blocks).
    pub log_alloc_bytes_since_sync: std::sync::atomic::AtomicU64,
    /// Held across a change of the vdev tree (`oxpool add`): one at a time.
    pub config_change: Mutex<()>,
    /// The scrub, if one ran.
    pub scan: crate::spa::scan::Scan,
}

/// An imported pool. Dropping it without [`Pool::export`] stops its sync thread without a final
/// sync (as a process exit would): data not yet synced or flushed is lost, nothing else.
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
    sync_thread: Option<JoinHandle<()>>,
}

/// Reads a pool's counters (see [`Pool::counters`]).
#[derive(Clone)]
pub struct PoolCounters {
    inner: Arc<PoolInner>,
}

impl PoolCounters {
    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Intent-log and flush counters.
    pub fn log_stats(&self) -> LogStats {
        self.inner.log_counters.stats()
    }

    /// The last durable txg.
    pub fn synced_txg(&self) -> Txg {
        self.inner.txg.synced()
    }

    /// I/O statistics of every present leaf device, in vdev tree order.
    pub fn device_stats(&self) -> Vec<DeviceStats> {
        let mut out = Vec::new();
        for top in self.inner.zio.vdevs.tops() {
            for leaf in top.leaves() {
                let vdev = match top.kind {
                    TopVdevKind::Mirror => format!("mirror-{}", top.id.0),
                    _ => leaf.name().to_string(),
                };
                out.push(DeviceStats {
                    name: leaf.name().to_string(),
                    vdev,
                    scheduler: leaf.queue.mode().as_str().to_string(),
                    io: leaf.io_stats.snapshot(),
                    queue: leaf.queue.snapshot(),
                    errors: crate::iostats::DeviceErrors {
                        read: leaf.counters.read_errors.load(Ordering::Relaxed),
                        write: leaf.counters.write_errors.load(Ordering::Relaxed),
                        checksum: leaf.counters.checksum_errors.load(Ordering::Relaxed),
                        repaired_bytes: leaf.counters.repaired_bytes.load(Ordering::Relaxed),
                    },
                });
            }
        }
        out
    }

    /// I/O statistics of every volume, by name.
    pub fn volume_stats(&self) -> Vec<VolumeStats> {
        let s = self.inner.state.lock().unwrap();
        s.volumes
            .values()
            .map(|v| VolumeStats {
                name: v.name.clone(),
                io: v.io_stats.snapshot(),
            })
            .collect()
    }

    /// Hits, misses and size of the data-block cache.
    pub fn data_cache_stats(&self) -> crate::zio::data_cache::DataCacheStats {
        self.inner.zio.data_cache.stats()
    }
}

/// One line of `oxpool status`.
#[derive(Clone, Debug)]
pub struct VdevStatus {
    /// Device path, or `mirror-N` for a mirror.
    pub name: String,
    /// ONLINE, DEGRADED or MISSING.
    pub state: String,
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
    /// ONLINE, DEGRADED or SUSPENDED.
    pub state: String,
    /// Allocatable bytes.
    pub size_bytes: u64,
    /// Allocated bytes.
    pub allocated_bytes: u64,
    /// Last durable txg.
    pub txg: u64,
    /// Dirty bytes in memory.
    pub dirty_bytes: u64,
    /// Top-level vdevs.
    pub vdevs: Vec<VdevStatus>,
    /// The latest scrub since the pool was opened.
    pub scan: Option<crate::ScanStatus>,
}

/// The dirty-data limit in force: `dirty_max`, but at most an eighth of the pool. A txg's
/// space is allocated anew (copy-on-write) while the space it frees comes back only
/// DEFER_TXGS txgs later, so a few txgs' worth of free space must always exist.
pub(crate) fn effective_dirty_max(dirty_max_bytes: u64, pool_bytes: u64) -> u64 {
    dirty_max_bytes.min((pool_bytes / 8).max(1 << 20))
}

/// Space kept for txg syncs beyond what writers charge to their txgs (see
/// [`PoolInner::wait_for_space`]): the space maps, the pool metadata (whose list of deferred
/// frees grows with what recent txgs freed), a tree growing a level. Writers may not use it;
/// the sync may (as ZFS's slop space). Frees may use half of it: they give space back.
pub(crate) fn slop_bytes(pool_bytes: u64) -> u64 {
    (pool_bytes / 32).max(4 << 20)
}

/// Syncs a writer waits through for space before it gets ENOSPC (each returns deferred frees).
const SPACE_WAIT_SYNCS_MAX: u32 = 2 * DEFER_TXGS as u32 + 4;

/// A writer's place in the space check, from [`PoolInner::wait_for_space`] until its change is
/// charged to its txg ([`crate::spa::txg::TxgHold::note_dirty`]): while it lives, the worst case of
/// the change counts as needed, so concurrent writers cannot all pass the check on the same
/// free space. Drop it after `note_dirty`.
pub(crate) struct SpaceAdmission<'a> {
    inner: &'a PoolInner,
    bytes: ClassBytes,
}

impl Drop for SpaceAdmission<'_> {
    fn drop(&mut self) {
        self.inner.txg.state.lock().unwrap().space_admitting -= self.bytes;
    }
}

impl PoolInner {
    /// Empty-slab space that must stay free beside what the pending syncs need: the slop
    /// (half of it for `frees`), and one slab per size class and data vdev that a sync may
    /// leave partly filled (see [`Allocator::fits`]).
    fn sync_reserve(alloc: &Allocator, space: &Space, frees: bool) -> u64 {
        let slop = slop_bytes(space.size_bytes);
        let slop = if frees { slop / 2 } else { slop };
        slop + CLASSES as u64 * SLAB_BYTES * alloc.data_vdevs() as u64
    }

    /// Whether `need` fits with the reserve left over (see [`Allocator::fits`]).
    fn fits(alloc: &Allocator, need: &ClassBytes, frees: bool) -> bool {
        let space = alloc.space();
        space.fits(need, Self::sync_reserve(alloc, &space, frees))
    }

    /// Whether something outside the txg sync (the intent log) may allocate `extra` now: it
    /// must leave the pending syncs everything they may need and the slop. Called with the
    /// pool's state locked (the allocator) and allocating under the same lock.
    pub(crate) fn may_allocate_outside_sync(&self, alloc: &Allocator, extra: ClassBytes) -> bool {
        let need = self.txg.state.lock().unwrap().space_needed() + extra;
        Self::fits(alloc, &need, false)
    }

    /// The write throttle's space check. A change whose txg sync may allocate up to `bytes`
    /// (by size class, every copy) waits until it fits beside what every unsynced txg's sync
    /// may allocate, with the reserve left over ([`Allocator::fits`]: sure to fit, not just
    /// in total bytes but in places the blocks can go). Each round asks for a sync, which
    /// releases its txg's charge and returns deferred frees; ENOSPC after a bounded number.
    /// This is what makes a sync never run out of space: everything it allocates was charged
    /// and checked here first (the intent log's allocations are checked the same way, see
    /// [`PoolInner::may_allocate_outside_sync`]).
    pub(crate) async fn wait_for_space(
        &self,
        bytes: ClassBytes,
        frees: bool,
    ) -> Result<SpaceAdmission<'_>> {
        for _ in 0..SPACE_WAIT_SYNCS_MAX {
            let held_back = {
                let s = self.state.lock().unwrap();
                let mut t = self.txg.state.lock().unwrap();
                let need = t.space_needed() + bytes;
                if Self::fits(&s.alloc, &need, frees) {
                    t.space_admitting += bytes;
                    return Ok(SpaceAdmission { inner: self, bytes });
                }
                let batch = crate::spa::scan::batches_done(self);
                crate::spa::scan::pin_holds_frees(&s, t.open).then_some(batch)
            };
            // A scrub batch holds back frees the next sync would give back: they come back
            // only once it is done. Not a round of its own: one batch's reads, then the sync.
            if let Some(batch) = held_back {
                crate::spa::scan::wait_batch_done(self, batch).await;
            }
            let open = self.txg.state.lock().unwrap().open;
            self.txg.kick();
            self.txg.wait_synced(open, true).await?;
        }
        Err(EngineError::NoSpace {
            pool: self.name.clone(),
        })
    }
}

/// The leaves of a new top-level vdev, with their guids.
type NewLeaves = Vec<(Arc<Leaf>, Guid)>;

/// Checks the devices of one new top-level vdev (layout, size, not another pool's unless
/// `force`) and gives them identities.
fn prepare_top(
    id: VdevId,
    spec: TopSpec,
    force: bool,
) -> Result<(TopVdev, TopVdevConfig, NewLeaves)> {
    match (&spec.kind, spec.devices.len()) {
        (_, 0) => return Err(EngineError::invalid("a vdev needs a device")),
        (TopVdevKind::Single, 1) => {}
        (TopVdevKind::Mirror, n) if n >= 2 => {}
        (TopVdevKind::Single, _) => {
            return Err(EngineError::invalid("a single vdev has exactly one device"))
        }
        (TopVdevKind::Mirror, _) => {
            return Err(EngineError::invalid("a mirror needs at least two devices"))
        }
    }
    let mut asize = u64::MAX;
    let mut children = Vec::new();
    let mut child_cfg = Vec::new();
    let mut leaves = Vec::new();
    for dev in spec.devices {
        let size = dev.size_bytes();
        if size < oxpool_format::MIN_DEVICE_BYTES {
            return Err(EngineError::invalid(format!(
                "{}: {size} bytes is smaller than the minimum {} bytes",
                dev.name(),
                oxpool_format::MIN_DEVICE_BYTES
            )));
        }
        if !force {
            if let Ok(cfg) = block_on(read_label(dev.as_ref())) {
                return Err(EngineError::invalid(format!(
                    "{} belongs to pool '{}' (guid {:x}); use -f to overwrite it",
                    dev.name(),
                    cfg.pool_name,
                    cfg.pool_guid.0
                )));
            }
        }
        asize = asize.min((data_end_bytes(size) - DATA_START_BYTES) / SECTOR_BYTES * SECTOR_BYTES);
        let guid = random_guid();
        child_cfg.push(LeafConfig {
            guid,
            path: dev.name().to_string(),
            size_bytes: size,
        });
        let leaf = Arc::new(Leaf::new(guid, dev));
        leaves.push((leaf.clone(), guid));
        children.push(Some(leaf));
    }
    let cfg = TopVdevConfig {
        id,
        kind: spec.kind.clone(),
        children: child_cfg,
        asize_bytes: asize,
        log: spec.log,
    };
    Ok((TopVdev::new(&cfg, children), cfg, leaves))
}

/// Checks a pool or volume name: 1 to 64 characters of [A-Za-z0-9_.-], not starting with `-`.
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(EngineError::invalid(format!(
            "invalid {kind} name '{name}': use 1-64 of A-Z a-z 0-9 _ . -"
        )))
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn random_guid() -> Guid {
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

impl Pool {
    /// Creates a pool on `tops`. Refuses devices that belong to a pool unless `force`.
    pub fn create(name: &str, tops: Vec<TopSpec>, props: PoolProps, force: bool) -> Result<Pool> {
        check_name("pool", name)?;
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
        let mut config = VdevTreeConfig { top: Vec::new() };
        let mut vdev_tops = Vec::new();
        let mut leaves_to_label = Vec::new();
        for (i, spec) in tops.into_iter().enumerate() {
            let (top, cfg, leaves) = prepare_top(VdevId(i as u32), spec, force)?;
            leaves_to_label.extend(leaves.into_iter().map(|(l, g)| (l, g, top.id)));
            config.top.push(cfg);
            vdev_tops.push(top);
        }
        let asizes: Vec<u64> = vdev_tops.iter().map(|t| t.asize_bytes).collect();
        let logs: Vec<bool> = vdev_tops.iter().map(|t| t.log).collect();
        if logs.iter().all(|&l| l) {
            return Err(EngineError::invalid(
                "a pool needs a data vdev besides its log devices",
            ));
        }
        let inner = Arc::new(PoolInner {
            name: name.to_string(),
            guid: pool_guid,
            zio: Zio::new(
                VdevTree::new(vdev_tops),
                props.completion,
                props.data_cache_max_bytes,
            ),
            config_change: Mutex::new(()),
            scan: Default::default(),
            txg: TxgControl::new(
                name,
                Txg(0),
                effective_dirty_max(props.dirty_max_bytes, asizes.iter().sum()),
                Duration::from_secs(props.txg_timeout_s),
            ),
            state: Mutex::new(PoolState {
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
                alloc: Allocator::with_log_devices(&asizes, &logs),
                props,
                volumes: BTreeMap::new(),
                destroyed: Vec::new(),
                deferred: Vec::new(),
                next_volume_id: 1,
                meta_ptr: BlockPtr::HOLE,
                meta_places: Vec::new(),
                scan_pin: None,
            }),
            log_counters: LogCounters::default(),
            log_alloc_bytes_since_sync: Default::default(),
        });
        // Before the first I/O (an import's first reads run in `auto`: the properties are
        // on disk).
        apply_scheduler(&inner);
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
        let r = block_on(sync_txg(&inner, txg));
        inner.txg.finish_sync(txg, &r);
        r?;
        Ok(Pool::start(inner))
    }

    fn start(inner: Arc<PoolInner>) -> Pool {
        apply_scheduler(&inner);
        let weak = Arc::downgrade(&inner);
        let thread = std::thread::Builder::new()
            .name(format!("txg-sync-{}", inner.name))
            .spawn(move || sync_thread(weak))
            .expect("spawn the txg sync thread");
        Pool {
            inner,
            sync_thread: Some(thread),
        }
    }

    /// Imports the pool found on `devices` (all devices of one pool, possibly others too).
    /// With `name`, only that pool is considered. Errors name each device and what was wrong.
    pub fn import(devices: Vec<Arc<dyn Backend>>, name: Option<&str>) -> Result<Pool> {
        block_on(async {
            let mut found: Vec<(LabelConfig, Arc<dyn Backend>)> = Vec::new();
            let mut rejected: Vec<String> = Vec::new();
            for dev in devices {
                match read_label(dev.as_ref()).await {
                    Ok(cfg) if name.is_none_or(|n| n == cfg.pool_name) => found.push((cfg, dev)),
                    Ok(cfg) => rejected.push(format!(
                        "{}: belongs to pool '{}'",
                        dev.name(),
                        cfg.pool_name
                    )),
                    Err(e) => rejected.push(e.to_string()),
                }
            }
            let mut guids: Vec<(Guid, String)> = found
                .iter()
                .map(|(c, _)| (c.pool_guid, c.pool_name.clone()))
                .collect();
            guids.sort();
            guids.dedup();
            match guids.len() {
                0 => {
                    let what = name
                        .map(|n| format!("pool '{n}'"))
                        .unwrap_or("a pool".into());
                    let why = if rejected.is_empty() {
                        "no devices given".to_string()
                    } else {
                        rejected.join("; ")
                    };
                    return Err(EngineError::NotFound(format!("{what}: {why}")));
                }
                1 => {}
                _ => {
                    let names: Vec<String> = guids
                        .iter()
                        .map(|(g, n)| format!("{n} ({:x})", g.0))
                        .collect();
                    return Err(EngineError::invalid(format!(
                        "several pools found: {}; name the one to import",
                        names.join(", ")
                    )));
                }
            }
            import_devices(found).await
        })
        .and_then(|(inner, replays)| {
            let had_log = inner
                .state
                .lock()
                .unwrap()
                .volumes
                .values()
                .any(|v| !v.zil.reserved_on_import_is_empty());
            let pool = Pool::start(inner);
            pool.replay(replays)?;
            if had_log {
                // Commit the replayed changes and free the old chains before serving anything.
                pool.sync()?;
            }
            Ok(pool)
        })
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

    /// Intent-log counters since the pool was opened.
    pub fn log_stats(&self) -> LogStats {
        self.inner.log_counters.stats()
    }

    /// A handle that reads the pool's counters from another thread while the pool is served.
    pub fn counters(&self) -> PoolCounters {
        PoolCounters {
            inner: self.inner.clone(),
        }
    }

    /// Writes everything dirty, stops the sync thread and closes the pool. A volume handle
    /// that outlives it gets errors from then on: nothing more is written to the devices,
    /// which another process may own next.
    pub fn export(mut self) -> Result<()> {
        self.stop_sync_thread();
        let mut s = self.inner.txg.state.lock().unwrap();
        let result = match &s.suspended {
            Some(r) => Err(EngineError::Suspended {
                pool: self.inner.name.clone(),
                reason: r.clone(),
            }),
            None => Ok(()),
        };
        s.suspended.get_or_insert_with(|| "exported".into());
        result
    }

    fn stop_sync_thread(&mut self) {
        // The scrub first: it waits on syncs of its own, and a closed pool has none.
        self.inner.scan.stop();
        self.inner.txg.stop();
        if let Some(t) = self.sync_thread.take() {
            let _ = t.join();
        }
    }

    /// Destroys the pool: clears every device's labels. The data is gone for oxpool.
    pub fn destroy(mut self) -> Result<()> {
        // Stop without a final sync: nothing of it matters any more.
        self.inner.txg.state.lock().unwrap().suspended = Some("destroyed".into());
        self.stop_sync_thread();
        block_on(async {
            for leaf in self.inner.zio.vdevs.leaves() {
                crate::vdev::label::clear_labels(leaf.backend.as_ref()).await?;
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
        let inner = &self.inner;
        let _one_change = inner.config_change.lock().unwrap();
        let base = inner.zio.vdevs.top_count();
        if base + specs.len() > TOP_VDEVS_MAX {
            return Err(EngineError::invalid(format!(
                "pool '{}' would have {} top-level vdevs; at most {TOP_VDEVS_MAX}",
                inner.name,
                base + specs.len()
            )));
        }
        // As `zpool add`: a single device beside mirrors would leave data with no redundancy.
        let mirrored = inner
            .zio
            .vdevs
            .tops()
            .any(|t| !t.log && t.kind == TopVdevKind::Mirror);
        let single_data = specs
            .iter()
            .any(|s| !s.log && s.kind == TopVdevKind::Single);
        if mirrored && single_data && !force {
            return Err(EngineError::invalid(format!(
                "mismatched replication level: pool '{}' has mirrors and a single device would \
                 have no redundancy (-f adds it anyway)",
                inner.name
            )));
        }
        let mut new_tops = Vec::new();
        let mut new_leaves = Vec::new();
        let mut config = inner.zio.vdevs.config();
        for (i, spec) in specs.into_iter().enumerate() {
            let (top, cfg, leaves) = prepare_top(VdevId((base + i) as u32), spec, force)?;
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
        self.sync()?;
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
        self.sync()?;
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
        block_on(async {
            for top in inner.zio.vdevs.tops() {
                for (leaf, lcfg) in top.children.iter().zip(&top.leaf_configs) {
                    if let Some(leaf) = leaf {
                        if !new_leaves.iter().any(|(l, _, _)| Arc::ptr_eq(l, leaf)) {
                            let cfg = label(lcfg.guid, top.id);
                            crate::vdev::label::update_label_config(leaf.backend.as_ref(), &cfg)
                                .await?;
                        }
                    }
                }
            }
            Ok::<(), EngineError>(())
        })
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Pool guid.
    pub fn guid(&self) -> Guid {
        self.inner.guid
    }

    /// Names (paths as opened) of the devices the pool has open.
    pub fn open_device_names(&self) -> Vec<String> {
        self.inner
            .zio
            .vdevs
            .leaves()
            .map(|l| l.name().to_string())
            .collect()
    }

    /// Paths of the pool's devices as configured (for the cache file).
    pub fn device_paths(&self) -> Vec<String> {
        self.inner
            .zio
            .vdevs
            .tops()
            .flat_map(|t| t.leaf_configs.iter().map(|c| c.path.clone()))
            .collect()
    }

    /// Asks for a sync of everything dirty now and waits until it is durable.
    pub fn sync(&self) -> Result<()> {
        self.inner.txg.mark_dirty();
        let open = self.inner.txg.state.lock().unwrap().open;
        block_on(self.inner.txg.wait_synced(open, true))
    }

    /// Asynchronous [`Pool::sync`], for use inside an executor.
    pub async fn sync_async(&self) -> Result<()> {
        self.inner.txg.mark_dirty();
        let open = self.inner.txg.state.lock().unwrap().open;
        self.inner.txg.wait_synced(open, true).await
    }

    /// The last durable txg.
    pub fn synced_txg(&self) -> Txg {
        self.inner.txg.synced()
    }

    /// Dirty bytes held in memory.
    pub fn dirty_bytes(&self) -> u64 {
        self.inner.txg.dirty_bytes()
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
        for (k, v) in props {
            if k == "volsize" {
                return Err(EngineError::invalid("give volsize with --size"));
            }
            p.set_initial(k, v)?;
        }
        p.validate()?;
        let mut s = self.inner.state.lock().unwrap();
        if s.volumes.contains_key(name) {
            return Err(EngineError::Exists(format!("{}/{name}", self.inner.name)));
        }
        let id = VolumeId(s.next_volume_id);
        s.next_volume_id += 1;
        let nblocks = size_bytes / p.volblocksize_bytes as u64;
        let vol = Arc::new(VolumeInner::new(
            id,
            &self.inner.name,
            name,
            p,
            BlockTree::new(levels_for(nblocks), BlockPtr::HOLE),
            0,
            Zil::new(self.inner.guid, id, 1, Vec::new()),
        ));
        s.volumes.insert(name.to_string(), vol.clone());
        self.inner.txg.mark_dirty();
        Ok(Volume {
            pool: self.inner.clone(),
            vol,
        })
    }

    /// Destroys a volume; its space is freed by the next sync.
    pub fn destroy_volume(&self, name: &str) -> Result<()> {
        let mut s = self.inner.state.lock().unwrap();
        let vol = s
            .volumes
            .remove(name)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{name}", self.inner.name)))?;
        vol.destroyed.store(true, Ordering::Release);
        s.destroyed.push(vol);
        self.inner.txg.mark_dirty();
        Ok(())
    }

    /// A handle to a volume.
    pub fn volume(&self, name: &str) -> Result<Volume> {
        let s = self.inner.state.lock().unwrap();
        let vol = s
            .volumes
            .get(name)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{name}", self.inner.name)))?
            .clone();
        Ok(Volume {
            pool: self.inner.clone(),
            vol,
        })
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> Vec<Volume> {
        let s = self.inner.state.lock().unwrap();
        s.volumes
            .values()
            .map(|v| Volume {
                pool: self.inner.clone(),
                vol: v.clone(),
            })
            .collect()
    }

    /// Reads a pool property.
    pub fn get_prop(&self, name: &str) -> Result<String> {
        self.inner.state.lock().unwrap().props.get(name)
    }

    /// Sets a pool property (persisted by the next sync).
    pub fn set_prop(&self, name: &str, value: &str) -> Result<()> {
        let mut s = self.inner.state.lock().unwrap();
        s.props.set(name, value)?;
        self.inner
            .zio
            .data_cache
            .set_max_bytes(s.props.data_cache_max_bytes);
        self.inner.zio.completion.set(s.props.completion);
        self.inner.txg.configure(
            effective_dirty_max(s.props.dirty_max_bytes, s.alloc.totals_bytes().0),
            Duration::from_secs(s.props.txg_timeout_s),
        );
        self.inner.txg.mark_dirty();
        drop(s);
        apply_scheduler(&self.inner);
        Ok(())
    }

    /// The present leaf named `device` (its path, or its guid in hex).
    fn leaf_named(&self, device: &str) -> Result<Arc<Leaf>> {
        self.inner
            .zio
            .vdevs
            .leaves()
            .find(|l| l.name() == device || format!("{:x}", l.guid.0) == device)
            .cloned()
            .ok_or_else(|| {
                EngineError::NotFound(format!("device '{device}' in pool '{}'", self.inner.name))
            })
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
        let s = self.inner.state.lock().unwrap();
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
        self.inner
            .state
            .lock()
            .unwrap()
            .props
            .set_device(leaf.guid, name, value)?;
        self.inner.txg.mark_dirty();
        apply_scheduler(&self.inner);
        Ok(())
    }

    /// Sets a volume property. A `volsize` change is durable when this returns (a txg sync);
    /// a shrink frees the blocks past the new end, after every request in flight there is
    /// done (see `Volume::resize`).
    pub fn set_volume_prop(&self, volume: &str, name: &str, value: &str) -> Result<()> {
        let vol = self.volume(volume)?;
        if name == "volsize" {
            let _one_at_a_time = vol.vol.resizing.lock().unwrap();
            let new_size = {
                let mut q = vol.vol.props.lock().unwrap().clone();
                q.set(name, value)?;
                q.validate()?;
                q.volsize_bytes
            };
            return block_on(vol.resize(new_size));
        }
        {
            // Checked and stored in one step: a concurrent change is not undone.
            let mut p = vol.vol.props.lock().unwrap();
            let mut q = p.clone();
            q.set(name, value)?;
            q.validate()?;
            *p = q;
        }
        self.inner.txg.mark_dirty();
        Ok(())
    }

    /// Status of the pool and its devices.
    pub fn status(&self) -> PoolStatus {
        let (size, allocated) = self.inner.state.lock().unwrap().alloc.totals_bytes();
        let suspended = self.inner.txg.state.lock().unwrap().suspended.is_some();
        let leaf_status = |l: &Option<Arc<Leaf>>, cfg: &LeafConfig| match l {
            Some(l) => VdevStatus {
                name: l.name().to_string(),
                state: "ONLINE".into(),
                read_errors: l.counters.read_errors.load(Ordering::Relaxed),
                write_errors: l.counters.write_errors.load(Ordering::Relaxed),
                checksum_errors: l.counters.checksum_errors.load(Ordering::Relaxed),
                repaired_bytes: l.counters.repaired_bytes.load(Ordering::Relaxed),
                children: vec![],
            },
            None => VdevStatus {
                name: cfg.path.clone(),
                state: "MISSING".into(),
                read_errors: 0,
                write_errors: 0,
                checksum_errors: 0,
                repaired_bytes: 0,
                children: vec![],
            },
        };
        let mut degraded = false;
        let vdevs = self
            .inner
            .zio
            .vdevs
            .tops()
            .map(|t| {
                let kids: Vec<VdevStatus> = t
                    .children
                    .iter()
                    .zip(&t.leaf_configs)
                    .map(|(l, c)| leaf_status(l, c))
                    .collect();
                let missing = kids.iter().any(|k| k.state != "ONLINE");
                degraded |= missing;
                match t.kind {
                    TopVdevKind::Single => kids.into_iter().next().unwrap(),
                    TopVdevKind::Mirror => VdevStatus {
                        name: format!("mirror-{}", t.id.0),
                        state: if missing { "DEGRADED" } else { "ONLINE" }.into(),
                        read_errors: 0,
                        write_errors: 0,
                        checksum_errors: 0,
                        repaired_bytes: 0,
                        children: kids,
                    },
                }
            })
            .collect();
        PoolStatus {
            name: self.inner.name.clone(),
            guid: self.inner.guid.0,
            state: if suspended {
                "SUSPENDED"
            } else if degraded {
                "DEGRADED"
            } else {
                "ONLINE"
            }
            .into(),
            size_bytes: size,
            allocated_bytes: allocated,
            txg: self.inner.txg.synced().0,
            dirty_bytes: self.inner.txg.dirty_bytes(),
            vdevs,
            scan: self.scan_status(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.sync_thread.is_some() {
            // No final sync: as a process exit. Mark suspended so the thread stops at once.
            let mut s = self.inner.txg.state.lock().unwrap();
            if s.suspended.is_none() {
                s.suspended = Some("pool closed without export".into());
            }
            drop(s);
            self.stop_sync_thread();
        }
    }
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

/// Assembles and loads a pool from devices whose labels name it.
/// Log records to replay, per volume name.
type Replays = Vec<(String, Vec<ReplayRecord>)>;

async fn import_devices(
    found: Vec<(LabelConfig, Arc<dyn Backend>)>,
) -> Result<(Arc<PoolInner>, Replays)> {
    let cfg0 = found[0].0.clone();
    let pool_name = cfg0.pool_name.clone();
    let config = found
        .iter()
        .map(|(c, _)| &c.tree)
        .max_by_key(|t| t.top.len())
        .unwrap()
        .clone();
    let mut tops = Vec::new();
    for tcfg in &config.top {
        let children: Vec<Option<Arc<Leaf>>> = tcfg
            .children
            .iter()
            .map(|lc| {
                found
                    .iter()
                    .find(|(c, _)| c.leaf_guid == lc.guid)
                    .map(|(_, dev)| Arc::new(Leaf::new(lc.guid, dev.clone())))
            })
            .collect();
        if children.iter().all(|c| c.is_none()) {
            let paths: Vec<&str> = tcfg.children.iter().map(|c| c.path.as_str()).collect();
            return Err(EngineError::NotFound(format!(
                "pool '{pool_name}': {}vdev {} has no device present (expected {})",
                if tcfg.log { "log " } else { "" },
                tcfg.id.0,
                paths.join(", ")
            )));
        }
        tops.push(TopVdev::new(tcfg, children));
    }
    // The completion policy and the cache size are properties, known once the metadata is
    // read (set below).
    let mut zio = Zio::new(
        VdevTree::new(tops),
        crate::zio::completion::CompletionPolicy::default(),
        0,
    );
    // The newest uberblock whose pool metadata reads and verifies.
    let mut ubs = Vec::new();
    for leaf in zio.vdevs.leaves() {
        ubs.extend(read_uberblocks(leaf.backend.as_ref()).await);
    }
    ubs.retain(|u| u.pool_guid == cfg0.pool_guid);
    ubs.sort_by_key(|u| std::cmp::Reverse(u.txg));
    ubs.dedup();
    let mut last_err = None;
    let mut chosen = None;
    for ub in ubs {
        match load_meta(&zio, &ub.root, &pool_name).await {
            Ok(meta) => {
                chosen = Some((ub, meta));
                break;
            }
            Err(e) => {
                tracing::warn!(
                    pool = pool_name,
                    "uberblock of txg {} unusable: {e}",
                    ub.txg.0
                );
                last_err = Some(e);
            }
        }
    }
    let Some((ub, (meta, meta_places))) = chosen else {
        let devs: Vec<&str> = zio.vdevs.leaves().map(|l| l.name()).collect();
        return Err(match last_err {
            Some(e) => e,
            None => EngineError::invalid(format!(
                "pool '{pool_name}': no valid uberblock on {}",
                devs.join(", ")
            )),
        });
    };
    let props = PoolProps::from_pairs(&meta.props)?;
    zio.completion.set(props.completion);
    zio.data_cache.set_max_bytes(props.data_cache_max_bytes);
    // The pool's own record of its zio.vdevs is the truth; labels only help find devices. A vdev
    // the labels found no trace of (a log device added later, then lost) cannot be skipped:
    // its log blocks may hold acknowledged writes.
    if meta.tree.top.len() > zio.vdevs.top_count() {
        let missing: Vec<String> = meta.tree.top[zio.vdevs.top_count()..]
            .iter()
            .map(|t| {
                let paths: Vec<&str> = t.children.iter().map(|c| c.path.as_str()).collect();
                format!(
                    "{}vdev {} ({})",
                    if t.log { "log " } else { "" },
                    t.id.0,
                    paths.join(", ")
                )
            })
            .collect();
        return Err(EngineError::NotFound(format!(
            "pool '{pool_name}': missing {}",
            missing.join("; ")
        )));
    }
    // A vdev whose labels were written but whose addition never committed is not part of it.
    zio.vdevs.truncate(meta.tree.top.len());
    zio.vdevs.set_leaf_configs(&meta.tree);
    let asizes: Vec<u64> = zio.vdevs.tops().map(|t| t.asize_bytes).collect();
    let logs: Vec<bool> = zio.vdevs.tops().map(|t| t.log).collect();
    let mut alloc = Allocator::with_log_devices(&asizes, &logs);
    let mut chunk_ptrs = Vec::new();
    for (v, sm) in meta.spacemaps.iter().enumerate() {
        let map = alloc.map_mut(VdevId(v as u32));
        if sm.chunks.len() as u64 != map.chunk_count() {
            return Err(EngineError::invalid(format!(
                "pool '{pool_name}': space map of vdev {v} has {} chunks, expected {}",
                sm.chunks.len(),
                map.chunk_count()
            )));
        }
        for (c, bp) in sm.chunks.iter().enumerate() {
            if bp.is_hole() {
                continue;
            }
            let what = format!("{pool_name} space map {v}/{c}");
            let buf = read_block(&zio, IoClass::SyncRead, bp, &what).await?;
            let bits = decode_meta_block(BlockType::SpaceMap, &buf[..bp.psize_bytes as usize])
                .map_err(|e| EngineError::Corrupt {
                    device: pool_name.clone(),
                    what: what.clone(),
                    source: e,
                })?;
            if bits.len() != SPACEMAP_CHUNK_PAYLOAD_BYTES {
                return Err(EngineError::invalid(format!(
                    "{what}: wrong size {}",
                    bits.len()
                )));
            }
            map.load_chunk_bits(c as u64, bits);
        }
        map.take_dirty_chunks();
        chunk_ptrs.push(sm.chunks.clone());
    }
    // The PoolMeta block (or its index and pieces) is allocated after the space maps it
    // describes were written.
    for dva in &meta_places {
        if zio
            .vdevs
            .top(dva.vdev)
            .is_some_and(|t| dva.end_bytes() <= t.asize_bytes)
        {
            alloc.map_mut(dva.vdev).claim(dva);
        }
    }
    let mut volumes = BTreeMap::new();
    let mut replays = Vec::new();
    for vm in &meta.volumes {
        let p = VolumeProps::from_parts(vm.volsize_bytes, vm.volblocksize_bytes, &vm.props)?;
        // The intent log: records newer than the committed txg are replayed once the pool is
        // up. Every place the log held (persisted list and the chain walked) is claimed now,
        // before anything allocates, and freed by the replay's sync.
        let mut log_blocks = vm.log_reserved.clone();
        let mut claimed_indirect: Vec<Dva> = Vec::new();
        let mut next_seq = vm.log_first_seq.max(1);
        if vm.log_first.asize_bytes > 0 {
            let replay = read_chain(
                &zio,
                cfg0.pool_guid,
                vm.id,
                vm.log_first,
                vm.log_first_seq,
                meta.txg,
            )
            .await;
            log_blocks.extend(replay.blocks.iter().copied());
            // Blocks written in place for records that are replayed: claimed like the log's
            // own, freed after the replay copied their data.
            // In-place blocks of replayed records: freed after the replay only if the
            // committed maps show them free (claimed here) or `log_reserved` lists them (the
            // sync allocated them in its maps but neither adopted nor freed them). Any other
            // one the maps hold allocated is covered by a deferred free or by the tree
            // already; freeing it again would be a double free.
            for d in &replay.indirect_blocks {
                if zio
                    .vdevs
                    .top(d.vdev)
                    .is_some_and(|t| d.end_bytes() <= t.asize_bytes)
                    && alloc.map_mut(d.vdev).claim(d)
                {
                    claimed_indirect.push(*d);
                }
            }
            next_seq = replay.end_seq;
            if !replay.records.is_empty() {
                replays.push((vm.name.clone(), replay.records));
            }
        }
        // An in-place block both listed and claimed above is freed once.
        log_blocks.extend(claimed_indirect);
        log_blocks.sort_by_key(|d| (d.vdev, d.offset_bytes));
        log_blocks.dedup();
        for d in &log_blocks {
            if zio
                .vdevs
                .top(d.vdev)
                .is_some_and(|t| d.end_bytes() <= t.asize_bytes)
            {
                alloc.map_mut(d.vdev).claim(d);
            }
        }
        let zil = Zil::new(
            cfg0.pool_guid,
            vm.id,
            next_seq + crate::zil::SEQ_RESTART_GAP,
            log_blocks,
        );
        let vol = VolumeInner::new(
            vm.id,
            &pool_name,
            &vm.name,
            p,
            BlockTree::new(vm.levels.max(1), vm.root),
            vm.used_bytes,
            zil,
        );
        vol.compressed_bytes
            .store(vm.compressed_bytes, Ordering::Relaxed);
        volumes.insert(vm.name.clone(), Arc::new(vol));
    }
    tracing::info!(pool = pool_name, txg = meta.txg.0, "imported");
    let inner = Arc::new(PoolInner {
        name: pool_name.clone(),
        guid: cfg0.pool_guid,
        zio,
        config_change: Mutex::new(()),
        scan: Default::default(),
        txg: TxgControl::new(
            &pool_name,
            meta.txg,
            effective_dirty_max(props.dirty_max_bytes, asizes.iter().sum()),
            Duration::from_secs(props.txg_timeout_s),
        ),
        state: Mutex::new(PoolState {
            props,
            volumes,
            destroyed: Vec::new(),
            alloc,
            chunk_ptrs,
            deferred: meta.deferred_frees.clone(),
            next_volume_id: meta.next_volume_id,
            meta_ptr: ub.root,
            meta_places,
            scan_pin: None,
        }),
        log_counters: LogCounters::default(),
        log_alloc_bytes_since_sync: Default::default(),
    });
    Ok((inner, replays))
}

/// Reads the pool metadata the uberblock's root points at: one block, or the index of its
/// pieces (see [`write_pool_meta`]). Returns it with every place it occupies.
async fn load_meta(zio: &Zio, bp: &BlockPtr, pool: &str) -> Result<(PoolMeta, Vec<Dva>)> {
    let corrupt = |what: &str, e| EngineError::Corrupt {
        device: pool.to_string(),
        what: what.into(),
        source: e,
    };
    let what = format!("{pool} pool metadata");
    let mut places = bp.dvas().to_vec();
    let whole = match (bp.is_hole(), bp.block_type) {
        (false, BlockType::PoolMeta) => {
            let buf = read_block(zio, IoClass::SyncRead, bp, &what).await?;
            buf[..bp.psize_bytes as usize].to_vec()
        }
        (false, BlockType::MetaIndex) => {
            let buf = read_block(zio, IoClass::SyncRead, bp, &what).await?;
            let pieces = decode_meta_index(&buf[..bp.psize_bytes as usize])
                .map_err(|e| corrupt("pool metadata index", e))?;
            let mut whole = Vec::new();
            // Bounded by META_INDEX_PIECES_MAX.
            for p in &pieces {
                if p.block_type != BlockType::PoolMeta {
                    return Err(corrupt(
                        "pool metadata index",
                        oxpool_format::FormatError::BadField {
                            field: "meta index piece type",
                            value: p.block_type as u64,
                        },
                    ));
                }
                let buf = read_block(zio, IoClass::SyncRead, p, &what).await?;
                whole.extend_from_slice(&buf[..p.psize_bytes as usize]);
                places.extend_from_slice(p.dvas());
            }
            whole
        }
        _ => {
            return Err(EngineError::invalid(format!(
                "pool '{pool}': uberblock root is not pool metadata"
            )))
        }
    };
    let meta = PoolMeta::decode(&whole).map_err(|e| corrupt("pool metadata", e))?;
    Ok((meta, places))
}

/// Writes txg `txg`'s encoded PoolMeta block: as one block when it fits in one allocation,
/// else as pieces of at most META_PIECE_BYTES_MAX named by a metadata index. Its list of
/// deferred frees grows with what recent txgs freed (hundreds of KiB under random writes), and
/// the allocator places no block larger than a slab: one that size may find no room at all in
/// a pool whose free space is in small holes, while pieces always do (see `alloc`). Returns the
/// uberblock's root pointer and every place written.
async fn write_pool_meta(
    inner: &PoolInner,
    txg: Txg,
    meta_block: &[u8],
) -> Result<(BlockPtr, Vec<Dva>)> {
    let nb = |psize_bytes: usize, block_type| NewBlock {
        psize_bytes: psize_bytes as u32,
        lsize_bytes: psize_bytes as u32,
        compression: Compression::Off,
        block_type,
        level: 0,
        copies: META_COPIES,
        checksum_type: oxpool_format::ChecksumType::Xxh3_128,
        txg,
        fill: 0,
    };
    if meta_block.len() <= META_PIECE_BYTES_MAX {
        let block = Arc::new(padded(meta_block));
        let nb = nb(meta_block.len(), BlockType::PoolMeta);
        let bp = write_new_block(inner, IoClass::AsyncWrite, &block, nb).await?;
        return Ok((bp, bp.dvas().to_vec()));
    }
    let futs: Vec<_> = meta_block
        .chunks(META_PIECE_BYTES_MAX)
        .map(|piece| async move {
            let block = Arc::new(padded(piece));
            let nb = nb(piece.len(), BlockType::PoolMeta);
            write_new_block(inner, IoClass::AsyncWrite, &block, nb).await
        })
        .collect();
    let mut pieces = Vec::new();
    let mut places = Vec::new();
    for r in join_all(futs).await {
        let bp = r?;
        places.extend_from_slice(bp.dvas());
        pieces.push(bp);
    }
    let index = encode_meta_index(&pieces);
    let nb = nb(index.len(), BlockType::MetaIndex);
    let bp = write_new_block(inner, IoClass::AsyncWrite, &Arc::new(padded(&index)), nb).await?;
    places.extend_from_slice(bp.dvas());
    Ok((bp, places))
}

fn sync_thread(pool: std::sync::Weak<PoolInner>) {
    // Nobody waits on this thread's I/O completions within microseconds: sleep, don't spin.
    oxpool_io::rt::set_spin(false);
    loop {
        let Some(inner) = pool.upgrade() else { return };
        let Some(txg) = inner.txg.next_to_sync() else {
            return;
        };
        let r = block_on(sync_txg(&inner, txg));
        inner.txg.finish_sync(txg, &r);
    }
}

/// What a new block is, for [`write_new_block`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewBlock {
    pub psize_bytes: u32,
    /// The content's size: `psize_bytes` unless compressed.
    pub lsize_bytes: u32,
    /// How the stored bytes are compressed.
    pub compression: Compression,
    pub block_type: BlockType,
    pub level: u8,
    pub copies: usize,
    pub checksum_type: oxpool_format::ChecksumType,
    pub txg: Txg,
    pub fill: u64,
}

impl NewBlock {
    /// A data block of a volume with properties `props`, born in `txg`.
    pub(crate) fn data(props: &VolumeProps, txg: Txg) -> NewBlock {
        NewBlock {
            psize_bytes: props.volblocksize_bytes,
            lsize_bytes: props.volblocksize_bytes,
            compression: Compression::Off,
            block_type: BlockType::Data,
            level: 0,
            copies: props.copies as usize,
            checksum_type: props.checksum,
            txg,
            fill: 1,
        }
    }

    /// This block stored compressed as `c` (its content stays `lsize_bytes`).
    pub(crate) fn compressed(self, c: &crate::zio::compress::CompressedBlock) -> NewBlock {
        debug_assert!(c.psize_bytes < self.lsize_bytes);
        NewBlock {
            psize_bytes: c.psize_bytes,
            compression: c.compression,
            ..self
        }
    }
}

/// Allocates and writes one block as I/Os of `class`; returns its pointer. `data` is padded
/// to whole sectors; every copy is written from it (no copy of the bytes).
pub(crate) async fn write_new_block(
    inner: &PoolInner,
    class: IoClass,
    data: &Arc<IoBuf>,
    nb: NewBlock,
) -> Result<BlockPtr> {
    let bp = alloc_new_block(inner, data, nb, None)?;
    write_block_shared(&inner.zio, class, bp.dvas(), data).await?;
    Ok(bp)
}

/// Allocates and writes many blocks as I/Os of `class` (see [`write_blocks_shared`]: places
/// taken in order, so adjacent writes aggregate); returns their pointers in order.
pub(crate) async fn write_new_blocks(
    inner: &PoolInner,
    class: IoClass,
    blocks: &[(&Arc<IoBuf>, NewBlock)],
) -> Result<Vec<BlockPtr>> {
    let mut ptrs = Vec::with_capacity(blocks.len());
    for (data, nb) in blocks {
        ptrs.push(alloc_new_block(inner, data, *nb, None)?);
    }
    let list: Vec<(&[Dva], &Arc<IoBuf>)> = ptrs
        .iter()
        .zip(blocks)
        .map(|(bp, (data, _))| (bp.dvas(), *data))
        .collect();
    for r in write_blocks_shared(&inner.zio, class, &list).await {
        r?;
    }
    Ok(ptrs)
}

/// Allocates the places of a new block of `data` and returns its pointer; nothing is written.
/// With `held` (the intent log's blocks written in place, outside any txg sync), the places
/// are recorded there under the pool's state lock, in the same step as the allocation, so a
/// txg sync whose space maps include the allocation finds them there; and the allocation must
/// leave the pending syncs the space they may need, or it fails with NoSpace (the log then
/// falls back to waiting for the txg).
pub(crate) fn alloc_new_block(
    inner: &PoolInner,
    data: &IoBuf,
    nb: NewBlock,
    held: Option<&Mutex<HashSet<Dva>>>,
) -> Result<BlockPtr> {
    let asize = data.len() as u64;
    debug_assert_eq!(asize % SECTOR_BYTES, 0);
    let no_space = || EngineError::NoSpace {
        pool: inner.name.clone(),
    };
    let dvas = {
        let mut s = inner.state.lock().unwrap();
        if held.is_some() {
            let mut extra = ClassBytes::default();
            extra.add_blocks(asize, nb.copies as u64, 1);
            if !inner.may_allocate_outside_sync(&s.alloc, extra) {
                return Err(no_space());
            }
        }
        // The sync's blocks go to adjacent places (one aggregated write) while empty space is
        // plentiful: while the empty slabs alone hold everything pending syncs may still
        // allocate, with the reserve, spending them cannot make a later block not fit.
        let sequential = held.is_none() && {
            let space = s.alloc.space();
            let need = inner.txg.state.lock().unwrap().space_needed();
            let reserve = PoolInner::sync_reserve(&s.alloc, &space, false);
            space.holds_all(&need, reserve, nb.copies)
        };
        let dvas = s
            .alloc
            .alloc_with(asize, nb.copies, sequential)
            .ok_or_else(no_space)?;
        if let Some(h) = held {
            h.lock().unwrap().extend(dvas.iter().copied());
        }
        dvas
    };
    let mut bp = BlockPtr {
        ndvas: dvas.len() as u8,
        lsize_bytes: nb.lsize_bytes,
        psize_bytes: nb.psize_bytes,
        checksum_type: nb.checksum_type,
        compression: nb.compression,
        block_type: nb.block_type,
        level: nb.level,
        birth: nb.txg,
        fill: nb.fill,
        checksum: checksum(nb.checksum_type, &data[..nb.psize_bytes as usize]),
        ..BlockPtr::HOLE
    };
    bp.dvas[..dvas.len()].copy_from_slice(&dvas);
    Ok(bp)
}

pub(crate) fn padded(data: &[u8]) -> IoBuf {
    let len = (data.len() as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
    let mut b = IoBuf::zeroed(len as usize);
    b[..data.len()].copy_from_slice(data);
    b
}

/// A dirty data block once the sync has its whole content.
// Lives only in one batch's vector (at most SYNC_WRITES_IN_FLIGHT_MAX): boxing the pointers
// would cost an allocation per block to save a few KiB for a moment.
#[allow(clippy::large_enum_variant)]
enum Prepared {
    /// Nothing to write: the block the log wrote in place with this content.
    Done(BlockPtr, Option<BlockPtr>),
    /// The content: the merged block for a partial one, else the dirty buffer.
    Content(Option<IoBuf>),
}

/// What the sync does with one dirty data block.
#[allow(clippy::large_enum_variant)]
enum DataWrite {
    /// Nothing to write: the block's pointer (a hole, or the block the log wrote in place),
    /// and the log's block to free if it is not that one.
    Done(BlockPtr, Option<BlockPtr>),
    /// Write `data` (the stored bytes, whole sectors) to a new place as `nb`.
    Write {
        nb: NewBlock,
        data: Arc<IoBuf>,
        cache: CacheAfter,
    },
}

/// What goes to the data cache once a block is written (the cache holds content).
enum CacheAfter {
    Nothing,
    /// The buffer written, which is the content (a merged block stored as is).
    Written,
    /// This content (a merged block stored compressed).
    Content(IoBuf),
}

/// Writes txg `txg` out and commits it (see the module comment for the protocol).
pub(crate) async fn sync_txg(inner: &PoolInner, txg: Txg) -> Result<()> {
    let mut freed: Vec<Dva> = Vec::new();
    inner.log_alloc_bytes_since_sync.store(0, Ordering::Relaxed);
    // Frees old enough are allocatable again from this txg on.
    {
        let mut s = inner.state.lock().unwrap();
        let pin = s.scan_pin;
        let (ready, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut s.deferred)
            .into_iter()
            .partition(|d| d.txg.0 + DEFER_TXGS < txg.0 && pin.is_none_or(|p| d.txg <= p));
        s.deferred = keep;
        for d in ready {
            for dva in &d.dvas {
                s.alloc.free(dva);
            }
        }
    }
    let (volumes, destroyed) = {
        let mut s = inner.state.lock().unwrap();
        (
            s.volumes.values().cloned().collect::<Vec<_>>(),
            std::mem::take(&mut s.destroyed),
        )
    };
    for vol in &volumes {
        sync_volume(inner, vol, txg, false, &mut freed).await?;
    }
    for vol in &destroyed {
        sync_volume(inner, vol, txg, true, &mut freed).await?;
    }
    // Space maps: give every changed chunk a new place until no allocation changes a chunk
    // that has none yet (each round only allocates for chunks new to the set: bounded by the
    // number of chunks), then write them with their final bits.
    let mut pending: BTreeMap<(u32, u64), Vec<Dva>> = BTreeMap::new();
    {
        let mut s = inner.state.lock().unwrap();
        let nvdevs = s.alloc.maps().len();
        let chunk_total: usize = s.chunk_ptrs.iter().map(|c| c.len()).sum();
        for _round in 0..=chunk_total + 1 {
            let mut added = false;
            for v in 0..nvdevs {
                let dirty = s.alloc.map_mut(VdevId(v as u32)).take_dirty_chunks();
                for c in dirty {
                    if let std::collections::btree_map::Entry::Vacant(e) =
                        pending.entry((v as u32, c))
                    {
                        let dvas = s.alloc.alloc(SECTOR_BYTES, META_COPIES).ok_or_else(|| {
                            EngineError::NoSpace {
                                pool: inner.name.clone(),
                            }
                        })?;
                        e.insert(dvas);
                        added = true;
                    }
                }
            }
            if !added {
                break;
            }
        }
        debug_assert!(s.alloc.maps().iter().all(|m| m.dirty_chunk_count() == 0));
    }
    let mut chunk_writes = Vec::new();
    {
        let s = inner.state.lock().unwrap();
        for ((v, c), dvas) in &pending {
            let mut bits = vec![0u8; SPACEMAP_CHUNK_PAYLOAD_BYTES];
            s.alloc.map(VdevId(*v)).chunk_bits(*c, &mut bits);
            let block = IoBuf::from_slice(&encode_meta_block(BlockType::SpaceMap, &bits));
            let mut bp = BlockPtr {
                ndvas: dvas.len() as u8,
                lsize_bytes: block.len() as u32,
                psize_bytes: block.len() as u32,
                checksum_type: oxpool_format::ChecksumType::Xxh3_128,
                compression: Compression::Off,
                block_type: BlockType::SpaceMap,
                level: 0,
                birth: txg,
                fill: 0,
                checksum: checksum(oxpool_format::ChecksumType::Xxh3_128, &block),
                ..BlockPtr::HOLE
            };
            bp.dvas[..dvas.len()].copy_from_slice(dvas);
            let old = s.chunk_ptrs[*v as usize][*c as usize];
            chunk_writes.push((*v, *c, bp, Arc::new(block), old));
        }
    }
    for batch in chunk_writes.chunks(SYNC_WRITES_IN_FLIGHT_MAX) {
        let list: Vec<(&[Dva], &Arc<IoBuf>)> = batch
            .iter()
            .map(|(_, _, bp, block, _)| (bp.dvas(), block))
            .collect();
        for r in write_blocks_shared(&inner.zio, IoClass::AsyncWrite, &list).await {
            r?;
        }
    }
    // The logs' places, taken after the space maps were encoded (so every log block allocated
    // before then is either still held, and listed, or handed back here to free) and without
    // the pool lock (committers allocate while holding their log's lock).
    type LogHead = Option<(Dva, u64)>;
    let mut log_info: BTreeMap<u64, (LogHead, Vec<Dva>)> = BTreeMap::new();
    for vol in &volumes {
        freed.extend(vol.zil.take_to_free());
        let mut reserved = vol.zil.reserved();
        reserved.extend(vol.inplace_held.lock().unwrap().iter().copied());
        log_info.insert(vol.id.0, (vol.zil.head(), reserved));
    }
    for vol in &destroyed {
        freed.extend(vol.zil.take_to_free());
        freed.extend(vol.zil.reserved());
    }
    // Build the pool metadata.
    let meta_block = {
        let mut s = inner.state.lock().unwrap();
        for (v, c, bp, _, old) in &chunk_writes {
            s.chunk_ptrs[*v as usize][*c as usize] = *bp;
            freed.extend_from_slice(old.dvas());
        }
        freed.extend_from_slice(&s.meta_places);
        let mut deferred = s.deferred.clone();
        if !freed.is_empty() {
            deferred.push(DeferredFree {
                txg,
                dvas: freed.clone(),
            });
        }
        let meta = PoolMeta {
            name: inner.name.clone(),
            guid: inner.guid,
            txg,
            tree: inner.zio.vdevs.config(),
            props: s.props.to_pairs(),
            volumes: s
                .volumes
                .values()
                .map(|v| {
                    let p = v.props.lock().unwrap();
                    let t = v.tree.lock().unwrap();
                    VolumeMeta {
                        id: v.id,
                        name: v.name.clone(),
                        props: p.to_pairs(),
                        // Not `p`'s: a resize in the open txg goes with its frees.
                        volsize_bytes: v.tree_size_bytes.load(Ordering::Relaxed),
                        volblocksize_bytes: p.volblocksize_bytes,
                        root: t.root(),
                        levels: t.levels(),
                        used_bytes: v.used_bytes.load(Ordering::Relaxed),
                        log_first: log_info
                            .get(&v.id.0)
                            .and_then(|i| i.0)
                            .map(|h| h.0)
                            .unwrap_or_default(),
                        log_first_seq: log_info
                            .get(&v.id.0)
                            .and_then(|i| i.0)
                            .map(|h| h.1)
                            .unwrap_or(0),
                        log_reserved: log_info
                            .get(&v.id.0)
                            .map(|i| i.1.clone())
                            .unwrap_or_default(),
                        compressed_bytes: v.compressed_bytes.load(Ordering::Relaxed),
                    }
                })
                .collect(),
            spacemaps: s
                .alloc
                .maps()
                .iter()
                .enumerate()
                .map(|(v, m)| SpaceMapMeta {
                    vdev: VdevId(v as u32),
                    allocated_bytes: m.allocated_bytes(),
                    chunks: s.chunk_ptrs[v].clone(),
                })
                .collect(),
            deferred_frees: deferred,
            next_volume_id: s.next_volume_id,
        };
        meta.encode()
    };
    let (meta_ptr, meta_places) = write_pool_meta(inner, txg, &meta_block).await?;
    flush_all(inner).await?;
    let ub = Uberblock {
        txg,
        timestamp_ns: now_ns(),
        pool_guid: inner.guid,
        root: meta_ptr,
    };
    let mut written = 0;
    let mut last_err = None;
    let leaves: Vec<_> = inner.zio.vdevs.leaves().cloned().collect();
    let futs: Vec<_> = leaves
        .iter()
        .map(|l| {
            let ub = &ub;
            async move { write_uberblock(l.backend.as_ref(), ub).await }
        })
        .collect();
    for r in join_all(futs).await {
        match r {
            Ok(()) => written += 1,
            Err(e) => last_err = Some(e),
        }
    }
    if written == 0 {
        return Err(last_err.unwrap_or_else(|| EngineError::invalid("no device to commit to")));
    }
    flush_all(inner).await?;
    // Durable. Publish the new state.
    {
        let mut s = inner.state.lock().unwrap();
        s.meta_ptr = meta_ptr;
        s.meta_places = meta_places;
        if !freed.is_empty() {
            s.deferred.push(DeferredFree { txg, dvas: freed });
        }
        let cache_blocks =
            (s.props.cache_max_bytes as usize / BlockTree::CACHED_BLOCK_BYTES).max(64);
        let per_volume = (cache_blocks / volumes.len().max(1)).max(16);
        for vol in &volumes {
            vol.dirty.lock().unwrap().retire(txg);
            vol.tree.lock().unwrap().evict(per_volume);
        }
    }
    for vol in &volumes {
        vol.zil.txg_synced(txg);
        vol.zil.restart_if_broken(txg);
    }
    Ok(())
}

/// Sets every leaf's vdev queue mode from the pool's properties.
fn apply_scheduler(inner: &PoolInner) {
    let s = inner.state.lock().unwrap();
    for leaf in inner.zio.vdevs.leaves() {
        leaf.queue.set_mode(s.props.device_scheduler(leaf.guid));
    }
}

async fn flush_all(inner: &PoolInner) -> Result<()> {
    // One snapshot of the tree: a vdev added meanwhile is not in this txg's configuration.
    let tops: Vec<&TopVdev> = inner.zio.vdevs.tops().collect();
    let ios: Vec<(usize, Arc<Leaf>)> = tops
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.leaves().map(move |l| (i, l.clone())))
        .collect();
    let futs: Vec<_> = ios.iter().map(|(_, l)| l.flush()).collect();
    let mut flushed = vec![false; tops.len()];
    let mut last_err = None;
    for ((top, l), r) in ios.iter().zip(join_all(futs).await) {
        inner
            .log_counters
            .device_flushes
            .fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(()) => flushed[*top] = true,
            Err(e) => {
                l.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                last_err = Some(EngineError::io(l.name(), e));
            }
        }
    }
    // Every top-level vdev must have a child whose writes are now durable: a stripe whose
    // member did not flush cannot commit, since blocks of this txg may live only there. A
    // mirror child that failed is counted and the mirror goes on with the others.
    if flushed.iter().all(|&f| f) {
        Ok(())
    } else {
        Err(last_err.unwrap_or_else(|| EngineError::invalid("a top-level vdev has no device")))
    }
}

/// Writes one volume's part of txg `txg`: frees, data blocks, indirect blocks. With
/// `destroy`, frees everything the volume has.
async fn sync_volume(
    inner: &PoolInner,
    vol: &VolumeInner,
    txg: Txg,
    destroy: bool,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    let what = vol.full_name.as_str();
    let (props, nblocks) = {
        let p = vol.props.lock().unwrap();
        (p.clone(), p.volsize_bytes / p.volblocksize_bytes as u64)
    };
    type Frees = Vec<(u64, u64)>;
    // (block, dirty buffer, sectors written if the block is partial)
    type Blocks = Vec<(u64, Arc<IoBuf>, Option<SectorMask>)>;
    let (frees, mut blocks): (Frees, Blocks) = {
        let d = vol.dirty.lock().unwrap();
        match d.txgs.iter().find(|(t, _)| *t == txg) {
            Some((_, t)) => {
                if let Some(size) = t.size_bytes {
                    vol.tree_size_bytes.store(size, Ordering::Relaxed);
                }
                (
                    t.frees.iter().map(|(&s, &e)| (s, e)).collect(),
                    t.blocks
                        .iter()
                        .map(|(&b, block)| {
                            let written = match block {
                                DirtyBlock::Data(_) => None,
                                DirtyBlock::Partial(_, m) => Some(*m),
                            };
                            (b, Arc::clone(block.buf()), written)
                        })
                        .collect(),
                )
            }
            None => (Vec::new(), Vec::new()),
        }
    };
    let mut frees = frees;
    if destroy {
        frees = vec![(0, capacity(vol.tree.lock().unwrap().levels()))];
        blocks.clear();
    }
    vol.tree.lock().unwrap().grow_for(nblocks);
    let mut used_delta: i64 = 0;
    // The change of the data blocks' stored bytes (one copy each), for `compressratio`.
    let mut compressed_delta: i64 = 0;
    // 1. Frees (applied before the txg's writes, which may land inside a freed range).
    for (start, end) in frees {
        let mut b = start;
        // Bounded: each round moves past one level-1 block or one hole subtree.
        while b < end {
            match walk(&vol.tree, &inner.zio, IoClass::AsyncRead, b, 1, false, what).await? {
                Walk::Hole { level } => b = skip_hole(b, level).max(b + 1),
                Walk::Cached => {
                    let mut removed = Vec::new();
                    let next = (b / FANOUT + 1) * FANOUT;
                    if vol
                        .tree
                        .lock()
                        .unwrap()
                        .clear_data_range(b, end.min(next), &mut removed)
                    {
                        for p in removed {
                            used_delta -=
                                p.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
                            compressed_delta -= stored_bytes(&p);
                            freed.extend_from_slice(p.dvas());
                        }
                        b = next;
                    }
                }
            }
        }
    }
    // 2. Data blocks, written concurrently in bounded batches. A block the intent log already
    // wrote in place with this very content is adopted, not written again; the log's other
    // in-place blocks of this txg (or older) are freed.
    blocks.sort_unstable_by_key(|(b, _, _)| *b);
    let bs = props.volblocksize_bytes;
    let mut overrides: HashMap<u64, crate::zio::compress::InPlaceBlock> = HashMap::new();
    // Every in-place block taken here is adopted or freed by this txg: no longer held.
    {
        let mut o = vol.overrides.lock().unwrap();
        let mut held = vol.inplace_held.lock().unwrap();
        let mine: Vec<(Txg, u64)> = o.keys().filter(|(t, _)| *t <= txg).copied().collect();
        for k in mine {
            let block = o.remove(&k).unwrap();
            block.bp.dvas().iter().for_each(|d| {
                held.remove(d);
            });
            if k.0 == txg && !destroy {
                overrides.insert(k.1, block);
            } else {
                freed.extend_from_slice(block.bp.dvas());
            }
        }
        vol.override_garbage.lock().unwrap().retain(|(t, bp)| {
            if *t <= txg {
                bp.dvas().iter().for_each(|d| {
                    held.remove(d);
                });
                freed.extend_from_slice(bp.dvas());
                false
            } else {
                true
            }
        });
    }
    let overrides = &overrides;
    let data_props = &props;
    let compression = props.compression;
    for batch in blocks.chunks(SYNC_WRITES_IN_FLIGHT_MAX) {
        // Merge partial blocks with their old content (reads it: frees of this txg, applied
        // above, never cover a partial block of this txg); find the blocks the log already
        // wrote with this content.
        let prepare = batch.iter().map(|(b, dirty_buf, written)| async move {
            let merged = match written {
                None => None,
                Some(w) => {
                    Some(merge_partial(inner, vol, txg, *b, dirty_buf, w, bs as usize).await?)
                }
            };
            let buf: &IoBuf = merged.as_ref().unwrap_or(dirty_buf);
            if let Some(o) = overrides.get(b) {
                if o.holds(buf) {
                    inner
                        .log_counters
                        .adopted_blocks
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(Prepared::Done(o.bp, None));
                }
            }
            Ok(Prepared::Content(merged))
        });
        let prepared = join_all(prepare.collect::<Vec<_>>())
            .await
            .into_iter()
            .collect::<Result<Vec<Prepared>>>()?;
        // How each block is stored (compressed, as is, or a hole): CPU work, done here
        // between the merge reads and the writes, on every core (`store_all`).
        let contents: Vec<&[u8]> = prepared
            .iter()
            .zip(batch)
            .filter_map(|(p, (_, dirty_buf, _))| match p {
                Prepared::Done(..) => None,
                Prepared::Content(merged) => Some(&merged.as_ref().unwrap_or(dirty_buf)[..]),
            })
            .collect();
        let mut stored_forms = crate::zio::compress::store_all(compression, &contents).into_iter();
        drop(contents);
        let mut to_write: Vec<DataWrite> = Vec::with_capacity(batch.len());
        for (p, (b, dirty_buf, _)) in prepared.into_iter().zip(batch) {
            to_write.push(match p {
                Prepared::Done(bp, unused) => DataWrite::Done(bp, unused),
                Prepared::Content(merged) => {
                    let buf: &IoBuf = merged.as_ref().unwrap_or(dirty_buf);
                    let stored = stored_forms.next().expect("one stored form per content");
                    crate::zio::compress::COMPRESS_COUNTERS.note_written(buf.len(), &stored);
                    let nb = NewBlock::data(data_props, txg);
                    match stored {
                        // All zeros, compression on: a hole, as ZFS does.
                        crate::zio::compress::StoreAs::Hole => DataWrite::Done(
                            crate::zio::compress::zero_hole(txg),
                            overrides.get(b).map(|o| o.bp),
                        ),
                        crate::zio::compress::StoreAs::Compressed(c) => DataWrite::Write {
                            nb: nb.compressed(&c),
                            data: Arc::new(c.buf),
                            // The merged block goes to the data cache as its content.
                            cache: merged.map_or(CacheAfter::Nothing, CacheAfter::Content),
                        },
                        crate::zio::compress::StoreAs::AsIs
                            if !(buf.len() as u64).is_multiple_of(SECTOR_BYTES) =>
                        {
                            // A block smaller than a sector is written padded (a copy).
                            DataWrite::Write {
                                nb,
                                data: Arc::new(padded(buf)),
                                cache: CacheAfter::Nothing,
                            }
                        }
                        crate::zio::compress::StoreAs::AsIs => match merged {
                            // The merged block is the sync's own: once written it goes to the
                            // data cache (no copy), so the next partial write to the block
                            // merges from memory.
                            Some(merged) => DataWrite::Write {
                                nb,
                                data: Arc::new(merged),
                                cache: CacheAfter::Written,
                            },
                            // A whole dirty block is written from the buffer readers share
                            // until the txg retires (no copy). It is not cached: seldom merged
                            // again, it would only crowd out what reads brought in.
                            None => DataWrite::Write {
                                nb,
                                data: Arc::clone(dirty_buf),
                                cache: CacheAfter::Nothing,
                            },
                        },
                    }
                }
            });
        }
        // Places in block order, so that next-fit hands out adjacent ones and the writes of
        // the batch aggregate into a few large I/Os.
        let mut ptrs: Vec<Result<(BlockPtr, Option<BlockPtr>)>> = Vec::with_capacity(batch.len());
        let mut writes: Vec<(usize, BlockPtr, Arc<IoBuf>, CacheAfter)> = Vec::new();
        for (i, (w, (b, _, _))) in to_write.into_iter().zip(batch).enumerate() {
            match w {
                DataWrite::Done(bp, unused) => ptrs.push(Ok((bp, unused))),
                DataWrite::Write { nb, data, cache } => {
                    let bp = alloc_new_block(inner, &data, nb, None)?;
                    ptrs.push(Ok((bp, overrides.get(b).map(|o| o.bp))));
                    writes.push((i, bp, data, cache));
                }
            }
        }
        let list: Vec<(&[Dva], &Arc<IoBuf>)> = writes
            .iter()
            .map(|(_, bp, data, _)| (bp.dvas(), data))
            .collect();
        let written = write_blocks_shared(&inner.zio, IoClass::AsyncWrite, &list).await;
        drop(list);
        for ((i, bp, data, cache), r) in writes.into_iter().zip(written) {
            if let Err(e) = r {
                ptrs[i] = Err(e);
                continue;
            }
            match cache {
                CacheAfter::Nothing => {}
                // The write gave its references back: the merged buffer is ours again.
                CacheAfter::Written => {
                    if let Ok(buf) = Arc::try_unwrap(data) {
                        inner.zio.data_cache.insert(CacheKey::of(&bp), buf);
                    }
                }
                CacheAfter::Content(buf) => inner.zio.data_cache.insert(CacheKey::of(&bp), buf),
            }
        }
        for ((b, _, _), ptr) in batch.iter().zip(ptrs) {
            let (ptr, unused) = ptr?;
            if let Some(u) = unused {
                freed.extend_from_slice(u.dvas());
            }
            walk(&vol.tree, &inner.zio, IoClass::AsyncRead, *b, 1, true, what).await?;
            let old = vol
                .tree
                .lock()
                .unwrap()
                .set_data_ptr(*b, ptr)
                .expect("level-1 block cached by the walk");
            used_delta += ptr.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
            used_delta -= old.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
            compressed_delta += stored_bytes(&ptr) - stored_bytes(&old);
            freed.extend_from_slice(old.dvas());
        }
    }
    for (b, o) in overrides.iter() {
        if blocks.binary_search_by_key(b, |(x, _, _)| *x).is_err() {
            freed.extend_from_slice(o.bp.dvas());
        }
    }
    // 3. Indirect blocks, bottom up; a block left with no data below becomes a hole.
    let levels = vol.tree.lock().unwrap().levels();
    let meta_copies = crate::zvol::indirect_copies(&props);
    for level in 1..=levels {
        let dirty = vol.tree.lock().unwrap().dirty_at(level);
        for batch in dirty.chunks(SYNC_WRITES_IN_FLIGHT_MAX) {
            let encoded: Vec<(u64, Arc<IoBuf>, u64)> = {
                let t = vol.tree.lock().unwrap();
                batch
                    .iter()
                    .map(|&idx| {
                        let mut buf = IoBuf::zeroed(INDIRECT_BLOCK_BYTES);
                        let fill = t.encode_block(level, idx, &mut buf);
                        (idx, Arc::new(buf), fill)
                    })
                    .collect()
            };
            let to_write: Vec<(&Arc<IoBuf>, NewBlock)> = encoded
                .iter()
                .filter(|(_, _, fill)| *fill != 0)
                .map(|(_, buf, fill)| {
                    let nb = NewBlock {
                        psize_bytes: INDIRECT_BLOCK_BYTES as u32,
                        lsize_bytes: INDIRECT_BLOCK_BYTES as u32,
                        compression: Compression::Off,
                        block_type: BlockType::Indirect,
                        level,
                        copies: meta_copies,
                        checksum_type: oxpool_format::ChecksumType::Xxh3_128,
                        txg,
                        fill: *fill,
                    };
                    (buf, nb)
                })
                .collect();
            let mut written = write_new_blocks(inner, IoClass::AsyncWrite, &to_write)
                .await?
                .into_iter();
            let ptrs = encoded.iter().map(|(_, _, fill)| -> Result<BlockPtr> {
                Ok(match fill {
                    0 => BlockPtr::HOLE,
                    _ => written.next().expect("one pointer per block written"),
                })
            });
            for ((idx, _, _), ptr) in encoded.iter().zip(ptrs.collect::<Vec<_>>()) {
                let ptr = ptr?;
                // The parent must be cached to take the pointer: load it if it was evicted.
                let mut tries = 0;
                let old = loop {
                    let r = vol.tree.lock().unwrap().finish_block(level, *idx, ptr);
                    match r {
                        Ok(old) => break old,
                        Err(()) => {
                            tries += 1;
                            if tries > 100 {
                                return Err(EngineError::invalid(format!(
                                    "{what}: parent of indirect block L{level}/{idx} kept being evicted"
                                )));
                            }
                            let b = idx * crate::dmu::tree::capacity(level);
                            walk(
                                &vol.tree,
                                &inner.zio,
                                IoClass::AsyncRead,
                                b,
                                level + 1,
                                true,
                                what,
                            )
                            .await?;
                        }
                    }
                };
                used_delta += ptr.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
                used_delta -= old.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
                freed.extend_from_slice(old.dvas());
            }
        }
    }
    {
        let t = vol.tree.lock().unwrap();
        debug_assert!(!t.has_dirty());
        *vol.written_root.lock().unwrap() = (t.root(), t.levels());
    }
    let used = vol.used_bytes.load(Ordering::Relaxed) as i64 + used_delta;
    debug_assert!(used >= 0);
    vol.used_bytes.store(used.max(0) as u64, Ordering::Relaxed);
    let stored = vol.compressed_bytes.load(Ordering::Relaxed) as i64 + compressed_delta;
    debug_assert!(stored >= 0);
    vol.compressed_bytes
        .store(stored.max(0) as u64, Ordering::Relaxed);
    Ok(())
}
