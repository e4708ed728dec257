//! Indirect blocks: the inner nodes of a volume's block tree.

use crate::bytes::{
    all_zero, check_reserved, get_u32, get_u64, get_u8, need, put_u32, put_u64, put_u8,
};
use crate::checksum::{put_self_checksum, verify_self_checksum};
use crate::{
    BlockPtr, FormatError, FormatVersion, BLOCK_LEVEL_MAX, BLOCK_PTR_BYTES, FORMAT_VERSION,
};

/// Size of an indirect block.
pub const INDIRECT_BLOCK_BYTES: usize = 32 * 1024;
/// Block pointers per indirect block: slot 0 (128 bytes) is the header.
pub const INDIRECT_FANOUT: usize = 255;
/// Magic of an indirect block: the ASCII bytes `oxpINDIR` at offset 0.
pub const INDIRECT_MAGIC: u64 = u64::from_le_bytes(*b"oxpINDIR");

const _: () = assert!((INDIRECT_FANOUT + 1) * BLOCK_PTR_BYTES == INDIRECT_BLOCK_BYTES);

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_LEVEL: usize = 12;
const OFF_RESERVED_A: usize = 13;
const OFF_CHECKSUM: usize = 16;
const OFF_RESERVED_B: usize = 32;
const HEADER_BYTES: usize = BLOCK_PTR_BYTES;

/// Encodes an indirect block of level `level` (1..=BLOCK_LEVEL_MAX) holding `ptrs` in its
/// first slots; the missing tail is holes. The header carries magic, version, level and a
/// self-checksum over the whole 32 KiB.
///
/// # Panics
/// If `ptrs.len() > INDIRECT_FANOUT`, `out.len() != INDIRECT_BLOCK_BYTES`, `level` is out of
/// range, or a pointer is invalid or not at `level - 1` (holes excepted): all bugs of the
/// caller, which must never reach the disk.
pub fn encode_indirect(level: u8, ptrs: &[BlockPtr], out: &mut [u8]) {
    assert!(
        ptrs.len() <= INDIRECT_FANOUT,
        "{} pointers in an indirect block",
        ptrs.len()
    );
    assert_eq!(
        out.len(),
        INDIRECT_BLOCK_BYTES,
        "indirect block buffer size"
    );
    assert!(
        (1..=BLOCK_LEVEL_MAX).contains(&level),
        "indirect block level {level}"
    );
    out.fill(0);
    put_u64(out, OFF_MAGIC, INDIRECT_MAGIC);
    put_u32(out, OFF_VERSION, FORMAT_VERSION);
    put_u8(out, OFF_LEVEL, level);
    for (i, ptr) in ptrs.iter().enumerate() {
        assert!(
            ptr.is_hole() || ptr.level == level - 1,
            "child at level {} in an indirect block of level {level}",
            ptr.level
        );
        let start = HEADER_BYTES + i * BLOCK_PTR_BYTES;
        let slot: &mut [u8; BLOCK_PTR_BYTES] = (&mut out[start..start + BLOCK_PTR_BYTES])
            .try_into()
            .expect("slot of BLOCK_PTR_BYTES");
        ptr.encode(slot);
    }
    put_self_checksum(out, OFF_CHECKSUM);
}

/// Decodes the first `INDIRECT_BLOCK_BYTES` bytes of `bytes` (trailing bytes are ignored)
/// into `out` and returns the block's level. Every non-hole child must be at `level - 1`.
/// An all-zero block is `Empty`. On error `out` holds unspecified (but valid) pointers.
pub fn decode_indirect(
    bytes: &[u8],
    out: &mut [BlockPtr; INDIRECT_FANOUT],
) -> Result<u8, FormatError> {
    need(bytes, INDIRECT_BLOCK_BYTES)?;
    let bytes = &bytes[..INDIRECT_BLOCK_BYTES];
    // A never-written block reads as zeros; say so rather than "bad magic".
    if all_zero(bytes) {
        return Err(FormatError::Empty);
    }
    let magic = get_u64(bytes, OFF_MAGIC)?;
    if magic != INDIRECT_MAGIC {
        return Err(FormatError::BadMagic {
            expected: INDIRECT_MAGIC,
            found: magic,
        });
    }
    FormatVersion::try_from(get_u32(bytes, OFF_VERSION)?)?;
    verify_self_checksum(bytes, OFF_CHECKSUM)?;
    check_reserved(bytes, OFF_RESERVED_A, OFF_CHECKSUM, "reserved (13..16)")?;
    check_reserved(bytes, OFF_RESERVED_B, HEADER_BYTES, "reserved (32..128)")?;
    let level = get_u8(bytes, OFF_LEVEL)?;
    if !(1..=BLOCK_LEVEL_MAX).contains(&level) {
        return Err(FormatError::BadField {
            field: "level",
            value: u64::from(level),
        });
    }
    for (i, slot) in out.iter_mut().enumerate() {
        let start = HEADER_BYTES + i * BLOCK_PTR_BYTES;
        let ptr = BlockPtr::decode(&bytes[start..start + BLOCK_PTR_BYTES])?;
        if !ptr.is_hole() && ptr.level != level - 1 {
            return Err(FormatError::BadField {
                field: "child level",
                value: u64::from(ptr.level),
            });
        }
        *slot = ptr;
    }
    Ok(level)
}
