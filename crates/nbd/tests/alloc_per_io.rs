//! No heap allocation per request through the NBD server in steady state: 4 KiB READs of
//! synced data whose indirect blocks are cached, and 4 KiB WRITEs to blocks already dirty in
//! the open txg or (once the buffer pools are warm) that dirty a new block. An in-process
//! server over a file-backed pool on a loopback port, and a raw client (this test's thread)
//! that sends one request at a time from preallocated buffers; READs both with simple replies
//! and with structured replies (what libnbd, qemu and fio negotiate), of 4 KiB and of 128 KiB
//! (sent from the data cache's blocks by one `sendmsg`, not copied into the reply), and
//! bursts of 128 KiB and of 16 KiB READs (sent from the cache's blocks, several per send).
//!
//! Counted by this binary's global allocator on the threads that serve the requests: the
//! server's reactor threads (named `nbd-reactor-N`, where the request tasks and their device
//! I/O run) and the client thread. The txg sync thread is not counted: its allocations are per
//! txg, not per request, and no request waits for it here. Counting is off while the test
//! itself waits for a sync.
#![cfg(feature = "server")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oxpool_engine::{Pool, PoolProps, TopSpec, Volume};
use oxpool_io::rt::net::Listener;
use oxpool_io::{Backend, FileBackend};
use oxpool_nbd::server::{parts_reply_counts, Server, ServerConfig, ServerExport};

struct CountingAllocator;

/// Whether a thread's allocations are counted: not decided yet, yes, no.
const ROLE_UNKNOWN: u8 = 0;
const ROLE_SERVING: u8 = 1;
const ROLE_OTHER: u8 = 2;

thread_local! {
    static ROLE: Cell<u8> = const { Cell::new(ROLE_UNKNOWN) };
}

/// Counting is on (the measured window).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Allocations on serving threads while counting.
static ALLOC_COUNT: AtomicU64 = AtomicU64::new(0);

/// Whether this thread serves requests. Decided once per thread, by its name; the thread is
/// marked `ROLE_OTHER` while deciding, so an allocation made meanwhile is neither counted nor
/// recursive.
fn serving_thread() -> bool {
    ROLE.try_with(|role| match role.get() {
        ROLE_SERVING => true,
        ROLE_OTHER => false,
        _ => {
            role.set(ROLE_OTHER);
            let serving = std::thread::current()
                .name()
                .is_some_and(|name| name.starts_with("nbd-reactor-"));
            role.set(if serving { ROLE_SERVING } else { ROLE_OTHER });
            serving
        }
    })
    .unwrap_or(false)
}

fn note_allocation() {
    if COUNTING.load(Ordering::Relaxed) && serving_thread() {
        ALLOC_COUNT.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; the counting touches atomics and a
// const-initialized thread local, which do not allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Runs `f` and returns how many allocations the serving threads made meanwhile.
fn allocations_during(f: impl FnOnce()) -> u64 {
    ALLOC_COUNT.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::SeqCst);
    f();
    COUNTING.store(false, Ordering::SeqCst);
    ALLOC_COUNT.load(Ordering::Relaxed)
}

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const OFFSET_DATA_HEADER_BYTES: usize = 28;
const REP_ACK: u32 = 1;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const REQUEST_HEADER_BYTES: usize = 28;
const SIMPLE_REPLY_BYTES: usize = 16;

const IO_BYTES: usize = 4096;
/// A WRITE of whole blocks: 4 of the default 16 KiB (received into its blocks).
const WHOLE_BLOCKS_BYTES: usize = 64 * 1024;
/// Large READs: eight blocks of the default 16 KiB, sent from the cache's blocks.
const LARGE_IO_BYTES: usize = 128 * 1024;
/// READs of one default block's length (16 KiB; most of the test's offsets are 4 KiB
/// aligned, not 16 KiB, so most span two blocks): a reply too large for the writer's batch.
const BLOCK_IO_BYTES: usize = 16 * 1024;
/// Sparse; large enough that the dirty limit (at most an eighth of the pool) does not start
/// syncs on its own in the middle of a measurement.
const DEVICE_BYTES: u64 = 1 << 30;
const VOLUME_BYTES: u64 = 16 << 20;
/// The part of the volume the requests touch: 256 blocks of the default 16 KiB.
const REGION_BYTES: u64 = 4 << 20;
const WARM_UP_IO_COUNT: usize = 2000;
const MEASURED_IO_COUNT: usize = 2000;
const EXPORT_NAME: &[u8] = b"tank/v";

fn file_pool(dir: &std::path::Path) -> (Pool, Volume) {
    let device: Arc<dyn Backend> =
        Arc::new(FileBackend::open(&dir.join("dev0"), Some(DEVICE_BYTES)).unwrap());
    let mut props = PoolProps::default();
    // Txgs end only where the test syncs.
    props.set("txg_timeout", "3600").unwrap();
    props.set("dirty_max", "256M").unwrap();
    // A data cache smaller than the region, so it is in its steady state (each block kept
    // evicts an older one, whose buffer returns to the I/O buffer pool) as a long-running
    // server's is once full.
    props.set("data_cache_max", "1M").unwrap();
    let pool = Pool::create("tank", vec![TopSpec::single(device)], props, false).unwrap();
    let volume = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    (pool, volume)
}

fn serve(volume: &Volume) -> (Server, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let export = ServerExport {
        name: String::from_utf8(EXPORT_NAME.to_vec()).unwrap(),
        volume: volume.clone(),
        read_only: false,
    };
    let config = ServerConfig {
        reactors: 1,
        ..ServerConfig::default()
    };
    let server = Server::start(config, vec![export], vec![Listener::tcp(listener)]).unwrap();
    (server, addr)
}

/// Large READs sent together, before any reply is read: the server's writer sends replies
/// queued behind one with it.
const BURST_READ_COUNT: usize = 8;

/// A raw client; every buffer it uses in a request is allocated here.
struct Client {
    stream: TcpStream,
    request: [u8; REQUEST_HEADER_BYTES + IO_BYTES],
    /// The replies to a burst of large READs (simple replies).
    burst_replies: Vec<u8>,
    /// Room for the largest reply (a structured reply to a large READ).
    reply: Vec<u8>,
    /// A WRITE of whole blocks, header and payload.
    whole_blocks_request: Vec<u8>,
    next_cookie: u64,
    structured: bool,
}

/// Reads one option reply; true if it is the final ACK.
fn option_reply(stream: &mut TcpStream) -> bool {
    let mut header = [0u8; 20];
    stream.read_exact(&mut header).unwrap();
    let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    assert_eq!(reply_type >> 31, 0, "option refused");
    reply_type == REP_ACK
}

impl Client {
    /// Connects and negotiates with NBD_OPT_GO, after NBD_OPT_STRUCTURED_REPLY if `structured`.
    fn open(addr: &str, structured: bool) -> Client {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).unwrap();
        assert_eq!(
            u64::from_be_bytes(greeting[..8].try_into().unwrap()),
            NBDMAGIC
        );
        let mut out = 3u32.to_be_bytes().to_vec();
        if structured {
            out.extend_from_slice(&IHAVEOPT.to_be_bytes());
            out.extend_from_slice(&OPT_STRUCTURED_REPLY.to_be_bytes());
            out.extend_from_slice(&0u32.to_be_bytes());
            stream.write_all(&out).unwrap();
            assert!(option_reply(&mut stream), "structured replies refused");
            out.clear();
        }
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&OPT_GO.to_be_bytes());
        out.extend_from_slice(&(4 + EXPORT_NAME.len() as u32 + 2).to_be_bytes());
        out.extend_from_slice(&(EXPORT_NAME.len() as u32).to_be_bytes());
        out.extend_from_slice(EXPORT_NAME);
        out.extend_from_slice(&0u16.to_be_bytes());
        stream.write_all(&out).unwrap();
        for _ in 0..16 {
            if option_reply(&mut stream) {
                return Client {
                    stream,
                    request: [0; REQUEST_HEADER_BYTES + IO_BYTES],
                    burst_replies: vec![
                        0;
                        BURST_READ_COUNT * (SIMPLE_REPLY_BYTES + LARGE_IO_BYTES)
                    ],
                    reply: vec![0; OFFSET_DATA_HEADER_BYTES + LARGE_IO_BYTES],
                    whole_blocks_request: vec![0; REQUEST_HEADER_BYTES + WHOLE_BLOCKS_BYTES],
                    next_cookie: 1,
                    structured,
                };
            }
        }
        panic!("no ACK");
    }

    fn header(&mut self, command: u16, offset_bytes: u64, length: usize) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        encode_header(&mut self.request, command, cookie, offset_bytes, length);
        cookie
    }

    fn check_reply(&self, cookie: u64) {
        assert_eq!(ok_reply_cookie(&self.reply), cookie);
    }

    /// READ of `length` bytes of data (not zeros); returns the data.
    fn read(&mut self, offset_bytes: u64, length: usize) -> &[u8] {
        let cookie = self.header(CMD_READ, offset_bytes, length);
        self.stream
            .write_all(&self.request[..REQUEST_HEADER_BYTES])
            .unwrap();
        if !self.structured {
            self.stream
                .read_exact(&mut self.reply[..SIMPLE_REPLY_BYTES + length])
                .unwrap();
            self.check_reply(cookie);
            return &self.reply[SIMPLE_REPLY_BYTES..SIMPLE_REPLY_BYTES + length];
        }
        // One OFFSET_DATA chunk, flagged DONE, with all the data.
        self.stream
            .read_exact(&mut self.reply[..OFFSET_DATA_HEADER_BYTES + length])
            .unwrap();
        let r = &self.reply;
        assert_eq!(
            u32::from_be_bytes(r[..4].try_into().unwrap()),
            STRUCTURED_REPLY_MAGIC
        );
        assert_eq!(u16::from_be_bytes(r[4..6].try_into().unwrap()), 1, "DONE");
        assert_eq!(
            u16::from_be_bytes(r[6..8].try_into().unwrap()),
            REPLY_TYPE_OFFSET_DATA
        );
        assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), cookie);
        assert_eq!(
            u32::from_be_bytes(r[16..20].try_into().unwrap()) as usize,
            8 + length
        );
        assert_eq!(
            u64::from_be_bytes(r[20..28].try_into().unwrap()),
            offset_bytes
        );
        &self.reply[OFFSET_DATA_HEADER_BYTES..OFFSET_DATA_HEADER_BYTES + length]
    }

    /// `BURST_READ_COUNT` READs of `length` bytes (at most `LARGE_IO_BYTES`) at `offset(0)`,
    /// `offset(1)`, ... sent together with simple replies; checks every reply (in any order)
    /// is all `byte`.
    fn read_burst(&mut self, offset: impl Fn(usize) -> u64, length: usize, byte: u8) {
        assert!(!self.structured);
        assert!(length <= LARGE_IO_BYTES);
        let first_cookie = self.next_cookie;
        let mut headers = [0u8; BURST_READ_COUNT * REQUEST_HEADER_BYTES];
        for (k, header) in headers.chunks_mut(REQUEST_HEADER_BYTES).enumerate() {
            encode_header(header, CMD_READ, first_cookie + k as u64, offset(k), length);
        }
        self.next_cookie += BURST_READ_COUNT as u64;
        self.stream.write_all(&headers).unwrap();
        let replies = &mut self.burst_replies[..BURST_READ_COUNT * (SIMPLE_REPLY_BYTES + length)];
        self.stream.read_exact(replies).unwrap();
        let mut answered = 0u32;
        for r in replies.chunks(SIMPLE_REPLY_BYTES + length) {
            let k = ok_reply_cookie(r) - first_cookie;
            assert!(
                k < BURST_READ_COUNT as u64 && answered & (1 << k) == 0,
                "cookie"
            );
            answered |= 1 << k;
            assert!(r[SIMPLE_REPLY_BYTES..].iter().all(|&b| b == byte), "data");
        }
    }

    /// WRITE of 4 KiB of `byte`.
    fn write(&mut self, offset_bytes: u64, byte: u8) {
        let cookie = self.header(CMD_WRITE, offset_bytes, IO_BYTES);
        self.request[REQUEST_HEADER_BYTES..].fill(byte);
        self.stream.write_all(&self.request).unwrap();
        self.stream
            .read_exact(&mut self.reply[..SIMPLE_REPLY_BYTES])
            .unwrap();
        self.check_reply(cookie);
    }

    /// WRITE of `WHOLE_BLOCKS_BYTES` of `byte` (whole blocks when `offset_bytes` is on one).
    fn write_whole_blocks(&mut self, offset_bytes: u64, byte: u8) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let request = &mut self.whole_blocks_request;
        encode_header(request, CMD_WRITE, cookie, offset_bytes, WHOLE_BLOCKS_BYTES);
        request[REQUEST_HEADER_BYTES..].fill(byte);
        self.stream.write_all(request).unwrap();
        self.stream
            .read_exact(&mut self.reply[..SIMPLE_REPLY_BYTES])
            .unwrap();
        self.check_reply(cookie);
    }
}

/// The cookie of the simple reply at the start of `r`, checked to be one without error.
fn ok_reply_cookie(r: &[u8]) -> u64 {
    assert_eq!(
        u32::from_be_bytes(r[..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 0, "error");
    u64::from_be_bytes(r[8..16].try_into().unwrap())
}

/// A request header into `out[..REQUEST_HEADER_BYTES]`.
fn encode_header(out: &mut [u8], command: u16, cookie: u64, offset_bytes: u64, len: usize) {
    let h = &mut out[..REQUEST_HEADER_BYTES];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&0u16.to_be_bytes());
    h[6..8].copy_from_slice(&command.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset_bytes.to_be_bytes());
    h[24..28].copy_from_slice(&(len as u32).to_be_bytes());
}

/// The offset of the `i`th request: 4 KiB-aligned, spread over the region in a fixed order.
fn io_offset(i: usize) -> u64 {
    let slots = REGION_BYTES / IO_BYTES as u64;
    (i as u64).wrapping_mul(0x9E37_79B9) % slots * IO_BYTES as u64
}

/// Allocations of `MEASURED_IO_COUNT` READs of `length` bytes after as many to warm up;
/// checks the data is `byte`.
fn count_read_allocations(client: &mut Client, byte: u8, length: usize) -> u64 {
    // Within the region, at offsets of 4 KiB multiples (not of the 16 KiB blocks).
    let offset = |i: usize| io_offset(i) % (REGION_BYTES - length as u64 + 1) / 4096 * 4096;
    for i in 0..WARM_UP_IO_COUNT {
        client.read(offset(i), length);
    }
    let allocations = allocations_during(|| {
        for i in WARM_UP_IO_COUNT..WARM_UP_IO_COUNT + MEASURED_IO_COUNT {
            client.read(offset(i), length);
        }
    });
    assert!(client.read(4096, length).iter().all(|&b| b == byte));
    allocations
}

/// Allocations of `MEASURED_IO_COUNT` READs of `length` bytes, `BURST_READ_COUNT` at a time,
/// after as many to warm up; checks the data is `byte` and that the replies went out
/// together: each burst's replies queue behind the first one's send (the reader starts all
/// of them before the writer runs), so a send carries several.
fn count_burst_read_allocations(client: &mut Client, byte: u8, length: usize) -> u64 {
    let burst_offset = |i: usize| io_offset(i) % (REGION_BYTES - length as u64 + 1) / 4096 * 4096;
    let bursts = MEASURED_IO_COUNT / BURST_READ_COUNT;
    for b in 0..bursts {
        client.read_burst(|k| burst_offset(b * BURST_READ_COUNT + k), length, byte);
    }
    let (replies_before, sends_before) = parts_reply_counts();
    let allocations = allocations_during(|| {
        for b in bursts..2 * bursts {
            client.read_burst(|k| burst_offset(b * BURST_READ_COUNT + k), length, byte);
        }
    });
    let (replies_after, sends_after) = parts_reply_counts();
    let (replies, sends) = (replies_after - replies_before, sends_after - sends_before);
    assert_eq!(
        replies,
        (bursts * BURST_READ_COUNT) as u64,
        "every {length}-byte READ reply sent in parts (from the cache's blocks)"
    );
    assert!(
        sends * 2 <= replies,
        "{replies} READ replies of {length} bytes in {sends} sends: not batched"
    );
    allocations
}

fn fill_region(client: &mut Client, byte: u8) {
    for k in 0..REGION_BYTES / IO_BYTES as u64 {
        client.write(k * IO_BYTES as u64, byte);
    }
}

/// All cases in one test: the allocator counts every serving thread, so nothing else may run
/// in this binary at the same time.
#[test]
fn requests_allocate_nothing_in_steady_state() {
    ROLE.with(|role| role.set(ROLE_SERVING)); // The client thread.
    let dir = tempfile::tempdir().unwrap();
    let (pool, volume) = file_pool(dir.path());
    let (server, addr) = serve(&volume);
    let mut client = Client::open(&addr, false);
    let mut structured_client = Client::open(&addr, true);

    // 1. READs of synced data.
    fill_region(&mut client, 0x5a);
    pool.sync().unwrap();
    let read_allocations = count_read_allocations(&mut client, 0x5a, IO_BYTES);
    let structured_read_allocations =
        count_read_allocations(&mut structured_client, 0x5a, IO_BYTES);
    // Large READs with the region cached (each reply holds its blocks while it is sent).
    pool.set_prop("data_cache_max", "64M").unwrap();
    let large_read_allocations = count_read_allocations(&mut client, 0x5a, LARGE_IO_BYTES);
    let large_structured_read_allocations =
        count_read_allocations(&mut structured_client, 0x5a, LARGE_IO_BYTES);
    // The same, `BURST_READ_COUNT` at a time; and bursts of READs of a block's length, whose
    // replies (16 KiB and a header) are too large to be copied into the writer's batch.
    let burst_read_allocations = count_burst_read_allocations(&mut client, 0x5a, LARGE_IO_BYTES);
    let block_burst_read_allocations =
        count_burst_read_allocations(&mut client, 0x5a, BLOCK_IO_BYTES);
    let cache = pool.counters().data_cache_stats();
    assert!(
        cache.bytes >= REGION_BYTES,
        "the region was cached: {cache:?}"
    );
    pool.set_prop("data_cache_max", "1M").unwrap();

    // 2. WRITEs to blocks dirty in the open txg (after a txg of as many writes, so that the
    // intent log's list of the txg's changes has the capacity: see the engine's test).
    fill_region(&mut client, 1);
    for i in 0..WARM_UP_IO_COUNT + MEASURED_IO_COUNT {
        client.write(io_offset(i), 0xc3);
    }
    pool.sync().unwrap();
    fill_region(&mut client, 2);
    for i in 0..WARM_UP_IO_COUNT {
        client.write(io_offset(i), 0xc3);
    }
    let overwrite_allocations = allocations_during(|| {
        for i in WARM_UP_IO_COUNT..WARM_UP_IO_COUNT + MEASURED_IO_COUNT {
            client.write(io_offset(i), 0xc3);
        }
    });

    // 3. WRITEs that each dirty a new block (read-modify-write of a synced block), a txg of
    // one per block of the region at a time, once the pools are warm.
    pool.sync().unwrap();
    let block_bytes = u64::from(volume.block_size_bytes());
    let block_count = REGION_BYTES / block_bytes;
    let mut one_txg = |round: u64| {
        for k in 0..block_count {
            let offset_bytes = k * block_bytes + (round % (block_bytes / IO_BYTES as u64)) * 4096;
            client.write(offset_bytes, round as u8);
        }
    };
    const WARM_UP_TXG_COUNT: u64 = 3;
    for round in 0..WARM_UP_TXG_COUNT {
        one_txg(round);
        pool.sync().unwrap();
    }
    let mut new_block_allocations = 0;
    let mut new_block_writes = 0;
    let mut round = WARM_UP_TXG_COUNT;
    while new_block_writes < MEASURED_IO_COUNT as u64 {
        new_block_allocations += allocations_during(|| one_txg(round));
        new_block_writes += block_count;
        pool.sync().unwrap();
        round += 1;
    }

    // 4. WRITEs of whole blocks, received straight into the buffers that become the blocks:
    // the buffers come from the I/O buffer pool, which each sync refills, and their `Arc`s
    // from the synced txg's recycled shells.
    assert_eq!(block_bytes as usize * 4, WHOLE_BLOCKS_BYTES);
    let whole_writes_per_txg = REGION_BYTES / WHOLE_BLOCKS_BYTES as u64;
    let mut whole_txg = |round: u64| {
        for k in 0..whole_writes_per_txg {
            client.write_whole_blocks(k * WHOLE_BLOCKS_BYTES as u64, 0x40 + round as u8);
        }
    };
    for round in 0..WARM_UP_TXG_COUNT {
        whole_txg(round);
        pool.sync().unwrap();
    }
    let mut whole_block_allocations = 0;
    let mut whole_block_writes = 0;
    let mut round = WARM_UP_TXG_COUNT;
    while whole_block_writes < MEASURED_IO_COUNT as u64 {
        whole_block_allocations += allocations_during(|| whole_txg(round));
        whole_block_writes += whole_writes_per_txg;
        pool.sync().unwrap();
        round += 1;
    }
    // What the last round wrote is what reads back.
    let last_byte = 0x40 + (round - 1) as u8;
    for k in 0..REGION_BYTES / IO_BYTES as u64 {
        assert!(client
            .read(k * IO_BYTES as u64, IO_BYTES)
            .iter()
            .all(|&b| b == last_byte));
    }

    assert_eq!(
        (
            read_allocations,
            structured_read_allocations,
            large_read_allocations,
            large_structured_read_allocations,
            burst_read_allocations,
            block_burst_read_allocations,
            overwrite_allocations,
            new_block_allocations,
            whole_block_allocations
        ),
        (0, 0, 0, 0, 0, 0, 0, 0, 0),
        "allocations in {MEASURED_IO_COUNT} reads (simple replies), {MEASURED_IO_COUNT} reads \
         (structured replies), as many 128 KiB reads of each, as many {BURST_READ_COUNT} at a \
         time, as many 16 KiB reads {BURST_READ_COUNT} at a time, {MEASURED_IO_COUNT} overwrites, \
         {new_block_writes} writes that dirty a new block, {whole_block_writes} writes of whole \
         blocks"
    );

    server.shutdown_handle().shutdown();
    drop(client);
    drop(structured_client);
    server.join().unwrap();
    drop(volume);
    pool.export().unwrap();
}
