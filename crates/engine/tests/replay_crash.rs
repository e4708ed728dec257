//! A crash in the middle of import's replay of the intent log: the syncs that commit while
//! the replay runs (its dirty data passes the sync threshold) must keep the old chain as the
//! log's head, its places held and its records' txg floor, so that the next import replays
//! every record again. Every acknowledged write reads back after the second import, and the
//! pool audits clean (no place freed twice, none leaked).
//!
//! The crash point walks through every device operation of the first import's replay, one
//! case each; the import after it crashes too, at a point spread over its own replay, and a
//! third import checks. Both crashes lose power: writes not yet flushed are dropped, kept or
//! torn.

mod common;

use common::{audit_result, pattern, single_device_pool, test_props};
use oxpool_engine::Pool;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use std::sync::Arc;

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 8 << 20;
/// Written with FUA after the chain is anchored: in the log, in no synced txg.
const LOGGED_BYTES: usize = 3 << 20;
const WRITE_BYTES: usize = 32 << 10;

/// A pool that crashed with `LOGGED_BYTES` of acknowledged writes in its intent log only, and
/// a persisted `dirty_max` of 1 MiB, so that replaying them passes the sync threshold (a
/// fifth of it) several times. Returns the device, the volume's expected content and the
/// txg the crash left committed.
///
/// `in_place`: with `logbias=throughput`, the whole blocks of each write are written in place
/// and logged as pointers (read back by the walk at import), and some writes are followed by
/// a write-zeroes and a trim of a whole block; otherwise every record is a copy.
fn crashed_pool(in_place: bool) -> (MemoryBackend, Vec<u8>, u64) {
    let mem = MemoryBackend::new("d0", DEVICE_BYTES);
    let fault = Arc::new(FaultBackend::new(Arc::new(mem.clone()), 1));
    let pool = single_device_pool(fault.clone(), test_props());
    let props: Vec<(String, String)> = if in_place {
        vec![
            ("volblocksize".into(), "16K".into()),
            ("logbias".into(), "throughput".into()),
        ]
    } else {
        vec![]
    };
    let vol = pool.create_volume("v", VOLUME_BYTES, &props).unwrap();
    let mut expected = vec![0u8; VOLUME_BYTES as usize];
    // The first commit anchors the chain with a sync, which persists dirty_max=1M.
    pool.set_prop("dirty_max", "1M").unwrap();
    block_on(vol.write(0, &[7u8; 4096], true)).unwrap();
    expected[..4096].fill(7);
    // Back to the test's limit in memory only (no sync follows), so the writes below stay in
    // the open txg and the log.
    pool.set_prop("dirty_max", "256M").unwrap();
    let synced = pool.synced_txg();
    let data = pattern(11, LOGGED_BYTES);
    for (i, chunk) in data.chunks(WRITE_BYTES).enumerate() {
        let at = 4096 + (i * WRITE_BYTES) as u64;
        block_on(vol.write(at, chunk, true)).unwrap();
        expected[at as usize..at as usize + chunk.len()].copy_from_slice(chunk);
        if in_place && i % 5 == 2 {
            block_on(vol.write_zeroes(at + 4096, 8192, true)).unwrap();
            expected[at as usize + 4096..at as usize + 4096 + 8192].fill(0);
        }
        if in_place && i % 7 == 3 {
            let block = at.next_multiple_of(16 << 10);
            block_on(vol.trim(block, 16 << 10, true)).unwrap();
            expected[block as usize..block as usize + (16 << 10)].fill(0);
        }
    }
    assert_eq!(
        pool.synced_txg(),
        synced,
        "a sync committed the writes: the log would hold nothing to replay"
    );
    fault.crash_after_ops(0);
    drop(vol);
    drop(pool);
    (mem, expected, synced.0)
}

#[test]
fn a_crash_during_replay_loses_no_acknowledged_write() {
    crash_at_every_write_of_the_replay(false);
}

#[test]
fn a_crash_during_replay_of_in_place_records_loses_no_acknowledged_write() {
    crash_at_every_write_of_the_replay(true);
}

fn crash_at_every_write_of_the_replay(in_place: bool) {
    let (mem, expected, crash_txg) = crashed_pool(in_place);
    // Without a crash, the replay commits several syncs before its own.
    let replay_syncs = {
        let pool = Pool::import(vec![Arc::new(mem.snapshot()) as Arc<dyn Backend>], None)
            .expect("import without a crash");
        pool.synced_txg().0 - crash_txg
    };
    let mut crashed_mid_replay = 0;
    // Bounded: each case lets one more device write through; the import that completes ends
    // the loop.
    for ops in 0..100_000u64 {
        let dev = mem.snapshot();
        // Writes not yet flushed at the crash are dropped, kept or torn (seeded).
        let fault = Arc::new(FaultBackend::new(Arc::new(dev.clone()), ops));
        fault.enable_power_loss();
        fault.crash_after_ops(ops);
        let first = Pool::import(vec![fault.clone() as Arc<dyn Backend>], None);
        let completed = first.is_ok() && !fault.is_dead();
        drop(first);
        fault.apply_power_loss(ops);
        // A second crash, in the import that replays again (at a point spread over the
        // replay by the case number): the chain, its places and its txg floor survive it.
        let again = (ops * 7919) % 600;
        let fault = Arc::new(FaultBackend::new(Arc::new(dev.clone()), again));
        fault.enable_power_loss();
        fault.crash_after_ops(again);
        drop(Pool::import(vec![fault.clone() as Arc<dyn Backend>], None));
        fault.apply_power_loss(again ^ 0x5eed);
        let pool = Pool::import(vec![Arc::new(dev) as Arc<dyn Backend>], None)
            .unwrap_or_else(|e| panic!("crash after {ops} and {again} device ops: import: {e}"));
        let vol = pool.volume("v").unwrap();
        let mut got = vec![0u8; VOLUME_BYTES as usize];
        block_on(vol.read(0, &mut got)).unwrap();
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            panic!(
                "crashes after {ops} and {again} device ops of the replays: byte {i} is {:#x}, \
                 acknowledged {:#x}",
                got[i], expected[i]
            );
        }
        drop(vol);
        audit_result(
            &pool,
            &format!("crashes after {ops} and {again} device ops of the replays"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        pool.export().unwrap();
        if completed {
            break;
        }
        crashed_mid_replay += 1;
    }
    eprintln!(
        "{crashed_mid_replay} crash points in the replay, which commits {replay_syncs} txgs \
         (the first import's own sync included)"
    );
    assert!(
        replay_syncs >= 3,
        "the replay committed {replay_syncs} txgs: no sync in its middle, nothing tested"
    );
    assert!(
        crashed_mid_replay > 0,
        "no crash point was inside the replay"
    );
}
