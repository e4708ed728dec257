//! Mirror self-healing: one side is corrupted by random bit flips; every read still returns
//! the written data, the errors are counted per device, and the bad side is repaired (proved by
//! then reading with the good side failing every read).

mod common;

use common::{mem_pool, pattern, reimport};
use oxpool_engine::Pool;
use oxpool_format::{TopVdevKind, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use std::sync::Arc;

const VOLUME_BYTES: u64 = 4 << 20;

#[test]
fn mirror_serves_and_repairs_a_corrupted_side() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let v = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    let data = pattern(7, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    drop(v);
    pool.export().unwrap();

    // Flip bits all over side 0's data area (metadata included).
    for k in 0..400u64 {
        mems[0].corrupt(DATA_START_BYTES + k * 24_571, 64, k);
    }
    let pool = reimport(&mems);
    let v = pool.volume("v").unwrap();
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut got)).unwrap();
    assert!(got == data, "mirror returned wrong data");
    let s = pool.status();
    let side0 = &s.vdevs[0].children[0];
    let side1 = &s.vdevs[0].children[1];
    assert!(
        side0.checksum_errors > 0,
        "corruption not counted: {side0:?}"
    );
    assert_eq!(side1.checksum_errors, 0);
    assert!(side0.repaired_bytes > 0, "nothing repaired: {side0:?}");
    // Reads repair what they touch; a scrub repairs every copy, read or not.
    let scrub = pool.scrub().unwrap();
    assert_eq!(scrub.blocks_lost, 0, "{scrub:?}");
    assert_eq!(scrub.copies_bad, scrub.copies_repaired, "{scrub:?}");
    assert_eq!(
        pool.scrub().unwrap().copies_bad,
        0,
        "second scrub still finds damage"
    );
    drop(v);
    pool.export().unwrap();

    // Side 1 now fails every read: side 0 alone must hold the right data.
    let side1 = Arc::new(FaultBackend::new(Arc::new(mems[1].clone()), 1));
    side1.set_read_error_probability(1.0);
    let devices: Vec<Arc<dyn Backend>> = vec![Arc::new(mems[0].clone()), side1];
    let pool = Pool::import(devices, Some("tank")).unwrap();
    let v = pool.volume("v").unwrap();
    let mut again = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut again)).unwrap();
    assert!(again == data, "the corrupted side was not repaired");
    assert_eq!(pool.status().vdevs[0].children[0].checksum_errors, 0);
    drop(v);
    drop(pool);
}

#[test]
fn transient_bit_flips_on_read_are_caught() {
    let mems = [
        MemoryBackend::new("a", common::DEVICE_BYTES),
        MemoryBackend::new("b", common::DEVICE_BYTES),
    ];
    let flaky = Arc::new(FaultBackend::new(Arc::new(mems[0].clone()), 9));
    let devices: Vec<Arc<dyn Backend>> = vec![flaky.clone(), Arc::new(mems[1].clone())];
    let pool = Pool::create(
        "tank",
        vec![oxpool_engine::TopSpec {
            log: false,
            kind: TopVdevKind::Mirror,
            devices,
        }],
        common::test_props(),
        false,
    )
    .unwrap();
    let v = pool.create_volume("v", 1 << 20, &[]).unwrap();
    let data = pattern(3, 1 << 20);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    // Every read must reach the devices, not the data cache.
    pool.set_prop("data_cache_max", "0").unwrap();
    flaky.set_read_bit_flip_probability(0.5);
    for round in 0..4 {
        let mut got = vec![0u8; 1 << 20];
        block_on(v.read(0, &mut got)).unwrap();
        assert!(got == data, "round {round}: wrong data");
    }
    let c = &pool.status().vdevs[0].children[0];
    assert!(c.checksum_errors > 0, "flips not counted: {c:?}");
    drop(v);
    pool.export().unwrap();
}
