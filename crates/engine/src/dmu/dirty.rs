//! The dirty state of an object: per txg not yet synced, the blocks written in it (whole, or
//! some sectors of them: [`DirtyBlock::Partial`], or whole and already in their stored form,
//! checksummed: [`DirtyBlock::Stored`]), the block ranges freed, a new size, and the
//! indirect blocks its sync will rewrite (charged to the txg's space once). Reads look at the
//! dirty sets (newest txg first) before the tree; the txg sync writes a txg's set and retires
//! it. What a retired set allocated is kept for the next txgs (`DirtySpares`), so that
//! steady-state writing allocates nothing.

use crate::dmu::tree::FANOUT;
use crate::idhash::{IdMap, IdSet};
use crate::props::VolumeProps;
use crate::sector_mask::{copy_runs, zero_runs, SectorMask};
use crate::vdev::alloc::ClassBytes;
pub use crate::zio::compress::StoredForm;
use oxpool_format::Txg;
use oxpool_io::IoBuf;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A block's content in one txg's dirty set.
pub(crate) enum DirtyBlock {
    /// New data, exactly one volume block long. Shared with the sync while it writes the
    /// block out (no copy); a later write to the open txg's copy is copy-on-write.
    Data(Arc<IoBuf>),
    /// The sectors in the mask were written in this txg (the buffer, one volume block long,
    /// holds them; its other bytes mean nothing); the other sectors are the block's content at
    /// the end of the previous txg. That is exactly what the tree holds when this txg syncs
    /// (txgs sync in order, and a block freed in this txg is never partial), so the sync
    /// reads the block from the tree and merges.
    Partial(Arc<IoBuf>, SectorMask),
    /// A whole block already in the form the pool stores it: a received block, as its sender
    /// stored it, or a block a client wrote whole that its writer found incompressible (or
    /// `compression=off`) and hashed on arrival (`compress::written_form`). The buffer holds
    /// its stored bytes, zero-padded to whole sectors. The sync writes them as they are (no
    /// compression, no checksum when `form` has the volume's checksum type); reads decode
    /// them (`StoredForm::content`).
    Stored(Arc<IoBuf>, StoredForm),
}

impl DirtyBlock {
    /// The block's buffer, whichever kind (the stored bytes for [`DirtyBlock::Stored`]).
    pub(crate) fn buf(&self) -> &Arc<IoBuf> {
        match self {
            DirtyBlock::Data(buf) | DirtyBlock::Partial(buf, _) | DirtyBlock::Stored(buf, _) => buf,
        }
    }

    pub(crate) fn into_buf(self) -> Arc<IoBuf> {
        match self {
            DirtyBlock::Data(buf) | DirtyBlock::Partial(buf, _) | DirtyBlock::Stored(buf, _) => buf,
        }
    }
}

/// The changes of one txg to one volume.
#[derive(Default)]
pub(crate) struct TxgDirty {
    /// Blocks written in this txg.
    pub blocks: IdMap<u64, DirtyBlock>,
    /// Block ranges freed (trim, write-zeroes, shrink) in this txg, applied before `blocks`:
    /// start -> end (exclusive), merged.
    pub frees: BTreeMap<u64, u64>,
    /// The volume's new size, if this txg changed it ([`Volume::resize`]).
    pub size_bytes: Option<u64>,
    /// Indirect blocks this txg's sync will rewrite, as `level << 56 | index`: each is charged
    /// to the txg's space once (see [`SpaceCosts`]).
    pub indirect: IdSet<u64>,
}

/// What the txg sync allocates for one block of a volume, by size class and with every copy:
/// the space a writer charges to its txg before the sync can run out of it (see
/// `pool::Spa::wait_for_space`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpaceCosts {
    /// One data block.
    pub data: ClassBytes,
    /// One indirect block.
    pub indirect: ClassBytes,
    /// Levels of indirect blocks above the data.
    pub levels: u8,
}

impl SpaceCosts {
    /// The costs for a volume with `props` and a tree of `levels` levels.
    pub(crate) fn new(props: &VolumeProps, levels: u8) -> SpaceCosts {
        let mut data = ClassBytes::default();
        data.add_blocks(
            u64::from(props.volblocksize_bytes),
            u64::from(props.copies),
            1,
        );
        let mut indirect = ClassBytes::default();
        indirect.add_blocks(
            oxpool_format::INDIRECT_BLOCK_BYTES as u64,
            indirect_copies(props) as u64,
            1,
        );
        SpaceCosts {
            data,
            indirect,
            levels,
        }
    }

    /// The most a change of blocks `first..=last` can cost: every block new to its txg, and
    /// every indirect block above them too.
    pub(crate) fn worst(&self, first: u64, last: u64) -> ClassBytes {
        let mut out = ClassBytes::default();
        for (c, n) in self.data.0.iter().zip(out.0.iter_mut()) {
            *n = c * (last - first + 1);
        }
        let mut span = 1u64;
        for _ in 1..=self.levels {
            span = span.saturating_mul(FANOUT);
            let count = last / span - first / span + 1;
            for (c, n) in self.indirect.0.iter().zip(out.0.iter_mut()) {
                *n += c * count;
            }
        }
        out
    }

    /// The most a free of a block range can cost: the indirect blocks above its two ends.
    pub(crate) fn worst_free(&self) -> ClassBytes {
        let mut out = ClassBytes::default();
        for _ in 0..2 * u32::from(self.levels) {
            out += self.indirect;
        }
        out
    }
}

/// Copies of a volume's indirect blocks: one more than its data, at most three (as ZFS's
/// metadata ditto blocks).
pub(crate) fn indirect_copies(props: &VolumeProps) -> usize {
    (props.copies as usize + 1).min(3)
}

impl TxgDirty {
    /// Marks the indirect blocks above data block `b` as rewritten by this txg's sync and
    /// charges `space` for those that were not yet; returns 1 if the level-1 block above `b`
    /// was not yet (for the txg's density, `spa::txg::Dirtied`), else 0. Bounded by the
    /// levels; stops at the first one already marked (its ancestors were marked with it).
    pub(crate) fn charge_indirect(
        &mut self,
        b: u64,
        costs: &SpaceCosts,
        space: &mut ClassBytes,
    ) -> u64 {
        let mut idx = b;
        let mut level1_new = 0;
        for level in 1..=costs.levels {
            idx /= FANOUT;
            if !self.indirect.insert(u64::from(level) << 56 | idx) {
                break;
            }
            *space += costs.indirect;
            if level == 1 {
                level1_new = 1;
            }
        }
        level1_new
    }

    /// Frees blocks [first, end) and charges `space` for the indirect blocks the sync then
    /// rewrites: those at the range's two ends at each level (one inside the range loses all
    /// its data and becomes a hole, which allocates nothing).
    /// Returns how many of those level-1 blocks were not marked yet (as `charge_indirect`).
    pub(crate) fn free_charged(
        &mut self,
        first: u64,
        end: u64,
        costs: &SpaceCosts,
        space: &mut ClassBytes,
    ) -> u64 {
        self.add_free(first, end);
        self.charge_indirect(first, costs, space) + self.charge_indirect(end - 1, costs, space)
    }

    pub(crate) fn freed(&self, b: u64) -> bool {
        self.frees
            .range(..=b)
            .next_back()
            .is_some_and(|(_, &end)| b < end)
    }

    pub(crate) fn add_free(&mut self, first: u64, last: u64) {
        // Blocks written earlier in this txg inside the new range are gone; blocks outside it
        // (even inside a range it merges with, written after that range was freed) stay.
        self.blocks.retain(|&b, _| b < first || b >= last);
        let (mut start, mut end) = (first, last);
        // Merge with every range that touches [start, end): bounded by the ranges present.
        let touching: Vec<(u64, u64)> = self
            .frees
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.frees.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.frees.insert(start, end);
    }
}

/// Most empty dirty-block shells (`Arc`s whose buffer went back to the I/O buffer pool) a
/// volume keeps for reuse: the new dirty blocks of one txg of steady-state writing make no
/// allocation up to this many. About 48 bytes each.
const SPARE_SHELLS_MAX: usize = 4096;

/// Most emptied block maps a volume keeps: one per txg that can be dirty at once (open,
/// quiescing, syncing).
const SPARE_MAPS_MAX: usize = 3;

/// Largest block map (in entries it has room for) a volume keeps for the next txgs; a larger
/// one, left by an unusually big txg, is freed rather than held. About 17 bytes an entry.
const SPARE_MAP_CAPACITY_MAX: usize = SPARE_SHELLS_MAX;

/// The dirty sets of the txgs not yet synced (at most the syncing one and the open one).
#[derive(Default)]
pub(crate) struct ObjectDirty {
    /// Ascending by txg.
    pub txgs: Vec<(Txg, TxgDirty)>,
    /// What retired txgs leave for the next ones, so that steady-state writes do not allocate.
    pub(crate) spares: DirtySpares,
}

/// Allocations of synced txgs kept for reuse. Bounded: `SPARE_SHELLS_MAX` shells and
/// `SPARE_MAPS_MAX` maps of at most `SPARE_MAP_CAPACITY_MAX` entries (under 0.5 MiB a volume).
#[derive(Default)]
pub(crate) struct DirtySpares {
    /// `Arc`s that held a dirty block, now holding an empty buffer; unique.
    shells: Vec<Arc<IoBuf>>,
    /// Emptied block maps, each with room for `blocks_high_water` entries.
    maps: Vec<IdMap<u64, DirtyBlock>>,
    /// Most blocks a retired txg had (at most `SPARE_MAP_CAPACITY_MAX`).
    blocks_high_water: usize,
    /// Emptied sets of indirect blocks, each with room for `indirect_high_water` entries.
    sets: Vec<IdSet<u64>>,
    /// Most indirect blocks a retired txg had (at most `SPARE_MAP_CAPACITY_MAX`).
    indirect_high_water: usize,
}

impl DirtySpares {
    /// `buf` shared, in a recycled `Arc` if there is one.
    pub(crate) fn shell(&mut self, buf: IoBuf) -> Arc<IoBuf> {
        let Some(mut shell) = self.shells.pop() else {
            return Arc::new(buf);
        };
        let slot = Arc::get_mut(&mut shell).expect("spare shells are unique");
        debug_assert!(slot.is_empty(), "a spare shell still holds data");
        *slot = buf;
        shell
    }

    /// Keeps what it can of a synced txg's dirty set: blocks nobody else holds become shells
    /// (their data goes back to the I/O buffer pool), the emptied map is kept for a next txg.
    /// Runs on the sync thread, which also grows the kept map to the largest txg seen, so that
    /// a txg that happened to be small does not leave a map that a writer must grow.
    pub(crate) fn recycle(&mut self, mut retired: TxgDirty) {
        self.blocks_high_water = self
            .blocks_high_water
            .max(retired.blocks.len())
            .min(SPARE_MAP_CAPACITY_MAX);
        for (_, block) in retired.blocks.drain() {
            let mut block = block.into_buf();
            if self.shells.len() >= SPARE_SHELLS_MAX {
                break; // The rest is freed with the map's drain.
            }
            if let Some(buf) = Arc::get_mut(&mut block) {
                drop(std::mem::replace(buf, IoBuf::zeroed(0)));
                if self.shells.capacity() == 0 {
                    // Once, at the bound: pushing never reallocates afterwards.
                    self.shells.reserve_exact(SPARE_SHELLS_MAX);
                }
                self.shells.push(block);
            }
        }
        self.indirect_high_water = self
            .indirect_high_water
            .max(retired.indirect.len())
            .min(SPARE_MAP_CAPACITY_MAX);
        let mut set = retired.indirect;
        set.clear();
        if self.sets.len() < SPARE_MAPS_MAX && set.capacity() <= SPARE_MAP_CAPACITY_MAX {
            set.reserve(self.indirect_high_water);
            if self.sets.capacity() == 0 {
                self.sets.reserve_exact(SPARE_MAPS_MAX);
            }
            self.sets.push(set);
        }
        let mut map = retired.blocks;
        debug_assert!(map.is_empty());
        if self.maps.len() < SPARE_MAPS_MAX && map.capacity() <= SPARE_MAP_CAPACITY_MAX {
            map.reserve(self.blocks_high_water);
            if self.maps.capacity() == 0 {
                self.maps.reserve_exact(SPARE_MAPS_MAX);
            }
            self.maps.push(map);
        }
    }
}

/// Where the current content of a block is, by its newest dirty state.
pub(crate) enum Source {
    /// All of it dirty in some txg: shared, copied only if the writer needs its own copy.
    Dirty(Arc<IoBuf>),
    /// Freed (reads as zeros).
    Zero,
    /// Some sectors dirty, the rest in older txgs or the tree.
    Partial,
    /// Not dirty: the tree has it.
    Tree,
}

/// The content a write that is not sector-aligned starts from (read-modify-write).
pub(crate) enum BlockBase {
    /// The block's dirty data in some txg, shared.
    Shared(Arc<IoBuf>),
    /// The block's whole current content, one volume block long.
    Owned(IoBuf),
}

impl BlockBase {
    /// A new buffer of `bs` bytes holding the base (from the I/O buffer pool).
    pub(crate) fn to_block(&self, bs: usize) -> IoBuf {
        match self {
            BlockBase::Shared(buf) => IoBuf::from_slice(&buf[..bs]),
            BlockBase::Owned(buf) => IoBuf::from_slice(&buf[..bs]),
        }
    }
}

impl ObjectDirty {
    /// Records a freed block range [first, end) in `txg`; returns the space its sync will
    /// allocate for it, and how many level-1 blocks it newly marks (as `charge_indirect`).
    pub(crate) fn txgs_add_free(
        &mut self,
        txg: Txg,
        first: u64,
        end: u64,
        costs: &SpaceCosts,
    ) -> (ClassBytes, u64) {
        let mut space = ClassBytes::default();
        let level1_blocks = self
            .txg_mut(txg)
            .free_charged(first, end, costs, &mut space);
        (space, level1_blocks)
    }

    pub(crate) fn txg_mut(&mut self, txg: Txg) -> &mut TxgDirty {
        self.txg_and_spares(txg).0
    }

    /// The dirty set of `txg` (created if needed) and the spares to build new blocks from.
    pub(crate) fn txg_and_spares(&mut self, txg: Txg) -> (&mut TxgDirty, &mut DirtySpares) {
        let i = match self.txgs.iter().position(|(t, _)| *t == txg) {
            Some(i) => i,
            None => {
                debug_assert!(
                    self.txgs.iter().all(|(t, _)| *t < txg),
                    "txg went backwards"
                );
                debug_assert!(self.txgs.len() < 3, "more than three txgs dirty");
                let blocks = self.spares.maps.pop().unwrap_or_default();
                debug_assert!(blocks.is_empty());
                let indirect = self.spares.sets.pop().unwrap_or_default();
                debug_assert!(indirect.is_empty());
                self.txgs.push((
                    txg,
                    TxgDirty {
                        blocks,
                        frees: BTreeMap::new(),
                        size_bytes: None,
                        indirect,
                    },
                ));
                self.txgs.len() - 1
            }
        };
        (&mut self.txgs[i].1, &mut self.spares)
    }

    /// Drops txg `txg`'s dirty set (the sync made it durable), keeping its allocations for
    /// the next txgs.
    pub(crate) fn retire(&mut self, txg: Txg) {
        if let Some(i) = self.txgs.iter().position(|(t, _)| *t == txg) {
            let (_, retired) = self.txgs.remove(i);
            self.spares.recycle(retired);
        }
    }

    /// Copies what the dirty sets hold of bytes [in_block, in_block + out.len()) of block `b`
    /// into `out` (newest txg first). Returns the sectors of that range still to be read from
    /// the tree (empty when the dirty sets had it all).
    pub(crate) fn read_into(&self, b: u64, in_block: usize, out: &mut [u8]) -> SectorMask {
        let mut need = SectorMask::touching(in_block, in_block + out.len());
        // Bounded: at most three txgs are dirty.
        for (_, d) in self.txgs.iter().rev() {
            match d.blocks.get(&b) {
                Some(DirtyBlock::Data(buf)) => {
                    copy_runs(&need, buf, in_block, out);
                    return SectorMask::EMPTY;
                }
                Some(DirtyBlock::Stored(buf, form)) => {
                    copy_runs(&need, &form.content(buf), in_block, out);
                    return SectorMask::EMPTY;
                }
                Some(DirtyBlock::Partial(buf, written)) => {
                    copy_runs(&need.intersect(written), buf, in_block, out);
                    need = need.minus(written);
                    if need.is_empty() {
                        return need;
                    }
                }
                None => {}
            }
            // A txg's frees come before its writes.
            if d.freed(b) {
                zero_runs(&need, in_block, out);
                return SectorMask::EMPTY;
            }
        }
        need
    }

    pub(crate) fn source(&self, b: u64) -> Source {
        for (_, d) in self.txgs.iter().rev() {
            match d.blocks.get(&b) {
                Some(DirtyBlock::Data(buf)) => return Source::Dirty(Arc::clone(buf)),
                Some(DirtyBlock::Stored(buf, form)) => return Source::Dirty(form.content(buf)),
                Some(DirtyBlock::Partial(..)) => return Source::Partial,
                None => {}
            }
            if d.freed(b) {
                return Source::Zero;
            }
        }
        Source::Tree
    }

    pub(crate) fn is_dirty_data(&self, b: u64) -> Option<bool> {
        for (_, d) in self.txgs.iter().rev() {
            if d.blocks.contains_key(&b) {
                return Some(true);
            }
            if d.freed(b) {
                return Some(false);
            }
        }
        None
    }
}
