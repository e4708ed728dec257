//! The device states of the vdev tree (`health.rs` has one leaf's): errors and the fault
//! rule, `offline`, `online` and `clear`, what a top-level vdev can lose, and the state
//! records persisted in the pool's metadata.
//!
//! **Records.** A leaf that is not simply ONLINE and whole is recorded in the pool's
//! properties as `device_state@<guid in hex>` = `online|offline|faulted[ FROM-[TO]]`: the
//! state it imports in, and the txgs it lacks (an open range: it was out of service when the
//! txg was written). Only such leaves are recorded, so a pool whose devices are all well
//! stays readable by a build that knows nothing of states; a build that does not know them
//! refuses a pool with one (an unknown property), rather than use a device it should not.

use crate::vdev::health::{ErrorKind, LeafState, StateRecord};
use crate::vdev::{Leaf, TopVdev, VdevTree};
use crate::{EngineError, Result};
use oxpool_format::{Guid, Txg, VdevId};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Each leaf's count of outages when a scrub started, by guid.
pub type OutageMarks = std::collections::BTreeMap<Guid, u64>;

/// Prefix of a leaf's state record among the pool's persisted properties.
pub const STATE_RECORD_PREFIX: &str = "device_state@";

/// Whether `e` says the device is gone (unplugged, deleted block device).
fn device_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ENODEV))
}

impl VdevTree {
    /// The pool committed `txg` (the leaves' missed ranges are measured from it).
    pub fn note_synced(&self, txg: Txg) {
        self.synced.fetch_max(txg.0, Ordering::Relaxed);
        self.sync_started.fetch_max(txg.0, Ordering::Relaxed);
    }

    /// The pool began writing `txg`: the next one is open from now on. The fence orders this
    /// before the sync's reading of the vdev shapes, against a shape swapped in and then
    /// this figure read ([`VdevTree::swap_shape_adding`]): one of the two sees the other.
    pub fn note_sync_started(&self, txg: Txg) {
        self.sync_started.fetch_max(txg.0, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// The first txg not yet durable: the first a leaf going out now may lack.
    pub(crate) fn first_not_durable(&self) -> Txg {
        Txg(self.synced.load(Ordering::Relaxed) + 1)
    }

    /// The last txg whose blocks may be being written now: the open one (the intent log
    /// writes blocks of it in place; the syncing one is older). Once it is durable, every
    /// block written now is. The txg engine raises the figure as it closes a txg, before
    /// that txg's sync begins: else, in between, a block born in the open txg would be one
    /// past a missed range ending here, and a resilver would skip it (session 25's reviewer).
    pub(crate) fn last_written(&self) -> Txg {
        Txg(self.sync_started.load(Ordering::SeqCst) + 1)
    }

    /// The top-level vdev and child index of `leaf`.
    pub fn position(&self, leaf: &Leaf) -> Option<(&TopVdev, usize)> {
        self.tops()
            .find_map(|t| t.shape().child_of(leaf).map(|i| (t, i)))
    }

    /// Counts an error of `leaf` (`e`: the device's error, if it gave one) and applies the
    /// fault rule (module `health`). A failed write also means the leaf lacks the block.
    pub fn note_error(&self, leaf: &Leaf, kind: ErrorKind, e: Option<&std::io::Error>) {
        let c = &leaf.counters;
        match kind {
            ErrorKind::Read => c.read_errors.fetch_add(1, Ordering::Relaxed),
            ErrorKind::Write => c.write_errors.fetch_add(1, Ordering::Relaxed),
            ErrorKind::Checksum => c.checksum_errors.fetch_add(1, Ordering::Relaxed),
        };
        if kind == ErrorKind::Write {
            leaf.health
                .note_missed(self.first_not_durable(), self.last_written());
            self.on_record_change.notify();
        }
        if let Some(e) = e.filter(|e| device_gone(e)) {
            let _one = self.state_change.lock().unwrap();
            if leaf.health.in_service() {
                tracing::warn!(device = leaf.name(), "device gone: {e}");
                self.take_out(
                    leaf,
                    LeafState::Removed,
                    format!("the device is gone ({e})"),
                    false,
                );
                self.on_record_change.notify();
                self.on_spare_in.notify();
            }
            return;
        }
        let Some(n) = leaf
            .health
            .count_error(kind, &self.fault_policy, Instant::now())
        else {
            return;
        };
        let window_s = self.fault_policy.window().as_secs();
        if kind == ErrorKind::Checksum {
            if leaf.health.state() == LeafState::Online {
                tracing::warn!(device = leaf.name(), "degraded: {n} checksum errors");
            }
            leaf.health.degrade_by_rule(format!(
                "too many checksum errors ({n} within {window_s} s)"
            ));
            return;
        }
        let _one = self.state_change.lock().unwrap();
        if !leaf.health.in_service() {
            return;
        }
        let Some((top, _)) = self.position(leaf) else {
            return;
        };
        let why = format!("too many I/O errors ({n} within {window_s} s)");
        match self.check_can_lose(top, leaf) {
            Ok(()) => {
                tracing::warn!(device = leaf.name(), "faulted: {why}");
                self.take_out(leaf, LeafState::Faulted, why, false);
                self.on_record_change.notify();
                self.on_spare_in.notify();
            }
            Err(no) => {
                if leaf.health.state() == LeafState::Online {
                    tracing::warn!(device = leaf.name(), "{why}; not faulted: {no}");
                }
                leaf.health
                    .degrade_by_rule(format!("{why}; not faulted: {no}"));
            }
        }
    }

    /// Ok if `top` still gives back every block without `leaf` (one of its members); else
    /// why not. A member that lacks txgs does not count as a copy; the other member of a
    /// pair that lacks nothing does.
    pub fn check_can_lose(&self, top: &TopVdev, leaf: &Leaf) -> std::result::Result<(), String> {
        let shape = top.shape();
        let Some(index) = shape.child_of(leaf) else {
            return Ok(());
        };
        if shape.children[index].whole_without(leaf) {
            return Ok(());
        }
        let others: Vec<usize> = (0..shape.children.len())
            .filter(|&c| c != index && !shape.children[c].whole())
            .collect();
        if others.len() < shape.redundancy() {
            return Ok(());
        }
        let name = |c: usize| match shape.children[c]
            .for_read(None)
            .or(shape.children[c].old.leaf.as_ref())
        {
            None => format!("{} UNAVAIL", shape.children[c].old.config.path),
            Some(l) => match (l.health.state(), l.health.missed()) {
                (s, Some((f, t))) if s.in_service() => {
                    format!("{} lacks txgs {}-{}", l.name(), f.0, t.0)
                }
                (s, _) => format!("{} {}", l.name(), s.as_str()),
            },
        };
        Err(match top.group_name() {
            None => "its vdev is a single device: nothing else holds its blocks".to_string(),
            Some(group) if others.is_empty() => {
                format!("{group} has no redundancy to lose it")
            }
            Some(group) => format!(
                "{group} can lose {} of its devices and already runs without {}",
                shape.redundancy(),
                others
                    .iter()
                    .map(|&c| name(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// Takes `leaf` offline (`oxpool offline`; `temporary`: until the pool is exported, not
    /// recorded). Refused, with the reason, if its vdev could not give back every block
    /// without it.
    pub fn offline(&self, leaf: &Leaf, temporary: bool) -> Result<()> {
        let _one = self.state_change.lock().unwrap();
        if leaf.health.in_service() {
            let (top, _) = self.position(leaf).ok_or_else(|| {
                EngineError::NotFound(format!("device '{}' in the vdev tree", leaf.name()))
            })?;
            self.check_can_lose(top, leaf).map_err(|why| {
                EngineError::invalid(format!("cannot take {} offline: {why}", leaf.name()))
            })?;
        }
        self.take_out(
            leaf,
            LeafState::Offline,
            offline_reason(temporary),
            temporary,
        );
        Ok(())
    }

    /// Takes `leaf`, the last device in service of a log vdev that holds no block any more
    /// (`Spa::offline_log` emptied it), offline: without [`VdevTree::offline`]'s check,
    /// since nothing needs it.
    pub(crate) fn offline_emptied_log(&self, leaf: &Leaf, temporary: bool) {
        let _one = self.state_change.lock().unwrap();
        debug_assert!(self.position(leaf).is_some_and(|(top, _)| top.log));
        self.take_out(
            leaf,
            LeafState::Offline,
            offline_reason(temporary),
            temporary,
        );
    }

    /// Returns `leaf` to service (`oxpool online`): from OFFLINE, FAULTED or REMOVED. The
    /// txgs written without it become its missed range.
    pub fn online(&self, leaf: &Leaf) {
        let _one = self.state_change.lock().unwrap();
        if !leaf.health.in_service() {
            leaf.health.bring_back(self.last_written());
        }
    }

    /// Forgets `leaf`'s errors (`oxpool clear`): zero counters, no DEGRADED, and a FAULTED
    /// or REMOVED leaf back in service. An OFFLINE one stays offline.
    pub fn clear(&self, leaf: &Leaf) {
        let _one = self.state_change.lock().unwrap();
        leaf.counters.zero();
        leaf.health.clear_errors();
        if matches!(leaf.health.state(), LeafState::Faulted | LeafState::Removed) {
            leaf.health.bring_back(self.last_written());
        }
    }

    /// Each present leaf's count of outages, by guid: taken when a scrub starts, for
    /// [`VdevTree::scrub_repaired_through`].
    pub fn outage_marks(&self) -> OutageMarks {
        self.leaves()
            .map(|l| (l.guid, l.health.outages()))
            .collect()
    }

    /// A scrub that started after `txg` was durable (when the leaves' outages were `marks`)
    /// finished and repaired everything: every leaf in service all along forgets a missed
    /// range that ends at or before `txg`. Returns whether any did.
    pub fn scrub_repaired_through(&self, txg: Txg, marks: &OutageMarks) -> bool {
        let mut any = false;
        // By guid: leaves come and go (attach, detach); one attached after the scrub began
        // has no mark and keeps its range.
        for leaf in self.leaves() {
            let Some(&mark) = marks.get(&leaf.guid) else {
                continue;
            };
            if leaf.health.forget_missed_through(txg, mark) {
                tracing::info!(device = leaf.name(), "scrub repaired what it lacked");
                any = true;
            }
        }
        any
    }

    /// The state records to persist (see the module documentation).
    pub fn state_records(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for top in self.tops() {
            let shape = top.shape();
            for m in shape.children.iter().flat_map(|c| c.members()) {
                let (child, cfg) = (&m.leaf, &m.config);
                let record = match child {
                    Some(leaf) => leaf.health.record(),
                    None => self.absent.lock().unwrap().get(&cfg.guid).copied(),
                };
                if let Some(r) = record {
                    out.push((format!("{STATE_RECORD_PREFIX}{:x}", cfg.guid.0), r.encode()));
                }
            }
        }
        out
    }

    /// Sets the leaves up from their records at import (the pool was committed at
    /// `imported`). A child absent now is recorded as lacking every txg from the next one.
    /// `emptied`: log vdevs recorded emptied (`Spa::offline_log`), whose offline devices
    /// stay offline.
    pub fn load_state_records(
        &self,
        records: &[(String, String)],
        imported: Txg,
        emptied: &[VdevId],
    ) -> Result<()> {
        let mut by_guid = std::collections::BTreeMap::new();
        for (name, value) in records {
            let hex = name.strip_prefix(STATE_RECORD_PREFIX).unwrap_or(name);
            let guid = u64::from_str_radix(hex, 16)
                .map_err(|_| EngineError::invalid(format!("bad device state record '{name}'")))?;
            by_guid.insert(Guid(guid), StateRecord::parse(value)?);
        }
        self.note_synced(imported);
        let mut absent = self.absent.lock().unwrap();
        absent.clear();
        for top in self.tops() {
            let shape = top.shape();
            for m in shape.children.iter().flat_map(|c| c.members()) {
                let (child, cfg) = (&m.leaf, &m.config);
                let record = by_guid.get(&cfg.guid);
                match child {
                    Some(leaf) => {
                        if let Some(r) = record {
                            leaf.health.load_record(r, imported);
                        }
                    }
                    None => {
                        let mut r = record.copied().unwrap_or(StateRecord {
                            state: LeafState::Online,
                            missed_from: None,
                            missed_to: None,
                        });
                        // Absent: it lacks what is written from now on, and what it lacked.
                        r.missed_from = Some(r.missed_from.unwrap_or(Txg(imported.0 + 1)));
                        r.missed_to = None;
                        absent.insert(cfg.guid, r);
                    }
                }
            }
            // A vdev that would lack more children than its redundancy takes back its
            // faulted, then its offline ones: blocks read from them are checked like any,
            // and a vdev that cannot give back its blocks is worse than one that uses a
            // doubtful device. Not the offline devices of a log vdev recorded emptied: the
            // last of them went offline only once no block was left on it.
            let wanted_states: &[LeafState] = if emptied.contains(&top.id) {
                &[LeafState::Faulted]
            } else {
                &[LeafState::Faulted, LeafState::Offline]
            };
            for &wanted in wanted_states {
                for (i, child) in shape.children.iter().enumerate() {
                    let out = (0..shape.children.len())
                        .filter(|&c| shape.child_in_service(c).is_none())
                        .count();
                    if out <= shape.redundancy() {
                        break;
                    }
                    if shape.child_in_service(i).is_some() {
                        continue;
                    }
                    let Some(leaf) = child.leaves().find(|l| l.health.state() == wanted) else {
                        continue;
                    };
                    tracing::warn!(
                        device = leaf.name(),
                        "{} at export, in service: its vdev cannot do without it",
                        wanted.as_str()
                    );
                    leaf.health.bring_back(imported);
                    leaf.health.degrade(format!(
                        "{} when the pool was exported; in service because {} cannot do \
                         without it",
                        wanted.as_str(),
                        top.group_name()
                            .unwrap_or_else(|| child.old.config.path.clone())
                    ));
                }
            }
            // What a single log device missed while out of service (offline -t until an
            // export, failed writes) is nothing a resilver could give it: log blocks are in
            // no block tree, and no other child holds them.
            if top.log && shape.children.len() == 1 {
                for leaf in top.leaves_in_service() {
                    leaf.health
                        .forget_missed_through(Txg(u64::MAX), leaf.health.outages());
                }
            }
        }
        Ok(())
    }
}

/// Why a device `oxpool offline` took out is out of service.
fn offline_reason(temporary: bool) -> String {
    if temporary {
        "taken offline by the administrator until the pool is exported".to_string()
    } else {
        "taken offline by the administrator".to_string()
    }
}
