//! [`FaultBackend`]: wraps another backend to inject EIO, bit flips and latency, and to
//! simulate power loss (volatile writes that a crash drops or tears).
//!
//! Power-loss model (when enabled): a completed write is volatile until a flush *issued after
//! it completed* completes. Volatile writes live in an in-memory overlay (reads see them) and
//! reach `inner` only when a covering flush runs. A crash leaves the overlay as it is;
//! [`FaultBackend::apply_power_loss`] then decides, per volatile write and reproducibly from a
//! seed, whether it was lost, persisted, or torn (a prefix of whole 512-byte sectors persisted).
//!
//! A durable write ([`Backend::write_durable`], FUA) that completed persists whole, whatever
//! the seed, and after every write that completed before it (so an older volatile write to the
//! same sectors never lands over it); it makes no other write durable. One in flight when the
//! power fails is volatile like any write.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::buf::IoBuf;
use crate::executor::{block_on, sleep};
use crate::memory::flip_random_bits;
use crate::{Backend, DurableWriteMode, IoFuture, IoResult};

/// Torn writes keep a prefix of whole sectors of this size.
const SECTOR_BYTES: usize = 512;

/// Bound on remembered flush-gate waiters (each wake drains them all; see `FlushGate`).
const FLUSH_GATE_WAITERS_MAX: usize = 1 << 20;

/// Counts kept by a [`FaultBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Read operations issued.
    pub reads: u64,
    /// Write operations issued.
    pub writes: u64,
    /// Flush operations issued.
    pub flushes: u64,
    /// Discard operations issued.
    pub discards: u64,
    /// Reads failed with an injected EIO.
    pub read_errors_injected: u64,
    /// Writes failed with an injected EIO.
    pub write_errors_injected: u64,
    /// Reads whose returned data had bits flipped.
    pub reads_bit_flipped: u64,
    /// Bits flipped in returned data, in total.
    pub bits_flipped: u64,
    /// Operations failed because the device had lost power.
    pub ops_failed_after_power_loss: u64,
    /// Flushes that moved volatile writes to `inner` (power-loss tracking only).
    pub flushes_applied: u64,
    /// Writes currently volatile (not yet covered by a completed flush; durable writes are
    /// not counted).
    pub volatile_writes: u64,
    /// Durable (FUA) writes issued.
    pub durable_writes: u64,
    /// Most reads in flight at once since the wrapper was made (a high-water mark, never
    /// reset), among the reads that went through the wrapper's own future: a latency set, a
    /// fault drawn, or volatile writes to overlay (power-loss tracking). A read passed
    /// straight through to `inner` is not counted.
    pub reads_in_flight_max: u64,
}

/// What [`FaultBackend::apply_power_loss`] did with the volatile writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerLossReport {
    /// Volatile writes that left no trace.
    pub dropped: u64,
    /// Volatile writes that persisted whole.
    pub kept: u64,
    /// Volatile writes of which a prefix of whole 512-byte sectors persisted.
    pub torn: u64,
}

/// A volatile write that a power loss dropped or tore ([`FaultBackend::lost_writes`]): what a
/// failed crash test prints next to the blocks it could not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostWrite {
    /// Its completion order among the device's writes.
    pub seq: u64,
    /// Where it was written.
    pub offset_bytes: u64,
    /// How long it was.
    pub length_bytes: u64,
    /// How much of it persisted (a prefix of whole sectors; 0 when dropped).
    pub persisted_bytes: u64,
}

/// A completed write not yet covered by a completed flush.
struct VolatileWrite {
    /// Completion order.
    seq: u64,
    offset_bytes: u64,
    data: Arc<[u8]>,
    /// A completed durable (FUA) write: it survives a power loss whole. Kept in the list
    /// (rather than written to `inner` at once) so that it lands in completion order: an
    /// older volatile write that survives is applied before it, never over it.
    durable: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpClass {
    Read,
    Write,
    Flush,
    Discard,
}

struct FaultState {
    rng: SmallRng,
    read_error_probability: f64,
    write_error_probability: f64,
    read_bit_flip_probability: f64,
    latency: Duration,
    /// Added to reads only, on top of `latency`.
    read_latency: Duration,
    /// What [`Backend::durable_write_mode`] answers, when a test chose it.
    durable_write_mode: Option<DurableWriteMode>,
    power_loss_tracking: bool,
    /// Operations (reads, writes, flushes) left before the power fails.
    crash_countdown: Option<u64>,
    /// The power has failed: every operation fails with EIO.
    dead: bool,
    /// Sequence number the next completing volatile write gets.
    next_write_seq: u64,
    /// Volatile writes in completion order.
    volatile: VecDeque<VolatileWrite>,
    /// What the last power loss dropped or tore.
    lost: Vec<LostWrite>,
    /// Reads in flight through the wrapper's own future (see `FaultStats::reads_in_flight_max`).
    reads_in_flight: u64,
    stats: FaultStats,
}

/// Serialises the apply phase of flushes, so that volatile writes reach `inner` in
/// completion order and a flush completes only after every earlier one did.
struct FlushGate {
    busy: bool,
    waiters: Vec<Waker>,
}

struct FaultShared {
    inner: Arc<dyn Backend>,
    state: Mutex<FaultState>,
    gate: Mutex<FlushGate>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // State stays consistent across a panic in a test thread: every update is one step.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// Counts one read in flight from its issue until its future completes or is dropped.
struct ReadInFlight(Arc<FaultShared>);

impl ReadInFlight {
    fn new(shared: &Arc<FaultShared>) -> ReadInFlight {
        let mut state = lock(&shared.state);
        state.reads_in_flight += 1;
        state.stats.reads_in_flight_max =
            state.stats.reads_in_flight_max.max(state.reads_in_flight);
        ReadInFlight(Arc::clone(shared))
    }
}

impl Drop for ReadInFlight {
    fn drop(&mut self) {
        lock(&self.0.state).reads_in_flight -= 1;
    }
}

/// Wraps another backend: injects EIO, bit flips and latency, and simulates power loss.
///
/// Decisions come from one PRNG seeded at construction and drawn when an operation is issued,
/// so a single-threaded run replays exactly from its seed. With every knob at its default the
/// wrapper passes operations straight through (no allocation, no extra future).
#[derive(Clone)]
pub struct FaultBackend {
    shared: Arc<FaultShared>,
}

impl FaultBackend {
    /// Wraps `inner`; decisions are drawn from a PRNG seeded with `seed`. No faults at first.
    pub fn new(inner: Arc<dyn Backend>, seed: u64) -> FaultBackend {
        let state = FaultState {
            rng: SmallRng::seed_from_u64(seed),
            read_error_probability: 0.0,
            write_error_probability: 0.0,
            read_bit_flip_probability: 0.0,
            latency: Duration::ZERO,
            read_latency: Duration::ZERO,
            durable_write_mode: None,
            power_loss_tracking: false,
            crash_countdown: None,
            dead: false,
            next_write_seq: 0,
            volatile: VecDeque::new(),
            lost: Vec::new(),
            reads_in_flight: 0,
            stats: FaultStats::default(),
        };
        FaultBackend {
            shared: Arc::new(FaultShared {
                inner,
                state: Mutex::new(state),
                gate: Mutex::new(FlushGate {
                    busy: false,
                    waiters: Vec::new(),
                }),
            }),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.shared.inner
    }

    /// Probability (0..=1) that a read fails with EIO (the device is not read).
    pub fn set_read_error_probability(&self, p: f64) {
        lock(&self.shared.state).read_error_probability = clamp_probability(p);
    }

    /// Probability (0..=1) that a write fails with EIO (nothing is written).
    pub fn set_write_error_probability(&self, p: f64) {
        lock(&self.shared.state).write_error_probability = clamp_probability(p);
    }

    /// Probability (0..=1) that a read returns data with 1..=8 distinct random bits flipped
    /// (the device content is untouched).
    pub fn set_read_bit_flip_probability(&self, p: f64) {
        lock(&self.shared.state).read_bit_flip_probability = clamp_probability(p);
    }

    /// Latency added to every read, write and flush (an io_uring timeout on the caller's ring).
    pub fn set_latency(&self, latency: Duration) {
        lock(&self.shared.state).latency = latency;
    }

    /// Latency added to every read only (on top of [`FaultBackend::set_latency`]'s): slow
    /// reads beside fast writes and flushes, e.g. a scan racing the syncs.
    pub fn set_read_latency(&self, latency: Duration) {
        lock(&self.shared.state).read_latency = latency;
    }

    /// Makes [`Backend::durable_write_mode`] answer `mode` instead of the wrapped backend's
    /// answer, so a test can make its user take either way to durability on any device.
    pub fn set_durable_write_mode(&self, mode: DurableWriteMode) {
        lock(&self.shared.state).durable_write_mode = Some(mode);
    }

    /// Power-loss tracking: from now on a completed write is volatile until a flush that was
    /// issued after it completes; volatile writes are kept in an in-memory overlay (reads see
    /// them) and reach `inner` only when a covering flush completes. Discards become no-ops
    /// while tracking (allowed: a discard may be a no-op).
    pub fn enable_power_loss(&self) {
        lock(&self.shared.state).power_loss_tracking = true;
    }

    /// After `ops` more operations (reads + writes + flushes) the device loses power: that
    /// operation and every later one fails with EIO (the machine is dead).
    pub fn crash_after_ops(&self, ops: u64) {
        lock(&self.shared.state).crash_countdown = Some(ops);
    }

    /// True once the device has lost power.
    pub fn is_dead(&self) -> bool {
        lock(&self.shared.state).dead
    }

    /// Restores power after a crash (and after [`FaultBackend::apply_power_loss`]): operations
    /// succeed again and no crash is scheduled. Volatile writes still pending are kept.
    pub fn revive(&self) {
        let mut state = lock(&self.shared.state);
        state.dead = false;
        state.crash_countdown = None;
    }

    /// Applies the power loss to `inner`: each volatile write (in completion order) is, by a
    /// PRNG seeded with `seed`, dropped, kept whole, or torn (a prefix of whole 512-byte
    /// sectors kept, the rest dropped). After this, `inner` holds exactly what survived and
    /// the overlay is empty. Returns counts for the test log.
    ///
    /// Runs `inner`'s writes to completion on this thread: call it outside any executor
    /// unless `inner` completes immediately (as the memory backend does).
    pub fn apply_power_loss(&self, seed: u64) -> PowerLossReport {
        let volatile: Vec<VolatileWrite> = lock(&self.shared.state).volatile.drain(..).collect();
        let inner = &self.shared.inner;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut report = PowerLossReport::default();
        let mut lost = Vec::new();
        debug_assert!(volatile.windows(2).all(|w| w[0].seq < w[1].seq));
        for write in &volatile {
            let sectors = write.data.len().div_ceil(SECTOR_BYTES);
            let persisted_bytes = match rng.random_range(0..3u32) {
                _ if write.durable => {
                    report.kept += 1;
                    write.data.len()
                }
                0 => {
                    report.dropped += 1;
                    0
                }
                1 => {
                    report.kept += 1;
                    write.data.len()
                }
                _ if sectors >= 2 => {
                    report.torn += 1;
                    rng.random_range(1..sectors) * SECTOR_BYTES
                }
                // A one-sector write cannot tear: sectors are atomic.
                _ => {
                    report.dropped += 1;
                    0
                }
            };
            if persisted_bytes < write.data.len() {
                lost.push(LostWrite {
                    seq: write.seq,
                    offset_bytes: write.offset_bytes,
                    length_bytes: write.data.len() as u64,
                    persisted_bytes: persisted_bytes as u64,
                });
            }
            if persisted_bytes > 0 {
                let buf = IoBuf::from_slice(&write.data[..persisted_bytes]);
                if let Err(err) = block_on(inner.write(write.offset_bytes, buf)) {
                    panic!("apply_power_loss: write to {} failed: {err}", inner.name());
                }
            }
        }
        if let Err(err) = block_on(inner.flush()) {
            panic!("apply_power_loss: flush of {} failed: {err}", inner.name());
        }
        lock(&self.shared.state).lost = lost;
        report
    }

    /// The writes the last [`FaultBackend::apply_power_loss`] dropped or tore, in completion
    /// order.
    pub fn lost_writes(&self) -> Vec<LostWrite> {
        lock(&self.shared.state).lost.clone()
    }

    /// Counts of operations, injected errors, flips, flushes.
    pub fn stats(&self) -> FaultStats {
        let state = lock(&self.shared.state);
        let mut stats = state.stats;
        stats.volatile_writes = state.volatile.iter().filter(|w| !w.durable).count() as u64;
        stats
    }

    /// Counts the operation and applies the crash countdown. Runs when the op is issued.
    fn admit(state: &mut FaultState, class: OpClass) -> IoResult<()> {
        match class {
            OpClass::Read => state.stats.reads += 1,
            OpClass::Write => state.stats.writes += 1,
            OpClass::Flush => state.stats.flushes += 1,
            OpClass::Discard => state.stats.discards += 1,
        }
        if !state.dead && class != OpClass::Discard {
            match state.crash_countdown {
                Some(0) => {
                    state.dead = true;
                    state.crash_countdown = None;
                    tracing::debug!("fault backend: power lost");
                }
                Some(left) => state.crash_countdown = Some(left - 1),
                None => {}
            }
        }
        if state.dead {
            state.stats.ops_failed_after_power_loss += 1;
            return Err(eio());
        }
        Ok(())
    }

    /// A write, durable (FUA) or not; see the module docs for the model.
    /// Admits a write of `len` bytes: its added latency, whether it fails, whether power-loss
    /// tracking takes it.
    fn admit_write(
        &self,
        offset_bytes: u64,
        len: usize,
        durable: bool,
    ) -> IoResult<(Duration, bool, bool)> {
        let (latency, inject_error, tracking) = {
            let mut state = lock(&self.shared.state);
            Self::admit(&mut state, OpClass::Write)?;
            state.stats.durable_writes += u64::from(durable);
            let p_error = state.write_error_probability;
            let inject_error = draw(&mut state.rng, p_error);
            if inject_error {
                state.stats.write_errors_injected += 1;
            }
            (state.latency, inject_error, state.power_loss_tracking)
        };
        if tracking {
            // The overlay would accept anything; the device would not.
            self.check_range(offset_bytes, len)?;
        }
        Ok((latency, inject_error, tracking))
    }

    fn write_kind(&self, offset_bytes: u64, buf: IoBuf, durable: bool) -> IoFuture<IoBuf> {
        let (latency, inject_error, tracking) =
            match self.admit_write(offset_bytes, buf.len(), durable) {
                Ok(admitted) => admitted,
                Err(err) => return IoFuture::ready(Err(err)),
            };
        if latency.is_zero() && !inject_error && !tracking {
            return write_to(&*self.shared.inner, offset_bytes, buf, durable);
        }
        self.write_admitted(offset_bytes, buf, durable, latency, inject_error, tracking)
    }

    /// The injected path of an admitted write: latency, error, the power-loss overlay.
    fn write_admitted(
        &self,
        offset_bytes: u64,
        buf: IoBuf,
        durable: bool,
        latency: Duration,
        inject_error: bool,
        tracking: bool,
    ) -> IoFuture<IoBuf> {
        let shared = self.shared.clone();
        IoFuture::boxed(async move {
            delay_or_fail(latency, inject_error).await?;
            if !tracking {
                return write_to(&*shared.inner, offset_bytes, buf, durable).await;
            }
            let data: Arc<[u8]> = Arc::from(&buf[..]);
            let mut state = lock(&shared.state);
            let seq = state.next_write_seq;
            state.next_write_seq += 1;
            let dead = state.dead;
            // A write in flight when the power failed may or may not have reached the media:
            // it joins the volatile set, for `apply_power_loss` to decide, but is not acked
            // (so a durable one is durable only if it completed).
            state.volatile.push_back(VolatileWrite {
                seq,
                offset_bytes,
                data,
                durable: durable && !dead,
            });
            if state.dead {
                state.stats.ops_failed_after_power_loss += 1;
                return Err(eio());
            }
            Ok(buf)
        })
    }

    fn check_range(&self, offset_bytes: u64, len: usize) -> IoResult<()> {
        let size_bytes = self.shared.inner.size_bytes();
        if offset_bytes
            .checked_add(len as u64)
            .is_some_and(|end| end <= size_bytes)
        {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: write of {len} bytes at offset {offset_bytes} beyond end of device",
                self.shared.inner.name()
            ),
        ))
    }
}

/// The injected part of an operation: its added latency, then its injected EIO if drawn.
async fn delay_or_fail(latency: Duration, inject_error: bool) -> IoResult<()> {
    if !latency.is_zero() {
        sleep(latency).await;
    }
    if inject_error {
        return Err(eio());
    }
    Ok(())
}

/// `inner`'s durable or plain write.
fn write_to(inner: &dyn Backend, offset_bytes: u64, buf: IoBuf, durable: bool) -> IoFuture<IoBuf> {
    if durable {
        inner.write_durable(offset_bytes, buf)
    } else {
        inner.write(offset_bytes, buf)
    }
}

fn clamp_probability(p: f64) -> f64 {
    assert!(!p.is_nan(), "probability is NaN");
    p.clamp(0.0, 1.0)
}

/// Draws a bool only when it can be true, so a zero probability does not move the PRNG.
fn draw(rng: &mut SmallRng, p: f64) -> bool {
    p > 0.0 && rng.random_bool(p)
}

/// Volatile writes overlapping `[offset, offset + len)`, oldest first.
fn overlay_for(state: &FaultState, offset_bytes: u64, len: usize) -> Vec<(u64, Arc<[u8]>)> {
    let end = offset_bytes + len as u64;
    state
        .volatile
        .iter()
        .filter(|w| w.offset_bytes < end && offset_bytes < w.offset_bytes + w.data.len() as u64)
        .map(|w| (w.offset_bytes, w.data.clone()))
        .collect()
}

/// Copies the overlapping parts of `overlay` (oldest first, so newer writes win) into `buf`,
/// which holds the device bytes at `offset_bytes`.
fn apply_overlay(buf: &mut [u8], offset_bytes: u64, overlay: &[(u64, Arc<[u8]>)]) {
    let end = offset_bytes + buf.len() as u64;
    for (write_offset, data) in overlay {
        let start = offset_bytes.max(*write_offset);
        let stop = end.min(write_offset + data.len() as u64);
        if start >= stop {
            continue;
        }
        let dst = (start - offset_bytes) as usize..(stop - offset_bytes) as usize;
        let src = (start - write_offset) as usize..(stop - write_offset) as usize;
        buf[dst].copy_from_slice(&data[src]);
    }
}

impl Backend for FaultBackend {
    fn name(&self) -> &str {
        self.shared.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.shared.inner.size_bytes()
    }

    fn read(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        let (latency, inject_error, flip_seed, pass_through) = {
            let mut state = lock(&self.shared.state);
            if let Err(err) = Self::admit(&mut state, OpClass::Read) {
                return IoFuture::ready(Err(err));
            }
            let (p_error, p_flip) = (
                state.read_error_probability,
                state.read_bit_flip_probability,
            );
            let inject_error = draw(&mut state.rng, p_error);
            let flip_seed = draw(&mut state.rng, p_flip).then(|| state.rng.random::<u64>());
            if inject_error {
                state.stats.read_errors_injected += 1;
            }
            let latency = state.latency + state.read_latency;
            let pass_through = latency.is_zero()
                && !inject_error
                && flip_seed.is_none()
                && state.volatile.is_empty();
            (latency, inject_error, flip_seed, pass_through)
        };
        if pass_through {
            return self.shared.inner.read(offset_bytes, buf);
        }
        let shared = self.shared.clone();
        let in_flight = ReadInFlight::new(&shared);
        IoFuture::boxed(async move {
            let _in_flight = in_flight;
            delay_or_fail(latency, inject_error).await?;
            let overlay = overlay_for(&lock(&shared.state), offset_bytes, buf.len());
            let mut buf = shared.inner.read(offset_bytes, buf).await?;
            apply_overlay(&mut buf, offset_bytes, &overlay);
            if let Some(seed) = flip_seed {
                let flipped = flip_random_bits(&mut buf, &mut SmallRng::seed_from_u64(seed));
                let mut state = lock(&shared.state);
                state.stats.reads_bit_flipped += 1;
                state.stats.bits_flipped += u64::from(flipped);
            }
            Ok(buf)
        })
    }

    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.write_kind(offset_bytes, buf, false)
    }

    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.write_kind(offset_bytes, buf, true)
    }

    /// Forwards the shared buffer to the inner device, so a write that outlives its future
    /// there (io_uring's) keeps holding it, as the trait asks. Only the power-loss overlay,
    /// which completes in memory, takes a copy.
    fn write_shared(&self, offset_bytes: u64, buf: Arc<IoBuf>) -> IoFuture<()> {
        let (latency, inject_error, tracking) =
            match self.admit_write(offset_bytes, buf.len(), false) {
                Ok(admitted) => admitted,
                Err(err) => return IoFuture::ready(Err(err)),
            };
        if tracking {
            let write = self.write_admitted(
                offset_bytes,
                IoBuf::from_slice(&buf),
                false,
                latency,
                inject_error,
                tracking,
            );
            return IoFuture::boxed(async move { write.await.map(drop) });
        }
        if latency.is_zero() && !inject_error {
            return self.shared.inner.write_shared(offset_bytes, buf);
        }
        let shared = self.shared.clone();
        IoFuture::boxed(async move {
            delay_or_fail(latency, inject_error).await?;
            shared.inner.write_shared(offset_bytes, buf).await
        })
    }

    fn durable_write_mode(&self) -> DurableWriteMode {
        let chosen = lock(&self.shared.state).durable_write_mode;
        chosen.unwrap_or_else(|| self.shared.inner.durable_write_mode())
    }

    fn flush(&self) -> IoFuture<()> {
        let (latency, tracking, cover_seq) = {
            let mut state = lock(&self.shared.state);
            if let Err(err) = Self::admit(&mut state, OpClass::Flush) {
                return IoFuture::ready(Err(err));
            }
            // Covers exactly the writes that completed before this flush was issued.
            (
                state.latency,
                state.power_loss_tracking,
                state.next_write_seq,
            )
        };
        if latency.is_zero() && !tracking {
            return self.shared.inner.flush();
        }
        let shared = self.shared.clone();
        IoFuture::boxed(async move {
            if !latency.is_zero() {
                sleep(latency).await;
            }
            if !tracking {
                return shared.inner.flush().await;
            }
            let _gate = FlushGateAcquire { shared: &shared }.await;
            let batch: Vec<(u64, Arc<[u8]>)> = {
                let state = lock(&shared.state);
                if state.dead {
                    return Err(eio());
                }
                state
                    .volatile
                    .iter()
                    .take_while(|w| w.seq < cover_seq)
                    .map(|w| (w.offset_bytes, w.data.clone()))
                    .collect()
            };
            // In completion order, so a later write to the same range wins on `inner` too.
            for (offset_bytes, data) in &batch {
                shared
                    .inner
                    .write(*offset_bytes, IoBuf::from_slice(data))
                    .await?;
            }
            shared.inner.flush().await?;
            let mut state = lock(&shared.state);
            if state.dead {
                // Power failed during the flush: it does not complete, and its writes stay
                // volatile (they may also already be on `inner`, which is a legal outcome).
                state.stats.ops_failed_after_power_loss += 1;
                return Err(eio());
            }
            // Entries are removed only now, so concurrent reads saw them in the overlay until
            // `inner` held them.
            while state.volatile.front().is_some_and(|w| w.seq < cover_seq) {
                state.volatile.pop_front();
            }
            state.stats.flushes_applied += 1;
            Ok(())
        })
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()> {
        let tracking = {
            let mut state = lock(&self.shared.state);
            if let Err(err) = Self::admit(&mut state, OpClass::Discard) {
                return IoFuture::ready(Err(err));
            }
            state.power_loss_tracking
        };
        if tracking {
            // A discard may be a no-op; applying it under the overlay would reorder it
            // against volatile writes.
            return IoFuture::ready(Ok(()));
        }
        self.shared.inner.discard(offset_bytes, length_bytes)
    }
}

impl std::fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultBackend")
            .field("inner", &self.shared.inner.name())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Waits for the flush gate; the guard releases it (also when the flush is dropped).
struct FlushGateAcquire<'a> {
    shared: &'a FaultShared,
}

struct FlushGateGuard<'a> {
    shared: &'a FaultShared,
}

impl<'a> Future for FlushGateAcquire<'a> {
    type Output = FlushGateGuard<'a>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FlushGateGuard<'a>> {
        let mut gate = lock(&self.shared.gate);
        if !gate.busy {
            gate.busy = true;
            return Poll::Ready(FlushGateGuard {
                shared: self.shared,
            });
        }
        if gate.waiters.len() < FLUSH_GATE_WAITERS_MAX {
            gate.waiters.push(cx.waker().clone());
        } else {
            // Over the bound: retry soon rather than grow.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl Drop for FlushGateGuard<'_> {
    fn drop(&mut self) {
        let waiters = {
            let mut gate = lock(&self.shared.gate);
            debug_assert!(gate.busy);
            gate.busy = false;
            std::mem::take(&mut gate.waiters)
        };
        // All of them: a waiter may have been dropped, and waking only one would lose the
        // gate. The losers wait again.
        for waker in waiters {
            waker.wake();
        }
    }
}
