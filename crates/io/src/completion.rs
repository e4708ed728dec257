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
use std::time::Duration;

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
}

/// The process's completion counters.
pub static COMPLETIONS: CompletionCounters = CompletionCounters {
    inline: AtomicU64::new(0),
    batched: AtomicU64::new(0),
    offloaded: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    batch_waits: AtomicU64::new(0),
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
        }
    }
}

thread_local! {
    /// Device I/Os of this thread in flight whose completion may be batched.
    static BATCHABLE_IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// Device I/Os of this thread whose completion may wait for company.
pub(crate) fn batchable_in_flight() -> usize {
    BATCHABLE_IN_FLIGHT.with(Cell::get)
}

/// Marks one device I/O of this thread as batchable while it lives. Create it before the I/O
/// is awaited and drop it when the I/O's result is in; not `Send` (the count is per thread).
#[derive(Debug)]
pub struct BatchGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl BatchGuard {
    /// Counts one batchable device I/O on this thread.
    pub fn new() -> BatchGuard {
        BATCHABLE_IN_FLIGHT.with(|c| c.set(c.get() + 1));
        BatchGuard {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Default for BatchGuard {
    fn default() -> Self {
        BatchGuard::new()
    }
}

impl Drop for BatchGuard {
    fn drop(&mut self) {
        BATCHABLE_IN_FLIGHT.with(|c| {
            debug_assert!(c.get() > 0);
            c.set(c.get().saturating_sub(1));
        });
    }
}
