//! Microbenchmark of the range lock: uncontended enter+exit of a 4 KiB range, with the node
//! embedded in the caller (`intrusive`, what oxpool does) and with a node boxed per call
//! (`boxed`, the OpenZFS shape: same algorithm, one allocation per lock), on a lock holding 0 and
//! 1,000 other ranges. Prints one line per case:
//!
//! `range_lock <case>: <ns> ns/op, <n> allocs/op`
//!
//! ns/op is the best of several runs (the machine is shared; the minimum is the least noisy
//! estimate of the code's own cost); allocs/op is counted by this binary's global allocator.
//!
//! Run: `cargo bench -p oxpool-engine --bench rangelock`.

use oxpool_engine::zvol::rangelock::{LockMode, RangeLock, RangeLockNode};
use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

struct CountingAllocator;

static ALLOC_COUNT: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; counting is a relaxed atomic add.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOC_COUNT.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOC_COUNT.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOC_COUNT.fetch_add(1, Ordering::Relaxed);
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

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const RANGE_BYTES: u64 = 4 * KIB;
const HELD_COUNT: u64 = 1000;
const RUN_COUNT: usize = 9;

/// Enter (`lock`, first poll resolves) and exit (drop the guard) with the caller's node.
#[inline(always)]
fn enter_exit(lock: &RangeLock, node: Pin<&mut RangeLockNode>, offset_bytes: u64) {
    let mut fut = lock.lock(node, offset_bytes, RANGE_BYTES, LockMode::Write);
    let Poll::Ready(guard) = Pin::new(&mut fut).poll(&mut Context::from_waker(Waker::noop()))
    else {
        panic!("uncontended lock waited");
    };
    drop(black_box(guard));
}

/// Times `op(i)` for `op_count` iterations, best of `RUN_COUNT` runs; returns (ns/op, allocs/op).
fn measure(op_count: u64, mut op: impl FnMut(u64)) -> (f64, f64) {
    for i in 0..op_count / 10 {
        op(i); // Warm-up.
    }
    let mut best_ns_per_op = f64::INFINITY;
    let mut allocs_per_op = 0.0;
    for _ in 0..RUN_COUNT {
        let allocs_before = ALLOC_COUNT.load(Ordering::Relaxed);
        let start = Instant::now();
        for i in 0..op_count {
            op(black_box(i));
        }
        let elapsed_ns = start.elapsed().as_nanos() as f64;
        let allocs = ALLOC_COUNT.load(Ordering::Relaxed) - allocs_before;
        best_ns_per_op = best_ns_per_op.min(elapsed_ns / op_count as f64);
        allocs_per_op = allocs as f64 / op_count as f64;
    }
    (best_ns_per_op, allocs_per_op)
}

fn report(case: &str, (ns_per_op, allocs_per_op): (f64, f64)) {
    println!("range_lock {case}: {ns_per_op:.1} ns/op, {allocs_per_op} allocs/op");
}

/// An offset in the gap after held range `i % HELD_COUNT` (held ranges sit at every MiB), so
/// every enter walks a different path of the tree and never waits.
#[inline(always)]
fn gap_offset_bytes(i: u64) -> u64 {
    (i % HELD_COUNT) * MIB + 512 * KIB
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let op_count: u64 = if quick { 10_000 } else { 2_000_000 };

    let lock = RangeLock::new();
    let mut node = pin!(RangeLockNode::new());
    report(
        "intrusive/empty",
        measure(op_count, |i| enter_exit(&lock, node.as_mut(), i & 7)),
    );
    report(
        "boxed/empty",
        measure(op_count, |i| {
            let mut boxed = Box::pin(RangeLockNode::new());
            enter_exit(&lock, boxed.as_mut(), i & 7);
        }),
    );

    let mut held_nodes: Vec<RangeLockNode> =
        (0..HELD_COUNT).map(|_| RangeLockNode::new()).collect();
    let mut guards = Vec::with_capacity(held_nodes.len());
    for (i, held) in held_nodes.iter_mut().enumerate() {
        // SAFETY: the Vec is never grown, so its elements never move while pinned.
        let held = unsafe { Pin::new_unchecked(held) };
        // Readers and writers mixed, as a busy volume would hold them.
        let mode = if i % 2 == 0 {
            LockMode::Write
        } else {
            LockMode::Read
        };
        guards.push(
            lock.try_lock(held, i as u64 * MIB, RANGE_BYTES, mode)
                .unwrap(),
        );
    }
    assert_eq!(lock.held_count(), HELD_COUNT as usize);
    report(
        "intrusive/held_1000",
        measure(op_count, |i| {
            enter_exit(&lock, node.as_mut(), gap_offset_bytes(i))
        }),
    );
    report(
        "boxed/held_1000",
        measure(op_count, |i| {
            let mut boxed = Box::pin(RangeLockNode::new());
            enter_exit(&lock, boxed.as_mut(), gap_offset_bytes(i));
        }),
    );
    drop(guards);

    // For scale: the floor set by the two uncontended critical sections of an enter+exit.
    let mutex = Mutex::new(0u64);
    let (ns_per_op, _) = measure(op_count, |i| {
        *mutex.lock().unwrap() += i;
        *mutex.lock().unwrap() -= i;
    });
    println!("reference: 2 uncontended std Mutex lock+unlock pairs: {ns_per_op:.1} ns/op");
}
