//! [`HealGuard`]: the places of a block that a self-heal rewrites, kept from reuse while it
//! does.

use super::{heal_copies, Repairs, Zio};
use oxpool_format::Dva;
use oxpool_io::IoBuf;
use std::future::Future;

/// Most places registered by heals in flight at once (each reader heals one block at a time);
/// beyond it a heal is skipped (the bad copy is found again later, by a read or a scrub).
const HEALING_PLACES_MAX: usize = 1 << 16;

/// Keeps the places of a block that a self-heal rewrites from being released while it lives
/// (`Zio::healing`, which the txg sync consults before it releases a deferred free). A heal
/// of a block no longer current would write the old block over whatever reused its place.
///
/// Made before the check that the block is still current: a free before it is seen by that
/// check, and one after it stays deferred until the rewrite is done, however long a failing
/// device takes (a reviewer found the check alone left that window open). Only these places
/// wait, not the other frees of their txg.
pub struct HealGuard<'a> {
    zio: &'a Zio,
    dvas: Vec<Dva>,
}

impl<'a> HealGuard<'a> {
    /// Registers the places of `dvas`; None (no heal) if too many are registered already.
    pub fn new(zio: &'a Zio, dvas: &[Dva]) -> Option<HealGuard<'a>> {
        let mut healing = zio.healing.lock().unwrap();
        if healing.len() + dvas.len() > HEALING_PLACES_MAX {
            return None;
        }
        healing.extend_from_slice(dvas);
        Some(HealGuard {
            zio,
            dvas: dvas.to_vec(),
        })
    }
}

impl Drop for HealGuard<'_> {
    fn drop(&mut self) {
        let mut healing = self.zio.healing.lock().unwrap();
        for dva in &self.dvas {
            if let Some(i) = healing.iter().position(|d| d == dva) {
                healing.swap_remove(i);
            }
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
    let Some(_places) = HealGuard::new(zio, dvas) else {
        return;
    };
    if current.await {
        heal_copies(zio, bad, good).await;
    }
}
