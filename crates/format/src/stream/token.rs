//! Resume tokens: where an interrupted receive stopped, as a string the user hands to
//! `oxpool send -t TOKEN`.
//!
//! The token is not a secret and not an authenticator: its checksum catches a token that was
//! cut, mistyped or edited by hand, and its version one written by another build; the sender
//! still checks the guids against its snapshots (a token whose snapshot was destroyed since is
//! refused there).

use std::fmt;
use std::str::FromStr;

use xxhash_rust::xxh3::Xxh3Default;

use super::StreamFeatures;
use crate::Guid;

/// The version of the token layout this build writes and reads.
pub const RESUME_TOKEN_VERSION: u32 = 1;

/// What every token starts with: `oxp`, the version in decimal, `-`.
pub const RESUME_TOKEN_PREFIX: &str = "oxp1-";

/// Bytes of a version 1 token before hex: 40 of fields and 16 of checksum.
const TOKEN_BYTES: usize = 56;
const FIELDS_BYTES: usize = 40;

/// Hashed before the fields, so a token's checksum never matches another structure's.
const DOMAIN: &[u8] = b"oxpool resume token";

/// Where a receive stopped, so the sender can continue from there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumeToken {
    /// The snapshot being sent.
    pub toguid: Guid,
    /// Its base, for an incremental stream.
    pub fromguid: Option<Guid>,
    /// Every block below this volume offset was received: the resumed stream starts here.
    pub offset_bytes: u64,
    /// The interrupted stream's features (the resumed one has the same, plus `RESUMING`).
    pub features: StreamFeatures,
}

/// Why a string is not a valid resume token. One line each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// It does not start like an oxpool token.
    #[error("not an oxpool resume token (they start with \"oxp1-\")")]
    NotAToken,
    /// Written by another version of the token layout.
    #[error("resume token version {found} is not supported (this build reads version 1)")]
    UnsupportedVersion {
        /// The version in the token's prefix, as written.
        found: String,
    },
    /// Not the right number of hex digits, or not hex.
    #[error("malformed resume token: {0}")]
    Malformed(&'static str),
    /// The checksum does not match: a token cut short, mistyped or edited.
    #[error("resume token checksum mismatch: the token is damaged or was edited")]
    BadChecksum,
    /// A field out of range under a valid checksum (a writer's bug).
    #[error("invalid resume token: bad {0}")]
    BadField(&'static str),
}

fn checksum(fields: &[u8]) -> [u8; 16] {
    let mut hasher = Xxh3Default::new();
    hasher.update(DOMAIN);
    hasher.update(&RESUME_TOKEN_VERSION.to_le_bytes());
    hasher.update(fields);
    hasher.digest128().to_le_bytes()
}

impl ResumeToken {
    /// The token's bytes (before hex): toguid, fromguid (0: full), offset, features, 8 zero
    /// bytes, then the checksum.
    fn to_bytes(self) -> [u8; TOKEN_BYTES] {
        let mut bytes = [0u8; TOKEN_BYTES];
        bytes[0..8].copy_from_slice(&self.toguid.0.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.fromguid.map_or(0, |g| g.0).to_le_bytes());
        bytes[16..24].copy_from_slice(&self.offset_bytes.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.features.0.to_le_bytes());
        let sum = checksum(&bytes[..FIELDS_BYTES]);
        bytes[FIELDS_BYTES..].copy_from_slice(&sum);
        bytes
    }
}

/// `oxp1-` and 112 lower-case hex digits.
impl fmt::Display for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(RESUME_TOKEN_PREFIX)?;
        for byte in self.to_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for ResumeToken {
    type Err = TokenError;

    fn from_str(text: &str) -> Result<ResumeToken, TokenError> {
        let text = text.trim();
        let rest = text.strip_prefix("oxp").ok_or(TokenError::NotAToken)?;
        let (version, hex) = rest.split_once('-').ok_or(TokenError::NotAToken)?;
        if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TokenError::NotAToken);
        }
        if version != RESUME_TOKEN_VERSION.to_string() {
            // Bounded: a version is a few digits; anything longer is shown cut.
            let found = version.chars().take(12).collect();
            return Err(TokenError::UnsupportedVersion { found });
        }
        if hex.len() != 2 * TOKEN_BYTES {
            return Err(TokenError::Malformed("wrong length"));
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            match (digit(pair[0]), digit(pair[1])) {
                (Some(high), Some(low)) => *byte = high << 4 | low,
                _ => return Err(TokenError::Malformed("not lower-case hex")),
            }
        }
        if checksum(&bytes[..FIELDS_BYTES]) != bytes[FIELDS_BYTES..] {
            return Err(TokenError::BadChecksum);
        }
        let field = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let toguid = Guid(field(0));
        let fromguid = field(8);
        let features = StreamFeatures(field(24));
        if toguid.0 == 0 {
            return Err(TokenError::BadField("toguid"));
        }
        if fromguid == toguid.0 {
            return Err(TokenError::BadField("fromguid"));
        }
        if features.unknown_bits() != 0 {
            return Err(TokenError::BadField("features"));
        }
        if field(32) != 0 {
            return Err(TokenError::BadField("reserved"));
        }
        Ok(ResumeToken {
            toguid,
            fromguid: (fromguid != 0).then_some(Guid(fromguid)),
            offset_bytes: field(16),
            features,
        })
    }
}
