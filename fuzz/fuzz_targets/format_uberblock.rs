#![no_main]
//! Uberblock::decode on raw bytes and on sealed slots (valid magic, version and checksum
//! around fuzzed fields).

use libfuzzer_sys::fuzz_target;
use oxpool_format::{Uberblock, UBERBLOCK_MAGIC, UBERBLOCK_SLOT_BYTES};

#[path = "format_common.rs"]
mod format_common;

fn check(bytes: &[u8]) {
    if let Ok(ub) = Uberblock::decode(bytes) {
        let encoded = ub.encode();
        assert_eq!(encoded.len() as u64, UBERBLOCK_SLOT_BYTES);
        assert_eq!(Uberblock::decode(&encoded), Ok(ub));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let slot_bytes = UBERBLOCK_SLOT_BYTES as usize;
    let mut sealed = format_common::envelope(UBERBLOCK_MAGIC, 32, slot_bytes, data);
    format_common::reseal(&mut sealed);
    check(&sealed);
});
