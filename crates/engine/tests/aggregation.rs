//! The txg sync aggregates adjacent block writes: the blocks of a txg get adjacent places
//! (next-fit, in block order), and each batch of them reaches the device as a few vectored
//! writes, not one write per block; the data is the same as block-by-block writes give.
//! A volume read of blocks that lie side by side is one device read, each block verified on
//! its own, and a bad one read again alone from another copy (and rewritten).

mod common;

use common::{mem_pool, pattern, reimport};
use oxpool_engine::vdev::{InjectKind, InjectOps, InjectRule};
use oxpool_engine::{Pool, Volume};
use oxpool_format::{TopVdevKind, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::MemoryBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const VOLUME_BYTES: u64 = 8 << 20;
const BLOCK_BYTES: u64 = 16 * 1024;

#[test]
fn a_txg_writes_adjacent_blocks_as_few_large_writes() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let v = pool
        .create_volume("v", VOLUME_BYTES, &[("volblocksize".into(), "16K".into())])
        .unwrap();
    pool.sync().unwrap();
    let before = pool.counters().device_stats()[0].io.write;
    let data = pattern(5, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    let writes = pool.counters().device_stats()[0].io.write.since(&before);
    let blocks = VOLUME_BYTES / BLOCK_BYTES;
    assert!(writes.bytes >= VOLUME_BYTES, "{writes:?}");
    // 512 data blocks and their indirect blocks (two copies) and space maps: block by block
    // that is over 512 writes; aggregated (1 MiB each) a few dozen at most.
    assert!(
        writes.ops * 8 < blocks,
        "{} device writes for {blocks} blocks: not aggregated",
        writes.ops
    );
    drop(v);
    pool.export().unwrap();
    let pool = reimport(&mems);
    let v = pool.volume("v").unwrap();
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut got)).unwrap();
    assert!(got == data, "aggregated writes put wrong bytes somewhere");
}

/// A pool of `kind` holding an 8 MiB volume of 16 KiB blocks written in one txg (so side by
/// side), reimported (nothing cached); returns it with the data.
fn written_pool(kind: TopVdevKind, devices: usize) -> (Pool, Vec<MemoryBackend>, Vec<u8>) {
    written_pool_of(kind, devices, "off", pattern(9, VOLUME_BYTES as usize))
}

/// As [`written_pool`], with `compression` and `data`.
fn written_pool_of(
    kind: TopVdevKind,
    devices: usize,
    compression: &str,
    data: Vec<u8>,
) -> (Pool, Vec<MemoryBackend>, Vec<u8>) {
    let (pool, mems) = mem_pool(kind, devices);
    let props = [
        ("volblocksize".into(), "16K".into()),
        ("compression".into(), compression.into()),
    ];
    let v = pool.create_volume("v", VOLUME_BYTES, &props).unwrap();
    block_on(v.write(0, &data, false)).unwrap();
    drop(v);
    pool.export().unwrap();
    (reimport(&mems), mems, data)
}

/// Where block `b`'s first copy starts on its device.
fn block_place(v: &Volume, b: u64) -> u64 {
    DATA_START_BYTES + block_on(v.block_pointer(b)).unwrap().dvas()[0].offset_bytes
}

#[test]
fn a_read_of_adjacent_blocks_is_one_device_read() {
    let (pool, _mems, data) = written_pool(TopVdevKind::Single, 1);
    let v = pool.volume("v").unwrap();
    // 128 KiB at 1 MiB: eight blocks the sync wrote back to back.
    assert_eq!(block_place(&v, 71), block_place(&v, 64) + 7 * BLOCK_BYTES);
    let reads = || pool.counters().device_stats()[0].io.read;
    let before = reads();
    let mut got = vec![0u8; 128 << 10];
    block_on(v.read(1 << 20, &mut got)).unwrap();
    assert!(got[..] == data[1 << 20..(1 << 20) + (128 << 10)]);
    let read = reads().since(&before);
    // Block by block it was eight; the level-1 block was read by `block_place`.
    assert_eq!(read.ops, 1, "{read:?}");
    assert_eq!(read.bytes, 128 << 10, "{read:?}");
    // The whole volume: runs of at most 1 MiB (ZFS's aggregation limit), not 512 reads.
    let before = reads();
    let mut all = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut all)).unwrap();
    assert!(all == data, "aggregated reads returned wrong bytes");
    let read = reads().since(&before);
    let blocks = VOLUME_BYTES / BLOCK_BYTES;
    assert!(read.ops * 16 < blocks, "{read:?} for {blocks} blocks");
    // Every block was verified on its own and is in the data cache: read again, no I/O.
    let before = reads();
    block_on(v.read(0, &mut all)).unwrap();
    assert!(all == data);
    assert_eq!(reads().since(&before).ops, 0);
}

#[test]
fn a_bad_block_in_a_run_fails_alone_on_one_device_and_is_repaired_on_a_mirror() {
    // One device: the run reads, block 66 does not verify; it is read again alone, fails
    // again, and the read is a checksum error, counted; its neighbours still read.
    let (pool, mems, data) = written_pool(TopVdevKind::Single, 1);
    let v = pool.volume("v").unwrap();
    mems[0].corrupt(block_place(&v, 66) + 100, 8, 1);
    let mut got = vec![0u8; 128 << 10];
    let err = block_on(v.read(1 << 20, &mut got)).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    // Once, by the run: read again alone, the copy it knows bad is not charged twice.
    assert_eq!(
        pool.status().vdevs[0].checksum_errors,
        1,
        "not counted once"
    );
    let mut one = vec![0u8; BLOCK_BYTES as usize];
    for b in [64u64, 65, 67, 71] {
        let at = (b * BLOCK_BYTES) as usize;
        block_on(v.read(at as u64, &mut one)).unwrap();
        assert!(one[..] == data[at..at + one.len()], "block {b}");
    }
    drop(v);
    drop(pool);

    // A mirror: the same block bad on the side the run reads (both sides, one after the
    // other): the block comes from the other side and its bad copy is rewritten. Under each
    // completion policy: `worker` verifies the run's blocks on the completion threads, and
    // each verdict must still be its own block's.
    for (completion, side) in ["inline", "worker", "auto"]
        .into_iter()
        .flat_map(|c| [(c, 0), (c, 1)])
    {
        let (pool, mems, data) = written_pool(TopVdevKind::Mirror, 2);
        let v = pool.volume("v").unwrap();
        pool.set_prop("completion", completion).unwrap();
        // Every read goes to the devices.
        pool.set_prop("data_cache_max", "0").unwrap();
        mems[side].corrupt(block_place(&v, 66) + 100, 8, 2);
        for _ in 0..2 {
            // Twice: the runs alternate between the sides.
            let mut got = vec![0u8; 128 << 10];
            block_on(v.read(1 << 20, &mut got)).unwrap();
            assert!(got[..] == data[1 << 20..(1 << 20) + (128 << 10)]);
        }
        let s = pool.status();
        let bad = &s.vdevs[0].children[side];
        // Once, by whichever read met it first; the careful read tries it last.
        assert_eq!(bad.checksum_errors, 1, "{completion}: {bad:?}");
        assert!(
            bad.repaired_bytes > 0,
            "{completion}: not repaired: {bad:?}"
        );
        assert_eq!(s.vdevs[0].children[1 - side].checksum_errors, 0);
        assert_eq!(
            pool.scrub().unwrap().copies_bad,
            0,
            "the bad copy is still bad"
        );
    }
}

#[test]
fn compressed_blocks_read_as_a_run_and_a_bad_one_is_repaired() {
    // Each 16 KiB block: 3000 random bytes, then zeros: lz4 stores a few KiB of it.
    let mut data = vec![0u8; VOLUME_BYTES as usize];
    for (b, block) in data.chunks_mut(BLOCK_BYTES as usize).enumerate() {
        block[..3000].copy_from_slice(&pattern(100 + b as u64, 3000));
    }
    let (pool, _mems, data) = written_pool_of(TopVdevKind::Single, 1, "lz4", data);
    let v = pool.volume("v").unwrap();
    let bp = block_on(v.block_pointer(64)).unwrap();
    assert!(
        u64::from(bp.dvas()[0].asize_bytes) < BLOCK_BYTES,
        "not compressed: {bp:?}"
    );
    let reads = || pool.counters().device_stats()[0].io.read;
    let before = reads();
    let mut got = vec![0u8; 128 << 10];
    block_on(v.read(1 << 20, &mut got)).unwrap();
    assert!(got[..] == data[1 << 20..(1 << 20) + (128 << 10)]);
    assert_eq!(reads().since(&before).ops, 1);
    drop(v);
    drop(pool);
    for side in 0..2 {
        let (pool, mems, data) = written_pool_of(TopVdevKind::Mirror, 2, "lz4", data.clone());
        pool.set_prop("data_cache_max", "0").unwrap();
        let v = pool.volume("v").unwrap();
        mems[side].corrupt(block_place(&v, 66) + 100, 8, 3);
        for _ in 0..2 {
            let mut got = vec![0u8; 128 << 10];
            block_on(v.read(1 << 20, &mut got)).unwrap();
            assert!(got[..] == data[1 << 20..(1 << 20) + (128 << 10)]);
        }
        let bad = &pool.status().vdevs[0].children[side];
        assert_eq!(bad.checksum_errors, 1, "{bad:?}");
        assert!(bad.repaired_bytes > 0, "not repaired: {bad:?}");
        assert_eq!(
            pool.scrub().unwrap().copies_bad,
            0,
            "the bad copy is still bad"
        );
    }
}

#[test]
fn a_mirror_side_that_missed_txgs_is_not_asked_for_a_run() {
    // mem1 misses the txg that rewrites 128 KiB at 1 MiB (its writes fail, the fault rule
    // is off): it lacks those blocks until a scrub; mem0 has them.
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let props = [("volblocksize".into(), "16K".into())];
    let v = pool.create_volume("v", VOLUME_BYTES, &props).unwrap();
    let mut data = pattern(9, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    pool.set_prop("fault_errors", "0").unwrap();
    let mem1 = pool.device("mem1").unwrap().0;
    pool.inject_add(InjectRule {
        id: 1,
        device: mem1,
        kind: InjectKind::Io,
        ops: InjectOps::Write,
        frequency_ppm: 1_000_000,
    })
    .unwrap();
    let new = pattern(77, 128 << 10);
    data[1 << 20..(1 << 20) + (128 << 10)].copy_from_slice(&new);
    block_on(v.write(1 << 20, &new, false)).unwrap();
    pool.sync().unwrap();
    pool.inject_clear(None);
    pool.set_prop("data_cache_max", "0").unwrap();
    let reads = |side: usize| pool.counters().device_stats()[side].io.read;
    let before = [reads(0), reads(1)];
    for _ in 0..6 {
        let mut got = vec![0u8; 128 << 10];
        block_on(v.read(1 << 20, &mut got)).unwrap();
        assert!(got[..] == data[1 << 20..(1 << 20) + (128 << 10)]);
    }
    // Every run from mem0, whatever side the rotor offered first: six reads, not the
    // eight-a-time block-by-block reads of a run given up.
    assert_eq!(reads(0).since(&before[0]).ops, 6);
    assert_eq!(reads(1).since(&before[1]).ops, 0);
    let s = pool.status();
    assert_eq!(s.vdevs[0].children[1].checksum_errors, 0, "{s:?}");
    drop(mems);
}

#[test]
fn reads_of_partly_dirty_blocks_stay_right_while_txgs_sync() {
    // Sector writes into blocks 64..72 while another thread syncs txgs without pause; reads
    // of 128 KiB across them (unaligned) must always see the newest bytes: a run planned
    // from a pointer the sync then replaces falls back to the current block.
    let (pool, _mems, mut model) = written_pool(TopVdevKind::Mirror, 2);
    pool.set_prop("data_cache_max", "0").unwrap();
    let pool = Arc::new(pool);
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded by the reads below, which set `stop`.
            while !stop.load(Ordering::Relaxed) {
                pool.sync().unwrap();
            }
        })
    };
    let v = pool.volume("v").unwrap();
    let mut x = 12345u64;
    for round in 0..400usize {
        for _ in 0..3 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (64 + (x >> 33) % 8) * BLOCK_BYTES + ((x >> 20) % 32) * 512;
            let bytes = pattern(x, 512);
            model[at as usize..at as usize + 512].copy_from_slice(&bytes);
            block_on(v.write(at, &bytes, false)).unwrap();
        }
        let mut got = vec![0u8; 128 << 10];
        let off = (1 << 20) - 4096 + (round % 5) * 1000;
        block_on(v.read(off as u64, &mut got)).unwrap();
        assert!(got[..] == model[off..off + got.len()], "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    syncer.join().unwrap();
    let s = pool.status();
    assert!(
        s.vdevs[0].children.iter().all(|c| c.checksum_errors == 0),
        "{s:?}"
    );
}
