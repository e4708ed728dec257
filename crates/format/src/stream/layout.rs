//! Byte offsets of the record header, and the little-endian field access on it.
//!
//! Every record starts with a header of [`RECORD_HEADER_BYTES`]; the fields of each record
//! type live in the same 80-byte area. The tables are in `docs/format.md` ("Send streams").

use oxpool_xxh3::xxh3_128;

/// Size of every record header.
pub const RECORD_HEADER_BYTES: usize = 128;

/// The 8 bytes every record starts with (ASCII `oxpSTREM`), as a little-endian `u64`.
pub const STREAM_MAGIC: u64 = u64::from_le_bytes(*b"oxpSTREM");

/// A record header as it travels.
pub type RecordHeader = [u8; RECORD_HEADER_BYTES];

pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const TYPE_AT: usize = 8;
pub(crate) const PAYLOAD_BYTES_AT: usize = 12;
/// End of the per-type field area, which starts at byte 16.
pub(crate) const FIELDS_END: usize = 96;
pub(crate) const PAYLOAD_CHECKSUM_AT: usize = 96;
pub(crate) const STREAM_CHECKSUM_AT: usize = 112;

// BEGIN.
pub(crate) const BEGIN_VERSION_AT: usize = 16;
pub(crate) const BEGIN_VOLBLOCKSIZE_AT: usize = 20;
pub(crate) const BEGIN_FEATURES_AT: usize = 24;
pub(crate) const BEGIN_VOLSIZE_AT: usize = 32;
pub(crate) const BEGIN_POOL_GUID_AT: usize = 40;
pub(crate) const BEGIN_VOLUME_ID_AT: usize = 48;
pub(crate) const BEGIN_TOGUID_AT: usize = 56;
pub(crate) const BEGIN_FROMGUID_AT: usize = 64;
pub(crate) const BEGIN_CREATION_TXG_AT: usize = 72;
pub(crate) const BEGIN_CREATION_TIME_AT: usize = 80;
pub(crate) const BEGIN_RESUME_OFFSET_AT: usize = 88;

// DATA.
pub(crate) const DATA_OFFSET_AT: usize = 16;
pub(crate) const DATA_LSIZE_AT: usize = 24;
pub(crate) const DATA_COMPRESSION_AT: usize = 28;
pub(crate) const DATA_CHECKSUM_TYPE_AT: usize = 29;
/// Two reserved bytes at 30..32.
pub(crate) const DATA_CHECKSUM_AT: usize = 32;
/// Reserved from here to the end of the field area.
pub(crate) const DATA_FIELDS_END: usize = 64;

// FREE.
pub(crate) const FREE_OFFSET_AT: usize = 16;
pub(crate) const FREE_LENGTH_AT: usize = 24;
pub(crate) const FREE_FIELDS_END: usize = 32;

// SET_SIZE.
pub(crate) const SET_SIZE_VOLSIZE_AT: usize = 16;
pub(crate) const SET_SIZE_FIELDS_END: usize = 24;

// END.
pub(crate) const END_TOGUID_AT: usize = 16;
pub(crate) const END_FIELDS_END: usize = 24;

/// The type of a record (header bytes 8..12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RecordType {
    /// The stream's header: what is sent, from where, with which features.
    Begin = 1,
    /// One block of the volume, as stored.
    Data = 2,
    /// A range that reads as zeros (trimmed, zeroed or never written since the base).
    Free = 3,
    /// The volume's size changed since the base.
    SetSize = 4,
    /// The end of the stream; its running checksum is the stream's.
    End = 5,
}

impl RecordType {
    /// The name `oxpool stream dump` prints.
    pub const fn name(self) -> &'static str {
        match self {
            RecordType::Begin => "BEGIN",
            RecordType::Data => "DATA",
            RecordType::Free => "FREE",
            RecordType::SetSize => "SET_SIZE",
            RecordType::End => "END",
        }
    }

    pub(crate) const fn from_wire(value: u32) -> Option<RecordType> {
        Some(match value {
            1 => RecordType::Begin,
            2 => RecordType::Data,
            3 => RecordType::Free,
            4 => RecordType::SetSize,
            5 => RecordType::End,
            _ => return None,
        })
    }

    /// End of the fields this type uses in the field area; the rest up to `FIELDS_END` is
    /// reserved (zero).
    pub(crate) const fn fields_end(self) -> usize {
        match self {
            RecordType::Begin => FIELDS_END,
            RecordType::Data => DATA_FIELDS_END,
            RecordType::Free => FREE_FIELDS_END,
            RecordType::SetSize => SET_SIZE_FIELDS_END,
            RecordType::End => END_FIELDS_END,
        }
    }
}

/// A header with the magic, type and payload size set, everything else zero.
pub(crate) fn new_header(kind: RecordType, payload_bytes: u32) -> RecordHeader {
    let mut header = [0u8; RECORD_HEADER_BYTES];
    put_u64(&mut header, MAGIC_AT, STREAM_MAGIC);
    put_u32(&mut header, TYPE_AT, kind as u32);
    put_u32(&mut header, PAYLOAD_BYTES_AT, payload_bytes);
    header
}

/// The payload checksum: xxh3-128 of the payload (of nothing, for records without one).
pub(crate) fn payload_checksum(payload: &[u8]) -> u128 {
    xxh3_128(payload)
}

// The offsets below are constants of this file, all within the 128-byte header, so the
// slices cannot be out of range: the conversions are to fixed-size arrays of their length.

pub(crate) fn get_u8(header: &RecordHeader, at: usize) -> u8 {
    header[at]
}

pub(crate) fn get_u32(header: &RecordHeader, at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&header[at..at + 4]);
    u32::from_le_bytes(bytes)
}

pub(crate) fn get_u64(header: &RecordHeader, at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&header[at..at + 8]);
    u64::from_le_bytes(bytes)
}

pub(crate) fn get_u128(header: &RecordHeader, at: usize) -> u128 {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&header[at..at + 16]);
    u128::from_le_bytes(bytes)
}

pub(crate) fn get_bytes<const N: usize>(header: &RecordHeader, at: usize) -> [u8; N] {
    let mut bytes = [0u8; N];
    bytes.copy_from_slice(&header[at..at + N]);
    bytes
}

pub(crate) fn put_u8(header: &mut RecordHeader, at: usize, value: u8) {
    header[at] = value;
}

pub(crate) fn put_u32(header: &mut RecordHeader, at: usize, value: u32) {
    header[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(header: &mut RecordHeader, at: usize, value: u64) {
    header[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u128(header: &mut RecordHeader, at: usize, value: u128) {
    header[at..at + 16].copy_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_bytes(header: &mut RecordHeader, at: usize, value: &[u8]) {
    header[at..at + value.len()].copy_from_slice(value);
}
