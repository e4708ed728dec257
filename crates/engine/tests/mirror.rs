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

/// The txg sync writes its blocks as aggregated (vectored) writes; one failing side of a
/// mirror fails its own aggregated writes only: every block still lands on the other side,
/// the sync succeeds, the errors are counted on the failing device, and the good side alone
/// holds everything. With both sides failing, the sync fails and nothing is acknowledged as
/// durable.
#[test]
fn aggregated_writes_survive_a_failing_side() {
    use common::{test_props, DEVICE_BYTES};
    use oxpool_engine::TopSpec;
    let mems: Vec<MemoryBackend> = (0..2)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), DEVICE_BYTES))
        .collect();
    let faults: Vec<Arc<FaultBackend>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64)))
        .collect();
    let devices: Vec<Arc<dyn Backend>> = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn Backend>)
        .collect();
    let tops = vec![TopSpec {
        log: false,
        kind: TopVdevKind::Mirror,
        devices,
    }];
    let pool = Pool::create("tank", tops, test_props(), false).unwrap();
    let v = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    faults[1].set_write_error_probability(1.0);
    // Many whole blocks in one txg: the sync aggregates them.
    let data = pattern(11, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().expect("one good side is enough");
    let s = pool.status();
    assert!(s.vdevs[0].children[1].write_errors > 0, "{s:?}");
    assert_eq!(s.vdevs[0].children[0].write_errors, 0, "{s:?}");
    drop(v);
    pool.export().unwrap();

    // Side 0 alone has every block.
    let only0: Vec<Arc<dyn Backend>> = vec![Arc::new(mems[0].clone())];
    let pool = Pool::import(only0, Some("tank")).unwrap();
    let v = pool.volume("v").unwrap();
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut got)).unwrap();
    assert!(got == data, "the good side lacks blocks");
    drop(v);
    drop(pool);

    // Both sides failing: the sync fails (the pool suspends), and nothing is lost that was
    // durable before.
    let faults: Vec<Arc<FaultBackend>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), 10 + i as u64)))
        .collect();
    let devices: Vec<Arc<dyn Backend>> = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn Backend>)
        .collect();
    let pool = Pool::import(devices, Some("tank")).unwrap();
    let v = pool.volume("v").unwrap();
    faults
        .iter()
        .for_each(|f| f.set_write_error_probability(1.0));
    block_on(v.write(0, &pattern(12, VOLUME_BYTES as usize), false)).unwrap();
    assert!(pool.sync().is_err(), "a sync with no good side must fail");
    drop(v);
    drop(pool);
    let all: Vec<Arc<dyn Backend>> = mems
        .iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
        .collect();
    let pool = Pool::import(all, Some("tank")).unwrap();
    let v = pool.volume("v").unwrap();
    block_on(v.read(0, &mut got)).unwrap();
    assert!(got == data, "the failed sync damaged durable data");
    drop(v);
    common::audit_clean(&pool, "after the failed sync and the crash");
}
