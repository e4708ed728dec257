//! Claiming, at import, the places an intent log holds, so that each is freed exactly once.
//!
//! Import finds a log's places in two ways: the list the committed txg persisted
//! (`log_reserved`: the chain, the open block, the next block's place, and in-place blocks the
//! sync allocated but did not adopt) and the chain walked from its head on disk, with the
//! in-place blocks its records point at. The walk reaches blocks written after that txg, so
//! their places may be, in the committed state:
//!
//! - free in the space maps: allocated after the maps were encoded. Claimed now.
//! - allocated as a deferred free of that txg or one before it: the place was freed, and
//!   became allocatable in memory when a later sync (that did not commit) began, and a log
//!   block was written there. Left as it is, the deferred free would release it at the
//!   replay's sync and the log would free it again after the replay: a double free, and the
//!   allocator could hand the place out while the log still needs it (a crash before the
//!   replay's sync commits walks the chain again). So the log takes it over: its sectors
//!   leave the deferred list, and the log frees them once, after the replay.
//! - allocated otherwise: referenced by the committed tree (an in-place block the sync
//!   adopted). Not the log's to free.
//!
//! Every listed place is the log's; the maps show it allocated or, allocated after they were
//! encoded, free (claimed now). Found by the audit at the end of the `log_faults` crash test.

use crate::vdev::alloc::Allocator;
use oxpool_format::{DeferredFree, Dva, VdevId, SECTOR_BYTES};
use std::collections::BTreeMap;

/// Sector runs `[start, end)` by vdev.
type Runs = BTreeMap<u32, Vec<(u64, u64)>>;

/// Largest run returned as one place (a place's size is a u32 of bytes).
const RUN_SECTORS_MAX: u64 = (u32::MAX as u64 / SECTOR_BYTES) & !0xff;

/// Claims the places of one intent log at import (see the module docs): `listed` are the
/// places the committed txg persisted as the log's, `walked` those found by walking its chain
/// (log blocks and in-place blocks of the records). Returns what the log owns now, to free
/// once after its replay: every listed place, and the parts of walked places that were free
/// (now allocated) or deferred frees (now out of `deferred`). Places outside the maps (a
/// pointer read from disk that names no vdev, or lies past its end) are ignored.
pub(crate) fn claim_log_places(
    alloc: &mut Allocator,
    deferred: &mut Vec<DeferredFree>,
    listed: &[Dva],
    walked: &[Dva],
) -> Vec<Dva> {
    if listed.is_empty() && walked.is_empty() {
        return Vec::new();
    }
    let mut deferred_at: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for d in deferred.iter().flat_map(|f| f.dvas.iter()) {
        let (start, end) = sector_run(d);
        deferred_at.insert((d.vdev.0, start), end);
    }
    let is_deferred = |vdev: u32, sector: u64| {
        deferred_at
            .range(..=(vdev, sector))
            .next_back()
            .is_some_and(|(&(v, _), &end)| v == vdev && sector < end)
    };
    let mut owned: Runs = BTreeMap::new();
    let mut took_deferred = false;
    let places = listed
        .iter()
        .map(|d| (d, true))
        .chain(walked.iter().map(|d| (d, false)));
    for (dva, is_listed) in places {
        let (start, end) = sector_run(dva);
        let in_map = alloc
            .maps()
            .get(dva.vdev.0 as usize)
            .is_some_and(|m| start < end && end <= m.sectors());
        if !in_map {
            continue;
        }
        let map = alloc.map_mut(dva.vdev);
        let runs = owned.entry(dva.vdev.0).or_default();
        // Runs of sectors alike: free ones are claimed as one run, so that an empty slab
        // takes the size class of the whole block, as an allocation of it would.
        let mut sector = start;
        // Bounded by the place's sectors: each round consumes at least one.
        while sector < end {
            let free = !map.is_sector_allocated(sector);
            let mut run_end = sector + 1;
            while run_end < end && map.is_sector_allocated(run_end) != free {
                run_end += 1;
            }
            if free {
                for piece in split(dva.vdev, sector, run_end) {
                    let claimed = map.claim(&piece);
                    debug_assert!(claimed, "a free run is claimed");
                }
                push_run(runs, sector, run_end);
            } else {
                for s in sector..run_end {
                    let deferred_here = is_deferred(dva.vdev.0, s);
                    took_deferred |= deferred_here;
                    if is_listed || deferred_here {
                        push_run(runs, s, s + 1);
                    }
                }
            }
            sector = run_end;
        }
    }
    for runs in owned.values_mut() {
        merge(runs);
    }
    if took_deferred {
        for f in deferred.iter_mut() {
            f.dvas = f
                .dvas
                .iter()
                .flat_map(|d| subtract(d, owned.get(&d.vdev.0).map_or(&[][..], |r| r)))
                .collect();
        }
        deferred.retain(|f| !f.dvas.is_empty());
    }
    owned
        .iter()
        .flat_map(|(v, runs)| runs.iter().flat_map(move |&(s, e)| split(VdevId(*v), s, e)))
        .collect()
}

/// Appends `[start, end)` to runs, joining it to the last run when they touch.
fn push_run(runs: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    match runs.last_mut() {
        Some((_, e)) if *e == start => *e = end,
        _ => runs.push((start, end)),
    }
}

fn sector_run(d: &Dva) -> (u64, u64) {
    let start = d.offset_bytes / SECTOR_BYTES;
    (
        start,
        start.saturating_add(u64::from(d.asize_bytes).div_ceil(SECTOR_BYTES)),
    )
}

fn sector_dva(vdev: VdevId, start: u64, end: u64) -> Dva {
    debug_assert!(start < end && end - start <= RUN_SECTORS_MAX);
    Dva {
        vdev,
        offset_bytes: start * SECTOR_BYTES,
        asize_bytes: ((end - start) * SECTOR_BYTES) as u32,
    }
}

/// Sorts runs and joins the overlapping ones (the same place listed and walked).
fn merge(runs: &mut Vec<(u64, u64)>) {
    runs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for &(s, e) in runs.iter() {
        match out.last_mut() {
            Some((_, oe)) if s <= *oe => *oe = (*oe).max(e),
            _ => out.push((s, e)),
        }
    }
    *runs = out;
}

/// The parts of `d` outside `runs` (sorted, disjoint).
fn subtract(d: &Dva, runs: &[(u64, u64)]) -> Vec<Dva> {
    let (start, end) = sector_run(d);
    let first = runs.partition_point(|&(_, e)| e <= start);
    let mut out = Vec::new();
    let mut at = start;
    for &(s, e) in runs[first..].iter().take_while(|&&(s, _)| s < end) {
        if s > at {
            out.extend(split(d.vdev, at, s));
        }
        at = at.max(e);
    }
    if at == start {
        return vec![*d];
    }
    if at < end {
        out.extend(split(d.vdev, at, end));
    }
    out
}

/// One run as places of at most [`RUN_SECTORS_MAX`] sectors.
fn split(vdev: VdevId, start: u64, end: u64) -> impl Iterator<Item = Dva> {
    (start..end)
        .step_by(RUN_SECTORS_MAX as usize)
        .map(move |s| sector_dva(vdev, s, (s + RUN_SECTORS_MAX).min(end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::Txg;

    fn place(sector: u64, sectors: u64) -> Dva {
        sector_dva(VdevId(0), sector, sector + sectors)
    }

    fn allocated(a: &Allocator, d: &Dva) -> Vec<bool> {
        let (s, e) = sector_run(d);
        (s..e)
            .map(|x| a.map(VdevId(0)).is_sector_allocated(x))
            .collect()
    }

    /// A walked block written where a deferred free was (the case the crash test found): the
    /// log owns it, the deferred free keeps only the rest, so the place is freed once.
    #[test]
    fn walked_block_over_a_deferred_free_leaves_the_deferred_list() {
        let mut a = Allocator::new(&[1 << 30]);
        let freed = place(100, 32);
        assert!(a.map_mut(VdevId(0)).claim(&freed));
        let mut deferred = vec![DeferredFree {
            txg: Txg(5),
            dvas: vec![freed],
        }];
        let walked = place(100, 13);
        let owned = claim_log_places(&mut a, &mut deferred, &[], &[walked]);
        assert_eq!(owned, vec![walked]);
        assert_eq!(deferred.len(), 1);
        assert_eq!(deferred[0].dvas, vec![place(113, 19)]);
        assert!(allocated(&a, &freed).iter().all(|&b| b));
        assert_eq!(a.map(VdevId(0)).allocated_bytes(), 32 * SECTOR_BYTES);
    }

    /// Free space is claimed; a place the committed tree holds (allocated, not deferred, not
    /// listed) is not the log's; a listed one always is.
    #[test]
    fn free_sectors_are_claimed_and_live_ones_are_not_taken() {
        let mut a = Allocator::new(&[1 << 30]);
        let live = place(10, 4);
        let listed = place(40, 4);
        assert!(a.map_mut(VdevId(0)).claim(&live));
        assert!(a.map_mut(VdevId(0)).claim(&listed));
        let mut deferred = Vec::new();
        // Half over the live block, half over free space.
        let walked = place(12, 4);
        let owned = claim_log_places(&mut a, &mut deferred, &[listed], &[walked, listed]);
        assert_eq!(owned, vec![place(14, 2), listed]);
        assert!(allocated(&a, &place(10, 6)).iter().all(|&b| b));
        assert_eq!(a.map(VdevId(0)).allocated_bytes(), 10 * SECTOR_BYTES);
        assert!(deferred.is_empty());
    }

    /// Part free, part deferred, across two deferred entries of two txgs; a place past the
    /// end of the vdev or on no vdev is ignored.
    #[test]
    fn runs_split_and_merge_across_deferred_entries() {
        let mut a = Allocator::new(&[1 << 30]);
        let d1 = place(200, 8);
        let d2 = place(210, 8);
        for d in [d1, d2] {
            assert!(a.map_mut(VdevId(0)).claim(&d));
        }
        let mut deferred = vec![
            DeferredFree {
                txg: Txg(3),
                dvas: vec![d1],
            },
            DeferredFree {
                txg: Txg(4),
                dvas: vec![d2],
            },
        ];
        let walked = place(204, 10);
        let bogus = [
            place((1 << 30) / SECTOR_BYTES - 1, 2),
            sector_dva(VdevId(7), 0, 1),
        ];
        let owned = claim_log_places(&mut a, &mut deferred, &[], &[walked, bogus[0], bogus[1]]);
        assert_eq!(owned, vec![walked]);
        assert_eq!(deferred[0].dvas, vec![place(200, 4)]);
        assert_eq!(deferred[1].dvas, vec![place(214, 4)]);
        assert!(allocated(&a, &place(200, 18)).iter().all(|&b| b));
        // A whole entry taken over leaves the list.
        let owned = claim_log_places(&mut a, &mut deferred, &[], &[place(214, 4)]);
        assert_eq!(owned, vec![place(214, 4)]);
        assert_eq!(deferred.len(), 1);
    }

    /// A block claimed in an empty slab gives the slab its size class, as allocating it
    /// would: the slab's other half takes the next block of that size.
    #[test]
    fn a_claimed_block_gives_an_empty_slab_its_class() {
        use crate::vdev::alloc::SLAB_SECTORS;
        let mut a = Allocator::new(&[4 * SLAB_SECTORS * SECTOR_BYTES]);
        let half = SLAB_SECTORS / 2;
        let owned = claim_log_places(&mut a, &mut Vec::new(), &[], &[place(0, half)]);
        assert_eq!(owned, vec![place(0, half)]);
        let next = a.map_mut(VdevId(0)).alloc(half * SECTOR_BYTES).unwrap();
        assert_eq!(
            next,
            place(half, half),
            "the claimed slab did not take its class"
        );
    }

    #[test]
    fn subtract_and_merge_cover_the_edges() {
        let d = place(10, 10);
        assert_eq!(subtract(&d, &[]), vec![d]);
        assert_eq!(subtract(&d, &[(0, 10), (20, 30)]), vec![d]);
        assert_eq!(subtract(&d, &[(0, 30)]), vec![]);
        assert_eq!(
            subtract(&d, &[(12, 13), (15, 17)]),
            vec![place(10, 2), place(13, 2), place(17, 3)]
        );
        let mut runs = vec![(5, 8), (1, 3), (2, 4), (8, 9)];
        merge(&mut runs);
        assert_eq!(runs, vec![(1, 4), (5, 9)]);
        let big: Vec<Dva> = split(VdevId(0), 0, RUN_SECTORS_MAX + 1).collect();
        assert_eq!(big.len(), 2);
        assert_eq!(big[1], place(RUN_SECTORS_MAX, 1));
    }
}
