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
