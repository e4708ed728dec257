//! When a txg's sync starts by itself (no timeout, no FLUSH): a stream of new whole blocks
//! (a sequential write) starts one past 32 MiB, while partial writes to a hot set and
//! scattered whole-block writes wait for a fifth of `dirty_max`, as before. The rule itself
//! is `spa::txg::Dirtied`; this checks what the volume's writes tell it.

mod common;

use common::pattern;
use oxpool_engine::{Pool, PoolProps, Volume};
use oxpool_format::Txg;
use oxpool_io::rt::block_on;
use oxpool_io::MemoryBackend;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 16 << 10;

/// A pool whose syncs start only by the dirty-data thresholds: no timeout, and a fifth of
/// `dirty_max` (1 GiB, under an eighth of the 16 GiB sparse device) far above 32 MiB.
fn pool() -> Pool {
    let dev = MemoryBackend::new("mem0", 16 << 30);
    let mut props = PoolProps::default();
    props.set("dirty_max", "1G").unwrap();
    props.set("txg_timeout", "3600").unwrap();
    common::single_device_pool(Arc::new(dev), props)
}

fn volume(pool: &Pool, size_bytes: u64) -> Volume {
    let v = pool
        .create_volume("v", size_bytes, &[("volblocksize".into(), "16K".into())])
        .unwrap();
    // The volume's creation is synced, so that nothing else is dirty.
    pool.sync().unwrap();
    v
}

/// Whether a sync completed after `before` within `wait` (a bound on waiting for one that was
/// started, not a timing assertion: a sync of 40 MiB to memory takes milliseconds).
fn synced_within(pool: &Pool, before: Txg, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if pool.synced_txg() > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    pool.synced_txg() > before
}

/// A xorshift step, for scattered offsets.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn a_sequential_stream_starts_a_sync_past_32_mib() {
    let pool = pool();
    let v = volume(&pool, 256 * MIB);
    let before = pool.synced_txg();
    // 40 MiB of whole blocks in order, 1 MiB at a time.
    for i in 0..40u64 {
        block_on(v.write(i * MIB, &pattern(i, MIB as usize), false)).unwrap();
    }
    assert!(
        synced_within(&pool, before, Duration::from_secs(60)),
        "a 40 MiB sequential stream did not start a sync"
    );
}

#[test]
fn partial_writes_to_a_hot_set_wait_for_the_fifth() {
    let pool = pool();
    let v = volume(&pool, 256 * MIB);
    let before = pool.synced_txg();
    // 4 KiB writes all over a 64 MiB hot set: about 60 MiB of its 16 KiB blocks dirty, each
    // rewritten several times (what a larger txg absorbs).
    let mut x = 0x9E37_79B9_7F4A_7C15;
    let data = pattern(1, 4096);
    for _ in 0..20_000 {
        let at = next(&mut x) % (64 * MIB / 4096) * 4096;
        block_on(v.write(at, &data, false)).unwrap();
    }
    assert!(
        pool.dirty_bytes() > 40 * MIB,
        "the test must dirty more than 32 MiB ({} bytes)",
        pool.dirty_bytes()
    );
    // A sync wrongly started by the writes above would complete within this.
    assert!(
        !synced_within(&pool, before, Duration::from_secs(2)),
        "partial writes to a hot set started a sync before a fifth of dirty_max"
    );
}

#[test]
fn scattered_whole_blocks_wait_for_the_fifth() {
    let pool = pool();
    let v = volume(&pool, 4096 * MIB);
    let before = pool.synced_txg();
    // 48 MiB of whole 16 KiB blocks scattered over 4 GiB: each level-1 block (255 data
    // blocks) gets about three.
    let mut x = 0x2545_F491_4F6C_DD1D;
    let data = pattern(2, BLOCK as usize);
    for _ in 0..(48 * MIB / BLOCK) {
        let at = next(&mut x) % (4096 * MIB / BLOCK) * BLOCK;
        block_on(v.write(at, &data, false)).unwrap();
    }
    assert!(pool.dirty_bytes() > 40 * MIB);
    assert!(
        !synced_within(&pool, before, Duration::from_secs(2)),
        "scattered whole blocks started a sync before a fifth of dirty_max"
    );
}
