//! `oxpool attach`, `replace -w`, `detach`, `add POOL spare`, `remove` through the real
//! command on a pool that `oxpool serve` serves, read by a real NBD client (nbdcopy): a
//! single device becomes a mirror, its new side is replaced, a spare is listed AVAIL and
//! removed, and every byte stays right; bad requests are refused in one line with nothing
//! changed.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{random_bytes, tool, Env};

const MIB: usize = 1 << 20;

fn p(path: &std::path::Path) -> &str {
    path.to_str().unwrap()
}

/// An empty device file of `size_mib` MiB.
fn file(env: &Env, name: &str, size_mib: u64) -> std::path::PathBuf {
    let path = env.path(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(size_mib << 20)
        .unwrap();
    path
}

fn read_equals(env: &Env, uri: &str, image: &[u8], name: &str) {
    let back = env.path(&format!("{name}.out"));
    tool("nbdcopy", &["--connections=2", uri, p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == image,
        "{name}: bytes differ"
    );
}

/// The first word of each line under `config:` that names a device or group.
fn names(status: &str) -> Vec<String> {
    status
        .lines()
        .skip_while(|l| !l.starts_with("config:"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|w| w.rsplit('/').next().unwrap().to_string())
        .collect()
}

#[test]
fn device_verbs_on_a_served_pool() {
    let env = Env::new();
    let a = env.path("a.img");
    env.ok(&["create", "tank", p(&a), "--size", "256M", "--sparse"]);
    env.ok(&["vol", "create", "tank/vol0", "--size", "16M"]);
    env.ok(&["set", "data_cache_max=0", "tank"]);
    let image = random_bytes(23, 16 * MIB);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let source = env.path("image.in");
    std::fs::write(&source, &image).unwrap();
    tool("nbdcopy", &[p(&source), &uri]);

    let (c, d, e) = (
        file(&env, "c.img", 256),
        file(&env, "d.img", 256),
        file(&env, "e.img", 256),
    );
    let small = file(&env, "small.img", 64);

    // A single device becomes a mirror; -w waits for the resilver and shows the status.
    let out = env.ok(&["attach", "-w", "tank", "a.img", p(&c)]);
    assert!(out.contains("mirror-0"), "{out}");
    let status = env.ok(&["status", "tank"]);
    let n = names(&status);
    assert!(
        n.contains(&"mirror-0".into()) && n.contains(&"c.img".into()),
        "{status}"
    );
    assert!(status.contains(" state: ONLINE"), "{status}");

    // Refusals: one line each, nothing changed.
    let err = env.fails(&["replace", "tank", "c.img", p(&small)]);
    assert!(
        err.contains("cannot replace") && err.contains("smaller"),
        "{err}"
    );
    let err = env.fails(&["replace", "tank", "nosuch.img", p(&d)]);
    assert!(err.contains("nosuch.img"), "{err}");
    let err = env.fails(&["attach", "tank", "a.img", p(&c)]);
    assert!(err.contains("already in pool 'tank'"), "{err}");
    assert_eq!(env.ok(&["status", "tank"]), status);

    // The new side replaced: d takes c's place once resilvered.
    let out = env.ok(&["replace", "-w", "tank", "c.img", p(&d)]);
    assert!(!names(&out).contains(&"c.img".into()), "{out}");
    let status = env.ok(&["status", "tank"]);
    let n = names(&status);
    assert!(
        n.contains(&"d.img".into()) && !n.contains(&"c.img".into()),
        "{status}"
    );
    assert!(!n.iter().any(|x| x.starts_with("replacing")), "{status}");
    read_equals(&env, &uri, &image, "replaced");

    // The replaced device is let go: its file is unlocked (it can join a pool again) and
    // the cache file names its replacement instead. The server follows such changes on a
    // beat of 200 ms; the wait is bounded far above that, never timed.
    let mut reused = env.run(&["add", "tank", "spare", p(&c)]);
    for _ in 0..300 {
        if reused.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&reused.stderr);
        assert!(err.contains("in use"), "{err}");
        std::thread::sleep(std::time::Duration::from_millis(100));
        reused = env.run(&["add", "tank", "spare", p(&c)]);
    }
    assert!(
        reused.status.success(),
        "the replaced c.img stayed locked by the server: {}",
        String::from_utf8_lossy(&reused.stderr)
    );
    env.ok(&["remove", "tank", "c.img"]);
    let cache = std::fs::read_to_string(env.path("pools.cache")).unwrap();
    assert!(
        cache.contains("d.img") && !cache.contains("c.img"),
        "{cache}"
    );

    // A hot spare: listed AVAIL, then removed.
    env.ok(&["add", "tank", "spare", p(&e)]);
    let status = env.ok(&["status", "tank"]);
    let spare_line = status
        .lines()
        .skip_while(|l| l.trim() != "spares")
        .nth(1)
        .unwrap_or_else(|| panic!("no spares section:\n{status}"));
    assert!(
        spare_line.contains("e.img") && spare_line.contains("AVAIL"),
        "{status}"
    );
    env.ok(&["remove", "tank", "e.img"]);
    assert!(!env.ok(&["status", "tank"]).contains("spares"));

    // Detach back to a single device; the last side is refused.
    env.ok(&["detach", "tank", "d.img"]);
    let err = env.fails(&["detach", "tank", "a.img"]);
    assert!(
        err.contains("cannot detach") && err.contains("only device of its vdev"),
        "{err}"
    );
    read_equals(&env, &uri, &image, "detached");
    server.stop();
}

/// The device lines (name, state) of `oxpool status`, names without their directory.
fn states(status: &str) -> Vec<(String, String)> {
    status
        .lines()
        .skip_while(|l| !l.starts_with("config:"))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?.rsplit('/').next()?.to_string();
            let state = w.next()?.to_string();
            name.ends_with(".img").then_some((name, state))
        })
        .collect()
}

fn vol_read(env: &Env, name: &str) -> Vec<u8> {
    let out = env.path(name);
    env.ok(&["vol", "read", "tank/vol0", p(&out)]);
    std::fs::read(&out).unwrap()
}

/// With no server, `attach` and `replace` record the new device in the cache file, so the
/// next command opens it (before, it showed UNAVAIL and the pool ran degraded); a cache file
/// that is behind the pool anyway is caught up from the labels; `replace POOL OLD` takes a
/// device swapped in at OLD's path, named by its file name, and refuses the old device
/// itself in one line.
#[test]
fn device_changes_without_a_server_reach_the_next_command() {
    let env = Env::new();
    let a = env.path("a.img");
    env.ok(&["create", "tank", p(&a), "--size", "128M", "--sparse"]);
    env.ok(&["vol", "create", "tank/vol0", "--size", "8M"]);
    let image = random_bytes(29, 8 * MIB);
    let source = env.path("image.in");
    std::fs::write(&source, &image).unwrap();
    env.ok(&["vol", "write", "tank/vol0", p(&source)]);
    let (b, c) = (file(&env, "b.img", 128), file(&env, "c.img", 128));
    let online = |names: &[&str]| {
        let status = env.ok(&["status", "tank"]);
        let got = states(&status);
        let want: Vec<(String, String)> = names
            .iter()
            .map(|n| (n.to_string(), "ONLINE".to_string()))
            .collect();
        assert_eq!(got, want, "{status}");
    };

    let e = env.fails(&["attach", "tank", "a.img", "nosuch.img"]);
    assert!(
        e.contains("no such file") && e.contains("truncate -s") && !e.contains("--size"),
        "{e}"
    );
    env.ok(&["attach", "tank", "a.img", p(&b)]);
    online(&["a.img", "b.img"]);
    env.ok(&["replace", "tank", "b.img", p(&c)]);
    online(&["a.img", "c.img"]);
    let cache = std::fs::read_to_string(env.path("pools.cache")).unwrap();
    assert!(
        cache.contains("c.img") && !cache.contains("b.img"),
        "{cache}"
    );

    // A cache file behind the pool (as a server killed after an attach leaves it): the
    // labels name c.img, and the command finds it there and records it.
    let stale = cache.replace(&format!("\t{}", c.display()), "");
    assert!(!stale.contains("c.img"), "{stale}");
    std::fs::write(env.path("pools.cache"), &stale).unwrap();
    online(&["a.img", "c.img"]);
    let cache = std::fs::read_to_string(env.path("pools.cache")).unwrap();
    assert!(cache.contains("c.img"), "{cache}");

    // The device itself is not a swapped one: refused, nothing changed.
    let err = env.fails(&["replace", "tank", "c.img"]);
    assert!(err.contains("still has pool 'tank''s label"), "{err}");
    online(&["a.img", "c.img"]);

    // Swapped for a blank file at the same path: UNAVAIL, then replaced by its file name.
    std::fs::remove_file(&c).unwrap();
    file(&env, "c.img", 128);
    let status = env.ok(&["status", "tank"]);
    assert!(
        states(&status).contains(&("c.img".to_string(), "UNAVAIL".to_string())),
        "{status}"
    );
    env.ok(&["replace", "tank", "c.img"]);
    online(&["a.img", "c.img"]);
    assert!(vol_read(&env, "back.out") == image, "bytes differ");

    // Both sides hold every block: the pool reads right from c.img alone.
    env.ok(&["offline", "tank", "a.img"]);
    assert!(
        vol_read(&env, "from-c.out") == image,
        "bytes differ from c.img"
    );
    env.ok(&["online", "-w", "tank", "a.img"]);
    // Exits non-zero on any bad checksum, leak or wrong space figure.
    env.ok(&["audit", "tank"]);
}

/// A device file truncated while the pool was exported is not taken at import (its end, the
/// end labels and the last blocks, is gone): UNAVAIL with why, the mirror runs from its
/// other side with every byte right, and `replace` brings a new device in.
#[test]
fn a_truncated_device_is_unavail_with_why() {
    let env = Env::new();
    let (a, b) = (env.path("a.img"), env.path("b.img"));
    env.ok(&["create", "tank", "mirror", p(&a), p(&b), "--size", "64M"]);
    env.ok(&["vol", "create", "tank/vol0", "--size", "8M"]);
    let image = random_bytes(31, 8 * MIB);
    let source = env.path("image.in");
    std::fs::write(&source, &image).unwrap();
    env.ok(&["vol", "write", "tank/vol0", p(&source)]);
    let f = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
    f.set_len(63 << 20).unwrap();
    drop(f);
    let status = env.ok(&["status", "tank"]);
    let line = status
        .lines()
        .find(|l| l.starts_with('\t') && l.contains("b.img"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        line.contains("UNAVAIL") && line.contains("smaller than") && line.contains("truncated"),
        "{status}"
    );
    assert!(status.contains(" state: DEGRADED"), "{status}");
    assert!(vol_read(&env, "back.out") == image, "bytes differ");
    let c = file(&env, "c.img", 64);
    env.ok(&["replace", "tank", "b.img", p(&c)]);
    let status = env.ok(&["status", "tank"]);
    assert_eq!(
        states(&status),
        [
            ("a.img".to_string(), "ONLINE".to_string()),
            ("c.img".to_string(), "ONLINE".to_string())
        ],
        "{status}"
    );
    env.ok(&["audit", "tank"]);
}

/// On a served pool, a device overwritten in place (a new user zeroed a raidz member with dd)
/// is the same file the server holds open: `replace POOL DEV` at its path cannot lock it,
/// and says why and what to do, where it said "in use by another oxpool process (is
/// `oxpool serve` running?)" of the server running the command. Done as it says, it works.
#[test]
fn a_device_overwritten_in_place_is_replaced_by_a_new_file_at_its_path() {
    let env = Env::new();
    let (_, c) = env.mirror_tank("a.img", "c.img", "128M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "8M"]);
    let image = random_bytes(31, 8 * MIB);
    let source = env.path("image.in");
    std::fs::write(&source, &image).unwrap();
    env.ok(&["vol", "write", "tank/vol0", p(&source)]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    std::fs::write(&c, vec![0u8; 128 << 20]).unwrap();
    let err = env.fails(&["replace", "tank", "c.img"]);
    assert!(
        err.contains("overwritten in place") && err.contains("move the old one away"),
        "{err}"
    );
    std::fs::rename(&c, env.path("c.old")).unwrap();
    file(&env, "c.img", 128);
    env.ok(&["replace", "-w", "tank", "c.img"]);
    assert!(vol_read(&env, "back.out") == image, "bytes differ");
    env.ok(&["audit", "tank"]);
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// A served pool that opened without a device (not found at import) whose device then
/// comes back at its path: `status` says it is back and what opens it. It said the path
/// "holds another device of this pool", naming the device's own guid (a new user's
/// finding); the export and import it says then take it back.
#[test]
fn a_device_back_at_its_path_after_the_import_is_said_to_be_back() {
    let env = Env::new();
    let (_, b) = env.mirror_tank("a.img", "b.img", "64M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "8M"]);
    std::fs::rename(&b, env.path("b.away")).unwrap();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains("not found at import"), "{status}");
    std::fs::rename(env.path("b.away"), &b).unwrap();
    let status = env.ok(&["status", "tank"]);
    let line = status
        .lines()
        .find(|l| l.trim_start().starts_with(p(&b)))
        .unwrap_or_else(|| panic!("no b.img in:\n{status}"));
    assert!(
        line.contains("UNAVAIL") && line.contains("back at its path since the import"),
        "{status}"
    );
    env.ok(&["export", "tank"]);
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    env.ok(&["import", "-d", p(&env.path("")), "tank"]);
    let status = env.ok(&["status", "tank"]);
    assert!(!status.contains("UNAVAIL"), "{status}");
}
