//! Block pointers: how a parent names, locates and vouches for a child block.
//!
//! A block never vouches for itself: the checksum of a block lives in the pointer to it, so a
//! misdirected write, a lost write or a stale block is caught by the parent when it is read.

use crate::bytes::{
    all_zero, check_reserved, get_array, get_u32, get_u64, get_u8, need, put_bytes, put_u32,
    put_u64, put_u8, round_up,
};
use crate::{
    Checksum, ChecksumType, FormatError, Txg, VdevId, META_HEADER_BYTES, META_PAYLOAD_BYTES_MAX,
    SECTOR_BYTES,
};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

/// Size of an encoded block pointer.
pub const BLOCK_PTR_BYTES: usize = 128;
/// Version byte written in every non-hole block pointer (byte 53). Block pointers have no magic
/// (they are always embedded in a structure that has one), so this byte is what tells a
/// pointer of a known version from garbage or from a later version. Version 2 (format
/// version 2) added compressed blocks; a version 1 pointer decodes too, and must have
/// `compression` 0.
pub const BLOCK_PTR_VERSION: u8 = 2;
/// The oldest block pointer version this build reads.
pub const BLOCK_PTR_VERSION_MIN: u8 = 1;
/// Most copies (DVAs) one block pointer holds.
pub const DVAS_MAX: usize = 3;
/// Highest tree level of a block. With 255 pointers per indirect block, 9 levels already
/// address more than 2^64 blocks; the margin keeps the bound simple.
pub const BLOCK_LEVEL_MAX: u8 = 15;
/// Largest logical or physical block size: the largest metadata block (a header plus
/// `META_PAYLOAD_BYTES_MAX`, rounded up to a sector).
pub const BLOCK_BYTES_MAX: u32 = round_up(
    META_HEADER_BYTES + META_PAYLOAD_BYTES_MAX,
    SECTOR_BYTES as usize,
) as u32;

/// Compression of a block's contents, stored in its block pointer (byte 50). The algorithm
/// only: a zstd level is a property of the writer, not needed to decompress. The codecs are in
/// `compress.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[repr(u8)]
pub enum Compression {
    /// Stored as is: `psize_bytes == lsize_bytes`.
    #[default]
    Off = 0,
    /// LZ4 block format (no frame), `psize_bytes` bytes decompress to `lsize_bytes`. Since
    /// format version 2.
    Lz4 = 1,
    /// One Zstandard frame. Since format version 2.
    Zstd = 2,
    /// Zero-length encoding: runs of zeros and literal runs (see `compress.rs`). Since format
    /// version 2.
    Zle = 3,
}

impl Compression {
    /// Name as shown and parsed by the CLI (`compression` property, without a level).
    pub const fn name(self) -> &'static str {
        match self {
            Compression::Off => "off",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Zle => "zle",
        }
    }
}

impl TryFrom<u8> for Compression {
    type Error = FormatError;

    fn try_from(value: u8) -> Result<Self, FormatError> {
        match value {
            0 => Ok(Compression::Off),
            1 => Ok(Compression::Lz4),
            2 => Ok(Compression::Zstd),
            3 => Ok(Compression::Zle),
            _ => Err(FormatError::BadField {
                field: "compression",
                value: u64::from(value),
            }),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Compression {
    type Err = crate::ParseNameError;

    fn from_str(s: &str) -> Result<Self, crate::ParseNameError> {
        match s {
            "off" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            "zle" => Ok(Compression::Zle),
            _ => Err(crate::ParseNameError {
                what: "compression",
                found: s.to_owned(),
                expected: "off, lz4, zstd, zle",
            }),
        }
    }
}

/// What a block holds, stored in its block pointer (and in the header of metadata blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum BlockType {
    /// Volume data (level 0 of a volume's block tree).
    Data = 1,
    /// Indirect block of a volume's block tree (level >= 1).
    Indirect = 2,
    /// The pool's `PoolMeta` block (pointed to by the uberblock).
    PoolMeta = 3,
    /// A space map chunk.
    SpaceMap = 4,
    /// An intent log block.
    Log = 5,
    /// The index of a metadata block too large for one allocation, stored in pieces: a
    /// metadata block whose payload is the pieces' block pointers, in order.
    MetaIndex = 6,
    /// A chunk of a deadlist: a metadata block whose payload is the block pointers of blocks
    /// a dataset killed while a snapshot still references them (format version 3).
    DeadList = 7,
    /// A chunk of a dataset's snapshot table: a metadata block whose payload is up to
    /// `TABLE_CHUNK_ENTRIES_MAX` snapshot records, oldest first (format version 4).
    SnapshotTable = 8,
    /// A chunk of a dataset's bookmark table: a metadata block whose payload is up to
    /// `TABLE_CHUNK_ENTRIES_MAX` bookmark records, oldest first (format version 4).
    BookmarkTable = 9,
    /// A chunk of the pool's command history: a metadata block whose payload is up to
    /// `TABLE_CHUNK_ENTRIES_MAX` history records, oldest first (format version 8).
    History = 10,
}

impl BlockType {
    /// Short name, for logs and the CLI.
    pub const fn name(self) -> &'static str {
        match self {
            BlockType::Data => "data",
            BlockType::Indirect => "indirect",
            BlockType::PoolMeta => "pool-meta",
            BlockType::SpaceMap => "space-map",
            BlockType::Log => "log",
            BlockType::MetaIndex => "meta-index",
            BlockType::DeadList => "deadlist",
            BlockType::SnapshotTable => "snapshot-table",
            BlockType::BookmarkTable => "bookmark-table",
            BlockType::History => "history",
        }
    }
}

impl TryFrom<u8> for BlockType {
    type Error = FormatError;

    fn try_from(value: u8) -> Result<Self, FormatError> {
        match value {
            1 => Ok(BlockType::Data),
            2 => Ok(BlockType::Indirect),
            3 => Ok(BlockType::PoolMeta),
            4 => Ok(BlockType::SpaceMap),
            5 => Ok(BlockType::Log),
            6 => Ok(BlockType::MetaIndex),
            7 => Ok(BlockType::DeadList),
            8 => Ok(BlockType::SnapshotTable),
            9 => Ok(BlockType::BookmarkTable),
            10 => Ok(BlockType::History),
            _ => Err(FormatError::BadField {
                field: "block_type",
                value: u64::from(value),
            }),
        }
    }
}

impl fmt::Display for BlockType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Data virtual address: where one copy of a block lives.
///
/// `offset_bytes` is a byte offset in the top-level vdev's allocatable space (0 = first byte
/// at `DATA_START_BYTES` on each leaf). Offsets and sizes are whole sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Dva {
    /// The top-level vdev holding this copy.
    pub vdev: VdevId,
    /// Byte offset in the top-level vdev's allocatable space; a multiple of `SECTOR_BYTES`.
    pub offset_bytes: u64,
    /// Bytes allocated for this copy (>= psize; more on raidz); a non-zero multiple of
    /// `SECTOR_BYTES`.
    pub asize_bytes: u32,
}

impl Dva {
    /// Size of an encoded DVA inside a block pointer.
    pub const ENCODED_BYTES: usize = 16;

    /// End (exclusive) of the allocated range, saturating (a valid DVA never overflows).
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes
            .saturating_add(u64::from(self.asize_bytes))
    }

    /// Checks what a DVA alone can tell: non-zero, sector-aligned size and offset, and no
    /// overflow. Whether the vdev exists and the range fits in it needs the vdev tree: see
    /// `VdevTreeConfig::check_dva`.
    pub fn validate(&self) -> Result<(), FormatError> {
        let asize_bytes = u64::from(self.asize_bytes);
        if asize_bytes == 0 || !asize_bytes.is_multiple_of(SECTOR_BYTES) {
            return Err(FormatError::BadField {
                field: "dva.asize_bytes",
                value: asize_bytes,
            });
        }
        if !self.offset_bytes.is_multiple_of(SECTOR_BYTES)
            || self.offset_bytes.checked_add(asize_bytes).is_none()
        {
            return Err(FormatError::BadField {
                field: "dva.offset_bytes",
                value: self.offset_bytes,
            });
        }
        Ok(())
    }

    fn encode(&self, out: &mut [u8]) {
        put_u64(out, 0, self.offset_bytes);
        put_u32(out, 8, self.asize_bytes);
        put_u32(out, 12, self.vdev.0);
    }

    fn decode(bytes: &[u8]) -> Result<Dva, FormatError> {
        Ok(Dva {
            offset_bytes: get_u64(bytes, 0)?,
            asize_bytes: get_u32(bytes, 8)?,
            vdev: VdevId(get_u32(bytes, 12)?),
        })
    }
}

// Byte offsets inside an encoded block pointer (see docs/format.md).
const OFF_DVAS: usize = 0;
const OFF_NDVAS: usize = 48;
const OFF_CHECKSUM_TYPE: usize = 49;
const OFF_COMPRESSION: usize = 50;
const OFF_BLOCK_TYPE: usize = 51;
const OFF_LEVEL: usize = 52;
const OFF_VERSION: usize = 53;
const OFF_RESERVED_A: usize = 54;
const OFF_LSIZE: usize = 56;
const OFF_PSIZE: usize = 60;
const OFF_BIRTH: usize = 64;
const OFF_FILL: usize = 72;
const OFF_CHECKSUM: usize = 80;
const OFF_RESERVED_B: usize = 112;

/// A pointer to a block: up to three copies, sizes, types, birth txg and the checksum of
/// the block's contents.
///
/// Encoded in exactly `BLOCK_PTR_BYTES` bytes. A hole (`ndvas == 0`) reads as zeros; the
/// canonical hole, [`BlockPtr::HOLE`], encodes as 128 zero bytes, so freshly zeroed indirect
/// blocks are all holes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockPtr {
    /// The copies; only the first `ndvas` are meaningful, the rest are zero.
    pub dvas: [Dva; 3],
    /// Number of copies; 0 for a hole.
    pub ndvas: u8,
    /// Logical size: the size of the block's contents once decompressed.
    pub lsize_bytes: u32,
    /// Physical size: the bytes stored (and checksummed) on disk.
    pub psize_bytes: u32,
    /// Algorithm of `checksum`.
    pub checksum_type: ChecksumType,
    /// Compression of the stored bytes.
    pub compression: Compression,
    /// What the block holds.
    pub block_type: BlockType,
    /// Tree level of the block pointed to: 0 for data and for all non-tree blocks, n for an
    /// indirect block of level n (whose children are at level n-1).
    pub level: u8,
    /// The txg in which the block was written.
    pub birth: Txg,
    /// Number of non-hole data blocks below (1 for a data block).
    pub fill: u64,
    /// Checksum of the `psize_bytes` bytes of the child block.
    pub checksum: Checksum,
}

impl Default for BlockPtr {
    /// A hole.
    fn default() -> Self {
        BlockPtr::HOLE
    }
}

const ZERO_DVA: Dva = Dva {
    vdev: VdevId(0),
    offset_bytes: 0,
    asize_bytes: 0,
};

impl BlockPtr {
    /// The canonical hole: all-zero encoding; `is_hole()` is true.
    pub const HOLE: BlockPtr = BlockPtr {
        dvas: [ZERO_DVA; 3],
        ndvas: 0,
        lsize_bytes: 0,
        psize_bytes: 0,
        checksum_type: ChecksumType::Xxh3_128,
        compression: Compression::Off,
        block_type: BlockType::Data,
        level: 0,
        birth: Txg(0),
        fill: 0,
        checksum: Checksum([0; 32]),
    };

    /// True for a hole (`ndvas == 0`): no block, reads as zeros.
    pub fn is_hole(&self) -> bool {
        self.ndvas == 0
    }

    /// The copies in use: `&self.dvas[..ndvas]` (empty for a hole, and for an invalid
    /// `ndvas > 3`, so this never panics).
    pub fn dvas(&self) -> &[Dva] {
        self.dvas.get(..usize::from(self.ndvas)).unwrap_or(&[])
    }

    /// Checks the invariants of a block pointer's fields (those `decode` enforces and `encode`
    /// asserts): `ndvas <= 3`; and unless it is a hole: every used DVA valid (see
    /// [`Dva::validate`]) and at least `psize_bytes` large, sizes in `1..=BLOCK_BYTES_MAX`,
    /// `psize == lsize` when uncompressed and `psize < lsize` when compressed, `level <= BLOCK_LEVEL_MAX`, level > 0 exactly for
    /// indirect blocks, and the unused half of an xxh3-128 checksum zero.
    pub fn validate(&self) -> Result<(), FormatError> {
        if usize::from(self.ndvas) > DVAS_MAX {
            return Err(FormatError::BadField {
                field: "ndvas",
                value: u64::from(self.ndvas),
            });
        }
        if self.is_hole() {
            return Ok(());
        }
        for (field, size) in [
            ("lsize_bytes", self.lsize_bytes),
            ("psize_bytes", self.psize_bytes),
        ] {
            if size == 0 || size > BLOCK_BYTES_MAX {
                return Err(FormatError::BadField {
                    field,
                    value: u64::from(size),
                });
            }
        }
        // Uncompressed: the stored bytes are the block. Compressed: stored only because it
        // saved space, so never as large as the block (a reader sizes its buffers by lsize).
        let psize_ok = match self.compression {
            Compression::Off => self.psize_bytes == self.lsize_bytes,
            _ => self.psize_bytes < self.lsize_bytes,
        };
        if !psize_ok {
            return Err(FormatError::BadField {
                field: "psize_bytes",
                value: u64::from(self.psize_bytes),
            });
        }
        for dva in self.dvas() {
            dva.validate()?;
            // A copy smaller than the block would make a reader run past its allocation.
            if dva.asize_bytes < self.psize_bytes {
                return Err(FormatError::BadField {
                    field: "dva.asize_bytes",
                    value: u64::from(dva.asize_bytes),
                });
            }
        }
        if self.level > BLOCK_LEVEL_MAX
            || (self.level > 0) != (self.block_type == BlockType::Indirect)
        {
            return Err(FormatError::BadField {
                field: "level",
                value: u64::from(self.level),
            });
        }
        if self.checksum_type == ChecksumType::Xxh3_128 && !all_zero(&self.checksum.0[16..]) {
            return Err(FormatError::BadField {
                field: "checksum",
                value: 0,
            });
        }
        Ok(())
    }

    /// Encodes into exactly `BLOCK_PTR_BYTES` bytes. `HOLE` encodes as zeros; DVA slots past
    /// `ndvas` are written as zeros whatever they hold.
    ///
    /// # Panics
    /// If [`BlockPtr::validate`] fails: a pointer that no decoder would accept must not be
    /// written.
    pub fn encode(&self, out: &mut [u8; BLOCK_PTR_BYTES]) {
        if let Err(err) = self.validate() {
            panic!("encoding an invalid block pointer ({err}): {self:?}");
        }
        out.fill(0);
        if *self == BlockPtr::HOLE {
            return;
        }
        for (i, dva) in self.dvas().iter().enumerate() {
            let start = OFF_DVAS + i * Dva::ENCODED_BYTES;
            dva.encode(&mut out[start..start + Dva::ENCODED_BYTES]);
        }
        put_u8(out, OFF_NDVAS, self.ndvas);
        put_u8(out, OFF_CHECKSUM_TYPE, self.checksum_type as u8);
        put_u8(out, OFF_COMPRESSION, self.compression as u8);
        put_u8(out, OFF_BLOCK_TYPE, self.block_type as u8);
        put_u8(out, OFF_LEVEL, self.level);
        put_u8(out, OFF_VERSION, BLOCK_PTR_VERSION);
        put_u32(out, OFF_LSIZE, self.lsize_bytes);
        put_u32(out, OFF_PSIZE, self.psize_bytes);
        put_u64(out, OFF_BIRTH, self.birth.0);
        put_u64(out, OFF_FILL, self.fill);
        put_bytes(out, OFF_CHECKSUM, &self.checksum.0);
    }

    /// Encodes into a new array (convenience for [`BlockPtr::encode`]).
    pub fn to_bytes(&self) -> [u8; BLOCK_PTR_BYTES] {
        let mut out = [0u8; BLOCK_PTR_BYTES];
        self.encode(&mut out);
        out
    }

    /// Decodes the first `BLOCK_PTR_BYTES` bytes of `bytes` (trailing bytes are ignored).
    /// 128 zero bytes decode to `HOLE`. Otherwise the version byte must be 1 or
    /// `BLOCK_PTR_VERSION` (2; a version 1 pointer is uncompressed), the enums known, reserved bytes and unused DVA slots zero, and
    /// [`BlockPtr::validate`] must pass.
    pub fn decode(bytes: &[u8]) -> Result<BlockPtr, FormatError> {
        need(bytes, BLOCK_PTR_BYTES)?;
        let bytes = &bytes[..BLOCK_PTR_BYTES];
        if all_zero(bytes) {
            return Ok(BlockPtr::HOLE);
        }
        let version = get_u8(bytes, OFF_VERSION)?;
        if !(BLOCK_PTR_VERSION_MIN..=BLOCK_PTR_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion {
                found: u32::from(version),
            });
        }
        let ndvas = get_u8(bytes, OFF_NDVAS)?;
        if usize::from(ndvas) > DVAS_MAX {
            return Err(FormatError::BadField {
                field: "ndvas",
                value: u64::from(ndvas),
            });
        }
        let mut dvas = [ZERO_DVA; 3];
        for (i, dva) in dvas.iter_mut().enumerate() {
            let start = OFF_DVAS + i * Dva::ENCODED_BYTES;
            let end = start + Dva::ENCODED_BYTES;
            if i < usize::from(ndvas) {
                *dva = Dva::decode(&bytes[start..end])?;
            } else {
                check_reserved(bytes, start, end, "dvas (unused slot)")?;
            }
        }
        check_reserved(bytes, OFF_RESERVED_A, OFF_LSIZE, "reserved (54..56)")?;
        check_reserved(
            bytes,
            OFF_RESERVED_B,
            BLOCK_PTR_BYTES,
            "reserved (112..128)",
        )?;
        let ptr = BlockPtr {
            dvas,
            ndvas,
            lsize_bytes: get_u32(bytes, OFF_LSIZE)?,
            psize_bytes: get_u32(bytes, OFF_PSIZE)?,
            checksum_type: ChecksumType::try_from(get_u8(bytes, OFF_CHECKSUM_TYPE)?)?,
            compression: match get_u8(bytes, OFF_COMPRESSION)? {
                // Version 1 had no compression.
                c if version == 1 && c != 0 => {
                    return Err(FormatError::BadField {
                        field: "compression",
                        value: u64::from(c),
                    })
                }
                c => Compression::try_from(c)?,
            },
            block_type: BlockType::try_from(get_u8(bytes, OFF_BLOCK_TYPE)?)?,
            level: get_u8(bytes, OFF_LEVEL)?,
            birth: Txg(get_u64(bytes, OFF_BIRTH)?),
            fill: get_u64(bytes, OFF_FILL)?,
            checksum: Checksum(get_array(bytes, OFF_CHECKSUM)?),
        };
        ptr.validate()?;
        Ok(ptr)
    }
}

/// Serialized as its 128-byte encoding (a byte string), so the one encoding and its checks
/// hold wherever a block pointer is stored, including inside postcard payloads.
impl Serialize for BlockPtr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> Deserialize<'de> for BlockPtr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<BlockPtr, D::Error> {
        deserializer.deserialize_bytes(BlockPtrVisitor)
    }
}

struct BlockPtrVisitor;

impl BlockPtrVisitor {
    fn from_slice<E: de::Error>(bytes: &[u8]) -> Result<BlockPtr, E> {
        if bytes.len() != BLOCK_PTR_BYTES {
            return Err(E::invalid_length(bytes.len(), &"128 bytes"));
        }
        BlockPtr::decode(bytes).map_err(E::custom)
    }
}

impl<'de> Visitor<'de> for BlockPtrVisitor {
    type Value = BlockPtr;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a 128-byte encoded block pointer")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<BlockPtr, E> {
        Self::from_slice(bytes)
    }

    // Self-describing formats (JSON) hand bytes over as a sequence of numbers.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BlockPtr, A::Error> {
        let mut bytes = [0u8; BLOCK_PTR_BYTES];
        let mut len = 0usize;
        while let Some(byte) = seq.next_element::<u8>()? {
            if len == BLOCK_PTR_BYTES {
                return Err(de::Error::invalid_length(len + 1, &"128 bytes"));
            }
            bytes[len] = byte;
            len += 1;
        }
        Self::from_slice(&bytes[..len])
    }
}
