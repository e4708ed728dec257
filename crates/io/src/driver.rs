//! The per-thread ring driver: one io_uring ring and one fixed-size op table per thread.
//!
//! Every thread that does I/O owns a [`Driver`] (created lazily in a thread-local). Futures
//! ([`RingOp`]) push SQEs to it; the thread's executor calls [`turn`] to submit them, wait, and
//! reap completions, which wake the futures. Completions therefore run on the thread that
//! submitted, with no hand-off.
//!
//! The op table is a preallocated slab of [`OP_TABLE_CAPACITY`] slots whose index (plus a
//! generation, so a stale cancel can never hit a reused slot) is the SQE `user_data`. A slot
//! owns the operation's buffer and a reference to its file while the kernel may touch them, so
//! dropping a future mid-flight only marks the slot orphaned; the slot, its buffer and its file
//! reference are released when the CQE arrives. No allocation happens per operation.
//!
//! Cross-thread wake-ups: each thread has a [`Notifier`] (an eventfd). The driver keeps a read of
//! that eventfd armed on the ring, so a waker called from another thread writes the eventfd and
//! the ring wait returns. A waker called on the owning thread makes no system call: the owning
//! thread is by definition not asleep in the ring, and its executor re-checks its run queue
//! before it waits.

use std::cell::{OnceCell, RefCell};
use std::io;
use std::marker::PhantomData;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::scatter::Scatter;

use io_uring::{opcode, squeue, types, IoUring};

use crate::buf::IoBuf;
use crate::completion::{self, WaitTarget};
use crate::IoResult;

/// Slots in each thread's op table: the most operations one thread can have in the kernel.
/// When all are taken, a new operation waits for a completion (back-pressure).
pub const OP_TABLE_CAPACITY: usize = 4096;

/// Submission queue entries. Smaller than the op table: SQEs are handed to the kernel at every
/// executor turn, and a full SQ is flushed with a submit on the spot.
const SQ_ENTRIES: u32 = 256;

/// Completion queue entries: room for a CQE from every slot plus a cancel CQE for every slot
/// plus the doorbell, so the CQ cannot overflow in normal operation (the kernel's NODROP
/// overflow list backs us up anyway).
const CQ_ENTRIES: u32 = 4 * OP_TABLE_CAPACITY as u32;

/// Bound on futures waiting for a free slot that are remembered individually. Beyond it, a
/// waiting future is woken at the next turn to retry (it spins, but nothing is lost).
const SLOT_WAITERS_MAX: usize = 16 * OP_TABLE_CAPACITY;

/// `user_data` of the doorbell read on the thread's eventfd.
const USER_DATA_DOORBELL: u64 = u64::MAX;
/// `user_data` of cancel requests, whose CQEs carry nothing we need.
const USER_DATA_CANCEL: u64 = u64::MAX - 1;

/// Largest single read/write handed to the kernel (the SQE length is 32 bits); larger
/// transfers are split by [`RingOp`].
const SUBMISSION_BYTES_MAX: usize = 1 << 30;

/// Retries of an operation that failed with EINTR or EAGAIN before the error is returned.
const TRANSIENT_RETRIES_MAX: u8 = 16;

/// Retries of `io_uring_enter` after EBUSY/EAGAIN within one turn.
const ENTER_RETRIES_MAX: usize = 8;

/// At thread exit, how long the driver waits for operations still in the kernel before it
/// leaks their buffers instead of freeing memory the kernel may still write.
const DROP_WAIT_ROUNDS: usize = 100;
const DROP_WAIT_ROUND: Duration = Duration::from_millis(100);

thread_local! {
    /// This thread's driver, created on first use.
    static DRIVER: RefCell<Option<Driver>> = const { RefCell::new(None) };
    /// This thread's notifier (eventfd), shared with every waker created on this thread.
    static NOTIFIER: OnceCell<Arc<Notifier>> = const { OnceCell::new() };
    /// Its address identifies the thread cheaply (no `Thread` handle clone).
    static THREAD_TOKEN: u8 = const { 0 };
}

/// A cheap identity of the calling thread, unique among live threads.
pub(crate) fn thread_token() -> usize {
    THREAD_TOKEN.with(|t| t as *const u8 as usize)
}

/// Wakes a thread that may be asleep in its ring: an eventfd whose read is kept armed on the
/// thread's ring. Shared (via `Arc`) by every waker of that thread, so the fd stays open as
/// long as any waker may write it.
pub(crate) struct Notifier {
    eventfd: OwnedFd,
    owner_token: usize,
}

impl Notifier {
    /// Makes the owning thread's ring wait return. No system call when called on the owning
    /// thread: that thread is running (it is the caller), and its executor checks its run
    /// queues before it waits.
    pub(crate) fn notify(&self) {
        if thread_token() == self.owner_token {
            return;
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to an eventfd we own. The eventfd is blocking
        // only when its counter would overflow (2^64 - 2), which these writes cannot reach
        // before the owner reads it.
        let written = unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                mem::size_of::<u64>(),
            )
        };
        debug_assert_eq!(
            written,
            8,
            "eventfd write failed: {}",
            io::Error::last_os_error()
        );
    }

    fn raw_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }
}

/// The calling thread's notifier, created on first use.
pub(crate) fn thread_notifier() -> Arc<Notifier> {
    NOTIFIER.with(|cell| {
        cell.get_or_init(|| {
            // SAFETY: plain syscall; the result is checked below. Blocking mode on purpose:
            // io_uring returns EAGAIN for reads of O_NONBLOCK files instead of waiting.
            let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if raw < 0 {
                panic!("oxpool-io: eventfd failed: {}", io::Error::last_os_error());
            }
            // SAFETY: `raw` is a fresh fd owned by nobody else.
            let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
            Arc::new(Notifier {
                eventfd,
                owner_token: thread_token(),
            })
        })
        .clone()
    })
}

/// Runs `f` on this thread's driver, creating it on first use.
///
/// Panics if the ring cannot be created (io_uring disabled) or on re-entrant use, which would
/// be a bug in this crate: the driver never calls out to user code while borrowed.
pub(crate) fn with_driver<R>(f: impl FnOnce(&mut Driver) -> R) -> R {
    DRIVER.with(|cell| {
        let mut guard = cell.borrow_mut();
        if guard.is_none() {
            let driver = Driver::new().unwrap_or_else(|err| {
                panic!("oxpool-io: cannot set up this thread's io_uring ring: {err}")
            });
            *guard = Some(driver);
        }
        f(guard.as_mut().expect("driver was just created"))
    })
}

/// Runs `f` on this thread's driver if it exists and is still alive (not torn down at thread
/// exit). Used on drop paths, which must not create a ring.
fn with_existing_driver<R>(f: impl FnOnce(&mut Driver) -> R) -> Option<R> {
    DRIVER
        .try_with(|cell| cell.borrow_mut().as_mut().map(f))
        .ok()
        .flatten()
}

/// Whether the calling thread may spin before it sleeps in its ring (default: yes). A thread
/// whose waits nobody is waiting on (the txg sync: background writes, milliseconds each)
/// turns it off: on a small machine its spinning would take the CPU the threads that serve
/// clients need.
pub fn set_spin(enabled: bool) {
    with_driver(|d| d.spin.enabled = enabled);
}

/// Operations this thread has in the kernel (in flight or orphaned), or 0 if it has no ring.
/// For tests and diagnostics.
pub fn ops_in_flight() -> usize {
    with_existing_driver(|d| d.in_kernel).unwrap_or(0)
}

/// Hands the operations this thread has queued to the kernel now, without waiting for any
/// completion. Operations are otherwise submitted at the executor's next turn; a task that
/// starts I/O and then computes for milliseconds without yielding (the txg sync starts a
/// batch's writes, then compresses and checksums the next batch) calls this in between, so
/// the device works while it computes instead of after.
pub fn submit_queued() {
    with_existing_driver(|d| {
        if !d.ring.submission().is_empty() {
            d.enter(0);
        }
    });
}

/// Submits queued SQEs, waits for a completion if `block` (and nothing is runnable yet), reaps
/// completions and wakes their futures. Called by the executors between polls.
pub(crate) fn turn(block: bool) {
    let mut wakers = with_driver(|d| d.turn(block));
    // Woken outside the driver borrow: a waker is user code and may, in principle, poll.
    for waker in wakers.drain(..) {
        waker.wake();
    }
    with_driver(|d| d.return_wake_buf(wakers));
}

/// Where an operation is in its life; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// On the free list.
    Free,
    /// Submitted (or queued in the SQ); its future is alive.
    InFlight,
    /// The CQE arrived; result and buffer wait for the future to take them.
    Completed,
    /// The future was dropped while the kernel still owns the op; freed when its CQE arrives.
    Orphaned,
}

/// One entry of the op table.
struct Slot {
    state: SlotState,
    /// Bumped on every free, so `user_data` of a former occupant never matches.
    generation: u32,
    /// CQE result (negative errno on failure).
    result: i32,
    /// The op's result is a new fd (accept) that must be closed if nobody takes it.
    result_is_fd: bool,
    /// A device operation (read, write, fdatasync), counted by the completion accounting.
    device: bool,
    /// An fdatasync: the kernel runs it on a worker thread (see [`Driver::spin_for_event`]).
    fsync: bool,
    waker: Option<Waker>,
    /// The buffer the kernel reads or writes, held here while the op is in the kernel.
    buf: Option<OpBuf>,
    /// Keeps the fd open (and its number unreused) until the op has completed.
    fd: Option<Arc<OwnedFd>>,
    /// Timeout ops point the kernel at this; it lives as long as the slot.
    timespec: types::Timespec,
    /// `sendmsg` ops point the kernel at this (and it at their list's iovecs): the op's
    /// buffer moves between the future and the slot, the slot does not.
    msghdr: libc::msghdr,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: SlotState::Free,
            generation: 0,
            result: 0,
            result_is_fd: false,
            device: false,
            fsync: false,
            waker: None,
            buf: None,
            fd: None,
            timespec: types::Timespec::new(),
            // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control data).
            msghdr: unsafe { mem::zeroed() },
        }
    }
}

/// Names one occupied slot: index and generation (together, the SQE `user_data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpHandle {
    index: u32,
    generation: u32,
}

impl OpHandle {
    fn user_data(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }
}

/// One operation to put on the ring. Buffer ranges refer to the buffer handed to
/// [`Driver::start`]; the fd to the `Arc<OwnedFd>` handed with it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpDesc {
    /// `pread` into `buf[start..start + len]`.
    Read {
        offset_bytes: u64,
        start: usize,
        len: usize,
    },
    /// `pwrite` from `buf[start..start + len]`; with `durable`, `RWF_DSYNC` (a FUA write:
    /// complete only once the bytes are durable).
    Write {
        offset_bytes: u64,
        start: usize,
        len: usize,
        durable: bool,
    },
    /// `fdatasync`.
    Fdatasync,
    /// Completes after `duration`.
    Timeout { duration: Duration },
    /// `recv` into `buf[start..start + len]`.
    Recv { start: usize, len: usize },
    /// `send(MSG_NOSIGNAL)` from `buf[start..start + len]`.
    Send { start: usize, len: usize },
    /// `sendmsg(MSG_NOSIGNAL)` of bytes `[start, start + len)` of a [`SendList`] (at most
    /// [`SEND_IOVECS_MAX`] pieces of it per submission).
    SendMsg { start: usize, len: usize },
    /// `accept4(SOCK_CLOEXEC)`; the result is the new fd.
    Accept,
}

/// A thread's ring and op table. See the module docs.
pub(crate) struct Driver {
    ring: IoUring,
    slots: Box<[Slot]>,
    /// Stack of free slot indices; preallocated to the table size.
    free_slots: Vec<u32>,
    /// Slots in state InFlight or Orphaned: ops whose CQE has not arrived.
    in_kernel: usize,
    /// Futures waiting for a free slot or SQ room (bounded by [`SLOT_WAITERS_MAX`]).
    slot_waiters: Vec<Waker>,
    /// Wakers to wake at the end of this turn; taken out and handed back to avoid allocating.
    wake_buf: Vec<Waker>,
    notifier: Arc<Notifier>,
    /// Target of the armed doorbell read. Boxed so its address is stable.
    doorbell_buf: Box<u64>,
    doorbell_armed: bool,
    /// Whether and when to spin before sleeping.
    spin: SpinState,
    /// fdatasyncs submitted whose CQE has not arrived.
    fsyncs_in_kernel: usize,
    /// When an fdatasync runs on this thread instead of the ring; see [`Driver::fsync_here`].
    fsync_inline: FsyncInline,
    /// Device operations (read, write, fdatasync) submitted whose CQE has not arrived: a
    /// batching wait never asks for more completions than these can produce.
    device_in_kernel: usize,
    /// The kernel takes a timeout with the wait (IORING_FEAT_EXT_ARG, Linux 5.11): without
    /// it there are no batching waits.
    can_batch: bool,
}

/// Longest a reactor spins for a completion before it sleeps in the ring. Below the cost of
/// the wake-up it saves (74-131 us across the development machine's vCPUs): spinning longer
/// than a wake-up costs can never pay.
const SPIN_MAX: Duration = Duration::from_micros(50);

/// Polls of the ring's flags between two reads of the clock while spinning (a poll is a few
/// nanoseconds; 32 of them stay far below the spin's 50 us bound).
const SPIN_CLOCK_EVERY: u32 = 32;

/// A thread spins only if it reaped a completion this recently: a busy reactor's next event
/// is usually microseconds away; an idle one sleeps at once (idle means idle).
const SPIN_ACTIVE_WITHIN: Duration = Duration::from_millis(1);

/// Spins judged together: if fewer than [`SPIN_HITS_MIN`] of them saw an event arrive, or
/// the thread was preempted [`SPIN_PREEMPTIONS_MAX`] times or more meanwhile, the thread stops
/// spinning for [`SPIN_BACKOFF_WAITS`] sleeps, then tries again.
const SPIN_WINDOW: u32 = 64;
const SPIN_HITS_MIN: u32 = 16;
const SPIN_BACKOFF_WAITS: u32 = 1024;

/// Involuntary context switches of the thread in one window of spins that say its CPU is
/// wanted by others: a spin then takes the CPU from a thread that has work (the client, the
/// txg sync), which costs more than the wake-up it saves. Measured per window of 64 spins
/// (2026-11-28, 2 vCPUs, fio on the same machine): 4 KiB random reads at depth 1, where
/// spinning gains a third of the IOPS, 0.04; 4 KiB writes with a flush at depth 1, where it
/// gains nothing and doubles the server's CPU per write, 18; the 128 KiB sequential write,
/// where it costs a tenth of the throughput, 28 (docs/completion.md).
const SPIN_PREEMPTIONS_MAX: u64 = 2;

/// Whether a window of spins paid: enough of them saw an event arrive, and the thread was
/// not preempted as one whose CPU others need.
fn spin_window_pays(hits: u32, preemptions: u64) -> bool {
    hits >= SPIN_HITS_MIN && preemptions < SPIN_PREEMPTIONS_MAX
}

/// The calling thread's involuntary context switches so far (None if the kernel does not
/// say): the times the scheduler took its CPU for another thread.
fn thread_preemptions() -> Option<u64> {
    // SAFETY: all zeros is a valid rusage (integers only).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only the struct it is given, valid for writes.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    (rc == 0).then_some(usage.ru_nivcsw as u64)
}

/// Longest an fdatasync may take, on average, to keep being run on the calling thread (see
/// [`Driver::fsync_here`]), by default: about the cost of one of the two wake-ups it saves,
/// so that a slow device flush never holds a reactor longer than handing it off would have
/// cost.
pub const FSYNC_HERE_MAX_DEFAULT: Duration = Duration::from_micros(100);

/// The limit in force (nanoseconds): [`FSYNC_HERE_MAX_DEFAULT`] unless set.
static FSYNC_HERE_MAX_NS: AtomicU64 = AtomicU64::new(FSYNC_HERE_MAX_DEFAULT.as_nanos() as u64);

/// Sets the longest average fdatasync latency at which fdatasyncs keep running on the calling
/// thread when it is alone (every thread of the process; [`FSYNC_HERE_MAX_DEFAULT`] by
/// default). Zero hands every fdatasync after a first slow one to the ring (but for probes).
pub fn set_fsync_here_max(max: Duration) {
    let ns = max.as_nanos().min(u128::from(u64::MAX)) as u64;
    FSYNC_HERE_MAX_NS.store(ns, Ordering::Relaxed);
}

/// After fdatasyncs on the calling thread turned slow, one eligible call in this many is
/// still run there, to measure again.
const FSYNC_PROBE_EVERY: u32 = 64;

/// Recent latency of fdatasyncs run on the calling thread.
#[derive(Debug, Default)]
struct FsyncInline {
    /// Moving average (1/4 weight to the newest), nanoseconds.
    ewma_ns: u64,
    /// Eligible calls handed to the ring since the last probe.
    skipped: u32,
}

impl FsyncInline {
    fn record(&mut self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.ewma_ns = (self.ewma_ns * 3 + ns) / 4;
        completion::COMPLETIONS
            .fsyncs_inline
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// The adaptive spin of one thread; see [`Driver::spin_for_event`].
#[derive(Debug)]
struct SpinState {
    /// Whether this thread spins at all ([`set_spin`]).
    enabled: bool,
    /// When this thread last reaped a completion.
    last_active: Option<Instant>,
    /// Spins in the current window and how many of them saw an event.
    tries: u32,
    hits: u32,
    /// Sleeps left before spinning is tried again after a window that did not pay.
    backoff_waits: u32,
    /// [`thread_preemptions`] when the current window's first spin began.
    preemptions_at_window_start: Option<u64>,
}

impl Driver {
    fn new() -> io::Result<Driver> {
        let ring = build_ring()?;
        let can_batch = ring.params().is_feature_ext_arg();
        let slots: Box<[Slot]> = (0..OP_TABLE_CAPACITY).map(|_| Slot::new()).collect();
        // Reversed so that low indices are used first (easier to read in traces).
        let free_slots: Vec<u32> = (0..OP_TABLE_CAPACITY as u32).rev().collect();
        Ok(Driver {
            ring,
            slots,
            free_slots,
            in_kernel: 0,
            slot_waiters: Vec::with_capacity(64),
            wake_buf: Vec::with_capacity(OP_TABLE_CAPACITY),
            notifier: thread_notifier(),
            doorbell_buf: Box::new(0),
            doorbell_armed: false,
            spin: SpinState {
                enabled: true,
                last_active: None,
                tries: 0,
                hits: 0,
                backoff_waits: 0,
                preemptions_at_window_start: None,
            },
            fsyncs_in_kernel: 0,
            fsync_inline: FsyncInline::default(),
            device_in_kernel: 0,
            can_batch,
        })
    }

    /// Puts an operation on the ring if a slot and SQ room are free; otherwise remembers
    /// `waker` and returns `None` (the caller retries when woken). On success the slot takes
    /// `buf` and a reference to `fd` until the op's CQE has arrived.
    pub(crate) fn start(
        &mut self,
        desc: OpDesc,
        buf: &mut Option<OpBuf>,
        fd: Option<&Arc<OwnedFd>>,
        waker: &Waker,
    ) -> Option<OpHandle> {
        if self.free_slots.is_empty() || !self.make_sq_room() {
            self.wait_for_resources(waker);
            return None;
        }
        let index = self.free_slots.pop().expect("checked non-empty");
        if matches!(desc, OpDesc::Fdatasync) && self.fsync_here() {
            let fd = fd.expect("an fdatasync has a file");
            let started = Instant::now();
            // SAFETY: a plain syscall on a descriptor the op keeps open.
            let r = unsafe { libc::fdatasync(fd.as_raw_fd()) };
            let result = if r == 0 {
                0
            } else {
                -io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            };
            self.fsync_inline.record(started.elapsed());
            let slot = &mut self.slots[index as usize];
            debug_assert_eq!(slot.state, SlotState::Free);
            slot.state = SlotState::Completed;
            slot.result = result;
            slot.result_is_fd = false;
            slot.device = false;
            slot.fsync = false;
            return Some(OpHandle {
                index,
                generation: slot.generation,
            });
        }
        if matches!(desc, OpDesc::Fdatasync) {
            completion::COMPLETIONS
                .fsyncs_ring
                .fetch_add(1, Ordering::Relaxed);
        }
        let slot = &mut self.slots[index as usize];
        debug_assert_eq!(slot.state, SlotState::Free);
        debug_assert!(slot.buf.is_none() && slot.fd.is_none() && slot.waker.is_none());
        slot.state = SlotState::InFlight;
        slot.result = 0;
        slot.result_is_fd = matches!(desc, OpDesc::Accept);
        slot.device = matches!(
            desc,
            OpDesc::Read { .. } | OpDesc::Write { .. } | OpDesc::Fdatasync
        );
        slot.fsync = matches!(desc, OpDesc::Fdatasync);
        self.fsyncs_in_kernel += usize::from(slot.fsync);
        self.device_in_kernel += usize::from(slot.device);
        slot.buf = buf.take();
        slot.fd = fd.cloned();
        slot.waker = Some(waker.clone());
        let handle = OpHandle {
            index,
            generation: slot.generation,
        };
        let entry = build_entry(desc, slot).user_data(handle.user_data());
        // SAFETY: every pointer in the entry targets memory owned by the slot (the buffer's
        // heap allocation, the slot's timespec) or kept alive by it (the fd), and the slot
        // keeps them until the CQE for this user_data has been reaped; orphaning does not
        // release them early. The table is a boxed slice that never reallocates.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        pushed.expect("make_sq_room guaranteed a free SQ entry");
        self.in_kernel += 1;
        debug_assert!(self.in_kernel <= OP_TABLE_CAPACITY);
        Some(handle)
    }

    /// The op's result and buffer if its CQE has arrived (the slot is freed), else records
    /// `waker` and returns `Pending`.
    pub(crate) fn poll_completion(
        &mut self,
        handle: OpHandle,
        waker: &Waker,
    ) -> Poll<(i32, Option<OpBuf>)> {
        let slot = &mut self.slots[handle.index as usize];
        assert_eq!(slot.generation, handle.generation, "stale op handle");
        match slot.state {
            SlotState::Completed => {
                let result = slot.result;
                let buf = slot.buf.take();
                self.free_slot(handle.index);
                Poll::Ready((result, buf))
            }
            SlotState::InFlight => {
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    slot.waker = Some(waker.clone());
                }
                Poll::Pending
            }
            state => panic!("op handle polled in slot state {state:?}"),
        }
    }

    /// The op's future is gone. If the CQE is in, free now; otherwise mark the slot orphaned
    /// (freed, with its buffer, at the CQE) and, for ops that may never complete on their own
    /// (sockets, timers), ask the kernel to cancel it.
    pub(crate) fn orphan(&mut self, handle: OpHandle, cancel: bool) {
        let slot = &mut self.slots[handle.index as usize];
        debug_assert_eq!(slot.generation, handle.generation);
        if slot.generation != handle.generation {
            return;
        }
        match slot.state {
            SlotState::Completed => {
                close_unclaimed_fd(slot);
                self.free_slot(handle.index);
            }
            SlotState::InFlight => {
                slot.state = SlotState::Orphaned;
                slot.waker = None;
                if cancel && self.make_sq_room() {
                    let entry = opcode::AsyncCancel::new(handle.user_data())
                        .build()
                        .user_data(USER_DATA_CANCEL);
                    // SAFETY: a cancel request references no memory.
                    let pushed = unsafe { self.ring.submission().push(&entry) };
                    debug_assert!(pushed.is_ok());
                }
                // Without SQ room the cancel is skipped: the op still completes when its
                // socket does; the slot is merely held longer.
            }
            state => debug_assert!(false, "orphaning slot in state {state:?}"),
        }
    }

    /// One executor turn; returns the wakers to wake (the caller wakes them outside the borrow
    /// and hands the vector back through [`Driver::return_wake_buf`]).
    fn turn(&mut self, block: bool) -> Vec<Waker> {
        self.arm_doorbell();
        let runnable_now = !self.wake_buf.is_empty()
            || (!self.slot_waiters.is_empty() && self.has_resources())
            || !self.ring.completion().is_empty();
        // Block only with the doorbell armed, or a cross-thread wake could be missed.
        let sleep = block && self.doorbell_armed && !runnable_now;
        let (want, batch_wait) = if sleep {
            match completion::wait_target() {
                _ if !self.can_batch => (1, None),
                WaitTarget::Batch { want, always: true } => {
                    (want, Some(completion::BATCH_WAIT_MAX))
                }
                // Device I/Os still queued elsewhere (a vdev queue, a completion thread)
                // cannot complete on this ring: ask only for what is in its kernel queue,
                // and do not wait for company that cannot come.
                WaitTarget::Batch {
                    want,
                    always: false,
                } if self.device_in_kernel >= 2 => (
                    want.min(self.device_in_kernel),
                    Some(completion::BATCH_WAIT_MAX),
                ),
                _ => (1, None),
            }
        } else {
            (0, None)
        };
        let (sq_len, taskrun) = {
            let sq = self.ring.submission();
            (sq.len(), sq.taskrun())
        };
        // With DEFER_TASKRUN, completions are only posted by an enter with GETEVENTS; the
        // TASKRUN flag says some are pending. Otherwise an idle turn needs no syscall.
        let mut waited = Duration::ZERO;
        let mut want = want;
        if want == 1 && batch_wait.is_none() && self.spin_for_event() {
            want = 0;
        }
        if want > 0 {
            let started = Instant::now();
            match batch_wait {
                Some(timeout) => self.enter_batching(want, timeout),
                None => self.enter(want),
            }
            waited = started.elapsed();
            completion::COMPLETIONS
                .waits
                .fetch_add(1, Ordering::Relaxed);
            if batch_wait.is_some() {
                completion::COMPLETIONS
                    .batch_waits
                    .fetch_add(1, Ordering::Relaxed);
            }
        } else if sq_len > 0 || taskrun || sleep {
            self.enter(0);
        }
        let device_completions = self.reap();
        completion::record_turn(waited, device_completions, batch_wait.is_some());
        if !self.slot_waiters.is_empty() && self.has_resources() {
            // Wake all: a woken waiter may have been dropped, and waking one at a time would
            // then lose the wake-up. Losers re-register.
            self.wake_buf.append(&mut self.slot_waiters);
        }
        mem::take(&mut self.wake_buf)
    }

    fn return_wake_buf(&mut self, wakers: Vec<Waker>) {
        debug_assert!(wakers.is_empty());
        if self.wake_buf.is_empty() {
            // Keep the allocation; anything pushed meanwhile lives in the other vector.
            self.wake_buf = wakers;
        }
    }

    fn has_resources(&mut self) -> bool {
        !self.free_slots.is_empty() && !self.ring.submission().is_full()
    }

    fn wait_for_resources(&mut self, waker: &Waker) {
        if self.slot_waiters.len() < SLOT_WAITERS_MAX {
            self.slot_waiters.push(waker.clone());
        } else {
            // Over the bound: retry after the next turn instead of being remembered.
            self.wake_buf.push(waker.clone());
        }
    }

    /// Ensures the SQ has a free entry, submitting queued SQEs if it is full.
    fn make_sq_room(&mut self) -> bool {
        if !self.ring.submission().is_full() {
            return true;
        }
        match self.ring.submit() {
            Ok(_) => {}
            Err(err) if is_transient_enter_error(&err) => {}
            Err(err) => panic!("oxpool-io: io_uring submit failed: {err}"),
        }
        !self.ring.submission().is_full()
    }

    /// Whether to run an fdatasync on this thread, now, instead of through the ring. io_uring
    /// cannot run an fdatasync without blocking, so it hands it to a kernel worker thread:
    /// a wake-up of that worker and, at its completion, one of this thread (74-131 us each
    /// across the development machine's vCPUs), for a call that takes about 10 us on a fast
    /// device. Done here only when it pays and harms no one: at most one client request is
    /// being served on this thread and no other device I/O of it is in flight (queue depth 1:
    /// nothing else to do but wait), and recent fdatasyncs done here were fast; after a slow
    /// one, only every [`FSYNC_PROBE_EVERY`]th eligible call is done here, to notice when the
    /// device is fast again.
    fn fsync_here(&mut self) -> bool {
        if self.device_in_kernel > 0 || completion::requests_in_flight() > 1 {
            return false;
        }
        let f = &mut self.fsync_inline;
        if f.ewma_ns <= FSYNC_HERE_MAX_NS.load(Ordering::Relaxed) {
            return true;
        }
        f.skipped += 1;
        if f.skipped >= FSYNC_PROBE_EVERY {
            f.skipped = 0;
            return true;
        }
        false
    }

    /// Before a sleep: submits what is queued and, if this thread is active and spinning has
    /// been paying, polls the ring's shared flags for up to [`SPIN_MAX`]. True if an event
    /// (a completion, deferred task work, a cross-thread wake) arrived: the caller then reaps
    /// without sleeping, saving a sleep and a wake-up.
    fn spin_for_event(&mut self) -> bool {
        if !self.spin.enabled {
            return false;
        }
        let now = Instant::now();
        let active = self
            .spin
            .last_active
            .is_some_and(|t| now.saturating_duration_since(t) < SPIN_ACTIVE_WITHIN);
        if !active {
            return false;
        }
        if self.spin.backoff_waits > 0 {
            self.spin.backoff_waits -= 1;
            return false;
        }
        // io_uring runs an fdatasync on a kernel worker thread for tens of microseconds; on a
        // small machine a spinning reactor would take the CPU that worker needs.
        if self.fsyncs_in_kernel > 0 {
            return false;
        }
        // Put queued operations in the kernel first: what we spin for may be their result.
        if !self.ring.submission().is_empty() {
            self.enter(0);
        }
        if self.spin.tries == 0 {
            self.spin.preemptions_at_window_start = thread_preemptions();
        }
        completion::COMPLETIONS
            .spins
            .fetch_add(1, Ordering::Relaxed);
        let deadline = now + SPIN_MAX;
        let mut hit = false;
        // Bounded by the deadline; the flags are shared memory the kernel updates. The clock
        // is read once every SPIN_CLOCK_EVERY polls: a read costs more than a poll (under a
        // hypervisor, most of a spinning reactor's time went to clock_gettime).
        let mut polls: u32 = 0;
        loop {
            if !self.ring.completion().is_empty() || self.ring.submission().taskrun() {
                hit = true;
                break;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(SPIN_CLOCK_EVERY) && Instant::now() >= deadline {
                break;
            }
            std::hint::spin_loop();
        }
        self.spin.tries += 1;
        if hit {
            self.spin.hits += 1;
            completion::COMPLETIONS
                .spin_hits
                .fetch_add(1, Ordering::Relaxed);
        }
        if self.spin.tries == SPIN_WINDOW {
            let preemptions = match (self.spin.preemptions_at_window_start, thread_preemptions()) {
                (Some(start), Some(end)) => end.saturating_sub(start),
                _ => 0,
            };
            if !spin_window_pays(self.spin.hits, preemptions) {
                self.spin.backoff_waits = SPIN_BACKOFF_WAITS;
            }
            self.spin.tries = 0;
            self.spin.hits = 0;
        }
        hit
    }

    /// Waits for `want` completions or `timeout`, whichever comes first (a batching wait).
    fn enter_batching(&mut self, want: usize, timeout: Duration) {
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(want, &args) {
            Ok(_) => {}
            // ETIME: the timeout passed with fewer completions; EINTR: a signal. Either way the
            // executor loop reaps what came and goes on.
            Err(err) if matches!(err.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
            // CQ overflow backlog or kernel short of memory: drain and submit without waiting,
            // as the plain wait does.
            Err(err) if is_transient_enter_error(&err) => {
                self.reap();
                self.enter(0);
            }
            Err(err) => panic!("oxpool-io: io_uring_enter failed: {err}"),
        }
    }

    fn enter(&mut self, mut want: usize) {
        for _ in 0..ENTER_RETRIES_MAX {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                // A signal interrupted the wait: the executor loop re-checks and waits again.
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => return,
                Err(err) if is_transient_enter_error(&err) => {
                    // CQ overflow backlog or kernel short of memory: drain, retry without
                    // waiting (we may now have completions to run).
                    self.reap();
                    want = 0;
                }
                Err(err) => panic!("oxpool-io: io_uring_enter failed: {err}"),
            }
        }
    }

    /// Keeps a read of this thread's eventfd on the ring (see the module docs).
    fn arm_doorbell(&mut self) {
        if self.doorbell_armed || !self.make_sq_room() {
            return;
        }
        let target: *mut u64 = &mut *self.doorbell_buf;
        let entry = opcode::Read::new(
            types::Fd(self.notifier.raw_fd()),
            target.cast(),
            mem::size_of::<u64>() as u32,
        )
        .build()
        .user_data(USER_DATA_DOORBELL);
        // SAFETY: `doorbell_buf` is a heap cell owned by the driver; the driver outlives the
        // read (drop waits for it or leaks the cell) and `notifier` keeps the fd open.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        debug_assert!(pushed.is_ok());
        self.doorbell_armed = true;
    }

    /// Moves every available CQE into its slot and collects the wakers to wake. Returns the
    /// number of device operations among them.
    fn reap(&mut self) -> u64 {
        let Driver {
            ring,
            slots,
            free_slots,
            in_kernel,
            wake_buf,
            doorbell_armed,
            spin,
            fsyncs_in_kernel,
            device_in_kernel,
            ..
        } = self;
        let mut device_completions = 0;
        if !ring.completion().is_empty() {
            spin.last_active = Some(Instant::now());
        }
        // Bounded by the CQ size: the iterator stops at the tail it loaded.
        for cqe in ring.completion() {
            let user_data = cqe.user_data();
            match user_data {
                USER_DATA_DOORBELL => {
                    // The counter was read (and reset) by the op itself; the wakers that rang
                    // already queued their tasks. Re-armed at the next turn.
                    *doorbell_armed = false;
                }
                USER_DATA_CANCEL => {}
                _ => {
                    let index = (user_data & u64::from(u32::MAX)) as u32;
                    let generation = (user_data >> 32) as u32;
                    let slot = &mut slots[index as usize];
                    assert_eq!(slot.generation, generation, "CQE for a reused slot");
                    *in_kernel -= 1;
                    device_completions += u64::from(slot.device);
                    *fsyncs_in_kernel -= usize::from(slot.fsync);
                    *device_in_kernel -= usize::from(slot.device);
                    match slot.state {
                        SlotState::InFlight => {
                            slot.state = SlotState::Completed;
                            slot.result = cqe.result();
                            if let Some(waker) = slot.waker.take() {
                                wake_buf.push(waker);
                            }
                        }
                        SlotState::Orphaned => {
                            slot.result = cqe.result();
                            close_unclaimed_fd(slot);
                            free_slot_in(slots, free_slots, index);
                        }
                        state => panic!("CQE for slot {index} in state {state:?}"),
                    }
                }
            }
        }
        device_completions
    }

    fn free_slot(&mut self, index: u32) {
        free_slot_in(&mut self.slots, &mut self.free_slots, index);
    }
}

fn free_slot_in(slots: &mut [Slot], free_slots: &mut Vec<u32>, index: u32) {
    let slot = &mut slots[index as usize];
    slot.state = SlotState::Free;
    slot.generation = slot.generation.wrapping_add(1);
    slot.waker = None;
    slot.buf = None;
    slot.fd = None;
    slot.result_is_fd = false;
    debug_assert!(free_slots.len() < OP_TABLE_CAPACITY);
    free_slots.push(index);
}

/// An accepted connection nobody will take must still be closed.
fn close_unclaimed_fd(slot: &mut Slot) {
    if slot.result_is_fd && slot.result >= 0 {
        // SAFETY: the kernel handed us this fd as the op's result and nobody else saw it.
        drop(unsafe { OwnedFd::from_raw_fd(slot.result) });
        slot.result_is_fd = false;
    }
}

fn is_transient_enter_error(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EBUSY) | Some(libc::EAGAIN) | Some(libc::EINTR)
    )
}

fn build_entry(desc: OpDesc, slot: &mut Slot) -> squeue::Entry {
    let fd = types::Fd(slot.fd.as_ref().map_or(-1, |fd| fd.as_raw_fd()));
    // Checks the range and gives the kernel a pointer into the slot's buffer: a mutable one
    // (reads, receives) needs a buffer the op owns; a shared one is only ever read from.
    let range = |buf: &Option<OpBuf>, start: usize, len: usize| {
        let buf = buf.as_ref().expect("this op needs a buffer");
        assert!(
            start <= buf.len() && len <= buf.len() - start,
            "op range outside buffer"
        );
        debug_assert!(len <= SUBMISSION_BYTES_MAX);
    };
    let into_range = |buf: &mut Option<OpBuf>, start: usize, len: usize| -> *mut u8 {
        range(buf, start, len);
        let ptr = buf
            .as_mut()
            .and_then(OpBuf::as_mut_ptr)
            .expect("the kernel writes only into a buffer the op owns");
        // SAFETY: in bounds (checked above).
        unsafe { ptr.add(start) }
    };
    let from_range = |buf: &Option<OpBuf>, start: usize, len: usize| -> *const u8 {
        range(buf, start, len);
        let ptr = buf
            .as_ref()
            .and_then(OpBuf::as_ptr)
            .expect("a single buffer");
        // SAFETY: in bounds (checked above).
        unsafe { ptr.add(start) }
    };
    match desc {
        OpDesc::Read {
            offset_bytes,
            start,
            len,
        } => {
            if let Some(OpBuf::Scatter(scatter)) = slot.buf.as_mut() {
                let (iovecs, count) = scatter.iovecs_for(start, start + len);
                return opcode::Readv::new(fd, iovecs, count)
                    .offset(offset_bytes)
                    .build();
            }
            opcode::Read::new(fd, into_range(&mut slot.buf, start, len), len as u32)
                .offset(offset_bytes)
                .build()
        }
        OpDesc::Write {
            offset_bytes,
            start,
            len,
            durable,
        } => {
            let rw_flags: i32 = if durable { libc::RWF_DSYNC } else { 0 };
            if let Some(OpBuf::Gather(gather)) = slot.buf.as_mut() {
                let (iovecs, count) = gather.iovecs_for(start, len);
                return opcode::Writev::new(fd, iovecs, count)
                    .offset(offset_bytes)
                    .rw_flags(rw_flags)
                    .build();
            }
            opcode::Write::new(fd, from_range(&slot.buf, start, len), len as u32)
                .offset(offset_bytes)
                .rw_flags(rw_flags)
                .build()
        }
        OpDesc::Fdatasync => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        OpDesc::Recv { start, len } => {
            if matches!(slot.buf, Some(OpBuf::Scatter(_))) {
                range(&slot.buf, start, len);
                let Some(OpBuf::Scatter(scatter)) = slot.buf.as_mut() else {
                    unreachable!("matched above")
                };
                let (iovecs, count) = scatter.iovecs_for(start, start + len);
                // On a socket `readv` is a `recv` without flags; the offset is not used.
                return opcode::Readv::new(fd, iovecs, count).build();
            }
            opcode::Recv::new(fd, into_range(&mut slot.buf, start, len), len as u32).build()
        }
        OpDesc::Send { start, len } => {
            opcode::Send::new(fd, from_range(&slot.buf, start, len), len as u32)
                .flags(libc::MSG_NOSIGNAL)
                .build()
        }
        OpDesc::SendMsg { start, len } => {
            let Some(OpBuf::List(list)) = slot.buf.as_mut() else {
                panic!("a sendmsg needs a send list");
            };
            let (iovecs, count) = list.iovecs_for(start, len);
            // SAFETY: all-zero is a valid msghdr; only the iovec fields are set.
            slot.msghdr = unsafe { mem::zeroed() };
            slot.msghdr.msg_iov = iovecs;
            slot.msghdr.msg_iovlen = count as _;
            opcode::SendMsg::new(fd, &slot.msghdr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
        }
        OpDesc::Accept => opcode::Accept::new(fd, std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build(),
        OpDesc::Timeout { duration } => {
            slot.timespec = types::Timespec::from(duration);
            opcode::Timeout::new(&slot.timespec).build()
        }
    }
}

/// Creates a ring with SINGLE_ISSUER|DEFER_TASKRUN|COOP_TASKRUN (the owner submits and reaps,
/// with no task-work interrupts), falling back to COOP_TASKRUN only, then to a plain ring, on
/// kernels that refuse the flags.
fn build_ring() -> io::Result<IoUring> {
    let mut last_err = None;
    for flags_level in 0..3 {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(CQ_ENTRIES).setup_clamp();
        if flags_level == 0 {
            builder
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_coop_taskrun()
                .setup_taskrun_flag();
        } else if flags_level == 1 {
            builder.setup_coop_taskrun().setup_taskrun_flag();
        }
        match builder.build(SQ_ENTRIES) {
            Ok(ring) => {
                if flags_level > 0 {
                    tracing::debug!(flags_level, "io_uring: preferred setup flags refused");
                }
                return Ok(ring);
            }
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => last_err = Some(err),
            Err(err) => return Err(err),
        }
    }
    Err(last_err.expect("at least one attempt failed"))
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.in_kernel == 0 && !self.doorbell_armed {
            return;
        }
        // Thread exit with ops in the kernel: cancel what can be cancelled (sockets, timers,
        // the doorbell); disk I/O finishes on its own. Wait, bounded, before freeing buffers.
        if self.make_sq_room() {
            let entry = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(USER_DATA_CANCEL);
            // SAFETY: a cancel request references no memory.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            debug_assert!(pushed.is_ok());
        }
        let timeout = types::Timespec::from(DROP_WAIT_ROUND);
        for _ in 0..DROP_WAIT_ROUNDS {
            if self.in_kernel == 0 && !self.doorbell_armed {
                break;
            }
            let args = types::SubmitArgs::new().timespec(&timeout);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(err)
                    if matches!(
                        err.raw_os_error(),
                        Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                    ) => {}
                Err(_) => break,
            }
            self.reap();
            // Nobody is left to run the woken futures.
            self.wake_buf.clear();
        }
        if self.in_kernel > 0 || self.doorbell_armed {
            // The kernel may still write into these: leaking is the only sound choice.
            tracing::warn!(
                in_kernel = self.in_kernel,
                "oxpool-io: thread exits with I/O still in the kernel; leaking its buffers"
            );
            for slot in self.slots.iter_mut() {
                if matches!(slot.state, SlotState::InFlight | SlotState::Orphaned) {
                    mem::forget(slot.buf.take());
                    mem::forget(slot.fd.take());
                }
            }
            mem::forget(mem::replace(&mut self.doorbell_buf, Box::new(0)));
        }
    }
}

/// What a [`RingOp`] does, with its progress for transfers that may complete in pieces.
#[derive(Debug)]
enum RingOpKind {
    /// Fill the whole buffer from `offset_bytes`; a read of 0 bytes before that is EOF.
    ReadExact {
        offset_bytes: u64,
        done_bytes: usize,
    },
    /// Write the whole buffer at `offset_bytes`; each piece with `RWF_DSYNC` if `durable`.
    WriteAll {
        offset_bytes: u64,
        done_bytes: usize,
        durable: bool,
    },
    Fdatasync,
    Timeout {
        duration: Duration,
    },
    /// One `recv` into `buf[start..end]`.
    Recv {
        start: usize,
        end: usize,
    },
    /// Send `buf[..len]`, looping on short sends.
    SendAll {
        len: usize,
        done_bytes: usize,
    },
    /// Send all of a [`SendList`], looping on short sends.
    SendList {
        done_bytes: usize,
    },
    Accept,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RingOpState {
    /// Not on the ring (not yet submitted, or between pieces of a transfer).
    Idle,
    InFlight(OpHandle),
    Done,
}

/// Most buffers one gathered write takes (far under the kernel's IOV_MAX of 1024).
pub const GATHER_BUFS_MAX: usize = 256;

/// The memory of an op's transfer, held by the op (and by its slot while the kernel uses it):
/// a buffer the op owns; one it shares read-only with others, which only writes and sends
/// take (the kernel reads it; nobody can write through an `Arc` the slot also holds); or
/// several shared buffers written back to back by one vectored write.
#[derive(Debug)]
pub(crate) enum OpBuf {
    Owned(IoBuf),
    Shared(Arc<IoBuf>),
    Gather(Gather),
    /// Owned buffers a vectored receive fills back to back.
    Scatter(Scatter),
    List(SendList),
}

/// Shared buffers written as one contiguous range, with the `iovec` array the kernel reads
/// (rebuilt for each submission, since a short write resumes in the middle of it).
#[derive(Debug)]
pub(crate) struct Gather {
    bufs: Vec<Arc<IoBuf>>,
    len: usize,
    iovecs: Vec<libc::iovec>,
}

impl Gather {
    /// Gathers `bufs` (at most [`GATHER_BUFS_MAX`]).
    pub(crate) fn new(bufs: Vec<Arc<IoBuf>>) -> Gather {
        assert!(
            bufs.len() <= GATHER_BUFS_MAX,
            "too many buffers for one write"
        );
        let len = bufs.iter().map(|b| b.len()).sum();
        Gather {
            iovecs: Vec::with_capacity(bufs.len()),
            bufs,
            len,
        }
    }

    /// Points the `iovec`s at bytes `[start, start + len)` of the concatenated buffers and
    /// returns the array for the kernel.
    fn iovecs_for(&mut self, start: usize, len: usize) -> (*const libc::iovec, u32) {
        debug_assert!(start + len <= self.len);
        // The kernel only reads through these pointers.
        let bufs = self.bufs.iter().map(|b| (b.as_ptr().cast_mut(), b.len()));
        let covered = point_iovecs(&mut self.iovecs, bufs, start, len, usize::MAX);
        debug_assert_eq!(covered, len);
        (self.iovecs.as_ptr(), self.iovecs.len() as u32)
    }
}

/// Points `iovecs` (emptied first) at bytes `[start, start + len)` of the concatenation of
/// `bufs` (start pointer and length of each), at most `max` entries; returns the bytes
/// covered (less than `len` only when `max` stopped it).
pub(crate) fn point_iovecs(
    iovecs: &mut Vec<libc::iovec>,
    bufs: impl Iterator<Item = (*mut u8, usize)>,
    start: usize,
    len: usize,
    max: usize,
) -> usize {
    iovecs.clear();
    let (mut skip, mut left) = (start, len);
    for (ptr, buf_len) in bufs {
        if left == 0 || iovecs.len() == max {
            break;
        }
        if skip >= buf_len {
            skip -= buf_len;
            continue;
        }
        let take = (buf_len - skip).min(left);
        iovecs.push(libc::iovec {
            // SAFETY: `skip < buf_len`: in bounds of the buffer the caller described.
            iov_base: unsafe { ptr.add(skip) } as *mut libc::c_void,
            iov_len: take,
        });
        left -= take;
        skip = 0;
    }
    len - left
}

/// Most iovecs one `sendmsg` is given (the kernel's `UIO_MAXIOV`); a longer [`SendList`]
/// goes out in several submissions, as after a short send.
pub const SEND_IOVECS_MAX: usize = 1024;

/// Bytes to send as one stream, held in pieces: ranges of a buffer the list owns (say a
/// reply's header and bytes copied behind it) and ranges of shared buffers (blocks of a
/// cache, sent where they are), in order. One `sendmsg` takes an iovec per piece, so the
/// pieces are never copied into one buffer first (the kernel copies them into the socket).
///
/// Reused from send to send: its vectors keep their capacity, so a list allocates only while
/// it grows. The list holds every shared buffer until the kernel is done with it, even if
/// the send is dropped midway.
#[derive(Debug, Default)]
pub struct SendList {
    /// The buffers the list owns, in the order they were added ([`SendList::start`],
    /// [`SendList::add_own`]); its owned pieces are ranges of them.
    own: Vec<IoBuf>,
    pieces: Vec<SendPiece>,
    len: usize,
    iovecs: Vec<libc::iovec>,
}

#[derive(Debug)]
enum SendPiece {
    /// Bytes of the owned buffer at this index.
    Own(usize, std::ops::Range<usize>),
    Shared(Arc<IoBuf>, std::ops::Range<usize>),
    Taken(IoBuf, std::ops::Range<usize>),
}

impl SendList {
    /// An empty list, allocating nothing until pieces are pushed.
    pub fn new() -> SendList {
        SendList::default()
    }

    /// Starts a list whose owned pieces will be ranges of `buf`. The list must be empty
    /// (new, or [`SendList::finish`]ed).
    pub fn start(&mut self, buf: IoBuf) {
        assert!(
            self.own.is_empty() && self.pieces.is_empty(),
            "a send list started twice"
        );
        self.own.push(buf);
    }

    /// Adds another owned buffer after the pieces pushed so far: the owned pieces pushed from
    /// now on are ranges of it (say the next reply of a batch, with its own header). The
    /// caller bounds how many a list gets.
    pub fn add_own(&mut self, buf: IoBuf) {
        self.own.push(buf);
    }

    /// Appends bytes `range` of the owned buffer added last (merged with the piece before it
    /// when that one ends where `range` starts in the same buffer).
    pub fn push_own(&mut self, range: std::ops::Range<usize>) {
        let index = self.own.len().saturating_sub(1);
        let own_len = self.own.last().map_or(0, |b| b.len());
        assert!(
            range.start <= range.end && range.end <= own_len,
            "send piece {range:?} outside its {own_len}-byte buffer"
        );
        if range.is_empty() {
            return;
        }
        self.len += range.len();
        if let Some(SendPiece::Own(last_index, last)) = self.pieces.last_mut() {
            if *last_index == index && last.end == range.start {
                last.end = range.end;
                return;
            }
        }
        self.pieces.push(SendPiece::Own(index, range));
    }

    /// Appends bytes `range` of `buf`, which the list holds until they are sent.
    pub fn push_shared(&mut self, buf: Arc<IoBuf>, range: std::ops::Range<usize>) {
        if self.counts(&range, buf.len()) {
            self.pieces.push(SendPiece::Shared(buf, range));
        }
    }

    /// Appends bytes `range` of `buf`, which the list takes and drops once it is finished
    /// (a block read for this send alone, handed over rather than copied).
    pub fn push_taken(&mut self, buf: IoBuf, range: std::ops::Range<usize>) {
        if self.counts(&range, buf.len()) {
            self.pieces.push(SendPiece::Taken(buf, range));
        }
    }

    /// Checks a piece `range` of a `buf_len`-byte buffer and counts its bytes; whether it
    /// has any (an empty piece is not pushed).
    fn counts(&mut self, range: &std::ops::Range<usize>, buf_len: usize) -> bool {
        assert!(
            range.start <= range.end && range.end <= buf_len,
            "send piece {range:?} outside its {buf_len}-byte buffer"
        );
        self.len += range.len();
        !range.is_empty()
    }

    /// Bytes in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Empties the list: lets go of its shared buffers (whose last holder may free them now)
    /// and of the ones it took, and hands back the owned buffers in the order they were added
    /// (the list keeps its capacity whether or not the caller takes them all).
    pub fn finish(&mut self) -> std::vec::Drain<'_, IoBuf> {
        self.pieces.clear();
        self.iovecs.clear();
        self.len = 0;
        self.own.drain(..)
    }

    /// Points the iovecs at bytes `[start, start + len)` of the list, at most
    /// [`SEND_IOVECS_MAX`] of them (a send of fewer bytes than asked, which the op resumes),
    /// and returns the array for the kernel.
    fn iovecs_for(&mut self, start: usize, len: usize) -> (*mut libc::iovec, u32) {
        debug_assert!(start + len <= self.len);
        let own = &self.own;
        // Each piece's first byte and length: `range.end <= buffer length` was checked when
        // the piece was pushed. The kernel only reads through these pointers.
        let pieces = self.pieces.iter().map(|piece| {
            let (base, range) = match piece {
                SendPiece::Own(index, range) => (own[*index].as_ptr(), range),
                SendPiece::Shared(buf, range) => (buf.as_ptr(), range),
                SendPiece::Taken(buf, range) => (buf.as_ptr(), range),
            };
            // SAFETY: `range.start <= buffer length`: in bounds (or one past the end).
            (unsafe { base.add(range.start) }.cast_mut(), range.len())
        });
        point_iovecs(&mut self.iovecs, pieces, start, len, SEND_IOVECS_MAX);
        (self.iovecs.as_mut_ptr(), self.iovecs.len() as u32)
    }
}

impl OpBuf {
    fn len(&self) -> usize {
        match self {
            OpBuf::Owned(b) => b.len(),
            OpBuf::Shared(b) => b.len(),
            OpBuf::Gather(g) => g.len,
            OpBuf::Scatter(s) => s.len_bytes(),
            OpBuf::List(l) => l.len,
        }
    }

    /// The start of a single buffer (a gather has none).
    fn as_ptr(&self) -> Option<*const u8> {
        match self {
            OpBuf::Owned(b) => Some(b.as_ptr()),
            OpBuf::Shared(b) => Some(b.as_ptr()),
            OpBuf::Gather(_) | OpBuf::Scatter(_) | OpBuf::List(_) => None,
        }
    }

    /// A pointer the kernel may write through: only into a buffer the op owns.
    fn as_mut_ptr(&mut self) -> Option<*mut u8> {
        match self {
            OpBuf::Owned(b) => Some(b.as_mut_ptr()),
            OpBuf::Shared(_) | OpBuf::Gather(_) | OpBuf::Scatter(_) | OpBuf::List(_) => None,
        }
    }

    /// The owned buffer back (reads, receives and owned writes and sends give one).
    pub(crate) fn into_owned(self) -> IoBuf {
        match self {
            OpBuf::Owned(b) => b,
            OpBuf::Shared(_) | OpBuf::Gather(_) | OpBuf::Scatter(_) | OpBuf::List(_) => {
                panic!("a shared buffer has no owner to return to")
            }
        }
    }

    /// The scatter back (a vectored receive or read gives one).
    pub(crate) fn into_scatter(self) -> Scatter {
        match self {
            OpBuf::Scatter(s) => s,
            _ => panic!("not a scatter"),
        }
    }

    /// The send list back (a sent list gives it).
    pub(crate) fn into_list(self) -> SendList {
        match self {
            OpBuf::List(l) => l,
            _ => panic!("not a send list"),
        }
    }
}

/// What a finished [`RingOp`] hands back.
#[derive(Debug)]
pub(crate) struct RingOutput {
    /// The buffer the op was given, if any.
    pub(crate) buf: Option<OpBuf>,
    /// Op-specific value: bytes received (recv), the new fd (accept), else 0.
    pub(crate) value: u32,
}

/// A future for one logical operation on the current thread's ring. It is submitted at its
/// first poll (so `join_all` of many ops shares one `io_uring_enter`), and it re-submits the
/// rest of a short transfer. Not `Send`: its slot lives in this thread's op table.
pub(crate) struct RingOp {
    kind: RingOpKind,
    fd: Option<Arc<OwnedFd>>,
    buf: Option<OpBuf>,
    state: RingOpState,
    /// Device name for error messages (file ops).
    context: Option<Arc<str>>,
    transient_retries: u8,
    _not_send: PhantomData<*const ()>,
}

impl RingOp {
    fn new(kind: RingOpKind, fd: Option<Arc<OwnedFd>>, buf: Option<OpBuf>) -> RingOp {
        RingOp {
            kind,
            fd,
            buf,
            state: RingOpState::Idle,
            context: None,
            transient_retries: 0,
            _not_send: PhantomData,
        }
    }

    /// Reads `buf.len()` bytes at `offset_bytes`; a short read at EOF is `UnexpectedEof`.
    pub(crate) fn read_exact(
        fd: Arc<OwnedFd>,
        offset_bytes: u64,
        buf: IoBuf,
        context: Arc<str>,
    ) -> RingOp {
        RingOp::read_exact_into(fd, offset_bytes, OpBuf::Owned(buf), context)
    }

    /// Fills every buffer of `scatter`, back to back, from `offset_bytes` (vectored reads);
    /// a short read at EOF is `UnexpectedEof`.
    pub(crate) fn read_exact_scatter(
        fd: Arc<OwnedFd>,
        offset_bytes: u64,
        scatter: Scatter,
        context: Arc<str>,
    ) -> RingOp {
        assert_eq!(
            scatter.filled_bytes(),
            0,
            "a read fills a scatter from its start"
        );
        RingOp::read_exact_into(fd, offset_bytes, OpBuf::Scatter(scatter), context)
    }

    /// Fills all of `buf` (owned or a scatter) from `offset_bytes`.
    fn read_exact_into(
        fd: Arc<OwnedFd>,
        offset_bytes: u64,
        buf: OpBuf,
        context: Arc<str>,
    ) -> RingOp {
        let mut op = RingOp::new(
            RingOpKind::ReadExact {
                offset_bytes,
                done_bytes: 0,
            },
            Some(fd),
            Some(buf),
        );
        op.context = Some(context);
        op
    }

    /// Writes all of `buf` (owned or shared) at `offset_bytes`; with `durable`, every piece
    /// as a FUA write (`RWF_DSYNC`), so the op completes only once all of it is durable.
    pub(crate) fn write_all(
        fd: Arc<OwnedFd>,
        offset_bytes: u64,
        buf: OpBuf,
        durable: bool,
        context: Arc<str>,
    ) -> RingOp {
        let mut op = RingOp::new(
            RingOpKind::WriteAll {
                offset_bytes,
                done_bytes: 0,
                durable,
            },
            Some(fd),
            Some(buf),
        );
        op.context = Some(context);
        op
    }

    /// `fdatasync`.
    pub(crate) fn fdatasync(fd: Arc<OwnedFd>, context: Arc<str>) -> RingOp {
        let mut op = RingOp::new(RingOpKind::Fdatasync, Some(fd), None);
        op.context = Some(context);
        op
    }

    /// Completes after `duration`.
    pub(crate) fn timeout(duration: Duration) -> RingOp {
        RingOp::new(RingOpKind::Timeout { duration }, None, None)
    }

    /// One `recv` into `buf[start..end]`; the output value is the byte count (0 = EOF).
    pub(crate) fn recv(fd: Arc<OwnedFd>, buf: IoBuf, start: usize, end: usize) -> RingOp {
        debug_assert!(start < end && end <= buf.len());
        RingOp::new(
            RingOpKind::Recv { start, end },
            Some(fd),
            Some(OpBuf::Owned(buf)),
        )
    }

    /// One vectored `recv` into bytes `[start, end)` of `scatter`'s buffers; the output value
    /// is the byte count (0 = EOF).
    pub(crate) fn recv_scatter(
        fd: Arc<OwnedFd>,
        scatter: Scatter,
        start: usize,
        end: usize,
    ) -> RingOp {
        debug_assert!(start < end && end <= scatter.len_bytes());
        RingOp::new(
            RingOpKind::Recv { start, end },
            Some(fd),
            Some(OpBuf::Scatter(scatter)),
        )
    }

    /// Sends `buf[..len]`.
    pub(crate) fn send_all(fd: Arc<OwnedFd>, buf: IoBuf, len: usize) -> RingOp {
        debug_assert!(len <= buf.len());
        RingOp::new(
            RingOpKind::SendAll { len, done_bytes: 0 },
            Some(fd),
            Some(OpBuf::Owned(buf)),
        )
    }

    /// Sends every byte of `list`.
    pub(crate) fn send_list(fd: Arc<OwnedFd>, list: SendList) -> RingOp {
        RingOp::new(
            RingOpKind::SendList { done_bytes: 0 },
            Some(fd),
            Some(OpBuf::List(list)),
        )
    }

    /// Accepts a connection; the output value is the new fd.
    pub(crate) fn accept(fd: Arc<OwnedFd>) -> RingOp {
        RingOp::new(RingOpKind::Accept, Some(fd), None)
    }

    fn buf_len(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// The next SQE to submit for this op.
    fn next_desc(&self) -> OpDesc {
        let buf_len = self.buf_len();
        match self.kind {
            RingOpKind::ReadExact {
                offset_bytes,
                done_bytes,
            } => OpDesc::Read {
                offset_bytes: offset_bytes + done_bytes as u64,
                start: done_bytes,
                len: (buf_len - done_bytes).min(SUBMISSION_BYTES_MAX),
            },
            RingOpKind::WriteAll {
                offset_bytes,
                done_bytes,
                durable,
            } => OpDesc::Write {
                offset_bytes: offset_bytes + done_bytes as u64,
                start: done_bytes,
                len: (buf_len - done_bytes).min(SUBMISSION_BYTES_MAX),
                durable,
            },
            RingOpKind::Fdatasync => OpDesc::Fdatasync,
            RingOpKind::Timeout { duration } => OpDesc::Timeout { duration },
            RingOpKind::Recv { start, end } => OpDesc::Recv {
                start,
                len: (end.min(buf_len) - start).min(SUBMISSION_BYTES_MAX),
            },
            RingOpKind::SendAll { len, done_bytes } => OpDesc::Send {
                start: done_bytes,
                len: (len - done_bytes).min(SUBMISSION_BYTES_MAX),
            },
            RingOpKind::SendList { done_bytes } => OpDesc::SendMsg {
                start: done_bytes,
                len: (buf_len - done_bytes).min(SUBMISSION_BYTES_MAX),
            },
            RingOpKind::Accept => OpDesc::Accept,
        }
    }

    /// Sockets and timers may never complete on their own, so a dropped op is cancelled.
    fn cancel_on_drop(&self) -> bool {
        matches!(
            self.kind,
            RingOpKind::Timeout { .. }
                | RingOpKind::Recv { .. }
                | RingOpKind::SendAll { .. }
                | RingOpKind::SendList { .. }
                | RingOpKind::Accept
        )
    }

    /// The output once the op is complete.
    fn output(&mut self, value: u32) -> IoResult<RingOutput> {
        Ok(RingOutput {
            buf: self.buf.take(),
            value,
        })
    }

    fn error(&self, err: io::Error) -> io::Error {
        let Some(name) = &self.context else {
            return err;
        };
        let what = match self.kind {
            RingOpKind::ReadExact {
                offset_bytes,
                done_bytes,
            } => {
                format!(
                    "read of {} bytes at offset {}",
                    self.buf_len() - done_bytes,
                    offset_bytes + done_bytes as u64
                )
            }
            RingOpKind::WriteAll {
                offset_bytes,
                done_bytes,
                durable,
            } => {
                format!(
                    "{}write of {} bytes at offset {}",
                    if durable { "durable " } else { "" },
                    self.buf_len() - done_bytes,
                    offset_bytes + done_bytes as u64
                )
            }
            RingOpKind::Fdatasync => "fdatasync".to_string(),
            _ => "I/O".to_string(),
        };
        io::Error::new(err.kind(), format!("{name}: {what}: {err}"))
    }

    /// Applies a CQE result: `Some(output)` when the op is finished, `None` to submit again.
    fn on_completion(&mut self, result: i32) -> Option<IoResult<RingOutput>> {
        if result < 0 {
            let errno = -result;
            let transient = errno == libc::EINTR || errno == libc::EAGAIN;
            if transient && self.transient_retries < TRANSIENT_RETRIES_MAX {
                self.transient_retries += 1;
                return None;
            }
            if matches!(self.kind, RingOpKind::Timeout { .. }) {
                // ETIME is the normal end of a timeout; ECANCELED only happens at teardown.
                return Some(self.output(0));
            }
            return Some(Err(self.error(io::Error::from_raw_os_error(errno))));
        }
        let count = result as usize;
        let buf_len = self.buf_len();
        match &mut self.kind {
            RingOpKind::ReadExact { done_bytes, .. } => {
                if count == 0 {
                    let err = io::Error::new(io::ErrorKind::UnexpectedEof, "end of device");
                    return Some(Err(self.error(err)));
                }
                *done_bytes += count;
                debug_assert!(*done_bytes <= buf_len);
                if let Some(OpBuf::Scatter(scatter)) = self.buf.as_mut() {
                    // The next submission resumes after these bytes.
                    scatter.received(count);
                }
                if *done_bytes < buf_len {
                    return None;
                }
                Some(self.output(0))
            }
            RingOpKind::WriteAll { done_bytes, .. } => {
                if count == 0 {
                    let err = io::Error::new(io::ErrorKind::WriteZero, "device accepted 0 bytes");
                    return Some(Err(self.error(err)));
                }
                *done_bytes += count;
                debug_assert!(*done_bytes <= buf_len);
                if *done_bytes < buf_len {
                    return None;
                }
                Some(self.output(0))
            }
            RingOpKind::SendAll { len, done_bytes } => {
                if count == 0 {
                    let err = io::Error::new(io::ErrorKind::WriteZero, "socket accepted 0 bytes");
                    return Some(Err(err));
                }
                *done_bytes += count;
                debug_assert!(*done_bytes <= *len);
                if *done_bytes < *len {
                    return None;
                }
                Some(self.output(0))
            }
            RingOpKind::SendList { done_bytes } => {
                if count == 0 {
                    let err = io::Error::new(io::ErrorKind::WriteZero, "socket accepted 0 bytes");
                    return Some(Err(err));
                }
                *done_bytes += count;
                debug_assert!(*done_bytes <= buf_len);
                if *done_bytes < buf_len {
                    return None;
                }
                Some(self.output(0))
            }
            RingOpKind::Recv { .. } | RingOpKind::Accept => Some(self.output(result as u32)),
            RingOpKind::Fdatasync | RingOpKind::Timeout { .. } => Some(self.output(0)),
        }
    }
}

impl std::future::Future for RingOp {
    type Output = IoResult<RingOutput>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoResult<RingOutput>> {
        let this = self.get_mut();
        // At most two iterations: a completion that needs another piece goes back to Idle,
        // and Idle always returns.
        loop {
            match this.state {
                RingOpState::Idle => {
                    let desc = this.next_desc();
                    let may_finish_at_once = matches!(desc, OpDesc::Fdatasync);
                    let (buf, fd) = (&mut this.buf, this.fd.as_ref());
                    if let Some(handle) = with_driver(|d| d.start(desc, buf, fd, cx.waker())) {
                        this.state = RingOpState::InFlight(handle);
                        if may_finish_at_once {
                            continue; // an fdatasync the driver ran on this thread is done
                        }
                    }
                    // Either way the CQE cannot be here yet: the SQE is submitted at the
                    // executor's next turn, which wakes us.
                    return Poll::Pending;
                }
                RingOpState::InFlight(handle) => {
                    let (result, buf) = match with_driver(|d| d.poll_completion(handle, cx.waker()))
                    {
                        Poll::Ready(done) => done,
                        Poll::Pending => return Poll::Pending,
                    };
                    this.state = RingOpState::Idle;
                    this.buf = buf;
                    if let Some(output) = this.on_completion(result) {
                        this.state = RingOpState::Done;
                        return Poll::Ready(output);
                    }
                }
                RingOpState::Done => panic!("oxpool-io: I/O future polled after completion"),
            }
        }
    }
}

impl Drop for RingOp {
    fn drop(&mut self) {
        if let RingOpState::InFlight(handle) = self.state {
            let cancel = self.cancel_on_drop();
            // If the driver is already gone (thread exit), its drop dealt with the slot.
            with_existing_driver(|d| d.orphan(handle, cancel));
        }
    }
}

impl std::fmt::Debug for RingOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingOp")
            .field("kind", &self.kind)
            .field("state", &self.state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_window_pays_only_with_hits_and_a_cpu_of_its_own() {
        assert!(spin_window_pays(SPIN_WINDOW, 0));
        assert!(spin_window_pays(SPIN_HITS_MIN, SPIN_PREEMPTIONS_MAX - 1));
        // Too few events.
        assert!(!spin_window_pays(SPIN_HITS_MIN - 1, 0));
        // Events, but the CPU is wanted by others (the figures measured in the constant's docs).
        assert!(!spin_window_pays(SPIN_WINDOW, SPIN_PREEMPTIONS_MAX));
        assert!(!spin_window_pays(SPIN_WINDOW, 18));
    }

    /// The bytes `count` iovecs at `ptr` point to, in order (none of them empty).
    ///
    /// # Safety
    ///
    /// `ptr` holds `count` iovecs, each pointing to `iov_len` live bytes.
    unsafe fn iovec_bytes(ptr: *const libc::iovec, count: u32) -> Vec<u8> {
        // SAFETY: the caller's promise.
        let iovecs = unsafe { std::slice::from_raw_parts(ptr, count as usize) };
        let mut got = Vec::new();
        for v in iovecs {
            assert!(v.iov_len > 0, "no empty iovec");
            // SAFETY: the caller's promise.
            got.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
            });
        }
        got
    }

    /// A send list's iovecs cover exactly the bytes asked, wherever a resumed send starts,
    /// at most `SEND_IOVECS_MAX` of them (the rest goes in the next submission); adjacent
    /// owned ranges are one iovec; taken buffers are sent in place like shared ones; `finish`
    /// lets the shared and taken buffers go and returns the owned.
    #[test]
    fn send_list_iovecs_cover_exactly_the_range() {
        let own = IoBuf::from_slice(&(0..200u8).collect::<Vec<u8>>());
        let shared: Vec<Arc<IoBuf>> = (0..1500)
            .map(|i| Arc::new(IoBuf::from_slice(&[i as u8 ^ 0x5a; 10])))
            .collect();
        let mut list = SendList::new();
        list.start(own);
        list.push_own(0..16);
        list.push_own(16..40); // merged with the one before
        let mut whole: Vec<u8> = (0..40u8).collect();
        for (i, buf) in shared.iter().enumerate() {
            list.push_shared(buf.clone(), 2..2 + i % 7 + 1);
            whole.extend_from_slice(&buf[2..2 + i % 7 + 1]);
            if i % 500 == 0 {
                list.push_own(100..104);
                whole.extend(100..104u8);
                let taken = IoBuf::from_slice(&[i as u8 ^ 0xa5; 9]);
                whole.extend_from_slice(&taken[1..8]);
                list.push_taken(taken, 1..8);
            }
        }
        list.push_own(150..150); // empty: nothing
        assert_eq!(list.len(), whole.len());
        assert_eq!(
            list.pieces.len(),
            1 + 1500 + 3 + 3,
            "header merged, empty piece dropped"
        );
        let mut start = 0;
        // Bounded: each pass sends at least one byte.
        while start < whole.len() {
            let (ptr, count) = list.iovecs_for(start, whole.len() - start);
            assert!(count as usize <= SEND_IOVECS_MAX);
            // SAFETY: the array and its buffers live in `list` until the next call.
            let got = unsafe { iovec_bytes(ptr, count) };
            assert_eq!(got, whole[start..start + got.len()], "from {start}");
            // Resume in the middle of a piece next time, as after a short send.
            start += (got.len() - got.len() / 3).max(1);
        }
        assert_eq!(Arc::strong_count(&shared[3]), 2);
        let own = {
            let mut back = list.finish();
            let own = back.next().expect("the owned buffer back");
            assert!(back.next().is_none(), "one owned buffer");
            own
        };
        assert_eq!(own.len(), 200);
        assert_eq!(
            Arc::strong_count(&shared[3]),
            1,
            "finish lets shared buffers go"
        );
        assert!(list.is_empty());
        list.start(own); // reusable
    }

    /// A list of several owned buffers (replies batched into one send): each owned piece is
    /// a range of the buffer added before it, adjacent ranges of two buffers are not merged,
    /// and `finish` hands the buffers back in order.
    #[test]
    fn send_list_of_several_owned_buffers() {
        let first = IoBuf::from_slice(&[1u8; 32]);
        let second = IoBuf::from_slice(&[2u8; 32]);
        let block = Arc::new(IoBuf::from_slice(&[9u8; 16]));
        let mut list = SendList::new();
        list.start(first);
        list.push_own(0..8);
        list.push_shared(block.clone(), 0..16);
        list.push_own(8..12);
        list.add_own(second);
        list.push_own(12..20); // starts where the last owned piece ended, in another buffer
        let mut whole = vec![1u8; 8];
        whole.extend_from_slice(&[9u8; 16]);
        whole.extend_from_slice(&[1u8; 4]);
        whole.extend_from_slice(&[2u8; 8]);
        assert_eq!(list.len(), whole.len());
        assert_eq!(list.pieces.len(), 4, "no merge across buffers");
        // A send resumed at any byte (after a short send), inside or at the edge of either
        // owned buffer, points at exactly the bytes left.
        for start in 0..whole.len() {
            let (ptr, count) = list.iovecs_for(start, whole.len() - start);
            // SAFETY: the array and its buffers live in `list` until the next call.
            let got = unsafe { iovec_bytes(ptr, count) };
            assert_eq!(got, whole[start..], "from {start}");
        }
        let back: Vec<u8> = list.finish().map(|b| b[0]).collect();
        assert_eq!(
            back,
            [1, 2],
            "owned buffers back in the order they were added"
        );
        assert_eq!(
            Arc::strong_count(&block),
            1,
            "finish lets shared buffers go"
        );
        // A caller that takes only the first buffer back: the others are dropped with the
        // drain, and the list is empty and reusable.
        list.start(IoBuf::from_slice(&[3u8; 4]));
        list.push_own(0..4);
        list.add_own(IoBuf::from_slice(&[4u8; 4]));
        list.push_own(0..4);
        let first = list.finish().next().expect("the first buffer back");
        assert_eq!(first[0], 3);
        assert!(list.is_empty());
        list.start(first); // reusable
    }

    /// A gathered write resumed after a short write points its iovecs at exactly the bytes
    /// left, wherever the resume point falls (inside a buffer, at a boundary).
    #[test]
    fn gather_iovecs_cover_exactly_the_range() {
        let lens = [4096usize, 512, 8192, 4096];
        let bufs: Vec<Arc<IoBuf>> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| Arc::new(IoBuf::from_slice(&vec![i as u8 + 1; len])))
            .collect();
        let whole: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        let mut gather = Gather::new(bufs);
        assert_eq!(gather.len, whole.len());
        for (start, len) in [
            (0, whole.len()),
            (100, whole.len() - 100),
            (4096, 512),
            (4096 + 512, 8192 + 4096),
            (5000, 1),
            (0, 4096),
            (whole.len() - 1, 1),
        ] {
            let (ptr, count) = gather.iovecs_for(start, len);
            // SAFETY: the array and its buffers live in `gather` until the next call.
            let got = unsafe { iovec_bytes(ptr, count) };
            assert_eq!(got, whole[start..start + len], "range {start}+{len}");
        }
    }
}
