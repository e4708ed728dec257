#![no_main]
//! decompress_block on raw stored bytes, for every compression: the decoder of a compressed
//! block's stored bytes (after its checksum verified: a writer's bug or a forged collision is
//! all that reaches it). It must return an error or fill exactly the buffer of the logical size
//! it is given, whatever the bytes say: never a panic, never a read or write outside either
//! buffer (the C codecs are built with the sanitizer's coverage, and their bounds are what
//! LZ4_decompress_safe and ZSTD_decompressDCtx promise).
//!
//! Input: byte 0 selects the algorithm, bytes 1..3 the logical size (1 to 65536), the rest is
//! the stored bytes. The same input is also compressed with each setting and must decompress
//! back to itself (the writer's side).

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    compress_block, compressed_bytes_max, decompress_block, Compression, CompressionSetting,
};

const ALGORITHMS: [Compression; 4] = [
    Compression::Off,
    Compression::Lz4,
    Compression::Zstd,
    Compression::Zle,
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let compression = ALGORITHMS[data[0] as usize % ALGORITHMS.len()];
    let lsize = usize::from(u16::from_le_bytes([data[1], data[2]])) + 1;
    let stored = &data[3..];
    let mut out = vec![0u8; lsize];
    if decompress_block(compression, stored, &mut out).is_ok() {
        // Deterministic, and only for exactly this size.
        let mut again = vec![0xa5u8; lsize];
        decompress_block(compression, stored, &mut again).unwrap();
        assert_eq!(again, out);
        let mut longer = vec![0u8; lsize + 1];
        assert!(decompress_block(compression, stored, &mut longer).is_err());
        if lsize > 1 {
            let mut shorter = vec![0u8; lsize - 1];
            assert!(decompress_block(compression, stored, &mut shorter).is_err());
        }
    }
    // The writer's side: whatever compresses within the limit decodes back to itself.
    let max = compressed_bytes_max(stored.len());
    if max > 0 {
        for setting in ["lz4", "zstd-1", "zle"] {
            let setting: CompressionSetting = setting.parse().unwrap();
            let mut dst = vec![0u8; max];
            if let Some(n) = compress_block(setting, stored, &mut dst) {
                assert!(n <= max);
                let mut back = vec![0u8; stored.len()];
                decompress_block(setting.algorithm, &dst[..n], &mut back).unwrap();
                assert_eq!(back, stored);
            }
        }
    }
});
