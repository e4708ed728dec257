//! Space allocation: one bitmap of sectors per top-level vdev.
//!
//! The bitmap is persisted as space-map chunks (each a small metadata block covering
//! [`SPACEMAP_CHUNK_SECTORS`] sectors); only the chunks a txg changed are rewritten. Frees are
//! never applied at once: the txg sync hands them to [`Allocator::free`] only once the txg that
//! freed them has been durable for [`DEFER_TXGS`] more txgs, so a crash, or a rewind to a
//! recent uberblock, never finds a block it references overwritten by a newer one.

use oxpool_format::{Dva, VdevId, SECTOR_BYTES, SPACEMAP_CHUNK_SECTORS};
use std::collections::BTreeSet;

/// Txgs a freed block stays untouched after the txg that freed it: blocks freed in txg T
/// become allocatable when txg T + DEFER_TXGS has synced.
pub const DEFER_TXGS: u64 = 2;

/// The allocation bitmap of one top-level vdev.
#[derive(Debug)]
pub struct SpaceMap {
    vdev: VdevId,
    sectors: u64,
    words: Vec<u64>,
    allocated_sectors: u64,
    /// Next sector to try; allocation is next-fit so writes of one txg land close together.
    cursor_sector: u64,
    dirty_chunks: BTreeSet<u64>,
}

impl SpaceMap {
    /// An empty map over `asize_bytes` of allocatable space.
    pub fn new(vdev: VdevId, asize_bytes: u64) -> SpaceMap {
        let sectors = asize_bytes / SECTOR_BYTES;
        SpaceMap {
            vdev,
            sectors,
            words: vec![0; sectors.div_ceil(64) as usize],
            allocated_sectors: 0,
            cursor_sector: 0,
            dirty_chunks: BTreeSet::new(),
        }
    }

    /// Number of space-map chunks that cover this vdev.
    pub fn chunk_count(&self) -> u64 {
        self.sectors.div_ceil(SPACEMAP_CHUNK_SECTORS)
    }

    /// Allocated bytes.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_sectors * SECTOR_BYTES
    }

    /// Allocatable bytes in all.
    pub fn size_bytes(&self) -> u64 {
        self.sectors * SECTOR_BYTES
    }

    fn bit(&self, sector: u64) -> bool {
        self.words[(sector / 64) as usize] >> (sector % 64) & 1 == 1
    }

    fn set_run(&mut self, start: u64, count: u64, value: bool) {
        for s in start..start + count {
            let w = &mut self.words[(s / 64) as usize];
            let mask = 1u64 << (s % 64);
            debug_assert_eq!(*w & mask != 0, !value, "sector {s} already in that state");
            if value {
                *w |= mask;
            } else {
                *w &= !mask;
            }
        }
        let first = start / SPACEMAP_CHUNK_SECTORS;
        let last = (start + count - 1) / SPACEMAP_CHUNK_SECTORS;
        for c in first..=last {
            self.dirty_chunks.insert(c);
        }
        if value {
            self.allocated_sectors += count;
        } else {
            self.allocated_sectors -= count;
        }
    }

    /// Allocates `size_bytes` (rounded up to whole sectors) contiguously; None if no run fits.
    pub fn alloc(&mut self, size_bytes: u64) -> Option<Dva> {
        let count = size_bytes.div_ceil(SECTOR_BYTES).max(1);
        if count > self.sectors - self.allocated_sectors {
            return None;
        }
        // Next-fit over at most two passes (cursor..end, then 0..cursor): bounded by the map.
        let mut start = self.cursor_sector.min(self.sectors);
        let mut wrapped = false;
        loop {
            if start + count > self.sectors {
                if wrapped {
                    return None;
                }
                wrapped = true;
                start = 0;
                continue;
            }
            if wrapped && start >= self.cursor_sector {
                return None;
            }
            // Skip whole allocated words quickly.
            if start.is_multiple_of(64) && self.words[(start / 64) as usize] == u64::MAX {
                start += 64;
                continue;
            }
            match (start..start + count).find(|&s| self.bit(s)) {
                None => {
                    self.set_run(start, count, true);
                    self.cursor_sector = start + count;
                    return Some(Dva {
                        vdev: self.vdev,
                        offset_bytes: start * SECTOR_BYTES,
                        asize_bytes: (count * SECTOR_BYTES) as u32,
                    });
                }
                Some(used) => start = used + 1,
            }
        }
    }

    /// Marks a run allocated (import: blocks referenced but not yet in the persisted map).
    /// Returns false if any sector of it was already allocated.
    pub fn claim(&mut self, dva: &Dva) -> bool {
        let (start, count) = self.run(dva);
        if (start..start + count).any(|s| self.bit(s)) {
            return false;
        }
        self.set_run(start, count, true);
        true
    }

    /// Returns a run to free space. Panics (debug) if it was not allocated: a double free
    /// means the block tree and the map disagree.
    pub fn free(&mut self, dva: &Dva) {
        let (start, count) = self.run(dva);
        debug_assert!(
            (start..start + count).all(|s| self.bit(s)),
            "double free of {dva:?}"
        );
        self.set_run(start, count, false);
    }

    /// Whether every sector of `dva` is allocated (for assertions and tests).
    pub fn is_allocated(&self, dva: &Dva) -> bool {
        let (start, count) = self.run(dva);
        (start..start + count).all(|s| self.bit(s))
    }

    fn run(&self, dva: &Dva) -> (u64, u64) {
        debug_assert_eq!(dva.vdev, self.vdev);
        let start = dva.offset_bytes / SECTOR_BYTES;
        let count = (dva.asize_bytes as u64).div_ceil(SECTOR_BYTES);
        assert!(
            start + count <= self.sectors,
            "dva {dva:?} past the end of the vdev"
        );
        (start, count)
    }

    /// Chunks changed since the last [`SpaceMap::take_dirty_chunks`].
    pub fn dirty_chunk_count(&self) -> usize {
        self.dirty_chunks.len()
    }

    /// Takes the set of changed chunks.
    pub fn take_dirty_chunks(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.dirty_chunks).into_iter().collect()
    }

    /// Whether chunk `chunk` changed since the last take.
    pub fn is_chunk_dirty(&self, chunk: u64) -> bool {
        self.dirty_chunks.contains(&chunk)
    }

    /// The persisted bitmap of chunk `chunk`: SPACEMAP_CHUNK_SECTORS bits, LSB first.
    pub fn chunk_bits(&self, chunk: u64, out: &mut [u8]) {
        out.fill(0);
        let first = chunk * SPACEMAP_CHUNK_SECTORS;
        let end = (first + SPACEMAP_CHUNK_SECTORS).min(self.sectors);
        for s in first..end {
            if self.bit(s) {
                let i = (s - first) as usize;
                out[i / 8] |= 1 << (i % 8);
            }
        }
    }

    /// Loads chunk `chunk` from its persisted bitmap (import).
    pub fn load_chunk_bits(&mut self, chunk: u64, bits: &[u8]) {
        let first = chunk * SPACEMAP_CHUNK_SECTORS;
        let end = (first + SPACEMAP_CHUNK_SECTORS).min(self.sectors);
        for s in first..end {
            let i = (s - first) as usize;
            if bits[i / 8] >> (i % 8) & 1 == 1 && !self.bit(s) {
                self.words[(s / 64) as usize] |= 1 << (s % 64);
                self.allocated_sectors += 1;
            }
        }
    }
}

/// All top-level vdevs' maps, with the policy that spreads blocks over them.
#[derive(Debug)]
pub struct Allocator {
    maps: Vec<SpaceMap>,
    /// Per vdev: a separate log device (log blocks only).
    log: Vec<bool>,
    /// Rotor over top-level vdevs for data blocks (stripe).
    rotor: usize,
}

impl Allocator {
    /// One map per top-level vdev, sized by its allocatable bytes; none is a log device.
    pub fn new(asizes_bytes: &[u64]) -> Allocator {
        Self::with_log_devices(asizes_bytes, &vec![false; asizes_bytes.len()])
    }

    /// One map per top-level vdev; `log[i]` marks separate intent-log devices, which pool data
    /// never uses.
    pub fn with_log_devices(asizes_bytes: &[u64], log: &[bool]) -> Allocator {
        debug_assert_eq!(asizes_bytes.len(), log.len());
        Allocator {
            maps: asizes_bytes
                .iter()
                .enumerate()
                .map(|(i, &a)| SpaceMap::new(VdevId(i as u32), a))
                .collect(),
            log: log.to_vec(),
            rotor: 0,
        }
    }

    /// Adds a top-level vdev (its id is the next index).
    pub fn add_vdev(&mut self, asize_bytes: u64, log: bool) {
        let id = VdevId(self.maps.len() as u32);
        self.maps.push(SpaceMap::new(id, asize_bytes));
        self.log.push(log);
    }

    /// Whether the pool has a separate log device.
    pub fn has_log_device(&self) -> bool {
        self.log.iter().any(|&l| l)
    }

    /// The map of one vdev.
    pub fn map(&self, vdev: VdevId) -> &SpaceMap {
        &self.maps[vdev.0 as usize]
    }

    /// The map of one vdev, mutable.
    pub fn map_mut(&mut self, vdev: VdevId) -> &mut SpaceMap {
        &mut self.maps[vdev.0 as usize]
    }

    /// All maps.
    pub fn maps(&self) -> &[SpaceMap] {
        &self.maps
    }

    /// Allocates `copies` copies of `size_bytes`, each on a different top-level vdev when there
    /// are enough, else spread over the same one. Returns the DVAs or None (out of space; any
    /// partial allocation is undone).
    pub fn alloc(&mut self, size_bytes: u64, copies: usize) -> Option<Vec<Dva>> {
        debug_assert!((1..=3).contains(&copies));
        let n = self.maps.len();
        let normal = self.log.iter().filter(|&&l| !l).count();
        let first = self.rotor % n;
        self.rotor = self.rotor.wrapping_add(1);
        let mut out = Vec::with_capacity(copies);
        // Try each vdev once per copy, starting at the rotor, preferring vdevs not yet used;
        // log devices hold log blocks only.
        for c in 0..copies {
            let mut got = None;
            for k in 0..n {
                let v = (first + c + k) % n;
                if self.log[v] {
                    continue;
                }
                if normal >= copies && out.iter().any(|d: &Dva| d.vdev.0 as usize == v) {
                    continue;
                }
                if let Some(d) = self.maps[v].alloc(size_bytes) {
                    got = Some(d);
                    break;
                }
            }
            match got {
                Some(d) => out.push(d),
                None => {
                    for d in &out {
                        self.maps[d.vdev.0 as usize].free(d);
                    }
                    return None;
                }
            }
        }
        Some(out)
    }

    /// Allocates one intent-log block. Log blocks are allocated outside the txg sync, at
    /// commit time; they reach the persisted maps with the next sync like any allocation.
    pub fn alloc_log(&mut self, size_bytes: u64) -> Option<Dva> {
        // A separate log device first (round-robin over several), then the pool.
        let n = self.maps.len();
        let first = self.rotor % n;
        self.rotor = self.rotor.wrapping_add(1);
        for k in 0..n {
            let v = (first + k) % n;
            if self.log[v] {
                if let Some(d) = self.maps[v].alloc(size_bytes) {
                    return Some(d);
                }
            }
        }
        self.alloc(size_bytes, 1).map(|v| v[0])
    }

    /// Returns a block's space (only called when its deferral has passed).
    pub fn free(&mut self, dva: &Dva) {
        self.maps[dva.vdev.0 as usize].free(dva);
    }

    /// Total allocatable and allocated bytes of the pool's data vdevs (log devices apart).
    pub fn totals_bytes(&self) -> (u64, u64) {
        self.maps
            .iter()
            .zip(&self.log)
            .filter(|(_, &l)| !l)
            .fold((0, 0), |(s, a), (m, _)| {
                (s + m.size_bytes(), a + m.allocated_bytes())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alloc_free_accounting() {
        let mut m = SpaceMap::new(VdevId(0), 64 * SECTOR_BYTES);
        let a = m.alloc(10_000).unwrap();
        assert_eq!(a.asize_bytes as u64, 3 * SECTOR_BYTES);
        assert_eq!(m.allocated_bytes(), 3 * SECTOR_BYTES);
        let b = m.alloc(SECTOR_BYTES).unwrap();
        assert_ne!(a.offset_bytes, b.offset_bytes);
        m.free(&a);
        assert_eq!(m.allocated_bytes(), SECTOR_BYTES);
        assert!(m.is_allocated(&b));
        assert!(!m.claim(&b));
    }

    #[test]
    fn full_map_refuses_and_wraps() {
        let mut m = SpaceMap::new(VdevId(0), 8 * SECTOR_BYTES);
        let all: Vec<_> = (0..8).map(|_| m.alloc(SECTOR_BYTES).unwrap()).collect();
        assert!(m.alloc(SECTOR_BYTES).is_none());
        m.free(&all[2]);
        m.free(&all[3]);
        // The cursor is at the end: the allocation must wrap and find the hole.
        let d = m.alloc(2 * SECTOR_BYTES).unwrap();
        assert_eq!(d.offset_bytes, 2 * SECTOR_BYTES);
    }

    #[test]
    fn chunk_bits_round_trip() {
        let mut m = SpaceMap::new(VdevId(0), (SPACEMAP_CHUNK_SECTORS + 100) * SECTOR_BYTES);
        for _ in 0..50 {
            m.alloc(3 * SECTOR_BYTES).unwrap();
        }
        let dirty = m.take_dirty_chunks();
        assert_eq!(dirty, vec![0]);
        let mut n = SpaceMap::new(VdevId(0), m.size_bytes());
        let mut bits = vec![0u8; oxpool_format::SPACEMAP_CHUNK_PAYLOAD_BYTES];
        for c in 0..m.chunk_count() {
            m.chunk_bits(c, &mut bits);
            n.load_chunk_bits(c, &bits);
        }
        assert_eq!(n.allocated_bytes(), m.allocated_bytes());
        assert_eq!(n.words, m.words);
    }

    #[test]
    fn copies_go_to_distinct_vdevs() {
        let mut a = Allocator::new(&[64 * SECTOR_BYTES, 64 * SECTOR_BYTES, 64 * SECTOR_BYTES]);
        for _ in 0..10 {
            let d = a.alloc(SECTOR_BYTES, 3).unwrap();
            let mut v: Vec<_> = d.iter().map(|x| x.vdev.0).collect();
            v.sort();
            assert_eq!(v, vec![0, 1, 2]);
        }
        let mut one = Allocator::new(&[64 * SECTOR_BYTES]);
        let d = one.alloc(SECTOR_BYTES, 2).unwrap();
        assert_ne!(d[0].offset_bytes, d[1].offset_bytes);
    }

    proptest! {
        /// The map agrees with a model set of sectors under random alloc/free.
        #[test]
        fn map_matches_model(ops in proptest::collection::vec((any::<bool>(), 1u64..5), 1..200)) {
            let mut m = SpaceMap::new(VdevId(0), 128 * SECTOR_BYTES);
            let mut live: Vec<Dva> = Vec::new();
            for (is_alloc, n) in ops {
                if is_alloc || live.is_empty() {
                    if let Some(d) = m.alloc(n * SECTOR_BYTES) {
                        for o in &live {
                            let (a0, a1) = (d.offset_bytes, d.offset_bytes + d.asize_bytes as u64);
                            let (b0, b1) = (o.offset_bytes, o.offset_bytes + o.asize_bytes as u64);
                            prop_assert!(a1 <= b0 || b1 <= a0, "overlap {:?} {:?}", d, o);
                        }
                        live.push(d);
                    }
                } else {
                    let d = live.swap_remove(n as usize % live.len());
                    m.free(&d);
                }
                let model: u64 = live.iter().map(|d| d.asize_bytes as u64).sum();
                prop_assert_eq!(m.allocated_bytes(), model);
            }
        }
    }
}
