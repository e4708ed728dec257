//! Power loss during snapshot, destroy, rollback, clone and clone destroy (the fault backend
//! of power_loss.rs: writes not covered by a completed flush are dropped, kept or torn at a
//! seeded instant). After import each snapshot and clone is exactly its model (a change that
//! was in flight is there whole or not at all), the volume holds its durable bytes or bytes
//! written after them (or, for a rollback in flight, exactly the snapshot's), and the audit
//! finds no leak, no block both free and referenced, no wrong counter. The pool then keeps
//! working: more changes, every snapshot destroyed, and a clean audit again.
//!
//! `OXPOOL_CRASH_CASES=N` runs N seeds (default 2000); `OXPOOL_CRASH_SEED=S` replays one.

mod common;

use common::{crash_devices, pattern, run_crash_cases, test_props};
use oxpool_engine::{Pool, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const DEVICE_BYTES: u64 = 32 << 20;
const VOLUME_BYTES: u64 = 256 << 10;

fn as_backends(mems: &[MemoryBackend]) -> Vec<Arc<dyn Backend>> {
    mems.iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
        .collect()
}

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

/// A change that had not returned when the power went.
enum InFlight {
    None,
    Snapshot(String, Vec<u8>),
    Destroy(String),
    Rollback(Vec<u8>),
    Clone(String, Vec<u8>),
    DestroyClone(String),
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
    pool.sync().map_err(|e| e.to_string())?;
    for m in group.members.lock().unwrap().iter() {
        m.enable_power_loss();
    }
    group
        .remaining
        .store(rng.random_range(1..500), Ordering::SeqCst);
    let mut current = vec![0u8; VOLUME_BYTES as usize];
    let mut durable = current.clone();
    let mut since: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut snaps: Vec<(String, Vec<u8>)> = Vec::new();
    let mut clones: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut in_flight = InFlight::None;
    let mut next = 0;
    // Bounded workload; it ends at the crash (the first error).
    for _ in 0..120u64 {
        next += 1;
        let r = match rng.random_range(0..14) {
            0..=5 => {
                let len = rng.random_range(1..20_000u64);
                let off = rng.random_range(0..VOLUME_BYTES - len);
                let data = pattern(rng.random(), len as usize);
                current[off as usize..(off + len) as usize].copy_from_slice(&data);
                since.push((off, data.clone()));
                block_on(vol.write(off, &data, false))
            }
            6 => {
                let r = block_on(vol.flush());
                if r.is_ok() {
                    durable = current.clone();
                    since.clear();
                }
                r
            }
            7 | 8 => {
                let name = format!("s{next}");
                let r = pool.snapshot(&[format!("v@{name}")]);
                match &r {
                    Ok(()) => {
                        snaps.push((name, current.clone()));
                        durable = current.clone();
                        since.clear();
                    }
                    Err(_) => in_flight = InFlight::Snapshot(name, current.clone()),
                }
                r
            }
            9 if !snaps.is_empty() => {
                let i = rng.random_range(0..snaps.len());
                let name = snaps[i].0.clone();
                let r = pool.destroy_snapshots("v", std::slice::from_ref(&name));
                match &r {
                    Ok(_) => {
                        snaps.remove(i);
                    }
                    Err(oxpool_engine::EngineError::Busy(_)) => continue,
                    Err(_) => in_flight = InFlight::Destroy(name),
                }
                r.map(|_| ())
            }
            10 if !snaps.is_empty() => {
                let (name, bytes) = snaps.last().unwrap().clone();
                let r = pool.rollback("v", &name, false);
                match &r {
                    Ok(()) => {
                        current = bytes.clone();
                        durable = bytes;
                        since.clear();
                    }
                    Err(_) => in_flight = InFlight::Rollback(bytes),
                }
                r
            }
            11 if !snaps.is_empty() && clones.len() < 2 => {
                let (snap, bytes) = snaps[rng.random_range(0..snaps.len())].clone();
                let c = format!("c{next}");
                let r = pool.clone_snapshot("v", &snap, &c, &[]).map(|_| ());
                match &r {
                    Ok(()) => {
                        clones.insert(c, bytes);
                    }
                    Err(_) => in_flight = InFlight::Clone(c, bytes),
                }
                r
            }
            12 if !clones.is_empty() => {
                let c = clones.keys().next().unwrap().clone();
                let r = pool.destroy_volume(&c).and_then(|()| pool.sync());
                match &r {
                    Ok(()) => {
                        clones.remove(&c);
                    }
                    Err(_) => in_flight = InFlight::DestroyClone(c),
                }
                r
            }
            _ => {
                let r = pool.sync();
                if r.is_ok() {
                    durable = current.clone();
                    since.clear();
                }
                r
            }
        };
        if r.is_err() {
            break;
        }
    }
    drop(vol);
    drop(pool);
    let mut report = String::new();
    for (i, m) in group.members.lock().unwrap().iter().enumerate() {
        let r = m.apply_power_loss(seed.wrapping_mul(31).wrapping_add(i as u64));
        report += &format!(
            "dev{i}: dropped {} kept {} torn {}; ",
            r.dropped, r.kept, r.torn
        );
    }
    let pool = Pool::import(as_backends(&mems), Some("tank"))
        .map_err(|e| format!("import after crash failed: {e} ({report})"))?;
    // Snapshots: exactly the model's, give or take the change in flight, each its bytes.
    let listed: Vec<String> = pool
        .snapshots("v")
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|s| s.name)
        .collect();
    let mut expect: Vec<(String, Vec<u8>)> = snaps.clone();
    match &in_flight {
        InFlight::Snapshot(name, bytes) if listed.contains(name) => {
            expect.push((name.clone(), bytes.clone()))
        }
        InFlight::Destroy(name) if !listed.contains(name) => expect.retain(|(n, _)| n != name),
        _ => {}
    }
    let names: Vec<String> = expect.iter().map(|(n, _)| n.clone()).collect();
    if listed != names {
        return Err(format!(
            "snapshots {listed:?}, expected {names:?} ({report})"
        ));
    }
    for (name, bytes) in &expect {
        if read(&pool, &format!("v@{name}"))? != *bytes {
            return Err(format!("v@{name} differs from its model ({report})"));
        }
    }
    // Clones.
    let mut expect_clones = clones.clone();
    match &in_flight {
        InFlight::Clone(c, bytes) if pool.volume(c).is_ok() => {
            expect_clones.insert(c.clone(), bytes.clone());
        }
        InFlight::DestroyClone(c) if pool.volume(c).is_err() => {
            expect_clones.remove(c);
        }
        _ => {}
    }
    let vols: Vec<String> = pool
        .volumes()
        .iter()
        .map(|v| v.name().to_string())
        .filter(|n| n != "v")
        .collect();
    let want: Vec<String> = expect_clones.keys().cloned().collect();
    if vols != want {
        return Err(format!("clones {vols:?}, expected {want:?} ({report})"));
    }
    for (c, bytes) in &expect_clones {
        if read(&pool, c)? != *bytes {
            return Err(format!("clone {c} differs from its origin ({report})"));
        }
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
    // The pool keeps working: a write, a snapshot, everything destroyed, a clean audit.
    let v = pool.volume("v").map_err(|e| e.to_string())?;
    block_on(v.write(0, &pattern(seed, 8192), false)).map_err(|e| e.to_string())?;
    pool.snapshot(&["v@after".into()])
        .map_err(|e| e.to_string())?;
    for c in &vols {
        pool.destroy_volume(c).map_err(|e| e.to_string())?;
    }
    let all: Vec<String> = pool
        .snapshots("v")
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|s| s.name)
        .collect();
    pool.destroy_snapshots("v", &all)
        .map_err(|e| e.to_string())?;
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
    Ok(report)
}

#[test]
fn power_loss_during_snapshot_changes() {
    run_crash_cases("snapshot_power_loss", crash_case);
}
