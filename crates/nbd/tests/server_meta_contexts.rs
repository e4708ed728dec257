//! Change maps through the server, in-process over a memory pool with a raw client: a fake
//! `ChangeMaps` offers `oxpool:changed-since:monday`, `...:#weekly` and `...:broken` on one
//! volume; LIST_META_CONTEXT lists them, SET_META_CONTEXT selects them beside
//! `base:allocation`, BLOCK_STATUS answers one chunk per selected context (the fake's extents,
//! cut to the request), REQ_ONE gives one extent per context, a failing map fails that
//! request only; and the default server (no change maps) selects only `base:allocation`.
#![cfg(feature = "server")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use oxpool_engine::{EngineError, Pool, PoolProps, TopSpec, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::net::Listener;
use oxpool_io::{Backend, MemoryBackend};
use oxpool_nbd::proto::{BasePin, ChangeBase};
use oxpool_nbd::server::{
    ChangeExtent, ChangeExtentsFuture, ChangeMaps, Server, ServerConfig, ServerExport,
};

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_LIST_META_CONTEXT: u32 = 9;
const OPT_SET_META_CONTEXT: u32 = 10;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const CMD_WRITE: u16 = 1;
const CMD_READ: u16 = 0;
const CMD_BLOCK_STATUS: u16 = 7;
const FLAG_REQ_ONE: u16 = 1 << 3;
const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
const NBD_EIO: u32 = 5;

const VOLUME_BYTES: u64 = 96 << 20;
const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// Ranges `monday` flags as changed.
const MONDAY_CHANGED: [(u64, u64); 2] = [(64 * KIB, 192 * KIB), (MIB, MIB + 16 * KIB)];

/// The fake: on `mem/vol0` only, `monday` (the ranges above), `#weekly` (everything, and it
/// answers past the query to see the server cut it) and `broken` (offered, but fails).
#[derive(Debug)]
struct FakeMaps;

fn base(leaf: &str) -> ChangeBase {
    ChangeBase::parse(leaf.as_bytes()).unwrap()
}

impl ChangeMaps for FakeMaps {
    fn bases(&self, volume: &Volume, limit: usize) -> Vec<ChangeBase> {
        if volume.full_name() != "mem/vol0" {
            return Vec::new();
        }
        let mut all = vec![base("monday"), base("#weekly"), base("broken")];
        all.truncate(limit);
        all
    }

    /// The base's place in the list: every BLOCK_STATUS must hand it back.
    fn pin(&self, volume: &Volume, wanted: &ChangeBase) -> Option<BasePin> {
        let at = self
            .bases(volume, usize::MAX)
            .iter()
            .position(|b| b == wanted)?;
        Some(BasePin(at as u64, 7))
    }

    fn changed_extents<'a>(
        &'a self,
        volume: &'a Volume,
        wanted: &'a ChangeBase,
        pin: BasePin,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> ChangeExtentsFuture<'a> {
        let pinned = self.pin(volume, wanted);
        Box::pin(async move {
            if pinned != Some(pin) {
                return Err(EngineError::Invalid(format!(
                    "{wanted}: pinned {pinned:?} at selection, handed back {pin:?}"
                )));
            }
            let end = offset_bytes + length_bytes;
            match wanted.to_string().as_str() {
                "broken" => Err(EngineError::NotFound("snapshot broken".into())),
                "#weekly" => Ok(vec![ChangeExtent {
                    length_bytes: length_bytes + MIB,
                    changed: true,
                }]),
                _ => {
                    let mut extents = Vec::new();
                    let mut at = offset_bytes;
                    for (start, stop) in MONDAY_CHANGED {
                        let (start, stop) = (start.clamp(at, end), stop.clamp(at, end));
                        for (len, changed) in [(start - at, false), (stop - start, true)] {
                            if len > 0 {
                                extents.push(ChangeExtent {
                                    length_bytes: len,
                                    changed,
                                });
                            }
                        }
                        at = stop;
                    }
                    if end > at {
                        extents.push(ChangeExtent {
                            length_bytes: end - at,
                            changed: false,
                        });
                    }
                    Ok(extents)
                }
            }
        })
    }
}

fn pool() -> (Pool, Volume) {
    let device: Arc<dyn Backend> = Arc::new(MemoryBackend::new("mem0", 256 << 20));
    let pool = Pool::create(
        "mem",
        vec![TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![device],
        }],
        PoolProps::default(),
        false,
    )
    .unwrap();
    let volume = pool.create_volume("vol0", VOLUME_BYTES, &[]).unwrap();
    (pool, volume)
}

fn serve(volume: &Volume, change_maps: Option<Arc<dyn ChangeMaps>>) -> (Server, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let export = ServerExport {
        name: "mem/vol0".into(),
        volume: volume.clone(),
        read_only: false,
    };
    let mut config = ServerConfig {
        reactors: 1,
        ..ServerConfig::default()
    };
    if let Some(maps) = change_maps {
        config.change_maps = maps;
    }
    let server = Server::start(config, vec![export], vec![Listener::tcp(listener)]).unwrap();
    (server, addr)
}

fn read_exact(s: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).expect("read from the server");
    buf
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

fn send_option(s: &mut TcpStream, option: u32, data: &[u8]) {
    let mut out = IHAVEOPT.to_be_bytes().to_vec();
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    s.write_all(&out).unwrap();
}

/// The replies to one option up to its final one: (id, name) of each META_CONTEXT, and the
/// final reply type.
fn option_replies(s: &mut TcpStream, option: u32) -> (Vec<(u32, String)>, u32) {
    let mut contexts = Vec::new();
    for _ in 0..100 {
        let header = read_exact(s, 20);
        assert_eq!(be32(&header[8..]), option);
        let kind = be32(&header[12..]);
        let data = read_exact(s, be32(&header[16..]) as usize);
        if kind == REP_META_CONTEXT {
            contexts.push((be32(&data), String::from_utf8(data[4..].to_vec()).unwrap()));
            continue;
        }
        if kind == REP_INFO {
            continue; // GO's export information.
        }
        return (contexts, kind);
    }
    panic!("no final reply");
}

fn meta_data(queries: &[&str]) -> Vec<u8> {
    let name = b"mem/vol0";
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name);
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// Connects, negotiates structured replies, lists with `list` (if given), selects `set`,
/// enters transmission on mem/vol0. Returns the stream, what LIST named, what SET selected.
fn connect(
    addr: &str,
    list: Option<&[&str]>,
    set: &[&str],
) -> (TcpStream, Vec<String>, Vec<(u32, String)>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    read_exact(&mut s, 18);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(option_replies(&mut s, OPT_STRUCTURED_REPLY).1, REP_ACK);
    let mut listed = Vec::new();
    if let Some(queries) = list {
        send_option(&mut s, OPT_LIST_META_CONTEXT, &meta_data(queries));
        let (contexts, end) = option_replies(&mut s, OPT_LIST_META_CONTEXT);
        assert_eq!(end, REP_ACK);
        assert!(contexts.iter().all(|(id, _)| *id == 0));
        listed = contexts.into_iter().map(|(_, name)| name).collect();
    }
    send_option(&mut s, OPT_SET_META_CONTEXT, &meta_data(set));
    let (selected, end) = option_replies(&mut s, OPT_SET_META_CONTEXT);
    assert_eq!(end, REP_ACK);
    let name = b"mem/vol0";
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name);
    go.extend_from_slice(&0u16.to_be_bytes());
    send_option(&mut s, OPT_GO, &go);
    assert_eq!(option_replies(&mut s, OPT_GO).1, REP_ACK);
    (s, listed, selected)
}

fn request(s: &mut TcpStream, command: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
    let mut out = REQUEST_MAGIC.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&command.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    s.write_all(&out).unwrap();
}

/// A structured reply's chunks up to DONE: (type, payload, done).
fn chunks(s: &mut TcpStream, cookie: u64) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    for _ in 0..64 {
        let header = read_exact(s, 20);
        assert_eq!(be32(&header), STRUCTURED_REPLY_MAGIC);
        assert_eq!(be64(&header[8..]), cookie);
        let done = be16(&header[4..]) & REPLY_FLAG_DONE != 0;
        let kind = be16(&header[6..]);
        let payload = read_exact(s, be32(&header[16..]) as usize);
        out.push((kind, payload));
        if done {
            return out;
        }
    }
    panic!("no DONE chunk");
}

/// One BLOCK_STATUS chunk: the context id and its extents (length, flags).
type ContextExtents = (u32, Vec<(u32, u32)>);

/// BLOCK_STATUS: per chunk, the context id and its extents; or the error.
fn block_status(
    s: &mut TcpStream,
    cookie: u64,
    offset: u64,
    len: u32,
    flags: u16,
) -> Result<Vec<ContextExtents>, u32> {
    request(s, CMD_BLOCK_STATUS, flags, cookie, offset, len);
    let mut contexts = Vec::new();
    for (kind, payload) in chunks(s, cookie) {
        match kind {
            REPLY_TYPE_BLOCK_STATUS => {
                let extents = payload[4..]
                    .chunks_exact(8)
                    .map(|d| (be32(d), be32(&d[4..])))
                    .collect();
                contexts.push((be32(&payload), extents));
            }
            REPLY_TYPE_ERROR => return Err(be32(&payload)),
            REPLY_TYPE_NONE => {}
            other => panic!("unexpected chunk type {other}"),
        }
    }
    Ok(contexts)
}

/// Writes 16 KiB of data at 0 (simple reply: structured replies only change READ).
fn write_head(s: &mut TcpStream) {
    request(s, CMD_WRITE, 0, 1, 0, 16384);
    s.write_all(&[0x5a; 16384]).unwrap();
    let r = read_exact(s, 16);
    assert_eq!(be32(&r), SIMPLE_REPLY_MAGIC);
    assert_eq!(be32(&r[4..]), 0, "write failed");
}

const K: u32 = 1024;
const M: u32 = 1 << 20;

#[test]
fn change_maps_are_listed_selected_and_answered_per_context() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, Some(Arc::new(FakeMaps)));

    let (mut s, listed, selected) = connect(
        &addr,
        Some(&[]),
        &[
            "base:allocation",
            "oxpool:changed-since:monday",
            "oxpool:changed-since:tuesday",
            "oxpool:changed-since:#weekly",
        ],
    );
    assert_eq!(
        listed,
        [
            "base:allocation",
            "oxpool:changed-since:monday",
            "oxpool:changed-since:#weekly",
            "oxpool:changed-since:broken",
        ]
    );
    assert_eq!(
        selected,
        [
            (1, "base:allocation".to_string()),
            (2, "oxpool:changed-since:monday".to_string()),
            (3, "oxpool:changed-since:#weekly".to_string()),
        ]
    );
    write_head(&mut s);

    let status = block_status(&mut s, 10, 0, 2 * M, 0).unwrap();
    assert_eq!(
        status,
        [
            (1, vec![(16 * K, 0), (2 * M - 16 * K, 3)]),
            (
                2,
                vec![
                    (64 * K, 0),
                    (128 * K, 1),
                    (M - 192 * K, 0),
                    (16 * K, 1),
                    (M - 16 * K, 0)
                ]
            ),
            // The fake answered 1 MiB past the request: cut to it.
            (3, vec![(2 * M, 1)]),
        ]
    );

    // REQ_ONE: one extent per context, within the request.
    let status = block_status(&mut s, 11, 0, 2 * M, FLAG_REQ_ONE).unwrap();
    assert_eq!(
        status,
        [
            (1, vec![(16 * K, 0)]),
            (2, vec![(64 * K, 0)]),
            (3, vec![(2 * M, 1)])
        ]
    );

    // A range inside a changed one.
    let status = block_status(&mut s, 12, 100 * 1024, 8 * K, 0).unwrap();
    assert_eq!(status[1], (2, vec![(8 * K, 1)]));

    // The listing by the change maps' prefix names the same maps.
    drop(s);
    let (_, listed, selected) = connect(
        &addr,
        Some(&["oxpool:changed-since:"]),
        &["oxpool:changed-since:monday"],
    );
    assert_eq!(listed.len(), 3);
    assert!(listed
        .iter()
        .all(|name| name.starts_with("oxpool:changed-since:")));
    // Selected alone, it keeps the ids after base:allocation's.
    assert_eq!(selected, [(2, "oxpool:changed-since:monday".to_string())]);

    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

#[test]
fn a_change_map_alone_and_a_failing_one() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, Some(Arc::new(FakeMaps)));

    let (mut s, _, selected) = connect(&addr, None, &["oxpool:changed-since:monday"]);
    assert_eq!(selected.len(), 1);
    let status = block_status(&mut s, 20, 0, 128 * K, 0).unwrap();
    assert_eq!(status, [(2, vec![(64 * K, 0), (64 * K, 1)])]);
    drop(s);

    // A map that fails: that request gets EIO, the connection goes on.
    let (mut s, _, selected) = connect(
        &addr,
        None,
        &["base:allocation", "oxpool:changed-since:broken"],
    );
    assert_eq!(selected.len(), 2);
    assert_eq!(block_status(&mut s, 21, 0, 64 * K, 0), Err(NBD_EIO));
    request(&mut s, CMD_READ, 0, 22, 0, 4096);
    let reply = chunks(&mut s, 22);
    assert!(
        reply
            .iter()
            .all(|(kind, _)| *kind == REPLY_TYPE_OFFSET_DATA || *kind == REPLY_TYPE_OFFSET_HOLE),
        "{reply:?}"
    );

    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}

#[test]
fn without_change_maps_only_base_allocation_is_served() {
    let (pool, volume) = pool();
    let (server, addr) = serve(&volume, None);
    let (mut s, listed, selected) = connect(
        &addr,
        Some(&["oxpool:", "base:"]),
        &["oxpool:changed-since:monday", "base:allocation"],
    );
    assert_eq!(listed, ["base:allocation"]);
    assert_eq!(selected, [(1, "base:allocation".to_string())]);
    let status = block_status(&mut s, 30, 0, 64 * K, 0).unwrap();
    assert_eq!(status, [(1, vec![(64 * K, 3)])]);
    server.shutdown_handle().shutdown();
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}
