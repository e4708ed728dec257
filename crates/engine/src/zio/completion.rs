//! The completion policy: where the work that follows a device I/O runs (pool property
//! `completion = auto | inline | worker | batched`).
//!
//! A reactor thread submits a leaf I/O on its own ring and, by default, reaps the completion
//! and finishes the request itself (checksum verification, copy, reply): no hand-off, no
//! wake-up of another thread. That is `inline`, the fix for OpenZFS PR 18562's finding that a
//! completion taskq costs a sleep and a wake-up per I/O. The other policies exist because each
//! wins somewhere:
//!
//! - `worker` hands checksum verification (and the decompression of a compressed data block,
//!   in the same hand-off) of every block read to a pool of completion threads (ZFS's interrupt
//!   taskq shape). It pays only when the reactor's CPU is the bottleneck and
//!   another core is idle; on 2 vCPUs a cross-CPU wake-up costs 74-131 us.
//! - `batched` makes every ring wait with a device I/O in flight ask for two or more
//!   completions and wait up to [`BATCH_WAIT_MAX`] for them, so many completions share one
//!   wake-up (the Linux 2026 task-context completion batching, with a delay even at queue depth
//!   1: the pathology `auto` avoids).
//! - `auto` (default) is inline, plus: a batching wait only while this reactor has two or more
//!   device I/Os in flight and completes at least [`AUTO_BATCH_RATE_PER_S`] per second (so a
//!   second completion is expected within the wait; never at queue depth 1); and verification
//!   (with decompression) on a completion thread only when the reactor serves at least
//!   [`AUTO_OFFLOAD_REQUESTS_MIN`] requests, was busy at least
//!   [`AUTO_OFFLOAD_BUSY_PER_MILLE`] of its last window, the machine left
//!   [`AUTO_OFFLOAD_SPARE_CPU_PER_MILLE`] of a core idle lately (`oxpool_io::spare_cpu`), and
//!   the block is large enough that its
//!   checksum ([`AUTO_OFFLOAD_MIN_BYTES`]) or its decompression
//!   ([`auto_offload_decode_min_bytes`]) costs more than the hand-off.

use crate::zio::compress::{verify_and_decode, Verdict};
use oxpool_format::{BlockPtr, ChecksumType, Compression};
use oxpool_io::completion::{BatchGuard, BatchMode, COMPLETIONS};
use oxpool_io::IoBuf;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

pub use oxpool_io::completion::{AUTO_BATCH_RATE_PER_S, BATCH_WAIT_MAX};

/// Busy fraction (per mille of the last 10 ms window) from which `auto` offloads CPU-heavy
/// completions, when the reactor serves other requests too ([`AUTO_OFFLOAD_REQUESTS_MIN`]):
/// a completion thread then decompresses while the reactor serves them. Measured
/// (128 KiB reads of half-compressible lz4 blocks from the device, two connections at
/// iodepth 16, one server, alternating rounds, 2026-11-27): from 950, `auto` read 7.6K IOPS
/// against `worker`'s 8.9K, as it almost never offloaded; from 700, 8.2K; from 500, 9.0K
/// against 9.4K; offloading every heavy block, 9.2K.
pub const AUTO_OFFLOAD_BUSY_PER_MILLE: u32 = 500;

/// Client requests this reactor must be serving for `auto` to offload: with one (iodepth 1),
/// the reactor only waits for the completion thread. Measured as above at iodepth 1: 6.3K
/// IOPS inline, 5.3K with every heavy block offloaded, and a reactor waiting on its one
/// request shows a busy fraction above 500 (it spins before it sleeps).
pub const AUTO_OFFLOAD_REQUESTS_MIN: usize = 2;

/// Idle CPU (thousandths of one CPU, over 100 ms or more: `oxpool_io::spare_cpu`) the machine
/// must have had for `auto` to offload: a completion thread then finds a core to run on at
/// once. A quarter of a core: below it the cores are as good as all busy (the reactors and the
/// client take them), and a completion thread would only compete with the reactor that
/// handed it the job (in-memory pool, two connections at iodepth 16: `worker` 26.1-27.2K
/// reads/s against `inline`'s 27.5-33.5K).
pub const AUTO_OFFLOAD_SPARE_CPU_PER_MILLE: u32 = 250;

/// `auto`'s load rule for a heavy completion: offload it when this reactor serves
/// `requests` client requests, was busy `busy_per_mille` of its last window, and the machine
/// had `spare_cpu_per_mille` idle lately (`None`: not measured, which does not forbid it).
/// With one request, nothing else could run while a completion thread works: the hand-off
/// and the wake-up back would be pure cost; without an idle core, the completion thread
/// would take the CPU from the reactor.
pub fn auto_offloads(
    requests: usize,
    busy_per_mille: u32,
    spare_cpu_per_mille: Option<u32>,
) -> bool {
    reactor_would_offload(requests, busy_per_mille) && core_is_idle(spare_cpu_per_mille)
}

/// The reactor's half of [`auto_offloads`]: company, and half a window busy.
fn reactor_would_offload(requests: usize, busy_per_mille: u32) -> bool {
    requests >= AUTO_OFFLOAD_REQUESTS_MIN && busy_per_mille >= AUTO_OFFLOAD_BUSY_PER_MILLE
}

/// The machine's half of [`auto_offloads`]: a core idle lately (`None`: not measured).
fn core_is_idle(spare_cpu_per_mille: Option<u32>) -> bool {
    spare_cpu_per_mille.is_none_or(|spare| spare >= AUTO_OFFLOAD_SPARE_CPU_PER_MILLE)
}

/// Smallest block whose verification `auto` may offload. xxh3-128 verifies about 10 GB/s on
/// the development machine, so 128 KiB costs ~13 us, about what handing the job over and
/// waking the reactor back costs when both threads are running; blake3 (about 4x slower) pays
/// from 32 KiB. Smaller blocks are always verified inline.
pub const AUTO_OFFLOAD_MIN_BYTES: u32 = 128 * 1024;

/// Smallest compressed block (by logical size) whose decompression `auto` may offload, as the
/// checksum rule above: where decompressing costs about the hand-off and the wake-up back
/// (~13 us). Measured per core on the development machine (docs/compression.md): liblz4
/// decompresses 1.5-2 GB/s of text and ~8 GB/s of half-zero data, so 32 KiB costs ~4-20 us;
/// zstd 0.5-1 GB/s of text, so from 16 KiB; zle runs at memcpy speed and is never worth it.
pub const fn auto_offload_decode_min_bytes(compression: Compression) -> u32 {
    match compression {
        Compression::Lz4 => 32 * 1024,
        Compression::Zstd => 16 * 1024,
        Compression::Off | Compression::Zle => u32::MAX,
    }
}

/// Slots of the completion-thread job table: the most verifications handed over at once. When
/// all are taken, a completion is verified inline (it never waits for a slot).
pub const WORKER_JOB_SLOTS: usize = 1024;

/// Where completions run; see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompletionPolicy {
    /// Inline, with batching and offload chosen by load.
    #[default]
    Auto,
    /// Every completion on the reactor that reaped it.
    Inline,
    /// Verification on completion threads.
    Worker,
    /// Every completion waits for company.
    Batched,
}

impl CompletionPolicy {
    /// Parses a property value.
    pub fn parse(v: &str) -> Option<CompletionPolicy> {
        Some(match v {
            "auto" => CompletionPolicy::Auto,
            "inline" => CompletionPolicy::Inline,
            "worker" => CompletionPolicy::Worker,
            "batched" => CompletionPolicy::Batched,
            _ => return None,
        })
    }

    /// The property value.
    pub fn as_str(self) -> &'static str {
        match self {
            CompletionPolicy::Auto => "auto",
            CompletionPolicy::Inline => "inline",
            CompletionPolicy::Worker => "worker",
            CompletionPolicy::Batched => "batched",
        }
    }

    fn to_u8(self) -> u8 {
        self as u8
    }

    fn from_u8(v: u8) -> CompletionPolicy {
        match v {
            1 => CompletionPolicy::Inline,
            2 => CompletionPolicy::Worker,
            3 => CompletionPolicy::Batched,
            _ => CompletionPolicy::Auto,
        }
    }
}

/// A pool's current policy, read on every leaf I/O without a lock.
#[derive(Debug, Default)]
pub struct CompletionControl {
    policy: AtomicU8,
}

impl CompletionControl {
    /// A control starting at `policy`.
    pub fn new(policy: CompletionPolicy) -> CompletionControl {
        CompletionControl {
            policy: AtomicU8::new(policy.to_u8()),
        }
    }

    /// The current policy.
    pub fn policy(&self) -> CompletionPolicy {
        CompletionPolicy::from_u8(self.policy.load(Ordering::Relaxed))
    }

    /// Changes the policy; I/Os started afterwards follow it.
    pub fn set(&self, policy: CompletionPolicy) {
        self.policy.store(policy.to_u8(), Ordering::Relaxed);
    }

    /// The batching hint for one leaf I/O about to be awaited on this thread; keep it alive
    /// until the I/O's result is in.
    pub fn batch_guard(&self) -> Option<BatchGuard> {
        match self.policy() {
            CompletionPolicy::Auto => Some(BatchGuard::new(BatchMode::Auto)),
            CompletionPolicy::Batched => Some(BatchGuard::new(BatchMode::Always)),
            CompletionPolicy::Inline | CompletionPolicy::Worker => None,
        }
    }

    /// Verifies `buf` against `bp`, on this thread or on a completion thread as the policy
    /// says. Returns the buffer and whether it holds the block.
    pub async fn verify(&self, bp: &BlockPtr, buf: IoBuf) -> (IoBuf, bool) {
        let (buf, verdict) = self.verify_decode(bp, buf, None).await;
        (buf, matches!(verdict, Verdict::Good(_)))
    }

    /// [`verify_and_decode`] (verify `buf` against `bp`, then, with `decode_to`, decompress a
    /// compressed block into a buffer of that size), on this thread or on a completion thread
    /// as the policy says: both steps in one hand-off. Returns the stored bytes and the
    /// verdict.
    pub async fn verify_decode(
        &self,
        bp: &BlockPtr,
        buf: IoBuf,
        decode_to: Option<usize>,
    ) -> (IoBuf, Verdict) {
        self.start_verify_decode(bp, buf, decode_to).finish().await
    }

    /// [`CompletionControl::verify_decode`] in two steps, for a caller with many blocks to
    /// verify and no list of futures to join: this one verifies here, or hands the job to a
    /// completion thread, and returns at once; [`Verifying::finish`] gives the result. Start
    /// them all before finishing any, and the handed-over ones run side by side.
    pub fn start_verify_decode(
        &self,
        bp: &BlockPtr,
        buf: IoBuf,
        decode_to: Option<usize>,
    ) -> Verifying {
        let decode = decode_to.is_some() && bp.compression != Compression::Off;
        let buf = if self.offload(bp, decode) {
            match VerifyJob::start(bp, buf, decode_to) {
                Ok(job) => return Verifying(VerifyingState::Handed(job)),
                // No free job slot: the buffer comes back and is checked here.
                Err(buf) => buf,
            }
        } else {
            buf
        };
        let verdict = verify_and_decode(bp, &buf, decode_to);
        Verifying(VerifyingState::Done(buf, verdict))
    }

    fn offload(&self, bp: &BlockPtr, decode: bool) -> bool {
        match self.policy() {
            CompletionPolicy::Worker => true,
            CompletionPolicy::Auto => {
                let min_bytes = match bp.checksum_type {
                    ChecksumType::Blake3 => AUTO_OFFLOAD_MIN_BYTES / 4,
                    _ => AUTO_OFFLOAD_MIN_BYTES,
                };
                let heavy = bp.psize_bytes >= min_bytes
                    || (decode && bp.lsize_bytes >= auto_offload_decode_min_bytes(bp.compression));
                // `auto_offloads`, in order of cost: the idle CPU is sampled only when the
                // block is heavy and the reactor would offload it.
                heavy
                    && reactor_would_offload(
                        oxpool_io::completion::requests_in_flight(),
                        oxpool_io::completion::thread_busy_per_mille(),
                    )
                    && core_is_idle(oxpool_io::spare_cpu::spare_cpu_per_mille())
            }
            CompletionPolicy::Inline | CompletionPolicy::Batched => false,
        }
    }
}

/// One job slot of the completion threads.
struct JobSlot {
    bp: Option<BlockPtr>,
    buf: Option<IoBuf>,
    /// The logical size to decompress a compressed block to, if its content is wanted.
    decode_to: Option<usize>,
    state: JobState,
    verdict: Option<Verdict>,
    waker: Option<Waker>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobState {
    Free,
    Queued,
    Done,
    /// The waiting future was dropped; the worker frees the slot when done.
    Abandoned,
}

/// The completion threads: a fixed job table, a bounded queue of slot indices, and threads
/// that verify. Created on first use; lives for the process.
struct Workers {
    slots: Box<[Mutex<JobSlot>]>,
    free: Mutex<Vec<u32>>,
    queue: Mutex<VecDeque<u32>>,
    queued: Condvar,
}

fn workers() -> &'static Workers {
    static WORKERS: OnceLock<&'static Workers> = OnceLock::new();
    WORKERS.get_or_init(|| {
        let w: &'static Workers = Box::leak(Box::new(Workers {
            slots: (0..WORKER_JOB_SLOTS)
                .map(|_| {
                    Mutex::new(JobSlot {
                        bp: None,
                        buf: None,
                        decode_to: None,
                        state: JobState::Free,
                        verdict: None,
                        waker: None,
                    })
                })
                .collect(),
            free: Mutex::new((0..WORKER_JOB_SLOTS as u32).rev().collect()),
            queue: Mutex::new(VecDeque::with_capacity(WORKER_JOB_SLOTS)),
            queued: Condvar::new(),
        }));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for i in 0..threads {
            std::thread::Builder::new()
                .name(format!("oxpool-complete-{i}"))
                .spawn(move || w.run())
                .expect("spawn completion thread");
        }
        w
    })
}

impl Workers {
    fn run(&self) {
        // Unbounded by design: a completion thread lives as long as the process.
        loop {
            let index = {
                let mut q = self.queue.lock().unwrap();
                loop {
                    if let Some(i) = q.pop_front() {
                        break i;
                    }
                    q = self.queued.wait(q).unwrap();
                }
            };
            let (bp, buf, decode_to) = {
                let mut slot = self.slots[index as usize].lock().unwrap();
                (slot.bp.take(), slot.buf.take(), slot.decode_to.take())
            };
            let (Some(bp), Some(buf)) = (bp, buf) else {
                debug_assert!(false, "queued job without its block");
                continue;
            };
            let verdict = verify_and_decode(&bp, &buf, decode_to);
            COMPLETIONS.offloaded.fetch_add(1, Ordering::Relaxed);
            let waker = {
                let mut slot = self.slots[index as usize].lock().unwrap();
                match slot.state {
                    JobState::Queued => {
                        slot.state = JobState::Done;
                        slot.verdict = Some(verdict);
                        slot.buf = Some(buf);
                        slot.waker.take()
                    }
                    JobState::Abandoned => {
                        slot.state = JobState::Free;
                        drop(slot);
                        self.free.lock().unwrap().push(index);
                        None
                    }
                    s => {
                        debug_assert!(false, "job slot in state {s:?} at completion");
                        None
                    }
                }
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

/// A verification started by [`CompletionControl::start_verify_decode`]: done already, or
/// running on a completion thread (dropping it then abandons the job, which frees its slot
/// when done).
#[must_use = "the verdict is had by finishing it"]
pub struct Verifying(VerifyingState);

enum VerifyingState {
    Done(IoBuf, Verdict),
    Handed(VerifyJob),
}

impl Verifying {
    /// The stored bytes and the verdict, once the verification is done.
    pub async fn finish(self) -> (IoBuf, Verdict) {
        match self.0 {
            VerifyingState::Done(buf, verdict) => (buf, verdict),
            VerifyingState::Handed(job) => job.await,
        }
    }
}

/// A verification (and decompression) running on a completion thread; resolves to the
/// buffer and the verdict.
struct VerifyJob {
    index: u32,
    finished: bool,
}

impl VerifyJob {
    /// Hands the job over; gives the buffer back if no slot is free.
    fn start(bp: &BlockPtr, buf: IoBuf, decode_to: Option<usize>) -> Result<VerifyJob, IoBuf> {
        let w = workers();
        let Some(index) = w.free.lock().unwrap().pop() else {
            return Err(buf);
        };
        {
            let mut slot = w.slots[index as usize].lock().unwrap();
            debug_assert_eq!(slot.state, JobState::Free);
            slot.bp = Some(*bp);
            slot.buf = Some(buf);
            slot.decode_to = decode_to;
            slot.verdict = None;
            slot.state = JobState::Queued;
            slot.waker = None;
        }
        let mut q = w.queue.lock().unwrap();
        debug_assert!(q.len() < WORKER_JOB_SLOTS);
        q.push_back(index);
        drop(q);
        w.queued.notify_one();
        Ok(VerifyJob {
            index,
            finished: false,
        })
    }
}

impl Future for VerifyJob {
    type Output = (IoBuf, Verdict);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(IoBuf, Verdict)> {
        let w = workers();
        let mut slot = w.slots[self.index as usize].lock().unwrap();
        match slot.state {
            JobState::Done => {
                let buf = slot.buf.take().expect("done job has its buffer");
                let verdict = slot.verdict.take().expect("done job has its verdict");
                slot.state = JobState::Free;
                drop(slot);
                w.free.lock().unwrap().push(self.index);
                self.finished = true;
                Poll::Ready((buf, verdict))
            }
            JobState::Queued => {
                if !slot.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                    slot.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            s => panic!("verify job polled in state {s:?}"),
        }
    }
}

impl Drop for VerifyJob {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let w = workers();
        let mut slot = w.slots[self.index as usize].lock().unwrap();
        match slot.state {
            JobState::Queued => {
                // The worker still has (or will take) the job; it frees the slot.
                slot.state = JobState::Abandoned;
                slot.waker = None;
            }
            JobState::Done => {
                slot.buf = None;
                slot.verdict = None;
                slot.state = JobState::Free;
                drop(slot);
                w.free.lock().unwrap().push(self.index);
            }
            s => debug_assert!(false, "verify job dropped in state {s:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::{checksum, Dva, VdevId};
    use oxpool_io::rt::block_on;

    /// A lone request keeps its completion however busy the reactor looks (a spinning reactor
    /// at iodepth 1 looks busy); with company, half a window busy is enough.
    #[test]
    fn auto_offloads_only_with_company_half_a_busy_window_and_an_idle_core() {
        assert!(!auto_offloads(0, 1000, None));
        assert!(!auto_offloads(1, 1000, None));
        assert!(!auto_offloads(2, 499, None));
        assert!(auto_offloads(2, 500, None));
        assert!(auto_offloads(16, 700, None));
        assert!(!auto_offloads(16, 0, None));
        // Every core busy: inline, however busy the reactor.
        assert!(!auto_offloads(16, 1000, Some(0)));
        assert!(!auto_offloads(16, 1000, Some(249)));
        assert!(auto_offloads(16, 1000, Some(250)));
        assert!(auto_offloads(2, 500, Some(1500)));
        assert!(!auto_offloads(1, 1000, Some(2000)));
    }

    fn block(len: usize, seed: u8) -> (BlockPtr, IoBuf) {
        let mut buf = IoBuf::zeroed(len);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        let mut bp = BlockPtr {
            ndvas: 1,
            psize_bytes: len as u32,
            lsize_bytes: len as u32,
            checksum_type: ChecksumType::Xxh3_128,
            checksum: checksum(ChecksumType::Xxh3_128, &buf),
            ..BlockPtr::HOLE
        };
        bp.dvas[0] = Dva {
            vdev: VdevId(0),
            offset_bytes: 0,
            asize_bytes: len as u32,
        };
        (bp, buf)
    }

    #[test]
    fn every_policy_gives_the_same_verdicts() {
        for policy in ["auto", "inline", "worker", "batched"] {
            let control = CompletionControl::new(CompletionPolicy::parse(policy).unwrap());
            let before = COMPLETIONS.snapshot().offloaded;
            for (len, seed) in [(4096, 1u8), (131072, 2)] {
                let (bp, buf) = block(len, seed);
                let (back, ok) = block_on(control.verify(&bp, buf));
                assert!(ok, "{policy}: good block of {len} rejected");
                assert_eq!(back.len(), len);
                let mut bad = back;
                bad[len / 2] ^= 1;
                let (_, ok) = block_on(control.verify(&bp, bad));
                assert!(!ok, "{policy}: flipped block of {len} accepted");
            }
            if policy == "worker" {
                assert!(
                    COMPLETIONS.snapshot().offloaded >= before + 4,
                    "worker policy verified on the caller"
                );
            }
        }
    }

    /// Verification and decompression in one completion: every policy returns the content of
    /// a good compressed block, and refuses a flipped one before decompressing it.
    #[test]
    fn every_policy_decompresses_what_verifies() {
        let mut content = IoBuf::zeroed(131072);
        for (i, chunk) in content.chunks_mut(512).enumerate() {
            chunk[..200].fill(i as u8);
        }
        let setting: oxpool_format::CompressionSetting = "zstd".parse().unwrap();
        let mut stored = vec![0u8; oxpool_format::compressed_bytes_max(content.len())];
        let n = oxpool_format::compress_block(setting, &content, &mut stored).unwrap();
        let mut buf = IoBuf::zeroed(n.div_ceil(4096) * 4096);
        buf[..n].copy_from_slice(&stored[..n]);
        let mut bp = BlockPtr {
            ndvas: 1,
            psize_bytes: n as u32,
            lsize_bytes: content.len() as u32,
            compression: Compression::Zstd,
            checksum_type: ChecksumType::Xxh3_128,
            checksum: checksum(ChecksumType::Xxh3_128, &buf[..n]),
            ..BlockPtr::HOLE
        };
        bp.dvas[0] = Dva {
            vdev: VdevId(0),
            offset_bytes: 0,
            asize_bytes: buf.len() as u32,
        };
        for policy in ["auto", "inline", "worker", "batched"] {
            let control = CompletionControl::new(CompletionPolicy::parse(policy).unwrap());
            let before = COMPLETIONS.snapshot().offloaded;
            let (back, verdict) =
                block_on(control.verify_decode(&bp, buf.clone(), Some(content.len())));
            let Verdict::Good(Some(decoded)) = verdict else {
                panic!("{policy}: good block not decoded");
            };
            assert!(decoded[..] == content[..], "{policy}: wrong content");
            assert_eq!(back.len(), buf.len());
            let mut bad = back;
            bad[7] ^= 1;
            let (_, verdict) = block_on(control.verify_decode(&bp, bad, Some(content.len())));
            assert!(matches!(verdict, Verdict::BadChecksum), "{policy}");
            if policy == "worker" {
                assert!(COMPLETIONS.snapshot().offloaded >= before + 2);
            }
        }
    }

    #[test]
    fn dropped_jobs_free_their_slots() {
        // More abandoned jobs than slots: if a dropped job leaked its slot, the later ones
        // would all fall back inline and the offload count would stop growing.
        let mut started = 0;
        for i in 0..(2 * WORKER_JOB_SLOTS) {
            let (bp, buf) = block(4096, i as u8);
            let job = VerifyJob::start(&bp, buf, None);
            started += usize::from(job.is_ok());
            drop(job);
        }
        assert!(started > 0);
        // Every slot must come back once the workers are through: a slot leaked by a dropped
        // job never does. Bounded wait (the workers need only microseconds per job).
        let w = workers();
        for _ in 0..1000 {
            if w.free.lock().unwrap().len() == WORKER_JOB_SLOTS {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(w.free.lock().unwrap().len(), WORKER_JOB_SLOTS);
    }

    #[test]
    fn policies_round_trip_their_names() {
        for p in ["auto", "inline", "worker", "batched"] {
            let policy = CompletionPolicy::parse(p).unwrap();
            assert_eq!(policy.as_str(), p);
            let c = CompletionControl::new(CompletionPolicy::Inline);
            c.set(policy);
            assert_eq!(c.policy(), policy);
        }
        assert!(CompletionPolicy::parse("fast").is_none());
    }
}
