//! Scrub while the pool serves: a writer overwrites, trims and syncs all the time, so blocks
//! are freed and their places reused under the scan. The scan must report no damage that is
//! not there (a place reused under it would read as a checksum error) and must never
//! "repair" a place that now holds newer data (the writer's data is checked at the end).
//! Real damage made while it runs is still found and repaired; `scrub_cancel` stops it.

mod common;

use common::{pattern, test_props};
use oxpool_engine::{Pool, ScanState, TopSpec};
use oxpool_format::{TopVdevKind, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BLOCK: u64 = 4096;
const VOLUME_BYTES: u64 = 4 << 20;

/// A mirror of two memory devices behind fault backends (returned, to set latencies on).
fn mirror() -> (Arc<Pool>, Vec<MemoryBackend>, Vec<Arc<FaultBackend>>) {
    let mems: Vec<MemoryBackend> = (0..2)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), 48 << 20))
        .collect();
    let faults: Vec<Arc<FaultBackend>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64)))
        .collect();
    let devices: Vec<Arc<dyn Backend>> = faults
        .iter()
        .map(|f| f.clone() as Arc<dyn Backend>)
        .collect();
    let pool = Pool::create(
        "tank",
        vec![TopSpec {
            log: false,
            kind: TopVdevKind::Mirror,
            devices,
        }],
        test_props(),
        false,
    )
    .unwrap();
    (Arc::new(pool), mems, faults)
}

/// Overwrites and trims random blocks and syncs every few changes, until `stop`; keeps
/// `model` equal to what the volume must hold.
fn churn(pool: Arc<Pool>, model: Arc<Mutex<Vec<u8>>>, stop: Arc<AtomicBool>) -> u64 {
    let vol = pool.volume("v").unwrap();
    let blocks = VOLUME_BYTES / BLOCK;
    let mut n = 0u64;
    // Bounded by `stop` and by a count far above what the scrubs need.
    while !stop.load(Ordering::Relaxed) && n < 1_000_000 {
        let b = (n.wrapping_mul(2654435761)) % blocks;
        if n.is_multiple_of(7) {
            block_on(vol.trim(b * BLOCK, BLOCK, false)).unwrap();
            model.lock().unwrap()[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].fill(0);
        } else {
            let data = pattern(n, BLOCK as usize);
            block_on(vol.write(b * BLOCK, &data, false)).unwrap();
            model.lock().unwrap()[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
                .copy_from_slice(&data);
        }
        if n % 16 == 15 {
            pool.sync().unwrap();
        }
        n += 1;
    }
    n
}

#[test]
fn scrub_under_churn_reports_no_false_damage_and_repairs_nothing_live() {
    let (pool, mems, faults) = mirror();
    let vol = pool
        .create_volume("v", VOLUME_BYTES, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let first = pattern(1, VOLUME_BYTES as usize);
    block_on(vol.write(0, &first, false)).unwrap();
    pool.sync().unwrap();
    let model = Arc::new(Mutex::new(first));
    let stop = Arc::new(AtomicBool::new(false));
    // Slow reads, fast writes and flushes: a scan batch's reads take long enough for several
    // txgs to sync, free blocks and reuse their places under it (the writer writes whole
    // blocks, so its syncs read nothing).
    for f in &faults {
        f.set_read_latency(Duration::from_millis(2));
    }
    let writer = {
        let (pool, model, stop) = (pool.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || churn(pool, model, stop))
    };
    let synced_before = pool.synced_txg();
    for round in 0..3 {
        let counts = pool.scrub().unwrap();
        assert_eq!(
            counts.copies_bad, 0,
            "round {round}: false damage: {counts:?}"
        );
        assert_eq!(counts.blocks_lost, 0, "round {round}: {counts:?}");
        assert!(counts.copies_checked > 0);
    }
    let synced_during = pool.synced_txg().0 - synced_before.0;
    stop.store(true, Ordering::Relaxed);
    let changes = writer.join().unwrap();
    assert!(
        synced_during >= 8,
        "only {synced_during} txgs synced during the scrubs: the test did not churn"
    );
    assert!(changes > 100, "{changes} changes");
    for f in &faults {
        f.set_read_latency(Duration::ZERO);
    }
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(vol.read(0, &mut got)).unwrap();
    assert!(
        got == *model.lock().unwrap(),
        "data changed under the scrub"
    );
    let status = pool.scan_status().unwrap();
    assert_eq!(status.state, ScanState::Finished);
    assert!(status.examined_bytes > 0 && status.percent_done() == 100.0);
    drop(vol);
    Arc::try_unwrap(pool).ok().unwrap().export().unwrap();
    drop(mems);
}

#[test]
fn damage_is_found_and_repaired_while_serving_and_a_scrub_can_be_stopped() {
    let (pool, mems, _faults) = mirror();
    let vol = pool
        .create_volume("v", VOLUME_BYTES, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let data = pattern(3, VOLUME_BYTES as usize);
    block_on(vol.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    // Bit flips over side 1's data area; the pool is open and keeps serving reads.
    for k in 0..64u64 {
        mems[1].corrupt(DATA_START_BYTES + k * 65_537, 16, k);
    }
    let counts = pool.scrub().unwrap();
    assert!(counts.copies_bad > 0, "damage not found: {counts:?}");
    assert_eq!(counts.copies_bad, counts.copies_repaired, "{counts:?}");
    assert_eq!(counts.blocks_lost, 0);
    assert!(pool.scan_status().unwrap().repaired_bytes > 0);
    assert_eq!(pool.scrub().unwrap().copies_bad, 0, "repair did not stick");
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(vol.read(0, &mut got)).unwrap();
    assert!(got == data);

    // A second start is refused while one runs; a stop ends it as canceled.
    pool.scrub_start().unwrap();
    let e = pool.scrub_start().unwrap_err().to_string();
    assert!(e.contains("scrubbed already"), "{e}");
    pool.scrub_cancel().unwrap();
    let status = pool.scan_wait(Duration::from_secs(60)).unwrap();
    assert_eq!(status.state, ScanState::Canceled);
    assert!(pool.scrub_cancel().is_err());
    // An export stops a running scrub rather than waiting for it.
    pool.scrub_start().unwrap();
    drop(vol);
    Arc::try_unwrap(pool).ok().unwrap().export().unwrap();
}
