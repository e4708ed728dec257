//! raidz1, raidz2 and raidz3 as top-level vdevs of a pool: written through the engine, read
//! back after export and import; reads right with up to `parity` devices failing (I/O
//! errors, a device missing, a device's data silently overwritten), the damage repaired by
//! reads and scrubs; with one device more than the parity failing, errors, never wrong data.

mod common;

use common::{mem_pool, pattern, raidz, reimport, test_props, DEVICE_BYTES};
use oxpool_engine::{Pool, TopSpec, Volume};
use oxpool_format::{data_end_bytes, TopVdevKind, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use std::sync::Arc;

/// Volume size: small enough to stay fast, large enough for a few hundred blocks.
const VOLUME_BYTES: u64 = 6 << 20;

/// (parity, width): the narrowest of each allowed, and a wider raidz2.
const SHAPES: [(u8, usize); 4] = [(1, 3), (2, 5), (2, 8), (3, 7)];

/// Writes at pseudo-random offsets and sizes (not multiples of anything) over a volume, some
/// synced in between (several txgs), into `model` too.
fn random_writes(v: &Volume, model: &mut [u8], seed: u64, count: usize) {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..count {
        let len = (next() % 70_000 + 1) as usize;
        let off = (next() % (model.len() as u64 - len as u64)) as usize;
        let data = pattern(next(), len);
        block_on(v.write(off as u64, &data, false)).unwrap();
        model[off..off + len].copy_from_slice(&data);
        if i % 16 == 15 {
            block_on(v.flush()).unwrap();
        }
    }
}

fn read_all(v: &Volume) -> oxpool_engine::Result<Vec<u8>> {
    let mut got = vec![0u8; v.size_bytes() as usize];
    block_on(v.read(0, &mut got))?;
    Ok(got)
}

/// A pool of one raidz vdev over memory devices, its volume written with random writes.
fn written_pool(parity: u8, width: usize, seed: u64) -> (Pool, Vec<MemoryBackend>, Vec<u8>) {
    let (pool, mems) = mem_pool(raidz(parity), width);
    let v = pool
        .create_volume(
            "v",
            VOLUME_BYTES,
            &[("compression".to_string(), "off".to_string())],
        )
        .unwrap();
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    // The whole volume first, so every block exists; then overwrites.
    let base = pattern(seed, VOLUME_BYTES as usize);
    block_on(v.write(0, &base, false)).unwrap();
    model.copy_from_slice(&base);
    random_writes(&v, &mut model, seed ^ 0x5eed, 60);
    drop(v);
    (pool, mems, model)
}

/// Overwrites device `mem`'s whole data area with other bytes, its labels kept (so the pool
/// still finds it): every column it holds is silently wrong.
fn overwrite_data_area(mem: &MemoryBackend, seed: u64) {
    let end = data_end_bytes(mem.size_bytes());
    let mut off = DATA_START_BYTES;
    while off < end {
        let len = (1u64 << 20).min(end - off);
        mem.corrupt(off, len as usize, seed ^ off);
        off += len;
    }
}

#[test]
fn raidz_pools_round_trip_through_export_and_import() {
    for (parity, width) in SHAPES {
        let (pool, mems, model) =
            written_pool(parity, width, u64::from(parity) * 31 + width as u64);
        let s = pool.status();
        assert_eq!(s.vdevs[0].name, format!("raidz{parity}-0"));
        assert_eq!(s.vdevs[0].children.len(), width);
        assert_eq!(s.state, "ONLINE");
        assert!(s.reasons.is_empty());
        // The raw size, parity included, as `zpool list` shows a raidz: every child's data
        // area (at 4 KiB sectors).
        let child = (data_end_bytes(DEVICE_BYTES) - DATA_START_BYTES) / 4096 * 4096;
        assert_eq!(s.size_bytes, width as u64 * child);
        pool.export().unwrap();
        let pool = reimport(&mems);
        let v = pool.volume("v").unwrap();
        assert!(
            read_all(&v).unwrap() == model,
            "raidz{parity} of {width}: wrong data"
        );
        // Nothing was damaged: no error anywhere, and a scrub (every column, the parity
        // checked) agrees.
        let scrub = pool.scrub().unwrap();
        assert_eq!((scrub.copies_bad, scrub.blocks_lost), (0, 0), "{scrub:?}");
        for c in &pool.status().vdevs[0].children {
            assert_eq!((c.read_errors, c.checksum_errors), (0, 0), "{c:?}");
        }
        drop(v);
        pool.export().unwrap();
    }
}

/// Parity costs space as ZFS's layout says: a 16 KiB block on a 5-wide raidz2 takes 4 data
/// sectors in 2 rows of 3 and 2 parity sectors per row, 8, rounded up to a multiple of
/// parity + 1: 9 sectors, 36 KiB charged to the volume per block; on a 3-wide raidz1, 4 + 2 = 6 sectors too; on a 7-wide raidz3, 4 + 3 = 7,
/// rounded up to 8.
#[test]
fn allocation_follows_the_raidz_asize_rule() {
    for (parity, width, sectors) in [(2u8, 5usize, 9u64), (1, 3, 6), (3, 7, 8)] {
        let (pool, _mems) = mem_pool(raidz(parity), width);
        let v = pool
            .create_volume(
                "v",
                4 << 20,
                &[("compression".to_string(), "off".to_string())],
            )
            .unwrap();
        block_on(v.write(0, &pattern(1, 16 << 10), false)).unwrap();
        pool.sync().unwrap();
        let one = v.used_bytes();
        // 63 more blocks under the same indirect block (rewritten at the same size).
        block_on(v.write(16 << 10, &pattern(2, 63 * (16 << 10)), false)).unwrap();
        pool.sync().unwrap();
        assert_eq!(
            v.used_bytes() - one,
            63 * sectors * 4096,
            "raidz{parity} of {width}"
        );
        drop(v);
        pool.export().unwrap();
    }
}

#[test]
fn reads_survive_up_to_parity_failing_devices() {
    for (parity, width) in SHAPES {
        let (pool, mems, model) = written_pool(parity, width, 77 + width as u64);
        pool.export().unwrap();
        for k in 1..=usize::from(parity) {
            // `k` devices failing every read, starting at a different child each time.
            let faults: Vec<Arc<FaultBackend>> = mems
                .iter()
                .enumerate()
                .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64)))
                .collect();
            let devices: Vec<Arc<dyn Backend>> = faults
                .iter()
                .map(|f| Arc::clone(f) as Arc<dyn Backend>)
                .collect();
            let pool = Pool::import(devices, Some("tank")).unwrap();
            pool.set_prop("data_cache_max", "0").unwrap();
            // Children 2.. hold data columns of every block (blocks are placed in slots
            // aligned to a power of two sectors, so on a width of 8 every 16 KiB block starts
            // at child 0: P and Q on children 0 and 1; see docs/raidz.md).
            let failing: Vec<usize> = (0..k).map(|j| (2 + j) % width).collect();
            for &i in &failing {
                faults[i].set_read_error_probability(1.0);
            }
            let v = pool.volume("v").unwrap();
            let got =
                read_all(&v).unwrap_or_else(|e| panic!("raidz{parity}/{width}, {k} failing: {e}"));
            assert!(
                got == model,
                "raidz{parity}/{width}, {k} failing: wrong data"
            );
            let s = pool.status();
            for &i in &failing {
                assert!(s.vdevs[0].children[i].read_errors > 0, "{s:?}");
            }
            // The devices are fixed (the faults go with this import): back in service.
            pool.clear(None).unwrap();
            drop(v);
            pool.export().unwrap();
        }
        // Devices missing altogether (removed): `parity` of them.
        let present: Vec<Arc<dyn Backend>> = mems
            .iter()
            .skip(usize::from(parity))
            .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
            .collect();
        let pool = Pool::import(present, Some("tank")).unwrap();
        let s = pool.status();
        assert_eq!(s.state, "DEGRADED", "{s:?}");
        assert_eq!(s.vdevs[0].state, "DEGRADED", "{s:?}");
        let gone: Vec<String> = (0..usize::from(parity))
            .map(|i| format!("mem{i} UNAVAIL"))
            .collect();
        assert_eq!(
            s.reasons,
            [format!(
                "raidz{parity}-0: {parity} of its devices out of service ({}); it runs from \
                 its redundancy and can lose 0 more",
                gone.join(", ")
            )]
        );
        let v = pool.volume("v").unwrap();
        assert!(
            read_all(&v).unwrap() == model,
            "raidz{parity}/{width} with devices missing"
        );
        drop(v);
        pool.export().unwrap();
        // One more missing: import refuses, naming what is missing.
        let present: Vec<Arc<dyn Backend>> = mems
            .iter()
            .skip(usize::from(parity) + 1)
            .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
            .collect();
        let err = Pool::import(present, Some("tank"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(&format!(
                "raidz{parity}-0 can lose {parity} of its devices, {} are missing (mem0",
                parity + 1
            )),
            "{err}"
        );
    }
}

/// Up to `parity` devices' data silently overwritten (no device reports an error): reads find
/// the bad columns by combinatorial reconstruction, count them, and return the right data; a
/// scrub repairs every damaged column, a second finds nothing; and the repaired devices then
/// carry the pool alone with `parity` other devices failing.
#[test]
fn silent_damage_is_found_and_a_scrub_repairs_it() {
    for (parity, width) in SHAPES {
        let (pool, mems, model) = written_pool(parity, width, 1234 + width as u64);
        pool.export().unwrap();
        let damaged: Vec<usize> = (0..usize::from(parity)).map(|j| (2 + j) % width).collect();
        for &i in &damaged {
            overwrite_data_area(&mems[i], i as u64 + 99);
        }
        // Import reads (and repairs) the pool's metadata; the volume's blocks are the scrub's.
        let pool = reimport(&mems);
        pool.set_prop("data_cache_max", "0").unwrap();
        let devices_repaired = |pool: &Pool| -> u64 {
            pool.status().vdevs[0]
                .children
                .iter()
                .map(|c| c.repaired_bytes)
                .sum()
        };
        let before = devices_repaired(&pool);
        let scrub = pool.scrub().unwrap();
        assert_eq!(scrub.blocks_lost, 0, "{scrub:?}");
        assert!(scrub.copies_bad > 0, "{scrub:?}");
        assert_eq!(scrub.copies_bad, scrub.copies_repaired, "{scrub:?}");
        // The scrub's "repaired" is what the devices count: the bad columns' bytes, not the
        // whole raidz copies they belong to.
        let status = pool.scan_status().expect("a scrub ran");
        assert_eq!(
            status.repaired_bytes,
            devices_repaired(&pool) - before,
            "raidz{parity}/{width}"
        );
        let s = pool.status();
        for &i in &damaged {
            assert!(s.vdevs[0].children[i].checksum_errors > 0, "{s:?}");
        }
        let again = pool.scrub().unwrap();
        assert_eq!((again.copies_bad, again.blocks_lost), (0, 0), "{again:?}");
        let v = pool.volume("v").unwrap();
        assert!(
            read_all(&v).unwrap() == model,
            "raidz{parity}/{width}: wrong data"
        );
        let repaired: u64 = damaged
            .iter()
            .map(|&i| pool.status().vdevs[0].children[i].repaired_bytes)
            .sum();
        assert!(repaired > 0);
        drop(v);
        pool.export().unwrap();

        // The damaged devices hold their columns again: fail `parity` others.
        let faults: Vec<Arc<FaultBackend>> = mems
            .iter()
            .enumerate()
            .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64)))
            .collect();
        let devices: Vec<Arc<dyn Backend>> = faults
            .iter()
            .map(|f| Arc::clone(f) as Arc<dyn Backend>)
            .collect();
        let pool = Pool::import(devices, Some("tank")).unwrap();
        pool.set_prop("data_cache_max", "0").unwrap();
        let others: Vec<usize> = (0..width).filter(|i| !damaged.contains(i)).collect();
        for &i in others.iter().take(usize::from(parity)) {
            faults[i].set_read_error_probability(1.0);
        }
        let v = pool.volume("v").unwrap();
        assert!(
            read_all(&v).unwrap() == model,
            "raidz{parity}/{width}: not repaired"
        );
        drop(v);
        pool.export().unwrap();
    }
}

/// One device more than the parity failing: reads of the blocks with columns on all of them
/// fail with an error naming the vdev; no read ever returns wrong bytes.
#[test]
fn one_failure_beyond_parity_is_an_error_never_wrong_data() {
    for (parity, width) in SHAPES {
        let (pool, mems, model) = written_pool(parity, width, 4321 + width as u64);
        pool.export().unwrap();
        let faults: Vec<Arc<FaultBackend>> = mems
            .iter()
            .enumerate()
            .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64)))
            .collect();
        let devices: Vec<Arc<dyn Backend>> = faults
            .iter()
            .map(|f| Arc::clone(f) as Arc<dyn Backend>)
            .collect();
        let pool = Pool::import(devices, Some("tank")).unwrap();
        pool.set_prop("data_cache_max", "0").unwrap();
        let v = pool.volume("v").unwrap();
        // The tree's indirect blocks are read (and kept) before the devices fail.
        assert!(read_all(&v).unwrap() == model);
        for f in faults.iter().take(usize::from(parity) + 1) {
            f.set_read_error_probability(1.0);
        }
        let (mut failed, mut right) = (0, 0);
        for (b, want) in model.chunks(16 << 10).enumerate() {
            let mut got = vec![0u8; want.len()];
            match block_on(v.read(b as u64 * (16 << 10), &mut got)) {
                Ok(()) => {
                    assert!(got == want, "block {b}: wrong data instead of an error");
                    right += 1;
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&format!("raidz{parity}-0")) && msg.contains("unreadable"),
                        "{msg}"
                    );
                    assert!(!msg.contains('\n'));
                    failed += 1;
                }
            }
        }
        assert!(
            failed > 0,
            "raidz{parity}/{width}: no read failed ({right} right)"
        );
        drop(v);
        drop(pool);

        // The same with the data silently overwritten: checksum errors, never wrong bytes.
        for (i, m) in mems.iter().enumerate().take(usize::from(parity) + 1) {
            overwrite_data_area(m, 7 + i as u64);
        }
        let imported = Pool::import(
            mems.iter()
                .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
                .collect(),
            Some("tank"),
        );
        // The pool's own metadata is damaged beyond parity too: import refuses, or reads fail.
        if let Ok(pool) = imported {
            if let Ok(v) = pool.volume("v") {
                if let Ok(got) = read_all(&v) {
                    assert!(got == model, "wrong data instead of an error");
                }
            }
        }
    }
}

/// A write with up to `parity` columns failing succeeds (the block reads back from the
/// others); a scrub rewrites the missing columns once the device works again.
#[test]
fn writes_survive_a_failing_device_and_a_scrub_fills_it_in() {
    let (parity, width) = (2u8, 6usize);
    let mems: Vec<MemoryBackend> = (0..width)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), DEVICE_BYTES))
        .collect();
    let faults: Vec<Arc<FaultBackend>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64)))
        .collect();
    let devices: Vec<Arc<dyn Backend>> = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn Backend>)
        .collect();
    let pool = Pool::create(
        "tank",
        vec![TopSpec::raidz(parity, devices)],
        test_props(),
        false,
    )
    .unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let v = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    faults[3].set_write_error_probability(1.0);
    let data = pattern(5, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().expect("parity covers one failing device");
    assert!(pool.status().vdevs[0].children[3].write_errors > 0);
    assert!(read_all(&v).unwrap() == data);
    // Fixed, and back in service: it lacks its columns until the scrub writes them.
    faults[3].set_write_error_probability(0.0);
    pool.clear(Some("mem3")).unwrap();
    assert_eq!(pool.status().state, "DEGRADED");
    let scrub = pool.scrub().unwrap();
    assert_eq!(scrub.blocks_lost, 0, "{scrub:?}");
    assert!(scrub.copies_repaired > 0, "{scrub:?}");
    assert_eq!(pool.scrub().unwrap().copies_bad, 0);
    assert_eq!(pool.status().state, "ONLINE");
    // Device 3 now holds its columns: two others may fail.
    faults[0].set_read_error_probability(1.0);
    faults[5].set_read_error_probability(1.0);
    assert!(read_all(&v).unwrap() == data);
    faults[0].set_read_error_probability(0.0);
    faults[5].set_read_error_probability(0.0);
    // Beyond parity the sync fails, and says so.
    for f in &faults[..3] {
        f.set_write_error_probability(1.0);
    }
    block_on(v.write(0, &pattern(6, 1 << 20), false)).unwrap();
    assert!(pool.sync().is_err());
    drop(v);
    drop(pool);
}

/// raidz beside a mirror and a single device, and added to a running pool; the
/// configuration survives export and import; too few devices are refused with one line.
#[test]
fn raidz_beside_other_vdevs_and_added_later() {
    let mems: Vec<MemoryBackend> = (0..10)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), DEVICE_BYTES))
        .collect();
    let dev = |i: usize| Arc::new(mems[i].clone()) as Arc<dyn Backend>;
    let too_few = Pool::create(
        "tank",
        vec![TopSpec::raidz(2, vec![dev(0), dev(1), dev(2), dev(3)])],
        test_props(),
        false,
    )
    .err()
    .unwrap()
    .to_string();
    assert_eq!(too_few, "raidz2 needs at least 5 devices, got 4");
    let pool = Pool::create(
        "tank",
        vec![
            TopSpec::raidz(1, vec![dev(0), dev(1), dev(2)]),
            TopSpec {
                kind: TopVdevKind::Mirror,
                devices: vec![dev(3), dev(4)],
                log: false,
            },
        ],
        test_props(),
        false,
    )
    .unwrap();
    let v = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    random_writes(&v, &mut model, 9, 40);
    let err = pool
        .add_vdevs(vec![TopSpec::raidz(3, vec![dev(5), dev(6), dev(7)])], false)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "raidz3 needs at least 7 devices, got 3");
    pool.add_vdevs(vec![TopSpec::raidz(1, vec![dev(5), dev(6), dev(7)])], false)
        .unwrap();
    random_writes(&v, &mut model, 10, 80);
    drop(v);
    let names: Vec<String> = pool.status().vdevs.iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["raidz1-0", "mirror-1", "raidz1-2"]);
    pool.export().unwrap();
    let pool = reimport(&mems[..8]);
    let names: Vec<String> = pool.status().vdevs.iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["raidz1-0", "mirror-1", "raidz1-2"]);
    let v = pool.volume("v").unwrap();
    assert!(read_all(&v).unwrap() == model);
    // Blocks went to the added raidz too.
    let added = &pool.status().vdevs[2];
    assert!(added.children.iter().all(|c| c.state == "ONLINE"));
    let scrub = pool.scrub().unwrap();
    assert_eq!((scrub.copies_bad, scrub.blocks_lost), (0, 0));
    drop(v);
    pool.export().unwrap();
}

/// A raidz volume rewritten whole after an import, as a command with no server does every
/// time: the slabs of its 9-sector blocks (16-sector slots) keep their class across the
/// import, so what the rewrite frees serves the next rewrite. Before, the import took them
/// for 4 KiB slabs and a 5-wide raidz2 of 64 MiB devices, 44 % full, refused to rewrite its
/// 60 MiB volume (ENOSPC with 150 MiB free in 4 KiB slots).
#[test]
fn a_raidz_volume_is_rewritten_whole_after_imports() {
    // The default properties, as the command had them (timed syncs, dirty_max an eighth of
    // the pool).
    let (pool, mems) = common::mem_pool_with(raidz(2), 5, oxpool_engine::PoolProps::default());
    // Each step in its own import, as each command with no server is.
    pool.export().unwrap();
    let pool = reimport(&mems);
    pool.create_volume("v", 60 << 20, &[]).unwrap();
    pool.export().unwrap();
    let mut pool = reimport(&mems);
    for round in 1..6u64 {
        let v = pool.volume("v").unwrap();
        let data = pattern(round, 60 << 20);
        // In 1 MiB writes, as `oxpool vol write` sends them, a txg every 4 MiB: each sync
        // writes space-map chunks (4 KiB blocks), which went into the unused ends of the
        // data's slots when those were taken for 4 KiB slots, so the data's slabs never
        // emptied.
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            block_on(v.write((i as u64) << 20, chunk, false))
                .unwrap_or_else(|e| panic!("round {round}, MiB {i}: {e}"));
            if i % 4 == 3 {
                pool.sync().unwrap();
            }
        }
        block_on(v.flush()).unwrap();
        assert!(common::read_all(&v) == data, "round {round}: wrong data");
        drop(v);
        pool.export().unwrap();
        pool = reimport(&mems);
    }
    common::audit_clean(&pool, "after the rewrites");
    pool.export().unwrap();
}
