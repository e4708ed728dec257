//! The range lock allocates nothing: not to take or release a lock, contended or not, nor to park
//! and wake waiters. Counted by this binary's global allocator, per thread (other tests of the
//! binary may run concurrently on other threads).

use oxpool_engine::zvol::rangelock::{LockFuture, LockMode, RangeGuard, RangeLock, RangeLockNode};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

struct CountingAllocator;

thread_local! {
    /// Allocations made by this thread while counting is on.
    static ALLOC_COUNT: Cell<u64> = const { Cell::new(0) };
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note_allocation() {
    // `try_with`: the allocator may be called while thread locals are being torn down.
    let counting = COUNTING.try_with(Cell::get).unwrap_or(false);
    if counting {
        let _ = ALLOC_COUNT.try_with(|c| c.set(c.get() + 1));
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

/// Runs `f` and returns how many allocations this thread made meanwhile.
fn allocations_during(f: impl FnOnce()) -> u64 {
    ALLOC_COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOC_COUNT.with(Cell::get)
}

const CYCLE_COUNT: usize = 10_000;
const KIB: u64 = 1024;

fn poll_once<'a>(fut: &mut LockFuture<'a>, waker: &Waker) -> Poll<RangeGuard<'a>> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}

fn uncontended_cycles(lock: &RangeLock, node: &mut Pin<&mut RangeLockNode>, offset_bytes: u64) {
    for i in 0..CYCLE_COUNT {
        let mode = if i % 2 == 0 {
            LockMode::Write
        } else {
            LockMode::Read
        };
        let mut fut = lock.lock(node.as_mut(), offset_bytes, 4 * KIB, mode);
        let Poll::Ready(guard) = poll_once(&mut fut, Waker::noop()) else {
            panic!("uncontended lock waited")
        };
        drop(guard);
        drop(fut);
        let guard = lock
            .try_lock(node.as_mut(), offset_bytes, 4 * KIB, mode)
            .unwrap();
        drop(guard);
    }
}

/// Holder, then a writer and a reader that must wait; the holder's release wakes the writer,
/// whose release wakes the reader.
fn contended_cycles(lock: &RangeLock, nodes: &mut [Pin<&mut RangeLockNode>; 3], waker: &Waker) {
    let [holder, writer, reader] = nodes;
    for _ in 0..CYCLE_COUNT {
        let held = lock
            .try_lock(holder.as_mut(), 0, 8 * KIB, LockMode::Write)
            .unwrap();
        let mut w = lock.lock(writer.as_mut(), 4 * KIB, 4 * KIB, LockMode::Write);
        let mut r = lock.lock(reader.as_mut(), 0, 8 * KIB, LockMode::Read);
        assert!(poll_once(&mut w, waker).is_pending());
        assert!(poll_once(&mut r, waker).is_pending());
        drop(held);
        let Poll::Ready(wg) = poll_once(&mut w, waker) else {
            panic!("writer not woken")
        };
        assert!(poll_once(&mut r, waker).is_pending());
        drop(wg);
        let Poll::Ready(rg) = poll_once(&mut r, waker) else {
            panic!("reader not woken")
        };
        drop(rg);
    }
}

#[test]
fn uncontended_lock_allocates_nothing() {
    let lock = RangeLock::new();
    let mut node = pin!(RangeLockNode::new());
    uncontended_cycles(&lock, &mut node, 0); // Warm-up (lazy thread-local setup, if any).
    let allocation_count = allocations_during(|| uncontended_cycles(&lock, &mut node, 0));
    assert_eq!(allocation_count, 0);
    assert_eq!(lock.held_count(), 0);
}

#[test]
fn uncontended_lock_with_1000_held_ranges_allocates_nothing() {
    let lock = RangeLock::new();
    let mut held_nodes: Vec<RangeLockNode> = (0..1000).map(|_| RangeLockNode::new()).collect();
    let mut guards = Vec::with_capacity(held_nodes.len());
    for (i, node) in held_nodes.iter_mut().enumerate() {
        // SAFETY: the Vec is not touched while its elements are borrowed, so they do not move.
        let node = unsafe { Pin::new_unchecked(node) };
        guards.push(
            lock.try_lock(node, i as u64 * (1 << 20), 4 * KIB, LockMode::Write)
                .unwrap(),
        );
    }
    let mut node = pin!(RangeLockNode::new());
    let gap_offset_bytes = 500 * (1 << 20) + 64 * KIB;
    uncontended_cycles(&lock, &mut node, gap_offset_bytes);
    let allocation_count =
        allocations_during(|| uncontended_cycles(&lock, &mut node, gap_offset_bytes));
    assert_eq!(allocation_count, 0);
    assert_eq!(lock.held_count(), 1000);
    drop(guards);
}

#[test]
fn contended_lock_with_noop_waker_allocates_nothing() {
    let lock = RangeLock::new();
    let (mut a, mut b, mut c) = (
        pin!(RangeLockNode::new()),
        pin!(RangeLockNode::new()),
        pin!(RangeLockNode::new()),
    );
    let mut nodes = [a.as_mut(), b.as_mut(), c.as_mut()];
    contended_cycles(&lock, &mut nodes, Waker::noop());
    let allocation_count =
        allocations_during(|| contended_cycles(&lock, &mut nodes, Waker::noop()));
    assert_eq!(allocation_count, 0);
    assert_eq!(lock.held_count() + lock.waiting_count(), 0);
}

/// The same with a real (reference-counted) waker: storing it clones it, waking consumes the
/// clone; neither allocates.
#[test]
fn contended_lock_with_counting_waker_allocates_nothing() {
    #[derive(Default)]
    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let lock = RangeLock::new();
    let (mut a, mut b, mut c) = (
        pin!(RangeLockNode::new()),
        pin!(RangeLockNode::new()),
        pin!(RangeLockNode::new()),
    );
    let mut nodes = [a.as_mut(), b.as_mut(), c.as_mut()];
    contended_cycles(&lock, &mut nodes, &waker);
    let allocation_count = allocations_during(|| contended_cycles(&lock, &mut nodes, &waker));
    assert_eq!(allocation_count, 0);
    assert_eq!(counter.0.load(Ordering::Relaxed), 2 * 2 * CYCLE_COUNT);
}

/// A release that makes more waiters runnable than one wake batch holds wakes them in several
/// rounds, still without allocating.
#[test]
fn mass_wake_allocates_nothing() {
    const WAITER_COUNT: usize = 40;
    const ROUND_COUNT: usize = 200;
    let lock = RangeLock::new();
    let mut holder = pin!(RangeLockNode::new());
    let mut waiter_nodes: Vec<RangeLockNode> =
        (0..WAITER_COUNT).map(|_| RangeLockNode::new()).collect();
    let mut rounds = || {
        for _ in 0..ROUND_COUNT {
            let held = lock
                .try_lock(holder.as_mut(), 0, 1 << 30, LockMode::Write)
                .unwrap();
            // Stack arrays: a Vec here would be an allocation of the test's own.
            let mut futures: [Option<LockFuture<'_>>; WAITER_COUNT] =
                [const { None }; WAITER_COUNT];
            for ((i, node), slot) in waiter_nodes.iter_mut().enumerate().zip(&mut futures) {
                // SAFETY: the Vec is never grown, so its elements never move.
                let node = unsafe { Pin::new_unchecked(node) };
                let mut fut = lock.lock(node, i as u64 * 4 * KIB, 4 * KIB, LockMode::Read);
                assert!(poll_once(&mut fut, Waker::noop()).is_pending());
                *slot = Some(fut);
            }
            drop(held);
            let mut guards: [Option<RangeGuard<'_>>; WAITER_COUNT] = [const { None }; WAITER_COUNT];
            for (slot, guard_slot) in futures.iter_mut().zip(&mut guards) {
                let fut = slot.as_mut().unwrap();
                let Poll::Ready(guard) = poll_once(fut, Waker::noop()) else {
                    panic!("waiter not granted")
                };
                *guard_slot = Some(guard);
            }
            assert_eq!(lock.held_count(), WAITER_COUNT);
        }
    };
    rounds();
    let allocation_count = allocations_during(&mut rounds);
    assert_eq!(allocation_count, 0);
    assert_eq!(lock.held_count(), 0);
}

/// The counter itself works: a Box per lock (the baseline the intrusive node replaces) is seen.
#[test]
fn counter_sees_a_boxed_node_per_lock() {
    let lock = RangeLock::new();
    let allocation_count = allocations_during(|| {
        for _ in 0..CYCLE_COUNT {
            let mut node = Box::pin(RangeLockNode::new());
            drop(
                lock.try_lock(node.as_mut(), 0, 4 * KIB, LockMode::Write)
                    .unwrap(),
            );
        }
    });
    assert_eq!(allocation_count, CYCLE_COUNT as u64);
}
