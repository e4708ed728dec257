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
