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
//!
//! A volume read that spans several blocks ([`read_data_run`]) does the same with the blocks
//! it misses in the data cache: a 128 KiB read of 16 KiB blocks written side by side is one
//! device request, not eight (measured: eight cost the reactor about twice the CPU of one, in
//! submissions, completions, page pinning and, with a delay injected, timers).
//!
//! A reader that goes on reading runs ([`read_run`] one by one, as a send's sliding window
//! does) reuses their buffers through [`RunBufs`]: a fresh 1 MiB buffer costs a zeroing (and
//! page faults) of every byte before the device overwrites it.

use super::completion::Verifying;
use super::compress::Verdict;
use super::{read_block, verify, DataBlock, Zio};
use crate::vdev::queue::IoClass;
use crate::vdev::{ErrorKind, LeafIo};
use crate::zio::warn_limit::io_warn;
use crate::Result;
use oxpool_format::BlockPtr;
use oxpool_io::scratch::{Scratch, Stash};
use oxpool_io::{IoBuf, Scatter};
use std::fmt::Display;
use std::sync::{Arc, Mutex};

/// A block's stored bytes as read: a part of a run's buffer, shared with the run's other
/// blocks (no copy), or a buffer of its own.
pub struct StoredBlock {
    buf: Arc<RunBuf>,
    start: usize,
    len: usize,
}

impl StoredBlock {
    fn whole(buf: IoBuf) -> StoredBlock {
        let len = buf.len();
        StoredBlock {
            buf: Arc::new(RunBuf { buf, home: None }),
            start: 0,
            len,
        }
    }
}

impl std::ops::Deref for StoredBlock {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf.buf[self.start..self.start + self.len]
    }
}

/// A run's buffer, which goes back to its [`RunBufs`] (if it came from one) when the last
/// block in it is dropped.
struct RunBuf {
    buf: IoBuf,
    home: Option<Arc<RunBufs>>,
}

impl Drop for RunBuf {
    fn drop(&mut self) {
        if let Some(home) = &self.home {
            // An empty buffer takes its place: allocates nothing.
            home.give(std::mem::replace(&mut self.buf, IoBuf::zeroed(0)));
        }
    }
}

/// Run buffers kept for reuse by one reader (a send): at most `count_max` of them, of
/// whatever lengths its runs had. A reused buffer is not zeroed: the device read overwrites
/// all of it (a read that returns fewer bytes fails), and every block in it is verified
/// against its checksum before anyone sees it.
pub struct RunBufs {
    free: Mutex<Vec<IoBuf>>,
    count_max: usize,
}

impl RunBufs {
    /// A pool keeping at most `count_max` free buffers (the most runs its reader holds at
    /// once is enough: more would never be reused).
    pub fn new(count_max: usize) -> Arc<RunBufs> {
        Arc::new(RunBufs {
            free: Mutex::new(Vec::new()),
            count_max,
        })
    }

    /// A buffer of exactly `len` bytes: a free one, else a new zeroed one.
    fn take(&self, len: usize) -> IoBuf {
        let mut free = self.free.lock().unwrap();
        // Bounded by `count_max`.
        if let Some(i) = free.iter().position(|b| b.len() == len) {
            return free.swap_remove(i);
        }
        drop(free);
        IoBuf::zeroed(len)
    }

    fn give(&self, buf: IoBuf) {
        let mut free = self.free.lock().unwrap();
        if free.len() < self.count_max {
            free.push(buf);
        }
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
        .map(|run| read_run(zio, class, &bps[run.first..run.end], run.bytes, what, None));
    oxpool_io::rt::join_all(reads.collect::<Vec<_>>())
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The bytes `bp`'s first copy takes on its device: what it adds to a run.
pub fn run_bytes(bp: &BlockPtr) -> u64 {
    u64::from(bp.dvas()[0].asize_bytes)
}

/// Whether `next` may join a run of `run_bytes` (as [`run_bytes`] counts them) ending with
/// `last`: their first copies lie back to back on the same mirror or single-device vdev, and
/// the run stays within `run_bytes_max` (at most [`READ_RUN_BYTES_MAX`]).
pub fn extends_run(
    zio: &Zio,
    last: &BlockPtr,
    run_bytes: u64,
    next: &BlockPtr,
    run_bytes_max: u64,
) -> bool {
    debug_assert!(!last.is_hole() && !next.is_hole());
    let (a, b) = (last.dvas()[0], next.dvas()[0]);
    a.vdev == b.vdev
        && a.offset_bytes + u64::from(a.asize_bytes) == b.offset_bytes
        && run_bytes + u64::from(b.asize_bytes) <= run_bytes_max.min(READ_RUN_BYTES_MAX)
        && zio.vdevs.top(b.vdev).is_some_and(|t| t.raidz.is_none())
}

/// Splits `bps` into runs: consecutive blocks whose first copies are back to back on the
/// same mirror or single-device vdev, up to [`READ_RUN_BYTES_MAX`] each.
fn plan_runs(zio: &Zio, bps: &[BlockPtr]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (i, bp) in bps.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if extends_run(zio, &bps[i - 1], run.bytes, bp, READ_RUN_BYTES_MAX) => {
                run.end = i + 1;
                run.bytes += run_bytes(bp);
            }
            _ => runs.push(Run {
                first: i,
                end: i + 1,
                bytes: run_bytes(bp),
            }),
        }
    }
    runs
}

/// Reads the run `bps` (`bytes` long on the device, blocks that [`extends_run`] chained) as
/// one request into a buffer from `bufs` (a new one without), then verifies each block;
/// whatever fails is read again alone, the careful way.
pub async fn read_run(
    zio: &Zio,
    class: IoClass,
    bps: &[BlockPtr],
    bytes: u64,
    what: &(impl Display + ?Sized),
    bufs: Option<&Arc<RunBufs>>,
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
            let buf = match bufs {
                Some(bufs) => bufs.take(bytes as usize),
                None => IoBuf::zeroed(bytes as usize),
            };
            let batch = zio.completion.batch_guard();
            let read = io.leaf.read(class, io.offset_bytes, buf).await;
            drop(batch);
            read.ok().map(|buf| {
                Arc::new(RunBuf {
                    buf,
                    home: bufs.cloned(),
                })
            })
        }
        None => None,
    };
    let mut out = Vec::with_capacity(bps.len());
    let mut at = 0usize;
    for bp in bps {
        let len = bp.dvas()[0].asize_bytes as usize;
        let good = read
            .as_ref()
            .filter(|run| verify(bp, &run.buf[at..at + len]))
            .map(|run| StoredBlock {
                buf: run.clone(),
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

/// A block of a run, as [`read_data_run`] gives it.
pub enum RunBlock {
    /// Verified (and decoded).
    Good(DataBlock),
    /// Not had from the run: its read failed or the block's copy in it does not verify
    /// (`Some`: where that copy is, counted against its device already, to try last and to
    /// rewrite once the block is had from another), or no device could take the run (`None`).
    Retry(Option<LeafIo>),
}

/// Reads the data blocks `bps`, a run that [`extends_run`] chained, as one device request, and
/// verifies each (decoding a compressed one to `lsize_bytes`); if that read fails, each block
/// is read alone from the same device. A failed block read or a copy that does not verify is
/// counted against the device, as [`super::read_data_block_unhealed`] counts it; the caller
/// reads each [`RunBlock::Retry`] block again the careful way
/// ([`super::read_data_block_after_bad_copy`]: its other copies first, this one last and not
/// counted again), and rewrites the bad copy. Appends one [`RunBlock`] per block to `out`, in
/// order.
///
/// The run is one vectored read straight into one buffer per block (the data cache holds
/// blocks, not runs), so no block is copied out of a run buffer. Its lists are scratch
/// values of this thread ([`oxpool_io::scratch`]): a run that reads and verifies allocates
/// nothing.
pub async fn read_data_run(
    zio: &Zio,
    class: IoClass,
    bps: &[BlockPtr],
    lsize_bytes: usize,
    what: &(impl Display + ?Sized),
    out: &mut Vec<RunBlock>,
) {
    thread_local! {
        static SCATTERS: Stash<Scatter> = const { Stash::new() };
        static STORED: Stash<Vec<Option<IoBuf>>> = const { Stash::new() };
        static CHECKS: Stash<Vec<(Option<Verifying>, LeafIo)>> = const { Stash::new() };
    }
    debug_assert!(bps.len() >= 2);
    debug_assert!(bps
        .windows(2)
        .all(|w| extends_run(zio, &w[0], 0, &w[1], READ_RUN_BYTES_MAX)));
    let bytes: u64 = bps.iter().map(run_bytes).sum();
    assert!(
        bytes <= READ_RUN_BYTES_MAX,
        "a run is at most {READ_RUN_BYTES_MAX} bytes"
    );
    let first = bps[0].dvas()[0];
    // Not a mirror side that missed some of these blocks' txgs: it may lack them.
    let io = zio.vdevs.top(first.vdev).and_then(|top| {
        top.plan_read(&first)
            .find(|io| bps.iter().all(|bp| !io.leaf.health.missed_covers(bp.birth)))
    });
    let Some(io) = io else {
        out.extend(bps.iter().map(|_| RunBlock::Retry(None)));
        return;
    };
    // Each block's copy straight into its own buffer (one vectored read).
    let mut scatter = Scratch::take(&SCATTERS);
    for bp in bps {
        scatter.push(IoBuf::for_overwrite(run_bytes(bp) as usize));
    }
    debug_assert_eq!(scatter.len_bytes() as u64, bytes);
    let batch = zio.completion.batch_guard();
    let read = io
        .leaf
        .read_scatter(class, io.offset_bytes, std::mem::take(&mut *scatter))
        .await;
    drop(batch);
    // Where the copy `at` bytes into the run is on its device.
    let place = |at: u64| LeafIo {
        leaf: io.leaf.clone(),
        offset_bytes: io.offset_bytes + at,
    };
    // Each block's stored bytes: from the run's buffer, or if the run's read failed, from a
    // read of the block alone on the same device (as ZFS reissues the parts of a failed
    // aggregated I/O), so that a failing device is charged per block, as without runs. One
    // after the other, and none once the device is out of service (the fault rule counts
    // errors up to its limit, not a run's worth past it).
    let mut stored = Scratch::take(&STORED);
    match read {
        Ok(run) => {
            // Back in the stash's scatter, which keeps its capacity for the next run.
            *scatter = run;
            let bufs = scatter.bufs_mut();
            assert_eq!(bufs.len(), bps.len(), "a run read gave back every block");
            stored.extend(bufs.drain(..).map(Some));
        }
        // Bounded by the blocks of the run.
        Err(_) => {
            let mut at = 0;
            for bp in bps {
                let place = place(at);
                at += run_bytes(bp);
                if !place.leaf.health.in_service() {
                    stored.push(None);
                    continue;
                }
                let len = bp.dvas()[0].asize_bytes as usize;
                let batch = zio.completion.batch_guard();
                let read = place
                    .leaf
                    .read(class, place.offset_bytes, IoBuf::for_overwrite(len))
                    .await;
                drop(batch);
                stored.push(match read {
                    Ok(buf) => Some(buf),
                    Err(e) => {
                        zio.vdevs.note_error(&place.leaf, ErrorKind::Read, Some(&e));
                        io_warn!(device = place.leaf.name(), %what, "read failed: {e}");
                        None
                    }
                });
            }
        }
    }
    // Verified together: every block's check starts (with `completion=auto` on a busy
    // reactor, each may go to a worker) before any is waited for. Bounded by the blocks of
    // the run.
    let mut checks = Scratch::take(&CHECKS);
    let mut at = 0;
    for (bp, stored) in bps.iter().zip(stored.drain(..)) {
        let verifying = stored.map(|stored| {
            zio.completion
                .start_verify_decode(bp, stored, Some(lsize_bytes))
        });
        checks.push((verifying, place(at)));
        at += run_bytes(bp);
    }
    // Bounded by the blocks of the run.
    for (verifying, place) in checks.drain(..) {
        let Some(verifying) = verifying else {
            out.push(RunBlock::Retry(Some(place)));
            continue;
        };
        out.push(match verifying.finish().await {
            (stored, Verdict::Good(None)) => RunBlock::Good(DataBlock {
                content: stored,
                stored: None,
            }),
            (stored, Verdict::Good(Some(content))) => RunBlock::Good(DataBlock {
                content,
                stored: Some(stored),
            }),
            (_, Verdict::BadChecksum | Verdict::Undecodable) => {
                zio.vdevs.note_error(&place.leaf, ErrorKind::Checksum, None);
                io_warn!(device = place.leaf.name(), %what, "checksum mismatch");
                RunBlock::Retry(Some(place))
            }
        });
    }
}
