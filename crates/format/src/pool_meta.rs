//! The pool's own state, stored in a `PoolMeta` metadata block that the uberblock points to.

use crate::meta::{meta_block_version, postcard_exact};
use crate::{
    decode_meta_block, encode_meta_block, BlockPtr, BlockType, Dva, FormatError, FormatVersion,
    Guid, Txg, VdevId, VdevTreeConfig, VolumeId, BLOCK_LEVEL_MAX, SECTOR_BYTES,
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
    tree: VdevTreeConfig,
    props: Vec<(String, String)>,
    volumes: Vec<VolumeMetaV1>,
    spacemaps: Vec<SpaceMapMeta>,
    deferred_frees: Vec<DeferredFree>,
    next_volume_id: u64,
}

impl From<VolumeMetaV1> for VolumeMeta {
    fn from(v: VolumeMetaV1) -> VolumeMeta {
        // Version 1 stored every data block as is, in whole sectors: `fill` of them.
        let block_bytes = u64::from(v.volblocksize_bytes).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
        VolumeMeta {
            compressed_bytes: v.root.fill.saturating_mul(block_bytes),
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
            tree: m.tree,
            props: m.props,
            volumes: m.volumes.into_iter().map(VolumeMeta::from).collect(),
            spacemaps: m.spacemaps,
            deferred_frees: m.deferred_frees,
            next_volume_id: m.next_volume_id,
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

    /// Decodes a metadata block of kind `PoolMeta`, of format version 1 or 2 (the version in
    /// its header says which layout the payload has). Block pointers inside are checked as by
    /// `BlockPtr::decode`, deferred-free DVAs by `Dva::validate`, volume levels against
    /// `BLOCK_LEVEL_MAX`. DVAs are not checked against the tree: see
    /// `VdevTreeConfig::check_dva`.
    pub fn decode(bytes: &[u8]) -> Result<PoolMeta, FormatError> {
        let payload = decode_meta_block(BlockType::PoolMeta, bytes)?;
        // The header decoded, so its version is a known one.
        let meta: PoolMeta = match meta_block_version(bytes)? {
            FormatVersion::V1 => postcard_exact::<PoolMetaV1>(payload)?.into(),
            FormatVersion::V2 => postcard_exact(payload)?,
        };
        for volume in &meta.volumes {
            if volume.levels > BLOCK_LEVEL_MAX {
                return Err(FormatError::BadField {
                    field: "volume.levels",
                    value: u64::from(volume.levels),
                });
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
