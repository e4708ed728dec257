//! The protocol, request by request, through libnbd's python binding
//! (tests/nbd/protocol.py): structured replies with data and hole chunks, block status,
//! FUA, trim, write-zeroes, cache, flush, many requests in flight, simple replies, and every
//! error case, each reply checked.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{python, Env};

#[test]
fn libnbd_drives_every_command_and_error() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[]), ("ro", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--read-only", "tank/ro"]);
    let out = python(
        "protocol.py",
        &[&server.uri("tank/vol0"), &server.uri("tank/ro")],
    );
    assert!(out.contains("protocol: all checks passed"), "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn libnbd_over_a_unix_socket_with_one_reactor_and_few_slots() {
    // One reactor and 4 slots: 128 requests in flight from the client must queue behind the
    // slots (back-pressure) and still all complete.
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[]), ("ro", "16M", &[])]);
    let socket = env.path("nbd.sock");
    let server = env.serve(&[
        "--socket",
        socket.to_str().unwrap(),
        "--reactors",
        "1",
        "--slots",
        "4",
        "--read-only",
        "tank/ro",
    ]);
    let out = python(
        "protocol.py",
        &[&server.uri("tank/vol0"), &server.uri("tank/ro")],
    );
    assert!(out.contains("protocol: all checks passed"), "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// Clear-text READ replies are sent from the data cache's blocks by one `sendmsg` when they
/// can (`read_in_parts` in the server): reads.py compares every reply, cold and cached,
/// structured (with and without DF) and simple, with holes, zeros inside data and dirty
/// pieces inside cached blocks, with what it wrote before the server restarted; with 16 KiB
/// blocks and with 4 KiB blocks (a 4 MiB read is then more pieces than one `sendmsg` takes).
#[test]
fn reads_from_cached_dirty_and_hole_blocks_are_identical() {
    let env = Env::new();
    env.tank(&[
        ("vol16k", "8M", &["volblocksize=16K"]),
        ("vol4k", "8M", &["volblocksize=4K"]),
    ]);
    let args = ["--listen", "127.0.0.1:0"];
    let server = env.serve(&args);
    for vol in ["tank/vol16k", "tank/vol4k"] {
        python("reads.py", &["write", &server.uri(vol)]);
    }
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    // A new server: nothing dirty and nothing cached, so the first reads miss the cache.
    let server = env.serve(&args);
    for vol in ["tank/vol16k", "tank/vol4k"] {
        let out = python("reads.py", &["read", &server.uri(vol)]);
        assert!(out.contains("reads: all reads identical"), "{vol}: {out}");
    }
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
