//! `oxpool import POOL NEWNAME` (as `zpool import pool newpool`): a pool imported under a new
//! name keeps it (its metadata and every label carry it) and is found by it from then on,
//! not by the old one; two pools of one name are told apart by id; a bad new name is
//! refused; and a power loss at any instant of a rename leaves a pool that imports, by its
//! old name or its new one, with every byte and snapshot, an audit clean and labels that all
//! agree once imported.
//!
//! `OXPOOL_CRASH_CASES=N` runs N seeds of the crash case (default 2000);
//! `OXPOOL_CRASH_SEED=S` replays one.

mod common;

use common::{audit_clean, crash_devices, pattern, power_off, run_crash_cases, test_props};
use oxpool_engine::{ImportOptions, Pool, PoolRef, TopSpec};
use oxpool_format::{label_offsets, Guid, LabelConfig, TopVdevKind, LABEL_CONFIG_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, IoBuf, MemoryBackend};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const DEVICE_BYTES: u64 = 32 << 20;
const VOLUME_BYTES: u64 = 256 << 10;

fn backends(mems: &[MemoryBackend]) -> Vec<Arc<dyn Backend>> {
    mems.iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
        .collect()
}

fn mems(prefix: &str, n: usize) -> Vec<MemoryBackend> {
    (0..n)
        .map(|i| MemoryBackend::new(&format!("{prefix}{i}"), DEVICE_BYTES))
        .collect()
}

/// Layout `layout % 3`: one device, a mirror of two, a stripe of two.
fn tops(layout: u64, devs: &[Arc<dyn Backend>]) -> Vec<TopSpec> {
    match layout % 3 {
        0 => vec![TopSpec::single(devs[0].clone())],
        1 => vec![TopSpec {
            log: false,
            kind: TopVdevKind::Mirror,
            devices: devs.to_vec(),
        }],
        _ => devs.iter().map(|d| TopSpec::single(d.clone())).collect(),
    }
}

fn device_count(layout: u64) -> usize {
    if layout.is_multiple_of(3) {
        1
    } else {
        2
    }
}

/// Pool `name` on `mems` with volume `v` (pattern `seed`) and its snapshot `@s`, exported.
/// Returns the pool's guid.
fn make_pool(name: &str, layout: u64, mems: &[MemoryBackend], seed: u64) -> Guid {
    let pool = Pool::create(name, tops(layout, &backends(mems)), test_props(), false).unwrap();
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    block_on(vol.write(0, &pattern(seed, VOLUME_BYTES as usize), false)).unwrap();
    pool.snapshot(&["v@s".to_string()]).unwrap();
    block_on(vol.write(0, &pattern(seed + 1, 4096), false)).unwrap();
    drop(vol);
    let guid = pool.guid();
    pool.export().unwrap();
    guid
}

/// What pool `pool` should hold when made by [`make_pool`] with `seed`: `v` and `v@s`.
fn check_data(pool: &Pool, seed: u64) -> Result<(), String> {
    let mut want = pattern(seed, VOLUME_BYTES as usize);
    let vol = pool.volume("v").map_err(|e| e.to_string())?;
    let snap = pool.snapshot_volume("v", "s").map_err(|e| e.to_string())?;
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(snap.read(0, &mut got)).map_err(|e| e.to_string())?;
    if got != want {
        return Err("v@s does not read back".into());
    }
    want[..4096].copy_from_slice(&pattern(seed + 1, 4096));
    block_on(vol.read(0, &mut got)).map_err(|e| e.to_string())?;
    if got != want {
        return Err("v does not read back".into());
    }
    if vol.full_name() != format!("{}/v", pool.name()) {
        return Err(format!(
            "volume named {} in pool {}",
            vol.full_name(),
            pool.name()
        ));
    }
    Ok(())
}

/// The pool names the four labels of each device carry (None: a label that does not decode).
fn label_names(mems: &[MemoryBackend]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for m in mems {
        for off in label_offsets(m.size_bytes()) {
            let buf = block_on(m.read(off, IoBuf::zeroed(LABEL_CONFIG_BYTES as usize))).unwrap();
            out.push(LabelConfig::decode(&buf).ok().map(|c| c.pool_name));
        }
    }
    out
}

fn import(
    mems: &[MemoryBackend],
    which: PoolRef<'_>,
    new_name: Option<&str>,
) -> oxpool_engine::Result<Pool> {
    Pool::import_as(backends(mems), which, new_name, ImportOptions::default())
}

#[test]
fn a_pool_imported_under_a_new_name_is_found_by_it_and_not_by_the_old() {
    let mems = mems("d", 2);
    make_pool("tank", 1, &mems, 7);
    let pool = import(&mems, PoolRef::NameOrId("tank"), Some("tank2")).unwrap();
    assert_eq!(pool.name(), "tank2");
    check_data(&pool, 7).unwrap();
    pool.export().unwrap();
    // The metadata and every label carry the new name.
    assert!(label_names(&mems)
        .iter()
        .all(|n| n.as_deref() == Some("tank2")));
    let e = import(&mems, PoolRef::Name("tank"), None).err().unwrap();
    assert!(e.to_string().contains("no pool 'tank'"), "{e}");
    let pool = Pool::import(backends(&mems), Some("tank2")).unwrap();
    assert_eq!(pool.name(), "tank2");
    check_data(&pool, 7).unwrap();
    audit_clean(&pool, "after a rename");
    pool.export().unwrap();
}

#[test]
fn two_pools_of_one_name_are_told_apart_by_id() {
    let (a, b) = (mems("a", 1), mems("b", 1));
    make_pool("tank", 0, &a, 1);
    let guid_b = make_pool("tank", 0, &b, 2);
    let all: Vec<MemoryBackend> = a.iter().chain(&b).cloned().collect();
    let e = import(&all, PoolRef::Name("tank"), None).err().unwrap();
    assert!(
        e.to_string().contains("several pools found") && e.to_string().contains("id"),
        "{e}"
    );
    // By its id, as `oxpool import` lists it (hex).
    let id = format!("{:x}", guid_b.0);
    let pool = import(&all, PoolRef::NameOrId(&id), Some("tank2")).unwrap();
    assert_eq!((pool.name(), pool.guid()), ("tank2", guid_b));
    check_data(&pool, 2).unwrap();
    pool.export().unwrap();
    // Now each name finds one pool.
    let pool = import(&all, PoolRef::Name("tank"), None).unwrap();
    assert_ne!(pool.guid(), guid_b);
    check_data(&pool, 1).unwrap();
    pool.export().unwrap();
    let pool = import(&all, PoolRef::Id(guid_b), None).unwrap();
    assert_eq!(pool.name(), "tank2");
    pool.export().unwrap();
    let e = import(&all, PoolRef::NameOrId("ffff"), None).err().unwrap();
    assert!(
        e.to_string().contains("no pool named or of id 'ffff'"),
        "{e}"
    );
}

#[test]
fn a_bad_new_name_is_refused_and_changes_nothing() {
    let mems = mems("d", 1);
    make_pool("tank", 0, &mems, 3);
    for bad in ["", "a/b", "1tank", "mirror2", "-x", &"x".repeat(65)] {
        let e = import(&mems, PoolRef::Name("tank"), Some(bad))
            .err()
            .unwrap_or_else(|| panic!("'{bad}' was taken"));
        assert!(e.to_string().contains("pool name"), "{bad}: {e}");
    }
    assert!(label_names(&mems)
        .iter()
        .all(|n| n.as_deref() == Some("tank")));
    let pool = Pool::import(backends(&mems), Some("tank")).unwrap();
    check_data(&pool, 3).unwrap();
    pool.export().unwrap();
}

/// Operations a rename's import does at most (reads, writes and flushes of every device):
/// the power fails at a seeded one of them, or after the import returned.
const RENAME_OPS_MAX: u64 = 96;

/// A power loss during `import tank tank2` (at a seeded operation, or the moment it
/// returns): the pool then imports by one of the names (tried in a seeded order), with the
/// new one if the rename had returned; its data, snapshot and audit are whole; after that
/// import every label names it as it came up, so its name finds it and the other does not.
fn rename_crash_case(seed: u64) -> Result<String, String> {
    let layout = seed % 3;
    let mems = mems("d", device_count(layout));
    let guid = make_pool("tank", layout, &mems, seed);
    let (group, devs) = crash_devices(&mems, seed);
    let cut_at_return = seed % 8 == 7;
    if !cut_at_return {
        group
            .remaining
            .store(1 + (seed / 3) % RENAME_OPS_MAX, Ordering::SeqCst);
    }
    let renamed = Pool::import_as(
        devs,
        PoolRef::Name("tank"),
        Some("tank2"),
        ImportOptions::default(),
    );
    let returned = renamed.is_ok();
    // Operations the whole import took, when the power did not fail in it (to keep
    // RENAME_OPS_MAX above it).
    let ops = u64::MAX - group.remaining.load(Ordering::SeqCst);
    // The machine dies now if it has not yet: what the import returned must be durable.
    group.remaining.store(1, Ordering::SeqCst);
    group.tick();
    drop(renamed);
    let report = power_off(&group, seed);
    let before = label_names(&mems);
    if before.iter().any(|n| n.as_deref() == Some("tank"))
        && before.iter().any(|n| n.as_deref() == Some("tank2"))
    {
        REACHED[2].fetch_add(1, Ordering::Relaxed);
    }
    let names = if seed.is_multiple_of(2) {
        ["tank", "tank2"]
    } else {
        ["tank2", "tank"]
    };
    let pool = match import(&mems, PoolRef::Name(names[0]), None) {
        Ok(p) => p,
        Err(first) => import(&mems, PoolRef::Name(names[1]), None).map_err(|e| {
            format!(
                "unimportable: by {}: {first}; by {}: {e} (labels {:?}; {report})",
                names[0],
                names[1],
                label_names(&mems)
            )
        })?,
    };
    let name = pool.name().to_string();
    if pool.guid() != guid || !["tank", "tank2"].contains(&name.as_str()) {
        return Err(format!("imported pool {name} ({:x})", pool.guid().0));
    }
    if returned && name != "tank2" {
        return Err(format!("the rename returned, the pool came back as {name}"));
    }
    check_data(&pool, seed).map_err(|e| format!("{e} ({report})"))?;
    common::audit_result(&pool, "after a power loss during a rename")?;
    pool.export().map_err(|e| e.to_string())?;
    let labels = label_names(&mems);
    if labels.iter().any(|n| n.as_deref() != Some(name.as_str())) {
        return Err(format!("labels after import as {name}: {labels:?}"));
    }
    REACHED[usize::from(name == "tank2")].fetch_add(1, Ordering::Relaxed);
    let other = if name == "tank" { "tank2" } else { "tank" };
    if import(&mems, PoolRef::Name(other), None).is_ok() {
        return Err(format!("{other} still finds the pool named {name}"));
    }
    let pool = import(&mems, PoolRef::Name(&name), None).map_err(|e| e.to_string())?;
    pool.export().map_err(|e| e.to_string())?;
    let ops = if cut_at_return {
        format!(" after {ops} operations")
    } else {
        String::new()
    };
    Ok(format!("returned {returned}{ops}, came back as {name}"))
}

/// Crash cases that came back as `tank`, as `tank2`, and that found labels naming both.
static REACHED: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

#[test]
fn a_power_loss_during_a_rename_leaves_a_pool_found_by_the_old_or_the_new_name() {
    run_crash_cases("import_rename", rename_crash_case);
    let reached: Vec<u64> = REACHED.iter().map(|r| r.load(Ordering::Relaxed)).collect();
    println!(
        "came back as tank {}, as tank2 {}, labels naming both {}",
        reached[0], reached[1], reached[2]
    );
    // Each outcome, and the instant between the labels' writes, is reached by a run of
    // any size (a replay of one seed reaches one).
    if std::env::var("OXPOOL_CRASH_SEED").is_err() {
        assert!(
            reached.iter().all(|&n| n > 0),
            "not every case was reached: {reached:?}"
        );
    }
}

/// A device absent during the rename keeps the old name in its labels; when it is back, an
/// import by the new name takes it too (by guid: its pool is the one the name selected) and
/// rewrites its labels, and the old name finds nothing.
#[test]
fn a_device_absent_during_the_rename_rejoins_under_the_new_name() {
    let mems = mems("d", 2);
    make_pool("tank", 1, &mems, 5);
    let pool = import(&mems[..1], PoolRef::Name("tank"), Some("tank2")).unwrap();
    check_data(&pool, 5).unwrap();
    pool.export().unwrap();
    assert_eq!(
        label_names(&mems),
        [["tank2"; 4], ["tank"; 4]]
            .concat()
            .iter()
            .map(|n| Some(n.to_string()))
            .collect::<Vec<_>>()
    );
    let pool = import(&mems, PoolRef::Name("tank2"), None).unwrap();
    assert_eq!(pool.status().vdevs[0].children.len(), 2);
    check_data(&pool, 5).unwrap();
    pool.export().unwrap();
    assert!(label_names(&mems)
        .iter()
        .all(|n| n.as_deref() == Some("tank2")));
    assert!(import(&mems, PoolRef::Name("tank"), None).is_err());
}
