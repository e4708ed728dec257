//! A bound on the lines a stream of like warnings prints: a bad range of a disk read by a
//! scrub is hundreds of failing blocks, a client retrying a refused TLS handshake in a loop
//! is thousands of refusals, and a line for each buries everything else in the log. As ZFS
//! bounds its checksum and I/O events (`zfs_checksum_events_per_second`, 20), a
//! [`WarnLimit`] lets a given number of lines a second through; the first line of a later
//! second says how many were left out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// One kind of warning's counts for the current second.
pub struct WarnLimit {
    /// Lines let through per second at most.
    per_second: u64,
    /// The second (since the process's first warning) the counts are of.
    second: AtomicU64,
    /// Warnings seen in that second, printed or not.
    seen: AtomicU64,
    /// Warnings left out since the last one printed.
    left_out: AtomicU64,
}

/// The clock every limit counts seconds on: from the process's first warning.
static START: OnceLock<Instant> = OnceLock::new();

impl WarnLimit {
    /// A limit of `per_second` lines a second (a `static` per kind of warning).
    pub const fn new(per_second: u64) -> WarnLimit {
        WarnLimit {
            per_second,
            second: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// Lines let through per second at most.
    pub fn per_second(&self) -> u64 {
        self.per_second
    }

    /// Whether a warning may be printed now: `Some(n)` with the number left out before it,
    /// or `None` (counted as left out).
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(START.get_or_init(Instant::now).elapsed().as_secs())
    }

    /// [`WarnLimit::allow`] at second `now_s`. Racy at a second's turn by a line or two,
    /// which is all a bound on a log needs.
    pub fn allow_at(&self, now_s: u64) -> Option<u64> {
        if self.second.swap(now_s, Ordering::Relaxed) != now_s {
            self.seen.store(0, Ordering::Relaxed);
        }
        if self.seen.fetch_add(1, Ordering::Relaxed) < self.per_second {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twenty a second; the first of the next second counts what was left out.
    #[test]
    fn twenty_a_second_then_the_count_of_the_rest() {
        let l = WarnLimit::new(20);
        for i in 0..20 {
            assert_eq!(l.allow_at(5), Some(0), "warning {i}");
        }
        for _ in 0..563 {
            assert_eq!(l.allow_at(5), None);
        }
        assert_eq!(l.allow_at(6), Some(563));
        assert_eq!(l.allow_at(6), Some(0));
    }

    /// Each limit counts on its own.
    #[test]
    fn limits_are_independent() {
        let a = WarnLimit::new(1);
        let b = WarnLimit::new(1);
        assert_eq!(a.allow_at(1), Some(0));
        assert_eq!(a.allow_at(1), None);
        assert_eq!(b.allow_at(1), Some(0));
        assert_eq!(a.allow_at(2), Some(1));
    }
}
