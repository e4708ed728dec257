//! A raidz vdev's geometry ([`RaidzLayout`]: width, parity, sector size), its space arithmetic
//! (allocated size of a block, ZFS's `vdev_raidz_asize`), and the geometry over time
//! ([`LayoutHistory`]: which layout a block born in a given txg was written with, so that a
//! later expansion can change the width without rewriting old blocks).

use super::error::RaidzError;
use super::map::RaidzMap;
use super::{RAIDZ_PARITY_MAX, RAIDZ_WIDTH_MAX};
use oxpool_format::{Txg, BLOCK_BYTES_MAX, SECTOR_BYTES};

/// Sector shifts a layout may have: ZFS's ashift range (512 bytes to 64 KiB).
pub const SECTOR_SHIFT_MIN: u32 = 9;
/// See [`SECTOR_SHIFT_MIN`].
pub const SECTOR_SHIFT_MAX: u32 = 16;

/// The geometry of a raidz vdev: `width` children, `parity` of whose columns in every block
/// are parity (1 to 3), and the sector, the unit of columns and of allocation.
///
/// This is what a pool's configuration records for each width the vdev has had (see
/// [`LayoutHistory`] and `docs/format.md`); the map of a block is a pure function of the layout,
/// the block's offset and its size ([`RaidzLayout::map`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RaidzLayout {
    width: u8,
    parity: u8,
    sector_shift: u8,
}

impl RaidzLayout {
    /// A layout of `width` children and `parity` parity columns with oxpool's sector
    /// (`SECTOR_BYTES`, 4096).
    pub fn new(width: usize, parity: usize) -> Result<RaidzLayout, RaidzError> {
        RaidzLayout::with_sector_shift(width, parity, SECTOR_BYTES.trailing_zeros())
    }

    /// A layout with sectors of `1 << sector_shift` bytes.
    ///
    /// Refused: parity outside 1..=3; fewer than `parity + 1` children (a block needs at least
    /// one data column beside its parity); more than [`RAIDZ_WIDTH_MAX`] children; a sector
    /// shift outside 9..=16.
    pub fn with_sector_shift(
        width: usize,
        parity: usize,
        sector_shift: u32,
    ) -> Result<RaidzLayout, RaidzError> {
        if !(1..=RAIDZ_PARITY_MAX).contains(&parity) {
            return Err(RaidzError::Layout(format!(
                "parity {parity}: raidz has 1 to {RAIDZ_PARITY_MAX} parity columns"
            )));
        }
        if width < parity + 1 {
            return Err(RaidzError::Layout(format!(
                "raidz{parity} needs at least {} devices, got {width}",
                parity + 1
            )));
        }
        if width > RAIDZ_WIDTH_MAX {
            return Err(RaidzError::Layout(format!(
                "{width} devices: a raidz vdev has at most {RAIDZ_WIDTH_MAX}"
            )));
        }
        if !(SECTOR_SHIFT_MIN..=SECTOR_SHIFT_MAX).contains(&sector_shift) {
            return Err(RaidzError::Layout(format!(
                "sector shift {sector_shift}: must be {SECTOR_SHIFT_MIN} to {SECTOR_SHIFT_MAX}"
            )));
        }
        Ok(RaidzLayout {
            width: width as u8,
            parity: parity as u8,
            sector_shift: sector_shift as u8,
        })
    }

    /// Children of the vdev.
    pub fn width(self) -> usize {
        self.width as usize
    }

    /// Parity columns of every block (1 to 3).
    pub fn parity(self) -> usize {
        self.parity as usize
    }

    /// Data columns of a block that spans the whole width: `width - parity`.
    pub fn data_width(self) -> usize {
        self.width() - self.parity()
    }

    /// log2 of the sector size.
    pub fn sector_shift(self) -> u32 {
        self.sector_shift as u32
    }

    /// Bytes per sector.
    pub fn sector_bytes(self) -> u64 {
        1 << self.sector_shift
    }

    /// Allocated bytes (asize) of a block of `psize_bytes` physical bytes, as ZFS's
    /// `vdev_raidz_asize` computes it: the data sectors, plus `parity` sectors per row (a row is
    /// `width - parity` data sectors; a partial row counts), rounded up to a multiple of
    /// `parity + 1` sectors so that every free fragment can hold the smallest block. The
    /// sectors of the rounding are the block's skip sectors.
    ///
    /// `psize_bytes` is rounded up to whole sectors first; 0 gives 0.
    pub fn asize_bytes(self, psize_bytes: u64) -> u64 {
        self.asize_sectors(psize_bytes.div_ceil(self.sector_bytes())) << self.sector_shift
    }

    /// [`RaidzLayout::asize_bytes`] in sectors, for `data_sectors` data sectors.
    pub fn asize_sectors(self, data_sectors: u64) -> u64 {
        let parity = self.parity as u64;
        let data_width = self.data_width() as u64;
        let sectors = data_sectors + parity * data_sectors.div_ceil(data_width);
        sectors.div_ceil(parity + 1) * (parity + 1)
    }

    /// The largest physical size (whole sectors) whose allocated size fits in `asize_bytes`:
    /// the inverse of [`RaidzLayout::asize_bytes`], for space reporting. Found by bisection on
    /// the monotone `asize` (64 steps at most), which is exact by construction.
    pub fn psize_bytes_max(self, asize_bytes: u64) -> u64 {
        let asize_sectors = asize_bytes >> self.sector_shift;
        // Invariant: asize(lo) <= asize_sectors < asize(hi + 1) is sought; asize(s) >= s, so
        // the answer is at most asize_sectors.
        let (mut lo, mut hi) = (0u64, asize_sectors);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.asize_sectors(mid) <= asize_sectors {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo << self.sector_shift
    }

    /// The raidz vdev's allocatable bytes over children of `child_bytes` allocatable bytes
    /// each: logical sector `b` lives on child `b % width` at child sector `b / width`, so the
    /// vdev has `width` times the whole sectors of its smallest child.
    pub fn vdev_bytes(self, child_bytes: u64) -> u64 {
        ((child_bytes >> self.sector_shift) * self.width as u64) << self.sector_shift
    }

    /// The map of the block at `offset_bytes` of the vdev's allocatable space, of
    /// `psize_bytes` physical bytes: which child and offset each column goes to.
    ///
    /// Refused: an offset that is not a whole sector, a size of 0 or above `BLOCK_BYTES_MAX`,
    /// an allocation that would run past the end of a 64-bit address space.
    pub fn map(self, offset_bytes: u64, psize_bytes: u64) -> Result<RaidzMap, RaidzError> {
        RaidzMap::new(self, offset_bytes, psize_bytes)
    }
}

/// Largest block a map describes: the largest block oxpool writes.
pub const RAIDZ_BLOCK_BYTES_MAX: u64 = BLOCK_BYTES_MAX as u64;

/// One geometry of a raidz vdev and the first txg whose blocks were written with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutEpoch {
    /// Blocks born in this txg or later (until the next epoch) use `layout`.
    pub first_txg: Txg,
    /// The geometry.
    pub layout: RaidzLayout,
}

/// The layouts a raidz vdev has had, oldest first: what the pool's configuration records so
/// that a block is read with the geometry it was written with (its birth txg picks the epoch).
///
/// Today a vdev has one epoch. A future expansion (one more child, ZFS 2.3's `attach` on a
/// raidz) appends an epoch with a wider layout and the same parity; blocks born before keep
/// their data:parity ratio and their logical width. (Reading such an old block after its
/// sectors were reflowed onto the wider vdev needs a multi-row map, which the expansion work
/// will add; this type records what that map needs.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutHistory {
    /// Sorted by strictly increasing `first_txg`; at most [`RAIDZ_WIDTH_MAX`] entries, since
    /// each epoch is at least one child wider than the one before.
    epochs: Vec<LayoutEpoch>,
}

impl LayoutHistory {
    /// The history of a vdev created in `create_txg` with `layout`.
    pub fn new(layout: RaidzLayout, create_txg: Txg) -> LayoutHistory {
        LayoutHistory {
            epochs: vec![LayoutEpoch {
                first_txg: create_txg,
                layout,
            }],
        }
    }

    /// A history from recorded epochs (as decoded from a configuration), checked: at least one
    /// epoch; txgs strictly increasing; the same parity and sector size throughout; each width
    /// larger than the one before.
    pub fn from_epochs(epochs: Vec<LayoutEpoch>) -> Result<LayoutHistory, RaidzError> {
        let Some(first) = epochs.first() else {
            return Err(RaidzError::Layout("a layout history needs an epoch".into()));
        };
        for pair in epochs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.first_txg <= a.first_txg {
                return Err(RaidzError::Layout(format!(
                    "layout epochs out of order: txg {} after txg {}",
                    b.first_txg, a.first_txg
                )));
            }
            if b.layout.parity != first.layout.parity
                || b.layout.sector_shift != first.layout.sector_shift
            {
                return Err(RaidzError::Layout(
                    "an expansion keeps the parity and the sector size".into(),
                ));
            }
            if b.layout.width <= a.layout.width {
                return Err(RaidzError::Layout(format!(
                    "an expansion widens the vdev: width {} after {}",
                    b.layout.width, a.layout.width
                )));
            }
        }
        Ok(LayoutHistory { epochs })
    }

    /// Records that blocks born from `txg` on are written `width` wide (same parity and
    /// sector). Refused unless `txg` is after the last epoch and `width` is wider.
    pub fn expand(&mut self, txg: Txg, width: usize) -> Result<(), RaidzError> {
        let last = self.current();
        let layout = RaidzLayout::with_sector_shift(width, last.parity(), last.sector_shift())?;
        let mut epochs = self.epochs.clone();
        epochs.push(LayoutEpoch {
            first_txg: txg,
            layout,
        });
        *self = LayoutHistory::from_epochs(epochs)?;
        Ok(())
    }

    /// The layout new blocks are written with.
    pub fn current(&self) -> RaidzLayout {
        self.epochs.last().expect("a history has an epoch").layout
    }

    /// The layout a block born in `birth` was written with: the last epoch that began at or
    /// before it. (A birth before the first epoch cannot be a block of this vdev; it gets the
    /// first layout, and its checksum will say the rest.)
    pub fn layout_at(&self, birth: Txg) -> RaidzLayout {
        let after = self.epochs.partition_point(|e| e.first_txg <= birth);
        self.epochs[after.saturating_sub(1)].layout
    }

    /// The epochs, oldest first.
    pub fn epochs(&self) -> &[LayoutEpoch] {
        &self.epochs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_impossible_layouts() {
        assert!(RaidzLayout::new(3, 0).is_err());
        assert!(RaidzLayout::new(5, 4).is_err());
        assert!(RaidzLayout::new(2, 2).is_err());
        assert!(RaidzLayout::new(65, 1).is_err());
        assert!(RaidzLayout::with_sector_shift(4, 1, 8).is_err());
        assert!(RaidzLayout::with_sector_shift(4, 1, 17).is_err());
        let l = RaidzLayout::new(3, 2).unwrap();
        assert_eq!((l.width(), l.parity(), l.data_width()), (3, 2, 1));
        assert_eq!(l.sector_bytes(), 4096);
        let e = RaidzLayout::new(2, 2).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid raidz layout: raidz2 needs at least 3 devices, got 2"
        );
    }

    #[test]
    fn asize_examples_from_zfs() {
        // 5-wide raidz2, 20K: 5 data + 2 rows * 2 parity = 9, a multiple of 3.
        assert_eq!(
            RaidzLayout::new(5, 2).unwrap().asize_bytes(20 << 10),
            9 << 12
        );
        // 5-wide raidz1, 8K: 2 data + 1 parity = 3, rounded to 4 (one skip sector).
        assert_eq!(
            RaidzLayout::new(5, 1).unwrap().asize_bytes(8 << 10),
            4 << 12
        );
        // 6-wide raidz2, 4K: 1 + 2 = 3 sectors: a 4K block costs 12K (research table: 33%).
        assert_eq!(
            RaidzLayout::new(6, 2).unwrap().asize_bytes(4 << 10),
            3 << 12
        );
        // A partial sector counts as a whole one.
        assert_eq!(RaidzLayout::new(6, 2).unwrap().asize_bytes(1), 3 << 12);
    }

    #[test]
    fn history_picks_the_epoch_of_the_birth_txg() {
        let l4 = RaidzLayout::new(4, 1).unwrap();
        let mut h = LayoutHistory::new(l4, Txg(5));
        assert!(h.expand(Txg(5), 5).is_err(), "same txg");
        assert!(h.expand(Txg(9), 4).is_err(), "not wider");
        h.expand(Txg(10), 5).unwrap();
        h.expand(Txg(20), 7).unwrap();
        assert_eq!(h.layout_at(Txg(5)).width(), 4);
        assert_eq!(h.layout_at(Txg(9)).width(), 4);
        assert_eq!(h.layout_at(Txg(10)).width(), 5);
        assert_eq!(h.layout_at(Txg(19)).width(), 5);
        assert_eq!(h.layout_at(Txg(1000)).width(), 7);
        assert_eq!(h.layout_at(Txg(1)).width(), 4);
        assert_eq!(h.current().width(), 7);
        let mut bad = h.epochs().to_vec();
        bad[1].layout = RaidzLayout::new(6, 2).unwrap();
        assert!(LayoutHistory::from_epochs(bad).is_err(), "parity changed");
        assert!(LayoutHistory::from_epochs(Vec::new()).is_err());
    }
}
