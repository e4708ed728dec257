//! The scanner shared by scrub and resilver: a background scan that reads every copy of the
//! blocks the pool references, verifies each against the checksum its parent holds, and
//! rewrites bad or missing copies from good ones, while the pool serves.
//!
//! # Scrub and resilver
//!
//! A **scrub** visits every block. A **resilver** is the same walk limited to the txgs that
//! the devices in service lack (their missed ranges, `vdev/health.rs`: a dirty-time log as one
//! range per leaf): with `from` the lowest first txg any of them lacks, a subtree whose root
//! was born before `from` is skipped whole (copy on write: a parent is never older than its
//! children, so nothing under it is newer), and only blocks born within the window are read.
//! A device that lacks a block is written from a good copy without being read
//! (`zio::scrub_block`). When either ends clean, every device in service throughout forgets
//! the missed range it had when the scan started (`VdevTree::scrub_repaired_through`).
//!
//! Only one scan runs per pool. A resilver has priority: a scrub asked for during a resilver
//! is refused, a resilver asked for during a scrub cancels the scrub, and one asked for
//! during a resilver whose window does not cover the new one restarts it over both.
//!
//! # Persisted position
//!
//! After each batch the scan's state (kind, start txg, window, position, counters, paused)
//! becomes the pool's record [`SCAN_RECORD_KEY`], which the next txg writes among the pool's
//! properties. An import finds it and resumes from the position: a batch done after the last
//! sync is done again, none is skipped. The position is (dataset id, tree: a snapshot's guid
//! or 0 for the head, object, block cursor); datasets are walked in id order, and a position
//! whose snapshot is gone restarts its dataset.
//!
//! # Consistency with a pool that keeps changing
//!
//! The scan walks each volume's tree in batches: the children of consecutive level-1 blocks,
//! gathered up to [`SCAN_BATCH_BLOCKS_MAX`] blocks or [`SCAN_BATCH_BYTES_MAX`] of allocated
//! copies, then read all at once in the order of their first copy's (vdev, offset) (a
//! fragmented volume is read in device order; ZFS's sorted scan, bounded to one batch). For
//! each batch it sets a **pin** at the last durable txg, then reads the tree's root as the
//! last sync left it and descends from there. While the pin is
//! set, the txg sync releases no deferred free of a txg after the pin. Every block reachable
//! from that root was not freed by any txg up to the pin (the root is newer than those
//! txgs' syncs), so while pinned none of its places can be reallocated and overwritten: what
//! the scan reads is exactly the block its parent describes, a mismatch is real damage, and
//! a repair writes over nothing but the damaged copy. Between batches the pin is released,
//! so a scan never holds back frees for longer than one batch's reads (hence the bound).
//!
//! Indirect blocks on the path are verified once per scan (the next batch reuses them while
//! its root leads to the same ones, and verifies the new ones a sync wrote meanwhile).

use crate::dmu::object::Object;
use crate::dmu::tree::{capacity, skip_hole, BlockTree, FANOUT};
use crate::dsl::dataset::Dataset;
use crate::dsl::snapshot::Lineage;
use crate::dsl::Datasets;
use crate::spa::space::ScanPin;
use crate::spa::{Spa, SCAN_RECORD_KEY};
use crate::zio::{scrub_block, ScrubCounts};
use crate::{EngineError, Result};
use oxpool_format::{
    decode_indirect, decode_meta_index, BlockPtr, BlockType, Txg, INDIRECT_FANOUT,
};
use oxpool_io::rt::{block_on, join_all};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a scan does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanKind {
    /// Every block, every copy.
    Scrub,
    /// The blocks born in the txgs some device in service lacks.
    Resilver,
}

impl ScanKind {
    /// `scrub` or `resilver`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScanKind::Scrub => "scrub",
            ScanKind::Resilver => "resilver",
        }
    }
}

/// Where a scan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanState {
    /// Running.
    Scanning,
    /// Paused by `oxpool scrub -p` (persisted); `oxpool scrub` resumes it.
    Paused,
    /// Done: every block was visited.
    Finished,
    /// Stopped by `oxpool scrub -s`, a resilver, or an error (see [`ScanStatus::error`]).
    Canceled,
}

impl ScanState {
    fn as_str(self) -> &'static str {
        match self {
            ScanState::Scanning => "scanning",
            ScanState::Paused => "paused",
            ScanState::Finished => "finished",
            ScanState::Canceled => "canceled",
        }
    }
}

/// Where the scan resumes: the batches before it are done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanPosition {
    /// The dataset (volume id): datasets are scanned in id order.
    pub dataset: u64,
    /// Its tree: a snapshot's guid, or 0 for the head.
    pub tree: u64,
    /// The object within the tree.
    pub object: u64,
    /// The first data block index not yet scanned.
    pub cursor: u64,
}

/// What `oxpool status` shows of the pool's latest scan.
#[derive(Clone, Debug)]
pub struct ScanStatus {
    /// Scrub or resilver.
    pub kind: ScanKind,
    /// Running, paused, finished or canceled.
    pub state: ScanState,
    /// When it started, ns since the epoch.
    pub started_ns: u64,
    /// When it ended, ns since the epoch.
    pub ended_ns: Option<u64>,
    /// Since when it is paused, ns since the epoch.
    pub paused_ns: Option<u64>,
    /// How long it ran, paused time and time the pool was exported left out (to now, while
    /// running).
    pub elapsed: Duration,
    /// The txg durable when it started: it covers every block born up to it.
    pub start_txg: Txg,
    /// A resilver's txgs: the lowest and highest txg the devices lacked when it started.
    pub window: Option<(Txg, Txg)>,
    /// Where it resumes (None: from the start).
    pub position: Option<ScanPosition>,
    /// Bytes of block copies found by the walk so far (ZFS's "scanned").
    pub examined_bytes: u64,
    /// Bytes of block copies read and verified so far (ZFS's "issued").
    pub issued_bytes: u64,
    /// Bytes allocated when it started: what a scrub expects to read in all (an estimate,
    /// since the pool keeps changing; a resilver reads only a part of it).
    pub total_bytes: u64,
    /// Bytes rewritten over bad or missing copies.
    pub repaired_bytes: u64,
    /// Blocks read (each with all its copies).
    pub blocks_visited: u64,
    /// Copies checked, bad, repaired; blocks with no good copy.
    pub counts: ScrubCounts,
    /// Why it stopped, if an error stopped it.
    pub error: Option<String>,
    /// Active time of earlier runs (before an export or a pause), ns.
    active_before_ns: u64,
    /// When this run started (ns since the epoch) and the bytes examined and issued then:
    /// the rates are this run's.
    run: Option<(u64, u64, u64)>,
}

impl ScanStatus {
    fn new(kind: ScanKind, start_txg: Txg, window: Option<(Txg, Txg)>, total_bytes: u64) -> Self {
        let now = now_ns();
        ScanStatus {
            kind,
            state: ScanState::Scanning,
            started_ns: now,
            ended_ns: None,
            paused_ns: None,
            elapsed: Duration::ZERO,
            start_txg,
            window,
            position: None,
            examined_bytes: 0,
            issued_bytes: 0,
            total_bytes,
            repaired_bytes: 0,
            blocks_visited: 0,
            counts: ScrubCounts::default(),
            error: None,
            active_before_ns: 0,
            run: Some((now, 0, 0)),
        }
    }

    /// Percent done: issued of the estimate (at most 100).
    pub fn percent_done(&self) -> f64 {
        if self.state == ScanState::Finished {
            return 100.0;
        }
        if self.total_bytes == 0 {
            return 0.0;
        }
        (self.issued_bytes as f64 * 100.0 / self.total_bytes as f64).min(100.0)
    }

    fn active_ns(&self, now: u64) -> u64 {
        self.active_before_ns
            + self
                .run
                .map_or(0, |(since, _, _)| now.saturating_sub(since))
    }

    fn run_rate(&self, pick: impl Fn(&ScanStatus, u64, u64) -> u64) -> u64 {
        let Some((since, examined0, issued0)) = self.run else {
            return 0;
        };
        let secs = now_ns().saturating_sub(since) as f64 / 1e9;
        if secs <= 0.0 {
            return 0;
        }
        (pick(self, examined0, issued0) as f64 / secs) as u64
    }

    /// Bytes found per second by this run (since it started or resumed); 0 when not running.
    pub fn scan_rate_bytes_per_s(&self) -> u64 {
        self.run_rate(|s, e0, _| s.examined_bytes.saturating_sub(e0))
    }

    /// Bytes read and verified per second by this run; 0 when not running.
    pub fn issue_rate_bytes_per_s(&self) -> u64 {
        self.run_rate(|s, _, i0| s.issued_bytes.saturating_sub(i0))
    }

    /// The time left at this run's issue rate; None if it is not running, has issued
    /// nothing yet, or passed its estimate (the pool grew).
    pub fn time_left(&self) -> Option<Duration> {
        let rate = self.issue_rate_bytes_per_s();
        if self.state != ScanState::Scanning || rate == 0 || self.issued_bytes > self.total_bytes {
            return None;
        }
        Some(Duration::from_secs(
            (self.total_bytes - self.issued_bytes) / rate,
        ))
    }

    /// The record persisted among the pool's properties (see the module documentation):
    /// `KIND STATE key=value...`.
    fn encode(&self) -> String {
        let now = now_ns();
        let (wf, wt) = self.window.map_or((0, 0), |(f, t)| (f.0, t.0));
        let p = self.position;
        let pos = p.map_or("-".to_string(), |p| {
            format!("{}/{}/{}/{}", p.dataset, p.tree, p.object, p.cursor)
        });
        let c = &self.counts;
        format!(
            "{} {} txg={} window={wf}-{wt} pos={pos} examined={} issued={} total={} \
             repaired={} visited={} checked={} bad={} fixed={} lost={} started={} ended={} \
             active={} paused={}",
            self.kind.as_str(),
            self.state.as_str(),
            self.start_txg.0,
            self.examined_bytes,
            self.issued_bytes,
            self.total_bytes,
            self.repaired_bytes,
            self.blocks_visited,
            c.copies_checked,
            c.copies_bad,
            c.copies_repaired,
            c.blocks_lost,
            self.started_ns,
            self.ended_ns.unwrap_or(0),
            self.active_ns(now),
            self.paused_ns.unwrap_or(0),
        )
    }

    /// Parses [`ScanStatus::encode`]'s form (never panics; unknown keys are ignored, so a
    /// later build may add some). The result is not running: a resumed scan starts a run.
    fn parse(record: &str) -> Option<ScanStatus> {
        let mut words = record.split_ascii_whitespace();
        let kind = match words.next()? {
            "scrub" => ScanKind::Scrub,
            "resilver" => ScanKind::Resilver,
            _ => return None,
        };
        let state = match words.next()? {
            "scanning" => ScanState::Scanning,
            "paused" => ScanState::Paused,
            "finished" => ScanState::Finished,
            "canceled" => ScanState::Canceled,
            _ => return None,
        };
        let mut s = ScanStatus::new(kind, Txg(0), None, 0);
        s.state = state;
        s.run = None;
        for w in words {
            let (k, v) = w.split_once('=')?;
            let num = || v.parse::<u64>().ok();
            match k {
                "txg" => s.start_txg = Txg(num()?),
                "window" => {
                    let (f, t) = v.split_once('-')?;
                    let (f, t) = (f.parse::<u64>().ok()?, t.parse::<u64>().ok()?);
                    if f > t {
                        return None;
                    }
                    s.window = (f > 0).then_some((Txg(f), Txg(t)));
                }
                "pos" if v == "-" => s.position = None,
                "pos" => {
                    let n: Vec<u64> = v
                        .split('/')
                        .map(|x| x.parse::<u64>().ok())
                        .collect::<Option<_>>()?;
                    let [dataset, tree, object, cursor] = n[..] else {
                        return None;
                    };
                    s.position = Some(ScanPosition {
                        dataset,
                        tree,
                        object,
                        cursor,
                    });
                }
                "examined" => s.examined_bytes = num()?,
                "issued" => s.issued_bytes = num()?,
                "total" => s.total_bytes = num()?,
                "repaired" => {
                    // One figure, kept in both places (`issued` adds to both).
                    s.repaired_bytes = num()?;
                    s.counts.repaired_bytes = s.repaired_bytes;
                }
                "visited" => s.blocks_visited = num()?,
                "checked" => s.counts.copies_checked = num()?,
                "bad" => s.counts.copies_bad = num()?,
                "fixed" => s.counts.copies_repaired = num()?,
                "lost" => s.counts.blocks_lost = num()?,
                "started" => s.started_ns = num()?,
                "ended" => s.ended_ns = Some(num()?).filter(|&n| n != 0),
                "active" => s.active_before_ns = num()?,
                "paused" => s.paused_ns = Some(num()?).filter(|&n| n != 0),
                _ => {}
            }
        }
        if s.kind == ScanKind::Resilver && s.window.is_none() {
            return None;
        }
        s.elapsed = Duration::from_nanos(s.active_before_ns);
        Some(s)
    }
}

/// Why a scan's thread was asked to stop.
const RUN: u8 = 0;
/// `oxpool scrub -s`: the scan ends, canceled.
const STOP_CANCEL: u8 = 1;
/// `oxpool scrub -p`: the scan stays, paused.
const STOP_PAUSE: u8 = 2;
/// An export or a close: the scan stays as it is, and resumes at the next import.
const STOP_SUSPEND: u8 = 3;
/// A new scan replaces it: its starter sets the status.
const STOP_REPLACE: u8 = 4;

/// The pool's scan: its status and its thread.
#[derive(Default)]
pub(crate) struct Scan {
    status: Mutex<Option<ScanStatus>>,
    /// Signalled when a scan ends or pauses.
    ended: Condvar,
    /// RUN, or why the thread should stop.
    stop: AtomicU8,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// One start, stop or pause at a time.
    control: Mutex<()>,
    /// The txg durable when the running scan started, and the devices' outages when this
    /// run started: a scan that finishes clean repaired what the devices lacked up to it.
    repairs_through: Mutex<Option<(Txg, crate::vdev::OutageMarks)>>,
    /// Test hook: the scan waits before a batch once it has visited this many blocks (0: never).
    pub(crate) hold_after_blocks: std::sync::atomic::AtomicU64,
    /// Test hook: a smaller bound on a batch's blocks (0: [`SCAN_BATCH_BLOCKS_MAX`]), for
    /// more batches (and positions) in a small pool.
    pub(crate) batch_blocks_max: std::sync::atomic::AtomicUsize,
}

impl Scan {
    fn update(&self, f: impl FnOnce(&mut ScanStatus)) {
        if let Some(s) = self.status.lock().unwrap().as_mut() {
            f(s)
        }
    }

    fn canceled(&self) -> bool {
        self.stop.load(Ordering::Relaxed) != RUN
    }

    /// Asks the running thread (if any) to stop for `why` and waits for it.
    fn stop_thread(&self, why: u8) {
        self.stop.store(why, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Stops a running scan for an export or a close: it stays persisted as it is and
    /// resumes at the next import.
    pub(crate) fn stop(&self) {
        let _one = self.control.lock().unwrap();
        self.stop_thread(STOP_SUSPEND);
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The txgs the devices in service lack: the lowest first and highest last of their
/// missed ranges.
fn missed_window(spa: &Spa) -> Option<(Txg, Txg)> {
    spa.zio
        .vdevs
        .leaves()
        .filter(|l| l.health.in_service())
        .filter_map(|l| l.health.missed())
        .reduce(|(f, t), (f2, t2)| (f.min(f2), t.max(t2)))
}

/// Makes the status the pool's record for its next txg.
fn publish(spa: &Spa, status: &ScanStatus) {
    let record = status.encode();
    spa.state.lock().unwrap().scan_record = Some(record);
    spa.txg.mark_dirty();
}

impl Datasets {
    /// Starts (or resumes, with `status` given) the scan thread; the caller holds the
    /// scan's control lock and no thread runs.
    fn spawn_scan(self: &Arc<Self>, spa: &Arc<Spa>, mut status: ScanStatus) -> Result<()> {
        let scan = &self.scan;
        if let Some(old) = scan.thread.lock().unwrap().take() {
            let _ = old.join(); // ended already: its status says so
        }
        // What a device lacks up to the start, the scan repairs (if the device stays in
        // service): its outages are counted from this run on.
        *scan.repairs_through.lock().unwrap() =
            Some((status.start_txg, spa.zio.vdevs.outage_marks()));
        status.state = ScanState::Scanning;
        status.paused_ns = None;
        status.ended_ns = None;
        status.error = None;
        status.run = Some((now_ns(), status.examined_bytes, status.issued_bytes));
        publish(spa, &status);
        let kind = status.kind;
        *scan.status.lock().unwrap() = Some(status);
        scan.stop.store(RUN, Ordering::Relaxed);
        let (spa2, dsl) = (spa.clone(), self.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-{}", kind.as_str(), spa.name))
            .spawn(move || scan_thread(spa2, dsl));
        match spawned {
            Ok(t) => {
                *scan.thread.lock().unwrap() = Some(t);
                Ok(())
            }
            Err(e) => {
                scan.update(|s| {
                    s.state = ScanState::Canceled;
                    s.error = Some(format!("no thread: {e}"));
                });
                Err(EngineError::io("scan thread", e))
            }
        }
    }

    /// A new scan of `kind` from the start: syncs first, so that it covers every write
    /// answered before it started.
    fn fresh(spa: &Spa, kind: ScanKind, window: Option<(Txg, Txg)>) -> Result<ScanStatus> {
        spa.sync_now()?;
        // ALLOC as `list` shows it: what synced txgs freed is no block a scan visits.
        let total_bytes = spa.size_and_alloc_bytes().1;
        Ok(ScanStatus::new(kind, spa.synced_txg(), window, total_bytes))
    }

    /// Starts a scrub of pool `spa` in the background (`oxpool scrub`), or resumes a paused
    /// one; refused while a scrub or a resilver runs.
    pub(crate) fn scrub_start(self: &Arc<Self>, spa: &Arc<Spa>) -> Result<()> {
        let _one = self.scan.control.lock().unwrap();
        let current = self.scan.status.lock().unwrap().clone();
        match current.as_ref().map(|s| (s.kind, s.state)) {
            Some((ScanKind::Resilver, ScanState::Scanning)) => {
                return Err(EngineError::invalid(format!(
                    "pool '{}' is resilvering: a scrub waits until the resilver ends",
                    spa.name
                )))
            }
            Some((_, ScanState::Scanning)) => {
                return Err(EngineError::invalid(format!(
                    "pool '{}' is being scrubbed already (oxpool scrub -s {} stops it)",
                    spa.name, spa.name
                )))
            }
            Some((_, ScanState::Paused)) => {
                let mut s = current.expect("matched");
                s.active_before_ns = s.active_ns(now_ns());
                tracing::info!(pool = spa.name, "scrub resumed");
                return self.spawn_scan(spa, s);
            }
            _ => {}
        }
        let status = Self::fresh(spa, ScanKind::Scrub, None)?;
        self.spawn_scan(spa, status)
    }

    /// Starts a resilver of every device in service that lacks txgs (`Pool::resilver_start`):
    /// a running scrub is canceled; a running resilver whose window does not cover what the
    /// devices lack now restarts over both. Nothing to do if no device lacks anything.
    pub(crate) fn resilver_start(self: &Arc<Self>, spa: &Arc<Spa>) -> Result<()> {
        let _one = self.scan.control.lock().unwrap();
        let Some(window) = missed_window(spa) else {
            return Ok(());
        };
        let current = self.scan.status.lock().unwrap().clone();
        if let Some(s) = current.filter(|s| s.state == ScanState::Scanning) {
            let covers = s.kind == ScanKind::Resilver
                && s.window
                    .is_some_and(|(f, t)| f <= window.0 && window.1 <= t);
            if covers && self.scan.thread.lock().unwrap().is_some() {
                return Ok(());
            }
            tracing::info!(
                pool = spa.name,
                "{} {} for a resilver of txgs {}-{}",
                s.kind.as_str(),
                if s.kind == ScanKind::Scrub {
                    "canceled"
                } else {
                    "restarted"
                },
                window.0 .0,
                window.1 .0
            );
            self.scan.stop_thread(STOP_REPLACE);
        }
        let window = missed_window(spa).unwrap_or(window);
        let status = Self::fresh(spa, ScanKind::Resilver, Some(window))?;
        // Devices that came back while it synced widen it.
        let status = ScanStatus {
            window: missed_window(spa).map_or(status.window, |(f, t)| {
                Some((f.min(window.0), t.max(window.1)))
            }),
            ..status
        };
        self.spawn_scan(spa, status)
    }

    /// At import: takes up the scan the pool's record describes (resumes a running one from
    /// its position, shows a paused or ended one), and starts a resilver if a device in
    /// service lacks txgs the record's resilver does not cover.
    pub(crate) fn scan_import(self: &Arc<Self>, spa: &Arc<Spa>) -> Result<()> {
        let record = spa.state.lock().unwrap().scan_record.clone();
        let status = record.as_deref().and_then(|r| {
            let s = ScanStatus::parse(r);
            if s.is_none() {
                tracing::warn!(
                    pool = spa.name,
                    "ignoring a damaged {SCAN_RECORD_KEY} record: {r}"
                );
            }
            s
        });
        let resume = status
            .as_ref()
            .is_some_and(|s| s.state == ScanState::Scanning);
        *self.scan.status.lock().unwrap() = status.clone();
        let lacking = missed_window(spa);
        let covered = status.as_ref().is_some_and(|s| {
            resume
                && s.kind == ScanKind::Resilver
                && lacking.is_none_or(|(f, t)| s.window.is_some_and(|(sf, st)| sf <= f && t <= st))
        });
        if lacking.is_some() && !covered {
            return self.resilver_start(spa);
        }
        if let (true, Some(s)) = (resume, status) {
            let _one = self.scan.control.lock().unwrap();
            tracing::info!(pool = spa.name, position = ?s.position, "{} resumed", s.kind.as_str());
            return self.spawn_scan(spa, s);
        }
        Ok(())
    }

    fn stop_scrub(&self, spa: &Spa, why: u8, verb: &str) -> Result<()> {
        let _one = self.scan.control.lock().unwrap();
        let current = self.scan.status.lock().unwrap().clone();
        match current.as_ref().map(|s| (s.kind, s.state)) {
            Some((ScanKind::Resilver, ScanState::Scanning)) => {
                return Err(EngineError::invalid(format!(
                    "pool '{}' is resilvering: a resilver cannot be {verb}",
                    self.pool_name
                )))
            }
            Some((ScanKind::Scrub, ScanState::Scanning)) => {}
            Some((ScanKind::Scrub, ScanState::Paused)) if why == STOP_CANCEL => {}
            _ => {
                return Err(EngineError::invalid(format!(
                    "there is no scrub of pool '{}' to stop{}",
                    self.pool_name,
                    if why == STOP_PAUSE { " or pause" } else { "" }
                )))
            }
        }
        self.scan.stop_thread(why);
        let now = now_ns();
        let mut status = self.scan.status.lock().unwrap();
        if let Some(s) = status.as_mut() {
            s.active_before_ns = s.active_ns(now);
            s.run = None;
            s.elapsed = Duration::from_nanos(s.active_before_ns);
            if why == STOP_PAUSE {
                s.state = ScanState::Paused;
                s.paused_ns = Some(now);
            } else {
                s.state = ScanState::Canceled;
                s.ended_ns = Some(now);
            }
            publish(spa, s);
        }
        drop(status);
        self.scan.ended.notify_all();
        Ok(())
    }

    /// Stops a running or paused scrub (`oxpool scrub -s`); a resilver cannot be stopped.
    pub(crate) fn scrub_cancel(&self, spa: &Spa) -> Result<()> {
        self.stop_scrub(spa, STOP_CANCEL, "stopped")
    }

    /// Pauses a running scrub (`oxpool scrub -p`), persisted; `oxpool scrub` resumes it.
    pub(crate) fn scrub_pause(&self, spa: &Spa) -> Result<()> {
        self.stop_scrub(spa, STOP_PAUSE, "paused")
    }

    /// The latest scan's status, if one ran since the pool was opened or its record says.
    pub(crate) fn scan_status(&self) -> Option<ScanStatus> {
        let mut s = self.scan.status.lock().unwrap().clone()?;
        if s.state == ScanState::Scanning {
            s.elapsed = Duration::from_nanos(s.active_ns(now_ns()));
        }
        Some(s)
    }

    /// Waits until the running scan (if any) ends or pauses, or `limit` passes; returns its
    /// status.
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
            (ScanState::Paused, _) => Err(EngineError::invalid("scrub paused")),
            _ => Err(EngineError::invalid("scrub canceled")),
        }
    }
}

fn scan_thread(spa: Arc<Spa>, dsl: Arc<Datasets>) {
    // Nobody waits on this thread's I/O within microseconds: sleep, don't spin.
    oxpool_io::rt::set_spin(false);
    let (kind, window, resume) = {
        let s = dsl.scan.status.lock().unwrap();
        let s = s.as_ref().expect("a scan thread has a status");
        (s.kind, s.window, s.position)
    };
    let ctx = Ctx {
        spa: &spa,
        dsl: &dsl,
        window,
    };
    let result = block_on(scan_pool(&ctx, resume));
    let scan = &dsl.scan;
    let why = scan.stop.load(Ordering::Relaxed);
    if why != RUN {
        // Paused, canceled, suspended or replaced: whoever stopped it says what it is now
        // (a suspended scan stays as its record says, and resumes at the next import).
        if why == STOP_SUSPEND {
            let status = scan.status.lock().unwrap();
            if let Some(s) = status.as_ref() {
                publish(&spa, s);
            }
        }
        scan.ended.notify_all();
        return;
    }
    // Every block visited, none lost, every bad copy rewritten: the devices that were in
    // service throughout hold every block born up to the scan's start. Before the status
    // says Finished, so that whoever waits for it sees the devices as the scan left them.
    let clean = result.is_ok()
        && scan.status.lock().unwrap().as_ref().is_some_and(|s| {
            s.counts.blocks_lost == 0 && s.counts.copies_bad == s.counts.copies_repaired
        });
    let through = scan.repairs_through.lock().unwrap().take();
    if clean && kind == ScanKind::Scrub {
        // Every block the pool references read back: nothing listed as damaged still is (a
        // resilver reads only some of them).
        spa.error_log.clear();
    }
    if let (true, Some((txg, marks))) = (clean, through) {
        if spa.zio.vdevs.scrub_repaired_through(txg, &marks) {
            // The devices' records change: the next txg says so.
            spa.txg.mark_dirty();
        }
        spa.finish_replacements();
    }
    let mut status = scan.status.lock().unwrap();
    if let Some(s) = status.as_mut() {
        let now = now_ns();
        s.active_before_ns = s.active_ns(now);
        s.run = None;
        s.elapsed = Duration::from_nanos(s.active_before_ns);
        s.ended_ns = Some(now);
        s.state = match &result {
            Ok(()) => ScanState::Finished,
            Err(_) => ScanState::Canceled,
        };
        if let Err(e) = &result {
            s.error = Some(e.to_string());
        }
        publish(&spa, s);
    }
    drop(status);
    match &result {
        Ok(()) => tracing::info!(pool = spa.name, kind = kind.as_str(), "scan ended"),
        Err(e) => tracing::warn!(pool = spa.name, kind = kind.as_str(), "scan stopped: {e}"),
    }
    scan.ended.notify_all();
}

/// What a scan's walk needs.
struct Ctx<'a> {
    spa: &'a Spa,
    dsl: &'a Datasets,
    /// A resilver's txgs (None: a scrub, every block).
    window: Option<(Txg, Txg)>,
}

impl Ctx<'_> {
    /// Whether the scan reads the block `bp` (a resilver: born within its window).
    fn wanted(&self, bp: &BlockPtr) -> bool {
        !bp.is_hole()
            && self
                .window
                .is_none_or(|(f, t)| f <= bp.birth && bp.birth <= t)
    }

    /// The txg at or before which a resilver skips a subtree whole (nothing under a root
    /// born before the window is in it).
    fn prune(&self, prune_txg: Txg) -> Txg {
        match self.window {
            Some((from, _)) => prune_txg.max(Txg(from.0.saturating_sub(1))),
            None => prune_txg,
        }
    }

    /// Test hook: waits while the scan has visited as many blocks as the hold says.
    fn held(&self) {
        let scan = &self.dsl.scan;
        // Bounded: the test lifts the hold, or the scan is stopped.
        loop {
            let limit = scan.hold_after_blocks.load(Ordering::Relaxed);
            let visited = scan
                .status
                .lock()
                .unwrap()
                .as_ref()
                .map_or(0, |s| s.blocks_visited);
            if limit == 0 || visited < limit || scan.canceled() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Adds one block's findings to the status: found by the walk and read at once.
fn account(ctx: &Ctx<'_>, bp: &BlockPtr, counts: ScrubCounts) {
    let copies: u64 = bp.dvas().iter().map(|d| d.asize_bytes as u64).sum();
    ctx.dsl.scan.update(|s| s.examined_bytes += copies);
    issued(ctx, bp, counts);
}

/// Adds the findings of one block read (its walk counted it found already).
fn issued(ctx: &Ctx<'_>, bp: &BlockPtr, counts: ScrubCounts) {
    let copies: u64 = bp.dvas().iter().map(|d| d.asize_bytes as u64).sum();
    ctx.dsl.scan.update(|s| {
        s.issued_bytes += copies;
        s.repaired_bytes += counts.repaired_bytes;
        s.blocks_visited += 1;
        s.counts += counts;
    });
}

/// Scrubs one block and accounts for it.
async fn visit(ctx: &Ctx<'_>, bp: &BlockPtr, what: &str) -> Option<oxpool_io::IoBuf> {
    let (buf, counts) = scrub_block(&ctx.spa.zio, bp, what).await;
    account(ctx, bp, counts);
    buf
}

async fn scan_pool(ctx: &Ctx<'_>, resume: Option<ScanPosition>) -> Result<()> {
    scan_pool_metadata(ctx).await;
    let mut datasets = ctx.dsl.all();
    datasets.sort_by_key(|d| d.id.0);
    for ds in datasets {
        if ctx.dsl.scan.canceled() {
            break;
        }
        // Datasets before the position are done (one gone since is no matter).
        if resume.is_some_and(|p| ds.id.0 < p.dataset) {
            continue;
        }
        let from = resume.filter(|p| p.dataset == ds.id.0);
        scan_dataset(ctx, &ds, from).await?;
    }
    Ok(())
}

/// The pool's own metadata: its block (or index and pieces) and the space-map chunks.
async fn scan_pool_metadata(ctx: &Ctx<'_>) {
    let spa = ctx.spa;
    let _pin = ScanPin::set(spa);
    let (meta_ptr, chunks) = {
        let s = spa.state.lock().unwrap();
        (s.meta_ptr, s.chunk_ptrs.concat())
    };
    let history = spa.history.lock().unwrap().blocks();
    if meta_ptr.is_hole() {
        return;
    }
    // The index is read to find its pieces even when a resilver does not need it itself.
    let index = if ctx.wanted(&meta_ptr) || meta_ptr.block_type == BlockType::MetaIndex {
        visit(ctx, &meta_ptr, "pool metadata").await
    } else {
        None
    };
    if meta_ptr.block_type == BlockType::MetaIndex {
        let pieces =
            index.and_then(|buf| decode_meta_index(&buf[..meta_ptr.psize_bytes as usize]).ok());
        for p in pieces.unwrap_or_default().iter().filter(|p| ctx.wanted(p)) {
            visit(ctx, p, "pool metadata").await;
        }
    }
    for c in chunks.iter().filter(|c| ctx.wanted(c)) {
        visit(ctx, c, "space map").await;
    }
    for c in history.iter().filter(|c| ctx.wanted(c)) {
        visit(ctx, c, "history").await;
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
    ctx: &Ctx<'_>,
    path: &mut [Option<Decoded>],
    level: u8,
    bp: &BlockPtr,
    what: &str,
) -> Option<usize> {
    let slot = level as usize;
    if path[slot].as_ref().is_some_and(|d| d.bp == *bp) {
        return Some(slot);
    }
    let (buf, mut counts) = scrub_block(&ctx.spa.zio, bp, what).await;
    let mut ptrs = Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]);
    let decoded =
        buf.is_some_and(|b| decode_indirect(&b[..bp.psize_bytes as usize], &mut ptrs).is_ok());
    if !decoded && counts.blocks_lost == 0 {
        counts.blocks_lost = 1;
    }
    account(ctx, bp, counts);
    path[slot] = decoded.then_some(Decoded { bp: *bp, ptrs });
    decoded.then_some(slot)
}

/// One dataset's snapshots, oldest first, then its objects, a level-1 block's children per
/// batch (see the module docs), from `from` if the scan resumes within it. Each tree skips
/// the blocks born at or before the snapshot before it (the origin's, for a clone's
/// first): those are in that older tree, scanned with it, so a block shared by many
/// snapshots is read once.
async fn scan_dataset(ctx: &Ctx<'_>, ds: &Arc<Dataset>, from: Option<ScanPosition>) -> Result<()> {
    let spa = ctx.spa;
    let (snapshots, origin_txg, prev_snap_txg) = {
        let l = ds.lineage.lock().unwrap();
        (l.snapshots().to_vec(), l.origin_txg(), l.prev_snap_txg)
    };
    // A volume's block size is fixed at its creation: its snapshots' too.
    let block_bytes = u64::from(ds.props.lock().unwrap().volblocksize_bytes);
    // The deadlists' and tables' own blocks (a few; done again when the scan resumes here).
    {
        let _pin = ScanPin::set(spa);
        let chunks: Vec<BlockPtr> = {
            let l = ds.lineage.lock().unwrap();
            std::iter::once(&l.deadlist)
                .chain(l.snapshots().iter().map(|s| &s.deadlist))
                .flat_map(|d| d.buckets().flat_map(|(_, b)| b.stored.clone()))
                .chain(l.snapshot_table.blocks().copied())
                .chain(l.bookmark_table.blocks().copied())
                .collect()
        };
        for c in chunks.iter().filter(|c| ctx.wanted(c)) {
            visit(ctx, c, "deadlist").await;
        }
    }
    // The tree the position names: its snapshot if it still exists, or the head (0). A
    // snapshot destroyed since: the dataset from its start (work done again, none skipped).
    let resume_tree = from
        .and_then(|p| (p.tree == 0 || snapshots.iter().any(|s| s.guid.0 == p.tree)).then_some(p));
    let mut skipping = resume_tree.is_some_and(|p| p.tree != 0);
    let mut prune = origin_txg;
    for s in &snapshots {
        let this = resume_tree.filter(|p| p.tree == s.guid.0);
        if this.is_some() {
            skipping = false;
        }
        if skipping || resume_tree.is_some_and(|p| p.tree == 0) {
            prune = s.txg;
            continue;
        }
        // A view, so that destroying the snapshot stops its scan before its blocks are freed.
        let view = Arc::new(Dataset::volume(
            ds.id,
            &spa.name,
            &format!("{}@{}", ds.name(), s.name),
            ds.props.lock().unwrap().clone(),
            Object::new(
                BlockTree::new(s.levels.max(1), s.root),
                s.volsize_bytes,
                s.referenced_bytes,
            ),
            ds.log.clone(),
            Lineage::new(s.guid, s.txg, s.creation_s),
        ));
        ctx.dsl.add_view(ds, s.guid, &view);
        let still_there = ds.lineage.lock().unwrap().find(&s.name).is_some();
        if still_there {
            for (id, obj) in view.objset.objects() {
                let tree = TreeAt {
                    dataset: ds.id.0,
                    tree: s.guid.0,
                    object: id.0,
                };
                let Some(cursor) = tree.start(this) else {
                    continue;
                };
                let walked = Walked {
                    name: &view.full_name(),
                    block_bytes,
                    size_bytes: obj.tree_size_bytes.load(Ordering::Relaxed),
                };
                scan_object(ctx, &walked, &view.destroyed, obj, prune, tree, cursor).await?;
            }
        }
        prune = s.txg;
    }
    let head = resume_tree.filter(|p| p.tree == 0);
    for (id, obj) in ds.objset.objects() {
        let tree = TreeAt {
            dataset: ds.id.0,
            tree: 0,
            object: id.0,
        };
        let Some(cursor) = tree.start(head) else {
            continue;
        };
        let walked = Walked {
            name: &ds.full_name(),
            block_bytes,
            size_bytes: obj.tree_size_bytes.load(Ordering::Relaxed),
        };
        scan_object(
            ctx,
            &walked,
            &ds.destroyed,
            obj,
            prev_snap_txg,
            tree,
            cursor,
        )
        .await?;
    }
    Ok(())
}

/// An object of a tree of a dataset, as a position names it.
#[derive(Clone, Copy)]
struct TreeAt {
    dataset: u64,
    tree: u64,
    object: u64,
}

impl TreeAt {
    /// Where the scan starts in this object when it resumes at `from` (a position in this
    /// tree, or None): None if the object is done.
    fn start(&self, from: Option<ScanPosition>) -> Option<u64> {
        match from {
            None => Some(0),
            Some(p) if self.object < p.object => None,
            Some(p) if self.object == p.object => Some(p.cursor),
            Some(_) => Some(0),
        }
    }
}

/// Bound on the allocated bytes of the data blocks one batch gathers before it issues
/// their reads (all in flight at once, so also the batch's buffers per copy).
pub(crate) const SCAN_BATCH_BYTES_MAX: u64 = 16 << 20;
/// Bound on the blocks one batch gathers: the pin holds back frees while they are read.
pub(crate) const SCAN_BATCH_BLOCKS_MAX: usize = 2048;

/// A tree the scan walks, as the error log names its damage.
struct Walked<'a> {
    /// `pool/vol` or `pool/vol@snap`.
    name: &'a str,
    /// Its data blocks' size (`volblocksize`).
    block_bytes: u64,
    /// The volume's size: a lost indirect block's range ends there at most.
    size_bytes: u64,
}

/// Descends from `root` (a tree of `levels`) to the level-1 block covering `cursor`,
/// verifying the indirect blocks on the way, and appends its children from `cursor` on that
/// the scan reads to `gathered`. Returns the cursor past it (or past the hole or pruned
/// subtree found on the way).
#[allow(clippy::too_many_arguments)]
async fn gather_level1(
    ctx: &Ctx<'_>,
    path: &mut [Option<Decoded>],
    root: BlockPtr,
    levels: u8,
    cursor: u64,
    prune_txg: Txg,
    walked: &Walked<'_>,
    gathered: &mut Vec<(u64, BlockPtr)>,
) -> u64 {
    let mut bp = root;
    let mut level = levels;
    // At most `levels` steps.
    loop {
        if bp.is_hole() || bp.birth <= prune_txg {
            return skip_hole(cursor, level);
        }
        let Some(slot) = indirect(ctx, path, level, &bp, walked.name).await else {
            // Every block below it is unreadable (`oxpool status -v` names its range, up to
            // the volume's end).
            let span_blocks = FANOUT.saturating_pow(u32::from(level));
            let first = cursor - cursor % span_blocks;
            let start = first.saturating_mul(walked.block_bytes);
            let end = first
                .saturating_add(span_blocks)
                .saturating_mul(walked.block_bytes)
                .min(walked.size_bytes);
            if end > start {
                ctx.spa
                    .error_log
                    .record_range(walked.name, start, end - start);
            }
            return skip_hole(cursor, level);
        };
        let ptrs = &path[slot].as_ref().expect("decoded").ptrs;
        if level == 1 {
            let first = (cursor % FANOUT) as usize;
            let base = cursor - cursor % FANOUT;
            let before = gathered.len();
            gathered.extend(
                ptrs.iter()
                    .enumerate()
                    .skip(first)
                    .filter(|(_, p)| p.birth > prune_txg && ctx.wanted(p))
                    .map(|(i, p)| (base + i as u64, *p)),
            );
            let found: u64 = gathered[before..]
                .iter()
                .flat_map(|(_, b)| b.dvas().iter().map(|d| d.asize_bytes as u64))
                .sum();
            ctx.dsl.scan.update(|s| s.examined_bytes += found);
            return skip_hole(cursor, 1);
        }
        let span_below = FANOUT.saturating_pow(u32::from(level) - 1);
        bp = ptrs[((cursor / span_below) % FANOUT) as usize];
        level -= 1;
    }
}

/// One object, from block `cursor` on, in batches (see the module docs): each gathers the
/// children of level-1 blocks under one pin, up to [`SCAN_BATCH_BLOCKS_MAX`] blocks or
/// [`SCAN_BATCH_BYTES_MAX`], then issues their reads sorted by (vdev, offset) of their first
/// copy, so that a fragmented volume is read in device order rather than logical order.
/// Skips blocks born at or before `prune_txg` (scanned with an older tree). After each batch
/// the position moves past it.
async fn scan_object(
    ctx: &Ctx<'_>,
    walked: &Walked<'_>,
    destroyed: &AtomicBool,
    obj: &Object,
    prune_txg: Txg,
    at: TreeAt,
    mut cursor: u64,
) -> Result<()> {
    let spa = ctx.spa;
    let what = walked.name;
    let prune_txg = ctx.prune(prune_txg);
    let mut path: Vec<Option<Decoded>> = Vec::new();
    // (block index, pointer) of the data blocks of a batch.
    let mut gathered: Vec<(u64, BlockPtr)> = Vec::new();
    let batch_blocks_max = match ctx.dsl.scan.batch_blocks_max.load(Ordering::Relaxed) {
        0 => SCAN_BATCH_BLOCKS_MAX,
        n => n.min(SCAN_BATCH_BLOCKS_MAX),
    };
    // Bounded: every pass moves the cursor past at least one level-1 block's range (or a
    // hole's subtree), and the tree's capacity is finite; or it ends.
    loop {
        ctx.held();
        if ctx.dsl.scan.canceled() || destroyed.load(Ordering::Acquire) {
            return Ok(());
        }
        // Set from reading the root until the gathered blocks' reads are done: none of
        // them can be freed and reused under the scan meanwhile.
        let pin = ScanPin::set(spa);
        let (root, levels) = *obj.written_root.lock().unwrap();
        if cursor >= capacity(levels) {
            return Ok(());
        }
        path.resize_with(levels as usize + 1, || None);
        gathered.clear();
        let mut gathered_bytes = 0u64;
        // Bounded by the tree's capacity and the batch's bounds (a level-1 block adds at
        // most FANOUT blocks past them).
        while cursor < capacity(levels)
            && gathered.len() < batch_blocks_max
            && gathered_bytes < SCAN_BATCH_BYTES_MAX
            && !ctx.dsl.scan.canceled()
        {
            let before = gathered.len();
            let next = gather_level1(
                ctx,
                &mut path,
                root,
                levels,
                cursor,
                prune_txg,
                walked,
                &mut gathered,
            )
            .await;
            gathered_bytes += gathered[before..]
                .iter()
                .flat_map(|(_, b)| b.dvas().iter().map(|d| d.asize_bytes as u64))
                .sum::<u64>();
            debug_assert!(next > cursor);
            cursor = next;
        }
        gathered.sort_unstable_by_key(|(_, b)| {
            b.dvas()
                .first()
                .map_or((u32::MAX, 0), |d| (d.vdev.0, d.offset_bytes))
        });
        let results = join_all(
            gathered
                .iter()
                .map(|(_, c)| scrub_block(&spa.zio, c, what))
                .collect(),
        )
        .await;
        for ((block, c), (_, counts)) in gathered.iter().zip(results) {
            if counts.blocks_lost > 0 {
                // No copy gave it back: `oxpool status -v` names the range, as a failed
                // read does.
                spa.error_log.record(what, *block, walked.block_bytes);
            }
            issued(ctx, c, counts);
        }
        drop(pin);
        // The batch is done (its repairs written): the position moves past it.
        let mut status = ctx.dsl.scan.status.lock().unwrap();
        if let Some(s) = status.as_mut() {
            s.position = Some(ScanPosition {
                dataset: at.dataset,
                tree: at.tree,
                object: at.object,
                cursor,
            });
            publish(spa, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused_without_panics() {
        let mut s = ScanStatus::new(
            ScanKind::Resilver,
            Txg(40),
            Some((Txg(7), Txg(31))),
            1 << 30,
        );
        s.position = Some(ScanPosition {
            dataset: 3,
            tree: 0xdead_beef,
            object: 1,
            cursor: 4096,
        });
        s.examined_bytes = 11;
        s.issued_bytes = 10;
        s.repaired_bytes = 9;
        s.counts.repaired_bytes = 9;
        s.blocks_visited = 8;
        s.counts.copies_checked = 7;
        s.counts.copies_bad = 6;
        s.counts.copies_repaired = 5;
        s.state = ScanState::Paused;
        s.paused_ns = Some(123);
        let back = ScanStatus::parse(&s.encode()).expect("parses");
        assert_eq!(
            back.encode().split(" active=").next(),
            s.encode().split(" active=").next()
        );
        assert_eq!(
            (back.kind, back.state),
            (ScanKind::Resilver, ScanState::Paused)
        );
        assert_eq!(back.position, s.position);
        assert_eq!(back.window, s.window);
        assert_eq!(back.blocks_visited, 8);
        // What `Pool::scrub` returns after a resumed scrub counts the bytes of every run.
        assert_eq!(back.counts.repaired_bytes, 9);
        let scrub = ScanStatus::new(ScanKind::Scrub, Txg(5), None, 0);
        let back = ScanStatus::parse(&scrub.encode()).unwrap();
        assert_eq!((back.window, back.position), (None, None));
        // Unknown keys are ignored; anything else malformed is refused.
        assert!(ScanStatus::parse("scrub scanning txg=3 future=1").is_some());
        for bad in [
            "",
            "scrub",
            "trim scanning",
            "scrub running",
            "scrub scanning txg=x",
            "scrub scanning txg",
            "scrub scanning pos=1/2/3",
            "scrub scanning pos=1/2/3/4/",
            "scrub scanning window=9-3",
            "resilver scanning txg=3",
            "scrub scanning visited=99999999999999999999999",
            "scrub scanning pos=////",
        ] {
            assert!(ScanStatus::parse(bad).is_none(), "{bad}");
        }
        // Every prefix and a byte flipped anywhere: never a panic.
        let good = s.encode();
        for i in 0..good.len() {
            let _ = ScanStatus::parse(&good[..i]);
            let mut b = good.clone().into_bytes();
            b[i] ^= 0x15;
            let _ = ScanStatus::parse(&String::from_utf8_lossy(&b));
        }
    }
}
