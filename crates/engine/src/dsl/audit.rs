//! The audit (`oxpool audit`): walks every dataset's and snapshot's block tree and every
//! deadlist, verifies every block's checksum, recomputes every space figure, and compares
//! the places referenced with the allocator's map, sector by sector. It finds leaks (allocated,
//! referenced by nothing), blocks both free and referenced, places referenced by two different
//! blocks, corrupt blocks, and counters that disagree with the trees. It is what the tests run
//! after every crash.
//!
//! It reads a pool at rest: the caller syncs first, and nothing may write meanwhile (an
//! exported pool, or a served one whose clients are quiet), else a change racing the walk
//! shows up as a difference.

use crate::dsl::dataset::Dataset;
use crate::dsl::deadlist::Deadlist;
use crate::dsl::snapshot_sync::read_deadlist_chunk;
use crate::dsl::table::TablesView;
use crate::dsl::Datasets;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_block;
use crate::Result;
use oxpool_format::{
    decode_indirect, BlockPtr, Dva, Guid, Txg, VolumeId, INDIRECT_FANOUT, SECTOR_BYTES,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;

/// Reads of the intent logs' places before an audit gives up on a moment with no log block
/// allocated between them and the allocator's (each read takes microseconds).
const LOG_READ_ATTEMPTS_MAX: u32 = 1000;

/// What an audit found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Blocks read and verified (each place once).
    pub blocks_checked: u64,
    /// Trees walked (heads and snapshots).
    pub trees_walked: u64,
    /// `written@SNAP` figures checked against the trees: every volume and snapshot against
    /// every older snapshot of its line (dsl/written.rs).
    pub written_since_checked: u64,
    /// Bytes allocated that nothing references.
    pub leaked_bytes: u64,
    /// Every problem, one line each (leaks, double references, corrupt blocks, counters).
    pub problems: Vec<String>,
}

impl AuditReport {
    /// Whether it found nothing wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Identity of a block (not of a place): its birth and checksum.
type BlockKey = (u64, [u8; 16]);

fn key_of(bp: &BlockPtr) -> BlockKey {
    let mut k = [0u8; 16];
    k.copy_from_slice(&bp.checksum.0[..16]);
    (bp.birth.0, k)
}

/// Every place referenced, with the block (or the structure) that references it.
#[derive(Default)]
struct Referenced {
    places: HashMap<(u32, u64), (u32, Option<BlockKey>, String)>,
    problems: Vec<String>,
}

impl Referenced {
    /// Records a place; `block` None for places outside trees (metadata, logs, frees).
    /// Returns whether it was new (false: the same block seen from another tree).
    fn add(&mut self, dva: &Dva, block: Option<BlockKey>, owner: &dyn Fn() -> String) -> bool {
        let k = (dva.vdev.0, dva.offset_bytes);
        match self.places.get(&k) {
            Some((asize, b, first)) if *asize == dva.asize_bytes && b.is_some() && *b == block => {
                let _ = first;
                false
            }
            Some((_, _, first)) => {
                self.problems.push(format!(
                    "double reference: vdev {} offset {} by {} and by {}",
                    dva.vdev.0,
                    dva.offset_bytes,
                    first,
                    owner()
                ));
                false
            }
            None => {
                self.places.insert(k, (dva.asize_bytes, block, owner()));
                true
            }
        }
    }
}

/// Figures recomputed from one tree.
#[derive(Default)]
struct TreeSums {
    referenced_bytes: u64,
    born_after_bytes: u64,
    /// Bytes of its blocks by birth txg: `written@SNAP` is the sum above `SNAP`'s txg.
    bytes_by_birth: BTreeMap<Txg, u64>,
}

/// Walks the tree under `root`: records its places, verifies each block once, and sums its
/// bytes (and those born after `after`).
async fn walk_tree(
    spa: &Spa,
    root: BlockPtr,
    after: Txg,
    what: &str,
    refs: &mut Referenced,
    children_of: &mut HashMap<BlockKey, Vec<BlockPtr>>,
    report: &mut AuditReport,
) -> TreeSums {
    let mut sums = TreeSums::default();
    let mut stack = vec![root];
    // Bounded by the blocks of the tree.
    while let Some(bp) = stack.pop() {
        if bp.is_hole() {
            continue;
        }
        let bytes: u64 = bp.dvas().iter().map(|d| u64::from(d.asize_bytes)).sum();
        sums.referenced_bytes += bytes;
        if bp.birth > after {
            sums.born_after_bytes += bytes;
        }
        *sums.bytes_by_birth.entry(bp.birth).or_default() += bytes;
        let key = key_of(&bp);
        let mut new = false;
        for d in bp.dvas() {
            new |= refs.add(d, Some(key), &|| {
                format!("{what} (L{} birth {})", bp.level, bp.birth.0)
            });
        }
        if bp.level == 0 {
            if new {
                report.blocks_checked += 1;
                if let Err(e) = read_block(&spa.zio, IoClass::Scrub, &bp, what).await {
                    report.problems.push(format!("{what}: {e}"));
                }
            }
            continue;
        }
        if let Some(children) = children_of.get(&key) {
            stack.extend(children.iter().copied());
            continue;
        }
        report.blocks_checked += 1;
        match read_block(&spa.zio, IoClass::Scrub, &bp, what).await {
            Ok(buf) => {
                let mut children = [BlockPtr::HOLE; INDIRECT_FANOUT];
                match decode_indirect(&buf, &mut children) {
                    Ok(_) => {
                        let list: Vec<BlockPtr> =
                            children.iter().filter(|c| !c.is_hole()).copied().collect();
                        stack.extend(list.iter().copied());
                        children_of.insert(key, list);
                    }
                    Err(e) => report
                        .problems
                        .push(format!("{what}: indirect block L{}: {e}", bp.level)),
                }
            }
            Err(e) => report.problems.push(format!("{what}: {e}")),
        }
    }
    report.trees_walked += 1;
    sums
}

/// Reads a deadlist's blocks, records their places, and checks its counters; returns its
/// entries.
async fn walk_deadlist(
    spa: &Spa,
    d: &Deadlist,
    what: &str,
    refs: &mut Referenced,
    report: &mut AuditReport,
) -> Vec<BlockPtr> {
    let mut all = Vec::new();
    for (key, bucket) in d.buckets() {
        let mut entries: Vec<BlockPtr> = bucket.pending.clone();
        for chunk in &bucket.stored {
            for dva in chunk.dvas() {
                refs.add(dva, Some(key_of(chunk)), &|| {
                    format!("{what} deadlist block")
                });
            }
            report.blocks_checked += 1;
            match read_deadlist_chunk(spa, chunk).await {
                Ok(e) => entries.extend(e),
                Err(e) => report.problems.push(format!("{what}: deadlist: {e}")),
            }
        }
        let bytes: u64 = entries
            .iter()
            .flat_map(|e| e.dvas())
            .map(|d| u64::from(d.asize_bytes))
            .sum();
        if entries.len() as u64 != bucket.count || bytes != bucket.bytes {
            report.problems.push(format!(
                "{what}: deadlist bucket {} counts {} entries of {} bytes, holds {} of {}",
                key.0,
                bucket.count,
                bucket.bytes,
                entries.len(),
                bytes
            ));
        }
        all.extend(entries);
    }
    all
}

fn check(report: &mut AuditReport, what: &str, figure: &str, recorded: u64, computed: u64) {
    if recorded != computed {
        report.problems.push(format!(
            "{what}: {figure} is {recorded}, the tree says {computed}"
        ));
    }
}

/// Checks `written@SNAP` (computed from figures and deadlist totals, as `oxpool get` does)
/// of each volume and snapshot against every older snapshot of its line, with the bytes of
/// its tree born after that snapshot's txg (`births`, from the walks). O(n^2) figures for a
/// line of n snapshots: each line is summed once per older snapshot.
fn check_written_since(
    dsl: &Datasets,
    datasets: &[std::sync::Arc<Dataset>],
    births: &HashMap<(VolumeId, Option<Guid>), BTreeMap<Txg, u64>>,
    report: &mut AuditReport,
) {
    for ds in datasets {
        let line = crate::dsl::written::line(dsl, ds);
        // This dataset's own generations (its snapshots and head) end the line; the older
        // ones are its origins', checked with their own volumes.
        let own = 1 + ds.lineage.lock().unwrap().snapshots().len();
        let own_start = line.len().saturating_sub(own);
        for k in 0..line.len().saturating_sub(1) {
            let since = &line[k];
            let figures = crate::dsl::written::written_since_each(&line, k);
            for (m, figure) in (k + 1..line.len()).zip(figures) {
                if m < own_start {
                    continue;
                }
                let g = &line[m];
                // By id and guid: a rename since the walk changes the names.
                let Some(by_birth) = births.get(&g.key) else {
                    report.problems.push(format!(
                        "{}/{}: no tree walked for it",
                        dsl.pool_name, g.name
                    ));
                    continue;
                };
                let walked: u64 = by_birth
                    .range(Txg(since.txg.0.saturating_add(1))..)
                    .map(|(_, b)| b)
                    .sum();
                report.written_since_checked += 1;
                if figure != walked {
                    report.problems.push(format!(
                        "{}/{}: written@{} is {figure}, the tree says {walked}",
                        dsl.pool_name, g.name, since.name
                    ));
                }
            }
        }
    }
}

/// Audits the pool (see the module docs).
pub(crate) async fn audit(spa: &Spa, dsl: &Datasets) -> Result<AuditReport> {
    let mut report = AuditReport::default();
    let mut refs = Referenced::default();
    let mut children_of = HashMap::new();
    let datasets: Vec<std::sync::Arc<Dataset>> = dsl.all();
    let mut dead_entries: Vec<(String, BlockPtr)> = Vec::new();
    // Each tree's bytes by birth, by its volume's id and snapshot's guid (None: the head).
    let mut births: HashMap<(VolumeId, Option<Guid>), BTreeMap<Txg, u64>> = HashMap::new();
    let (history_blocks, history_problems) = crate::spa::history::verify(spa).await;
    report.blocks_checked += history_blocks;
    report.problems.extend(history_problems);
    for ds in &datasets {
        let (root, _) = *ds.data().written_root.lock().unwrap();
        let l = {
            let l = ds.lineage.lock().unwrap();
            (
                l.prev_snap_txg,
                l.written_bytes,
                l.snapshots().to_vec(),
                l.deadlist.clone(),
                l.origin_txg(),
                TablesView::of(&l),
            )
        };
        let (prev_snap_txg, written_bytes, snapshots, deadlist, origin_txg, tables) = l;
        for chunk in tables.blocks() {
            for dva in chunk.dvas() {
                refs.add(dva, Some(key_of(chunk)), &|| {
                    format!("{} {} block", ds.full_name(), chunk.block_type.name())
                });
            }
            report.blocks_checked += 1;
        }
        report
            .problems
            .extend(tables.audit(spa, &ds.full_name()).await);
        let sums = walk_tree(
            spa,
            root,
            prev_snap_txg,
            &ds.full_name(),
            &mut refs,
            &mut children_of,
            &mut report,
        )
        .await;
        let obj = ds.data();
        check(
            &mut report,
            &ds.full_name(),
            "referenced",
            obj.used_bytes.load(Ordering::Relaxed),
            sums.referenced_bytes,
        );
        check(
            &mut report,
            &ds.full_name(),
            "written",
            written_bytes,
            sums.born_after_bytes,
        );
        births.insert((ds.id, None), sums.bytes_by_birth);
        for e in walk_deadlist(spa, &deadlist, &ds.full_name(), &mut refs, &mut report).await {
            if e.birth > prev_snap_txg {
                report.problems.push(format!(
                    "{}: deadlist entry born {} after the previous snapshot ({})",
                    ds.full_name(),
                    e.birth.0,
                    prev_snap_txg.0
                ));
            }
            dead_entries.push((ds.full_name(), e));
        }
        for (i, s) in snapshots.iter().enumerate() {
            let what = format!("{}@{}", ds.full_name(), s.name);
            let prev = match i {
                0 => origin_txg,
                _ => snapshots[i - 1].txg,
            };
            let sums = walk_tree(
                spa,
                s.root,
                prev,
                &what,
                &mut refs,
                &mut children_of,
                &mut report,
            )
            .await;
            check(
                &mut report,
                &what,
                "referenced",
                s.referenced_bytes,
                sums.referenced_bytes,
            );
            check(
                &mut report,
                &what,
                "written",
                s.written_bytes,
                sums.born_after_bytes,
            );
            births.insert((ds.id, Some(s.guid)), sums.bytes_by_birth);
            for e in walk_deadlist(spa, &s.deadlist, &what, &mut refs, &mut report).await {
                dead_entries.push((what.clone(), e));
            }
        }
    }
    check_written_since(dsl, &datasets, &births, &mut report);
    // The queue of frees: its chunks and their entries are still allocated until drained.
    let (chunks, count, bytes) = {
        let q = dsl.freeing.lock().unwrap();
        (q.chunks(), q.count(), q.bytes())
    };
    let (mut found_count, mut found_bytes) = (0u64, 0u64);
    for chunk in &chunks {
        for d in chunk.dvas() {
            refs.add(d, Some(key_of(chunk)), &|| "freeing queue block".into());
        }
        report.blocks_checked += 1;
        match read_deadlist_chunk(spa, chunk).await {
            Ok(entries) => {
                for e in &entries {
                    found_count += 1;
                    for d in e.dvas() {
                        found_bytes += u64::from(d.asize_bytes);
                        refs.add(d, Some(key_of(e)), &|| {
                            format!("freeing queue entry (birth {})", e.birth.0)
                        });
                    }
                }
            }
            Err(e) => report.problems.push(format!("freeing queue: {e}")),
        }
    }
    if (found_count, found_bytes) != (count, bytes) {
        report.problems.push(format!(
            "freeing queue counts {count} entries of {bytes} bytes, holds {found_count} of {found_bytes}"
        ));
    }
    // A deadlist entry is a block a snapshot still references: it must be in a tree walked.
    for (what, e) in &dead_entries {
        let k = key_of(e);
        let known = e.dvas().iter().all(|d| {
            refs.places
                .get(&(d.vdev.0, d.offset_bytes))
                .is_some_and(|(_, b, _)| *b == Some(k))
        });
        if !known {
            report.problems.push(format!(
                "{what}: deadlist entry (birth {}) is in no snapshot's tree",
                e.birth.0
            ));
        }
    }
    // The intent logs' places and the pool's own metadata. No sync runs (the caller holds
    // `sync_gate`), so only commits allocate meanwhile: blocks written in place are held
    // under the allocator's lock and read under it here. A log block is allocated under its
    // log's lock (which comes before the allocator's, so the logs cannot be read under it)
    // and recorded in the log before that lock is released: if the count of log blocks
    // allocated (kept under the allocator's lock) is the same before the logs are read and
    // under the allocator's lock, every log block the allocator holds is in what was read.
    // Otherwise, read again (bounded: commits allocate a block per many writes).
    let mut attempts = 0;
    let (s, log_places) = loop {
        let before = spa.log_blocks_allocated.load(Ordering::SeqCst);
        let places: Vec<(usize, Dva)> = datasets
            .iter()
            .enumerate()
            .flat_map(|(i, ds)| ds.log.reserved().into_iter().map(move |d| (i, d)))
            .collect();
        let s = spa.state.lock().unwrap();
        attempts += 1;
        if spa.log_blocks_allocated.load(Ordering::SeqCst) == before {
            break (s, places);
        }
        if attempts == LOG_READ_ATTEMPTS_MAX {
            report.problems.push(format!(
                "intent logs allocated blocks during each of {attempts} reads of their places: \
                 a log block may show as leaked; audit again when fewer clients commit"
            ));
            break (s, places);
        }
        drop(s);
    };
    for (i, d) in &log_places {
        refs.add(d, None, &|| {
            format!("{} intent log", datasets[*i].full_name())
        });
    }
    for ds in &datasets {
        for d in ds.data().inplace_held.lock().unwrap().iter() {
            refs.add(d, None, &|| {
                format!("{} in-place log block", ds.full_name())
            });
        }
    }
    for d in &s.meta_places {
        refs.add(d, None, &|| "pool metadata".into());
    }
    // Under the state lock, then the history's (the one order of the two).
    for c in spa.history.lock().unwrap().blocks() {
        for d in c.dvas() {
            // No block key: a chunk listed twice is a double reference, not one block.
            refs.add(d, None, &|| "pool history".into());
        }
    }
    for (v, chunks) in s.chunk_ptrs.iter().enumerate() {
        for c in chunks.iter().filter(|c| !c.is_hole()) {
            for d in c.dvas() {
                refs.add(d, None, &|| format!("space map of vdev {v}"));
            }
        }
    }
    for f in &s.deferred {
        for d in &f.dvas {
            refs.add(d, None, &|| format!("deferred free of txg {}", f.txg.0));
        }
    }
    // Sector by sector against the allocator.
    let mut referenced: Vec<HashSet<u64>> = vec![HashSet::new(); s.alloc.maps().len()];
    for ((vdev, offset), (asize, _, owner)) in &refs.places {
        let Some(set) = referenced.get_mut(*vdev as usize) else {
            report
                .problems
                .push(format!("{owner}: vdev {vdev} does not exist"));
            continue;
        };
        let first = offset / SECTOR_BYTES;
        for sector in first..first + u64::from(*asize).div_ceil(SECTOR_BYTES) {
            if !set.insert(sector) {
                report.problems.push(format!(
                    "double reference: vdev {vdev} sector {sector} (by {owner} and another)"
                ));
            }
        }
    }
    for (v, map) in s.alloc.maps().iter().enumerate() {
        let set = &referenced[v];
        let mut leaked = 0u64;
        let mut free_referenced = 0u64;
        let mut first_leak = None;
        for sector in 0..map.sectors() {
            match (map.is_sector_allocated(sector), set.contains(&sector)) {
                (true, false) => {
                    leaked += 1;
                    first_leak.get_or_insert(sector);
                }
                (false, true) => free_referenced += 1,
                _ => {}
            }
        }
        if leaked > 0 {
            report.leaked_bytes += leaked * SECTOR_BYTES;
            report.problems.push(format!(
                "vdev {v}: {} bytes allocated and referenced by nothing (first at sector {})",
                leaked * SECTOR_BYTES,
                first_leak.unwrap_or(0)
            ));
        }
        if free_referenced > 0 {
            // Name the first structure that references free space (the error path only).
            let mut owners: Vec<(u64, &str)> = refs
                .places
                .iter()
                .filter(|((vdev, offset), (asize, _, _))| {
                    *vdev as usize == v && {
                        let first = offset / SECTOR_BYTES;
                        (first..first + u64::from(*asize).div_ceil(SECTOR_BYTES))
                            .any(|s| !map.is_sector_allocated(s))
                    }
                })
                .map(|((_, offset), (_, _, owner))| (*offset, owner.as_str()))
                .collect();
            owners.sort();
            let (offset, owner) = owners.first().copied().unwrap_or((0, "?"));
            report.problems.push(format!(
                "vdev {v}: {} bytes referenced but free in the space map (first at offset \
                 {offset}, by {owner})",
                free_referenced * SECTOR_BYTES
            ));
        }
        let counted: u64 = (0..map.sectors())
            .filter(|s| map.is_sector_allocated(*s))
            .count() as u64
            * SECTOR_BYTES;
        if counted != map.allocated_bytes() {
            report.problems.push(format!(
                "vdev {v}: allocated_bytes is {}, the map holds {counted}",
                map.allocated_bytes()
            ));
        }
    }
    Ok(report)
}
