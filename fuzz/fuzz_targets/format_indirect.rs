#![no_main]
//! decode_indirect on raw bytes and on sealed blocks whose header level and slots are fuzzed.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    decode_indirect, encode_indirect, BlockPtr, INDIRECT_BLOCK_BYTES, INDIRECT_FANOUT,
    INDIRECT_MAGIC,
};

#[path = "format_common.rs"]
mod format_common;

fn check(bytes: &[u8]) {
    let mut ptrs = [BlockPtr::HOLE; INDIRECT_FANOUT];
    if let Ok(level) = decode_indirect(bytes, &mut ptrs) {
        let mut encoded = vec![0u8; INDIRECT_BLOCK_BYTES];
        encode_indirect(level, &ptrs, &mut encoded);
        let mut again = [BlockPtr::HOLE; INDIRECT_FANOUT];
        assert_eq!(decode_indirect(&encoded, &mut again), Ok(level));
        assert_eq!(again, ptrs);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // First byte: the level; the rest: the 255 slots.
    let (level, slots) = data
        .split_first()
        .map_or((1, &[][..]), |(l, rest)| (*l, rest));
    let mut sealed = format_common::envelope(INDIRECT_MAGIC, 128, INDIRECT_BLOCK_BYTES, slots);
    sealed[12] = level;
    format_common::reseal(&mut sealed);
    check(&sealed);
});
