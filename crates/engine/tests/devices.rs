//! Changing a pool's devices while it runs: `attach` (a single device becomes a mirror),
//! `detach`, `replace` on a mirror and on a raidz2 (also across an export and import in the
//! middle of the resilver), hot spares that step in for a device faulted by injected errors
//! and go back when the device is replaced, and the refusals. Each proves the new device
//! holds the data by taking enough of the others out of service and reading everything.

mod common;

use common::{mem_pool, pattern, raidz, test_props, DEVICE_BYTES};
use oxpool_engine::vdev::{InjectKind, InjectOps, InjectRule};
use oxpool_engine::{Pool, PoolStatus, ScanState, VdevStatus, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use std::sync::Arc;
use std::time::{Duration, Instant};

const VOLUME_BYTES: u64 = 4 << 20;

fn dev(m: &MemoryBackend) -> Arc<dyn Backend> {
    Arc::new(m.clone())
}

fn mem(i: usize) -> MemoryBackend {
    MemoryBackend::new(&format!("mem{i}"), DEVICE_BYTES)
}

/// Volume `v` written with `seed`'s pattern and synced, the data cache off (every read goes
/// to the devices).
fn fill(pool: &Pool, seed: u64) -> Vec<u8> {
    pool.set_prop("data_cache_max", "0").unwrap();
    let v = pool
        .create_volume(
            "v",
            VOLUME_BYTES,
            &[("compression".to_string(), "off".to_string())],
        )
        .unwrap();
    let data = pattern(seed, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    data
}

fn read_all(v: &Volume) -> oxpool_engine::Result<Vec<u8>> {
    let mut got = vec![0u8; v.size_bytes() as usize];
    block_on(v.read(0, &mut got))?;
    Ok(got)
}

/// Waits until no scan runs and no replacement or spare is left to resilver (bounded; the
/// bound is a hang guard, not a measurement).
fn wait_resilvered(pool: &Pool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let scanning = pool
            .scan_wait(Duration::from_secs(10))
            .is_some_and(|s| s.state == ScanState::Scanning);
        if !scanning && !pool.resilvering() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "resilver did not end: {:?}",
            pool.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn names(s: &PoolStatus) -> Vec<String> {
    s.vdevs[0].children.iter().map(|c| c.name.clone()).collect()
}

fn labelled(m: &MemoryBackend) -> bool {
    block_on(oxpool_engine::vdev::label::read_label(m)).is_ok()
}

#[test]
fn attach_makes_a_mirror_that_holds_everything_then_detach_undoes_it() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let data = fill(&pool, 1);
    let m1 = mem(1);
    pool.attach("mem0", dev(&m1), false).unwrap();
    let s = pool.status();
    assert_eq!(s.vdevs[0].name, "mirror-0", "{s:?}");
    wait_resilvered(&pool);
    let s = pool.status();
    assert_eq!(names(&s), ["mem0", "mem1"]);
    assert_eq!(s.state, "ONLINE", "{s:?}");
    // The original out of service: every block comes from the attached side.
    pool.offline("mem0", false).unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data, "attached side lacks data");
    pool.online("mem0").unwrap();
    // Detaching the original leaves a single device again, recorded: the pool imports from
    // the attached device alone, and the original's labels are gone.
    pool.detach("mem0").unwrap();
    let s = pool.status();
    assert_eq!(s.vdevs[0].name, "mem1", "{s:?}");
    assert!(s.vdevs[0].children.is_empty());
    assert!(!labelled(&mems[0]));
    drop(v);
    pool.export().unwrap();
    let pool = Pool::import(vec![dev(&mems[0]), dev(&m1)], Some("tank")).unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
    assert_eq!(pool.status().vdevs[0].name, "mem1");
}

#[test]
fn replace_on_a_mirror_resilvers_and_detaches_the_old_device() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let data = fill(&pool, 2);
    let m2 = mem(2);
    pool.replace("mem1", dev(&m2), false).unwrap();
    wait_resilvered(&pool);
    let s = pool.status();
    assert_eq!(names(&s), ["mem0", "mem2"], "{s:?}");
    assert_eq!(s.state, "ONLINE", "{s:?}");
    assert!(!labelled(&mems[1]), "the replaced device keeps its labels");
    pool.offline("mem0", false).unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data, "replacement lacks data");
    // Recorded: after export and import the mirror is mem0 + mem2.
    pool.online("mem0").unwrap();
    drop(v);
    pool.export().unwrap();
    let pool = Pool::import(vec![dev(&mems[0]), dev(&mems[1]), dev(&m2)], Some("tank")).unwrap();
    assert_eq!(names(&pool.status()), ["mem0", "mem2"]);
}

#[test]
fn replace_on_raidz2_then_two_others_out_reads_everything() {
    let (pool, _mems) = mem_pool(raidz(2), 5);
    let data = fill(&pool, 3);
    let m5 = mem(5);
    pool.replace("mem4", dev(&m5), false).unwrap();
    let s = pool.status();
    assert_eq!(s.vdevs[0].children[4].name, "replacing-4", "{s:?}");
    wait_resilvered(&pool);
    let s = pool.status();
    assert_eq!(names(&s), ["mem0", "mem1", "mem2", "mem3", "mem5"], "{s:?}");
    // Two others out: every block needs mem5's columns.
    pool.offline("mem0", false).unwrap();
    pool.offline("mem1", false).unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data, "replacement lacks columns");
}

#[test]
fn replace_survives_export_and_import_in_the_middle() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let data = fill(&pool, 4);
    pool.set_prop("fault_errors", "0").unwrap();
    // Every read of both old sides returns wrong bytes: the resilver cannot finish (no good
    // copy), so the replacement stays half done whatever the timing.
    for (id, name) in [(1, "mem0"), (2, "mem1")] {
        pool.inject_add(InjectRule {
            id,
            device: pool.device(name).unwrap().0,
            kind: InjectKind::Corrupt,
            ops: InjectOps::Read,
            frequency_ppm: 1_000_000,
        })
        .unwrap();
    }
    let m2 = mem(2);
    pool.replace("mem1", dev(&m2), false).unwrap();
    wait_resilvered_or_stuck(&pool);
    let s = pool.status();
    let pair = &s.vdevs[0].children[1];
    assert_eq!(pair.name, "replacing-1", "{s:?}");
    assert_eq!(pair.children[1].name, "mem2");
    assert!(
        pair.children[1]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("lacks the blocks of txgs 1-")),
        "{s:?}"
    );
    pool.export().unwrap();
    // Injection rules end with the process's pool: the import's resilver finishes.
    let pool = Pool::import(vec![dev(&mems[0]), dev(&mems[1]), dev(&m2)], Some("tank")).unwrap();
    wait_resilvered(&pool);
    let s = pool.status();
    assert_eq!(names(&s), ["mem0", "mem2"], "{s:?}");
    assert!(!labelled(&mems[1]));
    pool.offline("mem0", false).unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
}

/// Waits for the scan a replace started to end, finished or not.
fn wait_resilvered_or_stuck(pool: &Pool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while pool
        .scan_wait(Duration::from_secs(10))
        .is_some_and(|s| s.state == ScanState::Scanning)
    {
        assert!(Instant::now() < deadline, "scan did not end");
    }
}

/// A raidz1 of mem0-mem2, filled, with hot spare mem3 standing in (resilvered) for mem2,
/// faulted by read errors. Returns the pool, its devices, the spare and the data.
fn spare_in_for_mem2() -> (Pool, Vec<MemoryBackend>, MemoryBackend, Vec<u8>) {
    let (pool, mems) = mem_pool(raidz(1), 3);
    let data = fill(&pool, 5);
    let m3 = mem(3);
    pool.add_spares(vec![dev(&m3)], false).unwrap();
    let spares = pool.spares();
    assert_eq!(
        (spares[0].name.as_str(), spares[0].state),
        ("mem3", "AVAIL")
    );
    pool.inject_add(InjectRule {
        id: 1,
        device: pool.device("mem2").unwrap().0,
        kind: InjectKind::Io,
        ops: InjectOps::Read,
        frequency_ppm: 1_000_000,
    })
    .unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
    // The fault (10 read errors) calls the spare in, on a thread of its own.
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.spares()[0].state != "INUSE" {
        assert!(Instant::now() < deadline, "no spare: {:?}", pool.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_resilvered(&pool);
    (pool, mems, m3, data)
}

#[test]
fn a_hot_spare_steps_in_for_a_faulted_device_and_replace_returns_it() {
    let (pool, mems, m3, data) = spare_in_for_mem2();
    let v = pool.volume("v").unwrap();
    let s = pool.status();
    let pair = &s.vdevs[0].children[2];
    assert_eq!(pair.name, "spare-2", "{s:?}");
    assert_eq!(
        (
            pair.children[0].state.as_str(),
            pair.children[1].name.as_str()
        ),
        ("FAULTED", "mem3")
    );
    assert_eq!(pair.state, "DEGRADED", "{s:?}");
    assert_eq!(
        pair.children[1].reason, None,
        "the spare is resilvered: {s:?}"
    );
    assert!(
        s.reasons
            .iter()
            .any(|r| r.contains("hot spare mem3 stands in for mem2")),
        "{s:?}"
    );
    assert_eq!(s.spares[0].in_use_for.as_deref(), Some("mem2"));
    // Its path once among the pool's device paths (the cache file lists them; a path twice
    // made the next open lock one file twice and fail).
    let paths = pool.device_paths();
    assert_eq!(
        paths.iter().filter(|p| p.as_str() == "mem3").count(),
        1,
        "{paths:?}"
    );
    // The spare holds mem2's columns: with mem0 out too, everything reads.
    pool.inject_clear(None);
    pool.offline("mem0", false).unwrap();
    assert!(read_all(&v).unwrap() == data, "the spare lacks data");
    pool.online("mem0").unwrap();
    // A spare in use cannot be removed.
    let e = pool.remove_spare("mem3").unwrap_err().to_string();
    assert!(
        e.contains("cannot remove mem3: ") && e.contains("in use"),
        "{e}"
    );
    // Replacing the faulted device: the new one resilvers, the spare goes back.
    let m4 = mem(4);
    pool.replace("mem2", dev(&m4), false).unwrap();
    wait_resilvered(&pool);
    let s = pool.status();
    assert_eq!(names(&s), ["mem0", "mem1", "mem4"], "{s:?}");
    assert_eq!(
        (s.spares[0].name.as_str(), s.spares[0].state),
        ("mem3", "AVAIL")
    );
    assert!(labelled(&m3), "a spare keeps its labels");
    assert!(!labelled(&mems[2]));
    pool.offline("mem1", false).unwrap();
    assert!(read_all(&v).unwrap() == data, "the replacement lacks data");
    pool.online("mem1").unwrap();
    // Spares are recorded; an unused one can be removed.
    drop(v);
    pool.export().unwrap();
    let all: Vec<Arc<dyn Backend>> = mems.iter().chain([&m3, &m4]).map(dev).collect();
    let pool = Pool::import(all, Some("tank")).unwrap();
    assert_eq!(pool.spares()[0].state, "AVAIL");
    pool.remove_spare("mem3").unwrap();
    assert!(pool.spares().is_empty());
    assert!(!labelled(&m3));
}

/// The tree as `status` shows it: each vdev's name and state, children in order.
fn tree(s: &VdevStatus) -> String {
    let children: Vec<String> = s.children.iter().map(tree).collect();
    format!("{} {} [{}]", s.name, s.state, children.join(", "))
}

/// A replace of the device a spare stands in for takes that device out and makes the
/// spare a plain member until the new one is resilvered. If the new device's labels cannot
/// be written, the replace fails and all of that is undone: the faulted device is back in
/// its pair with the spare, in memory and after an import.
#[test]
fn a_replace_whose_labels_fail_leaves_the_spare_pair_as_it_was() {
    let (pool, mems, m3, data) = spare_in_for_mem2();
    let before = pool.status();
    let m4 = mem(4);
    let failing = Arc::new(FaultBackend::new(dev(&m4), 7));
    failing.set_write_error_probability(1.0);
    let e = pool
        .replace("mem2", failing, false)
        .unwrap_err()
        .to_string();
    // Refused by the label write, not before the change (a check would say "cannot").
    assert!(
        e.contains("mem4: Input/output error") && !e.contains("cannot"),
        "{e}"
    );
    let after = pool.status();
    assert_eq!(tree(&after.vdevs[0]), tree(&before.vdevs[0]));
    assert!(
        tree(&after.vdevs[0]).contains("spare-2 DEGRADED [mem2 FAULTED [], mem3 ONLINE []]"),
        "{after:?}"
    );
    assert_eq!(after.spares[0].in_use_for.as_deref(), Some("mem2"));
    // Recorded so: the import finds the same tree, and mem2 keeps its labels.
    pool.sync().unwrap();
    pool.export().unwrap();
    assert!(labelled(&mems[2]), "the faulted device was let go");
    let all: Vec<Arc<dyn Backend>> = mems.iter().chain([&m3]).map(dev).collect();
    let pool = Pool::import(all, Some("tank")).unwrap();
    let imported = pool.status();
    assert_eq!(
        imported.vdevs[0].children[2].children.len(),
        2,
        "{imported:?}"
    );
    assert_eq!(imported.spares[0].in_use_for.as_deref(), Some("mem2"));
    assert!(read_all(&pool.volume("v").unwrap()).unwrap() == data);
    // A replace that can be done still is.
    let m5 = mem(5);
    pool.replace("mem2", dev(&m5), false).unwrap();
    wait_resilvered(&pool);
    assert_eq!(names(&pool.status()), ["mem0", "mem1", "mem5"]);
}

#[test]
fn detaching_a_spare_in_use_returns_it() {
    let (pool, _mems) = mem_pool(TopVdevKind::Mirror, 2);
    fill(&pool, 6);
    let m2 = mem(2);
    pool.add_spares(vec![dev(&m2)], false).unwrap();
    pool.inject_add(InjectRule {
        id: 1,
        device: pool.device("mem1").unwrap().0,
        kind: InjectKind::Io,
        ops: InjectOps::Read,
        frequency_ppm: 1_000_000,
    })
    .unwrap();
    let v = pool.volume("v").unwrap();
    // Reads alternate between the sides: enough of them reach mem1 to fault it.
    for _ in 0..4 {
        read_all(&v).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.spares()[0].state != "INUSE" {
        assert!(Instant::now() < deadline, "no spare: {:?}", pool.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_resilvered(&pool);
    pool.detach("mem2").unwrap();
    assert_eq!(pool.spares()[0].state, "AVAIL");
    assert_eq!(names(&pool.status()), ["mem0", "mem1"]);
}

#[test]
fn refusals_say_why_and_change_nothing() {
    let (pool, _mems) = mem_pool(raidz(1), 3);
    fill(&pool, 7);
    let before = format!("{:?}", pool.status().vdevs);
    let refused = |r: oxpool_engine::Result<()>| r.unwrap_err().to_string();
    let e = refused(pool.attach("mem0", dev(&mem(5)), false));
    assert!(
        e.contains("cannot attach mem5 to mem0") && e.contains("raidz expansion is not supported"),
        "{e}"
    );
    let small = MemoryBackend::new("small", DEVICE_BYTES / 2);
    let e = refused(pool.replace("mem0", Arc::new(small), false));
    assert!(
        e.contains("cannot replace mem0 with small") && e.contains("smaller"),
        "{e}"
    );
    let e = refused(pool.replace("nosuch", dev(&mem(5)), false));
    assert!(e.contains("device 'nosuch'"), "{e}");
    let e = refused(pool.replace("mem0", dev(&mem(1)), false));
    assert!(e.contains("already in pool 'tank'"), "{e}");
    let e = refused(pool.detach("mem0"));
    assert!(
        e.contains("cannot detach mem0: it is a column of raidz1-0"),
        "{e}"
    );
    // A device of another pool needs -f.
    let other = mem(9);
    Pool::create(
        "other",
        vec![oxpool_engine::TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![dev(&other)],
        }],
        test_props(),
        false,
    )
    .unwrap()
    .export()
    .unwrap();
    let e = refused(pool.replace("mem0", dev(&other), false));
    assert!(
        e.contains("belongs to pool 'other'") && e.contains("-f"),
        "{e}"
    );
    assert_eq!(format!("{:?}", pool.status().vdevs), before);

    // A mirror: the last side, and a side whose partner is out.
    let (pool, _mems) = mem_pool(TopVdevKind::Mirror, 2);
    fill(&pool, 8);
    pool.offline("mem1", false).unwrap();
    let e = refused(pool.detach("mem0"));
    assert!(e.starts_with("cannot detach mem0: mirror-0"), "{e}");
    assert!(!e.contains('\n'));
    pool.online("mem1").unwrap();
    pool.scrub().unwrap();
    pool.detach("mem1").unwrap();
    let e = refused(pool.detach("mem0"));
    assert!(
        e.contains("cannot detach mem0: it is the only device of its vdev"),
        "{e}"
    );
}

#[test]
fn replace_without_new_takes_a_swapped_device_at_the_same_path() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let data = fill(&pool, 9);
    // Not swapped: the device at the path is still the old one.
    let e = pool
        .replace("mem1", dev(&mems[1]), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is still the device it replaces"), "{e}");
    // Swapped: a blank device at the same path.
    let swapped = mem(1);
    pool.replace("mem1", dev(&swapped), false).unwrap();
    wait_resilvered(&pool);
    let s = pool.status();
    assert_eq!(names(&s), ["mem0", "mem1"], "{s:?}");
    assert_eq!(s.state, "ONLINE", "{s:?}");
    pool.offline("mem0", false).unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
    // The swapped device is the one in the pool now.
    assert!(labelled(&swapped));
}

/// A device whose writes wait at a gate until it is opened (the first one that waits says
/// so).
struct HeldWrites {
    inner: MemoryBackend,
    /// (a write has waited, the gate is open).
    state: std::sync::Mutex<(bool, bool)>,
    cv: std::sync::Condvar,
}

impl HeldWrites {
    fn new(inner: MemoryBackend) -> Arc<HeldWrites> {
        Arc::new(HeldWrites {
            inner,
            state: std::sync::Mutex::new((false, false)),
            cv: std::sync::Condvar::new(),
        })
    }

    /// Waits until a write waits at the gate (a hang guard of 10 s).
    fn wait_held(&self) {
        let s = self.state.lock().unwrap();
        let (s, _) = self
            .cv
            .wait_timeout_while(s, Duration::from_secs(10), |s| !s.0)
            .unwrap();
        assert!(s.0, "no write reached the device");
    }

    /// A write waits here until the gate opens.
    fn hold(&self) {
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.cv.notify_all();
        while !s.1 {
            s = self.cv.wait(s).unwrap();
        }
    }

    fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl Backend for HeldWrites {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.inner.read(offset_bytes, buf)
    }
    fn write(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.hold();
        self.inner.write(offset_bytes, buf)
    }
    fn write_durable(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.hold();
        self.inner.write_durable(offset_bytes, buf)
    }
    fn flush(&self) -> oxpool_io::IoFuture<()> {
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> oxpool_io::IoFuture<()> {
        self.inner.discard(offset_bytes, length_bytes)
    }
}

/// No txg records a hot spare before its labels are written: a sync asked for while
/// `add_spares` writes them waits, so a power cut then leaves a pool that names no spare it
/// cannot find.
#[test]
fn no_txg_records_a_spare_before_its_labels() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let pool = &pool;
    let m2 = mem(2);
    let held = HeldWrites::new(m2.clone());
    std::thread::scope(|scope| {
        let spare: Arc<dyn Backend> = held.clone();
        let adding = scope.spawn(move || pool.add_spares(vec![spare], false));
        held.wait_held();
        let (synced, done) = std::sync::mpsc::channel();
        let syncing = scope.spawn(move || {
            let r = pool.sync();
            let _ = synced.send(());
            r
        });
        // Time for an unguarded sync to record the spare (it takes milliseconds); guarded,
        // it waits for the labels, and the cut comes first either way.
        let _ = done.recv_timeout(Duration::from_secs(2));
        let cut: Vec<MemoryBackend> = mems.iter().chain([&m2]).map(|m| m.snapshot()).collect();
        held.open();
        adding.join().unwrap().unwrap();
        syncing.join().unwrap().unwrap();
        let devices: Vec<Arc<dyn Backend>> = cut.iter().map(dev).collect();
        let imported = Pool::import(devices, Some("tank")).unwrap();
        for spare in imported.spares() {
            assert_ne!(
                spare.state, "UNAVAIL",
                "a spare recorded before its labels: {spare:?}"
            );
        }
    });
    assert_eq!(pool.spares()[0].state, "AVAIL");
}

/// The error record a host keeps between opens covers the hot spares, and `clear` zeroes a
/// spare's counts as it does the tree's devices' (a spare not in use is no tree leaf).
#[test]
fn clear_zeroes_the_counts_of_a_spare_not_in_use() {
    use oxpool_engine::vdev::DeviceErrors;
    use oxpool_engine::{DeviceRecord, ErrorRecord};
    let (pool, _mems) = mem_pool(TopVdevKind::Mirror, 2);
    let m2 = mem(2);
    pool.add_spares(vec![dev(&m2)], false).unwrap();
    let spare = pool.spares()[0].guid;
    let counts = DeviceErrors {
        read: 0,
        write: 0,
        checksum: 3,
        repaired_bytes: 0,
    };
    pool.restore_error_record(&ErrorRecord {
        devices: vec![DeviceRecord {
            guid: spare,
            counts,
            degraded: None,
        }],
        ..Default::default()
    });
    let kept = pool.error_record();
    assert_eq!(kept.devices.len(), 1, "{kept:?}");
    assert_eq!(
        (kept.devices[0].guid, kept.devices[0].counts),
        (spare, counts)
    );
    pool.clear(None).unwrap();
    assert!(pool.error_record().is_empty(), "{:?}", pool.error_record());
}

/// An import that finds no pool among many devices sums up those that never held one, but
/// names a device whose labels are damaged: it may be a member of the pool looked for.
#[test]
fn an_import_that_finds_nothing_names_the_devices_with_damaged_labels() {
    use oxpool_engine::TopSpec;
    let member = MemoryBackend::new("member", 64 << 20);
    let pool = Pool::create(
        "tank",
        vec![TopSpec::single(Arc::new(member.clone()))],
        oxpool_engine::PoolProps::default(),
        false,
    )
    .unwrap();
    pool.export().unwrap();
    // Every label's bytes after its magic damaged: the labels fail their checksums.
    for (i, at) in oxpool_format::label_offsets(member.size_bytes())
        .into_iter()
        .enumerate()
    {
        member.corrupt(at + 64, 64, i as u64 + 1);
    }
    // A second member whose first label was wiped (zeros) and the others damaged: it held a
    // pool, whatever its first label says.
    let wiped = MemoryBackend::new("wiped", 64 << 20);
    let pool = Pool::create(
        "tank",
        vec![TopSpec::single(Arc::new(wiped.clone()))],
        oxpool_engine::PoolProps::default(),
        false,
    )
    .unwrap();
    pool.export().unwrap();
    let labels = oxpool_format::label_offsets(wiped.size_bytes());
    let zeros = oxpool_io::IoBuf::zeroed(oxpool_format::LABEL_BYTES as usize);
    oxpool_io::rt::block_on(wiped.write(labels[0], zeros)).unwrap();
    for (i, at) in labels.into_iter().enumerate().skip(1) {
        wiped.corrupt(at + 64, 64, i as u64 + 11);
    }
    let mut devices: Vec<Arc<dyn Backend>> = (0..6)
        .map(|i| Arc::new(MemoryBackend::new(&format!("junk{i}"), 1 << 20)) as Arc<dyn Backend>)
        .collect();
    devices.push(Arc::new(member));
    devices.push(Arc::new(wiped));
    let err = Pool::import(devices, Some("tank"))
        .err()
        .expect("imported")
        .to_string();
    assert!(err.contains("member: label 0"), "{err}");
    assert!(err.contains("wiped: label 1"), "{err}");
    assert!(err.contains("6 without a pool's label"), "{err}");
    assert!(!err.contains("junk5"), "{err}");
}

/// Labels damaged on a device are written again at the next import: the pool survives a
/// second incident that damages the device's other labels (a new user's finding: the first
/// labels stayed damaged through import, scrub and export, and damage to the last two then
/// left a pool no import could find).
#[test]
fn an_import_mends_damaged_labels() {
    use oxpool_engine::TopSpec;
    let dev = MemoryBackend::new("dev", 64 << 20);
    let pool = Pool::create(
        "tank",
        vec![TopSpec::single(Arc::new(dev.clone()))],
        oxpool_engine::PoolProps::default(),
        false,
    )
    .unwrap();
    let v = pool.create_volume("v", 1 << 20, &[]).unwrap();
    let data = vec![7u8; 1 << 20];
    oxpool_io::rt::block_on(v.write(0, &data, false)).unwrap();
    drop(v);
    pool.export().unwrap();
    let labels = oxpool_format::label_offsets(dev.size_bytes());
    // Each label whole, its configuration and its uberblock ring, overwritten with noise (as
    // the new user's dd from /dev/urandom).
    let damage = |which: &[usize], seed: u64| {
        for &i in which {
            let noise = pattern(seed + i as u64, oxpool_format::LABEL_BYTES as usize);
            let noise = oxpool_io::IoBuf::from_slice(&noise);
            oxpool_io::rt::block_on(dev.write(labels[i], noise)).unwrap();
        }
    };
    damage(&[0, 1], 1);
    let import = || {
        Pool::import(
            vec![Arc::new(dev.clone()) as Arc<dyn Backend>],
            Some("tank"),
        )
    };
    let pool = import().expect("the end labels find the pool");
    pool.export().unwrap();
    damage(&[2, 3], 11);
    let pool = import().expect("the labels damaged first were mended at the last import");
    let v = pool.volume("v").unwrap();
    let mut got = vec![0u8; 1 << 20];
    oxpool_io::rt::block_on(v.read(0, &mut got)).unwrap();
    assert!(got == data);
    drop(v);
    pool.export().unwrap();
}
