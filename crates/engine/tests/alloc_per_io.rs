//! No heap allocation per I/O in steady state: 4 KiB reads of synced data whose indirect blocks
//! are cached, 4 KiB overwrites of blocks already dirty in the open txg, and 4 KiB writes that
//! dirty a new block once the buffer pools are warm. On a file-backed pool (the io_uring
//! backend), single device and two-way mirror.
//!
//! Counted by this binary's global allocator on the thread that serves the I/O (this test's
//! thread: `block_on` runs the volume operation and its device I/O on the caller's ring). The
//! txg sync thread is not counted: its allocations are per txg, not per I/O, and it is not on
//! the path of a request. Counting is also off while the test itself waits for a sync.
//!
//! The tests of this binary run one at a time: the I/O buffer pool is process-wide, and
//! another test draining it would make this one allocate. `OXPOOL_ALLOC_BACKTRACE=1` prints a
//! backtrace of every counted allocation, to find one that was reintroduced.

use oxpool_engine::{Pool, PoolProps, TopSpec, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FileBackend};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

struct CountingAllocator;

thread_local! {
    /// Allocations made by this thread while counting is on.
    static ALLOC_COUNT: Cell<u64> = const { Cell::new(0) };
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

/// `OXPOOL_ALLOC_BACKTRACE` was set (read before counting starts: reading it allocates).
static PRINT_BACKTRACES: AtomicBool = AtomicBool::new(false);

fn note_allocation() {
    // `try_with`: the allocator may be called while thread locals are being torn down.
    let counting = COUNTING.try_with(Cell::get).unwrap_or(false);
    if counting {
        let _ = ALLOC_COUNT.try_with(|c| c.set(c.get() + 1));
        if PRINT_BACKTRACES.load(Ordering::Relaxed) {
            // Not counted (and not recursing): counting is off while the backtrace is taken.
            COUNTING.with(|c| c.set(false));
            eprintln!(
                "counted allocation at\n{}",
                std::backtrace::Backtrace::force_capture()
            );
            COUNTING.with(|c| c.set(true));
        }
    }
}

// SAFETY: forwards to the system allocator; the counting touches only const-initialized thread
// locals, which do not allocate.
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

/// Serialises the tests of this binary (see the module docs); also reads the environment.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    PRINT_BACKTRACES.store(
        std::env::var_os("OXPOOL_ALLOC_BACKTRACE").is_some(),
        Ordering::Relaxed,
    );
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` and returns how many allocations this thread made meanwhile.
fn allocations_during(f: impl FnOnce()) -> u64 {
    ALLOC_COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOC_COUNT.with(Cell::get)
}

const KIB: u64 = 1024;
const IO_BYTES: usize = 4 * KIB as usize;
/// Sparse; large enough that the dirty limit (at most an eighth of the pool) does not start
/// syncs on its own in the middle of a measurement.
const DEVICE_BYTES: u64 = 1 << 30;
const VOLUME_BYTES: u64 = 16 << 20;
/// The part of the volume the I/Os touch: 256 blocks of the default 16 KiB.
const REGION_BYTES: u64 = 4 << 20;
const WARM_UP_IO_COUNT: usize = 2000;
const MEASURED_IO_COUNT: usize = 2000;

/// A pool of one top-level vdev (single, or a mirror of two) over files in `dir`.
fn file_pool(dir: &std::path::Path, kind: TopVdevKind) -> Pool {
    let device_count = if kind == TopVdevKind::Mirror { 2 } else { 1 };
    let devices: Vec<Arc<dyn Backend>> = (0..device_count)
        .map(|i| {
            let path = dir.join(format!("dev{i}"));
            Arc::new(FileBackend::open(&path, Some(DEVICE_BYTES)).unwrap()) as Arc<dyn Backend>
        })
        .collect();
    let mut props = PoolProps::default();
    // Txgs end only where the test syncs.
    props.set("txg_timeout", "3600").unwrap();
    props.set("dirty_max", "256M").unwrap();
    Pool::create(
        "tank",
        vec![TopSpec {
            kind,
            devices,
            log: false,
        }],
        props,
        false,
    )
    .unwrap()
}

/// The offset of the `i`th I/O: 4 KiB-aligned, spread over the region in a fixed order.
fn io_offset(i: usize) -> u64 {
    let slots = REGION_BYTES / IO_BYTES as u64;
    (i as u64).wrapping_mul(0x9E37_79B9) % slots * IO_BYTES as u64
}

fn fill_region(vol: &Volume, seed: u8) {
    let data = vec![seed; REGION_BYTES as usize];
    block_on(vol.write(0, &data, false)).unwrap();
}

fn reads(vol: &Volume, buf: &mut [u8], first: usize, count: usize) {
    for i in first..first + count {
        block_on(vol.read(io_offset(i), buf)).unwrap();
    }
}

fn writes(vol: &Volume, data: &[u8], first: usize, count: usize) {
    for i in first..first + count {
        block_on(vol.write(io_offset(i), data, false)).unwrap();
    }
}

/// Reads of synced data with every indirect block cached; with `data_cache` off every read
/// goes to the device (read, verify, copy), with it on the warm-up fills the cache and every
/// measured read is a hit.
fn synced_reads_allocate_nothing(kind: TopVdevKind, data_cache: bool) {
    synced_reads_allocate_nothing_with(kind, data_cache, "auto");
}

fn synced_reads_allocate_nothing_with(kind: TopVdevKind, data_cache: bool, completion: &str) {
    synced_reads_allocate_nothing_compressed(kind, data_cache, completion, "lz4");
}

/// As [`synced_reads_allocate_nothing`], for a volume with `compression` (the region's
/// blocks compress: uncached reads decompress them, with buffers from the I/O buffer pool and
/// the codecs' per-thread contexts).
fn synced_reads_allocate_nothing_compressed(
    kind: TopVdevKind,
    data_cache: bool,
    completion: &str,
    compression: &str,
) {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(dir.path(), kind.clone());
    pool.set_prop("completion", completion).unwrap();
    if !data_cache {
        pool.set_prop("data_cache_max", "0").unwrap();
    }
    let vol = pool
        .create_volume(
            "v",
            VOLUME_BYTES,
            &[("compression".into(), compression.into())],
        )
        .unwrap();
    fill_region(&vol, 0x5a);
    pool.sync().unwrap();
    let stored = block_on(vol.block_pointer(0)).unwrap();
    assert_eq!(
        stored.compression.name(),
        compression.split('-').next().unwrap(),
        "{stored:?}"
    );
    let mut buf = vec![0u8; IO_BYTES];
    reads(&vol, &mut buf, 0, WARM_UP_IO_COUNT);
    let allocation_count =
        allocations_during(|| reads(&vol, &mut buf, WARM_UP_IO_COUNT, MEASURED_IO_COUNT));
    assert!(buf.iter().all(|&b| b == 0x5a), "read the wrong data");
    assert_eq!(
        allocation_count, 0,
        "{allocation_count} allocations in {MEASURED_IO_COUNT} reads ({kind:?}, data cache {data_cache})"
    );
    let hits = pool.counters().data_cache_stats().hits;
    if data_cache {
        assert!(
            hits >= MEASURED_IO_COUNT as u64,
            "the reads were not cache hits"
        );
    } else {
        assert_eq!(hits, 0, "the cache was meant to be off");
    }
    drop(vol);
    pool.export().unwrap();
}

#[test]
fn synced_reads_allocate_nothing_single() {
    synced_reads_allocate_nothing(TopVdevKind::Single, false);
}

#[test]
fn synced_reads_allocate_nothing_mirror() {
    synced_reads_allocate_nothing(TopVdevKind::Mirror, false);
}

/// Every completion policy: batching hints, completion-thread job slots and the offload
/// hand-off are all preallocated.
#[test]
fn uncached_reads_allocate_nothing_under_each_completion_policy() {
    for completion in ["inline", "worker", "batched", "auto"] {
        synced_reads_allocate_nothing_with(TopVdevKind::Single, false, completion);
    }
}

/// Reads of compressed blocks that miss the cache decompress each block (zstd here;
/// lz4 is the default of the tests above), under each completion policy.
#[test]
fn uncached_compressed_reads_allocate_nothing() {
    for completion in ["inline", "worker", "auto"] {
        for compression in ["zstd", "off"] {
            synced_reads_allocate_nothing_compressed(
                TopVdevKind::Single,
                false,
                completion,
                compression,
            );
        }
    }
}

#[test]
fn cached_reads_allocate_nothing() {
    synced_reads_allocate_nothing(TopVdevKind::Single, true);
}

/// 128 KiB reads (eight 16 KiB blocks, at offsets not aligned to them) of cached data,
/// copied (`read`) and shared (`read_shared`, its parts vector reused as the NBD server
/// reuses it): blocks found without I/O need no list and no futures of tree reads.
#[test]
fn multi_block_cached_reads_allocate_nothing() {
    const READ_BYTES: u64 = 128 * KIB;
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(dir.path(), TopVdevKind::Single);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    fill_region(&vol, 0x5a);
    pool.sync().unwrap();
    let offset = |i: usize| (i as u64).wrapping_mul(0x9E37_79B9) % (REGION_BYTES - READ_BYTES);
    let mut buf = vec![0u8; READ_BYTES as usize];
    let mut parts = Vec::new();
    let read_both = |buf: &mut [u8], parts: &mut Vec<_>, i: usize| {
        block_on(vol.read(offset(i), buf)).unwrap();
        block_on(vol.read_shared(offset(i), buf, parts)).unwrap();
    };
    for i in 0..WARM_UP_IO_COUNT {
        read_both(&mut buf, &mut parts, i);
    }
    let allocation_count = allocations_during(|| {
        for i in WARM_UP_IO_COUNT..WARM_UP_IO_COUNT + MEASURED_IO_COUNT {
            read_both(&mut buf, &mut parts, i);
        }
    });
    assert!(buf.iter().all(|&b| b == 0x5a), "read the wrong data");
    assert!(
        parts.len() >= 8
            && parts
                .iter()
                .all(|p| matches!(p, oxpool_engine::ReadPart::Shared { .. })),
        "the blocks were shared: {parts:?}"
    );
    assert_eq!(
        allocation_count, 0,
        "{allocation_count} allocations in {MEASURED_IO_COUNT} pairs of 128 KiB reads"
    );
    drop(parts);
    drop(vol);
    pool.export().unwrap();
}

/// 128 KiB reads from the devices (the data cache off; offsets 4 KiB-aligned, so most span
/// nine 16 KiB blocks and use parts of two): each is one run read of blocks written side by
/// side, verified block by block, copied (`read`) or handed over (`read_shared`). Its lists
/// (the blocks missed, the run's buffers, their verdicts) are lent by the thread's stashes,
/// the verifications started before any is waited for: no allocation per read (there were
/// 36 before the stashes: malloc and free were 4 % of the server's samples in the 128K cell
/// of `bench/async_latency.sh`). Under each completion policy: `worker` hands every
/// verification of the run to the completion threads.
#[test]
fn multi_block_uncached_reads_allocate_nothing() {
    for completion in ["inline", "worker", "auto"] {
        for kind in [TopVdevKind::Single, TopVdevKind::Mirror] {
            multi_block_uncached_reads_allocate_nothing_on(kind, completion);
        }
    }
}

fn multi_block_uncached_reads_allocate_nothing_on(kind: TopVdevKind, completion: &str) {
    const READ_BYTES: u64 = 128 * KIB;
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(dir.path(), kind.clone());
    pool.set_prop("data_cache_max", "0").unwrap();
    pool.set_prop("completion", completion).unwrap();
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    // Each 4 KiB of the region starts with its own offset, so a block read from the wrong
    // place, or put in the wrong part of the output, shows.
    let mut data = vec![0x5au8; REGION_BYTES as usize];
    for (i, piece) in data.chunks_mut(IO_BYTES).enumerate() {
        piece[..8].copy_from_slice(&(i as u64 * IO_BYTES as u64).to_le_bytes());
    }
    block_on(vol.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    let offset = |i: usize| {
        (i as u64).wrapping_mul(0x9E37_79B9) % (REGION_BYTES - READ_BYTES) / IO_BYTES as u64
            * IO_BYTES as u64
    };
    let mut buf = vec![0u8; READ_BYTES as usize];
    let mut parts = Vec::new();
    let read_both = |buf: &mut [u8], parts: &mut Vec<_>, i: usize| {
        let at = offset(i);
        let want = &data[at as usize..(at + READ_BYTES) as usize];
        block_on(vol.read(at, buf)).unwrap();
        assert!(buf == want, "read at {at} gave the wrong bytes");
        buf.fill(0);
        block_on(vol.read_shared(at, buf, parts)).unwrap();
        assert!(
            parts
                .iter()
                .any(|p| matches!(p, oxpool_engine::ReadPart::Owned { .. })),
            "whole blocks from the devices are handed over: {parts:?}"
        );
        // The parts, in order, are the bytes asked for.
        let mut covered = 0;
        for part in parts.iter() {
            assert_eq!(
                part.output_start(),
                covered,
                "parts in output order, no gap"
            );
            assert!(
                part.bytes(buf) == &want[covered..covered + part.len()],
                "read_shared at {at}: the part at {covered} has the wrong bytes"
            );
            covered += part.len();
        }
        assert_eq!(covered, READ_BYTES as usize);
    };
    for i in 0..WARM_UP_IO_COUNT {
        read_both(&mut buf, &mut parts, i);
    }
    let offloaded = || oxpool_io::completion::COMPLETIONS.snapshot().offloaded;
    let offloaded_before = offloaded();
    let reads_before = pool.counters().data_cache_stats().misses;
    let allocation_count = allocations_during(|| {
        for i in WARM_UP_IO_COUNT..WARM_UP_IO_COUNT + MEASURED_IO_COUNT {
            read_both(&mut buf, &mut parts, i);
        }
    });
    let misses = pool.counters().data_cache_stats().misses - reads_before;
    assert!(
        misses >= 2 * 8 * MEASURED_IO_COUNT as u64,
        "every block came from the devices ({misses} misses)"
    );
    if completion == "worker" {
        let handed = offloaded() - offloaded_before;
        assert!(
            handed >= misses,
            "every verification was handed to a completion thread ({handed} of {misses})"
        );
    }
    assert_eq!(
        allocation_count, 0,
        "{allocation_count} allocations in {MEASURED_IO_COUNT} pairs of 128 KiB reads from the \
         devices ({kind:?}, completion {completion})"
    );
    drop(parts);
    drop(vol);
    pool.export().unwrap();
}

/// Overwrites of blocks already dirty in the open txg.
///
/// Warm-up includes one sync: each write appends one record to the intent log's list of the
/// txg's changes, which keeps its capacity when a sync empties it. A txg of as many writes as
/// the previous one then appends without growing it (amortised per txg, not per I/O).
#[test]
fn overwrites_of_dirty_blocks_allocate_nothing() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(dir.path(), TopVdevKind::Single);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    let data = vec![0xc3u8; IO_BYTES];
    fill_region(&vol, 1);
    writes(&vol, &data, 0, WARM_UP_IO_COUNT + MEASURED_IO_COUNT);
    pool.sync().unwrap();
    // Every block of the region dirty again in the open txg; then overwrites only.
    fill_region(&vol, 2);
    writes(&vol, &data, 0, WARM_UP_IO_COUNT);
    let allocation_count =
        allocations_during(|| writes(&vol, &data, WARM_UP_IO_COUNT, MEASURED_IO_COUNT));
    assert_eq!(
        allocation_count, 0,
        "{allocation_count} allocations in {MEASURED_IO_COUNT} overwrites"
    );
    let mut back = vec![0u8; IO_BYTES];
    block_on(vol.read(io_offset(WARM_UP_IO_COUNT), &mut back)).unwrap();
    assert_eq!(back, data);
    drop(vol);
    pool.export().unwrap();
}

/// 4 KiB writes that each make a new block dirty (a read-modify-write of a synced 16 KiB
/// block), once the I/O buffer pool and the volume's spare dirty blocks are warm: one write
/// per block of the region per txg, a sync between txgs (not counted).
#[test]
fn writes_that_dirty_a_new_block_allocate_nothing_when_warm() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(dir.path(), TopVdevKind::Single);
    // A cache smaller than the region, so it is in its steady state (each block kept evicts
    // an older one, whose buffer goes back to the I/O buffer pool) from the start, as a
    // long-running server's is once the cache is full.
    pool.set_prop("data_cache_max", "1M").unwrap();
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    let block_bytes = u64::from(vol.block_size_bytes());
    let block_count = (REGION_BYTES / block_bytes) as usize;
    let data = vec![0x3cu8; IO_BYTES];
    fill_region(&vol, 3);
    pool.sync().unwrap();
    let one_txg = |round: u64| {
        for k in 0..block_count as u64 {
            // A different 4 KiB of each block every round.
            let offset_bytes = k * block_bytes + (round % (block_bytes / IO_BYTES as u64)) * 4096;
            block_on(vol.write(offset_bytes, &data, false)).unwrap();
        }
    };
    const WARM_UP_TXG_COUNT: u64 = 3;
    for round in 0..WARM_UP_TXG_COUNT {
        one_txg(round);
        pool.sync().unwrap();
    }
    let mut allocation_count = 0;
    let mut measured_count = 0;
    let mut round = WARM_UP_TXG_COUNT;
    while measured_count < MEASURED_IO_COUNT {
        allocation_count += allocations_during(|| one_txg(round));
        measured_count += block_count;
        pool.sync().unwrap();
        round += 1;
    }
    assert_eq!(
        allocation_count, 0,
        "{allocation_count} allocations in {measured_count} writes that dirty a new block"
    );
    drop(vol);
    pool.export().unwrap();
}

/// The counter itself works: an allocation reintroduced on the path is seen.
#[test]
fn counter_sees_an_allocation_per_read() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let pool = file_pool(dir.path(), TopVdevKind::Single);
    let vol = pool.create_volume("v", VOLUME_BYTES, &[]).unwrap();
    fill_region(&vol, 4);
    pool.sync().unwrap();
    let mut buf = vec![0u8; IO_BYTES];
    reads(&vol, &mut buf, 0, WARM_UP_IO_COUNT);
    let allocation_count = allocations_during(|| {
        for i in 0..MEASURED_IO_COUNT {
            let mut scratch = vec![0u8; IO_BYTES];
            block_on(vol.read(io_offset(i), &mut scratch)).unwrap();
        }
    });
    assert_eq!(allocation_count, MEASURED_IO_COUNT as u64);
    drop(vol);
    pool.export().unwrap();
}
