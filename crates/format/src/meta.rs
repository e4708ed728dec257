//! Generic metadata blocks (a header and a payload) and the space map chunks built on them.

use crate::bytes::{
    all_zero, check_reserved, get_u32, get_u64, get_u8, need, put_bytes, put_u32, put_u64, put_u8,
    round_up,
};
use crate::checksum::{put_self_checksum, verify_self_checksum};
use crate::{
    BlockPtr, BlockType, FormatError, FormatVersion, BLOCK_PTR_BYTES, FORMAT_VERSION, SECTOR_BYTES,
};
use serde::de::DeserializeOwned;

/// Size of the header of a metadata block.
pub const META_HEADER_BYTES: usize = 64;
/// Largest payload of a metadata block.
pub const META_PAYLOAD_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Magic of a metadata block: the ASCII bytes `oxpMETAB` at offset 0.
pub const META_MAGIC: u64 = u64::from_le_bytes(*b"oxpMETAB");

/// Space map chunk = meta block of kind SpaceMap whose payload is a bitmap of
/// SPACEMAP_CHUNK_SECTORS bits (bit i set = sector i of the chunk allocated, LSB first) -> the
/// whole block is exactly 4096 bytes.
pub const SPACEMAP_CHUNK_PAYLOAD_BYTES: usize = 4096 - META_HEADER_BYTES;
/// Sectors described by one space map chunk (32256, i.e. 126 MiB of 4 KiB sectors).
pub const SPACEMAP_CHUNK_SECTORS: u64 = (SPACEMAP_CHUNK_PAYLOAD_BYTES * 8) as u64;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_BLOCK_TYPE: usize = 12;
const OFF_RESERVED_A: usize = 13;
const OFF_CHECKSUM: usize = 16;
const OFF_PAYLOAD_LEN: usize = 32;
const OFF_RESERVED_B: usize = 36;

/// Size of the encoded metadata block for a payload of `payload_bytes`: header plus payload,
/// rounded up to a multiple of `SECTOR_BYTES`.
pub const fn meta_block_bytes(payload_bytes: usize) -> usize {
    round_up(META_HEADER_BYTES + payload_bytes, SECTOR_BYTES as usize)
}

/// Generic metadata block: 64-byte header (magic, version, BlockType, payload length,
/// xxh3-128 self-checksum over header and payload) + payload, zero padded to a SECTOR_BYTES
/// multiple.
///
/// # Panics
/// If `payload.len() > META_PAYLOAD_BYTES_MAX`.
pub fn encode_meta_block(kind: BlockType, payload: &[u8]) -> Vec<u8> {
    assert!(
        payload.len() <= META_PAYLOAD_BYTES_MAX,
        "metadata payload of {} bytes exceeds {META_PAYLOAD_BYTES_MAX}",
        payload.len()
    );
    let covered_bytes = META_HEADER_BYTES + payload.len();
    let mut out = vec![0u8; meta_block_bytes(payload.len())];
    put_u64(&mut out, OFF_MAGIC, META_MAGIC);
    put_u32(&mut out, OFF_VERSION, FORMAT_VERSION);
    put_u8(&mut out, OFF_BLOCK_TYPE, kind as u8);
    put_u32(&mut out, OFF_PAYLOAD_LEN, payload.len() as u32);
    put_bytes(&mut out, META_HEADER_BYTES, payload);
    put_self_checksum(&mut out[..covered_bytes], OFF_CHECKSUM);
    out
}

/// Decodes a metadata block that must be of kind `kind` and returns its payload. `bytes` may
/// be longer than the block (a whole allocation); bytes past the payload are not read, so
/// the padding is covered only by the parent's checksum.
pub fn decode_meta_block(kind: BlockType, bytes: &[u8]) -> Result<&[u8], FormatError> {
    need(bytes, META_HEADER_BYTES)?;
    if all_zero(&bytes[..META_HEADER_BYTES]) {
        return Err(FormatError::Empty);
    }
    let magic = get_u64(bytes, OFF_MAGIC)?;
    if magic != META_MAGIC {
        return Err(FormatError::BadMagic {
            expected: META_MAGIC,
            found: magic,
        });
    }
    FormatVersion::try_from(get_u32(bytes, OFF_VERSION)?)?;
    // The length is needed to find the end of the checksummed range, so it is bounded
    // before the checksum can vouch for it.
    let payload_bytes = get_u32(bytes, OFF_PAYLOAD_LEN)? as usize;
    if payload_bytes > META_PAYLOAD_BYTES_MAX {
        return Err(FormatError::BadField {
            field: "payload_bytes",
            value: payload_bytes as u64,
        });
    }
    let covered_bytes = META_HEADER_BYTES + payload_bytes;
    need(bytes, covered_bytes)?;
    let covered = &bytes[..covered_bytes];
    verify_self_checksum(covered, OFF_CHECKSUM)?;
    check_reserved(covered, OFF_RESERVED_A, OFF_CHECKSUM, "reserved (13..16)")?;
    check_reserved(
        covered,
        OFF_RESERVED_B,
        META_HEADER_BYTES,
        "reserved (36..64)",
    )?;
    let found = BlockType::try_from(get_u8(covered, OFF_BLOCK_TYPE)?)?;
    if found != kind {
        return Err(FormatError::BadField {
            field: "block_type",
            value: found as u64,
        });
    }
    Ok(&covered[META_HEADER_BYTES..])
}

/// Largest piece of a metadata block stored in pieces (the largest block the engine's
/// allocator places in one run: 256 KiB).
pub const META_PIECE_BYTES_MAX: usize = 256 * 1024;
/// Most pieces a metadata index names: enough for the largest metadata block.
pub const META_INDEX_PIECES_MAX: usize =
    meta_block_bytes(META_PAYLOAD_BYTES_MAX).div_ceil(META_PIECE_BYTES_MAX);

/// Encodes a metadata index: a metadata block of kind `MetaIndex` whose payload is the
/// 128-byte block pointers of `pieces`, the consecutive byte ranges of one metadata block too
/// large to be stored in one piece. Reading them in order and concatenating their
/// `psize_bytes` gives back the block.
///
/// # Panics
/// If there are more than `META_INDEX_PIECES_MAX` pieces, or a piece is a hole, an index, or
/// larger than `META_PIECE_BYTES_MAX`.
pub fn encode_meta_index(pieces: &[BlockPtr]) -> Vec<u8> {
    assert!(pieces.len() <= META_INDEX_PIECES_MAX, "too many pieces");
    let mut payload = vec![0u8; pieces.len() * BLOCK_PTR_BYTES];
    for (p, out) in pieces.iter().zip(payload.chunks_exact_mut(BLOCK_PTR_BYTES)) {
        assert!(
            !p.is_hole()
                && p.block_type != BlockType::MetaIndex
                && p.psize_bytes as usize <= META_PIECE_BYTES_MAX,
            "invalid piece {p:?}"
        );
        p.encode(out.try_into().expect("a 128-byte chunk"));
    }
    encode_meta_block(BlockType::MetaIndex, &payload)
}

/// Decodes a metadata index (see [`encode_meta_index`]): checks the metadata block, that the
/// payload is a whole number of block pointers, at least one and at most
/// `META_INDEX_PIECES_MAX`, and that each decodes and is a piece (not a hole, not an index,
/// at most `META_PIECE_BYTES_MAX`). The caller checks the pieces' block type.
pub fn decode_meta_index(bytes: &[u8]) -> Result<Vec<BlockPtr>, FormatError> {
    let payload = decode_meta_block(BlockType::MetaIndex, bytes)?;
    let count = payload.len() / BLOCK_PTR_BYTES;
    if payload.len() % BLOCK_PTR_BYTES != 0 || count == 0 || count > META_INDEX_PIECES_MAX {
        return Err(FormatError::BadField {
            field: "meta index length",
            value: payload.len() as u64,
        });
    }
    payload
        .chunks_exact(BLOCK_PTR_BYTES)
        .map(|chunk| {
            let p = BlockPtr::decode(chunk)?;
            if p.is_hole() || p.block_type == BlockType::MetaIndex {
                return Err(FormatError::BadField {
                    field: "meta index piece type",
                    value: if p.is_hole() { 0 } else { p.block_type as u64 },
                });
            }
            if p.psize_bytes as usize > META_PIECE_BYTES_MAX {
                return Err(FormatError::BadField {
                    field: "meta index piece size",
                    value: u64::from(p.psize_bytes),
                });
            }
            Ok(p)
        })
        .collect()
}

/// Encodes a space map chunk: a metadata block of kind `SpaceMap`, exactly `SECTOR_BYTES`.
pub fn encode_spacemap_chunk(bitmap: &[u8; SPACEMAP_CHUNK_PAYLOAD_BYTES]) -> Vec<u8> {
    encode_meta_block(BlockType::SpaceMap, bitmap)
}

/// Decodes a space map chunk and returns its bitmap (bit i, LSB first = sector i allocated).
/// The payload must be exactly `SPACEMAP_CHUNK_PAYLOAD_BYTES`.
pub fn decode_spacemap_chunk(
    bytes: &[u8],
) -> Result<&[u8; SPACEMAP_CHUNK_PAYLOAD_BYTES], FormatError> {
    let payload = decode_meta_block(BlockType::SpaceMap, bytes)?;
    payload.try_into().map_err(|_| FormatError::BadField {
        field: "payload_bytes",
        value: payload.len() as u64,
    })
}

/// Decodes `payload` as exactly one postcard value: trailing bytes are an error, since an
/// encoder never writes them.
/// The format version in the header of a metadata block (checked to be a known one).
pub(crate) fn meta_block_version(bytes: &[u8]) -> Result<FormatVersion, FormatError> {
    FormatVersion::try_from(get_u32(bytes, OFF_VERSION)?)
}

pub(crate) fn postcard_exact<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FormatError> {
    let (value, rest) = postcard::take_from_bytes::<T>(payload)
        .map_err(|err| FormatError::Payload(err.to_string()))?;
    if !rest.is_empty() {
        return Err(FormatError::Payload(format!(
            "{} trailing bytes after the value",
            rest.len()
        )));
    }
    Ok(value)
}

const _: () = assert!(meta_block_bytes(SPACEMAP_CHUNK_PAYLOAD_BYTES) == SECTOR_BYTES as usize);
