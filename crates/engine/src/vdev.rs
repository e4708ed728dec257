//! The vdev tree: top-level vdevs (a single device or an n-way mirror) striped together.
//!
//! The tree plans and never issues I/O: given a block address (a [`Dva`]) it says which leaf
//! devices to write and in which order to try reads. The pipeline (`pipeline.rs`) executes the
//! plans; that keeps this logic pure and testable without devices.

use crate::completion::{CompletionControl, CompletionPolicy};
use crate::iostats::LeafIoStats;
use crate::vdev_queue::VdevQueue;
use oxpool_format::{Dva, Guid, TopVdevKind, VdevId, DATA_START_BYTES};
use oxpool_io::Backend;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

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
    /// A top-level vdev over `children`.
    pub fn new(
        id: VdevId,
        kind: TopVdevKind,
        children: Vec<Option<Arc<Leaf>>>,
        asize_bytes: u64,
        log: bool,
    ) -> TopVdev {
        debug_assert!(!children.is_empty());
        debug_assert!(kind == TopVdevKind::Mirror || children.len() == 1);
        TopVdev {
            id,
            kind,
            children,
            asize_bytes,
            log,
            read_rotor: AtomicUsize::new(0),
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

/// The pool's vdevs.
#[derive(Debug)]
pub struct VdevTree {
    /// Top-level vdevs, striped.
    pub tops: Vec<TopVdev>,
    /// Where completions of this pool's leaf I/Os run (the `completion` property).
    pub completion: CompletionControl,
}

impl VdevTree {
    /// A tree of `tops` whose completions follow `policy`.
    pub fn new(tops: Vec<TopVdev>, policy: CompletionPolicy) -> VdevTree {
        VdevTree {
            tops,
            completion: CompletionControl::new(policy),
        }
    }

    /// The top-level vdev a DVA names, if it exists.
    pub fn top(&self, vdev: VdevId) -> Option<&TopVdev> {
        self.tops.get(vdev.0 as usize)
    }

    /// Every present leaf.
    pub fn leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.tops.iter().flat_map(|t| t.leaves())
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
        let top = TopVdev::new(
            VdevId(0),
            TopVdevKind::Mirror,
            vec![leaf("a", 1), None, leaf("c", 3)],
            1 << 20,
            false,
        );
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
    }
}
