//! The `oxpool` command end to end: every verb on file-backed pools in a temporary directory,
//! with its own cache file (nothing outside the directory is touched).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_oxpool"))
            .arg("--cache-file")
            .arg(self.path("pools.cache"))
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }
    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "oxpool {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }
    fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(!o.status.success(), "oxpool {args:?} should have failed");
        let e = String::from_utf8(o.stderr).unwrap();
        assert_eq!(
            e.trim_end().lines().count(),
            1,
            "error is not one line: {e}"
        );
        e
    }
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn pool_and_volume_lifecycle() {
    let env = Env::new();
    let (a, b) = (env.path("a.img"), env.path("b.img"));
    env.ok(&["create", "tank", "mirror", p(&a), p(&b), "--size", "256M"]);
    let list = env.ok(&["list"]);
    assert!(list.contains("tank") && list.contains("ONLINE"), "{list}");
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains("mirror-0") && status.contains("a.img") && status.contains("b.img"),
        "{status}"
    );
    // Whole paths, so `-P` (as `zpool status -P`) shows the same.
    assert!(status.contains(p(&a)) && status.contains(p(&b)), "{status}");
    assert_eq!(env.ok(&["status", "-P", "tank"]), status);

    env.ok(&[
        "vol",
        "create",
        "tank/vol0",
        "--size",
        "64M",
        "-o",
        "volblocksize=4K",
    ]);
    let vols = env.ok(&["vol", "list"]);
    assert!(vols.contains("tank/vol0") && vols.contains("64M"), "{vols}");

    // Write a file in, read it back, through separate processes.
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(env.path("in.bin"), &data).unwrap();
    let write_at = |offset: &str, file: &str| {
        env.ok(&[
            "vol",
            "write",
            "tank/vol0",
            "--offset",
            offset,
            p(&env.path(file)),
        ])
    };
    write_at("12345", "in.bin");
    env.ok(&[
        "vol",
        "read",
        "tank/vol0",
        "--offset",
        "12345",
        "--length",
        &data.len().to_string(),
        p(&env.path("out.bin")),
    ]);
    assert!(
        std::fs::read(env.path("out.bin")).unwrap() == data,
        "read back differs"
    );
    // A file that would run past the end: refused whole, nothing written.
    let e = env.fails(&[
        "vol",
        "write",
        "tank/vol0",
        "--offset",
        "62M",
        p(&env.path("in.bin")),
    ]);
    assert!(
        e.contains("past its end") && e.contains("nothing written"),
        "{e}"
    );
    env.ok(&[
        "vol",
        "read",
        "tank/vol0",
        "--offset",
        "62M",
        "--length",
        "2M",
        p(&env.path("tail.bin")),
    ]);
    assert!(
        std::fs::read(env.path("tail.bin")).unwrap() == vec![0u8; 2 << 20],
        "the refused write changed the volume"
    );
    // A read past the end: refused before a byte goes out, in the terms asked.
    let past = env.run(&[
        "vol",
        "read",
        "tank/vol0",
        "--offset",
        "63M",
        "--length",
        "2M",
        "-",
    ]);
    let e = String::from_utf8_lossy(&past.stderr);
    assert!(!past.status.success() && past.stdout.is_empty(), "{e}");
    assert!(
        e.contains("2097152 bytes at offset 66060288") && e.contains("nothing read"),
        "{e}"
    );
    // USED is `used`: what a snapshot holds counts too, as `zfs list`.
    env.ok(&["snapshot", "tank/vol0@before"]);
    let other: Vec<u8> = data.iter().map(|b| !b).collect();
    std::fs::write(env.path("other.bin"), &other).unwrap();
    write_at("12345", "other.bin");
    // A snapshot is read-only, and says so.
    let e = env.fails(&["vol", "write", "tank/vol0@before", p(&env.path("in.bin"))]);
    assert!(e.contains("a snapshot is read-only"), "{e}");
    // A snapshot reads as the volume was.
    let len = data.len().to_string();
    for (name, want) in [("tank/vol0@before", &data), ("tank/vol0", &other)] {
        let out = env.path("snap.bin");
        env.ok(&[
            "vol",
            "read",
            name,
            "--offset",
            "12345",
            "--length",
            &len,
            p(&out),
        ]);
        assert!(std::fs::read(&out).unwrap() == *want, "{name} reads wrong");
    }
    let used = env.ok(&["get", "-p", "used", "tank/vol0"]);
    let used = used
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap();
    let referenced = env.ok(&["get", "-p", "referenced", "tank/vol0"]);
    assert!(
        !referenced.contains(used),
        "nothing held by the snapshot: {referenced}"
    );
    let listed = env.ok(&["vol", "list", "-H", "-p"]);
    assert!(
        listed.lines().any(|l| l.split('\t').nth(2) == Some(used)),
        "vol list USED is not used ({used}):\n{listed}"
    );
    // A snapshot's properties are read-only: no source.
    assert_eq!(
        env.ok(&[
            "get",
            "-H",
            "-o",
            "source",
            "referenced",
            "tank/vol0@before"
        ]),
        "-\n"
    );
    env.ok(&["destroy", "tank/vol0@before"]);
    write_at("12345", "in.bin");

    // Properties.
    assert!(env.ok(&["get", "volblocksize", "tank/vol0"]).contains("4K"));
    assert!(env
        .ok(&["get", "-p", "volblocksize", "tank/vol0"])
        .contains("4096"));
    // As zfs get: a comma list, -H (no header, tabs), -p (exact; times in seconds).
    let two = env.ok(&[
        "get",
        "-H",
        "-p",
        "volsize,volblocksize,creation",
        "tank/vol0",
    ]);
    let rows: Vec<Vec<&str>> = two.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 3, "{two}");
    assert_eq!(
        rows[0],
        ["tank/vol0", "volsize", "67108864", "local"],
        "{two}"
    );
    assert_eq!(
        rows[1],
        ["tank/vol0", "volblocksize", "4096", "local"],
        "{two}"
    );
    let created: u64 = rows[2][2].parse().unwrap_or_else(|_| panic!("{two}"));
    // share/unshare act on a server's exports: a pool no server has is refused in one line.
    let e = env.fails(&["share", "tank/vol0"]);
    assert!(e.contains("not served"), "{e}");
    let e = env.fails(&["share", "nosuch/vol0"]);
    assert!(e.contains("no pool 'nosuch'"), "{e}");
    // -o picks fields in the order asked; `-H -o value` gives bare values for scripts.
    let values =
        |props: &str, target: &str| env.ok(&["get", "-H", "-p", "-o", "value", props, target]);
    assert_eq!(
        values("volsize,volblocksize", "tank/vol0"),
        "67108864\n4096\n"
    );
    assert_eq!(
        env.ok(&[
            "get",
            "-H",
            "-o",
            "property,name",
            "volblocksize",
            "tank/vol0"
        ]),
        "volblocksize\ttank/vol0\n"
    );
    let picked = env.ok(&["get", "-o", "value", "volsize", "tank/vol0"]);
    assert_eq!(
        picked.lines().collect::<Vec<_>>(),
        ["VALUE", "64M"],
        "{picked}"
    );
    let e = env.fails(&["get", "-o", "value,size", "volsize", "tank/vol0"]);
    assert!(
        e.contains("no field 'size'") && e.contains("name, property, value"),
        "{e}"
    );
    // SOURCE as zfs get: `default` for a setting at its default value, `local` for one set
    // (volblocksize was, at creation), `-` for a statistic; the pool's settings likewise.
    assert_eq!(
        env.ok(&[
            "get",
            "-H",
            "-o",
            "property,source",
            "volblocksize,checksum,used",
            "tank/vol0"
        ]),
        "volblocksize\tlocal\nchecksum\tdefault\nused\t-\n"
    );
    assert_eq!(
        env.ok(&["get", "-H", "-o", "source", "cache_max,freeing", "tank"]),
        "default\n-\n"
    );
    // The pool's space and health beside its settings, as zpool get: what list shows.
    let listed = env.ok(&["list", "-H", "-p", "tank"]);
    let listed: Vec<&str> = listed.trim_end().split('\t').collect();
    assert_eq!(
        values("size,allocated,free,health", "tank"),
        format!(
            "{}\n{}\n{}\n{}\n",
            listed[1], listed[2], listed[3], listed[4]
        )
    );
    let size: u64 = listed[1].parse().unwrap();
    let allocated: u64 = listed[2].parse().unwrap();
    assert_eq!(
        values("capacity", "tank"),
        format!("{}\n", allocated * 100 / size)
    );
    assert!(env.fails(&["set", "size=1G", "tank"]).contains("read-only"));
    assert_eq!(
        env.ok(&["get", "-H", "-o", "all", "volsize", "tank/vol0"]),
        env.ok(&["get", "-H", "volsize", "tank/vol0"])
    );
    let e = env.fails(&["get", "-o", "VALUE", "volsize", "tank/vol0"]);
    assert!(e.contains("no field 'VALUE'"), "{e}");
    let human = env.ok(&["get", "creation,volsize", "tank/vol0"]);
    assert!(human.lines().next().unwrap().starts_with("NAME"), "{human}");
    assert!(
        !human.contains(&created.to_string()),
        "a date, not seconds: {human}"
    );
    assert!(human.contains("64M"), "{human}");
    env.ok(&["set", "sync=always", "tank/vol0"]);
    assert!(env.ok(&["get", "all", "tank/vol0"]).contains("always"));
    env.ok(&["set", "txg_timeout=2", "tank"]);
    assert!(env.ok(&["get", "txg_timeout", "tank"]).contains(" 2"));
    assert_eq!(
        env.ok(&["get", "-H", "-o", "value,source", "txg_timeout", "tank"]),
        "2\tlocal\n"
    );
    env.ok(&["set", "volsize=128M", "tank/vol0"]);
    assert!(env.ok(&["vol", "list", "tank"]).contains("128M"));
    let e = env.fails(&["set", "volblocksize=8K", "tank/vol0"]);
    assert!(e.contains("fixed"), "{e}");
    let e = env.fails(&["set", "bogus=1", "tank"]);
    assert!(e.contains("unknown"), "{e}");

    // The vdev queue's scheduler: pool-wide, then one device's own setting, then back.
    assert!(env.ok(&["get", "scheduler", "tank"]).contains("auto"));
    env.ok(&["set", "scheduler=on", "tank"]);
    env.ok(&["set", "scheduler=off", "tank", p(&b)]);
    let dev = env.ok(&["get", "scheduler", "tank", p(&b)]);
    assert!(dev.contains("off") && dev.contains("local"), "{dev}");
    assert_eq!(
        env.ok(&[
            "get",
            "-H",
            "-o",
            "source,value",
            "scheduler",
            "tank",
            p(&b)
        ]),
        "local\toff\n"
    );
    let dev = env.ok(&["get", "all", "tank", p(&a)]);
    assert!(dev.contains(" on ") && dev.contains("default"), "{dev}");
    env.ok(&["set", "scheduler=inherit", "tank", p(&b)]);
    assert!(env
        .ok(&["get", "scheduler", "tank", p(&b)])
        .contains(" on "));
    let e = env.fails(&["set", "scheduler=fast", "tank"]);
    assert!(e.contains("auto, on or off"), "{e}");
    let e = env.fails(&["set", "scheduler=on", "tank", "/no/such.img"]);
    assert!(e.contains("no/such.img"), "{e}");
    env.ok(&["set", "scheduler=auto", "tank"]);

    // Scrub finds nothing wrong on a healthy pool.
    let s = env.ok(&["scrub", "-w", "tank"]);
    assert!(s.contains("0 bad"), "{s}");

    // Export, then import from the directory.
    env.ok(&["export", "tank"]);
    assert!(!env.ok(&["list"]).contains("tank"));
    // As zpool: with no pools, status (-x too) and list say so.
    for args in [&["status"][..], &["status", "-x"], &["list"]] {
        assert_eq!(env.ok(args), "no pools available\n", "{args:?}");
    }
    let found = env.ok(&["import", "-d", p(env.dir.path())]);
    assert!(found.contains("pool: tank"), "{found}");
    env.ok(&["import", "-d", p(env.dir.path()), "tank"]);
    env.ok(&[
        "vol",
        "read",
        "tank/vol0",
        "--offset",
        "12345",
        "--length",
        &data.len().to_string(),
        p(&env.path("out2.bin")),
    ]);
    assert!(
        std::fs::read(env.path("out2.bin")).unwrap() == data,
        "data lost across export/import"
    );

    // Destroying a volume and the pool.
    env.ok(&["vol", "destroy", "tank/vol0"]);
    assert!(!env.ok(&["vol", "list"]).contains("vol0"));
    env.ok(&["destroy", "tank"]);
    assert!(!env.ok(&["list"]).contains("tank"));
    // As zpool: with no pools, status (-x too) and list say so.
    for args in [&["status"][..], &["status", "-x"], &["list"]] {
        assert_eq!(env.ok(args), "no pools available\n", "{args:?}");
    }
    let found = env.ok(&["import", "-d", p(env.dir.path())]);
    assert!(found.contains("no pools"), "{found}");
}

#[test]
fn creates_device_files_allocated_unless_asked_for_sparse() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    let (a, b, l) = (env.path("a.img"), env.path("b.img"), env.path("l.img"));
    env.ok(&["create", "thick", p(&a), "--size", "64M"]);
    env.ok(&["create", "thin", p(&b), "--size", "64M", "--sparse"]);
    env.ok(&["add", "thick", "log", p(&l), "--size", "32M"]);
    // st_blocks counts 512-byte units: a thick file has a block under every byte, a sparse
    // one only under what the pool wrote (labels, metadata: far less than half).
    let allocated = |f: &std::path::Path| std::fs::metadata(f).unwrap().blocks() * 512;
    assert_eq!(std::fs::metadata(&a).unwrap().len(), 64 << 20);
    assert!(
        allocated(&a) >= 64 << 20,
        "{} bytes allocated",
        allocated(&a)
    );
    assert!(
        allocated(&l) >= 32 << 20,
        "{} bytes allocated",
        allocated(&l)
    );
    assert_eq!(std::fs::metadata(&b).unwrap().len(), 64 << 20);
    assert!(
        allocated(&b) < 32 << 20,
        "{} bytes allocated",
        allocated(&b)
    );
    // Both pools work alike.
    for pool in ["thick", "thin"] {
        env.ok(&["vol", "create", &format!("{pool}/v"), "--size", "8M"]);
        assert!(env.ok(&["status", pool]).contains(pool));
    }
    let e = env.fails(&["create", "x", p(&env.path("x.img")), "--sparse"]);
    assert!(e.contains("--size"), "{e}");
    let e = env.fails(&["create", "x", p(&env.path("x.img")), "--size", "0"]);
    assert!(e.contains("--size"), "{e}");
    // A create that fails after making a file removes it: a directory is no device.
    let (c, not_a_device) = (env.path("c.img"), env.path("adir"));
    std::fs::create_dir(&not_a_device).unwrap();
    let e = env.fails(&["create", "y", p(&c), p(&not_a_device), "--size", "64M"]);
    assert!(e.contains("adir"), "{e}");
    assert!(!c.exists(), "the failed create left {} behind", c.display());
    // So does an add.
    let e = env.fails(&[
        "add",
        "thick",
        "log",
        p(&c),
        p(&not_a_device),
        "--size",
        "8M",
    ]);
    assert!(e.contains("adir"), "{e}");
    assert!(!c.exists(), "the failed add left {} behind", c.display());
    assert!(env.ok(&["status", "thick"]).contains("thick"));
}

/// A device of an exported pool is taken with -f; one of a pool imported here is not, with
/// -f or without, by create, add, attach or replace (as ZFS refuses a device of an active
/// pool), and the pool it belongs to stays as it was.
#[test]
fn refuses_a_device_of_another_pool_unless_forced() {
    let env = Env::new();
    let a = env.path("a.img");
    env.ok(&["create", "one", p(&a), "--size", "64M"]);
    let b = env.path("b.img");
    env.ok(&["create", "other", p(&b), "--size", "64M"]);
    for args in [
        &["create", "-f", "two", p(&a)][..],
        &["add", "-f", "other", p(&a)],
        &["add", "-f", "other", "spare", p(&a)],
        &["attach", "-f", "other", p(&b), p(&a)],
        &["replace", "-f", "other", p(&b), p(&a)],
    ] {
        let e = env.fails(args);
        assert!(
            e.contains("is a device of pool 'one', imported here"),
            "{args:?}: {e}"
        );
    }
    let status = env.ok(&["status", "-x", "one"]);
    assert_eq!(status, "pool 'one' is healthy\n");
    env.ok(&["audit", "one"]);
    // A device of the pool itself is the engine's to refuse, as before.
    let e = env.fails(&["attach", "other", p(&b), p(&b)]);
    assert!(e.contains("already in pool 'other'"), "{e}");
    env.ok(&["export", "one"]);
    let e = env.fails(&["create", "two", p(&a)]);
    assert!(
        e.contains("belongs to pool 'one'") && e.contains("-f"),
        "{e}"
    );
    env.ok(&["create", "-f", "two", p(&a)]);
    assert!(env.ok(&["list"]).contains("two"));
}

#[test]
fn errors_are_one_clear_line() {
    let env = Env::new();
    let e = env.fails(&["status", "nosuch"]);
    assert!(e.contains("nosuch"), "{e}");
    let e = env.fails(&["create", "tank", p(&env.path("missing.img"))]);
    assert!(e.contains("missing.img") && e.contains("--size"), "{e}");
    let e = env.fails(&["create", "bad/name", p(&env.path("x.img")), "--size", "64M"]);
    assert!(e.contains("invalid pool name"), "{e}");
    // As zpool create: a letter first, and no vdev kind's word (a new user made pools named
    // mirror, log, spare and 1pool).
    for name in ["mirror", "log", "spare", "raidz2x", "1pool", "_x"] {
        let e = env.fails(&["create", name, p(&env.path("x.img")), "--size", "64M"]);
        assert!(e.contains(&format!("invalid pool name '{name}'")), "{e}");
        assert!(!env.path("x.img").exists(), "{name}: nothing made");
    }
    std::fs::write(env.path("junk.img"), vec![7u8; 32 << 20]).unwrap();
    let e = env.fails(&["import", "-d", p(env.dir.path()), "tank"]);
    assert!(e.contains("junk.img"), "{e}");
    std::fs::remove_file(env.path("junk.img")).unwrap();
    // A name that is no volume is said so before what destroys a volume; a listing that
    // fails prints no header.
    env.ok(&[
        "create",
        "tank",
        p(&env.path("t.img")),
        "--size",
        "64M",
        "--sparse",
    ]);
    env.ok(&["vol", "create", "tank/v", "--size", "8M"]);
    let e = env.fails(&["destroy", "tank/nonexist"]);
    assert!(e.contains("tank/nonexist: not found"), "{e}");
    let out = env.run(&["holds", "tank/v@nosuch"]);
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    // Every verb has --help.
    for verb in [
        "create", "import", "export", "destroy", "list", "status", "vol", "get", "set", "serve",
        "scrub",
    ] {
        let o = env.run(&[verb, "--help"]);
        assert!(o.status.success(), "{verb} --help");
    }
}

#[test]
fn a_pool_in_use_is_locked() {
    let env = Env::new();
    let a = env.path("a.img");
    env.ok(&["create", "tank", p(&a), "--size", "64M"]);
    // Hold the device lock as `oxpool serve` would, from this process.
    let f = std::fs::File::open(&a).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a valid descriptor we own.
    assert_eq!(unsafe { libc_flock(f.as_raw_fd(), 2 | 4) }, 0);
    let e = env.fails(&["status", "tank"]);
    // The holder may be another command, not a server: a `send | recv` within one pool
    // with no server is told what to do (a new user read "is `oxpool serve` running?").
    assert!(
        e.contains("in use") && e.contains("send | recv") && e.contains("serve the pool"),
        "{e}"
    );
    // A holder that lets go within a few seconds (another short command: `send -t` looking
    // for its pool beside the `recv` of its pipeline) is waited for.
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1000));
        drop(f);
    });
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains("ONLINE"), "{status}");
    holder.join().unwrap();
}

extern "C" {
    #[link_name = "flock"]
    fn libc_flock(fd: i32, op: i32) -> i32;
}

#[test]
fn log_devices_at_create_and_added_later() {
    let env = Env::new();
    let (a, l1, l2) = (env.path("a.img"), env.path("l1.img"), env.path("l2.img"));
    env.ok(&["create", "tank", p(&a), "log", p(&l1), "--size", "64M"]);
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains("l1.img"), "{status}");
    env.ok(&["vol", "create", "tank/v", "--size", "16M"]);
    env.ok(&["create", "two", p(&env.path("b.img")), "--size", "64M"]);
    env.ok(&["add", "two", "log", p(&l2), "--size", "64M"]);
    assert!(env.ok(&["status", "two"]).contains("l2.img"));
    // A data vdev too: the pool grows, striped, and new data may land there.
    let before = env.ok(&["list", "-H", "-p", "two"]);
    let size = |line: &str| line.split('\t').nth(1).unwrap().parse::<u64>().unwrap();
    env.ok(&["add", "two", p(&env.path("c.img")), "--size", "64M"]);
    let after = env.ok(&["list", "-H", "-p", "two"]);
    assert!(
        size(&after) > size(&before) + (32 << 20),
        "{before} -> {after}"
    );
    // As `zpool status`: the data vdevs, then the log vdev under `logs` (c.img, added after
    // the log, is still listed before it).
    let status = env.ok(&["status", "two"]);
    let device_lines: Vec<&str> = status
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(".img") || *l == "logs")
        .map(|l| l.split_whitespace().next().unwrap())
        .map(|w| w.rsplit('/').next().unwrap())
        .collect();
    assert_eq!(
        device_lines,
        ["b.img", "c.img", "logs", "l2.img"],
        "{status}"
    );
    let e = env.fails(&["add", "two", p(&env.path("nosuch.img"))]);
    assert!(e.contains("nosuch.img") && e.contains("--size"), "{e}");
    // Said as it is: a device of this pool, one named twice, the only log device.
    let e = env.fails(&["add", "two", "log", p(&l2)]);
    assert!(e.contains("already in pool 'two'"), "{e}");
    let m = env.path("m.img");
    let e = env.fails(&["add", "two", "log", "mirror", p(&m), p(&m), "--size", "64M"]);
    assert!(e.contains("named twice"), "{e}");
    assert!(!m.exists(), "a refused add left its file");
    let e = env.fails(&["detach", "two", p(&l2)]);
    assert!(e.contains("oxpool remove"), "{e}");
    let dir = env.dir.path().to_str().unwrap().to_string();
    // A directory of many files: the other pools by name, and a count of the files that
    // hold none, not each file's reason.
    for i in 0..6 {
        std::fs::write(env.path(&format!("junk{i}.bin")), b"not a device").unwrap();
    }
    let e = env.fails(&["import", "-d", &dir, "nosuch"]);
    assert!(
        e.contains("no pool 'nosuch'") && !e.contains("not found"),
        "{e}"
    );
    assert!(
        e.contains("other pools found: 'tank', 'two'") && e.contains("without a pool's label"),
        "{e}"
    );
    assert!(!e.contains("junk5.bin"), "every file named: {e}");
    // The log device gone: the pool is refused by name, not opened without its log, and
    // the refusal says how to go on: `status` shows it UNAVAIL with why, and a command
    // that needs it open fails with the same reason.
    std::fs::remove_file(&l2).unwrap();
    let status = env.ok(&["status", "two"]);
    assert!(status.contains(" state: UNAVAIL"), "{status}");
    let why = status.lines().find(|l| l.starts_with("status:")).unwrap();
    assert!(
        why.contains("log") && why.contains("l2.img") && why.contains("import -m"),
        "{status}"
    );
    let e = env.fails(&["vol", "list", "two"]);
    assert!(e.contains("l2.img") && e.contains("import -m"), "{e}");
    // `import -m`: without the log's records; later commands need no -m.
    assert!(env
        .ok(&["import", "-m", "two"])
        .contains("imported pool 'two'"));
    let status = env.ok(&["status", "two"]);
    assert!(
        status.contains("DEGRADED") && status.contains("oxpool remove two"),
        "{status}"
    );
    // `remove` takes the missing log vdev out; the pool is whole again.
    env.ok(&["remove", "two", p(&l2)]);
    let status = env.ok(&["status", "two"]);
    assert!(
        status.contains("ONLINE") && !status.contains("logs") && !status.contains("l2.img"),
        "{status}"
    );
    env.ok(&["audit", "two"]);
    // A data device cannot be removed: one line, nothing changed.
    let e = env.fails(&["remove", "two", p(&env.path("c.img"))]);
    assert!(e.contains("holds pool data"), "{e}");
    assert!(env.ok(&["status", "two"]).contains("c.img"));
}

/// A pool whose devices were moved to another directory: `import -d DIR` finds them by
/// their labels, and the commands after it open them where they are now.
#[test]
fn devices_moved_are_found_by_import_d_and_stay_found() {
    let env = Env::new();
    let (a, l) = (env.path("a.img"), env.path("l.img"));
    env.ok(&[
        "create",
        "tank",
        p(&a),
        "log",
        p(&l),
        "--size",
        "64M",
        "--sparse",
    ]);
    env.ok(&["vol", "create", "tank/v", "--size", "8M"]);
    let moved = env.path("moved");
    std::fs::create_dir(&moved).unwrap();
    std::fs::rename(&a, moved.join("a.img")).unwrap();
    std::fs::rename(&l, moved.join("l.img")).unwrap();
    assert!(env
        .ok(&["import", "-d", p(&moved), "tank"])
        .contains("imported pool 'tank'"));
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains("ONLINE") && status.contains("moved/l.img"),
        "{status}"
    );
    assert!(env.ok(&["vol", "list"]).contains("tank/v"));
}

/// Another pool of the same name in `-d DIR` is refused while one is imported here, which
/// stays (a new user found the first replaced in the cache file, dropped from every list);
/// the same pool again is still fine (it records where its devices are).
#[test]
fn import_of_a_second_pool_with_a_name_in_use_is_refused() {
    let env = Env::new();
    let other = Env::new();
    for (e, vol) in [(&env, "tank/v"), (&other, "tank/w")] {
        let a = e.path("a.img");
        e.ok(&["create", "tank", p(&a), "--size", "64M", "--sparse"]);
        e.ok(&["vol", "create", vol, "--size", "8M"]);
    }
    other.ok(&["export", "tank"]);
    let e = env.fails(&["import", "-d", p(other.dir.path()), "tank"]);
    assert!(
        e.contains("cannot import 'tank'")
            && e.contains("a pool named tank is imported already")
            && e.contains("oxpool export tank")
            && !e.trim().contains('\n'),
        "{e}"
    );
    let volumes = env.ok(&["vol", "list"]);
    assert!(
        volumes.contains("tank/v") && !volumes.contains("tank/w"),
        "{volumes}"
    );
    assert!(env
        .ok(&["import", "-d", p(env.dir.path()), "tank"])
        .contains("imported pool 'tank'"));
    assert!(env.ok(&["vol", "list"]).contains("tank/v"));
    // Once the first is exported, the second may come in.
    env.ok(&["export", "tank"]);
    env.ok(&["import", "-d", p(other.dir.path()), "tank"]);
    assert!(env.ok(&["vol", "list"]).contains("tank/w"));
}

/// `import -d DIR` with no pool lists each pool with the devices its labels name that the
/// directory lacks, and two files holding one device (an old copy beside the device), as
/// `zpool import` shows a pool's missing devices (a new user found a pool listed as if whole
/// that then could not be imported).
#[test]
fn import_d_lists_missing_devices_and_copies() {
    let env = Env::new();
    let dir = env.path("devs");
    std::fs::create_dir(&dir).unwrap();
    let (a, b) = (dir.join("a.img"), dir.join("b.img"));
    env.ok(&[
        "create",
        "tank",
        "mirror",
        p(&a),
        p(&b),
        "--size",
        "64M",
        "--sparse",
    ]);
    env.ok(&["export", "tank"]);
    // Without -d only known pools' devices are searched: an exported pool is not one, and
    // both forms say how to find it.
    let e = env.fails(&["import", "tank"]);
    assert!(e.contains("import -d DIR tank"), "{e}");
    let none = env.ok(&["import"]);
    assert!(none.contains("import -d DIR"), "{none}");
    let whole = env.ok(&["import", "-d", p(&dir)]);
    assert!(
        whole.contains("pool: tank") && !whole.contains("missing") && !whole.contains("copy"),
        "{whole}"
    );
    std::fs::rename(&b, env.path("b.img")).unwrap();
    std::fs::copy(&a, dir.join("a-old.img")).unwrap();
    let listed = env.ok(&["import", "-d", p(&dir)]);
    assert!(listed.contains(&format!("missing: {}", p(&b))), "{listed}");
    assert!(
        listed.contains("hold one device: one is a copy"),
        "{listed}"
    );
    assert!(listed.contains("a-old.img"), "{listed}");
    // b detached since the copy: the old copy's tree, which names b, is not the one read
    // (it sorts first).
    std::fs::rename(env.path("b.img"), &b).unwrap();
    std::fs::rename(dir.join("a-old.img"), env.path("a-old.img")).unwrap();
    env.ok(&["import", "-d", p(&dir), "tank"]);
    env.ok(&["detach", "tank", p(&b)]);
    env.ok(&["export", "tank"]);
    std::fs::remove_file(&b).unwrap();
    std::fs::rename(env.path("a-old.img"), dir.join("a-old.img")).unwrap();
    let listed = env.ok(&["import", "-d", p(&dir)]);
    assert!(
        !listed.contains("missing") && listed.contains("one is a copy"),
        "{listed}"
    );
}

/// Paths with spaces in `import -d`'s listing are quoted as one shell word each, so the
/// listing says which path is missing and pastes into a shell.
#[test]
fn import_d_quotes_paths_with_spaces() {
    let env = Env::new();
    let dir = env.path("my devs");
    std::fs::create_dir(&dir).unwrap();
    let (a, b) = (dir.join("a 1.img"), dir.join("b.img"));
    let args = ["create", "tank", "mirror", p(&a), p(&b), "--size", "64M"];
    env.ok(&[&args[..], &["--sparse"]].concat());
    env.ok(&["export", "tank"]);
    std::fs::rename(&b, env.path("b.img")).unwrap();
    let listed = env.ok(&["import", "-d", p(&dir)]);
    assert!(
        listed.contains(&format!("devices: '{}'  missing: '{}'", p(&a), p(&b))),
        "{listed}"
    );
}

/// `compression` is a volume property (default lz4) that `oxpool set` changes for what is
/// written afterwards; `compressratio`, `logicalused`, `logicalreferenced` and `used` are
/// read-only statistics shown by `oxpool get`.
#[test]
fn compression_property_and_its_statistics() {
    let env = Env::new();
    let a = env.path("a.img");
    env.ok(&["create", "tank", p(&a), "--size", "256M", "--sparse"]);
    env.ok(&[
        "vol",
        "create",
        "tank/vol0",
        "--size",
        "8M",
        "-o",
        "volblocksize=64K",
    ]);
    let all = env.ok(&["get", "all", "tank/vol0"]);
    for (name, value) in [
        ("compression", "lz4"),
        ("compressratio", "1.00x"),
        ("logicalused", "0"),
        ("logicalreferenced", "0"),
        ("used", "0"),
    ] {
        assert!(
            all.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["tank/vol0", name, value, "-"]
                || l.split_whitespace().collect::<Vec<_>>()
                    == ["tank/vol0", name, value, "default"]),
            "no {name} = {value} in:\n{all}"
        );
    }
    // As ZFS: on is lz4.
    env.ok(&["set", "compression=on", "tank/vol0"]);
    assert_eq!(
        env.ok(&[
            "get",
            "-H",
            "-o",
            "value,source",
            "compression",
            "tank/vol0"
        ]),
        "lz4\tdefault\n"
    );
    env.ok(&["set", "compression=zstd-3", "tank/vol0"]);
    assert!(env
        .ok(&["get", "compression", "tank/vol0"])
        .contains("zstd-3"));
    // 4 MiB of text: zstd stores it in well under half.
    let text: String = (0..200_000)
        .map(|i| format!("line {i}: the quick brown fox\n"))
        .collect();
    let input = env.path("text.txt");
    std::fs::write(&input, &text.as_bytes()[..4 << 20]).unwrap();
    env.ok(&["vol", "write", "tank/vol0", "--offset", "0", p(&input)]);
    let get = |name: &str| -> String {
        let out = env.ok(&["get", "-p", name, "tank/vol0"]);
        out.lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or_else(|| panic!("no value in {out}"))
            .to_string()
    };
    assert_eq!(get("logicalused"), (4u64 << 20).to_string());
    assert_eq!(get("logicalreferenced"), (4u64 << 20).to_string());
    // As zfs get -p: a bare number.
    let ratio: f64 = get("compressratio").parse().unwrap();
    assert!(ratio > 2.0, "compressratio {ratio}");
    let used: u64 = get("used").parse().unwrap();
    assert!(used < 2 << 20, "used {used}");
    let back = env.path("back.txt");
    env.ok(&[
        "vol",
        "read",
        "tank/vol0",
        "--offset",
        "0",
        "--length",
        "4M",
        p(&back),
    ]);
    assert!(
        std::fs::read(&back).unwrap() == text.as_bytes()[..4 << 20],
        "read back differs"
    );
    let err = env.fails(&["set", "compressratio=2", "tank/vol0"]);
    assert!(err.contains("read-only"), "{err}");
    let err = env.fails(&["set", "compression=gzip", "tank/vol0"]);
    assert!(err.contains("compression"), "{err}");
}

/// A known pool that cannot be opened (a device truncated, so the import refuses it):
/// `list` shows it UNAVAIL with no warning on the error stream, `status` says why (the
/// truncation, not only "not found"), listings of datasets leave it out unless it is
/// named, a pool nobody knows is said in one line with no header, and `destroy` refuses
/// without `-f` (changing nothing) and with `-f` clears the labels of its devices and
/// forgets it.
#[test]
fn a_pool_that_cannot_be_opened_is_listed_unavail_and_destroyed_only_with_f() {
    let env = Env::new();
    let (a, b, c) = (env.path("a.img"), env.path("b.img"), env.path("c.img"));
    env.ok(&["create", "tank", p(&a), p(&b), "--size", "64M", "--sparse"]);
    env.ok(&["create", "other", p(&c), "--size", "64M", "--sparse"]);
    env.ok(&["vol", "create", "other/v0", "--size", "8M"]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&b)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let out = env.run(&["list", "-H"]);
    assert!(out.status.success());
    let list = String::from_utf8(out.stdout).unwrap();
    assert!(
        list.lines().any(|l| l == "tank\t-\t-\t-\tUNAVAIL\t-"),
        "{list}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = env.ok(&["status", "tank"]);
    let why = status.lines().find(|l| l.starts_with("status:")).unwrap();
    assert!(
        why.contains("b.img") && why.contains("smaller than") && why.contains("truncated"),
        "{status}"
    );
    // Datasets: the pool that cannot be opened has none to list, unless named.
    let vols = env.ok(&["list", "-t", "volume", "-H", "-o", "name"]);
    assert_eq!(vols.trim(), "other/v0");
    let e = env.fails(&["list", "-t", "volume", "tank"]);
    assert!(e.contains("truncated"), "{e}");
    // A pool nobody knows: one line, no header.
    let out = env.run(&["list", "nosuch"]);
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("'nosuch'") && e.lines().count() == 1, "{e}");
    // `destroy` without -f: refused in one line saying both ways on; nothing changed.
    let e = env.fails(&["destroy", "tank"]);
    assert!(
        e.contains("oxpool export tank") && e.contains("destroy -f tank"),
        "{e}"
    );
    assert!(env.ok(&["list", "-H"]).contains("tank\t"));
    let dir = env.dir.path().to_str().unwrap().to_string();
    let found = env.ok(&["import", "-d", &dir]);
    assert!(
        found
            .lines()
            .any(|l| l.starts_with("pool: tank ") && l.ends_with("(imported already)")),
        "{found}"
    );
    // With -f: each device's labels cleared and said, the pool forgotten, its devices no
    // longer found by an import; the other pool untouched.
    let out = env.ok(&["destroy", "-f", "tank"]);
    assert!(
        out.contains("a.img: labels cleared") && out.contains("b.img: labels cleared"),
        "{out}"
    );
    let list = env.ok(&["list", "-H"]);
    assert!(!list.contains("tank") && list.contains("other\t"), "{list}");
    let found = env.ok(&["import", "-d", &dir]);
    assert!(!found.contains("tank"), "{found}");
    env.ok(&["audit", "other"]);
}

/// A path the cache file lists for pool `tank` now holds a device of another pool that is
/// also called `tank` (another machine's, or one exported and re-created): that device is
/// not taken. The pool shows UNAVAIL naming what is there, a command does not open the
/// other pool under this name, and `destroy -f` clears nothing of it.
#[test]
fn a_device_of_another_pool_of_the_same_name_is_not_taken() {
    let env = Env::new();
    let (a, b) = (env.path("a.img"), env.path("b.img"));
    env.ok(&["create", "tank", p(&a), "--size", "64M", "--sparse"]);
    let other = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_oxpool"))
            .arg("--cache-file")
            .arg(env.path("other.cache"))
            .args(args)
            .current_dir(env.dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    other(&["create", "tank", p(&b), "--size", "64M", "--sparse"]);
    other(&["vol", "create", "tank/theirs", "--size", "8M"]);
    std::fs::copy(&b, &a).unwrap();
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains(" state: UNAVAIL")
            && status
                .lines()
                .any(|l| l.contains("a.img") && l.contains("a device of another pool, 'tank'")),
        "{status}"
    );
    let e = env.fails(&["vol", "list", "tank"]);
    assert!(!e.contains("theirs"), "{e}");
    let out = env.ok(&["destroy", "-f", "tank"]);
    assert!(
        out.contains("a.img: left as it is (a device of another pool, 'tank'"),
        "{out}"
    );
    // Theirs is whole: its labels were not cleared (at b.img nor at the copy).
    assert!(other(&["vol", "list", "-H", "tank"]).contains("tank/theirs"));
    // Theirs is found by an import, and not marked as imported here.
    let dir = env.dir.path().to_str().unwrap().to_string();
    let found = env.ok(&["import", "-d", &dir]);
    assert!(
        found.contains("pool: tank ") && !found.contains("imported already"),
        "{found}"
    );
}

/// `destroy -f` of a pool that cannot be opened clears only devices whose start still
/// carries the pool's label: a device another tool reused (mkfs, pvcreate: its start
/// rewritten, the pool's end labels left) is left as it is, end labels and all.
#[test]
fn destroy_f_leaves_a_device_whose_start_was_reused() {
    let env = Env::new();
    let (x, y) = (env.path("x.img"), env.path("y.img"));
    env.ok(&["create", "tank", p(&x), p(&y), "--size", "64M", "--sparse"]);
    // Another tool's header over the first MiB of x; y gone.
    let f = std::fs::OpenOptions::new().write(true).open(&x).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![0x5a; 1 << 20], 0).unwrap();
    drop(f);
    std::fs::remove_file(&y).unwrap();
    let before = std::fs::read(&x).unwrap();
    let out = env.ok(&["destroy", "-f", "tank"]);
    assert!(
        out.contains("x.img: left as it is (no label of this pool at its start"),
        "{out}"
    );
    assert!(std::fs::read(&x).unwrap() == before, "x.img was changed");
    assert!(!env.ok(&["list", "-H"]).contains("tank"));
}

/// `create` takes `log` and `spare` devices as `zpool create` does (a `spare` word used to
/// become a device file named "spare"); `cache`, `special` and `dedup` are refused in one
/// line, with no file left behind.
#[test]
fn create_takes_log_and_spare_devices_and_refuses_other_classes() {
    let env = Env::new();
    let f = |n: &str| p(&env.path(n)).to_string();
    let (r1, r2, r3, l1, s1) = (
        f("r1.img"),
        f("r2.img"),
        f("r3.img"),
        f("l1.img"),
        f("s1.img"),
    );
    env.ok(&[
        "create", "tank", "raidz1", &r1, &r2, &r3, "log", &l1, "spare", &s1, "--size", "64M",
        "--sparse",
    ]);
    let status = env.ok(&["status", "tank"]);
    let lines: Vec<&str> = status.lines().map(str::trim).collect();
    let at = |word: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(word))
            .unwrap_or_else(|| panic!("no {word} in:\n{status}"))
    };
    assert!(at("logs") < at(&l1) && at(&l1) < at("spares") && at("spares") < at(&s1));
    assert!(lines[at(&s1)].contains("AVAIL"), "{status}");
    assert!(!env.path("spare").exists(), "a device file named 'spare'");
    // A second hard link to one of tank's devices, or a link to one by a relative path, is
    // that device: at add, attach and replace too.
    std::fs::hard_link(env.path("r2.img"), env.path("r2-hard.img")).unwrap();
    std::os::unix::fs::symlink("r3.img", env.path("r3-link.img")).unwrap();
    for link in ["r2-hard.img", "r3-link.img"] {
        let e = env.fails(&["add", "tank", "spare", &f(link)]);
        assert!(e.contains("is already in pool 'tank'"), "{link}: {e}");
        let e = env.fails(&["attach", "tank", &l1, &f(link)]);
        assert!(e.contains("is already in pool 'tank'"), "{link}: {e}");
        let e = env.fails(&["replace", "tank", &l1, &f(link)]);
        assert!(e.contains("is already in pool 'tank'"), "{link}: {e}");
        std::fs::remove_file(env.path(link)).unwrap();
    }
    for class in ["cache", "special", "dedup"] {
        let x = f("x.img");
        let e = env.fails(&[
            "create",
            "t2",
            &x,
            class,
            &f("y.img"),
            "--size",
            "64M",
            "--sparse",
        ]);
        assert!(
            e.contains(&format!("{class} vdevs are not supported")),
            "{e}"
        );
        assert!(!env.path("x.img").exists() && !env.path("y.img").exists());
    }
    let e = env.fails(&[
        "create",
        "t2",
        &f("x.img"),
        "spare",
        "--size",
        "64M",
        "--sparse",
    ]);
    assert!(e.contains("spare needs devices"), "{e}");
    // A path named twice, however written: said so, not "in use by another process".
    let e = env.fails(&[
        "create",
        "t2",
        "mirror",
        &f("x.img"),
        &f("y.img"),
        "spare",
        "z.img",
        "./z.img",
        "--size",
        "64M",
        "--sparse",
    ]);
    assert!(e.contains("./z.img is named twice"), "{e}");
    assert!(!env.path("x.img").exists());
    // A symbolic link to a file this create would make, and a second hard link to a file:
    // each is the file named twice (the link was found locked, "in use by another oxpool
    // process", before its target was resolved).
    std::os::unix::fs::symlink(env.path("w.img"), env.path("w-link.img")).unwrap();
    let e = env.fails(&[
        "create",
        "t2",
        &f("w.img"),
        &f("w-link.img"),
        "--size",
        "64M",
        "--sparse",
    ]);
    assert!(e.contains("w-link.img is named twice"), "{e}");
    assert!(!env.path("w.img").exists());
    std::fs::remove_file(env.path("w-link.img")).unwrap();
    std::fs::File::create(env.path("h.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    std::fs::hard_link(env.path("h.img"), env.path("h2.img")).unwrap();
    let e = env.fails(&["create", "t2", "mirror", &f("h.img"), &f("h2.img")]);
    assert!(e.contains("h2.img is named twice"), "{e}");
    std::fs::remove_file(env.path("h.img")).unwrap();
    std::fs::remove_file(env.path("h2.img")).unwrap();
    // A spare that cannot be added (r1 is tank's): no pool, no file.
    let e = env.fails(&[
        "create",
        "t2",
        &f("x.img"),
        "spare",
        &r1,
        "--size",
        "64M",
        "--sparse",
    ]);
    assert!(
        e.contains("is a device of pool 'tank', imported here"),
        "{e}"
    );
    assert!(!env.path("x.img").exists());
    assert!(!env.ok(&["list", "-H"]).contains("t2"));
    // destroy clears the spare's labels too: another pool takes it without -f.
    env.ok(&["destroy", "tank"]);
    env.ok(&["create", "t3", &s1]);
}

/// `status` of a pool that cannot be opened shows its vdev tree as the newest label found
/// records it, as `zpool status` does: which vdev lacks too many devices, which devices
/// are found, and its logs and spares.
#[test]
fn status_of_an_unavailable_pool_shows_its_vdev_tree() {
    let env = Env::new();
    let f = |n: &str| p(&env.path(n)).to_string();
    let names = ["a.img", "b.img", "c.img", "d.img", "l.img", "s.img"];
    let [a, b, c, d, l, s] = names.map(f);
    env.ok(&[
        "create", "tank", "mirror", &a, &b, "mirror", &c, &d, "log", &l, "spare", &s, "--size",
        "64M", "--sparse",
    ]);
    for gone in ["a.img", "b.img", "l.img"] {
        std::fs::rename(env.path(gone), env.path(&format!("{gone}.away"))).unwrap();
    }
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: UNAVAIL"), "{status}");
    let rows: Vec<Vec<&str>> = status
        .lines()
        .skip_while(|l| !l.contains("NAME"))
        .map(|l| l.split_whitespace().collect())
        .filter(|w: &Vec<&str>| !w.is_empty())
        .collect();
    let row = |name: &str| {
        rows.iter()
            .find(|w| w[0] == name)
            .unwrap_or_else(|| panic!("no {name} in:\n{status}"))
            .join(" ")
    };
    assert_eq!(row("mirror-0"), "mirror-0 UNAVAIL insufficient replicas");
    assert_eq!(row(&a), format!("{a} UNAVAIL not found"));
    assert_eq!(row("mirror-1"), "mirror-1 -");
    assert_eq!(row(&c), format!("{c} - found"));
    assert_eq!(row(&l), format!("{l} UNAVAIL not found"));
    assert_eq!(row(&s), format!("{s} - found"));
    let order: Vec<&str> = rows.iter().map(|w| w[0]).collect();
    let pos = |n: &str| order.iter().position(|x| *x == n).unwrap();
    assert!(pos("mirror-0") < pos(&a) && pos(&b) < pos("mirror-1") && pos(&d) < pos("logs"));
    assert!(pos("logs") < pos(&l) && pos(&l) < pos("spares") && pos("spares") < pos(&s));
    // A device of this pool cut short is not "found": mirror-1 lacks it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(env.path("c.img"))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let status = env.ok(&["status", "tank"]);
    let squeezed: Vec<String> = status
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        squeezed.contains(&"mirror-1 DEGRADED 1 of its devices not found".to_string())
            && squeezed.iter().any(|l| l.starts_with(&format!(
                "{c} UNAVAIL truncated: 33554432 bytes, the pool recorded "
            ))),
        "{status}"
    );
    // One device of mirror-0 back: that vdev can do without the other; the log device,
    // still missing, keeps the pool closed (import -m would give it up).
    std::fs::rename(env.path("a.img.away"), env.path("a.img")).unwrap();
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: UNAVAIL"), "{status}");
    assert!(
        status
            .lines()
            .any(|x| x.split_whitespace().collect::<Vec<_>>().join(" ")
                == "mirror-0 DEGRADED 1 of its devices not found"),
        "{status}"
    );
}

/// A pool that opens without one of its devices says what is at that device's path when
/// something is: another pool's device, or a file with no valid label (it said "not found
/// at import").
#[test]
fn status_says_what_is_at_the_path_of_a_device_the_pool_opened_without() {
    let env = Env::new();
    let f = |n: &str| p(&env.path(n)).to_string();
    let (a, b, c) = (f("a.img"), f("b.img"), f("c.img"));
    env.ok(&[
        "create", "tank", "mirror", &a, &b, "--size", "64M", "--sparse",
    ]);
    env.ok(&["create", "other", &c, "--size", "64M", "--sparse"]);
    env.ok(&["export", "other"]);
    std::fs::rename(&b, env.path("b.saved")).unwrap();
    std::fs::copy(&c, &b).unwrap();
    let line = |status: &str| {
        status
            .lines()
            .find(|l| l.trim_start().starts_with(&b))
            .unwrap_or_else(|| panic!("no {b} in:\n{status}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let status = env.ok(&["status", "tank"]);
    assert!(
        line(&status).starts_with(&format!(
            "{b} UNAVAIL 0 0 0 holds a device of another pool, 'other' (guid "
        )),
        "{status}"
    );
    std::fs::write(&b, b"").unwrap();
    let status = env.ok(&["status", "tank"]);
    assert_eq!(
        line(&status),
        format!("{b} UNAVAIL 0 0 0 found, with no valid label")
    );
    std::fs::remove_file(&b).unwrap();
    let status = env.ok(&["status", "tank"]);
    assert_eq!(
        line(&status),
        format!("{b} UNAVAIL 0 0 0 not found at import")
    );
}
