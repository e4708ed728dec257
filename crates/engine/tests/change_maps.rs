//! Change maps (`Volume::changed_extents`, the NBD contexts `oxpool:changed-since:SNAP`):
//! after seeded random writes, trims, write-zeroes and a partial refill of a trimmed range
//! since a snapshot, every byte that differs between the snapshot and the head lies in a
//! changed extent, with the changes dirty in memory, synced, half of each, and after export
//! and import; ranges never touched since the snapshot (data, and a hole among changed
//! neighbours) are not flagged. The bases a head, a snapshot view and a clone offer; refusals;
//! and the cost of a map follows the changed blocks (device reads counted).

mod common;

use common::*;
use oxpool_engine::{ChangeBase, ChangedExtent, Pool, Volume};
use oxpool_format::TopVdevKind;

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 16 * MIB;
/// Data written before the snapshot and never touched after it.
const UNTOUCHED_DATA: (u64, u64) = (5 * MIB, 6 * MIB);
/// A hole before the snapshot, never touched after it, inside a sparse stretch whose other
/// parts change (so its indirect blocks are rewritten around it).
const UNTOUCHED_HOLE: (u64, u64) = (10 * MIB, 11 * MIB);
/// The sparse stretch around it.
const SPARSE: (u64, u64) = (8 * MIB, 12 * MIB);

fn on<T>(f: impl std::future::Future<Output = T>) -> T {
    oxpool_io::rt::block_on(f)
}

fn read_all(vol: &Volume) -> Vec<u8> {
    let mut out = vec![0u8; vol.size_bytes() as usize];
    on(vol.read(0, &mut out)).unwrap();
    out
}

fn snap(pool: &Pool, name: &str) {
    pool.snapshot(&[name.to_string()]).unwrap();
}

/// A base by name: `SNAP`, or `#BOOKMARK`.
fn base(name: &str) -> ChangeBase {
    match name.strip_prefix('#') {
        Some(b) => ChangeBase::Bookmark(b.to_string()),
        None => ChangeBase::Snapshot(name.to_string()),
    }
}

/// A tiny deterministic generator (xorshift), so the test needs no RNG crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The whole map of `vol` since `since`, as one flag per byte, asked in windows of uneven
/// sizes starting at uneven offsets (each answer may be a prefix: the next query starts
/// where it ended). Checks each answer's shape on the way.
fn changed_bytes(vol: &Volume, since: &str, rng: &mut Rng) -> Vec<bool> {
    let size = vol.size_bytes();
    let mut flags = vec![false; size as usize];
    let mut pos = 0u64;
    // Bounded: every answer covers at least one byte.
    while pos < size {
        let want = (1 + rng.below(3 * MIB)).min(size - pos);
        let extents: Vec<ChangedExtent> = on(vol.changed_extents(&base(since), pos, want))
            .unwrap_or_else(|e| panic!("map of {} since @{since}: {e}", vol.full_name()));
        assert!(!extents.is_empty(), "no extent at {pos}+{want}");
        let covered: u64 = extents.iter().map(|e| e.length_bytes).sum();
        assert!(
            covered > 0 && covered <= want,
            "{covered} of {want} at {pos}"
        );
        for e in &extents {
            assert!(e.length_bytes > 0, "an empty extent at {pos}");
            if e.changed {
                flags[pos as usize..(pos + e.length_bytes) as usize].fill(true);
            }
            pos += e.length_bytes;
        }
    }
    flags
}

/// Checks the map of `vol` since `since` against the bytes: every byte that differs between
/// `old` (the snapshot's bytes) and the volume's is flagged; the untouched ranges are not.
/// Returns the flagged byte count.
fn check_map(vol: &Volume, since: &str, old: &[u8], untouched: &[(u64, u64)], when: &str) -> u64 {
    let mut rng = Rng(0x5eed ^ when.len() as u64);
    let flags = changed_bytes(vol, since, &mut rng);
    let now = read_all(vol);
    let mut differing = 0u64;
    for (i, (a, b)) in now.iter().zip(old).enumerate() {
        if a != b {
            differing += 1;
            assert!(
                flags[i],
                "{when}: byte {i} (block {}) differs from @{since} but is not flagged",
                i as u64 / u64::from(vol.block_size_bytes())
            );
        }
    }
    for &(lo, hi) in untouched {
        let flagged = flags[lo as usize..hi as usize]
            .iter()
            .filter(|f| **f)
            .count();
        assert_eq!(
            flagged, 0,
            "{when}: {flagged} bytes of the untouched range {lo}..{hi} flagged"
        );
    }
    let flagged = flags.iter().filter(|f| **f).count() as u64;
    assert!(
        differing > 0,
        "{when}: nothing changed: the test tests nothing"
    );
    assert!(flagged >= differing);
    flagged
}

/// One random change that stays out of the untouched ranges (whole blocks of them: a change
/// touches only the blocks its bytes are in).
fn random_change(vol: &Volume, rng: &mut Rng, seed: u64) {
    let bs = u64::from(vol.block_size_bytes());
    let (off, len) = loop {
        let most = if rng.below(4) == 0 { MIB } else { 4 * bs };
        let len = 1 + rng.below(most);
        let off = rng.below(VOLUME_BYTES - len);
        let clear = [UNTOUCHED_DATA, UNTOUCHED_HOLE]
            .iter()
            .all(|&(lo, hi)| off + len <= lo || off >= hi);
        // Changes in the sparse stretch land next to the untouched hole (its neighbours'
        // indirect blocks are rewritten) half the time.
        let sparse_bias = rng.below(2) == 0;
        if clear && (!sparse_bias || (off >= SPARSE.0 && off + len <= SPARSE.1)) {
            break (off, len);
        }
    };
    match rng.below(4) {
        0 => on(vol.trim(off, len, false)).unwrap(),
        1 => on(vol.write_zeroes(off, len, false)).unwrap(),
        2 => {
            // Zeros written as data: whole zero blocks are stored as holes with a birth.
            on(vol.write(off, &vec![0u8; len as usize], false)).unwrap()
        }
        _ => on(vol.write(off, &content(Fill::Mixed, seed, len as usize), false)).unwrap(),
    }
}

/// The volume before the snapshot: random data, a sparse stretch with a few blocks written,
/// mixed data (some whole blocks of zeros) at the end.
fn filled_volume(pool: &Pool) -> Volume {
    let vol = pool
        .create_volume("vol", VOLUME_BYTES, &[("compression".into(), "lz4".into())])
        .unwrap();
    let bs = u64::from(vol.block_size_bytes());
    on(vol.write(0, &content(Fill::Random, 1, SPARSE.0 as usize), false)).unwrap();
    for k in [3u64, 70, 200] {
        let at = SPARSE.0 + k * bs;
        on(vol.write(at, &content(Fill::Random, k, bs as usize), false)).unwrap();
    }
    let tail = (VOLUME_BYTES - SPARSE.1) as usize;
    on(vol.write(SPARSE.1, &content(Fill::Mixed, 2, tail), false)).unwrap();
    vol
}

#[test]
fn every_changed_byte_is_flagged_dirty_synced_and_after_import() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 2);
    let vol = filled_volume(&pool);
    snap(&pool, "vol@base");
    let old = read_all(&pool.snapshot_volume("vol", "base").unwrap());
    let untouched = [UNTOUCHED_DATA, UNTOUCHED_HOLE];
    // Nothing changed yet: nothing flagged.
    let mut rng = Rng(7);
    let flags = changed_bytes(&vol, "base", &mut rng);
    assert!(
        flags.iter().all(|f| !f),
        "a map right after the snapshot flags bytes"
    );

    // Changes only in memory (test pools sync only when told).
    let mut rng = Rng(11);
    for i in 0..30 {
        random_change(&vol, &mut rng, 100 + i);
    }
    let dirty = check_map(&vol, "base", &old, &untouched, "dirty");

    // The same changes synced: found by the tree walk.
    pool.sync().unwrap();
    let synced = check_map(&vol, "base", &old, &untouched, "synced");
    // Dirty blocks are flagged whole; the walk also clears holes written over holes.
    assert!(synced <= dirty, "synced {synced} > dirty {dirty}");

    // A trimmed range partly refilled, then changes half synced, half in memory.
    let bs = u64::from(vol.block_size_bytes());
    on(vol.trim(MIB, MIB, false)).unwrap();
    on(vol.write(
        MIB + 16 * bs + 512,
        &content(Fill::Random, 9, (5 * bs) as usize),
        false,
    ))
    .unwrap();
    for i in 0..10 {
        random_change(&vol, &mut rng, 200 + i);
    }
    pool.sync().unwrap();
    for i in 0..10 {
        random_change(&vol, &mut rng, 300 + i);
    }
    check_map(&vol, "base", &old, &untouched, "half synced");
    // The trimmed range is flagged (its bytes differ: they were random data).
    let trimmed = on(vol.changed_extents(&base("base"), MIB, bs)).unwrap();
    assert!(trimmed.iter().all(|e| e.changed), "{trimmed:?}");

    // Across export and import: the map comes from the trees alone.
    let before = read_all(&vol);
    drop(vol);
    pool.export().unwrap();
    let pool = reimport(&mems);
    let vol = pool.volume("vol").unwrap();
    assert_eq!(read_all(&vol), before);
    check_map(&vol, "base", &old, &untouched, "imported");
    let r = pool.audit().unwrap();
    assert!(r.is_clean(), "audit: {:#?}", r.problems);
}

#[test]
fn snapshot_views_and_clones_offer_their_lineage() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 2);
    let vol = filled_volume(&pool);
    snap(&pool, "vol@a");
    let a = read_all(&pool.snapshot_volume("vol", "a").unwrap());
    let mut rng = Rng(3);
    for i in 0..15 {
        random_change(&vol, &mut rng, 400 + i);
    }
    snap(&pool, "vol@b");
    for i in 0..15 {
        random_change(&vol, &mut rng, 500 + i);
    }
    let untouched = [UNTOUCHED_DATA, UNTOUCHED_HOLE];

    // The head offers every snapshot of its lineage, oldest first.
    assert_eq!(vol.change_bases(16), [base("a"), base("b")]);
    assert_eq!(vol.change_bases(1), [base("b")], "the newest when limited");
    assert!(!vol.offers_change_map(&base("nope")));
    assert!(!vol.offers_change_map(&ChangeBase::Bookmark("a".into())));
    let err = on(vol.changed_extents(&base("nope"), 0, 4096)).unwrap_err();
    assert!(
        err.to_string().contains("no change map since @nope"),
        "{err}"
    );
    // Past the end: refused like a read.
    assert!(on(vol.changed_extents(&base("a"), VOLUME_BYTES - 4096, 8192)).is_err());
    check_map(&vol, "a", &a, &untouched, "head since @a");

    // A snapshot view offers the snapshots before it: @b since @a, none for @a.
    let view_b = pool.snapshot_volume("vol", "b").unwrap();
    let view_a = pool.snapshot_volume("vol", "a").unwrap();
    assert_eq!(view_b.change_bases(16), [base("a")]);
    assert!(view_a.change_bases(16).is_empty());
    assert!(!view_b.offers_change_map(&base("b")), "a view since itself");
    check_map(&view_b, "a", &a, &untouched, "@b since @a");

    // A clone of @b offers its origin's chain, then its own snapshots.
    let clone = pool.clone_snapshot("vol", "b", "cl", &[]).unwrap();
    assert_eq!(clone.change_bases(16), [base("a"), base("b")]);
    for i in 0..10 {
        random_change(&clone, &mut rng, 600 + i);
    }
    snap(&pool, "cl@c");
    assert_eq!(clone.change_bases(16), [base("a"), base("b"), base("c")]);
    check_map(
        &clone,
        "a",
        &a,
        &untouched,
        "clone since its origin volume's @a",
    );
    let view_c = pool.snapshot_volume("cl", "c").unwrap();
    assert_eq!(view_c.change_bases(16), [base("a"), base("b")]);
    check_map(&view_c, "a", &a, &untouched, "clone's @c since @a");

    // A base destroyed: no longer offered, and a map since it is refused.
    pool.destroy_snapshots("vol", &["a".to_string()]).unwrap();
    assert!(!vol.offers_change_map(&base("a")));
    assert_eq!(vol.change_bases(16), [base("b")]);
    let err = on(vol.changed_extents(&base("a"), 0, 4096)).unwrap_err();
    assert!(err.to_string().contains("no change map since @a"), "{err}");
}

/// Bytes read from the pool's devices so far.
fn device_read_bytes(pool: &Pool) -> u64 {
    pool.counters()
        .device_stats()
        .iter()
        .map(|d| d.io.read.bytes)
        .sum()
}

/// The bytes of indirect blocks read by one map of the whole volume.
fn map_read_bytes(pool: &Pool, vol: &Volume, since: &str) -> (u64, Vec<ChangedExtent>) {
    let before = device_read_bytes(pool);
    let extents = on(vol.changed_extents(&base(since), 0, vol.size_bytes())).unwrap();
    (device_read_bytes(pool) - before, extents)
}

#[test]
fn the_cost_follows_the_changed_blocks() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 2);
    let vol = pool
        .create_volume("vol", 24 * MIB, &[("compression".into(), "off".into())])
        .unwrap();
    let bs = u64::from(vol.block_size_bytes());
    on(vol.write(0, &content(Fill::Random, 1, (24 * MIB) as usize), false)).unwrap();
    snap(&pool, "vol@s");
    let nblocks = 24 * MIB / bs;
    let indirect = u64::try_from(oxpool_format::INDIRECT_BLOCK_BYTES).unwrap();
    let level1_blocks = nblocks.div_ceil(oxpool_format::INDIRECT_FANOUT as u64);
    assert!(level1_blocks >= 6, "{level1_blocks}");

    // One block changed: the head's root and one level-1 block are read, and the base's
    // root (to line up the base's level-1 block, in case the new one holds holes), nothing
    // else.
    on(vol.write(1000 * bs, &content(Fill::Random, 2, bs as usize), false)).unwrap();
    pool.sync().unwrap();
    let (read, extents) = map_read_bytes(&pool, &vol, "s");
    let flagged: Vec<(u64, bool)> = extents
        .iter()
        .map(|e| (e.length_bytes, e.changed))
        .collect();
    assert_eq!(
        flagged,
        [
            (1000 * bs, false),
            (bs, true),
            (24 * MIB - 1001 * bs, false)
        ]
    );
    assert!(
        read <= 3 * indirect,
        "read {read} bytes for one changed block"
    );

    // One block changed under every level-1 block: each of them is read (the counter sees
    // the walk's reads, so the bound above means something).
    for k in 0..level1_blocks {
        let b = (k * oxpool_format::INDIRECT_FANOUT as u64 + 7).min(nblocks - 1);
        on(vol.write(b * bs, &content(Fill::Random, 3 + k, bs as usize), false)).unwrap();
    }
    pool.sync().unwrap();
    let (read, extents) = map_read_bytes(&pool, &vol, "s");
    assert_eq!(
        extents.iter().filter(|e| e.changed).count() as u64,
        level1_blocks + 1
    );
    assert!(read >= (level1_blocks + 1) * indirect, "read {read} bytes");
}

#[test]
fn many_scattered_changes_come_in_prefixes() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 2);
    let vol = pool
        .create_volume(
            "vol",
            24 * MIB,
            &[
                ("volblocksize".into(), "4K".into()),
                ("compression".into(), "off".into()),
            ],
        )
        .unwrap();
    let bs = u64::from(vol.block_size_bytes());
    on(vol.write(0, &content(Fill::Random, 1, (24 * MIB) as usize), false)).unwrap();
    snap(&pool, "vol@s");
    let old = read_all(&vol);
    // Every other block: more separate changed ranges than one answer holds.
    let nblocks = 24 * MIB / bs;
    for b in (0..nblocks).step_by(2) {
        on(vol.write(b * bs + 100, &content(Fill::Random, b, 10), false)).unwrap();
    }
    pool.sync().unwrap();
    let first = on(vol.changed_extents(&base("s"), 0, 24 * MIB)).unwrap();
    let covered: u64 = first.iter().map(|e| e.length_bytes).sum();
    let changed = first.iter().filter(|e| e.changed).count();
    assert_eq!(
        changed,
        oxpool_engine::CHANGED_RANGES_MAX,
        "one answer's changed ranges"
    );
    // Up to the start of the first range left out: blocks 0, 2, ... changed, the odd ones not.
    assert_eq!(covered, 2 * oxpool_engine::CHANGED_RANGES_MAX as u64 * bs);
    // Asked again from where each answer ends, the whole map is exact.
    check_map(&vol, "s", &old, &[], "every other block");
}

/// A bookmark serves the map its snapshot served, after the snapshot is gone (holes judged
/// by birth alone: no tree to compare with), across an import; a rollback past a bookmark
/// needs -r and destroys it (the head no longer descends from what it marks).
#[test]
fn bookmarks_serve_change_maps_after_their_snapshot_is_gone() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = filled_volume(&pool);
    snap(&pool, "vol@base");
    let old = read_all(&pool.snapshot_volume("vol", "base").unwrap());
    pool.bookmark("vol@base", "vol#base").unwrap();
    pool.destroy_snapshots("vol", &["base".to_string()])
        .unwrap();
    assert!(!vol.offers_change_map(&base("base")));
    assert!(vol.offers_change_map(&base("#base")));
    assert_eq!(vol.change_bases(16), [base("#base")]);
    let mut rng = Rng(23);
    for i in 0..20 {
        random_change(&vol, &mut rng, 600 + i);
    }
    check_map(&vol, "#base", &old, &[UNTOUCHED_DATA], "bookmark, dirty");
    pool.sync().unwrap();
    check_map(&vol, "#base", &old, &[UNTOUCHED_DATA], "bookmark, synced");
    drop(vol);
    pool.export().unwrap();
    let pool = reimport(&mems);
    let vol = pool.volume("vol").unwrap();
    check_map(&vol, "#base", &old, &[UNTOUCHED_DATA], "bookmark, imported");

    // A bookmark younger than the snapshot rolled back to.
    snap(&pool, "vol@r1");
    random_change(&vol, &mut rng, 700);
    snap(&pool, "vol@r2");
    pool.bookmark("vol@r2", "vol#r2").unwrap();
    pool.destroy_snapshots("vol", &["r2".to_string()]).unwrap();
    let err = pool.rollback("vol", "r1", false).unwrap_err().to_string();
    assert!(err.contains("#r2") && err.contains("-r"), "{err}");
    assert!(vol.offers_change_map(&base("#r2")));
    pool.rollback("vol", "r1", true).unwrap();
    assert!(
        !vol.offers_change_map(&base("#r2")),
        "a rolled-back-past bookmark"
    );
    assert!(vol.offers_change_map(&base("#base")));
    let names: Vec<String> = pool
        .bookmarks("vol")
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["base"]);
    let r = pool.audit().unwrap();
    assert!(r.is_clean(), "audit: {:#?}", r.problems);
}

/// A copy of the volume received within the pool has the same snapshot guids, other txgs,
/// and a name that sorts first: the change map of the original's snapshot export still goes
/// by the original's lineage. Before, the view's volume was found by guid across the pool,
/// the copy's, whose base is younger than every block of the original: the map said
/// nothing changed, and an incremental backup built from it would miss every change.
#[test]
fn a_copy_within_the_pool_does_not_answer_for_the_original() {
    use oxpool_engine::{ReceiveOptions, SendOptions};
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = filled_volume(&pool);
    snap(&pool, "vol@a");
    let changed = (4 * MIB, 5 * MIB);
    write(
        &vol,
        changed.0,
        &vec![0x5a; (changed.1 - changed.0) as usize],
    );
    snap(&pool, "vol@s");
    let copy = |snap: &str, base: Option<&str>| {
        let opts = SendOptions {
            base: base.map(str::to_string),
            ..SendOptions::default()
        };
        let mut stream = Vec::new();
        pool.send("vol", snap, &opts, &mut stream).unwrap();
        let recv = ReceiveOptions {
            force: false,
            resumable: false,
            dry_run: false,
            snapshot: None,
        };
        pool.receive("backup", &mut stream.as_slice(), &recv)
            .unwrap();
    };
    copy("a", None);
    copy("s", Some("a"));
    let view = pool.snapshot_volume("vol", "s").unwrap();
    let extents = on(view.changed_extents(&base("a"), 0, VOLUME_BYTES)).unwrap();
    let flagged = |at: u64| {
        extents
            .iter()
            .scan(0u64, |pos, e| {
                let start = *pos;
                *pos += e.length_bytes;
                Some((start, *pos, e.changed))
            })
            .any(|(start, end, changed)| changed && start <= at && at < end)
    };
    for at in [changed.0, changed.1 - 1] {
        assert!(flagged(at), "byte {at} changed since @a: {extents:?}");
    }
}

/// Whether the map of `vol` since the pinned `pin` flags the block at `offset`.
fn pinned_flags(vol: &Volume, pin: &oxpool_engine::PinnedBase, offset: u64) -> bool {
    let bs = u64::from(vol.block_size_bytes());
    let extents = on(vol.changed_extents_since(pin, offset, bs)).unwrap();
    assert_eq!(extents.len(), 1, "{extents:?}");
    extents[0].changed
}

/// A base chosen once (an NBD client's SET_META_CONTEXT) stays the snapshot it named: a
/// rotation of backup bases (`@cur` renamed `@prev`, a new `@cur` taken) does not move the
/// client's map to the new `@cur`, which would hide what was written between the two; a
/// bookmark renamed stays too; the base destroyed, the pinned map is refused (not moved).
#[test]
fn a_chosen_base_stays_what_it_named_across_a_rename() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("vol", VOLUME_BYTES, &[]).unwrap();
    let bs = u64::from(vol.block_size_bytes());
    let (a, b) = (0, 4 * MIB);
    assert!(b >= bs);
    // Data everywhere first: a bookmark has no tree to judge holes by, and flags holes
    // under rewritten indirect blocks (a superset); data born before it is never flagged.
    on(vol.write(0, &content(Fill::Random, 2, VOLUME_BYTES as usize), false)).unwrap();
    snap(&pool, "vol@cur");
    pool.bookmark("vol@cur", "vol#wk").unwrap();
    let pin = vol.pin_change_base(&base("cur")).unwrap();
    let mark = vol.pin_change_base(&base("#wk")).unwrap();
    on(vol.write(a, &vec![0x11; bs as usize], false)).unwrap();

    // Rotation: the old @cur is @prev now, and a new @cur holds the write at `a`.
    pool.rename("vol@cur", "vol@prev").unwrap();
    pool.rename("vol#wk", "vol#week").unwrap();
    snap(&pool, "vol@cur");
    on(vol.write(b, &vec![0x22; bs as usize], false)).unwrap();
    for (pin, what) in [(&pin, "snapshot"), (&mark, "bookmark")] {
        assert!(
            pinned_flags(&vol, pin, a),
            "{what}: the write before the rotation"
        );
        assert!(pinned_flags(&vol, pin, b), "{what}: the write after it");
        assert!(!pinned_flags(&vol, pin, 8 * MIB), "{what}: untouched");
    }
    // The same name chosen now is the new snapshot: only the write after it.
    let now = vol.pin_change_base(&base("cur")).unwrap();
    assert_ne!(now, pin);
    assert!(!pinned_flags(&vol, &now, a));
    assert!(pinned_flags(&vol, &now, b));
    assert_eq!(vol.pin_change_base(&base("prev")), Some(pin));
    assert_eq!(vol.pin_change_base(&base("#week")), Some(mark));
    assert_eq!(vol.pin_change_base(&base("#wk")), None);

    // Across a sync too (the tree walk, not only the dirty sets).
    pool.sync().unwrap();
    assert!(pinned_flags(&vol, &pin, a) && pinned_flags(&vol, &mark, a));

    // Destroyed: refused, not moved to another base.
    pool.destroy_snapshots("vol", &["prev".to_string()])
        .unwrap();
    let err = on(vol.changed_extents_since(&pin, 0, bs)).unwrap_err();
    assert!(err.to_string().contains("no change map since"), "{err}");
    pool.destroy_bookmark("vol", "week").unwrap();
    assert!(on(vol.changed_extents_since(&mark, 0, bs)).is_err());
    assert!(pinned_flags(&vol, &now, b), "the other base still answers");
}
