//! Resilver and the scan's persisted position: a device taken away and brought back is
//! resilvered automatically and only what it missed is visited (fewer blocks than the pool
//! holds, which a full scrub counts), after which the device alone gives back every block;
//! a scrub or resilver stopped mid-way by a pause, an export or a crash resumes from its
//! persisted position (it does not start over) and completes.

mod common;

use common::{mem_pool, pattern, raidz, reimport};
use oxpool_engine::{Pool, ScanKind, ScanState, ScanStatus, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::MemoryBackend;
use std::time::{Duration, Instant};

const VOLUME_BYTES: u64 = 4 << 20;
const BLOCK_BYTES: u64 = 4096;

/// A pool of `kind` over `n` memory devices with volume `v` (4 KiB blocks, no compression)
/// written and synced, its data cache off (every read goes to the devices).
fn written(kind: TopVdevKind, n: usize) -> (Pool, Vec<MemoryBackend>, Vec<u8>) {
    let (pool, mems) = mem_pool(kind, n);
    pool.set_prop("data_cache_max", "0").unwrap();
    let v = pool
        .create_volume(
            "v",
            VOLUME_BYTES,
            &[
                ("compression".to_string(), "off".to_string()),
                ("volblocksize".to_string(), "4K".to_string()),
            ],
        )
        .unwrap();
    let data = pattern(1, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    (pool, mems, data)
}

fn read_all(v: &Volume) -> Vec<u8> {
    let mut got = vec![0u8; v.size_bytes() as usize];
    block_on(v.read(0, &mut got)).unwrap();
    got
}

/// Overwrites one block in `every` with new bytes, a txg per quarter; returns the new content.
fn overwrite_some(pool: &Pool, data: &[u8], every: u64, seed: u64) -> Vec<u8> {
    let v = pool.volume("v").unwrap();
    let mut data = data.to_vec();
    let blocks = VOLUME_BYTES / BLOCK_BYTES;
    for b in (0..blocks).step_by(every as usize) {
        let at = (b * BLOCK_BYTES) as usize;
        let new = pattern(seed + b, BLOCK_BYTES as usize);
        data[at..at + BLOCK_BYTES as usize].copy_from_slice(&new);
        block_on(v.write(at as u64, &new, false)).unwrap();
        if b % (blocks / 4) == 0 {
            pool.sync().unwrap();
        }
    }
    pool.sync().unwrap();
    data
}

/// Waits for the running scan to end; its status.
fn wait_end(pool: &Pool) -> ScanStatus {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = pool.scan_wait(Duration::from_secs(1)).expect("a scan");
        if s.state != ScanState::Scanning {
            return s;
        }
        assert!(Instant::now() < deadline, "the scan does not end: {s:?}");
    }
}

/// Waits until the running scan has visited at least `blocks` blocks (it is held there).
fn wait_visited(pool: &Pool, blocks: u64) -> ScanStatus {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s = pool.scan_status().expect("a scan");
        if s.blocks_visited >= blocks {
            return s;
        }
        assert_eq!(s.state, ScanState::Scanning, "{s:?}");
        assert!(Instant::now() < deadline, "no progress: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Blocks a full scrub visits: every block the pool holds.
fn scrub_total(pool: &Pool) -> (u64, ScanStatus) {
    let counts = pool.scrub().unwrap();
    let s = pool.scan_status().unwrap();
    assert_eq!(s.kind, ScanKind::Scrub);
    assert_eq!(counts.blocks_lost, 0, "{s:?}");
    (s.blocks_visited, s)
}

/// Takes `out` offline, rewrites some blocks, brings them back: the resilver starts by
/// itself, visits fewer blocks than the pool holds, and leaves the returned devices whole:
/// with the devices in `others` offline, every block reads right from the rest.
fn resilver_only_what_was_missed(kind: TopVdevKind, n: usize, out: &[&str], others: &[&str]) {
    let (pool, _mems, data) = written(kind, n);
    for d in out {
        pool.offline(d, false).unwrap();
    }
    let data = overwrite_some(&pool, &data, 8, 100);
    for d in out {
        pool.online(d).unwrap();
    }
    let s = wait_end(&pool);
    assert_eq!(
        (s.kind, s.state),
        (ScanKind::Resilver, ScanState::Finished),
        "{s:?}"
    );
    assert_eq!(s.counts.blocks_lost, 0, "{s:?}");
    assert!(s.counts.copies_repaired > 0, "nothing written: {s:?}");
    assert_eq!(s.counts.copies_bad, s.counts.copies_repaired, "{s:?}");
    let st = pool.status();
    assert_eq!(
        st.state, "ONLINE",
        "resilvered devices lack nothing: {st:?}"
    );
    // The returned devices alone (with as many others out as the redundancy allows).
    for d in others {
        pool.offline(d, true).unwrap();
    }
    let v = pool.volume("v").unwrap();
    assert!(
        read_all(&v) == data,
        "the resilver did not write what was missed"
    );
    for d in others {
        pool.online(d).unwrap();
    }
    // Nothing missed, nothing to resilver: the last scan is still the resilver.
    assert_eq!(pool.scan_status().unwrap().kind, ScanKind::Resilver);
    let (total, scrub) = scrub_total(&pool);
    assert_eq!(scrub.counts.copies_bad, 0, "a scrub after it: {scrub:?}");
    eprintln!(
        "resilver visited {} blocks of {total} ({} bytes repaired)",
        s.blocks_visited, s.repaired_bytes
    );
    assert!(
        s.blocks_visited < total / 2,
        "visited {} of {total}: not only what was missed",
        s.blocks_visited
    );
    assert!(read_all(&v) == data);
    drop(v);
    pool.export().unwrap();
}

#[test]
fn a_mirror_side_brought_back_resilvers_only_what_it_missed() {
    resilver_only_what_was_missed(TopVdevKind::Mirror, 2, &["mem1"], &["mem0"]);
}

#[test]
fn raidz2_devices_brought_back_resilver_only_what_they_missed() {
    resilver_only_what_was_missed(raidz(2), 5, &["mem0", "mem1"], &["mem2", "mem3"]);
}

#[test]
fn a_device_missing_at_import_is_resilvered_when_it_returns() {
    let (pool, mems, data) = written(TopVdevKind::Mirror, 2);
    pool.export().unwrap();
    let only0: Vec<std::sync::Arc<dyn oxpool_io::Backend>> =
        vec![std::sync::Arc::new(mems[0].clone())];
    let pool = Pool::import(only0, Some("tank")).unwrap();
    let data = overwrite_some(&pool, &data, 4, 300);
    pool.export().unwrap();
    let pool = reimport(&mems);
    pool.set_prop("data_cache_max", "0").unwrap();
    let s = wait_end(&pool);
    assert_eq!((s.kind, s.state), (ScanKind::Resilver, ScanState::Finished));
    assert!(s.counts.copies_repaired > 0, "{s:?}");
    assert_eq!(pool.status().state, "ONLINE");
    pool.offline("mem0", true).unwrap();
    assert!(read_all(&pool.volume("v").unwrap()) == data);
    pool.export().unwrap();
}

/// A scan held after `at` blocks, then stopped by `stop` (which returns the pool to go on
/// with): it resumes from its position, does not start over, and ends with every block
/// checked. Returns the final status and the blocks a full scrub visits.
fn resumes(
    pool: Pool,
    mems: &[MemoryBackend],
    at: u64,
    start: impl FnOnce(&Pool),
    stop: impl FnOnce(Pool, &[MemoryBackend]) -> Pool,
) -> (Pool, ScanStatus, u64) {
    // Batches of a level-1 block's children: several positions in this small pool.
    pool.scan_batch_blocks(256);
    pool.scan_hold_after(at);
    start(&pool);
    let held = wait_visited(&pool, at);
    let pool = stop(pool, mems);
    pool.scan_batch_blocks(256);
    let s = pool.scan_status().expect("the scan's record");
    assert_eq!(s.kind, held.kind);
    let p = s.position.expect("a persisted position");
    assert!(p.cursor > 0, "{s:?}");
    assert!(s.blocks_visited >= at, "counters persisted: {s:?}");
    let persisted = s.blocks_visited;
    if s.state == ScanState::Paused {
        pool.scrub_start().unwrap();
    }
    let end = wait_end(&pool);
    assert_eq!(end.state, ScanState::Finished, "{end:?}");
    assert_eq!(end.counts.blocks_lost, 0);
    let (total, _) = scrub_total(&pool);
    eprintln!(
        "{}: held at {persisted} blocks, ended at {}, a full pass {total}",
        end.kind.as_str(),
        end.blocks_visited
    );
    // Resumed: what it visited after the stop is less than a whole pass by about what it
    // had done (a batch and the metadata are done again, nothing more).
    assert!(
        end.blocks_visited - persisted <= total - persisted / 2,
        "started over: {persisted} before, {} in all, {total} a pass",
        end.blocks_visited
    );
    assert!(end.blocks_visited < 2 * total);
    (pool, end, total)
}

#[test]
fn a_paused_scrub_stays_paused_across_export_and_resumes_where_it_was() {
    let (pool, mems, data) = written(TopVdevKind::Mirror, 2);
    let (pool, _, _) = resumes(
        pool,
        &mems,
        400,
        |p| p.scrub_start().unwrap(),
        |pool, mems| {
            pool.scrub_pause().unwrap();
            let s = pool.scan_status().unwrap();
            assert_eq!(s.state, ScanState::Paused, "{s:?}");
            // Refused while paused: another pause; allowed: a resume (after the import).
            assert!(pool.scrub_pause().is_err());
            pool.export().unwrap();
            let pool = reimport(mems);
            let s = pool.scan_status().unwrap();
            assert_eq!(
                (s.kind, s.state),
                (ScanKind::Scrub, ScanState::Paused),
                "{s:?}"
            );
            pool
        },
    );
    assert!(read_all(&pool.volume("v").unwrap()) == data);
    pool.export().unwrap();
}

#[test]
fn a_scrub_resumes_after_export_and_after_a_crash() {
    let (pool, mems, data) = written(TopVdevKind::Mirror, 2);
    let (pool, _, _) = resumes(
        pool,
        &mems,
        400,
        |p| p.scrub_start().unwrap(),
        |pool, mems| {
            pool.export().unwrap();
            let pool = reimport(mems);
            let s = pool.scan_status().unwrap();
            assert_eq!(s.kind, ScanKind::Scrub);
            assert_ne!(s.state, ScanState::Paused);
            pool
        },
    );
    pool.export().unwrap();
    // A crash: the position of the last sync; the process gone without an export.
    let pool = reimport(&mems);
    pool.set_prop("data_cache_max", "0").unwrap();
    let (pool, _, _) = resumes(
        pool,
        &mems,
        300,
        |p| p.scrub_start().unwrap(),
        |pool, mems| {
            pool.sync().unwrap();
            drop(pool);
            reimport(mems)
        },
    );
    assert!(read_all(&pool.volume("v").unwrap()) == data);
    common::audit_clean(&pool, "after the crash and the resumed scrub");
    pool.export().unwrap();
}

#[test]
fn a_resilver_resumes_after_export_and_completes() {
    let (pool, mems, data) = written(TopVdevKind::Mirror, 2);
    pool.offline("mem1", false).unwrap();
    // Every block rewritten: the resilver has as much to do as a scrub.
    let data = overwrite_some(&pool, &data, 1, 500);
    let (pool, end, _) = resumes(
        pool,
        &mems,
        300,
        |p| p.online("mem1").unwrap(),
        |pool, mems| {
            assert_eq!(pool.scan_status().unwrap().kind, ScanKind::Resilver);
            // Refused during a resilver: a scrub, a pause, a cancel.
            assert!(pool.scrub_start().is_err());
            assert!(pool.scrub_pause().is_err());
            assert!(pool.scrub_cancel().is_err());
            pool.export().unwrap();
            let pool = reimport(mems);
            pool.set_prop("data_cache_max", "0").unwrap();
            pool
        },
    );
    assert_eq!(end.kind, ScanKind::Resilver);
    assert_eq!(pool.status().state, "ONLINE");
    pool.offline("mem0", true).unwrap();
    assert!(read_all(&pool.volume("v").unwrap()) == data);
    pool.export().unwrap();
}

#[test]
fn a_resilver_cancels_a_running_scrub() {
    let (pool, _mems, data) = written(TopVdevKind::Mirror, 2);
    pool.offline("mem1", false).unwrap();
    let data = overwrite_some(&pool, &data, 2, 700);
    pool.scan_batch_blocks(64);
    pool.scan_hold_after(100);
    pool.scrub_start().unwrap();
    wait_visited(&pool, 100);
    pool.online("mem1").unwrap();
    pool.scan_hold_after(0);
    let s = wait_end(&pool);
    assert_eq!((s.kind, s.state), (ScanKind::Resilver, ScanState::Finished));
    assert_eq!(pool.status().state, "ONLINE");
    // Nothing lacking: `resilver_start` (for replace, attach, spares) starts nothing.
    pool.resilver_start().unwrap();
    let again = pool.scan_status().unwrap();
    assert_eq!(
        (again.state, again.started_ns),
        (ScanState::Finished, s.started_ns)
    );
    pool.offline("mem0", true).unwrap();
    assert!(read_all(&pool.volume("v").unwrap()) == data);
    pool.export().unwrap();
}

/// A memory device that records the offset of every read, in the order they are issued.
struct Recording {
    mem: MemoryBackend,
    reads: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

impl oxpool_io::Backend for Recording {
    fn name(&self) -> &str {
        self.mem.name()
    }
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.reads.lock().unwrap().push(offset_bytes);
        self.mem.read(offset_bytes, buf)
    }
    fn write(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.mem.write(offset_bytes, buf)
    }
    fn write_durable(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.mem.write_durable(offset_bytes, buf)
    }
    fn flush(&self) -> oxpool_io::IoFuture<()> {
        self.mem.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> oxpool_io::IoFuture<()> {
        self.mem.discard(offset_bytes, length_bytes)
    }
}

#[test]
fn a_scrub_reads_a_fragmented_volume_in_device_order() {
    let mem = MemoryBackend::new("mem0", common::DEVICE_BYTES);
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let dev = Recording {
        mem: mem.clone(),
        reads: reads.clone(),
    };
    let pool = Pool::create(
        "tank",
        vec![oxpool_engine::TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![std::sync::Arc::new(dev)],
        }],
        common::test_props(),
        false,
    )
    .unwrap();
    // The queue passes reads on in the order they come: what the device sees is the scan's
    // order.
    pool.set_device_prop("mem0", "scheduler", "off").unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let (_, _, data) = {
        let v = pool
            .create_volume(
                "v",
                VOLUME_BYTES,
                &[
                    ("compression".to_string(), "off".to_string()),
                    ("volblocksize".to_string(), "4K".to_string()),
                ],
            )
            .unwrap();
        // Blocks written in a scrambled order, a txg each few: logical order is not
        // device order.
        let blocks = VOLUME_BYTES / BLOCK_BYTES;
        let data = pattern(9, VOLUME_BYTES as usize);
        for i in 0..blocks {
            let b = (i * 389) % blocks; // 389 is prime to 1024: a permutation
            let at = (b * BLOCK_BYTES) as usize;
            block_on(v.write(at as u64, &data[at..at + BLOCK_BYTES as usize], false)).unwrap();
            if i % 64 == 63 {
                pool.sync().unwrap();
            }
        }
        pool.sync().unwrap();
        ((), (), data)
    };
    reads.lock().unwrap().clear();
    let counts = pool.scrub().unwrap();
    assert_eq!(counts.blocks_lost, 0);
    let offsets = reads.lock().unwrap().clone();
    let descents = offsets.windows(2).filter(|w| w[1] < w[0]).count();
    eprintln!(
        "{} reads, {descents} of them before the one issued ahead",
        offsets.len()
    );
    assert!(offsets.len() > 1000, "{}", offsets.len());
    // Sorted: the data blocks ascend; only the few metadata and indirect reads step back.
    assert!(
        descents < 20,
        "{descents} descents in {} reads",
        offsets.len()
    );
    assert!(read_all(&pool.volume("v").unwrap()) == data);
    pool.export().unwrap();
}
