//! Power loss during renames of volumes, snapshots and bookmarks (the fault backend of
//! power_loss.rs: writes no completed flush covers are dropped, kept or torn at a seeded
//! instant), among writes and syncs of another volume. After import the pool shows exactly
//! the names before the rename in flight or after it, never both and never neither: the same
//! volumes, each with its bytes, its origin, its snapshots (names, order, bytes) and its
//! bookmarks; the audit is clean. The pool then keeps working: another rename, exported and
//! imported, is there. The test counts the kinds of rename in flight and fails if one is
//! reached rarely.
//!
//! `OXPOOL_CRASH_CASES=N` runs N seeds (default 2000); `OXPOOL_CRASH_SEED=S` replays one.

mod common;

use common::{audit_result, crash_devices, pattern, power_off_and_import, run_crash_cases};
use oxpool_engine::{Pool, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::MemoryBackend;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

const DEVICE_BYTES: u64 = 32 << 20;
const VOLUME_BYTES: u64 = 64 << 10;
/// The names volumes, snapshots and bookmarks are renamed among.
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// A volume as the model has it: the seed of its bytes (None: the scratch volume, written
/// without a model), its origin (volume, snapshot), its snapshots (name, seed of their
/// bytes), oldest first, and its bookmarks' names, sorted.
#[derive(Clone, Debug, PartialEq)]
struct Vol {
    bytes: Option<u64>,
    origin: Option<(String, String)>,
    snaps: Vec<(String, u64)>,
    marks: Vec<String>,
}

type Model = BTreeMap<String, Vol>;

fn read(pool: &Pool, vol: &str, snap: Option<&str>) -> Result<Vec<u8>, String> {
    let v = match snap {
        Some(s) => pool.snapshot_volume(vol, s),
        None => pool.volume(vol),
    }
    .map_err(|e| format!("{vol}@{snap:?}: {e}"))?;
    let mut buf = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut buf)).map_err(|e| format!("read {vol}@{snap:?}: {e}"))?;
    Ok(buf)
}

/// Whether the pool holds exactly the model.
fn matches(pool: &Pool, m: &Model) -> Result<(), String> {
    let vols: Vec<String> = pool.volumes().iter().map(|v| v.name()).collect();
    let want: Vec<String> = m.keys().cloned().collect();
    if vols != want {
        return Err(format!("volumes {vols:?}, expected {want:?}"));
    }
    for (name, vol) in m {
        let snaps: Vec<String> = pool
            .snapshots(name)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|s| s.name)
            .collect();
        let want: Vec<String> = vol.snaps.iter().map(|(n, _)| n.clone()).collect();
        if snaps != want {
            return Err(format!("snapshots of {name}: {snaps:?}, expected {want:?}"));
        }
        let mut marks: Vec<String> = pool
            .bookmarks(name)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|b| b.name)
            .collect();
        marks.sort();
        if marks != vol.marks {
            return Err(format!(
                "bookmarks of {name}: {marks:?}, expected {:?}",
                vol.marks
            ));
        }
        let origin = pool.dataset_space(name).map_err(|e| e.to_string())?.origin;
        let want = vol.origin.as_ref().map(|(v, s)| format!("tank/{v}@{s}"));
        if origin != want {
            return Err(format!("origin of {name}: {origin:?}, expected {want:?}"));
        }
        for (snap, seed) in &vol.snaps {
            if read(pool, name, Some(snap))? != pattern(*seed, VOLUME_BYTES as usize) {
                return Err(format!("{name}@{snap} differs from its model"));
            }
        }
        if let Some(seed) = vol.bytes {
            if read(pool, name, None)? != pattern(seed, VOLUME_BYTES as usize) {
                return Err(format!("{name} differs from its model"));
            }
        }
    }
    Ok(())
}

/// Picks one of `items`, if any.
fn pick<T: Clone>(rng: &mut SmallRng, items: &[T]) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    Some(items[rng.random_range(0..items.len())].clone())
}

/// A name of [`NAMES`] that `taken` does not hold.
fn free_name(rng: &mut SmallRng, taken: &[String]) -> Option<String> {
    let free: Vec<String> = NAMES
        .iter()
        .map(|n| n.to_string())
        .filter(|n| !taken.contains(n))
        .collect();
    pick(rng, &free)
}

/// The model after volume `from` is renamed `to`: clones' origins follow.
fn rename_volume(m: &mut Model, from: &str, to: &str) {
    let v = m.remove(from).unwrap();
    m.insert(to.to_string(), v);
    for v in m.values_mut() {
        if let Some(o) = v.origin.as_mut().filter(|o| o.0 == from) {
            o.0 = to.to_string();
        }
    }
}

/// The model after snapshot `vol@from` is renamed `to`: clones' origins follow.
fn rename_snapshot(m: &mut Model, vol: &str, from: &str, to: &str) {
    let s = m.get_mut(vol).unwrap();
    s.snaps.iter_mut().find(|(n, _)| n == from).unwrap().0 = to.to_string();
    for v in m.values_mut() {
        if let Some(o) = v.origin.as_mut().filter(|o| o.0 == vol && o.1 == from) {
            o.1 = to.to_string();
        }
    }
}

fn crash_case(seed: u64) -> Result<String, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let layout = seed % 3; // 0 single, 1 mirror, 2 stripe
    let ndev = if layout == 0 { 1 } else { 2 };
    let mems: Vec<MemoryBackend> = (0..ndev)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), DEVICE_BYTES))
        .collect();
    let (group, devices) = crash_devices(&mems, seed);
    let tops = match layout {
        1 => vec![TopSpec {
            log: false,
            kind: TopVdevKind::Mirror,
            devices: devices.clone(),
        }],
        _ => devices
            .iter()
            .map(|d| TopSpec {
                log: false,
                kind: TopVdevKind::Single,
                devices: vec![d.clone()],
            })
            .collect(),
    };
    let e = |e: oxpool_engine::EngineError| e.to_string();
    let pool = Pool::create("tank", tops, common::test_props(), false).map_err(e)?;
    // `a`: snapshots a@a (bytes 1) and a@b (bytes 2), bookmark a#a, bytes 3; `b`, a clone of
    // a@a with a snapshot of its own, b@a; `z`: the scratch volume, written during the run.
    let size = VOLUME_BYTES as usize;
    let a = pool.create_volume("a", VOLUME_BYTES, &[]).map_err(e)?;
    for (i, snap) in [(1, "a"), (2, "b")] {
        block_on(a.write(0, &pattern(i, size), false)).map_err(e)?;
        pool.snapshot(&[format!("a@{snap}")]).map_err(e)?;
    }
    block_on(a.write(0, &pattern(3, size), false)).map_err(e)?;
    pool.bookmark("a@a", "a#a").map_err(e)?;
    pool.clone_snapshot("a", "a", "b", &[]).map_err(e)?;
    pool.snapshot(&["b@a".into()]).map_err(e)?;
    let z = pool.create_volume("z", VOLUME_BYTES, &[]).map_err(e)?;
    pool.sync().map_err(e)?;
    drop(a);
    let mut model: Model = BTreeMap::new();
    model.insert(
        "a".into(),
        Vol {
            bytes: Some(3),
            origin: None,
            snaps: vec![("a".into(), 1), ("b".into(), 2)],
            marks: vec!["a".into()],
        },
    );
    model.insert(
        "b".into(),
        Vol {
            bytes: Some(1),
            origin: Some(("a".into(), "a".into())),
            snaps: vec![("a".into(), 1)],
            marks: Vec::new(),
        },
    );
    model.insert(
        "z".into(),
        Vol {
            bytes: None,
            origin: None,
            snaps: Vec::new(),
            marks: Vec::new(),
        },
    );
    for m in group.members.lock().unwrap().iter() {
        m.enable_power_loss();
    }
    group
        .remaining
        .store(rng.random_range(1..400), Ordering::SeqCst);
    let mut in_flight: Option<(&'static str, Model)> = None;
    // Bounded workload; it ends at the crash (the first error).
    for _ in 0..100 {
        let mut after = model.clone();
        let renamed: Vec<String> = model.keys().filter(|n| *n != "z").cloned().collect();
        let (what, r) = match rng.random_range(0..8) {
            0 | 1 => {
                let from = pick(&mut rng, &renamed).unwrap();
                let taken: Vec<String> = model.keys().cloned().collect();
                let Some(to) = free_name(&mut rng, &taken) else {
                    continue;
                };
                rename_volume(&mut after, &from, &to);
                ("volume", pool.rename(&from, &to))
            }
            2 | 3 => {
                let vol = pick(&mut rng, &renamed).unwrap();
                let taken: Vec<String> = model[&vol].snaps.iter().map(|s| s.0.clone()).collect();
                let (Some(from), Some(to)) = (pick(&mut rng, &taken), free_name(&mut rng, &taken))
                else {
                    continue;
                };
                rename_snapshot(&mut after, &vol, &from, &to);
                (
                    "snapshot",
                    pool.rename(&format!("{vol}@{from}"), &format!("{vol}@{to}")),
                )
            }
            4 => {
                let vol = pick(&mut rng, &renamed).unwrap();
                let taken = model[&vol].marks.clone();
                let (Some(from), Some(to)) = (pick(&mut rng, &taken), free_name(&mut rng, &taken))
                else {
                    continue;
                };
                let marks = &mut after.get_mut(&vol).unwrap().marks;
                marks.retain(|m| *m != from);
                marks.push(to.clone());
                marks.sort();
                (
                    "bookmark",
                    pool.rename(&format!("{vol}#{from}"), &format!("{vol}#{to}")),
                )
            }
            _ => {
                // Other txgs between the renames: a write of the scratch volume, synced.
                let len = rng.random_range(1..16_384u64);
                let off = rng.random_range(0..VOLUME_BYTES - len);
                let data = pattern(rng.random(), len as usize);
                let r = block_on(z.write(off, &data, false)).and_then(|()| pool.sync());
                ("write", r)
            }
        };
        match r {
            Ok(()) => model = after,
            Err(_) => {
                if after != model {
                    in_flight = Some((what, after));
                }
                break;
            }
        }
    }
    drop(z);
    drop(pool);
    let (pool, mut report) = power_off_and_import(&group, &mems, seed)?;
    // Exactly the names before the rename in flight, or after it: never both, nor neither.
    let landed = match (matches(&pool, &model), &in_flight) {
        (Ok(()), _) => false,
        (Err(before), Some((what, after))) => match matches(&pool, after) {
            Ok(()) => true,
            Err(not_after) => {
                return Err(format!(
                    "{what} rename in flight: neither before ({before}) nor after \
                     ({not_after}) ({report})"
                ))
            }
        },
        (Err(before), None) => return Err(format!("{before} ({report})")),
    };
    if let Some((what, _)) = &in_flight {
        report += &format!("{what} rename in flight, landed: {landed}; ");
    }
    audit_result(&pool, "after the crash").map_err(|e| format!("{e} ({report})"))?;
    // The pool keeps working: one more rename of a volume, durable across an export.
    let vols: Vec<String> = pool.volumes().iter().map(|v| v.name()).collect();
    let from = vols.iter().find(|n| *n != "z").unwrap().clone();
    let to = free_name(&mut rng, &vols).unwrap();
    pool.rename(&from, &to).map_err(e)?;
    let mut model = if landed {
        in_flight.as_ref().unwrap().1.clone()
    } else {
        model
    };
    rename_volume(&mut model, &from, &to);
    pool.export().map_err(e)?;
    let devices = mems
        .iter()
        .map(|m| std::sync::Arc::new(m.clone()) as std::sync::Arc<dyn oxpool_io::Backend>)
        .collect();
    let pool = Pool::import(devices, Some("tank")).map_err(e)?;
    matches(&pool, &model).map_err(|m| format!("after a rename since the crash: {m}"))?;
    audit_result(&pool, "at the end").map_err(|e| format!("{e} ({report})"))?;
    pool.export().map_err(e)?;
    let kind = in_flight.as_ref().map_or("nothing", |(what, _)| *what);
    let mut counts = IN_FLIGHT.lock().unwrap();
    let (all, landed_count) = counts.entry(kind).or_default();
    *all += 1;
    *landed_count += u64::from(landed);
    Ok(report)
}

/// How many passed cases had each kind of rename in flight at the crash, and in how many of
/// them it had landed.
static IN_FLIGHT: Mutex<BTreeMap<&'static str, (u64, u64)>> = Mutex::new(BTreeMap::new());

#[test]
fn power_loss_during_renames() {
    run_crash_cases("rename_power_loss", crash_case);
    let counts = IN_FLIGHT.lock().unwrap().clone();
    println!("in flight at the crash (cases, of which landed): {counts:?}");
    // A workload change that stopped reaching one kind, before or after it landed, fails
    // here instead of silently testing less.
    let cases: u64 = std::env::var("OXPOOL_CRASH_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    if std::env::var("OXPOOL_CRASH_SEED").is_err() && cases >= 2000 {
        for kind in ["volume", "snapshot", "bookmark"] {
            let (n, landed) = counts.get(kind).copied().unwrap_or_default();
            assert!(n >= 25, "only {n} crashes during a {kind} rename");
            assert!(
                landed >= 5,
                "only {landed} crashes during a {kind} rename after it landed"
            );
        }
    }
}
