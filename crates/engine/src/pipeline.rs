//! The block pipeline: the one place where block I/O is issued. It executes the vdev tree's
//! plans: writes every copy, reads one copy and verifies it against the checksum held by the
//! parent block pointer, falls back to the other copies on an error or a mismatch, and
//! rewrites the copies that were bad (self-healing), counting every error on its leaf.

use crate::vdev::{LeafIo, VdevTree};
use crate::vdev_queue::IoClass;
use crate::{EngineError, Result};
use oxpool_format::{checksum, BlockPtr, Dva};
use oxpool_io::rt::join_all;
use oxpool_io::IoBuf;
use std::fmt::Display;
use std::sync::atomic::Ordering;

/// Writes `data` (already padded to the allocated size) to every copy in `dvas`, as I/Os of
/// `class`. Succeeds when each DVA has at least one good leaf write; failed leaves are counted.
/// Fails if any DVA could not be written at all. Copies `data` once for each I/O: a caller
/// that owns its buffer uses [`write_block_owned`], which saves one copy.
pub async fn write_block(
    vdevs: &VdevTree,
    class: IoClass,
    dvas: &[Dva],
    data: &IoBuf,
) -> Result<()> {
    write_block_owned(vdevs, class, dvas, data.clone())
        .await
        .map(drop)
}

/// As [`write_block`], with a buffer the caller gives up: the last I/O writes it as it is
/// (the others write copies), and it (or a copy with the same bytes) comes back when the
/// writes are done.
pub async fn write_block_owned(
    vdevs: &VdevTree,
    class: IoClass,
    dvas: &[Dva],
    data: IoBuf,
) -> Result<IoBuf> {
    let mut ios: Vec<(usize, LeafIo)> = Vec::with_capacity(dvas.len() * 2);
    for (i, dva) in dvas.iter().enumerate() {
        debug_assert_eq!(dva.asize_bytes as usize, data.len());
        let top = vdevs
            .top(dva.vdev)
            .ok_or_else(|| EngineError::invalid(format!("write to missing vdev {:?}", dva.vdev)))?;
        ios.extend(top.plan_write(dva).map(|io| (i, io)));
    }
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
            io.leaf.write(class, io.offset_bytes, buf)
        })
        .collect();
    let batch = vdevs.completion.batch_guard();
    let results = join_all(futs).await;
    drop(batch);
    let mut ok = vec![false; dvas.len()];
    let mut last_err = None;
    let mut back = None;
    for ((i, io), r) in ios.iter().zip(results) {
        match r {
            Ok(buf) => {
                ok[*i] = true;
                back = Some(buf);
            }
            Err(e) => {
                io.leaf
                    .counters
                    .write_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    device = io.leaf.name(),
                    offset = io.offset_bytes,
                    "write failed: {e}"
                );
                last_err = Some(EngineError::io(io.leaf.name(), e));
            }
        }
    }
    match back.or(data) {
        Some(buf) if ok.iter().all(|&b| b) => Ok(buf),
        _ => {
            Err(last_err.unwrap_or_else(|| EngineError::invalid("block has a DVA with no device")))
        }
    }
}

/// Reads the block `bp` points to, as I/Os of `class`, and verifies it. Returns a buffer of
/// the allocated size whose first `psize_bytes` are the verified block. `what` names the block
/// in errors; it is only formatted on an error path, so a caller can pass `&format_args!(..)`
/// and a read that succeeds allocates nothing (the buffer comes from the I/O buffer pool, and
/// `bad` stays empty).
pub async fn read_block(
    vdevs: &VdevTree,
    class: IoClass,
    bp: &BlockPtr,
    what: &(impl Display + ?Sized),
) -> Result<IoBuf> {
    let (buf, bad) = read_block_unhealed(vdevs, class, bp, what).await?;
    heal(&bad, &buf).await;
    Ok(buf)
}

/// As [`read_block`], without rewriting the copies that were bad: returns them with the
/// block, for [`heal_copies`]. For a reader whose block pointer may stop being current while
/// it reads (the txg sync may replace the block and free its places): healing then must wait
/// until the caller has checked that the pointer is still current, or it could write the
/// old block over a place already reused.
pub async fn read_block_unhealed(
    vdevs: &VdevTree,
    class: IoClass,
    bp: &BlockPtr,
    what: &(impl Display + ?Sized),
) -> Result<(IoBuf, Vec<LeafIo>)> {
    debug_assert!(!bp.is_hole());
    let mut bad: Vec<LeafIo> = Vec::new();
    let mut last_io_err = None;
    let mut checksum_failures = 0u32;
    for dva in bp.dvas() {
        let Some(top) = vdevs.top(dva.vdev) else {
            continue;
        };
        for io in top.plan_read(dva) {
            let batch = vdevs.completion.batch_guard();
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
                Ok(buf) => Ok(vdevs.completion.verify(bp, buf).await),
                Err(e) => Err(e),
            };
            match read {
                Err(e) => {
                    io.leaf.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = io.leaf.name(), %what, "read failed: {e}");
                    last_io_err = Some(EngineError::io(io.leaf.name(), e));
                    bad.push(io);
                }
                Ok((buf, verified)) => {
                    if verified {
                        return Ok((buf, bad));
                    }
                    io.leaf
                        .counters
                        .checksum_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(device = io.leaf.name(), %what, "checksum mismatch");
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
pub async fn scrub_block(
    vdevs: &VdevTree,
    bp: &BlockPtr,
    what: &str,
) -> (Option<IoBuf>, ScrubCounts) {
    let mut counts = ScrubCounts::default();
    let mut good: Option<IoBuf> = None;
    let mut bad: Vec<LeafIo> = Vec::new();
    for dva in bp.dvas() {
        let Some(top) = vdevs.top(dva.vdev) else {
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
