//! Completion accounting and the ring's batching hint.
//!
//! How a device completion is finished is chosen by the pool's `completion` property (see the
//! engine's `completion` module): on the reactor that reaped it, right away (*inline*); on the
//! reactor after a ring wait that asked for several completions at once (*batched*, one wake-up
//! for many); or on a completion thread (*offloaded*). The counters here are process-wide and
//! only ever increase; `oxpool iostat` shows their rates per I/O.
//!
//! The batching hint: the engine tells this thread's driver how many of the device I/Os it has
//! in flight may wait for company ([`BatchGuard`]). The driver's wait then asks the kernel for
//! more than one completion, with a short timeout, only while such I/Os are in flight; a
//! queue-depth-1 request never carries the hint into a wait alone (see `driver::wait_target`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest a batching ring wait delays a completion that has already arrived. Measured: a
/// cross-vCPU wake-up on the development machine costs 74-131 us, a 4 KiB device read about
/// 30-60 us, so waiting up to 50 us for a second completion costs at most about one wake-up
/// and saves one per completion that joins the batch.
pub const BATCH_WAIT_MAX: Duration = Duration::from_micros(50);

/// Most completions one batching wait asks for.
pub const BATCH_COMPLETIONS_MAX: usize = 16;

/// Process-wide completion counters.
#[derive(Debug, Default)]
pub struct CompletionCounters {
    /// Device completions finished on the reactor that reaped them, after a wait for one.
    pub inline: AtomicU64,
    /// Device completions reaped by a wait that asked for more than one completion.
    pub batched: AtomicU64,
    /// Device completions whose CPU work (checksum verification) ran on a completion thread.
    pub offloaded: AtomicU64,
    /// Ring waits that slept (asked the kernel for at least one completion).
    pub waits: AtomicU64,
    /// Ring waits that asked for more than one completion (batching waits).
    pub batch_waits: AtomicU64,
    /// Spins before a sleep (a busy reactor polls briefly for its next event).
    pub spins: AtomicU64,
    /// Spins that saw an event arrive, each a sleep and a wake-up saved.
    pub spin_hits: AtomicU64,
    /// fdatasyncs run on the calling thread (queue depth 1, fast device).
    pub fsyncs_inline: AtomicU64,
    /// fdatasyncs handed to the ring (run by a kernel worker thread).
    pub fsyncs_ring: AtomicU64,
}

/// A point-in-time copy of [`CompletionCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletionSnapshot {
    /// See [`CompletionCounters::inline`].
    pub inline: u64,
    /// See [`CompletionCounters::batched`].
    pub batched: u64,
    /// See [`CompletionCounters::offloaded`].
    pub offloaded: u64,
    /// See [`CompletionCounters::waits`].
    pub waits: u64,
    /// See [`CompletionCounters::batch_waits`].
    pub batch_waits: u64,
    /// See [`CompletionCounters::spins`].
    pub spins: u64,
    /// See [`CompletionCounters::spin_hits`].
    pub spin_hits: u64,
    /// See [`CompletionCounters::fsyncs_inline`].
    pub fsyncs_inline: u64,
    /// See [`CompletionCounters::fsyncs_ring`].
    pub fsyncs_ring: u64,
}

/// The process's completion counters.
pub static COMPLETIONS: CompletionCounters = CompletionCounters {
    inline: AtomicU64::new(0),
    batched: AtomicU64::new(0),
    offloaded: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    batch_waits: AtomicU64::new(0),
    spins: AtomicU64::new(0),
    spin_hits: AtomicU64::new(0),
    fsyncs_inline: AtomicU64::new(0),
    fsyncs_ring: AtomicU64::new(0),
};

impl CompletionCounters {
    /// Copies the counters.
    pub fn snapshot(&self) -> CompletionSnapshot {
        CompletionSnapshot {
            inline: self.inline.load(Ordering::Relaxed),
            batched: self.batched.load(Ordering::Relaxed),
            offloaded: self.offloaded.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            batch_waits: self.batch_waits.load(Ordering::Relaxed),
            spins: self.spins.load(Ordering::Relaxed),
            spin_hits: self.spin_hits.load(Ordering::Relaxed),
            fsyncs_inline: self.fsyncs_inline.load(Ordering::Relaxed),
            fsyncs_ring: self.fsyncs_ring.load(Ordering::Relaxed),
        }
    }
}

/// How a device I/O's completion may be batched: see [`BatchGuard`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchMode {
    /// Always wait for company (`completion=batched`): a ring wait with such an I/O in flight
    /// asks for at least two completions, even at queue depth 1, and takes up to
    /// [`BATCH_WAIT_MAX`] to get them. The classic "delay every completion a little" shape,
    /// kept as a baseline.
    Always,
    /// Wait for company only under load (`completion=auto`): when at least two such I/Os are
    /// in flight on this thread and its device completion rate is at least
    /// [`AUTO_BATCH_RATE_PER_S`], so a second completion is expected within the wait.
    Auto,
}

/// Device completions per second on one reactor above which `auto` batches: one completion
/// per [`BATCH_WAIT_MAX`]. Below it, a batching wait would usually time out with one
/// completion, having added delay and saved no wake-up.
pub const AUTO_BATCH_RATE_PER_S: u64 = 1_000_000 / BATCH_WAIT_MAX.as_micros() as u64;

/// Length of the window over which a reactor measures its completion rate and busy fraction.
const WINDOW: Duration = Duration::from_millis(10);

/// Per-thread state of the batching decision and of the reactor's load.
struct ThreadLoad {
    /// In-flight device I/Os in [`BatchMode::Always`].
    always_in_flight: Cell<usize>,
    /// In-flight device I/Os in [`BatchMode::Auto`].
    auto_in_flight: Cell<usize>,
    /// Start of the current measurement window (None before the first measurement).
    window_start: Cell<Option<Instant>>,
    /// Device completions reaped in the current window.
    window_completions: Cell<u64>,
    /// Nanoseconds spent asleep in ring waits in the current window.
    window_wait_ns: Cell<u64>,
    /// Device completions per second over the last full window.
    rate_per_s: Cell<u64>,
    /// Busy fraction of the last full window, in per mille (1000 = never waited).
    busy_per_mille: Cell<u32>,
    /// Client requests being served on this thread ([`RequestGuard`]).
    requests_in_flight: Cell<usize>,
}

thread_local! {
    static LOAD: ThreadLoad = const {
        ThreadLoad {
            always_in_flight: Cell::new(0),
            auto_in_flight: Cell::new(0),
            window_start: Cell::new(None),
            window_completions: Cell::new(0),
            window_wait_ns: Cell::new(0),
            rate_per_s: Cell::new(0),
            busy_per_mille: Cell::new(0),
            requests_in_flight: Cell::new(0),
        }
    };
}

/// Marks one client request as being served on this thread while it lives (the NBD server
/// holds one per request from its arrival to its reply). The driver runs an fdatasync on the
/// calling thread only when at most one request is in flight here: with more, the others
/// would wait behind the blocking call. Not `Send` (the count is per thread).
#[derive(Debug)]
pub struct RequestGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl RequestGuard {
    /// Counts one request on this thread.
    #[allow(clippy::new_without_default)]
    pub fn new() -> RequestGuard {
        LOAD.with(|l| l.requests_in_flight.set(l.requests_in_flight.get() + 1));
        RequestGuard {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        LOAD.with(|l| {
            let n = l.requests_in_flight.get();
            debug_assert!(n > 0, "request count underflow");
            l.requests_in_flight.set(n.saturating_sub(1));
        });
    }
}

/// Client requests being served on this thread (see [`RequestGuard`]).
pub fn requests_in_flight() -> usize {
    LOAD.with(|l| l.requests_in_flight.get())
}

/// What the next blocking ring wait of this thread should ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitTarget {
    /// One completion, as long as it takes.
    One,
    /// `want` completions or [`BATCH_WAIT_MAX`], whichever comes first. `always`: the
    /// baseline batching of [`BatchMode::Always`], which waits for company even when no other
    /// device I/O is in the kernel; otherwise the caller caps `want` at the device I/Os in its
    /// ring's kernel queue (only those can complete there) and waits for one if that leaves
    /// fewer than two.
    Batch { want: usize, always: bool },
}

/// What the next blocking ring wait of this thread should ask for.
pub(crate) fn wait_target() -> WaitTarget {
    LOAD.with(|l| {
        let always = l.always_in_flight.get();
        let auto = l.auto_in_flight.get();
        if always > 0 {
            // Baseline batching: wait for company even when nothing else is in flight.
            let want = (always + auto).clamp(2, BATCH_COMPLETIONS_MAX);
            return WaitTarget::Batch { want, always: true };
        }
        let rate = l.rate_per_s.get();
        if auto >= 2 && rate >= AUTO_BATCH_RATE_PER_S {
            // Ask for as many as are expected within the wait, so the wait rarely times out.
            let expected = (rate * BATCH_WAIT_MAX.as_micros() as u64 / 1_000_000) as usize;
            let want = expected.clamp(2, auto.min(BATCH_COMPLETIONS_MAX));
            return WaitTarget::Batch {
                want,
                always: false,
            };
        }
        WaitTarget::One
    })
}

/// Records a ring wait that slept `waited` and the device completions reaped after it.
pub(crate) fn record_turn(waited: Duration, device_completions: u64, batching_wait: bool) {
    if device_completions > 0 {
        let counter = if batching_wait {
            &COMPLETIONS.batched
        } else {
            &COMPLETIONS.inline
        };
        counter.fetch_add(device_completions, Ordering::Relaxed);
    }
    LOAD.with(|l| {
        l.window_completions
            .set(l.window_completions.get() + device_completions);
        l.window_wait_ns
            .set(l.window_wait_ns.get() + waited.as_nanos() as u64);
        let now = Instant::now();
        let Some(start) = l.window_start.get() else {
            l.window_start.set(Some(now));
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        if elapsed < WINDOW {
            return;
        }
        let elapsed_ns = elapsed.as_nanos().max(1) as u64;
        l.rate_per_s
            .set(l.window_completions.get() * 1_000_000_000 / elapsed_ns);
        let waited_ns = l.window_wait_ns.get().min(elapsed_ns);
        l.busy_per_mille
            .set((1000 - waited_ns * 1000 / elapsed_ns) as u32);
        l.window_start.set(Some(now));
        l.window_completions.set(0);
        l.window_wait_ns.set(0);
    })
}

/// This thread's device completions per second over the last measurement window (0 before
/// the first full window, or on a thread with no ring waits).
pub fn thread_completion_rate_per_s() -> u64 {
    LOAD.with(|l| l.rate_per_s.get())
}

/// This thread's busy fraction (time not asleep in its ring) over the last window, in per
/// mille. A reactor at 1000 is the bottleneck: work handed elsewhere would run sooner.
pub fn thread_busy_per_mille() -> u32 {
    LOAD.with(|l| l.busy_per_mille.get())
}

/// Marks one device I/O of this thread as batchable while it lives. Create it before the I/O
/// is awaited and drop it when the I/O's result is in; not `Send` (the count is per thread).
#[derive(Debug)]
pub struct BatchGuard {
    mode: BatchMode,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl BatchGuard {
    /// Counts one batchable device I/O on this thread.
    pub fn new(mode: BatchMode) -> BatchGuard {
        LOAD.with(|l| {
            let c = match mode {
                BatchMode::Always => &l.always_in_flight,
                BatchMode::Auto => &l.auto_in_flight,
            };
            c.set(c.get() + 1);
        });
        BatchGuard {
            mode,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for BatchGuard {
    fn drop(&mut self) {
        LOAD.with(|l| {
            let c = match self.mode {
                BatchMode::Always => &l.always_in_flight,
                BatchMode::Auto => &l.auto_in_flight,
            };
            debug_assert!(c.get() > 0);
            c.set(c.get().saturating_sub(1));
        });
    }
}
