//! `oxpool rename`, on a pool no server owns and on a served one: volumes, snapshots (with the
//! short forms `@NEW` and `NEW`) and bookmarks take their new names; a served volume's NBD
//! client stays connected across its rename and its writes land in the renamed volume;
//! `nbdinfo --list` offers the new names and not the old; the default export (empty name)
//! follows its volume; every refusal is one line and changes nothing; and a `kill -9` of the
//! server right after a rename returns loses nothing of it.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{exports, release, script, tcp_uri, tool, Env, PYTHON};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Every name `list -t all` shows, one a line, without the header.
fn names(env: &Env) -> String {
    env.ok(&["list", "-H", "-t", "all", "-o", "name"])
}

/// `write_across.py` on `uri`, once it has written its first block.
fn writer(uri: &str) -> Child {
    let mut child = Command::new(PYTHON)
        .arg(script("write_across.py"))
        .arg(uri)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start write_across.py");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "open", "write_across.py did not open {uri}");
    child
}

/// Pool `tank`: `vol0` with snapshot @s1 and bookmark #b1, `vol1` with @s1, and `clone0`,
/// a clone of vol0@s1.
fn lineage(env: &Env) {
    env.tank(&[("vol0", "16M", &[]), ("vol1", "16M", &[])]);
    env.ok(&["snapshot", "tank/vol0@s1", "tank/vol1@s1"]);
    env.ok(&["bookmark", "tank/vol0@s1", "tank/vol0#b1"]);
    env.ok(&["clone", "tank/vol0@s1", "tank/clone0"]);
}

/// The refusals, each one line naming why, each changing nothing (unserved or served).
fn refusals(env: &Env, when: &str) {
    let before = names(env);
    for (args, why) in [
        (["tank/vol0", "tank/vol1"], "exists"),
        (["tank/nope", "tank/x"], "not found"),
        (["tank/vol0", "tank/bad name"], "invalid volume name"),
        (["tank/vol0", "other/vol0"], "does not move between pools"),
        (["tank", "tank2"], "import"),
        (["tank/vol0@s1", "tank/vol1@s2"], "stays with its volume"),
        (["tank/vol0@s1", "@x@y"], "cannot rename"),
        (["tank/vol0@nope", "@x"], "not found"),
        (["tank/vol0#b1", "tank/vol1#b1"], "stays with its volume"),
        (["tank/vol0", "tank/vol0@s1"], "keeps its kind"),
    ] {
        let mut full = vec!["rename"];
        full.extend(args);
        let e = env.fails(&full);
        assert!(e.contains(why), "{when}: rename {args:?}: {e}");
        assert_eq!(
            names(env),
            before,
            "{when}: rename {args:?} changed something"
        );
    }
}

#[test]
fn rename_unserved_then_served_and_refusals_change_nothing() {
    let env = Env::new();
    lineage(&env);
    refusals(&env, "not served");
    env.ok(&["rename", "tank/vol0", "tank/disk"]);
    env.ok(&["rename", "tank/disk@s1", "@first"]);
    env.ok(&["rename", "tank/disk#b1", "mark"]);
    let got = names(&env);
    for want in ["tank/disk\n", "tank/disk@first\n", "tank/disk#mark\n"] {
        assert!(got.contains(want), "{want} missing: {got}");
    }
    assert!(!got.contains("vol0"), "{got}");
    // The clone's origin follows both renames.
    let origin = env.ok(&["get", "-H", "-o", "value", "origin", "tank/clone0"]);
    assert_eq!(origin.trim(), "tank/disk@first");

    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["rename", "tank/disk@first", "tank/disk@s1"]);
    env.ok(&["rename", "tank/disk", "tank/vol0"]);
    env.ok(&["rename", "tank/vol0#mark", "#b1"]);
    refusals(&env, "served");
    let listed = exports(&server);
    assert!(
        listed.contains("tank/vol0\n") && listed.contains("tank/vol0@s1"),
        "{listed}"
    );
    assert!(!listed.contains("disk"), "{listed}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    let got = names(&env);
    for want in ["tank/vol0\n", "tank/vol0@s1\n", "tank/vol0#b1\n"] {
        assert!(got.contains(want), "{want} missing after the server: {got}");
    }
    env.ok(&["audit", "tank"]);
}

#[test]
fn a_served_volume_keeps_its_client_across_a_rename_and_is_offered_under_the_new_name() {
    let env = Env::new();
    lineage(&env);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let client = writer(&tcp_uri(&server, "tank/vol0"));
    let snap_reader = harness::hold_reading(&tcp_uri(&server, "tank/vol0@s1"));
    env.ok(&["rename", "tank/vol0", "tank/disk"]);
    // The client's connection goes on, and its writes land in the renamed volume.
    assert_eq!(release(client), "wrote");
    assert_eq!(release(snap_reader), "still connected");
    let listed = exports(&server);
    assert!(
        listed.contains("tank/disk\n") && listed.contains("tank/disk@s1"),
        "{listed}"
    );
    assert!(!listed.contains("tank/vol0"), "{listed}");
    // What the client wrote, read through the new name by another client.
    let out = env.path("head.raw");
    tool(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &tcp_uri(&server, "tank/disk"),
            out.to_str().unwrap(),
        ],
    );
    let bytes = std::fs::read(&out).unwrap();
    assert!(bytes[..4096].iter().all(|b| *b == 0x11));
    assert!(bytes[4096..8192].iter().all(|b| *b == 0x22));
    // The old name is offered no more.
    let old = Command::new("nbdinfo")
        .arg("--size")
        .arg(tcp_uri(&server, "tank/vol0"))
        .output()
        .unwrap();
    assert!(!old.status.success(), "tank/vol0 is still offered");
    // A snapshot renamed: its export too, and a reader of it keeps reading.
    let snap_reader = harness::hold_reading(&tcp_uri(&server, "tank/disk@s1"));
    env.ok(&["rename", "tank/disk@s1", "s2"]);
    assert_eq!(release(snap_reader), "still connected");
    let listed = exports(&server);
    assert!(
        listed.contains("tank/disk@s2") && !listed.contains("tank/disk@s1"),
        "{listed}"
    );
    // A change map names its base when asked: the new name, which still finds what the
    // client wrote after it (the first block), and not the old one.
    let uri = tcp_uri(&server, "tank/disk");
    let map = tool("nbdinfo", &["--map=oxpool:changed-since:s2", &uri]);
    let first: Vec<&str> = map
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert!(
        first.len() >= 3 && first[0] == "0" && first[2] != "0",
        "the write after @s2 is not in its change map: {map}"
    );
    let old = Command::new("nbdinfo")
        .args(["--map=oxpool:changed-since:s1", &uri])
        .output()
        .unwrap();
    assert!(!old.status.success(), "a change map since the old name");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn the_default_export_follows_its_volume() {
    let env = Env::new();
    env.tank(&[("only", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let default = format!("nbd://{}", server.tcp_addr());
    assert_eq!(
        tool("nbdinfo", &["--size", &default]).trim(),
        (16u64 << 20).to_string()
    );
    env.ok(&["rename", "tank/only", "tank/renamed"]);
    // The same volume (same dataset guid) under a new name: an empty name still reaches it.
    assert_eq!(
        tool("nbdinfo", &["--size", &default]).trim(),
        (16u64 << 20).to_string()
    );
    let listed = exports(&server);
    assert!(
        listed.contains("tank/renamed") && !listed.contains("tank/only"),
        "{listed}"
    );
    // Renamed while not offered (`unshare`), then offered again: still the default.
    env.ok(&["unshare", "tank/renamed"]);
    env.ok(&["rename", "tank/renamed", "tank/again"]);
    env.ok(&["share", "tank/again"]);
    assert_eq!(
        tool("nbdinfo", &["--size", &default]).trim(),
        (16u64 << 20).to_string(),
        "the default export did not follow a rename made while it was not offered"
    );
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn a_kill_9_right_after_a_rename_returns_keeps_the_new_name() {
    let env = Env::new();
    lineage(&env);
    // No periodic txg would save a rename that did not sync before returning.
    env.ok(&["set", "txg_timeout=3600", "tank"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["rename", "tank/vol1", "tank/renamed"]);
    env.ok(&["rename", "tank/vol0@s1", "@kept"]);
    env.ok(&["rename", "tank/vol0#b1", "#mark"]);
    server.kill9();
    // The next command imports the pool the dead server left, as after a crash.
    let got = names(&env);
    for want in [
        "tank/renamed\n",
        "tank/renamed@s1\n",
        "tank/vol0@kept\n",
        "tank/vol0#mark\n",
    ] {
        assert!(got.contains(want), "{want} missing after kill -9: {got}");
    }
    assert!(
        !got.contains("tank/vol1") && !got.contains("tank/vol0@s1") && !got.contains("#b1"),
        "{got}"
    );
    env.ok(&["audit", "tank"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let listed = exports(&server);
    assert!(
        listed.contains("tank/renamed") && listed.contains("tank/vol0@kept"),
        "{listed}"
    );
    assert!(!listed.contains("tank/vol1"), "{listed}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn a_volume_served_read_only_stays_read_only_under_its_new_name() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--read-only", "tank/vol0"]);
    env.ok(&["rename", "tank/vol0", "tank/disk"]);
    let info = |export: &str| tool("nbdinfo", &[&tcp_uri(&server, export)]);
    assert!(info("tank/disk").contains("is_read_only: true"));
    // Offered again later (unshare, share), it is still the volume `--read-only` named.
    env.ok(&["unshare", "tank/disk"]);
    env.ok(&["share", "tank/disk"]);
    assert!(
        info("tank/disk").contains("is_read_only: true"),
        "{}",
        info("tank/disk")
    );
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}
