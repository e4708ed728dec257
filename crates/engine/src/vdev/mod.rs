//! The vdev tree: top-level vdevs (a single device, an n-way mirror, or a raidz1/2/3) striped
//! together.
//!
//! The tree plans and never issues I/O: given a block address (a [`Dva`]) it says which leaf
//! devices to write and in which order to try reads; for a raidz vdev, its layout gives each
//! block's columns ([`raidz::RaidzMap`]) and the plans of `raidz/plan.rs`. The pipeline
//! (`zio/`) executes the plans; that keeps this logic pure and testable without devices.

pub mod alloc;
mod change;
pub mod health;
pub mod inject;
pub mod label;
mod leaf_io;
pub mod queue;
pub mod raidz;
mod states;
mod stats;

pub use change::{Detached, SpareStatus};
pub use health::{ErrorKind, FaultPolicy, LeafHealth, LeafState, StateRecord};
pub use inject::{InjectKind, InjectOps, InjectRule, InjectRuleStatus};
pub use states::{OutageMarks, STATE_RECORD_PREFIX};
pub use stats::{DeviceErrors, DeviceStats};

use crate::iostats::LeafIoStats;
use crate::vdev::alloc::SLAB_BYTES;
use crate::vdev::queue::VdevQueue;
use crate::vdev::raidz::{LayoutEpoch, LayoutHistory, RaidzLayout};
use crate::{EngineError, Result};
use oxpool_format::{
    Dva, Guid, LeafConfig, PairConfig, PairKind, RaidzConfig, TopVdevConfig, TopVdevKind, Txg,
    VdevId, VdevTreeConfig, DATA_START_BYTES,
};
use oxpool_io::Backend;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Most top-level vdevs a pool can have (the bound of the append-only list; a pool's labels
/// could not describe many more).
pub const TOP_VDEVS_MAX: usize = 256;

/// The largest block the engine writes on a raidz vdev, other than a piece of the pool's
/// metadata (whose size the writer picks to fit, `spa/meta.rs`): the largest `volblocksize`
/// and the largest intent-log block (128 KiB).
pub const RAIDZ_BLOCK_BYTES_WRITTEN_MAX: u64 = 128 * 1024;

/// The fewest children a raidz vdev with `parity` parity columns may have in oxpool: the
/// fewest whose allocated size of the largest block ([`RAIDZ_BLOCK_BYTES_WRITTEN_MAX`], data
/// plus parity plus skip sectors) fits in one allocator slab ([`SLAB_BYTES`], 256 KiB), since
/// every block is one contiguous run of a slab. 2 for raidz1, 5 for raidz2, 7 for raidz3
/// (ZFS allows `parity + 1`; a 128 KiB block on a 4-wide raidz2 takes 264 KiB).
pub fn raidz_width_min(parity: usize) -> usize {
    (parity + 1..=raidz::RAIDZ_WIDTH_MAX)
        .find(|&w| {
            RaidzLayout::new(w, parity)
                .is_ok_and(|l| l.asize_bytes(RAIDZ_BLOCK_BYTES_WRITTEN_MAX) <= SLAB_BYTES)
        })
        .unwrap_or(raidz::RAIDZ_WIDTH_MAX)
}

/// The layout history a raidz configuration records (checked: see [`RaidzConfig::validate`]).
pub fn raidz_history(cfg: &RaidzConfig, children: usize) -> Result<LayoutHistory> {
    cfg.validate(children)
        .map_err(|e| EngineError::invalid(format!("raidz vdev configuration: {e}")))?;
    let epochs = cfg
        .epochs
        .iter()
        .map(|e| {
            RaidzLayout::with_sector_shift(
                usize::from(e.width),
                usize::from(cfg.parity),
                u32::from(cfg.sector_shift),
            )
            .map(|layout| LayoutEpoch {
                first_txg: e.first_txg,
                layout,
            })
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| EngineError::invalid(e.to_string()))?;
    LayoutHistory::from_epochs(epochs).map_err(|e| EngineError::invalid(e.to_string()))
}
/// Error counters of one leaf, shown by `oxpool status`.
#[derive(Debug, Default)]
pub struct LeafCounters {
    /// Reads that failed with an I/O error.
    pub read_errors: AtomicU64,
    /// Writes that failed with an I/O error.
    pub write_errors: AtomicU64,
    /// Reads whose data failed the checksum held by the parent block.
    pub checksum_errors: AtomicU64,
    /// Bytes rewritten on this leaf by self-healing.
    pub repaired_bytes: AtomicU64,
}

impl LeafCounters {
    /// The counters now, as `oxpool status` and `iostat` show them.
    pub fn snapshot(&self) -> DeviceErrors {
        DeviceErrors {
            read: self.read_errors.load(Ordering::Relaxed),
            write: self.write_errors.load(Ordering::Relaxed),
            checksum: self.checksum_errors.load(Ordering::Relaxed),
            repaired_bytes: self.repaired_bytes.load(Ordering::Relaxed),
        }
    }

    /// Sets every counter to zero (`oxpool clear`).
    pub fn zero(&self) {
        for counter in [
            &self.read_errors,
            &self.write_errors,
            &self.checksum_errors,
            &self.repaired_bytes,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// One device of the pool. Its I/O goes through [`Leaf::read`], [`Leaf::write`] and
/// [`Leaf::flush`] (`leaf_io.rs`), never to `backend` directly (labels aside).
pub struct Leaf {
    /// Identity written in the device's labels.
    pub guid: Guid,
    /// The device.
    pub backend: Arc<dyn Backend>,
    /// Error counters.
    pub counters: LeafCounters,
    /// The I/O scheduler (and its `scheduler` mode).
    pub queue: VdevQueue,
    /// Operations, bytes and latencies, for `oxpool iostat`.
    pub io_stats: LeafIoStats,
    /// Its state (in service or not), the txgs it lacks, its recent errors.
    pub health: LeafHealth,
    /// Fault injection rules (`oxpool inject`).
    pub inject: inject::LeafInject,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf")
            .field("guid", &self.guid)
            .field("name", &self.backend.name())
            .finish()
    }
}

impl Leaf {
    /// A leaf over `backend`, with `scheduler=auto` until the pool's properties are applied.
    pub fn new(guid: Guid, backend: Arc<dyn Backend>) -> Leaf {
        Leaf {
            guid,
            backend,
            counters: LeafCounters::default(),
            queue: VdevQueue::new(),
            io_stats: LeafIoStats::default(),
            health: LeafHealth::default(),
            inject: inject::LeafInject::default(),
        }
    }

    /// The device's name (its path).
    pub fn name(&self) -> &str {
        self.backend.name()
    }
}

/// One member of a child of a top-level vdev: its configuration, and its leaf when the
/// device was found.
#[derive(Clone, Debug)]
pub struct Member {
    /// Guid, path and size as configured.
    pub config: LeafConfig,
    /// The device; `None` where it was not found at import.
    pub leaf: Option<Arc<Leaf>>,
}

/// A child of a top-level vdev: one device, or a pair while it is replaced (or stood in for
/// by a hot spare). Every member of a child holds the child's blocks (a raidz column, a
/// mirror side): writes go to every member in service, a read to a member that lacks
/// nothing for the block.
#[derive(Clone, Debug)]
pub struct Child {
    /// The device (the one being replaced, in a pair).
    pub old: Member,
    /// The second member of a pair and why it is there: the replacement or the spare.
    pub new: Option<(PairKind, Member)>,
}

impl Child {
    /// The members, old first.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        std::iter::once(&self.old).chain(self.new.as_ref().map(|(_, m)| m))
    }

    /// The members' present leaves, old first.
    pub fn leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.members().filter_map(|m| m.leaf.as_ref())
    }

    /// A member in service to read a block born in `birth` from: one that lacks nothing for
    /// it if there is one (the new member of a pair lacks everything until resilvered), else
    /// any in service (a raidz then treats the column as stale). `None` with no birth: the
    /// member that lacks nothing at all, else any in service.
    pub fn for_read(&self, birth: Option<Txg>) -> Option<&Arc<Leaf>> {
        let mut in_service = self.leaves().filter(|l| l.health.in_service());
        let first = in_service.next()?;
        let lacks = |l: &Leaf| match birth {
            Some(b) => l.health.missed_covers(b),
            None => l.health.missed().is_some(),
        };
        if !lacks(first) {
            return Some(first);
        }
        Some(in_service.find(|l| !lacks(l)).unwrap_or(first))
    }

    /// Whether a member in service lacks nothing.
    pub fn whole(&self) -> bool {
        self.leaves()
            .any(|l| l.health.in_service() && l.health.missed().is_none())
    }

    /// Whether a member other than `except` is in service and lacks nothing.
    pub fn whole_without(&self, except: &Leaf) -> bool {
        self.leaves().any(|l| {
            !std::ptr::eq(&**l, except) && l.health.in_service() && l.health.missed().is_none()
        })
    }
}

/// What a top-level vdev is made of now: its kind (attach turns a single device into a
/// mirror) and its children. Immutable; a change swaps in a new one ([`TopVdev::set_shape`]).
#[derive(Clone, Debug)]
pub struct Shape {
    /// Single, mirror or raidz.
    pub kind: TopVdevKind,
    /// Children in configuration order.
    pub children: Vec<Child>,
}

impl Shape {
    /// The shape `config` describes over the present `leaves` (by guid).
    fn from_config(config: &TopVdevConfig, find: &dyn Fn(Guid) -> Option<Arc<Leaf>>) -> Shape {
        let children = config
            .children
            .iter()
            .enumerate()
            .map(|(i, c)| Child {
                old: Member {
                    config: c.clone(),
                    leaf: find(c.guid),
                },
                new: config
                    .pairs
                    .iter()
                    .find(|p| p.child as usize == i)
                    .map(|p| {
                        (
                            p.kind,
                            Member {
                                config: p.leaf.clone(),
                                leaf: find(p.leaf.guid),
                            },
                        )
                    }),
            })
            .collect();
        Shape {
            kind: config.kind.clone(),
            children,
        }
    }

    /// Child `index`'s member to read if it is present and in service (see
    /// [`Child::for_read`]).
    #[inline]
    pub fn child_in_service(&self, index: usize) -> Option<&Arc<Leaf>> {
        self.children[index].for_read(None)
    }

    /// Every present leaf, in service or not.
    pub fn leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.children.iter().flat_map(Child::leaves)
    }

    /// The index of the child `leaf` is a member of.
    pub fn child_of(&self, leaf: &Leaf) -> Option<usize> {
        self.children
            .iter()
            .position(|c| c.leaves().any(|l| std::ptr::eq(&**l, leaf)))
    }

    /// How many children the vdev can be without and still give back every block: a
    /// mirror all but one, a raidz its parity, a single device none.
    pub fn redundancy(&self) -> usize {
        match &self.kind {
            TopVdevKind::Raidz(r) => usize::from(r.parity),
            TopVdevKind::Mirror => self.children.len().saturating_sub(1),
            TopVdevKind::Single | TopVdevKind::Hole => 0,
        }
    }
}

/// A top-level vdev: a single leaf, a mirror of leaves or a raidz.
///
/// Its children may change while it serves (attach, detach, replace, spares): they are a
/// [`Shape`] that a change replaces whole. A plan reads the current one with one atomic
/// load, no lock, no reference count, no allocation: shapes are never freed while the vdev
/// lives (a change keeps the old one among `shapes`), so a plan made before a change
/// finishes on the shape it started with. A change is an administrator's act (a few in a
/// pool's life), so keeping the old shapes costs a few hundred bytes each.
pub struct TopVdev {
    /// Index in the pool.
    pub id: VdevId,
    /// A raidz vdev's layout (the last epoch of its recorded history, `kind`); None for
    /// single and mirror vdevs.
    pub raidz: Option<RaidzLayout>,
    /// The kind and the children now: the last of `shapes`.
    shape: AtomicPtr<Shape>,
    /// Every shape the vdev has had, the current one last; never shrunk, so the shapes
    /// `shape` ever pointed at stay valid as long as the vdev. Boxed: a shape must not move
    /// when the vector grows (`shape` points at it).
    #[allow(clippy::vec_box)]
    shapes: Mutex<Vec<Box<Shape>>>,
    /// Allocatable bytes (the same on every child).
    pub asize_bytes: u64,
    /// A separate intent-log device (holds log blocks only).
    pub log: bool,
    /// Rotor that spreads mirror reads over the children.
    read_rotor: AtomicUsize,
}

/// One leaf I/O of a plan: the device and the byte offset on it.
#[derive(Clone, Debug)]
pub struct LeafIo {
    /// The device.
    pub leaf: Arc<Leaf>,
    /// Byte offset on the device.
    pub offset_bytes: u64,
}

impl std::fmt::Debug for TopVdev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopVdev")
            .field("id", &self.id)
            .field("shape", self.shape())
            .field("asize_bytes", &self.asize_bytes)
            .field("log", &self.log)
            .finish()
    }
}

/// The present leaves of a shape, in order, as owned handles: planning allocates nothing.
pub struct ShapeLeaves<'a> {
    shape: &'a Shape,
    /// Next position: the `next / 2`-th child from `first`, member `next % 2` (old, new).
    next: usize,
    /// Positions to visit: two per child (0: none, a raidz's whole-copy plans).
    count: usize,
    /// First child (the read rotor's pick: reads rotate over children, not members).
    first: usize,
}

impl<'a> ShapeLeaves<'a> {
    fn new(shape: &'a Shape, whole_copies: bool, rotor: Option<usize>) -> ShapeLeaves<'a> {
        let children = if whole_copies {
            shape.children.len()
        } else {
            0
        };
        ShapeLeaves {
            first: rotor.map_or(0, |r| r % children.max(1)),
            shape,
            next: 0,
            count: children * 2,
        }
    }
}

impl Iterator for ShapeLeaves<'_> {
    type Item = Arc<Leaf>;

    fn next(&mut self) -> Option<Arc<Leaf>> {
        // Bounded: every turn moves `next` on.
        while self.next < self.count {
            let pos = self.next;
            self.next += 1;
            // `first + pos / 2` wraps at most once: no division on the I/O path.
            let children = self.count / 2;
            let mut c = self.first + pos / 2;
            if c >= children {
                c -= children;
            }
            let child = &self.shape.children[c];
            let member = if pos & 1 == 0 {
                Some(&child.old)
            } else {
                child.new.as_ref().map(|(_, m)| m)
            };
            if let Some(leaf) = member.and_then(|m| m.leaf.as_ref()) {
                return Some(leaf.clone());
            }
        }
        None
    }
}

impl TopVdev {
    /// The top-level vdev `config` describes, over `children` (in the order of its children's
    /// configurations; `None` where a device is missing). An error if a raidz record is not
    /// valid (a configuration read from a device is checked here).
    pub fn new(config: &TopVdevConfig, children: Vec<Option<Arc<Leaf>>>) -> Result<TopVdev> {
        debug_assert!(!children.is_empty());
        debug_assert_eq!(children.len(), config.children.len());
        let leaves: Vec<Arc<Leaf>> = children.into_iter().flatten().collect();
        Self::with_leaves(config, &|g| leaves.iter().find(|l| l.guid == g).cloned())
    }

    /// The top-level vdev `config` describes (pairs included), each member's leaf found by
    /// `find` (by guid; `None`: not present).
    pub fn with_leaves(
        config: &TopVdevConfig,
        find: &dyn Fn(Guid) -> Option<Arc<Leaf>>,
    ) -> Result<TopVdev> {
        let raidz = match &config.kind {
            TopVdevKind::Raidz(r) => Some(raidz_history(r, config.children.len())?.current()),
            TopVdevKind::Mirror | TopVdevKind::Hole => None,
            TopVdevKind::Single => {
                debug_assert_eq!(config.children.len(), 1);
                None
            }
        };
        let mut first = Box::new(Shape::from_config(config, find));
        Ok(TopVdev {
            id: config.id,
            raidz,
            shape: AtomicPtr::new(&mut *first),
            shapes: Mutex::new(vec![first]),
            asize_bytes: config.asize_bytes,
            log: config.log,
            read_rotor: AtomicUsize::new(0),
        })
    }

    /// The kind and children now (a later change does not alter what this returns).
    #[inline]
    pub fn shape(&self) -> &Shape {
        // SAFETY: `shape` always points into a box of `shapes`, which is only ever pushed
        // to and lives as long as `self`; a box's contents do not move when the vector
        // grows. Acquire pairs with the Release in `set_shape`: the shape is fully built.
        unsafe { &*self.shape.load(Ordering::Acquire) }
    }

    /// Swaps in a new shape (a device attached, detached, replaced). The caller serializes
    /// changes; plans made before finish on the old shape, which is kept.
    pub(crate) fn set_shape(&self, shape: Shape) {
        let mut shapes = self.shapes.lock().unwrap();
        let mut shape = Box::new(shape);
        let ptr: *mut Shape = &mut *shape;
        shapes.push(shape);
        self.shape.store(ptr, Ordering::Release);
    }

    /// Single, mirror or raidz, now.
    pub fn kind(&self) -> TopVdevKind {
        self.shape().kind.clone()
    }

    /// The layout new blocks of a raidz vdev are written with (None: not raidz).
    ///
    /// Blocks are read with it too: a vdev has one epoch until raidz expansion exists, which
    /// must then pick the epoch of the block's birth txg ([`LayoutHistory::layout_at`]).
    pub fn raidz_layout(&self) -> Option<RaidzLayout> {
        self.raidz
    }

    /// The name `oxpool status` gives the vdev: `mirror-N`, `raidzP-N`, or None for a single
    /// device (named by its device).
    pub fn group_name(&self) -> Option<String> {
        match &self.shape().kind {
            TopVdevKind::Single => None,
            TopVdevKind::Hole => Some(format!("hole-{}", self.id.0)),
            TopVdevKind::Mirror => Some(format!("mirror-{}", self.id.0)),
            TopVdevKind::Raidz(r) => Some(format!("raidz{}-{}", r.parity, self.id.0)),
        }
    }

    /// Whether this is the place of a removed vdev ([`TopVdevKind::Hole`]).
    pub fn is_hole(&self) -> bool {
        self.shape().kind == TopVdevKind::Hole
    }

    /// What the pool's metadata records of this vdev.
    pub fn config(&self) -> TopVdevConfig {
        let shape = self.shape();
        if shape.kind == TopVdevKind::Hole {
            return TopVdevConfig {
                id: self.id,
                kind: TopVdevKind::Hole,
                children: vec![],
                asize_bytes: 0,
                log: false,
                pairs: vec![],
            };
        }
        TopVdevConfig {
            id: self.id,
            kind: shape.kind.clone(),
            children: shape
                .children
                .iter()
                .map(|c| c.old.config.clone())
                .collect(),
            asize_bytes: self.asize_bytes,
            log: self.log,
            pairs: shape
                .children
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    c.new.as_ref().map(|(kind, m)| PairConfig {
                        child: i as u32,
                        kind: *kind,
                        leaf: m.config.clone(),
                    })
                })
                .collect(),
        }
    }

    /// The leaves present, in service or not (for status and statistics).
    pub fn leaves(&self) -> ShapeLeaves<'_> {
        ShapeLeaves::new(self.shape(), true, None)
    }

    /// The leaves present and in service (for flushes, uberblocks and labels: a leaf out of
    /// service gets no I/O at all).
    pub fn leaves_in_service(&self) -> impl Iterator<Item = Arc<Leaf>> + '_ {
        self.leaves().filter(|l| l.health.in_service())
    }

    /// Child `index`'s member to read, if one is present and in service (see
    /// [`Child::for_read`]).
    #[inline]
    pub fn child_in_service(&self, index: usize) -> Option<Arc<Leaf>> {
        self.shape().child_in_service(index).cloned()
    }

    /// Every whole copy of the block at `dva` on a child in service (a scrub reads each):
    /// as [`TopVdev::plan_write`], without noting anything on the children out of service.
    pub fn copies_in_service(&self, dva: &Dva) -> impl Iterator<Item = LeafIo> + '_ {
        debug_assert_eq!(dva.vdev, self.id);
        let offset_bytes = DATA_START_BYTES + dva.offset_bytes;
        ShapeLeaves::new(self.shape(), self.raidz.is_none(), None)
            .filter(|l| l.health.in_service())
            .map(move |leaf| LeafIo { leaf, offset_bytes })
    }

    /// Leaf I/Os that write the block at `dva`: one per present member in service (a mirror
    /// writes all, a pair both); a member out of service notes that it missed a write. An
    /// iterator, not a collection: planning allocates nothing. None for a raidz vdev, whose
    /// blocks are planned column by column ([`TopVdev::raidz_layout`]).
    pub fn plan_write(&self, dva: &Dva) -> impl Iterator<Item = LeafIo> + '_ {
        debug_assert_eq!(dva.vdev, self.id);
        let offset_bytes = DATA_START_BYTES + dva.offset_bytes;
        ShapeLeaves::new(self.shape(), self.raidz.is_none(), None)
            .filter(|leaf| {
                let in_service = leaf.health.in_service();
                if !in_service {
                    leaf.health.note_skipped();
                }
                in_service
            })
            .map(move |leaf| LeafIo { leaf, offset_bytes })
    }

    /// Leaf I/Os that can read the block at `dva`, in the order to try them: each read goes to
    /// one member, and the others are the fallbacks on an error or a checksum mismatch. An
    /// iterator, not a collection: planning allocates nothing. None for a raidz vdev (see
    /// [`TopVdev::plan_write`]).
    pub fn plan_read(&self, dva: &Dva) -> impl Iterator<Item = LeafIo> + '_ {
        debug_assert_eq!(dva.vdev, self.id);
        let offset_bytes = DATA_START_BYTES + dva.offset_bytes;
        let rotor = self.read_rotor.fetch_add(1, Ordering::Relaxed);
        ShapeLeaves::new(self.shape(), self.raidz.is_none(), Some(rotor))
            .filter(|l| l.health.in_service())
            .map(move |leaf| LeafIo { leaf, offset_bytes })
    }

    /// How many children this vdev can be without and still give back every block: a
    /// mirror all but one, a raidz its parity, a single device none.
    pub fn redundancy(&self) -> usize {
        self.shape().redundancy()
    }

    /// Whether child `index` holds every block it should: a member present, in service,
    /// lacking no txg.
    pub fn child_whole(&self, index: usize) -> bool {
        self.shape().children[index].whole()
    }
}

/// Top-level vdevs in id order. Appended to while the pool serves (`oxpool add`), never
/// shrunk or reordered once shared, so a `&TopVdev` stays valid as long as the tree: readers
/// on the I/O path pay one atomic load, no lock.
struct TopList {
    slots: Box<[OnceLock<TopVdev>]>,
    /// Slots set, all of them below this; published with Release after the slot is set.
    len: AtomicUsize,
}

impl std::fmt::Debug for TopList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl TopList {
    fn iter(&self) -> impl Iterator<Item = &TopVdev> {
        let len = self.len.load(Ordering::Acquire);
        self.slots[..len]
            .iter()
            .map(|s| s.get().expect("slots below len are set"))
    }
}

/// The pool's vdevs.
#[derive(Debug)]
pub struct VdevTree {
    tops: TopList,
    /// The fault rule (the pool's `fault_errors` and `fault_window`).
    pub fault_policy: FaultPolicy,
    /// The last durable txg, as the pool last said (`note_synced`): what the leaves' missed
    /// ranges are measured against.
    synced: AtomicU64,
    /// The last txg closed or whose sync began (`note_sync_started`, and the txg engine as
    /// it closes one: [`VdevTree::sync_started_handle`]): the open one is the next.
    sync_started: Arc<AtomicU64>,
    /// Held while a leaf's state changes: one decision at a time about what a vdev can lose.
    state_change: Mutex<()>,
    /// State records of children absent at import, by guid (carried to the next import).
    absent: Mutex<BTreeMap<Guid, StateRecord>>,
    /// Called when a leaf's record changes on its own (a fault, a failed write): the pool
    /// marks its open txg dirty, so the next sync records it even if nothing else changes.
    pub(crate) on_record_change: RecordListener,
    /// The pool's hot spares, in use or not (`change.rs`).
    spares: Mutex<Vec<Member>>,
    /// Called when a hot spare stepped in (`change.rs`): the pool starts its resilver.
    pub(crate) on_spare_in: RecordListener,
    /// Raised by one before and one after every change of which leaves get I/O (a leaf out
    /// of service, a new shape: detach, attach, replace, a spare stepping in): odd while one
    /// is under way. See [`VdevTree::service_stamp`].
    service_changes: AtomicU64,
    /// The txg that records the last member added to a vdev (attach, replace, a spare
    /// stepping in); see [`VdevTree::swap_shape_adding`].
    members_added_txg: AtomicU64,
    /// Shapes that add a member being swapped in now (their txg not yet recorded).
    members_adding: AtomicU64,
}

/// What the pool gives the tree to hear of record changes (set once, by the pool).
#[derive(Default)]
pub(crate) struct RecordListener(OnceLock<Box<dyn Fn() + Send + Sync>>);

impl RecordListener {
    /// Sets the listener (once; later calls are ignored).
    pub(crate) fn set(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.0.set(f);
    }

    /// Tells it.
    pub(crate) fn notify(&self) {
        if let Some(f) = self.0.get() {
            f();
        }
    }
}

impl std::fmt::Debug for RecordListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordListener")
    }
}

impl VdevTree {
    /// A tree of `tops` (ids 0, 1, ... in order).
    pub fn new(tops: Vec<TopVdev>) -> VdevTree {
        assert!(
            tops.len() <= TOP_VDEVS_MAX,
            "{} top-level vdevs",
            tops.len()
        );
        let tree = VdevTree {
            tops: TopList {
                slots: (0..TOP_VDEVS_MAX).map(|_| OnceLock::new()).collect(),
                len: AtomicUsize::new(0),
            },
            fault_policy: FaultPolicy::default(),
            synced: AtomicU64::new(0),
            sync_started: Arc::new(AtomicU64::new(0)),
            state_change: Mutex::new(()),
            absent: Mutex::new(BTreeMap::new()),
            on_record_change: RecordListener::default(),
            spares: Mutex::new(Vec::new()),
            on_spare_in: RecordListener::default(),
            service_changes: AtomicU64::new(0),
            members_added_txg: AtomicU64::new(0),
            members_adding: AtomicU64::new(0),
        };
        for top in tops {
            tree.push(top).expect("within TOP_VDEVS_MAX");
        }
        tree
    }

    /// A figure that changes whenever the set of leaves that get I/O may have changed: take
    /// it before a write, and after the flush meant to make the write durable check it with
    /// [`VdevTree::in_service_since`]. Why: a flush reaches the leaves in service when it
    /// starts; a leaf that wrote the block and left meanwhile (or was detached) is not
    /// flushed, and on a mirror whose other child failed that very write the block is then
    /// durable on no device.
    pub fn service_stamp(&self) -> u64 {
        self.service_changes.load(Ordering::SeqCst)
    }

    /// Whether no change of which leaves get I/O began since [`VdevTree::service_stamp`] gave
    /// `stamp`, nor was under way then.
    /// Also false until a member added since is recorded by a durable txg
    /// ([`VdevTree::swap_shape_adding`]).
    pub fn in_service_since(&self, stamp: u64) -> bool {
        stamp.is_multiple_of(2)
            && self.service_stamp() == stamp
            && self.members_adding.load(Ordering::SeqCst) == 0
            && self.synced.load(Ordering::SeqCst) >= self.members_added_txg.load(Ordering::SeqCst)
    }

    /// Runs `change`, which may change which leaves get I/O, counted for
    /// [`VdevTree::service_stamp`]: a leaf's state is changed between the two raises, so
    /// whoever sees the new state (an acquire load, [`crate::vdev::LeafHealth::in_service`])
    /// sees the first raise.
    fn service_change<R>(&self, change: impl FnOnce() -> R) -> R {
        self.service_changes.fetch_add(1, Ordering::SeqCst);
        let r = change();
        self.service_changes.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// Takes `leaf` out of service in `state` from the first txg not yet durable, counted
    /// as a service change: every way a leaf goes out (offline, fault, device gone) passes
    /// here.
    pub(crate) fn take_out(&self, leaf: &Leaf, state: LeafState, reason: String, temporary: bool) {
        self.service_change(|| {
            leaf.health
                .take_out(state, reason, self.first_not_durable(), temporary)
        });
    }

    /// Makes top-level vdev `vdev` a hole (a log device removed): no children from now on.
    /// Returns its leaves, whose labels the caller clears once the tree is recorded.
    pub(crate) fn make_hole(&self, vdev: VdevId) -> Vec<Arc<Leaf>> {
        let top = self.top(vdev).expect("the vdev exists");
        let leaves: Vec<Arc<Leaf>> = top.leaves().collect();
        self.swap_shape(
            top,
            Shape {
                kind: TopVdevKind::Hole,
                children: vec![],
            },
        );
        leaves
    }

    /// Swaps `next` in as `top`'s shape, counted as a service change: every change of a
    /// vdev's members (attach, replace, detach, a spare) passes here.
    pub(crate) fn swap_shape(&self, top: &TopVdev, next: Shape) {
        self.service_change(|| top.set_shape(next));
    }

    /// The figure [`VdevTree::note_sync_started`] raises, for the txg engine to raise as it
    /// closes a txg: writers' blocks are born in the next one from then, before the closed
    /// txg's sync begins, and a missed range measured up to the open txg
    /// ([`VdevTree::last_written`]) must cover them.
    pub(crate) fn sync_started_handle(&self) -> Arc<AtomicU64> {
        self.sync_started.clone()
    }

    /// [`VdevTree::swap_shape`] for a shape that adds a member (attach, replace, a spare
    /// stepping in). Until the txg that records it is durable, [`VdevTree::in_service_since`]
    /// is false for every stamp: a write that only the new member took (the old one failing
    /// it, or out of service) is acknowledged as durable, yet an import after a crash reads
    /// the shape before, which does not know that member. So the intent log's writes count
    /// only from then on, and its commits wait for that txg meanwhile. The txg is the one
    /// after the last whose sync began, read once the shape is in: a sync under way may have
    /// taken the shape before, and one that begins after that read takes the new one (the
    /// fence pairs with the one in [`VdevTree::note_sync_started`]). Until it is recorded,
    /// `members_adding` says a change is under way.
    pub(crate) fn swap_shape_adding(&self, top: &TopVdev, next: Shape) {
        self.members_adding.fetch_add(1, Ordering::SeqCst);
        self.swap_shape(top, next);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.members_added_txg
            .fetch_max(self.last_written().0, Ordering::SeqCst);
        self.members_adding.fetch_sub(1, Ordering::SeqCst);
    }

    /// Appends a top-level vdev (its id must be the next one). The caller serializes
    /// appends (one configuration change at a time); readers see the vdev from now on.
    /// Gives it back if the tree is full.
    pub fn push(&self, top: TopVdev) -> std::result::Result<(), TopVdev> {
        let len = self.tops.len.load(Ordering::Acquire);
        if len >= TOP_VDEVS_MAX {
            return Err(top);
        }
        assert_eq!(
            top.id.0 as usize, len,
            "top-level vdevs are appended in id order"
        );
        self.tops.slots[len].set(top)?;
        self.tops.len.store(len + 1, Ordering::Release);
        Ok(())
    }

    /// Keeps the first `len` top-level vdevs (at import, before the tree is shared: vdevs the
    /// labels know but the pool's metadata does not were never committed).
    pub fn truncate(&mut self, len: usize) {
        let old = *self.tops.len.get_mut();
        for slot in &mut self.tops.slots[len.min(old)..old] {
            slot.take();
        }
        *self.tops.len.get_mut() = len.min(old);
    }

    /// Gives each top-level vdev the children, pairs and kind `config` records, and the
    /// tree its spares (at import: the pool's metadata is the truth; labels only helped find
    /// the devices). A member's leaf is the one the tree has with its guid, else `find`'s.
    pub fn reshape(
        &mut self,
        config: &VdevTreeConfig,
        find: &dyn Fn(Guid) -> Option<Arc<Leaf>>,
    ) -> Result<()> {
        // One leaf per guid: a spare in use is both in a pair and among the spares.
        let known = std::cell::RefCell::new(self.leaves().collect::<Vec<Arc<Leaf>>>());
        let find = |g: Guid| {
            let hit = known.borrow().iter().find(|l| l.guid == g).cloned();
            hit.or_else(|| {
                let leaf = find(g)?;
                known.borrow_mut().push(leaf.clone());
                Some(leaf)
            })
        };
        let len = *self.tops.len.get_mut();
        for (slot, cfg) in self.tops.slots[..len].iter_mut().zip(&config.top) {
            // A vdev removed since the labels that built it were written: a hole now, with
            // no size and no log flag.
            // The labels that built the vdev may be older or newer than the metadata (a log
            // vdev removed since, or a removal whose txg never committed): where they differ
            // in more than the children, the vdev is built again as the metadata says.
            let same = slot.get().is_some_and(|t| {
                t.asize_bytes == cfg.asize_bytes
                    && t.log == cfg.log
                    && t.is_hole() == (cfg.kind == TopVdevKind::Hole)
                    && t.raidz.is_some() == cfg.kind.raidz().is_some()
            });
            if same {
                if let Some(top) = slot.get_mut() {
                    top.set_shape(Shape::from_config(cfg, &find));
                }
            } else {
                slot.take();
                let _ = slot.set(TopVdev::with_leaves(cfg, &find)?);
            }
        }
        *self.spares.get_mut().unwrap() = config
            .spares
            .iter()
            .map(|c| Member {
                config: c.clone(),
                leaf: find(c.guid),
            })
            .collect();
        Ok(())
    }

    /// Top-level vdevs, in id order.
    pub fn tops(&self) -> impl Iterator<Item = &TopVdev> {
        self.tops.iter()
    }

    /// Number of top-level vdevs.
    pub fn top_count(&self) -> usize {
        self.tops.len.load(Ordering::Acquire)
    }

    /// The top-level vdev a DVA names, if it exists.
    pub fn top(&self, vdev: VdevId) -> Option<&TopVdev> {
        let i = vdev.0 as usize;
        if i < self.tops.len.load(Ordering::Acquire) {
            self.tops.slots[i].get()
        } else {
            None
        }
    }

    /// Every present leaf of the top-level vdevs (spares not in use aside).
    pub fn leaves(&self) -> impl Iterator<Item = Arc<Leaf>> + '_ {
        self.tops().flat_map(|t| t.leaves())
    }

    /// The tree as the pool's metadata and labels record it.
    pub fn config(&self) -> VdevTreeConfig {
        VdevTreeConfig {
            top: self.tops().map(TopVdev::config).collect(),
            spares: self
                .spares
                .lock()
                .unwrap()
                .iter()
                .map(|m| m.config.clone())
                .collect(),
        }
    }
}

/// A seed for the random draws of fault injection.
pub(crate) fn seed() -> u64 {
    let mut g = [0u8; 8];
    // SAFETY: getrandom writes at most `g.len()` bytes into the valid buffer.
    let n = unsafe { libc::getrandom(g.as_mut_ptr().cast(), g.len(), 0) };
    if n == 8 {
        u64::from_le_bytes(g)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_io::MemoryBackend;

    fn leaf(name: &str, guid: u64) -> Option<Arc<Leaf>> {
        Some(Arc::new(Leaf::new(
            Guid(guid),
            Arc::new(MemoryBackend::new(name, 64 << 20)),
        )))
    }

    /// The configuration of a 64 MiB test device `dev<guid>`.
    fn leaf_config(guid: u64) -> LeafConfig {
        LeafConfig {
            guid: Guid(guid),
            path: format!("dev{guid}"),
            size_bytes: 64 << 20,
        }
    }

    #[test]
    fn mirror_writes_every_present_child_and_rotates_reads() {
        let child = leaf_config;
        let config = TopVdevConfig {
            id: VdevId(0),
            kind: TopVdevKind::Mirror,
            children: vec![child(1), child(2), child(3)],
            asize_bytes: 1 << 20,
            log: false,
            pairs: Vec::new(),
        };
        let top = TopVdev::new(&config, vec![leaf("a", 1), None, leaf("c", 3)]).unwrap();
        let dva = Dva {
            vdev: VdevId(0),
            offset_bytes: 8192,
            asize_bytes: 4096,
        };
        let w: Vec<LeafIo> = top.plan_write(&dva).collect();
        assert_eq!(w.len(), 2);
        assert!(w
            .iter()
            .all(|io| io.offset_bytes == DATA_START_BYTES + 8192));
        let firsts: Vec<_> = (0..6)
            .map(|_| top.plan_read(&dva).next().unwrap().leaf.name().to_string())
            .collect();
        assert!(firsts.contains(&"a".to_string()) && firsts.contains(&"c".to_string()));
        assert!(top.plan_read(&dva).count() == 2);
        assert_eq!(top.config(), config);
    }

    #[test]
    fn raidz_widths_fit_the_largest_block_in_a_slab() {
        assert_eq!(
            (raidz_width_min(1), raidz_width_min(2), raidz_width_min(3)),
            (2, 5, 7)
        );
        for p in 1..=3 {
            let w = raidz_width_min(p);
            let fits = |w| RaidzLayout::new(w, p).unwrap().asize_bytes(128 << 10) <= SLAB_BYTES;
            assert!(fits(w) && (w == p + 1 || !fits(w - 1)));
        }
    }

    #[test]
    fn a_raidz_top_plans_no_whole_copies() {
        let child = leaf_config;
        let config = TopVdevConfig {
            id: VdevId(0),
            kind: TopVdevKind::Raidz(RaidzConfig {
                parity: 1,
                sector_shift: 12,
                epochs: vec![oxpool_format::RaidzEpoch {
                    first_txg: oxpool_format::Txg(1),
                    width: 3,
                }],
            }),
            children: vec![child(1), child(2), child(3)],
            asize_bytes: 3 << 20,
            log: false,
            pairs: Vec::new(),
        };
        let top = TopVdev::new(&config, vec![leaf("a", 1), leaf("b", 2), leaf("c", 3)]).unwrap();
        let dva = Dva {
            vdev: VdevId(0),
            offset_bytes: 0,
            asize_bytes: 8192,
        };
        assert_eq!(top.plan_write(&dva).count(), 0);
        assert_eq!(top.plan_read(&dva).count(), 0);
        assert_eq!(top.raidz_layout().unwrap().width(), 3);
        assert_eq!(top.group_name().unwrap(), "raidz1-0");
        let mut bad = config.clone();
        bad.children.pop();
        assert!(TopVdev::new(&bad, vec![leaf("a", 1), leaf("b", 2)]).is_err());
    }

    #[test]
    fn tops_are_appended_in_order_and_bounded() {
        let cfg = |id: u32| TopVdevConfig {
            id: VdevId(id),
            kind: TopVdevKind::Single,
            children: vec![LeafConfig {
                guid: Guid(u64::from(id) + 1),
                path: format!("d{id}"),
                size_bytes: 64 << 20,
            }],
            asize_bytes: 1 << 20,
            log: false,
            pairs: Vec::new(),
        };
        let mut tree = VdevTree::new(vec![TopVdev::new(&cfg(0), vec![leaf("d0", 1)]).unwrap()]);
        let first: *const TopVdev = tree.top(VdevId(0)).unwrap();
        for id in 1..TOP_VDEVS_MAX as u32 {
            tree.push(TopVdev::new(&cfg(id), vec![leaf("d", 9)]).unwrap())
                .unwrap();
        }
        // Appending never moved the first one (references to it stay valid).
        assert!(std::ptr::eq(first, tree.top(VdevId(0)).unwrap()));
        assert_eq!(tree.top_count(), TOP_VDEVS_MAX);
        assert!(tree
            .push(TopVdev::new(&cfg(TOP_VDEVS_MAX as u32), vec![leaf("x", 1)]).unwrap())
            .is_err());
        assert!(tree.top(VdevId(TOP_VDEVS_MAX as u32)).is_none());
        tree.truncate(2);
        assert_eq!(tree.top_count(), 2);
        assert_eq!(tree.config().top, vec![cfg(0), cfg(1)]);
        assert!(tree.top(VdevId(2)).is_none());
    }

    /// A replacing pair: writes go to both members, reads to the member that lacks nothing
    /// for the block (the old one while the new one lacks txgs 1-9), then to either.
    #[test]
    fn a_pair_is_written_on_both_and_read_from_the_member_that_has_the_block() {
        let child = leaf_config;
        let config = TopVdevConfig {
            id: VdevId(0),
            kind: TopVdevKind::Single,
            children: vec![child(1)],
            asize_bytes: 1 << 20,
            log: false,
            pairs: vec![PairConfig {
                child: 0,
                kind: PairKind::Replacing,
                leaf: child(2),
            }],
        };
        let (a, b) = (leaf("a", 1).unwrap(), leaf("b", 2).unwrap());
        let found = [a.clone(), b.clone()];
        let top = TopVdev::with_leaves(&config, &|g| found.iter().find(|l| l.guid == g).cloned())
            .unwrap();
        assert_eq!(top.config(), config);
        b.health.note_missed(Txg(1), Txg(9));
        let dva = Dva {
            vdev: VdevId(0),
            offset_bytes: 0,
            asize_bytes: 4096,
        };
        assert_eq!(top.plan_write(&dva).count(), 2);
        let shape = top.shape();
        assert_eq!(
            shape.children[0].for_read(Some(Txg(5))).unwrap().name(),
            "a"
        );
        assert_eq!(shape.children[0].for_read(None).unwrap().name(), "a");
        assert!(shape.children[0].whole() && !shape.children[0].whole_without(&a));
        // The old member out: the new one is read (a raidz then treats it as stale).
        a.health
            .take_out(LeafState::Offline, "test".into(), Txg(10), false);
        assert_eq!(
            shape.children[0].for_read(Some(Txg(5))).unwrap().name(),
            "b"
        );
        assert!(!shape.children[0].whole());
        // A change swaps the shape; the one read before stays as it was.
        let mut next = shape.clone();
        next.children[0].new = None;
        top.set_shape(next);
        assert!(top.shape().children[0].new.is_none());
        assert!(shape.children[0].new.is_some());
    }
}
