//! raidz through the `oxpool` command and a real NBD client: `oxpool create tank raidz2 ...`
//! and `oxpool add tank raidz1 ...`, data copied in and out with nbdcopy, then a device's data
//! zeroed and another device file removed: the data still comes back exactly, a scrub
//! repairs the zeroed device, status shows the pool degraded by the missing one. And one more
//! failing device than the parity: the blocks it touches give EIO, never wrong bytes, and
//! `oxpool status -v` names the damaged ranges.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{random_bytes, tool, Env};
use std::io::{Seek, SeekFrom, Write};

const MIB: usize = 1 << 20;

fn p(path: &std::path::Path) -> &str {
    path.to_str().unwrap()
}

/// Copies `image` into the volume at `uri` and reads it back out with nbdcopy; asserts they
/// are the same bytes.
fn copy_in_and_out(env: &Env, uri: &str, image: &[u8], name: &str) {
    let source = env.path(&format!("{name}.in"));
    std::fs::write(&source, image).unwrap();
    tool(
        "nbdcopy",
        &["--connections=4", "--requests=16", p(&source), uri],
    );
    copy_out_equals(env, uri, image, name);
}

fn copy_out_equals(env: &Env, uri: &str, image: &[u8], name: &str) {
    let back = env.path(&format!("{name}.out"));
    tool("nbdcopy", &["--connections=4", uri, p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == image,
        "{name}: bytes differ after nbdcopy"
    );
}

#[test]
fn raidz2_pool_serves_nbd_and_survives_damaged_and_missing_devices() {
    let env = Env::new();
    let devs: Vec<String> = (0..9)
        .map(|i| p(&env.path(&format!("d{i}.img"))).to_string())
        .collect();
    // Too few devices: one line, nothing created.
    let err = env.fails(&[
        "create", "tank", "raidz2", &devs[0], &devs[1], &devs[2], &devs[3], "--size", "128M",
        "--sparse",
    ]);
    assert!(
        err.contains("raidz2 needs at least 5 devices, got 4"),
        "{err}"
    );
    assert!(!env.path("d0.img").exists(), "a refused create left a file");

    let mut create = vec!["create", "tank", "raidz2"];
    create.extend(devs[..6].iter().map(String::as_str));
    create.extend(["--size", "128M", "--sparse"]);
    env.ok(&create);
    let mut add = vec!["add", "tank", "raidz1"];
    add.extend(devs[6..9].iter().map(String::as_str));
    add.extend(["--size", "128M", "--sparse"]);
    env.ok(&add);
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains("raidz2-0") && status.contains("raidz1-1") && status.contains("d8.img"),
        "{status}"
    );
    env.ok(&["vol", "create", "tank/vol0", "--size", "48M"]);

    // In and out through NBD, with several connections (flushes at the end of nbdcopy).
    let image = random_bytes(18, 48 * MIB);
    {
        let server = env.serve(&["--listen", "127.0.0.1:0", "--reactors", "2"]);
        let uri = server.uri("tank/vol0");
        copy_in_and_out(&env, &uri, &image, "first");
        // Unaligned writes through qemu-io (not multiples of the block or the width).
        tool(
            "qemu-io",
            &[
                "-f",
                "raw",
                &uri,
                "-c",
                "write -P 0x3c 1000001 77777",
                "-c",
                "flush",
            ],
        );
        let (status, output) = server.stop();
        assert!(status.success(), "{output}");
    }
    let mut image = image;
    image[1_000_001..1_000_001 + 77_777].fill(0x3c);

    // Device 1's data zeroed (its labels kept), device 4 gone: two failures, raidz2's parity.
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&devs[1])
            .unwrap();
        let size = f.metadata().unwrap().len();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        let zeros = vec![0u8; MIB];
        for _ in 0..(size / (1 << 20) - 2) {
            f.write_all(&zeros).unwrap();
        }
    }
    std::fs::remove_file(&devs[4]).unwrap();
    let status = env.ok(&["status", "tank"]);
    assert!(status.contains(" state: DEGRADED"), "{status}");
    assert!(
        status.contains("status: raidz2-0: 1 of its devices out of service (")
            && status.contains("d4.img UNAVAIL); it runs from its redundancy and can lose 1 more"),
        "{status}"
    );
    {
        let server = env.serve(&["--listen", "127.0.0.1:0"]);
        let uri = server.uri("tank/vol0");
        copy_out_equals(&env, &uri, &image, "degraded");
        let (status, output) = server.stop();
        assert!(status.success(), "{output}");
    }
    let scrub = env.ok(&["scrub", "-w", "tank"]);
    let counts = scrub
        .lines()
        .find(|l| l.starts_with("scrub of tank:"))
        .unwrap_or_else(|| panic!("{scrub}"));
    let number = |before: &str| -> u64 {
        let at = counts.find(before).unwrap_or_else(|| panic!("{counts}"));
        let head = counts[..at].trim_end();
        head.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (bad, repaired, lost) = (number(" bad"), number(" repaired"), number(" blocks lost"));
    assert!(bad > 0 && bad == repaired && lost == 0, "{scrub}");
    assert!(scrub.contains("DEGRADED"), "{scrub}");
    // Its line in the config table (the `status:` lines may name it too).
    let d1 = scrub
        .lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|name| name.ends_with("d1.img"))
        })
        .unwrap_or_else(|| panic!("{scrub}"));
    // NAME STATE READ WRITE CKSUM: the zeroed device's columns failed their checksums.
    let cksum: u64 = d1.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(cksum > 0, "{scrub}");
    // The scrub rewrote device 1: with device 4 still gone and device 2's data zeroed too,
    // the data comes back only if device 1 holds its columns again.
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&devs[2])
            .unwrap();
        let size = f.metadata().unwrap().len();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        let zeros = vec![0u8; MIB];
        for _ in 0..(size / (1 << 20) - 2) {
            f.write_all(&zeros).unwrap();
        }
    }
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    copy_out_equals(&env, &uri, &image, "repaired");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// The damaged ranges `oxpool status -v` lists for `dataset`: (first byte, last byte).
fn damaged_ranges(status: &str, dataset: &str) -> Vec<(u64, u64)> {
    let prefix = format!("{dataset}: bytes ");
    status
        .lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .map(|rest| {
            let range = rest.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

#[test]
fn beyond_parity_blocks_give_eio_never_wrong_bytes_and_status_v_names_them() {
    let env = Env::new();
    let devs: Vec<String> = (0..6)
        .map(|i| p(&env.path(&format!("d{i}.img"))).to_string())
        .collect();
    let mut create = vec!["create", "tank", "raidz2"];
    create.extend(devs.iter().map(String::as_str));
    create.extend(["--size", "128M", "--sparse"]);
    env.ok(&create);
    env.ok(&["vol", "create", "tank/vol0", "--size", "8M"]);
    // Every read goes to the devices.
    env.ok(&["set", "data_cache_max=0", "tank"]);
    let image = random_bytes(41, 8 * MIB);
    let image_file = env.path("image.in");
    std::fs::write(&image_file, &image).unwrap();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    tool("nbdcopy", &[p(&image_file), &server.uri("tank/vol0")]);
    let (exit, output) = server.stop();
    assert!(exit.success(), "{output}");
    // Served again: the data is on the devices, not in dirty buffers.
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let status = env.ok(&["status", "-v", "tank"]);
    assert!(status.contains("errors: No known data errors"), "{status}");

    // Read errors on three devices, one more than raidz2's parity: a 16 KiB block spans all
    // six (four data columns, P and Q), so a block whose read hits three failures has no
    // good copy. At 40 % per read, many blocks do and many do not.
    for d in &devs[..3] {
        env.ok(&[
            "inject", "-d", d, "-e", "io", "-T", "read", "-f", "40", "tank",
        ]);
    }
    let out = harness::python("blocks_check.py", &[&uri, p(&image_file), "16384"]);
    let mut lines = out.lines();
    let counts = lines.next().unwrap_or_else(|| panic!("{out}"));
    let n = |key: &str| -> u64 {
        let w: Vec<&str> = counts.split_whitespace().collect();
        let i = w.iter().position(|x| *x == key).unwrap();
        w[i + 1].parse().unwrap()
    };
    let (ok, eio) = (n("ok"), n("eio"));
    assert_eq!(ok + eio, 512, "{out}");
    assert!(
        eio > 0 && ok > 0,
        "both readable and damaged blocks expected: {out}"
    );
    let failed: Vec<u64> = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(|o| o.parse().unwrap())
        .collect();
    assert_eq!(failed.len() as u64, eio);

    // Without -v a count; with -v every failed block lies in a listed range of tank/vol0,
    // and every listed range holds a block that failed.
    let status = env.ok(&["status", "tank"]);
    assert!(
        status.contains("damaged data range") && status.contains("use '-v' for a list"),
        "{status}"
    );
    let status = env.ok(&["status", "-v", "tank"]);
    assert!(
        status.contains("errors: Permanent errors have been detected in the following volumes:"),
        "{status}"
    );
    let ranges = damaged_ranges(&status, "tank/vol0");
    assert!(!ranges.is_empty(), "{status}");
    for o in &failed {
        assert!(
            ranges.iter().any(|(a, b)| a <= o && o + 16383 <= *b),
            "block at {o} not listed:\n{status}"
        );
    }
    for (a, b) in &ranges {
        assert!(
            failed.iter().any(|o| a <= o && o <= b),
            "range {a}-{b} holds no failed block:\n{status}"
        );
    }

    // The faults gone, every block reads right again (the damage was in the reads only),
    // and a scrub that finds nothing lost empties the list.
    env.ok(&["inject", "-c", "all", "tank"]);
    env.ok(&["clear", "tank"]);
    let out = harness::python("blocks_check.py", &[&uri, p(&image_file), "16384"]);
    assert!(out.starts_with("ok 512 eio 0"), "{out}");
    env.ok(&["scrub", "-w", "tank"]);
    let status = env.ok(&["status", "-v", "tank"]);
    assert!(status.contains("errors: No known data errors"), "{status}");

    // A scrub alone (no client read first) that finds blocks lost names them too: every
    // read of three devices fails, so no block of the volume has a good copy.
    for d in &devs[..3] {
        env.ok(&["inject", "-d", d, "-e", "io", "-T", "read", "tank"]);
    }
    let scrub = env.run(&["scrub", "-w", "tank"]);
    let said = String::from_utf8_lossy(&scrub.stdout).into_owned()
        + &String::from_utf8_lossy(&scrub.stderr);
    assert!(said.contains("lost"), "{said}");
    let status = env.ok(&["status", "-v", "tank"]);
    assert!(
        status.contains("errors: Permanent errors have been detected in the following volumes:"),
        "{status}"
    );
    let ranges = damaged_ranges(&status, "tank/vol0");
    let listed: u64 = ranges.iter().map(|(a, b)| b + 1 - a).sum();
    assert!(listed > 0, "{status}");
    env.ok(&["inject", "-c", "all", "tank"]);
    env.ok(&["clear", "tank"]);
    let (exit, output) = server.stop();
    assert!(exit.success(), "{output}");
}
