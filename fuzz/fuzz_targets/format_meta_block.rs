#![no_main]
//! decode_meta_block on raw bytes, for every block type.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{decode_meta_block, encode_meta_block, BlockType};

const KINDS: [BlockType; 5] = [
    BlockType::Data,
    BlockType::Indirect,
    BlockType::PoolMeta,
    BlockType::SpaceMap,
    BlockType::Log,
];

fuzz_target!(|data: &[u8]| {
    for kind in KINDS {
        if let Ok(payload) = decode_meta_block(kind, data) {
            let encoded = encode_meta_block(kind, payload);
            assert_eq!(decode_meta_block(kind, &encoded), Ok(payload));
            // Header and payload are canonical: the input's covered bytes re-encode exactly.
            assert_eq!(&encoded[..64 + payload.len()], &data[..64 + payload.len()]);
        }
    }
});
