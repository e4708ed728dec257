//! Every encoder's output decodes back to the value encoded.

mod common;

use common::*;
use oxpool_format::*;
use proptest::collection::vec;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn block_ptr_round_trips(ptr in arb_block_ptr()) {
        let mut bytes = [0u8; BLOCK_PTR_BYTES];
        ptr.encode(&mut bytes);
        prop_assert_eq!(BlockPtr::decode(&bytes)?, ptr);
        prop_assert_eq!(ptr.is_hole(), ptr.ndvas == 0);
        prop_assert_eq!(ptr.dvas().len(), usize::from(ptr.ndvas));
    }

    #[test]
    fn meta_index_round_trips(pieces in vec(arb_data_ptr(Some(0)), 1..40)) {
        let pieces: Vec<BlockPtr> = pieces
            .into_iter()
            .map(|mut p| {
                p.block_type = BlockType::PoolMeta;
                p.psize_bytes = p.psize_bytes.min(META_PIECE_BYTES_MAX as u32);
                p.lsize_bytes = p.psize_bytes;
                p.compression = Compression::Off;
                p
            })
            .collect();
        let bytes = encode_meta_index(&pieces);
        prop_assert_eq!(decode_meta_index(&bytes)?, pieces);
    }

    #[test]
    fn block_ptr_round_trips_through_postcard(ptr in arb_block_ptr()) {
        let bytes = postcard::to_allocvec(&ptr).unwrap();
        prop_assert_eq!(postcard::from_bytes::<BlockPtr>(&bytes).unwrap(), ptr);
    }

    #[test]
    fn uberblock_round_trips(ub in arb_uberblock()) {
        let bytes = ub.encode();
        prop_assert_eq!(bytes.len() as u64, UBERBLOCK_SLOT_BYTES);
        prop_assert_eq!(Uberblock::decode(&bytes)?, ub);
    }

    #[test]
    fn label_config_round_trips(config in arb_label_config()) {
        let bytes = config.encode();
        prop_assert_eq!(bytes.len() as u64, LABEL_CONFIG_BYTES);
        prop_assert_eq!(LabelConfig::decode(&bytes)?, config);
    }

    #[test]
    fn indirect_round_trips(
        (level, ptrs) in (1..=BLOCK_LEVEL_MAX).prop_flat_map(|level| {
            let child = prop_oneof![1 => Just(BlockPtr::HOLE), 3 => arb_data_ptr(Some(level - 1))];
            (Just(level), vec(child, 0..=INDIRECT_FANOUT))
        })
    ) {
        let mut bytes = vec![0u8; INDIRECT_BLOCK_BYTES];
        encode_indirect(level, &ptrs, &mut bytes);
        let mut out = [BlockPtr::HOLE; INDIRECT_FANOUT];
        prop_assert_eq!(decode_indirect(&bytes, &mut out)?, level);
        prop_assert_eq!(&out[..ptrs.len()], &ptrs[..]);
        prop_assert!(out[ptrs.len()..].iter().all(|p| *p == BlockPtr::HOLE));
    }

    #[test]
    fn meta_block_round_trips(kind in arb_block_type(), payload in vec(any::<u8>(), 0..20_000)) {
        let bytes = encode_meta_block(kind, &payload);
        prop_assert_eq!(bytes.len(), meta_block_bytes(payload.len()));
        prop_assert_eq!(bytes.len() as u64 % SECTOR_BYTES, 0);
        prop_assert_eq!(decode_meta_block(kind, &bytes)?, &payload[..]);
        // A caller may hand over a whole allocation, longer than the block.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0xAA; 4096]);
        prop_assert_eq!(decode_meta_block(kind, &longer)?, &payload[..]);
    }

    #[test]
    fn spacemap_chunk_round_trips(bitmap in vec(any::<u8>(), SPACEMAP_CHUNK_PAYLOAD_BYTES)) {
        let bitmap: [u8; SPACEMAP_CHUNK_PAYLOAD_BYTES] = bitmap.try_into().unwrap();
        let bytes = encode_spacemap_chunk(&bitmap);
        prop_assert_eq!(bytes.len() as u64, SECTOR_BYTES);
        prop_assert_eq!(decode_spacemap_chunk(&bytes)?, &bitmap);
    }

    #[test]
    fn pool_meta_round_trips(meta in arb_pool_meta()) {
        let bytes = meta.encode();
        prop_assert_eq!(bytes.len() as u64 % SECTOR_BYTES, 0);
        prop_assert_eq!(PoolMeta::decode(&bytes)?, meta);
    }

    #[test]
    fn tree_check_dva(tree in arb_tree(), dva in arb_dva(1)) {
        let fits = tree.top_vdev(dva.vdev).is_some_and(|top| dva.end_bytes() <= top.asize_bytes);
        prop_assert_eq!(tree.check_dva(&dva).is_ok(), fits);
        prop_assert!(tree.validate().is_ok());
    }
}

#[test]
fn hole_is_all_zero() {
    let mut bytes = [0xFFu8; BLOCK_PTR_BYTES];
    BlockPtr::HOLE.encode(&mut bytes);
    assert_eq!(bytes, [0u8; BLOCK_PTR_BYTES]);
    assert_eq!(BlockPtr::decode(&bytes), Ok(BlockPtr::HOLE));
    assert!(BlockPtr::HOLE.is_hole());
    assert!(BlockPtr::HOLE.dvas().is_empty());
    assert_eq!(BlockPtr::default(), BlockPtr::HOLE);
}

#[test]
fn empty_indirect_block_is_all_holes() {
    let mut bytes = vec![0u8; INDIRECT_BLOCK_BYTES];
    encode_indirect(1, &[], &mut bytes);
    let mut out = [sample_ptr(); INDIRECT_FANOUT];
    assert_eq!(decode_indirect(&bytes, &mut out), Ok(1));
    assert!(out.iter().all(BlockPtr::is_hole));
}

/// Freezes the byte layout documented in docs/format.md: a change here is a format change.
#[test]
fn block_ptr_layout_matches_the_documentation() {
    let ptr = sample_ptr();
    let bytes = ptr.to_bytes();
    assert_eq!(&bytes[0..8], &8192u64.to_le_bytes()); // dva[0].offset_bytes
    assert_eq!(&bytes[8..12], &16384u32.to_le_bytes()); // dva[0].asize_bytes
    assert_eq!(&bytes[12..16], &1u32.to_le_bytes()); // dva[0].vdev
    assert_eq!(&bytes[16..24], &(4096u64 * 1000).to_le_bytes()); // dva[1].offset_bytes
    assert_eq!(&bytes[28..32], &2u32.to_le_bytes()); // dva[1].vdev
    assert_eq!(&bytes[32..48], &[0u8; 16]); // dva[2] unused
    assert_eq!(bytes[48], 2); // ndvas
    assert_eq!(bytes[49], 1); // checksum_type xxh3-128
    assert_eq!(bytes[50], 0); // compression off
    assert_eq!(bytes[51], 1); // block_type data
    assert_eq!(bytes[52], 0); // level
    assert_eq!(bytes[53], BLOCK_PTR_VERSION);
    assert_eq!(&bytes[56..60], &16384u32.to_le_bytes()); // lsize
    assert_eq!(&bytes[60..64], &16384u32.to_le_bytes()); // psize
    assert_eq!(&bytes[64..72], &42u64.to_le_bytes()); // birth
    assert_eq!(&bytes[72..80], &1u64.to_le_bytes()); // fill
    assert_eq!(&bytes[80..112], &ptr.checksum.0); // checksum
    assert_eq!(&bytes[112..128], &[0u8; 16]); // reserved
}

#[test]
fn headers_match_the_documentation() {
    let ub = Uberblock {
        txg: Txg(7),
        timestamp_ns: 99,
        pool_guid: Guid(0xABCD),
        root: sample_ptr(),
    };
    let bytes = ub.encode();
    assert_eq!(&bytes[0..8], b"oxpUBERB");
    assert_eq!(&bytes[8..12], &FORMAT_VERSION.to_le_bytes());
    assert_eq!(&bytes[32..40], &7u64.to_le_bytes());
    assert_eq!(&bytes[40..48], &99u64.to_le_bytes());
    assert_eq!(&bytes[48..56], &0xABCDu64.to_le_bytes());
    assert_eq!(&bytes[64..192], &sample_ptr().to_bytes());

    let meta = encode_meta_block(BlockType::Log, b"hello");
    assert_eq!(meta.len(), 4096);
    assert_eq!(&meta[0..8], b"oxpMETAB");
    assert_eq!(meta[12], BlockType::Log as u8);
    assert_eq!(&meta[32..36], &5u32.to_le_bytes());
    assert_eq!(&meta[64..69], b"hello");

    let mut indirect = vec![0u8; INDIRECT_BLOCK_BYTES];
    encode_indirect(1, &[sample_ptr()], &mut indirect);
    assert_eq!(&indirect[0..8], b"oxpINDIR");
    assert_eq!(indirect[12], 1);
    assert_eq!(&indirect[128..256], &sample_ptr().to_bytes());

    let label = LabelConfig {
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
    let bytes = label.encode();
    assert_eq!(&bytes[0..8], b"oxpLABEL");
    let payload_bytes = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    assert_eq!(
        postcard::from_bytes::<LabelConfig>(&bytes[64..64 + payload_bytes]).unwrap(),
        label
    );
}

#[test]
fn magics_match_the_documentation() {
    assert_eq!(LABEL_CONFIG_MAGIC, 0x4c45_4241_4c70_786f);
    assert_eq!(UBERBLOCK_MAGIC, 0x4252_4542_5570_786f);
    assert_eq!(INDIRECT_MAGIC, 0x5249_444e_4970_786f);
    assert_eq!(META_MAGIC, 0x4241_5445_4d70_786f);
    assert_eq!(BLOCK_BYTES_MAX, 67_112_960);
    assert_eq!(SPACEMAP_CHUNK_SECTORS, 32_256);
    assert_eq!(LABEL_CONFIG_PAYLOAD_BYTES_MAX, 131_008);
}

#[test]
fn magics_are_distinct() {
    let magics = [
        UBERBLOCK_MAGIC,
        LABEL_CONFIG_MAGIC,
        INDIRECT_MAGIC,
        META_MAGIC,
    ];
    for (i, a) in magics.iter().enumerate() {
        for b in &magics[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn error_messages_are_one_line() {
    let errors = [
        FormatError::Empty,
        FormatError::BadMagic {
            expected: UBERBLOCK_MAGIC,
            found: 0,
        },
        FormatError::UnsupportedVersion { found: 9 },
        FormatError::BadChecksum,
        FormatError::Truncated {
            needed: 128,
            got: 3,
        },
        FormatError::BadField {
            field: "ndvas",
            value: 4,
        },
        FormatError::Payload("unexpected end".into()),
    ];
    for err in errors {
        let text = err.to_string();
        assert!(!text.is_empty() && !text.contains('\n'), "{text:?}");
    }
}

/// A PoolMeta block that format version 1 wrote (volumes without `compressed_bytes`) decodes,
/// with `compressed_bytes` derived from each volume's fill count: every block of a version 1
/// pool is stored as is, in whole sectors.
#[test]
fn version_1_pool_meta_decodes() {
    // The version 1 field order of VolumeMeta and PoolMeta.
    #[derive(serde::Serialize)]
    struct V1Volume {
        id: VolumeId,
        name: String,
        props: Vec<(String, String)>,
        volsize_bytes: u64,
        volblocksize_bytes: u32,
        root: BlockPtr,
        levels: u8,
        used_bytes: u64,
        log_first: Dva,
        log_first_seq: u64,
        log_reserved: Vec<Dva>,
    }
    #[derive(serde::Serialize)]
    struct V1Meta {
        name: String,
        guid: Guid,
        txg: Txg,
        tree: OldTree,
        props: Vec<(String, String)>,
        volumes: Vec<V1Volume>,
        spacemaps: Vec<SpaceMapMeta>,
        deferred_frees: Vec<DeferredFree>,
        next_volume_id: u64,
    }
    let mut root = sample_ptr();
    root.block_type = BlockType::Indirect;
    root.level = 1;
    root.fill = 7;
    let volume = |volblocksize_bytes| V1Volume {
        id: VolumeId(3),
        name: "v".into(),
        props: vec![("sync".into(), "always".into())],
        volsize_bytes: 1 << 20,
        volblocksize_bytes,
        root,
        levels: 1,
        used_bytes: 12345,
        log_first: Dva::default(),
        log_first_seq: 9,
        log_reserved: vec![],
    };
    let v1 = V1Meta {
        name: "old".into(),
        guid: Guid(5),
        txg: Txg(77),
        tree: OldTree { top: vec![] },
        props: vec![],
        volumes: vec![volume(16384), volume(512)],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 4,
    };
    let payload = postcard::to_allocvec(&v1).unwrap();
    let mut block = encode_meta_block(BlockType::PoolMeta, &payload);
    block[8..12].copy_from_slice(&1u32.to_le_bytes());
    reseal(&mut block[..META_HEADER_BYTES + payload.len()]);
    let meta = PoolMeta::decode(&block).unwrap();
    assert_eq!(
        (meta.name.as_str(), meta.txg, meta.next_volume_id),
        ("old", Txg(77), 4)
    );
    let v = &meta.volumes[0];
    assert_eq!((v.used_bytes, v.log_first_seq, v.root), (12345, 9, root));
    assert_eq!(v.compressed_bytes, 7 * 16384);
    // Blocks stored as is count their logical size, even under a sector (as ZFS's `psize`).
    assert_eq!(meta.volumes[1].compressed_bytes, 7 * 512);
    // The same payload under a version 2 header is refused: it lacks the new field.
    block[8..12].copy_from_slice(&2u32.to_le_bytes());
    reseal(&mut block[..META_HEADER_BYTES + payload.len()]);
    assert!(matches!(
        PoolMeta::decode(&block),
        Err(FormatError::Payload(_))
    ));
}

/// A version 2 pool (no dataset records) decodes with no snapshots; a version 3 one decodes
/// with its snapshots inline; a version 4 one with tables, origins and deadlists round-trips,
/// and its payload under an older header is refused.
#[test]
fn older_pool_meta_versions_decode_and_version_4_round_trips() {
    #[derive(serde::Serialize)]
    struct V2Meta {
        name: String,
        guid: Guid,
        txg: Txg,
        tree: OldTree,
        props: Vec<(String, String)>,
        volumes: Vec<VolumeMeta>,
        spacemaps: Vec<SpaceMapMeta>,
        deferred_frees: Vec<DeferredFree>,
        next_volume_id: u64,
    }
    let v2 = V2Meta {
        name: "two".into(),
        guid: Guid(6),
        txg: Txg(80),
        tree: OldTree { top: vec![] },
        props: vec![],
        volumes: vec![],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 2,
    };
    let payload = postcard::to_allocvec(&v2).unwrap();
    let mut block = encode_meta_block(BlockType::PoolMeta, &payload);
    block[8..12].copy_from_slice(&2u32.to_le_bytes());
    reseal(&mut block[..META_HEADER_BYTES + payload.len()]);
    let meta = PoolMeta::decode(&block).unwrap();
    assert_eq!((meta.name.as_str(), meta.next_volume_id), ("two", 2));
    assert!(meta.datasets.is_empty());

    let mut root = sample_ptr();
    root.block_type = BlockType::Indirect;
    root.level = 1;
    let bucket = DeadBucketMeta {
        key: Txg(10),
        chunks: vec![sample_ptr()],
        count: 3,
        bytes: 3 * 8192,
    };
    let snapshot = SnapshotMeta {
        name: "monday".into(),
        guid: Guid(99),
        txg: Txg(10),
        creation_s: 1_700_000_100,
        root,
        levels: 1,
        volsize_bytes: 1 << 20,
        referenced_bytes: 65536,
        written_bytes: 8192,
        compressed_bytes: 32768,
        deadlist: vec![bucket.clone()],
        holds: vec!["keep".into()],
        defer_destroy: true,
    };
    let origin = Some(OriginMeta {
        volume: VolumeId(0),
        snapshot_guid: Guid(5),
        txg: Txg(3),
    });
    let mut chunk = sample_ptr();
    chunk.block_type = BlockType::SnapshotTable;
    let mut meta = meta;
    meta.datasets.push(DatasetMeta {
        volume: VolumeId(1),
        guid: Guid(77),
        createtxg: Txg(4),
        creation_s: 1_700_000_000,
        origin: origin.clone(),
        prev_snap_txg: Txg(10),
        written_bytes: 4096,
        deadlist: vec![bucket.clone()],
        snapshot_table: vec![TableChunkMeta { chunk, entries: 1 }],
        bookmark_table: vec![],
        snapshots: vec![],
        receive_resume: Some(ReceiveResumeMeta {
            toguid: Guid(91),
            fromguid: Some(Guid(90)),
            snapshot: "b".into(),
            creation_time_ns: 1_700_000_000_000_000_000,
            volsize_bytes: 1 << 20,
            volblocksize_bytes: 16384,
            features: 1,
            offset_bytes: 65536,
        }),
    });
    let block = meta.encode();
    assert_eq!(PoolMeta::decode(&block).unwrap(), meta);
    let payload_len = u32::from_le_bytes(block[32..36].try_into().unwrap()) as usize;
    for older in [2u32, 3, 4] {
        let mut as_older = block.clone();
        as_older[8..12].copy_from_slice(&older.to_le_bytes());
        reseal(&mut as_older[..META_HEADER_BYTES + payload_len]);
        assert!(
            matches!(PoolMeta::decode(&as_older), Err(FormatError::Payload(_))),
            "version 5 payload decoded as version {older}"
        );
    }

    // Version 4: no `receive_resume` (decoded as None).
    #[derive(serde::Serialize)]
    struct V4Dataset {
        volume: VolumeId,
        guid: Guid,
        createtxg: Txg,
        creation_s: u64,
        origin: Option<OriginMeta>,
        prev_snap_txg: Txg,
        written_bytes: u64,
        deadlist: Vec<DeadBucketMeta>,
        snapshot_table: Vec<TableChunkMeta>,
        bookmark_table: Vec<TableChunkMeta>,
    }
    #[derive(serde::Serialize)]
    struct V4Meta {
        name: String,
        guid: Guid,
        txg: Txg,
        tree: OldTree,
        props: Vec<(String, String)>,
        volumes: Vec<VolumeMeta>,
        spacemaps: Vec<SpaceMapMeta>,
        deferred_frees: Vec<DeferredFree>,
        next_volume_id: u64,
        datasets: Vec<V4Dataset>,
        freeing: Vec<DeadBucketMeta>,
    }
    let v5 = &meta.datasets[meta.datasets.len() - 1];
    let v4 = V4Meta {
        name: "four".into(),
        guid: Guid(6),
        txg: Txg(80),
        tree: OldTree { top: vec![] },
        props: vec![],
        volumes: vec![],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 2,
        datasets: vec![V4Dataset {
            volume: v5.volume,
            guid: v5.guid,
            createtxg: v5.createtxg,
            creation_s: v5.creation_s,
            origin: v5.origin.clone(),
            prev_snap_txg: v5.prev_snap_txg,
            written_bytes: v5.written_bytes,
            deadlist: v5.deadlist.clone(),
            snapshot_table: v5.snapshot_table.clone(),
            bookmark_table: v5.bookmark_table.clone(),
        }],
        freeing: vec![],
    };
    let payload = postcard::to_allocvec(&v4).unwrap();
    let mut block = encode_meta_block(BlockType::PoolMeta, &payload);
    block[8..12].copy_from_slice(&4u32.to_le_bytes());
    reseal(&mut block[..META_HEADER_BYTES + payload.len()]);
    let four = PoolMeta::decode(&block).unwrap();
    let mut expected = v5.clone();
    expected.receive_resume = None;
    assert_eq!(four.datasets, vec![expected]);

    // Version 3: the snapshots inline in the dataset record, decoded into `snapshots`.
    #[derive(serde::Serialize)]
    struct V3Dataset {
        volume: VolumeId,
        guid: Guid,
        createtxg: Txg,
        creation_s: u64,
        origin: Option<OriginMeta>,
        prev_snap_txg: Txg,
        written_bytes: u64,
        deadlist: Vec<DeadBucketMeta>,
        snapshots: Vec<SnapshotMeta>,
    }
    #[derive(serde::Serialize)]
    struct V3Meta {
        name: String,
        guid: Guid,
        txg: Txg,
        tree: OldTree,
        props: Vec<(String, String)>,
        volumes: Vec<VolumeMeta>,
        spacemaps: Vec<SpaceMapMeta>,
        deferred_frees: Vec<DeferredFree>,
        next_volume_id: u64,
        datasets: Vec<V3Dataset>,
        freeing: Vec<DeadBucketMeta>,
    }
    let v3 = V3Meta {
        name: "three".into(),
        guid: Guid(6),
        txg: Txg(80),
        tree: OldTree { top: vec![] },
        props: vec![],
        volumes: vec![],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 2,
        datasets: vec![V3Dataset {
            volume: VolumeId(1),
            guid: Guid(77),
            createtxg: Txg(4),
            creation_s: 1_700_000_000,
            origin,
            prev_snap_txg: Txg(10),
            written_bytes: 4096,
            deadlist: vec![bucket],
            snapshots: vec![snapshot.clone()],
        }],
        freeing: vec![],
    };
    let payload = postcard::to_allocvec(&v3).unwrap();
    let mut block = encode_meta_block(BlockType::PoolMeta, &payload);
    block[8..12].copy_from_slice(&3u32.to_le_bytes());
    reseal(&mut block[..META_HEADER_BYTES + payload.len()]);
    let meta = PoolMeta::decode(&block).unwrap();
    assert_eq!(meta.datasets[0].snapshots, vec![snapshot]);
    assert!(meta.datasets[0].snapshot_table.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Deadlist chunks round-trip; a corrupted byte anywhere in the checksummed part is an
    /// error, never a panic or a different list.
    #[test]
    fn deadlist_chunks_round_trip(
        entries in vec(arb_block_ptr().prop_filter("no holes", |p| !p.is_hole()), 0..40),
        flip in any::<prop::sample::Index>(),
    ) {
        let block = encode_deadlist_chunk(&entries);
        prop_assert_eq!(decode_deadlist_chunk(&block)?, entries.clone());
        let payload_len = u32::from_le_bytes(block[32..36].try_into().unwrap()) as usize;
        let mut bad = block.clone();
        let at = flip.index(META_HEADER_BYTES + payload_len);
        bad[at] ^= 0x40;
        prop_assert!(decode_deadlist_chunk(&bad).is_err());
    }
}

#[test]
fn deadlist_chunks_refuse_holes_and_other_kinds() {
    let hole = encode_deadlist_chunk(&[]);
    assert!(decode_deadlist_chunk(&hole).unwrap().is_empty());
    let payload = postcard::to_allocvec(&vec![BlockPtr::HOLE]).unwrap();
    let block = encode_meta_block(BlockType::DeadList, &payload);
    assert!(decode_deadlist_chunk(&block).is_err());
    let other = encode_meta_block(
        BlockType::PoolMeta,
        &postcard::to_allocvec(&Vec::<BlockPtr>::new()).unwrap(),
    );
    assert!(decode_deadlist_chunk(&other).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Snapshot and bookmark table chunks round-trip; a corrupted byte anywhere in the
    /// checksummed part is an error, never a panic or a different table.
    #[test]
    fn table_chunks_round_trip(
        snaps in vec(arb_snapshot_meta(), 1..8),
        names in vec(arb_name(), 1..8),
        flip in any::<prop::sample::Index>(),
    ) {
        let block = encode_snapshot_chunk(&snaps);
        prop_assert_eq!(decode_snapshot_chunk(&block)?, snaps.clone());
        let payload_len = u32::from_le_bytes(block[32..36].try_into().unwrap()) as usize;
        let mut bad = block.clone();
        let at = flip.index(META_HEADER_BYTES + payload_len);
        bad[at] ^= 0x40;
        prop_assert!(decode_snapshot_chunk(&bad).is_err());
        // A snapshot chunk is not a bookmark chunk.
        prop_assert!(decode_bookmark_chunk(&block).is_err());

        let marks: Vec<BookmarkMeta> = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| BookmarkMeta { name, guid: Guid(i as u64), txg: Txg(i as u64), creation_s: 7, volsize_bytes: 1 << 20 })
            .collect();
        let block = encode_bookmark_chunk(&marks);
        prop_assert_eq!(decode_bookmark_chunk(&block)?, marks);
    }
}

/// An empty chunk or one of more than `TABLE_CHUNK_ENTRIES_MAX` records is refused.
#[test]
fn table_chunk_record_counts_are_checked() {
    let empty: Vec<BookmarkMeta> = Vec::new();
    let payload = postcard::to_allocvec(&empty).unwrap();
    let block = encode_meta_block(BlockType::BookmarkTable, &payload);
    assert!(matches!(
        decode_bookmark_chunk(&block),
        Err(FormatError::BadField { .. })
    ));
    let many: Vec<BookmarkMeta> = (0..=TABLE_CHUNK_ENTRIES_MAX as u64)
        .map(|i| BookmarkMeta {
            name: format!("b{i}"),
            guid: Guid(i),
            txg: Txg(i),
            creation_s: 0,
            volsize_bytes: 0,
        })
        .collect();
    let payload = postcard::to_allocvec(&many).unwrap();
    let block = encode_meta_block(BlockType::BookmarkTable, &payload);
    assert!(matches!(
        decode_bookmark_chunk(&block),
        Err(FormatError::BadField { .. })
    ));
}

/// A vdev tree as format versions 1 to 5 wrote it (no spares; an empty tree here).
#[derive(serde::Serialize)]
struct OldTree {
    top: Vec<u8>,
}

/// Format version 8's history: a version 7 PoolMeta (no `history`) decodes with an empty
/// history, a version 8 payload with history is refused under a version 7 header, and a
/// history chunk round-trips with its bounds checked on decode.
#[test]
fn version_7_pool_meta_decodes_with_no_history_and_history_chunks_round_trip() {
    let record = |line: &str| HistoryRecordMeta {
        time_s: 1_764_000_000,
        txg: Txg(12),
        uid: 1000,
        host: "backup-1".into(),
        line: line.into(),
    };
    let meta = PoolMeta {
        name: "tank".into(),
        guid: Guid(1),
        txg: Txg(9),
        tree: VdevTreeConfig {
            top: vec![],
            spares: vec![],
        },
        props: vec![],
        volumes: vec![],
        spacemaps: vec![],
        deferred_frees: vec![],
        next_volume_id: 3,
        datasets: vec![],
        freeing: vec![],
        history: vec![],
    };
    // Version 7's payload is version 8's without the trailing empty `history` (one zero
    // byte: postcard's length of an empty sequence).
    let block = meta.encode();
    let payload_len = u32::from_le_bytes(block[32..36].try_into().unwrap()) as usize;
    let payload = &block[META_HEADER_BYTES..META_HEADER_BYTES + payload_len];
    assert_eq!(payload.last(), Some(&0));
    let mut v7 = encode_meta_block(BlockType::PoolMeta, &payload[..payload_len - 1]);
    v7[8..12].copy_from_slice(&7u32.to_le_bytes());
    reseal(&mut v7[..META_HEADER_BYTES + payload_len - 1]);
    assert_eq!(PoolMeta::decode(&v7).unwrap(), meta);

    let mut chunk = sample_ptr();
    chunk.block_type = BlockType::History;
    let mut with_history = meta.clone();
    with_history.history = vec![TableChunkMeta { chunk, entries: 2 }];
    let block = with_history.encode();
    assert_eq!(PoolMeta::decode(&block).unwrap(), with_history);
    let payload_len = u32::from_le_bytes(block[32..36].try_into().unwrap()) as usize;
    let mut as_v7 = block.clone();
    as_v7[8..12].copy_from_slice(&7u32.to_le_bytes());
    reseal(&mut as_v7[..META_HEADER_BYTES + payload_len]);
    assert!(matches!(
        PoolMeta::decode(&as_v7),
        Err(FormatError::Payload(_))
    ));

    let records = vec![
        record("oxpool create tank /dev/sdb"),
        record("oxpool snapshot tank/vol0@mon"),
    ];
    let bytes = encode_history_chunk(&records);
    assert_eq!(decode_history_chunk(&bytes).unwrap(), records);
    // A line or a host name past its bound is refused, as a chunk of another kind is.
    for (long, field) in [
        (
            record(&"x".repeat(HISTORY_LINE_BYTES_MAX + 1)),
            "history.line",
        ),
        (
            HistoryRecordMeta {
                host: "h".repeat(HISTORY_HOST_BYTES_MAX + 1),
                ..record("oxpool sync")
            },
            "history.host",
        ),
    ] {
        let payload = postcard::to_allocvec(&vec![long]).unwrap();
        let block = encode_meta_block(BlockType::History, &payload);
        let got = decode_history_chunk(&block);
        assert!(
            matches!(got, Err(FormatError::BadField { field: f, .. }) if f == field),
            "{field}: {got:?}"
        );
    }
    // A block of another kind is not a history chunk, whatever its payload.
    let payload = postcard::to_allocvec(&records).unwrap();
    let other = encode_meta_block(BlockType::SnapshotTable, &payload);
    assert!(decode_history_chunk(&other).is_err());
}
