//! `Pool::rename` of volumes, snapshots and bookmarks: the new name survives export and
//! import and the old one is gone; a handle opened before the rename keeps reading and
//! writing; what refers to a volume or snapshot follows it (a clone's origin, holds, `send -i`
//! from a renamed base, a receive onto a renamed target, the intent log's replay after a
//! crash); a receive under way keeps its target's name, and its resume token survives renames
//! on the sending side; every refusal changes nothing, across an import too.

mod common;

use common::*;
use oxpool_engine::{EngineError, Pool, ReceiveOptions, SendOptions};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::MemoryBackend;

const VOLUME_BYTES: u64 = 1 << 20;

/// Whether an error is of the kind a refusal must give.
type IsKind = fn(&EngineError) -> bool;

/// Every name the pool shows: volumes, `VOL@SNAP` with its guid, `VOL#BM`, and each
/// volume's origin.
fn names(pool: &Pool) -> Vec<String> {
    let mut out = Vec::new();
    for v in pool.volumes() {
        let name = v.name();
        let origin = pool.dataset_space(&name).unwrap().origin;
        out.push(format!("{name} origin {origin:?}"));
        for s in pool.snapshots(&name).unwrap() {
            out.push(format!(
                "{name}@{} {:x} holds {:?}",
                s.name, s.guid, s.holds
            ));
        }
        for b in pool.bookmarks(&name).unwrap() {
            out.push(format!("{name}#{} {:x}", b.name, b.guid));
        }
    }
    out
}

/// Volume `a` (two snapshots, a bookmark, a hold on @s1), and `c`, a clone of `a@s1`.
fn pool_with_lineage() -> (Pool, Vec<MemoryBackend>) {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let a = pool.create_volume("a", VOLUME_BYTES, &[]).unwrap();
    write(&a, 0, &pattern(1, 65536));
    pool.snapshot(&["a@s1".into()]).unwrap();
    write(&a, 65536, &pattern(2, 65536));
    pool.snapshot(&["a@s2".into()]).unwrap();
    pool.bookmark("a@s1", "a#m1").unwrap();
    pool.hold("keep", "a", "s1").unwrap();
    pool.clone_snapshot("a", "s1", "c", &[]).unwrap();
    (pool, mems)
}

#[test]
fn volumes_snapshots_and_bookmarks_keep_their_new_names_across_import() {
    let (pool, mems) = pool_with_lineage();
    let a_bytes = read_all(&pool.volume("a").unwrap());
    let s1_bytes = snap_bytes(&pool, "a", "s1");
    pool.rename("a", "b").unwrap();
    pool.rename("b@s1", "b@first").unwrap();
    pool.rename("b#m1", "b#mark").unwrap();
    let expect = |pool: &Pool| {
        let n = names(pool);
        let joined = n.join("\n");
        assert!(pool.volume("a").is_err(), "{joined}");
        assert!(
            !joined.contains("@s1") && !joined.contains("#m1"),
            "{joined}"
        );
        assert!(joined.contains("b@first"), "{joined}");
        assert!(joined.contains("b#mark"), "{joined}");
        // The clone's origin is by guid: it shows the new names.
        assert!(
            joined.contains("c origin Some(\"tank/b@first\")"),
            "{joined}"
        );
        // The hold went with the snapshot.
        assert!(
            joined.contains("b@first") && joined.contains("\"keep\""),
            "{joined}"
        );
        assert_eq!(read_all(&pool.volume("b").unwrap()), a_bytes);
        assert_eq!(snap_bytes(pool, "b", "first"), s1_bytes);
        n
    };
    let before = expect(&pool);
    audit_clean(&pool, "after the renames");
    pool.export().unwrap();
    let pool = reimport(&mems);
    assert_eq!(expect(&pool), before, "the names after import");
    audit_clean(&pool, "after import");
    // The held snapshot is still held under its new name; the clone's origin, still cloned.
    assert!(matches!(
        pool.destroy_snapshots("b", &["first".into()]),
        Err(EngineError::Busy(_))
    ));
    // The origin volume renamed again: the clone follows that too.
    pool.rename("b", "z").unwrap();
    assert_eq!(
        pool.dataset_space("c").unwrap().origin.as_deref(),
        Some("tank/z@first")
    );
    pool.export().unwrap();
}

#[test]
fn a_handle_opened_before_the_rename_keeps_working_and_shows_the_new_name() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let v = pool.create_volume("old", VOLUME_BYTES, &[]).unwrap();
    write(&v, 0, &pattern(3, 8192));
    pool.snapshot(&["old@s".into()]).unwrap();
    let view = pool.snapshot_volume("old", "s").unwrap();
    pool.rename("old", "new").unwrap();
    assert_eq!(v.name(), "new");
    assert_eq!(v.full_name(), "tank/new");
    // A snapshot's view takes the volume's new name, then its own.
    assert_eq!(view.full_name(), "tank/new@s");
    pool.rename("new@s", "new@t").unwrap();
    assert_eq!(view.full_name(), "tank/new@t");
    // I/O through the old handle lands in the renamed volume.
    write(&v, 8192, &pattern(4, 8192));
    block_on(v.flush()).unwrap();
    let mut buf = vec![0u8; 16384];
    block_on(pool.volume("new").unwrap().read(0, &mut buf)).unwrap();
    assert_eq!(&buf[..8192], &pattern(3, 8192)[..]);
    assert_eq!(&buf[8192..], &pattern(4, 8192)[..]);
    assert_eq!(read_all(&view)[..8192], pattern(3, 8192)[..]);
}

#[test]
fn refusals_change_nothing() {
    let (pool, mems) = pool_with_lineage();
    pool.create_volume("other", VOLUME_BYTES, &[]).unwrap();
    pool.snapshot(&["other@o".into()]).unwrap();
    let before = names(&pool);
    let txg = pool.synced_txg();
    let refused: [(&str, &str, IsKind); 14] = [
        ("a", "other", |e| matches!(e, EngineError::Exists(_))),
        ("a", "a", |e| matches!(e, EngineError::Exists(_))),
        ("nope", "x", |e| matches!(e, EngineError::NotFound(_))),
        ("a", "bad name", |e| matches!(e, EngineError::Invalid(_))),
        ("a", "x%recv", |e| matches!(e, EngineError::Invalid(_))),
        ("a@s1", "a@s2", |e| matches!(e, EngineError::Exists(_))),
        ("a@nope", "a@x", |e| matches!(e, EngineError::NotFound(_))),
        ("a@s1", "a@bad/name", |e| {
            matches!(e, EngineError::Invalid(_))
        }),
        ("a@s1", "other@s1", |e| matches!(e, EngineError::Invalid(_))),
        ("a#m1", "a#m1", |e| matches!(e, EngineError::Exists(_))),
        ("a#nope", "a#x", |e| matches!(e, EngineError::NotFound(_))),
        ("a#m1", "other#m1", |e| matches!(e, EngineError::Invalid(_))),
        ("a@s1", "a#s1", |e| matches!(e, EngineError::Invalid(_))),
        ("a", "b@s", |e| matches!(e, EngineError::Invalid(_))),
    ];
    for (from, to, kind) in refused {
        let e = pool.rename(from, to).unwrap_err();
        assert!(kind(&e), "rename {from} {to}: {e:?}");
        assert_eq!(names(&pool), before, "after the refused rename {from} {to}");
    }
    assert_eq!(pool.synced_txg(), txg, "a refusal wrote a txg");
    pool.export().unwrap();
    let pool = reimport(&mems);
    assert_eq!(names(&pool), before, "after import");
    audit_clean(&pool, "after the refusals");
}

#[test]
fn a_renamed_snapshot_is_still_an_incremental_base_and_a_renamed_target_still_receives() {
    let (src, _m) = mem_pool(TopVdevKind::Single, 1);
    let (dst, dst_mems) = mem_pool(TopVdevKind::Single, 1);
    let v = src.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    write(&v, 0, &pattern(5, 65536));
    src.snapshot(&["v@a".into()]).unwrap();
    let send = |vol: &str, snap: &str, base: Option<&str>| {
        let opts = SendOptions {
            base: base.map(str::to_string),
            ..SendOptions::default()
        };
        let mut out = Vec::new();
        src.send(vol, snap, &opts, &mut out).unwrap();
        out
    };
    let recv = |vol: &str, stream: &[u8]| {
        let opts = ReceiveOptions {
            force: false,
            resumable: false,
            dry_run: false,
            snapshot: None,
        };
        dst.receive(vol, &mut &stream[..], &opts).map(|_| ())
    };
    recv("copy", &send("v", "a", None)).unwrap();
    // Both sides renamed: the source's base snapshot and volume, the target volume and its
    // copy of the base. Lineage is matched by guid, never by name.
    src.rename("v@a", "v@base").unwrap();
    src.rename("v", "w").unwrap();
    dst.rename("copy", "mirror").unwrap();
    dst.rename("mirror@a", "mirror@kept").unwrap();
    write(&v, 65536, &pattern(6, 65536));
    src.snapshot(&["w@b".into()]).unwrap();
    recv("mirror", &send("w", "b", Some("base"))).unwrap();
    assert_eq!(snap_bytes(&dst, "mirror", "b"), snap_bytes(&src, "w", "b"));
    // And from a bookmark renamed after it was made.
    src.bookmark("w@b", "w#bm").unwrap();
    src.rename("w#bm", "w#mark").unwrap();
    write(&v, 0, &pattern(7, 4096));
    src.snapshot(&["w@c".into()]).unwrap();
    recv("mirror", &send("w", "c", Some("#mark"))).unwrap();
    assert_eq!(snap_bytes(&dst, "mirror", "c"), snap_bytes(&src, "w", "c"));
    dst.export().unwrap();
    let dst = reimport(&dst_mems);
    audit_clean(&dst, "the target after receives onto renamed names");
}

#[test]
fn the_intent_log_replays_into_the_renamed_volume_after_a_crash() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let v = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    pool.sync().unwrap();
    // Logged before the rename (its sync writes the name, not these records' txg data).
    write(&v, 0, &pattern(8, 8192));
    block_on(v.flush()).unwrap();
    pool.rename("v", "w").unwrap();
    // Logged after it, never synced.
    write(&v, 8192, &pattern(9, 8192));
    block_on(v.flush()).unwrap();
    drop(v);
    // As a process exit: no final sync.
    drop(pool);
    let pool = reimport(&mems);
    assert!(pool.volume("v").is_err());
    let mut buf = vec![0u8; 16384];
    block_on(pool.volume("w").unwrap().read(0, &mut buf)).unwrap();
    assert_eq!(&buf[..8192], &pattern(8, 8192)[..]);
    assert_eq!(&buf[8192..], &pattern(9, 8192)[..]);
    audit_clean(&pool, "after the replay");
}

#[test]
fn two_volumes_swap_names_through_a_third() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let a = pool.create_volume("a", VOLUME_BYTES, &[]).unwrap();
    let b = pool.create_volume("b", VOLUME_BYTES, &[]).unwrap();
    write(&a, 0, &pattern(10, 4096));
    write(&b, 0, &pattern(11, 4096));
    pool.rename("a", "t").unwrap();
    pool.rename("b", "a").unwrap();
    pool.rename("t", "b").unwrap();
    pool.export().unwrap();
    let pool = reimport(&mems);
    let head = |n: &str| read_all(&pool.volume(n).unwrap())[..4096].to_vec();
    assert_eq!(head("a"), pattern(11, 4096));
    assert_eq!(head("b"), pattern(10, 4096));
    audit_clean(&pool, "after the swap");
}

#[test]
fn a_receive_under_way_keeps_its_target_name_and_its_token_survives_renames_of_the_source() {
    let (src, _m) = mem_pool(TopVdevKind::Single, 1);
    let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
    let v = src.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    write(&v, 0, &pattern(12, 65536));
    src.snapshot(&["v@a".into()]).unwrap();
    write(&v, 0, &pattern(13, VOLUME_BYTES as usize));
    src.snapshot(&["v@b".into()]).unwrap();
    let stream = |base: Option<&str>, snap: &str| {
        let opts = SendOptions {
            base: base.map(str::to_string),
            ..SendOptions::default()
        };
        let mut out = Vec::new();
        src.send("v", snap, &opts, &mut out).unwrap();
        out
    };
    let recv_into = |target: &str, stream: &[u8], resumable: bool| {
        let opts = ReceiveOptions {
            force: false,
            resumable,
            dry_run: false,
            snapshot: None,
        };
        dst.receive(target, &mut &stream[..], &opts).map(|_| ())
    };
    let recv = |stream: &[u8], resumable: bool| recv_into("copy", stream, resumable);
    recv(&stream(None, "a"), false).unwrap();
    dst.create_volume("spare", VOLUME_BYTES, &[]).unwrap();
    let inc = stream(Some("a"), "b");
    assert!(recv(&inc[..inc.len() / 2], true).is_err(), "a cut stream");
    let token = dst
        .receive_resume_token("copy")
        .expect("a resumable receive");
    // A full stream into a new volume, cut too: it waits under the name it will take.
    let full = stream(None, "a");
    assert!(recv_into("fresh", &full[..full.len() / 2], true).is_err());
    assert!(dst.receive_resume_token("fresh").is_some());
    // The end of a receive finds its target by name: neither away from it nor onto it.
    let before = names(&dst);
    assert!(matches!(
        dst.rename("copy", "moved"),
        Err(EngineError::Busy(_))
    ));
    assert!(matches!(
        dst.rename("spare", "fresh"),
        Err(EngineError::Busy(_))
    ));
    assert_eq!(names(&dst), before);
    // The token names snapshots by guid: renames on the sending side do not break it.
    src.rename("v@b", "v@bee").unwrap();
    src.rename("v", "w").unwrap();
    let token: oxpool_format::ResumeToken = token.parse().unwrap();
    let what = oxpool_engine::SendWhat::Resume {
        token: &token,
        volume: None,
    };
    let mut rest = Vec::new();
    src.send_what(&what, &SendOptions::default(), &mut rest)
        .unwrap();
    recv(&rest, true).unwrap();
    // Under the name the sender gave in the resumed stream; the same snapshot by guid.
    let got = dst.snapshots("copy").unwrap().pop().unwrap();
    let sent = src.snapshots("w").unwrap().pop().unwrap();
    assert_eq!((got.guid, sent.name.as_str()), (sent.guid, "bee"));
    assert_eq!(
        snap_bytes(&dst, "copy", &got.name),
        snap_bytes(&src, "w", "bee")
    );
    dst.rename("copy", "moved").unwrap();
    audit_clean(&dst, "after the resumed receive and the rename");
}

/// Audits while another thread renames volumes and snapshots back and forth, each rename
/// waiting for its txg: every audit is clean. The audit reads a line's names twice (when it
/// walks the trees and when it checks `written@`); it keys what it walked by volume id and
/// snapshot guid, so a rename between the two cannot make it report a tree "not walked".
/// (Not a timing test: the renames race the audits for as long as the audits run.)
#[test]
fn an_audit_beside_renames_finds_nothing_wrong() {
    let (pool, _mems) = pool_with_lineage();
    let a = pool.volume("a").unwrap();
    // More trees to walk, so that the audits last long enough to overlap renames.
    for i in 0..8u64 {
        write(&a, (i % 4) * 131072, &pattern(10 + i, 131072));
        pool.snapshot(&[format!("a@x{i}")]).unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let renames = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // Bounded: stops when the audits are done.
            let pairs = [("a", "b"), ("b@s2", "b@t2"), ("c", "d"), ("b", "a")];
            let back = [("a@t2", "a@s2"), ("d", "c")];
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                for (from, to) in pairs.iter().chain(back.iter()) {
                    pool.rename(from, to).unwrap();
                    renames.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        for round in 0..12 {
            let report = pool.audit().unwrap();
            assert!(
                report.problems.is_empty(),
                "audit {round}: {:?}",
                report.problems
            );
            assert!(report.written_since_checked > 0);
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
    });
    let renames = renames.load(std::sync::atomic::Ordering::Relaxed);
    println!("12 audits beside {renames} renames");
    assert!(renames > 0, "no rename ran beside the audits");
}

/// The damaged-data log (`status -v`) names what is damaged by the names of now: a volume's
/// entries and its snapshots' follow its rename, a snapshot's its own; a record a host kept
/// from before the pool was imported under a new name is put back under the new one.
#[test]
fn the_damage_log_follows_renames() {
    use oxpool_engine::spa::errlog::DamagedRange;
    use oxpool_engine::ErrorRecord;
    let (pool, _mems) = pool_with_lineage();
    let range = |dataset: &str| DamagedRange {
        dataset: dataset.to_string(),
        offset_bytes: 65536,
        length_bytes: 4096,
    };
    // As a host keeps it: under the name the pool had when the damage was found.
    pool.restore_error_record(&ErrorRecord {
        damaged: vec![range("old/a"), range("old/a@s1"), range("old/c")],
        ..Default::default()
    });
    let names = |pool: &Pool| -> Vec<String> {
        pool.error_record()
            .damaged
            .into_iter()
            .map(|r| r.dataset)
            .collect()
    };
    assert_eq!(names(&pool), ["tank/a", "tank/a@s1", "tank/c"]);
    pool.rename("a", "b").unwrap();
    assert_eq!(names(&pool), ["tank/b", "tank/b@s1", "tank/c"]);
    pool.rename("b@s1", "b@first").unwrap();
    assert_eq!(names(&pool), ["tank/b", "tank/b@first", "tank/c"]);
    assert_eq!(pool.error_record().damaged[0], range("tank/b"));
}

/// `recv -F` checks the target's snapshots after the base when the stream begins and
/// destroys them when it ends: a rename in between (here in the hook a server uses to take
/// down their exports, which runs between the two) must neither spare a renamed one (the
/// swap would then be refused, "latest changed", after the others were destroyed) nor
/// destroy another that took its name. The destroys go by the guids checked.
#[test]
fn recv_f_destroys_the_snapshots_it_checked_whatever_their_names_become() {
    let (src, _m) = mem_pool(TopVdevKind::Single, 1);
    let (dst, _dm) = mem_pool(TopVdevKind::Single, 1);
    let v = src.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    write(&v, 0, &pattern(5, 65536));
    src.snapshot(&["v@base".into()]).unwrap();
    let send = |snap: &str, base: Option<&str>| {
        let opts = SendOptions {
            base: base.map(str::to_string),
            ..SendOptions::default()
        };
        let mut out = Vec::new();
        src.send("v", snap, &opts, &mut out).unwrap();
        out
    };
    let opts = |force| ReceiveOptions {
        force,
        resumable: false,
        dry_run: false,
        snapshot: None,
    };
    dst.receive("t", &mut &send("base", None)[..], &opts(false))
        .unwrap();
    // The target moves on: two snapshots after the base, which -F is to destroy.
    let t = dst.volume("t").unwrap();
    write(&t, 0, &pattern(7, 4096));
    dst.snapshot(&["t@l1".into()]).unwrap();
    write(&t, 4096, &pattern(8, 4096));
    dst.snapshot(&["t@l2".into()]).unwrap();
    write(&v, 65536, &pattern(6, 65536));
    src.snapshot(&["v@next".into()]).unwrap();
    let stream = send("next", Some("base"));

    let hook = |volume: &str, later: &[String]| -> Result<(), String> {
        assert_eq!(
            (volume, later),
            ("t", &["l1".to_string(), "l2".to_string()][..])
        );
        // While the stream arrives: @l1 renamed away, the base renamed to @l1's old name.
        dst.rename("t@l1", "t@moved").unwrap();
        dst.rename("t@base", "t@l1").unwrap();
        Ok(())
    };
    dst.receive_with("t", &mut &stream[..], &opts(true), &hook, &|_| {})
        .unwrap();
    let snaps: Vec<String> = dst
        .snapshots("t")
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        snaps,
        ["l1", "next"],
        "the base (now @l1) kept, @moved and @l2 gone"
    );
    assert_eq!(
        read_all(&dst.volume("t").unwrap()),
        read_all(&v),
        "the head is the stream's snapshot"
    );
    audit_clean(&dst, "after the receive");
}
