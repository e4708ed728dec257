//! Scrub: a background scan that reads every copy of every block the pool references,
//! verifies each against the checksum its parent holds, and rewrites bad copies from good
//! ones, while the pool serves.
//!
//! # Consistency with a pool that keeps changing
//!
//! The scan walks each volume's tree in batches of one level-1 block's children (up to
//! [`FANOUT`] data blocks). For each batch it sets a **pin** at the last durable txg, then
//! reads the tree's root as the last sync left it and descends from there. While the pin is
//! set, the txg sync releases no deferred free of a txg after the pin. Every block reachable
//! from that root was not freed by any txg up to the pin (the root is newer than those
//! txgs' syncs), so while pinned none of its places can be reallocated and overwritten: what
//! the scan reads is exactly the block its parent describes, a mismatch is real damage, and
//! a repair writes over nothing but the damaged copy. Between batches the pin is released,
//! so a scrub never holds back frees for longer than one batch's reads.
//!
//! Indirect blocks on the path are verified once per scan (the next batch reuses them while
//! its root leads to the same ones, and verifies the new ones a sync wrote meanwhile).

use crate::dmu::object::Object;
use crate::dmu::tree::{capacity, skip_hole, BlockTree, FANOUT};
use crate::dsl::dataset::Dataset;
use crate::dsl::snapshot::Lineage;
use crate::dsl::Datasets;
use crate::spa::space::ScanPin;
use crate::spa::Spa;
use crate::zio::{scrub_block, ScrubCounts};
use crate::{EngineError, Result};
use oxpool_format::{
    decode_indirect, decode_meta_index, BlockPtr, BlockType, Txg, INDIRECT_FANOUT,
};
use oxpool_io::rt::{block_on, join_all};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a scan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanState {
    /// Running.
    Scanning,
    /// Done: every block was visited.
    Finished,
    /// Stopped by `oxpool scrub -s`, an export, or an error (see [`ScanStatus::error`]).
    Canceled,
}

/// What `oxpool status` shows of the pool's latest scrub.
#[derive(Clone, Debug)]
pub struct ScanStatus {
    /// Running, finished or canceled.
    pub state: ScanState,
    /// When it started, ns since the epoch.
    pub started_ns: u64,
    /// When it ended, ns since the epoch.
    pub ended_ns: Option<u64>,
    /// How long it ran (to now, while running).
    pub elapsed: Duration,
    /// Bytes of block copies read and verified so far.
    pub examined_bytes: u64,
    /// Bytes allocated when it started: what it expects to read in all (an estimate, since the
    /// pool keeps changing).
    pub total_bytes: u64,
    /// Bytes rewritten over bad copies.
    pub repaired_bytes: u64,
    /// Copies checked, bad, repaired; blocks with no good copy.
    pub counts: ScrubCounts,
    /// Why it stopped, if an error stopped it.
    pub error: Option<String>,
}

impl ScanStatus {
    /// Percent done (of the estimate; at most 100).
    pub fn percent_done(&self) -> f64 {
        if self.state == ScanState::Finished {
            return 100.0;
        }
        if self.total_bytes == 0 {
            return 0.0;
        }
        (self.examined_bytes as f64 * 100.0 / self.total_bytes as f64).min(100.0)
    }
}

/// The pool's scan: its status and its thread.
#[derive(Default)]
pub(crate) struct Scan {
    status: Mutex<Option<ScanStatus>>,
    /// Signalled when a scan ends.
    ended: Condvar,
    cancel: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The txg durable when the running scan started, and the devices' outages then: a scan
    /// that finishes clean repaired what the devices lacked up to it.
    repairs_through: Mutex<Option<(Txg, crate::vdev::OutageMarks)>>,
}

impl Scan {
    fn update(&self, f: impl FnOnce(&mut ScanStatus)) {
        if let Some(s) = self.status.lock().unwrap().as_mut() {
            f(s)
        }
    }

    fn canceled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Asks a running scan to stop and waits for its thread (export, drop).
    pub(crate) fn stop(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Datasets {
    /// Starts a scrub of pool `spa` in the background (`oxpool scrub`); refused while one
    /// runs.
    pub(crate) fn scrub_start(self: &Arc<Self>, spa: &Arc<Spa>) -> Result<()> {
        let inner = spa;
        let scan = &self.scan;
        let mut thread = scan.thread.lock().unwrap();
        if matches!(
            scan.status.lock().unwrap().as_ref().map(|s| s.state),
            Some(ScanState::Scanning)
        ) {
            return Err(EngineError::invalid(format!(
                "pool '{}' is being scrubbed already (oxpool scrub -s {} stops it)",
                inner.name, inner.name
            )));
        }
        if let Some(old) = thread.take() {
            let _ = old.join(); // ended already: its status says so
        }
        // What is dirty now is written first, so the scrub covers every write answered
        // before it started.
        spa.sync_now()?;
        // What a device lacks up to here, the scrub repairs (if the device stays in service).
        *scan.repairs_through.lock().unwrap() =
            Some((spa.synced_txg(), spa.zio.vdevs.outage_marks()));
        let total_bytes = inner.state.lock().unwrap().alloc.totals_bytes().1;
        scan.cancel.store(false, Ordering::Relaxed);
        *scan.status.lock().unwrap() = Some(ScanStatus {
            state: ScanState::Scanning,
            started_ns: now_ns(),
            ended_ns: None,
            elapsed: Duration::ZERO,
            examined_bytes: 0,
            total_bytes,
            repaired_bytes: 0,
            counts: ScrubCounts::default(),
            error: None,
        });
        let (spa, dsl) = (inner.clone(), self.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("scrub-{}", inner.name))
            .spawn(move || scan_thread(spa, dsl));
        match spawned {
            Ok(t) => {
                *thread = Some(t);
                Ok(())
            }
            Err(e) => {
                *scan.status.lock().unwrap() = None;
                Err(EngineError::io("scrub thread", e))
            }
        }
    }

    /// Stops a running scrub (`oxpool scrub -s`).
    pub(crate) fn scrub_cancel(&self) -> Result<()> {
        let running = matches!(
            self.scan_status().map(|s| s.state),
            Some(ScanState::Scanning)
        );
        if !running {
            return Err(EngineError::invalid(format!(
                "there is no scrub of pool '{}' to stop",
                self.pool_name
            )));
        }
        self.scan.stop();
        Ok(())
    }

    /// The latest scrub's status, if one ran since the pool was opened.
    pub(crate) fn scan_status(&self) -> Option<ScanStatus> {
        let mut s = self.scan.status.lock().unwrap().clone()?;
        if s.state == ScanState::Scanning {
            s.elapsed = Duration::from_nanos(now_ns().saturating_sub(s.started_ns));
        }
        Some(s)
    }

    /// Waits until the running scrub (if any) ends or `limit` passes; returns its status.
    pub(crate) fn scan_wait(&self, limit: Duration) -> Option<ScanStatus> {
        let scan = &self.scan;
        let deadline = Instant::now() + limit;
        let mut status = scan.status.lock().unwrap();
        // Bounded by the deadline.
        while status
            .as_ref()
            .is_some_and(|s| s.state == ScanState::Scanning)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            status = scan.ended.wait_timeout(status, left).unwrap().0;
        }
        drop(status);
        self.scan_status()
    }

    /// Scrubs the pool and waits for the end: syncs, then reads and verifies every copy of
    /// every block the pool references, rewriting bad copies from good ones. Returns what it
    /// found; an error if it could not finish.
    pub(crate) fn scrub(self: &Arc<Self>, spa: &Arc<Spa>) -> Result<ScrubCounts> {
        self.scrub_start(spa)?;
        // Bounded: a scan ends (each batch makes progress) or is stopped by an export.
        let status = loop {
            if let Some(s) = self.scan_wait(Duration::from_secs(3600)) {
                if s.state != ScanState::Scanning {
                    break s;
                }
            }
        };
        match (status.state, status.error) {
            (ScanState::Finished, _) => Ok(status.counts),
            (_, Some(e)) => Err(EngineError::invalid(format!("scrub stopped: {e}"))),
            _ => Err(EngineError::invalid("scrub canceled")),
        }
    }
}

fn scan_thread(inner: Arc<Spa>, dsl: Arc<Datasets>) {
    // Nobody waits on this thread's I/O within microseconds: sleep, don't spin.
    oxpool_io::rt::set_spin(false);
    let result = block_on(scan_pool(&inner, &dsl));
    let scan = &dsl.scan;
    let canceled = scan.canceled();
    // Every block visited, none lost, every bad copy rewritten: the devices that were in
    // service throughout hold every block born up to the scan's start. Before the status
    // says Finished, so that whoever waits for it sees the devices as the scrub left them.
    let clean = result.is_ok()
        && !canceled
        && scan.status.lock().unwrap().as_ref().is_some_and(|s| {
            s.counts.blocks_lost == 0 && s.counts.copies_bad == s.counts.copies_repaired
        });
    let through = scan.repairs_through.lock().unwrap().take();
    if let (true, Some((txg, marks))) = (clean, through) {
        if inner.zio.vdevs.scrub_repaired_through(txg, &marks) {
            // The devices' records change: the next txg says so.
            inner.txg.mark_dirty();
        }
        inner.finish_replacements();
    }
    scan.update(|s| {
        s.ended_ns = Some(now_ns());
        s.elapsed = Duration::from_nanos(s.ended_ns.unwrap_or(0).saturating_sub(s.started_ns));
        s.state = match (&result, canceled) {
            (Ok(()), false) => ScanState::Finished,
            _ => ScanState::Canceled,
        };
        if let Err(e) = &result {
            s.error = Some(e.to_string());
        }
    });
    match &result {
        Ok(()) => tracing::info!(pool = inner.name, canceled, "scrub ended"),
        Err(e) => tracing::warn!(pool = inner.name, "scrub stopped: {e}"),
    }
    scan.ended.notify_all();
}

/// Adds one block's findings to the status.
fn account(dsl: &Datasets, bp: &BlockPtr, counts: ScrubCounts) {
    let examined: u64 = bp.dvas().iter().map(|d| d.asize_bytes as u64).sum();
    let repaired = if counts.copies_repaired > 0 {
        counts.copies_repaired * bp.dvas().first().map_or(0, |d| d.asize_bytes as u64)
    } else {
        0
    };
    dsl.scan.update(|s| {
        s.examined_bytes += examined;
        s.repaired_bytes += repaired;
        s.counts += counts;
    });
}

async fn scan_pool(inner: &Spa, dsl: &Datasets) -> Result<()> {
    scan_pool_metadata(inner, dsl).await;
    for ds in dsl.all() {
        if dsl.scan.canceled() {
            break;
        }
        scan_dataset(inner, dsl, &ds).await?;
    }
    Ok(())
}

/// The pool's own metadata: its block (or index and pieces) and the space-map chunks.
async fn scan_pool_metadata(inner: &Spa, dsl: &Datasets) {
    let _pin = ScanPin::set(inner);
    let (meta_ptr, chunks) = {
        let s = inner.state.lock().unwrap();
        (s.meta_ptr, s.chunk_ptrs.concat())
    };
    let zio = &inner.zio;
    if meta_ptr.is_hole() {
        return;
    }
    let (index, counts) = scrub_block(zio, &meta_ptr, "pool metadata").await;
    account(dsl, &meta_ptr, counts);
    if meta_ptr.block_type == BlockType::MetaIndex {
        let pieces =
            index.and_then(|buf| decode_meta_index(&buf[..meta_ptr.psize_bytes as usize]).ok());
        for p in pieces.unwrap_or_default() {
            let (_, counts) = scrub_block(zio, &p, "pool metadata").await;
            account(dsl, &p, counts);
        }
    }
    for c in chunks.iter().filter(|c| !c.is_hole()) {
        let (_, counts) = scrub_block(zio, c, "space map").await;
        account(dsl, c, counts);
    }
}

/// An indirect block verified and decoded in this scan, kept while later batches' paths lead
/// through it.
struct Decoded {
    bp: BlockPtr,
    ptrs: Box<[BlockPtr; INDIRECT_FANOUT]>,
}

/// Verifies (once per scan) and decodes the indirect block `bp` of `level`; `None` if no copy
/// is good or it does not decode (counted as lost: its subtree cannot be reached).
async fn indirect(
    inner: &Spa,
    dsl: &Datasets,
    path: &mut [Option<Decoded>],
    level: u8,
    bp: &BlockPtr,
    what: &str,
) -> Option<usize> {
    let slot = level as usize;
    if path[slot].as_ref().is_some_and(|d| d.bp == *bp) {
        return Some(slot);
    }
    let (buf, mut counts) = scrub_block(&inner.zio, bp, what).await;
    let mut ptrs = Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]);
    let decoded =
        buf.is_some_and(|b| decode_indirect(&b[..bp.psize_bytes as usize], &mut ptrs).is_ok());
    if !decoded && counts.blocks_lost == 0 {
        counts.blocks_lost = 1;
    }
    account(dsl, bp, counts);
    path[slot] = decoded.then_some(Decoded { bp: *bp, ptrs });
    decoded.then_some(slot)
}

/// One dataset's snapshots, oldest first, then its objects, a level-1 block's children per
/// batch (see the module docs). Each tree skips the blocks born at or before the snapshot
/// before it (the origin's, for a clone's first): those are in that older tree, scanned
/// with it, so a block shared by many snapshots is read once.
async fn scan_dataset(inner: &Spa, dsl: &Datasets, ds: &Arc<Dataset>) -> Result<()> {
    let (snapshots, origin_txg, prev_snap_txg) = {
        let l = ds.lineage.lock().unwrap();
        (l.snapshots().to_vec(), l.origin_txg(), l.prev_snap_txg)
    };
    // The deadlists' and tables' own blocks.
    {
        let _pin = ScanPin::set(inner);
        let chunks: Vec<BlockPtr> = {
            let l = ds.lineage.lock().unwrap();
            std::iter::once(&l.deadlist)
                .chain(l.snapshots().iter().map(|s| &s.deadlist))
                .flat_map(|d| d.buckets().flat_map(|(_, b)| b.stored.clone()))
                .chain(l.snapshot_table.blocks().copied())
                .chain(l.bookmark_table.blocks().copied())
                .collect()
        };
        for c in &chunks {
            let (_, counts) = scrub_block(&inner.zio, c, "deadlist").await;
            account(dsl, c, counts);
        }
    }
    let mut prune = origin_txg;
    for s in &snapshots {
        // A view, so that destroying the snapshot stops its scan before its blocks are freed.
        let view = Arc::new(Dataset::volume(
            ds.id,
            &inner.name,
            &format!("{}@{}", ds.name, s.name),
            ds.props.lock().unwrap().clone(),
            Object::new(
                BlockTree::new(s.levels.max(1), s.root),
                s.volsize_bytes,
                s.referenced_bytes,
            ),
            ds.log.clone(),
            Lineage::new(s.guid, s.txg, s.creation_s),
        ));
        dsl.add_view(ds, s.guid, &view);
        let still_there = ds.lineage.lock().unwrap().find(&s.name).is_some();
        if still_there {
            scan_object(
                inner,
                dsl,
                &view.full_name,
                &view.destroyed,
                view.data(),
                prune,
            )
            .await?;
        }
        prune = s.txg;
    }
    for (_, obj) in ds.objset.objects() {
        scan_object(inner, dsl, &ds.full_name, &ds.destroyed, obj, prev_snap_txg).await?;
    }
    Ok(())
}

/// One object, a level-1 block's children per batch (see the module docs), skipping blocks
/// born at or before `prune_txg` (scanned with an older tree).
async fn scan_object(
    inner: &Spa,
    dsl: &Datasets,
    what: &str,
    destroyed: &AtomicBool,
    obj: &Object,
    prune_txg: Txg,
) -> Result<()> {
    let mut path: Vec<Option<Decoded>> = Vec::new();
    let mut cursor = 0u64;
    // Bounded: every pass moves the cursor past at least one level-1 block's range (or a
    // hole's subtree), and the tree's capacity is finite; or it ends.
    loop {
        if dsl.scan.canceled() || destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        let _pin = ScanPin::set(inner);
        let (root, levels) = *obj.written_root.lock().unwrap();
        if cursor >= capacity(levels) {
            return Ok(());
        }
        path.resize_with(levels as usize + 1, || None);
        let mut bp = root;
        let mut level = levels;
        // Descend to the level-1 block covering `cursor`: at most `levels` steps.
        let next = loop {
            if bp.is_hole() || bp.birth <= prune_txg {
                break skip_hole(cursor, level);
            }
            let Some(slot) = indirect(inner, dsl, &mut path, level, &bp, what).await else {
                break skip_hole(cursor, level);
            };
            let ptrs = &path[slot].as_ref().expect("decoded").ptrs;
            if level == 1 {
                let first = (cursor % FANOUT) as usize;
                let children: Vec<BlockPtr> = ptrs[first..]
                    .iter()
                    .filter(|p| !p.is_hole() && p.birth > prune_txg)
                    .copied()
                    .collect();
                let results = join_all(
                    children
                        .iter()
                        .map(|c| scrub_block(&inner.zio, c, what))
                        .collect(),
                )
                .await;
                for (c, (_, counts)) in children.iter().zip(results) {
                    account(dsl, c, counts);
                }
                break skip_hole(cursor, 1);
            }
            let span_below = FANOUT.saturating_pow(u32::from(level) - 1);
            bp = ptrs[((cursor / span_below) % FANOUT) as usize];
            level -= 1;
        };
        debug_assert!(next > cursor);
        cursor = next;
    }
}
