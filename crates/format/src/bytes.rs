//! Little-endian field access at explicit byte offsets.
//!
//! Getters are used on disk bytes, so they check bounds and return `Truncated` instead of
//! panicking. Putters are used by encoders on buffers they sized themselves, so an out of
//! range put is a bug in this crate and panics.

use crate::FormatError;

/// Checks that `buf` holds at least `needed` bytes.
pub(crate) fn need(buf: &[u8], needed: usize) -> Result<(), FormatError> {
    if buf.len() < needed {
        return Err(FormatError::Truncated {
            needed,
            got: buf.len(),
        });
    }
    Ok(())
}

/// Returns `buf[offset..offset + N]` as an array, or `Truncated`.
pub(crate) fn get_array<const N: usize>(buf: &[u8], offset: usize) -> Result<[u8; N], FormatError> {
    let end = offset.checked_add(N).ok_or(FormatError::Truncated {
        needed: usize::MAX,
        got: buf.len(),
    })?;
    match buf.get(offset..end) {
        Some(slice) => {
            let mut out = [0u8; N];
            out.copy_from_slice(slice);
            Ok(out)
        }
        None => Err(FormatError::Truncated {
            needed: end,
            got: buf.len(),
        }),
    }
}

pub(crate) fn get_u8(buf: &[u8], offset: usize) -> Result<u8, FormatError> {
    Ok(get_array::<1>(buf, offset)?[0])
}

pub(crate) fn get_u32(buf: &[u8], offset: usize) -> Result<u32, FormatError> {
    Ok(u32::from_le_bytes(get_array(buf, offset)?))
}

pub(crate) fn get_u64(buf: &[u8], offset: usize) -> Result<u64, FormatError> {
    Ok(u64::from_le_bytes(get_array(buf, offset)?))
}

pub(crate) fn put_bytes(buf: &mut [u8], offset: usize, value: &[u8]) {
    buf[offset..offset + value.len()].copy_from_slice(value);
}

pub(crate) fn put_u8(buf: &mut [u8], offset: usize, value: u8) {
    buf[offset] = value;
}

pub(crate) fn put_u32(buf: &mut [u8], offset: usize, value: u32) {
    put_bytes(buf, offset, &value.to_le_bytes());
}

pub(crate) fn put_u64(buf: &mut [u8], offset: usize, value: u64) {
    put_bytes(buf, offset, &value.to_le_bytes());
}

/// True when every byte is zero (a never-written area reads as zeros; an all-zero data block
/// is stored as a hole). Fast enough to run on every block a txg writes: 256-byte chunks are
/// OR-ed as words (which vectorizes), with an early exit per chunk, not per byte.
pub fn all_zero(buf: &[u8]) -> bool {
    const CHUNK_BYTES: usize = 256;
    let mut chunks = buf.chunks_exact(CHUNK_BYTES);
    for chunk in &mut chunks {
        let any = chunk.chunks_exact(8).fold(0u64, |acc, word| {
            acc | u64::from_ne_bytes(word.try_into().expect("8-byte chunk"))
        });
        if any != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

/// Checks that the reserved range `buf[start..end]` is zero. Reserved bytes are zero in
/// version 1; a later version that uses them bumps the format version, so a non-zero byte
/// here means damage (or a structure this build cannot read).
pub(crate) fn check_reserved(
    buf: &[u8],
    start: usize,
    end: usize,
    field: &'static str,
) -> Result<(), FormatError> {
    need(buf, end)?;
    match buf[start..end].iter().find(|&&b| b != 0) {
        None => Ok(()),
        Some(&b) => Err(FormatError::BadField {
            field,
            value: u64::from(b),
        }),
    }
}

/// Rounds `value` up to a multiple of `align` (a power of two or any non-zero value).
pub(crate) const fn round_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_zero_finds_any_set_byte() {
        for len in [0usize, 1, 7, 255, 256, 257, 4096, 16384 + 5] {
            let mut buf = vec![0u8; len];
            assert!(all_zero(&buf), "len {len}");
            for at in [0, len / 2, len.saturating_sub(1)] {
                if at < len {
                    buf[at] = 0x10;
                    assert!(!all_zero(&buf), "len {len} byte {at}");
                    buf[at] = 0;
                }
            }
        }
    }

    #[test]
    fn getters_check_bounds() {
        let buf = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(get_u8(&buf, 8), Ok(9));
        assert_eq!(get_u32(&buf, 0), Ok(0x0403_0201));
        assert_eq!(get_u64(&buf, 1), Ok(0x0908_0706_0504_0302));
        assert_eq!(
            get_u64(&buf, 2),
            Err(FormatError::Truncated { needed: 10, got: 9 })
        );
        assert_eq!(
            get_u8(&buf, 9),
            Err(FormatError::Truncated { needed: 10, got: 9 })
        );
        assert!(get_u64(&buf, usize::MAX - 3).is_err());
    }

    #[test]
    fn putters_are_little_endian() {
        let mut buf = [0u8; 12];
        put_u32(&mut buf, 0, 0x0403_0201);
        put_u64(&mut buf, 4, 0x0c0b_0a09_0807_0605);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    }

    #[test]
    fn reserved_must_be_zero() {
        let buf = [0u8, 0, 7, 0];
        assert!(check_reserved(&buf, 0, 2, "r").is_ok());
        assert_eq!(
            check_reserved(&buf, 0, 4, "r"),
            Err(FormatError::BadField {
                field: "r",
                value: 7
            })
        );
        assert!(check_reserved(&buf, 0, 5, "r").is_err());
    }
}
