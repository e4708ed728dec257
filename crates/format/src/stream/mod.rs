//! Send streams: the bytes `oxpool send` writes and `oxpool recv` reads, as a pure codec.
//!
//! A stream is a run of records, each a 128-byte header and an optional payload:
//!
//! ```text
//! BEGIN (name)  [SET_SIZE]  { DATA (block) | FREE }*  END
//! ```
//!
//! - BEGIN says what is sent: the snapshot (`toguid`, name, creation txg), the base of an
//!   incremental (`fromguid`, 0 for a full stream), the volume's size and block size, the
//!   sender's pool and volume, the feature bits (a decoder refuses bits it does not know),
//!   and where a resumed stream starts.
//! - DATA carries one block as stored (compressed or not) with its checksum, so the receiver
//!   verifies it and stores it without recompressing; FREE a block-aligned range that reads
//!   as zeros since the base (trims, write-zeroes, holes); SET_SIZE the new size of a volume
//!   resized since the base; END closes the stream.
//! - Integrity: every header carries the xxh3-128 of its payload and the running xxh3-128 of
//!   every header before that field (so each header is checked before any length in it is
//!   used, and a lost, repeated or reordered record breaks the chain; the payloads are bound
//!   into the chain by their checksums in the headers); END's running checksum is the whole
//!   stream's. No all-zero escape. Version 1 streams, whose running checksum also covers the
//!   payloads, are still read ([`STREAM_VERSION_MIN`]).
//!
//! [`StreamEncoder`] writes records (it panics on a record the decoder would refuse: a
//! sender bug must not leave the machine); [`StreamDecoder`] reads them incrementally,
//! sans-I/O: feed it bytes as they arrive, get each record once it is complete and verified.
//! It never panics, never allocates by a length it read (a payload buffer grows with the bytes
//! that actually arrive, up to the record type's bound), and reports damage, truncation,
//! unknown record types and unknown feature bits as a [`StreamError`] with the byte offset.
//! [`ResumeToken`] is what an interrupted receive hands back to `oxpool send -t`.
//!
//! Byte by byte: `docs/format.md`, "Send streams".

mod decoder;
mod encoder;
mod error;
mod layout;
mod rules;
mod token;

pub use decoder::{Decoded, StreamDecoder};
pub use encoder::StreamEncoder;
pub use error::{StreamError, StreamErrorKind};
pub use layout::{RecordHeader, RecordType, RECORD_HEADER_BYTES, STREAM_MAGIC};
pub use token::{ResumeToken, TokenError, RESUME_TOKEN_PREFIX, RESUME_TOKEN_VERSION};

use crate::{Checksum, ChecksumType, Compression, Guid, Txg, VolumeId};
use std::fmt;

/// The stream format version this build writes (BEGIN bytes 16..20). Independent of the
/// pool's format version.
///
/// - 1: the running checksum covers every stream byte (headers and payloads).
/// - 2: the running checksum covers the headers only; each header carries its payload's
///   checksum, so the payloads stay bound into the chain, and each payload is hashed once
///   (for an xxh3-128 block, the payload checksum is the block checksum).
pub const STREAM_VERSION: u32 = 2;

/// The oldest stream format version this build reads (and can write, for older receivers:
/// [`StreamEncoder::with_version`]). Every version from it to [`STREAM_VERSION`] is read.
pub const STREAM_VERSION_MIN: u32 = 1;

/// Longest snapshot name BEGIN carries (ZFS's limit for a full dataset name).
pub const STREAM_NAME_BYTES_MAX: usize = 256;

/// Smallest `volblocksize` a stream may declare.
pub const STREAM_BLOCK_BYTES_MIN: u32 = 512;

/// Largest `volblocksize` a stream may declare, and so the largest DATA payload: ZFS's
/// largest record size, well above what volumes use today (128 KiB), so that the format need
/// not change when they grow.
pub const STREAM_BLOCK_BYTES_MAX: u32 = 16 * 1024 * 1024;

/// The feature bits of a stream (BEGIN bytes 24..32). A decoder refuses a stream with a bit
/// it does not know: the bits say what a receiver must understand to apply the stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamFeatures(pub u64);

impl StreamFeatures {
    /// No features: uncompressed blocks, sent from the start.
    pub const NONE: StreamFeatures = StreamFeatures(0);
    /// DATA records may carry compressed blocks (`compression` other than off).
    pub const COMPRESSED: StreamFeatures = StreamFeatures(1 << 0);
    /// The stream continues an interrupted one: it starts at BEGIN's `resume_offset_bytes`.
    pub const RESUMING: StreamFeatures = StreamFeatures(1 << 1);
    /// Every bit this build knows.
    pub const KNOWN: StreamFeatures = StreamFeatures(0b11);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: StreamFeatures) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of bits.
    pub const fn union(self, other: StreamFeatures) -> StreamFeatures {
        StreamFeatures(self.0 | other.0)
    }

    /// The bits this build does not know (0: none).
    pub const fn unknown_bits(self) -> u64 {
        self.0 & !Self::KNOWN.0
    }
}

/// `0x3 (compressed,resuming)`, or `0x0` alone.
impl fmt::Display for StreamFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)?;
        let names: Vec<&str> = [
            (StreamFeatures::COMPRESSED, "compressed"),
            (StreamFeatures::RESUMING, "resuming"),
        ]
        .iter()
        .filter(|(bit, _)| self.contains(*bit))
        .map(|(_, name)| *name)
        .collect();
        if !names.is_empty() {
            write!(f, " ({})", names.join(","))?;
        }
        Ok(())
    }
}

/// A running checksum of the stream: xxh3-128, as stored (little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamChecksum(pub u128);

/// 32 lower-case hex digits of the stored bytes, in stream order.
impl fmt::Display for StreamChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0.to_le_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// The BEGIN record: what the stream carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamBegin {
    /// Feature bits; the decoder refuses unknown ones.
    pub features: StreamFeatures,
    /// The volume's size at the sent snapshot; a non-zero multiple of `volblocksize_bytes`.
    pub volsize_bytes: u64,
    /// The volume's block size: a power of two in
    /// `STREAM_BLOCK_BYTES_MIN..=STREAM_BLOCK_BYTES_MAX`.
    pub volblocksize_bytes: u32,
    /// The sending pool (non-zero).
    pub pool_guid: Guid,
    /// The sent volume's id in the sending pool.
    pub volume_id: VolumeId,
    /// The sent snapshot's guid (non-zero); the received snapshot keeps it.
    pub toguid: Guid,
    /// The base snapshot's (or bookmark's) guid for an incremental stream; `None` for a full
    /// stream. Never equal to `toguid`.
    pub fromguid: Option<Guid>,
    /// The txg that created the sent snapshot (at least 1).
    pub creation_txg: Txg,
    /// When the sent snapshot was created, ns since the Unix epoch (0: unknown).
    pub creation_time_ns: u64,
    /// Where a resumed stream starts (a multiple of `volblocksize_bytes`, at most
    /// `volsize_bytes`): no DATA or FREE record lies below it. 0 unless `RESUMING`.
    pub resume_offset_bytes: u64,
    /// The sent snapshot's full name, `pool/vol@snap`: 1 to `STREAM_NAME_BYTES_MAX` bytes of
    /// UTF-8 with one `@` and no control characters.
    pub name: String,
}

/// A DATA record: one volume block as the sender stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataRecord<'a> {
    /// Volume offset of the block: a multiple of `volblocksize_bytes`.
    pub offset_bytes: u64,
    /// Logical size: the volume's block size.
    pub lsize_bytes: u32,
    /// How `payload` is compressed (off: `payload` is the block itself).
    pub compression: Compression,
    /// The algorithm of `checksum`.
    pub checksum_type: ChecksumType,
    /// The checksum of `payload` (the stored bytes), as the sender's block pointer has it.
    pub checksum: Checksum,
    /// The stored bytes (`psize`): `lsize_bytes` of them uncompressed, fewer compressed.
    pub payload: &'a [u8],
}

/// One record of a stream, as the decoder hands it out (complete and verified).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamRecord<'a> {
    /// The stream's first record.
    Begin(&'a StreamBegin),
    /// One block.
    Data(DataRecord<'a>),
    /// `[offset_bytes, offset_bytes + length_bytes)` reads as zeros (block aligned).
    Free {
        /// Start of the range, a multiple of `volblocksize_bytes`.
        offset_bytes: u64,
        /// Length, a non-zero multiple of `volblocksize_bytes`.
        length_bytes: u64,
    },
    /// The volume was resized since the base: the target takes this size (BEGIN's
    /// `volsize_bytes`) before the records that follow.
    SetSize {
        /// The new size.
        volsize_bytes: u64,
    },
    /// The stream's last record.
    End {
        /// BEGIN's `toguid` again.
        toguid: Guid,
        /// The stream's checksum: the running checksum of every byte before END's field.
        checksum: StreamChecksum,
    },
}

impl StreamRecord<'_> {
    /// The record's type.
    pub fn record_type(&self) -> RecordType {
        match self {
            StreamRecord::Begin(_) => RecordType::Begin,
            StreamRecord::Data(_) => RecordType::Data,
            StreamRecord::Free { .. } => RecordType::Free,
            StreamRecord::SetSize { .. } => RecordType::SetSize,
            StreamRecord::End { .. } => RecordType::End,
        }
    }
}
