//! Fault injection (`oxpool inject`) and device states (`offline`, `online`, `clear`, the
//! fault rule) on mirrors and raidz: each kind of injected fault on one device leaves every
//! read right through the redundancy, counts its errors, moves the device to the state the
//! rule says (FAULTED for I/O errors, DEGRADED for checksum errors), the pool DEGRADED, and
//! `clear` brings it back ONLINE; a device that missed writes lacks them (the pool says so)
//! until a scrub repairs them, which a read with the other devices failing then proves.
//! Offline is refused beyond the redundancy with the reason and nothing changed, and is
//! persisted across export and import unless temporary.

mod common;

use common::{mem_pool, pattern, raidz, reimport};
use oxpool_engine::vdev::{InjectKind, InjectOps, InjectRule};
use oxpool_engine::{Pool, PoolStatus, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::{block_on, join_all};
use oxpool_io::{Backend, IoBuf, IoFuture, MemoryBackend};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const VOLUME_BYTES: u64 = 4 << 20;

/// The shapes each injection runs on: a two-way mirror and a raidz1 of three.
fn shapes() -> Vec<(&'static str, TopVdevKind, usize)> {
    vec![("mirror", TopVdevKind::Mirror, 2), ("raidz1", raidz(1), 3)]
}

/// A pool of `kind` over `n` memory devices with volume `v` written with `seed`'s pattern
/// and synced, its data cache off (every read goes to the devices).
fn written(kind: TopVdevKind, n: usize, seed: u64) -> (Pool, Vec<MemoryBackend>, Vec<u8>) {
    let (pool, mems) = mem_pool(kind, n);
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
    (pool, mems, data)
}

fn read_all(v: &Volume) -> oxpool_engine::Result<Vec<u8>> {
    let mut got = vec![0u8; v.size_bytes() as usize];
    block_on(v.read(0, &mut got))?;
    Ok(got)
}

/// Reads the whole volume one block per request: one device read per block (a larger request
/// reads blocks that lie side by side as one), so each block read on a corrupting device is a
/// checksum error.
fn read_by_block(v: &Volume) -> Vec<u8> {
    let bs = v.block_size_bytes() as usize;
    let mut got = vec![0u8; v.size_bytes() as usize];
    for (i, chunk) in got.chunks_mut(bs).enumerate() {
        block_on(v.read((i * bs) as u64, chunk)).unwrap();
    }
    got
}

/// Reads the whole volume as many 64 KiB reads in flight at once.
fn read_at_once(v: &Volume) -> Vec<u8> {
    let mut bufs: Vec<Vec<u8>> = (0..v.size_bytes() as usize / CHUNK_BYTES)
        .map(|_| vec![0u8; CHUNK_BYTES])
        .collect();
    let reads: Vec<_> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| v.read((i * CHUNK_BYTES) as u64, b))
        .collect();
    for r in block_on(join_all(reads)) {
        r.unwrap();
    }
    bufs.concat()
}

/// The size of each of [`read_at_once`]'s reads.
const CHUNK_BYTES: usize = 64 << 10;

fn rule(id: u64, pool: &Pool, device: &str, kind: InjectKind, ops: InjectOps) -> InjectRule {
    InjectRule {
        id,
        device: pool.device(device).unwrap().0,
        kind,
        ops,
        frequency_ppm: 1_000_000,
    }
}

/// Waits for the running scan to end; its status.
fn wait_scan_end(pool: &Pool) -> oxpool_engine::ScanStatus {
    // Bounded: the scan of a few MiB ends, or the test fails here.
    for _ in 0..600 {
        let s = pool.scan_wait(std::time::Duration::from_secs(1)).unwrap();
        if s.state != oxpool_engine::ScanState::Scanning {
            return s;
        }
    }
    panic!("the scan does not end");
}

/// Leaf `i` of the first vdev.
fn leaf(s: &PoolStatus, i: usize) -> &oxpool_engine::VdevStatus {
    &s.vdevs[0].children[i]
}

#[test]
fn injected_read_errors_fault_the_device_and_clear_brings_it_back() {
    for (shape, kind, n) in shapes() {
        let (pool, _mems, data) = written(kind, n, 1);
        let bad = n - 1;
        let dev = format!("mem{bad}");
        pool.inject_add(rule(1, &pool, &dev, InjectKind::Io, InjectOps::Read))
            .unwrap();
        let v = pool.volume("v").unwrap();
        assert!(read_all(&v).unwrap() == data, "{shape}: wrong data");
        let s = pool.status();
        let errors = leaf(&s, bad).read_errors;
        assert!(errors >= 10, "{shape}: {s:?}");
        assert_eq!(leaf(&s, bad).state, "FAULTED", "{shape}: {s:?}");
        assert!(
            leaf(&s, bad)
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("too many I/O errors (10 within 600 s)")),
            "{shape}: {s:?}"
        );
        assert_eq!(
            (s.state.as_str(), s.vdevs[0].state.as_str()),
            ("DEGRADED", "DEGRADED")
        );
        assert!(
            s.reasons[0].contains("1 of its devices out of service"),
            "{s:?}"
        );
        assert!(pool.inject_rules()[0].1.hits >= 10);
        // Out of service: the next reads do not go to it.
        assert!(
            read_all(&v).unwrap() == data,
            "{shape}: wrong data once faulted"
        );
        assert_eq!(leaf(&pool.status(), bad).read_errors, errors, "{shape}");
        // Nothing was written while it was out: `clear` returns it whole.
        assert_eq!(pool.inject_clear(None), 1);
        pool.clear(Some(&dev)).unwrap();
        let s = pool.status();
        assert_eq!(s.state, "ONLINE", "{shape}: {s:?}");
        assert_eq!(leaf(&s, bad).state, "ONLINE");
        assert_eq!(leaf(&s, bad).read_errors, 0);
        assert!(s.reasons.is_empty(), "{s:?}");
        assert!(read_all(&v).unwrap() == data);
        assert_eq!(leaf(&pool.status(), bad).read_errors, 0);
        drop(v);
        pool.export().unwrap();
    }
}

#[test]
fn injected_write_errors_fault_the_device_and_a_scrub_repairs_what_it_lacks() {
    for (shape, kind, n) in shapes() {
        let (pool, mems, _) = written(kind, n, 2);
        let bad = 0;
        let dev = "mem0";
        pool.inject_add(rule(7, &pool, dev, InjectKind::Io, InjectOps::Write))
            .unwrap();
        let v = pool.volume("v").unwrap();
        let data = pattern(22, VOLUME_BYTES as usize);
        // Several txgs, each writing the whole volume: more than 10 failed writes.
        for round in 0..4 {
            let at = round * VOLUME_BYTES / 4;
            let part = &data[at as usize..(at + VOLUME_BYTES / 4) as usize];
            block_on(v.write(at, part, false)).unwrap();
            pool.sync().unwrap();
        }
        let s = pool.status();
        assert!(leaf(&s, bad).write_errors >= 10, "{shape}: {s:?}");
        assert_eq!(leaf(&s, bad).state, "FAULTED", "{shape}: {s:?}");
        assert_eq!(s.state, "DEGRADED");
        assert!(read_all(&v).unwrap() == data, "{shape}: wrong data");
        pool.inject_clear(Some(7));
        pool.clear(Some(dev)).unwrap();
        // Back in service, but it lacks the blocks it failed or missed: said, and read
        // around (the other copies first, its column as missing).
        let s = pool.status();
        assert_eq!(leaf(&s, bad).state, "ONLINE", "{s:?}");
        assert!(
            leaf(&s, bad)
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("lacks the blocks of txgs")),
            "{shape}: {s:?}"
        );
        assert_eq!(
            (s.state.as_str(), s.vdevs[0].state.as_str()),
            ("DEGRADED", "DEGRADED")
        );
        assert!(s.reasons.iter().any(|r| r.contains("scrub")), "{s:?}");
        assert!(
            read_all(&v).unwrap() == data,
            "{shape}: wrong data after clear"
        );
        let s = pool.status();
        assert_eq!(
            leaf(&s, bad).checksum_errors,
            0,
            "expected to lack them: {s:?}"
        );
        let scrub = pool.scrub().unwrap();
        assert_eq!(scrub.blocks_lost, 0, "{scrub:?}");
        assert!(scrub.copies_repaired > 0, "{scrub:?}");
        let s = pool.status();
        assert_eq!(s.state, "ONLINE", "{shape}: {s:?}");
        assert!(leaf(&s, bad).reason.is_none(), "{s:?}");
        drop(v);
        pool.export().unwrap();
        // The scrub's repair is real: with every other device failing reads where the
        // redundancy allows (the other mirror side; one raidz1 child), the data is right.
        let pool = reimport(&mems);
        pool.set_prop("data_cache_max", "0").unwrap();
        pool.set_prop("fault_errors", "0").unwrap();
        pool.inject_add(rule(1, &pool, "mem1", InjectKind::Io, InjectOps::Read))
            .unwrap();
        let v = pool.volume("v").unwrap();
        assert!(
            read_all(&v).unwrap() == data,
            "{shape}: the scrub did not repair"
        );
        assert_eq!(leaf(&pool.status(), 0).checksum_errors, 0);
        drop(v);
        pool.export().unwrap();
    }
}

#[test]
fn injected_corruption_is_caught_and_degrades_the_device() {
    for (shape, kind, n) in shapes() {
        let (pool, _mems, data) = written(kind, n, 3);
        let bad = n - 1;
        let dev = format!("mem{bad}");
        pool.inject_add(rule(3, &pool, &dev, InjectKind::Corrupt, InjectOps::Read))
            .unwrap();
        let v = pool.volume("v").unwrap();
        assert!(
            read_by_block(&v) == data,
            "{shape}: corrupted data returned"
        );
        let s = pool.status();
        assert!(leaf(&s, bad).checksum_errors >= 10, "{shape}: {s:?}");
        assert_eq!(leaf(&s, bad).read_errors, 0);
        // Checksum errors degrade (still used), as in ZFS; they do not fault.
        assert_eq!(leaf(&s, bad).state, "DEGRADED", "{shape}: {s:?}");
        assert!(
            leaf(&s, bad)
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("too many checksum errors")),
            "{s:?}"
        );
        assert_eq!(s.state, "DEGRADED");
        assert!(read_all(&v).unwrap() == data, "{shape}: second read");
        pool.inject_clear(None);
        pool.clear(None).unwrap();
        let s = pool.status();
        assert_eq!(s.state, "ONLINE", "{shape}: {s:?}");
        assert_eq!(leaf(&s, bad).checksum_errors, 0);
        assert!(read_all(&v).unwrap() == data);
        assert_eq!(leaf(&pool.status(), bad).checksum_errors, 0, "{shape}");
        drop(v);
        pool.export().unwrap();
    }
}

/// Reads in flight on a device when the fault rule takes it out: each of their errors comes
/// back after it is FAULTED (a raidz read once looked the device up again there, found none,
/// and panicked the pool's sync thread; the pool suspended).
#[test]
fn reads_in_flight_when_their_device_is_faulted_still_give_the_data() {
    for (shape, kind, n) in shapes() {
        let (pool, _mems, data) = written(kind, n, 5);
        pool.set_prop("fault_errors", "1").unwrap();
        let dev = format!("mem{}", n - 1);
        // Every read of it fails, after 20 ms: all of them are in flight before the first
        // error faults it.
        pool.inject_add(rule(1, &pool, &dev, InjectKind::Io, InjectOps::Read))
            .unwrap();
        let delay = InjectKind::Delay { delay_ms: 20 };
        pool.inject_add(rule(2, &pool, &dev, delay, InjectOps::Read))
            .unwrap();
        let v = pool.volume("v").unwrap();
        assert!(read_at_once(&v) == data, "{shape}: wrong data");
        let s = pool.status();
        assert_eq!(leaf(&s, n - 1).state, "FAULTED", "{shape}: {s:?}");
        assert!(leaf(&s, n - 1).read_errors > 1, "{shape}: {s:?}");
        // The pool still commits.
        block_on(v.write(0, &data[..CHUNK_BYTES], false)).unwrap();
        pool.sync().unwrap();
        drop(v);
        pool.export().unwrap();
    }
}

#[test]
fn injected_latency_delays_without_errors() {
    for (shape, kind, n) in shapes() {
        let (pool, _mems, data) = written(kind, n, 4);
        for i in 0..n {
            let dev = format!("mem{i}");
            let delay = InjectKind::Delay { delay_ms: 20 };
            pool.inject_add(rule(10 + i as u64, &pool, &dev, delay, InjectOps::All))
                .unwrap();
        }
        let v = pool.volume("v").unwrap();
        // Many reads in flight at once, each delayed on its own timer.
        assert!(read_at_once(&v) == data, "{shape}: wrong data");
        let rules = pool.inject_rules();
        let hits: u64 = rules.iter().map(|(_, r)| r.hits).sum();
        assert!(hits > 0, "{shape}: {rules:?}");
        // Writes and flushes too.
        block_on(v.write(0, &data[..CHUNK_BYTES], false)).unwrap();
        pool.sync().unwrap();
        let after: u64 = pool.inject_rules().iter().map(|(_, r)| r.hits).sum();
        assert!(after > hits, "{shape}");
        let s = pool.status();
        assert_eq!(s.state, "ONLINE", "{shape}: {s:?}");
        assert!(s.vdevs[0].children.iter().all(|c| c.read_errors == 0));
        drop(v);
        pool.export().unwrap();
    }
}

#[test]
fn offline_is_refused_beyond_redundancy_and_persists_unless_temporary() {
    let cases: Vec<(TopVdevKind, usize, usize)> = vec![
        (TopVdevKind::Mirror, 2, 1),
        (TopVdevKind::Mirror, 3, 2),
        (raidz(1), 3, 1),
        (raidz(2), 5, 2),
    ];
    for (kind, n, can_lose) in cases {
        let (pool, mems, data) = written(kind.clone(), n, 5);
        for i in 0..can_lose {
            pool.offline(&format!("mem{i}"), false).unwrap();
        }
        let before = format!("{:?}", pool.status().vdevs);
        let err = pool.offline(&format!("mem{can_lose}"), false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("cannot take mem{can_lose} offline"))
                && msg.contains(&format!("can lose {can_lose} of its devices")),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert_eq!(
            format!("{:?}", pool.status().vdevs),
            before,
            "nothing changed"
        );
        let s = pool.status();
        for i in 0..can_lose {
            assert_eq!(leaf(&s, i).state, "OFFLINE");
        }
        assert_eq!(leaf(&s, can_lose).state, "ONLINE");
        let v = pool.volume("v").unwrap();
        assert!(read_all(&v).unwrap() == data);
        // Written while they are out: they lack it.
        let data2 = pattern(55, VOLUME_BYTES as usize);
        block_on(v.write(0, &data2, false)).unwrap();
        drop(v);
        pool.export().unwrap();
        // Persisted: still offline after import.
        let pool = reimport(&mems);
        let s = pool.status();
        assert_eq!(leaf(&s, 0).state, "OFFLINE", "{s:?}");
        assert_eq!(s.state, "DEGRADED");
        let v = pool.volume("v").unwrap();
        assert!(read_all(&v).unwrap() == data2);
        // The resilver that `online` starts is held, to see the devices lacking txgs.
        pool.scan_hold_after(1);
        for i in 0..can_lose {
            pool.online(&format!("mem{i}")).unwrap();
        }
        let s = pool.status();
        assert_eq!(leaf(&s, 0).state, "ONLINE");
        assert_eq!(s.state, "DEGRADED", "they lack what was written: {s:?}");
        assert!(read_all(&v).unwrap() == data2);
        // While one lacks txgs, it is no copy: taking a whole one out is refused.
        let whole = format!("mem{}", n - 1);
        assert!(pool.offline(&whole, true).is_err());
        pool.scan_hold_after(0);
        let resilver = wait_scan_end(&pool);
        assert_eq!(
            resilver.kind,
            oxpool_engine::ScanKind::Resilver,
            "{resilver:?}"
        );
        assert_eq!(resilver.counts.blocks_lost, 0, "{resilver:?}");
        assert_eq!(pool.status().state, "ONLINE");
        assert_eq!(pool.scrub().unwrap().blocks_lost, 0);
        assert_eq!(pool.status().state, "ONLINE");
        // Temporary: not persisted.
        pool.offline("mem0", true).unwrap();
        assert_eq!(leaf(&pool.status(), 0).state, "OFFLINE");
        drop(v);
        pool.export().unwrap();
        let pool = reimport(&mems);
        let s = pool.status();
        assert_eq!(leaf(&s, 0).state, "ONLINE", "{s:?}");
        // Nothing was written while it was out (the export's txg aside, which skipped it):
        // whatever it lacks, it says.
        let v = pool.volume("v").unwrap();
        assert!(read_all(&v).unwrap() == data2);
        drop(v);
        pool.export().unwrap();
    }
    // A single device: never.
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let err = pool.offline("mem0", true).unwrap_err().to_string();
    assert!(err.contains("single device"), "{err}");
    assert_eq!(pool.status().state, "ONLINE");
    pool.export().unwrap();
}

#[test]
fn the_fault_rule_is_a_property_and_never_faults_beyond_redundancy() {
    let (pool, _mems, data) = written(TopVdevKind::Mirror, 2, 6);
    pool.set_prop("fault_errors", "0").unwrap();
    pool.inject_add(rule(1, &pool, "mem1", InjectKind::Io, InjectOps::Read))
        .unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
    let s = pool.status();
    assert!(leaf(&s, 1).read_errors >= 10);
    assert_eq!(leaf(&s, 1).state, "ONLINE", "fault_errors=0: {s:?}");
    pool.set_prop("fault_errors", "3").unwrap();
    assert_eq!(pool.get_prop("fault_errors").unwrap(), "3");
    pool.clear(None).unwrap();
    assert!(read_all(&v).unwrap() == data);
    let s = pool.status();
    assert_eq!(leaf(&s, 1).state, "FAULTED");
    let errors = leaf(&s, 1).read_errors;
    assert!((3..10).contains(&errors), "out after the third: {s:?}");
    assert!(read_all(&v).unwrap() == data);
    assert_eq!(
        leaf(&pool.status(), 1).read_errors,
        errors,
        "out of service"
    );
    pool.inject_clear(None);
    pool.clear(None).unwrap();
    // The other side now also fails, with mem1 offline: no copy is left to fault it to.
    pool.offline("mem1", true).unwrap();
    pool.inject_add(rule(2, &pool, "mem0", InjectKind::Io, InjectOps::Read))
        .unwrap();
    assert!(
        read_all(&v).is_err(),
        "no good copy: an error, never wrong data"
    );
    let s = pool.status();
    assert_eq!(leaf(&s, 0).state, "DEGRADED", "{s:?}");
    assert!(
        leaf(&s, 0)
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("not faulted")),
        "{s:?}"
    );
    pool.inject_clear(None);
    pool.online("mem1").unwrap();
    pool.clear(None).unwrap();
    assert!(read_all(&v).unwrap() == data);
    assert_eq!(pool.status().state, "ONLINE");
    drop(v);
    pool.export().unwrap();
}

/// A memory device that can be made to vanish: every I/O then fails with ENODEV.
struct Vanishing {
    mem: MemoryBackend,
    gone: AtomicBool,
}

impl Vanishing {
    fn check(&self) -> Result<(), std::io::Error> {
        if self.gone.load(Ordering::Relaxed) {
            Err(std::io::Error::from_raw_os_error(libc::ENODEV))
        } else {
            Ok(())
        }
    }
}

impl Backend for Vanishing {
    fn name(&self) -> &str {
        self.mem.name()
    }
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        match self.check() {
            Ok(()) => self.mem.read(offset_bytes, buf),
            Err(e) => IoFuture::ready(Err(e)),
        }
    }
    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        match self.check() {
            Ok(()) => self.mem.write(offset_bytes, buf),
            Err(e) => IoFuture::ready(Err(e)),
        }
    }
    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        match self.check() {
            Ok(()) => self.mem.write_durable(offset_bytes, buf),
            Err(e) => IoFuture::ready(Err(e)),
        }
    }
    fn flush(&self) -> IoFuture<()> {
        match self.check() {
            Ok(()) => self.mem.flush(),
            Err(e) => IoFuture::ready(Err(e)),
        }
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()> {
        self.mem.discard(offset_bytes, length_bytes)
    }
}

#[test]
fn a_device_that_vanishes_is_removed_and_the_pool_serves_on() {
    let (pool, mems, data) = written(raidz(1), 3, 8);
    pool.export().unwrap();
    let vanishing = Arc::new(Vanishing {
        mem: mems[1].clone(),
        gone: AtomicBool::new(false),
    });
    let devices: Vec<Arc<dyn Backend>> = vec![
        Arc::new(mems[0].clone()),
        vanishing.clone(),
        Arc::new(mems[2].clone()),
    ];
    let pool = Pool::import(devices, Some("tank")).unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let v = pool.volume("v").unwrap();
    vanishing.gone.store(true, Ordering::Relaxed);
    assert!(read_all(&v).unwrap() == data);
    let s = pool.status();
    assert_eq!(leaf(&s, 1).state, "REMOVED", "{s:?}");
    // Removed at its first error (reads already in flight may add theirs), not after the
    // fault rule's ten.
    let errors = leaf(&s, 1).read_errors;
    assert!((1..10).contains(&errors), "{s:?}");
    assert!(
        leaf(&s, 1).reason.as_deref().unwrap().contains("gone"),
        "{s:?}"
    );
    assert_eq!(s.state, "DEGRADED");
    assert!(read_all(&v).unwrap() == data);
    assert_eq!(
        leaf(&pool.status(), 1).read_errors,
        errors,
        "out of service"
    );
    // Writes go on without it.
    let data2 = pattern(88, VOLUME_BYTES as usize);
    block_on(v.write(0, &data2, false)).unwrap();
    pool.sync().unwrap();
    assert!(read_all(&v).unwrap() == data2);
    // Back: `clear` returns it; it lacks what was written meanwhile until a scrub.
    vanishing.gone.store(false, Ordering::Relaxed);
    pool.clear(Some("mem1")).unwrap();
    let s = pool.status();
    assert_eq!(leaf(&s, 1).state, "ONLINE");
    assert_eq!(s.state, "DEGRADED", "{s:?}");
    assert!(read_all(&v).unwrap() == data2);
    assert_eq!(pool.scrub().unwrap().blocks_lost, 0);
    assert_eq!(pool.status().state, "ONLINE");
    drop(v);
    pool.export().unwrap();
}

#[test]
fn a_device_missing_at_import_lacks_what_was_written_without_it() {
    let (pool, mems, _) = written(TopVdevKind::Mirror, 2, 9);
    pool.export().unwrap();
    let only0: Vec<Arc<dyn Backend>> = vec![Arc::new(mems[0].clone())];
    let pool = Pool::import(only0, Some("tank")).unwrap();
    let s = pool.status();
    assert_eq!(leaf(&s, 1).state, "UNAVAIL", "{s:?}");
    assert_eq!(leaf(&s, 1).reason.as_deref(), Some("not found at import"));
    let v = pool.volume("v").unwrap();
    let data = pattern(99, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    drop(v);
    pool.export().unwrap();
    let pool = reimport(&mems);
    pool.set_prop("data_cache_max", "0").unwrap();
    let s = pool.status();
    assert_eq!(leaf(&s, 1).state, "ONLINE");
    // It lacks the txgs written without it: the import resilvers them.
    let resilver = wait_scan_end(&pool);
    assert_eq!(
        resilver.kind,
        oxpool_engine::ScanKind::Resilver,
        "{resilver:?}"
    );
    assert!(resilver.counts.copies_repaired > 0, "{resilver:?}");
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
    assert_eq!(
        leaf(&pool.status(), 1).checksum_errors,
        0,
        "expected, not errors"
    );
    assert_eq!(pool.scrub().unwrap().blocks_lost, 0);
    assert_eq!(pool.status().state, "ONLINE");
    drop(v);
    pool.export().unwrap();
}

#[test]
fn an_import_takes_back_a_faulted_device_its_vdev_cannot_do_without() {
    let (pool, mems, data) = written(raidz(1), 3, 10);
    // mem2 faulted (recorded in the pool), then exported.
    pool.inject_add(rule(1, &pool, "mem2", InjectKind::Io, InjectOps::Read))
        .unwrap();
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == data);
    assert_eq!(leaf(&pool.status(), 2).state, "FAULTED");
    drop(v);
    pool.export().unwrap();
    // All three back: mem2 stays faulted.
    let pool = reimport(&mems);
    assert_eq!(leaf(&pool.status(), 2).state, "FAULTED");
    pool.export().unwrap();
    // mem0 gone: the raidz1 cannot do without mem2 as well, so it is back in service.
    let two: Vec<Arc<dyn Backend>> = vec![Arc::new(mems[1].clone()), Arc::new(mems[2].clone())];
    let pool = Pool::import(two, Some("tank")).unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let s = pool.status();
    assert_eq!(leaf(&s, 0).state, "UNAVAIL", "{s:?}");
    assert_eq!(leaf(&s, 2).state, "DEGRADED", "{s:?}");
    assert!(
        leaf(&s, 2)
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("FAULTED when the pool was exported")),
        "{s:?}"
    );
    assert_eq!(s.state, "DEGRADED");
    let v = pool.volume("v").unwrap();
    assert!(
        read_all(&v).unwrap() == data,
        "the faulted device holds its columns"
    );
    drop(v);
    pool.export().unwrap();
}
