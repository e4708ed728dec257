#![no_main]
//! BlockPtr::decode on raw bytes; whatever decodes must re-encode to the same value.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{BlockPtr, BLOCK_PTR_BYTES, BLOCK_PTR_VERSION, BLOCK_PTR_VERSION_MIN};

/// Where a block pointer's version byte is (docs/format.md, "Block pointer").
const VERSION_BYTE: usize = 53;

fuzz_target!(|data: &[u8]| {
    if let Ok(ptr) = BlockPtr::decode(data) {
        assert!(ptr.validate().is_ok());
        let bytes = ptr.to_bytes();
        assert_eq!(BlockPtr::decode(&bytes), Ok(ptr));
        // The encoding is canonical except for the hole, whose only encoding is zeros, and
        // the version byte (53, docs/format.md): a version 1 pointer (uncompressed, the
        // format before compression) is read as is and written as the current version.
        if ptr != BlockPtr::HOLE {
            let mut want = data[..BLOCK_PTR_BYTES].to_vec();
            assert!((BLOCK_PTR_VERSION_MIN..=BLOCK_PTR_VERSION).contains(&want[VERSION_BYTE]));
            want[VERSION_BYTE] = BLOCK_PTR_VERSION;
            assert_eq!(&bytes[..], &want[..]);
        }
    }
    // The postcard path (used inside PoolMeta) must agree with the raw one.
    if let Ok(ptr) = postcard::from_bytes::<BlockPtr>(data) {
        assert_eq!(BlockPtr::decode(&ptr.to_bytes()), Ok(ptr));
    }
});
