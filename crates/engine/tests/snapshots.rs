//! Snapshots, clones, rollbacks, holds and destroys against a model: random sequences on
//! single, stripe and mirror pools, across export and import. Every snapshot, clone and head
//! reads back exactly its model, and the audit (every block verified, every space figure
//! recomputed, every allocated sector accounted for) finds nothing after each sequence.

mod common;

use common::*;
use oxpool_engine::{EngineError, Pool, Volume};
use oxpool_format::{TopVdevKind, DATA_START_BYTES};
use std::collections::BTreeMap;

const VOLUME_BYTES: u64 = 2 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The model: each volume's bytes, and each snapshot's (by `vol@snap`), oldest first.
#[derive(Default)]
struct Model {
    heads: BTreeMap<String, Vec<u8>>,
    snaps: BTreeMap<String, Vec<(String, Vec<u8>)>>,
    /// clone name -> (origin volume, origin snapshot)
    clones: BTreeMap<String, (String, String)>,
    /// Held snapshots: (volume, snapshot).
    held: std::collections::BTreeSet<(String, String)>,
}

fn read_all(vol: &Volume) -> Vec<u8> {
    let mut out = vec![0u8; vol.size_bytes() as usize];
    oxpool_io::rt::block_on(vol.read(0, &mut out)).unwrap();
    out
}

fn verify(pool: &Pool, m: &Model, when: &str) {
    for (name, bytes) in &m.heads {
        let vol = pool.volume(name).unwrap();
        let got = read_all(&vol);
        if got != *bytes {
            let first = got
                .iter()
                .zip(bytes.iter())
                .position(|(a, b)| a != b)
                .unwrap();
            let last = got.len()
                - got
                    .iter()
                    .rev()
                    .zip(bytes.iter().rev())
                    .position(|(a, b)| a != b)
                    .unwrap();
            panic!("{when}: head {name} differs from its model in [{first}, {last})");
        }
    }
    for (vol, snaps) in &m.snaps {
        let listed: Vec<String> = pool
            .snapshots(vol)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        let model: Vec<String> = snaps.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(listed, model, "{when}: snapshots of {vol}");
        for (snap, bytes) in snaps {
            let view = pool.snapshot_volume(vol, snap).unwrap();
            assert!(
                read_all(&view) == *bytes,
                "{when}: {vol}@{snap} differs from its model"
            );
        }
    }
    let report = pool.audit().unwrap();
    assert!(report.is_clean(), "{when}: audit: {:#?}", report.problems);
    assert!(report.trees_walked > 0);
}

fn write_random(rng: &mut Rng, vol: &Volume, model: &mut [u8]) {
    let len = 512 * (1 + rng.below(128));
    let off = 512 * rng.below((VOLUME_BYTES - len) / 512);
    let seed = rng.next();
    let (off, len) = (off as usize, len as usize);
    if std::env::var("SNAP_TRACE").is_ok() {
        eprintln!("  write/trim [{off}, {})", off + len);
    }
    match rng.below(8) {
        // A trim frees whole blocks only (partial ones are left as they are: it is advisory).
        0 => {
            oxpool_io::rt::block_on(vol.trim(off as u64, len as u64, false)).unwrap();
            let bs = vol.block_size_bytes() as usize;
            let (first, end) = (off.div_ceil(bs) * bs, (off + len) / bs * bs);
            if first < end {
                model[first..end].fill(0);
            }
        }
        1 => {
            oxpool_io::rt::block_on(vol.write_zeroes(off as u64, len as u64, false)).unwrap();
            model[off..off + len].fill(0);
        }
        _ => {
            let data = pattern(seed, len);
            oxpool_io::rt::block_on(vol.write(off as u64, &data, false)).unwrap();
            model[off..off + len].copy_from_slice(&data);
        }
    }
}

fn run_sequence(kind: TopVdevKind, devices: usize, seed: u64) {
    let (mut pool, mems) = mem_pool(kind.clone(), devices);
    let mut rng = Rng(seed | 1);
    let mut m = Model::default();
    for v in ["a", "b"] {
        pool.create_volume(v, VOLUME_BYTES, &[]).unwrap();
        m.heads
            .insert(v.to_string(), vec![0u8; VOLUME_BYTES as usize]);
        m.snaps.insert(v.to_string(), Vec::new());
    }
    let mut next_snap = 0;
    let mut next_clone = 0;
    for step in 0..60 {
        let names: Vec<String> = m.heads.keys().cloned().collect();
        let v = names[rng.below(names.len() as u64) as usize].clone();
        let when = format!("{kind:?} seed {seed} step {step}");
        let op = rng.below(20);
        if std::env::var("SNAP_TRACE").is_ok() {
            eprintln!("{when}: op {op} on {v}");
        }
        match op {
            0..=8 => {
                let vol = pool.volume(&v).unwrap();
                let model = m.heads.get_mut(&v).unwrap();
                for _ in 0..1 + rng.below(4) {
                    write_random(&mut rng, &vol, model);
                }
                if rng.below(3) == 0 {
                    pool.sync().unwrap();
                }
            }
            9..=11 => {
                // Snapshot one volume, or every volume in one call.
                next_snap += 1;
                let snap = format!("s{next_snap}");
                let targets: Vec<String> = if rng.below(2) == 0 {
                    vec![v.clone()]
                } else {
                    names
                };
                let full: Vec<String> = targets.iter().map(|t| format!("{t}@{snap}")).collect();
                pool.snapshot(&full).unwrap();
                for t in targets {
                    let bytes = m.heads[&t].clone();
                    m.snaps.get_mut(&t).unwrap().push((snap.clone(), bytes));
                }
            }
            13 => {
                // Hold or release a snapshot.
                let snaps = &m.snaps[&v];
                if snaps.is_empty() {
                    continue;
                }
                let snap = snaps[rng.below(snaps.len() as u64) as usize].0.clone();
                let key = (v.clone(), snap.clone());
                if m.held.remove(&key) {
                    pool.release("tag", &v, &snap).unwrap();
                } else {
                    pool.hold("tag", &v, &snap).unwrap();
                    m.held.insert(key);
                }
            }
            12 => {
                let snaps = &m.snaps[&v];
                if snaps.is_empty() {
                    continue;
                }
                let i = rng.below(snaps.len() as u64) as usize;
                let snap = snaps[i].0.clone();
                let cloned = m.clones.values().any(|(ov, os)| *ov == v && *os == snap)
                    || m.held.contains(&(v.clone(), snap.clone()));
                let r = pool.destroy_snapshots(&v, std::slice::from_ref(&snap));
                if cloned {
                    assert!(
                        matches!(r, Err(EngineError::Busy(_))),
                        "{when}: origin destroyed"
                    );
                } else {
                    r.unwrap();
                    m.snaps.get_mut(&v).unwrap().remove(i);
                }
            }
            14..=15 => {
                let snaps = &m.snaps[&v];
                if snaps.is_empty() {
                    continue;
                }
                let i = rng.below(snaps.len() as u64) as usize;
                let (snap, bytes) = snaps[i].clone();
                let later = &snaps[i + 1..];
                let later_cloned = later.iter().any(|(n, _)| {
                    m.clones.values().any(|(ov, os)| *ov == v && os == n)
                        || m.held.contains(&(v.clone(), n.clone()))
                });
                let r = pool.rollback(&v, &snap, true);
                if later_cloned {
                    assert!(r.is_err(), "{when}: rollback past a clone's origin");
                } else {
                    r.unwrap();
                    m.snaps.get_mut(&v).unwrap().truncate(i + 1);
                    *m.heads.get_mut(&v).unwrap() = bytes;
                }
            }
            16 => {
                let snaps = &m.snaps[&v];
                if snaps.is_empty() || m.clones.len() >= 2 {
                    continue;
                }
                let (snap, bytes) = snaps[rng.below(snaps.len() as u64) as usize].clone();
                next_clone += 1;
                let c = format!("c{next_clone}");
                pool.clone_snapshot(&v, &snap, &c, &[]).unwrap();
                m.heads.insert(c.clone(), bytes);
                m.snaps.insert(c.clone(), Vec::new());
                m.clones.insert(c, (v.clone(), snap));
            }
            17 => {
                // Destroy a clone with its snapshots (none may be an origin).
                let Some(c) = m.clones.keys().next().cloned() else {
                    continue;
                };
                if m.clones.values().any(|(ov, _)| *ov == c) {
                    continue;
                }
                let snaps: Vec<String> = m.snaps[&c].iter().map(|(n, _)| n.clone()).collect();
                for n in &snaps {
                    if m.held.remove(&(c.clone(), n.clone())) {
                        pool.release("tag", &c, n).unwrap();
                    }
                }
                if !snaps.is_empty() {
                    assert!(
                        pool.destroy_volume(&c).is_err(),
                        "{when}: volume with snapshots"
                    );
                    pool.destroy_snapshots(&c, &snaps).unwrap();
                }
                pool.destroy_volume(&c).unwrap();
                m.heads.remove(&c);
                m.snaps.remove(&c);
                m.clones.remove(&c);
            }
            19 if !m.clones.is_empty() && rng.below(2) == 0 => {
                // Promote a clone: its origin's snapshots up to the origin become its own.
                let c = m.clones.keys().next().cloned().unwrap();
                let (ov, os) = m.clones[&c].clone();
                let i = m.snaps[&ov].iter().position(|(n, _)| *n == os).unwrap();
                let collide = m.snaps[&ov][..=i]
                    .iter()
                    .any(|(n, _)| m.snaps[&c].iter().any(|(k, _)| k == n));
                let r = pool.promote(&c);
                if collide {
                    assert!(r.is_err(), "{when}: promote with colliding names");
                    continue;
                }
                r.unwrap();
                let moved: Vec<(String, Vec<u8>)> =
                    m.snaps.get_mut(&ov).unwrap().drain(..=i).collect();
                let names: Vec<String> = moved.iter().map(|(n, _)| n.clone()).collect();
                let mine = m.snaps.get_mut(&c).unwrap();
                let rest = std::mem::take(mine);
                *mine = moved;
                mine.extend(rest);
                // The origin's volume is now the clone of c@os (if it was a clone itself, c
                // takes its origin).
                let before = m.clones.remove(&c);
                let _ = before;
                if let Some(o) = m.clones.remove(&ov) {
                    m.clones.insert(c.clone(), o);
                }
                m.clones.insert(ov.clone(), (c.clone(), os));
                for (k, o) in m.clones.iter_mut() {
                    if *k != ov && o.0 == ov && names.contains(&o.1) {
                        o.0 = c.clone();
                    }
                }
                m.held = std::mem::take(&mut m.held)
                    .into_iter()
                    .map(|(hv, hs)| {
                        if hv == ov && names.contains(&hs) {
                            (c.clone(), hs)
                        } else {
                            (hv, hs)
                        }
                    })
                    .collect();
            }
            18 => {
                pool.export().unwrap();
                pool = reimport(&mems);
                verify(&pool, &m, &format!("{when} (after import)"));
            }
            _ => verify(&pool, &m, &when),
        }
        if std::env::var("SNAP_TRACE").is_ok() {
            verify(&pool, &m, &format!("{when} (traced)"));
        }
    }
    verify(&pool, &m, &format!("{kind:?} seed {seed} end"));
    // Destroying every snapshot and clone frees what only they held: the audit finds every
    // allocated sector referenced, and no snapshot space remains.
    for (hv, hs) in std::mem::take(&mut m.held) {
        pool.release("tag", &hv, &hs).unwrap();
    }
    // Clones that are no other clone's origin first (a promote can chain them).
    for _ in 0..8 {
        let leaves: Vec<String> = m
            .clones
            .keys()
            .filter(|c| !m.clones.values().any(|(ov, _)| ov == *c))
            .cloned()
            .collect();
        for c in leaves {
            let snaps: Vec<String> = m.snaps[&c].iter().map(|(n, _)| n.clone()).collect();
            if !snaps.is_empty() {
                pool.destroy_snapshots(&c, &snaps).unwrap();
            }
            pool.destroy_volume(&c).unwrap();
            m.heads.remove(&c);
            m.snaps.remove(&c);
            m.clones.remove(&c);
        }
    }
    assert!(m.clones.is_empty(), "clones left: {:?}", m.clones.keys());
    for (v, snaps) in m.snaps.iter_mut() {
        let names: Vec<String> = snaps.iter().map(|(n, _)| n.clone()).collect();
        if !names.is_empty() {
            pool.destroy_snapshots(v, &names).unwrap();
        }
        snaps.clear();
        let space = pool.dataset_space(v).unwrap();
        assert_eq!(space.used_by_snapshots_bytes, 0, "{v}: snapshot space left");
        assert_eq!(
            space.used_bytes, space.referenced_bytes,
            "{v}: used != referenced"
        );
    }
    m.clones.clear();
    verify(&pool, &m, "after destroying every snapshot");
    pool.export().unwrap();
}

#[test]
fn snapshot_sequences_on_a_single_device() {
    for seed in [1, 2, 3] {
        run_sequence(TopVdevKind::Single, 1, seed);
    }
}

#[test]
fn snapshot_sequences_on_a_stripe() {
    for seed in [4, 5] {
        run_sequence(TopVdevKind::Single, 2, seed);
    }
}

#[test]
fn snapshot_sequences_on_a_mirror() {
    for seed in [6, 7] {
        run_sequence(TopVdevKind::Mirror, 2, seed);
    }
}

/// Snapshot space figures follow the birth-txg rule exactly: a snapshot's `used` is what
/// only it holds; `written` is what changed since the snapshot before.
#[test]
fn space_figures_follow_overwrites() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume("v", VOLUME_BYTES, &[("compression".into(), "off".into())])
        .unwrap();
    let bs = vol.block_size_bytes() as usize;
    let w = |seed, off: usize, len: usize| {
        oxpool_io::rt::block_on(vol.write(off as u64, &pattern(seed, len), false)).unwrap()
    };
    w(1, 0, 8 * bs);
    pool.snapshot(&["v@one".to_string()]).unwrap();
    let one = pool.snapshots("v").unwrap()[0].clone();
    assert_eq!(
        one.used_bytes, 0,
        "nothing overwritten yet: the snapshot holds nothing alone"
    );
    assert!(one.written_bytes >= 8 * bs as u64);
    assert_eq!(
        one.referenced_bytes,
        pool.dataset_space("v").unwrap().referenced_bytes
    );
    // Overwrite two blocks: the snapshot now holds them alone.
    w(2, 0, 2 * bs);
    pool.sync().unwrap();
    let one = pool.snapshots("v").unwrap()[0].clone();
    // The two data blocks, and the indirect blocks above them (every copy).
    let unique = one.used_bytes;
    assert!(unique >= 2 * bs as u64, "two overwritten blocks: {unique}");
    assert!(
        unique <= 2 * bs as u64 + 3 * 32768 * 3,
        "more than the blocks: {unique}"
    );
    let space = pool.dataset_space("v").unwrap();
    assert_eq!(space.used_by_snapshots_bytes, unique);
    // As ZFS: the head's own share is all it references (nothing it was cloned from shares
    // it), and the snapshot's unique blocks come on top.
    assert_eq!(space.used_by_dataset_bytes, space.referenced_bytes);
    assert_eq!(space.used_bytes, space.referenced_bytes + unique);
    // Destroying the snapshot frees exactly those.
    let before = pool.status().allocated_bytes;
    assert_eq!(
        pool.destroy_estimate("v", &["one".to_string()]).unwrap(),
        unique
    );
    pool.destroy_snapshots("v", &["one".to_string()]).unwrap();
    // Frees are deferred a few txgs; sync past them.
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let after = pool.status().allocated_bytes;
    // Other blocks come and go with each txg (the pool's metadata); the audit shows that
    // nothing the snapshot held stayed allocated.
    assert!(after < before, "nothing freed: {after} of {before}");
    assert!(pool.audit().unwrap().is_clean());
}

/// Holds, clones and rollbacks refuse what would lose data, each with its reason, and change
/// nothing.
#[test]
fn refusals_say_why_and_change_nothing() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    oxpool_io::rt::block_on(vol.write(0, &pattern(1, 65536), false)).unwrap();
    pool.snapshot(&["v@a".to_string(), "v@a".to_string()])
        .unwrap_err();
    pool.snapshot(&["v@a".to_string()]).unwrap();
    pool.snapshot(&["v@b".to_string()]).unwrap();
    let err = pool.snapshot(&["v@a".to_string()]).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
    for bad in ["v", "v@", "@a", "v@a@b", "nosuch@a"] {
        assert!(pool.snapshot(&[bad.to_string()]).is_err(), "{bad} accepted");
    }
    pool.hold("keep", "v", "a").unwrap();
    let err = pool
        .destroy_snapshots("v", &["a".to_string()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("held") && err.contains("keep"), "{err}");
    let err = pool.rollback("v", "a", false).unwrap_err().to_string();
    assert!(err.contains("not the latest"), "{err}");
    pool.clone_snapshot("v", "b", "c", &[]).unwrap();
    let err = pool
        .destroy_snapshots("v", &["b".to_string()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("origin of tank/c"), "{err}");
    let err = pool.rollback("v", "a", true).unwrap_err().to_string();
    assert!(err.contains("origin of tank/c"), "{err}");
    let err = pool.destroy_volume("v").unwrap_err().to_string();
    assert!(err.contains("snapshots"), "{err}");
    // Nothing changed.
    let names: Vec<String> = pool
        .snapshots("v")
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(pool.snapshots("v").unwrap()[0].holds, ["keep"]);
    assert_eq!(pool.snapshots("v").unwrap()[1].clones, ["tank/c"]);
    assert_eq!(
        pool.dataset_space("c").unwrap().origin.as_deref(),
        Some("tank/v@b")
    );
    pool.release("keep", "v", "a").unwrap();
    pool.destroy_snapshots("v", &["a".to_string()]).unwrap();
    // A destroyed snapshot's view reads no more.
    let view = pool.snapshot_volume("v", "b").unwrap();
    assert!(
        oxpool_io::rt::block_on(view.write(0, &[1u8; 512], false)).is_err(),
        "view written"
    );
    assert!(pool.audit().unwrap().is_clean());
}

/// A scrub reads the blocks only snapshots hold and repairs them from the mirror's other
/// side; a bad copy shared by two snapshots is found and repaired once.
#[test]
fn scrub_repairs_blocks_only_a_snapshot_holds() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let vol = pool
        .create_volume("v", VOLUME_BYTES, &[("compression".into(), "off".into())])
        .unwrap();
    let bs = vol.block_size_bytes() as u64;
    oxpool_io::rt::block_on(vol.write(0, &pattern(1, VOLUME_BYTES as usize), false)).unwrap();
    pool.snapshot(&["v@old".to_string()]).unwrap();
    pool.snapshot(&["v@same".to_string()]).unwrap();
    // Overwrite everything: the old blocks are held by the snapshots alone.
    oxpool_io::rt::block_on(vol.write(0, &pattern(2, VOLUME_BYTES as usize), false)).unwrap();
    pool.sync().unwrap();
    let clean = pool.scrub().unwrap();
    assert_eq!(clean.copies_bad, 0);
    // Damage one copy of three snapshot-only blocks.
    let view = pool.snapshot_volume("v", "old").unwrap();
    for b in [0u64, 3, VOLUME_BYTES / bs - 1] {
        let bp = oxpool_io::rt::block_on(view.block_pointer(b)).unwrap();
        let d = bp.dvas()[0];
        let head = oxpool_io::rt::block_on(vol.block_pointer(b)).unwrap();
        assert_ne!(head.dvas()[0], d, "block {b} is not the snapshot's alone");
        mems[d.vdev.0 as usize].corrupt(DATA_START_BYTES + d.offset_bytes, 64, b);
    }
    let scrub = pool.scrub().unwrap();
    assert_eq!(scrub.copies_bad, 3, "{scrub:?}");
    assert_eq!(scrub.copies_repaired, 3, "{scrub:?}");
    assert_eq!(pool.scrub().unwrap().copies_bad, 0);
    assert!(pool.audit().unwrap().is_clean());
}

/// Destroyed snapshots' blocks go through the persistent queue of frees: `freeing` counts
/// them until the next txgs drain it, across an export and import too.
#[test]
fn freeing_counts_down_to_zero_across_an_import() {
    let (mut pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume("v", VOLUME_BYTES, &[("compression".into(), "off".into())])
        .unwrap();
    oxpool_io::rt::block_on(vol.write(0, &pattern(1, VOLUME_BYTES as usize), false)).unwrap();
    pool.snapshot(&["v@a".to_string()]).unwrap();
    oxpool_io::rt::block_on(vol.write(0, &pattern(2, VOLUME_BYTES as usize), false)).unwrap();
    pool.sync().unwrap();
    let held = pool.snapshots("v").unwrap()[0].used_bytes;
    assert!(held >= VOLUME_BYTES, "{held}");
    assert_eq!(pool.get_prop("freeing").unwrap(), "0");
    pool.destroy_snapshots("v", &["a".to_string()]).unwrap();
    // Queued by the destroy's txg, not freed yet.
    let freeing: u64 = pool.get_prop("freeing").unwrap().parse().unwrap();
    assert_eq!(freeing, held, "freeing {freeing}, the snapshot held {held}");
    assert!(pool.audit().unwrap().is_clean());
    drop(vol);
    // The queue is persistent: an import finds it and drains it.
    pool.export().unwrap();
    pool = reimport(&mems);
    for _ in 0..20 {
        if pool.get_prop("freeing").unwrap() == "0" {
            break;
        }
        pool.sync().unwrap();
    }
    assert_eq!(pool.get_prop("freeing").unwrap(), "0");
    assert!(pool.audit().unwrap().is_clean());
}

/// `destroy -d` marks a held or cloned snapshot, which goes with its last hold and clone; one
/// that can go now goes now.
#[test]
fn deferred_destroy_waits_for_the_last_hold_and_clone() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    oxpool_io::rt::block_on(vol.write(0, &pattern(1, 65536), false)).unwrap();
    pool.snapshot(&["v@a".to_string(), "v@b".to_string()][..1])
        .unwrap();
    pool.snapshot(&["v@b".to_string()]).unwrap();
    pool.hold("keep", "v", "a").unwrap();
    pool.clone_snapshot("v", "a", "c", &[]).unwrap();
    let (now, marked) = pool
        .destroy_snapshots_deferred("v", &["a".to_string(), "b".to_string()])
        .unwrap();
    assert_eq!(
        (now, marked),
        (vec!["b".to_string()], vec!["a".to_string()])
    );
    let snaps = pool.snapshots("v").unwrap();
    assert_eq!(snaps.len(), 1);
    assert!(snaps[0].defer_destroy);
    // Persistent: still marked after an import.
    drop(vol);
    pool.export().unwrap();
    let pool = reimport(&mems);
    assert!(pool.snapshots("v").unwrap()[0].defer_destroy);
    pool.release("keep", "v", "a").unwrap();
    assert_eq!(
        pool.snapshots("v").unwrap().len(),
        1,
        "the clone still needs it"
    );
    pool.destroy_volume("c").unwrap();
    assert!(
        pool.snapshots("v").unwrap().is_empty(),
        "not destroyed with its last clone"
    );
    assert!(pool.audit().unwrap().is_clean());
}

/// Bytes the pool's devices have written so far.
fn bytes_written(pool: &Pool) -> u64 {
    pool.counters()
        .device_stats()
        .iter()
        .map(|d| d.io.write.bytes)
        .sum()
}

/// Bytes written by taking snapshot `name` of an idle volume.
fn snapshot_cost_bytes(pool: &Pool, name: &str) -> u64 {
    pool.sync().unwrap();
    let before = bytes_written(pool);
    pool.snapshot(&[name.to_string()]).unwrap();
    bytes_written(pool) - before
}

/// The snapshot table lives in blocks of its own, rewritten only where it changes: taking a
/// snapshot with hundreds of others writes about what it writes with none (when the records
/// were in the pool's metadata block, every txg rewrote them all, three copies each), and the
/// table survives export and import with every change made to it (a destroy in the middle,
/// a hold).
#[test]
fn snapshot_table_writes_do_not_grow_with_the_snapshot_count() {
    let (mut pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    oxpool_io::rt::block_on(vol.write(0, &pattern(1, 65536), false)).unwrap();
    let first = snapshot_cost_bytes(&pool, "v@s0");
    const COUNT: usize = 300;
    for i in 1..COUNT {
        // A few blocks killed between snapshots, so their deadlists are not empty.
        if i % 10 == 0 {
            oxpool_io::rt::block_on(vol.write(
                (i as u64 % 16) * 4096,
                &pattern(i as u64, 4096),
                false,
            ))
            .unwrap();
        }
        pool.snapshot(&[format!("v@s{i}")]).unwrap();
    }
    let later = snapshot_cost_bytes(&pool, &format!("v@s{COUNT}"));
    eprintln!("snapshot create wrote {first} bytes with no other snapshot, {later} with {COUNT}");
    assert!(
        later <= first + 64 * 1024,
        "a snapshot with {COUNT} others wrote {later} bytes, with none {first}"
    );
    pool.destroy_snapshots("v", &["s150".to_string()]).unwrap();
    pool.hold("keep", "v", "s7").unwrap();
    assert!(pool.audit().unwrap().is_clean());
    let names = |pool: &Pool| -> Vec<String> {
        pool.snapshots("v")
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect()
    };
    let before = names(&pool);
    assert_eq!(before.len(), COUNT);
    drop(vol);
    pool.export().unwrap();
    pool = reimport(&mems);
    assert_eq!(names(&pool), before);
    assert!(!before.contains(&"s150".to_string()));
    assert!(matches!(
        pool.destroy_snapshots("v", &["s7".to_string()]),
        Err(EngineError::Busy(_))
    ));
    pool.release("keep", "v", "s7").unwrap();
    pool.destroy_snapshots("v", &["s7".to_string()]).unwrap();
    assert!(pool.audit().unwrap().is_clean());
}

/// The model of `written_since_a_snapshot_counts_what_is_newer`: per tree, for each 4 KiB
/// block, the epoch it was last changed in (written or trimmed) and whether it holds data.
/// The epoch counts the snapshots taken before: a block changed after snapshot `S` has an
/// epoch above `S`'s (txgs only grow, so this is "born after S.txg").
#[derive(Clone)]
struct EpochTree {
    changed: Vec<Option<u32>>,
    data: Vec<bool>,
}

impl EpochTree {
    fn new(blocks: usize) -> EpochTree {
        EpochTree {
            changed: vec![None; blocks],
            data: vec![false; blocks],
        }
    }

    /// Bytes of its data blocks changed after `epoch` (compression off: 4 KiB each).
    fn data_after(&self, epoch: u32) -> u64 {
        (0..self.data.len())
            .filter(|&b| self.data[b] && self.changed[b].is_some_and(|e| e > epoch))
            .count() as u64
            * 4096
    }

    /// At most the bytes of the indirect blocks rewritten after `epoch`: the level-1 blocks
    /// above a changed block, and the levels above them (two levels suffice: 512 blocks of
    /// 255 per indirect block), each 32 KiB, two copies.
    fn indirect_after_max(&self, epoch: u32) -> u64 {
        let l1: std::collections::BTreeSet<usize> = (0..self.changed.len())
            .filter(|&b| self.changed[b].is_some_and(|e| e > epoch))
            .map(|b| b / oxpool_format::INDIRECT_FANOUT)
            .collect();
        if l1.is_empty() {
            return 0;
        }
        (l1.len() as u64 + 1) * 2 * 32768
    }
}

/// `written@SNAP` of volumes and of snapshots, against every older snapshot of their line:
/// through overwrites, trims, a destroy in the middle (merged deadlists), a clone (its
/// origin's snapshots by full name), a promote (the snapshots move with it) and an import.
/// Each figure is checked three ways: the audit recomputes every pair from its walk of the
/// trees (bytes born after the snapshot's txg) and must have checked them all; it covers
/// the data blocks the model says changed since, plus at most their indirect blocks (and is
/// 0 when nothing changed); and against the snapshot just before, it is that tree's
/// `written`. `logicalreferenced` of each snapshot is its data blocks' bytes.
#[test]
fn written_since_a_snapshot_counts_what_is_newer() {
    const BS: u64 = 4096;
    let blocks = (VOLUME_BYTES / BS) as usize;
    let (mut pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let props = [
        ("compression".to_string(), "off".to_string()),
        ("volblocksize".to_string(), BS.to_string()),
    ];
    pool.create_volume("v", VOLUME_BYTES, &props).unwrap();
    // Heads and snapshots (`vol@snap`) with their models; snapshots with their epoch.
    let mut heads: BTreeMap<String, EpochTree> = BTreeMap::new();
    heads.insert("v".into(), EpochTree::new(blocks));
    let mut snaps: BTreeMap<String, (u32, EpochTree)> = BTreeMap::new();
    let mut epoch = 0u32;
    let change = |pool: &Pool,
                  heads: &mut BTreeMap<String, EpochTree>,
                  epoch: u32,
                  vol: &str,
                  first: usize,
                  count: usize,
                  trim: bool| {
        let v = pool.volume(vol).unwrap();
        let (off, len) = (first as u64 * BS, count as u64 * BS);
        if trim {
            oxpool_io::rt::block_on(v.trim(off, len, false)).unwrap();
        } else {
            let data = pattern(u64::from(epoch) << 32 | first as u64, len as usize);
            oxpool_io::rt::block_on(v.write(off, &data, false)).unwrap();
        }
        let m = heads.get_mut(vol).unwrap();
        for b in first..first + count {
            m.changed[b] = Some(epoch);
            m.data[b] = !trim;
        }
    };
    let snapshot = |pool: &Pool,
                    heads: &BTreeMap<String, EpochTree>,
                    snaps: &mut BTreeMap<String, (u32, EpochTree)>,
                    epoch: &mut u32,
                    full: &str| {
        pool.snapshot(&[full.to_string()]).unwrap();
        let vol = full.split_once('@').unwrap().0;
        snaps.insert(full.to_string(), (*epoch, heads[vol].clone()));
        *epoch += 1;
    };
    // `line`: the trees, oldest first, each older one a snapshot (`vol@snap` or a head).
    let check = |pool: &Pool,
                 heads: &BTreeMap<String, EpochTree>,
                 snaps: &BTreeMap<String, (u32, EpochTree)>,
                 line: &[&str],
                 when: &str| {
        for (m, x) in line.iter().enumerate() {
            let model = match snaps.get(*x) {
                Some((_, t)) => t,
                None => &heads[*x],
            };
            let vol = x.split_once('@').map_or(*x, |(v, _)| v);
            for o in &line[..m] {
                let (o_epoch, _) = snaps[*o];
                // A snapshot of the same volume by its short name, an origin's by full name.
                let since = match o.split_once('@') {
                    Some((ov, s)) if ov == vol => s.to_string(),
                    _ => o.to_string(),
                };
                let got = pool.written_since(x, &since).unwrap();
                let via_get: u64 = pool
                    .get_dataset_prop(x, &format!("written@{since}"))
                    .unwrap()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(got, via_get, "{when}: {x} written@{since}");
                let data = model.data_after(o_epoch);
                let indirect_max = model.indirect_after_max(o_epoch);
                assert!(
                    got >= data && got <= data + indirect_max,
                    "{when}: {x} written@{since} is {got}: data changed since {data}, \
                     indirect at most {indirect_max}"
                );
                assert_eq!(got == 0, indirect_max == 0, "{when}: {x} written@{since}");
            }
            // Against the snapshot just before: that tree's own `written`.
            if m > 0 {
                let since = line[m - 1];
                let written: u64 = pool
                    .get_dataset_prop(x, "written")
                    .unwrap()
                    .unwrap()
                    .parse()
                    .unwrap();
                let short = since.split_once('@').unwrap().1;
                let name = if since.starts_with(&format!("{vol}@")) {
                    short.to_string()
                } else {
                    since.to_string()
                };
                assert_eq!(
                    pool.written_since(x, &name).unwrap(),
                    written,
                    "{when}: {x} written@{name} and written"
                );
            }
            if let Some((vol, snap)) = x.split_once('@') {
                let lref: u64 = pool
                    .get_dataset_prop(x, "logicalreferenced")
                    .unwrap()
                    .unwrap()
                    .parse()
                    .unwrap();
                let blocks_with_data = model.data.iter().filter(|d| **d).count() as u64;
                assert_eq!(lref, blocks_with_data * BS, "{when}: {vol}@{snap}");
            }
        }
        let report = pool.audit().unwrap();
        assert!(report.is_clean(), "{when}: {:#?}", report.problems);
        // Every volume and snapshot against every older one of its line (origins' trees
        // counted with their own volume).
        let pairs: u64 = heads
            .keys()
            .map(|h| {
                let l = pool_line(pool, h);
                let own = l
                    .iter()
                    .filter(|g| g.split_once('@').map_or(g.as_str(), |(v, _)| v) == h)
                    .count();
                let first_own = l.len() - own;
                (first_own..l.len()).map(|m| m as u64).sum::<u64>()
            })
            .sum();
        assert_eq!(report.written_since_checked, pairs, "{when}: pairs audited");
    };

    change(&pool, &mut heads, epoch, "v", 0, 64, false);
    snapshot(&pool, &heads, &mut snaps, &mut epoch, "v@s1");
    change(&pool, &mut heads, epoch, "v", 0, 16, false);
    change(&pool, &mut heads, epoch, "v", 300, 10, false);
    snapshot(&pool, &heads, &mut snaps, &mut epoch, "v@s2");
    // Nothing changes between s2 and s3: written@s2 of s3 is 0.
    snapshot(&pool, &heads, &mut snaps, &mut epoch, "v@s3");
    change(&pool, &mut heads, epoch, "v", 300, 5, true);
    change(&pool, &mut heads, epoch, "v", 8, 16, false);
    snapshot(&pool, &heads, &mut snaps, &mut epoch, "v@s4");
    change(&pool, &mut heads, epoch, "v", 30, 10, false);
    pool.sync().unwrap();
    check(
        &pool,
        &heads,
        &snaps,
        &["v@s1", "v@s2", "v@s3", "v@s4", "v"],
        "overwrites",
    );
    // Not older, unknown, another line: one-line errors.
    let e = pool.written_since("v@s2", "s4").unwrap_err().to_string();
    assert!(e.contains("not older"), "{e}");
    let e = pool.written_since("v@s2", "s2").unwrap_err().to_string();
    assert!(e.contains("not older"), "{e}");
    let e = pool.written_since("v", "nosuch").unwrap_err().to_string();
    assert_eq!(e, "tank/v@nosuch: not found");
    assert!(pool.written_since("v", "").is_err());

    // A destroy in the middle: s3's deadlist holds what s2 alone held; merged into s4's.
    pool.destroy_snapshots("v", &["s2".to_string()]).unwrap();
    snaps.remove("v@s2");
    check(
        &pool,
        &heads,
        &snaps,
        &["v@s1", "v@s3", "v@s4", "v"],
        "after destroying s2",
    );

    // A clone of s3, written and snapshotted: its line runs through v's snapshots.
    pool.clone_snapshot("v", "s3", "c", &[]).unwrap();
    heads.insert("c".into(), snaps["v@s3"].1.clone());
    change(&pool, &mut heads, epoch, "c", 200, 10, false);
    change(&pool, &mut heads, epoch, "c", 40, 4, true);
    snapshot(&pool, &heads, &mut snaps, &mut epoch, "c@t1");
    change(&pool, &mut heads, epoch, "c", 0, 4, false);
    change(&pool, &mut heads, epoch, "v", 60, 4, false);
    pool.sync().unwrap();
    check(
        &pool,
        &heads,
        &snaps,
        &["v@s1", "v@s3", "v@s4", "v"],
        "v with a clone",
    );
    check(
        &pool,
        &heads,
        &snaps,
        &["v@s1", "v@s3", "c@t1", "c"],
        "the clone",
    );
    let e = pool.written_since("c", "v@s4").unwrap_err().to_string();
    assert!(e.contains("does not descend"), "{e}");
    // usedbydataset, as ZFS's: a clone's own share is what its origin does not share
    // (written@ORIGIN); a volume that is no clone owns all it references.
    let used_by_dataset =
        |pool: &Pool, v: &str| pool.dataset_space(v).unwrap().used_by_dataset_bytes;
    let c_own = pool.written_since("c", "v@s3").unwrap();
    assert_eq!(used_by_dataset(&pool, "c"), c_own);
    assert!(c_own > 0 && c_own < pool.dataset_space("c").unwrap().referenced_bytes);
    assert_eq!(
        used_by_dataset(&pool, "v"),
        pool.dataset_space("v").unwrap().referenced_bytes
    );

    // Promote: s1 and s3 move to c, v becomes a clone of c@s3.
    pool.promote("c").unwrap();
    for s in ["s1", "s3"] {
        let t = snaps.remove(&format!("v@{s}")).unwrap();
        snaps.insert(format!("c@{s}"), t);
    }
    let promoted = |pool: &Pool, heads: &_, snaps: &_, when: &str| {
        check(pool, heads, snaps, &["c@s1", "c@s3", "c@t1", "c"], when);
        check(pool, heads, snaps, &["c@s1", "c@s3", "v@s4", "v"], when);
    };
    promoted(&pool, &heads, &snaps, "after promote");
    // Now v is the clone (of c@s3), and c owns all it references.
    assert_eq!(
        pool.dataset_space("v").unwrap().used_by_dataset_bytes,
        pool.written_since("v", "c@s3").unwrap()
    );
    assert_eq!(
        pool.dataset_space("c").unwrap().used_by_dataset_bytes,
        pool.dataset_space("c").unwrap().referenced_bytes
    );
    // The figures are those recorded: the same after an import.
    pool.export().unwrap();
    pool = reimport(&mems);
    promoted(&pool, &heads, &snaps, "after import");
}

/// The names of `volume`'s line, oldest first (for counting the audit's pairs).
fn pool_line(pool: &Pool, volume: &str) -> Vec<String> {
    let mut out = vec![volume.to_string()];
    let mut vol = volume.to_string();
    let mut upto: Option<String> = None;
    // Bounded by the volumes: each step goes to an origin's volume.
    for _ in 0..pool.volumes().len() {
        let snaps = pool.snapshots(&vol).unwrap();
        let end = match &upto {
            Some(s) => snaps.iter().position(|x| x.name == *s).unwrap() + 1,
            None => snaps.len(),
        };
        for s in snaps[..end].iter().rev() {
            out.push(format!("{vol}@{}", s.name));
        }
        let Some(origin) = pool.dataset_space(&vol).unwrap().origin else {
            break;
        };
        let (ov, os) = origin.split_once('@').unwrap();
        vol = ov.strip_prefix("tank/").unwrap().to_string();
        upto = Some(os.to_string());
    }
    out.reverse();
    out
}

/// A read that is loading an indirect block when a rollback replaces the volume's tree must
/// not leave that block of the old tree in the new one: reads after the rollback return the
/// snapshot's bytes, not the rolled-back ones (whose places the rollback freed).
#[test]
fn a_read_loading_the_tree_during_a_rollback_leaves_nothing_of_the_old_tree() {
    use oxpool_io::{Backend, FaultBackend};
    use std::sync::Arc;
    use std::time::Duration;
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    let at_snapshot = content(Fill::Random, 1, VOLUME_BYTES as usize);
    write(&vol, 0, &at_snapshot);
    pool.snapshot(&["v@s".to_string()]).unwrap();
    write(&vol, 0, &content(Fill::Random, 2, VOLUME_BYTES as usize));
    drop(vol);
    pool.export().unwrap();
    // Imported again, so that no indirect block is cached; reads are slowed at will.
    let fault = Arc::new(FaultBackend::new(Arc::new(mems[0].clone()), 1));
    let pool = Pool::import(vec![fault.clone() as Arc<dyn Backend>], Some("tank")).unwrap();
    let vol = pool.volume("v").unwrap();
    let reads_before = fault.stats().reads;
    fault.set_read_latency(Duration::from_millis(4000));
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut buf = vec![0u8; 4096];
            oxpool_io::rt::block_on(vol.read(0, &mut buf)).unwrap();
        });
        // Until the reader's indirect-block read is issued (bounded: 10 s).
        for _ in 0..10_000 {
            if fault.stats().reads > reads_before {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            fault.stats().reads > reads_before,
            "the reader read nothing"
        );
        // The reader's read keeps its latency; the rollback's reads go fast, so the swap
        // comes while the reader is still loading.
        fault.set_read_latency(Duration::ZERO);
        pool.rollback("v", "s", false).unwrap();
        reader.join().unwrap();
    });
    assert!(
        read_all(&vol) == at_snapshot,
        "the volume after the rollback is not @s"
    );
    audit_clean(&pool, "after the rollback");
}
