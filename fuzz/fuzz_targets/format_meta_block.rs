#![no_main]
//! decode_meta_block on raw bytes, for every block type; decode_meta_index.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    decode_meta_block, decode_meta_index, encode_meta_block, encode_meta_index, BlockType,
};

const KINDS: [BlockType; 9] = [
    BlockType::Data,
    BlockType::Indirect,
    BlockType::PoolMeta,
    BlockType::SpaceMap,
    BlockType::Log,
    BlockType::MetaIndex,
    BlockType::DeadList,
    BlockType::SnapshotTable,
    BlockType::BookmarkTable,
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
    // A metadata index's pieces re-encode to the same index.
    if let Ok(pieces) = decode_meta_index(data) {
        let encoded = encode_meta_index(&pieces);
        assert_eq!(decode_meta_index(&encoded), Ok(pieces));
    }
});
