//! The block pipeline: the one place where block I/O is issued. It executes the vdev tree's
//! plans: writes every copy, reads one copy and verifies it against the checksum held by the
//! parent block pointer, falls back to the other copies on an error or a mismatch, and
//! rewrites the copies that were bad (self-healing), counting every error on its leaf.

pub mod completion;
pub mod compress;
pub mod data_cache;

use self::completion::{CompletionControl, CompletionPolicy};
use self::data_cache::DataCache;

/// What the pipeline runs on: the vdev tree it plans with, where completions run (the
/// `completion` property), and the cache of verified data blocks (`data_cache_max`).
pub struct Zio {
    /// The pool's vdevs.
    pub vdevs: VdevTree,
    /// Where completions of this pool's leaf I/Os run.
    pub completion: CompletionControl,
    /// Verified data blocks kept after reads.
    pub data_cache: DataCache,
}

impl Zio {
    /// A pipeline over `vdevs`, completions following `policy`, caching up to
    /// `data_cache_max_bytes` of data blocks.
    pub fn new(vdevs: VdevTree, policy: CompletionPolicy, data_cache_max_bytes: u64) -> Zio {
        Zio {
            vdevs,
            completion: CompletionControl::new(policy),
            data_cache: DataCache::new(data_cache_max_bytes),
        }
    }
}

impl std::fmt::Debug for Zio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zio").field("vdevs", &self.vdevs).finish()
    }
}

use crate::vdev::queue::IoClass;
use crate::vdev::{LeafIo, VdevTree};
use crate::zio::compress::Verdict;
use crate::{EngineError, Result};
use oxpool_format::{checksum, BlockPtr, Dva};
use oxpool_io::rt::join_all;
use oxpool_io::IoBuf;
use std::fmt::Display;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Writes `data` (already padded to the allocated size) to every copy in `dvas`, as I/Os of
/// `class`. Succeeds when each DVA has at least one good leaf write; failed leaves are counted.
/// Fails if any DVA could not be written at all. Every I/O writes from `data` itself, which
/// stays readable by others meanwhile: no copy, however many copies the block has.
pub async fn write_block_shared(
    zio: &Zio,
    class: IoClass,
    dvas: &[Dva],
    data: &Arc<IoBuf>,
) -> Result<()> {
    let ios = plan_writes(zio, dvas, data.len())?;
    let futs: Vec<_> = ios
        .iter()
        .map(|(_, io)| {
            io.leaf
                .write_shared(class, io.offset_bytes, Arc::clone(data))
        })
        .collect();
    let batch = zio.completion.batch_guard();
    let results = join_all(futs).await;
    drop(batch);
    tally_writes(&ios, dvas.len(), results).map(drop)
}

/// Most bytes one aggregated write carries: ZFS's `zfs_vdev_aggregation_limit` (1 MiB), large
/// enough that the per-request cost (a submission, a request in the device) vanishes beside
/// the transfer, small enough not to hold a slow device's queue for long.
pub const AGGREGATE_BYTES_MAX: usize = 1 << 20;

/// Writes many blocks, each `(dvas, data)` to every copy as [`write_block_shared`] does, and
/// aggregates the writes to adjacent places of one leaf into one vectored write (at most
/// [`AGGREGATE_BYTES_MAX`] and [`oxpool_io::GATHER_BUFS_MAX`] blocks). A txg writes its blocks
/// to places the allocator handed out one after another (next-fit), so a batch of them
/// becomes a few large writes instead of one submission and one device request per block.
/// One result per block: an error unless each of its DVAs has a good leaf write; a failed
/// aggregated write fails every block in it and counts one error on its leaf.
pub async fn write_blocks_shared(
    zio: &Zio,
    class: IoClass,
    blocks: &[(&[Dva], &Arc<IoBuf>)],
) -> Vec<Result<()>> {
    // Every leaf write as (block index, DVA index, leaf I/O), sorted by place.
    let mut pieces: Vec<(usize, usize, LeafIo)> = Vec::with_capacity(blocks.len() * 2);
    let mut results: Vec<Result<()>> = Vec::with_capacity(blocks.len());
    for (bi, (dvas, data)) in blocks.iter().enumerate() {
        results.push(Ok(()));
        for (di, dva) in dvas.iter().enumerate() {
            debug_assert_eq!(dva.asize_bytes as usize, data.len());
            match zio.vdevs.top(dva.vdev) {
                Some(top) => pieces.extend(top.plan_write(dva).map(|io| (bi, di, io))),
                None => {
                    results[bi] = Err(EngineError::invalid(format!(
                        "write to missing vdev {:?}",
                        dva.vdev
                    )))
                }
            }
        }
    }
    pieces.sort_unstable_by_key(|(_, _, io)| (Arc::as_ptr(&io.leaf) as usize, io.offset_bytes));
    let piece_len = |p: &(usize, usize, LeafIo)| blocks[p.0].1.len();
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    let mut start = 0;
    while start < pieces.len() {
        let (mut end, mut bytes) = (start + 1, piece_len(&pieces[start]));
        while end < pieces.len()
            && end - start < oxpool_io::GATHER_BUFS_MAX
            && Arc::ptr_eq(&pieces[end].2.leaf, &pieces[start].2.leaf)
            && pieces[end].2.offset_bytes == pieces[start].2.offset_bytes + bytes as u64
            && bytes + piece_len(&pieces[end]) <= AGGREGATE_BYTES_MAX
        {
            bytes += piece_len(&pieces[end]);
            end += 1;
        }
        runs.push(start..end);
        start = end;
    }
    let futs: Vec<_> = runs
        .iter()
        .map(|run| {
            let first = &pieces[run.start].2;
            let bufs = pieces[run.clone()]
                .iter()
                .map(|(bi, _, _)| Arc::clone(blocks[*bi].1))
                .collect();
            first.leaf.write_gather(class, first.offset_bytes, bufs)
        })
        .collect();
    let batch = zio.completion.batch_guard();
    let written = join_all(futs).await;
    drop(batch);
    // A DVA is written when one of its leaf writes is (a mirror child may fail).
    let mut dva_ok: Vec<Vec<bool>> = blocks.iter().map(|(d, _)| vec![false; d.len()]).collect();
    let mut block_err: Vec<Option<EngineError>> = (0..blocks.len()).map(|_| None).collect();
    for (run, r) in runs.iter().zip(written) {
        match r {
            Ok(()) => pieces[run.clone()]
                .iter()
                .for_each(|(bi, di, _)| dva_ok[*bi][*di] = true),
            Err(e) => {
                let io = &pieces[run.start].2;
                count_write_failure(io, run.len(), &e);
                for (bi, _, _) in &pieces[run.clone()] {
                    let copy = std::io::Error::new(e.kind(), e.to_string());
                    block_err[*bi] = Some(EngineError::io(io.leaf.name(), copy));
                }
            }
        }
    }
    for (bi, result) in results.iter_mut().enumerate() {
        if result.is_ok() && !dva_ok[bi].iter().all(|&ok| ok) {
            *result = Err(block_err[bi]
                .take()
                .unwrap_or_else(|| EngineError::invalid("block has a DVA with no device")));
        }
    }
    results
}

/// As [`write_block_shared`], with a buffer the caller gives up and gets back when the writes
/// are done (the last I/O writes it as it is, the others write copies): for a buffer that
/// goes on being used as the caller's own. With `durable`, every leaf write is a durable
/// (FUA) write: when this returns Ok, the block is durable on every copy it reports written.
pub async fn write_block_owned(
    zio: &Zio,
    class: IoClass,
    dvas: &[Dva],
    data: IoBuf,
    durable: bool,
) -> Result<IoBuf> {
    let ios = plan_writes(zio, dvas, data.len())?;
    let mut data = Some(data);
    let futs: Vec<_> = ios
        .iter()
        .enumerate()
        .map(|(n, (_, io))| {
            let buf = if n + 1 == ios.len() {
                data.take().expect("the last I/O takes the buffer")
            } else {
                data.as_ref().expect("not taken yet").clone()
            };
            let leaf = &io.leaf;
            async move {
                if durable {
                    leaf.write_durable(class, io.offset_bytes, buf).await
                } else {
                    leaf.write(class, io.offset_bytes, buf).await
                }
            }
        })
        .collect();
    let batch = zio.completion.batch_guard();
    let results = join_all(futs).await;
    drop(batch);
    match tally_writes(&ios, dvas.len(), results)? {
        Some(buf) => Ok(buf),
        // No leaf I/O at all (no DVA): nothing took the buffer.
        None => data.ok_or_else(|| EngineError::invalid("block has a DVA with no device")),
    }
}

/// Counts a failed leaf write (of `blocks` blocks, aggregated) on its device and logs it.
fn count_write_failure(io: &LeafIo, blocks: usize, e: &std::io::Error) {
    io.leaf
        .counters
        .write_errors
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        device = io.leaf.name(),
        offset = io.offset_bytes,
        blocks,
        "write failed: {e}"
    );
}

/// The leaf writes of a block of `len_bytes` at every copy in `dvas`, each tagged with the
/// index of its DVA.
fn plan_writes(zio: &Zio, dvas: &[Dva], len_bytes: usize) -> Result<Vec<(usize, LeafIo)>> {
    let mut ios: Vec<(usize, LeafIo)> = Vec::with_capacity(dvas.len() * 2);
    for (i, dva) in dvas.iter().enumerate() {
        debug_assert_eq!(dva.asize_bytes as usize, len_bytes);
        let top = zio
            .vdevs
            .top(dva.vdev)
            .ok_or_else(|| EngineError::invalid(format!("write to missing vdev {:?}", dva.vdev)))?;
        ios.extend(top.plan_write(dva).map(|io| (i, io)));
    }
    Ok(ios)
}

/// Counts and logs the failed leaf writes of `ios`; an error unless every one of the
/// `dva_count` DVAs has a good write. Returns the last result's value (a buffer handed back).
fn tally_writes<T>(
    ios: &[(usize, LeafIo)],
    dva_count: usize,
    results: Vec<oxpool_io::IoResult<T>>,
) -> Result<Option<T>> {
    let mut ok = vec![false; dva_count];
    let mut last_err = None;
    let mut back = None;
    for ((i, io), r) in ios.iter().zip(results) {
        match r {
            Ok(value) => {
                ok[*i] = true;
                back = Some(value);
            }
            Err(e) => {
                count_write_failure(io, 1, &e);
                last_err = Some(EngineError::io(io.leaf.name(), e));
            }
        }
    }
    if ok.iter().all(|&b| b) {
        return Ok(back);
    }
    Err(last_err.unwrap_or_else(|| EngineError::invalid("block has a DVA with no device")))
}

/// Reads the block `bp` points to, as I/Os of `class`, and verifies it. Returns a buffer of
/// the allocated size whose first `psize_bytes` are the verified block. `what` names the block
/// in errors; it is only formatted on an error path, so a caller can pass `&format_args!(..)`
/// and a read that succeeds allocates nothing (the buffer comes from the I/O buffer pool, and
/// `bad` stays empty).
pub async fn read_block(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    what: &(impl Display + ?Sized),
) -> Result<IoBuf> {
    let (buf, bad) = read_block_unhealed(zio, class, bp, what).await?;
    heal(&bad, &buf).await;
    Ok(buf)
}

/// As [`read_block`], without rewriting the copies that were bad: returns them with the
/// block, for [`heal_copies`]. For a reader whose block pointer may stop being current while
/// it reads (the txg sync may replace the block and free its places): healing then must wait
/// until the caller has checked that the pointer is still current, or it could write the
/// old block over a place already reused.
pub async fn read_block_unhealed(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    what: &(impl Display + ?Sized),
) -> Result<(IoBuf, Vec<LeafIo>)> {
    let (block, bad) = read_copies(zio, class, bp, None, what).await?;
    Ok((block.content, bad))
}

/// A data block read from the devices and verified.
pub struct DataBlock {
    /// Its content: for a compressed block, exactly the logical size the reader asked for;
    /// for a block stored as is, the stored bytes (the allocated size, content first).
    pub content: IoBuf,
    /// The stored bytes of a compressed block (what bad copies are rewritten with); None
    /// when they are `content`.
    pub stored: Option<IoBuf>,
}

impl DataBlock {
    /// The bytes as stored on the devices.
    pub fn stored(&self) -> &IoBuf {
        self.stored.as_ref().unwrap_or(&self.content)
    }
}

/// As [`read_block_unhealed`], for a data block whose content the caller wants: a compressed
/// block is verified (its stored bytes, against the pointer's checksum) and then decompressed
/// into exactly `lsize_bytes`, the reader's block size, in the same completion (see
/// `CompletionControl::verify_decode`). A copy that verifies but does not decompress to that
/// size counts as a checksum error of its device, like a copy that does not verify.
pub async fn read_data_block_unhealed(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    lsize_bytes: usize,
    what: &(impl Display + ?Sized),
) -> Result<(DataBlock, Vec<LeafIo>)> {
    read_copies(zio, class, bp, Some(lsize_bytes), what).await
}

/// As [`read_data_block_unhealed`], rewriting the bad copies at once (for a reader whose
/// pointer cannot change under it, see [`read_block_unhealed`]).
pub async fn read_data_block(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    lsize_bytes: usize,
    what: &(impl Display + ?Sized),
) -> Result<DataBlock> {
    let (block, bad) = read_data_block_unhealed(zio, class, bp, lsize_bytes, what).await?;
    heal_copies(&bad, block.stored()).await;
    Ok(block)
}

/// Reads and verifies one copy after the other until one is good (decompressed to
/// `decode_to` if it is compressed and that is given); returns it with the copies that were
/// bad.
async fn read_copies(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    decode_to: Option<usize>,
    what: &(impl Display + ?Sized),
) -> Result<(DataBlock, Vec<LeafIo>)> {
    debug_assert!(!bp.is_hole());
    let mut bad: Vec<LeafIo> = Vec::new();
    let mut last_io_err = None;
    let mut checksum_failures = 0u32;
    for dva in bp.dvas() {
        let Some(top) = zio.vdevs.top(dva.vdev) else {
            continue;
        };
        for io in top.plan_read(dva) {
            let batch = zio.completion.batch_guard();
            let read = io
                .leaf
                .read(
                    class,
                    io.offset_bytes,
                    IoBuf::zeroed(dva.asize_bytes as usize),
                )
                .await;
            drop(batch);
            let read = match read {
                Ok(buf) => Ok(zio.completion.verify_decode(bp, buf, decode_to).await),
                Err(e) => Err(e),
            };
            match read {
                Err(e) => {
                    io.leaf.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = io.leaf.name(), %what, "read failed: {e}");
                    last_io_err = Some(EngineError::io(io.leaf.name(), e));
                    bad.push(io);
                }
                Ok((buf, verdict)) => {
                    let why = match verdict {
                        Verdict::Good(None) => {
                            let block = DataBlock {
                                content: buf,
                                stored: None,
                            };
                            return Ok((block, bad));
                        }
                        Verdict::Good(Some(content)) => {
                            let block = DataBlock {
                                content,
                                stored: Some(buf),
                            };
                            return Ok((block, bad));
                        }
                        Verdict::BadChecksum => "checksum mismatch",
                        Verdict::Undecodable => "verified but does not decompress to its size",
                    };
                    io.leaf
                        .counters
                        .checksum_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = io.leaf.name(), %what, "{why}");
                    checksum_failures += 1;
                    bad.push(io);
                }
            }
        }
    }
    // Only I/O errors: report the device's error. Any copy that read but did not verify makes
    // it a checksum error, the more serious finding.
    Err(match last_io_err {
        Some(e) if checksum_failures == 0 => e,
        _ => EngineError::Checksum {
            what: what.to_string(),
        },
    })
}

/// Whether `buf` holds the block `bp` describes.
pub fn verify(bp: &BlockPtr, buf: &[u8]) -> bool {
    let psize = bp.psize_bytes as usize;
    psize <= buf.len() && checksum(bp.checksum_type, &buf[..psize]) == bp.checksum
}

/// Rewrites `good`, a verified block, over its copies in `bad` (from
/// [`read_block_unhealed`]); the caller has checked that the block is still current.
pub async fn heal_copies(bad: &[LeafIo], good: &IoBuf) {
    if !bad.is_empty() {
        heal(bad, good).await;
    }
}

/// Rewrites good data over the copies that failed. Each copy of a DVA has the same size, so
/// the verified buffer fits every bad location. Errors here are counted, not returned: the
/// read itself succeeded. Async writes: nobody waits for a repair.
async fn heal(bad: &[LeafIo], good: &IoBuf) -> u64 {
    let mut repaired = 0;
    for io in bad {
        match io
            .leaf
            .write(IoClass::AsyncWrite, io.offset_bytes, good.clone())
            .await
        {
            Ok(_) => {
                io.leaf
                    .counters
                    .repaired_bytes
                    .fetch_add(good.len() as u64, Ordering::Relaxed);
                repaired += 1;
            }
            Err(e) => {
                io.leaf
                    .counters
                    .write_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(device = io.leaf.name(), "self-heal write failed: {e}");
            }
        }
    }
    repaired
}

/// What a scrub of one block found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubCounts {
    /// Copies read (every child of every DVA).
    pub copies_checked: u64,
    /// Copies that failed to read or to verify.
    pub copies_bad: u64,
    /// Bad copies rewritten from a good one.
    pub copies_repaired: u64,
    /// Blocks with no good copy at all.
    pub blocks_lost: u64,
}

impl std::ops::AddAssign for ScrubCounts {
    fn add_assign(&mut self, o: ScrubCounts) {
        self.copies_checked += o.copies_checked;
        self.copies_bad += o.copies_bad;
        self.copies_repaired += o.copies_repaired;
        self.blocks_lost += o.blocks_lost;
    }
}

/// Scrubs one block: reads every copy on every child, verifies each, rewrites the bad ones from
/// a good one. Returns a verified copy (None if every copy is bad) and the counts.
pub async fn scrub_block(zio: &Zio, bp: &BlockPtr, what: &str) -> (Option<IoBuf>, ScrubCounts) {
    let mut counts = ScrubCounts::default();
    let mut good: Option<IoBuf> = None;
    let mut bad: Vec<LeafIo> = Vec::new();
    for dva in bp.dvas() {
        let Some(top) = zio.vdevs.top(dva.vdev) else {
            continue;
        };
        for io in top.plan_write(dva) {
            counts.copies_checked += 1;
            match io
                .leaf
                .read(
                    IoClass::Scrub,
                    io.offset_bytes,
                    IoBuf::zeroed(dva.asize_bytes as usize),
                )
                .await
            {
                Ok(buf) if verify(bp, &buf) => {
                    good.get_or_insert(buf);
                }
                Ok(_) => {
                    io.leaf
                        .counters
                        .checksum_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = io.leaf.name(), what, "scrub: checksum mismatch");
                    bad.push(io);
                }
                Err(e) => {
                    io.leaf.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = io.leaf.name(), what, "scrub: read failed: {e}");
                    bad.push(io);
                }
            }
        }
    }
    counts.copies_bad = bad.len() as u64;
    match &good {
        Some(buf) => {
            counts.copies_repaired = heal(&bad, buf).await;
        }
        None => counts.blocks_lost = 1,
    }
    (good, counts)
}
