//! The sync of one object: the txg's frees, its data blocks (merged with their old content
//! when only some sectors were written, compressed, placed next to each other, adopted from
//! the intent log when it already wrote them in place), then the indirect blocks above them,
//! bottom up. The dataset layer calls it for each object of each dataset; it hands the blocks
//! to the pipeline and the places it frees back to the caller.

use crate::dmu::dirty::{indirect_copies, DirtyBlock, StoredForm};
use crate::dmu::object::Object;
use crate::dmu::tree::{capacity, lookup, skip_hole, walk, Walk, FANOUT};
use crate::props::VolumeProps;
use crate::sector_mask::{copy_runs, SectorMask};
use crate::spa::block::{
    alloc_new_block_checksummed, padded, write_new_blocks, NewBlock, SYNC_WRITES_IN_FLIGHT_MAX,
};
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::compress::stored_bytes;
use crate::zio::data_cache::CacheKey;
use crate::zio::{read_data_block, write_blocks_shared};
use crate::{EngineError, Result};
use oxpool_format::{
    BlockPtr, BlockType, Checksum, Compression, Dva, Txg, INDIRECT_BLOCK_BYTES, SECTOR_BYTES,
};
use oxpool_io::rt::{join2, join_all_bounded};
use oxpool_io::IoBuf;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A dirty data block once the sync has its whole content.
// Lives only in one batch's vector (at most SYNC_WRITES_IN_FLIGHT_MAX): boxing the pointers
// would cost an allocation per block to save a few KiB for a moment.
#[allow(clippy::large_enum_variant)]
enum Prepared {
    /// Nothing to write: the block the log wrote in place with this content.
    Done(BlockPtr, Option<BlockPtr>),
    /// The content: the merged block for a partial one, else the dirty buffer.
    Content(Option<IoBuf>),
}

/// What the sync does with one dirty data block.
#[allow(clippy::large_enum_variant)]
enum DataWrite {
    /// Nothing to write: the block's pointer (a hole, or the block the log wrote in place),
    /// and the log's block to free if it is not that one.
    Done(BlockPtr, Option<BlockPtr>),
    /// Write `data` (the stored bytes, whole sectors) to a new place as `nb` (whose checksum
    /// is `checksum` when already known).
    Write {
        nb: NewBlock,
        data: Arc<IoBuf>,
        cache: CacheAfter,
        checksum: Option<Checksum>,
    },
}

/// What a txg left of a data block.
#[derive(Clone, Copy)]
enum Kind {
    /// All of it, as content.
    Whole,
    /// These sectors (the rest is the block's content before the txg).
    Partial(SectorMask),
    /// All of it, already stored as `StoredForm` says: written as it is.
    Stored(StoredForm),
}

/// What goes to the data cache once a block is written (the cache holds content).
enum CacheAfter {
    Nothing,
    /// The buffer written, which is the content (a merged block stored as is).
    Written,
    /// This content (a merged block stored compressed).
    Content(IoBuf),
}

/// Where the blocks an object's sync replaces or removes go: a block born after the
/// dataset's previous snapshot is the dataset's alone and is freed; one born at or before it
/// is still referenced by that snapshot and goes to the dataset's deadlist (the birth-txg
/// rule). Places that never were in a tree (the intent log's unadopted in-place blocks) are
/// freed directly. Also counts the change of `written` (bytes born after the snapshot).
pub(crate) struct Kills<'a> {
    /// Places freed by this sync.
    pub freed: &'a mut Vec<Dva>,
    /// Blocks killed that a snapshot still references.
    pub dead: Vec<BlockPtr>,
    /// The dataset's previous snapshot's txg (0: none).
    pub prev_snap_txg: Txg,
    /// Change of the bytes born after `prev_snap_txg` (every copy).
    pub written_delta: i64,
}

impl<'a> Kills<'a> {
    /// Kills into `freed`, for a dataset whose previous snapshot is `prev_snap_txg`.
    pub(crate) fn new(freed: &'a mut Vec<Dva>, prev_snap_txg: Txg) -> Kills<'a> {
        Kills {
            freed,
            dead: Vec::new(),
            prev_snap_txg,
            written_delta: 0,
        }
    }

    /// A tree block is no longer referenced by the dataset.
    pub(crate) fn kill(&mut self, bp: &BlockPtr) {
        if bp.is_hole() {
            return;
        }
        if bp.birth > self.prev_snap_txg {
            self.written_delta -= asize_all(bp) as i64;
            self.freed.extend_from_slice(bp.dvas());
        } else {
            self.dead.push(*bp);
        }
    }

    /// A tree block was written for the dataset.
    pub(crate) fn born(&mut self, bp: &BlockPtr) {
        self.written_delta += asize_all(bp) as i64;
    }
}

/// Allocated bytes of a block, every copy.
pub(crate) fn asize_all(bp: &BlockPtr) -> u64 {
    bp.dvas().iter().map(|d| u64::from(d.asize_bytes)).sum()
}

/// One batch of data blocks placed and ready to write: the blocks, their new pointers (or
/// their placement's error), and the writes to issue (index in the batch, new pointer,
/// stored bytes, what goes to the data cache afterwards).
struct BatchPlanned<'a> {
    batch: &'a [(u64, Arc<IoBuf>, Kind)],
    ptrs: Vec<Result<(BlockPtr, Option<BlockPtr>)>>,
    writes: Vec<(usize, BlockPtr, Arc<IoBuf>, CacheAfter)>,
}

/// One batch of data blocks whose writes are done, with each write's result.
struct BatchWritten<'a> {
    planned: BatchPlanned<'a>,
    written: Vec<Result<()>>,
}

/// After a batch's writes: caches what goes to the data cache, and puts the blocks in the
/// tree (in block order), counting the space they use and kill.
async fn finish_batch(
    inner: &Spa,
    obj: &Object,
    what: &str,
    done: BatchWritten<'_>,
    kills: &mut Kills<'_>,
    used_delta: &mut i64,
    compressed_delta: &mut i64,
) -> Result<()> {
    let BatchWritten {
        planned:
            BatchPlanned {
                batch,
                mut ptrs,
                writes,
            },
        written,
    } = done;
    for ((i, bp, data, cache), r) in writes.into_iter().zip(written) {
        if let Err(e) = r {
            ptrs[i] = Err(e);
            continue;
        }
        match cache {
            CacheAfter::Nothing => {}
            // The write gave its references back: the merged buffer is ours again.
            CacheAfter::Written => {
                if let Ok(buf) = Arc::try_unwrap(data) {
                    inner.zio.data_cache.insert(CacheKey::of(&bp), buf);
                }
            }
            CacheAfter::Content(buf) => inner.zio.data_cache.insert(CacheKey::of(&bp), buf),
        }
    }
    for ((b, _, _), ptr) in batch.iter().zip(ptrs) {
        let (ptr, unused) = ptr?;
        if let Some(u) = unused {
            kills.freed.extend_from_slice(u.dvas());
        }
        walk(&obj.tree, &inner.zio, IoClass::AsyncRead, *b, 1, true, what).await?;
        let old = obj
            .tree
            .lock()
            .unwrap()
            .set_data_ptr(*b, ptr)
            .expect("level-1 block cached by the walk");
        *used_delta += ptr.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
        *used_delta -= old.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
        *compressed_delta += stored_bytes(&ptr) - stored_bytes(&old);
        kills.born(&ptr);
        kills.kill(&old);
    }
    Ok(())
}

/// What the sync of one object's data blocks needs to prepare a batch.
struct DataSync<'a> {
    inner: &'a Spa,
    obj: &'a Object,
    what: &'a str,
    txg: Txg,
    props: &'a VolumeProps,
    /// Blocks the intent log wrote in place in this txg, by block index.
    overrides: &'a HashMap<u64, crate::zio::compress::InPlaceBlock>,
    /// The dataset's previous snapshot's txg: an old block born at or before it stays, a
    /// snapshot's (`Kills`).
    prev_snap_txg: Txg,
}

impl DataSync<'_> {
    /// Prepares one batch: merges partial blocks with their old content, finds the blocks
    /// the log already wrote with this content, decides how each is stored (compressed, as
    /// is, a hole) with its checksum, and gives the blocks to write adjacent places.
    async fn plan_batch<'b>(
        &self,
        batch: &'b [(u64, Arc<IoBuf>, Kind)],
    ) -> Result<BatchPlanned<'b>> {
        let DataSync {
            inner,
            obj,
            what,
            txg,
            props: data_props,
            overrides,
            prev_snap_txg,
        } = *self;
        let bs = data_props.volblocksize_bytes;
        let compression = data_props.compression;
        // Merge partial blocks with their old content (reads it: frees of this txg, applied
        // above, never cover a partial block of this txg); find the blocks the log already
        // wrote with this content. Only partial blocks wait for anything: the others are
        // prepared here, and only the merges become futures (a sequential stream has none, so
        // its batches move no futures around).
        // `form`: the block's stored form if the writer checksummed it on arrival; then, with
        // the log's algorithm, that checksum is compared instead of hashing the block again
        // (an uncompressed block's content is its stored bytes).
        let adopted = |b: &u64, buf: &IoBuf, form: Option<&StoredForm>| -> Option<Prepared> {
            let o = overrides.get(b)?;
            let holds = match form {
                Some(f) if f.checksum_type == o.bp.checksum_type => {
                    f.checksum == o.content_checksum
                }
                _ => o.holds(buf),
            };
            holds.then(|| {
                inner
                    .log_counters
                    .adopted_blocks
                    .fetch_add(1, Ordering::Relaxed);
                Prepared::Done(o.bp, None)
            })
        };
        let mut prepared: Vec<Prepared> = Vec::with_capacity(batch.len());
        let mut merges = Vec::new();
        for (i, (b, dirty_buf, written)) in batch.iter().enumerate() {
            prepared.push(match written {
                // Stored blocks are written as they are, never merged. Uncompressed ones
                // (hashed on arrival by the writer, `compress::written_form`, or received so)
                // hold their content as is, which the log may have written in place.
                Kind::Stored(form) if form.compression == Compression::Off => {
                    adopted(b, dirty_buf, Some(form)).unwrap_or(Prepared::Content(None))
                }
                // Received compressed, as the sender stored it: not compared with the log's
                // blocks (a volume that takes received blocks is not logged).
                Kind::Stored(_) => Prepared::Content(None),
                Kind::Whole => adopted(b, dirty_buf, None).unwrap_or(Prepared::Content(None)),
                Kind::Partial(w) => {
                    let partial = PartialBlock {
                        index: *b,
                        buf: dirty_buf,
                        written: w,
                    };
                    merges.push(async move {
                        let merged = merge_partial(
                            inner,
                            obj,
                            what,
                            txg,
                            partial,
                            bs as usize,
                            prev_snap_txg,
                        )
                        .await?;
                        Ok::<_, EngineError>((i, merged))
                    });
                    // Filled in below, when the merge is done.
                    Prepared::Content(None)
                }
            });
        }
        if !merges.is_empty() {
            // A window of merge reads, not the whole batch at once: a device queue holding a
            // batch of reads (256) is milliseconds deep, and every log write of a sync
            // writer waits behind it (see MERGE_READS_IN_FLIGHT_MAX).
            let mut first_error = None;
            for done in join_all_bounded(merges, MERGE_READS_IN_FLIGHT_MAX).await {
                match done {
                    Ok((i, merged)) => {
                        prepared[i] = adopted(&batch[i].0, &merged, None)
                            .unwrap_or(Prepared::Content(Some(merged)))
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        // How each block is stored (compressed, as is, or a hole) and the stored bytes'
        // checksums: CPU work, done here between the merge reads and the writes, on every
        // core (`store_all`).
        let contents: Vec<&[u8]> = prepared
            .iter()
            .zip(batch)
            .filter_map(|(p, (_, dirty_buf, kind))| match (p, kind) {
                (Prepared::Done(..), _) | (_, Kind::Stored(_)) => None,
                (Prepared::Content(merged), _) => Some(&merged.as_ref().unwrap_or(dirty_buf)[..]),
            })
            .collect();
        // The previous batch's writes, started just before by the same task, go to the
        // kernel now: this work does not yield for milliseconds (2026-11-27 profile: each
        // batch's writes began only after the next batch's compression, so the device idled
        // half the time and a sync wrote at about half its rate).
        oxpool_io::rt::submit_queued();
        let mut stored_forms =
            crate::zio::compress::store_all(compression, data_props.checksum, &contents)
                .into_iter();
        drop(contents);
        let mut to_write: Vec<DataWrite> = Vec::with_capacity(batch.len());
        for (p, (b, dirty_buf, kind)) in prepared.into_iter().zip(batch) {
            to_write.push(match (p, kind) {
                (Prepared::Done(bp, unused), _) => DataWrite::Done(bp, unused),
                (Prepared::Content(_), Kind::Stored(form)) => {
                    crate::zio::compress::COMPRESS_COUNTERS.note_stored(form);
                    // As it was stored by whoever made it (a sender, or the writer that
                    // hashed it on arrival): its compression and stored size; its checksum if
                    // of the volume's type, else the volume's checksum of the same bytes.
                    let nb = NewBlock {
                        psize_bytes: form.psize_bytes,
                        lsize_bytes: form.lsize_bytes,
                        compression: form.compression,
                        ..NewBlock::data(data_props, txg)
                    };
                    let checksum =
                        (form.checksum_type == nb.checksum_type).then_some(form.checksum);
                    if checksum.is_some() {
                        inner
                            .log_counters
                            .presummed_blocks
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    DataWrite::Write {
                        nb,
                        data: Arc::clone(dirty_buf),
                        cache: CacheAfter::Nothing,
                        checksum,
                    }
                }
                (Prepared::Content(merged), _) => {
                    let buf: &IoBuf = merged.as_ref().unwrap_or(dirty_buf);
                    let crate::zio::compress::Stored {
                        form: stored,
                        checksum,
                    } = stored_forms.next().expect("one stored form per content");
                    crate::zio::compress::COMPRESS_COUNTERS.note_written(buf.len(), &stored);
                    let nb = NewBlock::data(data_props, txg);
                    match stored {
                        // All zeros, compression on: a hole, as ZFS does.
                        crate::zio::compress::StoreAs::Hole => DataWrite::Done(
                            crate::zio::compress::zero_hole(txg),
                            overrides.get(b).map(|o| o.bp),
                        ),
                        crate::zio::compress::StoreAs::Compressed(c) => DataWrite::Write {
                            nb: nb.compressed(&c),
                            data: Arc::new(c.buf),
                            // The merged block goes to the data cache as its content.
                            cache: merged.map_or(CacheAfter::Nothing, CacheAfter::Content),
                            checksum,
                        },
                        crate::zio::compress::StoreAs::AsIs
                            if !(buf.len() as u64).is_multiple_of(SECTOR_BYTES) =>
                        {
                            // A block smaller than a sector is written padded (a copy).
                            DataWrite::Write {
                                nb,
                                data: Arc::new(padded(buf)),
                                cache: CacheAfter::Nothing,
                                checksum,
                            }
                        }
                        crate::zio::compress::StoreAs::AsIs => match merged {
                            // The merged block is the sync's own: once written it goes to the
                            // data cache (no copy), so the next partial write to the block
                            // merges from memory.
                            Some(merged) => DataWrite::Write {
                                nb,
                                data: Arc::new(merged),
                                cache: CacheAfter::Written,
                                checksum,
                            },
                            // A whole dirty block is written from the buffer readers share
                            // until the txg retires (no copy). It is not cached: seldom merged
                            // again, it would only crowd out what reads brought in.
                            None => DataWrite::Write {
                                nb,
                                data: Arc::clone(dirty_buf),
                                cache: CacheAfter::Nothing,
                                checksum,
                            },
                        },
                    }
                }
            });
        }
        // Places in block order, so that next-fit hands out adjacent ones and the writes of
        // the batch aggregate into a few large I/Os.
        let mut ptrs: Vec<Result<(BlockPtr, Option<BlockPtr>)>> = Vec::with_capacity(batch.len());
        let mut writes: Vec<(usize, BlockPtr, Arc<IoBuf>, CacheAfter)> = Vec::new();
        for (i, (w, (b, _, _))) in to_write.into_iter().zip(batch).enumerate() {
            match w {
                DataWrite::Done(bp, unused) => ptrs.push(Ok((bp, unused))),
                DataWrite::Write {
                    nb,
                    data,
                    cache,
                    checksum,
                } => {
                    let bp = alloc_new_block_checksummed(inner, &data, nb, None, checksum)?;
                    ptrs.push(Ok((bp, overrides.get(b).map(|o| o.bp))));
                    writes.push((i, bp, data, cache));
                }
            }
        }
        Ok(BatchPlanned {
            batch,
            ptrs,
            writes,
        })
    }
}

/// Issues a planned batch's writes (aggregated into large ones) and waits for them.
async fn write_batch<'b>(inner: &Spa, planned: BatchPlanned<'b>) -> BatchWritten<'b> {
    let list: Vec<(&[Dva], &Arc<IoBuf>)> = planned
        .writes
        .iter()
        .map(|(_, bp, data, _)| (bp.dvas(), data))
        .collect();
    let written = write_blocks_shared(&inner.zio, IoClass::AsyncWrite, &list).await;
    drop(list);
    BatchWritten { planned, written }
}

/// Writes one object's part of txg `txg`: frees, data blocks, indirect blocks; the blocks
/// it replaces or removes go to `kills`. With `destroy`, frees everything the object has. `props` are its
/// dataset's as of this sync (block size, checksum, copies, compression); `what` names it in
/// messages.
pub(crate) async fn sync_object(
    inner: &Spa,
    obj: &Object,
    what: &str,
    props: &VolumeProps,
    txg: Txg,
    destroy: bool,
    kills: &mut Kills<'_>,
) -> Result<()> {
    let props = props.clone();
    let nblocks = props.volsize_bytes / props.volblocksize_bytes as u64;
    type Frees = Vec<(u64, u64)>;
    // (block, dirty buffer, what the buffer holds)
    type Blocks = Vec<(u64, Arc<IoBuf>, Kind)>;
    let (frees, mut blocks): (Frees, Blocks) = {
        let d = obj.dirty.lock().unwrap();
        match d.txgs.iter().find(|(t, _)| *t == txg) {
            Some((_, t)) => {
                if let Some(size) = t.size_bytes {
                    obj.tree_size_bytes.store(size, Ordering::Relaxed);
                }
                (
                    t.frees.iter().map(|(&s, &e)| (s, e)).collect(),
                    t.blocks
                        .iter()
                        .map(|(&b, block)| {
                            let written = match block {
                                DirtyBlock::Data(_) => Kind::Whole,
                                DirtyBlock::Partial(_, m) => Kind::Partial(*m),
                                DirtyBlock::Stored(_, form) => Kind::Stored(*form),
                            };
                            (b, Arc::clone(block.buf()), written)
                        })
                        .collect(),
                )
            }
            None => (Vec::new(), Vec::new()),
        }
    };
    let mut frees = frees;
    if destroy {
        frees = vec![(0, capacity(obj.tree.lock().unwrap().levels()))];
        blocks.clear();
    }
    obj.tree.lock().unwrap().grow_for(nblocks);
    let mut used_delta: i64 = 0;
    // The change of the data blocks' stored bytes (one copy each), for `compressratio`.
    let mut compressed_delta: i64 = 0;
    // 1. Frees (applied before the txg's writes, which may land inside a freed range).
    for (start, end) in frees {
        let mut b = start;
        // Bounded: each round moves past one level-1 block or one hole subtree.
        while b < end {
            match walk(&obj.tree, &inner.zio, IoClass::AsyncRead, b, 1, false, what).await? {
                Walk::Hole { level } => b = skip_hole(b, level).max(b + 1),
                Walk::Cached => {
                    let mut removed = Vec::new();
                    let next = (b / FANOUT + 1) * FANOUT;
                    if obj
                        .tree
                        .lock()
                        .unwrap()
                        .clear_data_range(b, end.min(next), &mut removed)
                    {
                        for p in removed {
                            used_delta -=
                                p.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
                            compressed_delta -= stored_bytes(&p);
                            kills.kill(&p);
                        }
                        b = next;
                    }
                }
            }
        }
    }
    // 2. Data blocks, written concurrently in bounded batches. A block the intent log already
    // wrote in place with this very content is adopted, not written again; the log's other
    // in-place blocks of this txg (or older) are freed.
    blocks.sort_unstable_by_key(|(b, _, _)| *b);
    let mut overrides: HashMap<u64, crate::zio::compress::InPlaceBlock> = HashMap::new();
    // Every in-place block taken here is adopted or freed by this txg: no longer held.
    {
        let mut o = obj.overrides.lock().unwrap();
        let mut held = obj.inplace_held.lock().unwrap();
        let mine: Vec<(Txg, u64)> = o.keys().filter(|(t, _)| *t <= txg).copied().collect();
        for k in mine {
            let block = o.remove(&k).unwrap();
            block.bp.dvas().iter().for_each(|d| {
                held.remove(d);
            });
            if k.0 == txg && !destroy {
                overrides.insert(k.1, block);
            } else {
                kills.freed.extend_from_slice(block.bp.dvas());
            }
        }
        obj.override_garbage.lock().unwrap().retain(|(t, bp)| {
            if *t <= txg {
                bp.dvas().iter().for_each(|d| {
                    held.remove(d);
                });
                kills.freed.extend_from_slice(bp.dvas());
                false
            } else {
                true
            }
        });
    }
    let data = DataSync {
        inner,
        obj,
        what,
        txg,
        props: &props,
        overrides: &overrides,
        prev_snap_txg: kills.prev_snap_txg,
    };
    // A two-stage pipeline: while one batch's writes are in flight (and then its blocks go
    // into the tree), the next batch is prepared (merge reads, compression, checksums,
    // places), so the device is not idle while the sync's CPU works and the CPU not idle
    // while the device writes. Both stages are polled by one join: a batch's writes are
    // never left unpolled while the next batch's merge reads wait behind them in the vdev
    // queue (that deadlocked the txg sync with a faulted raidz child when a batch's writes
    // were left in flight unpolled: device_failures.rs, 2026-11-27). At most two batches
    // are in memory (docs/memory.md).
    let mut batches = blocks.chunks(SYNC_WRITES_IN_FLIGHT_MAX);
    let mut planned = match batches.next() {
        Some(first) => Some(data.plan_batch(first).await?),
        None => None,
    };
    // Bounded: one round per batch.
    while let Some(this) = planned.take() {
        let next = batches.next();
        let write_and_finish = async {
            let done = write_batch(inner, this).await;
            finish_batch(
                inner,
                obj,
                what,
                done,
                kills,
                &mut used_delta,
                &mut compressed_delta,
            )
            .await
        };
        let plan_next = async {
            match next {
                Some(batch) => Some(data.plan_batch(batch).await),
                None => None,
            }
        };
        let (finished, next_planned) = join2(write_and_finish, plan_next).await;
        finished?;
        planned = next_planned.transpose()?;
    }
    for (b, o) in overrides.iter() {
        if blocks.binary_search_by_key(b, |(x, _, _)| *x).is_err() {
            kills.freed.extend_from_slice(o.bp.dvas());
        }
    }
    // 3. Indirect blocks, bottom up; a block left with no data below becomes a hole.
    let levels = obj.tree.lock().unwrap().levels();
    let meta_copies = indirect_copies(&props);
    for level in 1..=levels {
        let dirty = obj.tree.lock().unwrap().dirty_at(level);
        for batch in dirty.chunks(SYNC_WRITES_IN_FLIGHT_MAX) {
            let encoded: Vec<(u64, Arc<IoBuf>, u64)> = {
                let t = obj.tree.lock().unwrap();
                batch
                    .iter()
                    .map(|&idx| {
                        let mut buf = IoBuf::zeroed(INDIRECT_BLOCK_BYTES);
                        let fill = t.encode_block(level, idx, &mut buf);
                        (idx, Arc::new(buf), fill)
                    })
                    .collect()
            };
            let to_write: Vec<(&Arc<IoBuf>, NewBlock)> = encoded
                .iter()
                .filter(|(_, _, fill)| *fill != 0)
                .map(|(_, buf, fill)| {
                    let nb = NewBlock {
                        psize_bytes: INDIRECT_BLOCK_BYTES as u32,
                        lsize_bytes: INDIRECT_BLOCK_BYTES as u32,
                        compression: Compression::Off,
                        block_type: BlockType::Indirect,
                        level,
                        copies: meta_copies,
                        checksum_type: oxpool_format::ChecksumType::Xxh3_128,
                        txg,
                        fill: *fill,
                    };
                    (buf, nb)
                })
                .collect();
            let mut written = write_new_blocks(inner, IoClass::AsyncWrite, &to_write)
                .await?
                .into_iter();
            let ptrs = encoded.iter().map(|(_, _, fill)| -> Result<BlockPtr> {
                Ok(match fill {
                    0 => BlockPtr::HOLE,
                    _ => written.next().expect("one pointer per block written"),
                })
            });
            for ((idx, _, _), ptr) in encoded.iter().zip(ptrs.collect::<Vec<_>>()) {
                let ptr = ptr?;
                // The parent must be cached to take the pointer: load it if it was evicted.
                let mut tries = 0;
                let old = loop {
                    let r = obj.tree.lock().unwrap().finish_block(level, *idx, ptr);
                    match r {
                        Ok(old) => break old,
                        Err(()) => {
                            tries += 1;
                            if tries > 100 {
                                return Err(EngineError::invalid(format!(
                                    "{what}: parent of indirect block L{level}/{idx} kept being evicted"
                                )));
                            }
                            let b = idx * crate::dmu::tree::capacity(level);
                            walk(
                                &obj.tree,
                                &inner.zio,
                                IoClass::AsyncRead,
                                b,
                                level + 1,
                                true,
                                what,
                            )
                            .await?;
                        }
                    }
                };
                used_delta += ptr.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
                used_delta -= old.dvas().iter().map(|d| d.asize_bytes as i64).sum::<i64>();
                kills.born(&ptr);
                kills.kill(&old);
            }
        }
    }
    {
        let t = obj.tree.lock().unwrap();
        debug_assert!(!t.has_dirty());
        *obj.written_root.lock().unwrap() = (t.root(), t.levels());
    }
    let used = obj.used_bytes.load(Ordering::Relaxed) as i64 + used_delta;
    debug_assert!(used >= 0);
    obj.used_bytes.store(used.max(0) as u64, Ordering::Relaxed);
    let stored = obj.compressed_bytes.load(Ordering::Relaxed) as i64 + compressed_delta;
    debug_assert!(stored >= 0);
    obj.compressed_bytes
        .store(stored.max(0) as u64, Ordering::Relaxed);
    Ok(())
}

/// A block a txg wrote only in part: its index in the object, the txg's buffer, and which
/// sectors of it the txg wrote.
pub(crate) struct PartialBlock<'a> {
    pub index: u64,
    pub buf: &'a IoBuf,
    pub written: &'a SectorMask,
}

/// Reads of every copy of an old block the txg sync tries before it gives up on merging.
const MERGE_READ_ATTEMPTS: u32 = 3;

/// Merge reads one batch of the txg sync keeps in flight (a sliding window). A whole batch at
/// once (256) only deepens the device's queue: the development machine's disk reads 16 KiB
/// blocks at 22K IOPS at queue depth 1, 50K at 16, 52K at 64 and 39K at 256 (fio, O_DIRECT,
/// 2026-11-27), where each read waits 6.5 ms, and so does any other I/O queued behind them,
/// the intent log's writes included. 4K random writes at depth 32 (512 MiB and a flush, one
/// server, alternating rounds) ran at 31.5K / 40.9K / 51.4K IOPS with 256 reads in flight and
/// 36.7K / 48.6K / 51.4K with 32.
const MERGE_READS_IN_FLIGHT_MAX: usize = 32;

/// The whole content of a block that txg `txg` left partial (`written` sectors in `buf`):
/// the block as the tree holds it, which is its content at the end of the previous txg since
/// the txg being synced is the oldest not in the tree, with the written sectors laid over it.
/// Called by the sync of `txg` before it replaces the block's pointer. The block's old copy
/// comes out of the data cache if it is there (no copy), else from the devices; either way
/// its buffer becomes the merged block, which the sync caches under its new place.
///
/// A failed read of the old block is retried ([`MERGE_READ_ATTEMPTS`] reads of every copy in
/// all), so a passing fault costs nothing. If every copy still fails its checksum, the old
/// block's content is gone: its unwritten sectors become zeros and the loss is logged with the
/// block's name (failing the sync instead would suspend the pool, and the log replay at the
/// next import would fail the same way: the pool could never be imported again). A lasting
/// I/O error fails the sync, as any read of the sync does: the pool suspends with the data in
/// the intent log, nothing lost.
pub(crate) async fn merge_partial(
    inner: &Spa,
    obj: &Object,
    what: &str,
    txg: Txg,
    partial: PartialBlock<'_>,
    bs: usize,
    prev_snap_txg: Txg,
) -> Result<IoBuf> {
    let PartialBlock {
        index: b,
        buf,
        written,
    } = partial;
    // Sync reads: the txg sync waits on them, as a writer waited on its read-modify-write
    // read (the async-read class, three in flight per device, is for reads nobody waits on).
    let bp = lookup(&obj.tree, &inner.zio, IoClass::SyncRead, b, what).await?;
    let mut merged = if bp.is_hole() {
        IoBuf::zeroed(bs)
    } else {
        // The old block's cached copy becomes the new block: its place is freed by this sync,
        // so nobody can hit it afterwards anyway (a reader that misses meanwhile reads the old
        // place, which stays allocated until the sync's frees are deferred past). Unless a
        // snapshot keeps it (born at or before the previous snapshot): then its readers keep
        // the cached copy, and the merge takes a copy of it.
        let key = CacheKey::of(&bp);
        let cached = if bp.birth > prev_snap_txg {
            inner.zio.data_cache.take(&key)
        } else {
            inner
                .zio
                .data_cache
                .share(&key, 0, bs)
                .map(|kept| IoBuf::from_slice(&kept))
        };
        match cached {
            Some(old) => old,
            None => {
                let name = format_args!("{what} block {b}");
                let mut attempt = 1;
                // Bounded: MERGE_READ_ATTEMPTS reads of every copy.
                loop {
                    let read = read_data_block(&inner.zio, IoClass::SyncRead, &bp, bs, &name).await;
                    match read {
                        Ok(old) => break old.content,
                        Err(_) if attempt < MERGE_READ_ATTEMPTS => attempt += 1,
                        Err(e @ EngineError::Checksum { .. }) => {
                            tracing::error!(
                                volume = what,
                                block = b,
                                txg = txg.0,
                                "{e} ({MERGE_READ_ATTEMPTS} attempts): the sectors of the \
                                 block not written in this txg are lost and become zeros"
                            );
                            break IoBuf::zeroed(bs);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    };
    if merged.len() != bs {
        // Allocated larger than the block (padding): the block alone.
        merged = IoBuf::from_slice(&merged[..bs]);
    }
    copy_runs(written, buf, 0, &mut merged);
    Ok(merged)
}
