//! The pool's own state, stored in a `PoolMeta` metadata block that the uberblock points to.

use crate::meta::postcard_exact;
use crate::{
    decode_meta_block, encode_meta_block, BlockPtr, BlockType, Dva, FormatError, Guid, Txg, VdevId,
    VdevTreeConfig, VolumeId, BLOCK_LEVEL_MAX,
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

    /// Decodes a metadata block of kind `PoolMeta`. Block pointers inside are checked as by
    /// `BlockPtr::decode`, deferred-free DVAs by `Dva::validate`, volume levels against
    /// `BLOCK_LEVEL_MAX`. DVAs are not checked against the tree: see
    /// `VdevTreeConfig::check_dva`.
    pub fn decode(bytes: &[u8]) -> Result<PoolMeta, FormatError> {
        let payload = decode_meta_block(BlockType::PoolMeta, bytes)?;
        let meta: PoolMeta = postcard_exact(payload)?;
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
