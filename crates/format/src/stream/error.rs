//! Why a byte stream is not a valid send stream, and where.

use std::fmt;

/// A send stream that does not decode: what is wrong and at which byte of the stream.
///
/// Displayed on one line, e.g. `byte 4224: record header checksum mismatch (the stream is
/// damaged)`, for `oxpool stream dump` and `oxpool recv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamError {
    /// Offset in the stream of the first byte found wrong: the field at fault, the start of
    /// the damaged header or payload, or for a truncated stream its length.
    pub offset_bytes: u64,
    /// What is wrong.
    pub kind: StreamErrorKind,
}

impl StreamError {
    pub(crate) fn new(offset_bytes: u64, kind: StreamErrorKind) -> StreamError {
        StreamError { offset_bytes, kind }
    }
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "byte {}: {}", self.offset_bytes, self.kind)
    }
}

impl std::error::Error for StreamError {}

/// The ways a send stream can be wrong (see `docs/format.md`, "Send streams").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamErrorKind {
    /// The first 8 bytes are not the stream magic: this is not an oxpool send stream.
    NotAStream,
    /// A record after the first does not start with the stream magic: the stream is damaged
    /// or out of step.
    BadMagic,
    /// The stream was written by a version of the stream format this build does not read.
    UnsupportedVersion {
        /// The version in the BEGIN record.
        found: u32,
    },
    /// BEGIN asks for features this build does not know.
    UnknownFeatures {
        /// The unknown bits.
        bits: u64,
    },
    /// A record type this build does not know (under a valid checksum: a newer writer).
    UnknownRecordType {
        /// The type found.
        found: u32,
    },
    /// A record header does not match the running checksum: damaged, or bytes lost or added
    /// before it.
    HeaderChecksum,
    /// A record's payload does not match the checksum in its header.
    PayloadChecksum,
    /// A DATA record's block does not match its block checksum.
    BlockChecksum,
    /// A field holds a value out of range or inconsistent with the stream.
    BadField {
        /// Name of the field, as in `docs/format.md`.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A record claims a payload larger than its type allows.
    PayloadTooLarge {
        /// The record type's name.
        record: &'static str,
        /// The claimed payload size.
        payload_bytes: u32,
        /// The largest this record may carry in this stream.
        max_bytes: u32,
    },
    /// BEGIN's snapshot name is not a valid name.
    BadName {
        /// Why.
        reason: &'static str,
    },
    /// A record where it may not be (a second BEGIN, data going backwards, ...).
    OutOfOrder {
        /// What the rule is.
        rule: &'static str,
    },
    /// The stream ends before its END record.
    Truncated {
        /// Where it ends: "in a record header", "in a payload", "before END".
        inside: &'static str,
    },
    /// Bytes follow the END record.
    TrailingBytes,
}

impl fmt::Display for StreamErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamErrorKind::NotAStream => f.write_str("not an oxpool send stream (bad magic)"),
            StreamErrorKind::BadMagic => {
                f.write_str("record does not start with the stream magic (the stream is damaged)")
            }
            StreamErrorKind::UnsupportedVersion { found } => write!(
                f,
                "stream format version {found} is not supported (this build reads versions \
                 {} to {})",
                super::STREAM_VERSION_MIN,
                super::STREAM_VERSION
            ),
            StreamErrorKind::UnknownFeatures { bits } => {
                write!(f, "unknown stream feature bits {bits:#x}")
            }
            StreamErrorKind::UnknownRecordType { found } => {
                write!(f, "unknown record type {found}")
            }
            StreamErrorKind::HeaderChecksum => {
                f.write_str("record header checksum mismatch (the stream is damaged)")
            }
            StreamErrorKind::PayloadChecksum => {
                f.write_str("payload checksum mismatch (the stream is damaged)")
            }
            StreamErrorKind::BlockChecksum => {
                f.write_str("block checksum mismatch (the sender sent a damaged block)")
            }
            StreamErrorKind::BadField { field, value } => {
                write!(f, "invalid value {value} in field {field}")
            }
            StreamErrorKind::PayloadTooLarge {
                record,
                payload_bytes,
                max_bytes,
            } => write!(
                f,
                "{record} record claims {payload_bytes} payload bytes (at most {max_bytes})"
            ),
            StreamErrorKind::BadName { reason } => write!(f, "bad snapshot name: {reason}"),
            StreamErrorKind::OutOfOrder { rule } => write!(f, "record out of order: {rule}"),
            StreamErrorKind::Truncated { inside } => {
                write!(f, "the stream is truncated: it ends {inside}")
            }
            StreamErrorKind::TrailingBytes => f.write_str("bytes after the END record"),
        }
    }
}
