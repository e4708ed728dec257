//! The vdev queue under each `scheduler` mode: data written and read by concurrent threads on
//! io_uring file devices (so I/Os really overlap and wait for each other) stays correct, the
//! queue drains, and its counters show what the mode did. The property persists, pool-wide and
//! per device.

mod common;

use common::{pattern, test_props};
use oxpool_engine::{Pool, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::{block_on, join_all};
use oxpool_io::{Backend, FileBackend};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const DEVICE_BYTES: u64 = 64 << 20;
const BLOCK_BYTES: u64 = 4096;
/// Blocks each thread writes and reads at once (above every class's max_active).
const BLOCKS_PER_THREAD: u64 = 64;
const THREADS: u64 = 2;

fn devices(paths: &[PathBuf]) -> Vec<Arc<dyn Backend>> {
    paths
        .iter()
        .map(|p| Arc::new(FileBackend::open(p, Some(DEVICE_BYTES)).unwrap()) as Arc<dyn Backend>)
        .collect()
}

fn offset(thread: u64, i: u64) -> u64 {
    (thread * BLOCKS_PER_THREAD + i) * BLOCK_BYTES
}

/// Each thread writes (or reads and checks) its blocks, all in flight at once.
fn concurrent_io(pool: &Pool, write: bool, seed: u64) {
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let vol = pool.volume("vol").unwrap();
            s.spawn(move || {
                block_on(async {
                    let futs: Vec<_> = (0..BLOCKS_PER_THREAD)
                        .map(|i| {
                            let vol = &vol;
                            async move {
                                let off = offset(t, i);
                                let want = pattern(seed + off, BLOCK_BYTES as usize);
                                if write {
                                    vol.write(off, &want, false).await.unwrap();
                                } else {
                                    let mut got = vec![0u8; BLOCK_BYTES as usize];
                                    vol.read(off, &mut got).await.unwrap();
                                    assert!(got == want, "block at {off} differs");
                                }
                            }
                        })
                        .collect();
                    join_all(futs).await;
                })
            });
        }
    });
}

fn queued_and_bypassed(pool: &Pool) -> (u64, u64) {
    let mut q = (0, 0);
    for d in pool.counters().device_stats() {
        assert_eq!(d.queue.waiting, 0, "{}: the queue drained", d.name);
        assert_eq!(d.queue.active, [0; 5], "{}: nothing left active", d.name);
        q.0 += d.queue.queued.iter().sum::<u64>();
        q.1 += d.queue.bypassed.iter().sum::<u64>();
    }
    q
}

fn run(mode: &str, dir: &Path) {
    let paths: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("{mode}{i}.img"))).collect();
    let mut props = test_props();
    props.set("scheduler", mode).unwrap();
    let pool = Pool::create(
        "tank",
        vec![TopSpec {
            log: false,
            kind: TopVdevKind::Mirror,
            devices: devices(&paths),
        }],
        props,
        false,
    )
    .unwrap();
    pool.create_volume("vol", 8 << 20, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    concurrent_io(&pool, true, 1);
    pool.sync().unwrap();
    concurrent_io(&pool, false, 1);
    // Overwrite half and read again before the sync: dirty and tree reads mixed.
    concurrent_io(&pool, true, 2);
    concurrent_io(&pool, false, 2);
    pool.sync().unwrap();
    let scrub = pool.scrub().unwrap();
    assert_eq!(scrub.copies_bad, 0);

    let (queued, bypassed) = queued_and_bypassed(&pool);
    match mode {
        "on" => assert!(queued > 0 && bypassed == 0, "on: {queued} {bypassed}"),
        "off" => assert!(queued == 0 && bypassed > 0, "off: {queued} {bypassed}"),
        _ => assert!(queued + bypassed > 0),
    }
    for d in pool.counters().device_stats() {
        assert_eq!(d.scheduler, mode);
        assert!(d.io.write.ops > 0 && d.io.read.ops > 0 && d.io.flush.ops > 0);
        assert_eq!(d.io.read.total_wait.count(), d.io.read.ops);
    }
    let vols = pool.counters().volume_stats();
    assert_eq!(vols[0].io.write.ops, 2 * THREADS * BLOCKS_PER_THREAD);
    assert_eq!(
        vols[0].io.read.latency.count(),
        2 * THREADS * BLOCKS_PER_THREAD
    );

    // The property survives an export, pool-wide and per device.
    let first = paths[0].display().to_string();
    pool.set_device_prop(&first, "scheduler", "off").unwrap();
    pool.export().unwrap();
    let pool = Pool::import(devices(&paths), Some("tank")).unwrap();
    assert_eq!(pool.get_prop("scheduler").unwrap(), mode);
    assert_eq!(
        pool.get_device_prop(&first, "scheduler").unwrap(),
        ("off".to_string(), "local")
    );
    let modes: Vec<String> = pool
        .counters()
        .device_stats()
        .into_iter()
        .map(|d| d.scheduler)
        .collect();
    assert_eq!(modes, vec!["off".to_string(), mode.to_string()]);
    concurrent_io(&pool, false, 2);
    pool.export().unwrap();
}

#[test]
fn data_stays_correct_with_scheduler_on() {
    run("on", tempfile::tempdir().unwrap().path());
}

#[test]
fn data_stays_correct_with_scheduler_off() {
    run("off", tempfile::tempdir().unwrap().path());
}

#[test]
fn data_stays_correct_with_scheduler_auto() {
    run("auto", tempfile::tempdir().unwrap().path());
}
