//! Unit tests of the range lock, driven by hand with counting wakers (no executor), plus a
//! proptest against a model of the fairness rule.

use super::*;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Wake;

const KIB: u64 = 1024;

/// A waker that counts its wake-ups.
#[derive(Default)]
struct CountingWaker {
    wake_count: AtomicUsize,
}

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_count.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let counter = Arc::new(CountingWaker::default());
    (counter.clone(), Waker::from(counter))
}

fn poll_with<'a>(fut: &mut LockFuture<'a>, waker: &Waker) -> Poll<RangeGuard<'a>> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}

fn poll_noop<'a>(fut: &mut LockFuture<'a>) -> Poll<RangeGuard<'a>> {
    poll_with(fut, Waker::noop())
}

#[test]
fn uncontended_lock_on_empty_lock_is_granted_and_released() {
    let lock = RangeLock::new();
    let mut node = pin!(RangeLockNode::new());
    {
        let mut fut = lock.lock(node.as_mut(), 0, 4 * KIB, LockMode::Write);
        let Poll::Ready(guard) = poll_noop(&mut fut) else {
            panic!("uncontended lock waited")
        };
        assert_eq!((guard.offset_bytes(), guard.length_bytes()), (0, 4 * KIB));
        assert_eq!(guard.mode(), LockMode::Write);
        assert_eq!(lock.held_count(), 1);
        lock.check_invariants();
        drop(guard);
    }
    assert_eq!(lock.held_count(), 0);
    // The node is reusable.
    let guard = lock
        .try_lock(node.as_mut(), 8 * KIB, 4 * KIB, LockMode::Read)
        .unwrap();
    assert_eq!(lock.held_count(), 1);
    drop(guard);
    assert_eq!(lock.held_count(), 0);
    lock.check_invariants();
}

#[test]
fn overlapping_writers_exclude_each_other() {
    let lock = RangeLock::new();
    let (mut a, mut b) = (pin!(RangeLockNode::new()), pin!(RangeLockNode::new()));
    let guard_a = lock
        .try_lock(a.as_mut(), 0, 8 * KIB, LockMode::Write)
        .unwrap();
    let (counter, waker) = counting_waker();
    let mut fut_b = lock.lock(b.as_mut(), 4 * KIB, 8 * KIB, LockMode::Write);
    assert!(poll_with(&mut fut_b, &waker).is_pending());
    assert_eq!((lock.held_count(), lock.waiting_count()), (1, 1));
    lock.check_invariants();
    drop(guard_a);
    assert_eq!(counter.wake_count.load(Ordering::SeqCst), 1);
    assert_eq!((lock.held_count(), lock.waiting_count()), (1, 0));
    let Poll::Ready(guard_b) = poll_with(&mut fut_b, &waker) else {
        panic!("not granted")
    };
    lock.check_invariants();
    drop(guard_b);
    drop(fut_b);
    assert_eq!(lock.held_count(), 0);
}

#[test]
fn writer_excludes_readers_and_readers_exclude_writer() {
    let lock = RangeLock::new();
    let mut w = pin!(RangeLockNode::new());
    let mut r = pin!(RangeLockNode::new());
    let guard_w = lock.try_lock(w.as_mut(), 100, 10, LockMode::Write).unwrap();
    assert!(lock.try_lock(r.as_mut(), 105, 1, LockMode::Read).is_none());
    assert_eq!(lock.held_count(), 1);
    drop(guard_w);
    let guard_r = lock.try_lock(r.as_mut(), 105, 1, LockMode::Read).unwrap();
    assert!(lock
        .try_lock(w.as_mut(), 100, 10, LockMode::Write)
        .is_none());
    drop(guard_r);
    lock.check_invariants();
}

#[test]
fn readers_share() {
    let lock = RangeLock::new();
    let mut nodes = [const { RangeLockNode::new() }; 8];
    let mut guards = Vec::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        // SAFETY: the array is never moved while the guards borrow its elements.
        let node = unsafe { Pin::new_unchecked(node) };
        guards.push(
            lock.try_lock(node, i as u64, 100, LockMode::Read)
                .expect("readers share"),
        );
    }
    assert_eq!(lock.held_count(), 8);
    lock.check_invariants();
    drop(guards);
    assert_eq!(lock.held_count(), 0);
}

#[test]
fn disjoint_ranges_never_wait() {
    let lock = RangeLock::new();
    let (mut a, mut b, mut c) = (
        pin!(RangeLockNode::new()),
        pin!(RangeLockNode::new()),
        pin!(RangeLockNode::new()),
    );
    let _ga = lock
        .try_lock(a.as_mut(), 0, 4 * KIB, LockMode::Write)
        .unwrap();
    // Adjacent: [4 KiB, 8 KiB) does not overlap [0, 4 KiB).
    let _gb = lock
        .try_lock(b.as_mut(), 4 * KIB, 4 * KIB, LockMode::Write)
        .unwrap();
    // A waiting request does not block a disjoint one either.
    let mut fut = lock.lock(c.as_mut(), 2 * KIB, 4 * KIB, LockMode::Write);
    assert!(poll_noop(&mut fut).is_pending());
    let mut d = pin!(RangeLockNode::new());
    let _gd = lock
        .try_lock(d.as_mut(), 1 << 40, 4 * KIB, LockMode::Write)
        .unwrap();
    lock.check_invariants();
}

#[test]
fn zero_length_locks_one_byte() {
    let lock = RangeLock::new();
    let (mut a, mut b) = (pin!(RangeLockNode::new()), pin!(RangeLockNode::new()));
    let guard = lock.try_lock(a.as_mut(), 10, 0, LockMode::Write).unwrap();
    assert!(lock.try_lock(b.as_mut(), 10, 1, LockMode::Read).is_none());
    assert!(lock.try_lock(b.as_mut(), 0, 11, LockMode::Read).is_none());
    let g = lock.try_lock(b.as_mut(), 11, 0, LockMode::Write).unwrap();
    drop(g);
    let g = lock.try_lock(b.as_mut(), 0, 10, LockMode::Write).unwrap();
    drop(g);
    assert_eq!(guard.length_bytes(), 0);
    drop(guard);
}

#[test]
fn ranges_are_clamped_below_u64_max() {
    let lock = RangeLock::new();
    let (mut a, mut b) = (pin!(RangeLockNode::new()), pin!(RangeLockNode::new()));
    let guard = lock
        .try_lock(a.as_mut(), u64::MAX - 10, u64::MAX, LockMode::Write)
        .unwrap();
    assert!(lock
        .try_lock(b.as_mut(), u64::MAX, 0, LockMode::Write)
        .is_none());
    assert!(lock
        .try_lock(b.as_mut(), u64::MAX - 1, 5, LockMode::Read)
        .is_none());
    let g = lock
        .try_lock(b.as_mut(), 0, u64::MAX - 10, LockMode::Write)
        .unwrap();
    lock.check_invariants();
    drop(g);
    drop(guard);
    assert_eq!(clamp_range(u64::MAX, 0), (u64::MAX - 1, u64::MAX));
    assert_eq!(clamp_range(5, 0), (5, 6));
}

/// Wake-up order: W1 holds [0, 100); R2 [0, 100), W3 [50, 150) and R4 [10, 20) wait, in that
/// order. Releasing W1 wakes exactly R2 and R4 (W3 conflicts with the earlier R2; R4 conflicts
/// only with W1); releasing R2 wakes W3.
#[test]
fn release_wakes_exactly_the_waiters_that_can_proceed() {
    let lock = RangeLock::new();
    let mut n1 = pin!(RangeLockNode::new());
    let mut n2 = pin!(RangeLockNode::new());
    let mut n3 = pin!(RangeLockNode::new());
    let mut n4 = pin!(RangeLockNode::new());
    let (c2, k2) = counting_waker();
    let (c3, k3) = counting_waker();
    let (c4, k4) = counting_waker();
    let g1 = lock.try_lock(n1.as_mut(), 0, 100, LockMode::Write).unwrap();
    let mut f2 = lock.lock(n2.as_mut(), 0, 100, LockMode::Read);
    let mut f3 = lock.lock(n3.as_mut(), 50, 100, LockMode::Write);
    let mut f4 = lock.lock(n4.as_mut(), 10, 10, LockMode::Read);
    for (f, k) in [(&mut f2, &k2), (&mut f3, &k3), (&mut f4, &k4)] {
        assert!(poll_with(f, k).is_pending());
    }
    lock.check_invariants();
    let wakes = || [&c2, &c3, &c4].map(|c| c.wake_count.load(Ordering::SeqCst));
    drop(g1);
    assert_eq!(wakes(), [1, 0, 1]);
    let Poll::Ready(g2) = poll_with(&mut f2, &k2) else {
        panic!("R2 not granted")
    };
    let Poll::Ready(g4) = poll_with(&mut f4, &k4) else {
        panic!("R4 not granted")
    };
    assert!(poll_with(&mut f3, &k3).is_pending());
    drop(g4);
    assert_eq!(wakes(), [1, 0, 1], "R4 was not in W3's way");
    drop(g2);
    assert_eq!(wakes(), [1, 1, 1]);
    let Poll::Ready(g3) = poll_with(&mut f3, &k3) else {
        panic!("W3 not granted")
    };
    drop(g3);
    lock.check_invariants();
    assert_eq!(lock.held_count() + lock.waiting_count(), 0);
}

#[test]
fn same_range_fifo_order() {
    let lock = RangeLock::new();
    let mut n1 = pin!(RangeLockNode::new());
    let mut n2 = pin!(RangeLockNode::new());
    let mut n3 = pin!(RangeLockNode::new());
    let mut n4 = pin!(RangeLockNode::new());
    let (c2, k2) = counting_waker();
    let (c3, k3) = counting_waker();
    let (c4, k4) = counting_waker();
    let g1 = lock.try_lock(n1.as_mut(), 0, 100, LockMode::Write).unwrap();
    let mut f2 = lock.lock(n2.as_mut(), 0, 100, LockMode::Read);
    let mut f3 = lock.lock(n3.as_mut(), 0, 100, LockMode::Write);
    let mut f4 = lock.lock(n4.as_mut(), 0, 100, LockMode::Read);
    for (f, k) in [(&mut f2, &k2), (&mut f3, &k3), (&mut f4, &k4)] {
        assert!(poll_with(f, k).is_pending());
    }
    let wakes = || [&c2, &c3, &c4].map(|c| c.wake_count.load(Ordering::SeqCst));
    drop(g1);
    assert_eq!(wakes(), [1, 0, 0], "only R2 can proceed");
    let Poll::Ready(g2) = poll_with(&mut f2, &k2) else {
        panic!()
    };
    assert!(
        poll_with(&mut f4, &k4).is_pending(),
        "R4 must not pass the waiting W3"
    );
    drop(g2);
    assert_eq!(wakes(), [1, 1, 0]);
    let Poll::Ready(g3) = poll_with(&mut f3, &k3) else {
        panic!()
    };
    drop(g3);
    assert_eq!(wakes(), [1, 1, 1]);
    let Poll::Ready(g4) = poll_with(&mut f4, &k4) else {
        panic!()
    };
    drop(g4);
    lock.check_invariants();
    assert_eq!(lock.held_count() + lock.waiting_count(), 0);
}

/// No starvation of writers: with a reader holding the range and a writer waiting, new readers
/// of the range queue behind the writer, even though they could share with the holder.
#[test]
fn new_readers_do_not_pass_a_waiting_writer() {
    let lock = RangeLock::new();
    let mut r1 = pin!(RangeLockNode::new());
    let mut w = pin!(RangeLockNode::new());
    let mut r2 = pin!(RangeLockNode::new());
    let g1 = lock.try_lock(r1.as_mut(), 0, 100, LockMode::Read).unwrap();
    let (cw, kw) = counting_waker();
    let mut fw = lock.lock(w.as_mut(), 0, 100, LockMode::Write);
    assert!(poll_with(&mut fw, &kw).is_pending());
    assert!(
        lock.try_lock(r2.as_mut(), 50, 1, LockMode::Read).is_none(),
        "try_lock jumped"
    );
    let mut f2 = lock.lock(r2.as_mut(), 50, 1, LockMode::Read);
    assert!(poll_noop(&mut f2).is_pending());
    drop(g1);
    assert_eq!(cw.wake_count.load(Ordering::SeqCst), 1);
    let Poll::Ready(gw) = poll_with(&mut fw, &kw) else {
        panic!()
    };
    assert!(poll_noop(&mut f2).is_pending());
    drop(gw);
    assert!(poll_noop(&mut f2).is_ready());
}

/// No starvation of readers either: later writers do not pass a waiting reader.
#[test]
fn new_writers_do_not_pass_a_waiting_reader() {
    let lock = RangeLock::new();
    let mut w1 = pin!(RangeLockNode::new());
    let mut r = pin!(RangeLockNode::new());
    let mut w2 = pin!(RangeLockNode::new());
    let g1 = lock.try_lock(w1.as_mut(), 0, 100, LockMode::Write).unwrap();
    let mut fr = lock.lock(r.as_mut(), 0, 10, LockMode::Read);
    assert!(poll_noop(&mut fr).is_pending());
    // W2 does not overlap W1, but overlaps the earlier waiting reader.
    let mut f2 = lock.lock(w2.as_mut(), 5, 200, LockMode::Write);
    assert!(poll_noop(&mut f2).is_pending());
    drop(g1);
    let Poll::Ready(gr) = poll_noop(&mut fr) else {
        panic!()
    };
    assert!(poll_noop(&mut f2).is_pending());
    drop(gr);
    assert!(poll_noop(&mut f2).is_ready());
}

#[test]
fn reader_not_behind_disjoint_waiting_writer() {
    let lock = RangeLock::new();
    let mut w1 = pin!(RangeLockNode::new());
    let mut w2 = pin!(RangeLockNode::new());
    let mut r = pin!(RangeLockNode::new());
    let g1 = lock.try_lock(w1.as_mut(), 0, 100, LockMode::Write).unwrap();
    let mut f2 = lock.lock(w2.as_mut(), 50, 100, LockMode::Write);
    let mut fr = lock.lock(r.as_mut(), 10, 10, LockMode::Read);
    assert!(poll_noop(&mut f2).is_pending());
    assert!(poll_noop(&mut fr).is_pending());
    drop(g1);
    // Both waited only for W1 and do not conflict with each other.
    assert!(poll_noop(&mut f2).is_ready());
    assert!(poll_noop(&mut fr).is_ready());
}

#[test]
fn cancelling_a_waiter_wakes_those_waiting_only_for_it() {
    let lock = RangeLock::new();
    let mut w1 = pin!(RangeLockNode::new());
    let mut r2 = pin!(RangeLockNode::new());
    let mut w3 = pin!(RangeLockNode::new());
    let g1 = lock.try_lock(w1.as_mut(), 0, 10, LockMode::Write).unwrap();
    let mut f2 = lock.lock(r2.as_mut(), 0, 20, LockMode::Read);
    assert!(poll_noop(&mut f2).is_pending());
    let (c3, k3) = counting_waker();
    let mut f3 = lock.lock(w3.as_mut(), 15, 5, LockMode::Write);
    assert!(
        poll_with(&mut f3, &k3).is_pending(),
        "W3 queues behind the waiting R2"
    );
    drop(f2);
    assert_eq!(c3.wake_count.load(Ordering::SeqCst), 1);
    assert_eq!(lock.waiting_count(), 0);
    let Poll::Ready(g3) = poll_with(&mut f3, &k3) else {
        panic!()
    };
    lock.check_invariants();
    drop(g3);
    drop(g1);
    assert_eq!(lock.held_count(), 0);
}

#[test]
fn cancelling_a_granted_unpolled_future_releases() {
    let lock = RangeLock::new();
    let mut w1 = pin!(RangeLockNode::new());
    let mut w2 = pin!(RangeLockNode::new());
    let mut w3 = pin!(RangeLockNode::new());
    let g1 = lock.try_lock(w1.as_mut(), 0, 10, LockMode::Write).unwrap();
    let mut f2 = lock.lock(w2.as_mut(), 0, 10, LockMode::Write);
    assert!(poll_noop(&mut f2).is_pending());
    let (c3, k3) = counting_waker();
    let mut f3 = lock.lock(w3.as_mut(), 0, 10, LockMode::Write);
    assert!(poll_with(&mut f3, &k3).is_pending());
    drop(g1); // Grants W2, which is never polled again...
    assert_eq!(lock.held_count(), 1);
    drop(f2); // ...and gives up: W3 goes next.
    assert_eq!(c3.wake_count.load(Ordering::SeqCst), 1);
    assert!(poll_with(&mut f3, &k3).is_ready());
    // A future granted at arrival and never polled releases on drop too.
    let f = lock.lock(w1.as_mut(), 100, 10, LockMode::Write);
    assert_eq!(lock.held_count(), 1);
    drop(f);
    assert_eq!(lock.held_count(), 0);
}

#[test]
fn waker_is_replaced_when_the_task_changes() {
    let lock = RangeLock::new();
    let mut w1 = pin!(RangeLockNode::new());
    let mut w2 = pin!(RangeLockNode::new());
    let g1 = lock.try_lock(w1.as_mut(), 0, 10, LockMode::Write).unwrap();
    let (ca, ka) = counting_waker();
    let (cb, kb) = counting_waker();
    let mut f2 = lock.lock(w2.as_mut(), 0, 10, LockMode::Write);
    assert!(poll_with(&mut f2, &ka).is_pending());
    assert!(poll_with(&mut f2, &kb).is_pending());
    drop(g1);
    assert_eq!(ca.wake_count.load(Ordering::SeqCst), 0);
    assert_eq!(cb.wake_count.load(Ordering::SeqCst), 1);
    // Dropping the stale waker did not leak it: only our clone and the lock's are gone.
    assert_eq!(Arc::strong_count(&ca), 1 + 1);
    assert!(poll_with(&mut f2, &kb).is_ready());
}

/// More waiters than one wake batch become runnable at one release: all are woken.
#[test]
fn release_wakes_more_than_one_batch() {
    const WAITER_COUNT: usize = 3 * WAKE_BATCH_COUNT + 5;
    let lock = RangeLock::new();
    let mut w = pin!(RangeLockNode::new());
    let g = lock
        .try_lock(w.as_mut(), 0, 1 << 20, LockMode::Write)
        .unwrap();
    let mut nodes: Vec<RangeLockNode> = (0..WAITER_COUNT).map(|_| RangeLockNode::new()).collect();
    let (counter, waker) = counting_waker();
    let mut futs = Vec::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        // SAFETY: the Vec is not touched (so its elements do not move) while borrowed.
        let node = unsafe { Pin::new_unchecked(node) };
        let mut fut = lock.lock(node, i as u64 * 4 * KIB, 4 * KIB, LockMode::Read);
        assert!(poll_with(&mut fut, &waker).is_pending());
        futs.push(fut);
    }
    lock.check_invariants();
    drop(g);
    assert_eq!(counter.wake_count.load(Ordering::SeqCst), WAITER_COUNT);
    assert_eq!(lock.held_count(), WAITER_COUNT);
    lock.check_invariants();
    for fut in &mut futs {
        assert!(poll_with(fut, &waker).is_ready());
    }
    drop(futs);
    assert_eq!(lock.held_count(), 0);
}

#[test]
fn many_held_ranges_keep_the_tree_valid() {
    const HELD_COUNT: usize = 1000;
    let lock = RangeLock::new();
    let mut nodes: Vec<RangeLockNode> = (0..HELD_COUNT).map(|_| RangeLockNode::new()).collect();
    let mut guards = Vec::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        // SAFETY: the Vec's elements do not move while borrowed.
        let node = unsafe { Pin::new_unchecked(node) };
        // Interleave the insertion order so the tree sees non-monotonic keys.
        let slot = (i * 7919) % HELD_COUNT;
        let mode = if i % 3 == 0 {
            LockMode::Read
        } else {
            LockMode::Write
        };
        guards.push(
            lock.try_lock(node, slot as u64 * (1 << 20), 4 * KIB, mode)
                .unwrap(),
        );
    }
    assert_eq!(lock.held_count(), HELD_COUNT);
    lock.check_invariants();
    let mut extra = pin!(RangeLockNode::new());
    assert!(lock
        .try_lock(extra.as_mut(), 17 << 20, 1, LockMode::Write)
        .is_none());
    let g = lock.try_lock(
        extra.as_mut(),
        (17 << 20) + 4 * KIB,
        4 * KIB,
        LockMode::Write,
    );
    drop(g.expect("gap between held ranges"));
    // Release every other one, out of order.
    let mut kept = Vec::new();
    for (i, g) in guards.into_iter().enumerate() {
        if i % 2 == 0 {
            drop(g);
        } else {
            kept.push(g);
        }
    }
    lock.check_invariants();
    drop(kept);
    assert_eq!(lock.held_count(), 0);
    lock.check_invariants();
}

#[test]
fn range_lock_is_send_sync_and_futures_are_send() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RangeLock>();
    assert_send_sync::<RangeLockNode>();
    assert_send_sync::<LockFuture<'static>>();
    assert_send_sync::<RangeGuard<'static>>();
    fn assert_unpin<T: Unpin>() {}
    assert_unpin::<LockFuture<'static>>();
}

/// Concurrency smoke test on real threads (the exhaustive checks are the shuttle tests):
/// writers on overlapping ranges never overlap in time.
#[test]
fn threads_writers_exclude() {
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;
    const THREAD_COUNT: usize = 4;
    const ITERATION_COUNT: usize = 2000;
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let lock = RangeLock::new();
    let inside = [const { AtomicBool::new(false) }; 4];
    std::thread::scope(|s| {
        for t in 0..THREAD_COUNT {
            let (lock, inside) = (&lock, &inside);
            s.spawn(move || {
                let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
                let mut node = pin!(RangeLockNode::new());
                for i in 0..ITERATION_COUNT {
                    let slot = (i + t) % 3;
                    let mode = if (i + t) % 4 == 0 {
                        LockMode::Read
                    } else {
                        LockMode::Write
                    };
                    let mut fut = lock.lock(node.as_mut(), slot as u64 * 100, 150, mode);
                    let guard = loop {
                        match poll_with(&mut fut, &waker) {
                            Poll::Ready(g) => break g,
                            Poll::Pending => std::thread::park(),
                        }
                    };
                    if mode == LockMode::Write {
                        // [slot*100, slot*100+150) overlaps slots slot and slot+1.
                        for flag in &inside[slot..slot + 2] {
                            assert!(!flag.swap(true, Ordering::SeqCst), "overlap");
                        }
                        std::hint::spin_loop();
                        for flag in &inside[slot..slot + 2] {
                            flag.store(false, Ordering::SeqCst);
                        }
                    }
                    drop(guard);
                    drop(fut);
                }
            });
        }
    });
    assert_eq!(lock.held_count() + lock.waiting_count(), 0);
}

mod model {
    //! Random operations against a model of the rule "granted iff no earlier present request
    //! overlaps in a conflicting mode"; after each step every request's status, and the set of
    //! requests a release woke, must match the model exactly.
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Lock {
            slot: usize,
            offset_bytes: u64,
            length_bytes: u64,
            write: bool,
        },
        TryLock {
            slot: usize,
            offset_bytes: u64,
            length_bytes: u64,
            write: bool,
        },
        /// Drops the slot's guard, or its future (cancel) if it is not granted yet.
        Drop { slot: usize },
    }

    const SLOT_COUNT: usize = 12;

    fn op() -> impl Strategy<Value = Op> {
        let range = (0..SLOT_COUNT, 0u64..64, 0u64..24, any::<bool>());
        prop_oneof![
            4 => range.clone().prop_map(|(slot, offset_bytes, length_bytes, write)| Op::Lock {
                slot, offset_bytes, length_bytes, write
            }),
            1 => range.prop_map(|(slot, offset_bytes, length_bytes, write)| Op::TryLock {
                slot, offset_bytes, length_bytes, write
            }),
            4 => (0..SLOT_COUNT).prop_map(|slot| Op::Drop { slot }),
        ]
    }

    enum Held {
        Waiting(LockFuture<'static>, Arc<CountingWaker>, Waker),
        Granted(RangeGuard<'static>),
    }

    struct Request {
        slot: usize,
        start_bytes: u64,
        end_bytes: u64,
        write: bool,
    }

    /// The model: present requests in arrival order.
    fn model_granted(requests: &[Request], i: usize) -> bool {
        let r = &requests[i];
        requests[..i].iter().all(|e| {
            let overlap = e.start_bytes < r.end_bytes && r.start_bytes < e.end_bytes;
            !(overlap && (e.write || r.write))
        })
    }

    fn leaked_node() -> Pin<&'static mut RangeLockNode> {
        // Leaked so that futures and guards can be 'static; a few KiB per case.
        Pin::static_mut(Box::leak(Box::new(RangeLockNode::new())))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]
        #[test]
        fn matches_fifo_model(ops in proptest::collection::vec(op(), 1..80)) {
            let lock: &'static RangeLock = Box::leak(Box::new(RangeLock::new()));
            let mut slots: Vec<Option<Held>> = (0..SLOT_COUNT).map(|_| None).collect();
            let mut requests: Vec<Request> = Vec::new();
            for op in ops {
                match op {
                    Op::Lock { slot, offset_bytes, length_bytes, write } => {
                        if slots[slot].is_some() { continue; }
                        let mode = if write { LockMode::Write } else { LockMode::Read };
                        let mut fut = lock.lock(leaked_node(), offset_bytes, length_bytes, mode);
                        let (start_bytes, end_bytes) = clamp_range(offset_bytes, length_bytes);
                        requests.push(Request { slot, start_bytes, end_bytes, write });
                        let expected = model_granted(&requests, requests.len() - 1);
                        let (counter, waker) = counting_waker();
                        match poll_with(&mut fut, &waker) {
                            Poll::Ready(guard) => {
                                prop_assert!(expected, "granted against the model");
                                slots[slot] = Some(Held::Granted(guard));
                            }
                            Poll::Pending => {
                                prop_assert!(!expected, "waits against the model");
                                slots[slot] = Some(Held::Waiting(fut, counter, waker));
                            }
                        }
                        continue; // Arrivals wake no one.
                    }
                    Op::TryLock { slot, offset_bytes, length_bytes, write } => {
                        if slots[slot].is_some() { continue; }
                        let mode = if write { LockMode::Write } else { LockMode::Read };
                        let (start_bytes, end_bytes) = clamp_range(offset_bytes, length_bytes);
                        requests.push(Request { slot, start_bytes, end_bytes, write });
                        let expected = model_granted(&requests, requests.len() - 1);
                        match lock.try_lock(leaked_node(), offset_bytes, length_bytes, mode) {
                            Some(guard) => {
                                prop_assert!(expected);
                                slots[slot] = Some(Held::Granted(guard));
                            }
                            None => {
                                prop_assert!(!expected);
                                requests.pop();
                            }
                        }
                        continue;
                    }
                    Op::Drop { slot } => {
                        let Some(held) = slots[slot].take() else { continue };
                        drop(held);
                        let index = requests.iter().position(|r| r.slot == slot).unwrap();
                        requests.remove(index);
                    }
                }
                lock.check_invariants();
                // Exactly the requests that just became grantable were woken, once (every
                // waiting future was polled after the previous step, and is polled again now).
                for (i, r) in requests.iter().enumerate() {
                    let now = model_granted(&requests, i);
                    let held = slots[r.slot].take().unwrap();
                    slots[r.slot] = Some(match held {
                        Held::Granted(g) => { prop_assert!(now); Held::Granted(g) }
                        Held::Waiting(mut fut, counter, waker) => {
                            let woken = counter.wake_count.load(Ordering::SeqCst);
                            prop_assert_eq!(woken, usize::from(now), "woken iff grantable");
                            match poll_with(&mut fut, &waker) {
                                Poll::Ready(g) => { prop_assert!(now); Held::Granted(g) }
                                Poll::Pending => {
                                    prop_assert!(!now);
                                    Held::Waiting(fut, counter, waker)
                                }
                            }
                        }
                    });
                }
            }
            prop_assert_eq!(lock.held_count() + lock.waiting_count(), requests.len());
            drop(slots);
            prop_assert_eq!(lock.held_count() + lock.waiting_count(), 0);
        }
    }
}
