//! Helpers shared by the format_* targets (included with `#[path]`, one copy per target).
//!
//! Random bytes almost never pass a magic and a checksum, so each target also "seals" its
//! input: it wraps the bytes in a valid header with a correct self-checksum, which lets the
//! fuzzer reach the field checks and the postcard payload decoders behind the checksum.
#![allow(dead_code)]

/// Writes the self-checksum of `covered` (xxh3-128 at bytes 16..32, hashed as zeros), the
/// rule every headered structure of format v1 follows.
pub fn reseal(covered: &mut [u8]) {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    hasher.update(&covered[..16]);
    hasher.update(&[0u8; 16]);
    hasher.update(&covered[32..]);
    covered[16..32].copy_from_slice(&hasher.digest128().to_le_bytes());
}

/// A header of `header_bytes` with magic and version 1, followed by `body` truncated or
/// zero-padded to `total_bytes - header_bytes`. The caller fills in its own header fields
/// and then calls `reseal`.
pub fn envelope(magic: u64, header_bytes: usize, total_bytes: usize, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; total_bytes];
    out[0..8].copy_from_slice(&magic.to_le_bytes());
    out[8..12].copy_from_slice(&oxpool_format::FORMAT_VERSION.to_le_bytes());
    let n = body.len().min(total_bytes - header_bytes);
    out[header_bytes..header_bytes + n].copy_from_slice(&body[..n]);
    out
}
