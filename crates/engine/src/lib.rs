//! The oxpool engine: pools of devices, the vdev tree (single, stripe, mirror), the allocator,
//! transaction groups, volumes and their block trees, and range locks.
//!
//! The data-plane API ([`Volume`]) is asynchronous: it returns futures that run on the calling
//! thread's ring driver (`oxpool_io::rt`), so one thread can keep many requests in flight.
//! The control plane ([`Pool::create`], [`Pool::import`], ...) is synchronous and must not be
//! called from inside an executor.

pub mod alloc;
pub mod cachefile;
pub mod completion;
pub mod compress;
pub mod data_cache;
pub mod dsl;
mod error;
mod idhash;
pub mod iostats;
pub mod label;
mod leaf_io;
pub mod pipeline;
pub mod pool;
pub mod props;
pub mod raidz;
pub mod rangelock;
mod scan;
mod sector_mask;
pub mod tree;
pub mod txg;
pub mod vdev;
pub mod vdev_queue;
pub mod volume;
mod zil;

pub use error::{EngineError, Result};
pub use pipeline::ScrubCounts;
pub use pool::{Pool, PoolCounters, PoolStatus, TopSpec, VdevStatus};
pub use props::{PoolProps, SyncMode, VolumeProps};
pub use scan::{ScanState, ScanStatus};
pub use volume::{BlockState, Volume};
pub use zil::{LogCounters, LogStats};
