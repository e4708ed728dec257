//! `written@SNAP`: the bytes a dataset (a volume, or a snapshot) references that an earlier
//! snapshot `SNAP` of its line does not, as ZFS has it. Computed from the space figures and
//! the deadlists' bucket totals, without reading a block.
//!
//! # Why the figures give it exactly
//!
//! A dataset's **line** is the sequence of trees it descends from, oldest first: the snapshots
//! of its origin's volume up to the origin (and on through that volume's own origin), then
//! its own snapshots, then the dataset itself. Call them `g_0 .. g_m` (`g_m` is the dataset
//! asked about: the head, or one of its snapshots) and let `O = g_k`, `k < m`, be `SNAP`.
//!
//! 1. Copy-on-write never puts an old block into a tree: a block born in txg `b` entered the
//!    line's trees in `b`, and once a tree of the line drops it no later one has it again.
//!    So a block of `g_m` born at or before `O.txg` was in the tree at the end of `O.txg`:
//!    `O` references it. Hence `written@O = bytes of g_m's blocks born after O.txg`. (This
//!    is what the audit recomputes from its walk of each tree.)
//! 2. `referenced(g_m) = written@O + bytes of g_m born at or before O.txg`, and the blocks of
//!    `g_m` born at or before `O.txg` are `O`'s blocks minus those the line dropped after
//!    `O`: `referenced(O) - dropped`.
//! 3. Each block of `O` that `g_m` lacks was dropped exactly once, by the first generation
//!    `g_j` (`k < j <= m`) without it, and so is an entry of `g_j`'s deadlist (what the
//!    generation before it referenced and it does not). Conversely an entry of `g_j`'s
//!    deadlist born at or before `O.txg` is a block of `g_{j-1}` born at or before `O.txg`:
//!    by 1., a block of `O`. The deadlists' buckets split exactly at every snapshot txg of
//!    the chain (`dsl/deadlist.rs`), so `dropped = sum over k < j <= m of g_j's deadlist
//!    bytes born in (0, O.txg]`: bucket totals only.
//!
//! So `written@O = referenced(g_m) - referenced(O) + sum_{k<j<=m} dead_j(<= O.txg)`. This
//! is ZFS's formula too (`dsl_dataset_space_written`); the deadlists keyed by snapshot txg
//! make each term a sum of bucket totals. Figures are those of the last synced txg.

use crate::dsl::dataset::Dataset;
use crate::dsl::snapshot::Snapshot;
use crate::dsl::Datasets;
use oxpool_format::{Guid, Txg, VolumeId};
use std::sync::atomic::Ordering;

/// One generation of a line: a snapshot, or the head.
#[derive(Clone, Debug)]
pub(crate) struct Generation {
    /// `volume@snapshot`, or `volume` for the head (names inside the pool), for messages.
    pub name: String,
    /// What it is whatever its name: its volume's id and the snapshot's guid (None for the
    /// head). A rename between two reads of a line changes names, never this.
    pub key: (VolumeId, Option<Guid>),
    /// The snapshot's txg (the head: after every txg).
    pub txg: Txg,
    /// Bytes its tree references (every copy, indirect blocks included).
    pub referenced_bytes: u64,
    /// Its deadlist's buckets, (key, bytes), by key: what the generation before it
    /// references and it does not.
    dead: Vec<(Txg, u64)>,
}

impl Generation {
    /// Bytes of its deadlist born at or before `t` (a snapshot txg of the line).
    fn dead_born_upto(&self, t: Txg) -> u64 {
        self.dead
            .iter()
            .take_while(|(key, _)| *key <= t)
            .map(|(_, bytes)| bytes)
            .sum()
    }
}

fn buckets(d: &crate::dsl::deadlist::Deadlist) -> Vec<(Txg, u64)> {
    d.buckets().map(|(k, b)| (*k, b.bytes)).collect()
}

/// The line of `ds`, oldest first, ending with its head (see the module docs). The head's
/// figures are those of the last sync.
pub(crate) fn line(dsl: &Datasets, ds: &Dataset) -> Vec<Generation> {
    // Built newest first, reversed at the end. Each dataset's part is read under its own
    // lock, one lock at a time.
    let mut out = Vec::new();
    let mut origin = {
        let l = ds.lineage.lock().unwrap();
        out.push(Generation {
            name: ds.name(),
            key: (ds.id, None),
            txg: Txg(u64::MAX),
            referenced_bytes: ds.data().used_bytes.load(Ordering::Relaxed),
            dead: buckets(&l.deadlist),
        });
        push_snapshots(ds, l.snapshots(), &mut out);
        l.origin.clone()
    };
    let all = dsl.all();
    // Bounded: each step goes to an older dataset of the line, at most once per dataset.
    for _ in 0..all.len() {
        let Some(o) = origin.take() else { break };
        let Some(src) = all.iter().find(|d| d.id == o.volume) else {
            break;
        };
        let l = src.lineage.lock().unwrap();
        // An origin snapshot is never destroyed while it has clones.
        let Some(i) = l.snapshots().iter().position(|s| s.guid == o.snapshot_guid) else {
            break;
        };
        push_snapshots(src, &l.snapshots()[..=i], &mut out);
        origin = l.origin.clone();
    }
    out.reverse();
    out
}

/// Pushes the generations of `snapshots` of `ds`, newest first.
fn push_snapshots(ds: &Dataset, snapshots: &[Snapshot], out: &mut Vec<Generation>) {
    for s in snapshots.iter().rev() {
        out.push(Generation {
            name: format!("{}@{}", ds.name(), s.name),
            key: (ds.id, Some(s.guid)),
            txg: s.txg,
            referenced_bytes: s.referenced_bytes,
            dead: buckets(&s.deadlist),
        });
    }
}

/// `written@line[k]` of every later generation `line[k+1..]`, in order (one pass: each
/// deadlist is summed once).
pub(crate) fn written_since_each(line: &[Generation], k: usize) -> Vec<u64> {
    let o = &line[k];
    let mut dropped_bytes = 0u64;
    line[k + 1..]
        .iter()
        .map(|g| {
            dropped_bytes += g.dead_born_upto(o.txg);
            // Not negative when the figures are right (module docs); the audit checks them.
            (g.referenced_bytes + dropped_bytes).saturating_sub(o.referenced_bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(txg: u64, referenced_bytes: u64, dead: &[(u64, u64)]) -> Generation {
        Generation {
            name: format!("v@{txg}"),
            key: (VolumeId(1), Some(Guid(txg))),
            txg: Txg(txg),
            referenced_bytes,
            dead: dead.iter().map(|(k, b)| (Txg(*k), *b)).collect(),
        }
    }

    /// Blocks A (born 5), B (born 8) in s10; s20 overwrote A with C (born 15) and added D
    /// (born 18); the head overwrote B and C with E (born 25). Sizes 1, 2, 4, 8, 16.
    #[test]
    fn formula_matches_the_blocks() {
        let line = [
            g(10, 1 + 2, &[]),
            // s20 dropped A (born 5, bucket 10).
            g(20, 2 + 4 + 8, &[(10, 1)]),
            // The head dropped B (bucket 10) and C (born 15, bucket 20).
            Generation {
                name: "v".into(),
                key: (VolumeId(1), None),
                txg: Txg(u64::MAX),
                referenced_bytes: 8 + 16,
                dead: vec![(Txg(10), 2), (Txg(20), 4)],
            },
        ];
        // Since s10: s20 has C, D born after 10; the head has D, E.
        assert_eq!(written_since_each(&line, 0), vec![4 + 8, 8 + 16]);
        // Since s20: the head has E.
        assert_eq!(written_since_each(&line, 1), vec![16]);
    }
}
