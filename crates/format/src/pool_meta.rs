//! The pool's own state, stored in a `PoolMeta` metadata block that the uberblock points to.

use crate::label::VdevTreeConfigV5;
use crate::meta::{meta_block_version, postcard_exact};
use crate::{
    decode_meta_block, encode_meta_block, BlockPtr, BlockType, Dva, FormatError, FormatVersion,
    Guid, Txg, VdevId, VdevTreeConfig, VolumeId, BLOCK_LEVEL_MAX,
};
use serde::{Deserialize, Serialize};

/// The pool's own state, stored inside the pool (PoolMeta block, postcard payload inside a
/// meta block; the uberblock's root points at it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMeta {
    /// Pool name.
    pub name: String,
    /// Pool guid (the same as in the labels and uberblocks).
    pub guid: Guid,
    /// The txg this state was committed in.
    pub txg: Txg,
    /// The vdev tree.
    pub tree: VdevTreeConfig,
    /// Pool properties, as (name, value) strings.
    pub props: Vec<(String, String)>,
    /// The volumes.
    pub volumes: Vec<VolumeMeta>,
    /// One space map per top-level vdev.
    pub spacemaps: Vec<SpaceMapMeta>,
    /// Blocks freed in recent txgs, reusable once their txg is durable (and past the rewind
    /// window).
    pub deferred_frees: Vec<DeferredFree>,
    /// Id of the next volume created; ids are never reused.
    pub next_volume_id: u64,
    /// Each volume's dataset record (its snapshots, origin and deadlist), by volume id;
    /// since format version 3 (a version 2 pool's volumes have none: no snapshots).
    pub datasets: Vec<DatasetMeta>,
    /// Blocks of destroyed snapshots still to free (deadlist chunks, drained a few per txg:
    /// the `freeing` property); since format version 3.
    pub freeing: Vec<DeadBucketMeta>,
    /// The pool's command history: `History` chunks of `HistoryRecordMeta`, oldest first
    /// (since format version 8).
    pub history: Vec<TableChunkMeta>,
}

/// Longest command line a history record keeps, in bytes (a longer one is cut, on a
/// character boundary, and ends with `...`).
pub const HISTORY_LINE_BYTES_MAX: usize = 1024;

/// Longest host name a history record keeps, in bytes.
pub const HISTORY_HOST_BYTES_MAX: usize = 255;

/// One command of the pool's history (`oxpool history`), as `zpool history` keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecordMeta {
    /// When the command ended, seconds since the Unix epoch.
    pub time_s: u64,
    /// The txg that wrote the record: the command's changes are in it or before it.
    pub txg: Txg,
    /// The user id that ran it.
    pub uid: u32,
    /// The host it ran on (at most `HISTORY_HOST_BYTES_MAX` bytes).
    pub host: String,
    /// The command line, `oxpool snapshot tank/vol0@mon` (at most
    /// `HISTORY_LINE_BYTES_MAX` bytes).
    pub line: String,
}

/// Encodes a chunk of the pool's history.
///
/// # Panics
/// If there are more than `TABLE_CHUNK_ENTRIES_MAX` records, or none.
pub fn encode_history_chunk(entries: &[HistoryRecordMeta]) -> Vec<u8> {
    encode_table_chunk(BlockType::History, entries)
}

/// Decodes a chunk of the pool's history: at least one and at most
/// `TABLE_CHUNK_ENTRIES_MAX` records, each line and host name within its bound.
pub fn decode_history_chunk(bytes: &[u8]) -> Result<Vec<HistoryRecordMeta>, FormatError> {
    let entries: Vec<HistoryRecordMeta> = decode_table_chunk(BlockType::History, bytes)?;
    for r in &entries {
        if r.line.len() > HISTORY_LINE_BYTES_MAX {
            return Err(FormatError::BadField {
                field: "history.line",
                value: r.line.len() as u64,
            });
        }
        if r.host.len() > HISTORY_HOST_BYTES_MAX {
            return Err(FormatError::BadField {
                field: "history.host",
                value: r.host.len() as u64,
            });
        }
    }
    Ok(entries)
}

/// A volume's dataset: its identity, lineage, snapshots and deadlist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetMeta {
    /// The volume this record belongs to.
    pub volume: VolumeId,
    /// The dataset's guid (random, for `guid` and send streams).
    pub guid: Guid,
    /// The txg it was created in.
    pub createtxg: Txg,
    /// Creation time, seconds since the Unix epoch.
    pub creation_s: u64,
    /// For a clone: the snapshot it was cloned from.
    pub origin: Option<OriginMeta>,
    /// Txg of the previous snapshot: the latest snapshot's, else the origin's, else 0. A
    /// block born after it is the head's alone; one born at or before it is shared.
    pub prev_snap_txg: Txg,
    /// Bytes of the head's blocks born after `prev_snap_txg` (every copy): `written`.
    pub written_bytes: u64,
    /// Blocks the head killed while the previous snapshot still references them.
    pub deadlist: Vec<DeadBucketMeta>,
    /// The snapshot table: `SnapshotTable` chunks holding the snapshots, oldest first (since
    /// format version 4).
    pub snapshot_table: Vec<TableChunkMeta>,
    /// The bookmark table: `BookmarkTable` chunks holding the bookmarks, oldest first (since
    /// format version 4).
    pub bookmark_table: Vec<TableChunkMeta>,
    /// The snapshots, oldest first: not part of the encoding (they live in the table's
    /// blocks, which whoever imports the pool reads and puts here), except in version 3,
    /// which stored them inline and decodes into this field.
    #[serde(skip)]
    pub snapshots: Vec<SnapshotMeta>,
    /// Set on the hidden dataset of an interrupted `recv -s` only: which stream it receives
    /// and how far (since format version 5).
    pub receive_resume: Option<ReceiveResumeMeta>,
}

/// Where an interrupted resumable receive (`recv -s`) stands: the stream's identity (what a
/// resuming stream must match, and what the received snapshot becomes) and the offset below
/// which every record was applied and is durable in the same txg as this record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiveResumeMeta {
    /// The snapshot being received: the sender's guid.
    pub toguid: Guid,
    /// The base of an incremental stream (None: full).
    pub fromguid: Option<Guid>,
    /// The received snapshot's name (after the `@`).
    pub snapshot: String,
    /// The snapshot's creation time on the sender, in nanoseconds since the Unix epoch.
    pub creation_time_ns: u64,
    /// The volume's size in the snapshot.
    pub volsize_bytes: u64,
    /// The volume's block size.
    pub volblocksize_bytes: u32,
    /// The stream's feature bits (`StreamFeatures`).
    pub features: u64,
    /// Every record below this volume offset was applied (a multiple of the block size).
    pub offset_bytes: u64,
}

/// One chunk of a dataset's table (of snapshots or of bookmarks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableChunkMeta {
    /// The chunk's block.
    pub chunk: BlockPtr,
    /// Records in it (at least 1, at most `TABLE_CHUNK_ENTRIES_MAX`).
    pub entries: u32,
}

/// A bookmark: what an incremental send needs of a snapshot (its guid and txg), without
/// holding any of its blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookmarkMeta {
    /// Name after the `#`.
    pub name: String,
    /// The guid of the snapshot it was made from (an incremental's base guid).
    pub guid: Guid,
    /// That snapshot's txg.
    pub txg: Txg,
    /// That snapshot's creation time, seconds since the Unix epoch.
    pub creation_s: u64,
    /// The volume's size in that snapshot (an incremental from the bookmark sends a resize
    /// only if the size changed).
    pub volsize_bytes: u64,
}

/// Largest number of records in one table chunk: a snapshot record is a few hundred bytes
/// (more with a long deadlist), so a chunk is tens of KiB, and a txg that changes one
/// snapshot rewrites that much, whatever the number of snapshots.
pub const TABLE_CHUNK_ENTRIES_MAX: usize = 64;

/// Encodes a chunk of a snapshot table.
///
/// # Panics
/// If there are more than `TABLE_CHUNK_ENTRIES_MAX` records, or none.
pub fn encode_snapshot_chunk(entries: &[SnapshotMeta]) -> Vec<u8> {
    encode_table_chunk(BlockType::SnapshotTable, entries)
}

/// Decodes a chunk of a snapshot table: at least one and at most `TABLE_CHUNK_ENTRIES_MAX`
/// records, tree levels at most `BLOCK_LEVEL_MAX`, no hole among deadlist chunks.
pub fn decode_snapshot_chunk(bytes: &[u8]) -> Result<Vec<SnapshotMeta>, FormatError> {
    let entries: Vec<SnapshotMeta> = decode_table_chunk(BlockType::SnapshotTable, bytes)?;
    for snap in &entries {
        if snap.levels > BLOCK_LEVEL_MAX {
            return Err(FormatError::BadField {
                field: "snapshot.levels",
                value: u64::from(snap.levels),
            });
        }
    }
    Ok(entries)
}

/// Encodes a chunk of a bookmark table.
///
/// # Panics
/// If there are more than `TABLE_CHUNK_ENTRIES_MAX` records, or none.
pub fn encode_bookmark_chunk(entries: &[BookmarkMeta]) -> Vec<u8> {
    encode_table_chunk(BlockType::BookmarkTable, entries)
}

/// Decodes a chunk of a bookmark table (at least one, at most `TABLE_CHUNK_ENTRIES_MAX`).
pub fn decode_bookmark_chunk(bytes: &[u8]) -> Result<Vec<BookmarkMeta>, FormatError> {
    decode_table_chunk(BlockType::BookmarkTable, bytes)
}

fn encode_table_chunk<T: Serialize>(kind: BlockType, entries: &[T]) -> Vec<u8> {
    assert!(
        !entries.is_empty() && entries.len() <= TABLE_CHUNK_ENTRIES_MAX,
        "table chunk of {} records",
        entries.len()
    );
    let payload = postcard::to_allocvec(entries).expect("postcard serializes records into a Vec");
    encode_meta_block(kind, &payload)
}

fn decode_table_chunk<T: serde::de::DeserializeOwned>(
    kind: BlockType,
    bytes: &[u8],
) -> Result<Vec<T>, FormatError> {
    let payload = decode_meta_block(kind, bytes)?;
    // postcard reads the count first and allocates as records decode, so a lying count
    // fails on the payload's end, not on memory.
    let entries: Vec<T> = postcard_exact(payload)?;
    if entries.is_empty() || entries.len() > TABLE_CHUNK_ENTRIES_MAX {
        return Err(FormatError::BadField {
            field: "table chunk records",
            value: entries.len() as u64,
        });
    }
    Ok(entries)
}

/// Where a clone comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginMeta {
    /// The volume whose snapshot it is.
    pub volume: VolumeId,
    /// The snapshot's guid.
    pub snapshot_guid: Guid,
    /// The snapshot's txg.
    pub txg: Txg,
}

/// A snapshot: a read-only block tree as it was at the end of txg `txg`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// Name after the `@`.
    pub name: String,
    /// Its guid (kept by send and receive).
    pub guid: Guid,
    /// The txg whose end it captures (`createtxg`).
    pub txg: Txg,
    /// Creation time, seconds since the Unix epoch.
    pub creation_s: u64,
    /// Root of its block tree.
    pub root: BlockPtr,
    /// Levels of its tree.
    pub levels: u8,
    /// The volume's size then.
    pub volsize_bytes: u64,
    /// Bytes its tree references (every copy): `referenced`.
    pub referenced_bytes: u64,
    /// Bytes of its tree born after the snapshot before it: `written`.
    pub written_bytes: u64,
    /// Bytes its data blocks take as stored, one copy each (for `compressratio`).
    pub compressed_bytes: u64,
    /// Blocks killed between the snapshot before it and it, that the one before references.
    pub deadlist: Vec<DeadBucketMeta>,
    /// User holds (`oxpool hold`): a held snapshot cannot be destroyed.
    pub holds: Vec<String>,
    /// Marked by `destroy -d` while held or cloned: destroyed when the last hold is released
    /// and the last clone destroyed.
    pub defer_destroy: bool,
}

/// One bucket of a deadlist: entries born after the chain's snapshot before `key`, at or
/// before `key`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadBucketMeta {
    /// The bucket's key: a snapshot txg.
    pub key: Txg,
    /// The `DeadList` blocks holding its entries.
    pub chunks: Vec<BlockPtr>,
    /// Entries.
    pub count: u64,
    /// Allocated bytes of the entries (every copy).
    pub bytes: u64,
}

/// Largest number of entries in one deadlist chunk (a 256 KiB piece at most).
pub const DEADLIST_CHUNK_ENTRIES_MAX: usize = 1024;

/// Encodes a deadlist chunk: a metadata block of kind `DeadList` holding `entries`.
///
/// # Panics
/// If there are more than `DEADLIST_CHUNK_ENTRIES_MAX` entries.
pub fn encode_deadlist_chunk(entries: &[BlockPtr]) -> Vec<u8> {
    assert!(
        entries.len() <= DEADLIST_CHUNK_ENTRIES_MAX,
        "deadlist chunk too large"
    );
    let payload =
        postcard::to_allocvec(entries).expect("postcard serializes block pointers into a Vec");
    encode_meta_block(BlockType::DeadList, &payload)
}

/// Decodes a deadlist chunk (entries checked as by `BlockPtr::decode`; at most
/// `DEADLIST_CHUNK_ENTRIES_MAX`; no hole among them).
pub fn decode_deadlist_chunk(bytes: &[u8]) -> Result<Vec<BlockPtr>, FormatError> {
    let payload = decode_meta_block(BlockType::DeadList, bytes)?;
    let entries: Vec<BlockPtr> = postcard_exact(payload)?;
    if entries.len() > DEADLIST_CHUNK_ENTRIES_MAX {
        return Err(FormatError::BadField {
            field: "deadlist entries",
            value: entries.len() as u64,
        });
    }
    if entries.iter().any(|e| e.is_hole()) {
        return Err(FormatError::BadField {
            field: "deadlist entry",
            value: 0,
        });
    }
    Ok(entries)
}

/// `DatasetMeta` as format version 3 wrote it (snapshots inline, no tables).
#[derive(Deserialize)]
struct DatasetMetaV3 {
    volume: VolumeId,
    guid: Guid,
    createtxg: Txg,
    creation_s: u64,
    origin: Option<OriginMeta>,
    prev_snap_txg: Txg,
    written_bytes: u64,
    deadlist: Vec<DeadBucketMeta>,
    snapshots: Vec<SnapshotMeta>,
}

impl From<DatasetMetaV3> for DatasetMeta {
    fn from(m: DatasetMetaV3) -> DatasetMeta {
        DatasetMeta {
            volume: m.volume,
            guid: m.guid,
            createtxg: m.createtxg,
            creation_s: m.creation_s,
            origin: m.origin,
            prev_snap_txg: m.prev_snap_txg,
            written_bytes: m.written_bytes,
            deadlist: m.deadlist,
            snapshot_table: Vec::new(),
            bookmark_table: Vec::new(),
            snapshots: m.snapshots,
            receive_resume: None,
        }
    }
}

/// `DatasetMeta` as format version 4 wrote it (no `receive_resume`).
#[derive(Deserialize)]
struct DatasetMetaV4 {
    volume: VolumeId,
    guid: Guid,
    createtxg: Txg,
    creation_s: u64,
    origin: Option<OriginMeta>,
    prev_snap_txg: Txg,
    written_bytes: u64,
    deadlist: Vec<DeadBucketMeta>,
    snapshot_table: Vec<TableChunkMeta>,
    bookmark_table: Vec<TableChunkMeta>,
}

impl From<DatasetMetaV4> for DatasetMeta {
    fn from(m: DatasetMetaV4) -> DatasetMeta {
        DatasetMeta {
            volume: m.volume,
            guid: m.guid,
            createtxg: m.createtxg,
            creation_s: m.creation_s,
            origin: m.origin,
            prev_snap_txg: m.prev_snap_txg,
            written_bytes: m.written_bytes,
            deadlist: m.deadlist,
            snapshot_table: m.snapshot_table,
            bookmark_table: m.bookmark_table,
            snapshots: Vec::new(),
            receive_resume: None,
        }
    }
}

/// `PoolMeta` as format versions 6 and 7 wrote it (no `history`).
#[derive(Deserialize)]
struct PoolMetaV7 {
    name: String,
    guid: Guid,
    txg: Txg,
    tree: VdevTreeConfig,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMeta>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
    datasets: Vec<DatasetMeta>,
    freeing: Vec<DeadBucketMeta>,
}

impl From<PoolMetaV7> for PoolMeta {
    fn from(m: PoolMetaV7) -> PoolMeta {
        PoolMeta {
            name: m.name,
            guid: m.guid,
            txg: m.txg,
            tree: m.tree,
            props: m.props,
            volumes: m.volumes,
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
            datasets: m.datasets,
            freeing: m.freeing,
            history: Vec::new(),
        }
    }
}

/// `PoolMeta` as format version 5 wrote it (its tree without pairs and spares).
#[derive(Deserialize)]
struct PoolMetaV5 {
    name: String,
    guid: Guid,
    txg: Txg,
    tree: VdevTreeConfigV5,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMeta>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
    datasets: Vec<DatasetMeta>,
    freeing: Vec<DeadBucketMeta>,
}

impl From<PoolMetaV5> for PoolMeta {
    fn from(m: PoolMetaV5) -> PoolMeta {
        PoolMeta {
            name: m.name,
            guid: m.guid,
            txg: m.txg,
            tree: m.tree.into(),
            props: m.props,
            volumes: m.volumes,
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
            datasets: m.datasets,
            freeing: m.freeing,
            history: Vec::new(),
        }
    }
}

/// `PoolMeta` as format version 4 wrote it (its datasets without `receive_resume`).
#[derive(Deserialize)]
struct PoolMetaV4 {
    name: String,
    guid: Guid,
    txg: Txg,
    tree: VdevTreeConfigV5,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMeta>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
    datasets: Vec<DatasetMetaV4>,
    freeing: Vec<DeadBucketMeta>,
}

impl From<PoolMetaV4> for PoolMeta {
    fn from(m: PoolMetaV4) -> PoolMeta {
        PoolMeta {
            name: m.name,
            guid: m.guid,
            txg: m.txg,
            tree: m.tree.into(),
            props: m.props,
            volumes: m.volumes,
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
            datasets: m.datasets.into_iter().map(Into::into).collect(),
            freeing: m.freeing,
            history: Vec::new(),
        }
    }
}

/// `PoolMeta` as format version 3 wrote it (its datasets' snapshots inline).
#[derive(Deserialize)]
struct PoolMetaV3 {
    name: String,
    guid: Guid,
    txg: Txg,
    tree: VdevTreeConfigV5,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMeta>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
    datasets: Vec<DatasetMetaV3>,
    freeing: Vec<DeadBucketMeta>,
}

impl From<PoolMetaV3> for PoolMeta {
    fn from(m: PoolMetaV3) -> PoolMeta {
        PoolMeta {
            name: m.name,
            guid: m.guid,
            txg: m.txg,
            tree: m.tree.into(),
            props: m.props,
            volumes: m.volumes,
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
            datasets: m.datasets.into_iter().map(Into::into).collect(),
            freeing: m.freeing,
            history: Vec::new(),
        }
    }
}

/// `PoolMeta` as format version 2 wrote it (no `datasets`).
#[derive(Deserialize)]
struct PoolMetaV2 {
    name: String,
    guid: Guid,
    txg: Txg,
    tree: VdevTreeConfigV5,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMeta>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
}

impl From<PoolMetaV2> for PoolMeta {
    fn from(m: PoolMetaV2) -> PoolMeta {
        PoolMeta {
            name: m.name,
            guid: m.guid,
            txg: m.txg,
            tree: m.tree.into(),
            props: m.props,
            volumes: m.volumes,
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
            datasets: Vec::new(),
            freeing: Vec::new(),
            history: Vec::new(),
        }
    }
}

/// A volume: its properties and the root of its block tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMeta {
    /// Volume id.
    pub id: VolumeId,
    /// Volume name.
    pub name: String,
    /// Volume properties, as (name, value) strings.
    pub props: Vec<(String, String)>,
    /// Size seen by clients.
    pub volsize_bytes: u64,
    /// Size of a data block of this volume.
    pub volblocksize_bytes: u32,
    /// Root of the block tree (a hole for an empty volume).
    pub root: BlockPtr,
    /// Levels of indirect blocks above the data blocks (`root.level` when not a hole).
    pub levels: u8,
    /// Bytes allocated for this volume.
    pub used_bytes: u64,
    /// Where the volume's intent log starts: the first log block that may hold records newer
    /// than this txg (or the place the next block will be written when the log is empty).
    /// An all-zero DVA means no log.
    pub log_first: Dva,
    /// Sequence number of the block at `log_first`.
    pub log_first_seq: u64,
    /// Every place the log had allocated when this was written (blocks in the chain, the
    /// block being filled, the place of the next one). Import frees them after replay, so
    /// a block allocated in advance and never written does not leak.
    pub log_reserved: Vec<Dva>,
    /// Bytes the volume's data blocks take as stored, one copy each (the allocated size of a
    /// copy: compressed blocks count what they take, not their logical size). With the
    /// logical size, `fill * volblocksize` of the root, this gives `compressratio`. Since
    /// format version 2; derived for a version 1 volume (nothing compressed: every data
    /// block takes its size rounded up to a sector).
    pub compressed_bytes: u64,
}

/// `VolumeMeta` as format version 1 wrote it (no `compressed_bytes`).
#[derive(Deserialize)]
struct VolumeMetaV1 {
    id: VolumeId,
    name: String,
    props: Vec<(String, String)>,
    volsize_bytes: u64,
    volblocksize_bytes: u32,
    root: BlockPtr,
    levels: u8,
    used_bytes: u64,
    log_first: Dva,
    log_first_seq: u64,
    log_reserved: Vec<Dva>,
}

/// `PoolMeta` as format version 1 wrote it (its volumes without `compressed_bytes`).
#[derive(Deserialize)]
struct PoolMetaV1 {
    name: String,
    guid: Guid,
    txg: Txg,
    tree: VdevTreeConfigV5,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMetaV1>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
}

impl From<VolumeMetaV1> for VolumeMeta {
    fn from(v: VolumeMetaV1) -> VolumeMeta {
        // Version 1 stored every data block as is (`fill` of them), and a block stored as is
        // counts its logical size (`compressratio`'s rule, docs/compression.md).
        VolumeMeta {
            compressed_bytes: v.root.fill.saturating_mul(u64::from(v.volblocksize_bytes)),
            id: v.id,
            name: v.name,
            props: v.props,
            volsize_bytes: v.volsize_bytes,
            volblocksize_bytes: v.volblocksize_bytes,
            root: v.root,
            levels: v.levels,
            used_bytes: v.used_bytes,
            log_first: v.log_first,
            log_first_seq: v.log_first_seq,
            log_reserved: v.log_reserved,
        }
    }
}

impl From<PoolMetaV1> for PoolMeta {
    fn from(m: PoolMetaV1) -> PoolMeta {
        PoolMeta {
            name: m.name,
            guid: m.guid,
            txg: m.txg,
            tree: m.tree.into(),
            props: m.props,
            volumes: m.volumes.into_iter().map(VolumeMeta::from).collect(),
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
            datasets: Vec::new(),
            freeing: Vec::new(),
            history: Vec::new(),
        }
    }
}

/// The space map of one top-level vdev: a list of bitmap chunks, chunk i covering sectors
/// `[i * SPACEMAP_CHUNK_SECTORS, (i + 1) * SPACEMAP_CHUNK_SECTORS)` of the allocatable space.
/// A hole is a chunk with nothing allocated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceMapMeta {
    /// The top-level vdev described.
    pub vdev: VdevId,
    /// Sum of allocated bytes (a cross-check of the bitmaps).
    pub allocated_bytes: u64,
    /// The chunks.
    pub chunks: Vec<BlockPtr>,
}

/// Blocks freed in txg `txg`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeferredFree {
    /// The txg that freed them.
    pub txg: Txg,
    /// The freed ranges.
    pub dvas: Vec<Dva>,
}

impl PoolMeta {
    /// Encodes as a whole metadata block of kind `PoolMeta` (see `encode_meta_block`).
    ///
    /// # Panics
    /// If the payload exceeds `META_PAYLOAD_BYTES_MAX` (64 MiB), or a block pointer inside
    /// is invalid.
    pub fn encode(&self) -> Vec<u8> {
        let payload =
            postcard::to_allocvec(self).expect("postcard serializes a PoolMeta into a Vec");
        encode_meta_block(BlockType::PoolMeta, &payload)
    }

    /// Decodes a metadata block of kind `PoolMeta`, of format version 1 to 8 (the version in
    /// its header says which layout the payload has). Block pointers inside are checked as by
    /// `BlockPtr::decode`, deferred-free DVAs by `Dva::validate`, volume levels against
    /// `BLOCK_LEVEL_MAX`. DVAs are not checked against the tree: see
    /// `VdevTreeConfig::check_dva`.
    pub fn decode(bytes: &[u8]) -> Result<PoolMeta, FormatError> {
        let payload = decode_meta_block(BlockType::PoolMeta, bytes)?;
        // The header decoded, so its version is a known one.
        let meta: PoolMeta = match meta_block_version(bytes)? {
            FormatVersion::V1 => postcard_exact::<PoolMetaV1>(payload)?.into(),
            FormatVersion::V2 => postcard_exact::<PoolMetaV2>(payload)?.into(),
            FormatVersion::V3 => postcard_exact::<PoolMetaV3>(payload)?.into(),
            FormatVersion::V4 => postcard_exact::<PoolMetaV4>(payload)?.into(),
            FormatVersion::V5 => postcard_exact::<PoolMetaV5>(payload)?.into(),
            FormatVersion::V6 | FormatVersion::V7 => postcard_exact::<PoolMetaV7>(payload)?.into(),
            FormatVersion::V8 => postcard_exact(payload)?,
        };
        meta.tree.check_holes(meta_block_version(bytes)?)?;
        for volume in &meta.volumes {
            if volume.levels > BLOCK_LEVEL_MAX {
                return Err(FormatError::BadField {
                    field: "volume.levels",
                    value: u64::from(volume.levels),
                });
            }
        }
        for ds in &meta.datasets {
            for snap in &ds.snapshots {
                if snap.levels > BLOCK_LEVEL_MAX {
                    return Err(FormatError::BadField {
                        field: "snapshot.levels",
                        value: u64::from(snap.levels),
                    });
                }
            }
        }
        for free in &meta.deferred_frees {
            for dva in &free.dvas {
                dva.validate()?;
            }
        }
        Ok(meta)
    }
}
