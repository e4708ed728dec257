//! The on-disk format of oxpool, version 2 (it reads version 1 too).
//!
//! This crate is pure: it defines the on-disk types, their byte encodings and the checksums,
//! and does no I/O. Everything that reads bytes from a device goes through a decoder here, so
//! the rules below are the pool's first line of defence against damaged media:
//!
//! - every decoder returns `Result<_, FormatError>` and never panics, whatever the input;
//! - no length, offset or count read from disk is trusted: each is checked against the buffer
//!   and against a documented maximum before it is used;
//! - every stand-alone structure carries a magic, a format version and a checksum;
//! - all integers are little-endian, at explicit byte offsets.
//!
//! Encoders take values the program built, so they panic on a broken invariant (for example a
//! payload larger than its documented maximum): writing a structure that no decoder would
//! accept is a bug that must not reach the disk.
//!
//! The byte-by-byte description of every structure is in `docs/format.md`, and so is the
//! send stream (`stream`), the one format here that travels rather than sits on a device.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod blockptr;
mod bytes;
mod checksum;
mod compress;
mod error;
mod ids;
mod indirect;
mod label;
mod layout;
mod log;
mod meta;
mod pool_meta;
pub mod stream;
mod uberblock;

pub use blockptr::{
    BlockPtr, BlockType, Compression, Dva, BLOCK_BYTES_MAX, BLOCK_LEVEL_MAX, BLOCK_PTR_BYTES,
    BLOCK_PTR_VERSION, BLOCK_PTR_VERSION_MIN, DVAS_MAX,
};
pub use bytes::all_zero;
pub use checksum::{checksum, checksum_parts, Checksum, ChecksumType, ParseNameError};
pub use compress::{
    compress_block, compressed_bytes_max, decompress_block, looks_incompressible, probe,
    CompressionSetting, ProbeVerdict, ZSTD_LEVEL_DEFAULT, ZSTD_LEVEL_MAX,
};
pub use error::FormatError;
pub use ids::{Guid, Txg, VdevId, VolumeId};
pub use indirect::{
    decode_indirect, encode_indirect, INDIRECT_BLOCK_BYTES, INDIRECT_FANOUT, INDIRECT_MAGIC,
};
pub use label::{
    LabelConfig, LeafConfig, PairConfig, PairKind, RaidzConfig, RaidzEpoch, TopVdevConfig,
    TopVdevKind, VdevTreeConfig, LABEL_CONFIG_HEADER_BYTES, LABEL_CONFIG_MAGIC,
    LABEL_CONFIG_PAYLOAD_BYTES_MAX, RAIDZ_CHILDREN_MAX, RAIDZ_PARITY_MAX, SPARE_TOP,
};
pub use layout::{
    check_device_bytes, data_end_bytes, label_offsets, uberblock_slot_offset, FormatVersion,
    DATA_START_BYTES, FORMAT_VERSION, LABEL_BYTES, LABEL_CONFIG_BYTES, LABEL_COUNT,
    MIN_DEVICE_BYTES, SECTOR_BYTES, UBERBLOCK_SLOTS, UBERBLOCK_SLOT_BYTES, VOLSIZE_MAX_BYTES,
};
pub use log::{
    decode_log_block, log_records, LogBlockHeader, LogBlockWriter, LogRecord, LOG_BLOCK_BYTES_MAX,
    LOG_BLOCK_MAGIC, LOG_HEADER_BYTES, LOG_RECORD_DATA_BYTES_MAX, LOG_RECORD_HEADER_BYTES,
};
pub use meta::{
    decode_meta_block, decode_meta_index, decode_spacemap_chunk, encode_meta_block,
    encode_meta_index, encode_spacemap_chunk, meta_block_bytes, META_HEADER_BYTES,
    META_INDEX_PIECES_MAX, META_MAGIC, META_PAYLOAD_BYTES_MAX, META_PIECE_BYTES_MAX,
    SPACEMAP_CHUNK_PAYLOAD_BYTES, SPACEMAP_CHUNK_SECTORS,
};
pub use pool_meta::{
    decode_bookmark_chunk, decode_deadlist_chunk, decode_history_chunk, decode_snapshot_chunk,
    encode_bookmark_chunk, encode_deadlist_chunk, encode_history_chunk, encode_snapshot_chunk,
    BookmarkMeta, DatasetMeta, DeadBucketMeta, DeferredFree, HistoryRecordMeta, OriginMeta,
    PoolMeta, ReceiveResumeMeta, SnapshotMeta, SpaceMapMeta, TableChunkMeta, VolumeMeta,
    DEADLIST_CHUNK_ENTRIES_MAX, HISTORY_HOST_BYTES_MAX, HISTORY_LINE_BYTES_MAX,
    TABLE_CHUNK_ENTRIES_MAX,
};
pub use stream::{
    DataRecord, RecordType, ResumeToken, StreamBegin, StreamChecksum, StreamDecoder, StreamEncoder,
    StreamError, StreamErrorKind, StreamFeatures, StreamRecord, TokenError,
};
pub use uberblock::{Uberblock, UBERBLOCK_MAGIC};
