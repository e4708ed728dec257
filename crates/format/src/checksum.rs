//! Checksums of block contents and of self-checksummed structures.

use crate::FormatError;
use oxpool_xxh3::xxh3_128;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use xxhash_rust::xxh3::Xxh3Default;

/// Checksum algorithm of a block, stored in its block pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[repr(u8)]
pub enum ChecksumType {
    /// xxh3 with a 128-bit result: the default (36 to 114 GB/s per core, by the CPU's vector
    /// unit: `oxpool-xxh3`). Not cryptographic: it detects media and software damage, not a
    /// deliberate forgery.
    #[default]
    Xxh3_128 = 1,
    /// BLAKE3 with a 256-bit result: cryptographic, slower.
    Blake3 = 2,
}

impl ChecksumType {
    /// Name as shown and parsed by the CLI's `checksum` property.
    pub const fn name(self) -> &'static str {
        match self {
            ChecksumType::Xxh3_128 => "xxh3-128",
            ChecksumType::Blake3 => "blake3",
        }
    }
}

impl TryFrom<u8> for ChecksumType {
    type Error = FormatError;

    fn try_from(value: u8) -> Result<Self, FormatError> {
        match value {
            1 => Ok(ChecksumType::Xxh3_128),
            2 => Ok(ChecksumType::Blake3),
            _ => Err(FormatError::BadField {
                field: "checksum_type",
                value: u64::from(value),
            }),
        }
    }
}

impl fmt::Display for ChecksumType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChecksumType {
    type Err = ParseNameError;

    fn from_str(s: &str) -> Result<Self, ParseNameError> {
        match s {
            "xxh3-128" => Ok(ChecksumType::Xxh3_128),
            "blake3" => Ok(ChecksumType::Blake3),
            _ => Err(ParseNameError {
                what: "checksum type",
                found: s.to_owned(),
                expected: "xxh3-128, blake3",
            }),
        }
    }
}

/// A property value that names no known variant (for example `checksum=sha1`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {found:?} (expected one of: {expected})")]
pub struct ParseNameError {
    /// What was being parsed, e.g. "checksum type".
    pub what: &'static str,
    /// The string that did not parse.
    pub found: String,
    /// The accepted names, comma separated.
    pub expected: &'static str,
}

/// A checksum value: 32 bytes, large enough for every supported algorithm.
/// xxh3-128 fills the first 16 bytes (the u128 result, little-endian) and leaves the rest zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Checksum(pub [u8; 32]);

/// Lower-case hex, 64 digits, the way the CLI prints it.
impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// Computes the checksum of `data` with the algorithm `kind`.
pub fn checksum(kind: ChecksumType, data: &[u8]) -> Checksum {
    let mut out = [0u8; 32];
    match kind {
        ChecksumType::Xxh3_128 => out[..16].copy_from_slice(&xxh3_128(data).to_le_bytes()),
        ChecksumType::Blake3 => out.copy_from_slice(blake3::hash(data).as_bytes()),
    }
    Checksum(out)
}

/// The checksum of the concatenation of `parts` (without building it): equal to
/// [`checksum`] of the bytes laid end to end. For data held in pieces, such as the data
/// columns of a raidz block.
pub fn checksum_parts<'a>(
    kind: ChecksumType,
    parts: impl IntoIterator<Item = &'a [u8]>,
) -> Checksum {
    let mut out = [0u8; 32];
    match kind {
        ChecksumType::Xxh3_128 => {
            let mut h = Xxh3Default::new();
            for p in parts {
                h.update(p);
            }
            out[..16].copy_from_slice(&h.digest128().to_le_bytes());
        }
        ChecksumType::Blake3 => {
            let mut h = blake3::Hasher::new();
            for p in parts {
                h.update(p);
            }
            out.copy_from_slice(h.finalize().as_bytes());
        }
    }
    Checksum(out)
}

/// Size of the self-checksum field of the headered structures (an xxh3-128 value).
pub(crate) const SELF_CHECKSUM_BYTES: usize = 16;

/// xxh3-128 of `covered`, with the `SELF_CHECKSUM_BYTES` at `field_offset` read as zeros.
///
/// A structure that checksums itself must exclude its own checksum field; hashing the field
/// as zeros (rather than skipping it) keeps the rule the same for every structure and lets
/// the header, including magic, version and lengths, be covered too.
pub(crate) fn self_checksum(covered: &[u8], field_offset: usize) -> [u8; SELF_CHECKSUM_BYTES] {
    let mut hasher = Xxh3Default::new();
    hasher.update(&covered[..field_offset]);
    hasher.update(&[0u8; SELF_CHECKSUM_BYTES]);
    hasher.update(&covered[field_offset + SELF_CHECKSUM_BYTES..]);
    hasher.digest128().to_le_bytes()
}

/// Writes the self-checksum of `covered` into its field at `field_offset`.
pub(crate) fn put_self_checksum(covered: &mut [u8], field_offset: usize) {
    let sum = self_checksum(covered, field_offset);
    covered[field_offset..field_offset + SELF_CHECKSUM_BYTES].copy_from_slice(&sum);
}

/// Checks the self-checksum of `covered` stored at `field_offset`. The caller has already
/// checked that `covered` holds the field.
pub(crate) fn verify_self_checksum(covered: &[u8], field_offset: usize) -> Result<(), FormatError> {
    let stored = &covered[field_offset..field_offset + SELF_CHECKSUM_BYTES];
    if self_checksum(covered, field_offset) != stored {
        return Err(FormatError::BadChecksum);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_parts_is_that_of_the_whole() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for kind in [ChecksumType::Xxh3_128, ChecksumType::Blake3] {
            let whole = checksum(kind, &data);
            for cut in [0, 1, 240, 4096, 9_999, 10_000] {
                let (a, b) = data.split_at(cut);
                assert_eq!(checksum_parts(kind, [a, b]), whole);
                assert_eq!(checksum_parts(kind, [a, &[][..], b]), whole);
            }
            assert_ne!(checksum_parts(kind, [&data[..9_999]]), whole);
        }
    }

    #[test]
    fn xxh3_fills_the_first_half_only() {
        let sum = checksum(ChecksumType::Xxh3_128, b"hello");
        assert_eq!(&sum.0[..16], &xxh3_128(b"hello").to_le_bytes());
        assert_eq!(&sum.0[16..], &[0u8; 16]);
    }

    #[test]
    fn blake3_fills_all() {
        let sum = checksum(ChecksumType::Blake3, b"hello");
        assert_eq!(&sum.0, blake3::hash(b"hello").as_bytes());
    }

    #[test]
    fn names_round_trip() {
        for kind in [ChecksumType::Xxh3_128, ChecksumType::Blake3] {
            assert_eq!(kind.to_string().parse::<ChecksumType>(), Ok(kind));
            assert_eq!(ChecksumType::try_from(kind as u8), Ok(kind));
        }
        assert!("sha256".parse::<ChecksumType>().is_err());
        assert!(ChecksumType::try_from(0).is_err());
        assert!(ChecksumType::try_from(3).is_err());
        assert_eq!(ChecksumType::default(), ChecksumType::Xxh3_128);
    }

    #[test]
    fn self_checksum_ignores_its_field_only() {
        let mut buf = vec![7u8; 100];
        put_self_checksum(&mut buf, 16);
        assert!(verify_self_checksum(&buf, 16).is_ok());
        buf[99] ^= 1;
        assert_eq!(
            verify_self_checksum(&buf, 16),
            Err(FormatError::BadChecksum)
        );
        buf[99] ^= 1;
        buf[20] ^= 1;
        assert_eq!(
            verify_self_checksum(&buf, 16),
            Err(FormatError::BadChecksum)
        );
    }
}
