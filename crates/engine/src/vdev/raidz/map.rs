//! The map of one raidz block: ZFS's layout (`vdev_raidz_map_alloc`), as a pure function of the
//! vdev's layout, the block's offset and its size.
//!
//! A raidz vdev of `w` children is one address space interleaved by sector: sector `b` of the
//! vdev is sector `b / w` of child `b % w`. A block allocated at sector `b` with `asize`
//! sectors owns the vdev sectors `b .. b + asize`. Its columns are the runs of that range on
//! each child: column `c` holds vdev sectors `b + c`, `b + c + w`, `b + c + 2w`, ... , so it
//! lives on child `(b + c) % w` from child sector `(b + c) / w`, contiguous there. The first
//! `parity` columns are P, Q, R; the data columns follow, each taking the next contiguous
//! slice of the block. `docs/format.md` ("RAID-Z layout") has the rules and examples.

use super::error::RaidzError;
use super::layout::{RaidzLayout, RAIDZ_BLOCK_BYTES_MAX};
use super::ColumnSet;
use std::ops::Range;

/// Index of a child of a raidz vdev (its position in the vdev's configuration), not to be
/// confused with a column index (position in one block's map).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChildIndex(pub usize);

/// What a column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnRole {
    /// Parity row `row`: 0 = P, 1 = Q, 2 = R.
    Parity {
        /// 0, 1 or 2.
        row: usize,
    },
    /// Data: bytes `block_offset_bytes .. + size_bytes` of the block.
    Data {
        /// Where the column's bytes start in the block.
        block_offset_bytes: usize,
    },
}

/// One column of a block: where it goes and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Position in the map: `0..parity` are parity, the rest data.
    pub index: usize,
    /// The child that stores it.
    pub child: ChildIndex,
    /// Byte offset on the child, from the start of the child's allocatable space (the caller
    /// adds `DATA_START_BYTES` for the leaf's byte address, as for any vdev).
    pub child_offset_bytes: u64,
    /// Bytes: a whole number of sectors, at least one.
    pub size_bytes: usize,
    /// Parity or data.
    pub role: ColumnRole,
}

/// One skip sector: allocated to the block (the rounding of its size to a multiple of
/// `parity + 1` sectors), holding nothing, in no parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkipSector {
    /// The child it is on.
    pub child: ChildIndex,
    /// Byte offset on the child, from the start of the child's allocatable space.
    pub child_offset_bytes: u64,
}

/// The map of one block (see the module documentation). Small and `Copy`: every column is
/// computed on demand from a few numbers, so planning allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaidzMap {
    layout: RaidzLayout,
    /// First vdev sector of the allocation (ZFS's `b`).
    first_sector: u64,
    /// Physical bytes as given (the data columns hold `data_sectors` whole sectors).
    psize_bytes: u64,
    /// Data sectors (ZFS's `s`).
    data_sectors: u64,
    /// Sectors of a small column: full rows of data (ZFS's `q`).
    rows_full: u64,
    /// Columns with one sector more than `rows_full` (ZFS's `bc`); parity columns are always
    /// among them when there are any. 0 when the data fills whole rows.
    big_columns: usize,
    /// Columns holding data or parity (ZFS's `acols`): `width`, or fewer for a block smaller
    /// than one row.
    columns: usize,
    /// Sectors of rounding after the last data sector (ZFS's `nskip`), `< parity + 1`.
    skip_sectors: u64,
}

impl RaidzMap {
    /// See [`RaidzLayout::map`].
    pub(super) fn new(
        layout: RaidzLayout,
        offset_bytes: u64,
        psize_bytes: u64,
    ) -> Result<RaidzMap, RaidzError> {
        let sector_bytes = layout.sector_bytes();
        if !offset_bytes.is_multiple_of(sector_bytes) {
            return Err(RaidzError::Block(format!(
                "offset {offset_bytes} is not a multiple of the {sector_bytes}-byte sector"
            )));
        }
        if psize_bytes == 0 || psize_bytes > RAIDZ_BLOCK_BYTES_MAX {
            return Err(RaidzError::Block(format!(
                "size {psize_bytes}: must be 1 to {RAIDZ_BLOCK_BYTES_MAX} bytes"
            )));
        }
        let width = layout.width() as u64;
        let parity = layout.parity() as u64;
        let data_width = width - parity;
        let first_sector = offset_bytes >> layout.sector_shift();
        let data_sectors = psize_bytes.div_ceil(sector_bytes);
        let rows_full = data_sectors / data_width;
        let remainder = data_sectors - rows_full * data_width;
        let big_columns = if remainder == 0 {
            0
        } else {
            remainder + parity
        };
        let used_sectors = data_sectors + parity * (rows_full + u64::from(remainder != 0));
        let asize_sectors = layout.asize_sectors(data_sectors);
        debug_assert!(asize_sectors >= used_sectors && asize_sectors - used_sectors <= parity);
        let end_bytes = first_sector
            .checked_add(asize_sectors)
            .and_then(|end| end.checked_mul(sector_bytes));
        if end_bytes.is_none() {
            return Err(RaidzError::Block(format!(
                "block at {offset_bytes} of {psize_bytes} bytes runs past the address space"
            )));
        }
        let columns = if rows_full == 0 { big_columns } else { width };
        Ok(RaidzMap {
            layout,
            first_sector,
            psize_bytes,
            data_sectors,
            rows_full,
            big_columns: big_columns as usize,
            columns: columns as usize,
            skip_sectors: asize_sectors - used_sectors,
        })
    }

    /// The vdev's layout.
    pub fn layout(&self) -> RaidzLayout {
        self.layout
    }

    /// Parity columns (the first ones of the map).
    pub fn parity_count(&self) -> usize {
        self.layout.parity()
    }

    /// Columns holding data or parity: the vdev's width, or fewer for a block smaller than a
    /// row.
    pub fn column_count(&self) -> usize {
        self.columns
    }

    /// Data columns.
    pub fn data_column_count(&self) -> usize {
        self.columns - self.parity_count()
    }

    /// The parity columns, `0..parity`.
    pub fn parity_columns(&self) -> ColumnSet {
        ColumnSet::range(0, self.parity_count())
    }

    /// The data columns, `parity..column_count`.
    pub fn data_columns(&self) -> ColumnSet {
        ColumnSet::range(self.parity_count(), self.columns)
    }

    /// All columns.
    pub fn all_columns(&self) -> ColumnSet {
        ColumnSet::range(0, self.columns)
    }

    /// Byte offset of the block in the vdev's allocatable space.
    pub fn offset_bytes(&self) -> u64 {
        self.first_sector << self.layout.sector_shift()
    }

    /// The physical size the map was made for.
    pub fn psize_bytes(&self) -> u64 {
        self.psize_bytes
    }

    /// Data sectors: the physical size rounded up to whole sectors.
    pub fn data_sectors(&self) -> u64 {
        self.data_sectors
    }

    /// Bytes of the data columns together: the length of the block buffer they split, which is
    /// the physical size padded to whole sectors.
    pub fn data_bytes(&self) -> usize {
        (self.data_sectors << self.layout.sector_shift()) as usize
    }

    /// Allocated sectors: data, parity and skip.
    pub fn asize_sectors(&self) -> u64 {
        self.used_sectors() + self.skip_sectors
    }

    /// Allocated bytes (equal to `layout.asize_bytes(psize_bytes)`).
    pub fn asize_bytes(&self) -> u64 {
        self.asize_sectors() << self.layout.sector_shift()
    }

    /// Data and parity sectors (without the skip sectors).
    fn used_sectors(&self) -> u64 {
        self.rows_full * self.columns as u64 + self.big_columns as u64
    }

    /// Number of skip sectors, `< parity + 1`.
    pub fn skip_sector_count(&self) -> u64 {
        self.skip_sectors
    }

    /// Size of column `index` in sectors.
    fn column_sectors(&self, index: usize) -> u64 {
        self.rows_full + u64::from(index < self.big_columns)
    }

    /// Size of column `index` in bytes.
    pub fn column_bytes(&self, index: usize) -> usize {
        assert!(index < self.columns, "column {index} of {}", self.columns);
        (self.column_sectors(index) << self.layout.sector_shift()) as usize
    }

    /// Size of each parity column: the largest column of the block. Data columns are this
    /// long or one sector shorter; parity counts the short ones as zero-padded.
    pub fn parity_column_bytes(&self) -> usize {
        self.column_bytes(0)
    }

    /// The range of the block buffer that data column `index` holds.
    pub fn data_range(&self, index: usize) -> Range<usize> {
        let parity = self.parity_count();
        assert!(
            (parity..self.columns).contains(&index),
            "column {index} is not a data column"
        );
        // Data columns before `i` are `i` columns of `rows_full` sectors plus one more sector
        // for each big one among them (the big ones come first).
        let i = (index - parity) as u64;
        let big_data = self.big_columns.saturating_sub(parity) as u64;
        let start_sectors = i * self.rows_full + i.min(big_data);
        let start = (start_sectors << self.layout.sector_shift()) as usize;
        start..start + self.column_bytes(index)
    }

    /// Column `index`.
    pub fn column(&self, index: usize) -> Column {
        let size_bytes = self.column_bytes(index);
        let sector = self.first_sector + index as u64;
        let width = self.layout.width() as u64;
        let role = if index < self.parity_count() {
            ColumnRole::Parity { row: index }
        } else {
            ColumnRole::Data {
                block_offset_bytes: self.data_range(index).start,
            }
        };
        Column {
            index,
            child: ChildIndex((sector % width) as usize),
            child_offset_bytes: (sector / width) << self.layout.sector_shift(),
            size_bytes,
            role,
        }
    }

    /// The columns in map order: P, Q, R, then the data columns.
    pub fn columns(&self) -> impl Iterator<Item = Column> + '_ {
        (0..self.columns).map(|c| self.column(c))
    }

    /// The skip sectors: the vdev sectors after the last data or parity sector, up to the end
    /// of the allocation. On the columns just after the last big column, one row down when
    /// the rounding wraps past the last child.
    pub fn skip_sectors(&self) -> impl Iterator<Item = SkipSector> + '_ {
        let width = self.layout.width() as u64;
        let first = self.first_sector + self.used_sectors();
        (first..first + self.skip_sectors).map(move |sector| SkipSector {
            child: ChildIndex((sector % width) as usize),
            child_offset_bytes: (sector / width) << self.layout.sector_shift(),
        })
    }

    /// The columns whose child satisfies `on`: e.g. the columns on children that cannot be
    /// read, for a read plan.
    pub fn columns_on(&self, mut on: impl FnMut(ChildIndex) -> bool) -> ColumnSet {
        self.columns()
            .filter(|c| on(c.child))
            .map(|c| c.index)
            .collect()
    }

    /// The data columns' slices of `block` (which is [`RaidzMap::data_bytes`] long), in order.
    pub fn split_block<'a>(&self, block: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        assert_eq!(block.len(), self.data_bytes(), "block buffer length");
        let map = *self;
        let mut rest = block;
        // Bounded: one step per data column.
        (map.parity_count()..map.columns).map(move |c| {
            let (column, tail) = rest.split_at(map.column_bytes(c));
            rest = tail;
            column
        })
    }

    /// The data columns' slices of `block`, mutable, in order.
    pub fn split_block_mut<'a>(
        &self,
        block: &'a mut [u8],
    ) -> impl Iterator<Item = &'a mut [u8]> + 'a {
        assert_eq!(block.len(), self.data_bytes(), "block buffer length");
        let map = *self;
        let mut rest = block;
        (map.parity_count()..map.columns).map(move |c| {
            let (column, tail) = std::mem::take(&mut rest).split_at_mut(map.column_bytes(c));
            rest = tail;
            column
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(map: &RaidzMap) -> Vec<u64> {
        map.columns().map(|c| c.size_bytes as u64 >> 12).collect()
    }

    #[test]
    fn worked_examples_from_the_research() {
        // 5-wide raidz2, 20K: q=1, r=2, bc=4: P=2, Q=2, D0=2, D1=2, D2=1 sectors; no skip.
        let map = RaidzLayout::new(5, 2).unwrap().map(0, 20 << 10).unwrap();
        assert_eq!(sizes(&map), vec![2, 2, 2, 2, 1]);
        assert_eq!(map.skip_sector_count(), 0);
        assert_eq!(map.asize_sectors(), 9);
        assert_eq!(map.data_range(2), 0..8192);
        assert_eq!(map.data_range(3), 8192..16384);
        assert_eq!(map.data_range(4), 16384..20480);
        // 5-wide raidz1, 8K: q=0, r=2, bc=3: three one-sector columns and one skip sector.
        let map = RaidzLayout::new(5, 1).unwrap().map(0, 8 << 10).unwrap();
        assert_eq!(sizes(&map), vec![1, 1, 1]);
        assert_eq!(map.skip_sector_count(), 1);
        let skip: Vec<_> = map.skip_sectors().collect();
        assert_eq!(skip[0].child, ChildIndex(3));
        assert_eq!(skip[0].child_offset_bytes, 0);
    }

    #[test]
    fn columns_wrap_to_the_next_child_sector() {
        // Vdev sector 13 of a 5-wide vdev: child 3, child sector 2. Column 2 is vdev sector 15:
        // child 0, child sector 3.
        let map = RaidzLayout::new(5, 1)
            .unwrap()
            .map(13 << 12, 16 << 10)
            .unwrap();
        let c0 = map.column(0);
        assert_eq!((c0.child, c0.child_offset_bytes), (ChildIndex(3), 2 << 12));
        let c2 = map.column(2);
        assert_eq!((c2.child, c2.child_offset_bytes), (ChildIndex(0), 3 << 12));
        assert_eq!(
            c2.role,
            ColumnRole::Data {
                block_offset_bytes: 4096
            }
        );
    }

    #[test]
    fn refuses_bad_blocks() {
        let layout = RaidzLayout::new(5, 1).unwrap();
        assert!(layout.map(100, 4096).is_err());
        assert!(layout.map(0, 0).is_err());
        assert!(layout.map(0, RAIDZ_BLOCK_BYTES_MAX + 1).is_err());
        assert!(layout.map(u64::MAX - 4095, 4096).is_err());
        // A partial sector is padded: the block buffer is whole sectors.
        let map = layout.map(0, 5000).unwrap();
        assert_eq!(map.data_bytes(), 8192);
        assert_eq!(map.psize_bytes(), 5000);
    }

    #[test]
    fn splits_the_block_into_data_columns() {
        let map = RaidzLayout::new(5, 2).unwrap().map(0, 20 << 10).unwrap();
        let mut block: Vec<u8> = (0..20 << 10).map(|i| (i / 4096) as u8).collect();
        let lens: Vec<_> = map.split_block(&block).map(|c| (c.len(), c[0])).collect();
        assert_eq!(lens, vec![(8192, 0), (8192, 2), (4096, 4)]);
        let firsts: Vec<_> = map.split_block_mut(&mut block).map(|c| c[0]).collect();
        assert_eq!(firsts, vec![0, 2, 4]);
    }
}
