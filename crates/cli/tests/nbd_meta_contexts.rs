//! Change maps (`oxpool:changed-since:SNAP` metadata contexts) of a real `oxpool serve`, with
//! real clients:
//! - libnbd's python binding (tests/nbd/meta_contexts.py) lists and selects them: a
//!   volume offers its snapshots' maps, a change map since an unknown snapshot or a bookmark
//!   is cleanly not offered (base:allocation still served), and `nbdinfo
//!   --map=oxpool:changed-since:nope` fails with its own one-line message;
//! - after random writes, trims, write-zeroes and a partial refill since a snapshot,
//!   `nbdinfo --map` shows the changed extents, and an incremental backup loop
//!   (tests/nbd/change_maps.py) that copies only the flagged extents from the head onto the
//!   snapshot's bytes (read through the snapshot's export) ends byte-identical to the head;
//! - the map is the same after kill -9 of the server and a restart, and the backup still
//!   works; a snapshot's export offers the maps since the snapshots before it;
//! - a client's map stays since the snapshot it chose when the snapshot's name moves on (a
//!   rotation of backup bases: `@cur` renamed `@prev`, a new `@cur`), and a new client of
//!   the same name gets the new snapshot's.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{python, release, run_unchecked, script, tcp_uri, tool, Env, PYTHON};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;
/// Bytes the changes never touch: must not be flagged.
const UNTOUCHED: (u64, u64) = (40 * MIB, 48 * MIB);

/// The contexts `nbdinfo URI` lists for the export.
fn listed_contexts(uri: &str) -> Vec<String> {
    let info = tool("nbdinfo", &[uri]);
    info.lines()
        .skip_while(|l| l.trim() != "contexts:")
        .skip(1)
        .take_while(|l| l.starts_with("\t\t"))
        .map(|l| l.trim().to_string())
        .collect()
}

/// `nbdinfo --map=oxpool:changed-since:SNAP URI`, as (offset, length, type) lines.
fn nbdinfo_map(uri: &str, snap: &str) -> Vec<(u64, u64, u32)> {
    let out = tool(
        "nbdinfo",
        &[&format!("--map=oxpool:changed-since:{snap}"), uri],
    );
    out.lines()
        .map(|line| {
            let mut words = line.split_whitespace();
            let mut next = || -> u64 {
                words
                    .next()
                    .and_then(|w| w.parse().ok())
                    .unwrap_or_else(|| panic!("not a map line: {line:?}\n{out}"))
            };
            let (offset, length, kind) = (next(), next(), next());
            (offset, length, kind as u32)
        })
        .collect()
}

#[test]
fn an_unknown_snapshot_or_a_bookmark_is_cleanly_not_offered() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[]), ("vol1", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["snapshot", "tank/vol0@monday"]);
    let uri = server.uri("tank/vol0");

    // A volume with a snapshot offers its map; one without offers none.
    let out = python("meta_contexts.py", &[&uri, "monday"]);
    assert!(out.contains("meta_contexts: all checks passed"), "{out}");
    let out = python("meta_contexts.py", &[&server.uri("tank/vol1")]);
    assert!(out.contains("meta_contexts: all checks passed"), "{out}");
    assert_eq!(
        listed_contexts(&uri),
        ["base:allocation", "oxpool:changed-since:monday"]
    );
    assert_eq!(
        listed_contexts(&server.uri("tank/vol1")),
        ["base:allocation"]
    );

    for missing in ["nope", "#weekly"] {
        let context = format!("oxpool:changed-since:{missing}");
        let mut map = Command::new("nbdinfo");
        map.args([&format!("--map={context}"), &uri]);
        let output = run_unchecked(map, &format!("nbdinfo --map={context}"));
        assert!(
            !output.status.success(),
            "a change map since {missing} was served"
        );
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(
            err.contains("does not support metadata context") && err.contains(&context),
            "{err}"
        );
    }

    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn a_backup_copies_only_the_changed_extents_and_the_map_survives_kill_9() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    // Every block written before the snapshot: then what a crash changes in how the
    // changes are stored (in memory, in the intent log, in the tree) cannot change the map.
    python("change_maps.py", &["fill", &uri, "1"]);
    env.ok(&["snapshot", "tank/vol0@monday"]);
    let (lo, hi) = (UNTOUCHED.0.to_string(), UNTOUCHED.1.to_string());
    let out = python("change_maps.py", &["change", &uri, "2", &lo, &hi]);
    assert!(out.contains("partial refill"), "{out}");

    // nbdinfo shows the map: changed extents, the untouched range inside an unchanged one.
    let map = nbdinfo_map(&uri, "monday");
    println!("nbdinfo --map: {} extents", map.len());
    let size: u64 = map.iter().map(|(_, len, _)| len).sum();
    assert_eq!(size, 64 * MIB, "{map:?}");
    let changed: u64 = map.iter().filter(|e| e.2 == 1).map(|e| e.1).sum();
    assert!(
        changed > 0 && changed < 48 * MIB,
        "{changed} bytes flagged: {map:?}"
    );
    assert!(
        map.iter()
            .any(|&(off, len, kind)| kind == 0 && off <= UNTOUCHED.0 && off + len >= UNTOUCHED.1),
        "the untouched range is flagged: {map:?}"
    );

    // The backup loop: the snapshot's bytes plus the flagged extents are the head.
    let snap_uri = tcp_uri(&server, "tank/vol0@monday");
    let out = python("change_maps.py", &["backup", &uri, &snap_uri, "monday"]);
    println!("{out}");
    assert!(out.contains("identical"), "{out}");
    assert!(!out.contains("copied 0 of"), "{out}");
    let before = python("change_maps.py", &["map", &uri, "monday"]);
    assert!(before.lines().count() > 2, "{before}");

    // Killed at once (the changes were flushed, not necessarily synced), restarted: the
    // same map, the same backup.
    server.kill9();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let after = python("change_maps.py", &["map", &uri, "monday"]);
    assert_eq!(before, after, "the map changed across kill -9 and restart");
    assert_eq!(nbdinfo_map(&uri, "monday"), map);
    let snap_uri = server.uri("tank/vol0@monday");
    let out = python("change_maps.py", &["backup", &uri, &snap_uri, "monday"]);
    assert!(out.contains("identical"), "{out}");

    // A later snapshot's export offers the map since the earlier one, and it is the head's
    // (nothing changed since the later snapshot).
    env.ok(&["snapshot", "tank/vol0@tuesday"]);
    let tuesday = tcp_uri(&server, "tank/vol0@tuesday");
    assert_eq!(
        listed_contexts(&tuesday),
        ["base:allocation", "oxpool:changed-since:monday"]
    );
    assert_eq!(nbdinfo_map(&tuesday, "monday"), map);
    assert_eq!(
        listed_contexts(&uri),
        [
            "base:allocation",
            "oxpool:changed-since:monday",
            "oxpool:changed-since:tuesday"
        ]
    );
    let since_tuesday = nbdinfo_map(&uri, "tuesday");
    assert_eq!(
        since_tuesday,
        [(0, 64 * MIB, 0)],
        "nothing changed since @tuesday"
    );

    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    let audit = env.ok(&["audit", "tank"]);
    assert!(!audit.is_empty());
}

/// Whether `map` ("OFFSET LENGTH FLAGS" lines) flags the byte at `at`.
fn flags_at(map: &str, at: u64) -> bool {
    map.lines()
        .filter_map(|line| {
            let w: Vec<u64> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            (w.len() == 3).then(|| (w[0], w[1], w[2]))
        })
        .find(|&(off, len, _)| off <= at && at < off + len)
        .unwrap_or_else(|| panic!("no extent at {at}: {map}"))
        .2
        == 1
}

#[test]
fn a_client_keeps_the_base_it_chose_across_a_rotation_of_snapshot_names() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    env.ok(&["snapshot", "tank/vol0@cur"]);
    let later = 8 * MIB;
    let mut client = Command::new(PYTHON)
        .arg(script("change_maps.py"))
        .args(["across", &uri, "cur", &later.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start change_maps.py across");
    let mut line = String::new();
    BufReader::new(client.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "open", "change_maps.py did not connect");

    // The rotation a backup tool does: the base it copied from becomes @prev, a new @cur
    // marks where the next backup starts.
    env.ok(&["rename", "tank/vol0@cur", "tank/vol0@prev"]);
    env.ok(&["snapshot", "tank/vol0@cur"]);
    let map = release(client);
    // The connected client's map is still since the snapshot it chose (now @prev): the
    // write before the rotation is flagged. Resolved by name per request, it would be
    // since the new @cur, and a backup would miss that block.
    assert!(flags_at(&map, 0), "the write before the rotation: {map}");
    assert!(flags_at(&map, later), "the write after it: {map}");
    assert!(!flags_at(&map, UNTOUCHED.0), "never written: {map}");

    // A new client of the name gets the new snapshot: only the later write.
    let now = python("change_maps.py", &["map", &uri, "cur"]);
    assert!(!flags_at(&now, 0), "{now}");
    assert!(flags_at(&now, later), "{now}");
    let prev = python("change_maps.py", &["map", &uri, "prev"]);
    assert_eq!(prev.trim(), map, "@prev's map is what the first client saw");

    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
