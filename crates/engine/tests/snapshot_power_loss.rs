//! Power loss during snapshot (of a volume or a clone), destroy (one snapshot, one next to a
//! clone's origin, a range of several in one txg as `destroy POOL/VOL@A%C` queues it),
//! rollback, clone, a write to a clone, clone destroy, promote, and the drain of the queue of
//! frees that destroys leave (the fault backend of power_loss.rs: writes not covered by a
//! completed flush are dropped, kept or torn at a seeded instant). After import every volume
//! is exactly the model before the change in flight or after it, whole: the same volumes,
//! each with its origin, its snapshots (names, order, bytes) and its bytes (a promote moves
//! snapshots and origins); the written volume holds its durable bytes or bytes written after
//! them (or, for a rollback in flight, exactly the snapshot's); the audit finds no leak, no
//! block both free and referenced, no wrong counter. The pool then keeps working: a write, a
//! snapshot, promotes until the written volume is no clone, every other volume destroyed
//! leaves first, every snapshot destroyed; `freeing` drains to zero and the audit is clean
//! again. The test counts the kinds of change in flight and fails if one is reached rarely.
//!
//! `OXPOOL_CRASH_CASES=N` runs N seeds (default 2000); `OXPOOL_CRASH_SEED=S` replays one.

mod common;

use common::{crash_devices, pattern, power_off_and_import, run_crash_cases, test_props};
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
const VOLUME_BYTES: u64 = 256 << 10;

fn read(pool: &Pool, name: &str) -> Result<Vec<u8>, String> {
    let v = match name.split_once('@') {
        Some((vol, snap)) => pool.snapshot_volume(vol, snap),
        None => pool.volume(name),
    }
    .map_err(|e| format!("{name}: {e}"))?;
    let mut buf = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut buf)).map_err(|e| format!("read {name}: {e}"))?;
    Ok(buf)
}

/// A volume as the model has it: its bytes, its origin (volume, snapshot) and its
/// snapshots, oldest first, with their bytes.
#[derive(Clone, Debug, PartialEq)]
struct Vol {
    /// None for `v`, the volume written without syncs: its bytes are checked apart (its
    /// durable bytes or later ones).
    bytes: Option<Vec<u8>>,
    origin: Option<(String, String)>,
    snaps: Vec<(String, Vec<u8>)>,
}

/// The volumes, by name.
type Model = BTreeMap<String, Vol>;

/// `promote` of clone `c`, as the engine does it (dsl/snapshot_sync.rs): the snapshots of
/// its origin's volume up to the origin move to it, it takes that volume's origin, that
/// volume becomes a clone of the origin snapshot, and clones of the moved snapshots follow.
fn promote(m: &mut Model, c: &str) {
    let (ov, os) = m[c].origin.clone().expect("a clone");
    let i = m[&ov].snaps.iter().position(|(n, _)| *n == os).unwrap();
    let moved: Vec<(String, Vec<u8>)> = m.get_mut(&ov).unwrap().snaps.drain(..=i).collect();
    let names: Vec<String> = moved.iter().map(|(n, _)| n.clone()).collect();
    let theirs = m.get_mut(&ov).unwrap().origin.take();
    let mine = m.get_mut(c).unwrap();
    let own = std::mem::replace(&mut mine.snaps, moved);
    mine.snaps.extend(own);
    mine.origin = theirs;
    m.get_mut(&ov).unwrap().origin = Some((c.to_string(), os));
    for (name, vol) in m.iter_mut() {
        if *name == ov || name == c {
            continue;
        }
        if let Some(o) = vol.origin.as_mut() {
            if o.0 == ov && names.contains(&o.1) {
                o.0 = c.to_string();
            }
        }
    }
}

/// Whether the pool holds exactly the model: the same volumes, each with its origin, its
/// snapshots (names, in order, and bytes) and its bytes.
fn matches(pool: &Pool, m: &Model) -> Result<(), String> {
    let vols: Vec<String> = pool
        .volumes()
        .iter()
        .map(|v| v.name().to_string())
        .collect();
    let want: Vec<String> = m.keys().cloned().collect();
    if vols != want {
        return Err(format!("volumes {vols:?}, expected {want:?}"));
    }
    for (name, vol) in m {
        let listed: Vec<String> = pool
            .snapshots(name)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|s| s.name)
            .collect();
        let want: Vec<String> = vol.snaps.iter().map(|(n, _)| n.clone()).collect();
        if listed != want {
            return Err(format!(
                "snapshots of {name}: {listed:?}, expected {want:?}"
            ));
        }
        let origin = pool.dataset_space(name).map_err(|e| e.to_string())?.origin;
        let want = vol.origin.as_ref().map(|(v, s)| format!("tank/{v}@{s}"));
        if origin != want {
            return Err(format!("origin of {name}: {origin:?}, expected {want:?}"));
        }
        for (snap, bytes) in &vol.snaps {
            if read(pool, &format!("{name}@{snap}"))? != *bytes {
                return Err(format!("{name}@{snap} differs from its model"));
            }
        }
        if let Some(bytes) = &vol.bytes {
            if read(pool, name)? != *bytes {
                return Err(format!("{name} differs from its model"));
            }
        }
    }
    Ok(())
}

/// What had not returned when the power went: a change to the model (the pool must then
/// hold the model before it or after it, whole), or a rollback of `v` (its bytes then are
/// the snapshot's, or its durable ones or later).
enum InFlight {
    None,
    Change(&'static str, Box<Model>),
    Rollback(Vec<u8>),
}

/// Picks one of `items`, if any.
fn pick<T: Clone>(rng: &mut SmallRng, items: &[T]) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    Some(items[rng.random_range(0..items.len())].clone())
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
    let pool = Pool::create("tank", tops, test_props(), false).map_err(|e| e.to_string())?;
    let bs = [4096u32, 16384][rng.random_range(0..2)];
    let vol = pool
        .create_volume(
            "v",
            VOLUME_BYTES,
            &[("volblocksize".into(), bs.to_string())],
        )
        .map_err(|e| e.to_string())?;
    let mut current = vec![0u8; VOLUME_BYTES as usize];
    let mut model: Model = BTreeMap::new();
    model.insert(
        "v".into(),
        Vol {
            bytes: None,
            origin: None,
            snaps: Vec::new(),
        },
    );
    // A quarter of the cases start (before the power can fail) with snapshots and a clone
    // with a snapshot of its own, so that ranges, destroys next to an origin and promotes
    // have something to work on from the first operation.
    if seed % 4 == 1 {
        for i in 0..rng.random_range(3..5) {
            let len = rng.random_range(1..20_000u64);
            let off = rng.random_range(0..VOLUME_BYTES - len);
            let data = pattern(rng.random(), len as usize);
            current[off as usize..(off + len) as usize].copy_from_slice(&data);
            block_on(vol.write(off, &data, false)).map_err(|e| e.to_string())?;
            pool.snapshot(&[format!("v@p{i}")])
                .map_err(|e| e.to_string())?;
            let v = model.get_mut("v").unwrap();
            v.snaps.push((format!("p{i}"), current.clone()));
        }
        let (snap, bytes) = pick(&mut rng, &model["v"].snaps).unwrap();
        pool.clone_snapshot("v", &snap, "c0", &[])
            .map_err(|e| e.to_string())?;
        pool.snapshot(&["c0@q0".into()])
            .map_err(|e| e.to_string())?;
        model.insert(
            "c0".into(),
            Vol {
                bytes: Some(bytes.clone()),
                origin: Some(("v".into(), snap)),
                snaps: vec![("q0".into(), bytes)],
            },
        );
    }
    pool.sync().map_err(|e| e.to_string())?;
    for m in group.members.lock().unwrap().iter() {
        m.enable_power_loss();
    }
    group
        .remaining
        .store(rng.random_range(1..500), Ordering::SeqCst);
    let mut durable = current.clone();
    let mut since: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut in_flight = InFlight::None;
    let mut next = 0;
    // Bounded workload; it ends at the crash (the first error).
    for _ in 0..120u64 {
        next += 1;
        let with_snaps: Vec<String> = model
            .iter()
            .filter(|(_, v)| !v.snaps.is_empty())
            .map(|(n, _)| n.clone())
            .collect();
        let origins: Vec<(String, String)> =
            model.values().filter_map(|v| v.origin.clone()).collect();
        let mut after = model.clone();
        // The bytes of `v` a rollback makes (the model's volumes do not change).
        let mut rollback_to = None;
        // (what, result): a failed change is in flight, with `after` as its outcome.
        let op = rng.random_range(0..19);
        let (what, r) = match op {
            0..=5 => {
                let len = rng.random_range(1..20_000u64);
                let off = rng.random_range(0..VOLUME_BYTES - len);
                let data = pattern(rng.random(), len as usize);
                current[off as usize..(off + len) as usize].copy_from_slice(&data);
                since.push((off, data.clone()));
                ("write", block_on(vol.write(off, &data, false)))
            }
            6 => {
                let r = block_on(vol.flush());
                if r.is_ok() {
                    durable = current.clone();
                    since.clear();
                }
                ("flush", r)
            }
            7 | 8 => {
                // Mostly of `v`; sometimes of a clone (which promote then moves with it).
                let others: Vec<String> = model.keys().filter(|n| *n != "v").cloned().collect();
                let target = match rng.random_range(0..4) {
                    0 => pick(&mut rng, &others).unwrap_or_else(|| "v".into()),
                    _ => "v".into(),
                };
                let name = format!("s{next}");
                let bytes = after[&target]
                    .bytes
                    .clone()
                    .unwrap_or_else(|| current.clone());
                after
                    .get_mut(&target)
                    .unwrap()
                    .snaps
                    .push((name.clone(), bytes));
                let r = pool.snapshot(&[format!("{target}@{name}")]);
                if r.is_ok() {
                    durable = current.clone();
                    since.clear();
                }
                ("snapshot", r)
            }
            9..=11 => {
                // 9: one snapshot, next to a clone's origin if one is; 10, 11: a range of two
                // to four in one txg, as `destroy POOL/VOL@A%C` queues it. Never an origin
                // (refused whole, nothing changed: the refusals have tests of their own).
                let is_origin = |vol: &str, n: &str| {
                    origins
                        .iter()
                        .any(|(ov, os)| ov.as_str() == vol && os.as_str() == n)
                };
                // (volume, first, last) of every candidate.
                let mut near = Vec::new();
                let mut single = Vec::new();
                let mut ranges = Vec::new();
                for (name, vol) in &model {
                    let snaps = &vol.snaps;
                    for i in 0..snaps.len() {
                        if is_origin(name, &snaps[i].0) {
                            continue;
                        }
                        single.push((name.clone(), i, i));
                        let neighbours = [i.wrapping_sub(1), i + 1];
                        if neighbours
                            .iter()
                            .any(|&j| snaps.get(j).is_some_and(|s| is_origin(name, &s.0)))
                        {
                            near.push((name.clone(), i, i));
                        }
                        let mut last = i;
                        let want = i + rng.random_range(1..4);
                        while last < want
                            && last + 1 < snaps.len()
                            && !is_origin(name, &snaps[last + 1].0)
                        {
                            last += 1;
                        }
                        if last > i {
                            ranges.push((name.clone(), i, last));
                        }
                    }
                }
                let chosen = match op {
                    9 if !near.is_empty() => pick(&mut rng, &near),
                    9 => pick(&mut rng, &single),
                    _ => pick(&mut rng, &ranges),
                };
                let Some((target, first, last)) = chosen else {
                    continue;
                };
                let names: Vec<String> = model[&target].snaps[first..=last]
                    .iter()
                    .map(|(n, _)| n.clone())
                    .collect();
                let kind = match op {
                    9 if !near.is_empty() => "destroy next to an origin",
                    9 => "destroy",
                    _ => "destroy range",
                };
                after
                    .get_mut(&target)
                    .unwrap()
                    .snaps
                    .retain(|(n, _)| !names.contains(n));
                match pool.destroy_snapshots(&target, &names) {
                    // None is an origin or held: a refusal is a failure, not a crash.
                    Err(e @ oxpool_engine::EngineError::Busy(_)) => {
                        return Err(format!("destroy {target}@{names:?} refused: {e}"))
                    }
                    r => (kind, r.map(|_| ())),
                }
            }
            12 => {
                let Some((name, bytes)) = model["v"].snaps.last().cloned() else {
                    continue;
                };
                let r = pool.rollback("v", &name, false);
                if r.is_ok() {
                    current = bytes.clone();
                    durable = bytes.clone();
                    since.clear();
                }
                rollback_to = Some(bytes);
                ("rollback", r)
            }
            13 if model.len() < 4 => {
                let Some(target) = pick(&mut rng, &with_snaps) else {
                    continue;
                };
                let (snap, bytes) = pick(&mut rng, &model[&target].snaps).unwrap();
                let c = format!("c{next}");
                after.insert(
                    c.clone(),
                    Vol {
                        bytes: Some(bytes),
                        origin: Some((target.clone(), snap.clone())),
                        snaps: Vec::new(),
                    },
                );
                (
                    "clone",
                    pool.clone_snapshot(&target, &snap, &c, &[]).map(|_| ()),
                )
            }
            14 => {
                // A clone (or a volume a promote left without origin) that is no origin and
                // has no snapshots.
                let leaves: Vec<String> = model
                    .iter()
                    .filter(|(n, v)| {
                        *n != "v" && v.snaps.is_empty() && !origins.iter().any(|(ov, _)| ov == *n)
                    })
                    .map(|(n, _)| n.clone())
                    .collect();
                let Some(c) = pick(&mut rng, &leaves) else {
                    continue;
                };
                after.remove(&c);
                (
                    "destroy clone",
                    pool.destroy_volume(&c).and_then(|()| pool.sync()),
                )
            }
            15 => {
                // A write to another volume (a clone, or one a promote made an origin), synced
                // at once: it is there whole or not at all.
                let others: Vec<String> = model.keys().filter(|n| *n != "v").cloned().collect();
                let Some(c) = pick(&mut rng, &others) else {
                    continue;
                };
                let len = rng.random_range(1..20_000u64);
                let off = rng.random_range(0..VOLUME_BYTES - len);
                let data = pattern(rng.random(), len as usize);
                after.get_mut(&c).unwrap().bytes.as_mut().unwrap()
                    [off as usize..(off + len) as usize]
                    .copy_from_slice(&data);
                let r = pool.volume(&c).and_then(|cv| {
                    block_on(cv.write(off, &data, false))?;
                    pool.sync()
                });
                if r.is_ok() {
                    durable = current.clone();
                    since.clear();
                }
                ("clone write", r)
            }
            16 | 17 => {
                let clones: Vec<String> = model
                    .iter()
                    .filter(|(_, v)| v.origin.is_some())
                    .map(|(n, _)| n.clone())
                    .collect();
                let Some(c) = pick(&mut rng, &clones) else {
                    continue;
                };
                promote(&mut after, &c);
                ("promote", pool.promote(&c))
            }
            _ => {
                let r = pool.sync();
                if r.is_ok() {
                    durable = current.clone();
                    since.clear();
                }
                ("sync", r)
            }
        };
        match r {
            Ok(()) => model = after,
            Err(_) => {
                if let Some(bytes) = rollback_to {
                    in_flight = InFlight::Rollback(bytes);
                } else if after != model {
                    in_flight = InFlight::Change(what, Box::new(after));
                }
                break;
            }
        }
    }
    drop(vol);
    drop(pool);
    let (pool, mut report) = power_off_and_import(&group, &mems, seed)?;
    // Every volume and snapshot: exactly the model before the change in flight, or after.
    // Whether the change in flight is there (it committed, its call did not return).
    let landed = match (matches(&pool, &model), &in_flight) {
        (Ok(()), _) => false,
        (Err(before), InFlight::Change(what, after)) => match matches(&pool, after) {
            Ok(()) => true,
            Err(not_after) => {
                return Err(format!(
                    "{what} in flight: neither before ({before}) nor after ({not_after}) \
                     ({report})"
                ))
            }
        },
        (Err(before), _) => return Err(format!("{before} ({report})")),
    };
    if let InFlight::Change(what, _) = &in_flight {
        report += &format!("{what} in flight, landed: {landed}; ");
    }
    // The volume: its durable bytes or later ones; a rollback in flight: all or nothing.
    let got = read(&pool, "v")?;
    let rolled_back = matches!(&in_flight, InFlight::Rollback(bytes) if got == *bytes);
    if !rolled_back {
        if let Some(i) = (0..got.len()).find(|&i| {
            got[i] != durable[i]
                && !since.iter().any(|(off, d)| {
                    let o = *off as usize;
                    i >= o && i < o + d.len() && d[i - o] == got[i]
                })
        }) {
            return Err(format!(
                "byte {i} of v is {:#x}: neither durable ({:#x}) nor written after ({report})",
                got[i], durable[i]
            ));
        }
    }
    let audit = pool.audit().map_err(|e| format!("audit: {e}"))?;
    if !audit.is_clean() {
        return Err(format!(
            "audit after the crash: {:?} ({report})",
            audit.problems
        ));
    }
    // The pool keeps working: a write, a snapshot, then everything destroyed but `v`: `v`
    // promoted until it is no clone, the other volumes leaves first, `v`'s snapshots.
    let v = pool.volume("v").map_err(|e| e.to_string())?;
    block_on(v.write(0, &pattern(seed, 8192), false)).map_err(|e| e.to_string())?;
    pool.snapshot(&["v@after".into()])
        .map_err(|e| e.to_string())?;
    let origin_of = |name: &str| -> Result<Option<String>, String> {
        Ok(pool
            .dataset_space(name)
            .map_err(|e| e.to_string())?
            .origin
            .map(|o| {
                o.trim_start_matches("tank/")
                    .split('@')
                    .next()
                    .unwrap()
                    .to_string()
            }))
    };
    // Bounded: each promote moves `v` one volume up its line.
    for _ in 0..8 {
        if origin_of("v")?.is_none() {
            break;
        }
        pool.promote("v").map_err(|e| format!("promote v: {e}"))?;
    }
    // Bounded: each round destroys at least one leaf.
    for _ in 0..8 {
        let others: Vec<String> = pool
            .volumes()
            .iter()
            .map(|v| v.name().to_string())
            .filter(|n| n != "v")
            .collect();
        if others.is_empty() {
            break;
        }
        let mut origins = Vec::new();
        for o in &others {
            origins.extend(origin_of(o)?);
        }
        for leaf in others.iter().filter(|o| !origins.contains(o)) {
            let snaps: Vec<String> = pool
                .snapshots(leaf)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|s| s.name)
                .collect();
            if !snaps.is_empty() {
                pool.destroy_snapshots(leaf, &snaps)
                    .map_err(|e| format!("destroy {leaf}@{snaps:?}: {e}"))?;
            }
            pool.destroy_volume(leaf)
                .map_err(|e| format!("destroy {leaf}: {e}"))?;
        }
    }
    let all: Vec<String> = pool
        .snapshots("v")
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|s| s.name)
        .collect();
    pool.destroy_snapshots("v", &all)
        .map_err(|e| e.to_string())?;
    if pool.volumes().len() != 1 {
        return Err(format!("volumes left: {} ({report})", pool.volumes().len()));
    }
    // The queue of frees drains (a bounded part per txg; a few txgs here).
    for _ in 0..20 {
        if pool.get_prop("freeing").map_err(|e| e.to_string())? == "0" {
            break;
        }
        pool.sync().map_err(|e| e.to_string())?;
    }
    let freeing = pool.get_prop("freeing").map_err(|e| e.to_string())?;
    if freeing != "0" {
        return Err(format!(
            "freeing is still {freeing} after 20 txgs ({report})"
        ));
    }
    let audit = pool.audit().map_err(|e| format!("audit: {e}"))?;
    if !audit.is_clean() {
        return Err(format!(
            "audit after destroying all: {:?} ({report})",
            audit.problems
        ));
    }
    let space = pool.dataset_space("v").map_err(|e| e.to_string())?;
    if space.used_by_snapshots_bytes != 0 {
        return Err(format!(
            "snapshot space left: {}",
            space.used_by_snapshots_bytes
        ));
    }
    drop(v);
    pool.export().map_err(|e| e.to_string())?;
    let kind = match &in_flight {
        InFlight::Change(what, _) => what,
        InFlight::Rollback(_) => "rollback",
        InFlight::None => "nothing",
    };
    let mut counts = IN_FLIGHT.lock().unwrap();
    let (all, landed_count) = counts.entry(kind).or_default();
    *all += 1;
    *landed_count += u64::from(landed || rolled_back);
    Ok(report)
}

/// How many passed cases had each kind of change in flight at the crash, and in how many of
/// them it had landed.
static IN_FLIGHT: Mutex<BTreeMap<&'static str, (u64, u64)>> = Mutex::new(BTreeMap::new());

#[test]
fn power_loss_during_snapshot_changes() {
    run_crash_cases("snapshot_power_loss", crash_case);
    let counts = IN_FLIGHT.lock().unwrap().clone();
    println!("in flight at the crash (cases, of which landed): {counts:?}");
    // The default run (2,000 seeds, deterministic) crashes during each kind of change many
    // times, before and after it landed (at least 54 and 13 times when written); a workload
    // change that stopped reaching one fails here instead of silently testing less.
    let cases: u64 = std::env::var("OXPOOL_CRASH_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    if std::env::var("OXPOOL_CRASH_SEED").is_err() && cases >= 2000 {
        for kind in [
            "snapshot",
            "destroy",
            "destroy next to an origin",
            "destroy range",
            "rollback",
            "clone",
            "clone write",
            "destroy clone",
            "promote",
        ] {
            let (n, landed) = counts.get(kind).copied().unwrap_or_default();
            assert!(n >= 25, "only {n} crashes during {kind}");
            assert!(
                landed >= 5,
                "only {landed} crashes during {kind} after it landed"
            );
        }
    }
}
