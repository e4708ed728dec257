//! The block pipeline: the one place where block I/O is issued. It executes the vdev tree's
//! plans: writes every copy, reads one copy and verifies it against the checksum held by the
//! parent block pointer, falls back to the other copies on an error or a mismatch, and
//! rewrites the copies that were bad (self-healing), counting every error on its leaf. On a
//! raidz vdev a copy is a block's columns, with parity (`raidz.rs`): a read rebuilds what is
//! missing or wrong from parity and rewrites those columns.

pub mod completion;
pub mod compress;
pub mod data_cache;
mod heal_guard;
pub mod probe_streak;
pub(crate) mod raidz;
pub mod read_run;
pub(crate) mod warn_limit;

use warn_limit::io_warn;

use self::completion::{CompletionControl, CompletionPolicy};
use self::data_cache::DataCache;
pub use self::heal_guard::{heal_if_current, HealGuard, HealRegistry};

/// What the pipeline runs on: the vdev tree it plans with, where completions run (the
/// `completion` property), and the cache of verified data blocks (`data_cache_max`).
pub struct Zio {
    /// The pool's vdevs.
    pub vdevs: VdevTree,
    /// Where completions of this pool's leaf I/Os run.
    pub completion: CompletionControl,
    /// Verified data blocks kept after reads.
    pub data_cache: DataCache,
    /// Places a self-heal is rewriting ([`HealGuard`]): the txg sync releases none of their
    /// deferred frees while they are here.
    pub healing: HealRegistry,
}

impl Zio {
    /// A pipeline over `vdevs`, completions following `policy`, caching up to
    /// `data_cache_max_bytes` of data blocks.
    pub fn new(vdevs: VdevTree, policy: CompletionPolicy, data_cache_max_bytes: u64) -> Zio {
        Zio {
            vdevs,
            completion: CompletionControl::new(policy),
            data_cache: DataCache::new(data_cache_max_bytes),
            healing: HealRegistry::default(),
        }
    }
}

impl std::fmt::Debug for Zio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zio").field("vdevs", &self.vdevs).finish()
    }
}

use crate::vdev::queue::IoClass;
use crate::vdev::raidz::ReadMode;
use crate::vdev::{ErrorKind, LeafIo, VdevTree};
use crate::zio::compress::Verdict;
use crate::{EngineError, Result};
use oxpool_format::{checksum, BlockPtr, Dva};
use oxpool_io::rt::{join2, join_all};
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
    let (whole, striped) = split_raidz(zio, dvas);
    if !striped.is_empty() {
        let (plain, parity) = join2(
            write_whole_copies_shared(zio, class, &whole, data),
            write_raidz_copies(zio, class, &striped, data, false),
        )
        .await;
        return plain.and(parity);
    }
    write_whole_copies_shared(zio, class, dvas, data).await
}

/// `dvas` split into the copies on single and mirror vdevs and those on raidz vdevs; both
/// empty when there is no raidz copy (the common case allocates nothing).
fn split_raidz(zio: &Zio, dvas: &[Dva]) -> (Vec<Dva>, Vec<Dva>) {
    let is_raidz = |d: &Dva| zio.vdevs.top(d.vdev).is_some_and(|t| t.raidz.is_some());
    if !dvas.iter().any(is_raidz) {
        return (Vec::new(), Vec::new());
    }
    dvas.iter().partition(|d| !is_raidz(d))
}

/// Writes `data` to each copy in `dvas`, all on raidz vdevs, at once.
async fn write_raidz_copies(
    zio: &Zio,
    class: IoClass,
    dvas: &[Dva],
    data: &[u8],
    durable: bool,
) -> Result<()> {
    let futs: Vec<_> = dvas
        .iter()
        .map(|dva| async move {
            let top = zio.vdevs.top(dva.vdev).ok_or_else(|| {
                EngineError::invalid(format!("write to missing vdev {:?}", dva.vdev))
            })?;
            raidz::write_raidz(zio, class, top, dva, data, durable).await
        })
        .collect();
    join_all(futs).await.into_iter().collect()
}

/// [`write_block_shared`] of the copies on single and mirror vdevs.
async fn write_whole_copies_shared(
    zio: &Zio,
    class: IoClass,
    dvas: &[Dva],
    data: &Arc<IoBuf>,
) -> Result<()> {
    if dvas.is_empty() {
        return Ok(());
    }
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
    tally_writes(zio, &ios, dvas.len(), results).map(drop)
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
    // Every leaf write as (block index, DVA index, leaf I/O), sorted by place. Copies on
    // raidz vdevs are written column by column beside them, not aggregated.
    let mut pieces: Vec<(usize, usize, LeafIo)> = Vec::with_capacity(blocks.len() * 2);
    let mut results: Vec<Result<()>> = Vec::with_capacity(blocks.len());
    let mut striped: Vec<(usize, usize)> = Vec::new();
    for (bi, (dvas, data)) in blocks.iter().enumerate() {
        results.push(Ok(()));
        for (di, dva) in dvas.iter().enumerate() {
            match zio.vdevs.top(dva.vdev) {
                Some(top) if top.raidz.is_some() => striped.push((bi, di)),
                Some(top) => {
                    debug_assert_eq!(dva.asize_bytes as usize, data.len());
                    pieces.extend(top.plan_write(dva).map(|io| (bi, di, io)))
                }
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
    let striped_futs: Vec<_> = striped
        .iter()
        .map(|&(bi, di)| {
            let (dvas, data) = blocks[bi];
            let dva = &dvas[di];
            let top = zio.vdevs.top(dva.vdev).expect("found above");
            raidz::write_raidz(zio, class, top, dva, data, false)
        })
        .collect();
    let batch = zio.completion.batch_guard();
    let (written, striped_written) = join2(join_all(futs), join_all(striped_futs)).await;
    drop(batch);
    // A DVA is written when one of its leaf writes is (a mirror child may fail); a raidz
    // copy when enough of its columns are.
    let mut dva_ok: Vec<Vec<bool>> = blocks.iter().map(|(d, _)| vec![false; d.len()]).collect();
    let mut block_err: Vec<Option<EngineError>> = (0..blocks.len()).map(|_| None).collect();
    for (&(bi, di), r) in striped.iter().zip(striped_written) {
        match r {
            Ok(()) => dva_ok[bi][di] = true,
            Err(e) => block_err[bi] = Some(e),
        }
    }
    for (run, r) in runs.iter().zip(written) {
        match r {
            Ok(()) => pieces[run.clone()]
                .iter()
                .for_each(|(bi, di, _)| dva_ok[*bi][*di] = true),
            Err(e) => {
                let io = &pieces[run.start].2;
                count_write_failure(zio, io, run.len(), &e);
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
    let (whole, striped) = split_raidz(zio, dvas);
    if !striped.is_empty() {
        // The columns are written from copies: the buffer stays the caller's throughout.
        write_raidz_copies(zio, class, &striped, &data, durable).await?;
        if whole.is_empty() {
            return Ok(data);
        }
        return Box::pin(write_block_owned(zio, class, &whole, data, durable)).await;
    }
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
    match tally_writes(zio, &ios, dvas.len(), results)? {
        Some(buf) => Ok(buf),
        // No leaf I/O at all (no DVA): nothing took the buffer.
        None => data.ok_or_else(|| EngineError::invalid("block has a DVA with no device")),
    }
}

/// Counts a failed leaf write (of `blocks` blocks, aggregated) on its device and logs it.
pub(crate) fn count_write_failure(zio: &Zio, io: &LeafIo, blocks: usize, e: &std::io::Error) {
    zio.vdevs.note_error(&io.leaf, ErrorKind::Write, Some(e));
    io_warn!(
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
    zio: &Zio,
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
                count_write_failure(zio, io, 1, &e);
                last_err = Some(EngineError::io(io.leaf.name(), e));
            }
        }
    }
    if ok.iter().all(|&b| b) {
        return Ok(back);
    }
    Err(last_err.unwrap_or_else(|| EngineError::invalid("block has a DVA with no device")))
}

/// A place a read found bad, to rewrite once the block is known good.
#[derive(Debug)]
pub enum Repair {
    /// A whole copy (on a single device or a mirror side): rewritten with the verified block.
    Copy(LeafIo),
    /// One column of a raidz block: rewritten with its own right bytes.
    Column {
        /// Where the column lives.
        io: LeafIo,
        /// Its right bytes.
        data: IoBuf,
    },
}

impl Repair {
    /// The device it would rewrite.
    fn leaf_name(&self) -> &str {
        match self {
            Repair::Copy(io) | Repair::Column { io, .. } => io.leaf.name(),
        }
    }
}

/// The places a read found bad ([`read_block_unhealed`]), for [`heal_if_current`].
#[derive(Debug, Default)]
pub struct Repairs(Vec<Repair>);

impl Repairs {
    /// Whether nothing needs rewriting.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Places to rewrite.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn push(&mut self, r: Repair) {
        self.0.push(r);
    }

    /// Adds the whole copy at `io`, found bad by another read, unless it is listed already.
    pub fn add_copy(&mut self, io: LeafIo) {
        let listed = self.0.iter().any(|r| {
            matches!(r, Repair::Copy(c)
                if Arc::ptr_eq(&c.leaf, &io.leaf) && c.offset_bytes == io.offset_bytes)
        });
        if !listed {
            self.0.push(Repair::Copy(io));
        }
    }
}

/// Reads the block `bp` points to, as I/Os of `class`, and verifies it. Returns a buffer of
/// at least the block's data size (`psize_bytes` rounded up to whole sectors; the allocated
/// size on a single device or mirror) whose first `psize_bytes` are the verified block. `what` names the block
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
    heal(zio, bp.dvas(), &bad.0, &buf).await;
    Ok(buf)
}

/// As [`read_block`], without rewriting the copies that were bad: returns them with the
/// block, for [`heal_if_current`]. For a reader whose block pointer may stop being current while
/// it reads (the txg sync may replace the block and free its places): healing then must wait
/// until the caller has checked that the pointer is still current, or it could write the
/// old block over a place already reused.
pub async fn read_block_unhealed(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    what: &(impl Display + ?Sized),
) -> Result<(IoBuf, Repairs)> {
    let (block, bad) = read_copies(zio, class, bp, None, None, what).await?;
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
) -> Result<(DataBlock, Repairs)> {
    read_copies(zio, class, bp, Some(lsize_bytes), None, what).await
}

/// As [`read_data_block_unhealed`], for a block whose copy at `known_bad` another read (a run,
/// `read_run::read_data_run`) found bad and has counted: that copy is tried last, and not
/// charged again if it fails again, as a mirror side that missed the block's txg.
pub async fn read_data_block_after_bad_copy(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    lsize_bytes: usize,
    known_bad: &LeafIo,
    what: &(impl Display + ?Sized),
) -> Result<(DataBlock, Repairs)> {
    read_copies(zio, class, bp, Some(lsize_bytes), Some(known_bad), what).await
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
    heal(zio, bp.dvas(), &bad.0, block.stored()).await;
    Ok(block)
}

/// Reads and verifies one copy after the other until one is good (decompressed to
/// `decode_to` if it is compressed and that is given); returns it with the copies that were
/// bad. `known_bad`, a copy already found bad and counted, is tried last and not counted
/// again.
async fn read_copies(
    zio: &Zio,
    class: IoClass,
    bp: &BlockPtr,
    decode_to: Option<usize>,
    known_bad: Option<&LeafIo>,
    what: &(impl Display + ?Sized),
) -> Result<(DataBlock, Repairs)> {
    debug_assert!(!bp.is_hole());
    let mut bad = Repairs::default();
    let mut last_io_err = None;
    let mut checksum_failures = 0u32;
    for dva in bp.dvas() {
        let Some(top) = zio.vdevs.top(dva.vdev) else {
            continue;
        };
        if top.raidz.is_some() {
            let read = raidz::read_raidz(zio, class, top, dva, bp, ReadMode::Normal, what).await;
            match read {
                Ok((stored, repairs, _)) => {
                    // Verified by the raidz read; what remains is the content.
                    match compress::decode_verified(bp, &stored, decode_to) {
                        Verdict::Good(content) => {
                            bad.0.extend(repairs.0);
                            let block = match content {
                                None => DataBlock {
                                    content: stored,
                                    stored: None,
                                },
                                Some(content) => DataBlock {
                                    content,
                                    stored: Some(stored),
                                },
                            };
                            return Ok((block, bad));
                        }
                        _ => {
                            io_warn!(%what, "verified but does not decompress to its size");
                            checksum_failures += 1;
                        }
                    }
                }
                Err(EngineError::Checksum { .. }) => checksum_failures += 1,
                Err(e) => last_io_err = Some(e),
            }
            continue;
        }
        // Sides that may lack the block (they missed its txg) are tried last, and their
        // mismatches charged to nobody: the second pass is only reached when every other
        // side failed, so a good first read pays nothing for it.
        let ios = top
            .plan_read(dva)
            .map(|io| (false, io))
            .chain(std::iter::once(()).flat_map(|()| top.plan_read(dva).map(|io| (true, io))));
        for (last_pass, io) in ios {
            let known = known_bad.is_some_and(|k| {
                Arc::ptr_eq(&k.leaf, &io.leaf) && k.offset_bytes == io.offset_bytes
            });
            if (known || io.leaf.health.missed_covers(bp.birth)) != last_pass {
                continue;
            }
            let batch = zio.completion.batch_guard();
            let read = io
                .leaf
                .read(
                    class,
                    io.offset_bytes,
                    IoBuf::for_overwrite(dva.asize_bytes as usize),
                )
                .await;
            drop(batch);
            let read = match read {
                Ok(buf) => Ok(zio.completion.verify_decode(bp, buf, decode_to).await),
                Err(e) => Err(e),
            };
            match read {
                Err(e) => {
                    zio.vdevs.note_error(&io.leaf, ErrorKind::Read, Some(&e));
                    io_warn!(device = io.leaf.name(), %what, "read failed: {e}");
                    last_io_err = Some(EngineError::io(io.leaf.name(), e));
                    bad.push(Repair::Copy(io));
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
                    if last_pass {
                        // Missed the block's txg, or already counted by the caller.
                        tracing::debug!(device = io.leaf.name(), %what, "lacks the block");
                    } else {
                        zio.vdevs.note_error(&io.leaf, ErrorKind::Checksum, None);
                        io_warn!(device = io.leaf.name(), %what, "{why}");
                    }
                    checksum_failures += 1;
                    bad.push(Repair::Copy(io));
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

/// Rewrites good data over the copies that failed, of a block at `dvas` whose pointer cannot
/// change under the caller (see [`heal_if_current`] for one that may). The places are held
/// ([`HealGuard`]) while a write may still reach them, even past this future: a reader
/// dropped mid-heal (a send whose receiver went away) also ends what kept the pointer
/// current (the snapshot's hold). Returns what was rewritten; nothing if too many heals are
/// in flight.
async fn heal(zio: &Zio, dvas: &[Dva], bad: &[Repair], good: &IoBuf) -> Healed {
    if bad.is_empty() {
        return Healed::default();
    }
    let Some(places) = HealGuard::new(zio, dvas) else {
        // Unrepaired, and counted so by a scrub: a read or a later scrub finds it again.
        io_warn!(
            device = bad.first().map(|r| r.leaf_name()),
            "self-heal skipped: too many heals in flight"
        );
        return Healed::default();
    };
    heal_held(zio, bad, good, &places).await
}

/// Rewrites good data over the copies that failed. Each copy of a DVA has the same size, so
/// the verified buffer fits every bad location; a raidz column carries its own bytes. Errors
/// here are counted, not returned: the read itself succeeded. Async writes: nobody waits for
/// a repair. Each write goes from a shared buffer that `places` tracks: the I/O driver holds
/// that buffer until the device is done, even if this future is dropped, and the places stay
/// held as long. Returns what was rewritten.
async fn heal_held(zio: &Zio, bad: &[Repair], good: &IoBuf, places: &HealGuard<'_>) -> Healed {
    let mut repaired = Healed::default();
    for r in bad {
        let (io, buf) = match r {
            Repair::Copy(io) => (io, good),
            Repair::Column { io, data } => (io, data),
        };
        // Faulted or taken offline since the read: it gets no I/O (the bad copy is found
        // again, and repaired, once it is back).
        if !io.leaf.health.in_service() {
            continue;
        }
        let buf = Arc::new(buf.clone());
        places.track(Arc::downgrade(&buf));
        let len_bytes = buf.len() as u64;
        match io
            .leaf
            .write_shared(IoClass::AsyncWrite, io.offset_bytes, buf)
            .await
        {
            Ok(()) => {
                io.leaf
                    .counters
                    .repaired_bytes
                    .fetch_add(len_bytes, Ordering::Relaxed);
                repaired.places += 1;
                repaired.bytes += len_bytes;
            }
            Err(e) => {
                zio.vdevs.note_error(&io.leaf, ErrorKind::Write, Some(&e));
                io_warn!(device = io.leaf.name(), "self-heal write failed: {e}");
            }
        }
    }
    repaired
}

/// What a heal rewrote.
#[derive(Clone, Copy, Debug, Default)]
struct Healed {
    /// Places (copies, raidz columns) rewritten.
    places: u64,
    /// Bytes written to them: what the devices count as repaired.
    bytes: u64,
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
    /// Bytes the rewrites put on the devices (a raidz copy's bad columns only, not its
    /// whole size): the sum of what the devices count as repaired.
    pub repaired_bytes: u64,
}

impl std::ops::AddAssign for ScrubCounts {
    fn add_assign(&mut self, o: ScrubCounts) {
        self.copies_checked += o.copies_checked;
        self.copies_bad += o.copies_bad;
        self.copies_repaired += o.copies_repaired;
        self.blocks_lost += o.blocks_lost;
        self.repaired_bytes += o.repaired_bytes;
    }
}

/// Scrubs one block: reads every copy on every child, verifies each, rewrites the bad ones from
/// a good one. Returns a verified copy (None if every copy is bad) and the counts.
///
/// A copy on a raidz vdev is read whole, every column, the parity checked against the data
/// (ZFS's scrub): it counts as one copy, bad if any column was, repaired when its bad
/// columns were rewritten; a raidz copy that cannot be rebuilt counts as bad and unrepaired.
pub async fn scrub_block(zio: &Zio, bp: &BlockPtr, what: &str) -> (Option<IoBuf>, ScrubCounts) {
    let mut counts = ScrubCounts::default();
    let mut good: Option<IoBuf> = None;
    let mut bad: Vec<Repair> = Vec::new();
    let mut raidz_lost = 0u64;
    let mut stale: Vec<(LeafIo, usize)> = Vec::new();
    for dva in bp.dvas() {
        let Some(top) = zio.vdevs.top(dva.vdev) else {
            continue;
        };
        if top.raidz.is_some() {
            counts.copies_checked += 1;
            match raidz::read_raidz(zio, IoClass::Scrub, top, dva, bp, ReadMode::Scrub, what).await
            {
                Ok((buf, repairs, _)) => {
                    if !repairs.is_empty() {
                        counts.copies_bad += 1;
                        let healed = heal(zio, std::slice::from_ref(dva), &repairs.0, &buf).await;
                        counts.repaired_bytes += healed.bytes;
                        if healed.places == repairs.len() as u64 {
                            counts.copies_repaired += 1;
                        }
                    }
                    good.get_or_insert(buf);
                }
                Err(e) => {
                    io_warn!(what, "scrub: {e}");
                    raidz_lost += 1;
                }
            }
            continue;
        }
        // A side that missed the block's txg lacks it: it is rewritten from a good side
        // without being read (what it holds there is not trusted, even if it happened to
        // verify), as ZFS's resilver treats a stale child. Only when every side missed the
        // txg (the ranges are conservative) are they read and checked after all.
        let sides: Vec<LeafIo> = top.copies_in_service(dva).collect();
        let all_stale = sides
            .iter()
            .all(|io| io.leaf.health.missed_covers(bp.birth));
        for io in sides {
            counts.copies_checked += 1;
            if !all_stale && io.leaf.health.missed_covers(bp.birth) {
                stale.push((io, dva.asize_bytes as usize));
                continue;
            }
            match io
                .leaf
                .read(
                    IoClass::Scrub,
                    io.offset_bytes,
                    IoBuf::for_overwrite(dva.asize_bytes as usize),
                )
                .await
            {
                Ok(buf) if verify(bp, &buf) => {
                    good.get_or_insert(buf);
                }
                Ok(_) => {
                    // A side that missed the block's txg is expected to lack it: repaired,
                    // not charged.
                    if !io.leaf.health.missed_covers(bp.birth) {
                        zio.vdevs.note_error(&io.leaf, ErrorKind::Checksum, None);
                        io_warn!(device = io.leaf.name(), what, "scrub: checksum mismatch");
                    }
                    bad.push(Repair::Copy(io));
                }
                Err(e) => {
                    zio.vdevs.note_error(&io.leaf, ErrorKind::Read, Some(&e));
                    io_warn!(device = io.leaf.name(), what, "scrub: read failed: {e}");
                    bad.push(Repair::Copy(io));
                }
            }
        }
    }
    // No side that should hold the block gave it: the stale sides are the last chance (a
    // missed range may cover txgs the side did get).
    if good.is_none() {
        for (io, len_bytes) in std::mem::take(&mut stale) {
            let read = io
                .leaf
                .read(IoClass::Scrub, io.offset_bytes, IoBuf::zeroed(len_bytes))
                .await;
            match read {
                Ok(buf) if verify(bp, &buf) => {
                    good.get_or_insert(buf);
                }
                _ => bad.push(Repair::Copy(io)),
            }
        }
    }
    bad.extend(stale.into_iter().map(|(io, _)| Repair::Copy(io)));
    counts.copies_bad += bad.len() as u64 + raidz_lost;
    match &good {
        Some(buf) => {
            // A whole copy takes the block at its allocated size; a raidz read returns the
            // data size, which is that size on a single device or mirror.
            let healed = heal(zio, bp.dvas(), &bad, buf).await;
            counts.copies_repaired += healed.places;
            counts.repaired_bytes += healed.bytes;
        }
        None => counts.blocks_lost = 1,
    }
    (good, counts)
}
