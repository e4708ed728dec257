//! The txg sync aggregates adjacent block writes: the blocks of a txg get adjacent places
//! (next-fit, in block order), and each batch of them reaches the device as a few vectored
//! writes, not one write per block; the data is the same as block-by-block writes give.
//! A volume read of blocks that lie side by side is one device read, each block verified on
//! its own, and a bad one read again alone from another copy (and rewritten).

mod common;

use common::{mem_pool, pattern, reimport};
use oxpool_engine::{Pool, Volume};
use oxpool_format::{TopVdevKind, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::MemoryBackend;

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
    let (pool, mems) = mem_pool(kind, devices);
    let v = pool
        .create_volume("v", VOLUME_BYTES, &[("volblocksize".into(), "16K".into())])
        .unwrap();
    let data = pattern(9, VOLUME_BYTES as usize);
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
    assert!(pool.status().vdevs[0].checksum_errors > 0, "not counted");
    let mut one = vec![0u8; BLOCK_BYTES as usize];
    for b in [64u64, 65, 67, 71] {
        let at = (b * BLOCK_BYTES) as usize;
        block_on(v.read(at as u64, &mut one)).unwrap();
        assert!(one[..] == data[at..at + one.len()], "block {b}");
    }
    drop(v);
    drop(pool);

    // A mirror: the same block bad on the side the run reads (both sides, one after the
    // other): the block comes from the other side and its bad copy is rewritten.
    for side in 0..2 {
        let (pool, mems, data) = written_pool(TopVdevKind::Mirror, 2);
        let v = pool.volume("v").unwrap();
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
        // Once by the run; perhaps again by the careful read, if it tried that side first.
        assert!((1..=2).contains(&bad.checksum_errors), "{bad:?}");
        assert!(bad.repaired_bytes > 0, "not repaired: {bad:?}");
        assert_eq!(s.vdevs[0].children[1 - side].checksum_errors, 0);
        assert_eq!(
            pool.scrub().unwrap().copies_bad,
            0,
            "the bad copy is still bad"
        );
    }
}
