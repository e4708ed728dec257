//! Which 512-byte sectors of one volume block a dirty block holds: the bookkeeping that lets a
//! sector-aligned write to part of a block land without first reading the rest of the block.

use crate::props::VOLBLOCKSIZE_MAX_BYTES;

/// Bytes per sector of a [`SectorMask`]: the smallest unit NBD clients write.
pub(crate) const MASK_SECTOR_BYTES: usize = 512;

const SECTORS_MAX: usize = VOLBLOCKSIZE_MAX_BYTES as usize / MASK_SECTOR_BYTES;
const WORDS: usize = SECTORS_MAX.div_ceil(64);

/// A set of sectors of one block (at most `VOLBLOCKSIZE_MAX_BYTES / 512` of them): a fixed
/// bitmap, copied by value, never allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SectorMask([u64; WORDS]);

impl SectorMask {
    /// No sector.
    pub const EMPTY: SectorMask = SectorMask([0; WORDS]);

    /// The sectors that bytes [lo, hi) of a block touch, even in part.
    pub fn touching(lo: usize, hi: usize) -> SectorMask {
        debug_assert!(lo <= hi && hi <= SECTORS_MAX * MASK_SECTOR_BYTES);
        let mut m = SectorMask::EMPTY;
        if lo < hi {
            m.set_sectors(lo / MASK_SECTOR_BYTES, hi.div_ceil(MASK_SECTOR_BYTES));
        }
        m
    }

    /// Every sector of a block of `block_bytes`.
    pub fn whole(block_bytes: usize) -> SectorMask {
        SectorMask::touching(0, block_bytes)
    }

    /// Whether bytes [lo, hi) cover whole sectors only (so a write of them can be recorded in
    /// a mask without the rest of its sectors).
    pub fn aligned(lo: usize, hi: usize) -> bool {
        lo.is_multiple_of(MASK_SECTOR_BYTES) && hi.is_multiple_of(MASK_SECTOR_BYTES)
    }

    fn set_sectors(&mut self, first: usize, end: usize) {
        debug_assert!(first < end && end <= SECTORS_MAX);
        // A word at a time: bounded by the words of the mask.
        for (w, word) in self.0.iter_mut().enumerate() {
            let (lo, hi) = (w * 64, w * 64 + 64);
            if end <= lo || first >= hi {
                continue;
            }
            let a = first.max(lo) - lo;
            let b = end.min(hi) - lo;
            let bits = if b - a == 64 {
                u64::MAX
            } else {
                ((1u64 << (b - a)) - 1) << a
            };
            *word |= bits;
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// Whether every sector of `other` is in the set.
    pub fn contains(&self, other: &SectorMask) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a & b == *b)
    }

    /// Whether every sector that bytes [lo, hi) touch is in the set: all of those bytes are
    /// wanted from the block, none from elsewhere (a read may then take the block whole).
    pub fn covers(&self, lo: usize, hi: usize) -> bool {
        self.contains(&SectorMask::touching(lo, hi))
    }

    /// The sectors in either set.
    pub fn union(&self, other: &SectorMask) -> SectorMask {
        let mut m = *self;
        m.0.iter_mut()
            .zip(other.0.iter())
            .for_each(|(a, b)| *a |= b);
        m
    }

    /// The sectors in both sets.
    pub fn intersect(&self, other: &SectorMask) -> SectorMask {
        let mut m = *self;
        m.0.iter_mut()
            .zip(other.0.iter())
            .for_each(|(a, b)| *a &= b);
        m
    }

    /// The sectors in this set and not in `other`.
    pub fn minus(&self, other: &SectorMask) -> SectorMask {
        let mut m = *self;
        m.0.iter_mut()
            .zip(other.0.iter())
            .for_each(|(a, b)| *a &= !b);
        m
    }

    fn has(&self, s: usize) -> bool {
        self.0[s / 64] & (1 << (s % 64)) != 0
    }

    /// The byte ranges of the set's runs of sectors, clipped to bytes [lo, hi) of the block,
    /// in ascending order. Bounded by the sectors of [lo, hi).
    pub fn byte_runs(&self, lo: usize, hi: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let end_sector = hi.div_ceil(MASK_SECTOR_BYTES).min(SECTORS_MAX);
        let mut s = lo / MASK_SECTOR_BYTES;
        std::iter::from_fn(move || {
            while s < end_sector && !self.has(s) {
                s += 1;
            }
            if s >= end_sector {
                return None;
            }
            let first = s;
            while s < end_sector && self.has(s) {
                s += 1;
            }
            let run_lo = (first * MASK_SECTOR_BYTES).max(lo);
            let run_hi = (s * MASK_SECTOR_BYTES).min(hi);
            Some((run_lo, run_hi))
        })
    }
}

/// Copies the bytes of `mask`'s sectors within [lo, hi) of a block from `block` (the whole
/// block) into `out`, which holds bytes [lo, hi).
pub(crate) fn copy_runs(mask: &SectorMask, block: &[u8], lo: usize, out: &mut [u8]) {
    let hi = lo + out.len();
    for (a, b) in mask.byte_runs(lo, hi) {
        out[a - lo..b - lo].copy_from_slice(&block[a..b]);
    }
}

/// Zeroes the bytes of `mask`'s sectors within [lo, lo + out.len()) of a block in `out`.
pub(crate) fn zero_runs(mask: &SectorMask, lo: usize, out: &mut [u8]) {
    let hi = lo + out.len();
    for (a, b) in mask.byte_runs(lo, hi) {
        out[a - lo..b - lo].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_and_whole() {
        assert!(SectorMask::touching(0, 0).is_empty());
        let m = SectorMask::touching(100, 600);
        assert_eq!(m.byte_runs(0, 4096).collect::<Vec<_>>(), vec![(0, 1024)]);
        let w = SectorMask::whole(128 * 1024);
        assert!(w.contains(&m));
        assert_eq!(
            w.byte_runs(0, 128 * 1024).collect::<Vec<_>>(),
            vec![(0, 128 * 1024)]
        );
        assert!(!SectorMask::whole(4096).contains(&SectorMask::touching(4096, 4097)));
    }

    #[test]
    fn set_algebra() {
        let a = SectorMask::touching(0, 2048);
        let b = SectorMask::touching(1024, 4096);
        assert_eq!(a.union(&b), SectorMask::touching(0, 4096));
        assert_eq!(a.intersect(&b), SectorMask::touching(1024, 2048));
        assert_eq!(a.minus(&b), SectorMask::touching(0, 1024));
        assert!(a.minus(&a).is_empty());
    }

    #[test]
    fn runs_are_clipped_and_split() {
        let m = SectorMask::touching(0, 512)
            .union(&SectorMask::touching(1536, 2048))
            .union(&SectorMask::touching(65 * 512, 70 * 512));
        assert_eq!(
            m.byte_runs(100, 40_000).collect::<Vec<_>>(),
            vec![(100, 512), (1536, 2048), (65 * 512, 70 * 512)]
        );
        assert_eq!(
            m.byte_runs(1600, 1700).collect::<Vec<_>>(),
            vec![(1600, 1700)]
        );
        assert_eq!(m.byte_runs(600, 1500).count(), 0);
    }

    #[test]
    fn copy_and_zero_runs() {
        let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
        let m = SectorMask::touching(512, 1024).union(&SectorMask::touching(2048, 2560));
        let mut out = vec![0u8; 2000];
        copy_runs(&m, &block, 600, &mut out);
        assert!(out[..424]
            .iter()
            .zip(&block[600..1024])
            .all(|(a, b)| a == b));
        assert!(out[424..1448].iter().all(|&x| x == 0));
        assert!(out[1448..1960]
            .iter()
            .zip(&block[2048..2560])
            .all(|(a, b)| a == b));
        assert!(out[1960..].iter().all(|&x| x == 0));
        zero_runs(&m, 600, &mut out);
        assert!(out.iter().all(|&x| x == 0));
    }
}
