//! Concurrency tests of the range lock under shuttle.
//!
//! Built with `--features shuttle`, every critical section of the lock is a shuttle scheduling
//! point (its std mutex is paired with a shuttle mutex), and each shuttle thread drives lock
//! futures with shuttle's `block_on`, which parks the thread until the future's waker is called:
//! a lost wake-up shows up as a deadlock that shuttle reports.
//!
//! - `*_dfs` tests explore every interleaving (`check_dfs` with no bound). To keep that
//!   exhaustive, each has two threads; where a case needs more parties (a holder, a waiting
//!   writer, a later reader), the main thread sets up the holders and the arrivals before
//!   spawning (a request takes its place in line when `lock` is called), and the threads then
//!   race the releases, the waits and the cancellations.
//! - `*_random` tests run bigger cases (3 to 5 threads, several locks each) under the random
//!   and PCT schedulers.
//!
//! Run: `cargo test -p oxpool-engine --features shuttle --test rangelock_shuttle`.

#![cfg(feature = "shuttle")]

use oxpool_engine::zvol::rangelock::{LockFuture, LockMode, RangeGuard, RangeLock, RangeLockNode};
use shuttle::future::block_on;
use shuttle::sync::atomic::{AtomicBool, Ordering};
use shuttle::sync::{Barrier, Mutex};
use shuttle::thread;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Waker};

use LockMode::{Read, Write};

/// One lock request: bytes [offset, offset + length) in a mode.
#[derive(Clone, Copy, Debug)]
struct Req {
    offset_bytes: u64,
    length_bytes: u64,
    mode: LockMode,
}

const fn req(offset_bytes: u64, length_bytes: u64, mode: LockMode) -> Req {
    Req {
        offset_bytes,
        length_bytes,
        mode,
    }
}

impl Req {
    fn conflicts(&self, other: &Req) -> bool {
        let overlap = self.offset_bytes < other.offset_bytes + other.length_bytes.max(1)
            && other.offset_bytes < self.offset_bytes + self.length_bytes.max(1);
        overlap && (self.mode == Write || other.mode == Write)
    }
}

/// The ranges held right now, by holder; entering asserts mutual exclusion. A std mutex: it is
/// never held across a scheduling point, and not being one keeps the search space small.
#[derive(Default)]
struct Occupancy {
    held: std::sync::Mutex<Vec<(usize, Req)>>,
}

impl Occupancy {
    fn enter(&self, who: usize, r: Req) {
        let mut held = self.held.lock().unwrap();
        for (other, o) in held.iter() {
            assert!(!r.conflicts(o), "{who} got {r:?} while {other} holds {o:?}");
        }
        held.push((who, r));
    }

    fn exit(&self, who: usize) {
        let mut held = self.held.lock().unwrap();
        let i = held
            .iter()
            .position(|(w, _)| *w == who)
            .expect("was inside");
        held.swap_remove(i);
    }
}

/// Runs each thread's requests in order (lock, check exclusion, release). Every thread
/// finishing is the no-lost-wake-up check.
fn run_threads(plan: &'static [&'static [Req]]) {
    let lock = Arc::new(RangeLock::new());
    let occupancy = Arc::new(Occupancy::default());
    let handles: Vec<_> = plan
        .iter()
        .enumerate()
        .map(|(who, reqs)| {
            let (lock, occupancy) = (lock.clone(), occupancy.clone());
            thread::spawn(move || {
                let mut node = pin!(RangeLockNode::new());
                for r in reqs.iter() {
                    let guard =
                        block_on(lock.lock(node.as_mut(), r.offset_bytes, r.length_bytes, r.mode));
                    occupancy.enter(who, *r);
                    // No yield needed here: taking the lock's mutex to release is itself a
                    // scheduling point at which other threads run while this one still holds.
                    occupancy.exit(who);
                    drop(guard);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(lock.held_count(), 0);
    assert_eq!(lock.waiting_count(), 0);
}

/// A lock and nodes that live for the whole execution, so that guards and futures set up by the
/// main thread can be handed to spawned threads (leaked: a few hundred bytes per execution).
fn leaked_lock() -> &'static RangeLock {
    Box::leak(Box::new(RangeLock::new()))
}

fn leaked_node() -> Pin<&'static mut RangeLockNode> {
    Pin::static_mut(Box::leak(Box::new(RangeLockNode::new())))
}

fn try_lock_static(lock: &'static RangeLock, r: Req) -> Option<RangeGuard<'static>> {
    lock.try_lock(leaked_node(), r.offset_bytes, r.length_bytes, r.mode)
}

fn lock_static(lock: &'static RangeLock, r: Req) -> LockFuture<'static> {
    lock.lock(leaked_node(), r.offset_bytes, r.length_bytes, r.mode)
}

// ---- exhaustive -------------------------------------------------------------------------------

#[test]
fn overlapping_writers_exclude_dfs() {
    const PLAN: &[&[Req]] = &[&[req(0, 10, Write)], &[req(5, 10, Write)]];
    shuttle::check_dfs(|| run_threads(PLAN), None);
}

#[test]
fn writer_and_reader_exclude_dfs() {
    const PLAN: &[&[Req]] = &[&[req(0, 10, Write)], &[req(9, 0, Read)]];
    shuttle::check_dfs(|| run_threads(PLAN), None);
}

#[test]
fn disjoint_writers_and_repeated_locks_dfs() {
    const PLAN: &[&[Req]] = &[&[req(0, 8, Write), req(4, 8, Read)], &[req(8, 0, Write)]];
    shuttle::check_dfs(|| run_threads(PLAN), None);
}

/// Readers share: two readers of overlapping ranges each wait, while holding, until the other
/// holds too. If the second reader were refused, the first would wait forever: a deadlock
/// shuttle reports.
#[test]
fn readers_share_dfs() {
    shuttle::check_dfs(
        || {
            let lock = Arc::new(RangeLock::new());
            let both_inside = Arc::new(Barrier::new(2));
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (lock, both_inside) = (lock.clone(), both_inside.clone());
                    thread::spawn(move || {
                        let mut node = pin!(RangeLockNode::new());
                        let guard = block_on(lock.lock(node.as_mut(), i * 3, 10, Read));
                        both_inside.wait();
                        drop(guard);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        },
        None,
    );
}

/// No lost wake-ups when several waiters are released at once and race their polls with the
/// releaser: a writer held by the main thread; a reader and a disjoint writer wait on it.
#[test]
fn release_wakes_all_runnable_waiters_dfs() {
    shuttle::check_dfs(
        || {
            let lock = leaked_lock();
            let holder = try_lock_static(lock, req(0, 100, Write)).unwrap();
            let reader = lock_static(lock, req(10, 10, Read));
            let writer = lock_static(lock, req(50, 10, Write));
            let t1 = thread::spawn(move || {
                drop(holder);
                drop(block_on(reader));
            });
            let t2 = thread::spawn(move || drop(block_on(writer)));
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(lock.held_count() + lock.waiting_count(), 0);
        },
        None,
    );
}

/// Fairness, writer side: holder R0 [0,100); writer W [10,20) arrives; then reader R [15,30)
/// arrives (it could share with R0, but W is ahead of it). In every interleaving of R0's release
/// and the two waits, R is granted only after W released.
#[test]
fn later_reader_does_not_pass_waiting_writer_dfs() {
    shuttle::check_dfs(
        || {
            let lock = leaked_lock();
            let released = Arc::new(AtomicBool::new(false));
            let holder = try_lock_static(lock, req(0, 100, Read)).unwrap();
            let writer = lock_static(lock, req(10, 10, Write));
            let reader = lock_static(lock, req(15, 15, Read));
            let t1 = {
                let released = released.clone();
                thread::spawn(move || {
                    drop(holder);
                    let guard = block_on(writer);
                    released.store(true, Ordering::SeqCst);
                    drop(guard);
                })
            };
            let t2 = thread::spawn(move || {
                let guard = block_on(reader);
                assert!(
                    released.load(Ordering::SeqCst),
                    "the later reader passed the writer"
                );
                drop(guard);
            });
            t1.join().unwrap();
            t2.join().unwrap();
        },
        None,
    );
}

/// Fairness, reader side: holder W0 [0,100); reader R [10,20) arrives; then writer W [15,35)
/// arrives. W is granted only after R released.
#[test]
fn later_writer_does_not_pass_waiting_reader_dfs() {
    shuttle::check_dfs(
        || {
            let lock = leaked_lock();
            let released = Arc::new(AtomicBool::new(false));
            let holder = try_lock_static(lock, req(0, 100, Write)).unwrap();
            let reader = lock_static(lock, req(10, 10, Read));
            let writer = lock_static(lock, req(15, 20, Write));
            let t1 = {
                let released = released.clone();
                thread::spawn(move || {
                    drop(holder);
                    let guard = block_on(reader);
                    released.store(true, Ordering::SeqCst);
                    drop(guard);
                })
            };
            let t2 = thread::spawn(move || {
                let guard = block_on(writer);
                assert!(
                    released.load(Ordering::SeqCst),
                    "the later writer passed the reader"
                );
                drop(guard);
            });
            t1.join().unwrap();
            t2.join().unwrap();
        },
        None,
    );
}

/// Wake-up order: holder W0; writers W1 then W2 queue on the same range; W1 is granted first in
/// every interleaving.
#[test]
fn fifo_grant_order_dfs() {
    shuttle::check_dfs(
        || {
            let lock = leaked_lock();
            let grants = Arc::new(Mutex::new(Vec::new()));
            let holder = try_lock_static(lock, req(0, 100, Write)).unwrap();
            let first = lock_static(lock, req(0, 100, Write));
            let second = lock_static(lock, req(50, 100, Write));
            let t1 = {
                let grants = grants.clone();
                thread::spawn(move || {
                    drop(holder);
                    let guard = block_on(first);
                    grants.lock().unwrap().push(1);
                    drop(guard);
                })
            };
            let t2 = {
                let grants = grants.clone();
                thread::spawn(move || {
                    let guard = block_on(second);
                    grants.lock().unwrap().push(2);
                    drop(guard);
                })
            };
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(*grants.lock().unwrap(), vec![1, 2]);
        },
        None,
    );
}

/// Cancellation: holder W0 [0,10); X = writer [0,10) waits; Y = reader [5,10) waits behind both.
/// X is polled once and dropped while W0 is released concurrently: Y is granted in every
/// interleaving (its last blocker may be the cancelled X).
#[test]
fn cancel_while_waiting_dfs() {
    shuttle::check_dfs(
        || {
            let lock = leaked_lock();
            let holder = try_lock_static(lock, req(0, 10, Write)).unwrap();
            let mut cancelled = lock_static(lock, req(0, 10, Write));
            let waiter = lock_static(lock, req(5, 5, Read));
            let t1 = thread::spawn(move || {
                let _ = Pin::new(&mut cancelled).poll(&mut Context::from_waker(Waker::noop()));
                drop(cancelled);
            });
            let t2 = thread::spawn(move || {
                drop(holder);
                drop(block_on(waiter));
            });
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(lock.held_count() + lock.waiting_count(), 0);
        },
        None,
    );
}

// ---- random and PCT ----------------------------------------------------------------------------

#[test]
fn three_threads_random() {
    const PLAN: &[&[Req]] = &[
        &[req(0, 10, Write)],
        &[req(5, 10, Read)],
        &[req(12, 8, Write)],
    ];
    shuttle::check_random(|| run_threads(PLAN), 5000);
    shuttle::check_pct(|| run_threads(PLAN), 5000, 3);
}

#[test]
fn mixed_random() {
    const PLAN: &[&[Req]] = &[
        &[req(0, 64, Write), req(32, 32, Read), req(100, 1, Write)],
        &[req(16, 16, Read), req(0, 0, Write), req(60, 50, Write)],
        &[req(40, 30, Write), req(0, 128, Read), req(64, 64, Read)],
        &[req(90, 20, Read), req(10, 10, Write), req(0, 200, Write)],
    ];
    shuttle::check_random(|| run_threads(PLAN), 5000);
    shuttle::check_pct(|| run_threads(PLAN), 5000, 3);
}

/// Fairness with a stream of readers: a reader that arrives after the writer has arrived (it saw
/// the writer's `arrived` flag before calling `lock`) is granted only after the writer released,
/// however many readers keep the range busy. A reader holds the range first, so the writer
/// really waits.
fn readers_stream_does_not_pass_writer(reader_count: usize, rounds: usize) {
    let lock = Arc::new(RangeLock::new());
    let arrived = Arc::new(AtomicBool::new(false));
    let released = Arc::new(AtomicBool::new(false));
    let mut first = pin!(RangeLockNode::new());
    let first_guard = lock.try_lock(first.as_mut(), 0, 100, Read).unwrap();
    let writer = {
        let (lock, arrived, released) = (lock.clone(), arrived.clone(), released.clone());
        thread::spawn(move || {
            let mut node = pin!(RangeLockNode::new());
            let fut = lock.lock(node.as_mut(), 10, 10, Write);
            arrived.store(true, Ordering::SeqCst);
            let guard = block_on(fut);
            released.store(true, Ordering::SeqCst);
            drop(guard);
        })
    };
    let readers: Vec<_> = (0..reader_count)
        .map(|i| {
            let (lock, arrived, released) = (lock.clone(), arrived.clone(), released.clone());
            thread::spawn(move || {
                let mut node = pin!(RangeLockNode::new());
                for _ in 0..rounds {
                    let after_writer = arrived.load(Ordering::SeqCst);
                    let guard = block_on(lock.lock(node.as_mut(), i as u64 * 5, 20, Read));
                    if after_writer {
                        assert!(
                            released.load(Ordering::SeqCst),
                            "a later reader passed the writer"
                        );
                    }
                    drop(guard);
                }
            })
        })
        .collect();
    thread::yield_now();
    drop(first_guard);
    writer.join().unwrap();
    for h in readers {
        h.join().unwrap();
    }
}

#[test]
fn readers_stream_does_not_pass_writer_random() {
    shuttle::check_random(|| readers_stream_does_not_pass_writer(3, 4), 5000);
    shuttle::check_pct(|| readers_stream_does_not_pass_writer(3, 4), 5000, 3);
}

/// The same for a waiting reader and a stream of writers.
fn writers_stream_does_not_pass_reader(writer_count: usize, rounds: usize) {
    let lock = Arc::new(RangeLock::new());
    let arrived = Arc::new(AtomicBool::new(false));
    let released = Arc::new(AtomicBool::new(false));
    let mut first = pin!(RangeLockNode::new());
    let first_guard = lock.try_lock(first.as_mut(), 0, 100, Write).unwrap();
    let reader = {
        let (lock, arrived, released) = (lock.clone(), arrived.clone(), released.clone());
        thread::spawn(move || {
            let mut node = pin!(RangeLockNode::new());
            let fut = lock.lock(node.as_mut(), 10, 10, Read);
            arrived.store(true, Ordering::SeqCst);
            let guard = block_on(fut);
            released.store(true, Ordering::SeqCst);
            drop(guard);
        })
    };
    let writers: Vec<_> = (0..writer_count)
        .map(|i| {
            let (lock, arrived, released) = (lock.clone(), arrived.clone(), released.clone());
            thread::spawn(move || {
                let mut node = pin!(RangeLockNode::new());
                for _ in 0..rounds {
                    let after_reader = arrived.load(Ordering::SeqCst);
                    let guard = block_on(lock.lock(node.as_mut(), 15 + i as u64, 20, Write));
                    if after_reader {
                        assert!(
                            released.load(Ordering::SeqCst),
                            "a later writer passed the reader"
                        );
                    }
                    drop(guard);
                }
            })
        })
        .collect();
    thread::yield_now();
    drop(first_guard);
    reader.join().unwrap();
    for h in writers {
        h.join().unwrap();
    }
}

#[test]
fn writers_stream_does_not_pass_reader_random() {
    shuttle::check_random(|| writers_stream_does_not_pass_reader(3, 4), 5000);
    shuttle::check_pct(|| writers_stream_does_not_pass_reader(3, 4), 5000, 3);
}

/// Wake-up order with more waiters, each arriving in its own thread: the arrival order is fixed
/// by a ticket taken under a shuttle mutex together with the `lock` call.
fn fifo_grant_order_threads(waiter_count: u64) {
    let lock = Arc::new(RangeLock::new());
    let tickets = Arc::new(Mutex::new(0usize));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut first = pin!(RangeLockNode::new());
    let first_guard = lock.try_lock(first.as_mut(), 0, 100, Write).unwrap();
    let handles: Vec<_> = (0..waiter_count)
        .map(|i| {
            let (lock, tickets, grants) = (lock.clone(), tickets.clone(), grants.clone());
            thread::spawn(move || {
                let mut node = pin!(RangeLockNode::new());
                let (ticket, fut) = {
                    let mut next = tickets.lock().unwrap();
                    let fut = lock.lock(node.as_mut(), i * 10, 50, Write);
                    *next += 1;
                    (*next, fut)
                };
                let guard = block_on(fut);
                grants.lock().unwrap().push(ticket);
                drop(guard);
            })
        })
        .collect();
    drop(first_guard);
    for h in handles {
        h.join().unwrap();
    }
    let expected: Vec<usize> = (1..=waiter_count as usize).collect();
    assert_eq!(*grants.lock().unwrap(), expected);
}

#[test]
fn fifo_grant_order_random() {
    shuttle::check_random(|| fifo_grant_order_threads(4), 5000);
    shuttle::check_pct(|| fifo_grant_order_threads(4), 5000, 3);
}

/// Cancellation under load: threads that give up on their request after one poll, mixed with
/// threads that wait; everybody who waits finishes.
#[test]
fn cancel_random() {
    fn body() {
        let lock = Arc::new(RangeLock::new());
        let handles: Vec<_> = (0..4u64)
            .map(|i| {
                let lock = lock.clone();
                thread::spawn(move || {
                    let mut node = pin!(RangeLockNode::new());
                    for round in 0..2u64 {
                        let mode = if (i + round) % 2 == 0 { Write } else { Read };
                        let mut fut = lock.lock(node.as_mut(), i * 4, 10, mode);
                        if i == 0 {
                            let _ =
                                Pin::new(&mut fut).poll(&mut Context::from_waker(Waker::noop()));
                            drop(fut);
                        } else {
                            drop(block_on(fut));
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(lock.held_count() + lock.waiting_count(), 0);
    }
    shuttle::check_random(body, 5000);
    shuttle::check_pct(body, 5000, 3);
}
