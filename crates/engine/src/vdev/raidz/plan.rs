//! What the pipeline issues for a raidz block, and what it does with the results ("the vdev
//! tree plans, the pipeline drives"): pure functions and a small state machine over
//! [`ColumnSet`]s. No I/O here; the pipeline owns the buffers and the devices.
//!
//! **Write**: [`generate_parity`] into `parity` buffers, then the leaf writes of
//! [`plan_write`], then [`write_outcome`] of the columns that failed.
//!
//! **Read**: a [`ReadPlan`], driven by a loop:
//!
//! ```text
//! let mut plan = ReadPlan::new(&map, mode, unreadable, stale);
//! loop {
//!     match plan.next(kernels, &mut cols, |data| checksum_ok(data)) {
//!         ReadStep::Read(columns) => for c in columns { read c into cols[c]; plan.read_done(c, ok) },
//!         ReadStep::Done(outcome) => { write outcome.repair back; break }
//!         ReadStep::Failed(failure) => { EIO; break }
//!     }
//! }
//! ```
//!
//! The first step reads the data columns only (plus, for each data column on a child that
//! cannot be read, one parity column: P, then Q, then R). When a read fails, the next step
//! asks for one more parity column. When the block fails its checksum, the next step reads
//! every column and then runs combinatorial reconstruction. A scrub reads every column from
//! the start and checks the parity it did not need.

use super::combrec::{reconstruct_verified, DataColumns};
use super::error::RaidzError;
use super::map::{ChildIndex, RaidzMap};
use super::{ColumnSet, ParityKernels, RAIDZ_WIDTH_MAX};
use std::ops::Range;

/// Where the bytes of a leaf write come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteSource {
    /// This range of the block buffer (a data column; or, for a block with one data column,
    /// a parity column too, since then P = Q = R = the data).
    Block(Range<usize>),
    /// Parity buffer `row` (0 = P, 1 = Q, 2 = R) filled by [`generate_parity`].
    Parity(usize),
    /// One sector of zeros (a skip sector).
    Zeros,
}

/// One leaf write of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafWrite {
    /// The column written; `None` for a skip sector.
    pub column: Option<usize>,
    /// The child to write.
    pub child: ChildIndex,
    /// Byte offset on the child, from the start of its allocatable space.
    pub child_offset_bytes: u64,
    /// Bytes written.
    pub size_bytes: usize,
    /// What to write.
    pub source: WriteSource,
    /// The write may be left out, or fail, with no harm: skip sectors, which ZFS writes only
    /// so that the device queue can merge the neighbouring writes into one.
    pub optional: bool,
}

impl RaidzMap {
    /// Whether the parity columns are copies of the block (a block with one data column:
    /// P = Q = R = D). Then no parity is computed and no parity buffer is needed: the parity
    /// columns write the block buffer (ZFS does the same since its commit 41311c6).
    pub fn parity_is_data(&self) -> bool {
        self.data_column_count() == 1
    }
}

/// The leaf writes of the block `map` describes: one per column (parity first), then the
/// optional skip sectors. An iterator: planning allocates nothing.
pub fn plan_write(map: &RaidzMap) -> impl Iterator<Item = LeafWrite> + '_ {
    let parity_count = map.parity_count();
    let columns = map.columns().map(move |column| {
        let source = if column.index >= parity_count {
            WriteSource::Block(map.data_range(column.index))
        } else if map.parity_is_data() {
            WriteSource::Block(map.data_range(parity_count))
        } else {
            WriteSource::Parity(column.index)
        };
        LeafWrite {
            column: Some(column.index),
            child: column.child,
            child_offset_bytes: column.child_offset_bytes,
            size_bytes: column.size_bytes,
            source,
            optional: false,
        }
    });
    let sector_bytes = map.layout().sector_bytes() as usize;
    let skips = map.skip_sectors().map(move |skip| LeafWrite {
        column: None,
        child: skip.child,
        child_offset_bytes: skip.child_offset_bytes,
        size_bytes: sector_bytes,
        source: WriteSource::Zeros,
        optional: true,
    });
    columns.chain(skips)
}

/// Computes the parity of `block` (the block buffer, [`RaidzMap::data_bytes`] long) into
/// `parity` (one buffer per parity column, [`RaidzMap::parity_column_bytes`] long each).
pub fn generate_parity<P: AsMut<[u8]>>(
    kernels: ParityKernels,
    map: &RaidzMap,
    block: &[u8],
    parity: &mut [P],
) {
    assert_eq!(parity.len(), map.parity_count(), "parity buffers");
    let mut data: [&[u8]; RAIDZ_WIDTH_MAX] = [&[]; RAIDZ_WIDTH_MAX];
    let mut count = 0;
    for column in map.split_block(block) {
        data[count] = column;
        count += 1;
    }
    kernels.generate(&data[..count], parity);
}

/// How a block write ended, from the columns whose write failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Every column is on its child.
    Complete,
    /// Written with redundancy to spare: the block reads back, rebuilt from parity where
    /// needed. The children of `missing` lack this txg (their dirty-time log must say so) and
    /// the block should be read back to repair them.
    Degraded {
        /// Columns whose write failed.
        missing: ColumnSet,
    },
    /// More columns failed than parity covers: the block is not written and must be
    /// allocated and written elsewhere.
    Failed {
        /// Columns whose write failed.
        missing: ColumnSet,
    },
}

/// ZFS's rule: a block write succeeds if at most `parity` of its columns failed (the failure of
/// an optional skip-sector write does not count: pass only columns).
pub fn write_outcome(map: &RaidzMap, failed: ColumnSet) -> WriteOutcome {
    let missing = failed.intersection(map.all_columns());
    if missing.is_empty() {
        WriteOutcome::Complete
    } else if missing.len() <= map.parity_count() {
        WriteOutcome::Degraded { missing }
    } else {
        WriteOutcome::Failed { missing }
    }
}

/// What a read is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// A client or metadata read: the fewest columns that give the data; repair what was
    /// found wrong on the way.
    Normal,
    /// A scrub or resilver read: every column, the parity checked, everything wrong or
    /// stale repaired.
    Scrub,
}

/// The next thing the pipeline does for a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadStep {
    /// Read these columns into their buffers and report each with [`ReadPlan::read_done`],
    /// then call [`ReadPlan::next`] again.
    Read(ColumnSet),
    /// The data columns hold the verified block.
    Done(ReadOutcome),
    /// The block cannot be read.
    Failed(ReadFailure),
}

/// A read that verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Columns whose buffers hold the right bytes that their child lacks: write them back to
    /// their children (self-healing). Never a column of an unreadable child; a stale child's
    /// columns only in a scrub.
    pub repair: ColumnSet,
    /// Columns whose child returned wrong bytes without an error: charge each child a
    /// checksum error.
    pub silent: ColumnSet,
    /// Whether data was rebuilt from parity.
    pub reconstructed: bool,
    /// Checksum verifications run.
    pub verifications: usize,
}

/// Why a read failed (the caller returns an I/O error, and records the block as damaged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFailure {
    /// More columns are unreadable than there is parity.
    TooManyMissing {
        /// The columns without content.
        missing: ColumnSet,
    },
    /// Every column was read and no choice of up to `parity` bad columns verifies: the
    /// block is damaged beyond its parity. Every column read is suspect (ZFS charges all of
    /// their children a checksum error).
    Unrecoverable {
        /// The columns read.
        read: ColumnSet,
    },
}

/// The state of one block read (see the module documentation for the loop that drives it).
#[derive(Clone, Debug)]
pub struct ReadPlan {
    map: RaidzMap,
    mode: ReadMode,
    /// Columns on children that cannot be read (missing, faulted, offline): never read, never
    /// written.
    unreadable: ColumnSet,
    /// Columns on children that missed the block's txg (its dirty-time log): not read;
    /// rewritten by a scrub or resilver.
    stale: ColumnSet,
    requested: ColumnSet,
    completed: ColumnSet,
    io_errors: ColumnSet,
    /// The block failed its checksum once: every readable column is wanted, then the
    /// combinatorial search.
    escalated: bool,
    finished: bool,
}

impl ReadPlan {
    /// A read of the block `map` describes. `unreadable` and `stale` are the columns on
    /// children that cannot be read, or that missed the block's txg (see
    /// [`RaidzMap::columns_on`]).
    pub fn new(
        map: &RaidzMap,
        mode: ReadMode,
        unreadable: ColumnSet,
        stale: ColumnSet,
    ) -> ReadPlan {
        let all = map.all_columns();
        ReadPlan {
            map: *map,
            mode,
            unreadable: unreadable.intersection(all),
            stale: stale.intersection(all).difference(unreadable),
            requested: ColumnSet::EMPTY,
            completed: ColumnSet::EMPTY,
            io_errors: ColumnSet::EMPTY,
            escalated: false,
            finished: false,
        }
    }

    /// Reports the read of `column` that the last [`ReadStep::Read`] asked for: `ok` false if
    /// the device returned an error.
    pub fn read_done(&mut self, column: usize, ok: bool) {
        assert!(
            self.requested.contains(column) && !self.completed.contains(column),
            "column {column} was not being read"
        );
        self.completed.insert(column);
        if !ok {
            self.io_errors.insert(column);
        }
    }

    /// The next step, once every read asked for is reported. `cols` are the block's column
    /// buffers in map order (parity first), each as long as the map says; the data columns
    /// are the caller's block buffer split by [`RaidzMap::split_block_mut`]. `verify` checks
    /// the block's checksum over the data columns.
    ///
    /// Data and parity are rebuilt and checked here, on the caller's thread: the pipeline
    /// decides where this runs.
    pub fn next<F>(
        &mut self,
        kernels: ParityKernels,
        cols: &mut [&mut [u8]],
        mut verify: F,
    ) -> ReadStep
    where
        F: FnMut(&DataColumns<'_>) -> bool,
    {
        assert!(!self.finished, "the read is over");
        assert_eq!(self.requested, self.completed, "reads still in flight");
        assert_eq!(cols.len(), self.map.column_count(), "columns of the block");
        for (c, col) in cols.iter().enumerate() {
            assert_eq!(
                col.len(),
                self.map.column_bytes(c),
                "column {c} buffer length"
            );
        }
        let map = self.map;
        let parity_count = map.parity_count();
        let all = map.all_columns();
        let data = map.data_columns();
        let parity = map.parity_columns();
        let missing = self.unreadable.union(self.stale).union(self.io_errors);
        if missing.len() > parity_count {
            self.finished = true;
            return ReadStep::Failed(ReadFailure::TooManyMissing { missing });
        }

        let want = if self.escalated || self.mode == ReadMode::Scrub {
            all
        } else {
            // The data, and one surviving parity column per missing data column.
            let missing_data = missing.intersection(data).len();
            data.union(parity.difference(missing).lowest(missing_data))
        }
        .difference(missing);
        let to_read = want.difference(self.requested);
        if !to_read.is_empty() {
            self.requested = self.requested.union(to_read);
            return ReadStep::Read(to_read);
        }

        if !self.escalated {
            let unread = all.difference(self.requested);
            kernels
                .reconstruct(cols, parity_count, missing.union(unread))
                .expect("one surviving parity column was read per missing data column");
            if verify(&DataColumns::new(cols, parity_count)) {
                let mut repair = self.io_errors;
                let mut silent = ColumnSet::EMPTY;
                if self.mode == ReadMode::Scrub {
                    repair = repair.union(self.stale);
                    // Every parity column read, used ones too (see combrec.rs, `finish`).
                    let checkable = parity.difference(missing);
                    silent = kernels.check_parity(cols, parity_count, checkable);
                    repair = repair.union(silent);
                }
                kernels.regenerate_parity(cols, parity_count, repair.intersection(parity));
                self.finished = true;
                return ReadStep::Done(ReadOutcome {
                    repair,
                    silent,
                    reconstructed: !missing.intersection(data).is_empty(),
                    verifications: 1,
                });
            }
            self.escalated = true;
            let to_read = all.difference(missing).difference(self.requested);
            if !to_read.is_empty() {
                self.requested = self.requested.union(to_read);
                return ReadStep::Read(to_read);
            }
        }

        self.finished = true;
        match reconstruct_verified(kernels, &map, cols, missing, &mut verify) {
            Ok(found) => {
                let mut repair = found.repaired.difference(self.unreadable);
                if self.mode == ReadMode::Normal {
                    repair = repair.difference(self.stale);
                }
                ReadStep::Done(ReadOutcome {
                    repair,
                    silent: found.silent,
                    reconstructed: !found.repaired.intersection(data).is_empty(),
                    verifications: found.verifications + 1,
                })
            }
            Err(RaidzError::TooManyMissing { .. }) => {
                ReadStep::Failed(ReadFailure::TooManyMissing { missing })
            }
            Err(_) => ReadStep::Failed(ReadFailure::Unrecoverable {
                read: self.completed.difference(self.io_errors),
            }),
        }
    }
}
