//! Device states (ZFS's vdev states) and the fault rule.
//!
//! A leaf is **in service** (ONLINE, or DEGRADED: still used) or **out of service** (FAULTED,
//! OFFLINE, REMOVED): the planners never hand an out-of-service leaf a read or a write, as if
//! its device were missing. What the leaf missed while out, or lost to failed writes, is
//! remembered as a range of txgs (`missed`, a dirty-time log of one range: ZFS keeps a range
//! set per leaf): reads of a block born in that range try the leaf last (a mirror) or treat
//! its column as missing (a raidz), its checksum mismatches there are expected and charged to
//! nobody, and a scrub that finishes clean repairs the blocks and forgets the range. A
//! resilver would visit only the blocks born in it. The range starts at the first txg not
//! yet durable when the leaf went out, so it never misses a block.
//!
//! The **fault rule** (pool properties `fault_errors`, default 10, and `fault_window`,
//! default 600 seconds, ZED's defaults): a leaf that returns `fault_errors` I/O errors (reads,
//! writes, flushes) within `fault_window` seconds is FAULTED, if its top-level vdev's
//! redundancy covers it (a mirror keeps a whole side, a raidz at most `parity` children out);
//! `fault_errors` checksum errors within the window make it DEGRADED (still used: as in ZFS,
//! a device returning bad data may still hold the only good copy of another block). When the
//! redundancy does not cover a fault, the leaf stays in use, DEGRADED, and says why. 0 turns
//! the rule off. A device that reports it is gone (`ENXIO`, `ENODEV`) is REMOVED at once.

use crate::{EngineError, Result};
use oxpool_format::Txg;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The state of a leaf (`oxpool status`'s STATE column). A child not found at import has no
/// leaf; it shows as UNAVAIL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LeafState {
    /// Working.
    Online = 0,
    /// Used, but it returned too many checksum errors, or too many I/O errors when its vdev
    /// had no redundancy to fault it.
    Degraded = 1,
    /// Out of service after too many I/O errors (persisted; `oxpool clear` or `online`
    /// returns it).
    Faulted = 2,
    /// Taken out by the administrator (`oxpool offline`; persisted unless `-t`).
    Offline = 3,
    /// Its device reported that it is gone.
    Removed = 4,
}

impl LeafState {
    /// Whether the leaf gets reads and writes.
    pub fn in_service(self) -> bool {
        matches!(self, LeafState::Online | LeafState::Degraded)
    }

    /// The name `oxpool status` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            LeafState::Online => "ONLINE",
            LeafState::Degraded => "DEGRADED",
            LeafState::Faulted => "FAULTED",
            LeafState::Offline => "OFFLINE",
            LeafState::Removed => "REMOVED",
        }
    }

    fn from_u8(v: u8) -> LeafState {
        match v {
            1 => LeafState::Degraded,
            2 => LeafState::Faulted,
            3 => LeafState::Offline,
            4 => LeafState::Removed,
            _ => LeafState::Online,
        }
    }
}

/// Which counter an error goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A read failed.
    Read,
    /// A write or a flush failed.
    Write,
    /// A read returned bytes that do not match their checksum.
    Checksum,
}

/// Default `fault_errors`: errors within the window that fault (or degrade) a leaf.
pub const FAULT_ERRORS_DEFAULT: u32 = 10;
/// Default `fault_window`, seconds.
pub const FAULT_WINDOW_S_DEFAULT: u64 = 600;
/// Largest `fault_errors` (the errors a leaf remembers are bounded by it).
pub const FAULT_ERRORS_MAX: u32 = 1000;

/// The fault rule in force (the pool's `fault_errors` and `fault_window`), read on error
/// paths only.
#[derive(Debug)]
pub struct FaultPolicy {
    errors: AtomicU32,
    window_s: AtomicU64,
}

impl Default for FaultPolicy {
    fn default() -> Self {
        FaultPolicy {
            errors: AtomicU32::new(FAULT_ERRORS_DEFAULT),
            window_s: AtomicU64::new(FAULT_WINDOW_S_DEFAULT),
        }
    }
}

impl FaultPolicy {
    /// Sets the rule: `errors` within `window_s` seconds (0 errors: never).
    pub fn set(&self, errors: u32, window_s: u64) {
        self.errors
            .store(errors.min(FAULT_ERRORS_MAX), Ordering::Relaxed);
        self.window_s.store(window_s, Ordering::Relaxed);
    }

    /// Errors within the window that trip the rule (0: off).
    pub fn errors(&self) -> u32 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.window_s.load(Ordering::Relaxed))
    }
}

/// A leaf's state, the txgs it lacks, and its recent errors.
#[derive(Debug, Default)]
pub struct LeafHealth {
    /// A [`LeafState`]; read (relaxed) by the planners for every I/O.
    state: AtomicU8,
    /// First txg of the range the leaf lacks (0: none). With `missed_to`, a copy of
    /// `Detail::missed` that reads can check without the lock.
    missed_from: AtomicU64,
    /// Last txg of that range.
    missed_to: AtomicU64,
    /// A write was planned without this leaf since it went out of service.
    skipped: AtomicBool,
    /// Times it went out of service: a scrub repairs what a leaf lacks only if the leaf was
    /// in service all along (it compares this before and after).
    outages: AtomicU64,
    detail: Mutex<Detail>,
}

#[derive(Debug, Default)]
struct Detail {
    /// Why the leaf is in its state (shown by `oxpool status`).
    reason: Option<String>,
    /// Out of service since this txg (the first one not durable when it went out).
    out_since: Option<Txg>,
    /// Offline until the pool is exported (`offline -t`): not persisted.
    temporary: bool,
    /// The txgs it lacks while in service.
    missed: Option<(Txg, Txg)>,
    /// When its recent I/O errors happened (at most `fault_errors` kept).
    io_errors: VecDeque<Instant>,
    /// When its recent checksum errors happened.
    checksum_errors: VecDeque<Instant>,
    /// DEGRADED by the fault rule (its errors), not by the import (a device FAULTED at export
    /// that its vdev cannot do without, which each import decides again).
    degraded_by_rule: bool,
}

/// What a leaf's state record (persisted in the pool's metadata) says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRecord {
    /// The state to import the leaf in: ONLINE, OFFLINE or FAULTED.
    pub state: LeafState,
    /// The first txg the leaf lacks, if any.
    pub missed_from: Option<Txg>,
    /// The last one; None while it is out (the range ends where the pool is imported).
    pub missed_to: Option<Txg>,
}

impl StateRecord {
    /// `online|offline|faulted[ FROM-[TO]]`.
    pub fn encode(&self) -> String {
        let state = match self.state {
            LeafState::Offline => "offline",
            LeafState::Faulted => "faulted",
            _ => "online",
        };
        match (self.missed_from, self.missed_to) {
            (None, _) => state.to_string(),
            (Some(f), None) => format!("{state} {}-", f.0),
            (Some(f), Some(t)) => format!("{state} {}-{}", f.0, t.0),
        }
    }

    /// Parses [`StateRecord::encode`]'s form.
    pub fn parse(value: &str) -> Result<StateRecord> {
        let bad = || EngineError::invalid(format!("bad device state record '{value}'"));
        let mut words = value.split(' ');
        let state = match words.next() {
            Some("online") => LeafState::Online,
            Some("offline") => LeafState::Offline,
            Some("faulted") => LeafState::Faulted,
            _ => return Err(bad()),
        };
        let (missed_from, missed_to) = match words.next() {
            None => (None, None),
            Some(range) => {
                let (f, t) = range.split_once('-').ok_or_else(bad)?;
                let f: u64 = f.parse().map_err(|_| bad())?;
                let t = if t.is_empty() {
                    None
                } else {
                    Some(Txg(t.parse().map_err(|_| bad())?))
                };
                if f == 0 || t.is_some_and(|t| t.0 < f) {
                    return Err(bad());
                }
                (Some(Txg(f)), t)
            }
        };
        if words.next().is_some() {
            return Err(bad());
        }
        Ok(StateRecord {
            state,
            missed_from,
            missed_to,
        })
    }
}

impl LeafHealth {
    /// The leaf's state.
    pub fn state(&self) -> LeafState {
        LeafState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Whether the leaf gets reads and writes (one load: the planners ask for every I/O).
    /// Acquire: who sees a leaf out of service sees the tree's count of service changes
    /// raised before it went (`VdevTree::service_change`); a plain load on x86.
    #[inline]
    pub fn in_service(&self) -> bool {
        self.state.load(Ordering::Acquire) <= LeafState::Degraded as u8
    }

    /// Why the leaf is in its state.
    pub fn reason(&self) -> Option<String> {
        self.detail.lock().unwrap().reason.clone()
    }

    /// The txgs the leaf lacks while in service.
    pub fn missed(&self) -> Option<(Txg, Txg)> {
        self.detail.lock().unwrap().missed
    }

    /// Whether the leaf may lack a block born in `birth` (one relaxed load when it lacks
    /// nothing).
    #[inline]
    pub fn missed_covers(&self, birth: Txg) -> bool {
        let from = self.missed_from.load(Ordering::Relaxed);
        from != 0 && from <= birth.0 && birth.0 <= self.missed_to.load(Ordering::Relaxed)
    }

    /// A write was planned without this out-of-service leaf.
    #[inline]
    pub fn note_skipped(&self) {
        if !self.skipped.load(Ordering::Relaxed) {
            self.skipped.store(true, Ordering::Relaxed);
        }
    }

    /// The leaf lacks the blocks of txgs `from..=to` (a write failed).
    pub(crate) fn note_missed(&self, from: Txg, to: Txg) {
        let mut d = self.detail.lock().unwrap();
        let range = match d.missed {
            None => (from, to),
            Some((f, t)) => (f.min(from), t.max(to)),
        };
        self.set_missed(&mut d, Some(range));
    }

    fn set_missed(&self, d: &mut Detail, range: Option<(Txg, Txg)>) {
        d.missed = range;
        match range {
            None => {
                self.missed_from.store(0, Ordering::Relaxed);
                self.missed_to.store(0, Ordering::Relaxed);
            }
            Some((f, t)) => {
                // `to` first: a reader that sees the new `from` sees a range at least this
                // wide (it only grows while set).
                self.missed_to.store(t.0, Ordering::Relaxed);
                self.missed_from.store(f.0.max(1), Ordering::Relaxed);
            }
        }
    }

    /// How many times the leaf went out of service.
    pub(crate) fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Forgets the missed range if it ends at or before `txg` and the leaf has been in
    /// service since it went out `outages` times (a scrub that started after `txg` was
    /// durable, with the leaf in service throughout, repaired it).
    pub(crate) fn forget_missed_through(&self, txg: Txg, outages: u64) -> bool {
        let mut d = self.detail.lock().unwrap();
        match d.missed {
            Some((_, to)) if to <= txg && self.in_service() && self.outages() == outages => {
                self.set_missed(&mut d, None);
                true
            }
            _ => false,
        }
    }

    /// Takes the leaf out of service in `state` (FAULTED, OFFLINE, REMOVED) from txg
    /// `since` (the first txg not yet durable). `temporary`: offline until export.
    pub(crate) fn take_out(&self, state: LeafState, reason: String, since: Txg, temporary: bool) {
        debug_assert!(!state.in_service());
        let mut d = self.detail.lock().unwrap();
        if self.in_service() {
            d.out_since = Some(since);
            self.skipped.store(false, Ordering::Relaxed);
            self.outages.fetch_add(1, Ordering::Relaxed);
        }
        d.reason = Some(reason);
        d.temporary = temporary;
        self.state.store(state as u8, Ordering::Release);
    }

    /// Returns the leaf to service; what writes skipped it since it went out joins its missed
    /// range, ending at `until` (the last txg that may have been written without it).
    pub(crate) fn bring_back(&self, until: Txg) {
        let mut d = self.detail.lock().unwrap();
        if !self.in_service() {
            if let (Some(since), true) = (d.out_since, self.skipped.load(Ordering::Relaxed)) {
                let range = match d.missed {
                    None => (since, until.max(since)),
                    Some((f, t)) => (f.min(since), t.max(until)),
                };
                self.set_missed(&mut d, Some(range));
            }
        }
        d.out_since = None;
        d.temporary = false;
        d.reason = None;
        d.io_errors.clear();
        d.checksum_errors.clear();
        self.skipped.store(false, Ordering::Relaxed);
        self.state.store(LeafState::Online as u8, Ordering::Relaxed);
    }

    /// Marks the in-service leaf DEGRADED (still used) for `reason`, found at import.
    pub(crate) fn degrade(&self, reason: String) {
        self.degrade_as(reason, false);
    }

    /// Marks the in-service leaf DEGRADED (still used) for `reason`, by the fault rule (its
    /// errors): a state the host keeps with its counts until `clear`
    /// ([`LeafHealth::degraded_by_rule`]).
    pub(crate) fn degrade_by_rule(&self, reason: String) {
        self.degrade_as(reason, true);
    }

    fn degrade_as(&self, reason: String, by_rule: bool) {
        let mut d = self.detail.lock().unwrap();
        if self.in_service() {
            d.reason = Some(reason);
            d.degraded_by_rule = by_rule;
            self.state
                .store(LeafState::Degraded as u8, Ordering::Relaxed);
        }
    }

    /// Why the fault rule made the leaf DEGRADED, if it did and the leaf still is.
    pub(crate) fn degraded_by_rule(&self) -> Option<String> {
        let d = self.detail.lock().unwrap();
        (self.state() == LeafState::Degraded && d.degraded_by_rule)
            .then(|| d.reason.clone().unwrap_or_else(|| "degraded".to_string()))
    }

    /// Forgets the recent errors (`oxpool clear`) and a DEGRADED state.
    pub(crate) fn clear_errors(&self) {
        let mut d = self.detail.lock().unwrap();
        d.io_errors.clear();
        d.checksum_errors.clear();
        if self.state() == LeafState::Degraded {
            d.reason = None;
            self.state.store(LeafState::Online as u8, Ordering::Relaxed);
        }
    }

    /// Notes an error at `now`; returns how many of its kind (I/O or checksum) happened
    /// within the policy's window if that reaches the policy's count (the rule trips).
    pub(crate) fn count_error(
        &self,
        kind: ErrorKind,
        policy: &FaultPolicy,
        now: Instant,
    ) -> Option<usize> {
        let n = policy.errors() as usize;
        if n == 0 {
            return None;
        }
        let window = policy.window();
        let mut d = self.detail.lock().unwrap();
        let q = match kind {
            ErrorKind::Checksum => &mut d.checksum_errors,
            _ => &mut d.io_errors,
        };
        q.push_back(now);
        while q.len() > n {
            q.pop_front();
        }
        while q
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > window)
        {
            q.pop_front();
        }
        (q.len() >= n).then_some(q.len())
    }

    /// What the pool's metadata records of this leaf; None when there is nothing to say
    /// (in service and lacking nothing).
    pub(crate) fn record(&self) -> Option<StateRecord> {
        let d = self.detail.lock().unwrap();
        let state = self.state();
        let persisted = match state {
            LeafState::Offline if !d.temporary => LeafState::Offline,
            LeafState::Faulted => LeafState::Faulted,
            _ => LeafState::Online,
        };
        // Out of service: assume writes skipped it (they will, unless it comes back first),
        // so that an import that finds it present knows what it may lack.
        let (from, to) = if state.in_service() {
            (d.missed.map(|m| m.0), d.missed.map(|m| m.1))
        } else {
            let since = d.out_since;
            let from = match (d.missed, since) {
                (Some((f, _)), Some(s)) => Some(f.min(s)),
                (Some((f, _)), None) => Some(f),
                (None, s) => s,
            };
            (from, None)
        };
        if persisted == LeafState::Online && from.is_none() {
            return None;
        }
        Some(StateRecord {
            state: persisted,
            missed_from: from,
            missed_to: to,
        })
    }

    /// Sets the leaf up from its record at import; `imported` is the txg the pool was
    /// imported at (an open range ends there: nothing after it was written yet). A missed
    /// range already noted (from the leaf's uberblocks) is kept and widened.
    pub(crate) fn load_record(&self, record: &StateRecord, imported: Txg) {
        let mut d = self.detail.lock().unwrap();
        let range = record
            .missed_from
            .map(|f| (f, record.missed_to.unwrap_or(imported).max(f)));
        match record.state {
            LeafState::Offline | LeafState::Faulted => {
                let why = if record.state == LeafState::Offline {
                    "taken offline by the administrator"
                } else {
                    "faulted before the pool was exported (too many I/O errors)"
                };
                d.reason = Some(why.to_string());
                d.out_since = Some(range.map_or(Txg(imported.0 + 1), |r| r.0));
                d.temporary = false;
                self.skipped.store(range.is_some(), Ordering::Relaxed);
                self.state.store(record.state as u8, Ordering::Relaxed);
                // The range it lacks is its out-of-service time: it joins `missed` when the
                // leaf comes back.
            }
            _ => {
                // An open range whose start is after the import's txg lacks nothing: no txg
                // was committed without the leaf.
                let range = range.filter(|r| record.missed_to.is_some() || r.0 <= imported);
                let merged = match (d.missed, range) {
                    (Some((f, t)), Some((rf, rt))) => Some((f.min(rf), t.max(rt))),
                    (a, b) => a.or(b),
                };
                self.set_missed(&mut d, merged);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_garbage() {
        for r in [
            StateRecord {
                state: LeafState::Offline,
                missed_from: None,
                missed_to: None,
            },
            StateRecord {
                state: LeafState::Faulted,
                missed_from: Some(Txg(7)),
                missed_to: None,
            },
            StateRecord {
                state: LeafState::Online,
                missed_from: Some(Txg(7)),
                missed_to: Some(Txg(9)),
            },
        ] {
            assert_eq!(StateRecord::parse(&r.encode()).unwrap(), r);
        }
        for bad in [
            "",
            "on",
            "online 5",
            "online 0-",
            "online 9-7",
            "online 1-2 x",
            "offline -3",
        ] {
            assert!(StateRecord::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_rule_counts_within_the_window_only() {
        let p = FaultPolicy::default();
        p.set(3, 10);
        let h = LeafHealth::default();
        let t0 = Instant::now();
        assert_eq!(h.count_error(ErrorKind::Read, &p, t0), None);
        assert_eq!(h.count_error(ErrorKind::Write, &p, t0), None);
        // Checksum errors are counted apart.
        assert_eq!(h.count_error(ErrorKind::Checksum, &p, t0), None);
        // The first two are older than the window by now.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(h.count_error(ErrorKind::Read, &p, later), None);
        assert_eq!(h.count_error(ErrorKind::Read, &p, later), None);
        assert_eq!(h.count_error(ErrorKind::Read, &p, later), Some(3));
        p.set(0, 10);
        assert_eq!(h.count_error(ErrorKind::Read, &p, later), None, "rule off");
    }

    #[test]
    fn out_of_service_time_becomes_a_missed_range_only_if_writes_skipped_it() {
        let h = LeafHealth::default();
        h.take_out(LeafState::Offline, "x".into(), Txg(5), true);
        assert!(!h.in_service());
        h.bring_back(Txg(9));
        assert_eq!(h.missed(), None, "no write skipped it");
        h.take_out(LeafState::Faulted, "x".into(), Txg(10), false);
        h.note_skipped();
        assert_eq!(
            h.record().unwrap(),
            StateRecord {
                state: LeafState::Faulted,
                missed_from: Some(Txg(10)),
                missed_to: None
            }
        );
        h.bring_back(Txg(12));
        assert_eq!(h.missed(), Some((Txg(10), Txg(12))));
        assert!(h.missed_covers(Txg(11)) && !h.missed_covers(Txg(13)));
        assert!(!h.forget_missed_through(Txg(11), 2));
        assert!(
            !h.forget_missed_through(Txg(12), 1),
            "out since the scrub began"
        );
        assert!(h.forget_missed_through(Txg(12), 2));
        assert!(!h.missed_covers(Txg(11)));
        assert_eq!(h.record(), None);
    }
}
