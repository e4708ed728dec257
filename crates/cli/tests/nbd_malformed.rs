//! Bad input on raw sockets (garbage, bad magic, truncated headers, huge lengths, clients that
//! vanish mid-request or stop reading) while a well-behaved libnbd client keeps writing and
//! verifying its data on two other connections: it must keep working, and so must the server.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{hold, release, run_unchecked, script, tool, until_bounded, Env, PYTHON};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_BLOCK_STATUS: u16 = 7;
const EINVAL: u32 = 22;

/// Long enough for any answer, short enough that a server that never answers fails the test.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
}

fn read_exact(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).expect("read from the server");
    buf
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes[..4].try_into().unwrap())
}

fn be64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().unwrap())
}

/// Reads the greeting and sends the client flags (fixed newstyle, no zeroes).
fn greet(addr: &str) -> TcpStream {
    let mut stream = connect(addr);
    let greeting = read_exact(&mut stream, 18);
    assert_eq!(be64(&greeting), NBDMAGIC);
    assert_eq!(be64(&greeting[8..]), IHAVEOPT);
    stream.write_all(&3u32.to_be_bytes()).unwrap();
    stream
}

/// A connection in the transmission phase on `export` (simple replies only).
fn open(addr: &str, export: &str) -> TcpStream {
    let mut stream = greet(addr);
    let mut option = Vec::new();
    option.extend_from_slice(&IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&OPT_GO.to_be_bytes());
    option.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
    option.extend_from_slice(&(export.len() as u32).to_be_bytes());
    option.extend_from_slice(export.as_bytes());
    option.extend_from_slice(&0u16.to_be_bytes());
    stream.write_all(&option).unwrap();
    // Bounded: the server sends a few INFO replies, then ACK.
    for _ in 0..16 {
        let header = read_exact(&mut stream, 20);
        assert_eq!(be64(&header), REPLY_MAGIC);
        let reply_type = be32(&header[12..]);
        let length = be32(&header[16..]) as usize;
        assert!(length < 4096, "option reply of {length} bytes");
        read_exact(&mut stream, length);
        assert_eq!(reply_type & (1 << 31), 0, "GO failed: {reply_type:#x}");
        if reply_type == REP_ACK {
            return stream;
        }
    }
    panic!("no ACK to NBD_OPT_GO");
}

fn header(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(28);
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out
}

/// Reads one simple reply: (error, cookie).
fn simple_reply(stream: &mut TcpStream) -> (u32, u64) {
    let reply = read_exact(stream, 16);
    assert_eq!(be32(&reply), SIMPLE_REPLY_MAGIC);
    (be32(&reply[4..]), be64(&reply[8..]))
}

/// The server must close the connection (EOF or reset) without sending anything more than
/// `allowed` bytes first.
fn expect_closed(stream: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 4096];
    let mut received = 0usize;
    // Bounded: the read timeout ends a server that neither answers nor closes.
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                received += n;
                assert!(received < 1 << 20, "{what}: server keeps sending");
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("{what}: connection not closed: {e}"),
        }
    }
}

/// One round of every kind of bad client, each on its own connection. Returns when the
/// server has dealt with each as the protocol says.
fn misbehave(addr: &str, export: &str) {
    // Garbage instead of the client flags.
    let mut s = connect(addr);
    read_exact(&mut s, 18);
    s.write_all(&harness::random_bytes(1, 1000)).unwrap();
    expect_closed(&mut s, "garbage flags");

    // Valid flags, then an option with a bad magic.
    let mut s = greet(addr);
    s.write_all(&harness::random_bytes(2, 64)).unwrap();
    expect_closed(&mut s, "bad option magic");

    // An option announcing 4 GiB of data, then the client vanishes after a few bytes.
    let mut s = greet(addr);
    let mut option = Vec::new();
    option.extend_from_slice(&IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&OPT_INFO.to_be_bytes());
    option.extend_from_slice(&u32::MAX.to_be_bytes());
    option.extend_from_slice(&[0u8; 100]);
    s.write_all(&option).unwrap();
    drop(s);

    // Connect and leave at once; connect and half-close without a word.
    drop(connect(addr));
    let mut s = connect(addr);
    s.shutdown(Shutdown::Write).unwrap();
    expect_closed(&mut s, "silent client");

    // A request header with a wrong magic.
    let mut s = open(addr, export);
    let mut bad = header(0, CMD_READ, 1, 0, 512);
    bad[0] ^= 0xff;
    s.write_all(&bad).unwrap();
    expect_closed(&mut s, "bad request magic");

    // A truncated header, then the client vanishes.
    let mut s = open(addr, export);
    s.write_all(&header(0, CMD_READ, 2, 0, 512)[..11]).unwrap();
    drop(s);

    // A WRITE announcing 4 GiB: the courtesy EINVAL for its cookie, then the close; nothing
    // of that size is ever allocated.
    let mut s = open(addr, export);
    s.write_all(&header(0, CMD_WRITE, 0xfeed, 0, u32::MAX))
        .unwrap();
    assert_eq!(simple_reply(&mut s), (EINVAL, 0xfeed), "huge write");
    expect_closed(&mut s, "huge write");

    // A READ of 4 GiB and an unknown command: errors, and the connection goes on.
    let mut s = open(addr, export);
    s.write_all(&header(0, CMD_READ, 3, 0, u32::MAX)).unwrap();
    assert_eq!(simple_reply(&mut s), (EINVAL, 3), "huge read");
    s.write_all(&header(0, 0x55, 4, 0, 512)).unwrap();
    assert_eq!(simple_reply(&mut s), (EINVAL, 4), "unknown command");
    s.write_all(&header(0, CMD_BLOCK_STATUS, 5, 0, 512))
        .unwrap();
    assert_eq!(
        simple_reply(&mut s),
        (EINVAL, 5),
        "block status not negotiated"
    );
    s.write_all(&header(0xffff, CMD_READ, 6, 0, 512)).unwrap();
    assert_eq!(simple_reply(&mut s), (EINVAL, 6), "unknown flags");
    s.write_all(&header(0, CMD_READ, 7, 0, 512)).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 7), "read after errors");
    assert_eq!(read_exact(&mut s, 512).len(), 512);
    s.write_all(&header(0, CMD_DISC, 8, 0, 0)).unwrap();
    expect_closed(&mut s, "disconnect");

    // A 1 MiB WRITE of which only 100 KiB arrive before the client vanishes: never applied
    // (checked below: the range stays zero).
    let mut s = open(addr, export);
    s.write_all(&header(0, CMD_WRITE, 9, 0, 1 << 20)).unwrap();
    s.write_all(&vec![0xee; 100 * 1024]).unwrap();
    drop(s);

    // Many reads in flight, replies never read, then the client resets the connection.
    let mut s = open(addr, export);
    let mut burst = Vec::new();
    for cookie in 0..512u64 {
        burst.extend_from_slice(&header(0, CMD_READ, cookie, cookie * 65536, 65536));
    }
    let _ = s.write_all(&burst);
    drop(s);

    // Requests, then DISC while they are in flight: every reply arrives before the close.
    let mut s = open(addr, export);
    let mut burst = Vec::new();
    for cookie in 100..164u64 {
        burst.extend_from_slice(&header(0, CMD_READ, cookie, 0, 4096));
    }
    burst.extend_from_slice(&header(0, CMD_DISC, 0, 0, 0));
    s.write_all(&burst).unwrap();
    let mut cookies: Vec<u64> = (0..64)
        .map(|_| {
            let (error, cookie) = simple_reply(&mut s);
            assert_eq!(error, 0);
            read_exact(&mut s, 4096);
            cookie
        })
        .collect();
    cookies.sort_unstable();
    assert_eq!(cookies, (100..164).collect::<Vec<u64>>());
    expect_closed(&mut s, "disconnect after requests");
}

#[test]
fn bad_clients_harm_no_one_else() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--reactors", "2"]);
    let uri = server.uri("tank/vol0");
    let addr = server.tcp_addr();

    // The healthy client works in the upper half of the volume for its whole run.
    let mut healthy = Command::new(PYTHON)
        .arg(script("healthy.py"))
        .args([uri.as_str(), "600", "11"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run healthy.py (python3-libnbd)");
    let mut rounds = 0;
    // Bounded: rounds stop when the healthy client is done (or after 1000 of them).
    loop {
        misbehave(&addr, "tank/vol0");
        rounds += 1;
        if healthy.try_wait().unwrap().is_some() || rounds >= 1000 {
            break;
        }
    }
    let output = healthy.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the healthy client failed after {rounds} rounds of bad clients:\n{}{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        server.output()
    );
    eprintln!("{rounds} rounds of bad clients during the healthy run");
    assert!(rounds >= 1);

    // The server is still whole: it lists its exports, the cut-off write never landed, and
    // it shuts down cleanly (no connection left hanging until the grace period).
    let list = tool("nbdinfo", &["--list", &uri]);
    assert!(list.contains("tank/vol0"), "{list}");
    let out = tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0 0 1M"]);
    assert!(
        !out.contains("verification failed"),
        "a partial WRITE was applied:\n{out}"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    assert!(!output.contains("grace period"), "{output}");
    assert!(!output.contains("panicked"), "{output}");
}

/// `--shared N` (qemu-nbd's flag): with N connections open, the next is closed at once and
/// the server's log says why and names the flag; once one leaves, a new one is served.
#[test]
fn connections_past_shared_are_closed_and_logged() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--shared", "2"]);
    let uri = server.uri("tank/vol0");
    let first = hold(&uri);
    let second = hold(&uri);
    let mut nbdinfo = Command::new("nbdinfo");
    nbdinfo.args(["--size", &uri]);
    let refused = run_unchecked(nbdinfo, "nbdinfo past --shared");
    assert!(!refused.status.success(), "a third connection was served");
    assert_eq!(release(first), "still connected");
    // The server counts the first closed once it has read its disconnect: a bounded wait.
    until_bounded("a connection within --shared after one left", || {
        let mut nbdinfo = Command::new("nbdinfo");
        nbdinfo.args(["--size", &uri]);
        let out = run_unchecked(nbdinfo, "nbdinfo within --shared");
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).trim() == (16u64 << 20).to_string()
    });
    assert_eq!(release(second), "still connected");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    assert!(
        output.contains("too many connections (oxpool serve --shared)"),
        "{output}"
    );
}

/// `--handshake-limit`: a client that connects and never finishes its handshake is
/// disconnected once the limit has passed (here 1 s, well before the default 10 s), and a
/// client that negotiates meanwhile is served.
#[test]
fn a_client_that_never_finishes_its_handshake_is_disconnected() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0", "--handshake-limit", "1"]);
    let uri = server.uri("tank/vol0");
    let addr = server.tcp_addr();
    let start = std::time::Instant::now();
    let mut silent = greet(&addr);
    let info = tool("nbdinfo", &["--size", &uri]);
    assert_eq!(info.trim(), (16u64 << 20).to_string());
    expect_closed(&mut silent, "a client silent after its flags");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(9),
        "closed after {waited:?}: not the 1 s limit"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
