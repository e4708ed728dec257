//! The pool's command history (`oxpool history`): records are kept in order across export
//! and import, stamped with the txg that wrote them; the history is bounded (the first chunk,
//! with the pool's creation, and the latest ones), its dropped chunks' places freed; after a
//! power loss it holds every record a finished sync wrote, and at most the one sync in
//! flight's besides; and the audit is clean throughout.
//!
//! Odd seeds of the power-loss case fill the history near its bound first, so the crash can
//! come while chunks are dropped. `OXPOOL_CRASH_CASES=N` runs N seeds (default 2000);
//! `OXPOOL_CRASH_SEED=S` replays one.

mod common;

use common::{
    audit_clean, audit_result, crash_devices, mem_pool, power_off_and_import, reimport,
    run_crash_cases,
};
use oxpool_engine::{HistoryRecord, Pool, TopSpec, HISTORY_CHUNKS_MAX};
use oxpool_format::{TopVdevKind, TABLE_CHUNK_ENTRIES_MAX};
use oxpool_io::MemoryBackend;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;

/// The command lines of a listing, in order.
fn lines(records: &[HistoryRecord]) -> Vec<String> {
    records.iter().map(|r| r.line.clone()).collect()
}

fn record(pool: &Pool, line: &str) {
    pool.record_history(line, 1000, "host-a", 1_764_000_000);
}

#[test]
fn records_are_kept_in_order_across_export_and_import() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    record(&pool, "oxpool create tank mem0");
    pool.sync().unwrap();
    record(&pool, "oxpool create -V 8M tank/vol0");
    record(&pool, "oxpool snapshot tank/vol0@mon");
    // Listed before the sync that writes them, with no txg yet.
    let waiting = pool.history();
    assert_eq!(waiting.records.len(), 3);
    assert_eq!(waiting.records[2].txg.0, 0);
    pool.sync().unwrap();
    let listed = pool.history();
    assert!(listed.unreadable.is_empty() && listed.dropped == 0);
    assert_eq!(
        lines(&listed.records),
        [
            "oxpool create tank mem0",
            "oxpool create -V 8M tank/vol0",
            "oxpool snapshot tank/vol0@mon"
        ]
    );
    let txgs: Vec<u64> = listed.records.iter().map(|r| r.txg.0).collect();
    assert!(
        txgs[0] > 0 && txgs[0] < txgs[1] && txgs[1] == txgs[2],
        "{txgs:?}"
    );
    assert!(listed
        .records
        .iter()
        .all(|r| r.uid == 1000 && r.host == "host-a" && r.time_s == 1_764_000_000));
    audit_clean(&pool, "after three records");
    pool.export().unwrap();

    let pool = reimport(&mems);
    assert_eq!(pool.history().records, listed.records);
    let blocks = audit_result(&pool, "after the import").unwrap();
    // A record after the import joins the stored last chunk (read back at the sync): the
    // audit reads as many blocks as before (a new chunk would be one more).
    record(&pool, "oxpool sync tank");
    pool.sync().unwrap();
    let after = pool.history();
    assert_eq!(after.records.len(), 4);
    assert_eq!(after.records[..3], listed.records[..]);
    assert_eq!(
        audit_result(&pool, "after a record since the import"),
        Ok(blocks)
    );
    pool.export().unwrap();
    assert_eq!(reimport(&mems).history().records, after.records);
}

#[test]
fn the_history_is_bounded_and_keeps_the_pools_creation() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let kept_max = HISTORY_CHUNKS_MAX * TABLE_CHUNK_ENTRIES_MAX;
    let total = kept_max + 3 * TABLE_CHUNK_ENTRIES_MAX + 17;
    // In syncs of uneven sizes, so chunks are rewritten, filled and added in every way.
    let mut n = 0;
    let mut step = 1;
    while n < total {
        for _ in 0..step.min(total - n) {
            record(&pool, &format!("oxpool sync {n}"));
            n += 1;
        }
        pool.sync().unwrap();
        step = step % 97 + 13;
    }
    let listed = pool.history();
    let got = lines(&listed.records);
    assert_eq!(got, expected(total));
    assert!(got.len() <= kept_max, "{} records kept", got.len());
    assert!(
        got.len() > kept_max - TABLE_CHUNK_ENTRIES_MAX,
        "{} kept",
        got.len()
    );
    // The first chunk (the creation) stays whole; then the latest records, without a gap.
    for (i, line) in got.iter().take(TABLE_CHUNK_ENTRIES_MAX).enumerate() {
        assert_eq!(*line, format!("oxpool sync {i}"));
    }
    let later = &got[TABLE_CHUNK_ENTRIES_MAX..];
    let first_later = total - later.len();
    assert!(first_later > TABLE_CHUNK_ENTRIES_MAX, "nothing was dropped");
    for (k, line) in later.iter().enumerate() {
        assert_eq!(*line, format!("oxpool sync {}", first_later + k));
    }
    // The dropped chunks' places went back to the allocator: no leak, no double reference.
    audit_clean(&pool, "after the history rolled over");
    pool.export().unwrap();
    assert_eq!(lines(&reimport(&mems).history().records), got);
}

/// What the history lists after `n` records `oxpool sync 0..n`: chunks fill to
/// `TABLE_CHUNK_ENTRIES_MAX` before the next begins, whatever the syncs' sizes, so chunk k
/// holds records [64k, 64k + 64); the first chunk stays, and the latest others up to the
/// bound.
fn expected(n: usize) -> Vec<String> {
    let per = TABLE_CHUNK_ENTRIES_MAX;
    let chunks = n.div_ceil(per);
    let first_later = chunks.saturating_sub(HISTORY_CHUNKS_MAX - 1).max(1);
    (0..n.min(per))
        .chain((first_later * per).min(n)..n)
        .map(|i| format!("oxpool sync {i}"))
        .collect()
}

/// Records and syncs until the power fails at a seeded instant; after import, the history is
/// the records of every sync that returned, plus at most those of the sync in flight, in
/// order; the audit is clean; the pool records on. Odd seeds fill the history near its bound
/// first, so the crash can come while chunks are dropped.
fn crash_case(seed: u64) -> Result<String, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mems = vec![MemoryBackend::new("mem0", 32 << 20)];
    let (group, devices) = crash_devices(&mems, seed);
    let tops = vec![TopSpec {
        log: false,
        kind: TopVdevKind::Single,
        devices,
    }];
    let e = |e: oxpool_engine::EngineError| e.to_string();
    let pool = Pool::create("tank", tops, common::test_props(), false).map_err(e)?;
    let mut recorded = 0usize;
    if seed % 2 == 1 {
        let near = HISTORY_CHUNKS_MAX * TABLE_CHUNK_ENTRIES_MAX - rng.random_range(0..200);
        while recorded < near {
            for _ in 0..(near - recorded).min(200) {
                record(&pool, &format!("oxpool sync {recorded}"));
                recorded += 1;
            }
            pool.sync().map_err(e)?;
        }
    }
    for m in group.members.lock().unwrap().iter() {
        m.enable_power_loss();
    }
    group
        .remaining
        .store(rng.random_range(1..300), Ordering::SeqCst);
    let mut synced = recorded;
    // Bounded; it ends at the crash (the first error).
    for _ in 0..200 {
        for _ in 0..rng.random_range(1..40) {
            record(&pool, &format!("oxpool sync {recorded}"));
            recorded += 1;
        }
        if pool.sync().is_err() {
            break;
        }
        synced = recorded;
    }
    drop(pool);
    let (pool, report) = power_off_and_import(&group, &mems, seed)?;
    let listed = pool.history();
    let got = lines(&listed.records);
    if !listed.unreadable.is_empty() {
        return Err(format!("unreadable: {:?} ({report})", listed.unreadable));
    }
    if got != expected(synced) && got != expected(recorded) {
        return Err(format!(
            "{} records after the crash; {synced} synced, {recorded} recorded ({report})",
            got.len()
        ));
    }
    audit_result(&pool, "after the crash").map_err(|e| format!("{e} ({report})"))?;
    record(&pool, "oxpool sync after");
    pool.sync().map_err(e)?;
    let last = pool.history().records.last().map(|r| r.line.clone());
    if last.as_deref() != Some("oxpool sync after") {
        return Err(format!("the record after the crash is missing ({report})"));
    }
    audit_result(&pool, "at the end").map_err(|e| format!("{e} ({report})"))?;
    pool.export().map_err(e)?;
    Ok(report)
}

#[test]
fn after_a_power_loss_the_history_holds_every_synced_record() {
    run_crash_cases("history", crash_case);
}
