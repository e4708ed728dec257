//! Reading many blocks at once, with adjacent ones aggregated into one device read (as ZFS's
//! vdev queue aggregates reads up to `zfs_vdev_aggregation_limit`).
//!
//! A reader that walks a tree in order (a send) finds blocks the txg sync wrote side by side:
//! reading each alone costs a device request per block (16 KiB), which a virtual disk serves
//! at a fraction of its sequential rate, and async reads are held to a few in flight once the
//! device is busy. Here a run of blocks whose first copies lie back to back on one
//! non-raidz vdev is read from one of its devices as one request of at most
//! [`READ_RUN_BYTES_MAX`]; each block is then verified against its own checksum. A block that
//! does not verify, or a run whose read fails, goes through [`super::read_block`] block by
//! block, which tries the other copies, counts the errors and heals: the aggregated read is
//! only ever a faster way to the same verified bytes, never a weaker one.

use super::{read_block, verify, Zio};
use crate::vdev::queue::IoClass;
use crate::Result;
use oxpool_format::BlockPtr;
use oxpool_io::IoBuf;
use std::fmt::Display;
use std::sync::Arc;

/// A block's stored bytes as read: a part of a run's buffer, shared with the run's other
/// blocks (no copy), or a buffer of its own.
pub struct StoredBlock {
    buf: Arc<IoBuf>,
    start: usize,
    len: usize,
}

impl StoredBlock {
    fn whole(buf: IoBuf) -> StoredBlock {
        let len = buf.len();
        StoredBlock {
            buf: Arc::new(buf),
            start: 0,
            len,
        }
    }
}

impl std::ops::Deref for StoredBlock {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

/// Most bytes one aggregated read covers: ZFS's `zfs_vdev_aggregation_limit`, as writes.
pub const READ_RUN_BYTES_MAX: u64 = 1 << 20;

/// A run of blocks `bps[first..end]` read as one request (one block: read alone).
struct Run {
    first: usize,
    end: usize,
    bytes: u64,
}

/// Reads and verifies the blocks `bps` (none a hole), aggregating adjacent ones; returns
/// each block's stored bytes (at least its `psize`, as [`read_block`] does) in order.
pub async fn read_blocks(
    zio: &Zio,
    class: IoClass,
    bps: &[BlockPtr],
    what: &(impl Display + ?Sized),
) -> Vec<Result<StoredBlock>> {
    let runs = plan_runs(zio, bps);
    let reads = runs
        .iter()
        .map(|run| read_run(zio, class, &bps[run.first..run.end], run.bytes, what));
    oxpool_io::rt::join_all(reads.collect::<Vec<_>>())
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Splits `bps` into runs: consecutive blocks whose first copies are back to back on the
/// same mirror or single-device vdev, up to [`READ_RUN_BYTES_MAX`] each.
fn plan_runs(zio: &Zio, bps: &[BlockPtr]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    // The place right after the current run's last block, if it may grow.
    let mut next_at: Option<(oxpool_format::VdevId, u64)> = None;
    for (i, bp) in bps.iter().enumerate() {
        debug_assert!(!bp.is_hole());
        let dva = bp.dvas()[0];
        let bytes = u64::from(dva.asize_bytes);
        let aggregable = zio.vdevs.top(dva.vdev).is_some_and(|t| t.raidz.is_none());
        match runs.last_mut() {
            Some(run)
                if aggregable
                    && next_at == Some((dva.vdev, dva.offset_bytes))
                    && run.bytes + bytes <= READ_RUN_BYTES_MAX =>
            {
                run.end = i + 1;
                run.bytes += bytes;
            }
            _ => runs.push(Run {
                first: i,
                end: i + 1,
                bytes,
            }),
        }
        next_at = aggregable.then_some((dva.vdev, dva.offset_bytes + bytes));
    }
    runs
}

/// Reads the run `bps` (`bytes` long on the device) as one request, then verifies each
/// block; whatever fails is read again alone, the careful way.
async fn read_run(
    zio: &Zio,
    class: IoClass,
    bps: &[BlockPtr],
    bytes: u64,
    what: &(impl Display + ?Sized),
) -> Vec<Result<StoredBlock>> {
    if bps.len() == 1 {
        return vec![read_block(zio, class, &bps[0], what)
            .await
            .map(StoredBlock::whole)];
    }
    let first = bps[0].dvas()[0];
    let io = zio
        .vdevs
        .top(first.vdev)
        .and_then(|top| top.plan_read(&first).next());
    let read = match io {
        Some(io) => {
            let batch = zio.completion.batch_guard();
            let read = io
                .leaf
                .read(class, io.offset_bytes, IoBuf::zeroed(bytes as usize))
                .await;
            drop(batch);
            read.ok().map(Arc::new)
        }
        None => None,
    };
    let mut out = Vec::with_capacity(bps.len());
    let mut at = 0usize;
    for bp in bps {
        let len = bp.dvas()[0].asize_bytes as usize;
        let good = read
            .as_ref()
            .filter(|buf| verify(bp, &buf[at..at + len]))
            .map(|buf| StoredBlock {
                buf: buf.clone(),
                start: at,
                len,
            });
        at += len;
        out.push(match good {
            Some(stored) => Ok(stored),
            // Errors are counted, other copies tried and bad ones healed there.
            None => read_block(zio, class, bp, what)
                .await
                .map(StoredBlock::whole),
        });
    }
    out
}
