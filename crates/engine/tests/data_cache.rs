//! The data-block cache: repeated reads are served from memory, within `data_cache_max`, and
//! a hit returns exactly what a verified device read would.

mod common;

use common::{mem_pool, pattern, reimport};
use oxpool_format::{TopVdevKind, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, IoBuf, MemoryBackend};

const DATA_BYTES: usize = 1 << 20;
const BLOCK_BYTES: u64 = 16 * 1024;

fn read_all(pool: &oxpool_engine::Pool) -> oxpool_engine::Result<Vec<u8>> {
    let v = pool.volume("vol").unwrap();
    let mut out = vec![0u8; DATA_BYTES];
    // Unaligned pieces, so hits copy out of the middle of cached blocks too.
    let mut pos = 0;
    for len in [5000usize, 16384, 100, 70000].iter().cycle() {
        if pos == DATA_BYTES {
            break;
        }
        let len = (*len).min(DATA_BYTES - pos);
        block_on(v.read(pos as u64, &mut out[pos..pos + len]))?;
        pos += len;
    }
    Ok(out)
}

#[test]
fn repeated_reads_hit_stay_bounded_and_need_no_device() {
    let (pool, mems, data) = written_volume(42);
    let blocks = DATA_BYTES as u64 / BLOCK_BYTES;

    // Cold: every block is a miss, and is kept.
    let cold = pool.counters().data_cache_stats();
    assert_eq!(read_all(&pool).unwrap(), data);
    let warm = pool.counters().data_cache_stats();
    // Each block misses once: the pieces that straddle a block a previous piece read hit.
    assert_eq!(
        warm.misses,
        cold.misses + blocks,
        "each block read from the device once"
    );
    assert_eq!(warm.bytes, DATA_BYTES as u64);

    // Warm: the same reads are all hits.
    assert_eq!(read_all(&pool).unwrap(), data);
    let hot = pool.counters().data_cache_stats();
    assert_eq!(hot.misses, warm.misses, "a warm cache missed");
    assert!(hot.hits > warm.hits + blocks);

    // A small bound is honoured (16 shards of 16 KiB each at least: 256 KiB).
    pool.set_prop("data_cache_max", "256K").unwrap();
    assert!(pool.counters().data_cache_stats().bytes <= 256 << 10);
    assert_eq!(read_all(&pool).unwrap(), data);
    assert!(pool.counters().data_cache_stats().bytes <= 256 << 10);

    // Warm the whole volume again, then destroy the data on the device: hits need no device
    // I/O, so the reads still return the data. With the cache off, the damage shows.
    pool.set_prop("data_cache_max", "64M").unwrap();
    assert_eq!(read_all(&pool).unwrap(), data);
    let garbage = IoBuf::from_slice(&pattern(7, 8 << 20));
    block_on(mems[0].write(DATA_START_BYTES, garbage)).unwrap();
    assert_eq!(
        read_all(&pool).unwrap(),
        data,
        "cached reads touched the device"
    );
    pool.set_prop("data_cache_max", "0").unwrap();
    assert_eq!(pool.counters().data_cache_stats().bytes, 0);
    let err = read_all(&pool).expect_err("reads of destroyed blocks must fail their checksum");
    assert!(err.to_string().contains("checksum"), "{err}");
    drop(pool);
}

/// A pool on one memory device with volume `vol` (16 KiB blocks) whose first `DATA_BYTES`
/// are `pattern(seed)`, written, exported and imported again: nothing in the data cache.
/// Also the device, and the data.
fn written_volume(seed: u64) -> (oxpool_engine::Pool, Vec<MemoryBackend>, Vec<u8>) {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    pool.create_volume(
        "vol",
        4 << 20,
        &[("volblocksize".into(), BLOCK_BYTES.to_string())],
    )
    .unwrap();
    let data = pattern(seed, DATA_BYTES);
    block_on(pool.volume("vol").unwrap().write(0, &data, false)).unwrap();
    pool.export().unwrap();
    (reimport(&mems), mems, data)
}

/// The bytes of a `read_shared` put back together, its copied parts from `out`.
fn glued(parts: &[oxpool_engine::ReadPart], out: &[u8]) -> Vec<u8> {
    parts.iter().flat_map(|p| p.bytes(out).to_vec()).collect()
}

/// `read_shared` hands cached blocks by reference (the NBD server sends them as they are):
/// what it handed stays the bytes read for as long as the caller holds it, while a write
/// changes those blocks and a sync writes them out; reads after the write see the new
/// bytes; and the parts put together are exactly the read, cached blocks and dirty pieces
/// inside them alike.
#[test]
fn shared_reads_keep_their_bytes_while_a_writer_changes_the_blocks() {
    use oxpool_engine::ReadPart;
    let (pool, _mems, mut data) = written_volume(42);
    let v = pool.volume("vol").unwrap();
    assert_eq!(read_all(&pool).unwrap(), data, "warms the cache");

    // Unaligned at both ends: 17 blocks, every one shared (the end ones in part).
    let (off, len) = (5000usize, 256 * 1024 + 1000);
    let mut out = vec![0u8; len];
    let mut parts = Vec::new();
    block_on(v.read_shared(off as u64, &mut out, &mut parts)).unwrap();
    let shared_count = parts
        .iter()
        .filter(|p| matches!(p, ReadPart::Shared { .. }))
        .count();
    assert_eq!(shared_count, 17, "the cached blocks are shared: {parts:?}");
    assert_eq!(parts.len(), 17, "nothing copied: {parts:?}");
    assert_eq!(glued(&parts, &out), data[off..off + len]);

    // A writer changes every block of the range (whole and partial) and a sync writes them:
    // the parts held still read as before.
    let new = pattern(43, len);
    block_on(v.write(off as u64, &new, false)).unwrap();
    assert_eq!(glued(&parts, &out), data[off..off + len], "before the sync");
    pool.sync().unwrap();
    assert_eq!(glued(&parts, &out), data[off..off + len], "after the sync");
    data[off..off + len].copy_from_slice(&new);
    drop(parts);
    let mut parts = Vec::new();
    block_on(v.read_shared(off as u64, &mut out, &mut parts)).unwrap();
    assert_eq!(
        glued(&parts, &out),
        data[off..off + len],
        "reads see the write"
    );

    // Cached again, then dirty 4 KiB pieces inside cached blocks: one read of shared blocks
    // and copied pieces.
    assert_eq!(read_all(&pool).unwrap(), data);
    for piece_off in [16 * 1024 + 4096, 160 * 1024 + 100] {
        let piece = pattern(piece_off as u64, 4096);
        block_on(v.write(piece_off as u64, &piece, false)).unwrap();
        data[piece_off..piece_off + 4096].copy_from_slice(&piece);
    }
    let mut out = vec![0u8; 256 * 1024];
    block_on(v.read_shared(0, &mut out, &mut parts)).unwrap();
    assert!(parts.iter().any(|p| matches!(p, ReadPart::Shared { .. })));
    assert!(parts.iter().any(|p| matches!(p, ReadPart::Copied(_))));
    assert_eq!(glued(&parts, &out), data[..256 * 1024]);
    drop(parts);
    drop(pool);
}

/// `read_shared` of blocks that must come from the devices: a block whose bytes in the read
/// all come from the device (the ends in part) is not copied into the output but becomes a
/// part, shared with the data cache when the cache keeps it, handed over when the cache is
/// off; blocks with dirty pieces inside are copied. Either way the parts put together are exactly the read,
/// and they keep their bytes while a writer changes the blocks.
#[test]
fn shared_reads_of_blocks_from_the_devices_hand_them_over() {
    use oxpool_engine::ReadPart;
    let count =
        |parts: &[ReadPart], kind: fn(&ReadPart) -> bool| parts.iter().filter(|p| kind(p)).count();
    let shared = |p: &ReadPart| matches!(p, ReadPart::Shared { .. });
    let owned = |p: &ReadPart| matches!(p, ReadPart::Owned { .. });
    let copied = |p: &ReadPart| matches!(p, ReadPart::Copied(_));
    // Cold cache: 17 blocks touched (the first and last in part), read from the device and
    // shared with the cache, which now holds them: nothing copied.
    let (pool, _mems, mut data) = written_volume(44);
    let v = pool.volume("vol").unwrap();
    let (off, len) = (5000usize, 16 * BLOCK_BYTES as usize + 1000);
    let mut out = vec![0u8; len];
    let mut parts = Vec::new();
    let before = pool.counters().data_cache_stats();
    block_on(v.read_shared(off as u64, &mut out, &mut parts)).unwrap();
    assert_eq!(count(&parts, shared), 17, "{parts:?}");
    assert_eq!(parts.len(), 17, "{parts:?}");
    assert_eq!(glued(&parts, &out), data[off..off + len]);
    let after = pool.counters().data_cache_stats();
    assert_eq!(
        after.misses - before.misses,
        17,
        "each block read from the device"
    );
    assert_eq!(after.bytes, 17 * BLOCK_BYTES, "the blocks read are cached");
    // The cached blocks are the shared ones: the same read again shares every block.
    let mut again = Vec::new();
    block_on(v.read_shared(off as u64, &mut out, &mut again)).unwrap();
    assert_eq!(count(&again, shared), 17, "{again:?}");
    assert_eq!(glued(&again, &out), data[off..off + len]);
    drop((parts, again));

    // The cache off: the blocks are handed over.
    pool.set_prop("data_cache_max", "0").unwrap();
    let mut parts = Vec::new();
    block_on(v.read_shared(off as u64, &mut out, &mut parts)).unwrap();
    assert_eq!(count(&parts, owned), 17, "{parts:?}");
    assert_eq!(parts.len(), 17, "{parts:?}");
    assert_eq!(glued(&parts, &out), data[off..off + len]);
    // Handed over means theirs: a write and a sync of the same blocks leave them as read.
    let new = pattern(45, len);
    block_on(v.write(off as u64, &new, false)).unwrap();
    pool.sync().unwrap();
    assert_eq!(glued(&parts, &out), data[off..off + len], "after the sync");
    data[off..off + len].copy_from_slice(&new);
    drop(parts);

    // Dirty 4 KiB pieces inside blocks that are not in memory: those blocks are copied (the
    // dirty bytes over the device's), the others handed over, and the bytes are the newest.
    for piece_off in [
        3 * BLOCK_BYTES as usize + 4096,
        9 * BLOCK_BYTES as usize + 100,
    ] {
        let piece = pattern(piece_off as u64, 4096);
        block_on(v.write(piece_off as u64, &piece, false)).unwrap();
        data[piece_off..piece_off + 4096].copy_from_slice(&piece);
    }
    let mut out = vec![0u8; 16 * BLOCK_BYTES as usize];
    let mut parts = Vec::new();
    block_on(v.read_shared(0, &mut out, &mut parts)).unwrap();
    assert_eq!(count(&parts, owned), 14, "{parts:?}");
    assert_eq!(count(&parts, copied), 2, "{parts:?}");
    assert_eq!(glued(&parts, &out), data[..16 * BLOCK_BYTES as usize]);
    drop(parts);
    drop(pool);
}
