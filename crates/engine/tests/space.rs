//! Space: a txg sync never runs out of space the write throttle let writers use; writers get
//! ENOSPC first; a pool half full never reports out of space, however fragmented its free
//! space is.
//!
//! The bench found a 6 GiB pool with a 2 GiB volume of 4 KiB blocks suspended ("txg 32 sync
//! failed: out of space") with half its space free: random 4 KiB rewrites had left free space
//! in single-sector holes, and the sync could place neither a 32 KiB indirect block nor its
//! pool metadata block (hundreds of KiB of deferred frees), both contiguous.

mod common;

use common::pattern;
use oxpool_engine::{EngineError, Pool, PoolProps, Volume};
use oxpool_format::{BlockType, TopVdevKind};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

const BLOCK: u64 = 4096;

fn pool_on(dev: &MemoryBackend) -> Pool {
    let mut props = PoolProps::default();
    // Txgs end where the test says, or at the dirty-data and log-space thresholds.
    props.set("txg_timeout", "3600").unwrap();
    common::single_device_pool(Arc::new(dev.clone()), props)
}

fn reimport(dev: &MemoryBackend) -> Pool {
    Pool::import(
        vec![Arc::new(dev.clone()) as Arc<dyn Backend>],
        Some("tank"),
    )
    .unwrap()
}

/// A 4 KiB-block volume of `bytes`, written whole with 1 MiB writes (as the bench
/// preconditions); returns the seed of every block's content.
fn filled_volume(pool: &Pool, bytes: u64) -> (Volume, Vec<u64>) {
    let vol = pool
        .create_volume("v", bytes, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let chunk = 1 << 20;
    let mut seeds = vec![0; (bytes / BLOCK) as usize];
    for c in 0..bytes / chunk {
        let mut data = Vec::with_capacity(chunk as usize);
        for b in 0..chunk / BLOCK {
            let seed = 1_000_000_000 + c * (chunk / BLOCK) + b;
            data.extend_from_slice(&pattern(seed, BLOCK as usize));
            seeds[(c * (chunk / BLOCK) + b) as usize] = seed;
        }
        block_on(vol.write(c * chunk, &data, false)).unwrap();
    }
    pool.sync().unwrap();
    (vol, seeds)
}

fn verify(vol: &Volume, seeds: &[u64]) {
    let mut got = vec![0u8; BLOCK as usize];
    for (b, &seed) in seeds.iter().enumerate() {
        block_on(vol.read(b as u64 * BLOCK, &mut got)).unwrap();
        assert!(
            got == pattern(seed, BLOCK as usize),
            "block {b} lost its data"
        );
    }
}

/// xorshift: deterministic block numbers.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// The bench's failure, small: a 4K-block volume over half the pool, rewritten at random with
/// a flush after every write (each commit writes an 8 KiB log block) and a txg sync every
/// 1500 writes (under the dirty-data and log-space thresholds, so the test decides where txgs
/// end). Before the fix a sync failed within 35,000 to 50,000 writes, every run: the pool was
/// a fifth free, all in holes of a few sectors, and a 32 KiB indirect block found no room.
#[test]
fn random_4k_sync_writes_never_fill_a_half_full_pool() {
    let dev = MemoryBackend::new("mem0", 256 << 20);
    let pool = pool_on(&dev);
    let (vol, mut seeds) = filled_volume(&pool, 128 << 20);
    let blocks = seeds.len() as u64;
    let mut x = 0x1234_5678u64;
    let mut seed = 0;
    for round in 0..80 {
        for _ in 0..1500 {
            let b = next(&mut x) % blocks;
            seed += 1;
            let r = block_on(vol.write(b * BLOCK, &pattern(seed, BLOCK as usize), false))
                .and_then(|()| block_on(vol.flush()));
            if let Err(e) = r {
                panic!(
                    "round {round}, write {seed}: {e} (pool {:?})",
                    pool.status().state
                );
            }
            seeds[b as usize] = seed;
        }
        pool.sync()
            .unwrap_or_else(|e| panic!("round {round}: sync: {e}"));
    }
    assert_eq!(pool.status().state, "ONLINE");
    verify(&vol, &seeds);
    drop(vol);
    pool.export().unwrap();
    let pool = reimport(&dev);
    verify(&pool.volume("v").unwrap(), &seeds);
    let counts = pool.scrub().unwrap();
    assert_eq!(counts.copies_bad, 0);
    pool.export().unwrap();
}

/// A pool that really is nearly full: writers get ENOSPC (an NBD error), never the sync, and
/// the pool stays online; once a trim gives space back, writes succeed again.
#[test]
fn a_full_pool_refuses_writers_and_never_suspends() {
    let dev = MemoryBackend::new("mem0", 64 << 20);
    let pool = pool_on(&dev);
    // A volume larger than what the pool can hold: the fill stops with ENOSPC.
    let vol = pool
        .create_volume("v", 60 << 20, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let chunk = 256 << 10;
    let mut filled = 0;
    let mut refused = 0;
    for c in 0..(60 << 20) / chunk {
        match block_on(vol.write(c * chunk, &pattern(c, chunk as usize), false)) {
            Ok(()) => filled = c + 1,
            Err(e @ EngineError::NoSpace { .. }) => {
                // The error says where the free space is, not only that there is none.
                let said = e.to_string();
                assert!(
                    said.contains("in empty slabs")
                        && said.contains("kept for the txg sync")
                        && said.contains("oxpool add"),
                    "{said}"
                );
                refused += 1;
                break;
            }
            Err(e) => panic!("fill {c}: {e}"),
        }
    }
    assert_eq!(refused, 1, "the pool never filled");
    assert!(filled > 0);
    // Random 4 KiB sync rewrites of what was written: the pool has no room left for their
    // copy-on-write, so some are refused; none may suspend the pool.
    let mut x = 0x9e37_79b9u64;
    let mut refused = 0;
    for k in 0..300 {
        let b = next(&mut x) % (filled * chunk / BLOCK);
        let r = block_on(vol.write(b * BLOCK, &pattern(k, BLOCK as usize), false))
            .and_then(|()| block_on(vol.flush()));
        match r {
            Ok(()) => {}
            Err(EngineError::NoSpace { .. }) => refused += 1,
            Err(e) => panic!("rewrite {k}: {e}"),
        }
    }
    assert_eq!(pool.status().state, "ONLINE");
    eprintln!("{refused} of 300 rewrites refused");
    // Free most of it: writes go through again.
    block_on(vol.trim(0, filled * chunk * 3 / 4, false)).unwrap();
    pool.sync().unwrap();
    pool.sync().unwrap();
    pool.sync().unwrap();
    for k in 0..100u64 {
        let b = next(&mut x) % (filled * chunk / BLOCK);
        block_on(vol.write(b * BLOCK, &pattern(k, BLOCK as usize), true)).unwrap();
    }
    assert_eq!(pool.status().state, "ONLINE");
    drop(vol);
    pool.export().unwrap();
}

/// The pool metadata lists every block freed in the last txgs: a large trim makes it larger
/// than the largest block the allocator places (256 KiB), so it is written in pieces named by
/// an index; import reads it back, and the blocks it lists are freed in time.
#[test]
fn pool_metadata_larger_than_a_slab_is_written_in_pieces() {
    let dev = MemoryBackend::new("mem0", 384 << 20);
    let pool = pool_on(&dev);
    let (vol, mut seeds) = filled_volume(&pool, 256 << 20);
    let allocated_full = pool.status().allocated_bytes;
    // 61,440 blocks freed in one txg: their places make a list of about 430 KiB.
    let trimmed = 240 << 20;
    block_on(vol.trim(0, trimmed, false)).unwrap();
    pool.sync().unwrap();
    for s in &mut seeds[..(trimmed / BLOCK) as usize] {
        *s = u64::MAX;
    }
    let roots: Vec<BlockType> = block_on(oxpool_engine::vdev::label::read_uberblocks(&dev))
        .iter()
        .filter(|u| u.txg == pool.synced_txg())
        .map(|u| u.root.block_type)
        .collect();
    assert_eq!(roots.first(), Some(&BlockType::MetaIndex), "not split");
    drop(vol);
    pool.export().unwrap();
    // The export's txg still lists the trim's frees: import reads the pieces.
    let pool = reimport(&dev);
    let vol = pool.volume("v").unwrap();
    let mut got = vec![0u8; BLOCK as usize];
    for (b, &seed) in seeds.iter().enumerate() {
        block_on(vol.read(b as u64 * BLOCK, &mut got)).unwrap();
        if seed == u64::MAX {
            assert!(got.iter().all(|&x| x == 0), "trimmed block {b} not zero");
        } else {
            assert!(
                got == pattern(seed, BLOCK as usize),
                "block {b} lost its data"
            );
        }
    }
    assert_eq!(pool.scrub().unwrap().copies_bad, 0);
    // Once the deferral has passed, the trimmed space is free again.
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let allocated = pool.status().allocated_bytes;
    assert!(
        allocated + (trimmed * 9 / 10) < allocated_full,
        "trimmed space not freed: {allocated} of {allocated_full} still allocated"
    );
    drop(vol);
    pool.export().unwrap();
}

/// What a txg frees leaves the allocated figure (`oxpool list`'s ALLOC) once that txg is
/// synced, as in ZFS, though the places become allocatable only `DEFER_TXGS` txgs later: an
/// idle pool syncs no later txg, and a destroy's space did not show until more writes came.
#[test]
fn frees_leave_the_allocated_figure_when_their_txg_is_synced() {
    let dev = MemoryBackend::new("mem0", 64 << 20);
    let pool = pool_on(&dev);
    let vol = pool
        .create_volume("v", 8 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    block_on(vol.write(0, &pattern(1, 4 << 20), false)).unwrap();
    // Past the deferral of everything the writes' txg replaced.
    for _ in 0..5 {
        pool.sync().unwrap();
    }
    let before = pool.status().allocated_bytes;
    block_on(vol.trim(0, 4 << 20, false)).unwrap();
    pool.sync().unwrap();
    let after = pool.status().allocated_bytes;
    // The 4 MiB and their indirect blocks go; the sync's own metadata comes and goes.
    assert!(
        after + (4 << 20) - (64 << 10) <= before,
        "allocated {before} before the trim's txg, {after} after it"
    );
    // A scrub's total is the same figure: the freed places are no blocks it visits.
    pool.scrub().unwrap();
    let total = pool.scan_status().expect("a scrub ran").total_bytes;
    assert!(
        total + (4 << 20) - (64 << 10) <= before,
        "the scrub's total {total} counts the trimmed blocks (allocated {before} before)"
    );
    pool.export().unwrap();
}

/// Free space held in the slots of one block size takes blocks of smaller sizes once the
/// empty slabs are down to the reserve. A new user's raidz2 pool refused every write at 29 %
/// allocated: its free space was in the data blocks' slots, and the metadata and smaller
/// blocks a write needs had only the reserve's empty slabs.
/// Here: a 64K-block volume fills the pool, every other block is trimmed (each slab keeps
/// about half its slots of that class), and 8 MiB of a 4K-block volume is then written: more
/// than the empty slabs beyond the reserve hold, so it needs slabs of the 64K blocks' class.
#[test]
fn smaller_blocks_use_the_free_slots_of_larger_ones() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    // One 64 MiB device: 64 KiB blocks in 64 KiB slots, 4 KiB blocks in 4 KiB ones.
    let (pool, mems) = common::mem_pool_with(TopVdevKind::Single, 1, props.clone());
    fill_trim_then_write_small_blocks(pool, &mems);
    // A 5-wide raidz2: 64 KiB blocks take 30 sectors (32-sector slots), 4 KiB blocks 3
    // (4-sector slots), 32 KiB indirect blocks 15 (16-sector slots).
    let (pool, mems) = common::mem_pool_with(common::raidz(2), 5, props);
    fill_trim_then_write_small_blocks(pool, &mems);
}

fn fill_trim_then_write_small_blocks(pool: Pool, mems: &[MemoryBackend]) {
    let big_block: u64 = 64 << 10;
    let big_volume_bytes = pool.status().size_bytes;
    let big = pool
        .create_volume(
            "big",
            big_volume_bytes / big_block * big_block,
            &[
                ("volblocksize".into(), "64K".into()),
                ("compression".into(), "off".into()),
            ],
        )
        .unwrap();
    let mut filled = 0;
    for b in 0..big_volume_bytes / big_block {
        match block_on(big.write(b * big_block, &pattern(b, big_block as usize), false)) {
            Ok(()) => filled = b + 1,
            Err(EngineError::NoSpace { .. }) => break,
            Err(e) => panic!("fill {b}: {e}"),
        }
    }
    assert!(
        filled > 0 && filled < big_volume_bytes / big_block,
        "filled {filled}"
    );
    for b in (0..filled).step_by(2) {
        block_on(big.trim(b * big_block, big_block, false)).unwrap();
    }
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let status = pool.status();
    eprintln!(
        "{}: {filled} blocks of 64 KiB written, half trimmed: {} of {} allocated",
        status.vdevs[0].name, status.allocated_bytes, status.size_bytes
    );
    // A quarter of the pool is free, in slots of the 64 KiB blocks' class.
    assert!(status.allocated_bytes * 10 < status.size_bytes * 7);
    let small = pool
        .create_volume(
            "small",
            16 << 20,
            &[
                ("volblocksize".into(), "4K".into()),
                ("compression".into(), "off".into()),
            ],
        )
        .unwrap();
    let chunk: u64 = 64 << 10;
    for c in 0..(8 << 20) / chunk {
        block_on(small.write(c * chunk, &pattern(1000 + c, chunk as usize), false))
            .and_then(|()| block_on(small.flush()))
            .unwrap_or_else(|e| panic!("4 KiB blocks, write {c}: {e}"));
    }
    pool.sync().unwrap();
    assert_eq!(pool.status().state, "ONLINE");
    drop((big, small));
    pool.export().unwrap();
    let pool = common::reimport(mems);
    let (big, small) = (pool.volume("big").unwrap(), pool.volume("small").unwrap());
    let mut got = vec![0u8; big_block as usize];
    for b in 0..filled {
        block_on(big.read(b * big_block, &mut got)).unwrap();
        if b % 2 == 0 {
            assert!(got.iter().all(|&x| x == 0), "trimmed block {b} not zero");
        } else {
            assert!(got == pattern(b, big_block as usize), "64K block {b} lost");
        }
    }
    for c in 0..(8 << 20) / chunk {
        block_on(small.read(c * chunk, &mut got)).unwrap();
        assert!(got == pattern(1000 + c, chunk as usize), "4K blocks at {c}");
    }
    common::audit_clean(&pool, "after the small blocks");
    drop((big, small));
    pool.export().unwrap();
}

/// `available` (the AVAIL of `oxpool list -t volume`, as ZFS's) is what writers can fill:
/// written down to 95 % of it, nothing is refused and the figure drops by what was written
/// (and a little metadata); the fill then meets ENOSPC before 105 % of it.
#[test]
fn available_is_what_writers_can_fill() {
    let dev = MemoryBackend::new("mem0", 64 << 20);
    let pool = pool_on(&dev);
    let vol = pool
        .create_volume("v", 60 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    pool.sync().unwrap();
    let status = pool.status();
    let free = status.size_bytes - status.allocated_bytes;
    let available = pool.available_bytes();
    // The reserve: a 4 MiB slop (the least) and a slab per class.
    assert!(
        available < free && available + (8 << 20) > free,
        "available {available} of {free} free"
    );
    let chunk = 256u64 << 10;
    let mut written = 0;
    while written + chunk <= available * 95 / 100 {
        block_on(vol.write(written, &pattern(written, chunk as usize), false))
            .unwrap_or_else(|e| panic!("refused at {written} of {available} available: {e}"));
        written += chunk;
    }
    pool.sync().unwrap();
    let left = pool.available_bytes();
    assert!(
        left + written <= available && available - left - written < written / 50 + (1 << 20),
        "available {available} before {written} bytes written, {left} after"
    );
    let mut refused_at = None;
    // Bounded by the volume's size.
    while written + chunk <= 60 << 20 {
        match block_on(vol.write(written, &pattern(written, chunk as usize), false)) {
            Ok(()) => written += chunk,
            Err(EngineError::NoSpace { .. }) => {
                refused_at = Some(written);
                break;
            }
            Err(e) => panic!("fill at {written}: {e}"),
        }
    }
    let refused_at = refused_at.expect("the pool never filled");
    assert!(
        refused_at <= available * 105 / 100,
        "writes went on to {refused_at} bytes with {available} available"
    );
    assert_eq!(pool.status().state, "ONLINE");
}
