//! The intent log under device faults in the middle of a commit:
//!
//! - EIO on log-block writes while concurrent writers commit (with power loss at a seeded
//!   point): every write answered as durable reads back after the crash and import.
//! - ENOSPC allocating a log block in the middle of a build: every committer gets an answer
//!   (the txg makes it durable), and the log works again after the next txg sync, although
//!   the failed build left a closed block that was never written.
//! - Records a failed build took out of the pending list are in no block: a later commit
//!   must not be answered before their txg has synced, even after the log restarted.
//! - In-place blocks allocated while a txg syncs, whose records belong to the next txg, are
//!   freed once after a crash and import: the space comes back.
//!
//! `OXPOOL_CRASH_CASES` and `OXPOOL_CRASH_SEED` as in power_loss.rs (for the EIO cases).

mod common;

use common::{audit_clean, audit_result, pattern, test_props, CrashGroup, GroupDevice};
use oxpool_engine::{Pool, TopSpec, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::{block_on, join_all, sleep};
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DEVICE_BYTES: u64 = 64 << 20;
const LOG_DEVICE_BYTES: u64 = 16 << 20;
const WRITERS: u64 = 8;
const REGION_BYTES: u64 = 64 << 10;

fn single(devices: Vec<Arc<dyn Backend>>, log: bool) -> TopSpec {
    TopSpec {
        log,
        kind: TopVdevKind::Single,
        devices,
    }
}

/// One writer's view: its own region, what is durable, what came after.
struct Writer {
    current: Vec<u8>,
    durable: Vec<u8>,
    since: Vec<(usize, Vec<u8>)>,
    /// Every operation: (step, offset, data or empty for a FLUSH, fua, answered ok).
    history: Vec<(u64, usize, Vec<u8>, bool, bool)>,
}

impl Writer {
    fn new() -> Writer {
        Writer {
            current: vec![0; REGION_BYTES as usize],
            durable: vec![0; REGION_BYTES as usize],
            since: Vec::new(),
            history: Vec::new(),
        }
    }

    /// The operations that touched byte `i`, and the FLUSHes, for a failure message.
    fn story(&self, i: usize, got: u8) -> String {
        let mut out = String::new();
        for (step, off, data, fua, ok) in &self.history {
            if data.is_empty() {
                out += &format!(" [{step}: flush ok={ok}]");
            } else if i >= *off && i < off + data.len() {
                let v = data[i - off];
                out += &format!(
                    " [{step}: write {v:#x} fua={fua} ok={ok}{}]",
                    if v == got { " <- got" } else { "" }
                );
            }
        }
        out
    }

    /// A FLUSH, or a FUA write, was answered: everything this writer wrote is durable.
    fn all_durable(&mut self) {
        self.durable = self.current.clone();
        self.since.clear();
    }

    /// The first byte of `got` that is neither durable nor put there by a later write.
    fn first_wrong_byte(&self, got: &[u8]) -> Option<usize> {
        (0..got.len()).find(|&i| {
            got[i] != self.durable[i]
                && !self
                    .since
                    .iter()
                    .any(|(o, d)| i >= *o && i < o + d.len() && d[i - o] == got[i])
        })
    }
}

/// FUA writes and FLUSHes in the writer's region. An error is a legal answer (the write may or
/// may not have landed); a success promises durability. Stops at the first error.
async fn writer_task(vol: Volume, w: u64, seed: u64, state: &RefCell<Writer>) {
    let mut rng = SmallRng::seed_from_u64(seed ^ (w << 40));
    let base = w * REGION_BYTES;
    for step in 0..40u64 {
        let ok = if rng.random_range(0..5) == 0 {
            let r = vol.flush().await;
            if r.is_ok() {
                state.borrow_mut().all_durable();
            }
            state
                .borrow_mut()
                .history
                .push((step, 0, Vec::new(), false, r.is_ok()));
            r.is_ok()
        } else {
            let len = rng.random_range(1..12_000u64);
            let off = rng.random_range(0..REGION_BYTES - len);
            let data = pattern(seed ^ (w << 32) ^ step, len as usize);
            let fua = rng.random_range(0..3) != 0;
            {
                // Recorded before the write: a write in flight at the crash may land.
                let mut s = state.borrow_mut();
                s.current[off as usize..(off + len) as usize].copy_from_slice(&data);
                s.since.push((off as usize, data.clone()));
            }
            let r = vol.write(base + off, &data, fua).await;
            if r.is_ok() && fua {
                state.borrow_mut().all_durable();
            }
            state
                .borrow_mut()
                .history
                .push((step, off as usize, data, fua, r.is_ok()));
            r.is_ok()
        };
        // After an error the write may or may not have been applied, so no later answer
        // promises anything about it: this writer stops (the device is dead by then, since
        // log write errors alone fall back to the txg).
        if !ok {
            return;
        }
    }
}

/// One seeded case: a data device and a log device; the log device fails a share of its
/// writes with EIO while 8 writers commit concurrently, so log blocks fail in the middle of
/// group commits (the records of a failed block, and of every block after it, must not be
/// answered through the log); then both devices lose power at a seeded point.
fn eio_crash_case(seed: u64) -> Result<(), String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let data_mem = MemoryBackend::new("data0", DEVICE_BYTES);
    let log_mem = MemoryBackend::new("slog0", LOG_DEVICE_BYTES);
    let data = Arc::new(FaultBackend::new(Arc::new(data_mem.clone()), seed));
    let log = Arc::new(FaultBackend::new(Arc::new(log_mem.clone()), seed ^ 0x5eed));
    data.set_latency(Duration::from_micros(20));
    log.set_latency(Duration::from_micros(20));
    let group = Arc::new(CrashGroup {
        remaining: AtomicU64::new(u64::MAX),
        members: Mutex::new(vec![data.clone(), log.clone()]),
    });
    let dev = |f: &Arc<FaultBackend>| -> Arc<dyn Backend> {
        Arc::new(GroupDevice {
            fault: f.clone(),
            group: group.clone(),
        })
    };
    let pool = Pool::create(
        "tank",
        vec![
            single(vec![dev(&data)], false),
            single(vec![dev(&log)], true),
        ],
        test_props(),
        false,
    )
    .map_err(|e| e.to_string())?;
    // Odd seeds: logbias=throughput, so records point at blocks written in place on the data
    // device; even seeds: data copied into the log device.
    let props: Vec<(String, String)> = if seed % 2 == 1 {
        vec![
            ("volblocksize".into(), "4K".into()),
            ("logbias".into(), "throughput".into()),
        ]
    } else {
        vec![]
    };
    let vol = pool
        .create_volume("v", WRITERS * REGION_BYTES, &props)
        .map_err(|e| e.to_string())?;
    pool.sync().map_err(|e| e.to_string())?;
    data.enable_power_loss();
    log.enable_power_loss();
    log.set_write_error_probability(rng.random_range(0.1..0.5));
    group
        .remaining
        .store(rng.random_range(1..600), Ordering::SeqCst);
    let states: Vec<RefCell<Writer>> = (0..WRITERS).map(|_| RefCell::new(Writer::new())).collect();
    block_on(join_all(
        (0..WRITERS)
            .map(|w| writer_task(vol.clone(), w, seed, &states[w as usize]))
            .collect(),
    ));
    let log_errors = log.stats().write_errors_injected;
    data.crash_after_ops(0);
    log.crash_after_ops(0);
    drop(vol);
    drop(pool);
    let report = (
        data.apply_power_loss(seed.wrapping_mul(7)),
        log.apply_power_loss(seed.wrapping_mul(11)),
    );
    let devices: Vec<Arc<dyn Backend>> = vec![Arc::new(data_mem), Arc::new(log_mem)];
    let pool = Pool::import(devices, Some("tank"))
        .map_err(|e| format!("import after crash failed: {e} ({report:?})"))?;
    let vol = pool.volume("v").map_err(|e| e.to_string())?;
    for (w, st) in states.iter().enumerate() {
        let mut got = vec![0u8; REGION_BYTES as usize];
        block_on(vol.read(w as u64 * REGION_BYTES, &mut got)).map_err(|e| format!("read: {e}"))?;
        let st = st.borrow();
        if let Some(i) = st.first_wrong_byte(&got) {
            return Err(format!(
                "writer {w} byte {i}: {:#x}, durable {:#x}, and no later write put it there \
                 ({log_errors} log write errors, {report:?}):{}",
                got[i],
                st.durable[i],
                st.story(i, got[i])
            ));
        }
    }
    drop(vol);
    audit_result(&pool, &format!("after the crash ({report:?})"))?;
    pool.export().map_err(|e| e.to_string())
}

#[test]
fn log_write_errors_in_group_commits_never_answer_lost_writes() {
    if let Ok(s) = std::env::var("OXPOOL_CRASH_SEED") {
        let seed: u64 = s.parse().expect("OXPOOL_CRASH_SEED is a number");
        eio_crash_case(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        return;
    }
    let cases: u64 = std::env::var("OXPOOL_CRASH_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(|n: u64| (n / 4).max(1))
        .unwrap_or(400);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let failures = &failures;
            s.spawn(move || {
                for seed in (t..cases).step_by(2) {
                    if let Err(e) = eio_crash_case(seed) {
                        failures.lock().unwrap().push((seed, e));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    for (seed, e) in &failures {
        eprintln!(
            "seed {seed}: {e}  (replay: OXPOOL_CRASH_SEED={seed} cargo test -p oxpool-engine \
             --test log_faults log_write_errors)"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} crash cases failed",
        failures.len()
    );
}

/// Log blocks written and the last committed txg: a commit that went through the log moves
/// the first, one that fell back to the txg moves the second.
fn log_progress(pool: &Pool) -> (u64, u64) {
    (pool.log_stats().blocks_written, pool.synced_txg().0)
}

#[test]
fn enospc_in_the_middle_of_a_build_falls_back_to_the_txg_and_the_log_recovers() {
    let mem = MemoryBackend::new("mem0", DEVICE_BYTES);
    let dev = Arc::new(FaultBackend::new(Arc::new(mem.clone()), 1));
    // Latency, so the committers below overlap.
    dev.set_latency(Duration::from_micros(200));
    let pool = Pool::create(
        "tank",
        vec![single(vec![dev as Arc<dyn Backend>], false)],
        test_props(),
        false,
    )
    .unwrap();
    let vol = pool
        .create_volume("v", WRITERS * REGION_BYTES, &[])
        .unwrap();
    block_on(vol.flush()).unwrap(); // anchors the chain; no block written yet
    let mut expect = vec![0u8; (WRITERS * REGION_BYTES) as usize];
    // 8 writes of 16 KiB pending, then 8 concurrent FLUSHes: the first builder takes them all.
    // The first block is small (nothing to predict from), so the records need several blocks;
    // opening the second fails for lack of space after the first was closed, never written.
    for w in 0..WRITERS {
        let data = pattern(w, 16 << 10);
        let off = (w * REGION_BYTES) as usize;
        block_on(vol.write(off as u64, &data, false)).unwrap();
        expect[off..off + data.len()].copy_from_slice(&data);
    }
    vol.set_log_alloc_fault(Some(1));
    let (blocks_before, _) = log_progress(&pool);
    let answers = block_on(join_all(
        (0..WRITERS)
            .map(|_| {
                let vol = vol.clone();
                async move { vol.flush().await }
            })
            .collect(),
    ));
    // The txg answered for the log: every FLUSH succeeded, and no log block was written.
    for (i, r) in answers.iter().enumerate() {
        assert!(r.is_ok(), "flush {i}: {r:?}");
    }
    assert_eq!(
        log_progress(&pool).0,
        blocks_before,
        "a log block was written"
    );
    vol.set_log_alloc_fault(None);
    // The next txg sync restarts the chain; the first commit anchors it (one more sync).
    pool.sync().unwrap();
    let k0 = pattern(100, 4096);
    block_on(vol.write(0, &k0, true)).unwrap();
    expect[..4096].copy_from_slice(&k0);
    // From now on, FUA writes go through the log, not through txg syncs.
    let (blocks0, txg0) = log_progress(&pool);
    for k in 1..=5u64 {
        let data = pattern(100 + k, 4096);
        let off = (k * REGION_BYTES) as usize + 32768;
        block_on(vol.write(off as u64, &data, true)).unwrap();
        expect[off..off + 4096].copy_from_slice(&data);
    }
    let (blocks1, txg1) = log_progress(&pool);
    assert_eq!(
        (blocks1 - blocks0, txg1 - txg0),
        (5, 0),
        "the log did not recover: 5 FUA writes took (log blocks, txg syncs)"
    );
    // A crash: the last writes are only in the new chain.
    drop(vol);
    drop(pool);
    let pool = Pool::import(vec![Arc::new(mem)], Some("tank")).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut got = vec![0u8; expect.len()];
    block_on(vol.read(0, &mut got)).unwrap();
    assert!(got == expect, "an acknowledged write was lost");
    drop(vol);
    pool.export().unwrap();
}

/// Waits (polling, bounded) until `done` holds.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if done() {
            return;
        }
        sleep(Duration::from_millis(1)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The property the lost floor protects: records a failed build took out of the pending list
/// are in no block, so no commit may be answered through the log until their txg has synced
/// — even after a txg sync restarted the broken log, when the records belong to the txg after
/// it. The sequence: a txg sync runs (slowly); a write lands in the next txg; a FLUSH's build
/// fails for lack of log space; the running sync finishes and restarts the log; a second
/// FLUSH must wait for the next txg. Then the power fails.
#[test]
fn records_of_a_failed_build_are_not_durable_before_their_txg() {
    let mem = MemoryBackend::new("mem0", DEVICE_BYTES);
    let dev = Arc::new(FaultBackend::new(Arc::new(mem.clone()), 3));
    let pool = Pool::create(
        "tank",
        vec![single(vec![dev.clone() as Arc<dyn Backend>], false)],
        test_props(),
        false,
    )
    .unwrap();
    let vol = pool.create_volume("v", 4 << 20, &[]).unwrap();
    // Dirty data for a slow sync, committed (and the chain anchored) before it starts.
    block_on(vol.write(0, &pattern(1, 1 << 20), false)).unwrap();
    block_on(vol.flush()).unwrap();
    dev.enable_power_loss();
    // Each device operation takes a while: the sync of the write above spans many of them.
    dev.set_latency(Duration::from_millis(20));
    let lost = pattern(2, 4096);
    let lost_at = 2 << 20;
    let writes_before = dev.stats().writes;
    let answered = std::thread::scope(|s| {
        let syncer = s.spawn(|| pool.sync());
        let answered = block_on(async {
            // The sync has closed its txg once it writes: what follows is in the next txg.
            wait_until("the sync writes", || dev.stats().writes > writes_before).await;
            let synced_before = pool.synced_txg();
            vol.write(lost_at, &lost, false).await.unwrap();
            vol.set_log_alloc_fault(Some(0));
            let failed_commit = vol.flush();
            let later_commit = async {
                wait_until("the sync ends", || pool.synced_txg() > synced_before).await;
                vol.set_log_alloc_fault(None);
                let r = vol.flush().await;
                // Power fails the moment the FLUSH is answered.
                dev.crash_after_ops(0);
                r
            };
            let (_, r) = futures_join(failed_commit, later_commit).await;
            r.is_ok()
        });
        syncer.join().unwrap().unwrap();
        answered
    });
    drop(vol);
    drop(pool);
    dev.apply_power_loss(5);
    let pool = Pool::import(vec![Arc::new(mem)], Some("tank")).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut got = vec![0u8; 4096];
    block_on(vol.read(lost_at, &mut got)).unwrap();
    assert!(answered, "the second FLUSH failed");
    assert!(
        got == lost,
        "a FLUSH was answered, yet the write before it is gone after the crash"
    );
    drop(vol);
    audit_clean(&pool, "after the crash");
    pool.export().unwrap();
}

/// Polls two futures to completion on one task.
async fn futures_join<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let std::task::Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let std::task::Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    (ra.unwrap(), rb.unwrap())
}

/// In-place blocks of a FUA write made while a txg syncs: allocated before that sync wrote its
/// space maps, so the maps it commits hold them allocated, but their records belong to the
/// next txg, so neither its tree nor its deferred frees reach them. After a crash right after
/// that sync, import replays the records and must free those blocks: the pool's allocated
/// space comes back to what it was before.
#[test]
fn in_place_blocks_of_the_next_txg_do_not_leak_across_a_crash() {
    let mem = MemoryBackend::new("mem0", DEVICE_BYTES);
    let dev = Arc::new(FaultBackend::new(Arc::new(mem.clone()), 4));
    let pool = Pool::create(
        "tank",
        vec![single(vec![dev.clone() as Arc<dyn Backend>], false)],
        test_props(),
        false,
    )
    .unwrap();
    let vol = pool
        .create_volume(
            "v",
            16 << 20,
            &[
                ("volblocksize".into(), "64K".into()),
                ("logbias".into(), "throughput".into()),
            ],
        )
        .unwrap();
    let region_bytes = 4usize << 20;
    block_on(vol.write(0, &pattern(1, region_bytes), false)).unwrap();
    block_on(vol.flush()).unwrap(); // anchors the chain
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let base = pool.status().allocated_bytes;
    // Dirty data for a slow sync.
    block_on(vol.write(8 << 20, &pattern(2, 1 << 20), false)).unwrap();
    dev.enable_power_loss();
    dev.set_latency(Duration::from_millis(20));
    let rewrite = pattern(3, region_bytes);
    let writes_before = dev.stats().writes;
    std::thread::scope(|s| {
        let syncer = s.spawn(|| pool.sync());
        block_on(async {
            wait_until("the sync writes", || dev.stats().writes > writes_before).await;
            // Whole blocks: written in place at once, logged by pointer.
            vol.write(0, &rewrite, true).await.unwrap();
        });
        syncer.join().unwrap().unwrap();
    });
    let in_place = pool.log_stats().indirect_bytes;
    assert!(in_place >= region_bytes as u64, "not written in place");
    dev.crash_after_ops(0);
    drop(vol);
    drop(pool);
    dev.apply_power_loss(6);
    let pool = Pool::import(vec![Arc::new(mem)], Some("tank")).unwrap();
    let vol = pool.volume("v").unwrap();
    let mut got = vec![0u8; region_bytes];
    block_on(vol.read(0, &mut got)).unwrap();
    assert!(got == rewrite, "the FUA write was lost");
    // Past the deferral of every free.
    for _ in 0..5 {
        pool.sync().unwrap();
    }
    let after = pool.status().allocated_bytes;
    // The slow sync's 1 MiB is new; a leak would add the 4 MiB written in place.
    assert!(
        after <= base + (1 << 20) + (256 << 10),
        "allocated {after} bytes after the crash, {base} before: in-place blocks leaked"
    );
    drop(vol);
    audit_clean(&pool, "after the crash");
    pool.export().unwrap();
}

/// A separate log device whose writes all fail: the fault rule does not fault it (its vdev
/// has no other device), so each commit tries it, fails and waits for a txg. `oxpool offline`
/// takes it out all the same, once its log blocks are moved off it; then commits go through
/// the intent log on the data device again. A crash then imports without the device (the
/// vdev is recorded emptied) with every acknowledged write; back and `online`, it takes log
/// blocks again.
#[test]
fn a_failing_log_device_is_taken_offline_and_the_log_moves_to_the_data_device() {
    let data = MemoryBackend::new("data0", DEVICE_BYTES);
    let slog_mem = MemoryBackend::new("slog0", LOG_DEVICE_BYTES);
    let slog = Arc::new(FaultBackend::new(Arc::new(slog_mem.clone()), 7));
    let pool = Pool::create(
        "tank",
        vec![
            single(vec![Arc::new(data.clone())], false),
            single(vec![slog.clone() as Arc<dyn Backend>], true),
        ],
        test_props(),
        false,
    )
    .unwrap();
    let vol = pool.create_volume("v", 64 * 4096, &[]).unwrap();
    block_on(vol.flush()).unwrap();
    let slog_writes = |pool: &Pool| {
        pool.counters()
            .device_stats()
            .iter()
            .find(|d| d.name == "slog0")
            .map_or(0, |d| d.io.write.ops)
    };
    let mut expect = vec![0u8; 64 * 4096];
    let write = |expect: &mut Vec<u8>, vol: &Volume, n: u64| {
        let slot = (n % 64) as usize;
        let data = pattern(5000 + n, 4096);
        block_on(vol.write(slot as u64 * 4096, &data, true)).unwrap();
        expect[slot * 4096..(slot + 1) * 4096].copy_from_slice(&data);
    };
    for n in 0..8 {
        write(&mut expect, &vol, n);
    }
    assert!(slog_writes(&pool) > 0, "commits used the log device");
    slog.set_write_error_probability(1.0);
    for n in 8..24 {
        write(&mut expect, &vol, n);
    }
    let status = pool.status();
    assert!(status.logs[0].write_errors > 0, "{status:?}");
    pool.offline("slog0", false).unwrap();
    pool.sync().unwrap(); // as `oxpool offline` syncs before it returns
    let (blocks0, txg0) = log_progress(&pool);
    for n in 24..40 {
        write(&mut expect, &vol, n);
    }
    let (blocks1, txg1) = log_progress(&pool);
    // The first commit anchors a new chain on the data device (one txg).
    assert!(
        blocks1 - blocks0 >= 14 && txg1 - txg0 <= 2,
        "16 FUA writes after the offline took {} log blocks and {} txg syncs",
        blocks1 - blocks0,
        txg1 - txg0
    );
    drop(vol);
    drop(pool); // a crash: the last commits are in a chain on the data device
    let pool = Pool::import(vec![Arc::new(data.clone())], Some("tank")).unwrap();
    let vol = pool.volume("v").unwrap();
    let check = |vol: &Volume, expect: &[u8], what: &str| {
        let mut got = vec![0u8; expect.len()];
        block_on(vol.read(0, &mut got)).unwrap();
        assert!(got == expect, "{what}: an acknowledged write was lost");
    };
    check(&vol, &expect, "imported without the failing log device");
    audit_clean(&pool, "imported without the failing log device");
    drop(vol);
    pool.export().unwrap();
    // Back, repaired, and online: log blocks go to it again.
    slog.set_write_error_probability(0.0);
    let pool = Pool::import(
        vec![Arc::new(data.clone()), slog.clone() as Arc<dyn Backend>],
        Some("tank"),
    )
    .unwrap();
    let vol = pool.volume("v").unwrap();
    pool.online("slog0").unwrap();
    let before = slog_writes(&pool);
    for n in 40..48 {
        write(&mut expect, &vol, n);
    }
    assert!(
        slog_writes(&pool) > before,
        "the log device took no block once online"
    );
    assert_eq!(pool.status().state, "ONLINE");
    drop(vol);
    drop(pool); // a crash: the last records are on the log device
    let pool = Pool::import(
        vec![Arc::new(data.clone()), Arc::new(slog_mem.clone())],
        Some("tank"),
    )
    .unwrap();
    let vol = pool.volume("v").unwrap();
    check(&vol, &expect, "replayed from the log device back online");
    audit_clean(&pool, "after the log device came back");
    drop(vol);
    pool.export().unwrap();
}

/// `oxpool replace` of a separate log device whose writes all fail, while a writer commits
/// FUA writes and the data device is slow (so the txg that records the new device takes a
/// while). The new device takes every log write from the moment it is in the vdev, the old
/// one fails them; but until a durable txg records the new device, an import after a crash
/// reads the vdev as the old device alone. So no commit may be answered from a log block
/// that only the new device holds until then. The power fails while the replace's txg is
/// being written; every acknowledged write must read back after the import (with `-m` if
/// the import asks for it: the old device failed writes), and the audit is clean.
#[test]
fn replacing_a_failing_log_device_answers_no_commit_before_the_new_one_is_recorded() {
    const SLOTS: u64 = 64;
    let mems = [
        MemoryBackend::new("data0", DEVICE_BYTES),
        MemoryBackend::new("slog0", LOG_DEVICE_BYTES),
        MemoryBackend::new("slog1", LOG_DEVICE_BYTES),
    ];
    let (group, devs) = common::crash_devices(&mems, 11);
    let fault = |i: usize| group.members.lock().unwrap()[i].clone();
    let pool = Pool::create(
        "tank",
        vec![
            single(vec![devs[0].clone()], false),
            single(vec![devs[1].clone()], true),
        ],
        test_props(),
        false,
    )
    .unwrap();
    let vol = pool.create_volume("v", SLOTS * 4096, &[]).unwrap();
    for n in 0..SLOTS {
        block_on(vol.write(n * 4096, &pattern(1000 + n, 4096), true)).unwrap();
    }
    pool.sync().unwrap();
    fault(1).set_write_error_probability(1.0);
    fault(0).set_latency(Duration::from_millis(20));
    // Per slot: the last write acknowledged, and the last one issued.
    let acked = Mutex::new((0..SLOTS).map(|k| (k, k)).collect::<Vec<_>>());
    let answered = AtomicU64::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (replaced, answered_in_window) = std::thread::scope(|s| {
        s.spawn(|| {
            for n in SLOTS..SLOTS + 100_000 {
                let k = (n % SLOTS) as usize;
                acked.lock().unwrap()[k].1 = n;
                let w = block_on(vol.write(n % SLOTS * 4096, &pattern(1000 + n, 4096), true));
                if w.is_err() || stop.load(Ordering::Relaxed) {
                    return;
                }
                acked.lock().unwrap()[k].0 = n;
                answered.fetch_add(1, Ordering::Relaxed);
            }
        });
        let replace = s.spawn(|| pool.replace("slog0", devs[2].clone(), false));
        // Until the new device is in the vdev (in memory), then a while for commits to be
        // answered through it: the replace's txg takes longer on the slow data device.
        for _ in 0..10_000 {
            if pool
                .status()
                .logs
                .iter()
                .any(|l| format!("{l:?}").contains("slog1"))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let at_swap = answered.load(Ordering::Relaxed);
        for _ in 0..400 {
            if answered.load(Ordering::Relaxed) >= at_swap + 16 || replace.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let finished_before_cut = replace.is_finished();
        group.remaining.store(1, Ordering::SeqCst);
        group.tick(); // the power fails
        stop.store(true, Ordering::Relaxed);
        let replaced = replace.join().unwrap();
        assert!(
            !finished_before_cut || replaced.is_err(),
            "the replace's txg was durable before the power failed: the case tests nothing"
        );
        (replaced, answered.load(Ordering::Relaxed) - at_swap)
    });
    drop(vol);
    drop(pool);
    let mut report = String::new();
    for (i, m) in group.members.lock().unwrap().iter().enumerate() {
        let r = m.apply_power_loss(100 + i as u64);
        report += &format!("dev{i}: dropped {} kept {}; ", r.dropped, r.kept);
    }
    let devices = || -> Vec<Arc<dyn Backend>> {
        mems.iter()
            .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
            .collect()
    };
    let pool = match Pool::import(devices(), Some("tank")) {
        Ok(p) => p,
        Err(e) if e.to_string().contains("import -m") => {
            let m = oxpool_engine::ImportOptions { missing_log: true };
            Pool::import_with(devices(), Some("tank"), m).unwrap()
        }
        Err(e) => panic!("import after the power loss: {e} ({report})"),
    };
    let vol = pool.volume("v").unwrap();
    for (k, &(ok, issued)) in acked.lock().unwrap().iter().enumerate() {
        let mut buf = vec![0u8; 4096];
        block_on(vol.read(k as u64 * 4096, &mut buf)).unwrap();
        assert!(
            (ok..=issued).any(|n| n % SLOTS == k as u64 && buf == pattern(1000 + n, 4096)),
            "slot {k}: acknowledged write {ok} lost (replace: {replaced:?}; {answered_in_window} \
             commits answered after the new device joined; {report})"
        );
    }
    drop(vol);
    audit_clean(
        &pool,
        "after a power loss during the replace of a failing log device",
    );
    pool.export().unwrap();
}
