//! The vdev tree: top-level vdevs (a single device or an n-way mirror) striped together.
//!
//! The tree plans and never issues I/O: given a block address (a [`Dva`]) it says which leaf
//! devices to write and in which order to try reads. The pipeline (`pipeline.rs`) executes the
//! plans; that keeps this logic pure and testable without devices.

pub mod alloc;
pub mod label;
mod leaf_io;
pub mod queue;
pub mod raidz;
mod stats;

pub use stats::{DeviceErrors, DeviceStats};

use crate::iostats::LeafIoStats;
use crate::vdev::queue::VdevQueue;
use oxpool_format::{
    Dva, Guid, LeafConfig, TopVdevConfig, TopVdevKind, VdevId, VdevTreeConfig, DATA_START_BYTES,
};
use oxpool_io::Backend;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Most top-level vdevs a pool can have (the bound of the append-only list; a pool's labels
/// could not describe many more).
pub const TOP_VDEVS_MAX: usize = 256;

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
        }
    }

    /// The device's name (its path).
    pub fn name(&self) -> &str {
        self.backend.name()
    }
}

/// A top-level vdev: a single leaf or a mirror of leaves. A missing mirror child is `None`.
#[derive(Debug)]
pub struct TopVdev {
    /// Index in the pool.
    pub id: VdevId,
    /// Single or mirror.
    pub kind: TopVdevKind,
    /// Children in configuration order; `None` where the device was not found at import.
    pub children: Vec<Option<Arc<Leaf>>>,
    /// Allocatable bytes (the same on every child).
    pub asize_bytes: u64,
    /// A separate intent-log device (holds log blocks only).
    pub log: bool,
    /// The children as configured (guid, path, size), present or not: with the fields above,
    /// what the pool's metadata and labels record of this vdev.
    pub leaf_configs: Vec<LeafConfig>,
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

impl TopVdev {
    /// The top-level vdev `config` describes, over `children` (in the order of its children's
    /// configurations; `None` where a device is missing).
    pub fn new(config: &TopVdevConfig, children: Vec<Option<Arc<Leaf>>>) -> TopVdev {
        debug_assert!(!children.is_empty());
        debug_assert_eq!(children.len(), config.children.len());
        debug_assert!(config.kind == TopVdevKind::Mirror || children.len() == 1);
        TopVdev {
            id: config.id,
            kind: config.kind.clone(),
            children,
            asize_bytes: config.asize_bytes,
            log: config.log,
            leaf_configs: config.children.clone(),
            read_rotor: AtomicUsize::new(0),
        }
    }

    /// What the pool's metadata records of this vdev.
    pub fn config(&self) -> TopVdevConfig {
        TopVdevConfig {
            id: self.id,
            kind: self.kind.clone(),
            children: self.leaf_configs.clone(),
            asize_bytes: self.asize_bytes,
            log: self.log,
        }
    }

    /// The leaves present (for flushes, labels, status).
    pub fn leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.children.iter().flatten()
    }

    /// Leaf I/Os that write the block at `dva`: one per present child (a mirror writes all).
    /// An iterator, not a collection: planning allocates nothing.
    pub fn plan_write(&self, dva: &Dva) -> impl Iterator<Item = LeafIo> + '_ {
        debug_assert_eq!(dva.vdev, self.id);
        let offset_bytes = DATA_START_BYTES + dva.offset_bytes;
        self.leaves().map(move |leaf| LeafIo {
            leaf: leaf.clone(),
            offset_bytes,
        })
    }

    /// Leaf I/Os that can read the block at `dva`, in the order to try them: each read goes to
    /// one side, and the others are the fallbacks on an error or a checksum mismatch. An
    /// iterator, not a collection: planning allocates nothing.
    pub fn plan_read(&self, dva: &Dva) -> impl Iterator<Item = LeafIo> + '_ {
        debug_assert_eq!(dva.vdev, self.id);
        let offset_bytes = DATA_START_BYTES + dva.offset_bytes;
        let n = self.children.len();
        let first = self.read_rotor.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .filter_map(move |k| self.children[(first + k) % n].clone())
            .map(move |leaf| LeafIo { leaf, offset_bytes })
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
        };
        for top in tops {
            tree.push(top).expect("within TOP_VDEVS_MAX");
        }
        tree
    }

    /// Appends a top-level vdev (its id must be the next one). The caller serializes
    /// appends (one configuration change at a time); readers see the vdev from now on.
    /// Gives it back if the tree is full.
    pub fn push(&self, top: TopVdev) -> Result<(), TopVdev> {
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

    /// Replaces the recorded children's configurations of each top-level vdev (at import:
    /// the pool's metadata is the truth; labels only helped find the devices).
    pub fn set_leaf_configs(&mut self, config: &VdevTreeConfig) {
        let len = *self.tops.len.get_mut();
        for (slot, cfg) in self.tops.slots[..len].iter_mut().zip(&config.top) {
            if let Some(top) = slot.get_mut() {
                if top.leaf_configs.len() == cfg.children.len() {
                    top.leaf_configs = cfg.children.clone();
                }
            }
        }
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

    /// Every present leaf.
    pub fn leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.tops().flat_map(|t| t.leaves())
    }

    /// The tree as the pool's metadata and labels record it.
    pub fn config(&self) -> VdevTreeConfig {
        VdevTreeConfig {
            top: self.tops().map(TopVdev::config).collect(),
        }
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

    #[test]
    fn mirror_writes_every_present_child_and_rotates_reads() {
        let child = |guid: u64| LeafConfig {
            guid: Guid(guid),
            path: format!("dev{guid}"),
            size_bytes: 64 << 20,
        };
        let config = TopVdevConfig {
            id: VdevId(0),
            kind: TopVdevKind::Mirror,
            children: vec![child(1), child(2), child(3)],
            asize_bytes: 1 << 20,
            log: false,
        };
        let top = TopVdev::new(&config, vec![leaf("a", 1), None, leaf("c", 3)]);
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
        };
        let mut tree = VdevTree::new(vec![TopVdev::new(&cfg(0), vec![leaf("d0", 1)])]);
        let first: *const TopVdev = tree.top(VdevId(0)).unwrap();
        for id in 1..TOP_VDEVS_MAX as u32 {
            tree.push(TopVdev::new(&cfg(id), vec![leaf("d", 9)]))
                .unwrap();
        }
        // Appending never moved the first one (references to it stay valid).
        assert!(std::ptr::eq(first, tree.top(VdevId(0)).unwrap()));
        assert_eq!(tree.top_count(), TOP_VDEVS_MAX);
        assert!(tree
            .push(TopVdev::new(&cfg(TOP_VDEVS_MAX as u32), vec![leaf("x", 1)]))
            .is_err());
        assert!(tree.top(VdevId(TOP_VDEVS_MAX as u32)).is_none());
        tree.truncate(2);
        assert_eq!(tree.top_count(), 2);
        assert_eq!(tree.config().top, vec![cfg(0), cfg(1)]);
        assert!(tree.top(VdevId(2)).is_none());
    }
}
