//! Newtypes for the numbers the format stores, so a txg is never mistaken for a guid.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A transaction group number. Txgs start at 1 and grow by one for each commit.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Txg(pub u64);

/// Index of a top-level vdev in the pool's vdev tree.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct VdevId(pub u32);

/// A 64-bit globally unique id of a pool or of a leaf device, chosen at random at creation.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Guid(pub u64);

/// Id of a volume inside a pool; never reused (see `PoolMeta::next_volume_id`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct VolumeId(pub u64);

impl fmt::Display for Txg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for VdevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Guids print as 16 hex digits, the way they are shown by the CLI.
impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
