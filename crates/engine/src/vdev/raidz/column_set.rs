//! A set of the columns of one raidz block (indices into its map: parity columns first, then
//! data), as a 64-bit mask: the maps have at most [`RAIDZ_WIDTH_MAX`] columns.

use super::RAIDZ_WIDTH_MAX;
use std::fmt;

/// A set of column indices below [`RAIDZ_WIDTH_MAX`]. Copied by value, never allocated.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ColumnSet(u64);

const _: () = assert!(RAIDZ_WIDTH_MAX <= 64);

impl ColumnSet {
    /// No column.
    pub const EMPTY: ColumnSet = ColumnSet(0);

    /// Columns `lo..hi`.
    pub fn range(lo: usize, hi: usize) -> ColumnSet {
        assert!(lo <= hi && hi <= RAIDZ_WIDTH_MAX, "column range {lo}..{hi}");
        let below = |n: usize| if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        ColumnSet(below(hi) & !below(lo))
    }

    /// The one column `column`.
    pub fn single(column: usize) -> ColumnSet {
        assert!(column < RAIDZ_WIDTH_MAX, "column {column}");
        ColumnSet(1 << column)
    }

    /// The set whose bit `i` is bit `i` of `bits`.
    pub const fn from_bits(bits: u64) -> ColumnSet {
        ColumnSet(bits)
    }

    /// The mask: bit `i` set if column `i` is in the set.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether `column` is in the set.
    pub fn contains(self, column: usize) -> bool {
        column < 64 && self.0 >> column & 1 != 0
    }

    /// Adds `column`.
    pub fn insert(&mut self, column: usize) {
        *self = self.union(ColumnSet::single(column));
    }

    /// Removes `column`.
    pub fn remove(&mut self, column: usize) {
        if column < 64 {
            self.0 &= !(1 << column);
        }
    }

    /// Columns in either set.
    pub const fn union(self, other: ColumnSet) -> ColumnSet {
        ColumnSet(self.0 | other.0)
    }

    /// Columns in both sets.
    pub const fn intersection(self, other: ColumnSet) -> ColumnSet {
        ColumnSet(self.0 & other.0)
    }

    /// Columns in `self` and not in `other`.
    pub const fn difference(self, other: ColumnSet) -> ColumnSet {
        ColumnSet(self.0 & !other.0)
    }

    /// Whether every column of `self` is in `other`.
    pub const fn is_subset(self, other: ColumnSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// Number of columns.
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The lowest column, if any.
    pub fn first(self) -> Option<usize> {
        (self.0 != 0).then(|| self.0.trailing_zeros() as usize)
    }

    /// The `n` lowest columns (all of them if there are fewer).
    pub fn lowest(self, n: usize) -> ColumnSet {
        let mut out = ColumnSet::EMPTY;
        for column in self.iter().take(n) {
            out.insert(column);
        }
        out
    }

    /// The columns in increasing order.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        // Bounded: one step per set bit.
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let column = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(column)
        })
    }
}

impl FromIterator<usize> for ColumnSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> ColumnSet {
        let mut set = ColumnSet::EMPTY;
        for column in iter {
            set.insert(column);
        }
        set
    }
}

impl fmt::Debug for ColumnSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let a: ColumnSet = [0, 3, 63].into_iter().collect();
        assert_eq!(a.len(), 3);
        assert!(a.contains(63) && !a.contains(1) && !a.contains(200));
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 3, 63]);
        assert_eq!(
            ColumnSet::range(2, 5).iter().collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(ColumnSet::range(0, 64).len(), 64);
        assert_eq!(ColumnSet::range(3, 3), ColumnSet::EMPTY);
        assert_eq!(a.lowest(2), [0, 3].into_iter().collect());
        assert_eq!(a.difference(ColumnSet::single(3)).len(), 2);
        assert!(ColumnSet::single(3).is_subset(a));
        assert_eq!(a.first(), Some(0));
        assert_eq!(format!("{a:?}"), "{0, 3, 63}");
    }
}
