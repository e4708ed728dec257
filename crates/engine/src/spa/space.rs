//! Space: the dirty-data limit and the slop a txg sync may always use; the check every writer
//! passes before it dirties anything (so that a sync never runs out of space); and the pin a
//! scrub batch holds on deferred frees, with the writers that wait for it.

use crate::spa::{Spa, SpaState};
use crate::vdev::alloc::{
    Allocator, ClassBytes, Keep, Reserve, Space, CLASSES, DEFER_TXGS, SLAB_BYTES,
};
use crate::{EngineError, Result};
use oxpool_format::Txg;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Poll, Waker};

/// The dirty-data limit in force: `dirty_max`, but at most an eighth of the pool. A txg's
/// space is allocated anew (copy-on-write) while the space it frees comes back only
/// DEFER_TXGS txgs later, so a few txgs' worth of free space must always exist.
pub(crate) fn effective_dirty_max(dirty_max_bytes: u64, pool_bytes: u64) -> u64 {
    dirty_max_bytes.min((pool_bytes / 8).max(1 << 20))
}

/// Space kept for txg syncs beyond what writers charge to their txgs (see
/// [`Spa::wait_for_space`]): the space maps, the pool metadata (whose list of deferred
/// frees grows with what recent txgs freed), a tree growing a level. Writers may not use it;
/// the sync may (as ZFS's slop space). Frees may use half of it: they give space back.
pub(crate) fn slop_bytes(pool_bytes: u64) -> u64 {
    (pool_bytes / 32).max(4 << 20)
}

/// Syncs in which nobody got space that a writer waits through before it gets ENOSPC (each
/// returns deferred frees).
const SPACE_WAIT_SYNCS_MAX: u32 = 2 * DEFER_TXGS as u32 + 4;

/// Bound on a writer's rounds of waiting for space, those in which others got it included.
const SPACE_WAIT_ROUNDS_MAX: u32 = 16 * SPACE_WAIT_SYNCS_MAX;

/// A writer's place in the space check, from [`Spa::wait_for_space`] until its change is
/// charged to its txg ([`crate::spa::txg::TxgHold::note_dirty`]): while it lives, the worst case of
/// the change counts as needed, so concurrent writers cannot all pass the check on the same
/// free space. Drop it after `note_dirty`.
pub(crate) struct SpaceAdmission<'a> {
    inner: &'a Spa,
    bytes: ClassBytes,
}

impl Drop for SpaceAdmission<'_> {
    fn drop(&mut self) {
        self.inner.txg.state.lock().unwrap().space_admitting -= self.bytes;
    }
}

impl Spa {
    /// What writers may still fill, as ZFS's `available`: the free space (`oxpool list`'s
    /// FREE: what synced txgs freed counts as free) less the reserve kept for txg syncs (the
    /// slop, a slab per size class and data vdev), what the unsynced txgs are charged, and
    /// what the datasets' reservations hold unused ([`Spa::reserved_bytes`]; a dataset
    /// with a reservation may fill its own part too). In allocated bytes, as `used` counts
    /// them (a raidz's parity included).
    pub fn available_bytes(&self) -> u64 {
        let (size, allocated) = self.size_and_alloc_bytes();
        let reserve = {
            let s = self.state.lock().unwrap();
            let space = s.alloc.space();
            Self::sync_reserve(&s.alloc, &space, false).total_bytes()
        };
        // The blocks' own sizes, not inflated by a raidz's parity: an estimate of what is
        // about to be taken, gone once those txgs sync.
        let needed = self.txg.state.lock().unwrap().space_needed().total();
        size.saturating_sub(allocated)
            .saturating_sub(reserve)
            .saturating_sub(needed)
            .saturating_sub(self.reserved_bytes.load(Ordering::Relaxed))
    }

    /// Empty-slab space that must stay free beside what the pending syncs need: the slop
    /// (half of it for `frees`), and one slab per size class and data vdev that a sync may
    /// leave partly filled (see [`Allocator::fits`]).
    ///
    /// Half the slop may be held in free slots that the charged blocks leave over, in the
    /// classes a one-sector block can use: the small uncharged blocks (space-map chunks,
    /// indirect blocks) take them, their own class's or larger ones' (`Placement::Borrow`).
    /// The other half (the PoolMeta, up to a slab a piece) and the partly filled slabs stay
    /// in empty slabs. Before, all of it had to be empty slabs:
    /// writers fill a pool until the empty slabs are the reserve, a sync then dips into it
    /// (it may), and frees come back as slots, not slabs, while every slab keeps a live
    /// block. A raidz2 pool then refused every write with 150 MiB free in slots, 11.2 MiB of
    /// empty slabs against a reserve of 11.5 (`space.rs`, 2026-11-30). Now writers still stop
    /// at the whole reserve while slots are full, and are refused only once the sync has
    /// taken more than half the slop.
    pub(crate) fn sync_reserve(alloc: &Allocator, space: &Space, frees: bool) -> Reserve {
        let slop = slop_bytes(space.size_bytes);
        let slop = if frees { slop / 2 } else { slop };
        Reserve {
            empty_bytes: slop - slop / 2 + CLASSES as u64 * SLAB_BYTES * alloc.data_vdevs() as u64,
            slots_bytes: slop / 2,
        }
    }

    /// What an allocation of the txg sync or the intent log leaves to others
    /// ([`Allocator::alloc_with`]): the reserve's empty part, and the pending charges. Once
    /// the syncing txg has placed every block it was charged for, its charge no longer
    /// holds slots back: the uncharged blocks after it (space-map chunks, the PoolMeta) may
    /// borrow the slots it left, which `fits` counted toward the reserve (found by review:
    /// with the charge still counted, those blocks found no slot to borrow and took the
    /// reserve's empty slabs only).
    ///
    /// The floor: a `charged` block (data and indirect blocks of the txg being synced, which
    /// `fits` counted against the empty slabs above the reserve's empty part) takes empty
    /// slabs down to that part. Any other (space-map chunks, the PoolMeta, log blocks) takes
    /// a larger class's spare slots first once the empty slabs are down to the whole
    /// reserve: else, on a pool whose writers had taken the empty slabs down to the empty
    /// part, the first of them took it below, and with every slab keeping a live block the
    /// pool refused all writes from then on (a raidz2 pool with 131 MiB free in slots,
    /// `space.rs` under load, 2026-11-30).
    pub(crate) fn keep(&self, alloc: &Allocator, space: &Space, charged: bool) -> Keep {
        let reserve = Self::sync_reserve(alloc, space, false);
        let empty_bytes = if charged {
            reserve.empty_bytes
        } else {
            reserve.total_bytes()
        };
        let placed = self.charged_placed_txg.load(Ordering::SeqCst);
        let t = self.txg.state.lock().unwrap();
        Keep {
            empty_bytes,
            need: match placed {
                0 => t.space_needed(),
                txg => t.space_needed_after(Txg(txg)),
            },
        }
    }

    /// Whether `need` fits with the reserve left over, and `held_bytes` of empty slabs
    /// besides (other datasets' unused reservations), once slabs of classes with free slots
    /// to spare are given to those short of them ([`Allocator::make_room`]).
    ///
    /// Reservations are held in empty slabs, as the reserve's empty part is: the dataset
    /// they are for may write blocks of any size class, and only an empty slab takes any.
    fn fits(alloc: &mut Allocator, need: &ClassBytes, frees: bool, held_bytes: u64) -> bool {
        let space = alloc.space();
        let mut reserve = Self::sync_reserve(alloc, &space, frees);
        reserve.empty_bytes = reserve.empty_bytes.saturating_add(held_bytes);
        alloc.make_room(need, reserve)
    }

    /// Whether the datasets' reservations can hold `more_bytes` more where the write throttle
    /// keeps them, in empty slabs beside everything the pending syncs may need and the
    /// reserve ([`Spa::fits`]). `available` counts free slots too, which a reservation
    /// cannot use: on a fragmented pool this is the stricter check.
    pub(crate) fn can_reserve(&self, more_bytes: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        let need = self.txg.state.lock().unwrap().space_needed();
        let held = self
            .reserved_bytes
            .load(Ordering::Relaxed)
            .saturating_add(more_bytes);
        Self::fits(&mut s.alloc, &need, false, held)
    }

    /// Whether something outside the txg sync (the intent log) may allocate `extra` now: it
    /// must leave the pending syncs everything they may need and the slop. Called with the
    /// pool's state locked (the allocator) and allocating under the same lock.
    ///
    /// Log blocks may take from the datasets' reservations: they hold records only until
    /// their txg syncs, and a writer of a reserved dataset that finds them in its way waits
    /// for those syncs ([`Spa::wait_for_space`], which gives up only after several syncs
    /// in which nobody got space).
    pub(crate) fn may_allocate_outside_sync(
        &self,
        alloc: &mut Allocator,
        extra: ClassBytes,
    ) -> bool {
        let need = self.txg.state.lock().unwrap().space_needed() + extra;
        Self::fits(alloc, &need, false, 0)
    }

    /// The write throttle's space check. A change whose txg sync may allocate up to `bytes`
    /// (by size class, every copy) waits until it fits beside what every unsynced txg's sync
    /// may allocate, with the reserve left over ([`Allocator::fits`]: sure to fit, not just
    /// in total bytes but in places the blocks can go). Each round asks for a sync, which
    /// releases its txg's charge and returns deferred frees; ENOSPC after a bounded number
    /// of rounds in which no writer got space. Rounds in which others did count only against
    /// a larger bound: with several writers waiting, the space a sync gives back may go to
    /// the others every time, and the pool is then busy, not full (four writers of sync 4 KiB
    /// writes on a pool half full got ENOSPC about once in ten runs when every round counted).
    /// This is what makes a sync never run out of space: everything it allocates was charged
    /// and checked here first (the intent log's allocations are checked the same way, see
    /// [`Spa::may_allocate_outside_sync`]).
    ///
    /// `own_reserved` is the writer's dataset's unused reservation: of what the datasets'
    /// reservations hold ([`Spa::reserved_bytes`]), everything else stays free for them.
    /// Read every round: a sync changes both. Not for `frees`: a free gives space back once
    /// synced (the indirect blocks it rewrites are what it takes meanwhile), and a pool
    /// whose free space is all reserved must still let a thin volume be trimmed.
    pub(crate) async fn wait_for_space(
        &self,
        bytes: ClassBytes,
        frees: bool,
        own_reserved: &AtomicU64,
    ) -> Result<SpaceAdmission<'_>> {
        let mut rounds_without_admissions = 0;
        let mut held_last = 0;
        for _ in 0..SPACE_WAIT_ROUNDS_MAX {
            let (held_back, admissions_before) = {
                let mut s = self.state.lock().unwrap();
                let mut t = self.txg.state.lock().unwrap();
                let need = t.space_needed() + bytes;
                let held = match frees {
                    true => 0,
                    false => self
                        .reserved_bytes
                        .load(Ordering::Relaxed)
                        .saturating_sub(own_reserved.load(Ordering::Relaxed)),
                };
                held_last = held;
                if Self::fits(&mut s.alloc, &need, frees, held) {
                    t.space_admitting += bytes;
                    t.space_admissions += 1;
                    return Ok(SpaceAdmission { inner: self, bytes });
                }
                let batch = batches_done(self);
                (
                    pin_holds_frees(&s, t.open).then_some(batch),
                    t.space_admissions,
                )
            };
            // A scrub batch holds back frees the next sync would give back: they come back
            // only once it is done. Not a round of its own: one batch's reads, then the sync.
            if let Some(batch) = held_back {
                wait_batch_done(self, batch).await;
            }
            let open = self.txg.state.lock().unwrap().open;
            self.txg.kick();
            self.txg.wait_synced(open, true).await?;
            if self.txg.state.lock().unwrap().space_admissions == admissions_before {
                rounds_without_admissions += 1;
                if rounds_without_admissions == SPACE_WAIT_SYNCS_MAX {
                    break;
                }
            }
        }
        let detail = {
            let s = self.state.lock().unwrap();
            let space = s.alloc.space();
            where_free(
                &space,
                Self::sync_reserve(&s.alloc, &space, frees),
                held_last,
            )
        };
        Err(EngineError::NoSpace {
            pool: self.name.clone(),
            detail,
        })
    }
}

/// Where a pool's free space is, for an out-of-space error: a write needs room in empty slabs
/// (beyond the reserve) or in free slots of its blocks' sizes, and free space elsewhere
/// (slots of other sizes, the unused ends of slots larger than their blocks: a compressed or
/// raidz block takes the next power of two of sectors) cannot take it (docs/space.md).
/// `held_bytes`: what other volumes' reservations keep from this writer.
fn where_free(space: &crate::vdev::alloc::Space, reserve: Reserve, held_bytes: u64) -> String {
    let mib = |b: u64| format!("{:.1}M", b as f64 / f64::from(1u32 << 20));
    let slots: u64 = space.free_slots.0.iter().sum();
    let ends = space
        .free_bytes
        .saturating_sub(space.empty_bytes)
        .saturating_sub(slots);
    // What to do first, in the administrator's words; where the free space lies (what only
    // docs/space.md explains) after it, for a report.
    let reserved = match held_bytes {
        0 => String::new(),
        b => format!(
            " and {} reserved for other volumes (refreservation)",
            mib(b)
        ),
    };
    format!(
        "; {} free of {}, {} of it kept for the txg sync{reserved}; make room (destroy \
         snapshots or volumes, trim or discard from the client) or add a device (oxpool add). \
         Where the free space is: {} in empty slabs, {} in free slots of block sizes, {} in \
         the unused ends of slots larger than their blocks (docs/space.md)",
        mib(space.free_bytes),
        mib(space.size_bytes),
        mib(reserve.total_bytes()),
        mib(space.empty_bytes),
        mib(slots),
        mib(ends)
    )
}

/// Bound on the list of writers waiting for a scan batch's pin to go (each re-registers on
/// every poll; duplicates are dropped).
const PIN_WAITERS_MAX: usize = 1 << 16;

/// Scrub batches done, and the writers waiting for the running one.
#[derive(Default)]
pub(crate) struct ScanBatches {
    waiters: Mutex<Vec<Waker>>,
    done: AtomicU64,
}

/// Holds back the release of deferred frees newer than the last durable txg while it lives:
/// a scrub batch reads only blocks whose places cannot be reused under it (`dsl/scan.rs`).
pub(crate) struct ScanPin<'a> {
    spa: &'a Spa,
}

impl<'a> ScanPin<'a> {
    /// Pins the last durable txg.
    pub(crate) fn set(spa: &'a Spa) -> ScanPin<'a> {
        let mut s = spa.state.lock().unwrap();
        // Under the state lock, which the sync holds while it releases frees: a release
        // either happened before this (and freed nothing the caller can reach from what it
        // reads next) or sees the pin.
        debug_assert!(s.scan_pin.is_none(), "one scan at a time");
        s.scan_pin = Some(spa.txg.synced());
        ScanPin { spa }
    }
}

impl Drop for ScanPin<'_> {
    fn drop(&mut self) {
        self.spa.state.lock().unwrap().scan_pin = None;
        self.spa.scan_batches.done.fetch_add(1, Ordering::SeqCst);
        let waiters = std::mem::take(&mut *self.spa.scan_batches.waiters.lock().unwrap());
        for w in waiters {
            w.wake();
        }
    }
}

/// The number of scan batches done so far (to wait for the next with [`wait_batch_done`]).
fn batches_done(spa: &Spa) -> u64 {
    spa.scan_batches.done.load(Ordering::SeqCst)
}

/// Whether the scan's pin holds back a deferred free that the sync of txg `next` would
/// otherwise release (called with the pool's state locked).
fn pin_holds_frees(s: &SpaState, next: Txg) -> bool {
    s.scan_pin.is_some_and(|pin| {
        s.deferred
            .iter()
            .any(|d| d.txg > pin && d.txg.0 + DEFER_TXGS < next.0)
    })
}

/// Waits until the scan batch running when [`batches_done`] returned `seen` is done: a
/// writer short of space whose frees a batch holds back waits for that batch (its reads)
/// rather than for syncs that cannot give the space back.
async fn wait_batch_done(spa: &Spa, seen: u64) {
    poll_fn(|cx| {
        // Registered before the check, which ScanPin::drop's wake follows: no wake-up is lost.
        {
            let mut waiters = spa.scan_batches.waiters.lock().unwrap();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                assert!(waiters.len() < PIN_WAITERS_MAX, "pin waiter list overflow");
                waiters.push(cx.waker().clone());
            }
        }
        if batches_done(spa) == seen && spa.state.lock().unwrap().scan_pin.is_some() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}
