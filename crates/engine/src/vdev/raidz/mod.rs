//! RAID-Z: ZFS's single, double and triple parity vdevs, as pure code (no I/O, no pool state),
//! for the vdev tree to plan with and the pipeline to drive ("the vdev tree plans, the pipeline
//! drives", DESIGN.md 5.1).
//!
//! - [`RaidzLayout`] and [`RaidzMap`]: ZFS's layout. A block's columns (parity first, data
//!   split across the data columns), where each goes, the skip sectors, the allocated size.
//! - [`ParityKernels`]: P, Q and R over GF(2^8) (polynomial 0x11d, generators 1, 2, 4), their
//!   generation, checking, and the reconstruction of up to three missing columns.
//! - [`reconstruct_verified`]: combinatorial reconstruction, which finds silently corrupted
//!   columns when a block fails its checksum and no device reported an error.
//! - [`plan_write`] and [`ReadPlan`]: what the pipeline issues for a block write and a block
//!   read, and what it does when a column fails or the checksum does not verify.
//!
//! `docs/format.md` ("RAID-Z layout") describes the layout byte by byte; `docs/raidz.md` the
//! math, the choices and the measured speed.

mod column_set;
mod combrec;
mod error;
pub mod gf;
mod kernels;
mod layout;
mod map;
mod parity;
mod plan;
mod reconstruct;

pub use column_set::ColumnSet;
pub use combrec::{reconstruct_verified, DataColumns, Reconstructed};
pub use error::RaidzError;
pub use layout::{
    LayoutEpoch, LayoutHistory, RaidzLayout, RAIDZ_BLOCK_BYTES_MAX, SECTOR_SHIFT_MAX,
    SECTOR_SHIFT_MIN,
};
pub use map::{ChildIndex, Column, ColumnRole, RaidzMap, SkipSector};
pub use parity::ParityKernels;
pub use plan::{
    generate_parity, plan_write, write_outcome, LeafWrite, ReadFailure, ReadMode, ReadOutcome,
    ReadPlan, ReadStep, WriteOutcome, WriteSource,
};

/// Most parity columns of a block (raidz3). A fourth generator would not keep every system of
/// surviving rows solvable (Plank's correction), which is why raidz stops at three.
pub const RAIDZ_PARITY_MAX: usize = 3;

/// Most children of a raidz vdev: one bit per column in a [`ColumnSet`]. (ZFS allows 255;
/// vdevs wider than a few dozen children are not a sensible raidz.)
pub const RAIDZ_WIDTH_MAX: usize = 64;
