//! The ring driver and executors: dropped futures, cross-thread wakes, many tasks, nesting.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use oxpool_io::rt::{
    block_on, join_all, join_all_bounded, ops_in_flight, sleep, spawn_local, LocalExecutor,
};
use oxpool_io::{Backend, FileBackend, IoBuf};

/// Polls `fut` exactly once (submitting its I/O) and resolves to whether it was ready.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *fut).poll(cx).is_ready())).await
}

/// Turns the ring until every orphaned op has completed (bounded).
async fn drain_orphans() {
    for _ in 0..10_000 {
        if ops_in_flight() == 0 {
            return;
        }
        sleep(Duration::from_millis(1)).await;
    }
    panic!("orphaned ops never completed: {}", ops_in_flight());
}

fn disk_device(dir: &tempfile::TempDir, size_bytes: u64) -> FileBackend {
    FileBackend::open(&dir.path().join("dev"), Some(size_bytes)).unwrap()
}

#[test]
fn dropped_in_flight_read_is_safe() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dev = disk_device(&dir, 16 << 20);
    block_on(dev.write(0, IoBuf::from_slice(&vec![0xabu8; 16 << 20]))).unwrap();
    block_on(async {
        for round in 0..20 {
            // Large reads, polled once (queued in the SQ), then dropped before completion.
            let mut futs: Vec<_> = (0..8)
                .map(|i| dev.read(i * (2 << 20), IoBuf::zeroed(2 << 20)))
                .collect();
            for fut in &mut futs {
                assert!(!poll_once(fut).await);
            }
            assert!(ops_in_flight() >= 8, "round {round}");
            drop(futs);
            // Reuse memory right away: the kernel must not write into it.
            let junk: Vec<Vec<u8>> = (0..16).map(|_| vec![0x11u8; 1 << 20]).collect();
            drain_orphans().await;
            assert!(junk.iter().all(|v| v.iter().all(|&b| b == 0x11)));
        }
        // The slots are reusable and data is intact.
        let back = dev.read(4096, IoBuf::zeroed(4096)).await.unwrap();
        assert!(back.iter().all(|&b| b == 0xab));
    });
    assert_eq!(ops_in_flight(), 0);
}

#[test]
fn dropped_sleep_is_cancelled() {
    block_on(async {
        let mut long = Box::pin(sleep(Duration::from_secs(3600)));
        assert!(!poll_once(&mut long).await);
        // Let it reach the kernel.
        sleep(Duration::from_millis(1)).await;
        assert_eq!(ops_in_flight(), 1);
        drop(long);
        drain_orphans().await;
    });
}

/// A future that hands its waker to a channel on first poll and is ready on the next poll.
struct RemoteWoken {
    tx: Option<mpsc::Sender<Waker>>,
}

impl Future for RemoteWoken {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.tx.take() {
            Some(tx) => {
                tx.send(cx.waker().clone()).unwrap();
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }
}

fn wake_from_other_thread_after(
    rx: mpsc::Receiver<Waker>,
    delay: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let waker = rx.recv().unwrap();
        std::thread::sleep(delay);
        waker.wake();
    })
}

#[test]
fn cross_thread_wake_interrupts_block_on() {
    for _ in 0..5 {
        let (tx, rx) = mpsc::channel();
        let waker_thread = wake_from_other_thread_after(rx, Duration::from_millis(50));
        // Nothing is in flight on the ring: only the doorbell can end the wait.
        block_on(RemoteWoken { tx: Some(tx) });
        waker_thread.join().unwrap();
    }
}

#[test]
fn cross_thread_wake_interrupts_local_executor() {
    let exec = LocalExecutor::new();
    let done = Rc::new(Cell::new(false));
    let (tx, rx) = mpsc::channel();
    let waker_thread = wake_from_other_thread_after(rx, Duration::from_millis(50));
    let flag = done.clone();
    exec.spawn(async move {
        RemoteWoken { tx: Some(tx) }.await;
        flag.set(true);
    });
    let (tx2, rx2) = mpsc::channel();
    let main_waker_thread = wake_from_other_thread_after(rx2, Duration::from_millis(100));
    exec.run_until(RemoteWoken { tx: Some(tx2) });
    waker_thread.join().unwrap();
    main_waker_thread.join().unwrap();
    // The spawned task was woken 50 ms before the main future.
    exec.run_until(async {});
    assert!(done.get());
}

/// Counts finished tasks and wakes the main future when all are done.
#[derive(Default)]
struct Latch {
    done: Cell<usize>,
    waker: RefCell<Option<Waker>>,
}

impl Latch {
    fn count_down(&self) {
        self.done.set(self.done.get() + 1);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    async fn wait_for(&self, count: usize) {
        std::future::poll_fn(|cx| {
            if self.done.get() >= count {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

#[test]
fn local_executor_runs_a_thousand_io_tasks() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dev = Rc::new(disk_device(&dir, 8 << 20));
    let exec = LocalExecutor::new();
    let latch = Rc::new(Latch::default());
    let tasks = 1000u64;
    for i in 0..tasks {
        let dev = dev.clone();
        let latch = latch.clone();
        exec.spawn(async move {
            let offset = (i % 2048) * 4096;
            let data = IoBuf::from_slice(&[(i % 251) as u8; 4096]);
            dev.write(offset, data).await.unwrap();
            if i % 10 == 0 {
                sleep(Duration::from_micros(100)).await;
            }
            let back = dev.read(offset, IoBuf::zeroed(4096)).await.unwrap();
            assert!(back.iter().all(|&b| b == (i % 251) as u8), "task {i}");
            latch.count_down();
        });
    }
    let waiter = latch.clone();
    exec.run_until(async move { waiter.wait_for(tasks as usize).await });
    assert_eq!(latch.done.get(), tasks as usize);
    assert_eq!(ops_in_flight(), 0);
}

#[test]
fn spawn_local_from_a_task() {
    let exec = LocalExecutor::new();
    let latch = Rc::new(Latch::default());
    let outer = latch.clone();
    exec.spawn(async move {
        for i in 0..10u64 {
            let latch = outer.clone();
            spawn_local(async move {
                sleep(Duration::from_micros(50 * i)).await;
                latch.count_down();
            });
        }
    });
    let waiter = latch.clone();
    exec.run_until(async move { waiter.wait_for(10).await });
}

#[test]
#[should_panic(expected = "spawn_local called outside")]
fn spawn_local_without_executor_panics() {
    spawn_local(async {});
}

#[test]
#[should_panic(expected = "nested executors are not supported")]
fn nested_block_on_panics() {
    block_on(async {
        sleep(Duration::from_millis(1)).await;
        block_on(sleep(Duration::from_millis(1)));
    });
}

#[test]
fn nested_block_on_of_a_ready_future_is_fine() {
    let mem = oxpool_io::MemoryBackend::new("m", 1 << 20);
    let out = block_on(async {
        sleep(Duration::from_millis(1)).await;
        block_on(mem.read(0, IoBuf::zeroed(512))).unwrap().len()
    });
    assert_eq!(out, 512);
}

#[test]
fn join_all_keeps_order_and_handles_empty() {
    let none: Vec<std::future::Ready<u32>> = Vec::new();
    assert!(block_on(join_all(none)).is_empty());
    let futs: Vec<_> = (0..100u64)
        .map(|i| async move {
            sleep(Duration::from_micros((100 - i) * 20)).await;
            i
        })
        .collect();
    assert_eq!(block_on(join_all(futs)), (0..100).collect::<Vec<_>>());
}

#[test]
fn join_all_bounded_runs_at_most_its_limit_at_once_and_all_of_them() {
    for (count, limit) in [(0usize, 4usize), (1, 4), (10, 3), (64, 8), (5, 100), (7, 0)] {
        let window = count.min(limit.max(1));
        let running = Rc::new(Cell::new(0usize));
        let most = Rc::new(Cell::new(0usize));
        // (true, i) when future i starts, (false, i) when it ends.
        let events = Rc::new(RefCell::new(Vec::new()));
        let futs: Vec<_> = (0..count as u64)
            .map(|i| {
                let (running, most, events) = (running.clone(), most.clone(), events.clone());
                async move {
                    events.borrow_mut().push((true, i));
                    running.set(running.get() + 1);
                    most.set(most.get().max(running.get()));
                    // Later futures finish sooner, so the first to finish is the last of the
                    // first window: a sliding window starts the next one then, long before
                    // future 0 ends; fixed groups of `limit` would wait for future 0.
                    sleep(Duration::from_micros((count as u64 - i) * 30)).await;
                    running.set(running.get() - 1);
                    events.borrow_mut().push((false, i));
                    i
                }
            })
            .collect();
        let out = block_on(join_all_bounded(futs, limit));
        assert_eq!(
            out,
            (0..count as u64).collect::<Vec<_>>(),
            "{count} by {limit}"
        );
        assert_eq!(
            most.get(),
            window,
            "{count} futures, limit {limit}: most at once"
        );
        assert_eq!(running.get(), 0);
        let events = events.borrow();
        let starts: Vec<u64> = events.iter().filter(|e| e.0).map(|e| e.1).collect();
        assert_eq!(starts, (0..count as u64).collect::<Vec<_>>(), "start order");
        if count > window && window >= 2 {
            let at = |e: (bool, u64)| events.iter().position(|&x| x == e).unwrap();
            assert!(
                at((true, window as u64)) < at((false, 0)),
                "{count} by {limit}: future {window} waited for future 0 to end"
            );
        }
    }
}

#[test]
fn many_sleeps_beyond_the_op_table() {
    let count = oxpool_io::rt::OP_TABLE_CAPACITY * 2;
    let futs: Vec<_> = (0..count)
        .map(|_| sleep(Duration::from_millis(1)))
        .collect();
    assert_eq!(block_on(join_all(futs)).len(), count);
    assert_eq!(ops_in_flight(), 0);
}

#[test]
fn threads_exit_with_orphans() {
    // A thread that drops in-flight ops and exits: its driver drains them at teardown.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dev = std::sync::Arc::new(disk_device(&dir, 8 << 20));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                block_on(async {
                    let mut fut = dev.read(0, IoBuf::zeroed(4 << 20));
                    poll_once(&mut fut).await;
                    let mut nap = Box::pin(sleep(Duration::from_secs(60)));
                    poll_once(&mut nap).await;
                    // Both leak out of this block_on still in flight.
                    std::mem::forget(fut);
                    std::mem::forget(nap);
                });
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
