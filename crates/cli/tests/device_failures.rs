//! Issue 18's acceptance through the real command and real clients: a raidz2 with a hot spare,
//! served over NBD while fio writes and verifies its data. Read errors are injected on one
//! device and silent corruption on the reads of a second: every read fio checks is right, the
//! counters show both, the erring device is faulted by the fault rule, the spare steps in and
//! is resilvered; then `oxpool replace` with a new file resilvers it, the spare goes back to
//! the spares, the pool is ONLINE again and a scrub finds nothing to repair.

#[path = "nbd/fio_loop.rs"]
mod fio_loop;
#[path = "nbd/harness.rs"]
mod harness;

use fio_loop::FioLoop;
use harness::{random_bytes, tool, Env};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn p(path: &std::path::Path) -> &str {
    path.to_str().unwrap()
}

/// The `oxpool status` line of the device whose path ends with `device`, in the section
/// before `spares` (the config table) or, with `spares`, in the spares section.
fn device_line<'a>(status: &'a str, device: &str, spares: bool) -> &'a str {
    let (table, spare_part) = status.split_once("\n\tspares").unwrap_or((status, ""));
    let part = if spares { spare_part } else { table };
    part.lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.ends_with(device))
        })
        .unwrap_or_else(|| panic!("no line for {device} in:\n{status}"))
}

/// A device line's STATE and READ, WRITE, CKSUM counts.
fn state_and_counts(line: &str) -> (String, u64, u64, u64) {
    let w: Vec<&str> = line.split_whitespace().collect();
    let n = |i: usize| w[i].parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    (w[1].to_string(), n(2), n(3), n(4))
}

/// Polls `oxpool status` until `done` holds for it (bounded by `limit`); returns it.
fn status_until(env: &Env, what: &str, limit: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + limit;
    // Bounded by the deadline.
    loop {
        let status = env.ok(&["status", "tank"]);
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}:\n{status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the fio loop over `[offset, offset + size)` until `during` returns, then asserts
/// every run verified.
fn under_fio<T>(uri: &str, offset: u64, size: u64, during: impl FnOnce() -> T) -> T {
    let fio = FioLoop::start(uri, offset, size);
    let value = during();
    let runs = fio.finish();
    assert!(!runs.is_empty());
    for run in &runs {
        assert!(run.ok, "fio saw an error:\n{}", run.output);
    }
    value
}

#[test]
fn raidz2_under_fio_verify_faults_a_device_a_spare_steps_in_and_replace_restores_it() {
    let env = Env::new();
    let devs: Vec<String> = (0..6)
        .map(|i| p(&env.path(&format!("d{i}.img"))).to_string())
        .collect();
    let spare = p(&env.path("spare.img")).to_string();
    let mut create = vec!["create", "tank", "raidz2"];
    create.extend(devs.iter().map(String::as_str));
    create.extend(["--size", "128M", "--sparse"]);
    env.ok(&create);
    env.ok(&["add", "tank", "spare", &spare, "--size", "128M", "--sparse"]);
    env.ok(&["vol", "create", "tank/vol0", "--size", "64M"]);
    // Every read goes to the devices; syncs come often, so that fio's data reaches them.
    env.ok(&["set", "data_cache_max=0", "tank"]);
    env.ok(&["set", "txg_timeout=1", "tank"]);
    let status = env.ok(&["status", "tank"]);
    assert_eq!(
        device_line(&status, "spare.img", true)
            .split_whitespace()
            .nth(1),
        Some("AVAIL"),
        "{status}"
    );

    // The lower half holds data written before the faults, checked at the end; fio loops
    // over the upper half throughout.
    let image = random_bytes(77, (32 * MIB) as usize);
    let image_file = env.path("image.in");
    std::fs::write(&image_file, &image).unwrap();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    tool("nbdcopy", &[p(&image_file), &uri]);

    let (d1, d2) = ("d1.img", "d2.img");
    let status = under_fio(&uri, 32 * MIB, 32 * MIB, || {
        // Read errors on d1 (every read), silent corruption of half of d2's reads.
        env.ok(&["inject", "-d", d1, "-e", "io", "-T", "read", "tank"]);
        env.ok(&[
            "inject", "-d", d2, "-e", "corrupt", "-T", "read", "-f", "50", "tank",
        ]);
        // The old data, read whole while the faults act, comes back exactly.
        let back = env.path("image.out");
        tool("nbdcopy", &["--connections=2", &uri, p(&back)]);
        let read = std::fs::read(&back).unwrap();
        assert!(
            read[..image.len()] == image[..],
            "the data written before the faults differs"
        );
        // d1 faulted by the rule, the spare in its place, resilvered.
        status_until(
            &env,
            "the spare's resilver",
            Duration::from_secs(120),
            |s| s.contains("resilvered") && !s.contains("resilver in progress"),
        )
    });
    let (state, read_errors, _, _) = state_and_counts(device_line(&status, d1, false));
    assert_eq!(state, "FAULTED", "{status}");
    assert!(read_errors >= 10, "{status}");
    assert!(status.contains("too many I/O errors"), "{status}");
    let (_, _, _, cksum) = state_and_counts(device_line(&status, d2, false));
    assert!(cksum > 0, "{status}");
    let spare_line = device_line(&status, "spare.img", true);
    assert!(spare_line.contains("INUSE"), "{status}");
    assert!(status.contains(" state: DEGRADED"), "{status}");

    // A new file replaces d1: resilvered, the spare back among the spares, the pool ONLINE
    // once d2's errors are cleared, and a scrub finds nothing.
    env.ok(&["inject", "-c", "all", "tank"]);
    let new = p(&env.path("new1.img")).to_string();
    std::fs::File::create(&new)
        .unwrap()
        .set_len(128 * MIB)
        .unwrap();
    under_fio(&uri, 32 * MIB, 32 * MIB, || {
        env.ok(&["replace", "-w", "tank", d1, &new]);
    });
    env.ok(&["clear", "tank"]);
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: ONLINE"), "{status}");
    assert_eq!(
        state_and_counts(device_line(&status, "new1.img", false)).0,
        "ONLINE"
    );
    assert!(!status.contains("/d1.img"), "{status}");
    assert!(
        device_line(&status, "spare.img", true).contains("AVAIL"),
        "{status}"
    );
    let scrub = env.ok(&["scrub", "-w", "tank"]);
    assert!(
        scrub.contains(" 0 bad, 0 repaired, 0 blocks lost"),
        "{scrub}"
    );

    // The old data is still exactly there, from the devices as they are now.
    let back = env.path("image.end");
    tool("nbdcopy", &[&uri, p(&back)]);
    assert!(std::fs::read(&back).unwrap()[..image.len()] == image[..]);
    let (exit, output) = server.stop();
    assert!(exit.success(), "{output}");
}
