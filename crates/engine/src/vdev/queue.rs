//! The vdev queue: a per-leaf-device I/O scheduler with ZFS's priority classes and their
//! minimum and maximum active limits (OpenZFS `vdev_queue.c`), and the `scheduler` property
//! that decides when it is bypassed.
//!
//! # Classes and limits
//!
//! Every leaf I/O names its [`IoClass`]. Per leaf, at most [`LEAF_ACTIVE_MAX`] I/Os are active
//! (issued to the device), and of each class at most its `max_active`. When a slot frees, the
//! next I/O is chosen as ZFS's `vdev_queue_class_to_issue` does: first, round-robin over the
//! classes, one with waiters that is below its `min_active` (so no class starves, however busy
//! the higher ones); then, strictly by priority, the first class with waiters below its
//! `max_active`. Within a class, I/Os are issued in arrival order (FIFO; ZFS sorts the async
//! classes by offset, which pays on disks with heads, not on the flash and files this targets).
//! The limits are ZFS's defaults ([`CLASS_LIMITS`]); see there for why they hold here.
//!
//! # Bypass: the `scheduler` property
//!
//! - `on`: every I/O goes through the queue (takes its lock), as in ZFS.
//! - `off`: no I/O does: it is issued at once and only counted (a few atomic adds and a
//!   subtract).
//! - `auto` (default): an I/O bypasses the queue when **nothing waits in this leaf's queue**,
//!   the leaf has fewer than [`LEAF_ACTIVE_MAX`] I/Os active, and either
//!   1. its class is below its `max_active`: the queue would admit it at once anyway, so
//!      bypassing changes no decision and only saves the lock; or
//!   2. **the device keeps up**: its recent device time per I/O (an average over about the
//!      last eight completions) is under [`AUTO_DISK_WAIT_US_MAX`], and the device is not
//!      **saturated**: within the last [`AUTO_SATURATED_HOLD_IOS`] admissions its sync reads'
//!      recent time has not reached [`AUTO_SATURATED_FACTOR`] times their time when they ran
//!      alone (and [`AUTO_SATURATED_US_MIN`]). Then the class limits are not
//!      enforced, because a device that answers within a millisecond and in parallel leaves
//!      nothing for a priority order to win and the limits would only cap its parallelism
//!      (ZFS's sync read limit of 10 would hold a queue-depth-64 client to 10 device I/Os).
//!
//!   A saturated device serves a burst one I/O after another: the burst's last I/O waits for
//!   all the others whether it waits in the device or here, so the limits cost the burst
//!   little, and they spread it. That matters when what follows the device keeps a burst
//!   together: with a fixed time after each read (the 4 ms `oxpool inject` adds in
//!   `bench/async_latency.sh`), the reads of a burst that reach the device together
//!   complete together, their replies leave together and the client sends the next burst
//!   together, round after round, each time waiting for the device to work through it (see
//!   `docs/io-scheduling.md` for the measurements). Flash that serves a burst in parallel
//!   stays bypassed.
//!
//!   Otherwise the I/O queues, and once anything waits, every later I/O of the leaf queues
//!   behind it until the queue drains: whenever the device is slow or saturated and classes
//!   compete, the priority order and the min guarantees decide. A spinning disk (4-10 ms per
//!   random I/O) never keeps up, so it gets ZFS's scheduling; flash at moderate depth does.
//!   OpenZFS's own `scheduler=auto` (PR 17358) bypasses for non-rotational block devices, a
//!   declared property; this rule measures the same thing.
//!
//! Bypassed I/Os are counted in the active counts (OpenZFS PR 16591 was rejected partly
//! because its bypassed I/Os were invisible to the queue), so a mode change at run time or a
//! switch between bypassing and queueing keeps the limits meaningful. The check-then-count of
//! a bypass is not atomic: concurrent bypassers may exceed a limit by the number of threads
//! racing, which the limits tolerate (they are throughput heuristics, not safety bounds).
//!
//! # Concurrency and cost
//!
//! A leaf is shared by every reactor thread. The queue state is one short `Mutex` section per
//! queued I/O (enqueue and admission) plus the active counters as atomics. A waiting I/O parks
//! its [`Waker`] in a slot of a slab owned by the queue; slots are linked into per-class FIFO
//! lists by index, so waiting allocates nothing once the slab has grown to the most I/Os ever
//! waiting at once (it starts with [`QUEUE_SLOTS_PREALLOCATED`] and never shrinks). A release
//! admits the next waiters under the lock, takes their wakers out and wakes them after
//! dropping it; the woken I/O finds itself admitted and issues on its own thread.
//!
//! Cancel safety: dropping a waiting [`AdmitFuture`] unlinks its slot; dropping one that was
//! admitted but not yet polled, or dropping an [`Admission`], releases the active slot and
//! admits the next waiter.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The priority class of a leaf I/O, highest first (ZFS's `zio_priority_t`, the classes this
/// engine issues).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoClass {
    /// A read a client waits for: volume data and the tree blocks leading to it, pool import.
    SyncRead = 0,
    /// A write a client waits for: the intent log.
    SyncWrite = 1,
    /// A read nobody waits for yet: tree blocks the txg sync needs.
    AsyncRead = 2,
    /// The txg sync's writes, and self-healing rewrites.
    AsyncWrite = 3,
    /// Scrub reads.
    Scrub = 4,
}

/// Number of [`IoClass`]es.
pub const IO_CLASS_COUNT: usize = 5;

impl IoClass {
    /// Every class, in priority order.
    pub const ALL: [IoClass; IO_CLASS_COUNT] = [
        IoClass::SyncRead,
        IoClass::SyncWrite,
        IoClass::AsyncRead,
        IoClass::AsyncWrite,
        IoClass::Scrub,
    ];

    /// Index into per-class arrays (0 = highest priority).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name `oxpool iostat` shows.
    pub fn name(self) -> &'static str {
        match self {
            IoClass::SyncRead => "sync_read",
            IoClass::SyncWrite => "sync_write",
            IoClass::AsyncRead => "async_read",
            IoClass::AsyncWrite => "async_write",
            IoClass::Scrub => "scrub",
        }
    }
}

/// How many I/Os of a class may be active on one leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassLimits {
    /// Guaranteed: the class is served ahead of strict priority while below this.
    pub min_active: u32,
    /// Never more active (through the queue) than this.
    pub max_active: u32,
}

/// Per-class limits, indexed by [`IoClass::index`]: OpenZFS's defaults
/// (`zfs_vdev_{sync_read,sync_write,async_read,async_write,scrub}_{min,max}_active`, with
/// scrub's max at 2 as in OpenZFS 2.1; 2.2 raised it to 3). They are kept because they only
/// apply when the device does not keep up (see the module documentation): then the device is
/// the bottleneck, and ZFS's numbers are the ones tuned for keeping sync latency low under a
/// txg sync or a scrub: sync classes 10 each, async writes 2 to 10, scrub 1 to 2.
/// ZFS scales the async write maximum with the dirty data; here it is fixed at 10, because
/// the txg sync bounds its writes in flight itself (64 blocks).
pub const CLASS_LIMITS: [ClassLimits; IO_CLASS_COUNT] = [
    ClassLimits {
        min_active: 10,
        max_active: 10,
    },
    ClassLimits {
        min_active: 10,
        max_active: 10,
    },
    ClassLimits {
        min_active: 1,
        max_active: 3,
    },
    ClassLimits {
        min_active: 2,
        max_active: 10,
    },
    ClassLimits {
        min_active: 1,
        max_active: 2,
    },
];

/// The scrub class's `max_active` while the leaf is idle: no I/O of another class active,
/// and at least [`SCRUB_IDLE_AFTER_COMPLETIONS`] scrub I/Os completed since the last one
/// began and ended (ZFS's non-interactive rule, `zfs_vdev_nia_delay`). A scan of a pool nobody is using
/// then reads at the device's pace instead of two column reads at a time (measured: a
/// raidz2 scrub 15-20 % slower than with the queue bypassed); the first client I/O puts it
/// back at [`CLASS_LIMITS`]' limit until it has been alone again for a while. The async read
/// class's limit: what the engine's own background reads get.
pub const SCRUB_IDLE_MAX_ACTIVE: u32 = 10;

/// Scrub completions without another class's I/O before the leaf counts as idle (ZFS's
/// `zfs_vdev_nia_delay` default).
pub const SCRUB_IDLE_AFTER_COMPLETIONS: u32 = 5;

/// Most I/Os active on one leaf, whatever their class (ZFS's `zfs_vdev_max_active`). Also
/// bounds the bypass of `auto`.
pub const LEAF_ACTIVE_MAX: u32 = 1000;

/// `scheduler=auto`: a device whose recent device time per I/O is below this keeps up, and
/// its I/Os bypass the queue. 1 ms sits between flash (tens to hundreds of microseconds, even
/// at queue depth 32) and a spinning disk's seek and rotation (4 ms and up), by a factor of
/// three or more on each side.
pub const AUTO_DISK_WAIT_US_MAX: u64 = 1000;

/// `scheduler=auto`: a device whose recent time per sync read reaches this many times their
/// time when they ran alone is saturated (serves a burst one I/O after another) and gets the
/// class limits. Flash that works in parallel stays under it: by Little's law, a drive rated
/// at 1M 4 KiB reads per second at depth 128 that answers one read in 80 us answers each in
/// 128 us at that depth, 1.6 times. A device serving a burst serially passes it at a depth
/// of 3 to 6 (the virtio disk of `docs/io-scheduling.md`: 50 us alone, 96 us at depth 4,
/// 271 us at 10, 460 us at 20). 3 rather than 4: with 4 the 4 ms test reached 91-99 % of
/// its goal, with 3 94-101 %.
pub const AUTO_SATURATED_FACTOR: u64 = 3;

/// `scheduler=auto`: for how many admissions (I/Os) a device seen saturated counts as
/// saturated, whatever their times. The limits keep a saturated device's queue short, and so
/// its time per I/O low: judged by that time alone, the limits would lift as soon as they
/// worked and the bursts would form again (measured: 87-91 % of the 4 ms test's goal without
/// the hold, 94-101 % with it). 4096 I/Os is a third of a second at 12K reads per second.
pub const AUTO_SATURATED_HOLD_IOS: u64 = 4096;

/// `scheduler=auto`: a sync read's time alone older than this many admissions does not find
/// a device saturated anew (nothing does until a new one comes). One measured long ago (at
/// import, before a cloud disk's burst credits ran out) says nothing about the device now,
/// and a stale low one would hold the limits for as long as the load lasts. A hold in
/// progress keeps using it: under constant load no read runs alone, and dropping the
/// limits then would let the bursts back.
pub const AUTO_ALONE_FRESH_IOS: u64 = 1 << 16;

/// `scheduler=auto`: a recent time per sync read under this is never saturation: a burst that
/// costs less than this leaves nothing to spread (fast flash going from 20 to 90 us).
pub const AUTO_SATURATED_US_MIN: u64 = 150;

/// Waiting slots each queue allocates up front (more are added if more I/Os ever wait at once).
pub const QUEUE_SLOTS_PREALLOCATED: usize = 256;

/// Hard bound on I/Os waiting in one queue: far above anything the engine issues (requests in
/// flight are bounded by the NBD request slots and the txg sync's writes in flight), so
/// reaching it is a bug.
const QUEUED_MAX: u32 = 1 << 20;

/// Wakers taken out of the lock per round of admissions.
const WAKE_BATCH_COUNT: usize = 16;

/// End of a slot list.
const NIL: u32 = u32::MAX;

/// The `scheduler` property of a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulerMode {
    /// Bypass while the device keeps up (see the module documentation).
    #[default]
    Auto = 0,
    /// Always queue.
    On = 1,
    /// Never queue.
    Off = 2,
}

impl SchedulerMode {
    /// Parses `auto`, `on` or `off`.
    pub fn parse(v: &str) -> Option<SchedulerMode> {
        match v {
            "auto" => Some(SchedulerMode::Auto),
            "on" => Some(SchedulerMode::On),
            "off" => Some(SchedulerMode::Off),
            _ => None,
        }
    }

    /// The property value.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulerMode::Auto => "auto",
            SchedulerMode::On => "on",
            SchedulerMode::Off => "off",
        }
    }

    fn from_u8(v: u8) -> SchedulerMode {
        match v {
            1 => SchedulerMode::On,
            2 => SchedulerMode::Off,
            _ => SchedulerMode::Auto,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Waiting,
    Admitted,
}

/// One waiting I/O: a node of its class's FIFO list (or of the free list).
#[derive(Debug)]
struct Slot {
    prev: u32,
    next: u32,
    class: u8,
    state: SlotState,
    waker: Option<Waker>,
    /// Once admitted: its admission number if no other I/O was active then
    /// ([`Admission::ran_alone`]).
    alone_admission: Option<u64>,
}

/// A FIFO list of slots, linked through the slab.
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// What the mutex guards.
#[derive(Debug)]
struct QueueState {
    slots: Vec<Slot>,
    /// Free slots, linked through `next`.
    free_head: u32,
    /// Waiting I/Os per class, oldest first.
    waiting: [List; IO_CLASS_COUNT],
    /// The class the last min-pass admission chose (the round robin starts after it).
    last_min_class: usize,
}

impl QueueState {
    fn with_slots(n: usize) -> QueueState {
        let mut st = QueueState {
            slots: Vec::with_capacity(n),
            free_head: NIL,
            waiting: [List::EMPTY; IO_CLASS_COUNT],
            last_min_class: IO_CLASS_COUNT - 1,
        };
        for _ in 0..n {
            let idx = st.new_slot();
            st.free(idx);
        }
        st
    }

    fn new_slot(&mut self) -> u32 {
        let idx = u32::try_from(self.slots.len()).expect("queue slots fit in u32");
        self.slots.push(Slot {
            prev: NIL,
            next: NIL,
            class: 0,
            state: SlotState::Free,
            waker: None,
            alone_admission: None,
        });
        idx
    }

    fn free(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        debug_assert!(s.waker.is_none());
        s.state = SlotState::Free;
        s.alone_admission = None;
        s.prev = NIL;
        s.next = self.free_head;
        self.free_head = idx;
    }

    /// Appends a waiting slot of `class`; grows the slab only past its high-water mark.
    fn push_waiting(&mut self, class: IoClass) -> u32 {
        let idx = if self.free_head != NIL {
            let idx = self.free_head;
            self.free_head = self.slots[idx as usize].next;
            idx
        } else {
            self.new_slot()
        };
        let c = class.index();
        let tail = self.waiting[c].tail;
        {
            let s = &mut self.slots[idx as usize];
            debug_assert_eq!(s.state, SlotState::Free);
            s.state = SlotState::Waiting;
            s.class = c as u8;
            s.prev = tail;
            s.next = NIL;
        }
        if tail == NIL {
            self.waiting[c].head = idx;
        } else {
            self.slots[tail as usize].next = idx;
        }
        self.waiting[c].tail = idx;
        self.waiting[c].len += 1;
        idx
    }

    /// Unlinks a waiting slot from its class list (it stays allocated).
    fn unlink(&mut self, idx: u32) {
        let (c, prev, next) = {
            let s = &self.slots[idx as usize];
            debug_assert_eq!(s.state, SlotState::Waiting);
            (s.class as usize, s.prev, s.next)
        };
        if prev == NIL {
            self.waiting[c].head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.waiting[c].tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        debug_assert!(self.waiting[c].len > 0);
        self.waiting[c].len -= 1;
        let s = &mut self.slots[idx as usize];
        s.prev = NIL;
        s.next = NIL;
    }

    fn waiting_total(&self) -> u32 {
        self.waiting.iter().map(|l| l.len).sum()
    }
}

/// Counters of one leaf's queue.
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// I/Os that went through the queue, per class.
    pub queued: [AtomicU64; IO_CLASS_COUNT],
    /// I/Os that bypassed it, per class.
    pub bypassed: [AtomicU64; IO_CLASS_COUNT],
}

/// A point-in-time copy of a queue's counters and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueSnapshot {
    /// See [`QueueCounters::queued`].
    pub queued: [u64; IO_CLASS_COUNT],
    /// See [`QueueCounters::bypassed`].
    pub bypassed: [u64; IO_CLASS_COUNT],
    /// I/Os active now, per class.
    pub active: [u32; IO_CLASS_COUNT],
    /// I/Os waiting now.
    pub waiting: u32,
    /// Recent device time per I/O, microseconds (the `auto` rule's measure).
    pub disk_wait_recent_us: u64,
    /// Recent device time per sync read, microseconds (the saturation rule's measure).
    /// This and the next two are absent from a server older than these fields.
    #[serde(default)]
    pub sync_read_disk_wait_us: u64,
    /// Recent device time of a sync read that ran alone, microseconds (0: none, or none
    /// within [`AUTO_ALONE_FRESH_IOS`]).
    #[serde(default)]
    pub sync_read_disk_wait_alone_us: u64,
    /// Whether `auto` holds the class limits now: the device does not keep up (slow, or
    /// saturated). False unless `scheduler=auto` (`on` always applies them, `off` never).
    #[serde(default)]
    pub limited: bool,
}

/// The scheduler of one leaf device (see the module documentation).
#[derive(Debug)]
pub struct VdevQueue {
    mode: AtomicU8,
    limits: [ClassLimits; IO_CLASS_COUNT],
    active_max: u32,
    /// Active I/Os per class, queued and bypassed.
    active: [AtomicU32; IO_CLASS_COUNT],
    active_total: AtomicU32,
    /// I/Os waiting; mirrors the lists' lengths so bypass and release can read it without the
    /// lock. Changed only under the lock.
    waiting_total: AtomicU32,
    /// Exponentially weighted average of the device time per I/O (weight 1/8), microseconds.
    disk_wait_recent_us: AtomicU64,
    /// The same average over the sync reads (saturation compares like with like: a large
    /// write is slower than a small read without any queue).
    sync_read_disk_wait_us: AtomicU64,
    /// The same average over the sync reads that ran alone ([`Admission::ran_alone`]; 0: none
    /// yet).
    sync_read_disk_wait_alone_us: AtomicU64,
    /// `admissions` at the last sample of `sync_read_disk_wait_alone_us`: how old it is.
    sync_read_alone_admission: AtomicU64,
    /// I/Os admitted on this leaf, ever (queued or bypassed): whether another I/O was admitted
    /// while one ran, and the clock of the saturation hold.
    admissions: AtomicU64,
    /// The device counts as saturated while `admissions` is below this (see
    /// [`AUTO_SATURATED_HOLD_IOS`]).
    saturated_until_admission: AtomicU64,
    /// Scrub I/Os completed since the last I/O of another class began (saturating at
    /// [`SCRUB_IDLE_AFTER_COMPLETIONS`]): whether the leaf is idle for a scrub.
    scrub_alone: AtomicU32,
    state: Mutex<QueueState>,
    /// Queued and bypassed I/Os.
    pub counters: QueueCounters,
}

impl Default for VdevQueue {
    fn default() -> Self {
        VdevQueue::new()
    }
}

impl VdevQueue {
    /// A queue with the default limits and `scheduler=auto`.
    pub fn new() -> VdevQueue {
        VdevQueue::with_limits(CLASS_LIMITS, LEAF_ACTIVE_MAX)
    }

    /// A queue with other limits (tests).
    pub fn with_limits(limits: [ClassLimits; IO_CLASS_COUNT], active_max: u32) -> VdevQueue {
        assert!(limits
            .iter()
            .all(|l| l.min_active <= l.max_active && l.max_active > 0));
        assert!(active_max > 0);
        VdevQueue {
            mode: AtomicU8::new(SchedulerMode::Auto as u8),
            limits,
            active_max,
            active: Default::default(),
            active_total: AtomicU32::new(0),
            waiting_total: AtomicU32::new(0),
            disk_wait_recent_us: AtomicU64::new(0),
            sync_read_disk_wait_us: AtomicU64::new(0),
            sync_read_disk_wait_alone_us: AtomicU64::new(0),
            sync_read_alone_admission: AtomicU64::new(0),
            admissions: AtomicU64::new(0),
            saturated_until_admission: AtomicU64::new(0),
            scrub_alone: AtomicU32::new(0),
            state: Mutex::new(QueueState::with_slots(QUEUE_SLOTS_PREALLOCATED)),
            counters: QueueCounters::default(),
        }
    }

    /// The `scheduler` mode.
    pub fn mode(&self) -> SchedulerMode {
        SchedulerMode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    /// Changes the `scheduler` mode; I/Os already waiting are still admitted as slots free.
    pub fn set_mode(&self, mode: SchedulerMode) {
        self.mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Waits until an I/O of `class` may be issued. The returned [`Admission`] holds its active
    /// slot until dropped.
    pub fn admit(&self, class: IoClass) -> AdmitFuture<'_> {
        AdmitFuture {
            queue: self,
            class,
            state: AdmitState::Start,
        }
    }

    /// Feeds the `auto` rule the device time of an I/O of `class`; `alone`: it ran alone
    /// ([`Admission::ran_alone`]).
    pub fn note_disk_wait(&self, class: IoClass, disk_wait: Duration, alone: bool) {
        let sample = u64::try_from(disk_wait.as_micros()).unwrap_or(u64::MAX);
        average_in(&self.disk_wait_recent_us, sample);
        if class != IoClass::SyncRead {
            return;
        }
        let recent = average_in(&self.sync_read_disk_wait_us, sample);
        let now = self.admissions.load(Ordering::Relaxed);
        if alone {
            // A first (or stale) sample is taken whole: an average starting from 0, or from
            // what the device did long ago, would take dozens of samples to mean anything.
            if self.sync_read_alone_us(now) == 0 {
                self.sync_read_disk_wait_alone_us
                    .store(sample.max(1), Ordering::Relaxed);
            } else {
                average_in(&self.sync_read_disk_wait_alone_us, sample);
            }
            self.sync_read_alone_admission.store(now, Ordering::Relaxed);
        }
        // A hold in progress keeps its time alone however old: under constant load no read
        // runs alone, and forgetting it would lift the limits and let the bursts back.
        let alone_us = if self.saturated() {
            self.sync_read_disk_wait_alone_us.load(Ordering::Relaxed)
        } else {
            self.sync_read_alone_us(now)
        };
        if alone_us > 0
            && recent >= AUTO_SATURATED_US_MIN
            && recent >= alone_us.saturating_mul(AUTO_SATURATED_FACTOR)
        {
            // A deadline, not a count down: nothing to write per I/O while it holds, and no
            // racing decrement to undo a fresh hold.
            self.saturated_until_admission.store(
                now.saturating_add(AUTO_SATURATED_HOLD_IOS),
                Ordering::Relaxed,
            );
        }
    }

    /// The sync reads' recent time alone, microseconds, if it is fresh (sampled within the
    /// last [`AUTO_ALONE_FRESH_IOS`] admissions); else 0.
    fn sync_read_alone_us(&self, now: u64) -> u64 {
        let at = self.sync_read_alone_admission.load(Ordering::Relaxed);
        if now.saturating_sub(at) > AUTO_ALONE_FRESH_IOS {
            return 0;
        }
        self.sync_read_disk_wait_alone_us.load(Ordering::Relaxed)
    }

    /// Whether the device is saturated (see [`AUTO_SATURATED_FACTOR`]): within the last
    /// [`AUTO_SATURATED_HOLD_IOS`] admissions its sync reads' recent time reached many
    /// times their time alone.
    fn saturated(&self) -> bool {
        self.admissions.load(Ordering::Relaxed)
            < self.saturated_until_admission.load(Ordering::Relaxed)
    }

    /// Whether the device keeps up (the second half of `auto`'s rule): then the class limits
    /// are lifted.
    fn keeps_up(&self) -> bool {
        self.disk_wait_recent_us.load(Ordering::Relaxed) < AUTO_DISK_WAIT_US_MAX
            && !self.saturated()
    }

    /// Counters and gauges.
    pub fn snapshot(&self) -> QueueSnapshot {
        let mut s = QueueSnapshot {
            waiting: self.waiting_total.load(Ordering::Relaxed),
            disk_wait_recent_us: self.disk_wait_recent_us.load(Ordering::Relaxed),
            sync_read_disk_wait_us: self.sync_read_disk_wait_us.load(Ordering::Relaxed),
            sync_read_disk_wait_alone_us: self
                .sync_read_alone_us(self.admissions.load(Ordering::Relaxed)),
            limited: self.mode() == SchedulerMode::Auto && !self.keeps_up(),
            ..Default::default()
        };
        for c in 0..IO_CLASS_COUNT {
            s.queued[c] = self.counters.queued[c].load(Ordering::Relaxed);
            s.bypassed[c] = self.counters.bypassed[c].load(Ordering::Relaxed);
            s.active[c] = self.active[c].load(Ordering::Relaxed);
        }
        s
    }

    /// Whether an I/O of `class` skips the queue now.
    fn bypasses(&self, class: IoClass) -> bool {
        match self.mode() {
            SchedulerMode::Off => true,
            SchedulerMode::On => false,
            SchedulerMode::Auto => {
                self.waiting_total.load(Ordering::SeqCst) == 0
                    && self.active_total.load(Ordering::SeqCst) < self.active_max
                    && (self.active[class.index()].load(Ordering::SeqCst)
                        < self.max_active(class.index())
                        || self.keeps_up())
            }
        }
    }

    /// Counts an I/O of class `c` active; its admission number, if it is the only one
    /// active (see [`Admission::ran_alone`]).
    fn count_active(&self, c: usize) -> Option<u64> {
        self.active[c].fetch_add(1, Ordering::SeqCst);
        let seq = self.admissions.fetch_add(1, Ordering::SeqCst);
        let others = self.active_total.fetch_add(1, Ordering::SeqCst);
        // Another class's I/O ends the leaf's idleness for the scrub; read first, so that
        // a busy leaf does not write the line on every I/O.
        if c != IoClass::Scrub.index() && self.scrub_alone.load(Ordering::Relaxed) != 0 {
            self.scrub_alone.store(0, Ordering::Relaxed);
        }
        (others == 0).then_some(seq)
    }

    /// Class `c`'s `max_active` now: its limit, or for the scrub on an idle leaf
    /// [`SCRUB_IDLE_MAX_ACTIVE`].
    fn max_active(&self, c: usize) -> u32 {
        let limit = self.limits[c].max_active;
        if c != IoClass::Scrub.index() {
            return limit;
        }
        // Two loads, not one snapshot: an admission or completion between them can make the
        // second larger (a debug build panicked on the underflow in a crash test).
        let others_active = self
            .active_total
            .load(Ordering::SeqCst)
            .saturating_sub(self.active[c].load(Ordering::SeqCst));
        let idle = others_active == 0
            && self.scrub_alone.load(Ordering::Relaxed) >= SCRUB_IDLE_AFTER_COMPLETIONS;
        if idle {
            limit.max(SCRUB_IDLE_MAX_ACTIVE)
        } else {
            limit
        }
    }

    /// Chooses the class of the next admission (ZFS's `vdev_queue_class_to_issue`).
    fn class_to_issue(&self, st: &mut QueueState) -> Option<usize> {
        if self.active_total.load(Ordering::SeqCst) >= self.active_max {
            return None;
        }
        // Min pass, round robin: every class below its guarantee gets its turn.
        for k in 1..=IO_CLASS_COUNT {
            let c = (st.last_min_class + k) % IO_CLASS_COUNT;
            if st.waiting[c].len > 0
                && self.active[c].load(Ordering::SeqCst) < self.limits[c].min_active
            {
                st.last_min_class = c;
                return Some(c);
            }
        }
        // Max pass, strict priority.
        (0..IO_CLASS_COUNT).find(|&c| {
            st.waiting[c].len > 0 && self.active[c].load(Ordering::SeqCst) < self.max_active(c)
        })
    }

    /// Admits waiters while the limits allow, at most one batch of wakers per call; returns
    /// whether the batch filled (call again after waking it).
    fn dispatch(&self, st: &mut QueueState, wake: &mut WakeBatch) -> bool {
        while wake.len < WAKE_BATCH_COUNT {
            let Some(c) = self.class_to_issue(st) else {
                return false;
            };
            let idx = st.waiting[c].head;
            debug_assert_ne!(idx, NIL);
            st.unlink(idx);
            let slot = &mut st.slots[idx as usize];
            slot.state = SlotState::Admitted;
            // The I/O that is enqueueing itself has no waker yet: it sees its admission
            // before it returns.
            if let Some(w) = slot.waker.take() {
                wake.push(w);
            }
            let alone_admission = self.count_active(c);
            st.slots[idx as usize].alone_admission = alone_admission;
            self.waiting_total.fetch_sub(1, Ordering::SeqCst);
        }
        true
    }

    /// Runs admissions until the limits stop them, waking the admitted outside the lock.
    fn dispatch_and_wake(&self) {
        // Bounded: each round admits a full batch, and at most the waiting I/Os are admitted.
        loop {
            let mut wake = WakeBatch::new();
            let more = {
                let mut st = self.state.lock().unwrap();
                self.dispatch(&mut st, &mut wake)
            };
            wake.wake_all();
            if !more {
                return;
            }
        }
    }

    /// Gives back one active slot of class `c` and admits waiters that may now run.
    fn release(&self, c: usize) {
        // Idleness is counted in scrub completions after the other classes' last I/O ended
        // (and began: `count_active`).
        let alone = self.scrub_alone.load(Ordering::Relaxed);
        if c == IoClass::Scrub.index() {
            if alone < SCRUB_IDLE_AFTER_COMPLETIONS {
                self.scrub_alone.fetch_add(1, Ordering::Relaxed);
            }
        } else if alone != 0 {
            self.scrub_alone.store(0, Ordering::Relaxed);
        }
        let before = self.active[c].fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "release of an inactive class");
        self.active_total.fetch_sub(1, Ordering::SeqCst);
        // SeqCst pairs with the enqueuer: it counts itself waiting and then reads the active
        // counts, we drop the count and then read the waiting count, so at least one of us
        // sees the other and the waiter is admitted.
        if self.waiting_total.load(Ordering::SeqCst) > 0 {
            self.dispatch_and_wake();
        }
    }
}

/// Moves the average in `avg` (weight 1/8) towards `sample` and returns the new average. A
/// racy read-modify-write: concurrent completions may lose a sample, which an average
/// tolerates; a CAS loop would cost more than the sample is worth.
fn average_in(avg: &AtomicU64, sample: u64) -> u64 {
    let old = avg.load(Ordering::Relaxed);
    let new = old - old / 8 + sample / 8;
    avg.store(new, Ordering::Relaxed);
    new
}

/// Wakers to wake after the lock is dropped (a waker may run arbitrary code).
struct WakeBatch {
    wakers: [Option<Waker>; WAKE_BATCH_COUNT],
    len: usize,
}

impl WakeBatch {
    fn new() -> WakeBatch {
        WakeBatch {
            wakers: Default::default(),
            len: 0,
        }
    }

    fn push(&mut self, w: Waker) {
        assert!(self.len < WAKE_BATCH_COUNT);
        self.wakers[self.len] = Some(w);
        self.len += 1;
    }

    fn wake_all(&mut self) {
        for w in self.wakers[..self.len].iter_mut() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
        self.len = 0;
    }
}

#[derive(Debug)]
enum AdmitState {
    /// Not polled yet.
    Start,
    /// Waiting in slot `idx`.
    Waiting(u32),
    /// Resolved (the admission was handed out).
    Done,
}

/// Waits for an active slot (see [`VdevQueue::admit`]).
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct AdmitFuture<'a> {
    queue: &'a VdevQueue,
    class: IoClass,
    state: AdmitState,
}

/// Permission to have one I/O of a class active on a leaf; dropping it gives the slot back.
#[derive(Debug)]
pub struct Admission<'a> {
    queue: &'a VdevQueue,
    class: IoClass,
    /// Whether the I/O waited in the queue (false: bypassed, or admitted at once).
    waited: bool,
    /// Its admission number if no other I/O was active on the leaf when it was admitted.
    alone_admission: Option<u64>,
}

impl Admission<'_> {
    /// Whether the I/O had to wait for its slot.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// Whether the I/O has run alone so far: no other I/O was active on the leaf when it was
    /// admitted, and none was admitted since. Asked when it completes, its device time is
    /// the device's own, with nothing ahead of it or beside it
    /// ([`VdevQueue::note_disk_wait`]). The first I/O of a burst is admitted alone but
    /// shares the device with the rest of the burst: not alone.
    ///
    /// Approximate by design: an admission's two counts (admissions, active) are separate
    /// atomics, so two I/Os admitted at the same instant on two threads may both look alone
    /// for a moment; the rare sample that results only pulls an average up, towards
    /// bypassing. Flushes are not admitted, so an I/O beside a flush counts as alone.
    pub fn ran_alone(&self) -> bool {
        self.alone_admission
            .is_some_and(|seq| self.queue.admissions.load(Ordering::SeqCst) == seq.wrapping_add(1))
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.queue.release(self.class.index());
    }
}

impl<'a> Future for AdmitFuture<'a> {
    type Output = Admission<'a>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Admission<'a>> {
        let this = self.get_mut();
        let q = this.queue;
        let c = this.class.index();
        match this.state {
            AdmitState::Start => {
                if q.bypasses(this.class) {
                    let alone_admission = q.count_active(c);
                    q.counters.bypassed[c].fetch_add(1, Ordering::Relaxed);
                    this.state = AdmitState::Done;
                    return Poll::Ready(Admission {
                        queue: q,
                        class: this.class,
                        waited: false,
                        alone_admission,
                    });
                }
                q.counters.queued[c].fetch_add(1, Ordering::Relaxed);
                let mut wake = WakeBatch::new();
                let mut alone_admission = None;
                let admitted_at_once = {
                    let mut st = q.state.lock().unwrap();
                    let waiting = q.waiting_total.fetch_add(1, Ordering::SeqCst);
                    assert!(waiting < QUEUED_MAX, "vdev queue overflow");
                    let idx = st.push_waiting(this.class);
                    // Only this new waiter can have become admissible (every release
                    // dispatches), so one batch suffices here.
                    q.dispatch(&mut st, &mut wake);
                    debug_assert_eq!(st.waiting_total(), q.waiting_total.load(Ordering::SeqCst));
                    if st.slots[idx as usize].state == SlotState::Admitted {
                        alone_admission = st.slots[idx as usize].alone_admission;
                        st.free(idx);
                        true
                    } else {
                        st.slots[idx as usize].waker = Some(cx.waker().clone());
                        this.state = AdmitState::Waiting(idx);
                        false
                    }
                };
                wake.wake_all();
                if admitted_at_once {
                    this.state = AdmitState::Done;
                    Poll::Ready(Admission {
                        queue: q,
                        class: this.class,
                        waited: false,
                        alone_admission,
                    })
                } else {
                    Poll::Pending
                }
            }
            AdmitState::Waiting(idx) => {
                let mut st = q.state.lock().unwrap();
                let slot = &mut st.slots[idx as usize];
                if slot.state == SlotState::Admitted {
                    debug_assert!(slot.waker.is_none());
                    let alone_admission = slot.alone_admission;
                    st.free(idx);
                    drop(st);
                    this.state = AdmitState::Done;
                    return Poll::Ready(Admission {
                        queue: q,
                        class: this.class,
                        waited: true,
                        alone_admission,
                    });
                }
                debug_assert_eq!(slot.state, SlotState::Waiting);
                match &mut slot.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    w => *w = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            AdmitState::Done => panic!("AdmitFuture polled after completion"),
        }
    }
}

impl Drop for AdmitFuture<'_> {
    fn drop(&mut self) {
        let AdmitState::Waiting(idx) = self.state else {
            return;
        };
        let q = self.queue;
        let (admitted, waker) = {
            let mut st = q.state.lock().unwrap();
            let admitted = st.slots[idx as usize].state == SlotState::Admitted;
            if !admitted {
                st.unlink(idx);
                q.waiting_total.fetch_sub(1, Ordering::SeqCst);
            }
            let waker = st.slots[idx as usize].waker.take();
            st.free(idx);
            (admitted, waker)
        };
        // Dropped outside the lock: a waker's drop may run arbitrary code.
        drop(waker);
        if admitted {
            // Admitted but never told: give the slot to the next waiter.
            q.release(self.class.index());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;

    fn limits(min_max: [(u32, u32); IO_CLASS_COUNT]) -> [ClassLimits; IO_CLASS_COUNT] {
        min_max.map(|(min_active, max_active)| ClassLimits {
            min_active,
            max_active,
        })
    }

    fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(f).poll(&mut cx)
    }

    fn admit_now(q: &VdevQueue, class: IoClass) -> Admission<'_> {
        match poll_once(&mut q.admit(class)) {
            Poll::Ready(a) => a,
            Poll::Pending => panic!("{class:?} should be admitted at once"),
        }
    }

    fn active(q: &VdevQueue, class: IoClass) -> u32 {
        q.snapshot().active[class.index()]
    }

    /// Admits waiters of `futs` that are ready now, in the order given; returns their indices.
    fn ready_indices<'a>(
        futs: &mut [AdmitFuture<'a>],
        out: &mut Vec<Admission<'a>>,
        done: &mut [bool],
    ) -> Vec<usize> {
        let mut got = Vec::new();
        for (i, f) in futs.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Poll::Ready(a) = poll_once(f) {
                done[i] = true;
                out.push(a);
                got.push(i);
            }
        }
        got
    }

    #[test]
    fn an_idle_leaf_lets_the_scrub_issue_more_until_another_class_comes() {
        let q = VdevQueue::new();
        q.set_mode(SchedulerMode::On);
        let scrub_max = CLASS_LIMITS[IoClass::Scrub.index()].max_active;
        assert!(scrub_max < SCRUB_IDLE_MAX_ACTIVE);
        // Not idle yet: the class's own limit.
        let first: Vec<_> = (0..scrub_max)
            .map(|_| admit_now(&q, IoClass::Scrub))
            .collect();
        assert!(poll_once(&mut q.admit(IoClass::Scrub)).is_pending());
        drop(first);
        // Enough scrub completions with nothing else: idle, the higher limit.
        for _ in 0..SCRUB_IDLE_AFTER_COMPLETIONS {
            drop(admit_now(&q, IoClass::Scrub));
        }
        let many: Vec<_> = (0..SCRUB_IDLE_MAX_ACTIVE)
            .map(|_| admit_now(&q, IoClass::Scrub))
            .collect();
        assert!(poll_once(&mut q.admit(IoClass::Scrub)).is_pending());
        // A client's read: no more scrubs beyond the class's limit while it is active.
        let read = admit_now(&q, IoClass::SyncRead);
        drop(many);
        let back: Vec<_> = (0..scrub_max)
            .map(|_| admit_now(&q, IoClass::Scrub))
            .collect();
        assert!(poll_once(&mut q.admit(IoClass::Scrub)).is_pending());
        drop((read, back));
        // Gone, but the scrub waits for completions alone before it counts as idle again.
        let again: Vec<_> = (0..scrub_max)
            .map(|_| admit_now(&q, IoClass::Scrub))
            .collect();
        assert!(poll_once(&mut q.admit(IoClass::Scrub)).is_pending());
        drop(again);
    }

    #[test]
    fn class_max_active_is_honoured_and_a_release_admits_the_next() {
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        q.set_mode(SchedulerMode::On);
        let a = admit_now(&q, IoClass::AsyncWrite);
        let b = admit_now(&q, IoClass::AsyncWrite);
        let mut c = q.admit(IoClass::AsyncWrite);
        assert!(poll_once(&mut c).is_pending());
        assert_eq!(active(&q, IoClass::AsyncWrite), 2);
        assert_eq!(q.snapshot().waiting, 1);
        drop(a);
        let Poll::Ready(c_adm) = poll_once(&mut c) else {
            panic!("a release admits the waiter")
        };
        assert!(c_adm.waited());
        assert_eq!(active(&q, IoClass::AsyncWrite), 2);
        drop((b, c_adm));
        assert_eq!(q.snapshot().active, [0; IO_CLASS_COUNT]);
        assert_eq!(q.snapshot().queued[IoClass::AsyncWrite.index()], 3);
    }

    #[test]
    fn leaf_active_max_bounds_every_class() {
        let q = VdevQueue::with_limits(limits([(5, 5); IO_CLASS_COUNT]), 2);
        q.set_mode(SchedulerMode::On);
        let _a = admit_now(&q, IoClass::SyncRead);
        let b = admit_now(&q, IoClass::AsyncWrite);
        let mut c = q.admit(IoClass::SyncWrite);
        assert!(poll_once(&mut c).is_pending());
        drop(b);
        assert!(poll_once(&mut c).is_ready());
    }

    #[test]
    fn waiters_are_admitted_by_priority_above_their_minimums_and_fifo_within_a_class() {
        // Every class min 0 (no guarantees), max 1, leaf max 1: one I/O at a time, so the
        // order of admissions is the scheduler's choice.
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 1);
        q.set_mode(SchedulerMode::On);
        let first = admit_now(&q, IoClass::Scrub);
        let classes = [
            IoClass::Scrub,
            IoClass::AsyncWrite,
            IoClass::SyncRead,
            IoClass::AsyncWrite,
            IoClass::SyncWrite,
            IoClass::SyncRead,
        ];
        let mut futs: Vec<_> = classes.iter().map(|&c| q.admit(c)).collect();
        let mut done = vec![false; futs.len()];
        let mut held = Vec::new();
        assert!(ready_indices(&mut futs, &mut held, &mut done).is_empty());
        drop(first);
        let mut order = Vec::new();
        for _ in 0..classes.len() {
            let got = ready_indices(&mut futs, &mut held, &mut done);
            assert_eq!(got.len(), 1, "one admission per release");
            order.push(got[0]);
            held.clear();
        }
        // sync reads (2, 5 in arrival order), sync write (4), async writes (1, 3), scrub (0).
        assert_eq!(order, vec![2, 5, 4, 1, 3, 0]);
    }

    #[test]
    fn min_guarantees_let_a_low_class_through_a_busy_high_class() {
        // Sync reads may have 4 active, scrub is guaranteed 1 although it has the lowest
        // priority; the leaf allows 4 in all.
        let mut l = limits([(0, 4); IO_CLASS_COUNT]);
        l[IoClass::Scrub.index()] = ClassLimits {
            min_active: 1,
            max_active: 2,
        };
        let q = VdevQueue::with_limits(l, 4);
        q.set_mode(SchedulerMode::On);
        let held: Vec<_> = (0..4).map(|_| admit_now(&q, IoClass::SyncRead)).collect();
        let mut reads: Vec<_> = (0..4).map(|_| q.admit(IoClass::SyncRead)).collect();
        let mut scrub = q.admit(IoClass::Scrub);
        for r in reads.iter_mut() {
            assert!(poll_once(r).is_pending());
        }
        assert!(poll_once(&mut scrub).is_pending());
        drop(held);
        // The four freed slots: the scrub gets one by its minimum, the reads the other three.
        let Poll::Ready(_scrub_adm) = poll_once(&mut scrub) else {
            panic!("the scrub's minimum admits it")
        };
        let admitted_reads: Vec<_> = reads
            .iter_mut()
            .filter_map(|r| match poll_once(r) {
                Poll::Ready(a) => Some(a),
                Poll::Pending => None,
            })
            .collect();
        assert_eq!(admitted_reads.len(), 3);
    }

    #[test]
    fn a_dropped_waiter_leaves_the_queue_consistent() {
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 10);
        q.set_mode(SchedulerMode::On);
        let first = admit_now(&q, IoClass::SyncRead);
        let mut a = q.admit(IoClass::SyncRead);
        let mut b = q.admit(IoClass::SyncRead);
        let mut c = q.admit(IoClass::SyncRead);
        for f in [&mut a, &mut b, &mut c] {
            assert!(poll_once(f).is_pending());
        }
        drop(b); // from the middle of the list
        assert_eq!(q.snapshot().waiting, 2);
        drop(first);
        let Poll::Ready(a_adm) = poll_once(&mut a) else {
            panic!("a is next")
        };
        assert!(poll_once(&mut c).is_pending());
        drop(a_adm);
        assert!(poll_once(&mut c).is_ready());
        drop((a, c));
        let s = q.snapshot();
        assert_eq!((s.waiting, s.active), (0, [0; IO_CLASS_COUNT]));
    }

    #[test]
    fn an_admitted_but_dropped_waiter_gives_its_slot_to_the_next() {
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 10);
        q.set_mode(SchedulerMode::On);
        let first = admit_now(&q, IoClass::SyncWrite);
        let mut a = q.admit(IoClass::SyncWrite);
        let mut b = q.admit(IoClass::SyncWrite);
        assert!(poll_once(&mut a).is_pending());
        assert!(poll_once(&mut b).is_pending());
        drop(first); // admits `a`
        drop(a); // ... which never runs: its slot goes to `b`
        let Poll::Ready(b_adm) = poll_once(&mut b) else {
            panic!("b got a's slot")
        };
        assert_eq!(active(&q, IoClass::SyncWrite), 1);
        drop(b_adm);
        assert_eq!(active(&q, IoClass::SyncWrite), 0);
    }

    #[test]
    fn a_dropped_admission_releases_its_slot() {
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 10);
        q.set_mode(SchedulerMode::On);
        let a = admit_now(&q, IoClass::SyncRead);
        assert_eq!(active(&q, IoClass::SyncRead), 1);
        drop(a);
        assert_eq!(active(&q, IoClass::SyncRead), 0);
        drop(admit_now(&q, IoClass::SyncRead));
    }

    #[test]
    fn a_waiter_is_woken_when_admitted() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        struct Flag(AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 10);
        q.set_mode(SchedulerMode::On);
        let first = admit_now(&q, IoClass::SyncRead);
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut f = pin!(q.admit(IoClass::SyncRead));
        assert!(f
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        assert!(!flag.0.load(Ordering::SeqCst));
        drop(first);
        assert!(flag.0.load(Ordering::SeqCst));
    }

    #[test]
    fn off_never_queues_and_on_always_does() {
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 10);
        q.set_mode(SchedulerMode::Off);
        // Past the class limit and the queue is never involved.
        let held: Vec<_> = (0..5).map(|_| admit_now(&q, IoClass::SyncRead)).collect();
        assert_eq!(active(&q, IoClass::SyncRead), 5);
        let s = q.snapshot();
        assert_eq!(s.bypassed[0], 5);
        assert_eq!(s.queued[0], 0);
        drop(held);
        q.set_mode(SchedulerMode::On);
        drop(admit_now(&q, IoClass::SyncRead));
        let s = q.snapshot();
        assert_eq!((s.bypassed[0], s.queued[0]), (5, 1));
    }

    #[test]
    fn auto_bypasses_within_limits_or_while_the_device_keeps_up() {
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 10);
        assert_eq!(q.mode(), SchedulerMode::Auto);
        // A slow device: within the class limit the I/Os bypass, past it they queue.
        for _ in 0..50 {
            q.note_disk_wait(IoClass::AsyncWrite, Duration::from_millis(8), false);
        }
        assert!(q.snapshot().disk_wait_recent_us >= AUTO_DISK_WAIT_US_MAX);
        let a = admit_now(&q, IoClass::AsyncWrite);
        let b = admit_now(&q, IoClass::AsyncWrite);
        let mut c = q.admit(IoClass::AsyncWrite);
        assert!(poll_once(&mut c).is_pending());
        let s = q.snapshot();
        assert_eq!(s.bypassed[3], 2);
        assert_eq!(s.queued[3], 1);
        // While anything waits, every I/O queues (even one whose class has room), so the
        // priority order decides.
        let mut r = q.admit(IoClass::SyncRead);
        assert!(poll_once(&mut r).is_ready());
        assert_eq!(q.snapshot().queued[0], 1);
        drop((a, b));
        assert!(poll_once(&mut c).is_ready());
        // A device that keeps up: the class limit is lifted.
        for _ in 0..100 {
            q.note_disk_wait(IoClass::AsyncWrite, Duration::from_micros(50), true);
        }
        assert!(q.snapshot().disk_wait_recent_us < AUTO_DISK_WAIT_US_MAX);
        let held: Vec<_> = (0..5).map(|_| admit_now(&q, IoClass::AsyncWrite)).collect();
        assert_eq!(q.snapshot().bypassed[3], 7);
        // ... up to the leaf's limit.
        let more: Vec<_> = (0..5).map(|_| admit_now(&q, IoClass::AsyncWrite)).collect();
        let mut over = q.admit(IoClass::AsyncWrite);
        assert!(poll_once(&mut over).is_pending());
        drop((held, more));
        assert!(poll_once(&mut over).is_ready());
    }

    /// Admits `n` I/Os of `class`; how many bypassed the queue.
    fn bypassed_of(q: &VdevQueue, class: IoClass, n: usize) -> (Vec<Admission<'_>>, u64) {
        let before = q.snapshot().bypassed[class.index()];
        let held: Vec<_> = (0..n).map(|_| admit_now(q, class)).collect();
        (held, q.snapshot().bypassed[class.index()] - before)
    }

    /// Feeds `n` sync read times of `us`.
    fn sync_reads(q: &VdevQueue, n: usize, us: u64, alone: bool) {
        for _ in 0..n {
            q.note_disk_wait(IoClass::SyncRead, Duration::from_micros(us), alone);
        }
    }

    /// Admits and completes `n` I/Os one at a time (the saturation hold's clock).
    fn pass(q: &VdevQueue, n: u64) {
        for _ in 0..n {
            drop(admit_now(q, IoClass::SyncRead));
        }
    }

    /// Whether a third sync read past a class limit of 2 waits (the limits hold).
    fn limited(q: &VdevQueue) -> bool {
        let (held, bypassed) = bypassed_of(q, IoClass::SyncRead, 2);
        assert_eq!(bypassed, 2, "within the class limit nothing changes");
        let mut third = q.admit(IoClass::SyncRead);
        let first_poll = poll_once(&mut third);
        let waits = first_poll.is_pending();
        assert_eq!(q.snapshot().limited, waits);
        drop(first_poll);
        drop(held);
        if waits {
            assert!(
                poll_once(&mut third).is_ready(),
                "a freed slot admits the waiter"
            );
        }
        waits
    }

    #[test]
    fn auto_queues_past_the_class_limit_on_a_saturated_device() {
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        // No sync read alone yet: nothing to compare with, so a fast device keeps up.
        sync_reads(&q, 50, 400, false);
        assert_eq!(q.snapshot().sync_read_disk_wait_alone_us, 0);
        assert!(!limited(&q));
        // 50 us alone, then a burst at 400 us: saturated. The class limit holds again.
        sync_reads(&q, 1, 50, true);
        assert_eq!(
            q.snapshot().sync_read_disk_wait_alone_us,
            50,
            "the first sample is taken whole"
        );
        sync_reads(&q, 1, 400, false);
        assert!(limited(&q));
        // The limits keep the device's time low; it still counts as saturated for
        // AUTO_SATURATED_HOLD_IOS admissions, or the bursts would come back as soon as the
        // limits worked.
        sync_reads(&q, 100, 60, false);
        assert!(q.snapshot().sync_read_disk_wait_us < AUTO_SATURATED_FACTOR * 50);
        // The hold runs from the last saturated sample (among the 60 us ones): HOLD - 4
        // admissions later, and 2 more by `limited`, the third is still within it (HOLD - 2);
        // the next `limited`'s third is past it (HOLD + 1).
        pass(&q, AUTO_SATURATED_HOLD_IOS - 4);
        assert!(limited(&q), "the hold's last admissions");
        assert!(!limited(&q), "the hold is over");

        // The hold's exact end: 4096 admissions after the last saturated sample.
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        sync_reads(&q, 1, 50, true);
        sync_reads(&q, 20, 400, false);
        pass(&q, AUTO_SATURATED_HOLD_IOS - 1);
        assert!(q.snapshot().limited);
        pass(&q, 1);
        assert!(!q.snapshot().limited);

        // A hold in progress outlives the freshness of its time alone.
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        sync_reads(&q, 1, 50, true);
        pass(&q, AUTO_ALONE_FRESH_IOS - 10);
        sync_reads(&q, 20, 400, false);
        pass(&q, 20);
        sync_reads(&q, 1, 400, false);
        pass(&q, AUTO_SATURATED_HOLD_IOS - 1);
        assert!(
            q.snapshot().limited,
            "re-armed with a time alone past its freshness"
        );

        // The factor: 100 us alone, 280 us deep is not saturation, 320 us is.
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        sync_reads(&q, 1, 100, true);
        sync_reads(&q, 100, 280, false);
        assert!(!limited(&q));
        sync_reads(&q, 100, 320, false);
        assert!(limited(&q));

        // Other classes' times are not compared: a large write is slower than a small read
        // with no queue at all.
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        sync_reads(&q, 1, 50, true);
        sync_reads(&q, 20, 50, false);
        for _ in 0..100 {
            q.note_disk_wait(IoClass::AsyncWrite, Duration::from_micros(900), false);
        }
        assert!(!limited(&q));

        // A time alone too old is not used: nothing counts as saturated until a new one.
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        sync_reads(&q, 1, 50, true);
        pass(&q, AUTO_ALONE_FRESH_IOS);
        assert_eq!(
            q.snapshot().sync_read_disk_wait_alone_us,
            50,
            "fresh to the last"
        );
        pass(&q, 1);
        assert_eq!(q.snapshot().sync_read_disk_wait_alone_us, 0);
        sync_reads(&q, 100, 400, false);
        assert!(!limited(&q));
        // A new one is taken whole.
        sync_reads(&q, 1, 70, true);
        assert_eq!(q.snapshot().sync_read_disk_wait_alone_us, 70);
        sync_reads(&q, 1, 400, false);
        assert!(limited(&q));

        // A device slow alone that works in parallel (300 us alone, 800 us deep) keeps up.
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        for _ in 0..50 {
            sync_reads(&q, 1, 300, true);
            sync_reads(&q, 1, 800, false);
        }
        let s = q.snapshot();
        assert!(
            s.sync_read_disk_wait_alone_us < 400 && s.sync_read_disk_wait_us > 500,
            "{s:?}"
        );
        assert!(!limited(&q));

        // Nor is a burst that costs under AUTO_SATURATED_US_MIN (20 us -> 100 us).
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        for _ in 0..100 {
            sync_reads(&q, 1, 20, true);
            sync_reads(&q, 1, 100, false);
        }
        assert!(!limited(&q));
    }

    #[test]
    fn an_io_runs_alone_until_another_is_admitted() {
        let q = VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 100);
        for mode in [SchedulerMode::Auto, SchedulerMode::On] {
            // Bypassed (auto) or admitted at once while enqueueing itself (on).
            q.set_mode(mode);
            let first = admit_now(&q, IoClass::SyncRead);
            assert!(first.ran_alone(), "{mode:?}");
            let second = admit_now(&q, IoClass::SyncRead);
            assert!(!first.ran_alone() && !second.ran_alone(), "{mode:?}");
            drop((first, second));
            let third = admit_now(&q, IoClass::SyncRead);
            assert!(third.ran_alone(), "{mode:?}: the leaf is idle again");
            drop(third);
        }
        // Admitted after waiting: alone if nothing else is active by then, else not.
        let q = VdevQueue::with_limits(limits([(1, 1); IO_CLASS_COUNT]), 100);
        q.set_mode(SchedulerMode::On);
        let first = admit_now(&q, IoClass::SyncRead);
        let mut second = q.admit(IoClass::SyncRead);
        assert!(poll_once(&mut second).is_pending());
        // Its class has room: admitted at once, beside the first.
        let other = admit_now(&q, IoClass::AsyncWrite);
        drop(first);
        let second = match poll_once(&mut second) {
            Poll::Ready(a) => a,
            Poll::Pending => panic!("the freed slot admits the sync read"),
        };
        assert!(!second.ran_alone(), "admitted beside the async write");
        drop((second, other));
        let first = admit_now(&q, IoClass::SyncRead);
        let mut second = q.admit(IoClass::SyncRead);
        assert!(poll_once(&mut second).is_pending());
        drop(first);
        let second = match poll_once(&mut second) {
            Poll::Ready(a) => a,
            Poll::Pending => panic!("the freed slot admits the sync read"),
        };
        assert!(
            second.ran_alone(),
            "admitted when the leaf had nothing else"
        );
    }

    #[test]
    fn many_waiters_grow_the_slab_once_and_drain() {
        let q = VdevQueue::with_limits(limits([(0, 1); IO_CLASS_COUNT]), 10);
        q.set_mode(SchedulerMode::On);
        let first = admit_now(&q, IoClass::AsyncWrite);
        let n = QUEUE_SLOTS_PREALLOCATED * 2 + 3;
        let mut futs: Vec<_> = (0..n).map(|_| q.admit(IoClass::AsyncWrite)).collect();
        for f in futs.iter_mut() {
            assert!(poll_once(f).is_pending());
        }
        assert_eq!(q.snapshot().waiting as usize, n);
        drop(first);
        // Strictly one at a time, in arrival order.
        for i in 0..n {
            let Poll::Ready(a) = poll_once(&mut futs[i]) else {
                panic!("waiter {i} is next")
            };
            if i + 1 < n {
                assert!(poll_once(&mut futs[i + 1]).is_pending());
            }
            drop(a);
        }
        drop(futs);
        let s = q.snapshot();
        assert_eq!((s.waiting, s.active), (0, [0; IO_CLASS_COUNT]));
    }

    #[test]
    fn concurrent_threads_never_exceed_the_limits_and_all_finish() {
        use std::sync::Arc;
        let q = Arc::new(VdevQueue::with_limits(limits([(1, 2); IO_CLASS_COUNT]), 4));
        q.set_mode(SchedulerMode::On);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let class = IoClass::ALL[(t + i) % IO_CLASS_COUNT];
                        let mut f = pin!(q.admit(class));
                        let waker = std::task::Waker::noop();
                        // Spin-polls: the test's executor.
                        let adm = loop {
                            if let Poll::Ready(a) = f.as_mut().poll(&mut Context::from_waker(waker))
                            {
                                break a;
                            }
                            std::thread::yield_now();
                        };
                        assert!(q.active_total.load(Ordering::SeqCst) <= 4);
                        assert!(q.active[class.index()].load(Ordering::SeqCst) <= 2);
                        drop(adm);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = q.snapshot();
        assert_eq!((s.waiting, s.active), (0, [0; IO_CLASS_COUNT]));
    }
}
