//! Per-volume reader/writer range locks whose nodes live in the caller's request.
//!
//! Every volume read, write and trim holds a [`RangeLock`] over the bytes it touches, so that
//! overlapping writes do not interleave and a read never sees half a write. OpenZFS allocates a
//! 208-byte node per lock (`zfs_rangelock_enter`); here the node is a [`RangeLockNode`] embedded
//! in the request (OpenZFS PR 16896's idea), so taking and releasing a lock never allocates,
//! contended or not.
//!
//! # Semantics
//!
//! - A lock covers the bytes `[offset_bytes, offset_bytes + length_bytes)`. A zero-length range
//!   is treated as length 1 (it still orders against writes of that byte). Ranges are clamped to
//!   `[0, u64::MAX)`: a range reaching past `u64::MAX - 1` ends there (no volume is 2^64 bytes).
//! - Readers share with readers; a writer excludes every overlapping lock; locks whose ranges do
//!   not overlap never wait for each other.
//! - **Fairness rule: first come, first served among conflicting requests.** A request is granted
//!   as soon as every *earlier* request that overlaps it in a conflicting mode (at least one of
//!   the two is a writer) has been released or cancelled; it never waits for a later request.
//!   "Earlier" is the order of the [`RangeLock::lock`] calls: a request takes its place in line
//!   when `lock` is called, not when its future is first polled. So a waiting writer is never
//!   passed by a reader that arrived after it (new readers queue behind it, as with OpenZFS's
//!   writer priority), and a waiting reader is never passed by a later writer. No starvation
//!   follows: the set of requests a request waits for is fixed when it arrives and only shrinks.
//!   [`RangeLock::try_lock`] obeys the same rule (it fails rather than jump the line).
//! - Waiting is asynchronous: [`LockFuture`] parks the request (its [`Waker`] is kept in the
//!   node) and no thread blocks. A release grants the lock, under the mutex, to exactly the
//!   waiters that can now proceed and wakes exactly those, after dropping the mutex; a woken
//!   future finds its lock already granted (no retry, no thundering herd).
//! - Cancel safety: dropping a [`LockFuture`] before it resolves unlinks the node and wakes the
//!   requests that were waiting only for it. Dropping the [`RangeGuard`] releases the lock.
//!
//! # Structure and cost
//!
//! One `std::sync::Mutex` per lock guards a treap (a randomized balanced binary search tree) of
//! all present requests, held and waiting, keyed by (start offset, arrival number) and linked
//! through the nodes themselves. Each tree node also carries the maximum end offset of its
//! subtree, over all requests and over writers only (an interval tree), so "which present
//! requests overlap [a, b) (and are writers)" visits O(log n + k) nodes for k matches
//! (expected), with no stack and no allocation. Each waiting request counts the earlier
//! conflicting requests still present (its blockers); a release or cancel decrements the count
//! of each later conflicting overlapping waiter and grants those that reach zero.
//!
//! - Uncontended enter + exit: two short critical sections. Enter is one O(log n) descent that
//!   finds the insertion point and proves nothing overlaps, then the insertion (expected < 2
//!   rotations); exit is the removal (expected < 2 rotations) plus the subtree maxima on the way
//!   up, and no search for waiters when none exist. On an empty lock each is a few stores; the
//!   cost is the mutex's two atomic operations per section. No allocation, ever.
//! - A request that overlaps present ones: O(log n + k) to count its k blockers. A release that
//!   concerns k waiters: O(log n + k) to find and update them.
//! - Wakers are taken out under the mutex and woken after it is dropped, 16 at a time from an
//!   intrusive queue of granted-but-not-yet-woken nodes; no `Waker` is ever dropped or woken with
//!   the mutex held (a waker may run arbitrary code, even re-enter the lock).
//!
//! # Leaks
//!
//! A node must not be freed while linked. The guard and the future unlink it when they drop, and
//! the borrow they hold keeps the node alive until then. If one of them is leaked
//! (`mem::forget`) the lock stays held forever (as with any leaked guard), and the node's own
//! `Drop` aborts the process if it runs while still linked: that is the one case where neither
//! unlinking (its lock may be gone) nor freeing (the tree points at it) is sound.

// The unsafe code is concentrated in `State::node` (dereferencing a linked node), in
// `link_pointers`/`mark_linked`/`unlink` (the raw pointers the future and guard keep to their
// node), and in the Send/Sync impls; each block states why it is sound.

use std::cell::UnsafeCell;
use std::fmt;
use std::future::Future;
use std::marker::{PhantomData, PhantomPinned};
use std::ops::ControlFlow;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll, Waker};

/// How many wakers a release takes out of the mutex per round (a stack array of `Option<Waker>`).
const WAKE_BATCH_COUNT: usize = 16;

/// The mode of a range lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Shared: any number of overlapping readers may hold the range together.
    Read,
    /// Exclusive: no other lock overlapping the range is held at the same time.
    Write,
}

/// The mutex guarding a lock's state, swapped for one that shuttle can schedule under the
/// `shuttle` feature.
mod sync {
    use std::ops::{Deref, DerefMut};

    /// A `std::sync::Mutex`. Under the `shuttle` feature it is paired with a shuttle mutex taken
    /// first when running inside a shuttle test, so that every critical section is a scheduling
    /// point shuttle controls; outside shuttle (other tests, benches) only the std mutex is used.
    pub(super) struct StateMutex<T> {
        #[cfg(feature = "shuttle")]
        schedule: shuttle::sync::Mutex<()>,
        inner: std::sync::Mutex<T>,
    }

    pub(super) struct StateGuard<'a, T> {
        // Declared first so that it drops first: the std mutex must be free before shuttle's
        // guard drops, which may switch tasks (a switch with the std mutex held would block the
        // one OS thread that runs every shuttle task).
        inner: std::sync::MutexGuard<'a, T>,
        #[cfg(feature = "shuttle")]
        _schedule: Option<shuttle::sync::MutexGuard<'a, ()>>,
    }

    impl<T> StateMutex<T> {
        pub(super) const fn new(value: T) -> Self {
            Self {
                #[cfg(feature = "shuttle")]
                schedule: shuttle::sync::Mutex::new(()),
                inner: std::sync::Mutex::new(value),
            }
        }

        /// Locks; panics if a panic (a failed assertion) inside a critical section poisoned
        /// the mutex, since the state may be half-updated and going on could grant
        /// overlapping writers.
        #[inline]
        pub(super) fn lock(&self) -> StateGuard<'_, T> {
            self.lock_unless_poisoned()
                .expect("range lock state poisoned by a panic")
        }

        /// Locks, or `None` if the mutex is poisoned. A poisoned state is never read again
        /// (every other path panics), which is what lets a guard or future dropped during the
        /// unwinding skip unlinking instead of aborting.
        #[inline]
        pub(super) fn lock_unless_poisoned(&self) -> Option<StateGuard<'_, T>> {
            #[cfg(feature = "shuttle")]
            let schedule = shuttle::current::try_get_current_task().map(|_| {
                self.schedule
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            });
            let inner = self.inner.lock().ok()?;
            Some(StateGuard {
                inner,
                #[cfg(feature = "shuttle")]
                _schedule: schedule,
            })
        }
    }

    impl<T> Deref for StateGuard<'_, T> {
        type Target = T;
        #[inline]
        fn deref(&self) -> &T {
            &self.inner
        }
    }

    impl<T> DerefMut for StateGuard<'_, T> {
        #[inline]
        fn deref_mut(&mut self) -> &mut T {
            &mut self.inner
        }
    }
}

/// A pointer to the fields of a node linked into some lock's [`State`].
type NodePtr = NonNull<NodeInner>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    /// Not linked into any lock.
    Idle,
    /// Linked; `blockers_count` earlier conflicting requests are still present.
    Waiting,
    /// Linked and granted (the future may not have observed it yet).
    Granted,
}

/// The part of a node that the lock's mutex guards while the node is linked.
struct NodeInner {
    // Treap links.
    parent: Option<NodePtr>,
    left: Option<NodePtr>,
    right: Option<NodePtr>,
    // Queue of granted nodes whose wakers are still to be taken out and woken.
    wake_prev: Option<NodePtr>,
    wake_next: Option<NodePtr>,
    start_bytes: u64,
    /// Exclusive; always > `start_bytes`.
    end_bytes: u64,
    /// Max `end_bytes` over this subtree (interval-tree augmentation).
    subtree_end_bytes_max: u64,
    /// Max `end_bytes` over the writers of this subtree; 0 when it has none (every end is >= 1).
    subtree_write_end_bytes_max: u64,
    /// Arrival number: the order of `lock` calls on this lock, and the tree key's tie-breaker.
    seq: u64,
    /// Treap heap priority, a hash of `seq`: parents have priorities >= their children's.
    priority: u64,
    /// Earlier requests still present that overlap this one in a conflicting mode.
    blockers_count: usize,
    waker: Option<Waker>,
    mode: LockMode,
    state: NodeState,
    in_wake_queue: bool,
}

impl NodeInner {
    const fn new() -> Self {
        Self {
            parent: None,
            left: None,
            right: None,
            wake_prev: None,
            wake_next: None,
            start_bytes: 0,
            end_bytes: 0,
            subtree_end_bytes_max: 0,
            subtree_write_end_bytes_max: 0,
            seq: 0,
            priority: 0,
            blockers_count: 0,
            waker: None,
            mode: LockMode::Read,
            state: NodeState::Idle,
            in_wake_queue: false,
        }
    }

    #[inline]
    fn write_end_bytes(&self) -> u64 {
        match self.mode {
            LockMode::Write => self.end_bytes,
            LockMode::Read => 0,
        }
    }
}

/// The intrusive lock node: lives inside the request (e.g. a local of the async fn serving it),
/// so that locking allocates nothing. `!Unpin`: it must stay put while linked, which the
/// `Pin<&mut RangeLockNode>` taken by [`RangeLock::lock`] guarantees. One node serves one lock at
/// a time and can be reused once its guard (or future) is dropped.
pub struct RangeLockNode {
    /// Guarded by the mutex of the lock the node is linked into; owned by the node otherwise.
    inner: UnsafeCell<NodeInner>,
    /// Whether the node is linked into a lock. Written only by whoever borrows the node
    /// (`lock`/`try_lock`, and the guard or future when it unlinks), read by `Drop`.
    linked: bool,
    _pinned: PhantomPinned,
}

// SAFETY: while linked, `inner` is accessed only with the owning lock's mutex held (from any
// thread: that is the point of the mutex); while not linked, only through `&mut RangeLockNode`.
// `linked` is only touched by the node's current borrower. A `Waker` is Send + Sync.
unsafe impl Send for RangeLockNode {}
// SAFETY: nothing reachable through `&RangeLockNode` reads `inner`; `Debug` reads `linked`, which
// changes only while the node is mutably borrowed (so no `&RangeLockNode` exists then).
unsafe impl Sync for RangeLockNode {}

impl RangeLockNode {
    /// A node, not linked into any lock.
    pub const fn new() -> Self {
        Self {
            inner: UnsafeCell::new(NodeInner::new()),
            linked: false,
            _pinned: PhantomPinned,
        }
    }
}

impl Default for RangeLockNode {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RangeLockNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeLockNode")
            .field("linked", &self.linked)
            .finish_non_exhaustive()
    }
}

impl Drop for RangeLockNode {
    fn drop(&mut self) {
        if self.linked {
            // Only reachable if a guard or future borrowing this node was leaked: the lock's tree
            // still points here, and the lock itself may already be gone, so the node can be
            // neither unlinked nor freed.
            eprintln!("oxpool: RangeLockNode dropped while linked (leaked RangeGuard/LockFuture)");
            std::process::abort();
        }
    }
}

/// Where a new node goes in the tree: under `parent` (or at the root), on which side.
#[derive(Clone, Copy)]
struct Slot {
    parent: Option<NodePtr>,
    go_left: bool,
}

/// Everything the mutex guards.
struct State {
    root: Option<NodePtr>,
    wake_head: Option<NodePtr>,
    wake_tail: Option<NodePtr>,
    seq_next: u64,
    granted_count: usize,
    waiting_count: usize,
}

// SAFETY: the pointers name nodes linked into this state; they are dereferenced only through
// `State::node`, that is by the holder of `&mut State`, which only the mutex hands out. The
// pointed-to fields are Send (`Waker` is Send).
unsafe impl Send for State {}

/// A release's wakers, taken out of the mutex to be woken after it is dropped.
struct WakeBatch {
    wakers: [Option<Waker>; WAKE_BATCH_COUNT],
    len: usize,
}

impl WakeBatch {
    fn new() -> Self {
        Self {
            wakers: [const { None }; WAKE_BATCH_COUNT],
            len: 0,
        }
    }

    fn wake_all(&mut self) {
        for slot in &mut self.wakers[..self.len] {
            if let Some(waker) = slot.take() {
                waker.wake();
            }
        }
        self.len = 0;
    }
}

/// A 64-bit mix (splitmix64's finalizer): turns arrival numbers into treap priorities that
/// are independent of the key order, which is what gives the treap its expected O(log n) depth.
#[inline]
fn priority_of(seq: u64) -> u64 {
    let mut x = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The half-open range a lock call covers: zero length counts as one byte; clamped below
/// `u64::MAX` so that `end_bytes` never overflows and is always > `start_bytes`.
#[inline]
fn clamp_range(offset_bytes: u64, length_bytes: u64) -> (u64, u64) {
    let end_bytes = offset_bytes.saturating_add(length_bytes.max(1));
    let start_bytes = offset_bytes.min(end_bytes - 1);
    (start_bytes, end_bytes)
}

impl State {
    const fn new() -> Self {
        Self {
            root: None,
            wake_head: None,
            wake_tail: None,
            seq_next: 0,
            granted_count: 0,
            waiting_count: 0,
        }
    }

    /// Borrows the fields of a linked node.
    ///
    /// Module invariant: every `NodePtr` reachable from a `State` (root, tree links, wake queue)
    /// points to a live, pinned node linked into this state, and every pointer passed here is
    /// one of those or the node being linked by `lock`/`try_lock` (which hold its borrow). Nodes
    /// are linked from a `Pin<&'a mut RangeLockNode>` and unlinked by the guard or future holding
    /// that borrow before it ends (a node dropped while linked aborts the process; a poisoned
    /// state, whose links may be stale, is never read again). The borrow returned is tied to
    /// `&mut self`, so two `&mut NodeInner` never coexist.
    #[inline(always)]
    fn node(&mut self, ptr: NodePtr) -> &mut NodeInner {
        // SAFETY: by the invariant above the node is alive and linked here, and `&mut self`
        // (which only the mutex hands out) is the only path to its fields.
        unsafe { &mut *ptr.as_ptr() }
    }

    #[inline]
    fn linked_count(&self) -> usize {
        self.granted_count + self.waiting_count
    }

    // ---- arrival and departure ---------------------------------------------------------------

    /// Links `x` as a request for `[start_bytes, end_bytes)` in `mode`; returns whether it is
    /// granted at once. If `only_if_granted`, leaves `x` unlinked instead of making it wait.
    fn arrive(
        &mut self,
        x: NodePtr,
        start_bytes: u64,
        end_bytes: u64,
        mode: LockMode,
        only_if_granted: bool,
    ) -> bool {
        // Every present request arrived earlier, so the blockers are all the present requests
        // that overlap and conflict: any for a writer, only writers for a reader. The descent
        // to the insertion point tells whether anything overlaps at all; only then (contended,
        // or readers sharing) are the conflicting ones counted.
        let (slot, overlaps_any) = self.find_slot(start_bytes, end_bytes);
        let mut blockers_count = 0usize;
        if overlaps_any {
            self.for_each_overlap(start_bytes, end_bytes, mode == LockMode::Read, |_, _| {
                blockers_count += 1;
                if only_if_granted {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
        }
        let granted = blockers_count == 0;
        if !granted && only_if_granted {
            return false;
        }
        let seq = self.seq_next;
        self.seq_next += 1;
        let n = self.node(x);
        debug_assert_eq!(n.state, NodeState::Idle);
        debug_assert!(n.waker.is_none() && !n.in_wake_queue);
        n.parent = None;
        n.left = None;
        n.right = None;
        n.start_bytes = start_bytes;
        n.end_bytes = end_bytes;
        n.mode = mode;
        n.subtree_end_bytes_max = end_bytes;
        n.subtree_write_end_bytes_max = n.write_end_bytes();
        n.seq = seq;
        n.priority = priority_of(seq);
        n.blockers_count = blockers_count;
        if granted {
            n.state = NodeState::Granted;
            self.granted_count += 1;
        } else {
            n.state = NodeState::Waiting;
            self.waiting_count += 1;
        }
        self.tree_insert(x, slot);
        debug_assert!(
            !granted || self.no_granted_conflict(x),
            "granted over a conflicting lock"
        );
        granted
    }

    /// Unlinks `x` (granted or waiting) and grants the waiters it was the last blocker of,
    /// queueing them for wake-up. Returns `x`'s own waker (to drop outside the mutex) and how
    /// many waiters were granted.
    fn depart(&mut self, x: NodePtr) -> (Option<Waker>, usize) {
        let n = self.node(x);
        let (start_bytes, end_bytes, mode, seq) = (n.start_bytes, n.end_bytes, n.mode, n.seq);
        let (state, in_wake_queue) = (n.state, n.in_wake_queue);
        let own_waker = n.waker.take();
        n.state = NodeState::Idle;
        match state {
            NodeState::Granted => self.granted_count -= 1,
            NodeState::Waiting => self.waiting_count -= 1,
            NodeState::Idle => unreachable!("departing node is not linked"),
        }
        if in_wake_queue {
            self.wake_queue_unlink(x);
        }
        self.tree_remove(x);

        // The requests that counted `x` as a blocker: later, overlapping, conflicting (every
        // one for a departing writer, the writers for a departing reader). All are waiting.
        let mut granted_now_count = 0usize;
        if self.waiting_count == 0 {
            return (own_waker, 0); // The uncontended case: no walk.
        }
        self.for_each_overlap(
            start_bytes,
            end_bytes,
            mode == LockMode::Read,
            |state, w| {
                let wn = state.node(w);
                if wn.seq < seq {
                    return ControlFlow::Continue(()); // Earlier: `x` was not in its way.
                }
                // A later conflicting request cannot have been granted while `x` was present.
                debug_assert_eq!(wn.state, NodeState::Waiting);
                debug_assert!(wn.blockers_count > 0);
                wn.blockers_count -= 1;
                if wn.blockers_count == 0 {
                    wn.state = NodeState::Granted;
                    state.waiting_count -= 1;
                    state.granted_count += 1;
                    state.wake_queue_push(w);
                    granted_now_count += 1;
                    debug_assert!(
                        state.no_granted_conflict(w),
                        "granted over a conflicting lock"
                    );
                }
                ControlFlow::Continue(())
            },
        );
        (own_waker, granted_now_count)
    }

    /// The future's poll: whether `x` is granted. If it is not, stores `waker` in it. Returns
    /// the waker it replaced or took out, to be dropped outside the mutex.
    fn poll_granted(&mut self, x: NodePtr, waker: &Waker) -> (bool, Option<Waker>) {
        let n = self.node(x);
        match n.state {
            NodeState::Granted => {
                let stale = n.waker.take();
                // Being polled anyway: no need to be woken.
                if n.in_wake_queue {
                    self.wake_queue_unlink(x);
                }
                (true, stale)
            }
            NodeState::Waiting => {
                let stale = match &n.waker {
                    Some(old) if old.will_wake(waker) => None,
                    _ => n.waker.replace(waker.clone()),
                };
                (false, stale)
            }
            NodeState::Idle => unreachable!("polled node is not linked"),
        }
    }

    // ---- wake queue ---------------------------------------------------------------------------

    fn wake_queue_push(&mut self, x: NodePtr) {
        let tail = self.wake_tail;
        let n = self.node(x);
        debug_assert!(!n.in_wake_queue);
        n.in_wake_queue = true;
        n.wake_prev = tail;
        n.wake_next = None;
        match tail {
            Some(t) => self.node(t).wake_next = Some(x),
            None => self.wake_head = Some(x),
        }
        self.wake_tail = Some(x);
    }

    fn wake_queue_unlink(&mut self, x: NodePtr) {
        let n = self.node(x);
        debug_assert!(n.in_wake_queue);
        let (prev, next) = (n.wake_prev.take(), n.wake_next.take());
        n.in_wake_queue = false;
        match prev {
            Some(p) => self.node(p).wake_next = next,
            None => self.wake_head = next,
        }
        match next {
            Some(nx) => self.node(nx).wake_prev = prev,
            None => self.wake_tail = prev,
        }
    }

    /// Pops up to a batch of queued nodes, moving their wakers into `batch`. Returns how many
    /// nodes it popped (a node granted before its first poll has no waker yet).
    fn take_wakers(&mut self, batch: &mut WakeBatch) -> usize {
        debug_assert_eq!(batch.len, 0);
        let mut popped_count = 0;
        while popped_count < WAKE_BATCH_COUNT {
            let Some(x) = self.wake_head else { break };
            self.wake_queue_unlink(x);
            if let Some(waker) = self.node(x).waker.take() {
                batch.wakers[batch.len] = Some(waker);
                batch.len += 1;
            }
            popped_count += 1;
        }
        popped_count
    }

    // ---- interval treap -------------------------------------------------------------------------

    /// Calls `f` on every linked node whose range overlaps `[start_bytes, end_bytes)` (and that
    /// is a writer, if `writers_only`), until `f` breaks. `f` may change anything but the tree's
    /// shape. Visits O(log n + matches) nodes (expected), walking the parent links: no stack.
    fn for_each_overlap(
        &mut self,
        start_bytes: u64,
        end_bytes: u64,
        writers_only: bool,
        mut f: impl FnMut(&mut State, NodePtr) -> ControlFlow<()>,
    ) {
        // Whether a subtree can hold a match: something in it ends after `start_bytes`.
        let reaches = |n: &NodeInner| {
            let end_max = if writers_only {
                n.subtree_write_end_bytes_max
            } else {
                n.subtree_end_bytes_max
            };
            end_max > start_bytes
        };
        let Some(root) = self.root else { return };
        if !reaches(self.node(root)) {
            return;
        }
        // Each node is entered at most once and climbed out of at most once.
        let mut steps_left = 2 * self.linked_count() + 2;
        let mut cur = root;
        'enter: loop {
            assert!(
                steps_left > 0,
                "range lock tree walk did not end: the tree is corrupt"
            );
            steps_left -= 1;
            let n = self.node(cur);
            let (n_start, n_end, n_mode) = (n.start_bytes, n.end_bytes, n.mode);
            let (left, right) = (n.left, n.right);
            let overlaps = n_start < end_bytes && n_end > start_bytes;
            if overlaps && (!writers_only || n_mode == LockMode::Write) && f(self, cur).is_break() {
                return;
            }
            if let Some(l) = left {
                if reaches(self.node(l)) {
                    cur = l;
                    continue 'enter;
                }
            }
            // The right subtree starts at or after `n_start`.
            if n_start < end_bytes {
                if let Some(r) = right {
                    if reaches(self.node(r)) {
                        cur = r;
                        continue 'enter;
                    }
                }
            }
            // `cur`'s subtree is done: climb to the first ancestor whose right subtree is not.
            loop {
                assert!(
                    steps_left > 0,
                    "range lock tree walk did not end: the tree is corrupt"
                );
                steps_left -= 1;
                let Some(p) = self.node(cur).parent else {
                    return;
                };
                let pn = self.node(p);
                if pn.left == Some(cur) && pn.start_bytes < end_bytes {
                    if let Some(r) = pn.right {
                        if reaches(self.node(r)) {
                            cur = r;
                            continue 'enter;
                        }
                    }
                }
                cur = p;
            }
        }
    }

    /// Recomputes `x`'s subtree maxima from its own range and its children's; returns whether
    /// they changed.
    fn recompute_subtree_max(&mut self, x: NodePtr) -> bool {
        let n = self.node(x);
        let (left, right) = (n.left, n.right);
        let mut end_max = n.end_bytes;
        let mut write_end_max = n.write_end_bytes();
        for child in [left, right].into_iter().flatten() {
            let c = self.node(child);
            end_max = end_max.max(c.subtree_end_bytes_max);
            write_end_max = write_end_max.max(c.subtree_write_end_bytes_max);
        }
        let n = self.node(x);
        let changed =
            n.subtree_end_bytes_max != end_max || n.subtree_write_end_bytes_max != write_end_max;
        n.subtree_end_bytes_max = end_max;
        n.subtree_write_end_bytes_max = write_end_max;
        changed
    }

    /// Makes `new` take `old`'s place as a child of `parent` (or as the root).
    fn replace_child(&mut self, parent: Option<NodePtr>, old: NodePtr, new: Option<NodePtr>) {
        match parent {
            None => self.root = new,
            Some(p) => {
                let pn = self.node(p);
                if pn.left == Some(old) {
                    pn.left = new;
                } else {
                    debug_assert_eq!(pn.right, Some(old));
                    pn.right = new;
                }
            }
        }
    }

    /// Rotates `c` above its parent, keeping the key order and the subtree maxima.
    fn rotate_up(&mut self, c: NodePtr) {
        let p = self.node(c).parent.expect("rotated node has a parent");
        let grandparent = self.node(p).parent;
        let moved = if self.node(p).left == Some(c) {
            let moved = self.node(c).right;
            self.node(p).left = moved;
            self.node(c).right = Some(p);
            moved
        } else {
            let moved = self.node(c).left;
            self.node(p).right = moved;
            self.node(c).left = Some(p);
            moved
        };
        if let Some(m) = moved {
            self.node(m).parent = Some(p);
        }
        self.node(p).parent = Some(c);
        self.node(c).parent = grandparent;
        self.replace_child(grandparent, p, Some(c));
        // `c`'s new subtree holds the same nodes as `p`'s old one: the ancestors are unchanged.
        self.recompute_subtree_max(p);
        self.recompute_subtree_max(c);
    }

    /// Descends to where a request for `[start_bytes, end_bytes)` arriving now goes (key
    /// (start, seq); equal starts go right, since the newcomer has the largest seq), and tells
    /// whether any linked request overlaps the range. Every node is either on the path, in the
    /// left subtree of a node the path leaves rightwards (all start <= `start_bytes`: they
    /// overlap iff their subtree maximum ends after `start_bytes`), or in the right subtree of
    /// a node the path leaves leftwards (they start at or after that node, which overlaps if it
    /// starts before `end_bytes`). O(depth).
    fn find_slot(&mut self, start_bytes: u64, end_bytes: u64) -> (Slot, bool) {
        let mut slot = Slot {
            parent: None,
            go_left: false,
        };
        let mut overlaps_any = false;
        let mut cur = self.root;
        let mut steps_left = self.linked_count();
        while let Some(c) = cur {
            assert!(
                steps_left > 0,
                "range lock tree descent did not end: the tree is corrupt"
            );
            steps_left -= 1;
            let cn = self.node(c);
            let (c_start, c_end, left, right) = (cn.start_bytes, cn.end_bytes, cn.left, cn.right);
            slot = Slot {
                parent: Some(c),
                go_left: start_bytes < c_start,
            };
            if slot.go_left {
                overlaps_any |= c_start < end_bytes;
                cur = left;
            } else {
                overlaps_any |= c_end > start_bytes;
                if let Some(l) = left {
                    overlaps_any |= self.node(l).subtree_end_bytes_max > start_bytes;
                }
                cur = right;
            }
        }
        (slot, overlaps_any)
    }

    /// Links `x` (links cleared, maxima set to its own range) at `slot`, found by `find_slot`
    /// with no change to the tree since, then restores the heap order.
    fn tree_insert(&mut self, x: NodePtr, slot: Slot) {
        let n = self.node(x);
        let (end_max, write_end_max, priority) = (
            n.subtree_end_bytes_max,
            n.subtree_write_end_bytes_max,
            n.priority,
        );
        n.parent = slot.parent;
        let Some(parent) = slot.parent else {
            debug_assert!(self.root.is_none());
            self.root = Some(x);
            return;
        };
        if slot.go_left {
            self.node(parent).left = Some(x);
        } else {
            self.node(parent).right = Some(x);
        }
        // Every ancestor's subtree gains `x`. Stop at the first that already covers it: its
        // ancestors hold its subtree, so they cover it too.
        let mut cur = Some(parent);
        let mut steps_left = self.linked_count();
        while let Some(c) = cur {
            assert!(
                steps_left > 0,
                "range lock tree climb did not end: the tree is corrupt"
            );
            steps_left -= 1;
            let cn = self.node(c);
            if cn.subtree_end_bytes_max >= end_max
                && cn.subtree_write_end_bytes_max >= write_end_max
            {
                break;
            }
            cn.subtree_end_bytes_max = cn.subtree_end_bytes_max.max(end_max);
            cn.subtree_write_end_bytes_max = cn.subtree_write_end_bytes_max.max(write_end_max);
            cur = cn.parent;
        }
        // Restore the heap order on priorities.
        let mut steps_left = self.linked_count();
        while let Some(p) = self.node(x).parent {
            assert!(
                steps_left > 0,
                "range lock tree rotation did not end: the tree is corrupt"
            );
            steps_left -= 1;
            if self.node(p).priority >= priority {
                break;
            }
            self.rotate_up(x);
        }
    }

    /// Removes `x` from the tree.
    fn tree_remove(&mut self, x: NodePtr) {
        // Rotate `x` down (its higher-priority child up) until it has at most one child.
        let mut steps_left = self.linked_count() + 1;
        loop {
            assert!(
                steps_left > 0,
                "range lock tree rotation did not end: the tree is corrupt"
            );
            steps_left -= 1;
            let n = self.node(x);
            let (Some(l), Some(r)) = (n.left, n.right) else {
                break;
            };
            let up = if self.node(l).priority > self.node(r).priority {
                l
            } else {
                r
            };
            self.rotate_up(up);
        }
        let n = self.node(x);
        let child = n.left.or(n.right);
        let parent = n.parent;
        n.parent = None;
        n.left = None;
        n.right = None;
        if let Some(c) = child {
            self.node(c).parent = parent;
        }
        self.replace_child(parent, x, child);
        // Only the maxima on the path to the root can have included `x`; stop where one does
        // not change, since everything above depends on this subtree only through it.
        let mut cur = parent;
        let mut steps_left = self.linked_count() + 1;
        while let Some(c) = cur {
            assert!(
                steps_left > 0,
                "range lock tree climb did not end: the tree is corrupt"
            );
            steps_left -= 1;
            if !self.recompute_subtree_max(c) {
                break;
            }
            cur = self.node(c).parent;
        }
    }

    /// Whether no granted lock other than `x` overlaps `x` in a conflicting mode. Debug checks.
    fn no_granted_conflict(&mut self, x: NodePtr) -> bool {
        let n = self.node(x);
        let (start_bytes, end_bytes, mode) = (n.start_bytes, n.end_bytes, n.mode);
        let mut ok = true;
        self.for_each_overlap(
            start_bytes,
            end_bytes,
            mode == LockMode::Read,
            |state, other| {
                if other != x && state.node(other).state == NodeState::Granted {
                    ok = false;
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            },
        );
        ok
    }

    /// Checks every invariant of the state, O(n^2); for tests.
    #[cfg(test)]
    fn check_invariants(&mut self) {
        // In-order walk with an explicit stack (tests may allocate).
        let mut nodes = Vec::new();
        let mut stack = Vec::new();
        let mut cur = self.root;
        if let Some(r) = cur {
            assert_eq!(self.node(r).parent, None);
        }
        loop {
            while let Some(c) = cur {
                stack.push(c);
                cur = self.node(c).left;
            }
            let Some(c) = stack.pop() else { break };
            nodes.push(c);
            assert!(
                nodes.len() <= self.linked_count(),
                "more tree nodes than linked requests"
            );
            cur = self.node(c).right;
        }
        assert_eq!(nodes.len(), self.linked_count());
        let mut granted_count = 0;
        for (i, &x) in nodes.iter().enumerate() {
            let wake_head = self.wake_head;
            let n = self.node(x);
            let (left, right, priority, key) =
                (n.left, n.right, n.priority, (n.start_bytes, n.seq));
            assert!(n.start_bytes < n.end_bytes);
            assert_ne!(n.state, NodeState::Idle);
            assert_eq!(
                n.in_wake_queue,
                n.wake_prev.is_some() || wake_head == Some(x)
            );
            if n.in_wake_queue {
                assert_eq!(n.state, NodeState::Granted);
            }
            granted_count += usize::from(n.state == NodeState::Granted);
            for child in [left, right].into_iter().flatten() {
                let cn = self.node(child);
                assert_eq!(cn.parent, Some(x), "parent link");
                assert!(cn.priority <= priority, "heap order");
            }
            if i > 0 {
                let prev = self.node(nodes[i - 1]);
                assert!((prev.start_bytes, prev.seq) < key, "key order");
            }
            assert!(!self.recompute_subtree_max(x), "subtree maxima");
        }
        assert_eq!(granted_count, self.granted_count);
        // Blocker counts and the exclusion rule, against the definition.
        for &x in &nodes {
            let n = self.node(x);
            let (s, e, m, seq, state, blockers) = (
                n.start_bytes,
                n.end_bytes,
                n.mode,
                n.seq,
                n.state,
                n.blockers_count,
            );
            let mut expected_blockers = 0;
            for &y in &nodes {
                let o = self.node(y);
                let conflict = m == LockMode::Write || o.mode == LockMode::Write;
                if y != x && conflict && o.start_bytes < e && o.end_bytes > s {
                    if o.seq < seq {
                        expected_blockers += 1;
                    }
                    assert!(
                        !(state == NodeState::Granted && o.state == NodeState::Granted),
                        "two conflicting overlapping locks granted"
                    );
                }
            }
            match state {
                NodeState::Granted => assert_eq!(expected_blockers, 0),
                NodeState::Waiting => {
                    assert!(expected_blockers > 0);
                    assert_eq!(blockers, expected_blockers);
                }
                NodeState::Idle => unreachable!(),
            }
        }
        // Wake queue links.
        let mut cur = self.wake_head;
        let mut prev = None;
        let mut queued_count = 0;
        while let Some(c) = cur {
            queued_count += 1;
            assert!(queued_count <= nodes.len());
            let n = self.node(c);
            assert!(n.in_wake_queue);
            assert_eq!(n.wake_prev, prev);
            prev = Some(c);
            cur = n.wake_next;
        }
        assert_eq!(self.wake_tail, prev);
    }
}

/// A reader/writer lock over byte ranges of one volume. `Send + Sync`: share it by reference
/// between the reactor threads serving the volume. See the [module docs](self) for the
/// semantics, the fairness rule and the costs.
pub struct RangeLock {
    state: sync::StateMutex<State>,
}

impl RangeLock {
    /// An empty lock.
    pub const fn new() -> Self {
        Self {
            state: sync::StateMutex::new(State::new()),
        }
    }

    /// How many locks are granted (held, or granted to a future not yet polled), for tests and
    /// assertions.
    pub fn held_count(&self) -> usize {
        self.state.lock().granted_count
    }

    /// How many requests are waiting, for tests and assertions.
    pub fn waiting_count(&self) -> usize {
        self.state.lock().waiting_count
    }

    /// Takes the lock over `[offset_bytes, offset_bytes + length_bytes)` in `mode`; resolves when
    /// granted. The request takes its place in line now (see the fairness rule), not at the first
    /// poll. Dropping the future before it resolves unlinks the node (cancel-safe).
    pub fn lock<'a>(
        &'a self,
        node: Pin<&'a mut RangeLockNode>,
        offset_bytes: u64,
        length_bytes: u64,
        mode: LockMode,
    ) -> LockFuture<'a> {
        let (start_bytes, end_bytes) = clamp_range(offset_bytes, length_bytes);
        let (node_ptr, inner) = link_pointers(node);
        let granted_at_arrival =
            self.state
                .lock()
                .arrive(inner, start_bytes, end_bytes, mode, false);
        mark_linked(node_ptr);
        LockFuture {
            lock: self,
            node: Some(node_ptr),
            inner,
            granted_at_arrival,
            offset_bytes,
            length_bytes,
            mode,
            _node: PhantomData,
        }
    }

    /// Non-blocking variant of [`lock`](Self::lock): `Some(guard)` if granted immediately, `None`
    /// (the node left unlinked) if it would have to wait, including behind an earlier waiting
    /// request (the fairness rule).
    pub fn try_lock<'a>(
        &'a self,
        node: Pin<&'a mut RangeLockNode>,
        offset_bytes: u64,
        length_bytes: u64,
        mode: LockMode,
    ) -> Option<RangeGuard<'a>> {
        let (start_bytes, end_bytes) = clamp_range(offset_bytes, length_bytes);
        let (node_ptr, inner) = link_pointers(node);
        if !self
            .state
            .lock()
            .arrive(inner, start_bytes, end_bytes, mode, true)
        {
            return None;
        }
        mark_linked(node_ptr);
        Some(RangeGuard {
            lock: self,
            node: node_ptr,
            inner,
            offset_bytes,
            length_bytes,
            mode,
            _node: PhantomData,
        })
    }

    /// Unlinks a node (release of a guard, or cancel of a future) and wakes the waiters it
    /// unblocked.
    fn unlink(&self, node: NonNull<RangeLockNode>, inner: NodePtr) {
        let Some(mut state) = self.state.lock_unless_poisoned() else {
            // The state will never be read again (see `lock_unless_poisoned`), so nothing can
            // reach the node through it any more: forget the link rather than abort.
            // SAFETY: `node` is borrowed (`&'a mut`) by the guard or future calling us.
            unsafe { (*node.as_ptr()).linked = false };
            return;
        };
        // Cleared before `depart`: if it panics, the state is poisoned and never read again,
        // so the node may be freed during the unwinding.
        // SAFETY: `node` is borrowed (`&'a mut`) by the guard or future calling us.
        unsafe { (*node.as_ptr()).linked = false };
        let (own_waker, granted_now_count) = state.depart(inner);
        if granted_now_count == 0 {
            drop(state);
            drop(own_waker);
            return;
        }
        let mut batch = WakeBatch::new();
        let popped_count = state.take_wakers(&mut batch);
        drop(state);
        drop(own_waker);
        batch.wake_all();
        if popped_count < granted_now_count {
            self.drain_wake_queue(granted_now_count - popped_count, &mut batch);
        }
    }

    /// Wakes at least `debt_count` more queued nodes, or until the queue is empty: every release
    /// pops as many entries as it pushed unless the queue empties first, so no entry is left
    /// behind (entries only leave earlier when their future polls or drops).
    #[cold]
    fn drain_wake_queue(&self, mut debt_count: usize, batch: &mut WakeBatch) {
        while debt_count > 0 {
            let popped_count = self.state.lock().take_wakers(batch);
            if popped_count == 0 {
                break;
            }
            debt_count = debt_count.saturating_sub(popped_count);
            batch.wake_all();
        }
    }

    /// Checks every invariant of the state, O(n^2); for tests.
    #[cfg(test)]
    fn check_invariants(&self) {
        self.state.lock().check_invariants();
    }
}

impl Default for RangeLock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RangeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("RangeLock")
            .field("held_count", &state.granted_count)
            .field("waiting_count", &state.waiting_count)
            .finish()
    }
}

/// The pointers the future or guard keeps to its node for `'a`.
#[inline]
fn link_pointers(node: Pin<&mut RangeLockNode>) -> (NonNull<RangeLockNode>, NodePtr) {
    // SAFETY: we never move out of the node; it stays pinned where it is, and the future or
    // guard that keeps these pointers holds the `'a` borrow (PhantomData<&'a mut>).
    let node_ptr: *mut RangeLockNode = unsafe { node.get_unchecked_mut() };
    // SAFETY: `node_ptr` is valid (just derived from a `&mut`). Both pointers are derived from
    // the same raw pointer, and no reference to the whole node is formed while they are in use,
    // so the lock's accesses to `inner` and the borrower's to `linked` do not alias.
    unsafe {
        debug_assert!(
            !(*node_ptr).linked,
            "node is exclusively borrowed, so not linked"
        );
        let inner = UnsafeCell::raw_get(std::ptr::addr_of!((*node_ptr).inner));
        (
            NonNull::new_unchecked(node_ptr),
            NonNull::new_unchecked(inner),
        )
    }
}

/// Records that the node is linked. Called only once `arrive` returned: if it panicked, the
/// state is poisoned and never read again, so the node is not reachable and may be freed.
#[inline]
fn mark_linked(node: NonNull<RangeLockNode>) {
    // SAFETY: `node` comes from `link_pointers` within the `'a` borrow held by the caller.
    unsafe { (*node.as_ptr()).linked = true };
}

/// The future returned by [`RangeLock::lock`]: resolves to the [`RangeGuard`] once granted.
/// `Unpin`. Dropping it before it resolves gives up the request (cancel-safe).
#[must_use = "the request holds its place in line until the future is awaited or dropped"]
pub struct LockFuture<'a> {
    lock: &'a RangeLock,
    /// `None` once resolved: the guard then owns the node.
    node: Option<NonNull<RangeLockNode>>,
    inner: NodePtr,
    /// Granted by `lock` itself: the first poll need not take the mutex.
    granted_at_arrival: bool,
    offset_bytes: u64,
    length_bytes: u64,
    mode: LockMode,
    _node: PhantomData<&'a mut RangeLockNode>,
}

// SAFETY: the pointers stand for the `&'a mut RangeLockNode` borrow (RangeLockNode is Send) and
// are used only to unlink under the lock's mutex or to poll under it; `&RangeLock` is Send
// because RangeLock is Sync.
unsafe impl Send for LockFuture<'_> {}
// SAFETY: no method reachable through `&LockFuture` uses the pointers.
unsafe impl Sync for LockFuture<'_> {}

impl<'a> Future for LockFuture<'a> {
    type Output = RangeGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RangeGuard<'a>> {
        let this = &mut *self;
        let node = this.node.expect("LockFuture polled after it resolved");
        if !this.granted_at_arrival {
            let (granted, stale_waker) =
                this.lock.state.lock().poll_granted(this.inner, cx.waker());
            // Dropped outside the mutex: a waker's drop may run arbitrary code.
            drop(stale_waker);
            if !granted {
                return Poll::Pending;
            }
        }
        this.node = None;
        Poll::Ready(RangeGuard {
            lock: this.lock,
            node,
            inner: this.inner,
            offset_bytes: this.offset_bytes,
            length_bytes: this.length_bytes,
            mode: this.mode,
            _node: PhantomData,
        })
    }
}

impl Drop for LockFuture<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.node {
            self.lock.unlink(node, self.inner);
        }
    }
}

impl fmt::Debug for LockFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFuture")
            .field("offset_bytes", &self.offset_bytes)
            .field("length_bytes", &self.length_bytes)
            .field("mode", &self.mode)
            .field("resolved", &self.node.is_none())
            .finish()
    }
}

/// A granted range lock; releases it (and wakes the waiters that can then proceed) on drop.
#[must_use = "the range is unlocked as soon as the guard is dropped"]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    node: NonNull<RangeLockNode>,
    inner: NodePtr,
    offset_bytes: u64,
    length_bytes: u64,
    mode: LockMode,
    _node: PhantomData<&'a mut RangeLockNode>,
}

// SAFETY: as for LockFuture: the pointers stand for the `&'a mut RangeLockNode` borrow and are
// used only in `drop`, under the lock's mutex.
unsafe impl Send for RangeGuard<'_> {}
// SAFETY: no method reachable through `&RangeGuard` uses the pointers.
unsafe impl Sync for RangeGuard<'_> {}

impl RangeGuard<'_> {
    /// The offset passed to `lock`.
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// The length passed to `lock` (0 locks one byte).
    pub fn length_bytes(&self) -> u64 {
        self.length_bytes
    }

    /// The mode the range is held in.
    pub fn mode(&self) -> LockMode {
        self.mode
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.lock.unlink(self.node, self.inner);
    }
}

impl fmt::Debug for RangeGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeGuard")
            .field("offset_bytes", &self.offset_bytes)
            .field("length_bytes", &self.length_bytes)
            .field("mode", &self.mode)
            .finish()
    }
}

#[cfg(test)]
mod tests;
