//! Reservations (`refreservation`, as ZFS's): a reserved volume can be written whole however
//! full the other volumes make the pool; the pool's `available` counts what reservations hold
//! unused; a change the pool has no room for (a reservation, a volume with one, its growth, a
//! snapshot that makes one whole again) is refused with nothing changed.

mod common;

use common::{audit_clean, pattern, read_all};
use oxpool_engine::{EngineError, Pool, PoolProps, Volume};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
/// Each fill writes this much at a time.
const CHUNK: u64 = 256 << 10;

fn pool_on(dev: &MemoryBackend) -> Pool {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    common::single_device_pool(Arc::new(dev.clone()), props)
}

fn prop(pool: &Pool, volume: &str, name: &str) -> String {
    match pool.get_dataset_prop(volume, name).unwrap() {
        Some(v) => v,
        None => pool.volume(volume).unwrap().get_prop(name).unwrap(),
    }
}

fn bytes_prop(pool: &Pool, volume: &str, name: &str) -> u64 {
    let v = prop(pool, volume, name);
    v.parse()
        .unwrap_or_else(|_| panic!("{volume} {name} = {v}: not a number"))
}

/// Writes `vol` from `from` in chunks until the pool refuses one (or `to` is reached);
/// returns where it stopped.
fn fill(vol: &Volume, from: u64, to: u64, seed: u64) -> u64 {
    let mut at = from;
    // Bounded by the volume's size.
    while at + CHUNK <= to {
        match block_on(vol.write(at, &pattern(seed + at, CHUNK as usize), false)) {
            Ok(()) => at += CHUNK,
            Err(e @ EngineError::NoSpace { .. }) => {
                eprintln!("fill stopped at {at}: {e}");
                return at;
            }
            Err(e) => panic!("fill at {at}: {e}"),
        }
    }
    at
}

fn no_space(r: oxpool_engine::Result<impl Sized>, what: &str) -> String {
    match r {
        Err(e @ EngineError::NoSpace { .. }) => e.to_string(),
        Err(e) => panic!("{what}: {e}, not out of space"),
        Ok(_) => panic!("{what} was not refused"),
    }
}

fn uncompressed() -> (String, String) {
    ("compression".into(), "off".into())
}

fn auto() -> (String, String) {
    ("refreservation".into(), "auto".into())
}

#[test]
fn a_reserved_volume_is_written_whole_while_another_fills_the_pool() {
    let dev = MemoryBackend::new("mem0", 64 << 20);
    let pool = pool_on(&dev);
    let available_empty = pool.available_bytes();
    let thick = pool
        .create_volume("thick", 16 * MIB, &[uncompressed(), auto()])
        .unwrap();
    // `auto`: every block once and the indirect blocks (a little over the data), and 4 MiB
    // to overwrite them with.
    let reserved = bytes_prop(&pool, "thick", "refreservation");
    assert!(
        (20 * MIB..21 * MIB).contains(&reserved),
        "auto reserved {reserved}"
    );
    // All of it unused: part of the volume's `used`, out of the pool's `available`, in the
    // volume's own.
    assert_eq!(bytes_prop(&pool, "thick", "usedbyrefreservation"), reserved);
    assert_eq!(bytes_prop(&pool, "thick", "used"), reserved);
    let available = pool.available_bytes();
    assert!(
        available + reserved <= available_empty && available_empty - available - reserved < MIB,
        "available {available_empty} before, {available} after reserving {reserved}"
    );
    assert_eq!(
        pool.volume_available_bytes("thick").unwrap(),
        available + reserved
    );
    // A sparse volume fills the pool: refused near `available`, which the reservation is
    // out of.
    let sparse = pool
        .create_volume("sparse", 60 * MIB, &[uncompressed()])
        .unwrap();
    let stopped = fill(&sparse, 0, 60 * MIB, 1);
    assert!(
        stopped < 60 * MIB && stopped <= available * 105 / 100,
        "the sparse volume wrote {stopped} with {available} available"
    );
    pool.sync().unwrap();
    assert_eq!(fill(&sparse, stopped, 60 * MIB, 1), stopped, "wrote on");
    // The reserved volume is written whole all the same (without the reservation held back
    // from the other's writes, these are refused).
    assert_eq!(fill(&thick, 0, 16 * MIB, 2), 16 * MIB);
    pool.sync().unwrap();
    // What is left is the room to overwrite it.
    let unused = bytes_prop(&pool, "thick", "usedbyrefreservation");
    assert!(
        (4 * MIB..5 * MIB).contains(&unused),
        "{unused} of {reserved} unused, written whole"
    );
    let expected: Vec<u8> = (0..16 * MIB / CHUNK)
        .flat_map(|c| pattern(2 + c * CHUNK, CHUNK as usize))
        .collect();
    assert!(read_all(&thick) == expected, "the reserved volume's data");
    // Overwritten whole, twice: each txg's frees come back as the writer waits for them.
    assert_eq!(fill(&thick, 0, 16 * MIB, 3), 16 * MIB);
    pool.sync().unwrap();
    assert_eq!(fill(&thick, 0, 16 * MIB, 4), 16 * MIB);
    pool.sync().unwrap();
    // With every free byte reserved or kept for the sync, the sparse volume can still be
    // trimmed (a free is not held to the others' reservations), and gives its space back.
    let before = pool.available_bytes();
    block_on(sparse.trim(0, 8 * MIB, false)).unwrap();
    for _ in 0..4 {
        pool.sync().unwrap();
    }
    let after = pool.available_bytes();
    assert!(
        after > before + 7 * MIB,
        "available {before} before trimming 8M, {after} after"
    );
    audit_clean(&pool, "filled");
    // Persisted: the property, and so the figures, after an export and an import.
    drop((thick, sparse));
    pool.export().unwrap();
    let pool = Pool::import(
        vec![Arc::new(dev.clone()) as Arc<dyn Backend>],
        Some("tank"),
    )
    .unwrap();
    assert_eq!(bytes_prop(&pool, "thick", "refreservation"), reserved);
    assert_eq!(
        bytes_prop(&pool, "thick", "usedbyrefreservation"),
        unused,
        "after import"
    );
    assert_eq!(prop(&pool, "sparse", "refreservation"), "none");
    audit_clean(&pool, "imported");
}

#[test]
fn what_the_pool_has_no_room_for_is_refused_with_nothing_changed() {
    let dev = MemoryBackend::new("mem0", 64 << 20);
    let pool = pool_on(&dev);
    let available = pool.available_bytes();
    // A volume whose reservation is more than is available is not made.
    let e = no_space(
        pool.create_volume("big", 128 * MIB, &[auto()]),
        "a 128M thick volume on a 64M pool",
    );
    assert!(e.contains("refreservation"), "{e}");
    assert!(pool.volume("big").is_err(), "made after all");
    assert_eq!(pool.available_bytes(), available);
    // Thin, it is made: it reserves nothing.
    pool.create_volume("big", 128 * MIB, &[]).unwrap();
    assert_eq!(prop(&pool, "big", "refreservation"), "none");
    assert_eq!(pool.available_bytes(), available);
    // A reservation set beyond what is available is refused; within, it holds.
    let half = available / 2;
    no_space(
        pool.set_volume_prop("big", "refreservation", &(available + MIB).to_string()),
        "a reservation over available",
    );
    assert_eq!(prop(&pool, "big", "refreservation"), "none");
    pool.set_volume_prop("big", "refreservation", &half.to_string())
        .unwrap();
    assert_eq!(bytes_prop(&pool, "big", "usedbyrefreservation"), half);
    assert!(pool.available_bytes() <= available - half);
    pool.set_volume_prop("big", "refreservation", "none")
        .unwrap();
    assert_eq!(pool.available_bytes(), available);
    pool.destroy_volume("big").unwrap();
    pool.sync().unwrap();

    // A thick volume grows with its reservation; a growth the pool cannot reserve is
    // refused, the size unchanged.
    let thick = pool
        .create_volume("thick", 8 * MIB, &[uncompressed(), auto()])
        .unwrap();
    let reserved_8m = bytes_prop(&pool, "thick", "refreservation");
    pool.set_volume_prop("thick", "volsize", "16M").unwrap();
    let reserved_16m = bytes_prop(&pool, "thick", "refreservation");
    assert!(
        reserved_16m > reserved_8m + 8 * MIB - MIB / 4 && reserved_16m >= 16 * MIB,
        "{reserved_8m} at 8M, {reserved_16m} at 16M"
    );
    no_space(
        pool.set_volume_prop("thick", "volsize", "128M"),
        "growing a thick volume past the pool",
    );
    assert_eq!(thick.size_bytes(), 16 * MIB);
    assert_eq!(bytes_prop(&pool, "thick", "refreservation"), reserved_16m);
    // A reservation set by hand does not follow the size.
    pool.set_volume_prop("thick", "refreservation", "12M")
        .unwrap();
    pool.set_volume_prop("thick", "volsize", "8M").unwrap();
    assert_eq!(bytes_prop(&pool, "thick", "refreservation"), 12 * MIB);
    pool.set_volume_prop("thick", "volsize", "16M").unwrap();
    pool.set_volume_prop("thick", "refreservation", "auto")
        .unwrap();
    assert_eq!(bytes_prop(&pool, "thick", "refreservation"), reserved_16m);

    // Written whole, then a snapshot: the reservation must hold all of itself again (every
    // block it has is the snapshot's too). With the pool filled by another, refused.
    assert_eq!(fill(&thick, 0, 16 * MIB, 5), 16 * MIB);
    pool.sync().unwrap();
    let sparse = pool
        .create_volume("sparse", 60 * MIB, &[uncompressed()])
        .unwrap();
    fill(&sparse, 0, 60 * MIB, 6);
    pool.sync().unwrap();
    let left = pool.available_bytes();
    assert!(left < MIB, "{left} available after the fill");
    let e = no_space(
        pool.snapshot(&["thick@one".to_string()]),
        "a snapshot of a full thick volume in a full pool",
    );
    assert!(e.contains("tank/thick"), "{e}");
    assert!(
        pool.snapshots("thick").unwrap().is_empty(),
        "taken after all"
    );
    // Room made: taken, and the reservation holds all of itself again.
    pool.destroy_volume("sparse").unwrap();
    pool.sync().unwrap();
    pool.sync().unwrap();
    pool.snapshot(&["thick@one".to_string()]).unwrap();
    assert_eq!(
        bytes_prop(&pool, "thick", "usedbyrefreservation"),
        reserved_16m
    );
    // So the volume can be overwritten whole while the snapshot keeps the old blocks, even
    // with the rest of the pool filled again.
    let sparse = pool
        .create_volume("sparse", 60 * MIB, &[uncompressed()])
        .unwrap();
    fill(&sparse, 0, 60 * MIB, 7);
    pool.sync().unwrap();
    assert_eq!(fill(&thick, 0, 16 * MIB, 8), 16 * MIB);
    pool.sync().unwrap();
    let snap = common::snap_bytes(&pool, "thick", "one");
    let expected: Vec<u8> = (0..16 * MIB / CHUNK)
        .flat_map(|c| pattern(5 + c * CHUNK, CHUNK as usize))
        .collect();
    assert!(snap == expected, "the snapshot's data");
    // A rollback makes the reservation whole again too (and what it drops comes back only
    // some txgs later): refused while the pool is full, the volume unchanged.
    let e = no_space(
        pool.rollback("thick", "one", false),
        "a rollback of a full thick volume in a full pool",
    );
    assert!(e.contains("rollback") && e.contains("tank/thick"), "{e}");
    let overwritten: Vec<u8> = (0..16 * MIB / CHUNK)
        .flat_map(|c| pattern(8 + c * CHUNK, CHUNK as usize))
        .collect();
    assert!(
        read_all(&thick) == overwritten,
        "changed by a refused rollback"
    );
    drop(sparse);
    pool.destroy_volume("sparse").unwrap();
    pool.sync().unwrap();
    pool.sync().unwrap();
    pool.rollback("thick", "one", false).unwrap();
    assert!(read_all(&thick) == expected, "rolled back");
    assert_eq!(
        bytes_prop(&pool, "thick", "usedbyrefreservation"),
        reserved_16m
    );
    // A clone reserves nothing unless told. Told `auto`, it would reserve what its origin's
    // volume does, which the pool (the volume, its snapshot and its reservation) has not
    // room for: refused, nothing made; told less, made with it.
    pool.clone_snapshot("thick", "one", "copy", &[]).unwrap();
    assert_eq!(prop(&pool, "copy", "refreservation"), "none");
    let e = no_space(
        pool.clone_snapshot("thick", "one", "thick_copy", &[auto()]),
        "a clone reserving auto",
    );
    assert!(
        e.contains("thick_copy")
            && e.contains(&format!("{:.1}M", reserved_16m as f64 / MIB as f64)),
        "{e}"
    );
    assert!(pool.volume("thick_copy").is_err(), "made after all");
    pool.clone_snapshot(
        "thick",
        "one",
        "thick_copy",
        &[("refreservation".into(), "4M".into())],
    )
    .unwrap();
    assert_eq!(
        bytes_prop(&pool, "thick_copy", "usedbyrefreservation"),
        4 * MIB
    );
    drop(thick);
    audit_clean(&pool, "refusals");
}
