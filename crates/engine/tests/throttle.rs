//! The write throttle keeps dirty memory bounded: under a sustained write load many times
//! `dirty_max`, dirty bytes never exceed `dirty_max` plus one write, and everything written
//! reads back.

mod common;

use common::pattern;
use oxpool_engine::{Pool, PoolProps, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

#[test]
fn dirty_data_stays_under_dirty_max() {
    let dev = MemoryBackend::new("mem0", 256 << 20);
    let mut props = PoolProps::default();
    props.set("dirty_max", "4M").unwrap();
    props.set("txg_timeout", "3600").unwrap(); // only the dirty threshold starts syncs
    let pool = Pool::create(
        "tank",
        vec![TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![Arc::new(dev.clone()) as Arc<dyn Backend>],
        }],
        props,
        false,
    )
    .unwrap();
    let v = pool.create_volume("v", 64 << 20, &[]).unwrap();
    let write_bytes: u64 = 256 << 10;
    let mut max_seen = 0;
    // 128 MiB written in all: 32x dirty_max.
    for i in 0..512u64 {
        let off = (i * write_bytes) % (64 << 20);
        block_on(v.write(off, &pattern(i, write_bytes as usize), false)).unwrap();
        max_seen = max_seen.max(pool.dirty_bytes());
    }
    assert!(
        max_seen <= (4 << 20) + write_bytes,
        "dirty bytes reached {max_seen}, limit {}",
        4 << 20
    );
    assert!(
        pool.synced_txg().0 > 10,
        "the threshold never started a sync"
    );
    let mut got = vec![0u8; write_bytes as usize];
    for i in 256..512u64 {
        let off = (i * write_bytes) % (64 << 20);
        block_on(v.read(off, &mut got)).unwrap();
        assert!(got == pattern(i, write_bytes as usize), "write {i} lost");
    }
    drop(v);
    pool.export().unwrap();
}

/// A small pool under random writes several times its size: space freed by copy-on-write comes
/// back only a few txgs later, so writers must wait for it (or get ENOSPC), never the txg sync
/// fail and suspend the pool (the bench harness found a 6 GiB pool suspended this way).
#[test]
fn random_writes_on_a_small_pool_never_suspend_it() {
    let dev = MemoryBackend::new("mem0", 64 << 20);
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    props.set("dirty_max", "1G").unwrap(); // far more than the pool: the pool must cap it
    let pool = common::single_device_pool(Arc::new(dev), props);
    let v = pool.create_volume("v", 32 << 20, &[]).unwrap();
    // 4 KiB writes into 16 KiB blocks: each dirties a whole block (4x the space per byte).
    for k in 0..20_000u64 {
        let off = ((k * 7919) % 8192) * 4096;
        block_on(v.write(off, &pattern(k, 4096), false))
            .unwrap_or_else(|e| panic!("write {k} failed: {e}"));
        if k % 1000 == 999 {
            block_on(v.flush()).unwrap();
        }
    }
    pool.sync().unwrap();
    assert_eq!(pool.status().state, "ONLINE");
    drop(v);
    pool.export().unwrap();
}
