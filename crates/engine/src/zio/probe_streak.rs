//! A volume's streak of incompressible blocks: while a client keeps writing blocks the probe
//! (`oxpool_format::probe`) finds incompressible, only every [`STREAK_PROBE_EVERY`]th is
//! probed; the others are stored as they are, unless they are all zeros.
//!
//! Why: the probe is the largest cost of a write of incompressible data under the default
//! `compression=lz4` that the server itself adds: 128 KiB sequential writes of fio's default
//! buffers spent 33-42 us of reactor CPU per write with it and 27-30 without it (paired runs,
//! 2026-11-28), at 15K against 18K writes/s. A stream of random data (encrypted, already
//! compressed: media, archives, backups of them) stays random: btrfs gives a file up as
//! incompressible after one failed compression for the same reason (its `NOCOMPRESS` flag);
//! this keeps looking, at an eighth of the cost.
//!
//! What it costs: when a stream turns compressible after a streak, the blocks before the next
//! probe are stored as they are, at most `STREAK_PROBE_EVERY - 1` blocks per change of data,
//! per volume: space, never data (a block stored as is reads back the same). The first
//! compressible block probed ends the streak, and every block is probed again until
//! [`STREAK_SKIP_MIN`] incompressible ones in a row. All-zero blocks still become holes: a
//! skipped block is tested for zeros (a scan that stops at the first nonzero word).
//!
//! Writers on several reactors share a volume's streak. Each block takes its place in the
//! streak and is decided on it in one atomic step, so two writers never decide on the same
//! place (two skipping the block that was to be probed would stretch the bound above); a
//! streak ended by one writer while another extends it only moves which block is probed
//! next.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Incompressible blocks in a row before probes are skipped: 32 blocks (512 KiB at the
/// default 16 KiB `volblocksize`), so that a write of a few random blocks among compressible
/// ones never starts skipping.
pub const STREAK_SKIP_MIN: u32 = 32;

/// During a streak, one block in this many is probed.
pub const STREAK_PROBE_EVERY: u32 = 8;

/// One volume's streak; see the module docs.
#[derive(Debug, Default)]
pub struct ProbeStreak {
    /// Places taken in the current streak: blocks written (probed or not) since the last one
    /// a probe found compressible.
    blocks: AtomicU32,
    /// Blocks whose probe was skipped, ever (for tests and statistics).
    skipped: AtomicU64,
}

impl ProbeStreak {
    /// Whether the next block's probe is skipped (see the module docs). Every call takes the
    /// block's place in the streak, probed or not, in one atomic step: the place a writer
    /// decides on is its own (wrapping past u32::MAX only starts the streak over).
    pub fn skips(&self) -> bool {
        let place = self.blocks.fetch_add(1, Ordering::Relaxed);
        let skip = place >= STREAK_SKIP_MIN && !place.is_multiple_of(STREAK_PROBE_EVERY);
        if skip {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        skip
    }

    /// Records the verdict of a probed block (one [`ProbeStreak::skips`] said to probe, which
    /// already counted it): a compressible block ends the streak.
    pub fn note(&self, incompressible: bool) {
        if !incompressible {
            self.blocks.store(0, Ordering::Relaxed);
        }
    }

    /// Blocks whose probe was skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_all_but_every_eighth_probe_of_a_long_streak_and_restarts_after_a_hit() {
        let s = ProbeStreak::default();
        let mut probed = 0;
        for _ in 0..STREAK_SKIP_MIN + 10 * STREAK_PROBE_EVERY {
            if !s.skips() {
                probed += 1;
                s.note(true);
            }
        }
        assert_eq!(probed, STREAK_SKIP_MIN + 10, "the first 32, then one in 8");
        assert_eq!(s.skipped(), u64::from(10 * (STREAK_PROBE_EVERY - 1)));
        // A compressible block probed: every block is probed again.
        let mut compressible_seen = false;
        for _ in 0..STREAK_PROBE_EVERY {
            if !s.skips() {
                s.note(false);
                compressible_seen = true;
                break;
            }
        }
        assert!(
            compressible_seen,
            "a probe within {STREAK_PROBE_EVERY} blocks"
        );
        // The first STREAK_SKIP_MIN blocks of a new streak are probed, and its first block
        // past them, as every eighth; the next is skipped.
        for _ in 0..=STREAK_SKIP_MIN {
            assert!(!s.skips());
            s.note(true);
        }
        assert!(s.skips(), "a new streak skips again");
    }

    #[test]
    fn writers_on_many_threads_probe_exactly_the_blocks_one_writer_would() {
        // Every call moves the count by one, deciding on the value it replaces: whatever the
        // interleaving, block n of the streak is probed exactly when one writer would probe it
        // (n < 32 or n a multiple of 8). Deciding on a stale count could skip block 40.
        const THREADS: u32 = 4;
        const CALLS: u32 = 5000;
        let s = ProbeStreak::default();
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..CALLS {
                        if !s.skips() {
                            s.note(true);
                        }
                    }
                });
            }
        });
        let total = THREADS * CALLS;
        let probed = STREAK_SKIP_MIN + (total - 1 - STREAK_SKIP_MIN) / STREAK_PROBE_EVERY + 1;
        assert_eq!(s.skipped(), u64::from(total - probed));
    }
}
