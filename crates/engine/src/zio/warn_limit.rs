//! A bound on the warnings a damaged device prints: one bad range of a disk read by a scrub
//! or a client is hundreds of blocks, each failing on its own, and a line for each buries
//! everything else in the log. As ZFS bounds its checksum and I/O events
//! (`zfs_checksum_events_per_second`, 20), at most [`IO_WARNINGS_PER_SECOND`] lines a second
//! are printed; the first line of the next second says how many were left out. Every error is
//! still counted on its device (`oxpool status`) and recorded in the pool's error log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// I/O warning lines printed per second at most.
pub(crate) const IO_WARNINGS_PER_SECOND: u64 = 20;

/// Counts of one second's warnings.
pub(crate) struct WarnLimit {
    /// The second (since the process's first warning) the counts are of.
    second: AtomicU64,
    /// Warnings seen in that second, printed or not.
    seen: AtomicU64,
    /// Warnings left out since the last one printed.
    left_out: AtomicU64,
}

impl WarnLimit {
    const fn new() -> WarnLimit {
        WarnLimit {
            second: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// Whether a warning at second `now_s` may be printed: `Some(n)` with the number left
    /// out before it, or `None` (counted as left out). Racy at a second's turn by a line or
    /// two, which is all a bound on a log needs.
    pub(crate) fn allow_at(&self, now_s: u64) -> Option<u64> {
        if self.second.swap(now_s, Ordering::Relaxed) != now_s {
            self.seen.store(0, Ordering::Relaxed);
        }
        if self.seen.fetch_add(1, Ordering::Relaxed) < IO_WARNINGS_PER_SECOND {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

static IO_WARNINGS: WarnLimit = WarnLimit::new();
static START: OnceLock<Instant> = OnceLock::new();

thread_local! {
    /// Set while this thread runs [`quietly`].
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While it lives, this thread's I/O warnings are left out: for a caller that says what
/// failed itself, once (an import probing its uberblocks: each bad copy of an unusable one
/// would print a line on every command that opens a damaged pool). The errors are still
/// counted on their devices. For work polled on this thread only (`block_on`).
pub(crate) struct Quiet {
    was: bool,
    /// Not sent to another thread, whose flag it would restore.
    _here: std::marker::PhantomData<*const ()>,
}

impl Quiet {
    /// Leaves this thread's I/O warnings out until dropped.
    pub(crate) fn enter() -> Quiet {
        Quiet {
            was: QUIET.with(|q| q.replace(true)),
            _here: std::marker::PhantomData,
        }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.with(|q| q.set(self.was));
    }
}

/// Whether an I/O warning may be printed now (see [`WarnLimit::allow_at`]).
pub(crate) fn allow() -> Option<u64> {
    if QUIET.with(|q| q.get()) {
        return None;
    }
    let now_s = START.get_or_init(Instant::now).elapsed().as_secs();
    IO_WARNINGS.allow_at(now_s)
}

/// `tracing::warn!` for an I/O error or a damaged block, within [`IO_WARNINGS_PER_SECOND`].
macro_rules! io_warn {
    ($($arg:tt)*) => {
        if let Some(left_out) = $crate::zio::warn_limit::allow() {
            if left_out > 0 {
                tracing::warn!("{left_out} more I/O warnings were left out (at most {} a second)",
                    $crate::zio::warn_limit::IO_WARNINGS_PER_SECOND);
            }
            tracing::warn!($($arg)*);
        }
    };
}
pub(crate) use io_warn;

#[cfg(test)]
mod tests {
    use super::*;

    /// Twenty a second; the first of the next second counts what was left out.
    #[test]
    fn twenty_a_second_then_the_count_of_the_rest() {
        let l = WarnLimit::new();
        for i in 0..IO_WARNINGS_PER_SECOND {
            assert_eq!(l.allow_at(5), Some(0), "warning {i}");
        }
        for _ in 0..563 {
            assert_eq!(l.allow_at(5), None);
        }
        assert_eq!(l.allow_at(6), Some(563));
        assert_eq!(l.allow_at(6), Some(0));
    }
}
