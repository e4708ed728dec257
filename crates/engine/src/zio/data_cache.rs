//! The data-block cache: verified data blocks kept in memory after a read, so a read of a
//! recently read block is a copy, not a device I/O (the "cache hit -> copy" of the read path;
//! ZFS's ARC for data). Bounded by the pool property `data_cache_max`.
//!
//! Keyed by the block's place and birth, as ZFS's ARC is: (vdev and offset of its first copy,
//! birth txg), plus its size and checksum. Copy-on-write never changes a block in place, and a
//! freed place is not reused for `DEFER_TXGS` txgs, so (place, birth) names one block for as
//! long as it can be read; the checksum in the key is a second check, so an entry can only
//! ever serve the exact block pointer it was read or written for. Not keyed by content alone:
//! the default checksum (xxh3-128) is not collision-resistant, and a client able to forge a
//! collision must not be able to plant data in another volume's reads. No invalidation is
//! needed: entries of freed blocks age out.
//!
//! Sharded by the checksum's first bytes (already uniformly distributed). Each shard is a
//! short mutex section over a hash map (the integer hasher of `idhash.rs`) and a CLOCK ring (second chance): a hit sets
//! the entry's reference bit; eviction walks the ring, clearing bits, and drops the first entry
//! not referenced since its last visit. Hits copy out under the shard lock and allocate
//! nothing; an insert reuses the buffer the device read produced, so a miss adds no copy.
//!
//! Entries are reference counted so that a hit can also be *shared* ([`DataCache::share`]):
//! the NBD server over TLS encrypts a READ's data straight from the cached blocks instead of
//! copying them into its reply first. A shared block evicted meanwhile lives on until its
//! holder lets go (at most the READ replies in flight; the bytes are counted out at eviction).

use crate::idhash::IdMap;
use oxpool_format::BlockPtr;
use oxpool_io::IoBuf;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Shards of the cache: enough that reactor threads rarely meet on one lock.
const SHARDS: usize = 16;

/// Keys of taken entries a shard's ring may hold beyond its live ones before it is compacted.
const RING_SLACK: usize = 64;

/// A cached block's identity: its content's checksum, type and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    vdev: u32,
    offset_bytes: u64,
    birth: u64,
    psize_bytes: u32,
    checksum_type: u8,
    checksum: [u8; 32],
}

impl CacheKey {
    /// The key of the block `bp` points to (not for holes).
    pub fn of(bp: &BlockPtr) -> CacheKey {
        debug_assert!(!bp.is_hole());
        let first = bp.dvas[0];
        CacheKey {
            vdev: first.vdev.0,
            offset_bytes: first.offset_bytes,
            birth: bp.birth.0,
            psize_bytes: bp.psize_bytes,
            checksum_type: bp.checksum_type as u8,
            checksum: bp.checksum.0,
        }
    }

    /// The block's physical size.
    pub fn psize_bytes(&self) -> u32 {
        self.psize_bytes
    }

    fn shard(&self) -> usize {
        self.checksum[0] as usize % SHARDS
    }
}

struct Entry {
    buf: Arc<IoBuf>,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    map: IdMap<CacheKey, Entry>,
    /// CLOCK order: every key of `map`, plus keys taken out of it since the last compaction
    /// (skipped when met; at most `2 * map.len() + RING_SLACK` keys in all).
    ring: VecDeque<CacheKey>,
    bytes: u64,
    /// Shells of evicted entries no one shared any more (their blocks freed), reused by the
    /// next inserts: a miss in steady state allocates nothing (at most `SPARE_SHELLS_MAX`).
    shells: Vec<Arc<IoBuf>>,
}

/// Spare entry shells a shard keeps.
const SPARE_SHELLS_MAX: usize = 64;

/// Hit, miss and eviction counts of a [`DataCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataCacheStats {
    /// Reads served from the cache.
    pub hits: u64,
    /// Reads that went to the device.
    pub misses: u64,
    /// Blocks evicted to stay within the bound.
    pub evictions: u64,
    /// Bytes cached now.
    pub bytes: u64,
}

/// The cache; see the module docs.
pub struct DataCache {
    shards: Box<[Mutex<Shard>]>,
    /// Bound of each shard: `data_cache_max` / [`SHARDS`].
    shard_max_bytes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl std::fmt::Debug for DataCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl DataCache {
    /// An empty cache holding at most `max_bytes` of blocks (0: caches nothing).
    pub fn new(max_bytes: u64) -> DataCache {
        DataCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_max_bytes: AtomicU64::new(max_bytes / SHARDS as u64),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// Changes the bound; a smaller one evicts at once.
    pub fn set_max_bytes(&self, max_bytes: u64) {
        let shard_max = max_bytes / SHARDS as u64;
        self.shard_max_bytes.store(shard_max, Ordering::Relaxed);
        for shard in self.shards.iter() {
            let mut s = shard.lock().unwrap();
            self.evict_to(&mut s, shard_max);
        }
    }

    /// Copies `out.len()` bytes from `in_block` of the cached block `key` into `out`; false
    /// (and `out` untouched) on a miss.
    pub fn read_into(&self, key: &CacheKey, in_block: usize, out: &mut [u8]) -> bool {
        self.copy_out(key, in_block, out, true)
    }

    /// As [`DataCache::read_into`], but a miss is not counted: for a caller that looks
    /// without I/O first and, on a miss, goes the way that counts it.
    pub fn try_read_into(&self, key: &CacheKey, in_block: usize, out: &mut [u8]) -> bool {
        self.copy_out(key, in_block, out, false)
    }

    /// Counts a miss found without a lookup here: a reader that read the block from the
    /// devices with others in one request (`read_run::read_data_run`).
    pub fn count_miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    fn copy_out(&self, key: &CacheKey, in_block: usize, out: &mut [u8], count_miss: bool) -> bool {
        let mut s = self.shards[key.shard()].lock().unwrap();
        match s.map.get_mut(key) {
            Some(e) if in_block + out.len() <= e.buf.len() => {
                e.referenced = true;
                out.copy_from_slice(&e.buf[in_block..in_block + out.len()]);
                drop(s);
                self.hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            _ => {
                drop(s);
                if count_miss {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                }
                false
            }
        }
    }

    /// A reference to the cached block `key` whose bytes `in_block..in_block + len` the
    /// caller reads in place (counted as a hit, as [`DataCache::read_into`]); `None` on a
    /// miss. The block stays cached; the caller must not hold it for long (it is memory the
    /// cache's bound no longer sees once evicted).
    pub fn share(&self, key: &CacheKey, in_block: usize, len: usize) -> Option<Arc<IoBuf>> {
        self.share_counted(key, in_block, len, true)
    }

    /// As [`DataCache::share`], but a miss is not counted (see [`DataCache::try_read_into`]).
    pub fn try_share(&self, key: &CacheKey, in_block: usize, len: usize) -> Option<Arc<IoBuf>> {
        self.share_counted(key, in_block, len, false)
    }

    fn share_counted(
        &self,
        key: &CacheKey,
        in_block: usize,
        len: usize,
        count_miss: bool,
    ) -> Option<Arc<IoBuf>> {
        let mut s = self.shards[key.shard()].lock().unwrap();
        match s.map.get_mut(key) {
            Some(e) if in_block + len <= e.buf.len() => {
                e.referenced = true;
                let buf = e.buf.clone();
                drop(s);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(buf)
            }
            _ => {
                drop(s);
                if count_miss {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Takes the cached block `key` out of the cache (counted as a hit): for a caller about to
    /// replace the block, which makes it its new version without a copy (a copy only if a
    /// reader still shares it).
    pub fn take(&self, key: &CacheKey) -> Option<IoBuf> {
        let mut s = self.shards[key.shard()].lock().unwrap();
        let Some(entry) = s.map.remove(key) else {
            drop(s);
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        s.bytes -= entry.buf.len() as u64;
        // The key stays in the ring until met or compacted; bounded by the compaction.
        if s.ring.len() > s.map.len() + s.map.len() + RING_SLACK {
            let Shard { map, ring, .. } = &mut *s;
            ring.retain(|k| map.contains_key(k));
        }
        drop(s);
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(Arc::try_unwrap(entry.buf).unwrap_or_else(|shared| IoBuf::from_slice(&shared)))
    }

    /// Keeps `buf`, a verified copy of the block `key` names (its first `psize` bytes are the
    /// block), evicting others as needed.
    pub fn insert(&self, key: CacheKey, buf: IoBuf) {
        drop(self.insert_shared(key, buf));
    }

    /// As [`DataCache::insert`], and hands back a reference to the cached block for the
    /// caller to read in place (as [`DataCache::share`] would); `Err(buf)` when the cache
    /// does not keep it (larger than the cache's bound, zero when the cache is off, or the
    /// block is cached already), so that the caller has its bytes either way, uncopied.
    pub fn insert_shared(&self, key: CacheKey, buf: IoBuf) -> Result<Arc<IoBuf>, IoBuf> {
        let len = buf.len() as u64;
        debug_assert!(buf.len() >= key.psize_bytes as usize);
        let mut s = self.shards[key.shard()].lock().unwrap();
        // Read under the shard lock: `set_max_bytes` stores the bound, then evicts each shard
        // under its lock, so an insert cannot slip in above a bound that was just lowered.
        let shard_max = self.shard_max_bytes.load(Ordering::Relaxed);
        if len > shard_max || s.map.contains_key(&key) {
            return Err(buf);
        }
        self.evict_to(&mut s, shard_max - len);
        // An evicted entry's shell if there is one (steady state: the eviction just above);
        // else a small allocation. Hits allocate nothing, shared or copied.
        let buf = match s.shells.pop() {
            Some(mut shell) => {
                *Arc::get_mut(&mut shell).expect("a spare shell is unique") = buf;
                shell
            }
            None => Arc::new(buf),
        };
        s.map.insert(
            key,
            Entry {
                buf: buf.clone(),
                referenced: false,
            },
        );
        s.ring.push_back(key);
        s.bytes += len;
        debug_assert!(s.map.len() <= s.ring.len());
        Ok(buf)
    }

    /// Evicts from `s` until it holds at most `target` bytes.
    fn evict_to(&self, s: &mut Shard, target: u64) {
        // Each entry is visited at most twice (once to clear its bit, once to evict), so the
        // walk is bounded by twice the ring's length.
        let mut steps = 2 * s.ring.len();
        while s.bytes > target && steps > 0 {
            steps -= 1;
            let Some(key) = s.ring.pop_front() else {
                break;
            };
            let Some(entry) = s.map.get_mut(&key) else {
                continue; // taken
            };
            if entry.referenced {
                entry.referenced = false;
                s.ring.push_back(key);
                continue;
            }
            let mut entry = s.map.remove(&key).expect("present");
            s.bytes -= entry.buf.len() as u64;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            // Its block goes back to the buffer pool now, its shell to the spares (unless a
            // reply still shares it: then both live until the reply lets go).
            if s.shells.len() < SPARE_SHELLS_MAX {
                if let Some(block) = Arc::get_mut(&mut entry.buf) {
                    drop(std::mem::replace(block, IoBuf::zeroed(0)));
                    if s.shells.capacity() == 0 {
                        // Once, at the bound: pushing never reallocates afterwards.
                        s.shells.reserve_exact(SPARE_SHELLS_MAX);
                    }
                    s.shells.push(entry.buf);
                }
            }
        }
    }

    /// Counts and size.
    pub fn stats(&self) -> DataCacheStats {
        DataCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            bytes: self.shards.iter().map(|s| s.lock().unwrap().bytes).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::{checksum, ChecksumType, Dva, Txg, VdevId};

    fn block(seed: u32, len: usize) -> (BlockPtr, IoBuf) {
        let mut buf = IoBuf::zeroed(len);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(2654435761).wrapping_add(seed) as u8;
        }
        buf[0..4].copy_from_slice(&seed.to_le_bytes());
        let mut bp = BlockPtr {
            ndvas: 1,
            psize_bytes: len as u32,
            lsize_bytes: len as u32,
            checksum: checksum(ChecksumType::Xxh3_128, &buf),
            birth: Txg(7),
            ..BlockPtr::HOLE
        };
        bp.dvas[0] = Dva {
            vdev: VdevId(0),
            offset_bytes: u64::from(seed) * len as u64,
            asize_bytes: len as u32,
        };
        (bp, buf)
    }

    #[test]
    fn the_same_bytes_in_another_block_never_hit() {
        // A block whose checksum equals a cached one (the same bytes, or a forged collision)
        // but which lives elsewhere, or was born in another txg, is not served from the entry.
        let cache = DataCache::new(1 << 20);
        let (bp, buf) = block(1, 4096);
        cache.insert(CacheKey::of(&bp), buf);
        let mut elsewhere = bp;
        elsewhere.dvas[0].offset_bytes += 4096;
        let mut reborn = bp;
        reborn.birth = Txg(8);
        let mut out = [0u8; 8];
        assert!(cache.read_into(&CacheKey::of(&bp), 0, &mut out));
        assert!(!cache.read_into(&CacheKey::of(&elsewhere), 0, &mut out));
        assert!(!cache.read_into(&CacheKey::of(&reborn), 0, &mut out));
    }

    #[test]
    fn hit_copies_the_requested_range() {
        let cache = DataCache::new(1 << 20);
        let (bp, buf) = block(1, 4096);
        let expected = buf.clone();
        let key = CacheKey::of(&bp);
        let mut out = [0u8; 100];
        assert!(!cache.read_into(&key, 10, &mut out));
        cache.insert(key, buf);
        assert!(cache.read_into(&key, 10, &mut out));
        assert_eq!(&out[..], &expected[10..110]);
        let st = cache.stats();
        assert_eq!((st.hits, st.misses, st.bytes), (1, 1, 4096));
    }

    #[test]
    fn shared_blocks_stay_intact_when_taken_or_evicted() {
        let cache = DataCache::new(1 << 20);
        let (bp, buf) = block(1, 4096);
        let expected = buf.clone();
        let key = CacheKey::of(&bp);
        assert!(cache.share(&key, 0, 4096).is_none(), "a miss");
        cache.insert(key, buf);
        assert!(cache.share(&key, 4000, 100).is_none(), "past the block");
        let shared = cache.share(&key, 10, 100).expect("a hit");
        assert_eq!(&shared[..], &expected[..]);
        // A writer taking the block while it is shared gets its own copy: the shared one
        // never changes under its reader.
        let mut taken = cache.take(&key).expect("cached");
        taken.fill(0xff);
        assert_eq!(&shared[..], &expected[..]);
        // Evicted (a zero bound) while shared: the reader's bytes outlive the entry.
        let (bp2, buf2) = block(2, 4096);
        let key2 = CacheKey::of(&bp2);
        let expected2 = buf2.clone();
        cache.insert(key2, buf2);
        let shared2 = cache.share(&key2, 0, 4096).expect("a hit");
        cache.set_max_bytes(0);
        assert_eq!(cache.stats().bytes, 0);
        assert_eq!(&shared2[..], &expected2[..]);
        let st = cache.stats();
        assert_eq!((st.hits, st.misses), (3, 2));
    }

    #[test]
    fn take_removes_and_the_ring_stays_bounded() {
        let cache = DataCache::new(1 << 30);
        let (bp, buf) = block(1, 4096);
        let key = CacheKey::of(&bp);
        let expected = buf.clone();
        cache.insert(key, buf);
        assert_eq!(cache.take(&key).as_deref(), Some(&expected[..]));
        assert!(cache.take(&key).is_none(), "taken twice");
        let mut out = [0u8; 8];
        assert!(
            !cache.read_into(&key, 0, &mut out),
            "a taken block still hits"
        );
        assert_eq!(cache.stats().bytes, 0);
        // Insert-and-take cycles (a block rewritten over and over) leave no ring behind.
        for seed in 2..20_000u32 {
            let (bp, buf) = block(seed, 512);
            cache.insert(CacheKey::of(&bp), buf);
            assert!(cache.take(&CacheKey::of(&bp)).is_some());
        }
        for shard in cache.shards.iter() {
            let s = shard.lock().unwrap();
            assert!(s.map.is_empty());
            assert!(
                s.ring.len() <= RING_SLACK + 1,
                "ring of {} keys",
                s.ring.len()
            );
        }
        // Eviction steps over taken keys.
        let small = DataCache::new(SHARDS as u64 * 4 * 512);
        for seed in 0..2000u32 {
            let (bp, buf) = block(seed, 512);
            small.insert(CacheKey::of(&bp), buf);
            if seed % 3 == 0 {
                small.take(&CacheKey::of(&bp));
            }
        }
        assert!(small.stats().bytes <= SHARDS as u64 * 4 * 512);
    }

    #[test]
    fn bound_holds_and_referenced_blocks_survive() {
        // One shard's worth: 16 blocks of 4 KiB per shard bound.
        let cache = DataCache::new(SHARDS as u64 * 16 * 4096);
        let mut hot = Vec::new();
        for seed in 0..4000u32 {
            let (bp, buf) = block(seed, 4096);
            let key = CacheKey::of(&bp);
            cache.insert(key, buf);
            if seed < 8 {
                hot.push(key);
            }
            // Touch the hot blocks often: CLOCK must keep them.
            let mut out = [0u8; 1];
            for k in &hot {
                assert!(cache.read_into(k, 0, &mut out), "hot block evicted");
            }
            assert!(cache.stats().bytes <= SHARDS as u64 * 16 * 4096);
        }
        assert!(cache.stats().evictions > 0);
    }

    #[test]
    fn zero_bound_caches_nothing_and_shrinking_evicts() {
        let cache = DataCache::new(0);
        let (bp, buf) = block(3, 4096);
        cache.insert(CacheKey::of(&bp), buf);
        assert_eq!(cache.stats().bytes, 0);
        let cache = DataCache::new(1 << 30);
        for seed in 0..100 {
            let (bp, buf) = block(seed, 8192);
            cache.insert(CacheKey::of(&bp), buf);
        }
        assert_eq!(cache.stats().bytes, 100 * 8192);
        cache.set_max_bytes(0);
        assert_eq!(cache.stats().bytes, 0);
    }

    #[test]
    fn different_content_never_hits() {
        let cache = DataCache::new(1 << 20);
        let (bp1, buf1) = block(1, 4096);
        let (bp2, _) = block(2, 4096);
        cache.insert(CacheKey::of(&bp1), buf1);
        let mut out = [0u8; 8];
        assert!(!cache.read_into(&CacheKey::of(&bp2), 0, &mut out));
    }
}
