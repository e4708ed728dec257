#![no_main]
//! decode_spacemap_chunk on raw bytes and on sealed chunks with a fuzzed payload length.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    decode_spacemap_chunk, encode_meta_block, encode_spacemap_chunk, BlockType,
    SPACEMAP_CHUNK_PAYLOAD_BYTES,
};

fn check(bytes: &[u8]) {
    if let Ok(bitmap) = decode_spacemap_chunk(bytes) {
        assert_eq!(bitmap.len(), SPACEMAP_CHUNK_PAYLOAD_BYTES);
        let encoded = encode_spacemap_chunk(bitmap);
        assert_eq!(decode_spacemap_chunk(&encoded), Ok(bitmap));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let payload = &data[..data.len().min(2 * SPACEMAP_CHUNK_PAYLOAD_BYTES)];
    check(&encode_meta_block(BlockType::SpaceMap, payload));
});
