//! Snapshots, clones and rollbacks of served volumes, with the real clients: qemu-img writes
//! and compares, nbdinfo lists the snapshot exports, hold.py keeps an export open.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{exports, hold_reading, put, random_bytes, release, tcp_uri, tool, Env};

fn write_file(env: &Env, name: &str, seed: u64, len: usize) -> String {
    let path = env.path(name);
    std::fs::write(&path, random_bytes(seed, len)).unwrap();
    path.to_str().unwrap().to_string()
}

/// `qemu-img compare` of an export with a raw file: identical bytes, or it fails.
fn same(uri: &str, file: &str) -> bool {
    let out = std::process::Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", uri, file])
        .output()
        .expect("run qemu-img compare");
    out.status.success()
}

#[test]
fn a_snapshot_export_keeps_the_bytes_written_before_it() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = write_file(&env, "first.raw", 1, 8 << 20);
    let second = write_file(&env, "second.raw", 2, 8 << 20);
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@one"]);
    // Listed by nbdinfo at once, read-only.
    let listed = exports(&server);
    assert!(listed.contains("tank/vol0@one"), "{listed}");
    let info = tool("nbdinfo", &[&tcp_uri(&server, "tank/vol0@one")]);
    assert!(info.contains("is_read_only: true"), "{info}");
    // Overwrite the volume: the snapshot keeps the first bytes, the head has the second.
    put(&second, &tcp_uri(&server, "tank/vol0"));
    assert!(
        same(&tcp_uri(&server, "tank/vol0@one"), &first),
        "snapshot changed"
    );
    assert!(
        same(&tcp_uri(&server, "tank/vol0"), &second),
        "head lost its writes"
    );
    assert!(!same(&tcp_uri(&server, "tank/vol0@one"), &second));
    // A snapshot export refuses writes.
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw", &second])
        .arg(tcp_uri(&server, "tank/vol0@one"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "a snapshot export took a write");
    assert!(same(&tcp_uri(&server, "tank/vol0@one"), &first));
    // Listings and properties.
    let list = env.ok(&["list", "-t", "snapshot", "-p", "-H"]);
    assert!(list.contains("tank/vol0@one"), "{list}");
    // Every block was overwritten: the snapshot alone holds at least the whole first copy
    // (space figures are those of the last txg, as in ZFS: a second snapshot syncs one).
    env.ok(&["snapshot", "tank/vol0@two"]);
    let got = env.ok(&[
        "get",
        "-p",
        "-H",
        "-o",
        "value",
        "usedbysnapshots",
        "tank/vol0",
    ]);
    let bytes: u64 = got
        .trim_end()
        .parse()
        .ok()
        .unwrap_or_else(|| panic!("no value in {got}"));
    assert!(bytes >= 8 << 20, "usedbysnapshots {bytes}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    // The pool audits clean, exported, and the snapshot is still there after import.
    env.ok(&["audit", "tank"]);
    let list = env.ok(&["list", "-t", "all"]);
    assert!(
        list.contains("tank/vol0@one") && list.contains("tank/vol0 "),
        "{list}"
    );
    // Chosen columns, scripted: one tab-separated line per dataset.
    let list = env.ok(&[
        "list",
        "-t",
        "all",
        "-o",
        "name,type,createtxg,userrefs",
        "-H",
    ]);
    let lines: Vec<Vec<&str>> = list.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert_eq!(lines[0][..2], ["tank/vol0", "volume"], "{list}");
    assert_eq!(lines[1][..2], ["tank/vol0@one", "snapshot"], "{list}");
    assert!(
        lines[1][2].parse::<u64>().unwrap() > 0 && lines[1][3] == "0",
        "{list}"
    );
    let e = env.fails(&["list", "-t", "snapshot", "-o", "name,bogus"]);
    assert!(e.contains("bogus"), "{e}");
    // AVAIL, as zfs list's: the default listing has it after USED; exact with -p, the
    // `available` property's figure, below the pool's FREE (the reserve is kept out); `-`
    // for a snapshot.
    let header = env.ok(&["list", "-t", "all"]);
    assert!(header.starts_with("NAME") && header.contains(" USED ") && header.contains("AVAIL"));
    let rows = env.ok(&["list", "-t", "all", "-p", "-H", "-o", "name,avail"]);
    let rows: Vec<Vec<&str>> = rows.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows[0][0], "tank/vol0");
    assert_eq!(rows[1][..], ["tank/vol0@one", "-"]);
    let available: u64 = rows[0][1].parse().unwrap();
    let prop = env.ok(&["get", "-p", "-H", "-o", "value", "available", "tank/vol0"]);
    // Two commands, each opening the pool: the figure may move by what an open writes.
    let prop: u64 = prop.trim().parse().unwrap();
    assert!(prop.abs_diff(available) < 1 << 20, "{prop} and {available}");
    let free = env.ok(&["list", "-p", "-H", "-o", "free", "tank"]);
    let free: u64 = free.trim().parse().unwrap();
    assert!(
        available < free && available > free / 2,
        "{available} of {free}"
    );
}

#[test]
fn a_clone_is_written_while_its_origin_stays() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = write_file(&env, "first.raw", 3, 8 << 20);
    let second = write_file(&env, "second.raw", 4, 8 << 20);
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@base"]);
    env.ok(&["clone", "tank/vol0@base", "tank/copy"]);
    assert!(exports(&server).contains("tank/copy"));
    assert!(
        same(&tcp_uri(&server, "tank/copy"), &first),
        "the clone is not its origin"
    );
    put(&second, &tcp_uri(&server, "tank/copy"));
    assert!(same(&tcp_uri(&server, "tank/copy"), &second));
    assert!(
        same(&tcp_uri(&server, "tank/vol0@base"), &first),
        "the origin changed"
    );
    assert!(
        same(&tcp_uri(&server, "tank/vol0"), &first),
        "the origin's volume changed"
    );
    let origin = env.ok(&["get", "origin", "tank/copy"]);
    assert!(origin.contains("tank/vol0@base"), "{origin}");
    // The origin of a clone cannot be destroyed; the reason is given.
    let e = env.fails(&["destroy", "tank/vol0@base"]);
    assert!(e.contains("origin of tank/copy"), "{e}");
    // A held snapshot cannot be destroyed either.
    env.ok(&["snapshot", "tank/copy@s1"]);
    env.ok(&["hold", "keep", "tank/copy@s1"]);
    let e = env.fails(&["destroy", "tank/copy@s1"]);
    assert!(e.contains("held") && e.contains("keep"), "{e}");
    assert!(env.ok(&["holds", "tank/copy@s1"]).contains("keep"));
    // Scripted, as `zfs holds -H`: no header, one tab between the fields.
    env.ok(&["hold", "daily", "tank/copy@s1"]);
    assert_eq!(
        env.ok(&["holds", "-H", "tank/copy@s1"]),
        "tank/copy@s1\tdaily\ntank/copy@s1\tkeep\n"
    );
    env.ok(&["release", "daily", "tank/copy@s1"]);
    // Several snapshots: checked whole first; one that cannot be held or released fails
    // the command with nothing changed.
    env.ok(&["snapshot", "tank/copy@s2"]);
    let e = env.fails(&["hold", "keep", "tank/copy@s2", "tank/copy@s1"]);
    assert!(e.contains("already exists"), "{e}");
    let e = env.fails(&["hold", "keep", "tank/copy@s2", "tank/copy@nosuch"]);
    assert!(e.contains("not found"), "{e}");
    let e = env.fails(&["hold", "twice", "tank/copy@s2", "tank/copy@s2"]);
    assert!(e.contains("named twice"), "{e}");
    assert!(!env.ok(&["holds", "tank/copy@s2"]).contains("keep"));
    let e = env.fails(&["release", "keep", "tank/copy@s1", "tank/copy@s2"]);
    assert!(e.contains("not found"), "{e}");
    assert!(env.ok(&["holds", "tank/copy@s1"]).contains("keep"));
    env.ok(&["release", "keep", "tank/copy@s1"]);
    env.ok(&["destroy", "tank/copy@s2"]);
    let e = env.fails(&["vol", "destroy", "tank/copy"]);
    assert!(e.contains("snapshot"), "{e}");
    // -n -v -d: what would go now and what would be marked; nothing changes.
    env.ok(&["snapshot", "tank/vol0@plain"]);
    let plan = env.ok(&["destroy", "-n", "-v", "-d", "tank/vol0@base,plain"]);
    assert!(
        plan.contains("would destroy tank/vol0@plain\n")
            && plan.contains("would mark tank/vol0@base: held or cloned")
            && plan.contains("would reclaim "),
        "{plan}"
    );
    // -p alone implies -v, as zfs destroy -p.
    let plan = env.ok(&["destroy", "-n", "-p", "-d", "tank/vol0@base,plain"]);
    assert!(
        plan.starts_with("destroy\ttank/vol0@plain\ndefer\ttank/vol0@base\nreclaim\t"),
        "{plan}"
    );
    assert!(env
        .ok(&["get", "defer_destroy", "tank/vol0@base"])
        .contains("off"));
    // -p without -n: the plan's lines, and done.
    let said = env.ok(&["destroy", "-p", "tank/vol0@plain"]);
    assert!(
        said.starts_with("destroy\ttank/vol0@plain\nreclaim\t"),
        "{said}"
    );
    // -d marks the origin; it goes with its clone.
    let out = env.ok(&["destroy", "-v", "-d", "tank/vol0@base"]);
    assert!(
        out.contains("will mark tank/vol0@base: held or cloned")
            && out
                .matches("destroyed when its last hold and clone go")
                .count()
                == 1,
        "{out}"
    );
    assert!(env
        .ok(&["get", "defer_destroy", "tank/vol0@base"])
        .contains("on"));
    assert!(exports(&server).contains("tank/vol0@base"));
    env.ok(&["vol", "destroy", "-r", "tank/copy"]);
    assert!(!exports(&server).contains("tank/vol0@base"));
    assert!(!env
        .ok(&["list", "-t", "snapshot"])
        .contains("tank/vol0@base"));
    env.ok(&["audit", "tank"]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn rollback_of_a_served_volume_disconnects_its_clients_only_with_f() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = write_file(&env, "first.raw", 5, 8 << 20);
    let second = write_file(&env, "second.raw", 6, 8 << 20);
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@good"]);
    put(&second, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@later"]);
    let client = hold_reading(&tcp_uri(&server, "tank/vol0"));
    // Not the latest: refused without -r; open: refused without -f. Nothing changed.
    let e = env.fails(&["rollback", "tank/vol0@good"]);
    assert!(e.contains("not the latest") && e.contains("later"), "{e}");
    let e = env.fails(&["rollback", "-r", "tank/vol0@good"]);
    assert!(
        e.contains("cannot roll back 'tank/vol0': it is open by 1 NBD client")
            && e.contains("rollback -f"),
        "{e}"
    );
    assert!(exports(&server).contains("tank/vol0@later"));
    assert!(same(&tcp_uri(&server, "tank/vol0"), &second));
    // With -f: the client is disconnected, the later snapshot destroyed, and a client that
    // reconnects reads the snapshot's bytes.
    env.ok(&["rollback", "-r", "-f", "tank/vol0@good"]);
    let said = release(client);
    assert!(said.starts_with("disconnected"), "{said}");
    assert!(
        same(&tcp_uri(&server, "tank/vol0"), &first),
        "not rolled back"
    );
    assert!(!exports(&server).contains("tank/vol0@later"));
    assert!(same(&tcp_uri(&server, "tank/vol0@good"), &first));
    // A snapshot export open by a client cannot be destroyed.
    let reader = hold_reading(&tcp_uri(&server, "tank/vol0@good"));
    let e = env.fails(&["destroy", "tank/vol0@good"]);
    assert!(e.contains("tank/vol0@good") && e.contains("open"), "{e}");
    assert_eq!(release(reader), "still connected");
    // -n -v says what would go and changes nothing.
    let out = env.ok(&["destroy", "-n", "-v", "tank/vol0@good"]);
    assert!(
        out.contains("would destroy tank/vol0@good") && out.contains("would reclaim"),
        "{out}"
    );
    assert!(exports(&server).contains("tank/vol0@good"));
    // As the refusal says, -f disconnects the snapshot's client and destroys it.
    let reader = hold_reading(&tcp_uri(&server, "tank/vol0@good"));
    let e = env.fails(&["destroy", "tank/vol0@good"]);
    assert!(
        e.contains("cannot destroy 'tank/vol0@good': it is open by 1 NBD client")
            && e.contains("-f disconnects"),
        "{e}"
    );
    env.ok(&["destroy", "-f", "tank/vol0@good"]);
    let said = release(reader);
    assert!(said.starts_with("disconnected"), "{said}");
    assert!(!exports(&server).contains("tank/vol0@good"));
    assert!(!env
        .ok(&["list", "-t", "snapshot"])
        .contains("tank/vol0@good"));
    env.ok(&["audit", "tank"]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn bad_snapshot_names_get_one_line_errors() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    for args in [
        &["snapshot", "tank/vol0"][..],
        &["snapshot", "tank/vol0@"],
        &["snapshot", "tank/vol0@a@b"],
        &["snapshot", "tank/nosuch@a"],
        &["rollback", "tank/vol0@nosuch"],
        &["destroy", "tank/vol0@nosuch"],
        &["clone", "tank/vol0@nosuch", "tank/c"],
        &["list", "-t", "filesystem"],
    ] {
        env.fails(args);
    }
    env.ok(&["snapshot", "tank/vol0@a"]);
    let e = env.fails(&["snapshot", "tank/vol0@a"]);
    assert!(e.contains("already exists"), "{e}");
    let e = env.fails(&["snapshot", "tank/vol0@a@b"]);
    assert!(e.contains("POOL/VOL@SNAP"), "{e}");
    // Two of one volume in one command: refused, nothing taken (taken together they made a
    // pool that no longer imported), and the pool still opens.
    let before = env.ok(&["list", "-t", "snapshot", "-H", "-p"]);
    let e = env.fails(&["snapshot", "tank/vol0@b", "tank/vol0@c"]);
    assert!(e.contains("one snapshot at a time"), "{e}");
    assert_eq!(env.ok(&["list", "-t", "snapshot", "-H", "-p"]), before);
    env.ok(&["audit", "tank"]);
}

#[test]
fn promote_lets_the_original_volume_go() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = write_file(&env, "first.raw", 7, 8 << 20);
    let second = write_file(&env, "second.raw", 8, 8 << 20);
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@base"]);
    env.ok(&["clone", "tank/vol0@base", "tank/new"]);
    put(&second, &tcp_uri(&server, "tank/new"));
    let e = env.fails(&["promote", "tank/vol0"]);
    assert!(e.contains("not a clone"), "{e}");
    env.ok(&["promote", "tank/new"]);
    // The snapshot moved, with its export; the old volume is now the clone.
    let listed = exports(&server);
    assert!(
        listed.contains("tank/new@base") && !listed.contains("tank/vol0@base"),
        "{listed}"
    );
    assert!(env
        .ok(&["get", "origin", "tank/vol0"])
        .contains("tank/new@base"));
    assert_eq!(
        env.ok(&["get", "-H", "origin", "tank/new"]),
        "tank/new\torigin\t-\t-\n"
    );
    assert!(same(&tcp_uri(&server, "tank/new@base"), &first));
    env.ok(&["vol", "destroy", "tank/vol0"]);
    assert!(
        same(&tcp_uri(&server, "tank/new"), &second),
        "the promoted volume changed"
    );
    assert!(same(&tcp_uri(&server, "tank/new@base"), &first));
    env.ok(&["audit", "tank"]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// What `unshare` (or `recv -u`) leaves out stays out: new snapshots follow their volume, and a
/// `vol destroy`, `destroy`, `destroy -d` or `promote` that fails, or a promote that moves a
/// snapshot, never offers again one that was not offered.
#[test]
fn what_unshare_leaves_out_stays_out() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let offered = |name: &str| exports(&server).contains(&format!("export=\"{name}\""));
    env.ok(&["unshare", "tank/vol0"]);
    env.ok(&["snapshot", "tank/vol0@a"]);
    assert!(!offered("tank/vol0") && !offered("tank/vol0@a"));
    env.ok(&["share", "tank/vol0"]);
    env.ok(&["snapshot", "tank/vol0@b"]);
    assert!(offered("tank/vol0") && offered("tank/vol0@b") && !offered("tank/vol0@a"));
    // A failed vol destroy (it has snapshots) leaves the volume as it was: unshared.
    env.ok(&["unshare", "tank/vol0"]);
    let e = env.fails(&["vol", "destroy", "tank/vol0"]);
    assert!(e.contains("snapshot"), "{e}");
    assert!(
        !offered("tank/vol0"),
        "a failed vol destroy offered the volume"
    );
    // A destroy of @a and @b refused (a client has @b open) leaves @a unshared.
    let client = hold_reading(&tcp_uri(&server, "tank/vol0@b"));
    let e = env.fails(&["destroy", "tank/vol0@a,b"]);
    assert!(e.contains("NBD client"), "{e}");
    assert!(!offered("tank/vol0@a"), "a failed destroy offered @a");
    assert!(offered("tank/vol0@b"));
    // A dry run meets the same refusal (of the volume's -r too), and -v plans nothing
    // before a refusal.
    let e = env.fails(&["destroy", "-n", "-v", "tank/vol0@a,b"]);
    assert!(e.contains("NBD client") && e.contains("tank/vol0@b"), "{e}");
    let e = env.fails(&["destroy", "-n", "-r", "tank/vol0"]);
    assert!(e.contains("NBD client") && e.contains("tank/vol0@b"), "{e}");
    let out = env.run(&["destroy", "-v", "tank/vol0@a,b"]);
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(!offered("tank/vol0@a") && offered("tank/vol0@b"));
    release(client);
    // destroy -d of a held snapshot marks it; unshared, it stays so.
    env.ok(&["hold", "keep", "tank/vol0@a"]);
    let said = env.ok(&["destroy", "-d", "tank/vol0@a"]);
    assert!(said.contains("held or cloned"), "{said}");
    assert!(!offered("tank/vol0@a"), "a marked snapshot was offered");
    // The last hold's release destroys it, and says so (on a served pool it may cut off
    // the snapshot's readers).
    let said = env.ok(&["release", "keep", "tank/vol0@a"]);
    assert!(
        said.contains("tank/vol0@a destroyed") && said.contains("last hold"),
        "{said}"
    );
    // A promote moves @b (offered) and a new @c (not offered: it followed its unshared
    // volume) to the clone, each as it was.
    env.ok(&["snapshot", "tank/vol0@c"]);
    assert!(!offered("tank/vol0@c"));
    env.ok(&["clone", "tank/vol0@c", "tank/new"]);
    env.ok(&["promote", "tank/new"]);
    assert!(offered("tank/new@b") && !offered("tank/vol0@b"));
    assert!(
        !offered("tank/new@c"),
        "promote offered an unshared snapshot"
    );
    env.ok(&["audit", "tank"]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// The value of a one-property `oxpool get -p -H`, checking its exact form: one line,
/// `TARGET<TAB>PROPERTY<TAB>VALUE<TAB>-` (a statistic has no source).
fn get_exact(env: &Env, prop: &str, target: &str) -> u64 {
    let out = env.ok(&["get", "-p", "-H", prop, target]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let value = lines[0].split('\t').nth(2).unwrap_or_default();
    assert_eq!(lines[0], format!("{target}\t{prop}\t{value}\t-"), "{out}");
    value
        .parse()
        .unwrap_or_else(|_| panic!("not exact bytes: {out}"))
}

/// `written@SNAP` of a volume and of a later snapshot, `logicalreferenced` of snapshots, and
/// `list -o written@SNAP,logicalreferenced -p`: exact bytes, the same figure wherever the
/// tree is the same; a bad or later snapshot is a one-line error.
#[test]
fn written_since_a_snapshot_and_logicalreferenced() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &["compression=off"])]);
    let w = |name: &str, seed: u64, len: usize, offset: u64| {
        let f = write_file(&env, name, seed, len);
        env.ok(&[
            "vol",
            "write",
            "tank/vol0",
            "--offset",
            &offset.to_string(),
            &f,
        ]);
    };
    w("a.raw", 11, 1 << 20, 0);
    env.ok(&["snapshot", "tank/vol0@snap1"]);
    w("b.raw", 12, 512 << 10, 0);
    env.ok(&["snapshot", "tank/vol0@snap2"]);
    w("c.raw", 13, 256 << 10, 4 << 20);
    env.ok(&["snapshot", "tank/vol0@snap3"]);
    // Since snap1: the 768 KiB of data written after it (compression off), and the indirect
    // blocks above them (a few of at most 32 KiB, two copies).
    let head = get_exact(&env, "written@snap1", "tank/vol0");
    assert!(
        ((768 << 10)..=(768 << 10) + 4 * 2 * (32 << 10)).contains(&head),
        "written@snap1 {head}"
    );
    // Nothing written after snap3: the head is snap3's tree, the same figure.
    assert_eq!(get_exact(&env, "written@snap1", "tank/vol0@snap3"), head);
    assert_eq!(get_exact(&env, "written@snap3", "tank/vol0"), 0);
    // Against the snapshot just before, a snapshot's written@ is its `written`.
    assert_eq!(
        get_exact(&env, "written@snap2", "tank/vol0@snap3"),
        get_exact(&env, "written", "tank/vol0@snap3")
    );
    // The data blocks' bytes before compression (here: as written).
    assert_eq!(
        get_exact(&env, "logicalreferenced", "tank/vol0@snap1"),
        1 << 20
    );
    assert_eq!(
        get_exact(&env, "logicalreferenced", "tank/vol0@snap3"),
        (1 << 20) + (256 << 10)
    );
    // A column of `list`, exact with -p; "-" where snap1 is not older.
    let list = env.ok(&[
        "list",
        "-t",
        "all",
        "-p",
        "-H",
        "-o",
        "name,written@snap1,logicalreferenced",
    ]);
    let rows: Vec<Vec<&str>> = list.lines().map(|l| l.split('\t').collect()).collect();
    let head_s = head.to_string();
    let snap2 = get_exact(&env, "written@snap1", "tank/vol0@snap2").to_string();
    assert_eq!(
        rows,
        [
            ["tank/vol0", head_s.as_str(), "1310720"],
            ["tank/vol0@snap1", "-", "1048576"],
            ["tank/vol0@snap2", snap2.as_str(), "1048576"],
            ["tank/vol0@snap3", head_s.as_str(), "1310720"],
        ],
        "{list}"
    );
    let list = env.ok(&["list", "-t", "snapshot", "-o", "name,written@snap1"]);
    assert!(
        list.starts_with("NAME") && list.contains("WRITTEN@SNAP1"),
        "{list}"
    );
    // One-line errors: no such snapshot, not older, no name.
    let e = env.fails(&["get", "written@nosuch", "tank/vol0"]);
    assert!(e.contains("tank/vol0@nosuch: not found"), "{e}");
    let e = env.fails(&["get", "written@snap3", "tank/vol0@snap1"]);
    assert!(e.contains("not older than tank/vol0@snap1"), "{e}");
    env.fails(&["get", "written@", "tank/vol0"]);
    env.ok(&["audit", "tank"]);
}

/// `hold -r`, `release -r` and `holds -r` with `POOL@SNAP` cover that snapshot of every
/// volume that has it (tank/c has none and is passed over), as their `zfs` namesakes do for
/// a pool's descendants; `-r POOL/VOL@SNAP` is that snapshot alone; without -r a pool's
/// snapshot is refused with -r named. A release refused on one volume releases none.
#[test]
fn hold_release_and_holds_recursive_cover_every_volume() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "8M", &[]), ("c", "8M", &[])]);
    env.ok(&["snapshot", "tank/a@s", "tank/b@s"]);
    let holds = || env.ok(&["holds", "-H", "-r", "tank@s"]);
    let e = env.fails(&["hold", "keep", "tank@s"]);
    assert!(e.contains("-r names that snapshot of every volume"), "{e}");
    assert_eq!(holds(), "");
    env.ok(&["hold", "-r", "keep", "tank@s"]);
    assert_eq!(holds(), "tank/a@s\tkeep\ntank/b@s\tkeep\n");
    let e = env.fails(&["destroy", "tank/b@s"]);
    assert!(e.contains("held"), "{e}");
    env.ok(&["release", "-r", "keep", "tank/a@s"]);
    assert_eq!(holds(), "tank/b@s\tkeep\n");
    let e = env.fails(&["release", "-r", "keep", "tank@s"]);
    assert!(
        e.contains("tank/a@s") && e.contains("nothing released"),
        "{e}"
    );
    assert_eq!(holds(), "tank/b@s\tkeep\n");
    env.ok(&["hold", "-r", "keep", "tank/a@s"]);
    env.ok(&["release", "-r", "keep", "tank@s"]);
    assert_eq!(holds(), "");
    // A snapshot named on its own beside POOL@SNAP is named once, not refused as twice.
    env.ok(&["hold", "-r", "again", "tank@s", "tank/a@s"]);
    assert_eq!(holds(), "tank/a@s\tagain\ntank/b@s\tagain\n");
    env.ok(&["release", "-r", "again", "tank/a@s", "tank@s"]);
    assert_eq!(holds(), "");
    // POOL@SNAP given twice is the user's own repetition: refused, nothing held.
    let e = env.fails(&["hold", "-r", "again", "tank@s", "tank@s"]);
    assert!(e.contains("named twice"), "{e}");
    assert_eq!(holds(), "");
    let e = env.fails(&["holds", "-r", "tank@nosuch"]);
    assert!(e.contains("no volume of 'tank' has such a snapshot"), "{e}");
    env.ok(&["destroy", "-r", "tank@s"]);
}

/// `snapshot -r POOL@SNAP` takes SNAP of every volume in one command, and `destroy -r
/// POOL@SNAP` destroys it wherever it is, as their `zfs` namesakes do for a pool's
/// descendants; without -r a pool's own snapshot is refused with the -r form named. With no
/// server, then served: the snapshot exports come and go with them, and a destroy refused
/// for an open one (or a held one) destroys none.
#[test]
fn snapshot_and_destroy_recursive_cover_every_volume() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "8M", &[])]);
    let snapshots = || env.ok(&["list", "-H", "-o", "name", "-t", "snapshot"]);
    let e = env.fails(&["snapshot", "tank@s"]);
    assert!(e.contains("snapshot -r tank@s"), "{e}");
    let e = env.fails(&["destroy", "tank@s"]);
    assert!(e.contains("destroy -r tank@s"), "{e}");
    env.ok(&["snapshot", "-r", "tank@s"]);
    assert_eq!(snapshots(), "tank/a@s\ntank/b@s\n");
    // One volume already has it: refused whole.
    env.ok(&["snapshot", "tank/a@t"]);
    let e = env.fails(&["snapshot", "-r", "tank@t"]);
    assert!(e.contains("tank/a@t"), "{e}");
    assert_eq!(snapshots(), "tank/a@s\ntank/a@t\ntank/b@s\n");
    // Held on one volume: nothing destroyed.
    env.ok(&["hold", "keep", "tank/b@s"]);
    let e = env.fails(&["destroy", "-r", "tank@s"]);
    assert!(e.contains("tank/b@s") && e.contains("held"), "{e}");
    assert_eq!(snapshots(), "tank/a@s\ntank/a@t\ntank/b@s\n");
    env.ok(&["release", "keep", "tank/b@s"]);
    let plan = env.ok(&["destroy", "-r", "-n", "-v", "tank@s,t"]);
    assert!(
        plan.contains("would destroy tank/a@s")
            && plan.contains("would destroy tank/a@t")
            && plan.contains("would destroy tank/b@s"),
        "{plan}"
    );
    assert_eq!(snapshots(), "tank/a@s\ntank/a@t\ntank/b@s\n");
    // A volume without it is passed over; a name no volume has is an error.
    env.ok(&["destroy", "-r", "tank@t"]);
    assert_eq!(snapshots(), "tank/a@s\ntank/b@s\n");
    let e = env.fails(&["destroy", "-r", "tank@nosuch"]);
    assert!(e.contains("no volume of 'tank' has such a snapshot"), "{e}");
    // `@%` is every snapshot; a volume with none is passed over (tank/c), and named alone
    // it has nothing to destroy.
    env.ok(&["vol", "create", "tank/c", "--size", "8M"]);
    let e = env.fails(&["destroy", "tank/c@%"]);
    assert!(e.contains("could not find any snapshots"), "{e}");
    env.ok(&["destroy", "-r", "tank@%"]);
    assert_eq!(snapshots(), "");

    // Served: exported as taken; refused while one is open, and then none goes.
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["snapshot", "-r", "tank@u"]);
    let listed = exports(&server);
    assert!(
        listed.contains("tank/a@u") && listed.contains("tank/b@u"),
        "{listed}"
    );
    let client = hold_reading(&tcp_uri(&server, "tank/b@u"));
    let e = env.fails(&["destroy", "-r", "tank@u"]);
    assert!(e.contains("tank/b@u"), "{e}");
    assert_eq!(snapshots(), "tank/a@u\ntank/b@u\ntank/c@u\n");
    // Deferred too: every volume's exports leave before any snapshot is destroyed.
    let e = env.fails(&["destroy", "-r", "-d", "tank@u"]);
    assert!(e.contains("tank/b@u"), "{e}");
    assert_eq!(snapshots(), "tank/a@u\ntank/b@u\ntank/c@u\n");
    let listed = exports(&server);
    assert!(
        listed.contains("tank/a@u") && listed.contains("tank/b@u"),
        "offered again after the refusal: {listed}"
    );
    assert_eq!(release(client), "still connected");
    harness::until_bounded("the destroy after the client left", || {
        env.run(&["destroy", "-r", "tank@u"]).status.success()
    });
    assert_eq!(snapshots(), "");
    let listed = exports(&server);
    assert!(!listed.contains("@u"), "{listed}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// `destroy -R`, as `zfs destroy -R`: a snapshot with its clone and the clone's own clone
/// (deepest first), or a volume with its snapshots and their clones. Refused in one line,
/// with nothing destroyed, while one of them is held or (without -f) open by a client;
/// -n lists them and changes nothing; afterwards their exports are gone, the origin's data
/// is untouched and the pool audits clean.
#[test]
fn destroy_r_takes_the_clones_along() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[]), ("keep", "8M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = write_file(&env, "first.raw", 31, 8 << 20);
    let second = write_file(&env, "second.raw", 32, 8 << 20);
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@base"]);
    env.ok(&["clone", "tank/vol0@base", "tank/c1"]);
    put(&second, &tcp_uri(&server, "tank/c1"));
    env.ok(&["snapshot", "tank/c1@s"]);
    env.ok(&["clone", "tank/c1@s", "tank/c2"]);
    env.ok(&["snapshot", "tank/vol0@other"]);
    let names = || env.ok(&["list", "-t", "all", "-H", "-o", "name"]);
    let before = names();

    // Without -R the clone refuses, as before.
    let e = env.fails(&["destroy", "tank/vol0@base"]);
    assert!(e.contains("origin of"), "{e}");
    let plan = env.ok(&["destroy", "-n", "-v", "-R", "tank/vol0@base"]);
    let lines: Vec<&str> = plan.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "would destroy tank/c2",
            "would destroy tank/c1@s",
            "would destroy tank/c1",
            "would destroy tank/vol0@base"
        ],
        "{plan}"
    );
    assert!(lines[4].starts_with("would reclaim"), "{plan}");
    let exact = env.ok(&["destroy", "-n", "-p", "-R", "tank/vol0@base"]);
    let reclaim: u64 = exact
        .lines()
        .find_map(|l| l.strip_prefix("reclaim\t"))
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("{exact}"));
    assert!(reclaim >= 8 << 20, "c1's 8 MiB of its own: {exact}");
    assert_eq!(names(), before, "-n destroyed something");

    // A hold on the clone's snapshot, or a client on the deepest clone: refused, nothing
    // destroyed.
    env.ok(&["hold", "mine", "tank/c1@s"]);
    let e = env.fails(&["destroy", "-R", "tank/vol0@base"]);
    assert!(
        e.contains("tank/c1@s is held (mine)") && e.trim().lines().count() == 1,
        "{e}"
    );
    env.ok(&["release", "mine", "tank/c1@s"]);
    let reader = hold_reading(&tcp_uri(&server, "tank/c2"));
    let e = env.fails(&["destroy", "-R", "tank/vol0@base"]);
    assert!(
        e.contains("tank/c2") && e.contains("open") && e.trim().lines().count() == 1,
        "{e}"
    );
    assert_eq!(release(reader), "still connected");
    assert_eq!(names(), before, "a refused destroy -R destroyed something");

    env.ok(&["destroy", "-R", "tank/vol0@base"]);
    let after = names();
    for gone in ["tank/c2", "tank/c1", "tank/c1@s", "tank/vol0@base"] {
        assert!(!after.lines().any(|l| l == gone), "{gone} left: {after}");
        assert!(!exports(&server).lines().any(|l| l.ends_with(gone)));
    }
    assert!(after.lines().any(|l| l == "tank/vol0@other"), "{after}");
    assert!(same(&tcp_uri(&server, "tank/vol0"), &first));
    assert!(same(&tcp_uri(&server, "tank/vol0@other"), &first));

    // A volume: its snapshots and their clones, then it; the other volume stays.
    env.ok(&["clone", "tank/vol0@other", "tank/c3"]);
    env.ok(&["destroy", "-R", "tank/vol0"]);
    let after = names();
    assert!(
        !after.contains("tank/vol0") && !after.contains("tank/c3"),
        "{after}"
    );
    assert!(after.lines().any(|l| l == "tank/keep"), "{after}");
    let e = env.fails(&["destroy", "-R", "tank"]);
    assert!(e.contains("-R is for a volume"), "{e}");

    // A receive saved by recv -s into a copy: its hidden dataset is a clone of the copy's
    // snapshot that only recv -A removes, so -R is refused in one line that says so.
    put(&second, &tcp_uri(&server, "tank/keep"));
    env.ok(&["snapshot", "tank/keep@k1"]);
    put(&first, &tcp_uri(&server, "tank/keep"));
    env.ok(&["snapshot", "tank/keep@k2"]);
    let recv_from = |stream: &[u8], args: &[&str]| {
        let file = env.path("stream");
        std::fs::write(&file, stream).unwrap();
        let mut command = env.oxpool_command();
        command
            .arg("recv")
            .args(args)
            .stdin(std::fs::File::open(&file).unwrap());
        command.output().unwrap()
    };
    let full = env.run(&["send", "tank/keep@k1"]).stdout;
    assert!(recv_from(&full, &["tank/kc"]).status.success());
    let incremental = env.run(&["send", "-i", "@k1", "tank/keep@k2"]).stdout;
    let cut = recv_from(&incremental[..incremental.len() / 2], &["-s", "tank/kc"]);
    assert!(!cut.status.success());
    let e = env.fails(&["destroy", "-R", "tank/kc@k1"]);
    assert!(
        e.contains("receive into tank/kc")
            && e.contains("recv -A tank/kc")
            && e.trim().lines().count() == 1,
        "{e}"
    );
    env.ok(&["recv", "-A", "tank/kc"]);
    env.ok(&["destroy", "-R", "tank/kc"]);
    assert!(!names().contains("tank/kc"));
    env.ok(&["audit", "tank"]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn create_v_reserves_the_volumes_space_unless_sparse() {
    let env = Env::new();
    env.tank(&[]);
    let get = |prop: &str, target: &str| -> String {
        env.ok(&["get", "-p", "-H", "-o", "value", prop, target])
            .trim()
            .to_string()
    };
    let bytes = |prop: &str, target: &str| -> u64 {
        let v = get(prop, target);
        v.parse()
            .unwrap_or_else(|_| panic!("{prop} of {target} = {v}"))
    };
    // As `zfs create -V`: thick, what writing it whole takes reserved; -s sparse.
    env.ok(&["create", "-V", "64M", "tank/thick"]);
    env.ok(&["create", "-s", "-V", "64M", "tank/thin"]);
    env.ok(&["vol", "create", "tank/plain", "--size", "8M"]);
    env.ok(&[
        "create",
        "-V",
        "8M",
        "-o",
        "refreservation=none",
        "tank/told",
    ]);
    let reserved = bytes("refreservation", "tank/thick");
    assert!(
        (68 << 20..70 << 20).contains(&reserved),
        "refreservation {reserved}"
    );
    for thin in ["tank/thin", "tank/plain", "tank/told"] {
        // `none`, 0 with -p (as zfs get).
        assert_eq!(get("refreservation", thin), "0", "{thin}");
        let shown = env.ok(&["get", "-H", "-o", "value", "refreservation", thin]);
        assert_eq!(shown.trim(), "none", "{thin}");
        assert_eq!(bytes("usedbyrefreservation", thin), 0, "{thin}");
    }
    // `auto` follows what the volume is made with, whatever the order of the options.
    env.ok(&[
        "create",
        "-V",
        "64M",
        "-o",
        "copies=2",
        "-b",
        "4K",
        "tank/dense",
    ]);
    let dense = bytes("refreservation", "tank/dense");
    assert!(
        dense > 2 * reserved - (8 << 20),
        "{dense} against {reserved}"
    );
    env.ok(&["destroy", "tank/dense"]);
    // Human without -p.
    let shown = env.ok(&["get", "-H", "-o", "value", "refreservation", "tank/thick"]);
    assert!(shown.trim().ends_with('M'), "{shown}");
    // The listing: USED is the unused reservation, which is the volume's own AVAIL beyond
    // the pool's.
    let rows = env.ok(&[
        "list",
        "-p",
        "-H",
        "-o",
        "name,used,usedrefreserv,refreserv,avail",
        "tank/thick",
        "tank/thin",
    ]);
    let rows: Vec<Vec<u64>> = rows
        .lines()
        .map(|l| l.split('\t').skip(1).map(|c| c.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows[0][..3], [reserved, reserved, reserved], "{rows:?}");
    assert_eq!(rows[1][..3], [0, 0, 0], "{rows:?}");
    assert_eq!(rows[0][3], rows[1][3] + reserved, "{rows:?}");
    let header = env.ok(&["list", "-o", "name,refreserv,usedrefreserv", "tank/thick"]);
    assert!(
        header.contains("REFRESERV") && header.contains("USEDREFRESERV"),
        "{header}"
    );
    // More than the pool has: refused in one line, nothing made.
    let e = env.fails(&["create", "-V", "2G", "tank/huge"]);
    assert!(
        e.contains("out of space") && e.contains("refreservation"),
        "{e}"
    );
    env.fails(&["list", "tank/huge"]);
    // A sparse one that size is made.
    env.ok(&["create", "-s", "-V", "2G", "tank/huge"]);
    let e = env.fails(&["set", "refreservation=auto", "tank/huge"]);
    assert!(e.contains("out of space"), "{e}");
    assert_eq!(get("refreservation", "tank/huge"), "0");
    // Given back, and taken again with `auto`.
    let available = bytes("available", "tank/thin");
    env.ok(&["set", "refreservation=none", "tank/thick"]);
    assert_eq!(bytes("usedbyrefreservation", "tank/thick"), 0);
    assert_eq!(bytes("available", "tank/thin"), available + reserved);
    env.ok(&["set", "refreservation=auto", "tank/thick"]);
    assert_eq!(bytes("refreservation", "tank/thick"), reserved);
    env.ok(&["inherit", "refreservation", "tank/thick"]);
    assert_eq!(get("refreservation", "tank/thick"), "0");
    env.ok(&["audit", "tank"]);
}
