//! Unit tests of the intent log that need a whole pool (the pool layer is above the log's).

use crate::props::PoolProps;
use crate::{Pool, TopSpec};
use oxpool_format::Txg;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

/// A build that finds the chain restarted (no place, or one whose anchoring txg has not
/// synced) writes no block: a block there would be answered as durable and never found
/// by import. Its records wait for the txg instead. (A serial commit could reach its
/// build after a restart: its checks and its build take the log's lock separately.)
#[test]
fn a_build_writes_no_block_at_an_unanchored_place() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let dev: Arc<dyn Backend> = Arc::new(MemoryBackend::new("d0", 64 << 20));
    let pool = Pool::create("tank", vec![TopSpec::single(dev)], props, false).unwrap();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    block_on(vol.write(0, &[1u8; 4096], true)).unwrap();
    let zil = &vol.vol.zil;
    let blocks_before = vol
        .pool
        .log_counters
        .blocks_written
        .load(std::sync::atomic::Ordering::Relaxed);
    for unanchored in ["restarted", "anchor not synced"] {
        {
            let mut s = zil.state.lock().unwrap();
            match unanchored {
                "restarted" => {
                    // As a restart does: the place goes to the next sync's frees.
                    let (addr, _) = s.next_addr.take().unwrap();
                    s.to_free.push(addr);
                }
                _ => s.anchor_txg = Txg(vol.pool.txg.synced().0 + 1),
            }
        }
        block_on(async {
            // Not through `write`: its commit would see the restart and anchor first.
            let target = zil.append(
                Txg(vol.pool.txg.synced().0 + 1),
                crate::zil::ItxKind::Free {
                    offset_bytes: 0,
                    length_bytes: 4096,
                },
            );
            zil.state.lock().unwrap().building = true;
            let (closed, r) = vol.zil_build_upto(Some(target)).await;
            zil.state.lock().unwrap().building = false;
            assert!(closed.is_empty(), "{unanchored}: a block was closed");
            assert!(r.is_err(), "{unanchored}: the build succeeded");
            let s = zil.state.lock().unwrap();
            assert!(s.needs_txg(target), "{unanchored}: no fallback to the txg");
            assert!(s.durable_itx <= target);
        });
        assert_eq!(
            vol.pool
                .log_counters
                .blocks_written
                .load(std::sync::atomic::Ordering::Relaxed),
            blocks_before
        );
        // The txg makes the records durable and restarts the log; it works again.
        pool.sync().unwrap();
        block_on(vol.write(4096, &[2u8; 4096], true)).unwrap();
        pool.sync().unwrap();
    }
    let mut got = vec![0u8; 8192];
    block_on(vol.read(0, &mut got)).unwrap();
    assert!(got[..4096].iter().all(|&b| b == 1) && got[4096..].iter().all(|&b| b == 2));
    drop(vol);
    let report = pool.audit().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    pool.export().unwrap();
}

/// A pool on one memory device whose txgs sync only when asked (so log blocks stay in the
/// chain), with an 8 MiB volume.
fn pool_without_txg_timeout() -> (Pool, crate::Volume) {
    let dev: Arc<dyn Backend> = Arc::new(MemoryBackend::new("d0", 64 << 20));
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let pool = Pool::create("tank", vec![TopSpec::single(dev)], props, false).unwrap();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    (pool, vol)
}

/// Syncs (which frees the log blocks its predecessor made unneeded), audits (every block
/// verifies, every space figure recomputes, no leak) and exports.
fn audit_clean_and_export(pool: Pool) {
    pool.sync().unwrap();
    let report = pool.audit().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    pool.export().unwrap();
}

/// Counters of the log, for the early-write tests.
fn log_stats(vol: &crate::Volume) -> crate::iostats::LogStats {
    vol.pool.log_counters.stats()
}

/// Runs `exec` until the volume's early writes have all completed (bounded): a spawned one
/// first waits for a turn of the executor, then claims the log.
fn run_until_early_done(exec: &oxpool_io::rt::LocalExecutor, vol: &crate::Volume) {
    exec.run_until(async {
        for _ in 0..4 {
            oxpool_io::rt::yield_now().await;
        }
        for _ in 0..10_000 {
            if vol.vol.zil.state.lock().unwrap().early_in_flight == 0 {
                return;
            }
            oxpool_io::rt::sleep(std::time::Duration::from_micros(100)).await;
        }
        panic!("an early log write did not complete");
    });
}

/// A write that follows a commit, on an idle log, has its log block written at once without
/// a flush (not durable yet); the FLUSH that follows writes no block, only flushes, and then
/// the write is durable. Its records replay after a crash (`power_loss.rs` covers crashes
/// between the two).
#[test]
fn an_early_write_leaves_only_the_flush_to_the_commit() {
    let (pool, vol) = pool_without_txg_timeout();
    pool.set_prop("logearly", "on").unwrap();
    let exec = oxpool_io::rt::LocalExecutor::new();
    // A commit first: early writes are for volumes whose writes are followed by commits.
    exec.run_until(vol.write(0, &[1u8; 4096], false)).unwrap();
    exec.run_until(vol.flush()).unwrap();
    run_until_early_done(&exec, &vol);
    let before = log_stats(&vol);
    exec.run_until(vol.write(8192, &[2u8; 4096], false))
        .unwrap();
    let target = vol.vol.zil.last_itx();
    run_until_early_done(&exec, &vol);
    let early = log_stats(&vol);
    assert_eq!(early.early_blocks, before.early_blocks + 1, "{early:?}");
    assert_eq!(early.blocks_written, before.blocks_written + 1);
    assert_eq!(early.flushes, before.flushes, "an early write flushed");
    {
        let mut s = vol.vol.zil.state.lock().unwrap();
        assert!(s.durable_itx <= target, "durable before any flush");
        assert_eq!(s.unflushed_blocks().len(), 1);
    }
    // A txg sync makes its records durable through the pool, but the block stays in the
    // chain until a flush covers it: the persisted head may name it, and replay reaches the
    // blocks after it only through it.
    pool.sync().unwrap();
    assert_eq!(
        vol.vol.zil.state.lock().unwrap().unflushed_blocks().len(),
        1,
        "an unflushed block left the chain"
    );
    exec.run_until(vol.flush()).unwrap();
    let flushed = log_stats(&vol);
    assert_eq!(
        flushed.blocks_written, early.blocks_written,
        "the commit wrote a block"
    );
    assert_eq!(flushed.flushes, early.flushes + 1);
    {
        let mut s = vol.vol.zil.state.lock().unwrap();
        assert!(s.durable_itx > target, "not durable after the flush");
        assert!(s.unflushed_blocks().is_empty());
        assert!(s.chain.iter().all(|c| c.done));
    }
    drop(exec);
    drop(vol);
    audit_clean_and_export(pool);
}

/// No early write for writes no commit follows (a bulk copy), for a change too large, after
/// a commit that overlapped another, with `logearly=off`, or outside an executor (`block_on`):
/// their blocks are written at commits.
#[test]
fn early_writes_only_where_a_commit_follows_small_writes() {
    let (pool, vol) = pool_without_txg_timeout();
    // Off by default: every case below would pass trivially without this.
    assert_eq!(pool.get_prop("logearly").unwrap(), "off");
    pool.set_prop("logearly", "on").unwrap();
    let exec = oxpool_io::rt::LocalExecutor::new();
    let early = |vol: &crate::Volume| log_stats(vol).early_blocks;
    // Never committed: no early writes.
    for i in 0..8u64 {
        exec.run_until(vol.write(i * 4096, &[3u8; 4096], false))
            .unwrap();
        run_until_early_done(&exec, &vol);
    }
    assert_eq!(early(&vol), 0, "early writes without any commit");
    exec.run_until(vol.flush()).unwrap();
    // Too large for an early write (it would be written in place, or be a burst).
    exec.run_until(vol.write(0, &[4u8; 64 << 10], false))
        .unwrap();
    run_until_early_done(&exec, &vol);
    assert_eq!(early(&vol), 0, "an early write of 64 KiB");
    exec.run_until(vol.flush()).unwrap();
    // Under block_on there is no executor to run one.
    block_on(vol.write(0, &[5u8; 4096], false)).unwrap();
    assert_eq!(early(&vol), 0, "an early write under block_on");
    exec.run_until(vol.flush()).unwrap();
    // A commit that began while another was running (as another's is, simulated here): its
    // clients commit concurrently, where group commit already shares blocks and flushes.
    vol.vol.zil.state.lock().unwrap().committers += 1;
    exec.run_until(vol.flush()).unwrap();
    vol.vol.zil.state.lock().unwrap().committers -= 1;
    exec.run_until(vol.write(0, &[8u8; 4096], false)).unwrap();
    run_until_early_done(&exec, &vol);
    assert_eq!(early(&vol), 0, "an early write after overlapping commits");
    exec.run_until(vol.flush()).unwrap();
    // logearly=off.
    pool.set_prop("logearly", "off").unwrap();
    exec.run_until(vol.write(0, &[6u8; 4096], false)).unwrap();
    run_until_early_done(&exec, &vol);
    assert_eq!(early(&vol), 0, "an early write with logearly=off");
    exec.run_until(vol.flush()).unwrap();
    // And on again: the same write is written early.
    pool.set_prop("logearly", "on").unwrap();
    exec.run_until(vol.write(0, &[7u8; 4096], false)).unwrap();
    run_until_early_done(&exec, &vol);
    assert_eq!(early(&vol), 1, "no early write with logearly=on");
    exec.run_until(vol.flush()).unwrap();
    let mut got = vec![0u8; 4096];
    exec.run_until(vol.read(0, &mut got)).unwrap();
    assert!(got.iter().all(|&b| b == 7));
    drop(exec);
    drop(vol);
    audit_clean_and_export(pool);
}

/// A pool of one mirror of `devices` with `props`, whose txgs sync only when asked, and an
/// 8 MiB volume.
fn mirror_pool_without_txg_timeout(
    devices: Vec<Arc<dyn Backend>>,
    mut props: PoolProps,
) -> (Pool, crate::Volume) {
    props.set("txg_timeout", "3600").unwrap();
    let top = TopSpec {
        kind: oxpool_format::TopVdevKind::Mirror,
        devices,
        log: false,
    };
    let pool = Pool::create("tank", vec![top], props, false).unwrap();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    (pool, vol)
}

/// A device of the log's vdev that leaves service between an early write and the flush that
/// covers it voids that flush: the block may be durable on no device in service (on a mirror
/// whose other child failed that very write, which still counts as written with one copy).
/// The commit then waits for the txg sync, which writes to the devices in service. The same
/// round without the device leaving is the control: its commit is the log's flush alone.
#[test]
fn a_device_leaving_service_before_the_flush_sends_the_commit_to_the_txg() {
    let devices: Vec<Arc<dyn Backend>> = (0..2)
        .map(|i| Arc::new(MemoryBackend::new(&format!("m{i}"), 64 << 20)) as Arc<dyn Backend>)
        .collect();
    let mut props = PoolProps::default();
    props.set("logearly", "on").unwrap();
    let (pool, vol) = mirror_pool_without_txg_timeout(devices, props);
    let exec = oxpool_io::rt::LocalExecutor::new();
    exec.run_until(vol.write(0, &[1u8; 4096], false)).unwrap();
    exec.run_until(vol.flush()).unwrap();
    run_until_early_done(&exec, &vol);
    // One round written early and committed by the log, one with m0 taken offline between,
    // one with m1 detached between (m0 back first: a mirror keeps one child in service).
    for (round, leave) in [(2u8, None), (3u8, Some("offline")), (4u8, Some("detach"))] {
        if leave == Some("detach") {
            pool.online("m0").unwrap();
            pool.scan_wait(std::time::Duration::from_secs(60));
            assert!(!pool.resilvering(), "the resilver of m0 did not end");
            // Its early write needs a commit that ran alone, after the resilver's syncs.
            exec.run_until(vol.write(0, &[round; 4096], false)).unwrap();
            exec.run_until(vol.flush()).unwrap();
            run_until_early_done(&exec, &vol);
        }
        let before = log_stats(&vol);
        exec.run_until(vol.write(8192, &[round; 4096], false))
            .unwrap();
        run_until_early_done(&exec, &vol);
        assert_eq!(
            log_stats(&vol).early_blocks,
            before.early_blocks + 1,
            "round {round}: not written early"
        );
        match leave {
            Some("offline") => pool.offline("m0", true).unwrap(),
            Some(_) => pool.detach("m1").unwrap(),
            None => {}
        }
        let synced = pool.synced_txg();
        exec.run_until(vol.flush()).unwrap();
        let after = log_stats(&vol);
        if leave.is_some() {
            assert!(
                pool.synced_txg() > synced,
                "round {round}: the commit trusted a flush that {leave:?} may have voided"
            );
        } else {
            assert_eq!(
                pool.synced_txg(),
                synced,
                "the control round waited for a txg"
            );
            assert_eq!(
                after.flushes,
                before.flushes + 2,
                "one flush per mirror child"
            );
        }
        let mut got = [0u8; 4096];
        exec.run_until(vol.read(8192, &mut got)).unwrap();
        assert!(
            got.iter().all(|&b| b == round),
            "round {round} reads back wrong"
        );
    }
    drop(exec);
    drop(vol);
    audit_clean_and_export(pool);
}

/// The same for the writes of a commit itself, with early writes off: a log block written
/// and then flushed, and (for a 64 KiB write) the blocks written in place that its records
/// point at. m0's writes are delayed 2 s (`oxpool inject`), and another thread takes m0 out
/// of service half a second in, while they wait: the commit's flush then reaches m1 alone,
/// and must not count. (Ordered by the delay: the offline would have to come before the
/// commit started writing, over 0.5 s late, for the test to miss what it checks.)
#[test]
fn a_device_leaving_service_during_a_commits_writes_sends_it_to_the_txg() {
    use crate::vdev::{InjectKind, InjectOps, InjectRule};
    for (len, what) in [
        (4096usize, "a log block"),
        (65536, "blocks written in place"),
    ] {
        // Devices without FUA (most virtual disks, files): a log block is written, then
        // flushed. (A FUA write is durable on each copy as it completes: no gap to check.)
        let devices: Vec<Arc<dyn Backend>> = (0..2)
            .map(|i| {
                let mem = Arc::new(MemoryBackend::new(&format!("m{i}"), 64 << 20));
                let dev = oxpool_io::FaultBackend::new(mem, i);
                dev.set_durable_write_mode(oxpool_io::DurableWriteMode::WriteThenFlush);
                Arc::new(dev) as Arc<dyn Backend>
            })
            .collect();
        let mut props = PoolProps::default();
        props.set("logearly", "off").unwrap();
        let (pool, vol) = mirror_pool_without_txg_timeout(devices, props);
        // A first commit anchors the log's chain (by a txg sync): the next ones use the log.
        block_on(vol.write(1 << 20, &[1u8; 4096], true)).unwrap();
        block_on(vol.write(1 << 20, &[2u8; 4096], true)).unwrap();
        let in_place = len > 32 << 10;
        if in_place {
            // The control: with every device in service, the sync adopts the blocks the
            // commit wrote in place (it does not write them again).
            let adopted = log_stats(&vol).adopted_blocks;
            block_on(vol.write(2 << 20, &vec![3u8; len], true)).unwrap();
            pool.sync().unwrap();
            assert_eq!(log_stats(&vol).adopted_blocks, adopted + (len as u64 >> 14));
        }
        let m0 = pool
            .spa
            .zio
            .vdevs
            .leaves()
            .find(|l| l.name() == "m0")
            .unwrap();
        pool.inject_add(InjectRule {
            id: 1,
            device: m0.guid,
            kind: InjectKind::Delay { delay_ms: 2000 },
            ops: InjectOps::Write,
            frequency_ppm: crate::vdev::inject::FREQUENCY_PPM_ALL,
        })
        .unwrap();
        let synced = pool.synced_txg();
        let before = log_stats(&vol);
        let offline = std::thread::scope(|scope| {
            let offline = scope.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(500));
                pool.offline("m0", true)
            });
            block_on(vol.write(0, &vec![7u8; len], true)).unwrap();
            offline.join().unwrap()
        });
        offline.unwrap();
        assert!(
            log_stats(&vol).blocks_written > before.blocks_written,
            "{what}: the commit wrote no log block"
        );
        assert!(
            pool.synced_txg() > synced,
            "{what}: the commit trusted a flush that m0's leaving service may have voided"
        );
        if in_place {
            // Their copies may be durable nowhere: the sync wrote the data again.
            assert_eq!(
                log_stats(&vol).adopted_blocks,
                before.adopted_blocks,
                "{what}: the sync adopted blocks whose flush did not count"
            );
        }
        let mut got = vec![0u8; len];
        block_on(vol.read(0, &mut got)).unwrap();
        assert!(got.iter().all(|&b| b == 7), "{what}: reads back wrong");
        pool.inject_clear(None);
        drop(vol);
        audit_clean_and_export(pool);
    }
}

/// The txg engine raises the vdev tree's figure of the last txg closed as it closes one
/// (`spa/txg.rs` tests the raise): wired at create and at import, so that the intent log's
/// blocks written in place in the open txg are inside any missed range measured meanwhile.
#[test]
fn the_txg_engine_tells_the_vdev_tree_when_a_txg_closes() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let mem = MemoryBackend::new("d0", 64 << 20);
    let dev: Arc<dyn Backend> = Arc::new(mem.clone());
    let pool = Pool::create("tank", vec![TopSpec::single(dev.clone())], props, false).unwrap();
    let wired = |pool: &Pool| {
        let spa = &pool.spa;
        spa.txg
            .closed
            .get()
            .is_some_and(|c| Arc::ptr_eq(c, &spa.zio.vdevs.sync_started_handle()))
    };
    assert!(wired(&pool), "not wired at create");
    pool.export().unwrap();
    let pool = Pool::import(vec![dev], Some("tank")).unwrap();
    assert!(wired(&pool), "not wired at import");
}
