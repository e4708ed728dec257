#![no_main]
//! BlockPtr::decode on raw bytes; whatever decodes must re-encode to the same value.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{BlockPtr, BLOCK_PTR_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Ok(ptr) = BlockPtr::decode(data) {
        assert!(ptr.validate().is_ok());
        let bytes = ptr.to_bytes();
        assert_eq!(BlockPtr::decode(&bytes), Ok(ptr));
        // The encoding is canonical except for the hole, whose only encoding is zeros.
        if ptr != BlockPtr::HOLE {
            assert_eq!(&bytes[..], &data[..BLOCK_PTR_BYTES]);
        }
    }
    // The postcard path (used inside PoolMeta) must agree with the raw one.
    if let Ok(ptr) = postcard::from_bytes::<BlockPtr>(data) {
        assert_eq!(BlockPtr::decode(&ptr.to_bytes()), Ok(ptr));
    }
});
