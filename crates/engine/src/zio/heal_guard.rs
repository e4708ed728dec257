//! [`HealGuard`]: the places of a block that a self-heal rewrites, kept from reuse while it
//! does, and while any write it started may still reach the device.

use super::{heal_held, Repairs, Zio};
use oxpool_format::Dva;
use oxpool_io::IoBuf;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, Weak};

/// Most places registered by heals at once (each reader heals one block at a time; a heal
/// dropped with a write in flight keeps its places until the write ends); beyond it a heal
/// is skipped (the bad copy is found again later, by a read or a scrub).
const HEALING_PLACES_MAX: usize = 1 << 16;

/// The places self-heals are rewriting, which the txg sync must not release
/// ([`HealRegistry::held`]).
#[derive(Debug, Default)]
pub struct HealRegistry {
    places: Mutex<Places>,
}

#[derive(Debug, Default)]
struct Places {
    /// The places of every live [`HealGuard`].
    live: Vec<Dva>,
    /// Heals dropped (their reader's future dropped: a client gone, a request cancelled)
    /// while a write of theirs may still be in flight. A write submitted to the kernel is
    /// not cancelled by dropping its future: the I/O driver keeps the buffer until the
    /// completion comes. So the places stay held while any of those buffers lives.
    orphans: Vec<Orphan>,
}

#[derive(Debug)]
struct Orphan {
    dvas: Vec<Dva>,
    /// The buffers of the heal's writes; alive while a write may still be in flight.
    writes: Vec<Weak<IoBuf>>,
}

impl Places {
    fn len(&self) -> usize {
        self.live.len() + self.orphans.iter().map(|o| o.dvas.len()).sum::<usize>()
    }

    /// Drops the orphans none of whose writes is in flight any more.
    fn forget_ended_orphans(&mut self) {
        self.orphans
            .retain(|o| o.writes.iter().any(|w| w.strong_count() > 0));
    }
}

/// The places no free may release now, for one pass of the txg sync over its frees.
pub struct HeldPlaces<'a>(MutexGuard<'a, Places>);

impl HeldPlaces<'_> {
    /// Whether no place is held (the common case: the sync then looks no further).
    pub fn is_empty(&self) -> bool {
        self.0.live.is_empty() && self.0.orphans.is_empty()
    }

    /// Whether `dva` is held.
    pub fn contains(&self, dva: &Dva) -> bool {
        self.0.live.contains(dva) || self.0.orphans.iter().any(|o| o.dvas.contains(dva))
    }
}

impl HealRegistry {
    /// The places held now. Orphaned heals whose writes have all ended are forgotten first.
    pub fn held(&self) -> HeldPlaces<'_> {
        let mut places = self.places.lock().unwrap();
        places.forget_ended_orphans();
        HeldPlaces(places)
    }
}

/// Keeps the places of a block that a self-heal rewrites from being released while it lives
/// ([`HealRegistry::held`], which the txg sync consults before it releases a deferred free).
/// A heal of a block no longer current would write the old block over whatever reused its
/// place.
///
/// Made before the check that the block is still current: a free before it is seen by that
/// check, and one after it stays deferred until the rewrite is done, however long a failing
/// device takes (a reviewer found the check alone left that window open). Only these places
/// wait, not the other frees of their txg.
///
/// Dropped before its writes ended (the reader's future dropped mid-heal), it leaves its
/// places held until the I/O driver lets go of the last write's buffer (a later reviewer
/// found the guard otherwise ended before a write it had started).
pub struct HealGuard<'a> {
    zio: &'a Zio,
    dvas: Vec<Dva>,
    /// The buffers of the writes this heal started ([`HealGuard::track`]).
    writes: Mutex<Vec<Weak<IoBuf>>>,
}

impl<'a> HealGuard<'a> {
    /// Registers the places of `dvas`; None (no heal) if too many are registered already.
    pub fn new(zio: &'a Zio, dvas: &[Dva]) -> Option<HealGuard<'a>> {
        let mut places = zio.healing.places.lock().unwrap();
        // Orphans whose writes ended count no more (the sync prunes too, but may be hours away
        // on an idle pool).
        places.forget_ended_orphans();
        if places.len() + dvas.len() > HEALING_PLACES_MAX {
            return None;
        }
        places.live.extend_from_slice(dvas);
        Some(HealGuard {
            zio,
            dvas: dvas.to_vec(),
            writes: Mutex::new(Vec::new()),
        })
    }

    /// Notes a write of the heal, from `buf`, before it is started: the places stay held
    /// while the buffer lives, even past the guard.
    pub fn track(&self, buf: Weak<IoBuf>) {
        self.writes.lock().unwrap().push(buf);
    }
}

impl Drop for HealGuard<'_> {
    fn drop(&mut self) {
        let mut writes = std::mem::take(self.writes.get_mut().unwrap());
        writes.retain(|w| w.strong_count() > 0);
        let mut places = self.zio.healing.places.lock().unwrap();
        for dva in &self.dvas {
            if let Some(i) = places.live.iter().position(|d| d == dva) {
                places.live.swap_remove(i);
            }
        }
        if !writes.is_empty() {
            places.orphans.push(Orphan {
                dvas: std::mem::take(&mut self.dvas),
                writes,
            });
        }
    }
}

/// Rewrites the copies `bad` of a block at `dvas` with `good` if `current` says the block is
/// still the one they held. `current` is awaited only once the places are registered (a
/// future does nothing until then): the order [`HealGuard`] needs, in one place for every
/// reader that heals a block whose pointer may change under it.
pub async fn heal_if_current(
    zio: &Zio,
    dvas: &[Dva],
    bad: &Repairs,
    good: &IoBuf,
    current: impl Future<Output = bool>,
) {
    if bad.is_empty() {
        return;
    }
    let Some(places) = HealGuard::new(zio, dvas) else {
        return;
    };
    if current.await {
        heal_held(zio, &bad.0, good, &places).await;
    }
}
