//! The server in-process over a memory pool, with a raw client: back-pressure when requests
//! outnumber the slots, the per-connection buffer budget with maximal requests, replies in any
//! order, and shutdown (in-flight requests answered, idle and stuck clients closed, a client
//! that stops reading dropped after the grace period).
#![cfg(feature = "server")]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use oxpool_engine::{Pool, PoolProps, TopSpec, Volume};
use oxpool_io::rt::net::Listener;
use oxpool_io::{Backend, MemoryBackend};
use oxpool_nbd::server::{Disconnect, ExportError, Server, ServerConfig, ServerExport};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
/// NBD_REP_ERR_UNKNOWN: the export does not exist.
const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;
const CMD_CACHE: u16 = 5;
const CMD_WRITE_ZEROES: u16 = 6;

const VOLUME_BYTES: u64 = 96 << 20;
const MIB: usize = 1 << 20;

/// A memory pool with one volume.
fn pool() -> (Pool, Volume) {
    let device: Arc<dyn Backend> = Arc::new(MemoryBackend::new("mem0", 256 << 20));
    let mut props = PoolProps::default();
    props.set("dirty_max", "128M").unwrap();
    let pool = Pool::create("mem", vec![TopSpec::single(device)], props, false).unwrap();
    let volume = pool.create_volume("vol0", VOLUME_BYTES, &[]).unwrap();
    (pool, volume)
}

/// Starts a server for `volume` on a free loopback port; returns it and its address.
fn serve(volume: &Volume, config: ServerConfig) -> (Server, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let export = ServerExport {
        name: "mem/vol0".into(),
        volume: volume.clone(),
        read_only: false,
    };
    let server = Server::start(config, vec![export], vec![Listener::tcp(listener)]).unwrap();
    (server, addr)
}

fn config(slots: usize, grace: Duration) -> ServerConfig {
    ServerConfig {
        reactors: 2,
        slots_per_connection: slots,
        shutdown_grace: grace,
        ..ServerConfig::default()
    }
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
}

fn read_exact(stream: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).expect("read from the server");
    buf
}

/// Handshake with NBD_OPT_GO (no structured replies): simple replies from then on.
fn open(addr: &str) -> TcpStream {
    open_export(addr, "mem/vol0").expect("GO refused").0
}

/// NBD_OPT_GO for export `name`: the stream and the export's size, or the error reply type.
fn open_export(addr: &str, name: &str) -> Result<(TcpStream, u64), u32> {
    go_export(addr, name).map_err(|(reply_type, _)| reply_type)
}

/// NBD_OPT_GO for export `name`: the stream and the export's size, or the error reply's type
/// and message.
fn go_export(addr: &str, name: &str) -> Result<(TcpStream, u64), (u32, String)> {
    go_after_greeting(greeted(addr), name)
}

/// A connection whose greeting was read: the server has read its export table for it.
fn greeted(addr: &str) -> TcpStream {
    let mut s = connect(addr);
    let greeting = read_exact(&mut s, 18);
    assert_eq!(
        u64::from_be_bytes(greeting[..8].try_into().unwrap()),
        NBDMAGIC
    );
    s
}

/// The client flags and NBD_OPT_GO for export `name` on a greeted connection.
fn go_after_greeting(mut s: TcpStream, name: &str) -> Result<(TcpStream, u64), (u32, String)> {
    let name = name.as_bytes();
    let mut out = 3u32.to_be_bytes().to_vec();
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&OPT_GO.to_be_bytes());
    out.extend_from_slice(&(4 + name.len() as u32 + 2).to_be_bytes());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&out).unwrap();
    let mut size = None;
    for _ in 0..16 {
        let header = read_exact(&mut s, 20);
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        let payload = read_exact(&mut s, len);
        if reply_type >> 31 != 0 {
            return Err((reply_type, String::from_utf8_lossy(&payload).into_owned()));
        }
        // NBD_REP_INFO with NBD_INFO_EXPORT: u16 type 0, u64 size, u16 flags.
        if reply_type == REP_INFO && payload.len() == 12 && payload[..2] == [0, 0] {
            size = Some(u64::from_be_bytes(payload[2..10].try_into().unwrap()));
        }
        if reply_type == REP_ACK {
            return Ok((s, size.expect("GO gave no NBD_INFO_EXPORT")));
        }
    }
    panic!("no ACK");
}

/// Old-style NBD_OPT_EXPORT_NAME for export `name`: the export's size, or `None` if the
/// server closed the connection (its only way to refuse that option).
fn export_name(addr: &str, name: &str) -> Option<u64> {
    export_name_after_greeting(greeted(addr), name)
}

/// The client flags and NBD_OPT_EXPORT_NAME for export `name` on a greeted connection.
fn export_name_after_greeting(mut s: TcpStream, name: &str) -> Option<u64> {
    let mut out = 3u32.to_be_bytes().to_vec();
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    s.write_all(&out).unwrap();
    // NO_ZEROES: the size (8 bytes) and the transmission flags (2), no padding.
    let mut reply = [0u8; 10];
    match s.read_exact(&mut reply) {
        Ok(()) => Some(u64::from_be_bytes(reply[..8].try_into().unwrap())),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
            ) =>
        {
            None
        }
        Err(e) => panic!("EXPORT_NAME reply: {e}"),
    }
}

fn request(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut out = REQUEST_MAGIC.to_be_bytes().to_vec();
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out
}

/// One simple reply: (error, cookie).
fn reply(s: &mut TcpStream) -> (u32, u64) {
    let r = read_exact(s, 16);
    assert_eq!(
        u32::from_be_bytes(r[..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    (
        u32::from_be_bytes(r[4..8].try_into().unwrap()),
        u64::from_be_bytes(r[8..16].try_into().unwrap()),
    )
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 / 7) % 251) as u8)
        .collect()
}

/// Whether the peer closed the connection (EOF or reset) before sending anything more.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Ok(0) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
        _ => false,
    }
}

#[test]
fn requests_beyond_the_slots_wait_and_all_complete() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(4, Duration::from_secs(30)));
    let mut s = open(&addr);
    let count = 200u64;
    let len = 4096usize;
    // Writes and reads pipelined from another thread while this one reads replies: the
    // server has only 4 slots, so most requests wait on the wire.
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..count {
            let mut out = request(CMD_WRITE, i, i * len as u64 * 3, len as u32);
            out.extend_from_slice(&pattern(i, len));
            writer.write_all(&out).unwrap();
        }
    });
    let mut seen = vec![false; count as usize];
    for _ in 0..count {
        let (error, cookie) = reply(&mut s);
        assert_eq!(error, 0);
        assert!(
            !std::mem::replace(&mut seen[cookie as usize], true),
            "cookie {cookie} twice"
        );
    }
    sender.join().unwrap();
    let mut burst = Vec::new();
    for i in 0..count {
        burst.extend_from_slice(&request(CMD_READ, 1000 + i, i * len as u64 * 3, len as u32));
    }
    s.write_all(&burst).unwrap();
    for _ in 0..count {
        let (error, cookie) = reply(&mut s);
        assert_eq!(error, 0);
        let i = cookie - 1000;
        assert_eq!(read_exact(&mut s, len), pattern(i, len), "read {i}");
    }
    server.shutdown_handle().shutdown();
    assert!(closed(&mut s));
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

/// WRITE_ZEROES and CACHE carry no payload, so the maximum block size (32 MiB) does not bound
/// them: a 64 MiB WRITE_ZEROES without FAST_ZERO (as nbdcopy sends for a large hole) over
/// written data, with edges inside blocks, reads back as zeros, and the data on either side
/// is intact.
#[test]
fn write_zeroes_longer_than_the_maximum_block_size() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(16, Duration::from_secs(30)));
    let mut s = open(&addr);
    let chunk = 32 * MIB;
    let mut expected = Vec::with_capacity(VOLUME_BYTES as usize);
    for i in 0..3u64 {
        let data = pattern(i + 1, chunk);
        let mut out = request(CMD_WRITE, i, i * chunk as u64, chunk as u32);
        out.extend_from_slice(&data);
        s.write_all(&out).unwrap();
        assert_eq!(reply(&mut s), (0, i));
        expected.extend_from_slice(&data);
    }
    let zero_at = 16 * MIB + 512;
    let zero_len = 64 * MIB - 1024;
    assert!(zero_len > 32 * MIB);
    s.write_all(&request(
        CMD_WRITE_ZEROES,
        10,
        zero_at as u64,
        zero_len as u32,
    ))
    .unwrap();
    assert_eq!(reply(&mut s), (0, 10), "WRITE_ZEROES of {zero_len} bytes");
    expected[zero_at..zero_at + zero_len].fill(0);
    // CACHE is advisory, and just as unbounded.
    s.write_all(&request(CMD_CACHE, 11, 0, 64 * MIB as u32))
        .unwrap();
    assert_eq!(reply(&mut s), (0, 11), "CACHE of 64 MiB");
    for i in 0..3u64 {
        s.write_all(&request(CMD_READ, 20 + i, i * chunk as u64, chunk as u32))
            .unwrap();
        assert_eq!(reply(&mut s), (0, 20 + i));
        let got = read_exact(&mut s, chunk);
        let want = &expected[i as usize * chunk..(i as usize + 1) * chunk];
        if let Some(at) = (0..chunk).find(|&k| got[k] != want[k]) {
            panic!(
                "byte {} reads {:#x}, expected {:#x}",
                i as usize * chunk + at,
                got[at],
                want[at]
            );
        }
    }
    server.shutdown_handle().shutdown();
    assert!(closed(&mut s));
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

/// A client that connects and does not finish its handshake within the limit is
/// disconnected (also one that has sent a partial option); one that finished it may stay
/// idle past the limit, and another client is served meanwhile.
#[test]
fn a_handshake_not_done_within_the_limit_is_closed_and_only_it() {
    let (pool, volume) = pool();
    let limit = Duration::from_secs(1);
    let mut cfg = config(4, Duration::from_secs(30));
    cfg.handshake_limit = limit;
    let (server, addr) = serve(&volume, cfg);
    let start = std::time::Instant::now();
    // Reads the greeting (NBDMAGIC, IHAVEOPT, flags), then says nothing.
    let mut silent = connect(&addr);
    read_exact(&mut silent, 18);
    // Sends its flags and half an option header.
    let mut partial = connect(&addr);
    read_exact(&mut partial, 18);
    let mut half = 3u32.to_be_bytes().to_vec();
    half.extend_from_slice(&IHAVEOPT.to_be_bytes());
    partial.write_all(&half).unwrap();
    // Finishes its handshake at once, then idles past the limit.
    let mut idle = open(&addr);
    for s in [&mut silent, &mut partial] {
        assert!(
            closed(s),
            "a client still connected after {:?}",
            start.elapsed()
        );
    }
    assert!(start.elapsed() >= limit, "closed before the limit");
    std::thread::sleep(limit);
    let len = 4096usize;
    let mut out = request(CMD_WRITE, 1, 0, len as u32);
    out.extend_from_slice(&pattern(1, len));
    idle.write_all(&out).unwrap();
    assert_eq!(reply(&mut idle), (0, 1));
    idle.write_all(&request(CMD_READ, 2, 0, len as u32))
        .unwrap();
    assert_eq!(reply(&mut idle), (0, 2));
    assert_eq!(read_exact(&mut idle, len), pattern(1, len));
    server.shutdown_handle().shutdown();
    assert!(closed(&mut idle));
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

/// READ replies sent together (the writer puts the large replies queued behind one into its
/// `sendmsg`): each carries its own header and data, whatever their sizes, with small
/// replies (copied into the writer's batch) between them, from the device and then from the
/// cache, and again when the slots are reused for replies of other sizes.
#[test]
fn reads_answered_together_each_carry_their_own_data() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(64, Duration::from_secs(30)));
    let mut s = open(&addr);
    let count = 48u64;
    let region = 128 * 1024u64;
    // Large replies (over the 16 KiB the writer copies), every size a different one.
    let len_of = |i: u64| [20 * 1024, 64 * 1024, 128 * 1024, 36 * 1024 + 512][i as usize % 4];
    for i in 0..count {
        let mut out = request(CMD_WRITE, i, i * region, region as u32);
        out.extend_from_slice(&pattern(i, region as usize));
        s.write_all(&out).unwrap();
        assert_eq!(reply(&mut s), (0, i));
    }
    s.write_all(&request(CMD_FLUSH, 99, 0, 0)).unwrap();
    assert_eq!(reply(&mut s), (0, 99));
    // Round 0 reads from the device, round 1 from the cache, round 2 in the other order.
    for round in 0..3u64 {
        let mut burst = Vec::new();
        let mut expected = std::collections::HashMap::new();
        for k in 0..count {
            let i = if round == 2 { count - 1 - k } else { k };
            let len = len_of(i + round);
            let cookie = 1000 * (round + 1) + i;
            burst.extend_from_slice(&request(CMD_READ, cookie, i * region, len as u32));
            expected.insert(cookie, pattern(i, region as usize)[..len].to_vec());
            if k % 5 == 4 {
                // A small read between the large ones: a reply of another kind in the queue.
                let cookie = 100_000 + 1000 * round + i;
                burst.extend_from_slice(&request(CMD_READ, cookie, i * region + 512, 4096));
                expected.insert(
                    cookie,
                    pattern(i, region as usize)[512..512 + 4096].to_vec(),
                );
            }
        }
        s.write_all(&burst).unwrap();
        // Bounded by the requests sent.
        for _ in 0..expected.len() {
            let (error, cookie) = reply(&mut s);
            assert_eq!(error, 0, "round {round} cookie {cookie}");
            let want = expected
                .remove(&cookie)
                .expect("a cookie sent once and answered once");
            assert!(
                read_exact(&mut s, want.len()) == want,
                "round {round}: the data of cookie {cookie}"
            );
        }
    }
    server.shutdown_handle().shutdown();
    assert!(closed(&mut s));
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

#[test]
fn maximal_requests_beyond_the_buffer_budget_wait_and_complete() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(128, Duration::from_secs(30)));
    let mut s = open(&addr);
    // Six 32 MiB writes (192 MiB) pipelined against a 64 MiB budget, then reads of each.
    let len = 32 * MIB;
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..6u64 {
            let offset = (i % 3) * len as u64;
            writer
                .write_all(&request(CMD_WRITE, i, offset, len as u32))
                .unwrap();
            writer.write_all(&pattern(i, len)).unwrap();
        }
        writer.write_all(&request(CMD_FLUSH, 99, 0, 0)).unwrap();
    });
    let mut cookies: Vec<u64> = (0..7)
        .map(|_| reply(&mut s))
        .map(|(e, c)| {
            assert_eq!(e, 0);
            c
        })
        .collect();
    sender.join().unwrap();
    cookies.sort_unstable();
    assert_eq!(cookies, vec![0, 1, 2, 3, 4, 5, 99]);
    for i in 0..3u64 {
        s.write_all(&request(CMD_READ, 10 + i, i * len as u64, len as u32))
            .unwrap();
    }
    for _ in 0..3 {
        let (error, cookie) = reply(&mut s);
        assert_eq!(error, 0);
        let slot = cookie - 10;
        // The later of the two writes to each third is what reads back (same connection,
        // each write answered before the reads were sent).
        assert!(
            read_exact(&mut s, len) == pattern(slot + 3, len),
            "read {slot}"
        );
    }
    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

#[test]
fn shutdown_answers_what_was_read_and_closes_idle_and_silent_clients() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(128, Duration::from_secs(30)));
    let mut busy = open(&addr);
    let mut idle = open(&addr);
    let mut silent = connect(&addr);
    read_exact(&mut silent, 18); // Greeting, then nothing from the client.
                                 // 64 reads and a FLUSH; once the first reply is here, shut down while others may still
                                 // be in flight: every reply that comes is whole, then the connection closes.
    let mut burst = Vec::new();
    for i in 0..64u64 {
        burst.extend_from_slice(&request(CMD_READ, i, i * 65536, 65536));
    }
    burst.extend_from_slice(&request(CMD_FLUSH, 64, 0, 0));
    busy.write_all(&burst).unwrap();
    let (error, cookie) = reply(&mut busy);
    assert_eq!(error, 0);
    if cookie < 64 {
        read_exact(&mut busy, 65536);
    }
    server.shutdown_handle().shutdown();
    // Bounded: at most the 64 remaining replies, then the close.
    let mut buf = [0u8; 16];
    for _ in 0..64 {
        match busy.read_exact(&mut buf) {
            Ok(()) => {
                assert_eq!(
                    u32::from_be_bytes(buf[..4].try_into().unwrap()),
                    SIMPLE_REPLY_MAGIC
                );
                let cookie = u64::from_be_bytes(buf[8..16].try_into().unwrap());
                if cookie < 64 {
                    read_exact(&mut busy, 65536);
                }
            }
            Err(_) => break,
        }
    }
    assert!(closed(&mut busy));
    assert!(closed(&mut idle));
    assert!(closed(&mut silent));
    server.join().unwrap();
    // New connections are refused once the listener is closed.
    assert!(TcpStream::connect(&addr).is_err());
    drop(volume);
    pool.export().unwrap();
}

#[test]
fn a_client_that_stops_reading_is_dropped_after_the_grace_period() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(128, Duration::from_millis(300)));
    let mut stuck = open(&addr);
    // 1 GiB of read replies that are never read: the writer blocks on a full socket.
    let mut burst = Vec::new();
    for i in 0..1024u64 {
        burst.extend_from_slice(&request(CMD_READ, i, (i % 96) * MIB as u64, MIB as u32));
    }
    stuck.write_all(&burst).unwrap();
    // The server has read some of them and is blocked sending.
    std::thread::sleep(Duration::from_millis(200));
    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(stuck);
    drop(volume);
    pool.export().unwrap();
}

#[test]
fn exports_are_added_and_removed_while_serving() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(16, Duration::from_secs(30)));
    let exports = server.exports();
    assert_eq!(open_export(&addr, "mem/vol1").err(), Some(REP_ERR_UNKNOWN));

    // A volume created while serving is offered to the next connection.
    let vol1 = pool.create_volume("vol1", 8 << 20, &[]).unwrap();
    exports
        .add(ServerExport {
            name: "mem/vol1".into(),
            volume: vol1.clone(),
            read_only: false,
        })
        .unwrap();
    assert_eq!(exports.names(), vec!["mem/vol0", "mem/vol1"]);
    let err = exports.add(ServerExport {
        name: "mem/vol1".into(),
        volume: vol1.clone(),
        read_only: false,
    });
    assert_eq!(err.unwrap_err(), ExportError::Exists("mem/vol1".into()));
    let (mut client, size) = open_export(&addr, "mem/vol1").unwrap();
    assert_eq!(size, 8 << 20);
    let mut out = request(CMD_WRITE, 1, 0, 4096);
    out.extend_from_slice(&pattern(1, 4096));
    client.write_all(&out).unwrap();
    assert_eq!(reply(&mut client), (0, 1));
    assert_eq!(exports.clients("mem/vol1"), Some(1));

    // Removal is refused while a client has it open, and changes nothing.
    let refused = exports.remove("mem/vol1", Disconnect::Refuse).unwrap_err();
    assert_eq!(
        refused,
        ExportError::InUse {
            name: "mem/vol1".into(),
            clients: 1
        }
    );
    // The remedy is the caller's to say (the CLI's `-f`, or none for a receive).
    assert_eq!(
        refused.to_string(),
        "'mem/vol1': it is open by 1 NBD client connection(s)"
    );
    client.write_all(&request(CMD_READ, 2, 0, 4096)).unwrap();
    assert_eq!(reply(&mut client), (0, 2));
    assert_eq!(read_exact(&mut client, 4096), pattern(1, 4096));

    // Forced: reads already sent are answered, then the connection closes; the export is no
    // longer offered, and the other export's client is untouched.
    let mut other = open(&addr);
    let mut burst = Vec::new();
    for i in 0..32u64 {
        burst.extend_from_slice(&request(CMD_READ, 100 + i, i * 4096, 4096));
    }
    client.write_all(&burst).unwrap();
    // The server has read requests of the burst (one is answered) before the removal.
    let (error, cookie) = reply(&mut client);
    assert_eq!(error, 0);
    assert!((100..132).contains(&cookie));
    let first_data = read_exact(&mut client, 4096);
    let removed = exports.remove("mem/vol1", Disconnect::Force).unwrap();
    assert_eq!(removed.name, "mem/vol1");
    // Every reply that comes is whole and right; then the connection closes cleanly.
    let mut answered = vec![cookie];
    let expected = |cookie: u64| {
        if cookie == 100 {
            pattern(1, 4096)
        } else {
            vec![0u8; 4096]
        }
    };
    assert_eq!(first_data, expected(cookie));
    let mut buf = [0u8; 16];
    // Bounded: at most the 31 other replies, then the close.
    while client.read_exact(&mut buf).is_ok() {
        assert_eq!(
            u32::from_be_bytes(buf[..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        let cookie = u64::from_be_bytes(buf[8..16].try_into().unwrap());
        assert_eq!(read_exact(&mut client, 4096), expected(cookie), "{cookie}");
        answered.push(cookie);
    }
    answered.sort_unstable();
    answered.dedup();
    assert!(!answered.is_empty() && answered.len() <= 32);
    assert_eq!(exports.clients("mem/vol1"), None);
    assert_eq!(open_export(&addr, "mem/vol1").err(), Some(REP_ERR_UNKNOWN));
    other.write_all(&request(CMD_READ, 7, 0, 4096)).unwrap();
    assert_eq!(reply(&mut other), (0, 7));
    read_exact(&mut other, 4096);
    assert_eq!(
        exports.remove("mem/vol1", Disconnect::Force).unwrap_err(),
        ExportError::NotFound("mem/vol1".into())
    );

    // A resize is seen by the next connection.
    pool.set_volume_prop("vol0", "volsize", "64M").unwrap();
    assert_eq!(open_export(&addr, "mem/vol0").unwrap().1, 64 << 20);

    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop((volume, vol1, removed));
    pool.export().unwrap();
}

#[test]
fn a_forced_removal_shuts_down_a_client_that_stops_reading() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(128, Duration::from_millis(300)));
    let mut stuck = open(&addr);
    // Large reads whose replies it never reads: the server's sends stall once the socket
    // buffers are full, so a stop alone cannot finish the connection.
    let mut burst = Vec::new();
    for i in 0..64u64 {
        burst.extend_from_slice(&request(
            CMD_READ,
            i,
            (i % 8) * 4 * MIB as u64,
            4 * MIB as u32,
        ));
    }
    stuck.write_all(&burst).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let removed = server
        .exports()
        .remove("mem/vol0", Disconnect::Force)
        .unwrap();
    assert_eq!(server.exports().clients("mem/vol0"), None);
    drop(removed);
    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

/// An empty export name (`nbdinfo nbd://HOST:PORT`) reaches a volume only while it is the
/// only export: with several, "the first" would change as volumes are added (after a restart,
/// one whose name sorts first), sending the same client URI to another disk. It is refused
/// then (EXPORT_NAME, which has no error reply, by closing), and never moves to another
/// volume: while the volume it reached is not offered, it reaches none, even with one left
/// alone; offered again under its name, it is the default again.
#[test]
fn the_default_export_is_the_only_export_and_never_moves() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(16, Duration::from_secs(30)));
    let exports = server.exports();
    // One volume: an empty name reaches it, with GO and with EXPORT_NAME.
    assert_eq!(open_export(&addr, "").unwrap().1, VOLUME_BYTES);
    assert_eq!(export_name(&addr, ""), Some(VOLUME_BYTES));

    // Two: refused, saying why and how to find the names.
    let vol1 = pool.create_volume("vol1", 8 << 20, &[]).unwrap();
    exports
        .add(ServerExport {
            name: "mem/vol1".into(),
            volume: vol1.clone(),
            read_only: false,
        })
        .unwrap();
    let (reply_type, message) = go_export(&addr, "").expect_err("an empty name refused");
    assert_eq!(reply_type, REP_ERR_UNKNOWN);
    assert!(
        message.contains("several exports are offered") && message.contains("nbdinfo --list"),
        "{message}"
    );
    assert_eq!(export_name(&addr, ""), None);
    // Named, both are served.
    assert_eq!(open_export(&addr, "mem/vol0").unwrap().1, VOLUME_BYTES);
    assert_eq!(export_name(&addr, "mem/vol1"), Some(8 << 20));

    drop(exports.remove("mem/vol0", Disconnect::Force).unwrap());
    // Gone: an empty name selects nothing, never mem/vol1 in its place.
    assert_eq!(open_export(&addr, "").err(), Some(REP_ERR_UNKNOWN));
    assert_eq!(export_name(&addr, ""), None);
    assert_eq!(open_export(&addr, "mem/vol1").unwrap().1, 8 << 20);
    // Back under its name (offered again after a refused destroy, a shrink, unshare and
    // share): the default again, once it is the only export.
    exports
        .add(ServerExport {
            name: "mem/vol0".into(),
            volume: volume.clone(),
            read_only: false,
        })
        .unwrap();
    assert_eq!(
        open_export(&addr, "").err(),
        Some(REP_ERR_UNKNOWN),
        "two exports"
    );
    drop(exports.remove("mem/vol1", Disconnect::Force).unwrap());
    assert_eq!(open_export(&addr, "").unwrap().1, VOLUME_BYTES);
    assert_eq!(export_name(&addr, ""), Some(VOLUME_BYTES));

    // Destroyed and created again under its name: another volume, never the default, though
    // it is the only export.
    drop(exports.remove("mem/vol0", Disconnect::Force).unwrap());
    drop(volume);
    pool.destroy_volume("vol0").unwrap();
    let again = pool.create_volume("vol0", 4 << 20, &[]).unwrap();
    exports
        .add(ServerExport {
            name: "mem/vol0".into(),
            volume: again.clone(),
            read_only: false,
        })
        .unwrap();
    assert_eq!(open_export(&addr, "").err(), Some(REP_ERR_UNKNOWN));
    assert_eq!(export_name(&addr, ""), None);
    assert_eq!(open_export(&addr, "mem/vol0").unwrap().1, 4 << 20);
    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop((again, vol1));
    pool.export().unwrap();
}

#[test]
fn a_name_swapped_during_the_handshake_opens_neither_volume_under_it() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, config(16, Duration::from_secs(30)));
    let exports = server.exports();
    let vol1 = pool.create_volume("vol1", 8 << 20, &[]).unwrap();
    exports
        .add(ServerExport {
            name: "mem/vol1".into(),
            volume: vol1.clone(),
            read_only: false,
        })
        .unwrap();
    // Both handshakes read the table (mem/vol0 is the 96 MiB volume) before the swap.
    let go_client = greeted(&addr);
    let export_name_client = greeted(&addr);
    exports
        .rename(&[
            ("mem/vol0".into(), "mem/vol1".into()),
            ("mem/vol1".into(), "mem/vol0".into()),
        ])
        .unwrap();
    // "mem/vol0" now means the 8 MiB volume: the handshake that listed the other one under
    // that name must not open it (the old lookup answered with its 96 MiB).
    let (reply_type, message) =
        go_after_greeting(go_client, "mem/vol0").expect_err("GO after a swap");
    assert_eq!(reply_type, REP_ERR_UNKNOWN);
    assert!(
        message.contains("renamed or removed during the handshake"),
        "{message}"
    );
    assert_eq!(
        export_name_after_greeting(export_name_client, "mem/vol0"),
        None
    );
    assert_eq!(exports.clients("mem/vol0"), Some(0));
    assert_eq!(exports.clients("mem/vol1"), Some(0));
    // A new connection sees the names as they are now.
    assert_eq!(open_export(&addr, "mem/vol0").unwrap().1, 8 << 20);
    assert_eq!(export_name(&addr, "mem/vol1"), Some(VOLUME_BYTES));
    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(vol1);
    pool.export().unwrap();
}
