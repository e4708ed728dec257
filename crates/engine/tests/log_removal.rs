//! Removing a separate log device (`oxpool remove POOL LOG`), and importing a pool whose log
//! device is gone (`oxpool import -m`): sync writes keep their promise across the removal,
//! the removed vdev leaves a hole whose index no other vdev takes, a crash at any point
//! imports, and every case ends with an audit.

mod common;

use common::{audit_clean, pattern, test_props};
use oxpool_engine::vdev::label::read_label;
use oxpool_engine::{ImportOptions, Pool, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

fn spec(kind: TopVdevKind, devs: &[&MemoryBackend], log: bool) -> TopSpec {
    TopSpec {
        log,
        kind,
        devices: devs
            .iter()
            .map(|d| Arc::new((*d).clone()) as Arc<dyn Backend>)
            .collect(),
    }
}

fn single(dev: &MemoryBackend, log: bool) -> TopSpec {
    spec(TopVdevKind::Single, &[dev], log)
}

fn backends(devs: &[&MemoryBackend]) -> Vec<Arc<dyn Backend>> {
    devs.iter()
        .map(|d| Arc::new((*d).clone()) as Arc<dyn Backend>)
        .collect()
}

/// A pool `tank` of a data device `data0` and a log device `slog0`.
fn data_and_log() -> (Pool, MemoryBackend, MemoryBackend) {
    let data = MemoryBackend::new("data0", 64 << 20);
    let slog = MemoryBackend::new("slog0", 32 << 20);
    let pool = Pool::create(
        "tank",
        vec![single(&data, false), single(&slog, true)],
        test_props(),
        false,
    )
    .unwrap();
    (pool, data, slog)
}

/// A pool `tank` of a data device `data0` and a log mirror of `sloga` and `slogb`.
fn data_and_log_mirror() -> (Pool, MemoryBackend, MemoryBackend, MemoryBackend) {
    let data = MemoryBackend::new("data0", 64 << 20);
    let (a, b) = (
        MemoryBackend::new("sloga", 32 << 20),
        MemoryBackend::new("slogb", 32 << 20),
    );
    let pool = Pool::create(
        "tank",
        vec![
            single(&data, false),
            spec(TopVdevKind::Mirror, &[&a, &b], true),
        ],
        test_props(),
        false,
    )
    .unwrap();
    (pool, data, a, b)
}

/// FUA writes `ns`: write `n` to slot `n % 64` (what [`check_slots`] checks).
fn fua_writes(vol: &oxpool_engine::Volume, ns: std::ops::Range<u64>) {
    for n in ns {
        block_on(vol.write((n % 64) * 4096, &pattern(1000 + n, 4096), true)).unwrap();
    }
}

/// Writes through the log device's device statistics.
fn device_writes(pool: &Pool, name: &str) -> u64 {
    pool.counters()
        .device_stats()
        .iter()
        .find(|d| d.name == name)
        .map_or(0, |d| d.io.write.ops)
}

/// A thread of FUA writes, write `n` to slot `n % 64`, until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<u64>,
}

impl Writer {
    fn start(vol: &oxpool_engine::Volume) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let thread = {
            let (vol, stop, written) = (vol.clone(), stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && n < 200_000 {
                    block_on(vol.write((n % 64) * 4096, &pattern(1000 + n, 4096), true)).unwrap();
                    n += 1;
                    written.store(n, Ordering::Relaxed);
                }
                n
            })
        };
        Writer {
            stop,
            written,
            thread,
        }
    }

    /// Writes acknowledged so far.
    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Waits (polling, bounded) until `n` writes were acknowledged.
    fn wait_for(&self, n: u64) {
        for _ in 0..30_000 {
            if self.written() >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the writer did not reach {n} writes");
    }

    /// Stops the writer; returns how many writes it made.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The last write of a writer that wrote `writes` FUA writes, write `n` to slot `n % 64`.
fn check_slots(pool: &Pool, writes: u64, what: &str) {
    let vol = pool.volume("v").unwrap();
    for k in 0..64u64.min(writes) {
        let last = (0..writes).filter(|n| n % 64 == k).max().unwrap();
        let mut buf = vec![0u8; 4096];
        block_on(vol.read(k * 4096, &mut buf)).unwrap();
        assert!(
            buf == pattern(1000 + last, 4096),
            "{what}: slot {k} lost its last acknowledged write ({last})"
        );
    }
}

/// A log device removed while a writer commits FUA writes: the writes go on across it,
/// the device's labels are cleared, later commits write to the data device only, a crash
/// right after loses no acknowledged write, and a log device added later takes a new index
/// (the hole keeps the old one) and imports.
#[test]
fn a_log_device_is_removed_while_a_writer_commits() {
    let (pool, data, slog) = data_and_log();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    block_on(vol.flush()).unwrap();
    let w = Writer::start(&vol);
    w.wait_for(20);
    assert!(
        device_writes(&pool, "slog0") > 0,
        "commits used the log device"
    );
    pool.remove("slog0").unwrap();
    // Writes keep going after the removal, and none of them touches the old log device.
    let after = device_writes(&pool, "slog0");
    w.wait_for(w.written() + 20);
    let writes = w.stop();
    assert_eq!(
        device_writes(&pool, "slog0"),
        after,
        "a commit after the removal wrote to the removed device"
    );
    let status = pool.status();
    assert!(status.logs.is_empty(), "{status:?}");
    assert_eq!(status.state, "ONLINE", "{status:?}");
    assert!(
        block_on(read_label(&slog)).is_err(),
        "the removed device still has labels"
    );
    drop(vol);
    drop(pool); // a crash: the last commits live in a chain on the data device
    let pool = Pool::import(backends(&[&data]), Some("tank")).unwrap();
    check_slots(&pool, writes, "after the removal and a crash");
    audit_clean(&pool, "after the removal and a crash");
    // A new log device takes the next index: the hole keeps index 1.
    let slog2 = MemoryBackend::new("slog1", 32 << 20);
    pool.add_vdevs(vec![single(&slog2, true)], false).unwrap();
    let vol = pool.volume("v").unwrap();
    fua_writes(&vol, writes..writes + 64);
    assert!(
        device_writes(&pool, "slog1") > 0,
        "the new log device is used"
    );
    assert_eq!(block_on(read_label(&slog2)).unwrap().top.0, 2);
    // The hole is no redundant vdev: a single data device joins a single-device pool
    // without -f.
    let data2 = MemoryBackend::new("data1", 64 << 20);
    pool.add_vdevs(vec![single(&data2, false)], false).unwrap();
    drop(vol);
    drop(pool); // a crash: the records are on the new log device
    let pool = Pool::import(backends(&[&data, &slog2, &data2]), Some("tank")).unwrap();
    check_slots(&pool, writes + 64, "replayed from the new log device");
    assert_eq!(pool.status().logs.len(), 1);
    audit_clean(&pool, "after a new log device's replay");
    pool.export().unwrap();
}

/// A crash after the removal's txg but before the removed device's labels were cleared
/// (its old labels written back): the pool imports with the hole, leaves the device alone,
/// and the device's stale tree does not bring the vdev back.
#[test]
fn stale_labels_of_a_removed_log_device_are_ignored() {
    let (pool, data, slog) = data_and_log();
    let vol = pool.create_volume("v", 4 << 20, &[]).unwrap();
    fua_writes(&vol, 0..32u64);
    let before = slog.snapshot();
    pool.remove("slog0").unwrap();
    fua_writes(&vol, 32..64u64);
    drop(vol);
    drop(pool);
    // Only the labels come back (the first and last 512 KiB), as if never cleared.
    let stale = MemoryBackend::new("slog0", 32 << 20);
    for off in [0u64, (32 << 20) - (512 << 10)] {
        let buf = block_on(before.read(off, oxpool_io::IoBuf::zeroed(512 << 10))).unwrap();
        block_on(stale.write(off, buf)).unwrap();
    }
    assert!(block_on(read_label(&stale)).is_ok());
    // Both orders: the stale tree may be the one import starts from.
    for devs in [[&stale, &data], [&data, &stale]] {
        let pool = Pool::import(backends(&devs), Some("tank")).unwrap();
        check_slots(&pool, 64, "with the removed device's stale labels");
        let status = pool.status();
        assert!(status.logs.is_empty(), "{status:?}");
        assert_eq!(status.state, "ONLINE", "{status:?}");
        audit_clean(&pool, "with the removed device's stale labels");
        drop(pool);
    }
}

/// A pool whose log device is gone: refused with what to do; imported with `-m` without the
/// records on it (what a txg made durable is all there), DEGRADED with the log vdev
/// UNAVAIL, sync writes logged on the data device; later imports need no `-m`; `remove`
/// takes the missing vdev out and the pool is ONLINE.
#[test]
fn a_pool_without_its_log_device_imports_with_m_and_the_log_is_removed() {
    let (pool, data, _slog) = data_and_log();
    let vol = pool.create_volume("v", 4 << 20, &[]).unwrap();
    fua_writes(&vol, 0..64u64);
    pool.sync().unwrap(); // these are in the pool
    fua_writes(&vol, 64..96u64);
    drop(vol);
    drop(pool); // a crash, then the log device is lost with writes 64..96
    let e = Pool::import(backends(&[&data]), Some("tank"))
        .err()
        .expect("imported without its log device")
        .to_string();
    assert!(
        e.contains("slog0") && e.contains("import -m"),
        "the refusal says what is missing and what to do: {e}"
    );
    let m = ImportOptions { missing_log: true };
    let pool = Pool::import_with(backends(&[&data]), Some("tank"), m).unwrap();
    // What the txg made durable is there; the records on the lost device are not replayed.
    check_slots(&pool, 64, "after import -m");
    let status = pool.status();
    assert_eq!(status.state, "DEGRADED", "{status:?}");
    assert_eq!(status.logs.len(), 1, "{status:?}");
    assert_eq!(status.logs[0].state, "UNAVAIL", "{status:?}");
    assert!(
        status.reasons.iter().any(|r| r.contains("oxpool remove")),
        "{status:?}"
    );
    let vol = pool.volume("v").unwrap();
    fua_writes(&vol, 96..160u64);
    assert!(device_writes(&pool, "data0") > 0);
    drop(vol);
    drop(pool); // a crash: these commits live on the data device
                // The record of the given-up log vdev: no -m needed now.
    let pool = Pool::import(backends(&[&data]), Some("tank")).unwrap();
    check_slots(&pool, 160, "replayed after import -m and a crash");
    audit_clean(&pool, "after import -m and a crash");
    pool.remove("slog0").unwrap();
    let status = pool.status();
    assert_eq!(status.state, "ONLINE", "{status:?}");
    assert!(status.logs.is_empty(), "{status:?}");
    pool.export().unwrap();
    let pool = Pool::import(backends(&[&data]), Some("tank")).unwrap();
    check_slots(&pool, 160, "after the removal of the missing log vdev");
    assert_eq!(pool.status().state, "ONLINE");
    audit_clean(&pool, "after the removal of the missing log vdev");
    pool.export().unwrap();
}

/// What `remove` refuses, changing nothing: a data device, one side of a log mirror (that
/// is `detach`), a device not in the pool. A log mirror goes by its name.
#[test]
fn remove_refuses_data_devices_and_takes_a_log_mirror_by_name() {
    let (pool, data, la, lb) = data_and_log_mirror();
    let vol = pool.create_volume("v", 4 << 20, &[]).unwrap();
    fua_writes(&vol, 0..64u64);
    let refused = |dev: &str, words: &[&str]| {
        let e = pool.remove(dev).expect_err("refused").to_string();
        for w in words {
            assert!(e.contains(w), "removing {dev}: {e}");
        }
        assert_eq!(pool.status().logs.len(), 1, "a refusal changed the pool");
        assert!(!e.contains('\n'), "one line: {e}");
    };
    refused("data0", &["cannot remove data0", "holds pool data"]);
    refused("sloga", &["mirror-1", "detach"]);
    refused("nothere", &["nothere"]);
    assert!(device_writes(&pool, "sloga") > 0);
    pool.remove("mirror-1").unwrap();
    assert!(pool.status().logs.is_empty());
    assert!(block_on(read_label(&la)).is_err() && block_on(read_label(&lb)).is_err());
    fua_writes(&vol, 64..128u64);
    drop(vol);
    drop(pool);
    let pool = Pool::import(backends(&[&data]), Some("tank")).unwrap();
    check_slots(&pool, 128, "after removing the log mirror and a crash");
    audit_clean(&pool, "after removing the log mirror and a crash");
    pool.export().unwrap();
}

/// Power fails at a seeded instant while a log device is removed under a writer of FUA
/// writes: before the removal's first sync, while chains move, at the hole's txg, while the
/// labels change. Every device drops, keeps or tears its unflushed writes. The pool imports
/// from both devices (the log's records may still be needed, or its labels may be stale),
/// every acknowledged write reads back (or a later write to its slot), and the audit is
/// clean.
#[test]
fn power_loss_during_a_log_removal_loses_no_acknowledged_write() {
    common::run_crash_cases("log_removal", |seed| {
        removal_crash_case(seed, Leave::Remove)
    });
}

/// As [`power_loss_during_a_log_removal_loses_no_acknowledged_write`], for `oxpool offline`
/// of the single log device, which moves the chains off it the same way and keeps the vdev.
#[test]
fn power_loss_during_a_log_offline_loses_no_acknowledged_write() {
    common::run_crash_cases("log_offline", |seed| {
        removal_crash_case(seed, Leave::Offline)
    });
}

/// How the log device leaves service in a crash case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Leave {
    /// `oxpool remove`: a hole in its place.
    Remove,
    /// `oxpool offline`: the vdev stays, out of service.
    Offline,
}

fn removal_crash_case(seed: u64, how: Leave) -> Result<String, String> {
    use std::sync::Mutex;
    const SLOTS: u64 = 64;
    let mems = [
        MemoryBackend::new("data0", 64 << 20),
        MemoryBackend::new("slog0", 32 << 20),
    ];
    let (group, devs) = common::crash_devices(&mems, seed);
    let spec = |d: &Arc<dyn Backend>, log| TopSpec {
        log,
        kind: TopVdevKind::Single,
        devices: vec![d.clone()],
    };
    let pool = Pool::create(
        "tank",
        vec![spec(&devs[0], false), spec(&devs[1], true)],
        test_props(),
        false,
    )
    .map_err(|e| e.to_string())?;
    let vol = pool
        .create_volume("v", SLOTS * 4096, &[])
        .map_err(|e| e.to_string())?;
    for n in 0..SLOTS {
        block_on(vol.write(n * 4096, &pattern(1000 + n, 4096), true)).map_err(|e| e.to_string())?;
    }
    // Per slot: the last write acknowledged, and the last one issued.
    let acked = Arc::new(Mutex::new(vec![(SLOTS, SLOTS); SLOTS as usize]));
    for (k, a) in acked.lock().unwrap().iter_mut().enumerate() {
        *a = (k as u64, k as u64);
    }
    // One case in four: the power fails the moment `remove` returns (what it said is done
    // must be durable then); the others at a seeded operation from here.
    let cut_at_return = seed.is_multiple_of(4);
    if !cut_at_return {
        group
            .remaining
            .store(1 + seed % 400, std::sync::atomic::Ordering::SeqCst);
    }
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (vol, acked, done) = (vol.clone(), acked.clone(), done.clone());
        std::thread::spawn(move || {
            let mut after_done = 0;
            for n in SLOTS..SLOTS + 4000 {
                let k = (n % SLOTS) as usize;
                acked.lock().unwrap()[k].1 = n;
                if block_on(vol.write(n % SLOTS * 4096, &pattern(1000 + n, 4096), true)).is_err() {
                    return;
                }
                acked.lock().unwrap()[k].0 = n;
                if done.load(Ordering::Relaxed) {
                    after_done += 1;
                    if after_done == 16 {
                        return;
                    }
                }
            }
        })
    };
    let removed = match how {
        Leave::Remove => pool.remove("slog0"),
        Leave::Offline => pool.offline("slog0", false),
    };
    if cut_at_return {
        group
            .remaining
            .store(1, std::sync::atomic::Ordering::SeqCst);
        group.tick();
    }
    done.store(true, Ordering::Relaxed);
    writer
        .join()
        .map_err(|_| "the writer panicked".to_string())?;
    drop(vol);
    drop(pool);
    let power_failed = group.remaining.load(Ordering::SeqCst) == 0
        || group.remaining.load(Ordering::SeqCst) > u64::MAX / 2;
    // An offline is recorded by the next sync, so the device may still be needed: both
    // devices are imported, as for a crash during a removal.
    let (pool, report) = if cut_at_return && removed.is_ok() && how == Leave::Remove {
        // Removed: the pool imports without the device.
        for (i, m) in group.members.lock().unwrap().iter().enumerate() {
            m.apply_power_loss(seed.wrapping_mul(31).wrapping_add(i as u64));
        }
        let pool = Pool::import(backends(&[&mems[0]]), Some("tank"))
            .map_err(|e| format!("import without the removed device: {e}"))?;
        (pool, "cut when remove returned".to_string())
    } else {
        common::power_off_and_import(&group, &mems, seed)?
    };
    let vol = pool.volume("v").map_err(|e| e.to_string())?;
    for (k, &(ok, issued)) in acked.lock().unwrap().iter().enumerate() {
        let mut buf = vec![0u8; 4096];
        block_on(vol.read(k as u64 * 4096, &mut buf)).map_err(|e| e.to_string())?;
        if !(ok..=issued).any(|n| n % SLOTS == k as u64 && buf == pattern(1000 + n, 4096)) {
            return Err(format!(
                "slot {k}: acknowledged write {ok} lost ({how:?} {removed:?}; {report})"
            ));
        }
    }
    drop(vol);
    common::audit_result(&pool, &format!("after a power loss during a log {how:?}"))?;
    pool.export().map_err(|e| e.to_string())?;
    Ok(format!(
        "{how:?} {:?}, power failed: {power_failed}",
        removed.is_ok()
    ))
}

/// The labels of a pool's data device may not know its log vdev (power failed after the
/// add's txg, before the labels learned it): a lost log device is then known only to the
/// pool's metadata. `-m` imports it all the same, and the imports after it need no `-m`.
#[test]
fn a_lost_log_device_unknown_to_the_labels_imports_with_m() {
    let data = MemoryBackend::new("data0", 64 << 20);
    let slog = MemoryBackend::new("slog0", 32 << 20);
    let pool = Pool::create("tank", vec![single(&data, false)], test_props(), false).unwrap();
    let vol = pool.create_volume("v", 4 << 20, &[]).unwrap();
    pool.sync().unwrap();
    let old_labels = data.snapshot();
    pool.add_vdevs(vec![single(&slog, true)], false).unwrap();
    fua_writes(&vol, 0..64u64);
    pool.sync().unwrap();
    drop(vol);
    drop(pool);
    // The data device's labels as before the add (their config halves; the uberblock
    // rings stay: they belong to the txgs since).
    let end = 64u64 << 20;
    for off in [0, 256 << 10, end - (512 << 10), end - (256 << 10)] {
        let buf = block_on(old_labels.read(off, oxpool_io::IoBuf::zeroed(128 << 10))).unwrap();
        block_on(data.write(off, buf)).unwrap();
    }
    assert_eq!(block_on(read_label(&data)).unwrap().tree.top.len(), 1);
    let e = Pool::import(backends(&[&data]), Some("tank"))
        .err()
        .expect("imported without its log device")
        .to_string();
    assert!(e.contains("slog0") && e.contains("import -m"), "{e}");
    let m = ImportOptions { missing_log: true };
    let pool = Pool::import_with(backends(&[&data]), Some("tank"), m).unwrap();
    check_slots(&pool, 64, "after import -m");
    assert_eq!(pool.status().state, "DEGRADED");
    pool.export().unwrap();
    let pool = Pool::import(backends(&[&data]), Some("tank")).unwrap();
    pool.remove("slog0").unwrap();
    assert_eq!(pool.status().state, "ONLINE");
    audit_clean(&pool, "after removing a log vdev the labels did not know");
    pool.export().unwrap();
}

/// `oxpool offline` of the only log device, while a writer commits FUA writes: the chains
/// move off it and the writes go on, the device gets no more I/O, and the pool shows
/// DEGRADED with the way back. Crashes then import without `-m`, with the device present
/// or gone (it holds nothing), with every acknowledged write; `online` has new chains use it
/// again, and a replay reads them from it. A temporary offline is forgotten by a crash.
#[test]
fn the_only_log_device_goes_offline_under_a_writer_and_comes_back() {
    let (pool, data, slog) = data_and_log();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    block_on(vol.flush()).unwrap();
    let w = Writer::start(&vol);
    w.wait_for(20);
    assert!(
        device_writes(&pool, "slog0") > 0,
        "commits used the log device"
    );
    pool.offline("slog0", false).unwrap();
    let after = device_writes(&pool, "slog0");
    w.wait_for(w.written() + 20);
    let writes = w.stop();
    assert_eq!(
        device_writes(&pool, "slog0"),
        after,
        "a commit after the offline wrote to the offline device"
    );
    let status = pool.status();
    assert_eq!(status.state, "DEGRADED", "{status:?}");
    assert_eq!(status.logs[0].state, "OFFLINE", "{status:?}");
    assert!(
        status.reasons.iter().any(|r| r.contains("oxpool online")),
        "{status:?}"
    );
    audit_clean(&pool, "after the offline");
    drop(vol);
    drop(pool); // a crash: the last commits live in a chain on the data device
    let pool = Pool::import(backends(&[&data, &slog]), Some("tank")).unwrap();
    check_slots(&pool, writes, "after the offline and a crash");
    assert_eq!(pool.status().logs[0].state, "OFFLINE");
    let (blocks, txg) = (pool.log_stats().blocks_written, pool.synced_txg());
    fua_writes(&pool.volume("v").unwrap(), writes..writes + 64);
    assert_eq!(device_writes(&pool, "slog0"), 0);
    // The commits went to a log on the data device, not to a log block placed on the
    // offline vdev (whose write fails, so that each commit waits for a txg).
    assert!(
        pool.log_stats().blocks_written >= blocks + 32,
        "commits after an import with the log device offline did not use the intent log"
    );
    assert!(
        pool.synced_txg().0 < txg.0 + 16,
        "commits waited for txgs: {:?} -> {:?}",
        txg,
        pool.synced_txg()
    );
    audit_clean(&pool, "imported with the log device offline");
    drop(pool); // a crash, and the log device is gone: nothing of it is needed
    let pool = Pool::import(backends(&[&data]), Some("tank")).unwrap();
    check_slots(
        &pool,
        writes + 64,
        "imported without the offline log device",
    );
    audit_clean(&pool, "imported without the offline log device");
    pool.export().unwrap();
    // Back, and online while a chain is anchored on the data device: the chain goes on onto
    // the log device, with no sync after the online's own, and a replay reads it from there.
    let pool = Pool::import(backends(&[&data, &slog]), Some("tank")).unwrap();
    let vol = pool.volume("v").unwrap();
    fua_writes(&vol, writes + 64..writes + 72);
    pool.online("slog0").unwrap();
    fua_writes(&vol, writes + 72..writes + 128);
    assert!(
        device_writes(&pool, "slog0") > 0,
        "the log device is used again once online"
    );
    drop(vol);
    drop(pool); // a crash: the last records are on the log device
                // The txg that returned it recorded it no longer emptied: without it, the import
                // refuses rather than lose what is on it.
    let Err(e) = Pool::import(backends(&[&data]), Some("tank")) else {
        panic!("imported without the log device that holds the last records");
    };
    assert!(e.to_string().contains("import -m"), "{e}");
    let pool = Pool::import(backends(&[&data, &slog]), Some("tank")).unwrap();
    check_slots(
        &pool,
        writes + 128,
        "replayed from the log device back online",
    );
    let status = pool.status();
    assert_eq!(status.state, "ONLINE", "{status:?}");
    audit_clean(&pool, "after the log device came back");
    // -t: until the pool is exported, so a crash forgets it.
    pool.offline("slog0", true).unwrap();
    assert_eq!(pool.status().logs[0].state, "OFFLINE");
    drop(pool);
    let pool = Pool::import(backends(&[&data, &slog]), Some("tank")).unwrap();
    assert_eq!(pool.status().logs[0].state, "ONLINE");
    fua_writes(&pool.volume("v").unwrap(), 0..64);
    assert!(device_writes(&pool, "slog0") > 0);
    audit_clean(&pool, "after a temporary offline and a crash");
    // -t, then an export: back in service at the import, lacking nothing (no resilver for a
    // log device: it held nothing while out, and its blocks are in no block tree).
    pool.offline("slog0", true).unwrap();
    fua_writes(&pool.volume("v").unwrap(), 0..64);
    pool.export().unwrap();
    let pool = Pool::import(backends(&[&data, &slog]), Some("tank")).unwrap();
    let status = pool.status();
    assert!(
        status.state == "ONLINE" && status.logs[0].reason.is_none() && status.scan.is_none(),
        "{status:?}"
    );
    pool.export().unwrap();
}

/// A log mirror whose one side was taken offline the ordinary way (the other served): the
/// chains after it are on the other side only. With that side gone, the offline side is
/// present but lacks them, so the import refuses, naming it and pointing to `-m`, rather
/// than read the chains as ending early.
#[test]
fn a_log_mirror_whose_only_whole_side_is_gone_needs_m() {
    let (pool, data, a, b) = data_and_log_mirror();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    fua_writes(&vol, 0..16);
    pool.offline("sloga", false).unwrap();
    pool.sync().unwrap();
    fua_writes(&vol, 16..80);
    assert!(device_writes(&pool, "slogb") > 0);
    drop(vol);
    drop(pool); // a crash: the last records are on slogb alone
    let Err(e) = Pool::import(backends(&[&data, &a]), Some("tank")) else {
        panic!("imported from the side that lacks the last records");
    };
    assert!(
        e.to_string().contains("sloga") && e.to_string().contains("import -m"),
        "{e}"
    );
    // With both sides the records are all there.
    let pool = Pool::import(backends(&[&data, &a, &b]), Some("tank")).unwrap();
    check_slots(&pool, 80, "replayed from the log mirror");
    audit_clean(&pool, "after the replay from the log mirror");
    pool.export().unwrap();
}

/// [`data_and_log`] with a volume `v`: 16 FUA writes, `offline` of the log device (its vdev
/// emptied), 16 more; with a new device `slog1` not yet in the pool. Devices: data0, slog0,
/// slog1.
fn offlined_log_device() -> (Pool, oxpool_engine::Volume, [MemoryBackend; 3]) {
    let (pool, data, slog) = data_and_log();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    fua_writes(&vol, 0..16);
    pool.offline("slog0", false).unwrap();
    fua_writes(&vol, 16..32);
    let slog1 = MemoryBackend::new("slog1", 32 << 20);
    (pool, vol, [data, slog, slog1])
}

/// A log device taken offline (its vdev emptied), then a new device attached to it: the
/// vdev takes log blocks again through the new device, not only after an `online` of the
/// old one. The txg that records it no longer emptied comes first: after a crash the import
/// needs the new device (without it, it refuses rather than lose what is on it), and with
/// it every acknowledged write replays.
#[test]
fn a_device_attached_to_an_offlined_log_device_takes_log_blocks() {
    let (pool, vol, [data, slog, slog1]) = offlined_log_device();
    let slog0_writes = device_writes(&pool, "slog0");
    pool.attach("slog0", Arc::new(slog1.clone()), false)
        .unwrap();
    fua_writes(&vol, 32..96);
    assert!(
        device_writes(&pool, "slog1") > 0,
        "the attached device took no log block"
    );
    assert_eq!(
        device_writes(&pool, "slog0"),
        slog0_writes,
        "the offline device"
    );
    drop(vol);
    drop(pool); // a crash: the last records are on slog1
    let Err(e) = Pool::import(backends(&[&data, &slog]), Some("tank")) else {
        panic!("imported without the device that holds the last records");
    };
    assert!(e.to_string().contains("import -m"), "{e}");
    let pool = Pool::import(backends(&[&data, &slog, &slog1]), Some("tank")).unwrap();
    check_slots(&pool, 96, "replayed from the attached log device");
    audit_clean(&pool, "after the attach to an offlined log device");
    pool.export().unwrap();
}

/// `replace` (not attach) of the offlined device of an emptied log vdev: the replacement
/// ends at once (the new device lacks nothing, so no resilver would end it), the new device
/// takes the log blocks, and a crash replays from it.
#[test]
fn replacing_an_offlined_log_device_ends_at_once() {
    let (pool, vol, [data, _slog, slog1]) = offlined_log_device();
    pool.replace("slog0", Arc::new(slog1.clone()), false)
        .unwrap();
    let status = pool.status();
    assert_eq!(status.state, "ONLINE", "{status:?}");
    let shown = format!("{:?}", status.logs);
    assert!(
        shown.contains("slog1") && !shown.contains("slog0") && !shown.contains("replacing"),
        "{status:?}"
    );
    fua_writes(&vol, 32..96);
    assert!(device_writes(&pool, "slog1") > 0);
    drop(vol);
    drop(pool); // a crash: the last records are on slog1
    let pool = Pool::import(backends(&[&data, &slog1]), Some("tank")).unwrap();
    check_slots(&pool, 96, "replayed from the replacing log device");
    audit_clean(&pool, "after the replace of an offlined log device");
    pool.export().unwrap();
}

/// The power fails at each point of an `attach` to the offlined device of an emptied log
/// vdev (its labels, the txg that records the new device, the one that drops the emptied
/// record), with a FUA writer running: every acknowledged write reads back after the
/// import, the audit is clean, and `online` of the new device (if the pool recorded it)
/// puts the vdev back to use, even when the crash came between the two txgs.
#[test]
fn power_loss_during_an_attach_to_an_emptied_log_vdev() {
    common::run_crash_cases("attach_emptied_log", attach_emptied_crash_case);
}

fn attach_emptied_crash_case(seed: u64) -> Result<String, String> {
    use std::sync::Mutex;
    const SLOTS: u64 = 32;
    let mems = [
        MemoryBackend::new("data0", 64 << 20),
        MemoryBackend::new("slog0", 32 << 20),
        MemoryBackend::new("slog1", 32 << 20),
    ];
    let (group, devs) = common::crash_devices(&mems, seed);
    let spec = |d: &Arc<dyn Backend>, log| TopSpec {
        log,
        kind: TopVdevKind::Single,
        devices: vec![d.clone()],
    };
    let err = |e: oxpool_engine::EngineError| e.to_string();
    let pool = Pool::create(
        "tank",
        vec![spec(&devs[0], false), spec(&devs[1], true)],
        test_props(),
        false,
    )
    .map_err(err)?;
    let vol = pool.create_volume("v", SLOTS * 4096, &[]).map_err(err)?;
    for n in 0..SLOTS {
        block_on(vol.write(n * 4096, &pattern(1000 + n, 4096), true)).map_err(err)?;
    }
    pool.offline("slog0", false).map_err(err)?;
    let acked = Mutex::new((0..SLOTS).map(|k| (k, k)).collect::<Vec<_>>());
    // The power fails at a seeded operation from here: the attach takes a few dozen.
    group.remaining.store(1 + seed % 120, Ordering::SeqCst);
    let attached = std::thread::scope(|s| {
        s.spawn(|| {
            for n in SLOTS..SLOTS + 2000 {
                let k = (n % SLOTS) as usize;
                acked.lock().unwrap()[k].1 = n;
                if block_on(vol.write(n % SLOTS * 4096, &pattern(1000 + n, 4096), true)).is_err() {
                    return;
                }
                acked.lock().unwrap()[k].0 = n;
            }
        });
        let r = pool.attach("slog0", devs[2].clone(), false);
        // The writer goes on until the power fails (bounded by its count).
        if group.remaining.load(Ordering::SeqCst) > 0 {
            group.remaining.store(1 + seed % 7, Ordering::SeqCst);
        }
        r
    });
    drop(vol);
    drop(pool);
    // A refusal asking for `-m` is possible: with the power cut during the uberblock writes
    // of the txg that drops the emptied record, the new device lacks that txg's uberblock and
    // the offline one is out, so the import cannot tell the new device whole (known and
    // left as it is: no log block was placed there before that txg's sync returned). `-m`
    // must then lose no acknowledged write.
    let (pool, report, with_m) = match common::power_off_and_import(&group, &mems, seed) {
        Ok((pool, report)) => (pool, report, false),
        Err(e) if e.contains("import -m") => {
            let devices = mems
                .iter()
                .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
                .collect();
            let m = ImportOptions { missing_log: true };
            let pool = Pool::import_with(devices, Some("tank"), m)
                .map_err(|e| format!("import -m after {e}"))?;
            (pool, e, true)
        }
        Err(e) => return Err(e),
    };
    let vol = pool.volume("v").map_err(err)?;
    for (k, &(ok, issued)) in acked.lock().unwrap().iter().enumerate() {
        let mut buf = vec![0u8; 4096];
        block_on(vol.read(k as u64 * 4096, &mut buf)).map_err(err)?;
        if !(ok..=issued).any(|n| n % SLOTS == k as u64 && buf == pattern(1000 + n, 4096)) {
            return Err(format!(
                "slot {k}: acknowledged write {ok} lost (attach {attached:?}; {report})"
            ));
        }
    }
    common::audit_result(
        &pool,
        "after a power loss during an attach to an emptied log",
    )?;
    // If the pool recorded the new device, `online` of it returns the vdev to use.
    let recorded = !with_m && format!("{:?}", pool.status().logs).contains("slog1");
    if recorded {
        pool.online("slog1").map_err(|e| {
            format!(
                "online of the attached device: {e} (attach {attached:?}; {report}; {:?})",
                pool.status().logs
            )
        })?;
        let before = device_writes(&pool, "slog1");
        for n in 0..SLOTS {
            block_on(vol.write(n * 4096, &pattern(9000 + n, 4096), true)).map_err(err)?;
        }
        if device_writes(&pool, "slog1") == before {
            return Err(format!(
                "the attached device took no log block after online (attach {attached:?}; {:?})",
                pool.status().logs
            ));
        }
    }
    drop(vol);
    pool.export().map_err(err)?;
    Ok(format!(
        "attach {:?}, recorded {recorded}, import -m {with_m}",
        attached.is_ok()
    ))
}
