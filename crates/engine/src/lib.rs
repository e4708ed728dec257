//! The oxpool engine: everything between a volume's bytes and a device's sectors, in layers
//! that are folders, each calling only the ones below it (docs/DESIGN.md 5.1):
//!
//! ```text
//!  zvol/   volumes: byte ranges, range locks, read-modify-write, FUA/FLUSH -> the log
//!  zil/    the intent log: records, log blocks, group commit, claim and replay
//!  dsl/    datasets: names, snapshots, deadlists, space accounting, sync tasks
//!  dmu/    objects: a block tree per object, dirty records per txg, traversal
//!  spa/    the pool: labels, uberblocks, config, import/export, the txg engine, frees, scrub
//!  zio/    the pipeline: checksum, compress, verify, repair; completion policy; data cache
//!  vdev/   the vdev tree (planners), leaf I/O and queues, the space allocator, labels
//! ```
//!
//! The data-plane API ([`Volume`]) is asynchronous: it returns futures that run on the calling
//! thread's ring driver (`oxpool_io::rt`), so one thread can keep many requests in flight.
//! The control plane ([`Pool::create`], [`Pool::import`], ...) is synchronous and must not be
//! called from inside an executor.

pub mod cachefile;
pub mod dmu;
pub mod dsl;
mod error;
mod idhash;
pub mod iostats;
mod pool;
pub mod props;
mod sector_mask;
pub mod spa;
pub mod vdev;
pub mod zil;
pub mod zio;
pub mod zvol;

pub use dsl::audit::AuditReport;
pub use dsl::change_map::{ChangeBase, PinnedBase};
pub use dsl::scan::{ScanKind, ScanPosition, ScanState, ScanStatus};
pub use error::{EngineError, Result};
pub use iostats::{LogCounters, LogStats};
pub use pool::{
    BeforeDestroy, BookmarkInfo, DatasetSpace, DeviceRecord, ErrorRecord, LegSize, OnKept, Pool,
    PoolCounters, ReceiveOptions, Received, SendOptions, SendStats, SendWhat, SnapshotInfo,
    DATASET_STAT_NAMES, SEND_PREFETCH_BYTES_DEFAULT, SEND_READS_IN_FLIGHT_BYTES_MAX,
    SNAPSHOT_PROP_NAMES,
};
pub use props::{PoolProps, SyncMode, VolumeProps};
pub use spa::history::{HistoryListing, HistoryRecord, HISTORY_CHUNKS_MAX};
pub use spa::import::{parse_id, ImportOptions, PoolRef};
pub use spa::{PoolStatus, TopSpec, VdevStatus};
pub use zio::ScrubCounts;
pub use zvol::{
    BlockState, ChangedExtent, ReadPart, StoredBlock, StoredForm, Volume, CHANGED_RANGES_MAX,
};
