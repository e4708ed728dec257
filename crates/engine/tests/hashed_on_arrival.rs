//! Whole blocks a client writes (`Volume::write_blocks`, the NBD server's path) are probed and
//! hashed on arrival, by the writer's thread, while their bytes are in its cache; the txg sync
//! then writes the incompressible ones (all of them with `compression=off`) as they are, with
//! that checksum, and hashes none of them again (`presummed_blocks`). These tests check that
//! the sync uses the checksum exactly when it still describes the block: not after the block
//! changed in the same txg, not after the volume's `checksum` changed, not for a block the
//! log already wrote in place (adopted instead), and that every block reads back and verifies
//! from the devices after an import, with a clean audit.

mod common;

use common::{audit_clean, content, mem_pool, pattern, reimport, Fill};
use oxpool_engine::{Pool, Volume};
use oxpool_format::{ChecksumType, Compression, TopVdevKind};
use oxpool_io::rt::block_on;
use oxpool_io::{IoBuf, MemoryBackend};

const BLOCK: u64 = 16384;
const BLOCKS: u64 = 32;

fn read(v: &Volume, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    block_on(v.read(off, &mut buf)).unwrap();
    buf
}

/// Hands `data` (whole blocks) to `write_blocks` at block `first`.
fn write_blocks(v: &Volume, first: u64, data: &[u8], fua: bool) {
    let mut blocks: Vec<IoBuf> = data.chunks(BLOCK as usize).map(IoBuf::from_slice).collect();
    block_on(v.write_blocks(first * BLOCK, &mut blocks, fua)).unwrap();
}

/// 4 random blocks, 2 compressible ones, 1 of zeros.
fn mixed_blocks(seed: u64) -> Vec<u8> {
    let mut data = pattern(seed, (4 * BLOCK) as usize);
    data.extend(content(Fill::Compressible, seed + 1, (2 * BLOCK) as usize));
    data.extend(vec![0u8; BLOCK as usize]);
    data
}

fn volume(pool: &Pool, props: &[(&str, &str)]) -> Volume {
    let props: Vec<(String, String)> = props
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    pool.create_volume("v", BLOCKS * BLOCK, &props).unwrap()
}

/// Reimports the pool (nothing cached: every block is read from the devices and verified)
/// and checks the volume's bytes and the audit.
fn check_after_import(mems: &[MemoryBackend], expect: &[u8], when: &str) {
    let pool = reimport(mems);
    let v = pool.volume("v").unwrap();
    assert!(
        read(&v, 0, expect.len() as u64) == expect,
        "{when}: bytes differ"
    );
    audit_clean(&pool, when);
    drop(v);
    pool.export().unwrap();
}

#[test]
fn incompressible_blocks_are_written_with_their_arrival_checksum() {
    for (setting, presummed) in [("lz4", 4), ("zstd", 4), ("off", 7)] {
        let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
        let v = volume(&pool, &[("compression", setting)]);
        let data = mixed_blocks(1);
        write_blocks(&v, 0, &data, false);
        // Before the sync, reads see the blocks as written.
        assert!(
            read(&v, 0, data.len() as u64) == data,
            "{setting}: dirty read"
        );
        pool.sync().unwrap();
        assert_eq!(
            pool.log_stats().presummed_blocks,
            presummed,
            "{setting}: blocks written with the checksum of their arrival"
        );
        for b in 0..4 {
            let bp = block_on(v.block_pointer(b)).unwrap();
            assert_eq!(bp.compression, Compression::Off, "{setting}: block {b}");
            assert_eq!(bp.checksum_type, ChecksumType::Xxh3_128);
        }
        let compressed = block_on(v.block_pointer(4)).unwrap().compression;
        let zero_is_hole = block_on(v.block_pointer(6)).unwrap().is_hole();
        if setting == "off" {
            assert_eq!(compressed, Compression::Off);
            assert!(!zero_is_hole, "compression=off writes zero blocks");
        } else {
            assert_ne!(
                compressed,
                Compression::Off,
                "{setting}: compressible block"
            );
            assert!(zero_is_hole, "{setting}: a zero block becomes a hole");
        }
        drop(v);
        pool.export().unwrap();
        let mut expect = data;
        expect.resize((BLOCKS * BLOCK) as usize, 0);
        check_after_import(&mems, &expect, setting);
    }
}

#[test]
fn a_block_changed_after_arrival_is_hashed_again() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let v = volume(&pool, &[]);
    let mut expect = pattern(2, (4 * BLOCK) as usize);
    write_blocks(&v, 0, &expect, false);
    // Block 1: 512 bytes rewritten in place; block 2: rewritten whole through `write`; in
    // the same txg, so neither arrival checksum holds any more.
    let patch = pattern(3, 512);
    block_on(v.write(BLOCK + 4096, &patch, false)).unwrap();
    expect[(BLOCK + 4096) as usize..(BLOCK + 4096 + 512) as usize].copy_from_slice(&patch);
    let whole = pattern(4, BLOCK as usize);
    block_on(v.write(2 * BLOCK, &whole, false)).unwrap();
    expect[(2 * BLOCK) as usize..(3 * BLOCK) as usize].copy_from_slice(&whole);
    assert!(read(&v, 0, 4 * BLOCK) == expect, "dirty read");
    pool.sync().unwrap();
    assert_eq!(pool.log_stats().presummed_blocks, 2, "blocks 0 and 3 only");
    drop(v);
    pool.export().unwrap();
    expect.resize((BLOCKS * BLOCK) as usize, 0);
    check_after_import(&mems, &expect, "after partial rewrites");
}

#[test]
fn a_checksum_changed_before_the_sync_is_computed_by_the_sync() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let v = volume(&pool, &[]);
    let mut expect = pattern(5, (4 * BLOCK) as usize);
    write_blocks(&v, 0, &expect, false);
    pool.set_volume_prop("v", "checksum", "blake3").unwrap();
    pool.sync().unwrap();
    assert_eq!(pool.log_stats().presummed_blocks, 0);
    for b in 0..4 {
        let bp = block_on(v.block_pointer(b)).unwrap();
        assert_eq!(bp.checksum_type, ChecksumType::Blake3, "block {b}");
    }
    drop(v);
    pool.export().unwrap();
    expect.resize((BLOCKS * BLOCK) as usize, 0);
    check_after_import(&mems, &expect, "after a change of checksum");
}

#[test]
fn blocks_the_log_wrote_in_place_are_adopted() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let v = volume(&pool, &[("logbias", "throughput")]);
    // Anchors the log's chain (its first commit waits for a txg sync).
    block_on(v.flush()).unwrap();
    let mut expect = pattern(6, (4 * BLOCK) as usize);
    write_blocks(&v, 0, &expect, true);
    pool.sync().unwrap();
    let s = pool.log_stats();
    assert_eq!(s.adopted_blocks, 4, "the sync wrote them again: {s:?}");
    assert_eq!(s.presummed_blocks, 0, "{s:?}");
    drop(v);
    pool.export().unwrap();
    expect.resize((BLOCKS * BLOCK) as usize, 0);
    check_after_import(&mems, &expect, "after adoption");
}
