//! `oxpool serve` with the real NBD clients, unmodified: nbdinfo, qemu-img, qemu-io, nbdcopy
//! and fio's nbd engine, over TCP and a unix socket.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{random_bytes, tool, Env};

const MIB: usize = 1 << 20;

/// `nbdinfo --map` as (offset, length, is_data) extents.
fn map(uri: &str) -> Vec<(u64, u64, bool)> {
    tool("nbdinfo", &["--map", uri])
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 4, "unexpected --map line: {line}");
            let offset = fields[0].parse().unwrap();
            let length = fields[1].parse().unwrap();
            let kind: u32 = fields[2].parse().unwrap();
            (offset, length, kind == 0)
        })
        .collect()
}

/// The data ranges of a map, merged.
fn data_ranges(map: &[(u64, u64, bool)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(offset, length, data) in map {
        if !data {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.0 + last.1 == offset => last.1 += length,
            _ => out.push((offset, length)),
        }
    }
    out
}

#[test]
fn nbdinfo_lists_every_export_with_its_size() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[]), ("small", "16M", &["volblocksize=4K"])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--read-only", "tank/small"]);
    let list = tool("nbdinfo", &["--list", &server.uri("tank/vol0")]);
    assert!(list.contains("export=\"tank/vol0\""), "{list}");
    assert!(list.contains("export=\"tank/small\""), "{list}");
    assert!(list.contains("export-size: 67108864"), "{list}");
    assert!(list.contains("export-size: 16777216"), "{list}");
    let small = tool("nbdinfo", &[&server.uri("tank/small")]);
    assert!(small.contains("is_read_only: true"), "{small}");
    assert!(small.contains("block_size_preferred: 4096"), "{small}");
    let vol0 = tool("nbdinfo", &[&server.uri("tank/vol0")]);
    for flag in [
        "can_multi_conn: true",
        "can_fua: true",
        "can_flush: true",
        "can_trim: true",
        "can_zero: true",
        "can_fast_zero: true",
        "can_cache: true",
        "is_read_only: false",
    ] {
        assert!(vol0.contains(flag), "{flag} missing:\n{vol0}");
    }
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn nbdinfo_map_shows_what_was_written_and_trimmed() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    assert_eq!(
        map(&uri),
        vec![(0, 64 << 20, false)],
        "a fresh volume is one hole"
    );
    // Data at [1M, 3M) and [8M, 12M); then trim [9M, 10M) and zero [11M, 12M).
    tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x5a 1M 2M",
            "-c",
            "write -P 0xa5 8M 4M",
            "-c",
            "discard 9M 1M",
            "-c",
            "write -z 11M 1M",
            "-c",
            "flush",
        ],
    );
    let m = map(&uri);
    assert_eq!(
        m.iter().map(|e| e.1).sum::<u64>(),
        64 << 20,
        "map covers the volume: {m:?}"
    );
    assert_eq!(
        data_ranges(&m),
        vec![(1 << 20, 2 << 20), (8 << 20, 1 << 20), (10 << 20, 1 << 20)],
        "{m:?}"
    );
    // The trimmed and zeroed ranges read as zeros; the rest as written.
    let out = tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "read -P 0x5a 1M 2M",
            "-c",
            "read -P 0xa5 8M 1M",
            "-c",
            "read -P 0 9M 1M",
            "-c",
            "read -P 0xa5 10M 1M",
            "-c",
            "read -P 0 11M 1M",
        ],
    );
    assert!(!out.contains("verification failed"), "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn qemu_img_convert_in_and_out_is_identical() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let source = env.path("source.raw");
    let image = random_bytes(42, 64 * MIB);
    std::fs::write(&source, &image).unwrap();
    tool(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            source.to_str().unwrap(),
            &uri,
        ],
    );
    let back = env.path("back.raw");
    tool(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            back.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after the round trip"
    );
    let info = tool("qemu-img", &["info", "-f", "raw", &uri]);
    assert!(info.contains("67108864"), "{info}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn qemu_io_patterns_at_unaligned_offsets_verify() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &["volblocksize=4K"])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    // Overlapping writes at odd offsets and lengths, spanning block edges, then reads that
    // check each byte range against the pattern that must be there.
    let out = tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x11 12345 67890",
            "-c",
            "write -P 0x22 50001 3",
            "-c",
            "write -P 0x33 1048575 1048579",
            "-c",
            "aio_write -P 0x44 7000001 4097",
            "-c",
            "aio_flush",
            "-c",
            "read -P 0 0 12345",
            "-c",
            "read -P 0x11 12345 37656",
            "-c",
            "read -P 0x22 50001 3",
            "-c",
            "read -P 0x11 50004 30231",
            "-c",
            "read -P 0 80235 968340",
            "-c",
            "read -P 0x33 1048575 1048579",
            "-c",
            "read -P 0 2097154 4902847",
            "-c",
            "read -P 0x44 7000001 4097",
            "-c",
            "read -P 0 7004098 100",
        ],
    );
    assert!(!out.contains("verification failed"), "{out}");
    assert_eq!(out.matches("read ").count(), 9, "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn nbdcopy_with_several_connections_is_identical() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--reactors", "2"]);
    let uri = server.uri("tank/vol0");
    let source = env.path("source.raw");
    let image = random_bytes(7, 64 * MIB);
    std::fs::write(&source, &image).unwrap();
    tool(
        "nbdcopy",
        &[
            "--connections=4",
            "--requests=16",
            source.to_str().unwrap(),
            &uri,
        ],
    );
    let back = env.path("back.raw");
    tool(
        "nbdcopy",
        &["--connections=4", &uri, back.to_str().unwrap()],
    );
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after nbdcopy"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");

    // Served again with the data cache off: every block comes from the device, runs of
    // blocks as one read each, and goes out to the client as it was read (not copied into
    // the reply first); the bytes are the same.
    env.ok(&["set", "data_cache_max=0", "tank"]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--reactors", "2"]);
    let uri = server.uri("tank/vol0");
    let back = env.path("back-uncached.raw");
    tool(
        "nbdcopy",
        &["--connections=4", &uri, back.to_str().unwrap()],
    );
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after nbdcopy from the device"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// nbdcopy of a sparse image onto a volume full of data: it zeroes each hole in one
/// WRITE_ZEROES of the hole's length, here 112 MiB, past the 32 MiB maximum block size that
/// bounds payloads (a new user's copy failed with "Invalid argument" when the server bounded
/// zeroes by it too). The volume ends as the image, holes read as zeros.
#[test]
fn nbdcopy_of_a_sparse_image_zeroes_holes_larger_than_a_block() {
    let env = Env::new();
    env.tank(&[("vol0", "128M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let full = env.path("full.raw");
    std::fs::write(&full, random_bytes(3, 128 * MIB)).unwrap();
    tool("nbdcopy", &[full.to_str().unwrap(), &uri]);
    // 8 MiB of data, a 112 MiB hole, 8 MiB of data.
    let sparse = env.path("sparse.raw");
    let mut image = vec![0u8; 128 * MIB];
    image[..8 * MIB].copy_from_slice(&random_bytes(4, 8 * MIB));
    image[120 * MIB..].copy_from_slice(&random_bytes(5, 8 * MIB));
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(&sparse).unwrap();
        f.write_all(&image[..8 * MIB]).unwrap();
        f.seek(SeekFrom::Start((120 * MIB) as u64)).unwrap();
        f.write_all(&image[120 * MIB..]).unwrap();
    }
    tool("nbdcopy", &[sparse.to_str().unwrap(), &uri]);
    let back = env.path("back.raw");
    tool("nbdcopy", &[&uri, back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after nbdcopy of the sparse image"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn fio_random_read_write_with_crc32c_verify() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &["volblocksize=4K"])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    let out = tool(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=32",
            "--size=64M",
            "--io_size=32M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--randseed=1234",
            "--verify_state_save=0",
        ],
    );
    assert!(out.contains("err= 0"), "{out}");
    // A second job with writes in larger, unaligned-to-volblocksize sizes and FUA-free
    // flushes, also verified.
    let out = tool(
        "fio",
        &[
            "--name=verify-big",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=6k",
            "--iodepth=32",
            "--size=64M",
            "--io_size=16M",
            "--fsync=64",
            "--verify_state_save=0",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ],
    );
    assert!(out.contains("err= 0"), "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn unix_socket_serves_and_is_removed_on_exit() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let socket = env.path("nbd.sock");
    let server = env.serve(&["--socket", socket.to_str().unwrap()]);
    let uri = server.uri("tank/vol0");
    assert!(uri.starts_with("nbd+unix:///tank/vol0?socket="), "{uri}");
    assert!(
        server.uris.iter().all(|u| !u.starts_with("nbd://")),
        "TCP too: {:?}",
        server.uris
    );
    let info = tool("qemu-img", &["info", "-f", "raw", &uri]);
    assert!(info.contains("67108864"), "{info}");
    tool("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x77 0 1M"]);
    let out = tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x77 0 1M"]);
    assert!(!out.contains("verification failed"), "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    assert!(!socket.exists(), "socket file left behind");
}

/// Issue 5: the data path gives the same bytes under every completion policy. fio writes with
/// crc32c verify headers; the server is restarted (export commits everything, so the verify
/// pass reads from the device: checksum verification, batching waits and completion threads
/// all run), then fio verifies every block at iodepth 32 and at iodepth 1.
#[test]
fn fio_verify_under_each_completion_policy() {
    for policy in ["inline", "worker", "batched", "auto"] {
        let env = Env::new();
        env.tank(&[("vol0", "64M", &[])]);
        env.ok(&["set", &format!("completion={policy}"), "tank"]);
        let fio = |uri: &str, extra: &[&str]| {
            let mut args = vec![
                "--name=policy".to_string(),
                "--ioengine=nbd".to_string(),
                format!("--uri={uri}"),
                "--rw=randwrite".to_string(),
                "--bs=4k".to_string(),
                "--size=64M".to_string(),
                "--io_size=16M".to_string(),
                "--randseed=5".to_string(),
                "--verify=crc32c".to_string(),
                "--verify_fatal=1".to_string(),
                "--verify_state_save=0".to_string(),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            tool("fio", &refs)
        };
        let server = env.serve(&["--listen", "127.0.0.1:0"]);
        let out = fio(&server.uri("tank/vol0"), &["--iodepth=32", "--do_verify=0"]);
        assert!(out.contains("err= 0"), "{policy}: {out}");
        let (status, output) = server.stop();
        assert!(status.success(), "{policy}: {output}");
        let got = env.ok(&["get", "completion", "tank"]);
        assert!(
            got.lines().any(|l| l.split_whitespace().eq([
                "tank",
                "completion",
                policy,
                if policy == "auto" { "default" } else { "local" }
            ])),
            "the property persists: {got}"
        );
        let server = env.serve(&["--listen", "127.0.0.1:0"]);
        for depth in ["--iodepth=32", "--iodepth=1"] {
            let out = fio(&server.uri("tank/vol0"), &[depth, "--verify_only"]);
            assert!(out.contains("err= 0"), "{policy} {depth}: {out}");
            // The verify pass really read the 16 MiB back.
            assert!(
                out.contains("io=16.0MiB"),
                "{policy} {depth}: no read of the written data: {out}"
            );
        }
        let (status, output) = server.stop();
        assert!(status.success(), "{policy}: {output}");
    }
}
