//! `oxpool inject`, `offline`, `online` and `clear` through the real command on a mirror
//! that `oxpool serve` serves, read by a real NBD client (nbdcopy): injected read errors,
//! corruption and latency on one device leave every byte right, the device's state and
//! counts show in `oxpool status`; rules set on an exported pool act when it is served
//! again; offline beyond the redundancy is refused with one line and nothing changed; an
//! offline taken on an exported pool is still there when it is served.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{random_bytes, tool, Env};

const MIB: usize = 1 << 20;

fn p(path: &std::path::Path) -> &str {
    path.to_str().unwrap()
}

/// Pool `tank`, a mirror of a.img and b.img of `size` each (sparse); returns their paths.
fn mirror_pool(env: &Env, size: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    env.mirror_tank("a.img", "b.img", size)
}

/// Reads the whole volume at `uri` with nbdcopy and asserts it is `image`.
fn read_equals(env: &Env, uri: &str, image: &[u8], name: &str) {
    let back = env.path(&format!("{name}.out"));
    tool("nbdcopy", &["--connections=2", uri, p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == image,
        "{name}: bytes differ"
    );
}

/// The `oxpool status` line of the device whose path ends with `device`.
fn device_line<'a>(status: &'a str, device: &str) -> &'a str {
    status
        .lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.ends_with(device))
        })
        .unwrap_or_else(|| panic!("no line for {device} in:\n{status}"))
}

/// The STATE and READ, WRITE, CKSUM counts of a device's status line.
fn state_and_counts(line: &str) -> (String, u64, u64, u64) {
    let w: Vec<&str> = line.split_whitespace().collect();
    let n = |i: usize| w[i].parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    (w[1].to_string(), n(2), n(3), n(4))
}

/// The HITS column of rule `id` in `oxpool inject`'s listing.
fn hits(listing: &str, id: u64) -> String {
    listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("no rule {id} in:\n{listing}"))
        .split_whitespace()
        .last()
        .unwrap()
        .to_string()
}

#[test]
fn faults_injected_on_a_served_mirror_keep_every_byte_right_and_show_in_status() {
    let env = Env::new();
    let (a, _b) = mirror_pool(&env, "256M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "32M"]);
    // Every read goes to the devices, not to the cache of verified blocks.
    env.ok(&["set", "data_cache_max=0", "tank"]);
    let image = random_bytes(19, 32 * MIB);

    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let source = env.path("image.in");
    std::fs::write(&source, &image).unwrap();
    tool("nbdcopy", &[p(&source), &uri]);

    // Read errors on b: every byte right, b faulted after ten, the pool degraded.
    let added = env.ok(&["inject", "-d", "b.img", "-e", "io", "-T", "read", "tank"]);
    assert!(
        added.starts_with("injection rule 1: io on read of ") && added.contains("b.img"),
        "{added}"
    );
    read_equals(&env, &uri, &image, "read-errors");
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: DEGRADED"), "{status}");
    let (state, read, _, _) = state_and_counts(device_line(&status, "b.img"));
    assert_eq!(state, "FAULTED", "{status}");
    assert!(read >= 10, "{status}");
    assert!(status.contains("too many I/O errors"), "{status}");
    assert!(
        status.contains("mirror-0: 1 of its devices out of service"),
        "{status}"
    );
    assert_eq!(state_and_counts(device_line(&status, "a.img")).0, "ONLINE");
    let listing = env.ok(&["inject"]);
    assert!(
        listing.contains("tank") && listing.contains("io"),
        "{listing}"
    );
    assert!(hits(&listing, 1).parse::<u64>().unwrap() >= 10, "{listing}");
    // Faulted: out of service, its count stays.
    read_equals(&env, &uri, &image, "faulted");
    let again = env.ok(&["status", "tank"]);
    assert_eq!(state_and_counts(device_line(&again, "b.img")).1, read);

    // Cleared: no rule, b back in service with its counts zeroed; whatever txg was written
    // while it was out, it lacks until a scrub, and then the pool is ONLINE.
    assert!(env
        .ok(&["inject", "-c", "all"])
        .contains("removed 1 injection rule"));
    env.ok(&["clear", "tank", "b.img"]);
    let status = env.ok(&["status", "tank"]);
    assert_eq!(
        state_and_counts(device_line(&status, "b.img")),
        ("ONLINE".to_string(), 0, 0, 0),
        "{status}"
    );
    env.ok(&["scrub", "-w", "tank"]);
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: ONLINE"), "{status}");

    // Corruption of what a reads: caught by the checksums, a degraded (still used).
    env.ok(&["inject", "-d", "a.img", "-e", "corrupt", "tank"]);
    read_equals(&env, &uri, &image, "corrupt");
    let status = env.ok(&["status", "tank"]);
    let (state, _, _, cksum) = state_and_counts(device_line(&status, "a.img"));
    assert!(cksum >= 10, "{status}");
    assert_eq!(state, "DEGRADED", "{status}");
    assert!(status.contains("too many checksum errors"), "{status}");
    env.ok(&["inject", "-c", "all", "tank"]);
    env.ok(&["clear", "tank"]);

    // Latency on both: still right, the rules hit.
    let rule = env.ok(&["inject", "-d", p(&a), "-D", "3", "tank"]);
    assert!(rule.contains("delay 3ms on all"), "{rule}");
    env.ok(&["inject", "-d", "b.img", "-D", "3", "-f", "50", "tank"]);
    read_equals(&env, &uri, &image, "delay");
    let listing = env.ok(&["inject", "tank"]);
    assert!(listing.contains("50%"), "{listing}");
    let ids: Vec<u64> = listing
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{listing}");
    for id in &ids {
        assert!(hits(&listing, *id).parse::<u64>().unwrap() > 0, "{listing}");
    }
    env.ok(&["inject", "-c", &ids[0].to_string()]);
    env.ok(&["inject", "-c", &ids[1].to_string(), "tank"]);
    let err = env.fails(&["inject", "-c", "999"]);
    assert!(err.contains("no injection rule 999"), "{err}");
    assert_eq!(env.ok(&["inject"]).lines().count(), 1, "only the header");

    // Offline: a, then b is refused with one line and nothing changes.
    env.ok(&["offline", "-t", "tank", "a.img"]);
    let before = env.ok(&["status", "tank"]);
    assert_eq!(state_and_counts(device_line(&before, "a.img")).0, "OFFLINE");
    let err = env.fails(&["offline", "tank", "b.img"]);
    assert!(
        err.contains("cannot take") && err.contains("b.img offline: mirror-0 can lose 1"),
        "{err}"
    );
    let after = env.ok(&["status", "tank"]);
    assert_eq!(
        state_and_counts(device_line(&after, "b.img")).0,
        "ONLINE",
        "{after}"
    );
    assert_eq!(device_line(&before, "b.img"), device_line(&after, "b.img"));
    read_equals(&env, &uri, &image, "offline");
    env.ok(&["online", "-w", "tank", "a.img"]);
    // Whatever a missed meanwhile, a scrub repairs (else it would not count as a copy, and
    // b could not be faulted below).
    env.ok(&["scrub", "-w", "tank"]);
    assert!(env.ok(&["status", "tank"]).contains(" state: ONLINE"));
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");

    // On the exported pool: a rule, kept in the file, acting when the pool is served.
    let saved = env.ok(&["inject", "-d", "b.img", "-e", "io", "-T", "read", "tank"]);
    assert!(saved.contains("next opened"), "{saved}");
    let listing = env.ok(&["inject"]);
    assert!(
        listing.contains("b.img") && hits(&listing, 5) == "-",
        "{listing}"
    );
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    read_equals(&env, &uri, &image, "rule-from-file");
    let status = env.ok(&["status", "tank"]);
    assert_eq!(
        state_and_counts(device_line(&status, "b.img")).0,
        "FAULTED",
        "the saved rule acted: {status}"
    );
    assert!(
        hits(&env.ok(&["inject", "tank"]), 5)
            .parse::<u64>()
            .unwrap()
            >= 10
    );
    env.ok(&["inject", "-c", "all"]);
    env.ok(&["clear", "tank"]);
    env.ok(&["scrub", "-w", "tank"]);
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: ONLINE"), "{status}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");

    // An offline taken on the exported pool is recorded in it (-t is refused: it would end
    // with the command) and holds when the pool is served; `online` and a scrub end it.
    let err = env.fails(&["offline", "-t", "tank", "a.img"]);
    assert!(err.contains("-t"), "{err}");
    env.ok(&["offline", "tank", "a.img"]);
    let status = env.ok(&["status", "tank"]);
    assert_eq!(state_and_counts(device_line(&status, "a.img")).0, "OFFLINE");
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let status = env.ok(&["status", "tank"]);
    assert_eq!(state_and_counts(device_line(&status, "a.img")).0, "OFFLINE");
    assert!(
        status.contains("taken offline by the administrator"),
        "{status}"
    );
    read_equals(&env, &server.uri("tank/vol0"), &image, "persisted-offline");
    let err = env.fails(&["offline", "tank", "b.img"]);
    assert!(err.contains("mirror-0 can lose 1"), "{err}");
    env.ok(&["online", "-w", "tank", "a.img"]);
    // What a missed while offline (the txgs of the commands that opened the pool), a
    // scrub repairs.
    env.ok(&["scrub", "-w", "tank"]);
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: ONLINE"), "{status}");
    read_equals(&env, &server.uri("tank/vol0"), &image, "online-again");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// `online` of a device that fails again at once (its resilver cannot write it) ends with
/// a warning naming its state, as `zpool online` warns, not as if it had worked.
#[test]
fn online_of_a_device_that_fails_again_says_so() {
    let env = Env::new();
    mirror_pool(&env, "128M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "8M"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    env.ok(&["offline", "tank", "b.img"]);
    let source = env.path("image.in");
    std::fs::write(&source, random_bytes(5, 8 * MIB)).unwrap();
    tool("nbdcopy", &[p(&source), &uri]);
    env.ok(&["inject", "-d", "b.img", "-e", "io", "-T", "write", "tank"]);
    let out = env.run(&["online", "-w", "tank", "b.img"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let status = env.ok(&["status", "tank"]);
    let (state, _, writes, _) = state_and_counts(device_line(&status, "b.img"));
    assert_eq!(state, "FAULTED", "the resilver's writes failed: {status}");
    assert!(writes > 0, "{status}");
    assert!(
        err.contains("warning:") && err.contains("b.img") && err.contains("FAULTED"),
        "online said nothing of the fault: {err}"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// The `oxpool status` device lines (NAME STATE READ WRITE CKSUM, and what was repaired).
fn device_lines(status: &str) -> Vec<&str> {
    status
        .lines()
        .filter(|l| l.contains(".img") || l.contains("repaired"))
        .collect()
}

/// Without a server each command opens the pool and exports it after. What one command
/// found (a read that repaired b's corrupt blocks; blocks no copy could give back) is kept
/// for the commands after it, carried into a server, zeroed by `clear` even if that server
/// is then killed, and forgotten at export.
#[test]
fn error_counts_outlive_the_command_that_found_them_until_clear_or_export() {
    let env = Env::new();
    mirror_pool(&env, "64M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "16M"]);
    // Every read goes to the devices, not to the cache of verified blocks.
    env.ok(&["set", "data_cache_max=0", "tank"]);
    let image = random_bytes(23, 16 * MIB);
    let source = env.path("image.in");
    std::fs::write(&source, &image).unwrap();
    env.ok(&["vol", "write", "tank/vol0", p(&source)]);
    let read_back = |name: &str| {
        let out = env.path(name);
        env.ok(&["vol", "read", "tank/vol0", p(&out)]);
        assert!(
            std::fs::read(&out).unwrap() == image,
            "{name}: bytes differ"
        );
    };

    // A read through a corrupt b: every byte right, b's blocks repaired and counted, and
    // the count is still there for the next command.
    env.ok(&["inject", "-d", "b.img", "-e", "corrupt", "tank"]);
    read_back("repaired.out");
    env.ok(&["inject", "-c", "all"]);
    let status = env.ok(&["status", "tank"]);
    let (state, _, _, cksum) = state_and_counts(device_line(&status, "b.img"));
    // Ten checksum errors within the fault window: DEGRADED, and still so for this command.
    assert!(state == "DEGRADED" && cksum >= 10, "{status}");
    assert!(status.contains("too many checksum errors"), "{status}");
    assert!(
        status.contains("(repaired ") && status.contains("since the import or the last clear)"),
        "{status}"
    );
    assert_eq!(
        state_and_counts(device_line(&status, "a.img")).3,
        0,
        "{status}"
    );
    // Commands that find nothing leave the counts as they are.
    read_back("clean.out");
    assert_eq!(
        device_lines(&env.ok(&["status", "tank"])),
        device_lines(&status)
    );
    // A command that runs while b is missing does not lose b's counts.
    std::fs::rename(env.path("b.img"), env.path("b.away")).unwrap();
    let without_b = env.ok(&["status", "tank"]);
    assert_eq!(
        state_and_counts(device_line(&without_b, "b.img")).0,
        "UNAVAIL"
    );
    std::fs::rename(env.path("b.away"), env.path("b.img")).unwrap();
    assert_eq!(
        device_lines(&env.ok(&["status", "tank"])),
        device_lines(&status)
    );

    // Blocks no copy gives back: `status -v` names them in the commands after.
    env.ok(&["inject", "-d", "a.img", "-e", "corrupt", "tank"]);
    env.ok(&["inject", "-d", "b.img", "-e", "corrupt", "tank"]);
    let lost = env.run(&["vol", "read", "tank/vol0", p(&env.path("lost.out"))]);
    assert!(!lost.status.success(), "a read of lost blocks succeeded");
    assert!(
        !env.path("lost.out").exists(),
        "a failed read left its output file"
    );
    env.ok(&["inject", "-c", "all"]);
    let verbose = env.ok(&["status", "-v", "tank"]);
    // The read failed on the indirect block above every data block: all of it is damaged,
    // as a scrub would name it (the read's own range was listed before).
    assert!(
        verbose.contains("Permanent errors")
            && verbose.contains("tank/vol0: bytes 0-16777215 (16M)"),
        "{verbose}"
    );
    let lost_cksum = state_and_counts(device_line(&verbose, "b.img")).3;
    assert!(lost_cksum > cksum, "{verbose}");

    // Carried into a server. Its `clear` zeroes the counts (the damage stays listed until
    // a scrub finds it gone, as in ZFS) and holds even though the server is then killed.
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let served = env.ok(&["status", "-v", "tank"]);
    assert_eq!(
        state_and_counts(device_line(&served, "b.img")).3,
        lost_cksum,
        "{served}"
    );
    assert!(served.contains("tank/vol0: bytes "), "{served}");
    env.ok(&["clear", "tank"]);
    server.kill9();
    let status = env.ok(&["status", "-v", "tank"]);
    for device in ["a.img", "b.img"] {
        assert_eq!(
            state_and_counts(device_line(&status, device)),
            ("ONLINE".to_string(), 0, 0, 0),
            "{status}"
        );
    }
    assert!(status.contains("tank/vol0: bytes "), "{status}");
    // The scrub reads every block back whole (the rules are gone): nothing is lost now.
    env.ok(&["scrub", "-w", "tank"]);
    read_back("scrubbed.out");
    let status = env.ok(&["status", "-v", "tank"]);
    assert!(status.contains("errors: No known data errors"), "{status}");

    // Exported, the machine forgets them: an import starts from zero, as ZFS's does.
    env.ok(&["inject", "-d", "b.img", "-e", "corrupt", "tank"]);
    read_back("again.out");
    env.ok(&["inject", "-c", "all"]);
    assert!(state_and_counts(device_line(&env.ok(&["status", "tank"]), "b.img")).3 > 0);
    env.ok(&["export", "tank"]);
    env.ok(&["import", "-d", p(&env.path("")), "tank"]);
    assert_eq!(
        state_and_counts(device_line(&env.ok(&["status", "tank"]), "b.img")),
        ("ONLINE".to_string(), 0, 0, 0)
    );

    // `clear` of the pool clears a device missing meanwhile too, as `zpool clear` does.
    env.ok(&["inject", "-d", "b.img", "-e", "corrupt", "tank"]);
    read_back("before-clear.out");
    env.ok(&["inject", "-c", "all"]);
    assert_eq!(
        state_and_counts(device_line(&env.ok(&["status", "tank"]), "b.img")).0,
        "DEGRADED"
    );
    std::fs::rename(env.path("b.img"), env.path("b.away")).unwrap();
    env.ok(&["clear", "tank"]);
    std::fs::rename(env.path("b.away"), env.path("b.img")).unwrap();
    assert_eq!(
        state_and_counts(device_line(&env.ok(&["status", "tank"]), "b.img")),
        ("ONLINE".to_string(), 0, 0, 0)
    );
}

/// Write errors that a command's last txg sync (the one its export makes) finds are kept
/// for the commands after it, as the errors its own work found are.
#[test]
fn write_errors_of_the_final_sync_are_kept() {
    let env = Env::new();
    mirror_pool(&env, "64M");
    env.ok(&["vol", "create", "tank/vol0", "--size", "4M"]);
    let source = env.path("image.in");
    std::fs::write(&source, random_bytes(29, 4 * MIB)).unwrap();
    env.ok(&["vol", "write", "tank/vol0", p(&source)]);
    env.ok(&["inject", "-d", "b.img", "-e", "io", "-T", "write", "tank"]);
    // A change with no sync of its own: the export's sync writes it, and b fails that.
    env.ok(&["set", "txg_timeout=7", "tank"]);
    env.ok(&["inject", "-c", "all"]);
    let status = env.ok(&["status", "tank"]);
    let (_, _, write, _) = state_and_counts(device_line(&status, "b.img"));
    assert!(write > 0, "{status}");
}
