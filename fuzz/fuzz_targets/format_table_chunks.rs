#![no_main]
//! decode_snapshot_chunk and decode_bookmark_chunk on raw bytes and on valid meta blocks
//! whose postcard payload is fuzzed: an error or a table that re-encodes to itself.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    decode_bookmark_chunk, decode_snapshot_chunk, encode_bookmark_chunk, encode_meta_block,
    encode_snapshot_chunk, BlockType,
};

fn check(bytes: &[u8]) {
    if let Ok(snaps) = decode_snapshot_chunk(bytes) {
        assert_eq!(decode_snapshot_chunk(&encode_snapshot_chunk(&snaps)), Ok(snaps));
    }
    if let Ok(marks) = decode_bookmark_chunk(bytes) {
        assert_eq!(decode_bookmark_chunk(&encode_bookmark_chunk(&marks)), Ok(marks));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&encode_meta_block(BlockType::SnapshotTable, data));
    check(&encode_meta_block(BlockType::BookmarkTable, data));
});
