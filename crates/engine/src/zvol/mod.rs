//! Volumes: block devices made of a block tree and the dirty data of the open transaction
//! groups.
//!
//! Every read, write, trim and write-zeroes holds a range lock over what it touches, taken by
//! the task serving the request (never the one that received it). Writes lock whole blocks,
//! because a write that is not sector-aligned is a read-modify-write of the block. A write
//! lands in the open txg's dirty map; reads look at the dirty maps (newest txg first) and then
//! the tree. The txg sync writes a txg's dirty blocks and swaps their pointers into the tree;
//! until it has, the dirty copy stays readable, so a read never sees a block half-way.
//!
//! A sector-aligned write to part of a block whose content is not in memory does not read the
//! block: it records the sectors it wrote ([`DirtyBlock::Partial`]), and the txg sync reads
//! the block once, merges, and writes it (off every client's path, many blocks at once).
//! Reads of such a block take the recorded sectors from memory and the rest from the tree.

mod changes;
mod log;
mod log_early;
pub use crate::dmu::dirty::StoredForm;
pub use changes::{ChangedExtent, CHANGED_RANGES_MAX};
pub mod rangelock;

use crate::dmu::dirty::{BlockBase, DirtyBlock, ObjectDirty, Source, SpaceCosts};
use crate::dmu::tree::{lookup, skip_hole, walk, Walk};
use crate::dsl::dataset::Dataset;
use crate::dsl::Datasets;
use crate::iostats::{VolumeIoStats, VolumeOp};
use crate::props::{SyncMode, VolumeProps};
use crate::sector_mask::{copy_runs, zero_runs, SectorMask};
use crate::spa::txg::Dirtied;
use crate::spa::Spa;
use crate::vdev::alloc::ClassBytes;
use crate::vdev::queue::IoClass;
use crate::vdev::LeafIo;
use crate::zil::{ItxKind, Zil};
use crate::zio::compress::WrittenForms;
use crate::zio::data_cache::CacheKey;
use crate::zio::probe_streak::ProbeStreak;
use crate::zio::read_run::{extends_run, read_data_run, run_bytes, RunBlock, READ_RUN_BYTES_MAX};
use crate::zio::{heal_if_current, read_data_block_after_bad_copy, read_data_block_unhealed};
use crate::zvol::rangelock::{LockMode, RangeLock, RangeLockNode};
use crate::{EngineError, Result};
use oxpool_format::{BlockPtr, INDIRECT_FANOUT};
use oxpool_io::scratch::{Scratch, Stash};
use oxpool_io::IoBuf;
use std::cell::RefCell;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// One volume block as stored (see [`Volume::write_stored`]).
pub struct StoredBlock {
    /// The stored bytes (`form.psize_bytes` of them), zero-padded to whole sectors.
    pub buf: IoBuf,
    /// How they are stored.
    pub form: StoredForm,
}

/// One part of what [`Volume::read_shared`] read, in order.
#[derive(Clone, Debug)]
pub enum ReadPart {
    /// These bytes of the caller's output buffer (copied there: dirty data, holes, partial
    /// blocks, blocks read again after a bad copy).
    Copied(std::ops::Range<usize>),
    /// These bytes of a cached block, shared instead of copied.
    Shared {
        /// The cached block (the cache's own buffer: read it, never write it).
        block: Arc<IoBuf>,
        /// The bytes of `block` that are this part.
        range: std::ops::Range<usize>,
        /// Where the part starts in the read's output.
        at: usize,
    },
    /// These bytes of a block this read brought from a device and the data cache did not
    /// keep (it is off, or the block is larger than it): handed over rather than copied.
    Owned {
        /// The block, verified (and decoded).
        block: IoBuf,
        /// The bytes of `block` that are this part.
        range: std::ops::Range<usize>,
        /// Where the part starts in the read's output.
        at: usize,
    },
}

impl ReadPart {
    /// The part's bytes; `out` is the output buffer the read was given.
    pub fn bytes<'a>(&'a self, out: &'a [u8]) -> &'a [u8] {
        match self {
            ReadPart::Copied(range) => &out[range.clone()],
            ReadPart::Shared { block, range, .. } => &block[range.clone()],
            ReadPart::Owned { block, range, .. } => &block[range.clone()],
        }
    }

    /// The part's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            ReadPart::Copied(range)
            | ReadPart::Shared { range, .. }
            | ReadPart::Owned { range, .. } => range.len(),
        }
    }

    /// Whether the part is empty (never, in what [`Volume::read_shared`] hands out).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the part starts in the read's output.
    pub fn output_start(&self) -> usize {
        match self {
            ReadPart::Copied(range) => range.start,
            ReadPart::Shared { at, .. } | ReadPart::Owned { at, .. } => *at,
        }
    }
}

/// Builds the parts of a read as its blocks are shared or handed over, in any order (the
/// blocks read from devices arrive after the cached ones, and concurrently); `finish` puts
/// them in output order and makes every byte not in one a copied part.
struct PartsBuilder<'a> {
    parts: &'a mut Vec<ReadPart>,
}

impl PartsBuilder<'_> {
    /// The output bytes `range` are bytes `in_block..` of the shared `block`.
    fn push_shared(&mut self, range: std::ops::Range<usize>, in_block: usize, block: Arc<IoBuf>) {
        self.parts.push(ReadPart::Shared {
            range: in_block..in_block + range.len(),
            block,
            at: range.start,
        });
    }

    /// The output bytes `range` are bytes `in_block..` of `block`, which the read hands over.
    fn push_owned(&mut self, range: std::ops::Range<usize>, in_block: usize, block: IoBuf) {
        self.parts.push(ReadPart::Owned {
            range: in_block..in_block + range.len(),
            block,
            at: range.start,
        });
    }

    /// Ends the parts of an output of `len` bytes: in output order, the gaps between the
    /// pushed parts (bytes the read copied into the output) as copied parts. Sorting in place
    /// allocates nothing; the caller's vector keeps its capacity from read to read.
    fn finish(self, len: usize) {
        let parts = self.parts;
        parts.sort_unstable_by_key(ReadPart::output_start);
        let pushed = parts.len();
        let mut covered = 0;
        // Bounded by the parts pushed: gaps are appended after them.
        for i in 0..pushed {
            let start = parts[i].output_start();
            debug_assert!(start >= covered, "read parts overlap");
            if start > covered {
                parts.push(ReadPart::Copied(covered..start));
            }
            covered = start + parts[i].len();
        }
        if covered < len {
            parts.push(ReadPart::Copied(covered..len));
        }
        if parts.len() > pushed && pushed > 0 {
            parts.sort_unstable_by_key(ReadPart::output_start);
        }
        debug_assert_eq!(parts.iter().map(ReadPart::len).sum::<usize>(), len);
    }
}

/// A volume's shared state: its dataset (name, properties, the data object) and what only
/// a volume has: range locks, its intent log, its call statistics.
pub(crate) struct VolumeInner {
    /// The dataset: name, properties, the object set holding the volume's data.
    pub ds: Arc<Dataset>,
    pub range_lock: RangeLock,
    /// Held across a size change ([`Volume::resize`]): one at a time.
    pub resizing: Mutex<()>,
    /// The volume's intent log (also its dataset's [`crate::dsl::dataset::DatasetLog`]).
    pub zil: Arc<Zil>,
    /// Calls of the data-plane API, for `oxpool iostat`.
    pub io_stats: VolumeIoStats,
    /// Whole blocks written in a row that looked incompressible (whose probes are skipped).
    pub probe_streak: ProbeStreak,
}

impl VolumeInner {
    /// The volume over dataset `ds`, whose log is `zil`.
    pub(crate) fn new(ds: Arc<Dataset>, zil: Arc<Zil>) -> VolumeInner {
        VolumeInner {
            ds,
            range_lock: RangeLock::new(),
            resizing: Mutex::new(()),
            zil,
            io_stats: VolumeIoStats::default(),
            probe_streak: ProbeStreak::default(),
        }
    }

    /// The volume's data object.
    pub(crate) fn data(&self) -> &crate::dmu::object::Object {
        self.ds.data()
    }
}

/// Whether a range of a volume holds data or reads as zeros without any (NBD block status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Allocated data (which may still happen to be zeros).
    Data,
    /// A hole: reads as zeros, no space allocated.
    Hole,
}

/// A handle to a volume, for the data plane. Cheap to clone; usable from any thread.
#[derive(Clone)]
pub struct Volume {
    pub(crate) pool: Arc<Spa>,
    pub(crate) vol: Arc<VolumeInner>,
    /// The pool's datasets: a change map looks up its base in the volume's lineage, which
    /// for a snapshot view or a clone is another dataset's (`changes.rs`).
    pub(crate) dsl: Arc<Datasets>,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume")
            .field("name", &self.vol.ds.full_name())
            .finish()
    }
}

impl Volume {
    /// `pool/volume`, as of now: `rename` may change it while the handle is in use.
    pub fn full_name(&self) -> String {
        self.vol.ds.full_name()
    }

    /// The volume's name inside its pool, as of now (see [`Volume::full_name`]).
    pub fn name(&self) -> String {
        self.vol.ds.name()
    }

    /// The guid of the volume's dataset: which volume this is, for good. One destroyed and
    /// created again under the same name has another; a rename or a rollback keeps it.
    pub fn dataset_guid(&self) -> oxpool_format::Guid {
        self.vol.ds.lineage.lock().unwrap().guid
    }

    /// Current size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.vol.ds.props.lock().unwrap().volsize_bytes
    }

    /// Block size in bytes.
    pub fn block_size_bytes(&self) -> u32 {
        self.vol.ds.props.lock().unwrap().volblocksize_bytes
    }

    /// Whether the volume refuses writes.
    pub fn read_only(&self) -> bool {
        self.vol.ds.props.lock().unwrap().readonly
    }

    /// A copy of the volume's properties.
    pub fn props(&self) -> VolumeProps {
        self.vol.ds.props.lock().unwrap().clone()
    }

    fn check_range(&self, offset_bytes: u64, length_bytes: u64, write: bool) -> Result<u32> {
        if self.vol.ds.destroyed.load(Ordering::Acquire) {
            return Err(EngineError::NotFound(self.vol.ds.full_name()));
        }
        let p = self.vol.ds.props.lock().unwrap();
        if write && p.readonly {
            return Err(EngineError::invalid(format!(
                "{} is read-only",
                self.vol.ds.full_name()
            )));
        }
        let end = offset_bytes.checked_add(length_bytes);
        if end.is_none_or(|e| e > p.volsize_bytes) {
            return Err(self.past_end(offset_bytes, length_bytes, p.volsize_bytes));
        }
        Ok(p.volblocksize_bytes)
    }

    fn past_end(&self, offset_bytes: u64, length_bytes: u64, size_bytes: u64) -> EngineError {
        EngineError::invalid(format!(
            "{}: range {offset_bytes}+{length_bytes} is past the end ({size_bytes} bytes)",
            self.vol.ds.full_name()
        ))
    }

    /// [`Volume::check_range`]'s size check again, once the request holds its range lock: a
    /// shrink may have cut the range off while the request waited for the lock. Under the
    /// lock the answer holds until the request is done: a shrink takes a write lock over
    /// everything past the new end before it changes the size (see [`Volume::resize`]).
    fn check_still_in_range(&self, offset_bytes: u64, length_bytes: u64) -> Result<()> {
        let size = self.size_bytes();
        if offset_bytes + length_bytes > size {
            return Err(self.past_end(offset_bytes, length_bytes, size));
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `offset_bytes`.
    pub async fn read(&self, offset_bytes: u64, out: &mut [u8]) -> Result<()> {
        let _timer = self.vol.io_stats.start(VolumeOp::Read, out.len() as u64);
        self.read_uncounted(offset_bytes, out, None).await
    }

    /// Reads `out.len()` bytes at `offset_bytes` as [`Volume::read`], but hands blocks that
    /// the data cache holds by reference instead of copying them into `out`: on success
    /// `parts` (cleared first) holds the bytes read, in order, each part either a range of
    /// `out` or a range of a shared cached block. For a caller that only reads the data once
    /// more anyway (the NBD server encrypting a READ reply for TLS): the copy into `out` was
    /// a third of the bytes it moved. `parts` keeps its capacity from call to call, so a
    /// caller that reuses it allocates nothing. On error `parts` is empty.
    pub async fn read_shared(
        &self,
        offset_bytes: u64,
        out: &mut [u8],
        parts: &mut Vec<ReadPart>,
    ) -> Result<()> {
        let _timer = self.vol.io_stats.start(VolumeOp::Read, out.len() as u64);
        parts.clear();
        let read = self
            .read_uncounted(offset_bytes, out, Some(&mut *parts))
            .await;
        if read.is_err() {
            parts.clear();
        }
        read
    }

    /// As [`Volume::read`], not counted as a client read (the intent log reading back what it
    /// commits); with `parts`, as [`Volume::read_shared`].
    pub(crate) async fn read_uncounted(
        &self,
        offset_bytes: u64,
        out: &mut [u8],
        parts: Option<&mut Vec<ReadPart>>,
    ) -> Result<()> {
        let bs = self.check_range(offset_bytes, out.len() as u64, false)? as u64;
        if out.is_empty() {
            return Ok(());
        }
        let mut node = pin!(RangeLockNode::new());
        let _guard = self
            .vol
            .range_lock
            .lock(
                node.as_mut(),
                offset_bytes,
                out.len() as u64,
                LockMode::Read,
            )
            .await;
        self.check_still_in_range(offset_bytes, out.len() as u64)?;
        self.read_locked(offset_bytes, out, bs, parts).await
    }

    /// Reads `out.len()` bytes at `offset_bytes` under a range lock the caller holds; with
    /// `parts`, cached blocks are shared rather than copied (see [`Volume::read_shared`]).
    async fn read_locked(
        &self,
        offset_bytes: u64,
        out: &mut [u8],
        bs: u64,
        parts: Option<&mut Vec<ReadPart>>,
    ) -> Result<()> {
        let share = parts.is_some();
        let end = offset_bytes + out.len() as u64;
        let mut pos = offset_bytes;
        // Blocks shared or handed over so far (`parts` is built as they come, in any order:
        // the device reads of `read_group` push theirs concurrently).
        let shared = parts.map(|parts| RefCell::new(PartsBuilder { parts }));
        // Blocks that must come from the tree and are not in memory: (block, in-block offset,
        // output range, sectors needed). The first apart, so that a read within one block
        // builds no list.
        let mut first_from_tree: Option<FromTree> = None;
        let mut from_tree: Option<Scratch<Vec<FromTree>>> = None;
        // Bounded by the blocks of the request. Block by block: what the dirty state lacks is
        // looked up in the tree's cached level-1 blocks and the data cache at once, without
        // a future, so that a read of cached blocks allocates nothing (a 128 KiB read used to
        // build a list and eight futures of tree reads: 7 % of the server's CPU at 128 KiB
        // sequential reads). Writes cannot change the range meanwhile (the caller's range
        // lock); a txg sync may move a block from the dirty state into the tree between the
        // two looks, which then finds the same bytes there.
        while pos < end {
            let b = pos / bs;
            let in_block = (pos % bs) as usize;
            let n = ((bs - pos % bs).min(end - pos)) as usize;
            let o = (pos - offset_bytes) as usize;
            pos += n as u64;
            let dst = &mut out[o..o + n];
            let need = self
                .vol
                .data()
                .dirty
                .lock()
                .unwrap()
                .read_into(b, in_block, dst);
            if need.is_empty() {
                continue;
            }
            match self.read_tree_cached(b, in_block, dst, &need, share) {
                Some(Some(block)) => {
                    if let Some(shared) = &shared {
                        shared.borrow_mut().push_shared(o..o + n, in_block, block);
                    }
                }
                Some(None) => {}
                None if first_from_tree.is_none() => {
                    first_from_tree = Some((b, in_block, o..o + n, need));
                }
                None => from_tree
                    .get_or_insert_with(|| Scratch::take(&FROM_TREE))
                    .push((b, in_block, o..o + n, need)),
            }
        }
        // What is left is read from the devices, or found in memory after all (a block
        // cached meanwhile): copied into `out` either way, so that the shared blocks stay in
        // output order.
        let Some(first) = first_from_tree else {
            if let Some(shared) = shared {
                shared.into_inner().finish(out.len());
            }
            return Ok(());
        };
        let Some(mut from_tree) = from_tree else {
            let (b, in_block, range, need) = first;
            self.read_tree_into(b, in_block, &mut out[range], &need)
                .await?;
            if let Some(shared) = shared {
                shared.into_inner().finish(out.len());
            }
            return Ok(());
        };
        from_tree.insert(0, first);
        // Issue the tree reads of one request concurrently, and blocks that lie side by side
        // on a device as one read ([`read_data_run`]): a 128 KiB read of 16 KiB blocks the
        // txg sync wrote together is one device read, not eight. A group is one block, or a
        // run of consecutive blocks whose pointers are at hand (cached level-1 blocks); the
        // groups' output ranges are disjoint and increasing, so each gets its own slice of
        // `out`.
        self.load_pointers(&from_tree).await;
        let mut groups = Scratch::take(&GROUPS);
        let mut bps = Scratch::take(&GROUP_POINTERS);
        self.plan_read_groups(&from_tree, &mut groups, &mut bps);
        if let [(group, run)] = groups.as_slice() {
            // One group (blocks written side by side, the usual case): read without a list
            // of futures to join.
            let span = from_tree[group.start].2.start..from_tree[group.end - 1].2.end;
            let start = span.start;
            self.read_group(
                &from_tree[group.clone()],
                &bps[run.clone()],
                &mut out[span],
                start,
                shared.as_ref(),
            )
            .await?;
        } else {
            let mut futs = Vec::with_capacity(groups.len());
            let mut rest: &mut [u8] = out;
            let mut rest_start = 0;
            for (group, run) in groups.iter() {
                let span = from_tree[group.start].2.start..from_tree[group.end - 1].2.end;
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(span.start - rest_start);
                let (mine, tail) = tail.split_at_mut(span.len());
                rest = tail;
                rest_start = span.end;
                futs.push(self.read_group(
                    &from_tree[group.clone()],
                    &bps[run.clone()],
                    mine,
                    span.start,
                    shared.as_ref(),
                ));
            }
            let results = oxpool_io::rt::join_all(futs).await;
            // The first error fails the read (and `read_shared` then empties `parts`).
            for result in results {
                result?;
            }
        }
        if let Some(shared) = shared {
            shared.into_inner().finish(out.len());
        }
        Ok(())
    }

    /// Brings the level-1 blocks that hold the pointers of `from_tree`'s blocks into the tree's
    /// cache, where [`Volume::plan_read_groups`] looks: a request whose pointers were not at
    /// hand would otherwise be read block by block. A lookup that fails is left to the read of
    /// the block, which reports it.
    async fn load_pointers(&self, from_tree: &[FromTree]) {
        let tree = &self.vol.data().tree;
        // Bounded by the blocks of the request; one lookup per level-1 block at most, as the
        // first loads it for the others.
        for (b, ..) in from_tree {
            if tree.lock().unwrap().cached_data_ptr(*b).is_none() {
                let what = &self.vol.ds.names;
                let _ = lookup(tree, &self.pool.zio, IoClass::SyncRead, *b, what).await;
            }
        }
    }

    /// Splits `from_tree` (blocks to read from the devices, in output order) into `groups` to
    /// read concurrently: runs of consecutive blocks whose first copies lie back to back on a
    /// mirror or single device, with their pointers, and single blocks (no pointers: looked
    /// up when read). Each group is its range of `from_tree` and the range of `bps` that
    /// holds its pointers (empty for a single block).
    fn plan_read_groups(
        &self,
        from_tree: &[FromTree],
        groups: &mut Vec<ReadGroup>,
        bps: &mut Vec<BlockPtr>,
    ) {
        let zio = &self.pool.zio;
        let tree = self.vol.data().tree.lock().unwrap();
        let mut run_bytes_total = 0;
        // Bounded by the blocks of the request.
        for (i, (b, ..)) in from_tree.iter().enumerate() {
            let bp = tree.cached_data_ptr(*b).filter(|bp| !bp.is_hole());
            if let (Some(bp), Some((group, run))) = (bp, groups.last_mut()) {
                // Only the last group's pointers are at the end of `bps`.
                let joins = run.start < run.end
                    && from_tree[i - 1].0 + 1 == *b
                    && extends_run(
                        zio,
                        &bps[run.end - 1],
                        run_bytes_total,
                        &bp,
                        READ_RUN_BYTES_MAX,
                    );
                if joins {
                    group.end = i + 1;
                    run.end += 1;
                    run_bytes_total += run_bytes(&bp);
                    bps.push(bp);
                    continue;
                }
            }
            run_bytes_total = bp.as_ref().map_or(0, run_bytes);
            let run_start = bps.len();
            bps.extend(bp);
            groups.push((i..i + 1, run_start..bps.len()));
        }
        drop(tree);
        // A group of one is read by its block number (the pointer is looked up again then).
        for (group, run) in groups.iter_mut() {
            if group.len() == 1 {
                run.end = run.start;
            }
        }
    }

    /// Reads `blocks` (from `from_tree`) into `out`, which holds their output ranges from
    /// `out_start` on: with `bps` (their pointers, a run), as one device read, each block
    /// that did not verify then read again alone; without, one block by its number.
    ///
    /// With `shared` (a [`Volume::read_shared`]), a block of the run whose bytes the read
    /// takes whole (none of them from the dirty state) is not copied into `out`: it becomes a
    /// part, shared with the data cache when the cache keeps it, else handed over. Why: in a
    /// 128 KiB read from the devices that copy was 10 % of the reactor's CPU.
    async fn read_group(
        &self,
        blocks: &[FromTree],
        bps: &[BlockPtr],
        out: &mut [u8],
        out_start: usize,
        shared: Option<&RefCell<PartsBuilder<'_>>>,
    ) -> Result<()> {
        if bps.is_empty() {
            debug_assert_eq!(blocks.len(), 1);
            let (b, in_block, _, need) = &blocks[0];
            return self.read_tree_into(*b, *in_block, out, need).await;
        }
        debug_assert_eq!(blocks.len(), bps.len());
        let cache = &self.pool.zio.data_cache;
        let bs = self.vol.ds.props.lock().unwrap().volblocksize_bytes as usize;
        let what = &self.vol.ds.names;
        let mut read = Scratch::take(&RUN_BLOCKS);
        read_data_run(&self.pool.zio, IoClass::SyncRead, bps, bs, what, &mut read).await;
        assert_eq!(read.len(), bps.len(), "a run gives one verdict per block");
        // The blocks the run did not deliver, read again concurrently, each into its own
        // slice of `out` (the ranges are disjoint and increasing).
        let mut retries = Vec::new();
        let mut rest: &mut [u8] = out;
        let mut rest_start = out_start;
        // Bounded by the blocks of the run.
        for (((b, in_block, range, need), bp), block) in blocks.iter().zip(bps).zip(read.drain(..))
        {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - rest_start);
            let (mine, tail) = tail.split_at_mut(range.len());
            rest = tail;
            rest_start = range.end;
            match block {
                RunBlock::Good(block) => {
                    // A miss, as the block-by-block read counts it.
                    cache.count_miss();
                    let whole = need.covers(*in_block, *in_block + range.len());
                    match shared {
                        Some(shared) if whole => {
                            match cache.insert_shared(CacheKey::of(bp), block.content) {
                                Ok(kept) => {
                                    shared
                                        .borrow_mut()
                                        .push_shared(range.clone(), *in_block, kept)
                                }
                                Err(block) => {
                                    shared
                                        .borrow_mut()
                                        .push_owned(range.clone(), *in_block, block)
                                }
                            }
                        }
                        _ => {
                            copy_runs(need, &block.content, *in_block, mine);
                            cache.insert(CacheKey::of(bp), block.content);
                        }
                    }
                }
                RunBlock::Retry(bad_copy) => {
                    let bad_copy = bad_copy.map(|io| (*bp, io));
                    retries.push(self.read_tree_into_healing(*b, *in_block, mine, need, bad_copy));
                }
            }
        }
        if retries.is_empty() {
            return Ok(());
        }
        // The first error fails the read.
        for result in oxpool_io::rt::join_all(retries).await {
            result?;
        }
        Ok(())
    }

    /// [`Volume::read_tree_into`] when it needs no I/O: block `b`'s pointer is in a cached
    /// level-1 block, and the block is a hole or in the data cache. `None` (and `out` partly
    /// written, perhaps) when it is not; a miss here is not counted (the read that follows
    /// counts it).
    fn read_tree_cached(
        &self,
        b: u64,
        in_block: usize,
        out: &mut [u8],
        need: &SectorMask,
        share: bool,
    ) -> Option<Option<Arc<IoBuf>>> {
        let bp = self.vol.data().tree.lock().unwrap().cached_data_ptr(b)?;
        let hi = in_block + out.len();
        if bp.is_hole() {
            zero_runs(need, in_block, out);
            return Some(None);
        }
        let cache = &self.pool.zio.data_cache;
        let key = CacheKey::of(&bp);
        let all = need.covers(in_block, hi);
        if all && share {
            return cache.try_share(&key, in_block, out.len()).map(Some);
        }
        if all {
            return cache.try_read_into(&key, in_block, out).then_some(None);
        }
        // Bounded by the sectors of the range.
        for (lo, run_hi) in need.byte_runs(in_block, hi) {
            if !cache.try_read_into(&key, lo, &mut out[lo - in_block..run_hi - in_block]) {
                return None;
            }
        }
        Some(None)
    }

    /// Copies the `need` sectors of bytes [in_block, in_block + out.len()) of block `b` in the
    /// tree into `out` (zeros for a hole), through the pool's data cache: a hit is a copy; a
    /// miss reads and verifies the block and leaves it in the cache. The other bytes of `out`
    /// (the dirty sets had them) are left alone. (Hits that need no I/O at all, the common
    /// case, are [`Volume::read_tree_cached`]'s, which can share the block instead.)
    async fn read_tree_into(
        &self,
        b: u64,
        in_block: usize,
        out: &mut [u8],
        need: &SectorMask,
    ) -> Result<()> {
        self.read_tree_into_healing(b, in_block, out, need, None)
            .await
    }

    /// [`Volume::read_tree_into`] for a block whose copy at `bad_copy.1` another read (a run)
    /// found bad when `bad_copy.0` was its pointer: rewritten too if the block is still that.
    async fn read_tree_into_healing(
        &self,
        b: u64,
        in_block: usize,
        out: &mut [u8],
        need: &SectorMask,
        bad_copy: Option<(BlockPtr, LeafIo)>,
    ) -> Result<()> {
        let cache = &self.pool.zio.data_cache;
        let hi = in_block + out.len();
        let all = need.covers(in_block, hi);
        let found = self
            .read_tree(b, bad_copy, |found| match found {
                TreeRead::Cached(key) if all => cache.read_into(key, in_block, out).then_some(()),
                TreeRead::Cached(key) => {
                    // Bounded by the sectors of the range.
                    for (lo, run_hi) in need.byte_runs(in_block, hi) {
                        let dst = &mut out[lo - in_block..run_hi - in_block];
                        if !cache.read_into(key, lo, dst) {
                            return None;
                        }
                    }
                    Some(())
                }
                TreeRead::Read(key, buf) => {
                    copy_runs(need, &buf, in_block, out);
                    cache.insert(key, buf);
                    Some(())
                }
            })
            .await?;
        if found.is_none() {
            zero_runs(need, in_block, out);
        }
        Ok(())
    }

    /// Looks up block `b` and hands it to `take`: first as a cache key (`take` returns `Some`
    /// on a hit), else as the verified block read from the devices (`take` must return
    /// `Some`). None for a hole. Retries once if the read fails and the pointer changed
    /// meanwhile (the block was rewritten and its old place reused).
    async fn read_tree<T>(
        &self,
        b: u64,
        bad_copy: Option<(BlockPtr, LeafIo)>,
        take: impl FnMut(TreeRead<'_>) -> Option<T>,
    ) -> Result<Option<T>> {
        let read = self.read_tree_once(b, bad_copy, take).await;
        if let Err(EngineError::Checksum { .. } | EngineError::Io { .. }) = &read {
            // No copy gave back the block or an indirect block above it: the client's range
            // is damaged (`oxpool status -v`): the block, or all below the indirect block
            // (up to the volume's end), as a scrub names it.
            let (bs, size) = {
                let p = self.vol.ds.props.lock().unwrap();
                (p.volblocksize_bytes as u64, p.volsize_bytes)
            };
            let lost_level = self.vol.data().tree.lock().unwrap().first_uncached_level(b);
            let name = &self.vol.ds.full_name();
            match lost_level {
                Some(level) => {
                    let span_blocks = (INDIRECT_FANOUT as u64).saturating_pow(u32::from(level));
                    let first = b - b % span_blocks;
                    let start = first.saturating_mul(bs);
                    let end = first
                        .saturating_add(span_blocks)
                        .saturating_mul(bs)
                        .min(size);
                    if end > start {
                        self.pool.error_log.record_range(name, start, end - start);
                    }
                }
                None => self.pool.error_log.record(name, b, bs),
            }
        }
        read
    }

    /// [`Volume::read_tree`] without the record of damage.
    async fn read_tree_once<T>(
        &self,
        b: u64,
        bad_copy: Option<(BlockPtr, LeafIo)>,
        mut take: impl FnMut(TreeRead<'_>) -> Option<T>,
    ) -> Result<Option<T>> {
        let zio = &self.pool.zio;
        let what = &self.vol.ds.names;
        let bs = self.vol.ds.props.lock().unwrap().volblocksize_bytes as usize;
        let mut bp = lookup(&self.vol.data().tree, zio, IoClass::SyncRead, b, what).await?;
        // A copy of this very block another read found bad (a copy of an older version of
        // it is nothing to this one).
        let mut known_bad = bad_copy
            .filter(|(run_bp, _)| *run_bp == bp)
            .map(|(_, io)| io);
        for attempt in 0..2 {
            if bp.is_hole() {
                return Ok(None);
            }
            let key = CacheKey::of(&bp);
            if let Some(v) = take(TreeRead::Cached(&key)) {
                return Ok(Some(v));
            }
            // The name is formatted only if the read fails. A compressed block comes back
            // decompressed (the cache holds content).
            let block_what = format_args!("{what} block {b}");
            let read = match known_bad.as_ref() {
                None => {
                    read_data_block_unhealed(zio, IoClass::SyncRead, &bp, bs, &block_what).await
                }
                Some(io) => {
                    read_data_block_after_bad_copy(zio, IoClass::SyncRead, &bp, bs, io, &block_what)
                        .await
                }
            };
            match read {
                Ok((block, mut bad)) => {
                    // Rewritten too if it was not read (another copy was good first).
                    if let Some(io) = known_bad.take() {
                        bad.add_copy(io);
                    }
                    // Bad copies are rewritten only if the block is still current: a block
                    // partial in a syncing txg may have been replaced while this read ran,
                    // its places freed and reused, and healing would then write the old
                    // block over another one.
                    // Checked once the places are registered (`heal_if_current`): the
                    // volume (or the snapshot a view reads) not destroyed, and the tree still
                    // pointing there (a view's tree never changes, so it alone says nothing).
                    // A lookup that fails only skips the heal: the read itself is good.
                    let tree = &self.vol.data().tree;
                    heal_if_current(zio, bp.dvas(), &bad, block.stored(), async {
                        !self.vol.ds.destroyed.load(Ordering::Acquire)
                            && lookup(tree, zio, IoClass::SyncRead, b, what)
                                .await
                                .is_ok_and(|now| now == bp)
                    })
                    .await;
                    let v = take(TreeRead::Read(key, block.content));
                    debug_assert!(v.is_some(), "a read block must be taken");
                    return Ok(v);
                }
                Err(e) => {
                    let again =
                        lookup(&self.vol.data().tree, zio, IoClass::SyncRead, b, what).await?;
                    if attempt == 1 || again == bp {
                        return Err(e);
                    }
                    bp = again;
                    known_bad = None;
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// The current content of block `b` (for read-modify-write), under the write range lock
    /// the caller holds on the block: when the newest dirty state holds all of it, shared, not
    /// copied (a write to a block already dirty in its txg needs no copy at all).
    async fn block_content(&self, b: u64, bs: usize) -> Result<BlockBase> {
        let src = self.vol.data().dirty.lock().unwrap().source(b);
        match src {
            Source::Dirty(buf) => Ok(BlockBase::Shared(buf)),
            Source::Zero => Ok(BlockBase::Owned(IoBuf::zeroed(bs))),
            Source::Partial | Source::Tree => {
                let mut buf = IoBuf::zeroed(bs);
                self.read_locked(b * bs as u64, &mut buf, bs as u64, None)
                    .await?;
                Ok(BlockBase::Owned(buf))
            }
        }
    }

    /// Writes `data` at `offset_bytes`. With `fua` (or `sync=always`) the data is durable when
    /// this returns.
    pub async fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        let _timer = self.vol.io_stats.start(VolumeOp::Write, data.len() as u64);
        self.modify(offset_bytes, data.len() as u64, Change::Bytes(data), fua)
            .await
    }

    /// Writes whole blocks from `offset_bytes` (a multiple of the block size) on, one buffer
    /// of exactly the block size per block, in order: each buffer **becomes** its block's
    /// dirty state (no copy), as if [`Volume::write`] had been given their concatenation.
    /// `blocks` is drained on success (its capacity kept for the caller's next request); on
    /// an error it may keep some or all of them, and nothing was changed.
    ///
    /// Why: the NBD server receives a WRITE of whole blocks straight into the buffers it
    /// hands here; copying one request buffer into blocks was 15 % of the server's CPU on
    /// 128K sequential writes (issue 19).
    pub async fn write_blocks(
        &self,
        offset_bytes: u64,
        blocks: &mut Vec<IoBuf>,
        fua: bool,
    ) -> Result<()> {
        let bs = self.block_size_bytes() as usize;
        if !offset_bytes.is_multiple_of(bs as u64) || blocks.iter().any(|b| b.len() != bs) {
            return Err(EngineError::invalid(format!(
                "{}: a write of whole blocks must start on a block and give {bs}-byte blocks",
                self.full_name()
            )));
        }
        let length_bytes = (bs * blocks.len()) as u64;
        let _timer = self.vol.io_stats.start(VolumeOp::Write, length_bytes);
        // Hashed (and probed) first, while the blocks' bytes are in this core's cache
        // (`compress::written_form`): before any wait for a lock or the write throttle.
        let (compression, checksum) = {
            let p = self.vol.ds.props.lock().unwrap();
            (p.compression, p.checksum)
        };
        let forms = WrittenForms::of(compression, checksum, blocks, &self.vol.probe_streak);
        self.modify(
            offset_bytes,
            length_bytes,
            Change::Blocks(blocks, forms),
            fua,
        )
        .await
    }

    /// Writes whole blocks `blocks[0]`, `blocks[1]`, ... from `offset_bytes` (a multiple of
    /// the block size) on, each given **as stored** (a received block, as its sender stored
    /// it: compressed or not, with its checksum): each buffer becomes the block's dirty state
    /// as it is (no copy), and the txg sync writes it as it is (no compression; no checksum
    /// when its checksum type is the volume's). Reads before the sync decode it; a later
    /// partial write decodes it too and makes it an ordinary dirty block.
    ///
    /// A compressed block is decompressed once here, to check that it does (its checksum was
    /// verified by the caller, but a broken sender could checksum bytes that do not
    /// decompress): such a block is refused before anything is changed. For a dataset that
    /// is not logged (`sync=disabled`, as a receive's hidden dataset): the intent log would
    /// need the content, so a logged volume is refused.
    pub async fn write_stored(&self, offset_bytes: u64, blocks: Vec<StoredBlock>) -> Result<()> {
        let bs = self.block_size_bytes() as u64;
        let length_bytes = bs * blocks.len() as u64;
        if blocks.is_empty() {
            return Ok(());
        }
        if self.logged() {
            return Err(EngineError::invalid(format!(
                "{}: blocks are written as stored only into a volume with sync=disabled",
                self.vol.ds.full_name()
            )));
        }
        let mut scratch = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            let at = offset_bytes + i as u64 * bs;
            let form = &block.form;
            let shape_ok = u64::from(form.lsize_bytes) == bs
                && form.psize_bytes <= form.lsize_bytes
                && block.buf.len() >= form.psize_bytes as usize
                && (block.buf.len() as u64).is_multiple_of(oxpool_format::SECTOR_BYTES);
            if !shape_ok || !form.decodes(&block.buf, &mut scratch) {
                return Err(EngineError::invalid(format!(
                    "{}: the block at byte {at} does not decompress to {bs} bytes ({} of {} \
                     stored, {})",
                    self.vol.ds.full_name(),
                    form.psize_bytes,
                    block.buf.len(),
                    form.compression.name()
                )));
            }
        }
        drop(scratch);
        if !offset_bytes.is_multiple_of(bs) {
            return Err(EngineError::invalid(format!(
                "{}: a block written as stored must start at a block boundary, not byte \
                 {offset_bytes}",
                self.vol.ds.full_name()
            )));
        }
        let _timer = self.vol.io_stats.start(VolumeOp::Write, length_bytes);
        self.check_range(offset_bytes, length_bytes, true)?;
        self.pool
            .log_counters
            .client_bytes
            .fetch_add(length_bytes, Ordering::Relaxed);
        let first_b = offset_bytes / bs;
        let last_b = first_b + blocks.len() as u64 - 1;
        let mut node = pin!(RangeLockNode::new());
        let _guard = self
            .vol
            .range_lock
            .lock(node.as_mut(), offset_bytes, length_bytes, LockMode::Write)
            .await;
        self.check_still_in_range(offset_bytes, length_bytes)?;
        let costs = self.space_costs();
        let mut space = ClassBytes::default();
        let _admission = self
            .pool
            .wait_for_space(
                costs.worst(first_b, last_b),
                false,
                &self.vol.ds.reserved_unused_bytes,
            )
            .await?;
        let hold = self.pool.txg.hold(length_bytes).await?;
        let mut dirtied = Dirtied {
            client_bytes: length_bytes,
            ..Dirtied::default()
        };
        {
            let mut d = self.vol.data().dirty.lock().unwrap();
            let (t, spares) = d.txg_and_spares(hold.txg());
            // Bounded by the blocks given.
            for (b, block) in (first_b..).zip(blocks) {
                let dirty = DirtyBlock::Stored(spares.shell(block.buf), block.form);
                if t.blocks.insert(b, dirty).is_none() {
                    dirtied.new_whole_block(bs);
                    space += costs.data;
                    dirtied.level1_blocks += t.charge_indirect(b, &costs, &mut space);
                }
            }
        }
        hold.note_dirty(dirtied, space);
        drop(hold);
        Ok(())
    }

    /// Writes zeros over the range. Whole blocks become holes (no space used; they read as
    /// zeros); partial blocks at the edges are zero-filled.
    pub async fn write_zeroes(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        fua: bool,
    ) -> Result<()> {
        let _timer = self.vol.io_stats.start(VolumeOp::Write, length_bytes);
        self.modify(offset_bytes, length_bytes, Change::Zeros, fua)
            .await
    }

    /// Frees the whole blocks inside the range (they read as zeros afterwards); partial blocks
    /// at the edges are left as they are, as a trim is advisory.
    pub async fn trim(&self, offset_bytes: u64, length_bytes: u64, fua: bool) -> Result<()> {
        let _timer = self.vol.io_stats.start(VolumeOp::Write, length_bytes);
        let bs = self.check_range(offset_bytes, length_bytes, true)? as u64;
        let first = offset_bytes.div_ceil(bs);
        let end = (offset_bytes + length_bytes) / bs;
        if first < end {
            let commit_now = fua || self.vol.ds.props.lock().unwrap().sync == SyncMode::Always;
            let _serial = if commit_now {
                self.serial_guard().await
            } else {
                None
            };
            let itx = self.free_blocks(first, end, true).await?;
            self.commit_if(itx, fua).await?;
        }
        Ok(())
    }

    /// Commits itx `itx` when the write asked for it (FUA) or the volume is `sync=always`.
    async fn commit_if(&self, itx: Option<u64>, fua: bool) -> Result<()> {
        let sync = self.vol.ds.props.lock().unwrap().sync;
        match itx {
            Some(seq) if sync == SyncMode::Always || fua => self.zil_commit(seq).await,
            Some(_) => {
                self.zil_write_early();
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Frees blocks [first, end) in the open txg; with `log`, records it in the intent log
    /// (returns the itx).
    pub(crate) async fn free_blocks(&self, first: u64, end: u64, log: bool) -> Result<Option<u64>> {
        let bs = self.block_size_bytes() as u64;
        let mut node = pin!(RangeLockNode::new());
        let _guard = self
            .vol
            .range_lock
            .lock(
                node.as_mut(),
                first * bs,
                (end - first) * bs,
                LockMode::Write,
            )
            .await;
        self.check_still_in_range(first * bs, (end - first) * bs)?;
        // A free allocates too: the indirect blocks at its ends are rewritten. It may use half
        // of the slop, as it gives space back once synced.
        let costs = self.space_costs();
        let _admission = self
            .pool
            .wait_for_space(costs.worst_free(), true, &self.vol.ds.reserved_unused_bytes)
            .await?;
        let hold = self.pool.txg.hold(0).await?;
        let (space, level1_blocks) =
            self.vol
                .data()
                .dirty
                .lock()
                .unwrap()
                .txgs_add_free(hold.txg(), first, end, &costs);
        let itx = (log && self.logged()).then(|| {
            self.vol.zil.append(
                hold.txg(),
                ItxKind::Free {
                    offset_bytes: first * bs,
                    length_bytes: (end - first) * bs,
                },
            )
        });
        let dirtied = Dirtied {
            level1_blocks,
            ..Dirtied::default()
        };
        hold.note_dirty(dirtied, space);
        Ok(itx)
    }

    /// Sets the volume's size to `new_size_bytes` (validated: a non-zero multiple of the block
    /// size). The caller holds [`VolumeInner::resizing`], so the size it starts from is the
    /// size it changes. Returns once the change is durable: the txg holding it has synced.
    ///
    /// The change is made under a write range lock over everything past the smaller of the
    /// two sizes, taken as writes take theirs (range lock, then txg hold) and kept until the
    /// sync:
    /// - A shrink waits for every request in flight past the new end. A read-modify-write
    ///   holds its lock from reading the block's old content until the new content is in the
    ///   txg, so none can put the old content back after the free; a request that waited for
    ///   a lock past the new end finds the new size once it has it, and fails as out of range.
    ///   So the free is the last change to the blocks cut off in its txg (a block freed in a
    ///   txg is never partial in it), and they read as zeros after a regrow.
    /// - Every intent-log record past the new end belongs to the shrink's txg or an older one,
    ///   which replay skips once that txg has synced: a crash after the shrink returned
    ///   brings back neither the old size nor the data cut off. (A commit that reads such a
    ///   record's data waits for the lock, i.e. for that sync, and then drops the record.)
    /// - A grow is durable before any request can use the new space (the lock covers it until
    ///   the sync), so replay, which clips records to the size it finds, never drops an
    ///   acknowledged write past the old end.
    pub(crate) async fn resize(&self, new_size_bytes: u64) -> Result<()> {
        let (old_size, bs) = {
            let p = self.vol.ds.props.lock().unwrap();
            (p.volsize_bytes, p.volblocksize_bytes as u64)
        };
        if new_size_bytes == old_size {
            return Ok(());
        }
        let from = new_size_bytes.min(old_size);
        let mut node = pin!(RangeLockNode::new());
        let _guard = self
            .vol
            .range_lock
            .lock(node.as_mut(), from, u64::MAX - from, LockMode::Write)
            .await;
        // A shrink's free allocates too: the indirect blocks at its ends are rewritten.
        let costs = self.space_costs();
        let _admission = self
            .pool
            .wait_for_space(costs.worst_free(), true, &self.vol.ds.reserved_unused_bytes)
            .await?;
        let hold = self.pool.txg.hold(0).await?;
        let txg = hold.txg();
        let mut space = ClassBytes::default();
        let mut dirtied = Dirtied::default();
        {
            // The size is persisted by the sync of this txg, with the free (not by a sync of
            // an older txg still running, whose tree still has the blocks).
            let mut d = self.vol.data().dirty.lock().unwrap();
            let t = d.txg_mut(txg);
            if new_size_bytes < old_size {
                dirtied.level1_blocks +=
                    t.free_charged(new_size_bytes / bs, old_size / bs, &costs, &mut space);
            }
            t.size_bytes = Some(new_size_bytes);
        }
        self.vol.ds.props.lock().unwrap().volsize_bytes = new_size_bytes;
        hold.note_dirty(dirtied, space);
        drop(hold);
        self.pool.txg.wait_synced(txg, true).await
    }

    /// What the sync allocates for this volume's blocks (see [`SpaceCosts`]).
    pub(crate) fn space_costs(&self) -> SpaceCosts {
        let levels = self.vol.data().tree.lock().unwrap().levels();
        SpaceCosts::new(&self.vol.ds.props.lock().unwrap(), levels)
    }

    /// Whether changes go to the intent log (not with `sync=disabled`).
    fn logged(&self) -> bool {
        self.vol.ds.props.lock().unwrap().sync != SyncMode::Disabled
    }

    /// Write or write-zeroes over a range.
    async fn modify(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        change: Change<'_>,
        fua: bool,
    ) -> Result<()> {
        self.check_range(offset_bytes, length_bytes, true)?;
        if length_bytes == 0 {
            return Ok(());
        }
        self.pool
            .log_counters
            .client_bytes
            .fetch_add(length_bytes, Ordering::Relaxed);
        let commit_now = fua || self.vol.ds.props.lock().unwrap().sync == SyncMode::Always;
        let _serial = if commit_now {
            self.serial_guard().await
        } else {
            None
        };
        // The range lock is released before the commit: the commit reads logged ranges.
        let itx = self
            .modify_locked(offset_bytes, length_bytes, change, commit_now)
            .await?;
        self.commit_if(itx, fua).await
    }

    async fn modify_locked(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        change: Change<'_>,
        commit_now: bool,
    ) -> Result<Option<u64>> {
        let bs = self.block_size_bytes() as u64;
        // A committed write's itx carries its bytes; whole blocks handed over are copied for
        // it here, before they become dirty blocks (only FUA and `sync=always` writes).
        let logged_blocks: Option<Arc<[u8]>> = match &change {
            Change::Blocks(blocks, _) if commit_now && self.logged() => {
                Some(blocks.iter().flat_map(|b| b.iter().copied()).collect())
            }
            _ => None,
        };
        let (data, mut owned, forms) = match change {
            Change::Zeros => (None, None, None),
            Change::Bytes(d) => (Some(d), None, None),
            Change::Blocks(blocks, forms) => (None, Some(blocks), Some(forms)),
        };
        let zeros = data.is_none() && owned.is_none();
        let end = offset_bytes + length_bytes;
        let first_b = offset_bytes / bs;
        let last_b = (end - 1) / bs;
        let mut node = pin!(RangeLockNode::new());
        let _guard = self
            .vol
            .range_lock
            .lock(
                node.as_mut(),
                first_b * bs,
                (last_b + 1 - first_b) * bs,
                LockMode::Write,
            )
            .await;
        self.check_still_in_range(offset_bytes, length_bytes)?;
        // A partial head or tail block that is not sector-aligned needs the block's content
        // (read-modify-write), read before taking the txg hold so a slow read does not hold
        // up the txg's quiesce. A sector-aligned one needs none (a partial dirty block).
        let head_lo = (offset_bytes - first_b * bs) as usize;
        let head_hi = (end.min((first_b + 1) * bs) - first_b * bs) as usize;
        let tail_hi = (end - last_b * bs) as usize;
        let head_partial = head_lo != 0 || head_hi != bs as usize;
        let tail_partial = last_b != first_b && tail_hi != bs as usize;
        let mut head = if head_partial && !SectorMask::aligned(head_lo, head_hi) {
            Some(self.block_content(first_b, bs as usize).await?)
        } else {
            None
        };
        let mut tail = if tail_partial && !SectorMask::aligned(0, tail_hi) {
            Some(self.block_content(last_b, bs as usize).await?)
        } else {
            None
        };
        // What this change makes dirty in its txg (for the sync's start: `Dirtied`).
        let mut dirtied = Dirtied {
            client_bytes: length_bytes,
            ..Dirtied::default()
        };
        // The space its txg's sync will need, charged below for what is new to the txg; the
        // writer waits (or gets ENOSPC) if the worst case does not fit.
        let costs = self.space_costs();
        let mut space = ClassBytes::default();
        // Zeros dirty their two edge blocks at most: the whole blocks between become a free
        // range, which costs only the indirect blocks at its ends. Counted as data, a zero
        // larger than the pool's free space was refused (ENOSPC) while it gives space back,
        // and one larger than the dirty limit waited for a sync it did not need.
        let (worst, dirty_bytes) = if zeros {
            let edges = costs.worst(first_b, first_b) + costs.worst(last_b, last_b);
            (edges + costs.worst_free(), length_bytes.min(2 * bs))
        } else {
            (costs.worst(first_b, last_b), length_bytes.max(bs))
        };
        let _admission = self
            .pool
            .wait_for_space(worst, false, &self.vol.ds.reserved_unused_bytes)
            .await?;
        let hold = self.pool.txg.hold(dirty_bytes.max(bs)).await?;
        {
            let mut d = self.vol.data().dirty.lock().unwrap();
            // The newest state of the partial blocks new to this txg, which start from it,
            // taken before this txg's set is borrowed (this txg is the newest dirty one). Not
            // for blocks this txg has: their buffer would be shared and make_mut would copy.
            let txg = hold.txg();
            let new_here = |d: &ObjectDirty, b: u64| {
                !d.txgs
                    .iter()
                    .any(|(x, t)| *x == txg && t.blocks.contains_key(&b))
            };
            let head_src = (head_partial && new_here(&d, first_b)).then(|| d.source(first_b));
            let tail_src = (tail_partial && new_here(&d, last_b)).then(|| d.source(last_b));
            let (t, spares) = d.txg_and_spares(hold.txg());
            // Whole zero blocks become a free range (holes).
            if zeros {
                let zfirst = offset_bytes.div_ceil(bs);
                let zend = end / bs;
                if zfirst < zend {
                    dirtied.level1_blocks += t.free_charged(zfirst, zend, &costs, &mut space);
                }
            }
            let whole = SectorMask::whole(bs as usize);
            let mut handed = owned.as_mut().map(|blocks| blocks.drain(..));
            // Bounded by the blocks of the request; for zeros by its two edge blocks, as the
            // whole blocks between are freed above (a zero may span 4 GiB: 8 million blocks
            // of 512 bytes, each visited under the dirty lock, before).
            let second = if zeros {
                last_b.max(first_b + 1)
            } else {
                first_b + 1
            };
            for b in std::iter::once(first_b).chain(second..=last_b) {
                if let Some(handed) = handed.as_mut() {
                    // A whole block handed over: it replaces whatever this txg had.
                    let buf = handed.next().expect("one buffer per block (checked)");
                    debug_assert_eq!(buf.len(), bs as usize);
                    let form = forms.as_ref().and_then(|f| f.get((b - first_b) as usize));
                    let block = match form {
                        // Stored as is, its checksum computed on arrival.
                        Some(form) => DirtyBlock::Stored(spares.shell(buf), form),
                        None => DirtyBlock::Data(spares.shell(buf)),
                    };
                    if t.blocks.insert(b, block).is_none() {
                        dirtied.new_whole_block(bs);
                        space += costs.data;
                        dirtied.level1_blocks += t.charge_indirect(b, &costs, &mut space);
                    }
                    continue;
                }
                let bstart = b * bs;
                let lo = offset_bytes.max(bstart);
                let hi = end.min(bstart + bs);
                let full = lo == bstart && hi == bstart + bs;
                if zeros && full {
                    continue; // freed above
                }
                let in_block = (lo - bstart) as usize;
                let len = (hi - lo) as usize;
                let src =
                    data.map(|d| &d[(lo - offset_bytes) as usize..(hi - offset_bytes) as usize]);
                let put = |buf: &mut [u8]| match src {
                    Some(s) => buf[in_block..in_block + len].copy_from_slice(s),
                    None => buf[in_block..in_block + len].fill(0),
                };
                let written = SectorMask::touching(in_block, in_block + len);
                let aligned = SectorMask::aligned(in_block, in_block + len);
                // The read-modify-write base of this block, if one was taken.
                let base = if b == first_b {
                    head.take()
                } else if b == last_b {
                    tail.take()
                } else {
                    None
                };
                match t.blocks.get_mut(&b) {
                    Some(DirtyBlock::Data(buf)) => {
                        // Unique unless a sync of this very txg holds it, which cannot happen
                        // while we hold the txg: make_mut never copies in practice. (The
                        // base, if any, may be this very buffer: dropped above, so that
                        // make_mut does not copy.)
                        drop(base);
                        put(&mut Arc::make_mut(buf)[..]);
                    }
                    Some(DirtyBlock::Partial(buf, have)) if aligned => {
                        put(&mut Arc::make_mut(buf)[..]);
                        *have = have.union(&written);
                        if have.contains(&whole) {
                            let buf = Arc::clone(buf);
                            t.blocks.insert(b, DirtyBlock::Data(buf));
                        }
                    }
                    Some(DirtyBlock::Stored(stored, form)) => {
                        // A block stored as received, overwritten in part (or whole) in the
                        // same txg: its content, decoded, takes the write, and the sync
                        // stores it by the volume's properties like any written block.
                        drop(base);
                        let content = form.content(stored);
                        let mut buf = IoBuf::from_slice(&content[..bs as usize]);
                        drop(content);
                        put(&mut buf);
                        t.blocks.insert(b, DirtyBlock::Data(spares.shell(buf)));
                    }
                    Some(DirtyBlock::Partial(..)) => {
                        // Not sector-aligned: the base is the block's whole current content,
                        // this txg's sectors included (read under the range lock).
                        let base = base.expect("an unaligned partial block has a base");
                        let mut buf = base.to_block(bs as usize);
                        put(&mut buf);
                        t.blocks.insert(b, DirtyBlock::Data(spares.shell(buf)));
                    }
                    None => {
                        let block = if full {
                            // The client's bytes, copied once (not zeroed first). A whole
                            // block of zeros has no source: it was freed above.
                            let buf = IoBuf::from_slice(src.expect("a whole block written"));
                            DirtyBlock::Data(spares.shell(buf))
                        } else if let Some(base) = base {
                            let mut buf = base.to_block(bs as usize);
                            put(&mut buf);
                            DirtyBlock::Data(spares.shell(buf))
                        } else {
                            let source = if b == first_b { &head_src } else { &tail_src };
                            match source.as_ref().expect("a partial block has a source") {
                                // Its content is in memory: a whole block, no read needed.
                                Source::Dirty(older) => {
                                    let mut buf = IoBuf::from_slice(&older[..bs as usize]);
                                    put(&mut buf);
                                    DirtyBlock::Data(spares.shell(buf))
                                }
                                Source::Zero => {
                                    let mut buf = IoBuf::zeroed(bs as usize);
                                    put(&mut buf);
                                    DirtyBlock::Data(spares.shell(buf))
                                }
                                // The rest of it is on the devices (or in an older partial
                                // block): the sync of this txg reads it once.
                                Source::Partial | Source::Tree => {
                                    let mut buf = IoBuf::zeroed(bs as usize);
                                    put(&mut buf);
                                    DirtyBlock::Partial(spares.shell(buf), written)
                                }
                            }
                        };
                        t.blocks.insert(b, block);
                        if full {
                            dirtied.new_whole_block(bs);
                        } else {
                            dirtied.new_partial_block(bs);
                        }
                        space += costs.data;
                        dirtied.level1_blocks += t.charge_indirect(b, &costs, &mut space);
                    }
                }
            }
        }
        // Log the change under the range lock, so overlapping changes log in their order. A
        // write committed right away carries its data; others are read at commit time, if a
        // commit ever comes.
        let itx = self.logged().then(|| {
            let kind = match data {
                Some(d) => ItxKind::Write {
                    offset_bytes,
                    length_bytes,
                    data: commit_now.then(|| std::sync::Arc::from(d)),
                },
                None if owned.is_some() => ItxKind::Write {
                    offset_bytes,
                    length_bytes,
                    data: logged_blocks,
                },
                None => ItxKind::Zero {
                    offset_bytes,
                    length_bytes,
                },
            };
            self.vol.zil.append(hold.txg(), kind)
        });
        debug_assert!(
            space
                .0
                .iter()
                .zip(worst.0.iter())
                .all(|(charged, admitted)| charged <= admitted),
            "charged {space:?} beyond the admitted worst case {worst:?}"
        );
        hold.note_dirty(dirtied, space);
        drop(hold);
        Ok(itx)
    }

    /// Makes every change to this volume completed before this call durable, whichever
    /// connection made it (NBD FLUSH with multi-connection semantics), through the intent log.
    /// A no-op with `sync=disabled`.
    pub async fn flush(&self) -> Result<()> {
        let _timer = self.vol.io_stats.start(VolumeOp::Flush, 0);
        if !self.logged() {
            return Ok(());
        }
        let _serial = self.serial_guard().await;
        self.zil_commit(self.vol.zil.last_itx()).await
    }

    /// Allocation state of the blocks covering [offset, offset+length), as runs of
    /// (length_bytes, state), each state other than the one before it. At most `runs_max`
    /// (at least 1): they add up to the range, or, where more runs would follow, to the part
    /// of it those runs cover from its start (an NBD reply describes no more than its
    /// descriptors, so the walk stops where they do, not at the range's end).
    pub async fn block_status(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        runs_max: usize,
    ) -> Result<Vec<(u64, BlockState)>> {
        assert!(runs_max >= 1, "block_status asked for no run");
        let bs = self.check_range(offset_bytes, length_bytes, false)? as u64;
        let end = offset_bytes + length_bytes;
        let mut runs: Vec<(u64, BlockState)> = Vec::new();
        let mut pos = offset_bytes;
        // Bounded by the blocks in the range; holes in the tree are skipped a subtree at a time.
        while pos < end {
            let b = pos / bs;
            let dirty = self.vol.data().dirty.lock().unwrap().is_dirty_data(b);
            let (state, next_b) = match dirty {
                Some(true) => (BlockState::Data, b + 1),
                Some(false) => (BlockState::Hole, b + 1),
                None => {
                    let walked = walk(
                        &self.vol.data().tree,
                        &self.pool.zio,
                        IoClass::SyncRead,
                        b,
                        1,
                        false,
                        &self.vol.ds.names,
                    )
                    .await?;
                    match walked {
                        Walk::Hole { level } => (BlockState::Hole, skip_hole(b, level).max(b + 1)),
                        Walk::Cached => {
                            let bp = lookup(
                                &self.vol.data().tree,
                                &self.pool.zio,
                                IoClass::SyncRead,
                                b,
                                &self.vol.ds.names,
                            )
                            .await?;
                            let s = if bp.is_hole() {
                                BlockState::Hole
                            } else {
                                BlockState::Data
                            };
                            (s, b + 1)
                        }
                    }
                }
            };
            // A skipped hole subtree may contain blocks dirty in memory: only skip past the
            // next block if none of them is dirty (checked one by one would defeat the skip,
            // so stop the skip at the first dirty block instead).
            let next_b = if next_b > b + 1 {
                let d = self.vol.data().dirty.lock().unwrap();
                let first_dirty = d
                    .txgs
                    .iter()
                    .flat_map(|(_, t)| t.blocks.keys().copied())
                    .filter(|&x| x > b && x < next_b)
                    .min();
                first_dirty.unwrap_or(next_b)
            } else {
                next_b
            };
            // A skipped hole subtree can end past 2^64 bytes (its span is 255^levels
            // blocks); the range's end bounds it.
            let next_pos = next_b.checked_mul(bs).map_or(end, |p| p.min(end));
            assert!(next_pos > pos, "block_status made no progress at {pos}");
            match runs.last_mut() {
                Some((len, last)) if *last == state => *len += next_pos - pos,
                _ => runs.push((next_pos - pos, state)),
            }
            if runs.len() > runs_max {
                // A run past the last one asked for began: the runs before it are whole.
                runs.pop();
                break;
            }
            pos = next_pos;
        }
        Ok(runs)
    }

    /// Bytes allocated to this volume's blocks as of the last txg sync.
    pub fn used_bytes(&self) -> u64 {
        self.vol.data().used_bytes.load(Ordering::Relaxed)
    }

    /// The logical size of the volume's data blocks as of the last txg sync: what they hold
    /// before compression, one copy, holes not counted (`logicalused`). Every data block holds
    /// `volblocksize` bytes, and the tree's root counts the data blocks below it (`fill`).
    pub fn logical_bytes(&self) -> u64 {
        let fill = self.vol.data().tree.lock().unwrap().root().fill;
        fill.saturating_mul(u64::from(self.block_size_bytes()))
    }

    /// The pointer of data block `b` as the tree holds it now (a hole for a block never
    /// written, freed, or stored as a hole): how and where the block is stored, for tools and
    /// tests. Dirty data not yet synced is not in it.
    pub async fn block_pointer(&self, b: u64) -> Result<oxpool_format::BlockPtr> {
        let bs = u64::from(self.block_size_bytes());
        self.check_range(b.saturating_mul(bs), bs, false)?;
        lookup(
            &self.vol.data().tree,
            &self.pool.zio,
            IoClass::SyncRead,
            b,
            &self.vol.ds.names,
        )
        .await
    }

    /// What the volume's data blocks take as stored, one copy each, as of the last txg sync.
    pub fn compressed_bytes(&self) -> u64 {
        self.vol.data().compressed_bytes.load(Ordering::Relaxed)
    }

    /// Reads a volume property: a settable one (see [`VolumeProps`]) or a statistic
    /// ([`crate::props::VOLUME_STAT_NAMES`]), as `oxpool get` shows it.
    pub fn get_prop(&self, name: &str) -> Result<String> {
        Ok(match name {
            "used" => self.used_bytes().to_string(),
            "logicalused" | "logicalreferenced" => self.logical_bytes().to_string(),
            "compressratio" => {
                let (logical, stored) = (self.logical_bytes(), self.compressed_bytes());
                // As ZFS: 1.00x for a volume with no data.
                let ratio = if logical == 0 || stored == 0 {
                    1.0
                } else {
                    logical as f64 / stored as f64
                };
                format!("{ratio:.2}x")
            }
            _ => return self.props().get(name),
        })
    }
}

/// What a change writes over its range ([`Volume::modify`]).
enum Change<'a> {
    /// Zeros (write-zeroes): whole blocks become holes.
    Zeros,
    /// The client's bytes, copied into the blocks they cover.
    Bytes(&'a [u8]),
    /// Whole blocks, one buffer each, in order: each becomes its block's dirty state, stored
    /// as is with its checksum where the forms say so.
    Blocks(&'a mut Vec<IoBuf>, WrittenForms),
}

/// A block a read needs from the devices: (block, in-block offset, output range, sectors
/// needed).
type FromTree = (u64, usize, std::ops::Range<usize>, SectorMask);

/// A group of [`Volume::plan_read_groups`]: its blocks' range of the request's `FromTree`
/// list, and its pointers' range of the pointer list (empty: one block, looked up).
type ReadGroup = (std::ops::Range<usize>, std::ops::Range<usize>);

thread_local! {
    /// The lists of a read that goes to the devices (see [`oxpool_io::scratch`]): lent per
    /// request, so that a multi-block read allocates nothing in steady state.
    static FROM_TREE: Stash<Vec<FromTree>> = const { Stash::new() };
    static GROUPS: Stash<Vec<ReadGroup>> = const { Stash::new() };
    static GROUP_POINTERS: Stash<Vec<BlockPtr>> = const { Stash::new() };
    static RUN_BLOCKS: Stash<Vec<RunBlock>> = const { Stash::new() };
}

/// What [`Volume::read_tree`] found for a block: its cache key (to try the data cache) or the
/// verified block read from the devices.
enum TreeRead<'a> {
    Cached(&'a CacheKey),
    Read(CacheKey, IoBuf),
}
