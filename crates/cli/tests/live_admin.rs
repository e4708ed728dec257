//! Administering pools that `oxpool serve` is serving: every verb goes through the server's
//! control socket and works on the live pool while clients keep using it; bad input on the
//! socket harms nobody; only the serving user may administer.

#[path = "nbd/fio_loop.rs"]
mod fio_loop;
#[path = "nbd/harness.rs"]
mod harness;

use fio_loop::FioLoop;
use harness::{exports, hold, python, release, run, tool, until_bounded, Env, ServerProcess};
use oxpool_control::{decode, encode, Message, Request};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// A second pool `tank2` with volume `w0` in the same directory.
fn tank2(env: &Env) {
    let file = env.path("tank2.img");
    env.ok(&[
        "create",
        "tank2",
        file.to_str().unwrap(),
        "--size",
        "256M",
        "--sparse",
    ]);
    env.ok(&["vol", "create", "tank2/w0", "--size", "16M"]);
}

#[test]
fn every_verb_works_on_a_served_pool_while_a_client_verifies_its_writes() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &["volblocksize=4K"]), ("v1", "32M", &[])]);
    tank2(&env);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let fio = FioLoop::start(&server.uri("tank/vol0"), 0, 16 << 20);

    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains("tank.img") && status.contains("ONLINE"),
        "{status}"
    );
    let list = env.ok(&["list"]);
    assert!(list.contains("tank ") && list.contains("tank2"), "{list}");
    assert!(env.ok(&["get", "all", "tank/v1"]).contains("volsize"));
    env.ok(&["set", "sync=always", "tank/v1"]);
    assert!(env.ok(&["get", "sync", "tank/v1"]).contains("always"));
    env.ok(&["set", "txg_timeout=3", "tank"]);
    assert!(env.ok(&["get", "txg_timeout", "tank"]).contains(" 3"));
    // -o on a served pool too: the server prints what the local path prints.
    assert_eq!(
        env.ok(&["get", "-H", "-o", "value", "txg_timeout", "tank"]),
        "3\n"
    );
    assert_eq!(
        env.ok(&["get", "-H", "-o", "name,value,source", "sync", "tank/v1"]),
        "tank/v1\talways\tlocal\n"
    );

    // A new volume is an export at once; a resize is seen by the next connection.
    env.ok(&["vol", "create", "tank/v2", "--size", "8M"]);
    assert!(exports(&server).contains("tank/v2"));
    env.ok(&["set", "volsize=48M", "tank/v1"]);
    let size = tool("nbdinfo", &["--size", &server.uri("tank/v1")]);
    assert_eq!(size.trim(), (48u64 << 20).to_string());
    env.ok(&["vol", "destroy", "tank/v2"]);
    assert!(!exports(&server).contains("tank/v2"));
    assert!(!env.ok(&["vol", "list"]).contains("tank/v2"));

    // A scrub in the background, then one waited for.
    env.ok(&["scrub", "tank"]);
    let waited = loop_until_scrub_can_start(&env);
    assert!(waited.contains("scrub of tank:"), "{waited}");
    assert!(waited.contains("scan: scrub repaired 0B"), "{waited}");
    let e = env.fails(&["scrub", "-s", "tank"]);
    assert!(e.contains("no scrub"), "{e}");

    // A log device added live; the next sync writes go there.
    env.ok(&[
        "add",
        "tank",
        "log",
        env.path("slog.img").to_str().unwrap(),
        "--size",
        "64M",
        "--sparse",
    ]);
    assert!(env.ok(&["status", "tank"]).contains("slog.img"));
    // And a data vdev: the pool grows while it serves.
    let size = |env: &Env| -> u64 {
        let line = env.ok(&["list", "-H", "-p", "tank"]);
        line.split('\t').nth(1).unwrap().parse().unwrap()
    };
    let before = size(&env);
    env.ok(&[
        "add",
        "tank",
        env.path("more.img").to_str().unwrap(),
        "--size",
        "256M",
        "--sparse",
    ]);
    assert!(size(&env) > before + (128 << 20));
    // The log device taken offline live, while fio writes: its chains move to the data
    // vdevs and the pool is DEGRADED until `online` returns it (lacking nothing).
    let slog = env.path("slog.img");
    let slog = slog.to_str().unwrap();
    env.ok(&["offline", "tank", slog]);
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains(" state: DEGRADED")
            && status
                .lines()
                .any(|l| l.contains("slog.img") && l.contains("OFFLINE")),
        "{status}"
    );
    env.ok(&["online", "tank", slog]);
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains(" state: ONLINE")
            && status
                .lines()
                .any(|l| l.contains("slog.img") && l.contains("ONLINE")),
        "{status}"
    );
    // The log device removed live, while fio writes: its labels are cleared (the file could
    // start a new pool) and the pool no longer lists it.
    env.ok(&["remove", "tank", "slog.img"]);
    let status = env.ok(&["status", "tank"]);
    assert!(
        !status.contains("slog.img") && !status.contains("logs"),
        "{status}"
    );
    env.ok(&["create", "fresh", env.path("slog.img").to_str().unwrap()]);
    env.ok(&["destroy", "fresh"]);
    let iostat = env.ok(&["iostat", "tank"]);
    assert!(iostat.contains("tank"), "{iostat}");

    // The other pool leaves the server and comes back.
    env.ok(&["export", "tank2"]);
    assert!(!env.ok(&["list"]).contains("tank2"));
    assert!(!exports(&server).contains("tank2/w0"));
    let dir = env.dir.path().to_str().unwrap().to_string();
    assert!(env
        .ok(&["import", "-d", &dir, "tank2"])
        .contains("imported pool 'tank2'"));
    assert!(exports(&server).contains("tank2/w0"));
    assert!(env.ok(&["vol", "list", "tank2"]).contains("tank2/w0"));

    let runs = fio.finish();
    let worst = runs.iter().map(|r| r.clat_us_max).max().unwrap_or(0);
    println!(
        "fio verify runs during the verbs: {}, largest I/O latency {worst} us (txg_timeout 5 s, then 3 s)",
        runs.len()
    );
    assert!(!runs.is_empty());
    for run in &runs {
        assert!(run.ok, "fio saw an error:\n{}", run.output);
    }
    let (status, out) = server.stop();
    assert!(status.success(), "{out}");
    assert!(out.contains("exported"), "{out}");
}

/// `scrub -w` on a pool whose background scrub may still run: waits for that one to end
/// (a start is refused while one runs), then waits for its own.
fn loop_until_scrub_can_start(env: &Env) -> String {
    // Bounded: the background scrub of a small pool ends within moments.
    for _ in 0..600 {
        let output = env.run(&["scrub", "-w", "tank"]);
        if output.status.success() {
            return String::from_utf8_lossy(&output.stdout).into_owned();
        }
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains("scrubbed already"), "{err}");
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the background scrub never ended");
}

/// One device line of `oxpool status`: (READ, WRITE, CKSUM). The line is the config table's
/// (NAME STATE READ WRITE CKSUM, then a note on why the device is in its state); the
/// `status:` lines above may name the device too.
fn status_counts(status: &str, device: &str) -> (u64, u64, u64) {
    let line = status
        .lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|name| name.ends_with(device))
        })
        .unwrap_or_else(|| panic!("no {device} in {status}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let n = |i: usize| f[i].parse::<u64>().unwrap();
    (n(2), n(3), n(4))
}

#[test]
fn status_of_a_served_pool_shows_the_servers_own_counters() {
    let env = Env::new();
    let (_, b) = env.mirror_tank("a.img", "b.img", "256M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "16M"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let data = harness::random_bytes(3, 16 << 20);
    std::fs::write(env.path("in.bin"), &data).unwrap();
    env.ok(&["vol", "write", "tank/vol0", "in.bin"]);
    env.ok(&["set", "txg_timeout=1", "tank"]); // the written data reaches the devices
    std::thread::sleep(Duration::from_secs(3));
    // Damage side b under the running server (its reads are O_DIRECT: they see it).
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
        for k in 0..200u64 {
            f.write_all_at(&[0xA5; 512], (4 << 20) + k * 65_536)
                .unwrap();
        }
        f.sync_all().unwrap();
    }
    let scrub = env.ok(&["scrub", "-w", "tank"]);
    assert!(scrub.contains("scrub of tank"), "{scrub}");
    let status = env.ok(&["status", "tank"]);
    let (_, _, cksum_b) = status_counts(&status, "b.img");
    assert!(cksum_b > 0, "damage not counted:\n{status}");
    assert_eq!(status_counts(&status, "a.img"), (0, 0, 0), "{status}");
    // The server's own counters, as it publishes them for iostat, are the same.
    std::thread::sleep(Duration::from_millis(500));
    let json = env.ok(&["iostat", "--json", "tank"]);
    let stats: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    for dev in stats["devices"].as_array().unwrap() {
        let name = dev["name"].as_str().unwrap();
        let file = Path::new(name).file_name().unwrap().to_str().unwrap();
        let (r, w, c) = status_counts(&status, file);
        let e = &dev["errors"];
        assert_eq!(
            (r, w, c),
            (
                e["read"].as_u64().unwrap(),
                e["write"].as_u64().unwrap(),
                e["checksum"].as_u64().unwrap()
            ),
            "{name}: status and the server's counters differ"
        );
    }
    let mut back = vec![0u8; data.len()];
    let out = env.path("out.bin");
    env.ok(&["vol", "read", "tank/vol0", out.to_str().unwrap()]);
    back.copy_from_slice(&std::fs::read(&out).unwrap());
    assert!(back == data, "read back differs");
    let served = status_counts(&env.ok(&["status", "tank"]), "b.img");
    let (ok, _) = server.stop();
    assert!(ok.success());
    // The server stopped, the machine still knows the pool: its counts are kept for the
    // commands that open it after (errors_file.rs), until `clear`.
    assert_eq!(status_counts(&env.ok(&["status", "tank"]), "b.img"), served);
    env.ok(&["clear", "tank"]);
    assert_eq!(
        status_counts(&env.ok(&["status", "tank"]), "b.img"),
        (0, 0, 0)
    );
}

/// `oxpool sync` (as `zpool sync`) makes what a served pool holds dirty durable: a write
/// without FUA or FLUSH survives a kill -9 after it, and (the control) one after the sync
/// does not. Without a pool named, every pool; a pool not known is an error.
#[test]
fn sync_makes_unflushed_writes_durable() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    // No timed txg sync: only `oxpool sync` can make the write durable before the kill.
    env.ok(&["set", "txg_timeout=3600", "tank"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let out = python("unflushed.py", &["write", &server.uri("tank/vol0"), "7"]);
    assert!(out.contains("written"), "{out}");
    env.ok(&["sync", "tank"]);
    server.kill9();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    assert_eq!(
        python("unflushed.py", &["check", &uri, "7"]).trim(),
        "present"
    );
    let out = python("unflushed.py", &["write", &uri, "8"]);
    assert!(out.contains("written"), "{out}");
    env.ok(&["sync"]);
    let out = python("unflushed.py", &["write", &uri, "9"]);
    assert!(out.contains("written"), "{out}");
    server.kill9();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    assert_eq!(
        python("unflushed.py", &["check", &uri, "9"]).trim(),
        "absent",
        "the write after the last sync was never promised"
    );
    assert_eq!(
        python("unflushed.py", &["check", &uri, "8"]).trim(),
        "present",
        "`sync` with no pool named synced tank"
    );
    let e = env.fails(&["sync", "nosuch"]);
    assert!(e.contains("'nosuch' not found"), "{e}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    env.ok(&["audit", "tank"]);
}

#[test]
fn sync_always_set_live_makes_the_next_write_durable_and_standard_does_not() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    // No timed txg sync: only the intent log can make a write durable before the kill.
    env.ok(&["set", "txg_timeout=3600", "tank"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["set", "sync=always", "tank/vol0"]);
    let out = python("unflushed.py", &["write", &server.uri("tank/vol0"), "7"]);
    assert!(out.contains("written"), "{out}");
    server.kill9();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    assert_eq!(
        python("unflushed.py", &["check", &uri, "7"]).trim(),
        "present"
    );
    env.ok(&["set", "sync=standard", "tank/vol0"]);
    let out = python("unflushed.py", &["write", &uri, "8"]);
    assert!(out.contains("written"), "{out}");
    server.kill9();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    // Neither FUA nor FLUSH nor sync=always: the write was never promised, and is gone.
    assert_eq!(
        python("unflushed.py", &["check", &uri, "8"]).trim(),
        "absent"
    );
    assert_eq!(
        python("unflushed.py", &["check", &uri, "7"]).trim(),
        "present"
    );
    server.kill9();
    // Three kills: the pool, imported with its log replayed, audits clean.
    env.ok(&["audit", "tank"]);
}

#[test]
fn vol_create_is_listed_and_vol_destroy_refuses_an_open_export_unless_forced() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["vol", "create", "tank/v9", "--size", "8M"]);
    assert!(exports(&server).contains("tank/v9"));
    let client = hold(&format!("nbd://{}/tank/v9", server.tcp_addr()));
    let e = env.fails(&["vol", "destroy", "tank/v9"]);
    assert!(
        e.contains("cannot destroy 'tank/v9': it is open by 1 NBD client")
            && e.contains("-f disconnects"),
        "{e}"
    );
    // Refused means unchanged: still listed, still served, the client still reads.
    assert!(env.ok(&["vol", "list"]).contains("tank/v9"));
    assert!(exports(&server).contains("tank/v9"));
    // With -r too: its snapshot stays (it went first, before the refusal, once).
    env.ok(&["snapshot", "tank/v9@keep"]);
    let e = env.fails(&["vol", "destroy", "-r", "tank/v9"]);
    assert!(e.contains("it is open by 1 NBD client"), "{e}");
    let snaps = env.ok(&["list", "-t", "snapshot", "-H", "-o", "name"]);
    assert!(snaps.contains("tank/v9@keep"), "{snaps}");
    assert!(exports(&server).contains("tank/v9"));
    // A snapshot that cannot go (held): refused before -f disconnects anyone.
    env.ok(&["hold", "k", "tank/v9@keep"]);
    let e = env.fails(&["vol", "destroy", "-r", "-f", "tank/v9"]);
    assert!(e.contains("tank/v9@keep is held (k)"), "{e}");
    assert!(exports(&server).contains("tank/v9"));
    // Snapshots without -r: refused before -f disconnects anyone too.
    let e = env.fails(&["vol", "destroy", "-f", "tank/v9"]);
    assert!(e.contains("has 1 snapshot (keep)"), "{e}");
    assert_eq!(
        release(client),
        "still connected",
        "a refused -f disconnected it"
    );
    let client = hold(&format!("nbd://{}/tank/v9", server.tcp_addr()));
    assert!(env
        .ok(&["list", "-t", "snapshot", "-H", "-o", "name"])
        .contains("tank/v9@keep"));
    env.ok(&["release", "k", "tank/v9@keep"]);
    let other = hold(&server.uri("tank/vol0"));
    env.ok(&["vol", "destroy", "-r", "-f", "tank/v9"]);
    let said = release(client);
    assert!(said.starts_with("disconnected"), "{said}");
    assert_eq!(release(other), "still connected");
    assert!(!exports(&server).contains("tank/v9"));
    assert!(!env.ok(&["vol", "list"]).contains("tank/v9"));
    let e = env.fails(&["vol", "destroy", "tank/v9"]);
    assert!(e.contains("tank/v9"), "{e}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// A served volume open by a client may grow, not shrink: the client was told its size, and
/// its data past a new end would be gone while its requests there fail (a new user's
/// finding). Once no client has it open, it shrinks.
#[test]
fn volsize_does_not_shrink_under_an_open_client() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let volsize = || env.ok(&["get", "-H", "-p", "-o", "value", "volsize", "tank/vol0"]);
    let client = hold(&server.uri("tank/vol0"));
    let e = env.fails(&["set", "volsize=8M", "tank/vol0"]);
    assert!(
        e.contains("cannot shrink 'tank/vol0': it is open by 1 NBD client")
            && e.contains("oxpool unshare -f disconnects them"),
        "{e}"
    );
    assert_eq!(volsize().trim(), (16u64 << 20).to_string());
    // Refused with another value: neither applies (the shrink is checked first).
    let sync = || env.ok(&["get", "-H", "-o", "value", "sync", "tank/vol0"]);
    let e = env.fails(&["set", "sync=always", "volsize=8M", "tank/vol0"]);
    assert!(e.contains("cannot shrink"), "{e}");
    assert_eq!(sync().trim(), "standard");
    assert_eq!(volsize().trim(), (16u64 << 20).to_string());
    env.ok(&["set", "volsize=32M", "tank/vol0"]);
    assert_eq!(volsize().trim(), (32u64 << 20).to_string());
    assert_eq!(release(client), "still connected");
    // The server counts the connection closed once it has read the client's disconnect,
    // which may be just after the client exits: a bounded wait for that.
    until_bounded("the shrink after the client left", || {
        env.run(&["set", "volsize=8M", "tank/vol0"])
            .status
            .success()
    });
    assert_eq!(volsize().trim(), (8u64 << 20).to_string());
    // Offered again after the shrink, at its new size.
    let size = tool("nbdinfo", &["--size", &server.uri("tank/vol0")]);
    assert_eq!(size.trim(), (8u64 << 20).to_string());
    // One taken out of the table stays out after a shrink.
    env.ok(&["unshare", "tank/vol0"]);
    env.ok(&["set", "volsize=4M", "tank/vol0"]);
    assert_eq!(volsize().trim(), (4u64 << 20).to_string());
    let listed = exports(&server);
    assert!(!listed.contains("tank/vol0"), "{listed}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// `list` takes datasets as `zfs list` does: a volume lists itself (its snapshots with
/// `-t snapshot`), a snapshot itself, a name that does not exist is an error; `creation` is
/// a date unless -p. The same with and without a server (a new user found `list tank/v`
/// refused as no pool, and on a served pool an internal path in the error).
#[test]
fn list_takes_volumes_and_snapshots_by_name() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "8M", &[])]);
    env.ok(&["snapshot", "tank/a@s1"]);
    env.ok(&["snapshot", "tank/b@s2"]);
    let check = |served: &str| {
        let names = |args: &[&str]| -> Vec<String> {
            let out = env.ok(&[&["list", "-H", "-o", "name"][..], args].concat());
            out.lines().map(str::to_string).collect()
        };
        assert_eq!(names(&["-t", "volume", "tank/a"]), ["tank/a"], "{served}");
        // Named twice, or with its pool: once. -r lists a pool's volumes.
        assert_eq!(names(&["tank/a", "tank/a"]), ["tank/a"], "{served}");
        assert_eq!(names(&["tank", "tank/a"]), ["tank/a", "tank/b"], "{served}");
        assert_eq!(names(&["-r", "tank"]), ["tank/a", "tank/b"], "{served}");
        assert_eq!(names(&["-r", "tank/b"]), ["tank/b"], "{served}");
        // Each name lists its own type: a snapshot beside its pool is listed, not passed
        // over as the pool's; a volume beside it that does not exist is still refused.
        assert_eq!(
            names(&["-r", "tank", "tank/b@s2"]),
            ["tank/a", "tank/b", "tank/b@s2"],
            "{served}"
        );
        assert_eq!(
            names(&["tank", "tank/a@s1"]),
            ["tank/a", "tank/b", "tank/a@s1"],
            "{served}"
        );
        let e = env.fails(&["list", "-t", "volume", "tank", "tank/nosuch"]);
        assert!(e.contains("tank/nosuch"), "{served}: {e}");
        // A snapshot beside its volume, of the same types: once.
        assert_eq!(
            names(&["-t", "snapshot", "tank/a", "tank/a@s1"]),
            ["tank/a@s1"],
            "{served}"
        );
        // Sorted as `zfs list -s/-S`, by a column shown or not, numbers as numbers.
        assert_eq!(
            names(&["-t", "snapshot", "-S", "createtxg", "tank"]),
            ["tank/b@s2", "tank/a@s1"],
            "{served}"
        );
        assert_eq!(
            names(&["-t", "snapshot", "-s", "type", "-S", "name"]),
            ["tank/b@s2", "tank/a@s1"],
            "{served}"
        );
        let e = env.fails(&["list", "-s", "name"]);
        assert!(e.contains("-s and -S sort datasets"), "{served}: {e}");
        // Without -t, -o picks the pool listing's columns, as `zpool list -H -o name`.
        assert_eq!(env.ok(&["list", "-H", "-o", "name"]), "tank\n", "{served}");
        let pools = env.ok(&["list", "-o", "name,cap,health"]);
        assert_eq!(
            pools
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .collect::<Vec<_>>(),
            [vec!["NAME", "CAP", "HEALTH"], vec!["tank", "0%", "ONLINE"]],
            "{served}: {pools}"
        );
        let e = env.fails(&["list", "-o", "name,bogus"]);
        assert!(e.contains("unknown pool column 'bogus'"), "{served}: {e}");
        assert_eq!(
            names(&["-r", "-t", "all", "tank"]),
            ["tank/a", "tank/a@s1", "tank/b", "tank/b@s2"],
            "{served}"
        );
        assert_eq!(
            env.ok(&["list", "-H", "tank/a"]).lines().count(),
            1,
            "{served}"
        );
        assert!(
            env.ok(&["list", "-H", "tank/a"]).starts_with("tank/a\t"),
            "{served}"
        );
        assert_eq!(
            names(&["-t", "snapshot", "tank/a"]),
            ["tank/a@s1"],
            "{served}"
        );
        assert_eq!(
            names(&["-t", "all", "tank/b"]),
            ["tank/b", "tank/b@s2"],
            "{served}"
        );
        assert_eq!(
            names(&["-t", "snapshot", "tank/b@s2"]),
            ["tank/b@s2"],
            "{served}"
        );
        let e = env.fails(&["list", "tank/nosuch"]);
        assert!(
            e.contains("nosuch") && !e.contains(".run/"),
            "{served}: {e}"
        );
        // An error alone has no header with it; nothing matched says so, as zfs list.
        let out = env.run(&["list", "tank/nosuch"]);
        assert!(out.stdout.is_empty(), "{served}: {out:?}");
        let out = env.run(&["list", "-t", "bookmark"]);
        assert!(out.status.success() && out.stdout.is_empty(), "{served}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "no datasets available\n",
            "{served}"
        );
        let e = env.fails(&["list", "-t", "volume", "tank/a@s1"]);
        assert!(e.contains("list it with -t snapshot"), "{served}: {e}");
        let e = env.fails(&["list", "tank@s1"]);
        assert!(e.contains("a pool has no snapshots"), "{served}: {e}");
        let e = env.fails(&["list", "tank/a@nosuch"]);
        assert!(
            e.contains("nosuch") && !e.contains(".run/"),
            "{served}: {e}"
        );
        let dated = env.ok(&["list", "-H", "-t", "snapshot", "-o", "creation", "tank/a"]);
        assert!(
            dated.trim().ends_with(|c: char| c.is_ascii_digit()) && dated.contains(':'),
            "{dated}"
        );
        let secs = env.ok(&[
            "list", "-H", "-p", "-t", "snapshot", "-o", "creation", "tank/a",
        ]);
        assert!(secs.trim().parse::<u64>().is_ok(), "{secs}");
    };
    unserved_then_served(&env, check);
}

/// `set` takes several assignments, as `zfs set`, all or none: one refused sets the others
/// back (a new user's `set readonly=off sync=standard tank/v0` was refused as "pool
/// 'sync=standard' not found"). The same with and without a server.
#[test]
fn set_takes_several_assignments_all_or_none() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let values = |props: &str| env.ok(&["get", "-H", "-o", "value", props, "tank/vol0"]);
    let check = |served: &str| {
        env.ok(&["set", "sync=always", "compression=zstd", "tank/vol0"]);
        assert_eq!(values("sync,compression"), "always\nzstd\n", "{served}");
        // volsize goes last; a bad value after good ones undoes them.
        let e = env.fails(&[
            "set",
            "sync=disabled",
            "volsize=32M",
            "checksum=md5",
            "tank/vol0",
        ]);
        assert!(e.contains("md5"), "{served}: {e}");
        assert_eq!(
            values("sync,volsize,checksum"),
            "always\n16M\nxxh3-128\n",
            "{served}"
        );
        let e = env.fails(&["set", "sync=disabled", "sync=always", "tank/vol0"]);
        assert!(e.contains("set twice"), "{served}: {e}");
        // A shrink with a refused value changes nothing: the data past the new end stays.
        let data = env.path("past8m.bin");
        std::fs::write(&data, vec![0x5au8; 1 << 20]).unwrap();
        env.ok(&[
            "vol",
            "write",
            "tank/vol0",
            "--offset",
            "12M",
            data.to_str().unwrap(),
        ]);
        let e = env.fails(&["set", "volsize=8M", "checksum=md5", "tank/vol0"]);
        assert!(e.contains("md5"), "{served}: {e}");
        let back = env.path("back.bin");
        env.ok(&[
            "vol",
            "read",
            "tank/vol0",
            "--offset",
            "12M",
            "--length",
            "1M",
            back.to_str().unwrap(),
        ]);
        assert!(
            std::fs::read(&back).unwrap() == vec![0x5au8; 1 << 20],
            "{served}: data lost"
        );
        // A read-only statistic among them is called read-only.
        for stat in ["used=1", "referenced=1", "guid=7"] {
            let e = env.fails(&["set", "sync=always", stat, "tank/vol0"]);
            assert!(e.contains("read-only"), "{served}: {e}");
        }
        let e = env.fails(&["set", "sync=disabled", "tank/vol0", "tank/other", "x"]);
        assert!(e.contains("unexpected 'x'"), "{served}: {e}");
        env.ok(&[
            "set",
            "sync=standard",
            "compression=lz4",
            "volsize=24M",
            "tank/vol0",
        ]);
        assert_eq!(
            values("sync,compression,volsize"),
            "standard\nlz4\n24M\n",
            "{served}"
        );
        env.ok(&["set", "volsize=16M", "tank/vol0"]);
    };
    unserved_then_served(&env, check);
}

/// A pool's or a device's properties are set all or none too: a name the target does not
/// have, after one it has, changes nothing (a reviewer found `set txg_timeout=9 bogus=1
/// tank` refused with txg_timeout left at 9). The same with and without a server.
#[test]
fn pool_and_device_properties_are_set_all_or_none() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    let device = env.path("tank.img");
    let device = device.to_str().unwrap();
    let value = |args: &[&str]| {
        let mut all = vec!["get", "-H", "-o", "value"];
        all.extend_from_slice(args);
        env.ok(&all).trim().to_string()
    };
    let check = |served: &str| {
        let timeout = value(&["txg_timeout", "tank"]);
        let e = env.fails(&["set", "txg_timeout=9", "bogus=1", "tank"]);
        assert!(e.contains("bogus"), "{served}: {e}");
        assert_eq!(value(&["txg_timeout", "tank"]), timeout, "{served}");
        let scheduler = value(&["scheduler", "tank", device]);
        let e = env.fails(&["set", "scheduler=on", "bogus=1", "tank", device]);
        assert!(e.contains("bogus"), "{served}: {e}");
        assert_eq!(value(&["scheduler", "tank", device]), scheduler, "{served}");
        // And a good pair is set whole.
        env.ok(&["set", "txg_timeout=9", "dirty_max=32M", "tank"]);
        assert_eq!(value(&["txg_timeout", "tank"]), "9", "{served}");
        env.ok(&["set", &format!("txg_timeout={timeout}"), "tank"]);
    };
    unserved_then_served(&env, check);
}

/// `inherit PROP VOL...` returns a volume's property to its default (SOURCE `default`), as
/// `zfs inherit`; `inherit PROP POOL DEVICE` makes a device follow its pool again. What
/// cannot be inherited is refused in one line and changes nothing. The same with and
/// without a server.
#[test]
fn inherit_returns_properties_to_their_defaults() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "8M", &[])]);
    let device = env.path("tank.img");
    let device = device.to_str().unwrap();
    let got = |args: &[&str]| {
        let mut all = vec!["get", "-H", "-o", "name,value,source"];
        all.extend_from_slice(args);
        env.ok(&all)
    };
    let check = |served: &str| {
        env.ok(&["set", "compression=zstd", "sync=always", "tank/a"]);
        env.ok(&["set", "compression=zle", "tank/b"]);
        env.ok(&["inherit", "compression", "tank/a", "tank/b"]);
        assert_eq!(
            got(&["compression,sync", "tank/a", "tank/b"]),
            "tank/a\tlz4\tdefault\ntank/a\talways\tlocal\n\
             tank/b\tlz4\tdefault\ntank/b\tstandard\tdefault\n",
            "{served}"
        );
        for (args, why) in [
            (&["inherit", "volsize", "tank/a"][..], "cannot be inherited"),
            (&["inherit", "used", "tank/a"], "read-only"),
            (
                &["inherit", "bogus", "tank/a"],
                "unknown volume property 'bogus'",
            ),
            (
                &["inherit", "sync", "tank"],
                "`oxpool inherit -r sync tank`",
            ),
            (
                &["inherit", "txg_timeout", "tank"],
                "no parent to inherit from",
            ),
            (&["inherit", "sync", "tank/a", "tank/nosuch"], "tank/nosuch"),
            (
                &["inherit", "-r", "sync", "tank", "tank/nosuch"],
                "tank/nosuch",
            ),
            (
                &["inherit", "-r", "sync", "tank", "other"],
                "must be of one pool (tank and other)",
            ),
            (
                &["inherit", "-r", "scheduler", "tank"],
                "'scheduler' is not a volume property",
            ),
        ] {
            let e = env.fails(args);
            assert!(e.contains(why), "{served}: {args:?}: {e}");
        }
        // Nothing changed by a refusal naming a good volume first.
        assert_eq!(
            got(&["sync", "tank/a"]),
            "tank/a\talways\tlocal\n",
            "{served}"
        );
        env.ok(&["inherit", "sync", "tank/a"]);
        assert_eq!(
            got(&["sync", "tank/a"]),
            "tank/a\tstandard\tdefault\n",
            "{served}"
        );
        // -r on the pool: every volume's, as `zfs inherit -r PROP POOL`.
        env.ok(&["set", "sync=always", "tank/a"]);
        env.ok(&["set", "sync=always", "tank/b"]);
        env.ok(&["inherit", "-r", "sync", "tank"]);
        assert_eq!(
            got(&["sync", "tank/a", "tank/b"]),
            "tank/a\tstandard\tdefault\ntank/b\tstandard\tdefault\n",
            "{served}"
        );
        env.ok(&["set", "scheduler=on", "tank", device]);
        let e = env.fails(&["inherit", "-r", "scheduler", "tank", device]);
        assert!(e.contains("-r is for volumes"), "{served}: {e}");
        env.ok(&["inherit", "scheduler", "tank", device]);
        assert_eq!(
            got(&["scheduler", "tank", device]),
            format!("{device}\tauto\tdefault\n"),
            "{served}"
        );
    };
    unserved_then_served(&env, check);
}

/// `status -x` shows only pools with something to act on, as `zpool status -x`: "all pools
/// are healthy" when none has, "pool 'tank' is healthy" for one named; a device out of
/// service shows its pool. The same with and without a server.
#[test]
fn status_x_shows_only_unhealthy_pools() {
    let env = Env::new();
    let (_, b) = env.mirror_tank("a.img", "b.img", "128M");
    let b = b.to_str().unwrap();
    env.ok(&["vol", "create", "tank/v", "--size", "8M"]);
    let check = |served: &str| {
        assert_eq!(
            env.ok(&["status", "-x"]),
            "all pools are healthy\n",
            "{served}"
        );
        assert_eq!(
            env.ok(&["status", "-x", "tank"]),
            "pool 'tank' is healthy\n",
            "{served}"
        );
        env.ok(&["offline", "tank", b]);
        let shown = env.ok(&["status", "-x"]);
        assert!(
            shown.contains("pool: tank") && shown.contains("DEGRADED") && shown.contains("OFFLINE"),
            "{served}: {shown}"
        );
        assert!(!shown.contains("healthy"), "{served}: {shown}");
        env.ok(&["online", "-w", "tank", b]);
        assert_eq!(
            env.ok(&["status", "-x"]),
            "all pools are healthy\n",
            "{served}"
        );
    };
    unserved_then_served(&env, check);
}

/// User properties, as ZFS's (`module:property`): set with others, read by name and in
/// `get all` (SOURCE `local`, `-` when not set), removed by `inherit`, kept across export
/// and import; a bad name, a pool target and a value over the bounds are refused. The same
/// with and without a server.
#[test]
fn user_properties_are_kept_on_volumes() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "8M", &[])]);
    env.ok(&["snapshot", "tank/a@s"]);
    let got = |args: &[&str]| {
        let mut all = vec!["get", "-H", "-o", "name,property,value,source"];
        all.extend_from_slice(args);
        env.ok(&all)
    };
    let check = |served: &str| {
        env.ok(&[
            "set",
            "com.example:backup=daily at 02:00",
            "sync=always",
            "tank/a",
        ]);
        assert_eq!(
            got(&["com.example:backup", "tank/a", "tank/b"]),
            "tank/a\tcom.example:backup\tdaily at 02:00\tlocal\n\
             tank/b\tcom.example:backup\t-\t-\n",
            "{served}"
        );
        // A pool and a snapshot keep none: shown unset, as `zfs get` and `zpool get` do.
        for other in ["tank", "tank/a@s"] {
            assert_eq!(
                got(&["com.example:backup", other]),
                format!("{other}\tcom.example:backup\t-\t-\n"),
                "{served}"
            );
            let e = env.fails(&["get", "Com:x", other]);
            assert!(e.contains("bad user property name"), "{served}: {e}");
        }
        let all = got(&["all", "tank/a"]);
        assert!(
            all.ends_with("tank/a\tcom.example:backup\tdaily at 02:00\tlocal\n"),
            "{served}: {all}"
        );
        for (args, why) in [
            (&["set", "Com:x=1", "tank/a"][..], "bad user property name"),
            (&["set", "com:x=1", "tank"], "kept on volumes"),
            (
                &["set", "com:x=1", "tank/a@s"],
                "a snapshot's properties are read-only",
            ),
            (&["set", "com:x=1", "checksum=md5", "tank/a"], "md5"),
        ] {
            let e = env.fails(args);
            assert!(e.contains(why), "{served}: {args:?}: {e}");
        }
        let big = format!("com:big={}", "x".repeat(20_000));
        let e = env.fails(&["set", &big, "tank/a"]);
        assert!(e.contains("at most"), "{served}: {e}");
        // Refusals left nothing behind.
        assert_eq!(
            got(&["com:x,com:big", "tank/a"]).matches("\t-\t-").count(),
            2
        );
    };
    unserved_then_served(&env, check);
    // Kept across the export the server did when it stopped.
    assert_eq!(
        got(&["com.example:backup", "tank/a"]),
        "tank/a\tcom.example:backup\tdaily at 02:00\tlocal\n"
    );
    env.ok(&["inherit", "com.example:backup", "tank/a"]);
    assert_eq!(
        got(&["com.example:backup", "tank/a"]),
        "tank/a\tcom.example:backup\t-\t-\n"
    );
}

/// `get -r POOL` reads every volume of the pool, each once; `get -s SOURCES` keeps the rows
/// of those sources (`none` is a statistic's `-`), as `zfs get -r` and `-s`. With and
/// without a server.
#[test]
fn get_r_and_s_select_targets_and_sources() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "8M", &[])]);
    let check = |served: &str| {
        env.ok(&["set", "compression=zstd", "tank/a"]);
        let got = env.ok(&[
            "get",
            "-H",
            "-r",
            "-s",
            "local",
            "-o",
            "name,property",
            "all",
            "tank",
            "tank/b",
        ]);
        assert_eq!(
            got, "tank/a\tvolsize\ntank/a\tcompression\ntank/b\tvolsize\n",
            "{served}"
        );
        let got = env.ok(&[
            "get",
            "-H",
            "-s",
            "none",
            "-o",
            "property",
            "used,sync",
            "tank/a",
        ]);
        assert_eq!(got, "used\n", "{served}");
        let e = env.fails(&["get", "-s", "bogus", "sync", "tank/a"]);
        assert!(e.contains("a source is local, default"), "{served}: {e}");
        env.ok(&["inherit", "compression", "tank/a"]);
    };
    unserved_then_served(&env, check);
}

/// `create -V SIZE POOL/VOL` makes a volume, as `zfs create -V` (and `vol create -V` as
/// `--size`), and `destroy [-r] POOL/VOL` removes it; pool options and devices with -V are
/// refused in one line. With and without a server.
#[test]
fn create_v_makes_a_volume_as_zfs_create() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[])]);
    let check = |served: &str| {
        let (one, two) = match served {
            "served" => ("tank/s1", "tank/s2"),
            _ => ("tank/u1", "tank/u2"),
        };
        env.ok(&["create", "-s", "-V", "16M", "-o", "sync=always", one]);
        env.ok(&["vol", "create", "-V", "4M", "-b", "8K", two]);
        let got = env.ok(&[
            "get",
            "-H",
            "-p",
            "-o",
            "value",
            "volsize,sync,volblocksize",
            one,
            two,
        ]);
        assert_eq!(
            got,
            format!(
                "{}\nalways\n{}\n{}\nstandard\n{}\n",
                16u64 << 20,
                oxpool_engine::props::VOLBLOCKSIZE_DEFAULT_BYTES,
                4u64 << 20,
                8 << 10
            ),
            "{served}"
        );
        let e = env.fails(&["create", "-V", "1x", "tank/x"]);
        assert!(e.contains("volsize (-V)"), "{served}: {e}");
        let e = env.fails(&["create", "-V", "8M", "tank/x", "x.img"]);
        assert!(e.contains("takes no devices"), "{served}: {e}");
        let e = env.fails(&["create", "-V", "8M", "tank"]);
        assert!(e.contains("POOL/VOL"), "{served}: {e}");
        assert!(env.run(&["get", "volsize", "tank/x"]).status.code() == Some(1));
        // And `destroy POOL/VOL` removes one, as `zfs destroy` (-r with its snapshots).
        // Blocks only the snapshot holds, and blocks of the volume's own.
        std::fs::write(env.path("in.bin"), harness::random_bytes(5, 256 << 10)).unwrap();
        env.ok(&["vol", "write", two, "in.bin"]);
        env.ok(&["snapshot", &format!("{two}@s")]);
        env.ok(&["vol", "write", two, "--offset", "1M", "in.bin"]);
        let e = env.fails(&["destroy", two]);
        assert!(e.contains("snapshot"), "{served}: {e}");
        let e = env.fails(&["destroy", "-n", two]);
        assert!(e.contains("snapshot"), "{served}: {e}");
        let e = env.fails(&["destroy", "-d", two]);
        assert!(e.contains("-d is for snapshots"), "{served}: {e}");
        // -n -v -p: the snapshots, the volume and its `used` (as `zfs destroy -nvp`), and
        // nothing destroyed.
        env.ok(&["sync", "tank"]);
        let used = env.ok(&["get", "-H", "-p", "-o", "value", "used", two]);
        let used: u64 = used.trim().parse().unwrap();
        assert!(used >= 512 << 10, "{served}: used {used}");
        let plan = env.ok(&["destroy", "-r", "-n", "-v", "-p", two]);
        assert_eq!(
            plan,
            format!("destroy\t{two}@s\ndestroy\t{two}\nreclaim\t{used}\n"),
            "{served}"
        );
        let plan = env.ok(&["vol", "destroy", "-n", one]);
        assert_eq!(
            plan,
            format!("would destroy {one}\nwould reclaim 0\n"),
            "{served}"
        );
        let left = env.ok(&["list", "-H", "-o", "name", "-t", "all", "tank"]);
        assert!(
            left.contains(&format!("{two}@s\n")) && left.contains(&format!("{one}\n")),
            "{served}: {left}"
        );
        // -v without -n: the same plan, done.
        let said = env.ok(&["destroy", "-v", one]);
        assert_eq!(
            said,
            format!("will destroy {one}\nwill reclaim 0\n"),
            "{served}"
        );
        env.ok(&["destroy", "-r", two]);
        let left = env.ok(&["list", "-H", "-o", "name", "-t", "all", "tank"]);
        assert_eq!(left, "tank/a\n", "{served}");
        let e = env.fails(&["destroy", one]);
        assert!(e.contains("not found"), "{served}: {e}");
    };
    unserved_then_served(&env, check);
}

/// `get` takes several targets of one pool, as `zfs get` (a new user's `get volsize
/// tank/v0 tank/vc` was read as a device and refused as such); a device still follows its
/// pool. The same with and without a server.
#[test]
fn get_takes_several_targets_of_one_pool() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[]), ("b", "16M", &[])]);
    env.ok(&["snapshot", "tank/a@s"]);
    let check = |served: &str| {
        let got = env.ok(&[
            "get",
            "-H",
            "-p",
            "-o",
            "name,value",
            "volsize",
            "tank/a",
            "tank/b",
            "tank/a@s",
        ]);
        assert_eq!(
            got,
            format!(
                "tank/a\t{}\ntank/b\t{}\ntank/a@s\t{}\n",
                8 << 20,
                16 << 20,
                8 << 20
            ),
            "{served}"
        );
        let e = env.fails(&["get", "volsize", "tank/a", "other/b"]);
        assert!(e.contains("other/b is not in tank"), "{served}: {e}");
        let e = env.fails(&["get", "scheduler", "tank", "x.img", "y.img"]);
        assert!(e.contains("unexpected 'y.img'"), "{served}: {e}");
    };
    unserved_then_served(&env, check);
}

/// `export` of a pool an NBD client has open is refused, as `zpool export` refuses a busy
/// pool (it used to disconnect them: a new user expected the refusal that destroy and
/// rollback give); `export -f` disconnects that pool's clients only.
#[test]
fn export_of_one_of_two_pools_disconnects_only_its_clients() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    tank2(&env);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let on_tank = hold(&server.uri("tank/vol0"));
    let on_tank2 = hold(&server.uri("tank2/w0"));
    let e = env.fails(&["export", "tank2"]);
    assert!(
        e.contains("pool 'tank2' is in use: tank2/w0 is open by 1 NBD client")
            && e.contains("-f disconnects them"),
        "{e}"
    );
    assert!(exports(&server).contains("tank2/w0"));
    assert!(env.ok(&["list", "-H"]).contains("tank2"));
    env.ok(&["export", "-f", "tank2"]);
    let said = release(on_tank2);
    assert!(said.starts_with("disconnected"), "{said}");
    assert_eq!(release(on_tank), "still connected");
    assert!(env.ok(&["status", "tank"]).contains("ONLINE"));
    // Exported cleanly: it imports elsewhere (another cache file, no server there) with
    // what its client wrote and flushed.
    let elsewhere = env.path("elsewhere.cache");
    let other = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_oxpool"));
        command.arg("--cache-file").arg(&elsewhere).args(args);
        String::from_utf8_lossy(&run(command, &format!("{args:?}")).stdout).into_owned()
    };
    let dir = env.dir.path().to_str().unwrap().to_string();
    other(&["import", "-d", &dir, "tank2"]);
    let out = env.path("w0.bin");
    other(&[
        "vol",
        "read",
        "tank2/w0",
        "--length",
        "4096",
        out.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&out).unwrap(), vec![0x5a; 4096]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// Sends `bytes` on a new connection to the control socket, closes the writing side, and
/// returns the first message the server answers with (None: it just closed).
fn exchange(socket: &Path, bytes: &[u8]) -> Option<Message> {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    decode(&got).ok().flatten().map(|(m, _)| m)
}

fn request(args: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    encode(
        &Message::Request(Request {
            args: args.iter().map(|a| a.to_string()).collect(),
            cwd: "/".into(),
            stderr_is_terminal: false,
        }),
        &mut out,
    )
    .unwrap();
    out
}

fn exit_error(m: Option<Message>) -> String {
    match m {
        Some(Message::Exit { code, error }) if code != 0 => error,
        other => panic!("expected a failed exit, got {other:?}"),
    }
}

#[test]
fn malformed_control_messages_end_that_connection_only() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let socket = server.control_socket();
    let e = exit_error(exchange(&socket, b"GET / HTTP/1.1\r\n\r\n"));
    assert!(
        e.contains("bad control request") && e.contains("magic"),
        "{e}"
    );
    let mut huge = request(&["status"]);
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = exit_error(exchange(&socket, &huge[..12]));
    assert!(e.contains("larger than the limit"), "{e}");
    let whole = request(&["status", "tank"]);
    let e = exit_error(exchange(&socket, &whole[..whole.len() - 3]));
    assert!(e.contains("ended in the middle"), "{e}");
    let mut flipped = whole.clone();
    flipped[20] ^= 0x10;
    let e = exit_error(exchange(&socket, &flipped));
    assert!(e.contains("checksum"), "{e}");
    let mut v2 = whole.clone();
    v2[4] = 2;
    let e = exit_error(exchange(&socket, &v2));
    assert!(e.contains("version"), "{e}");
    let e = exit_error(exchange(&socket, &request(&["frobnicate", "tank"])));
    assert!(e.contains("frobnicate"), "{e}");
    let e = exit_error(exchange(&socket, &request(&["serve"])));
    assert!(e.contains("cannot run inside a server"), "{e}");
    let mut stdout_first = Vec::new();
    encode(&Message::Stdout(b"hi".to_vec()), &mut stdout_first).unwrap();
    let e = exit_error(exchange(&socket, &stdout_first));
    assert!(e.contains("expected a command request"), "{e}");
    // An argument so long that the error quoting it would not fit a frame: a clear error,
    // and not a command slot lost (more of them than the server runs at once).
    let huge_arg = "x".repeat(1_048_000);
    for _ in 0..3 {
        let e = exit_error(exchange(&socket, &request(&[&huge_arg])));
        assert!(
            e.len() <= 4100 && e.contains("xxx"),
            "{}",
            &e[..80.min(e.len())]
        );
    }
    for _ in 0..70 {
        exit_error(exchange(&socket, &request(&["get", "bogus", "tank"])));
    }
    assert!(env
        .ok(&["get", "-p", "volsize", "tank/vol0"])
        .contains("16777216"));
    // The client refuses a command line too long for one frame (the OS takes 128 KiB per
    // argument: ten long properties), at once.
    let prop = format!("comment={}", "y".repeat(120_000));
    let mut args = vec!["vol", "create", "tank/v7", "--size", "1M"];
    for _ in 0..10 {
        args.extend(["-o", prop.as_str()]);
    }
    let out = env.run(&args);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(e.contains("too long"), "{}", &e[..200.min(e.len())]);
    // A client that connects and leaves, or leaves mid-request, changes nothing.
    drop(UnixStream::connect(&socket).unwrap());
    {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(&whole[..7]).unwrap();
    }
    // One that leaves right after asking for a long command: the command goes on.
    {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(&request(&["scrub", "-w", "tank"])).unwrap();
    }
    let mut finished = false;
    // Bounded: the scrub of a small pool ends within moments.
    for _ in 0..600 {
        if env.ok(&["status", "tank"]).contains("scan: scrub repaired") {
            finished = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(finished, "the scrub did not run to its end");
    // The server serves on: NBD and the control socket alike.
    let size = tool("nbdinfo", &["--size", &server.uri("tank/vol0")]);
    assert_eq!(size.trim(), (16u64 << 20).to_string());
    match exchange(&socket, &request(&["get", "-p", "volsize", "tank/vol0"])) {
        Some(Message::Stdout(out)) => {
            assert!(String::from_utf8_lossy(&out).contains("16777216"))
        }
        other => panic!("get through the socket: {other:?}"),
    }
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// uid and gid of `nobody`.
const NOBODY: u32 = 65534;

#[test]
fn only_the_serving_user_may_administer() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!(
            "this test switches users (uid {NOBODY}) and needs root; CI runs it as root. \
             Not run here: nothing was checked"
        );
    }
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    // Let another user find the cache file and the runtime directory (not the socket).
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        env.path("pools.cache"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // A copy of the binary the other user can run: the checkout may sit in a directory
    // only root may enter (a clone into `mktemp -d`, mode 0700).
    let binary = env.path("oxpool-for-nobody");
    std::fs::copy(env!("CARGO_BIN_EXE_oxpool"), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody_command = || {
        let mut command = Command::new(&binary);
        command
            .arg("--cache-file")
            .arg(env.path("pools.cache"))
            .current_dir(env.dir.path())
            .uid(NOBODY)
            .gid(NOBODY);
        command
    };
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let socket = server.control_socket();
    let mut as_nobody = nobody_command();
    as_nobody.args(["status", "tank"]);
    let out = harness::run_unchecked(as_nobody, "oxpool status as nobody");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("permission denied") && err.contains(socket.to_str().unwrap()),
        "{err}"
    );
    let (ok, _) = server.stop();
    assert!(ok.success());

    // The other way round: a server run by nobody refuses root, which the socket's mode
    // does not stop.
    for entry in std::fs::read_dir(env.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        std::os::unix::fs::lchown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::os::unix::fs::chown(env.dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let mut command = nobody_command();
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    let server = ServerProcess::start(command);
    let e = env.fails(&["status", "tank"]);
    assert!(
        e.contains("permission denied") && e.contains("uid 0"),
        "{e}"
    );
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn several_admin_commands_at_once_all_take_effect() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let env = Arc::new(env);
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let env = env.clone();
            std::thread::spawn(move || {
                let name = format!("tank/c{i}");
                env.ok(&["vol", "create", &name, "--size", "4M"]);
                env.ok(&["set", &format!("volsize={}M", 8 + i), &name]);
                env.ok(&[
                    "set",
                    if i % 2 == 0 {
                        "sync=always"
                    } else {
                        "sync=disabled"
                    },
                    &name,
                ]);
                env.ok(&["status", "tank"]);
                env.ok(&["list"]);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a command failed");
    }
    let list = env.ok(&["vol", "list", "-H", "-p", "tank"]);
    let listed = exports(&server);
    for i in 0..8u64 {
        let name = format!("tank/c{i}");
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("{name}\t")))
            .unwrap_or_else(|| panic!("{name} missing:\n{list}"));
        assert_eq!(
            line.split('\t').nth(1).unwrap(),
            ((8 + i) << 20).to_string()
        );
        let sync = env.ok(&["get", "sync", &name]);
        assert!(
            sync.contains(if i % 2 == 0 { "always" } else { "disabled" }),
            "{sync}"
        );
        assert!(listed.contains(&name), "{name} not exported:\n{listed}");
    }
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn a_pool_created_into_a_server_is_served_and_a_served_pool_is_destroyed_only_when_unused() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let file = env.path("tank3.img");
    // With a server running, create goes to it: the new pool is served at once.
    env.ok(&["create", "tank3", "tank3.img", "--size", "128M", "--sparse"]);
    assert!(file.exists());
    env.ok(&["vol", "create", "tank3/x", "--size", "8M"]);
    assert!(exports(&server).contains("tank3/x"));
    // Standard input streams through the socket into a served volume, and back out.
    let data = harness::random_bytes(11, 3 << 20);
    let mut write = env.oxpool_command();
    write
        .args(["vol", "write", "tank3/x", "--offset", "4096", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = write.spawn().unwrap();
    child.stdin.take().unwrap().write_all(&data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut read = env.oxpool_command();
    read.args([
        "vol",
        "read",
        "tank3/x",
        "--offset",
        "4096",
        "--length",
        &data.len().to_string(),
        "-",
    ]);
    let out = run(read, "vol read to stdout");
    assert!(out.stdout == data, "read back through the server differs");

    let client = hold(&format!("nbd://{}/tank3/x", server.tcp_addr()));
    let e = env.fails(&["destroy", "tank3"]);
    assert!(
        e.contains("in use") && e.contains("tank3/x") && e.contains("-f"),
        "{e}"
    );
    assert!(env.ok(&["list"]).contains("tank3"));
    env.ok(&["destroy", "-f", "tank3"]);
    assert!(release(client).starts_with("disconnected"));
    assert!(!env.ok(&["list"]).contains("tank3"));
    assert!(!exports(&server).contains("tank3"));
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn scrub_w_reports_progress_through_the_channel_and_status_shows_the_scan() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &["volblocksize=4K"])]);
    std::fs::write(env.path("in.bin"), harness::random_bytes(5, 48 << 20)).unwrap();
    env.ok(&["vol", "write", "tank/vol0", "in.bin"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let mut s = UnixStream::connect(server.control_socket()).unwrap();
    s.write_all(&request(&["scrub", "-w", "tank"])).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let mut messages = Vec::new();
    let mut at = 0;
    // Bounded by the bytes received: each pass consumes one frame.
    while let Some((m, used)) = decode(&got[at..]).unwrap() {
        messages.push(m);
        at += used;
    }
    let progress: Vec<(u64, u64)> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Progress { label, done, total } => {
                assert_eq!(label, "scrub tank");
                Some((*done, *total))
            }
            _ => None,
        })
        .collect();
    assert!(!progress.is_empty(), "no progress: {messages:?}");
    assert!(
        progress.windows(2).all(|w| w[0].0 <= w[1].0),
        "{progress:?}"
    );
    assert!(
        progress.iter().all(|(_, total)| *total >= 48 << 20),
        "{progress:?}"
    );
    let stdout: Vec<u8> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Stdout(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let stdout = String::from_utf8(stdout).unwrap();
    assert!(
        stdout.contains("scrub of tank:") && stdout.contains("0 bad"),
        "{stdout}"
    );
    assert!(matches!(
        messages.last(),
        Some(Message::Exit { code: 0, .. })
    ));
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains("scan: scrub repaired 0B in "), "{status}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn a_property_set_live_is_durable_when_the_command_returns() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    env.ok(&["set", "txg_timeout=3600", "tank"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    env.ok(&["set", "sync=always", "tank/vol0"]);
    env.ok(&["set", "scheduler=off", "tank"]);
    env.ok(&["vol", "create", "tank/v2", "--size", "8M"]);
    // No write, no flush, no timed sync: only the commands' own syncs can have kept these.
    server.kill9();
    assert!(env.ok(&["get", "sync", "tank/vol0"]).contains("always"));
    assert!(env.ok(&["get", "scheduler", "tank"]).contains("off"));
    assert!(env.ok(&["vol", "list"]).contains("tank/v2"));
    // Killed: the pool audits clean.
    env.ok(&["audit", "tank"]);
}

#[test]
fn changes_racing_an_export_never_leave_an_export_behind() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    tank2(&env);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let env = Arc::new(env);
    // A long change of tank2 (an add that zero-writes a new 1 GiB file), a second change
    // queued behind it, then the export: the export waits for both (or they are refused);
    // neither may run after it and leave an export of an exported pool.
    let add = {
        let env = env.clone();
        std::thread::spawn(move || {
            let big = env.path("big.img");
            env.run(&["add", "tank2", big.to_str().unwrap(), "--size", "1G"])
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let create = {
        let env = env.clone();
        std::thread::spawn(move || env.run(&["vol", "create", "tank2/late", "--size", "1M"]))
    };
    std::thread::sleep(Duration::from_millis(300));
    env.ok(&["export", "tank2"]);
    let (add, create) = (add.join().unwrap(), create.join().unwrap());
    let listed = exports(&server);
    assert!(
        !listed.contains("tank2/"),
        "an export of the exported pool:\n{listed}"
    );
    assert!(listed.contains("tank/vol0"));
    // Exported cleanly, with whatever the changes that ran did: another process imports it.
    let elsewhere = env.path("elsewhere.cache");
    let mut import = Command::new(env!("CARGO_BIN_EXE_oxpool"));
    import.arg("--cache-file").arg(&elsewhere).args([
        "import",
        "-d",
        env.dir.path().to_str().unwrap(),
        "tank2",
    ]);
    run(import, "import elsewhere");
    let mut vols = Command::new(env!("CARGO_BIN_EXE_oxpool"));
    vols.arg("--cache-file")
        .arg(&elsewhere)
        .args(["vol", "list", "tank2"]);
    let vols = String::from_utf8_lossy(&run(vols, "vol list").stdout).into_owned();
    assert_eq!(
        vols.contains("tank2/late"),
        create.status.success(),
        "the volume exists exactly if its command said so:\n{vols}"
    );
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

#[test]
fn importing_into_a_server_locks_only_the_imported_pools_devices() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    tank2(&env);
    let file3 = env.path("tank3.img");
    env.ok(&[
        "create",
        "tank3",
        file3.to_str().unwrap(),
        "--size",
        "128M",
        "--sparse",
    ]);
    env.ok(&["export", "tank2"]);
    env.ok(&["export", "tank3"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let dir = env.dir.path().to_str().unwrap().to_string();
    env.ok(&["import", "-d", &dir, "tank2"]);
    // tank3's device was a candidate of the first import; it must be free for the second.
    env.ok(&["import", "-d", &dir, "tank3"]);
    let list = env.ok(&["list"]);
    assert!(list.contains("tank2") && list.contains("tank3"), "{list}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// `serve` with no pool named serves every known pool it can open: one whose log device
/// was lost is left out with why (and imported later with `-m`), not the end of the server;
/// meanwhile `list` shows it UNAVAIL and `status` says why.
#[test]
fn serve_serves_the_pools_it_can_open_and_list_shows_the_others_unavail() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    tank2(&env);
    let slog = env.path("slog.img");
    let slog = slog.to_str().unwrap();
    env.ok(&["add", "tank2", "log", slog, "--size", "64M", "--sparse"]);
    std::fs::remove_file(slog).unwrap();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    assert!(exports(&server).contains("tank/vol0"));
    assert!(!exports(&server).contains("tank2/w0"));
    // `list` shows the served pool and the one that cannot be opened UNAVAIL, and exits 0
    // (as `zpool list`); `status` of it says why and lists the device it lacks.
    let list = env.ok(&["list", "-H"]);
    let rows: Vec<Vec<&str>> = list.lines().map(|l| l.split('\t').collect()).collect();
    assert!(
        rows.iter().any(|r| r[0] == "tank" && r[4] == "ONLINE"),
        "{list}"
    );
    assert!(
        rows.iter()
            .any(|r| r[..] == ["tank2", "-", "-", "-", "UNAVAIL", "-"]),
        "{list}"
    );
    // Datasets: the served pool's, and none of the pool that cannot be opened (exit 0).
    let vols = env.ok(&["list", "-t", "volume", "-H", "-o", "name"]);
    assert_eq!(vols.trim(), "tank/vol0");
    let status = env.ok(&["status", "tank2"]);
    assert!(status.contains(" state: UNAVAIL"), "{status}");
    assert!(status.contains("import -m"), "the reason: {status}");
    assert!(
        status
            .lines()
            .any(|l| l.contains(slog) && l.contains("UNAVAIL") && l.contains("not found")),
        "{status}"
    );
    assert!(
        status
            .lines()
            .any(|l| l.contains("tank2.img") && l.contains("found")),
        "{status}"
    );
    // `export` forgets it (as `zpool export` of a faulted pool), saying how to find it again.
    let out = env.run(&["export", "tank2"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("import -d"), "{err}");
    assert!(!env.ok(&["list", "-H"]).contains("tank2"));
    let dir = env.dir.path().to_str().unwrap().to_string();
    env.ok(&["import", "-m", "-d", &dir, "tank2"]);
    assert!(exports(&server).contains("tank2/w0"));
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    assert!(
        out.contains("pool 'tank2' is not served") && out.contains("import -m"),
        "{out}"
    );
    // The banner names only the pools it serves.
    let banner = out
        .lines()
        .find(|l| l.starts_with("serving pool(s)"))
        .unwrap_or_default();
    assert!(
        banner.contains("tank") && !banner.contains("tank2"),
        "{banner}"
    );
}

/// A server whose control socket file someone removed (a cleaner of the run directory) still
/// stops on SIGTERM and exports its pools: stopping the control server used to wake its
/// blocked accept by connecting to the file, and with the file gone it waited forever.
#[test]
fn a_server_whose_control_socket_was_removed_still_stops() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let socket = server.control_socket();
    std::fs::remove_file(&socket).expect("remove the control socket");
    // Fails (and kills the server) if it is still running after the harness's hang limit.
    let (status, output) = server.stop();
    assert!(status.success(), "{status}: {output}");
    // Exported cleanly: the pool imports without the unclean-shutdown replay.
    env.ok(&["vol", "list", "tank"]);
}

/// A pool that cannot be opened, one of whose listed paths now holds a device of another
/// pool that a server serves (and holds): that device is not this pool's, so the pool is
/// listed UNAVAIL naming what is at the path, and `export` forgets it. It used to fail
/// every command with "in use by another oxpool process".
#[test]
fn a_listed_path_holding_a_served_pool_s_device_does_not_block_the_pool() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let (b1, b2) = (env.path("b1.img"), env.path("b2.img"));
    let (b1, b2) = (b1.to_str().unwrap(), b2.to_str().unwrap());
    env.ok(&["create", "brk", b1, b2, "--size", "64M", "--sparse"]);
    std::fs::remove_file(b2).unwrap();
    env.ok(&["create", "reuse", b2, "--size", "64M", "--sparse"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let list = env.ok(&["list", "-H"]);
    assert!(
        list.lines().any(|l| l == "brk\t-\t-\t-\tUNAVAIL\t-")
            && list.lines().any(|l| l.starts_with("reuse\t")),
        "{list}"
    );
    let status = env.ok(&["status", "brk"]);
    assert!(
        status
            .lines()
            .any(|l| l.contains("b2.img") && l.contains("a device of another pool, 'reuse'")),
        "{status}"
    );
    env.ok(&["export", "brk"]);
    assert!(!env.ok(&["list", "-H"]).contains("brk"));
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// A server whose standard output and error were pipes whose reader left (`oxpool serve
/// 2>&1 | head -3`) still serves, adds exports, logs, and stops on SIGTERM, exporting its
/// pools. The signal thread used to panic on saying "stopping" to the closed pipe: the
/// server served on, and no later signal stopped it (a new user's finding); and a log line
/// that could not be written panicked the thread that logged it (the txg sync's, here at
/// `OXPOOL_LOG=info`, which logs each snapshot).
#[test]
fn a_server_whose_output_reader_left_still_stops() {
    use std::io::BufRead;
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let mut command = env.oxpool_command();
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("OXPOOL_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("start oxpool serve");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    // Bounded by the server's banner: it ends with "ready", or the pipe closes.
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("ready"));
    assert!(ready, "the server did not say ready");
    // The reader leaves: both pipes' read ends close.
    drop(lines);
    drop(stderr);
    // A new export prints its URI to the closed standard output.
    env.ok(&["vol", "create", "tank/vol1", "--size", "16M"]);
    assert!(env.ok(&["vol", "list", "tank"]).contains("vol1"));
    // The sync logs the snapshot to the closed standard error, and goes on syncing.
    env.ok(&["snapshot", "tank/vol1@s"]);
    env.ok(&["snapshot", "tank/vol1@t"]);
    assert!(env.ok(&["list", "-t", "snapshot"]).contains("tank/vol1@t"));
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    // Fails (and kills the server) if it is still running after the harness's hang limit.
    let status = harness::wait_bounded(&mut child, "oxpool serve with its output closed");
    assert!(status.success(), "{status}");
    // Exported: the pool opens here, with both volumes.
    let vols = env.ok(&["vol", "list", "tank"]);
    assert!(vols.contains("vol0") && vols.contains("vol1"), "{vols}");
}

/// Runs `check` on the pool with no server, then served (what a command does must not
/// depend on which runs it), and stops the server.
fn unserved_then_served(env: &Env, check: impl Fn(&str)) {
    check("not served");
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    check("served");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
}

/// `history` (as `zpool history`) lists the commands that changed a pool, oldest first,
/// with and without a server: the pool's creation first, each change once, never a command
/// that only read or one that was refused; `-l` adds the user, host and txg. The history is
/// the pool's: it survives an export and an import (which is recorded too).
#[test]
fn history_lists_the_commands_that_changed_the_pool() {
    let env = Env::new();
    env.tank(&[("a", "8M", &[])]);
    // The command part of each record, in order (the time stripped).
    let commands = |pool: &str| -> Vec<String> {
        let out = env.ok(&["history", pool]);
        let mut lines = out.lines();
        assert_eq!(
            lines.next(),
            Some(format!("History for '{pool}':").as_str())
        );
        assert!(out.ends_with("\n\n"), "{out}");
        lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (when, command) = l.split_once(' ').unwrap();
                // 2026-12-02.16:10:05
                assert_eq!(when.len(), 19, "{l}");
                command.to_string()
            })
            .collect()
    };
    let created = commands("tank");
    assert_eq!(created.len(), 2, "{created:?}");
    assert!(
        created[0].starts_with("oxpool create tank ")
            && created[0].ends_with(" --size 1G --sparse")
    );
    assert_eq!(created[1], "oxpool vol create tank/a --size 8M");
    let check = |served: &str| {
        let before = commands("tank");
        env.ok(&["snapshot", &format!("tank/a@{}", served.replace(' ', "-"))]);
        env.ok(&["set", "com.example:note=two words", "tank/a"]);
        env.ok(&["get", "compression", "tank/a"]);
        env.fails(&["set", "bogus=1", "tank/a"]);
        // A dry run made inside a change changes nothing: not recorded.
        env.ok(&[
            "destroy",
            "-n",
            &format!("tank/a@{}", served.replace(' ', "-")),
        ]);
        let after = commands("tank");
        assert_eq!(after[..before.len()], before[..], "{served}");
        assert_eq!(
            after[before.len()..],
            [
                format!("oxpool snapshot tank/a@{}", served.replace(' ', "-")),
                "oxpool set 'com.example:note=two words' tank/a".to_string(),
            ],
            "{served}"
        );
        let long = env.ok(&["history", "-l", "tank"]);
        let last = long.lines().rev().find(|l| !l.is_empty()).unwrap();
        assert!(
            last.contains("[user ") && last.contains(" on ") && last.contains(", txg "),
            "{served}: {last}"
        );
        // Without a pool, every pool's.
        assert!(
            env.ok(&["history"]).contains("History for 'tank':"),
            "{served}"
        );
    };
    unserved_then_served(&env, check);
    let kept = commands("tank");
    env.ok(&["export", "tank"]);
    env.ok(&["import", "-d", ".", "tank"]);
    let after = commands("tank");
    assert_eq!(after[..kept.len()], kept[..]);
    assert_eq!(
        after[kept.len()..],
        [
            "oxpool export tank".to_string(),
            "oxpool import -d . tank".to_string()
        ]
    );
    env.ok(&["audit", "tank"]);
}
