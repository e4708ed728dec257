//! The rules a stream obeys beyond its checksums, shared by the encoder (which panics on a
//! violation: a sender bug) and the decoder (which returns it as an error).

use super::error::StreamErrorKind;
use super::layout::*;
use super::{
    StreamBegin, StreamFeatures, STREAM_BLOCK_BYTES_MAX, STREAM_BLOCK_BYTES_MIN,
    STREAM_NAME_BYTES_MAX,
};
use crate::{Checksum, ChecksumType, Compression, Guid};

/// A DATA record's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DataFields {
    pub(crate) offset_bytes: u64,
    pub(crate) lsize_bytes: u32,
    pub(crate) compression: Compression,
    pub(crate) checksum_type: ChecksumType,
    pub(crate) checksum: Checksum,
    /// The payload's length: the block's stored size.
    pub(crate) psize_bytes: u32,
}

/// A rule broken by a field of a record header: the field's offset in the header and what.
#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) at: usize,
    pub(crate) kind: StreamErrorKind,
}

fn bad(at: usize, field: &'static str, value: u64) -> Violation {
    Violation {
        at,
        kind: StreamErrorKind::BadField { field, value },
    }
}

fn order(at: usize, rule: &'static str) -> Violation {
    Violation {
        at,
        kind: StreamErrorKind::OutOfOrder { rule },
    }
}

/// BEGIN's fields, without the name (which is its payload).
pub(crate) fn check_begin(begin: &StreamBegin) -> Result<(), Violation> {
    let unknown = begin.features.unknown_bits();
    if unknown != 0 {
        return Err(Violation {
            at: BEGIN_FEATURES_AT,
            kind: StreamErrorKind::UnknownFeatures { bits: unknown },
        });
    }
    let bs = begin.volblocksize_bytes;
    if !bs.is_power_of_two() || !(STREAM_BLOCK_BYTES_MIN..=STREAM_BLOCK_BYTES_MAX).contains(&bs) {
        return Err(bad(BEGIN_VOLBLOCKSIZE_AT, "volblocksize", u64::from(bs)));
    }
    let size = begin.volsize_bytes;
    if size == 0 || !size.is_multiple_of(u64::from(bs)) || size > crate::VOLSIZE_MAX_BYTES {
        return Err(bad(BEGIN_VOLSIZE_AT, "volsize", size));
    }
    if begin.pool_guid == Guid(0) {
        return Err(bad(BEGIN_POOL_GUID_AT, "pool_guid", 0));
    }
    if begin.toguid == Guid(0) {
        return Err(bad(BEGIN_TOGUID_AT, "toguid", 0));
    }
    if let Some(from) = begin.fromguid {
        // Guid(0) cannot be a base: it means "full stream" on the wire.
        if from == begin.toguid || from == Guid(0) {
            return Err(bad(BEGIN_FROMGUID_AT, "fromguid", from.0));
        }
    }
    if begin.creation_txg.0 == 0 {
        return Err(bad(BEGIN_CREATION_TXG_AT, "creation_txg", 0));
    }
    let resume = begin.resume_offset_bytes;
    let resume_ok = if begin.features.contains(StreamFeatures::RESUMING) {
        resume.is_multiple_of(u64::from(bs)) && resume <= size
    } else {
        resume == 0
    };
    if !resume_ok {
        return Err(bad(BEGIN_RESUME_OFFSET_AT, "resume_offset", resume));
    }
    Ok(())
}

/// BEGIN's payload: the snapshot's full name.
pub(crate) fn check_name(bytes: &[u8]) -> Result<&str, &'static str> {
    if bytes.is_empty() {
        return Err("empty");
    }
    if bytes.len() > STREAM_NAME_BYTES_MAX {
        return Err("too long");
    }
    let name = std::str::from_utf8(bytes).map_err(|_| "not UTF-8")?;
    // Control characters would reach a terminal through `stream dump`.
    if name.chars().any(char::is_control) {
        return Err("control character");
    }
    if name.matches('@').count() != 1 || name.starts_with('@') || name.ends_with('@') {
        return Err("not POOL/VOL@SNAP");
    }
    Ok(name)
}

/// The state a stream's records are checked against, from BEGIN on.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    volsize_bytes: u64,
    volblocksize_bytes: u32,
    features: StreamFeatures,
    incremental: bool,
    toguid: Guid,
    /// DATA and FREE records go forward: each starts at or after the end of the previous one
    /// (or the resume offset).
    cursor_bytes: u64,
    /// A DATA or FREE record was seen (SET_SIZE must come before them).
    data_seen: bool,
    set_size_seen: bool,
}

impl Rules {
    /// After a BEGIN that passed [`check_begin`].
    pub(crate) fn new(begin: &StreamBegin) -> Rules {
        Rules {
            volsize_bytes: begin.volsize_bytes,
            volblocksize_bytes: begin.volblocksize_bytes,
            features: begin.features,
            incremental: begin.fromguid.is_some(),
            toguid: begin.toguid,
            cursor_bytes: begin.resume_offset_bytes,
            data_seen: false,
            set_size_seen: false,
        }
    }

    /// The largest payload a record of `kind` may carry in this stream.
    pub(crate) fn payload_max_bytes(&self, kind: RecordType) -> u32 {
        match kind {
            RecordType::Begin => STREAM_NAME_BYTES_MAX as u32,
            RecordType::Data => self.volblocksize_bytes,
            RecordType::Free | RecordType::SetSize | RecordType::End => 0,
        }
    }

    /// Where the next DATA or FREE record may start.
    pub(crate) fn cursor_bytes(&self) -> u64 {
        self.cursor_bytes
    }

    /// A DATA record's header fields.
    pub(crate) fn data(&mut self, data: &DataFields) -> Result<(), Violation> {
        let bs = u64::from(self.volblocksize_bytes);
        let offset = data.offset_bytes;
        if !offset.is_multiple_of(bs) || offset >= self.volsize_bytes {
            return Err(bad(DATA_OFFSET_AT, "offset", offset));
        }
        if offset < self.cursor_bytes {
            return Err(order(
                DATA_OFFSET_AT,
                "DATA and FREE records go forward and do not overlap",
            ));
        }
        if data.lsize_bytes != self.volblocksize_bytes {
            return Err(bad(DATA_LSIZE_AT, "lsize", u64::from(data.lsize_bytes)));
        }
        let psize = u64::from(data.psize_bytes);
        let lsize = u64::from(data.lsize_bytes);
        match data.compression {
            Compression::Off => {
                if psize != lsize {
                    return Err(bad(PAYLOAD_BYTES_AT, "payload_bytes", psize));
                }
            }
            compressed => {
                if !self.features.contains(StreamFeatures::COMPRESSED) {
                    return Err(bad(
                        DATA_COMPRESSION_AT,
                        "compression",
                        compressed as u8 as u64,
                    ));
                }
                // Stored compressed only when that saves space, as on disk.
                if psize == 0 || psize >= lsize {
                    return Err(bad(PAYLOAD_BYTES_AT, "payload_bytes", psize));
                }
            }
        }
        if data.checksum_type == ChecksumType::Xxh3_128 && data.checksum.0[16..] != [0u8; 16] {
            return Err(bad(DATA_CHECKSUM_AT + 16, "checksum", 0));
        }
        self.cursor_bytes = offset + lsize;
        self.data_seen = true;
        Ok(())
    }

    /// A FREE record's range.
    pub(crate) fn free(&mut self, offset: u64, length: u64) -> Result<(), Violation> {
        let bs = u64::from(self.volblocksize_bytes);
        if !offset.is_multiple_of(bs) || offset >= self.volsize_bytes {
            return Err(bad(FREE_OFFSET_AT, "offset", offset));
        }
        let end = offset.checked_add(length);
        if length == 0
            || !length.is_multiple_of(bs)
            || end.is_none_or(|end| end > self.volsize_bytes)
        {
            return Err(bad(FREE_LENGTH_AT, "length", length));
        }
        if offset < self.cursor_bytes {
            return Err(order(
                FREE_OFFSET_AT,
                "DATA and FREE records go forward and do not overlap",
            ));
        }
        self.cursor_bytes = offset + length;
        self.data_seen = true;
        Ok(())
    }

    /// A SET_SIZE record: once, in an incremental stream, before any DATA or FREE, to the
    /// size BEGIN announced.
    pub(crate) fn set_size(&mut self, volsize: u64) -> Result<(), Violation> {
        if !self.incremental {
            return Err(order(TYPE_AT, "SET_SIZE only in an incremental stream"));
        }
        if self.set_size_seen {
            return Err(order(TYPE_AT, "one SET_SIZE per stream"));
        }
        if self.data_seen {
            return Err(order(TYPE_AT, "SET_SIZE comes before DATA and FREE"));
        }
        if volsize != self.volsize_bytes {
            return Err(bad(SET_SIZE_VOLSIZE_AT, "volsize", volsize));
        }
        self.set_size_seen = true;
        Ok(())
    }

    /// The END record.
    pub(crate) fn end(&self, toguid: Guid) -> Result<(), Violation> {
        if toguid != self.toguid {
            return Err(bad(END_TOGUID_AT, "toguid", toguid.0));
        }
        Ok(())
    }
}
