//! Proptest strategies and helpers shared by the integration tests.
#![allow(dead_code)]

use oxpool_format::*;
use proptest::collection::vec;
use proptest::prelude::*;

pub fn arb_checksum_type() -> impl Strategy<Value = ChecksumType> {
    prop_oneof![Just(ChecksumType::Xxh3_128), Just(ChecksumType::Blake3)]
}

pub fn arb_block_type() -> impl Strategy<Value = BlockType> {
    prop_oneof![
        Just(BlockType::Data),
        Just(BlockType::Indirect),
        Just(BlockType::PoolMeta),
        Just(BlockType::SpaceMap),
        Just(BlockType::Log),
        Just(BlockType::MetaIndex),
        Just(BlockType::DeadList),
        Just(BlockType::SnapshotTable),
        Just(BlockType::BookmarkTable),
        Just(BlockType::History),
    ]
}

pub fn arb_compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::Off),
        Just(Compression::Lz4),
        Just(Compression::Zstd),
        Just(Compression::Zle),
    ]
}

/// A valid DVA of at least `min_asize_bytes`.
pub fn arb_dva(min_asize_bytes: u32) -> impl Strategy<Value = Dva> {
    let min_sectors = u64::from(min_asize_bytes).div_ceil(SECTOR_BYTES).max(1);
    (0u32..8, 0u64..(1 << 40), 0u64..64).prop_map(move |(vdev, offset_sectors, extra_sectors)| {
        Dva {
            vdev: VdevId(vdev),
            offset_bytes: offset_sectors * SECTOR_BYTES,
            asize_bytes: ((min_sectors + extra_sectors) * SECTOR_BYTES) as u32,
        }
    })
}

fn arb_checksum_for(kind: ChecksumType) -> impl Strategy<Value = Checksum> {
    any::<[u8; 32]>().prop_map(move |mut bytes| {
        if kind == ChecksumType::Xxh3_128 {
            bytes[16..].fill(0);
        }
        Checksum(bytes)
    })
}

/// A valid non-hole block pointer at `level` (any level when None).
pub fn arb_data_ptr(level: Option<u8>) -> impl Strategy<Value = BlockPtr> {
    let level = match level {
        Some(l) => Just(l).boxed(),
        None => prop_oneof![Just(0u8), 1..=BLOCK_LEVEL_MAX].boxed(),
    };
    (
        level,
        1u32..=BLOCK_BYTES_MAX,
        1u8..=3,
        arb_checksum_type(),
        arb_block_type(),
        any::<u64>(),
        any::<u64>(),
        (arb_compression(), 1u32..1 << 20),
    )
        .prop_flat_map(
            |(
                level,
                psize,
                ndvas,
                checksum_type,
                block_type,
                birth,
                fill,
                (compression, extra),
            )| {
                // A compressed block is smaller than its logical size.
                let lsize = psize.saturating_add(extra).min(BLOCK_BYTES_MAX);
                let (compression, lsize) = if compression == Compression::Off || lsize == psize {
                    (Compression::Off, psize)
                } else {
                    (compression, lsize)
                };
                let block_type = if level > 0 {
                    BlockType::Indirect
                } else if block_type == BlockType::Indirect {
                    BlockType::Data
                } else {
                    block_type
                };
                (
                    vec(arb_dva(psize), ndvas as usize),
                    arb_checksum_for(checksum_type),
                )
                    .prop_map(move |(dva_list, checksum)| {
                        let mut dvas = [Dva::default(); 3];
                        dvas[..dva_list.len()].copy_from_slice(&dva_list);
                        BlockPtr {
                            dvas,
                            ndvas,
                            lsize_bytes: lsize,
                            psize_bytes: psize,
                            checksum_type,
                            compression,
                            block_type,
                            level,
                            birth: Txg(birth),
                            fill,
                            checksum,
                        }
                    })
            },
        )
}

/// A hole that carries fields (birth, type...) besides ndvas == 0.
pub fn arb_rich_hole() -> impl Strategy<Value = BlockPtr> {
    (
        arb_checksum_type(),
        arb_block_type(),
        any::<u8>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            |(checksum_type, block_type, level, birth, fill, lsize_bytes)| BlockPtr {
                checksum_type,
                block_type,
                level,
                birth: Txg(birth),
                fill,
                lsize_bytes,
                ..BlockPtr::HOLE
            },
        )
}

pub fn arb_block_ptr() -> impl Strategy<Value = BlockPtr> {
    prop_oneof![
        1 => Just(BlockPtr::HOLE),
        1 => arb_rich_hole(),
        6 => arb_data_ptr(None),
    ]
}

pub fn arb_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_./é-]{0,24}"
}

pub fn arb_tree() -> impl Strategy<Value = VdevTreeConfig> {
    let leaf =
        (any::<u64>(), arb_name(), any::<u64>()).prop_map(|(guid, path, size_bytes)| LeafConfig {
            guid: Guid(guid),
            path,
            size_bytes,
        });
    let top = (0u8..3, vec(leaf, 1..6), any::<u64>(), 1u8..=3, any::<u64>());
    vec(top, 0..5).prop_map(|tops| VdevTreeConfig {
        top: tops
            .into_iter()
            .enumerate()
            .map(|(i, (kind, mut children, asize_bytes, parity, txg))| {
                let kind = match kind {
                    0 => {
                        children.truncate(1);
                        TopVdevKind::Single
                    }
                    1 => TopVdevKind::Mirror,
                    _ if children.len() <= usize::from(parity) => TopVdevKind::Mirror,
                    _ => TopVdevKind::Raidz(RaidzConfig {
                        parity,
                        sector_shift: 12,
                        epochs: vec![RaidzEpoch {
                            first_txg: Txg(txg),
                            width: children.len() as u16,
                        }],
                    }),
                };
                // Every other vdev has its first child replaced (a pair), for the
                // version 6 fields.
                let pairs = if i % 2 == 1 {
                    vec![PairConfig {
                        child: 0,
                        kind: if asize_bytes % 2 == 0 {
                            PairKind::Replacing
                        } else {
                            PairKind::Spare
                        },
                        leaf: children[0].clone(),
                    }]
                } else {
                    Vec::new()
                };
                TopVdevConfig {
                    id: VdevId(i as u32),
                    kind,
                    children,
                    asize_bytes,
                    log: i % 3 == 2,
                    pairs,
                }
            })
            .collect(),
        spares: Vec::new(),
    })
}

pub fn arb_label_config() -> impl Strategy<Value = LabelConfig> {
    (
        any::<u64>(),
        arb_name(),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
        arb_tree(),
    )
        .prop_map(
            |(pool_guid, pool_name, leaf_guid, top, create_txg, tree)| LabelConfig {
                pool_guid: Guid(pool_guid),
                pool_name,
                leaf_guid: Guid(leaf_guid),
                top: VdevId(top),
                create_txg: Txg(create_txg),
                tree,
            },
        )
}

pub fn arb_uberblock() -> impl Strategy<Value = Uberblock> {
    (any::<u64>(), any::<u64>(), any::<u64>(), arb_block_ptr()).prop_map(
        |(txg, timestamp_ns, guid, root)| Uberblock {
            txg: Txg(txg),
            timestamp_ns,
            pool_guid: Guid(guid),
            root,
        },
    )
}

fn arb_props() -> impl Strategy<Value = Vec<(String, String)>> {
    vec((arb_name(), arb_name()), 0..4)
}

/// A table chunk's record (any pointer, 1 to 64 records).
pub fn arb_table_chunk() -> impl Strategy<Value = TableChunkMeta> {
    (arb_block_ptr(), 1..=64u32).prop_map(|(chunk, entries)| TableChunkMeta { chunk, entries })
}

/// A deadlist bucket's record.
pub fn arb_bucket() -> impl Strategy<Value = DeadBucketMeta> {
    (
        any::<u64>(),
        vec(arb_block_ptr(), 0..3),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(key, chunks, count, bytes)| DeadBucketMeta {
            key: Txg(key),
            chunks,
            count,
            bytes,
        })
}

/// A snapshot's record.
pub fn arb_snapshot_meta() -> impl Strategy<Value = SnapshotMeta> {
    let bucket = arb_bucket;
    (
        arb_name(),
        any::<(u64, u64, u64)>(),
        arb_block_ptr(),
        0..=BLOCK_LEVEL_MAX,
        any::<(u64, u64, u64, u64)>(),
        vec(bucket(), 0..3),
        vec(arb_name(), 0..2),
        any::<bool>(),
    )
        .prop_map(
            |(
                name,
                (guid, txg, creation_s),
                root,
                levels,
                sizes,
                deadlist,
                holds,
                defer_destroy,
            )| SnapshotMeta {
                name,
                guid: Guid(guid),
                txg: Txg(txg),
                creation_s,
                root,
                levels,
                volsize_bytes: sizes.0,
                referenced_bytes: sizes.1,
                written_bytes: sizes.2,
                compressed_bytes: sizes.3,
                deadlist,
                holds,
                defer_destroy,
            },
        )
}

pub fn arb_pool_meta() -> impl Strategy<Value = PoolMeta> {
    let volume = (
        any::<u64>(),
        arb_name(),
        arb_props(),
        any::<u64>(),
        any::<u32>(),
        arb_block_ptr(),
        0..=BLOCK_LEVEL_MAX,
        (any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |(
                id,
                name,
                props,
                volsize_bytes,
                volblocksize_bytes,
                root,
                levels,
                (used_bytes, seq),
            )| {
                VolumeMeta {
                    id: VolumeId(id),
                    name,
                    props,
                    volsize_bytes,
                    volblocksize_bytes,
                    root,
                    levels,
                    used_bytes,
                    log_first: Dva::default(),
                    log_first_seq: seq,
                    log_reserved: vec![],
                    compressed_bytes: seq.rotate_left(17),
                }
            },
        );
    let spacemap = (any::<u32>(), any::<u64>(), vec(arb_block_ptr(), 0..4)).prop_map(
        |(vdev, allocated_bytes, chunks)| SpaceMapMeta {
            vdev: VdevId(vdev),
            allocated_bytes,
            chunks,
        },
    );
    let free = (any::<u64>(), vec(arb_dva(1), 0..4)).prop_map(|(txg, dvas)| DeferredFree {
        txg: Txg(txg),
        dvas,
    });
    let bucket = arb_bucket;
    let origin = prop::option::of(any::<(u64, u64, u64)>().prop_map(|(v, g, t)| OriginMeta {
        volume: VolumeId(v),
        snapshot_guid: Guid(g),
        txg: Txg(t),
    }));
    let dataset = (
        any::<(u64, u64, u64, u64, u64, u64)>(),
        origin,
        vec(bucket(), 0..3),
        vec(arb_table_chunk(), 0..3),
        vec(arb_table_chunk(), 0..2),
        prop::option::of(arb_receive_resume()),
    )
        .prop_map(
            |(
                (volume, guid, createtxg, creation_s, prev, written),
                origin,
                deadlist,
                snapshot_table,
                bookmark_table,
                receive_resume,
            )| {
                DatasetMeta {
                    volume: VolumeId(volume),
                    guid: Guid(guid),
                    createtxg: Txg(createtxg),
                    creation_s,
                    origin,
                    prev_snap_txg: Txg(prev),
                    written_bytes: written,
                    deadlist,
                    snapshot_table,
                    bookmark_table,
                    snapshots: Vec::new(),
                    receive_resume,
                }
            },
        );
    (
        arb_name(),
        any::<u64>(),
        any::<u64>(),
        arb_tree(),
        arb_props(),
        vec(volume, 0..4),
        vec(spacemap, 0..3),
        vec(free, 0..3),
        any::<u64>(),
        vec(dataset, 0..3),
        vec(bucket(), 0..2),
        vec(arb_table_chunk(), 0..3),
    )
        .prop_map(
            |(
                name,
                guid,
                txg,
                tree,
                props,
                volumes,
                spacemaps,
                deferred_frees,
                next_volume_id,
                datasets,
                freeing,
                history,
            )| {
                PoolMeta {
                    name,
                    guid: Guid(guid),
                    txg: Txg(txg),
                    tree,
                    props,
                    volumes,
                    spacemaps,
                    deferred_frees,
                    next_volume_id,
                    datasets,
                    freeing,
                    history,
                }
            },
        )
}

/// Recomputes the self-checksum (xxh3-128 at bytes 16..32, hashed as zeros) of `covered`,
/// so a test can forge a structure whose only flaw is the field it changed.
pub fn reseal(covered: &mut [u8]) {
    let mut copy = covered.to_vec();
    copy[16..32].fill(0);
    let sum = xxhash_rust::xxh3::xxh3_128(&copy).to_le_bytes();
    covered[16..32].copy_from_slice(&sum);
}

/// A sample valid data block pointer.
pub fn sample_ptr() -> BlockPtr {
    let mut dvas = [Dva::default(); 3];
    dvas[0] = Dva {
        vdev: VdevId(1),
        offset_bytes: 8192,
        asize_bytes: 16384,
    };
    dvas[1] = Dva {
        vdev: VdevId(2),
        offset_bytes: 4096 * 1000,
        asize_bytes: 16384,
    };
    BlockPtr {
        dvas,
        ndvas: 2,
        lsize_bytes: 16384,
        psize_bytes: 16384,
        checksum_type: ChecksumType::Xxh3_128,
        compression: Compression::Off,
        block_type: BlockType::Data,
        level: 0,
        birth: Txg(42),
        fill: 1,
        checksum: checksum(ChecksumType::Xxh3_128, b"data"),
    }
}

/// Any resumable-receive record.
pub fn arb_receive_resume() -> impl Strategy<Value = ReceiveResumeMeta> {
    (
        any::<(u64, Option<u64>, u64, u64, u32, u64, u64)>(),
        "[a-z0-9_.:-]{1,20}",
    )
        .prop_map(
            |((to, from, ns, size, bs, features, offset), snapshot)| ReceiveResumeMeta {
                toguid: Guid(to),
                fromguid: from.map(Guid),
                snapshot,
                creation_time_ns: ns,
                volsize_bytes: size,
                volblocksize_bytes: bs,
                features,
                offset_bytes: offset,
            },
        )
}
