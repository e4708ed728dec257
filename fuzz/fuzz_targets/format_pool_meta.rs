#![no_main]
//! PoolMeta::decode on raw bytes and on valid meta blocks whose postcard payload is fuzzed.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{encode_meta_block, BlockType, PoolMeta};

fn check(bytes: &[u8]) {
    if let Ok(mut meta) = PoolMeta::decode(bytes) {
        // Version 3 held snapshots inline; this build writes them into tables of their own.
        for d in &mut meta.datasets {
            d.snapshots.clear();
        }
        assert_eq!(PoolMeta::decode(&meta.encode()), Ok(meta));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&encode_meta_block(BlockType::PoolMeta, data));
});
