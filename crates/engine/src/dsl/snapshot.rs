//! Snapshots of a dataset and its lineage: which snapshot came before the head, the head's
//! deadlist, the snapshots' trees and deadlists, and the changes (create, destroy, rollback)
//! that a txg sync applies to them.
//!
//! The birth-txg rule decides everything (DESIGN.md 5.2): a block born after the previous
//! snapshot's txg is the head's alone; one born at or before it is shared. So:
//! - **create** at the end of txg `T`: the snapshot takes the head's root and the head's
//!   deadlist whole; the head gets an empty one and `prev_snap_txg = T` (no block is read or
//!   written);
//! - **destroy** of `S` between `P` and `N` (a later snapshot or the head): the entries of
//!   `N`'s deadlist born after `P` were referenced by `S` alone and are freed (whole buckets,
//!   see [`super::deadlist`]); `S`'s own deadlist joins `N`'s;
//! - **rollback** to the latest snapshot `S`: the head's blocks born after `S` are freed (a
//!   walk that skips every subtree born at or before `S`), the head takes `S`'s root, and its
//!   deadlist empties (those blocks are the head's again).

use crate::dsl::deadlist::{bucket_key, Bucket, Deadlist};
use crate::dsl::resume::ResumeProgress;
use crate::dsl::table::{Table, TablePlan};
use oxpool_format::{BlockPtr, DatasetMeta, DeadBucketMeta, Guid, OriginMeta, SnapshotMeta, Txg};
use std::collections::BTreeSet;

/// A snapshot's state in memory.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub name: String,
    pub guid: Guid,
    pub txg: Txg,
    pub creation_s: u64,
    pub root: BlockPtr,
    pub levels: u8,
    pub volsize_bytes: u64,
    pub referenced_bytes: u64,
    pub written_bytes: u64,
    pub compressed_bytes: u64,
    pub deadlist: Deadlist,
    pub holds: BTreeSet<String>,
    /// `destroy -d` while held or cloned: destroyed when the last hold and clone go.
    pub defer_destroy: bool,
}

/// A dataset's lineage: its identity, origin, snapshots and the head's deadlist.
#[derive(Debug)]
pub(crate) struct Lineage {
    pub guid: Guid,
    pub createtxg: Txg,
    pub creation_s: u64,
    pub origin: Option<OriginMeta>,
    /// Snapshot txgs of the origin's chain (at or before the origin), oldest first: the keys
    /// for blocks the head kills that only the origin's snapshots reference.
    pub origin_chain: Vec<Txg>,
    pub prev_snap_txg: Txg,
    /// Bytes of the head's blocks born after `prev_snap_txg`, as of the last sync.
    pub written_bytes: u64,
    pub deadlist: Deadlist,
    /// Oldest first (txgs increasing). Private: every change goes through
    /// [`Lineage::snapshots_mut`], which marks the snapshot table for rewriting.
    snapshots: Vec<Snapshot>,
    /// Bookmarks, oldest first (by txg, then name).
    bookmarks: Vec<oxpool_format::BookmarkMeta>,
    /// The snapshot table's chunks as stored (see [`super::table`]).
    pub snapshot_table: Table,
    /// The bookmark table's chunks as stored.
    pub bookmark_table: Table,
    /// What changed in the snapshots since the table was last written.
    snapshot_dirt: Dirt,
    /// The bookmarks changed since their table was last written.
    bookmarks_dirty: bool,
    /// A snapshot's deadlist gained entries (a destroy merged one into it): the sync looks
    /// for pending entries in the snapshots' deadlists only then.
    snapshot_deadlists_grew: bool,
    /// On the hidden dataset of a resumable receive (`recv -s`): how far it has come.
    pub receive_resume: Option<ResumeProgress>,
}

/// What changed in a list of records since its table was written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Dirt {
    /// Nothing.
    #[default]
    Clean,
    /// These records (by guid) changed in place or were appended; no other moved.
    Records(BTreeSet<Guid>),
    /// Records were inserted, removed or reordered.
    Moved,
}

impl Dirt {
    fn record(&mut self, guid: Guid) {
        match self {
            Dirt::Clean => *self = Dirt::Records(BTreeSet::from([guid])),
            Dirt::Records(set) => {
                set.insert(guid);
            }
            Dirt::Moved => {}
        }
    }
}

impl Lineage {
    /// A new dataset's lineage (no snapshots), created in txg `createtxg`.
    pub(crate) fn new(guid: Guid, createtxg: Txg, creation_s: u64) -> Lineage {
        Lineage {
            guid,
            createtxg,
            creation_s,
            origin: None,
            origin_chain: Vec::new(),
            prev_snap_txg: Txg(0),
            written_bytes: 0,
            deadlist: Deadlist::new(),
            snapshots: Vec::new(),
            bookmarks: Vec::new(),
            snapshot_table: Table::default(),
            bookmark_table: Table::default(),
            snapshot_dirt: Dirt::Clean,
            bookmarks_dirty: false,
            snapshot_deadlists_grew: false,
            receive_resume: None,
        }
    }

    /// The snapshots, oldest first.
    pub(crate) fn snapshots(&self) -> &[Snapshot] {
        &self.snapshots
    }

    /// The snapshots, to change: the snapshot table is rewritten by the next sync.
    pub(crate) fn snapshots_mut(&mut self) -> &mut Vec<Snapshot> {
        self.snapshot_dirt = Dirt::Moved;
        self.snapshot_deadlists_grew = true;
        &mut self.snapshots
    }

    /// Snapshot `i`, to change in place: only its chunk of the table is rewritten.
    pub(crate) fn snapshot_mut(&mut self, i: usize) -> &mut Snapshot {
        self.snapshot_dirt.record(self.snapshots[i].guid);
        &mut self.snapshots[i]
    }

    /// Adds the newest snapshot: only the table's last chunk is rewritten.
    pub(crate) fn push_snapshot(&mut self, snap: Snapshot) {
        debug_assert!(self.snapshots.last().is_none_or(|l| l.txg < snap.txg));
        self.snapshot_dirt.record(snap.guid);
        // It takes the head's deadlist, whose entries of this txg are not written yet.
        self.snapshot_deadlists_grew |= snap.deadlist.has_pending();
        self.snapshots.push(snap);
    }

    /// The bookmarks, oldest first.
    pub(crate) fn bookmarks(&self) -> &[oxpool_format::BookmarkMeta] {
        &self.bookmarks
    }

    /// The bookmarks, to change (kept sorted by txg, then name, by the caller): the bookmark
    /// table is rewritten by the next sync.
    pub(crate) fn bookmarks_mut(&mut self) -> &mut Vec<oxpool_format::BookmarkMeta> {
        self.bookmarks_dirty = true;
        &mut self.bookmarks
    }

    /// Whether a snapshot's deadlist may have gained entries since the last call (clears the
    /// mark).
    pub(crate) fn take_snapshot_deadlists_grew(&mut self) -> bool {
        std::mem::take(&mut self.snapshot_deadlists_grew)
    }

    /// Whether the records changed since the tables were last written.
    pub(crate) fn tables_dirty(&self) -> bool {
        self.snapshot_dirt != Dirt::Clean || self.bookmarks_dirty
    }

    /// Marks the tables for rewriting whole (a write that failed).
    pub(crate) fn mark_tables_dirty(&mut self) {
        self.snapshot_dirt = Dirt::Moved;
        self.bookmarks_dirty = true;
    }

    /// If the records changed since the tables were written: the plans of the new tables
    /// (see [`Table::plan`]: only the chunks that changed are encoded). The marks are
    /// cleared; a change made while the plans are written sets them again.
    pub(crate) fn plan_dirty_tables(&mut self) -> Option<(TablePlan, TablePlan)> {
        if !self.tables_dirty() {
            return None;
        }
        let dirt = std::mem::take(&mut self.snapshot_dirt);
        let changed = |s: &Snapshot| match &dirt {
            Dirt::Records(set) => set.contains(&s.guid),
            Dirt::Clean | Dirt::Moved => false,
        };
        let snaps = self.snapshot_table.plan(
            &self.snapshots,
            |s| s.txg,
            changed,
            dirt == Dirt::Moved,
            |chunk| {
                let metas: Vec<SnapshotMeta> = chunk.iter().map(snapshot_meta).collect();
                oxpool_format::encode_snapshot_chunk(&metas)
            },
        );
        let moved = std::mem::take(&mut self.bookmarks_dirty);
        let marks = self.bookmark_table.plan(
            &self.bookmarks,
            |b| b.txg,
            |_| false,
            moved,
            oxpool_format::encode_bookmark_chunk,
        );
        Some((snaps, marks))
    }

    /// The snapshot txgs of the chain, oldest first: the origin's, then its own.
    pub(crate) fn chain(&self) -> Vec<Txg> {
        let mut chain = self.origin_chain.clone();
        chain.extend(self.snapshots.iter().map(|s| s.txg));
        chain
    }

    /// The txg a clone's blocks are measured from (0 for a dataset that is no clone).
    pub(crate) fn origin_txg(&self) -> Txg {
        self.origin.as_ref().map_or(Txg(0), |o| o.txg)
    }

    /// Files blocks the head killed while a snapshot still references them.
    pub(crate) fn add_dead(&mut self, dead: Vec<BlockPtr>) {
        if dead.is_empty() {
            return;
        }
        let chain = self.chain();
        for bp in dead {
            let key = bucket_key(&chain, bp.birth)
                .expect("a block killed into the deadlist is born at or before a snapshot");
            self.deadlist.insert(key, bp);
        }
    }

    /// The snapshot named `name`, and its index.
    pub(crate) fn find(&self, name: &str) -> Option<(usize, &Snapshot)> {
        self.snapshots
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == name)
    }

    /// The txg of the snapshot before snapshot `i` (the origin's for the first of a clone).
    pub(crate) fn prev_txg(&self, i: usize) -> Txg {
        match i {
            0 => self.origin_txg(),
            _ => self.snapshots[i - 1].txg,
        }
    }

    /// The deadlist of what now follows the snapshot that was at `i` before it was removed:
    /// snapshot `i`'s, or the head's.
    pub(crate) fn next_deadlist_at(&mut self, i: usize) -> &mut Deadlist {
        if let Some(s) = self.snapshots.get(i) {
            self.snapshot_dirt.record(s.guid);
            self.snapshot_deadlists_grew = true;
        }
        match self.snapshots.get_mut(i) {
            Some(n) => &mut n.deadlist,
            None => &mut self.deadlist,
        }
    }

    /// `used` of snapshot `i`: the bytes only it references (what destroying it frees).
    pub(crate) fn unique_bytes(&self, i: usize) -> u64 {
        let after = self.prev_txg(i);
        let upto = self.snapshots[i].txg;
        let next = match self.snapshots.get(i + 1) {
            Some(n) => &n.deadlist,
            None => &self.deadlist,
        };
        next.bytes_born_in(after, upto)
    }

    /// `usedbysnapshots`: what destroying every snapshot would free (entries of every
    /// deadlist born after the origin; older ones belong to the origin).
    pub(crate) fn used_by_snapshots_bytes(&self) -> u64 {
        let after = self.origin_txg();
        let all = Txg(u64::MAX);
        self.deadlist.bytes_born_in(after, all)
            + self
                .snapshots()
                .iter()
                .map(|s| s.deadlist.bytes_born_in(after, all))
                .sum::<u64>()
    }

    /// The persistent record of volume `volume` (the tables as last written).
    pub(crate) fn to_meta(&self, volume: oxpool_format::VolumeId) -> DatasetMeta {
        DatasetMeta {
            volume,
            guid: self.guid,
            createtxg: self.createtxg,
            creation_s: self.creation_s,
            origin: self.origin.clone(),
            prev_snap_txg: self.prev_snap_txg,
            written_bytes: self.written_bytes,
            deadlist: deadlist_meta(&self.deadlist),
            snapshot_table: self.snapshot_table.meta(),
            bookmark_table: self.bookmark_table.meta(),
            snapshots: Vec::new(),
            receive_resume: self.receive_resume.as_ref().map(|r| r.meta.clone()),
        }
    }

    /// The lineage a record describes, with its snapshots and bookmarks read from its tables
    /// (`snapshots` holds a version 3 record's inline ones: the next sync writes them into a
    /// table). `origin_chain` is filled in by the caller, which knows the origin.
    pub(crate) fn from_meta(
        m: &DatasetMeta,
        snapshot_table: Table,
        snapshots: Vec<SnapshotMeta>,
        bookmark_table: Table,
        bookmarks: Vec<oxpool_format::BookmarkMeta>,
    ) -> Lineage {
        let inline = !m.snapshots.is_empty();
        let snapshots = if inline { &m.snapshots } else { &snapshots };
        Lineage {
            guid: m.guid,
            createtxg: m.createtxg,
            creation_s: m.creation_s,
            origin: m.origin.clone(),
            origin_chain: Vec::new(),
            prev_snap_txg: m.prev_snap_txg,
            written_bytes: m.written_bytes,
            deadlist: deadlist_from_meta(&m.deadlist),
            snapshots: snapshots
                .iter()
                .map(|s| Snapshot {
                    name: s.name.clone(),
                    guid: s.guid,
                    txg: s.txg,
                    creation_s: s.creation_s,
                    root: s.root,
                    levels: s.levels,
                    volsize_bytes: s.volsize_bytes,
                    referenced_bytes: s.referenced_bytes,
                    written_bytes: s.written_bytes,
                    compressed_bytes: s.compressed_bytes,
                    deadlist: deadlist_from_meta(&s.deadlist),
                    holds: s.holds.iter().cloned().collect(),
                    defer_destroy: s.defer_destroy,
                })
                .collect(),
            bookmarks,
            snapshot_table,
            bookmark_table,
            snapshot_dirt: if inline { Dirt::Moved } else { Dirt::Clean },
            bookmarks_dirty: false,
            snapshot_deadlists_grew: false,
            receive_resume: m.receive_resume.clone().map(ResumeProgress::new),
        }
    }
}

/// A snapshot's persistent record.
fn snapshot_meta(s: &Snapshot) -> SnapshotMeta {
    SnapshotMeta {
        name: s.name.clone(),
        guid: s.guid,
        txg: s.txg,
        creation_s: s.creation_s,
        root: s.root,
        levels: s.levels,
        volsize_bytes: s.volsize_bytes,
        referenced_bytes: s.referenced_bytes,
        written_bytes: s.written_bytes,
        compressed_bytes: s.compressed_bytes,
        deadlist: deadlist_meta(&s.deadlist),
        holds: s.holds.iter().cloned().collect(),
        defer_destroy: s.defer_destroy,
    }
}

fn deadlist_meta(d: &Deadlist) -> Vec<DeadBucketMeta> {
    d.buckets()
        .map(|(k, b)| {
            assert!(
                b.pending.is_empty(),
                "deadlist entries written before the metadata"
            );
            DeadBucketMeta {
                key: *k,
                chunks: b.stored.clone(),
                count: b.count,
                bytes: b.bytes,
            }
        })
        .collect()
}

fn deadlist_from_meta(m: &[DeadBucketMeta]) -> Deadlist {
    Deadlist::from_buckets(m.iter().map(|b| {
        (
            b.key,
            Bucket {
                pending: Vec::new(),
                stored: b.chunks.clone(),
                count: b.count,
                bytes: b.bytes,
            },
        )
    }))
}

/// A change to snapshots that the next txg sync applies.
#[derive(Clone, Debug)]
pub(crate) enum SnapOp {
    /// Take snapshot `name` of the head at the end of the sync's txg.
    Create {
        name: String,
        guid: Guid,
        creation_s: u64,
    },
    /// Destroy snapshot `guid` (named `name` when asked: a rename may change that before
    /// the sync, the guid never).
    Destroy { name: String, guid: Guid },
    /// Roll the head back to snapshot `guid` (the latest, once the ops before it ran;
    /// named `name` when asked).
    Rollback { name: String, guid: Guid },
    /// Make this clone the owner of its origin's snapshots up to the origin (included),
    /// and the origin's volume a clone of that snapshot.
    Promote,
    /// End a receive: swap the hidden dataset this op is queued on into its target and
    /// snapshot the target (`dsl/recv.rs`).
    Receive(super::recv::ReceiveSwap),
}
