//! Import: assembling a pool from the devices whose labels name it.

use crate::iostats::LogCounters;
use crate::props::PoolProps;
use crate::spa::meta::load_meta;
use crate::spa::txg::TxgControl;
use crate::spa::{effective_dirty_max, Spa, SpaState};
use crate::vdev::alloc::Allocator;
use crate::vdev::label::read_uberblocks;
use crate::vdev::queue::IoClass;
use crate::vdev::{Leaf, TopVdev, VdevTree};
use crate::zio::{read_block, Zio};
use crate::{EngineError, Result};
use oxpool_format::{
    decode_meta_block, BlockType, Dva, LabelConfig, PoolMeta, TopVdevKind, VdevId,
    SPACEMAP_CHUNK_PAYLOAD_BYTES,
};
use oxpool_io::Backend;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to import a pool ([`crate::Pool::import_with`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ImportOptions {
    /// Import even if a separate log device is missing (`oxpool import -m`, as `zpool import
    /// -m`): the intent-log records on it are lost (acknowledged sync writes of the last
    /// txgs before the pool stopped), and the log vdev stays UNAVAIL, used for nothing,
    /// until `oxpool remove` takes it out.
    pub missing_log: bool,
}

/// Which pool an import takes among the devices it is given ([`crate::Pool::import_as`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolRef<'a> {
    /// The only pool the devices hold (refused if they hold several).
    #[default]
    Any,
    /// The pool whose labels name it (refused if several pools of that name are found:
    /// they are told apart by id).
    Name(&'a str),
    /// The pool of this guid.
    Id(oxpool_format::Guid),
    /// `oxpool import NAME_OR_ID`: the pool named so, or whose guid in hex (as `oxpool
    /// import` lists it) it is, as `zpool import` takes a name or an id.
    NameOrId(&'a str),
}

impl PoolRef<'_> {
    /// Whether a device whose label names pool `name` of `guid` is one this selects. A
    /// name matches any label of the pool: during a rename some may still carry the old
    /// one (the pool's metadata holds the name, see [`import_devices`]).
    pub fn matches(&self, name: &str, guid: oxpool_format::Guid) -> bool {
        match *self {
            PoolRef::Any => true,
            PoolRef::Name(n) => n == name,
            PoolRef::Id(g) => g == guid,
            PoolRef::NameOrId(s) => s == name || parse_id(s) == Some(guid),
        }
    }
}

/// A pool id as `oxpool import` lists it: the guid in hex (an `0x` before it is taken too).
pub fn parse_id(s: &str) -> Option<oxpool_format::Guid> {
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    // Hex digits only: from_str_radix alone would take a leading '+'.
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(oxpool_format::Guid)
}

/// Assembles and loads a pool from devices whose labels name it: the newest uberblock whose
/// metadata verifies, the vdev tree as that metadata records it, the space maps. Returns the
/// pool (its sync thread not started: nothing allocates until the caller has claimed the
/// places its intent logs hold, see [`Spa::claim`]) and the metadata, for the layers above.
///
/// The pool's name is `new_name` if given (`oxpool import POOL NEWNAME`), else the one its
/// metadata records: the labels' copies are hints, which a rename interrupted by a crash
/// leaves partly old (the metadata's name changes atomically with a txg; the labels are
/// rewritten after it, and mended at the next import).
pub(crate) async fn import_devices(
    found: Vec<(LabelConfig, Arc<dyn Backend>)>,
    opts: ImportOptions,
    new_name: Option<&str>,
) -> Result<(Arc<Spa>, PoolMeta)> {
    let cfg0 = found[0].0.clone();
    // Until the metadata is read, errors name the pool as its labels do.
    let label_name = cfg0.pool_name.clone();
    let pool_name = label_name.clone();
    let config = found
        .iter()
        .map(|(c, _)| &c.tree)
        .max_by_key(|t| t.top.len())
        .unwrap()
        .clone();
    // A device smaller than the size the pool recorded for it (a truncated file, a smaller
    // disk behind the same path) lacks its end: its last blocks and end labels. It is not
    // taken, as ZFS does not open a device that shrank, and shows UNAVAIL with why; the
    // pool runs from its redundancy, or import refuses it naming what is missing.
    let mut import_refusals = Vec::new();
    let found: Vec<(LabelConfig, Arc<dyn Backend>)> = found
        .into_iter()
        .filter(|(label, dev)| {
            let recorded = config
                .leaves()
                .find(|l| l.guid == label.leaf_guid)
                .map(|l| l.size_bytes);
            match recorded {
                Some(size) if dev.size_bytes() < size => {
                    let why = format!(
                        "device is {} bytes, smaller than the {size} the pool recorded \
                         (truncated?)",
                        dev.size_bytes()
                    );
                    // Said once the pool is open (below), and in any refusal that names it.
                    import_refusals.push((label.leaf_guid, why));
                    false
                }
                _ => true,
            }
        })
        .collect();
    if found.is_empty() {
        let why: Vec<&str> = import_refusals.iter().map(|(_, w)| w.as_str()).collect();
        return Err(EngineError::NotFound(format!(
            "pool '{pool_name}': no device can be used ({})",
            why.join("; ")
        )));
    }
    // A device's path, with why it was not taken if it was present but refused.
    let named = |lc: &oxpool_format::LeafConfig| match import_refusals
        .iter()
        .find(|(g, _)| *g == lc.guid)
    {
        Some((_, why)) => format!("{}: {why}", lc.path),
        None => lc.path.clone(),
    };
    // "Not found" only if none of `children` was found and refused; otherwise the refusal
    // named with the path says why, and a ": not found" after it would contradict it.
    let missing_error = |children: &[oxpool_format::LeafConfig], what: String| {
        if children
            .iter()
            .any(|lc| import_refusals.iter().any(|(g, _)| *g == lc.guid))
        {
            EngineError::invalid(what)
        } else {
            EngineError::NotFound(what)
        }
    };
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
        // A log vdev with no device present may be one the pool's metadata records as
        // removed (these labels are older), or may be imported without its records (`-m`):
        // decided once the metadata is read. A hole has no device to be present.
        if children.iter().all(|c| c.is_none()) && !tcfg.log && tcfg.kind != TopVdevKind::Hole {
            let paths: Vec<String> = tcfg.children.iter().map(named).collect();
            return Err(missing_error(
                &tcfg.children,
                format!(
                    "pool '{pool_name}': vdev {} has no device present (expected {})",
                    tcfg.id.0,
                    paths.join(", ")
                ),
            ));
        }
        // A raidz vdev missing more children than its parity cannot give back any block
        // that spans them: refuse with what is missing rather than fail on its first read.
        if let oxpool_format::TopVdevKind::Raidz(r) = &tcfg.kind {
            let missing: Vec<String> = tcfg
                .children
                .iter()
                .zip(&children)
                .filter(|(_, c)| c.is_none())
                .map(|(lc, _)| named(lc))
                .collect();
            if missing.len() > usize::from(r.parity) {
                return Err(missing_error(
                    &tcfg.children,
                    format!(
                        "pool '{pool_name}': raidz{}-{} can lose {} of its devices, {} are \
                         missing ({})",
                        r.parity,
                        tcfg.id.0,
                        r.parity,
                        missing.len(),
                        missing.join(", ")
                    ),
                ));
            }
        }
        tops.push(TopVdev::with_leaves(tcfg, &|g| {
            children.iter().flatten().find(|l| l.guid == g).cloned()
        })?);
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
    let mut newest_of_leaf = Vec::new();
    for leaf in zio.vdevs.leaves() {
        let found = read_uberblocks(leaf.backend.as_ref()).await;
        let newest = found
            .iter()
            .filter(|u| u.pool_guid == cfg0.pool_guid)
            .map(|u| u.txg)
            .max();
        newest_of_leaf.push((leaf.clone(), newest));
        ubs.extend(found);
    }
    ubs.retain(|u| u.pool_guid == cfg0.pool_guid);
    ubs.sort_by_key(|u| std::cmp::Reverse(u.txg));
    ubs.dedup();
    // Every txg writes its uberblock to every leaf in service, after its blocks: a leaf
    // whose newest uberblock is older than the pool's newest was out of service, or lost
    // writes, for the txgs in between, and may lack their blocks (reads try it last, a scrub
    // repairs it). As ZFS compares a label's txg with the pool's.
    if let Some(top_txg) = ubs.first().map(|u| u.txg) {
        for (leaf, newest) in &newest_of_leaf {
            let first_missed =
                newest.map_or(oxpool_format::Txg(1), |n| oxpool_format::Txg(n.0 + 1));
            if first_missed <= top_txg {
                leaf.health.note_missed(first_missed, top_txg);
            }
        }
    }
    let mut last_err = None;
    let mut chosen = None;
    // The uberblocks that could not be used are said once an older one is (the pool goes
    // back to it), or by the error if none can be: not a line per bad copy on every command
    // that opens a damaged pool.
    let mut unusable = Vec::new();
    {
        let _quiet = crate::zio::warn_limit::Quiet::enter();
        for ub in ubs {
            match load_meta(&zio, &ub.root, &pool_name).await {
                Ok(meta) => {
                    chosen = Some((ub, meta));
                    break;
                }
                Err(e) => {
                    unusable.push(format!("uberblock of txg {} unusable: {e}", ub.txg.0));
                    last_err = Some(e);
                }
            }
        }
    }
    if chosen.is_some() {
        for u in &unusable {
            tracing::warn!(pool = pool_name, "{u}");
        }
    }
    let Some((ub, (meta, meta_places))) = chosen else {
        let devs: Vec<String> = zio.vdevs.leaves().map(|l| l.name().to_string()).collect();
        return Err(match last_err {
            Some(e) => e,
            None => EngineError::invalid(format!(
                "pool '{pool_name}': no valid uberblock on {}",
                devs.join(", ")
            )),
        });
    };
    // The devices' state records ride among the properties (`vdev/states.rs`).
    let (state_records, plain_props): (Vec<_>, Vec<_>) = meta
        .props
        .iter()
        .cloned()
        .partition(|(k, _)| k.starts_with(crate::vdev::STATE_RECORD_PREFIX));
    // So does the scan's record (`dsl/scan.rs`).
    let (scan_records, plain_props): (Vec<_>, Vec<_>) = plain_props
        .into_iter()
        .partition(|(k, _)| k == super::SCAN_RECORD_KEY);
    let scan_record = scan_records.into_iter().next().map(|(_, v)| v);
    // And the log vdevs an earlier import gave up (`-m`).
    let (discarded_records, plain_props): (Vec<_>, Vec<_>) = plain_props
        .into_iter()
        .partition(|(k, _)| k == super::LOG_DISCARDED_KEY);
    let discarded_before = vdev_ids(&pool_name, super::LOG_DISCARDED_KEY, &discarded_records)?;
    // And the log vdevs emptied and taken offline (`Spa::offline_log`).
    let (emptied_records, plain_props): (Vec<_>, Vec<_>) = plain_props
        .into_iter()
        .partition(|(k, _)| k == super::LOG_EMPTIED_KEY);
    let emptied: Vec<VdevId> = vdev_ids(&pool_name, super::LOG_EMPTIED_KEY, &emptied_records)?
        .into_iter()
        .filter(|v| {
            meta.tree
                .top
                .get(v.0 as usize)
                .is_some_and(|t| t.log && t.kind != TopVdevKind::Hole)
        })
        .collect();
    let props = PoolProps::from_pairs(&plain_props)?;
    zio.completion.set(props.completion);
    zio.vdevs
        .fault_policy
        .set(props.fault_errors, props.fault_window_s);
    zio.data_cache.set_max_bytes(props.data_cache_max_bytes);
    // The pool's own record of its zio.vdevs is the truth; labels only help find devices. A vdev
    // the labels found no trace of (a log device added later, then lost) cannot be skipped:
    // its log blocks may hold acknowledged writes.
    if meta.tree.top.len() > zio.vdevs.top_count() {
        let unknown = &meta.tree.top[zio.vdevs.top_count()..];
        let lost: Vec<String> = unknown
            .iter()
            .filter(|t| {
                let given_up = opts.missing_log || discarded_before.contains(&t.id);
                !(t.kind == TopVdevKind::Hole || t.log && given_up)
            })
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
        if !lost.is_empty() {
            return Err(EngineError::invalid(format!(
                "pool '{pool_name}': missing {}{}",
                lost.join("; "),
                missing_log_hint(unknown.iter().all(|t| t.log || t.kind == TopVdevKind::Hole))
            )));
        }
        // Their devices are not present (else their labels would have named them).
        for t in unknown {
            if zio.vdevs.push(TopVdev::with_leaves(t, &|_| None)?).is_err() {
                return Err(EngineError::invalid(format!(
                    "pool '{pool_name}': too many top-level vdevs"
                )));
            }
        }
    }
    // A vdev whose labels were written but whose addition never committed is not part of it.
    zio.vdevs.truncate(meta.tree.top.len());
    // Children, pairs and spares as the metadata records them: a member the labels' tree
    // did not know (attached or replaced after its label was written) is found by guid.
    let find = |g: oxpool_format::Guid| {
        found
            .iter()
            .find(|(c, _)| c.leaf_guid == g)
            .map(|(_, dev)| Arc::new(Leaf::new(g, dev.clone())))
    };
    zio.vdevs.reshape(&meta.tree, &find)?;
    // A data vdev with no device present, as the metadata records it (a label's log flag
    // let it pass above: the label may be wrong).
    for (t, cfg) in zio.vdevs.tops().zip(&meta.tree.top) {
        if !cfg.log && cfg.kind != TopVdevKind::Hole && t.leaves().next().is_none() {
            let paths: Vec<String> = cfg.children.iter().map(named).collect();
            return Err(missing_error(
                &cfg.children,
                format!(
                    "pool '{pool_name}': vdev {} has no device present (expected {})",
                    cfg.id.0,
                    paths.join(", ")
                ),
            ));
        }
    }
    // A log vdev with no device present: refused, unless `-m` (its records are lost), or the
    // metadata records it removed (a hole: `reshape` made it one).
    // One recorded emptied holds nothing (`Spa::offline_log` emptied it before its devices
    // went offline): imported without them and without `-m`, taking no log blocks.
    let mut missing_logs = Vec::new();
    let mut logs_out = Vec::new();
    for (t, cfg) in zio.vdevs.tops().zip(&meta.tree.top) {
        if cfg.log && cfg.kind != TopVdevKind::Hole && t.leaves().next().is_none() {
            if emptied.contains(&cfg.id) {
                logs_out.push(cfg.id);
                continue;
            }
            if !opts.missing_log && !discarded_before.contains(&cfg.id) {
                let paths: Vec<String> = cfg.children.iter().map(named).collect();
                // Not `NotFound`, whose ": not found" would follow the hint.
                return Err(EngineError::invalid(format!(
                    "pool '{pool_name}': log vdev {} has no device present (expected {}){}",
                    cfg.id.0,
                    paths.join(", "),
                    missing_log_hint(true)
                )));
            }
            if !discarded_before.contains(&cfg.id) {
                tracing::warn!(
                    pool = pool_name,
                    "log vdev {} is missing: imported without its intent-log records (-m)",
                    cfg.id.0
                );
            }
            missing_logs.push(cfg.id);
        }
    }
    // Before anything reads the pool's blocks past its metadata: an offline or faulted
    // device gets no I/O from here on.
    zio.vdevs
        .load_state_records(&state_records, meta.txg, &emptied)?;
    // A log vdev whose devices are present but cannot give back every block (a mirror whose
    // side in service lacks txgs it missed while offline, the other side gone): its chains
    // would read as ending early, so it counts as missing, as when no device is present.
    for (t, cfg) in zio.vdevs.tops().zip(&meta.tree.top) {
        let known = missing_logs.contains(&cfg.id) || emptied.contains(&cfg.id);
        if !cfg.log || cfg.kind == TopVdevKind::Hole || known || t.leaves().next().is_none() {
            continue;
        }
        let shape = t.shape();
        let not_whole: Vec<&str> = shape
            .children
            .iter()
            .filter(|c| !c.whole())
            .map(|c| c.old.config.path.as_str())
            .collect();
        if not_whole.len() <= shape.redundancy() {
            continue;
        }
        if !opts.missing_log && !discarded_before.contains(&cfg.id) {
            return Err(EngineError::invalid(format!(
                "pool '{pool_name}': log vdev {} cannot give back every block (out of service \
                 or lacking txgs: {}){}",
                cfg.id.0,
                not_whole.join(", "),
                missing_log_hint(true)
            )));
        }
        tracing::warn!(
            pool = pool_name,
            "log vdev {} lacks blocks: imported without its intent-log records (-m)",
            cfg.id.0
        );
        missing_logs.push(cfg.id);
    }
    let asizes: Vec<u64> = zio.vdevs.tops().map(|t| t.asize_bytes).collect();
    let mut alloc = Allocator::for_tops(zio.vdevs.tops());
    // Log vdevs emptied, and any with no device in service, take no log blocks until
    // `online` brings one back.
    logs_out.extend(
        zio.vdevs
            .tops()
            .filter(|t| t.log && !t.is_hole() && t.leaves().next().is_some())
            .filter(|t| emptied.contains(&t.id) || t.leaves_in_service().next().is_none())
            .map(|t| t.id),
    );
    for v in missing_logs.iter().chain(&logs_out) {
        alloc.set_leaving(*v, true);
    }
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
    // Deferred frees reach the allocator's maps by the next syncs: one on no vdev, on a
    // hole or past a vdev's end is damage, refused here rather than failing a sync.
    for f in &meta.deferred_frees {
        for dva in &f.dvas {
            meta.tree.check_dva(dva).map_err(|e| EngineError::Corrupt {
                device: pool_name.clone(),
                what: format!("deferred free of txg {}", f.txg.0),
                source: e,
            })?;
        }
    }
    // The history's chunks are freed when they are replaced or dropped, some without being
    // read: a list that could make a sync free a place twice or off the tree is refused.
    check_history_list(&pool_name, &meta)?;
    let pool_name = match new_name {
        Some(n) => n.to_string(),
        None => {
            // From the devices: a name every command would then take apart (a `/`, a NUL)
            // is refused here, with a way out.
            super::check_name("pool", &meta.name).map_err(|e| {
                EngineError::invalid(format!(
                    "pool '{label_name}': its metadata names it '{}', not a pool name ({e}); \
                     import it under a new name (import POOL NEWNAME)",
                    meta.name.escape_debug()
                ))
            })?;
            meta.name.clone()
        }
    };
    if pool_name != label_name {
        tracing::info!(
            pool = pool_name,
            "labels name the pool '{label_name}': imported as '{pool_name}'"
        );
    }
    tracing::info!(pool = pool_name, txg = meta.txg.0, "imported");
    // At info, as a missing device: `status` shows it UNAVAIL with why, and a warning here
    // would repeat on every command that opens the pool.
    for (guid, why) in &import_refusals {
        let path = config.leaves().find(|l| l.guid == *guid).map(|l| &l.path);
        tracing::info!(pool = pool_name, device = path, "not opened: {why}");
    }
    let inner = Arc::new(Spa {
        name: pool_name.clone(),
        guid: cfg0.pool_guid,
        zio,
        config_change: Mutex::new(()),
        sync_gate: Mutex::new(()),
        scan_batches: Default::default(),
        error_log: Default::default(),
        history: Mutex::new(super::history::History::stored(meta.history.clone())),
        import_refusals,
        txg: TxgControl::new(
            &pool_name,
            meta.txg,
            effective_dirty_max(props.dirty_max_bytes, asizes.iter().sum()),
            Duration::from_secs(props.txg_timeout_s),
        ),
        state: Mutex::new(SpaState {
            props,
            alloc,
            chunk_ptrs,
            deferred: meta.deferred_frees.clone(),
            meta_ptr: ub.root,
            meta_places,
            scan_pin: None,
            scan_record,
            hole_requested: None,
            holed: Vec::new(),
            discarded_logs: missing_logs.clone(),
            emptied_logs: emptied,
        }),
        log_counters: LogCounters::default(),
        log_alloc_bytes_since_sync: Default::default(),
        charged_placed_txg: Default::default(),
        reserved_bytes: Default::default(),
        log_blocks_allocated: Default::default(),
    });
    super::listen_to_records(&inner);
    if !missing_logs.is_empty() {
        // The first txg records the log vdevs given up.
        inner.txg.mark_dirty();
    }
    Ok((inner, meta))
}

/// Checks `PoolMeta.history` (see its use in `import`): at most `HISTORY_CHUNKS_MAX`
/// chunks of history blocks, each of 1 to `TABLE_CHUNK_ENTRIES_MAX` records, on the tree,
/// no place listed twice.
fn check_history_list(pool_name: &str, meta: &oxpool_format::PoolMeta) -> Result<()> {
    let bad = |why: String| {
        EngineError::invalid(format!(
            "pool '{pool_name}': its history's chunk list {why}"
        ))
    };
    if meta.history.len() > super::history::HISTORY_CHUNKS_MAX {
        return Err(bad(format!("has {} chunks", meta.history.len())));
    }
    let mut places = std::collections::HashSet::new();
    for (i, c) in meta.history.iter().enumerate() {
        let entries = c.entries as usize;
        if c.chunk.block_type != oxpool_format::BlockType::History
            || !(1..=oxpool_format::TABLE_CHUNK_ENTRIES_MAX).contains(&entries)
        {
            return Err(bad(format!(
                "names a {} block of {entries} records (chunk {i})",
                c.chunk.block_type.name()
            )));
        }
        for dva in c.chunk.dvas() {
            meta.tree.check_dva(dva).map_err(|e| EngineError::Corrupt {
                device: pool_name.to_string(),
                what: format!("history chunk {i}"),
                source: e,
            })?;
            if !places.insert((dva.vdev, dva.offset_bytes)) {
                return Err(bad(format!("lists a place twice (chunk {i})")));
            }
        }
    }
    Ok(())
}

/// The vdev ids of a `key` record (comma-separated), as [`super::LOG_DISCARDED_KEY`] and
/// [`super::LOG_EMPTIED_KEY`] keep them.
fn vdev_ids(pool_name: &str, key: &str, records: &[(String, String)]) -> Result<Vec<VdevId>> {
    let mut out = Vec::new();
    for (_, v) in records {
        for id in v.split(',') {
            let id: u32 = id.parse().map_err(|_| {
                EngineError::invalid(format!("pool '{pool_name}': bad {key} record '{v}'"))
            })?;
            out.push(VdevId(id));
        }
    }
    Ok(out)
}

/// What an import refused for a missing log device may say: how to import without it.
fn missing_log_hint(only_logs: bool) -> &'static str {
    if only_logs {
        "; its intent-log records may hold acknowledged writes. `oxpool import -m` imports \
         without them (they are lost), then `oxpool remove` takes the log vdev out"
    } else {
        ""
    }
}

impl Spa {
    /// Claims, at import and before anything allocates, the places one intent log holds:
    /// `listed` by the committed txg, `walked` found on its chain. Returns the places the log
    /// owns, to free once after its replay (see spa/claim.rs).
    /// Places on no vdev, or past its end, are ignored (the space maps cover each top
    /// vdev's allocatable size exactly).
    pub(crate) fn claim_log_places(&self, listed: &[Dva], walked: &[Dva]) -> Vec<Dva> {
        let mut s = self.state.lock().unwrap();
        let s = &mut *s;
        super::claim::claim_log_places(&mut s.alloc, &mut s.deferred, listed, walked)
    }
}

#[cfg(test)]
mod tests {
    use super::{check_history_list, parse_id};
    use oxpool_format::{
        BlockPtr, BlockType, Dva, Guid, PoolMeta, TableChunkMeta, Txg, VdevId, VdevTreeConfig,
    };

    /// A history chunk list that could make a sync free a place twice, or something that is
    /// no history chunk, is refused at import, saying why.
    #[test]
    fn a_bad_history_chunk_list_is_refused() {
        let chunk = |block_type, entries| {
            let mut bp = BlockPtr {
                ndvas: 1,
                block_type,
                ..BlockPtr::HOLE
            };
            bp.dvas[0] = Dva {
                vdev: VdevId(0),
                offset_bytes: 1 << 20,
                asize_bytes: 4096,
            };
            TableChunkMeta { chunk: bp, entries }
        };
        let meta = |history: Vec<TableChunkMeta>| PoolMeta {
            name: "tank".into(),
            guid: Guid(1),
            txg: Txg(9),
            tree: VdevTreeConfig {
                top: vec![],
                spares: vec![],
            },
            props: vec![],
            volumes: vec![],
            spacemaps: vec![],
            deferred_frees: vec![],
            next_volume_id: 1,
            datasets: vec![],
            freeing: vec![],
            history,
        };
        assert!(check_history_list("tank", &meta(vec![])).is_ok());
        let too_many =
            vec![chunk(BlockType::History, 1); super::super::history::HISTORY_CHUNKS_MAX + 1];
        let e = check_history_list("tank", &meta(too_many))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has 33 chunks"), "{e}");
        let e = check_history_list("tank", &meta(vec![chunk(BlockType::Data, 1)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("names a data block"), "{e}");
        let e = check_history_list("tank", &meta(vec![chunk(BlockType::History, 65)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("of 65 records"), "{e}");
        // A place on no vdev of the tree (this one has none).
        assert!(check_history_list("tank", &meta(vec![chunk(BlockType::History, 1)])).is_err());
    }

    /// A pool id is hex as the listing shows it, with or without `0x`: nothing else.
    #[test]
    fn parse_id_takes_hex_digits_only() {
        assert_eq!(parse_id("00ab"), Some(Guid(0xab)));
        assert_eq!(parse_id("0xFFFFFFFFFFFFFFFF"), Some(Guid(u64::MAX)));
        for bad in [
            "",
            "0x",
            "+ab",
            "-1",
            "0x+1",
            "12345678901234567",
            "tank",
            " ab",
        ] {
            assert_eq!(parse_id(bad), None, "{bad:?}");
        }
    }
}
