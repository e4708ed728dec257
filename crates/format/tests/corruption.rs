//! Damaged, truncated or forged bytes yield errors, never panics or wrong values.

mod common;

use common::*;
use oxpool_format::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn is_truncated<T>(result: Result<T, FormatError>) -> bool {
    matches!(result, Err(FormatError::Truncated { .. }))
}

fn flip(bytes: &mut [u8], bit: usize) {
    bytes[bit / 8] ^= 1 << (bit % 8);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn uberblock_any_bit_flip_is_caught(ub in arb_uberblock(), bit in 0..UBERBLOCK_SLOT_BYTES as usize * 8) {
        let mut bytes = ub.encode();
        flip(&mut bytes, bit);
        prop_assert!(Uberblock::decode(&bytes).is_err());
    }

    #[test]
    fn label_config_any_bit_flip_is_caught(config in arb_label_config(), bit in 0..LABEL_CONFIG_BYTES as usize * 8) {
        let mut bytes = config.encode();
        flip(&mut bytes, bit);
        prop_assert!(LabelConfig::decode(&bytes).is_err());
    }

    #[test]
    fn indirect_any_bit_flip_is_caught(ptrs in vec(arb_data_ptr(Some(0)), 0..8), bit in 0..INDIRECT_BLOCK_BYTES * 8) {
        let mut bytes = vec![0u8; INDIRECT_BLOCK_BYTES];
        encode_indirect(1, &ptrs, &mut bytes);
        flip(&mut bytes, bit);
        let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
        prop_assert!(decode_indirect(&bytes, &mut out).is_err());
    }

    #[test]
    fn meta_block_bit_flip_in_header_or_payload_is_caught(
        payload in vec(any::<u8>(), 0..5000),
        bit_fraction in 0.0f64..1.0,
    ) {
        let mut bytes = encode_meta_block(BlockType::PoolMeta, &payload);
        let covered_bits = (META_HEADER_BYTES + payload.len()) * 8;
        flip(&mut bytes, (bit_fraction * covered_bits as f64) as usize);
        prop_assert!(decode_meta_block(BlockType::PoolMeta, &bytes).is_err());
    }

    #[test]
    fn pool_meta_bit_flip_is_caught(meta in arb_pool_meta(), bit_fraction in 0.0f64..1.0) {
        let mut bytes = meta.encode();
        let payload_bytes = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
        flip(&mut bytes, (bit_fraction * ((META_HEADER_BYTES + payload_bytes) * 8) as f64) as usize);
        prop_assert!(PoolMeta::decode(&bytes).is_err());
    }

    #[test]
    fn truncated_input_is_an_error(
        ub in arb_uberblock(),
        config in arb_label_config(),
        meta in arb_pool_meta(),
        cut_fraction in 0.0f64..1.0,
    ) {
        let cut = |len: usize| (cut_fraction * len as f64) as usize;
        let bytes = ub.encode();
        prop_assert!(is_truncated(Uberblock::decode(&bytes[..cut(bytes.len())])));
        let bytes = config.encode();
        prop_assert!(is_truncated(LabelConfig::decode(&bytes[..cut(bytes.len())])));
        let bytes = meta.encode();
        let payload_bytes = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
        let covered = META_HEADER_BYTES + payload_bytes;
        prop_assert!(is_truncated(PoolMeta::decode(&bytes[..cut(covered)])));
        let ptr = sample_ptr().to_bytes();
        prop_assert!(is_truncated(BlockPtr::decode(&ptr[..cut(BLOCK_PTR_BYTES)])));
        let mut indirect = vec![0u8; INDIRECT_BLOCK_BYTES];
        encode_indirect(1, &[sample_ptr()], &mut indirect);
        let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
        prop_assert!(is_truncated(decode_indirect(&indirect[..cut(INDIRECT_BLOCK_BYTES)], &mut out)));
    }

    /// Garbage never panics; whatever decodes re-encodes to the same value.
    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..5000)) {
        if let Ok(ptr) = BlockPtr::decode(&bytes) {
            prop_assert_eq!(BlockPtr::decode(&ptr.to_bytes()), Ok(ptr));
        }
        let _ = Uberblock::decode(&bytes);
        let _ = LabelConfig::decode(&bytes);
        let _ = decode_meta_block(BlockType::PoolMeta, &bytes);
        let _ = decode_spacemap_chunk(&bytes);
        let _ = PoolMeta::decode(&bytes);
        let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
        let _ = decode_indirect(&bytes, &mut out);
    }

    /// Random payloads with a valid header and checksum: postcard errors, not panics.
    #[test]
    fn forged_payloads_are_errors_not_panics(payload in vec(any::<u8>(), 0..2000)) {
        let bytes = encode_meta_block(BlockType::PoolMeta, &payload);
        let _ = PoolMeta::decode(&bytes);
    }

    /// Any single bit set in a hole makes either an error or a valid non-hole-or-rich-hole
    /// pointer, never a panic.
    #[test]
    fn block_ptr_bit_flips_never_panic(ptr in arb_block_ptr(), bit in 0..BLOCK_PTR_BYTES * 8) {
        let mut bytes = ptr.to_bytes();
        flip(&mut bytes, bit);
        if let Ok(decoded) = BlockPtr::decode(&bytes) {
            prop_assert!(decoded.validate().is_ok());
        }
    }
}

#[test]
fn empty_structures_say_empty() {
    assert_eq!(
        Uberblock::decode(&[0u8; UBERBLOCK_SLOT_BYTES as usize]),
        Err(FormatError::Empty)
    );
    assert_eq!(
        LabelConfig::decode(&vec![0u8; LABEL_CONFIG_BYTES as usize]),
        Err(FormatError::Empty)
    );
    assert_eq!(
        decode_meta_block(BlockType::SpaceMap, &[0u8; 4096]),
        Err(FormatError::Empty)
    );
    let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
    assert_eq!(
        decode_indirect(&vec![0u8; INDIRECT_BLOCK_BYTES], &mut out),
        Err(FormatError::Empty)
    );
}

#[test]
fn wrong_magic_says_bad_magic() {
    // A label config where an uberblock is expected: the magics tell them apart.
    let config = LabelConfig {
        pool_guid: Guid(1),
        pool_name: "tank".into(),
        leaf_guid: Guid(2),
        top: VdevId(0),
        create_txg: Txg(1),
        tree: VdevTreeConfig {
            top: vec![],
            spares: vec![],
        },
    }
    .encode();
    assert_eq!(
        Uberblock::decode(&config),
        Err(FormatError::BadMagic {
            expected: UBERBLOCK_MAGIC,
            found: LABEL_CONFIG_MAGIC
        })
    );
    let ub = Uberblock {
        txg: Txg(1),
        timestamp_ns: 0,
        pool_guid: Guid(1),
        root: sample_ptr(),
    }
    .encode();
    let mut padded = ub.clone();
    padded.resize(LABEL_CONFIG_BYTES as usize, 0);
    assert!(matches!(
        LabelConfig::decode(&padded),
        Err(FormatError::BadMagic { .. })
    ));
    assert!(matches!(
        decode_meta_block(BlockType::PoolMeta, &ub),
        Err(FormatError::BadMagic { .. })
    ));
    let mut indirect_input = ub.clone();
    indirect_input.resize(INDIRECT_BLOCK_BYTES, 0);
    let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
    assert!(matches!(
        decode_indirect(&indirect_input, &mut out),
        Err(FormatError::BadMagic { .. })
    ));
}

#[test]
fn other_versions_say_unsupported() {
    let mut ub = Uberblock {
        txg: Txg(1),
        timestamp_ns: 0,
        pool_guid: Guid(1),
        root: sample_ptr(),
    }
    .encode();
    ub[8..12].copy_from_slice(&9u32.to_le_bytes());
    reseal(&mut ub);
    assert_eq!(
        Uberblock::decode(&ub),
        Err(FormatError::UnsupportedVersion { found: 9 })
    );

    let mut meta = encode_meta_block(BlockType::Log, b"x");
    meta[8..12].copy_from_slice(&0u32.to_le_bytes());
    reseal(&mut meta[..META_HEADER_BYTES + 1]);
    assert_eq!(
        decode_meta_block(BlockType::Log, &meta),
        Err(FormatError::UnsupportedVersion { found: 0 })
    );

    let mut ptr = sample_ptr().to_bytes();
    for found in [0u8, 3, 255] {
        ptr[53] = found;
        assert_eq!(
            BlockPtr::decode(&ptr),
            Err(FormatError::UnsupportedVersion {
                found: u32::from(found)
            })
        );
    }
}

#[test]
fn checksum_mismatch_says_bad_checksum() {
    let mut ub = Uberblock {
        txg: Txg(1),
        timestamp_ns: 0,
        pool_guid: Guid(1),
        root: sample_ptr(),
    }
    .encode();
    ub[33] ^= 1;
    assert_eq!(Uberblock::decode(&ub), Err(FormatError::BadChecksum));
    let mut meta = encode_meta_block(BlockType::Log, b"hello");
    meta[66] ^= 1;
    assert_eq!(
        decode_meta_block(BlockType::Log, &meta),
        Err(FormatError::BadChecksum)
    );
}

#[test]
fn meta_block_kind_and_length_are_checked() {
    let meta = encode_meta_block(BlockType::Log, b"hello");
    assert_eq!(
        decode_meta_block(BlockType::PoolMeta, &meta),
        Err(FormatError::BadField {
            field: "block_type",
            value: BlockType::Log as u64
        })
    );
    // A length past the maximum is refused before anything is read at that length.
    let mut forged = meta.clone();
    forged[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_meta_block(BlockType::Log, &forged),
        Err(FormatError::BadField {
            field: "payload_bytes",
            ..
        })
    ));
    // A length past the buffer is Truncated.
    let mut forged = meta.clone();
    forged[32..36].copy_from_slice(&5000u32.to_le_bytes());
    assert_eq!(
        decode_meta_block(BlockType::Log, &forged),
        Err(FormatError::Truncated {
            needed: 5064,
            got: 4096
        })
    );
    // A space map chunk must carry exactly one bitmap.
    let short = encode_meta_block(BlockType::SpaceMap, &[0xFF; 10]);
    assert!(matches!(
        decode_spacemap_chunk(&short),
        Err(FormatError::BadField { .. })
    ));
}

#[test]
fn trailing_payload_bytes_are_refused() {
    let meta = PoolMeta {
        name: "tank".into(),
        guid: Guid(1),
        txg: Txg(1),
        tree: VdevTreeConfig {
            top: vec![],
            spares: vec![],
        },
        props: vec![],
        volumes: vec![],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 0,
        datasets: vec![],
        freeing: vec![],
        history: vec![],
    };
    let mut payload = postcard::to_allocvec(&meta).unwrap();
    payload.push(0);
    let bytes = encode_meta_block(BlockType::PoolMeta, &payload);
    assert!(matches!(
        PoolMeta::decode(&bytes),
        Err(FormatError::Payload(_))
    ));
}

#[test]
fn pool_meta_checks_the_values_inside() {
    let good_volume = VolumeMeta {
        id: VolumeId(0),
        name: "vol".into(),
        props: vec![],
        volsize_bytes: 1 << 30,
        volblocksize_bytes: 16384,
        root: BlockPtr::HOLE,
        levels: BLOCK_LEVEL_MAX + 1,
        used_bytes: 0,
        log_first: Dva::default(),
        log_first_seq: 0,
        log_reserved: vec![],
        compressed_bytes: 0,
    };
    let meta = PoolMeta {
        name: "tank".into(),
        guid: Guid(1),
        txg: Txg(1),
        tree: VdevTreeConfig {
            top: vec![],
            spares: vec![],
        },
        props: vec![],
        volumes: vec![good_volume],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 1,
        datasets: vec![],
        freeing: vec![],
        history: vec![],
    };
    assert!(matches!(
        PoolMeta::decode(&meta.encode()),
        Err(FormatError::BadField {
            field: "volume.levels",
            ..
        })
    ));

    let meta = PoolMeta {
        volumes: vec![],
        deferred_frees: vec![DeferredFree {
            txg: Txg(1),
            dvas: vec![Dva {
                vdev: VdevId(0),
                offset_bytes: 1,
                asize_bytes: 4096,
            }],
        }],
        ..meta
    };
    assert!(matches!(
        PoolMeta::decode(&meta.encode()),
        Err(FormatError::BadField {
            field: "dva.offset_bytes",
            ..
        })
    ));
}

/// Each rule of BlockPtr::decode, broken one at a time on a valid pointer.
#[test]
fn block_ptr_field_checks() {
    let good = sample_ptr().to_bytes();
    let bad = |offset: usize, value: u8| {
        let mut bytes = good;
        bytes[offset] = value;
        BlockPtr::decode(&bytes)
    };
    assert_eq!(
        bad(48, 4),
        Err(FormatError::BadField {
            field: "ndvas",
            value: 4
        })
    );
    assert_eq!(
        bad(49, 0),
        Err(FormatError::BadField {
            field: "checksum_type",
            value: 0
        })
    );
    assert_eq!(
        bad(49, 3),
        Err(FormatError::BadField {
            field: "checksum_type",
            value: 3
        })
    );
    assert_eq!(
        bad(50, 4),
        Err(FormatError::BadField {
            field: "compression",
            value: 4
        })
    );
    // A compressed block must be smaller than its logical size.
    assert_eq!(
        bad(50, 1),
        Err(FormatError::BadField {
            field: "psize_bytes",
            value: 16384
        })
    );
    // Compressed, 16 KiB stored in 8 KiB: a version 2 pointer; version 1 had no compression.
    let mut compressed = good;
    compressed[50] = Compression::Zstd as u8;
    compressed[60..64].copy_from_slice(&8192u32.to_le_bytes());
    let ptr = BlockPtr::decode(&compressed).unwrap();
    assert_eq!(
        (ptr.compression, ptr.lsize_bytes, ptr.psize_bytes),
        (Compression::Zstd, 16384, 8192)
    );
    compressed[53] = 1;
    assert_eq!(
        BlockPtr::decode(&compressed),
        Err(FormatError::BadField {
            field: "compression",
            value: 2
        })
    );
    // An uncompressed version 1 pointer (as format version 1 wrote them) decodes.
    let mut v1 = good;
    v1[53] = 1;
    assert_eq!(BlockPtr::decode(&v1), BlockPtr::decode(&good));
    assert_eq!(
        bad(51, 0),
        Err(FormatError::BadField {
            field: "block_type",
            value: 0
        })
    );
    assert_eq!(
        bad(51, 11),
        Err(FormatError::BadField {
            field: "block_type",
            value: 11
        })
    );
    assert!(matches!(
        bad(52, 1),
        Err(FormatError::BadField { field: "level", .. })
    ));
    assert!(matches!(bad(54, 1), Err(FormatError::BadField { .. })));
    assert!(matches!(bad(120, 1), Err(FormatError::BadField { .. })));
    assert!(matches!(
        bad(40, 1),
        Err(FormatError::BadField {
            field: "dvas (unused slot)",
            ..
        })
    ));
    assert!(matches!(
        bad(0, 1),
        Err(FormatError::BadField {
            field: "dva.offset_bytes",
            ..
        })
    )); // unaligned
    assert!(matches!(
        bad(100, 1),
        Err(FormatError::BadField {
            field: "checksum",
            ..
        })
    )); // xxh3 tail
        // psize larger than the allocation
    let mut ptr = sample_ptr();
    ptr.lsize_bytes = 20000;
    ptr.psize_bytes = 20000;
    assert!(ptr.validate().is_err());
    // lsize != psize without compression
    let mut bytes = good;
    bytes[56..60].copy_from_slice(&8192u32.to_le_bytes());
    assert!(matches!(
        BlockPtr::decode(&bytes),
        Err(FormatError::BadField {
            field: "psize_bytes",
            ..
        })
    ));
    // asize zero
    let mut bytes = good;
    bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(
        BlockPtr::decode(&bytes),
        Err(FormatError::BadField {
            field: "dva.asize_bytes",
            ..
        })
    ));
    // offset + asize overflows
    let mut bytes = good;
    bytes[0..8].copy_from_slice(&(u64::MAX - 4095).to_le_bytes());
    assert!(matches!(
        BlockPtr::decode(&bytes),
        Err(FormatError::BadField {
            field: "dva.offset_bytes",
            ..
        })
    ));
    // sizes above the maximum
    let mut bytes = good;
    bytes[56..64].copy_from_slice(&[0xFF; 8]);
    assert!(matches!(
        BlockPtr::decode(&bytes),
        Err(FormatError::BadField {
            field: "lsize_bytes",
            ..
        })
    ));
}

#[test]
#[should_panic(expected = "invalid block pointer")]
fn encoding_an_invalid_block_ptr_panics() {
    let mut ptr = sample_ptr();
    ptr.dvas[0].offset_bytes = 1;
    ptr.to_bytes();
}

#[test]
fn indirect_child_level_is_checked() {
    let mut bytes = vec![0u8; INDIRECT_BLOCK_BYTES];
    encode_indirect(2, &[], &mut bytes);
    // Put a level-0 data pointer under a level-2 block and reseal: the checksum is right
    // but the tree is not.
    bytes[128..256].copy_from_slice(&sample_ptr().to_bytes());
    reseal(&mut bytes);
    let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
    assert_eq!(
        decode_indirect(&bytes, &mut out),
        Err(FormatError::BadField {
            field: "child level",
            value: 0
        })
    );
    // Level 0 in the header.
    let mut bytes = vec![0u8; INDIRECT_BLOCK_BYTES];
    encode_indirect(1, &[], &mut bytes);
    bytes[12] = 0;
    reseal(&mut bytes);
    assert_eq!(
        decode_indirect(&bytes, &mut out),
        Err(FormatError::BadField {
            field: "level",
            value: 0
        })
    );
}

#[test]
fn label_config_payload_length_is_checked() {
    let config = LabelConfig {
        pool_guid: Guid(1),
        pool_name: "tank".into(),
        leaf_guid: Guid(2),
        top: VdevId(0),
        create_txg: Txg(1),
        tree: VdevTreeConfig {
            top: vec![],
            spares: vec![],
        },
    };
    let mut bytes = config.encode();
    bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bytes);
    assert!(matches!(
        LabelConfig::decode(&bytes),
        Err(FormatError::BadField {
            field: "payload_bytes",
            ..
        })
    ));
    // A shorter length leaves payload bytes in the padding.
    let mut bytes = config.encode();
    bytes[12..16].copy_from_slice(&3u32.to_le_bytes());
    reseal(&mut bytes);
    assert!(LabelConfig::decode(&bytes).is_err());
}

#[test]
#[should_panic(expected = "exceeds")]
fn oversized_label_config_panics() {
    LabelConfig {
        pool_guid: Guid(1),
        pool_name: "x".repeat(LABEL_CONFIG_PAYLOAD_BYTES_MAX),
        leaf_guid: Guid(2),
        top: VdevId(0),
        create_txg: Txg(1),
        tree: VdevTreeConfig {
            top: vec![],
            spares: vec![],
        },
    }
    .encode();
}
