//! A volume's block tree: indirect blocks map volume block numbers to data blocks.
//!
//! Level-1 indirect blocks hold the data blocks' pointers; a level-L block holds pointers to
//! level L-1 blocks; the volume's root pointer names the single top block. A hole pointer
//! anywhere means "all zeros below". Indirect blocks are cached in memory by position
//! (level, index). Only the txg sync thread changes the tree (it applies a txg's dirty blocks);
//! every change bumps a generation number, and a block loaded from disk by a reader is cached
//! only if the generation did not move while it was read, so a reader can never cache a
//! stale copy of a block the sync thread just rewrote.

use crate::idhash::IdMap;
use crate::vdev::queue::IoClass;
use crate::zio::{heal_if_current, read_block_unhealed, Zio};
use crate::{EngineError, Result};
use oxpool_format::{decode_indirect, encode_indirect, BlockPtr, INDIRECT_FANOUT};
use std::future::poll_fn;
use std::sync::Mutex;
use std::task::{Poll, Waker};

/// Pointers per indirect block.
pub const FANOUT: u64 = INDIRECT_FANOUT as u64;

/// Bound on retries when the tree changes under a reader (each retry follows a sync step).
const WALK_RETRIES_MAX: u32 = 1000;

/// The smallest number of levels whose tree addresses `nblocks` data blocks (at least 1).
pub fn levels_for(nblocks: u64) -> u8 {
    let mut levels = 1u8;
    let mut cap = FANOUT;
    while cap < nblocks {
        cap = cap.saturating_mul(FANOUT);
        levels += 1;
    }
    levels
}

/// Data blocks a tree of `levels` levels can address.
pub fn capacity(levels: u8) -> u64 {
    FANOUT.saturating_pow(levels as u32)
}

fn span(level: u8) -> u64 {
    FANOUT.saturating_pow(level as u32)
}

/// Index of the level-`level` block covering data block `b`, and the slot in it on `b`'s path.
fn position(b: u64, level: u8) -> (u64, usize) {
    debug_assert!(level >= 1);
    (b / span(level), ((b / span(level - 1)) % FANOUT) as usize)
}

/// One cached indirect block.
struct Cached {
    ptrs: Box<[BlockPtr; INDIRECT_FANOUT]>,
    dirty: bool,
    last_use: u64,
}

/// The in-memory state of a volume's tree.
pub struct BlockTree {
    levels: u8,
    root: BlockPtr,
    cache: IdMap<(u8, u64), Cached>,
    generation: u64,
    tick: u64,
    /// Indirect blocks a walker is reading from disk now, as (level, index): another walker
    /// that needs one waits for that read instead of issuing its own (as ZFS's ARC does with
    /// a read in progress). Without it, the 64 lookups of a 1 MiB read on a cold tree each
    /// read the same 32 KiB level-1 block: 2.9 bytes read from the device per byte served.
    /// As long as the most walkers ever in flight (no allocation once grown).
    loading: Vec<(u8, u64)>,
    /// Walkers waiting for one of `loading`: (level, index, waker).
    load_waiters: Vec<(u8, u64, Waker)>,
    /// Its dataset was destroyed (or the snapshot a view reads): its blocks' places may be
    /// freed and reused while it is still read, and no walk heals them ([`walk`]).
    retired: bool,
}

/// One step of a walk.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Done(Walk),
    Load {
        level: u8,
        idx: u64,
        ptr: BlockPtr,
        generation: u64,
    },
}

/// What a walk found.
#[derive(Debug, PartialEq, Eq)]
pub enum Walk {
    /// The block at the requested level is cached now.
    Cached,
    /// A hole at `level` covers the requested block: nothing below exists.
    Hole {
        /// Level of the hole pointer's target.
        level: u8,
    },
}

impl BlockTree {
    /// A tree with `levels` levels under `root`.
    pub fn new(levels: u8, root: BlockPtr) -> BlockTree {
        debug_assert!(levels >= 1);
        BlockTree {
            levels,
            root,
            cache: IdMap::default(),
            generation: 0,
            tick: 0,
            loading: Vec::new(),
            load_waiters: Vec::new(),
            retired: false,
        }
    }

    /// Its dataset is destroyed (or the snapshot a view reads): set before its blocks are
    /// freed, so that a walk that sees it clear may heal what it read ([`walk`]).
    pub fn retire(&mut self) {
        self.retired = true;
    }

    /// Makes this the tree of `levels` levels under `root` in place (a rollback, a receive's
    /// swap): every cached block goes, and the generation moves on instead of starting again,
    /// so a walker that began reading an indirect block of the old tree does not cache it in
    /// the new one (with a new `BlockTree` both generations could be 0). Walkers reading or
    /// waiting for a load keep their entries here: their claims end on this tree and wake
    /// their waiters, who then walk the new tree.
    pub fn reset(&mut self, levels: u8, root: BlockPtr) {
        debug_assert!(levels >= 1);
        debug_assert!(
            self.cache.values().all(|c| !c.dirty),
            "a tree replaced with changes not written"
        );
        self.levels = levels;
        self.root = root;
        self.cache.clear();
        self.generation += 1;
    }

    /// Number of indirect levels.
    pub fn levels(&self) -> u8 {
        self.levels
    }

    /// The root pointer as of the last write-back. Only meaningful when nothing is dirty.
    pub fn root(&self) -> BlockPtr {
        debug_assert!(!self.has_dirty(), "root read while the tree is dirty");
        self.root
    }

    /// Whether any cached block is dirty.
    pub fn has_dirty(&self) -> bool {
        self.cache.values().any(|c| c.dirty)
    }

    /// Cached indirect blocks (for memory accounting).
    pub fn cached_count(&self) -> usize {
        self.cache.len()
    }

    /// Bytes one cached block costs in memory.
    pub const CACHED_BLOCK_BYTES: usize = std::mem::size_of::<[BlockPtr; INDIRECT_FANOUT]>() + 64;

    /// Adds levels until the tree addresses `nblocks` (volume growth). The old top block
    /// becomes slot 0 of a new, dirty top block.
    pub fn grow_for(&mut self, nblocks: u64) {
        let want = levels_for(nblocks);
        while self.levels < want {
            let new_level = self.levels + 1;
            if !self.root.is_hole() || self.cache.contains_key(&(self.levels, 0)) {
                let mut ptrs = Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]);
                ptrs[0] = self.root;
                self.cache.insert(
                    (new_level, 0),
                    Cached {
                        ptrs,
                        dirty: true,
                        last_use: self.tick,
                    },
                );
                self.root = BlockPtr::HOLE;
            }
            self.levels = new_level;
            self.generation += 1;
        }
    }

    /// The pointer to block (level, idx): the root for the top block, else the parent's slot
    /// if the parent is cached.
    fn pointer_to(&self, level: u8, idx: u64) -> Option<BlockPtr> {
        // At or above the root's level only (level, 0) is the root: a walker of a tree that
        // a rollback replaced with a shallower one may ask for another.
        if level >= self.levels {
            return (level == self.levels && idx == 0).then_some(self.root);
        }
        self.cache
            .get(&(level + 1, idx / FANOUT))
            .map(|c| c.ptrs[(idx % FANOUT) as usize])
    }

    /// One step of a walk toward block `b` at `stop_level`: done, or the block to load from
    /// disk (with the generation to check when it is inserted).
    fn step(&mut self, b: u64, stop_level: u8, create: bool) -> Step {
        if b >= capacity(self.levels) {
            return Step::Done(Walk::Hole {
                level: self.levels + 1,
            });
        }
        self.tick += 1;
        let mut ptr = self.root;
        for level in (stop_level..=self.levels).rev() {
            let (idx, slot) = position(b, level);
            if let Some(c) = self.cache.get_mut(&(level, idx)) {
                c.last_use = self.tick;
                if level == stop_level {
                    return Step::Done(Walk::Cached);
                }
                ptr = c.ptrs[slot];
                continue;
            }
            if ptr.is_hole() {
                if !create {
                    return Step::Done(Walk::Hole { level });
                }
                // The sync thread is about to put something under a hole: start the block
                // empty and dirty; write-back gives it a pointer in its parent.
                self.cache.insert(
                    (level, idx),
                    Cached {
                        ptrs: Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]),
                        dirty: true,
                        last_use: self.tick,
                    },
                );
                self.generation += 1;
                if level == stop_level {
                    return Step::Done(Walk::Cached);
                }
                ptr = BlockPtr::HOLE;
                continue;
            }
            return Step::Load {
                level,
                idx,
                ptr,
                generation: self.generation,
            };
        }
        unreachable!("the loop returns at stop_level")
    }

    fn insert_loaded(
        &mut self,
        level: u8,
        idx: u64,
        ptrs: Box<[BlockPtr; INDIRECT_FANOUT]>,
        generation: u64,
    ) {
        // Stale if any tree change happened while the block was read.
        if self.generation == generation && !self.cache.contains_key(&(level, idx)) {
            self.cache.insert(
                (level, idx),
                Cached {
                    ptrs,
                    dirty: false,
                    last_use: self.tick,
                },
            );
        }
    }

    /// The data pointer of block `b`, if its level-1 block is cached (or a hole covers it).
    pub fn cached_data_ptr(&self, b: u64) -> Option<BlockPtr> {
        if b >= capacity(self.levels) {
            return Some(BlockPtr::HOLE);
        }
        let (idx, slot) = position(b, 1);
        self.cache.get(&(1, idx)).map(|c| c.ptrs[slot])
    }

    /// Sets the pointer in `slot` of cached block (level, idx) and marks it dirty; returns the
    /// old pointer. Panics if the block is not cached (callers walk with `create` first).
    pub fn set_slot(&mut self, level: u8, idx: u64, slot: usize, ptr: BlockPtr) -> BlockPtr {
        let c = self
            .cache
            .get_mut(&(level, idx))
            .expect("set_slot on a block that is not cached");
        let old = std::mem::replace(&mut c.ptrs[slot], ptr);
        c.dirty = true;
        self.generation += 1;
        old
    }

    /// Sets data block `b`'s pointer; its level-1 block must be cached. Returns the old one.
    pub fn set_data_ptr(&mut self, b: u64, ptr: BlockPtr) -> Option<BlockPtr> {
        let (idx, slot) = position(b, 1);
        self.cache
            .contains_key(&(1, idx))
            .then(|| self.set_slot(1, idx, slot, ptr))
    }

    /// Clears the data pointers of blocks [b, end) inside one cached level-1 block, returning
    /// the non-hole pointers removed.
    pub fn clear_data_range(&mut self, b: u64, end: u64, removed: &mut Vec<BlockPtr>) -> bool {
        let (idx, first_slot) = position(b, 1);
        let Some(c) = self.cache.get_mut(&(1, idx)) else {
            return false;
        };
        let last = ((idx + 1) * FANOUT).min(end);
        let mut changed = false;
        for s in first_slot..first_slot + (last - b) as usize {
            if !c.ptrs[s].is_hole() {
                removed.push(std::mem::replace(&mut c.ptrs[s], BlockPtr::HOLE));
                changed = true;
            }
        }
        if changed {
            c.dirty = true;
            self.generation += 1;
        }
        true
    }

    /// Indices of the dirty blocks at `level`.
    pub fn dirty_at(&self, level: u8) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .cache
            .iter()
            .filter(|(k, c)| k.0 == level && c.dirty)
            .map(|(k, _)| k.1)
            .collect();
        v.sort_unstable();
        v
    }

    /// Encodes dirty block (level, idx) into `out`; returns its fill (data blocks below).
    pub fn encode_block(&self, level: u8, idx: u64, out: &mut [u8]) -> u64 {
        let c = &self.cache[&(level, idx)];
        debug_assert!(c.dirty);
        encode_indirect(level, &c.ptrs[..], out);
        c.ptrs.iter().map(|p| p.fill).sum()
    }

    /// After block (level, idx) was written at `ptr` (or became a hole): marks it clean and
    /// stores `ptr` in its parent (or the root). Returns the pointer it replaced, to free.
    /// A parent that is not cached is reported as Err(()) so the caller can load it first.
    #[allow(clippy::result_unit_err)]
    pub fn finish_block(
        &mut self,
        level: u8,
        idx: u64,
        ptr: BlockPtr,
    ) -> std::result::Result<BlockPtr, ()> {
        let old = if level == self.levels {
            std::mem::replace(&mut self.root, ptr)
        } else {
            let pidx = idx / FANOUT;
            if !self.cache.contains_key(&(level + 1, pidx)) {
                return Err(());
            }
            self.set_slot(level + 1, pidx, (idx % FANOUT) as usize, ptr)
        };
        if ptr.is_hole() {
            self.cache.remove(&(level, idx));
        } else if let Some(c) = self.cache.get_mut(&(level, idx)) {
            c.dirty = false;
        }
        self.generation += 1;
        Ok(old)
    }

    /// Drops clean blocks, least recently used first, until at most `max_blocks` remain.
    pub fn evict(&mut self, max_blocks: usize) {
        if self.cache.len() <= max_blocks {
            return;
        }
        let mut clean: Vec<(u64, (u8, u64))> = self
            .cache
            .iter()
            .filter(|(_, c)| !c.dirty)
            .map(|(k, c)| (c.last_use, *k))
            .collect();
        clean.sort_unstable();
        let excess = self.cache.len() - max_blocks;
        for (_, k) in clean.into_iter().take(excess) {
            self.cache.remove(&k);
        }
    }

    /// The level of the first block on data block `b`'s path, from the root down, that is not
    /// cached (its parent is), or None if the path is cached down to `b`'s level-1 block
    /// (or a hole covers it). Right after a lookup of `b` failed to read a block, that is the
    /// block it could not read (unless an eviction came between: then a block above it).
    pub fn first_uncached_level(&mut self, b: u64) -> Option<u8> {
        match self.step(b, 1, false) {
            Step::Load { level, .. } => Some(level),
            Step::Done(_) => None,
        }
    }

    /// Every block pointer reachable in the cache plus the root (for destroy).
    pub fn pointer_to_block(&self, level: u8, idx: u64) -> Option<BlockPtr> {
        self.pointer_to(level, idx)
    }
}

/// Walks toward data block `b` until the level-`stop_level` block on its path is cached,
/// loading missing blocks from disk as I/Os of `class`. With `create`, missing blocks under holes are created
/// empty (sync thread only).
pub async fn walk(
    tree: &Mutex<BlockTree>,
    zio: &Zio,
    class: IoClass,
    b: u64,
    stop_level: u8,
    create: bool,
    what: &(impl std::fmt::Display + ?Sized),
) -> Result<Walk> {
    for _ in 0..WALK_RETRIES_MAX {
        // (the load to do, or None to wait for another walker's load of `.1`)
        let (load, key) = {
            let mut t = tree.lock().unwrap();
            match t.step(b, stop_level, create) {
                Step::Done(w) => return Ok(w),
                Step::Load { level, idx, .. } if t.loading.contains(&(level, idx)) => {
                    (None, (level, idx))
                }
                Step::Load {
                    level,
                    idx,
                    ptr,
                    generation,
                } => {
                    t.loading.push((level, idx));
                    (Some((ptr, generation)), (level, idx))
                }
            }
        };
        let (level, idx) = key;
        let Some((ptr, generation)) = load else {
            wait_for_load(tree, level, idx).await;
            continue; // The block is cached now, or that read failed: step again.
        };
        // Ends the claim however this walk ends (read error, corrupt block, dropped future).
        let claim = LoadClaim { tree, level, idx };
        // Bad copies are rewritten below, once the block is known to be still current.
        let (buf, bad) = read_block_unhealed(
            zio,
            class,
            &ptr,
            &format!("{what} indirect block L{level}/{idx}"),
        )
        .await?;
        let mut ptrs = Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]);
        let got_level =
            decode_indirect(&buf[..ptr.psize_bytes as usize], &mut ptrs).map_err(|e| {
                EngineError::Corrupt {
                    device: what.to_string(),
                    what: format!("indirect block L{level}/{idx}"),
                    source: e,
                }
            })?;
        if got_level != level {
            return Err(EngineError::invalid(format!(
                "{what}: indirect block L{level}/{idx} says it is level {got_level}"
            )));
        }
        {
            let mut t = tree.lock().unwrap();
            t.insert_loaded(level, idx, ptrs, generation);
            claim.end(&mut t);
        }
        std::mem::forget(claim);
        // Healed only if the tree still points there, and is not retired (a retired tree's
        // pointers never change, so the check would say nothing).
        heal_if_current(zio, ptr.dvas(), &bad, &buf, async {
            let t = tree.lock().unwrap();
            !t.retired && t.pointer_to(level, idx) == Some(ptr)
        })
        .await;
    }
    Err(EngineError::invalid(format!(
        "{what}: block tree kept changing during a lookup of block {b}"
    )))
}

/// A walker's claim on reading indirect block (level, idx) (see `BlockTree::loading`).
struct LoadClaim<'a> {
    tree: &'a Mutex<BlockTree>,
    level: u8,
    idx: u64,
}

impl LoadClaim<'_> {
    /// Ends the claim and wakes the walkers waiting for it.
    fn end(&self, t: &mut BlockTree) {
        let key = (self.level, self.idx);
        let at = t.loading.iter().position(|k| *k == key);
        debug_assert!(at.is_some(), "a load claim outlived its entry");
        if let Some(at) = at {
            t.loading.swap_remove(at);
        }
        // Bounded by the waiters; woken under the lock, which a waker only queues a task under.
        let mut i = 0;
        while i < t.load_waiters.len() {
            if (t.load_waiters[i].0, t.load_waiters[i].1) == key {
                t.load_waiters.swap_remove(i).2.wake();
            } else {
                i += 1;
            }
        }
    }
}

impl Drop for LoadClaim<'_> {
    fn drop(&mut self) {
        // Only on an early end: the normal one ends the claim itself and forgets the guard.
        if let Ok(mut t) = self.tree.lock() {
            self.end(&mut t);
        }
    }
}

/// Waits until no walker is reading indirect block (level, idx).
async fn wait_for_load(tree: &Mutex<BlockTree>, level: u8, idx: u64) {
    poll_fn(|cx| {
        let mut t = tree.lock().unwrap();
        if !t.loading.contains(&(level, idx)) {
            return Poll::Ready(());
        }
        let waker = cx.waker();
        let mine = t
            .load_waiters
            .iter()
            .any(|(l, i, w)| (*l, *i) == (level, idx) && w.will_wake(waker));
        if !mine {
            t.load_waiters.push((level, idx, waker.clone()));
        }
        Poll::Pending
    })
    .await
}

/// The pointer of data block `b` (a hole if nothing was written there), read as I/Os of `class`.
pub async fn lookup(
    tree: &Mutex<BlockTree>,
    zio: &Zio,
    class: IoClass,
    b: u64,
    what: &(impl std::fmt::Display + ?Sized),
) -> Result<BlockPtr> {
    for _ in 0..WALK_RETRIES_MAX {
        if let Some(p) = tree.lock().unwrap().cached_data_ptr(b) {
            return Ok(p);
        }
        match walk(tree, zio, class, b, 1, false, what).await? {
            Walk::Hole { .. } => return Ok(BlockPtr::HOLE),
            Walk::Cached => continue,
        }
    }
    Err(EngineError::invalid(format!(
        "{what}: level-1 block of block {b} kept being evicted"
    )))
}

/// Start of the next subtree after a hole found at `level` on the path of block `b`.
pub fn skip_hole(b: u64, level: u8) -> u64 {
    let s = span(level);
    (b / s).saturating_add(1).saturating_mul(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_positions() {
        assert_eq!(levels_for(1), 1);
        assert_eq!(levels_for(255), 1);
        assert_eq!(levels_for(256), 2);
        assert_eq!(levels_for(255 * 255 + 1), 3);
        assert_eq!(position(0, 1), (0, 0));
        assert_eq!(position(256, 1), (1, 1));
        assert_eq!(position(256, 2), (0, 1));
        assert_eq!(skip_hole(300, 1), 510);
        assert_eq!(skip_hole(300, 2), 255 * 255);
    }

    #[test]
    fn create_set_and_finish_marks_clean() {
        let mut t = BlockTree::new(2, BlockPtr::HOLE);
        assert_eq!(t.step(600, 1, false), Step::Done(Walk::Hole { level: 2 }));
        assert_eq!(t.step(600, 1, true), Step::Done(Walk::Cached));
        assert_eq!(t.dirty_at(1), vec![2]);
        assert_eq!(t.dirty_at(2), vec![0]);
        let p = BlockPtr {
            fill: 1,
            ..BlockPtr::HOLE
        };
        t.set_data_ptr(600, p);
        assert_eq!(t.cached_data_ptr(600), Some(p));
        // An all-hole block becomes a hole in its parent and leaves the cache.
        let old = t.finish_block(1, 2, BlockPtr::HOLE).unwrap();
        assert!(old.is_hole());
        assert_eq!(t.cached_data_ptr(600), None);
    }

    #[test]
    fn a_load_begun_before_a_reset_is_not_cached_after_it() {
        let mut t = BlockTree::new(2, BlockPtr::HOLE);
        let old_root = BlockPtr {
            ndvas: 1,
            fill: 1,
            ..BlockPtr::HOLE
        };
        t.reset(2, old_root);
        // A walker of the old tree's block L1/0 (its claim taken as `walk` does).
        let Step::Load {
            level, generation, ..
        } = t.step(0, 1, false)
        else {
            panic!("L2/0 is not cached: it must be loaded")
        };
        assert_eq!(level, 2);
        t.loading.push((2, 0));
        // A rollback's swap meanwhile; the new tree is empty.
        t.reset(2, BlockPtr::HOLE);
        t.insert_loaded(2, 0, Box::new([old_root; INDIRECT_FANOUT]), generation);
        assert!(
            !t.cache.contains_key(&(2, 0)),
            "the old tree's block cached"
        );
        assert_eq!(t.step(0, 1, false), Step::Done(Walk::Hole { level: 2 }));
        // The claim is still there to end (and its waiters to wake).
        assert_eq!(t.loading, [(2, 0)]);
    }

    #[test]
    fn stale_loads_are_not_cached() {
        let mut t = BlockTree::new(1, BlockPtr::HOLE);
        let g = t.generation;
        t.grow_for(300);
        t.insert_loaded(1, 0, Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]), g);
        assert!(!t.cache.contains_key(&(1, 0)));
    }
}
