//! Change maps: which blocks of a volume's (or a snapshot's) tree differ from an earlier
//! snapshot of its lineage, found by birth txg (DESIGN.md 5.2), for the NBD contexts
//! `oxpool:changed-since:SNAP` (docs/snapshots.md, "Change maps").
//!
//! Two parts live here: which bases a dataset offers and what they resolve to
//! ([`Datasets::pin_base`], the one place a base name becomes a txg), and the walk of a
//! synced tree ([`changed_in_tree`]). The volume layer adds what is dirty in memory.
//!
//! The walk is [`super::send::ChangeWalker`]'s rule, restricted to a block range, with one
//! refinement for holes. Copy-on-write makes a parent at least as new as its children, so a
//! pointer born at or before the base roots a subtree the base holds whole: skipped without
//! being read. A canonical hole (birth 0, left by a trim or write-zeroes) cannot say when it
//! appeared; `send` reports every one under a new indirect block as possibly freed. A change
//! map over a sparse volume would then flag most of it after one write (all the hole slots of
//! the rewritten indirect blocks). So when the base is a snapshot, whose tree we have, the
//! walk reads the base's indirect block at the same place (only when the new one has a hole
//! to judge) and flags a hole only where the base had data: a hole over a hole is zeros both
//! times (and under a subtree freed whole, only what the base had in it). Without the base's
//! tree (a bookmark, or a tree that grew levels since) it falls back to `send`'s superset.
//! Cost: the indirect blocks born after the base, plus the base's block at the same place for
//! those of them above level 1 or holding a hole (a level-1 block full of data needs none),
//! plus the base's blocks under a subtree freed whole. The new indirect blocks under one
//! parent are read [`READ_AHEAD_BLOCKS_MAX`] at a time, concurrently: with changes scattered
//! over the volume nearly every level-1 block is read, and one after another each would
//! cost a device's latency.

use super::dataset::Dataset;
use super::snapshot::Snapshot;
use super::Datasets;
use crate::dmu::tree::capacity;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_block_unhealed;
use crate::{EngineError, Result};
use oxpool_format::{decode_indirect, BlockPtr, Guid, Txg, INDIRECT_FANOUT};
use std::fmt::Display;
use std::sync::Arc;

/// What a change map is relative to: a snapshot of the lineage, or a bookmark.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangeBase {
    /// A snapshot (the part after `@`): of the volume, or of its origin's chain for a clone.
    Snapshot(String),
    /// A bookmark (the part after `#`) of the volume.
    Bookmark(String),
}

impl std::fmt::Display for ChangeBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChangeBase::Snapshot(name) => write!(f, "@{name}"),
            ChangeBase::Bookmark(name) => write!(f, "#{name}"),
        }
    }
}

/// A base as it was when a client chose it: the snapshot it named then (or the snapshot a
/// bookmark of that name was made from), by guid and txg, which a rename changes neither of.
/// A client that chose `oxpool:changed-since:cur` keeps the map since that snapshot when
/// `@cur` is renamed `@prev` and a new `@cur` is taken (a rotation of backup bases), instead
/// of being moved to the new one and missing what was written between the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PinnedBase {
    /// A bookmark (judged without a base tree) rather than a snapshot.
    pub bookmark: bool,
    /// The snapshot's guid (a bookmark's: the snapshot it was made from).
    pub guid: Guid,
    /// That snapshot's txg.
    pub txg: Txg,
}

/// A base resolved: the txg after which blocks count as changed, and the base's tree when
/// it has one (a snapshot), to judge holes by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BasePoint {
    /// Blocks born after this txg are changed.
    pub txg: Txg,
    /// The base's root and levels; None for a base without a tree (a bookmark).
    pub tree: Option<(BlockPtr, u8)>,
}

impl Datasets {
    /// The dataset whose lineage `ds` is part of, and where in it `ds` stands: `ds` itself
    /// for a head (None), or for a read-only view of a snapshot (a `VOL@SNAP` export) the
    /// volume that owns that snapshot now (as the view's registration says: a promote moves
    /// snapshots) and the snapshot's txg. Not by guid across the pool: a copy of the volume
    /// received within the pool has the same guids, and its snapshots other txgs. None once
    /// the head or the snapshot is gone.
    fn lineage_position(&self, ds: &Dataset) -> Option<(Arc<Dataset>, Option<Txg>)> {
        // No copy of the name, nor a lookup by it: a change map is asked for per NBD
        // BLOCK_STATUS request, and a rename may change the name meanwhile.
        if ds.names.with(|n| n.contains('@')) {
            let guid = ds.lineage.lock().unwrap().guid;
            let head = self.view_head(ds)?;
            let d = self.all().into_iter().find(|d| d.id == head)?;
            let txg = d
                .lineage
                .lock()
                .unwrap()
                .snapshots()
                .iter()
                .find(|s| s.guid == guid)
                .map(|s| s.txg)?;
            return Some((d, Some(txg)));
        }
        let s = self.state.lock().unwrap();
        let head = s
            .datasets
            .values()
            .find(|d| std::ptr::eq(Arc::as_ptr(d), ds))?;
        Some((head.clone(), None))
    }

    /// Visits the snapshots `ds` can be compared with, nearest first, until `visit` returns
    /// something: its lineage's snapshots older than it (every one for a head), then, for a
    /// clone, its origin and the snapshots of the origin's volume before it, and so on up the
    /// chain of origins. Every block pointer of `ds`'s tree born at or before such a
    /// snapshot's txg is in that snapshot's tree at the same place (one linear history),
    /// which is what makes birth txgs answer. `visit` runs under the snapshot's dataset's
    /// lineage lock: it takes no lock. No copy of a name: a pinned base is resolved per NBD
    /// BLOCK_STATUS request.
    fn visit_candidates<T>(
        &self,
        ds: &Dataset,
        mut visit: impl FnMut(&Snapshot) -> Option<T>,
    ) -> Option<T> {
        let (owner, before) = self.lineage_position(ds)?;
        let mut origin = {
            let l = owner.lineage.lock().unwrap();
            // A view compares with the snapshots strictly before its own.
            let older = l.snapshots().iter().rev();
            if let Some(found) = older
                .filter(|s| before.is_none_or(|t| s.txg < t))
                .find_map(&mut visit)
            {
                return Some(found);
            }
            l.origin.clone()
        };
        origin.as_ref()?;
        let all = self.all();
        // Bounded: one step per origin up the chain, at most one per dataset.
        for _ in 0..all.len() {
            let o = origin.take()?;
            let src = all.iter().find(|d| d.id == o.volume)?;
            let l = src.lineage.lock().unwrap();
            let mut upto = l.snapshots().iter().rev().filter(|s| s.txg <= o.txg);
            if let Some(found) = upto.find_map(&mut visit) {
                return Some(found);
            }
            origin = l.origin.clone();
        }
        None
    }

    /// What base `base` of dataset `ds` (a head or a snapshot view) names now, pinned
    /// ([`PinnedBase`]), or None if `ds` offers no change map since it. The one place a
    /// base's name is looked up.
    ///
    /// A snapshot name is looked up nearest first ([`Datasets::visit_candidates`]): the
    /// lineage's own snapshots, then those of its origin's chain, so a clone's own `@a`
    /// hides its origin volume's `@a`.
    pub(crate) fn pin_base(&self, ds: &Dataset, base: &ChangeBase) -> Option<PinnedBase> {
        match base {
            ChangeBase::Snapshot(name) => self.visit_candidates(ds, |s| {
                (s.name == *name).then_some(PinnedBase {
                    bookmark: false,
                    guid: s.guid,
                    txg: s.txg,
                })
            }),
            ChangeBase::Bookmark(name) => self.bookmark(ds, |b| b.name == *name),
        }
    }

    /// What a pinned base of `ds` resolves to now, or None once `ds` offers no change map
    /// since it (its snapshot or every bookmark of it destroyed, or rolled back past). Found
    /// by guid and txg, not by name: a rename keeps it, a new snapshot under its old name
    /// does not take its place.
    pub(crate) fn pinned_point(&self, ds: &Dataset, pin: &PinnedBase) -> Option<BasePoint> {
        if pin.bookmark {
            // A bookmark of the lineage's own volume (for a view, older than its snapshot):
            // no tree to judge holes by, so holes under changed indirect blocks are flagged
            // as possibly new (a superset). A rollback past a bookmark destroys it, so every
            // block born at or before its txg is still what it was then. Any bookmark of the
            // same snapshot answers the same.
            return self
                .bookmark(ds, |b| b.guid == pin.guid && b.txg == pin.txg)
                .map(|p| BasePoint {
                    txg: p.txg,
                    tree: None,
                });
        }
        self.visit_candidates(ds, |s| {
            (s.guid == pin.guid && s.txg == pin.txg).then_some(BasePoint {
                txg: s.txg,
                tree: Some((s.root, s.levels.max(1))),
            })
        })
    }

    /// The bases `ds` offers now, oldest first, at most `limit` (the newest ones when there
    /// are more), each name once (the nearest of a name hides the others, as in
    /// [`Datasets::pin_base`]).
    pub(crate) fn change_bases(&self, ds: &Dataset, limit: usize) -> Vec<ChangeBase> {
        let mut seen = std::collections::HashSet::new();
        let mut bases: Vec<ChangeBase> = Vec::new();
        self.visit_candidates(ds, |s| {
            if bases.len() >= limit {
                return Some(());
            }
            if seen.insert(s.name.clone()) {
                bases.push(ChangeBase::Snapshot(s.name.clone()));
            }
            None
        });
        // Then the bookmarks, nearest first, as many as still fit.
        if let Some((owner, before)) = self.lineage_position(ds) {
            let l = owner.lineage.lock().unwrap();
            let marks = l.bookmarks().iter().rev();
            bases.extend(
                marks
                    .filter(|b| before.is_none_or(|t| b.txg < t))
                    .take(limit.saturating_sub(bases.len()))
                    .map(|b| ChangeBase::Bookmark(b.name.clone())),
            );
        }
        bases.reverse();
        bases
    }

    /// The nearest bookmark of `ds`'s lineage that `wanted` accepts, as a base (for a view,
    /// only those older than its snapshot).
    fn bookmark(
        &self,
        ds: &Dataset,
        wanted: impl Fn(&oxpool_format::BookmarkMeta) -> bool,
    ) -> Option<PinnedBase> {
        let (owner, before) = self.lineage_position(ds)?;
        let l = owner.lineage.lock().unwrap();
        l.bookmarks()
            .iter()
            .rev()
            .find(|b| wanted(b) && before.is_none_or(|t| b.txg < t))
            .map(|b| PinnedBase {
                bookmark: true,
                guid: b.guid,
                txg: b.txg,
            })
    }
}

/// What [`changed_in_tree`] found.
#[derive(Debug, Default)]
pub(crate) struct TreeChanges {
    /// Changed block ranges `[start, end)`, increasing, disjoint, not adjacent.
    pub ranges: Vec<(u64, u64)>,
    /// The walk is exact for blocks before this one (the end of the range asked, unless it
    /// stopped at `ranges_max`).
    pub exact_end: u64,
    /// Indirect blocks read (of both trees).
    pub indirect_reads: u64,
}

/// The base's side of one indirect block being walked.
enum BaseSide {
    /// Not known (no base tree, or levels that do not line up): holes are judged by birth.
    Unknown,
    /// The base had a hole here: every child is a hole.
    Holes,
    /// The base's block here, not read yet (read when a hole needs judging).
    Unread(BlockPtr),
    /// The base's block's children.
    Read(Box<[BlockPtr; INDIRECT_FANOUT]>),
}

/// One indirect block of the head's tree being walked.
struct Frame {
    /// Level of the children (0: data pointers).
    child_level: u8,
    /// The first data block the first child covers.
    first_block: u64,
    children: Box<[BlockPtr; INDIRECT_FANOUT]>,
    base: BaseSide,
    next: usize,
    /// Indirect children read ahead (slot, children), in slot order: the next ones the walk
    /// descends into.
    ahead: std::collections::VecDeque<(usize, Box<[BlockPtr; INDIRECT_FANOUT]>)>,
}

/// Indirect blocks of one parent read at once: a walk that read them one after another
/// would wait a device's latency per changed block of 4 MiB (at 16 KiB blocks). Bounds the
/// memory read ahead to about 1 MiB per level.
const READ_AHEAD_BLOCKS_MAX: usize = 32;

/// The base's pointer at a place, as far as it is known.
#[derive(Clone, Copy)]
enum BaseChild {
    Unknown,
    Ptr(BlockPtr),
}

/// The changed blocks of the tree under `root` (`levels` levels) within blocks `[start,
/// end)`, relative to `base`: blocks born after `base.txg`, and holes where the base may have
/// had data (see the module docs). At most `ranges_max` ranges (at least 1): the walk stops
/// at the start of the next one and says so in `exact_end`. Reads are not healed: the tree
/// may be one a sync has replaced since, whose places may be reused; a read that fails its
/// checksum is an error the caller retries with the current tree.
pub(crate) async fn changed_in_tree(
    spa: &Spa,
    what: &(dyn Display + Sync),
    root: (BlockPtr, u8),
    base: &BasePoint,
    range: (u64, u64),
    ranges_max: usize,
) -> Result<TreeChanges> {
    let (start, end) = range;
    let (root, levels) = (root.0, root.1.max(1));
    let mut walk = Walk {
        spa,
        what,
        after: base.txg,
        start,
        end: end.min(capacity(levels)),
        ranges_max: ranges_max.max(1),
        out: TreeChanges {
            ranges: Vec::new(),
            exact_end: end,
            indirect_reads: 0,
        },
        stack: Vec::new(),
    };
    // The root's base side: the base's root if the trees have the same shape; a tree that
    // grew levels since has its old root deeper down, and is judged by birth alone.
    let base_root = match base.tree {
        Some((b, l)) if l.max(1) == levels => BaseChild::Ptr(b),
        _ => BaseChild::Unknown,
    };
    if walk.visit(root, base_root, levels, 0, None).await? {
        return Ok(walk.out);
    }
    // Bounded: each round moves one child forward or pops a frame; the tree is finite.
    while let Some(top) = walk.stack.last_mut() {
        if top.next == INDIRECT_FANOUT {
            walk.stack.pop();
            continue;
        }
        let i = top.next;
        top.next += 1;
        let level = top.child_level;
        let first = top.first_block + i as u64 * capacity(level);
        if first >= walk.end {
            // Past the range: nothing more in this block.
            top.next = INDIRECT_FANOUT;
            continue;
        }
        let bp = top.children[i];
        let (base_child, unread) = match &top.base {
            BaseSide::Unknown => (BaseChild::Unknown, None),
            BaseSide::Holes => (BaseChild::Ptr(BlockPtr::HOLE), None),
            BaseSide::Read(kids) => (BaseChild::Ptr(kids[i]), None),
            // Read only if this child needs it: a hole to judge, or a new indirect block
            // whose holes will need the base's block below it. Changed data blocks, the
            // children of most level-1 blocks, are judged by their birth alone.
            BaseSide::Unread(base_bp)
                if (bp.is_hole() || (level > 0 && bp.birth > walk.after))
                    && first.saturating_add(capacity(level)) > walk.start =>
            {
                (BaseChild::Unknown, Some(*base_bp))
            }
            BaseSide::Unread(_) => (BaseChild::Unknown, None),
        };
        let base_child = match unread {
            None => base_child,
            Some(base_bp) => {
                let kids = walk.read_indirect(&base_bp, level + 1).await?;
                let child = kids[i];
                if let Some(top) = walk.stack.last_mut() {
                    top.base = BaseSide::Read(kids);
                }
                BaseChild::Ptr(child)
            }
        };
        let descends = level > 0
            && !bp.is_hole()
            && bp.birth > walk.after
            && first.saturating_add(capacity(level)) > walk.start;
        let read = if descends {
            Some(walk.child_block(i, level).await?)
        } else {
            None
        };
        if walk.visit(bp, base_child, level, first, read).await? {
            break;
        }
    }
    Ok(walk.out)
}

/// The state of one [`changed_in_tree`].
struct Walk<'a> {
    spa: &'a Spa,
    what: &'a (dyn Display + Sync),
    after: Txg,
    start: u64,
    end: u64,
    ranges_max: usize,
    out: TreeChanges,
    /// Bounded by the tree's levels.
    stack: Vec<Frame>,
}

impl Walk<'_> {
    /// Looks at the head's pointer `bp` of a block at `level` covering blocks from `first`,
    /// whose base counterpart is `base`: a changed range, a frame to descend into, or
    /// nothing. True when the walk must stop (`ranges_max` reached).
    async fn visit(
        &mut self,
        bp: BlockPtr,
        base: BaseChild,
        level: u8,
        first: u64,
        read: Option<Box<[BlockPtr; INDIRECT_FANOUT]>>,
    ) -> Result<bool> {
        let span = capacity(level);
        if first >= self.end || first.saturating_add(span) <= self.start {
            return Ok(false);
        }
        if bp.is_hole() {
            let changed = match base {
                // Zeros then, zeros now.
                BaseChild::Ptr(b) if b.is_hole() => false,
                // A whole subtree freed (every block under an indirect block trimmed): only
                // what the base had under it changed; its holes stay zeros. Descend into the
                // base's block alone, the head's side all holes.
                BaseChild::Ptr(b) if level > 0 && b.level == level => {
                    self.stack.push(Frame {
                        child_level: level - 1,
                        first_block: first,
                        children: Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]),
                        base: BaseSide::Unread(b),
                        next: 0,
                        ahead: std::collections::VecDeque::new(),
                    });
                    return Ok(false);
                }
                BaseChild::Ptr(_) => true,
                // Born after the base, or a canonical hole that may be: we only descend into
                // blocks born after the base, and the root's parent changes every txg.
                BaseChild::Unknown => bp.birth > self.after || bp.birth == Txg(0),
            };
            return Ok(changed && self.changed(first, span));
        }
        if bp.birth <= self.after {
            return Ok(false);
        }
        if level == 0 {
            return Ok(self.changed(first, 1));
        }
        let children = match read {
            Some(children) => children,
            None => self.read_indirect(&bp, level).await?,
        };
        let base = match base {
            BaseChild::Unknown => BaseSide::Unknown,
            BaseChild::Ptr(b) if b.is_hole() => BaseSide::Holes,
            BaseChild::Ptr(b) if b.level == level => BaseSide::Unread(b),
            BaseChild::Ptr(_) => BaseSide::Unknown,
        };
        self.stack.push(Frame {
            child_level: level - 1,
            first_block: first,
            children,
            base,
            next: 0,
            ahead: std::collections::VecDeque::new(),
        });
        Ok(false)
    }

    /// Records blocks `[first, first + count)` (clipped to the range) as changed. True when
    /// they start a range past `ranges_max`: the walk ends before them.
    fn changed(&mut self, first: u64, count: u64) -> bool {
        let lo = first.max(self.start);
        let hi = first.saturating_add(count).min(self.end);
        if lo >= hi {
            return false;
        }
        let full = self.out.ranges.len() == self.ranges_max;
        match self.out.ranges.last_mut() {
            Some(last) if last.1 == lo => last.1 = hi,
            _ if full => {
                self.out.exact_end = lo;
                return true;
            }
            _ => self.out.ranges.push((lo, hi)),
        }
        false
    }

    /// The children of indirect block `bp` at `level` (not healed: see [`changed_in_tree`]).
    async fn read_indirect(
        &mut self,
        bp: &BlockPtr,
        level: u8,
    ) -> Result<Box<[BlockPtr; INDIRECT_FANOUT]>> {
        self.out.indirect_reads += 1;
        read_indirect(self.spa, self.what, bp, level).await
    }

    /// The children of child `slot` (an indirect block at `level` the walk descends into) of
    /// the frame on top: read ahead with the next children the walk will descend into, at
    /// most [`READ_AHEAD_BLOCKS_MAX`] at once, unless an earlier read ahead has it.
    async fn child_block(
        &mut self,
        slot: usize,
        level: u8,
    ) -> Result<Box<[BlockPtr; INDIRECT_FANOUT]>> {
        let (after, start, end) = (self.after, self.start, self.end);
        let top = self.stack.last_mut().expect("a frame being walked");
        // Ahead entries are in slot order and the walk goes in slot order: one not taken
        // (never, but cheap to drop) is older than `slot`.
        while let Some((s, children)) = top.ahead.pop_front() {
            if s == slot {
                return Ok(children);
            }
        }
        let span = capacity(level);
        let wanted: Vec<(usize, BlockPtr)> = (slot..INDIRECT_FANOUT)
            .map(|j| (j, top.children[j], top.first_block + j as u64 * span))
            .take_while(|&(_, _, first)| first < end)
            .filter(|&(_, bp, first)| {
                !bp.is_hole() && bp.birth > after && first.saturating_add(span) > start
            })
            .take(READ_AHEAD_BLOCKS_MAX)
            .map(|(j, bp, _)| (j, bp))
            .collect();
        debug_assert_eq!(wanted.first().map(|w| w.0), Some(slot));
        self.out.indirect_reads += wanted.len() as u64;
        let reads = wanted
            .iter()
            .map(|(_, bp)| read_indirect(self.spa, self.what, bp, level))
            .collect();
        let mut read = oxpool_io::rt::join_all(reads).await.into_iter();
        let first = read.next().expect("the slot asked for is wanted")?;
        let top = self.stack.last_mut().expect("a frame being walked");
        for ((j, _), children) in wanted.iter().skip(1).zip(read) {
            top.ahead.push_back((*j, children?));
        }
        Ok(first)
    }
}

/// The children of indirect block `bp` at `level`, read without healing (see
/// [`changed_in_tree`]) and checked to be that level's.
async fn read_indirect(
    spa: &Spa,
    what: &(dyn Display + Sync),
    bp: &BlockPtr,
    level: u8,
) -> Result<Box<[BlockPtr; INDIRECT_FANOUT]>> {
    let corrupt = |what: String, source| EngineError::Corrupt {
        device: spa.name.clone(),
        what,
        source,
    };
    if bp.level != level {
        return Err(corrupt(
            format!(
                "{what}: block pointer of level {} where level {level} belongs",
                bp.level
            ),
            oxpool_format::FormatError::BadField {
                field: "level",
                value: u64::from(bp.level),
            },
        ));
    }
    let (buf, _) = read_block_unhealed(
        &spa.zio,
        IoClass::SyncRead,
        bp,
        &format_args!("{what} indirect block"),
    )
    .await?;
    let mut children = Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]);
    let got = decode_indirect(&buf, &mut children)
        .map_err(|e| corrupt(format!("{what}: indirect block"), e))?;
    if got != level {
        return Err(EngineError::invalid(format!(
            "{what}: indirect block of level {got} where level {level} belongs"
        )));
    }
    Ok(children)
}
