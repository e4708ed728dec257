//! The executors: [`block_on`] for one future, [`LocalExecutor`] for many tasks on one thread,
//! and [`join_all`]. All of them drive the calling thread's ring (see `driver`) between polls.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::driver::{self, thread_notifier, Notifier, RingOp};

thread_local! {
    /// Name of the executor running on this thread, to refuse nesting with a clear message.
    static RUNNING: Cell<Option<&'static str>> = const { Cell::new(None) };
    /// The `LocalExecutor` whose `run_until` is running on this thread (for `spawn_local`).
    static CURRENT_LOCAL: RefCell<Option<Rc<ExecInner>>> = const { RefCell::new(None) };
    /// `block_on`'s waker, reused across calls on this thread.
    static BLOCK_ON_WAKER: OnceCell<Arc<FlagWaker>> = const { OnceCell::new() };
}

/// Marks an executor as running on this thread for its lifetime.
struct RunningGuard;

impl RunningGuard {
    fn enter(what: &'static str) -> RunningGuard {
        RUNNING.with(|running| {
            if let Some(outer) = running.get() {
                panic!(
                    "oxpool-io: {what} called while {outer} is already running on this thread; \
                     nested executors are not supported (await the future instead)"
                );
            }
            running.set(Some(what));
        });
        RunningGuard
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        RUNNING.with(|running| running.set(None));
    }
}

/// A waker that sets a flag and rings the owning thread's doorbell. Works from any thread.
struct FlagWaker {
    woken: AtomicBool,
    notifier: Arc<Notifier>,
}

impl FlagWaker {
    fn new() -> FlagWaker {
        FlagWaker {
            woken: AtomicBool::new(false),
            notifier: thread_notifier(),
        }
    }
}

impl Wake for FlagWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Only the false -> true transition rings: if the flag is already set, the owner
        // has not consumed it yet, so it will not sleep before seeing it.
        if !self.woken.swap(true, Ordering::AcqRel) {
            self.notifier.notify();
        }
    }
}

/// Runs a future to completion on the current thread, driving this thread's ring while it is
/// pending: submits queued SQEs, waits for at least one CQE or a cross-thread wake, completes
/// ops, polls again.
///
/// A future that is ready at its first poll (e.g. a memory-backend op) returns at once, even
/// inside another executor. Otherwise a nested call (from inside `block_on` or
/// `LocalExecutor::run_until` on the same thread) panics with a clear message.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let flag = BLOCK_ON_WAKER.with(|cell| cell.get_or_init(|| Arc::new(FlagWaker::new())).clone());
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    if let Poll::Ready(output) = fut.as_mut().poll(&mut cx) {
        return output;
    }
    let _running = RunningGuard::enter("block_on");
    // A stale wake from an earlier call only causes one spurious poll.
    // Unbounded by design: runs until the future completes; every iteration either polls
    // after a wake or sleeps in the kernel.
    loop {
        let block = !flag.woken.load(Ordering::Acquire);
        driver::turn(block);
        if flag.woken.swap(false, Ordering::AcqRel) {
            if let Poll::Ready(output) = fut.as_mut().poll(&mut cx) {
                return output;
            }
        }
    }
}

/// Sleep using an io_uring Timeout op on this thread's ring.
pub fn sleep(d: Duration) -> impl Future<Output = ()> {
    let op = RingOp::timeout(d);
    async move {
        // A timeout op only fails at thread teardown; either way the sleep is over.
        let _ = op.await;
    }
}

/// Runs all futures concurrently on the current task and returns their outputs in order.
///
/// Each future gets its own waker, so a completion re-polls only the futures it concerns
/// (txg sync issues hundreds of writes at once).
pub async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let limit = futs.len();
    JoinAll::new(futs, limit).await
}

/// As [`join_all`], but with at most `limit` futures running at once (a sliding window, in
/// order: the next future starts when one finishes). For I/O that would otherwise queue all
/// at once in front of more urgent I/O of the same device.
pub async fn join_all_bounded<F: Future>(futs: Vec<F>, limit: usize) -> Vec<F::Output> {
    JoinAll::new(futs, limit.max(1)).await
}

/// Runs `a` and `b` at once on the current task; their results when both are done. Either
/// one's wake polls both (each polls only while not done), so neither is left unpolled
/// while the other waits.
pub async fn join2<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready((ra.take().unwrap(), rb.take().unwrap()))
        } else {
            Poll::Pending
        }
    })
    .await
}

enum MaybeDone<F: Future> {
    Pending(F),
    Done(F::Output),
    Taken,
}

/// State shared by a [`JoinAll`] and its children's wakers.
struct JoinShared {
    /// Indices of children woken since the last poll (each at most once: `ChildWaker::queued`).
    woken: Mutex<Vec<usize>>,
    /// The waker of the task that polls the `JoinAll`.
    parent: Mutex<Option<Waker>>,
}

struct ChildWaker {
    index: usize,
    queued: AtomicBool,
    shared: Arc<JoinShared>,
}

impl Wake for ChildWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        lock(&self.shared.woken).push(self.index);
        let parent = lock(&self.shared.parent).clone();
        if let Some(parent) = parent {
            parent.wake();
        }
    }
}

struct JoinAll<F: Future> {
    /// Boxed slice: never reallocated, so the children stay pinned.
    children: Pin<Box<[MaybeDone<F>]>>,
    wakers: Vec<Arc<ChildWaker>>,
    shared: Arc<JoinShared>,
    remaining: usize,
    /// Children `0..started` have been started (polled at least once, or queued for their
    /// first poll); the others wait for a running one to finish.
    started: usize,
    /// Scratch for the woken list, swapped with the shared one to keep the lock short.
    scratch: Vec<usize>,
}

impl<F: Future> JoinAll<F> {
    /// Runs at most `limit` (at least 1) children at once.
    fn new(futs: Vec<F>, limit: usize) -> JoinAll<F> {
        let count = futs.len();
        let started = count.min(limit.max(1));
        let shared = Arc::new(JoinShared {
            // The first `started` children are polled at the first poll.
            woken: Mutex::new((0..started).collect()),
            parent: Mutex::new(None),
        });
        let wakers = (0..count)
            .map(|index| {
                Arc::new(ChildWaker {
                    index,
                    // Queued: in the woken list, or not started yet (a sibling's finish puts it
                    // in the woken list, still marked queued, so it is never queued twice).
                    queued: AtomicBool::new(true),
                    shared: shared.clone(),
                })
            })
            .collect();
        let children: Box<[MaybeDone<F>]> = futs.into_iter().map(MaybeDone::Pending).collect();
        JoinAll {
            children: Box::into_pin(children),
            wakers,
            shared,
            remaining: count,
            started,
            scratch: Vec::with_capacity(count),
        }
    }
}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<F::Output>> {
        // `JoinAll` is `Unpin`: the children are pinned in their own heap allocation.
        let this = self.get_mut();
        {
            let mut parent = lock(&this.shared.parent);
            if !parent.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *parent = Some(cx.waker().clone());
            }
        }
        // Bounded: each pass handles the children woken so far; a child woken during its own
        // poll is handled in the next pass, and the number of passes per poll is capped so
        // that one poll cannot spin forever on a child that always wakes itself.
        for _ in 0..4 {
            std::mem::swap(&mut *lock(&this.shared.woken), &mut this.scratch);
            if this.scratch.is_empty() {
                break;
            }
            for index in this.scratch.drain(..) {
                this.wakers[index].queued.store(false, Ordering::Release);
                // SAFETY: the boxed slice never moves; the element is pinned in place.
                let child = unsafe { this.children.as_mut().get_unchecked_mut() };
                let slot = &mut child[index];
                let MaybeDone::Pending(fut) = slot else {
                    continue;
                };
                let waker = Waker::from(this.wakers[index].clone());
                let mut child_cx = Context::from_waker(&waker);
                // SAFETY: `fut` lives in the pinned boxed slice and is never moved while
                // pending; it is dropped in place when replaced by `Done` below.
                let fut = unsafe { Pin::new_unchecked(fut) };
                if let Poll::Ready(output) = fut.poll(&mut child_cx) {
                    *slot = MaybeDone::Done(output);
                    this.remaining -= 1;
                    if this.started < this.children.len() {
                        // One finished: the next one starts, in the next pass (its waker is
                        // still marked queued from `new`).
                        lock(&this.shared.woken).push(this.started);
                        this.started += 1;
                    }
                }
            }
        }
        if this.remaining > 0 {
            // Children woken after the last pass rang the parent waker, so we will be polled.
            if !lock(&this.shared.woken).is_empty() {
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        }
        // SAFETY: every child is `Done`: no pinned future remains, outputs may be moved out.
        let children = unsafe { this.children.as_mut().get_unchecked_mut() };
        let outputs = children
            .iter_mut()
            .map(|slot| match std::mem::replace(slot, MaybeDone::Taken) {
                MaybeDone::Done(output) => output,
                _ => unreachable!("join_all finished with a child not done"),
            })
            .collect();
        Poll::Ready(outputs)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these short locks cannot leave the data inconsistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Task keys: slot index in the low 32 bits, slot generation in the high 32.
type TaskKey = u64;

fn task_key(index: u32, generation: u32) -> TaskKey {
    (u64::from(generation) << 32) | u64::from(index)
}

/// The part of an executor that wakers on other threads reach.
struct ExecShared {
    /// Tasks to poll. Each live task is queued at most once (`TaskWaker::queued`), and a
    /// stale waker (its task finished) at most once more, so the queue is bounded by the
    /// number of tasks and wakers ever created.
    ready: Mutex<VecDeque<TaskKey>>,
    notifier: Arc<Notifier>,
}

struct TaskWaker {
    key: TaskKey,
    queued: AtomicBool,
    shared: Arc<ExecShared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        lock(&self.shared.ready).push_back(self.key);
        self.shared.notifier.notify();
    }
}

struct TaskSlot {
    /// `None` while the task is being polled or when the slot is free.
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    waker: Option<Arc<TaskWaker>>,
    generation: u32,
}

struct ExecInner {
    shared: Arc<ExecShared>,
    tasks: RefCell<Vec<TaskSlot>>,
    free: RefCell<Vec<u32>>,
}

impl ExecInner {
    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()>>>) {
        let key = {
            let mut tasks = self.tasks.borrow_mut();
            let index = match self.free.borrow_mut().pop() {
                Some(index) => index,
                None => {
                    let index = u32::try_from(tasks.len()).expect("too many tasks");
                    tasks.push(TaskSlot {
                        future: None,
                        waker: None,
                        generation: 0,
                    });
                    index
                }
            };
            let slot = &mut tasks[index as usize];
            debug_assert!(slot.future.is_none() && slot.waker.is_none());
            let key = task_key(index, slot.generation);
            slot.future = Some(future);
            slot.waker = Some(Arc::new(TaskWaker {
                key,
                queued: AtomicBool::new(true),
                shared: self.shared.clone(),
            }));
            key
        };
        lock(&self.shared.ready).push_back(key);
    }

    fn poll_task(&self, key: TaskKey) {
        let index = (key & u64::from(u32::MAX)) as usize;
        let generation = (key >> 32) as u32;
        let (mut future, task_waker) = {
            let mut tasks = self.tasks.borrow_mut();
            let Some(slot) = tasks.get_mut(index) else {
                return;
            };
            if slot.generation != generation {
                return; // A stale wake for a finished task.
            }
            let Some(future) = slot.future.take() else {
                return;
            };
            let task_waker = slot.waker.clone().expect("a live task has a waker");
            // Cleared before the poll, so a wake during the poll queues the task again.
            task_waker.queued.store(false, Ordering::Release);
            (future, task_waker)
        };
        let waker = Waker::from(task_waker);
        let mut cx = Context::from_waker(&waker);
        // The tasks table is not borrowed here: the task may spawn.
        match future.as_mut().poll(&mut cx) {
            Poll::Pending => {
                self.tasks.borrow_mut()[index].future = Some(future);
            }
            Poll::Ready(()) => {
                // Dropped outside the borrow: a future's drop may spawn or orphan I/O.
                drop(future);
                let mut tasks = self.tasks.borrow_mut();
                let slot = &mut tasks[index];
                slot.waker = None;
                slot.generation = slot.generation.wrapping_add(1);
                self.free.borrow_mut().push(index as u32);
            }
        }
    }

    fn has_ready(&self) -> bool {
        !lock(&self.shared.ready).is_empty()
    }
}

/// A single-threaded executor for many tasks on this thread's ring (the NBD server runs one
/// per reactor thread: connection tasks, request tasks).
///
/// Tasks are boxed on spawn; polling and waking allocate nothing. Wakers are `Send + Sync`
/// and may be called from any thread.
pub struct LocalExecutor {
    inner: Rc<ExecInner>,
}

impl LocalExecutor {
    /// An executor with no tasks, bound to the current thread.
    pub fn new() -> Self {
        LocalExecutor {
            inner: Rc::new(ExecInner {
                shared: Arc::new(ExecShared {
                    ready: Mutex::new(VecDeque::new()),
                    notifier: thread_notifier(),
                }),
                tasks: RefCell::new(Vec::new()),
                free: RefCell::new(Vec::new()),
            }),
        }
    }

    /// Adds a task; it runs when `run_until` drives this executor.
    pub fn spawn(&self, fut: impl Future<Output = ()> + 'static) {
        self.inner.spawn(Box::pin(fut));
    }

    /// Drives the spawned tasks and the ring until `fut` completes, and returns its output.
    /// Tasks still pending then stay in the executor for the next `run_until`.
    ///
    /// Panics if another executor is running on this thread.
    pub fn run_until<F: Future>(&self, fut: F) -> F::Output {
        let _running = RunningGuard::enter("LocalExecutor::run_until");
        let _current = CurrentGuard::set(self.inner.clone());
        let main = Arc::new(FlagWaker::new());
        main.woken.store(true, Ordering::Relaxed);
        let main_waker = Waker::from(main.clone());
        let mut main_cx = Context::from_waker(&main_waker);
        let mut fut = pin!(fut);
        let mut batch: VecDeque<TaskKey> = VecDeque::new();
        // Unbounded by design: runs until `fut` completes. Each round polls only the tasks
        // that were ready when it began (a task that keeps waking itself cannot starve the
        // ring), then turns the ring once.
        loop {
            std::mem::swap(&mut *lock(&self.inner.shared.ready), &mut batch);
            for key in batch.drain(..) {
                self.inner.poll_task(key);
            }
            if main.woken.swap(false, Ordering::AcqRel) {
                if let Poll::Ready(output) = fut.as_mut().poll(&mut main_cx) {
                    return output;
                }
            }
            let block = !main.woken.load(Ordering::Acquire) && !self.inner.has_ready();
            driver::turn(block);
        }
    }
}

impl Default for LocalExecutor {
    fn default() -> Self {
        LocalExecutor::new()
    }
}

impl Drop for LocalExecutor {
    fn drop(&mut self) {
        // Take the futures out first: their drops may touch the executor (spawn_local).
        let futures: Vec<_> = self
            .inner
            .tasks
            .borrow_mut()
            .iter_mut()
            .filter_map(|t| t.future.take())
            .collect();
        drop(futures);
    }
}

impl std::fmt::Debug for LocalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let live = self
            .inner
            .tasks
            .borrow()
            .iter()
            .filter(|t| t.waker.is_some())
            .count();
        f.debug_struct("LocalExecutor")
            .field("tasks", &live)
            .finish()
    }
}

/// Installs the running `LocalExecutor` for `spawn_local`, restoring the previous one.
struct CurrentGuard {
    previous: Option<Rc<ExecInner>>,
}

impl CurrentGuard {
    fn set(inner: Rc<ExecInner>) -> CurrentGuard {
        let previous = CURRENT_LOCAL.with(|c| c.borrow_mut().replace(inner));
        CurrentGuard { previous }
    }
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT_LOCAL.with(|c| *c.borrow_mut() = previous);
    }
}

/// Lets the executor run everything else that is ready, and turn the ring once (submitting
/// what they queued), before the caller goes on: for a task that should not go before the
/// work that spawned it (an early log write, after the reply of the write that started it).
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Spawns a task onto the `LocalExecutor` running on this thread, if one is: returns whether
/// it did (under [`block_on`] there is none, and `fut` is dropped). For work a caller may
/// start early but need not: the engine's early log writes.
pub fn try_spawn_local(fut: impl Future<Output = ()> + 'static) -> bool {
    match CURRENT_LOCAL.with(|c| c.borrow().clone()) {
        Some(inner) => {
            inner.spawn(Box::pin(fut));
            true
        }
        None => false,
    }
}

/// Spawns a task onto the `LocalExecutor` currently running on this thread.
///
/// Panics with a clear message if no `LocalExecutor::run_until` is running on this thread.
pub fn spawn_local(fut: impl Future<Output = ()> + 'static) {
    let inner = CURRENT_LOCAL
        .with(|c| c.borrow().clone())
        .expect("oxpool-io: spawn_local called outside LocalExecutor::run_until on this thread");
    inner.spawn(Box::pin(fut));
}
