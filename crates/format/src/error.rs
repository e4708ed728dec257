//! The one error type of every decoder.

/// Why a byte buffer is not a valid on-disk structure.
///
/// Each variant's message is one line, suitable for a log or a CLI error.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum FormatError {
    /// The structure's bytes are all zero: nothing was ever written there (an unused
    /// uberblock slot, a label of a device that was never part of a pool).
    #[error("structure is empty (all bytes zero): never written")]
    Empty,
    /// The first 8 bytes are not this structure's magic: the bytes are something else, or
    /// a write landed in the wrong place.
    #[error("bad magic: expected {expected:#018x}, found {found:#018x}")]
    BadMagic {
        /// The magic this structure must start with.
        expected: u64,
        /// The 8 bytes found, read as a little-endian u64.
        found: u64,
    },
    /// The structure was written by a format version this build does not read.
    #[error(
        "unsupported format version {found} (this build reads versions 1 to {})",
        crate::FORMAT_VERSION
    )]
    UnsupportedVersion {
        /// The version stored in the structure.
        found: u32,
    },
    /// The stored checksum does not match the bytes: the structure is damaged.
    #[error("checksum mismatch: structure is damaged")]
    BadChecksum,
    /// The buffer is shorter than the structure (or than a length the structure claims).
    #[error("truncated: needed {needed} bytes, got {got}")]
    Truncated {
        /// Bytes needed to decode.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// A field holds a value that is out of range or inconsistent with another field.
    #[error("invalid value {value} in field {field}")]
    BadField {
        /// Name of the field, as in `docs/format.md`.
        field: &'static str,
        /// The value found (truncated or widened to u64).
        value: u64,
    },
    /// The stored bytes of a compressed block do not decompress to exactly its logical size
    /// (a damaged block whose checksum was not verified first, or a writer's bug).
    #[error("compressed block ({compression}) does not decompress to its size (at {value})")]
    BadCompressedData {
        /// The algorithm, by name.
        compression: &'static str,
        /// Where decoding stopped, or the size it produced.
        value: u64,
    },
    /// The postcard payload of a label or a metadata block did not decode.
    #[error("bad payload: {0}")]
    Payload(String),
}
