//! Space allocation: one bitmap of sectors per top-level vdev, placed by size class in slabs.
//!
//! The bitmap is persisted as space-map chunks (each a small metadata block covering
//! [`SPACEMAP_CHUNK_SECTORS`] sectors); only the chunks a txg changed are rewritten. Frees are
//! never applied at once: the txg sync hands them to [`Allocator::free`] only once the txg that
//! freed them has been durable for [`DEFER_TXGS`] more txgs, so a crash, or a rewind to a
//! recent uberblock, never finds a block it references overwritten by a newer one.
//!
//! # Slabs and size classes
//!
//! Blocks are contiguous: a 32 KiB indirect block needs 8 free sectors in a row. Placed next
//! fit anywhere, random 4 KiB rewrites leave free space as single-sector holes all over the
//! device, and a pool half empty can then hold no indirect block at all: the txg sync fails
//! and the pool suspends (the bench found exactly that). So the map is cut into slabs of
//! [`SLAB_SECTORS`] sectors (one word of the bitmap, 256 KiB), and a block of `n` sectors
//! belongs to size class `k`, the smallest with `2^k >= n`. A slab is either empty or holds
//! blocks of one class only, each in an aligned slot of `2^k` sectors; a class takes an empty
//! slab only when none of its slabs has a free slot. Then:
//! - a block of any class fits whenever an empty slab exists, however fragmented the rest is;
//! - free space is exactly: empty slabs, plus free slots of each class (usable by that class);
//!   [`Allocator::fits`] answers, from those counters, whether a given set of blocks is sure to
//!   fit, which is what the write throttle asks before it lets a writer dirty more
//!   (`pool::Spa::wait_for_space`).
//!
//! Free slots of a class can go to smaller classes: a writer short of slots of its class is
//! given whole slabs of a larger class that has slots to spare ([`Allocator::make_room`]),
//! and the txg sync's last resort before the reserve's empty slabs is the start of a larger
//! class's slot ([`Placement::Borrow`]). Never to larger classes (no gang blocks).
//!
//! The class of a slab is not persisted. After import a non-empty slab gets the largest class
//! whose aligned slots its bits are a union of (a full slab is decided at its first free): any
//! class is safe, since a slot is free only when all its bits are clear; the guess only decides
//! which blocks reuse the slab's holes.

//!
//! # Raidz vdevs
//!
//! The map of a raidz vdev covers its interleaved address space (every child's sectors), and
//! a block there takes its raidz allocated size: data, parity and skip sectors
//! ([`crate::vdev::raidz::RaidzLayout::asize_bytes`]), so the allocator is asked for the
//! block's physical size and each map inflates it ([`SpaceMap::asize_of`]); the DVA records
//! the inflated size. What writers charge ([`ClassBytes`]) is counted in physical sizes, and
//! [`Space`] inflates it as the widest-costing raidz vdev would ([`Space::fits`]).

use crate::vdev::raidz::RaidzLayout;
use oxpool_format::{Dva, VdevId, SECTOR_BYTES, SPACEMAP_CHUNK_SECTORS};
use std::collections::BTreeSet;

/// Txgs a freed block stays untouched after the txg that freed it: blocks freed in txg T
/// become allocatable when txg T + DEFER_TXGS has synced.
pub const DEFER_TXGS: u64 = 2;

/// Sectors in a slab: one word of the bitmap.
pub const SLAB_SECTORS: u64 = 64;
/// Bytes in a slab, and the largest block the allocator places.
pub const SLAB_BYTES: u64 = SLAB_SECTORS * SECTOR_BYTES;
/// Size classes: class `k` is `2^k` sectors, `k < CLASSES` (4 KiB to 256 KiB).
pub const CLASSES: usize = 7;

/// A slab with no class: every sector free.
const EMPTY: u8 = u8::MAX;
/// A full slab found at import: its class is decided by the first free in it.
const UNDECIDED: u8 = u8::MAX - 1;

/// Per class `k`: a bit at the start of every aligned slot of `2^k` sectors in a word.
const SLOT_STARTS: [u64; CLASSES] = [
    u64::MAX,
    0x5555_5555_5555_5555,
    0x1111_1111_1111_1111,
    0x0101_0101_0101_0101,
    0x0001_0001_0001_0001,
    0x0000_0001_0000_0001,
    1,
];

/// Bound on the slabs one [`Allocator::make_room`] gives to another class (each moves at
/// least one free slot; 256 slabs are 64 MiB, more than a request's worst case).
const MAKE_ROOM_SLABS_MAX: usize = 256;

/// Slabs of one fill bucket [`SpaceMap::slab_to_give`] looks at (within a bucket they differ
/// by less than a quarter of a slab's slots).
const GIVE_CANDIDATES_MAX: u64 = 16;

/// Fill buckets of the slabs of a class with a free slot (a quarter of the slots each):
/// coarse, so the indexes cost 4 bits per slab and class rather than one per free-slot count.
const OPEN_BUCKETS: usize = 4;

/// The bucket of a slab of class `k` with `free` free slots (1..=slots): 0 for the fullest
/// quarter.
fn open_bucket(k: usize, free: usize) -> usize {
    let slots = (SLAB_SECTORS >> k) as usize;
    debug_assert!((1..=slots).contains(&free));
    (free - 1) * OPEN_BUCKETS / slots
}

/// The size class of a block of `sectors` (1..=SLAB_SECTORS).
pub fn class_of_sectors(sectors: u64) -> usize {
    sectors.max(1).next_power_of_two().trailing_zeros() as usize
}

/// The size class of a block of `size_bytes`, None if it is larger than a slab.
pub fn class_of(size_bytes: u64) -> Option<usize> {
    let sectors = size_bytes.div_ceil(SECTOR_BYTES).max(1);
    (sectors <= SLAB_SECTORS).then(|| class_of_sectors(sectors))
}

/// Bit `i` set when sectors `i..i + 2^k` of the word `w` are all set and `i` starts a slot.
fn slots_all_set(w: u64, k: usize) -> u64 {
    let mut m = w;
    let mut span = 1;
    while span < (1u32 << k) {
        m &= m >> span;
        span <<= 1;
    }
    m & SLOT_STARTS[k]
}

/// Bit `i` set when slot `i` of class `k` in the word `w` is free.
fn free_slots(w: u64, k: usize) -> u64 {
    slots_all_set(!w, k)
}

/// The class a slab written by this allocator had (see the module docs), from its word `w`:
/// the largest class (below a whole slab) whose aligned slots are each all free or all
/// allocated; or, where that is only the smallest class, the largest whose slots each hold
/// nothing or one block smaller than its slot.
///
/// A block takes the first sectors of its slot, and not every block fills it: a compressed
/// block, a raidz block's allocated size (a 16 KiB block on a 5-wide raidz2 is 9 sectors, in
/// a 16-sector slot), a 17-sector log block. Such slabs are an all-or-nothing union of no
/// class but the smallest, and taking them for 4 KiB slabs left the space their blocks free
/// to 4 KiB blocks only: a raidz2 pool 44 % full refused to rewrite its volume, with 150 MiB
/// free in 4 KiB slots (2026-11-29). A block of class `k` is more than half its slot
/// (`2^(k-1) < n <= 2^k` sectors), so a slot of class `k` holds nothing or a prefix of more
/// than half of it, and most of its used slots do (see below). Where some class above the
/// smallest is all-or-nothing, it is kept: blocks
/// of that class explain the bits (three 8-sector blocks look like one 24-sector block in a
/// 32-sector slot, and the old guess is the safer there). Any class is safe (a slot is free
/// only when all its bits are clear): the guess decides which blocks reuse the slab's holes.
fn infer_class(w: u64) -> u8 {
    let exact = (0..CLASSES - 1)
        .rev()
        .find(|&k| (slots_all_set(w, k) | free_slots(w, k)) == SLOT_STARTS[k])
        .unwrap_or(0);
    if exact > 0 {
        return exact as u8;
    }
    (1..CLASSES - 1)
        .rev()
        .find(|&k| {
            let size = 1u32 << k;
            let (mut partial, mut full) = (0u32, 0u32);
            for slot in 0..(SLAB_SECTORS as u32 / size) {
                let bits = (w >> (slot * size)) & (u64::MAX >> (64 - size));
                let prefix = bits.trailing_ones();
                if bits >> prefix != 0 || (prefix != 0 && prefix <= size / 2) {
                    return false;
                }
                if prefix == size {
                    full += 1;
                } else if prefix > 0 {
                    partial += 1;
                }
            }
            // Blocks smaller than their slots make most of the slab's blocks so (every raidz
            // block of a class, most compressed ones). A slab of 4 KiB blocks with a hole or
            // two where a slot would end, or filled sequentially up to one, has one or two
            // such "prefixes" among full slots: it keeps the smallest class.
            partial >= 2 && partial >= full
        })
        .unwrap_or(0) as u8
}

/// Free space the write throttle keeps back for what the txg sync allocates uncharged
/// (`Spa::sync_reserve`, docs/space.md "The reserve").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reserve {
    /// Bytes that must stay in empty slabs: uncharged blocks of any size (PoolMeta pieces of
    /// up to a slab) and the slabs a sync leaves partly filled.
    pub empty_bytes: u64,
    /// Bytes more, in empty slabs or in free slots the charged blocks leave over (in classes
    /// a one-sector block can use): the small uncharged blocks take such slots, their own or
    /// larger ones ([`Placement::Borrow`]).
    pub slots_bytes: u64,
}

impl Reserve {
    /// Both parts.
    pub fn total_bytes(&self) -> u64 {
        self.empty_bytes + self.slots_bytes
    }
}

/// What the txg sync leaves to others as it places a block ([`Allocator::alloc_with`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Keep {
    /// Empty slabs at or below which a block with no slot of its class borrows a larger
    /// class's spare slot before it takes an empty slab ([`Reserve::empty_bytes`]).
    pub empty_bytes: u64,
    /// What the pending syncs may still allocate (charges, physical sizes): a block borrows
    /// only a slot beyond its class's part of it.
    pub need: ClassBytes,
}

/// Bytes by size class: what a set of blocks needs (each block counted at its slot size), or
/// the free slots a map has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassBytes(pub [u64; CLASSES]);

impl ClassBytes {
    /// Adds `count` blocks of `size_bytes` (at most a slab), each in `copies` copies.
    pub fn add_blocks(&mut self, size_bytes: u64, copies: u64, count: u64) {
        let k = class_of(size_bytes).expect("a block is at most a slab");
        self.0[k] += (SECTOR_BYTES << k) * copies * count;
    }

    /// The sum over classes.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Whether nothing is counted.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl std::ops::AddAssign for ClassBytes {
    fn add_assign(&mut self, o: ClassBytes) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
    }
}

impl std::ops::SubAssign for ClassBytes {
    fn sub_assign(&mut self, o: ClassBytes) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a = a.checked_sub(b).expect("space released twice");
        }
    }
}

impl std::ops::Add for ClassBytes {
    type Output = ClassBytes;
    fn add(mut self, o: ClassBytes) -> ClassBytes {
        self += o;
        self
    }
}

/// Free space of a pool's data vdevs, as the allocator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    /// Allocatable bytes in all.
    pub size_bytes: u64,
    /// Free bytes in all (in empty slabs, free slots, and holes no slot can use).
    pub free_bytes: u64,
    /// Bytes of empty slabs: usable by blocks of any class.
    pub empty_bytes: u64,
    /// Bytes of the free slots of each class: usable by blocks of that class.
    pub free_slots: ClassBytes,
    /// Per class of a block's physical size, the class and the bytes per physical byte its
    /// allocation may take on the costliest data vdev (a raidz inflates blocks by its parity
    /// and rounding): `(k, 1)` everywhere on a pool without raidz.
    pub inflation: [(u8, u64); CLASSES],
}

impl Default for Space {
    fn default() -> Space {
        Space {
            size_bytes: 0,
            free_bytes: 0,
            empty_bytes: 0,
            free_slots: ClassBytes::default(),
            inflation: std::array::from_fn(|k| (k as u8, 1)),
        }
    }
}

/// Where a block of physical size class `k` lands on a vdev with `raidz` (None: itself): the
/// class of its allocation and the allocation's bytes per byte of the class, taking a block
/// as large as the class allows (the allocated size grows with the physical size). An
/// allocation larger than a slab (no block written is: see `raidz_width_min`) counts as
/// whole slabs.
fn inflate_class(raidz: Option<RaidzLayout>, k: usize) -> (u8, u64) {
    let Some(layout) = raidz else {
        return (k as u8, 1);
    };
    let sectors = layout.asize_sectors(1 << k);
    if sectors > SLAB_SECTORS {
        let slabs = sectors.div_ceil(SLAB_SECTORS);
        return ((CLASSES - 1) as u8, (slabs * SLAB_SECTORS) >> k);
    }
    let to = class_of_sectors(sectors);
    (to as u8, 1 << (to - k.min(to)))
}

impl Space {
    /// `need` (charged in physical sizes) as the costliest vdev would allocate it.
    pub fn inflated(&self, need: &ClassBytes) -> ClassBytes {
        let mut out = ClassBytes::default();
        for (k, &bytes) in need.0.iter().enumerate() {
            let (to, mult) = self.inflation[k];
            out.0[to as usize] += bytes * mult;
        }
        out
    }

    /// [`Allocator::fits`], on this snapshot of the counters.
    pub fn fits(&self, need: &ClassBytes, reserve: Reserve) -> bool {
        let need = self.inflated(need);
        // Spare slots count toward the reserve only in classes the smallest uncharged block
        // (a space-map chunk, one sector) can use: its own and larger ones (a block borrows
        // upward only). On a 5-wide raidz2 a sector takes 3, in a 4-sector slot.
        let smallest = self.inflation[0].0 as usize;
        let (from_empty, spare) = need.0.iter().zip(self.free_slots.0).enumerate().fold(
            (0u64, 0u64),
            |(from_empty, spare), (k, (&n, f))| {
                let extra = if k >= smallest {
                    f.saturating_sub(n)
                } else {
                    0
                };
                (
                    from_empty.saturating_add(n.saturating_sub(f)),
                    spare + extra,
                )
            },
        );
        self.empty_bytes
            .checked_sub(from_empty)
            .is_some_and(|left| {
                left >= reserve.empty_bytes && left.saturating_add(spare) >= reserve.total_bytes()
            })
    }

    /// Whether the txg sync may place a block of physical size `size_bytes` sequentially, in
    /// an empty slab rather than a free slot of its class ([`Allocator::alloc_with`]): the
    /// empty slabs hold everything pending ([`Space::holds_all`]), and the block's class has
    /// no more bytes of free slots than there are empty slabs beyond the reserve.
    ///
    /// Why the second condition: a block placed in an empty slab while its class has free
    /// slots leaves those slots free, and the copy-on-write of random rewrites frees one more
    /// slot of the class for each block it places, all over the class's slabs. Sequential
    /// placement alone turned a 48 MiB pool's empty slabs into 4 KiB-rewrite holes of the
    /// data class until the empty slabs were the reserve and nothing more (20 MiB of free
    /// 16 KiB slots, 6 MiB of empty slabs): the indirect blocks' class then found no slab and
    /// writers got ENOSPC with 23 of 48 MiB allocated, 2 runs in 10 (docs/space.md, "Small
    /// pools"). With the bound, the class's free slots are filled (fullest first, so sparse
    /// slabs drain) whenever they outgrow the empty slabs, and the empty slabs stay above the
    /// reserve by about the class's free slots.
    pub fn sequential_ok(
        &self,
        need: &ClassBytes,
        reserve: u64,
        size_bytes: u64,
        copies: usize,
    ) -> bool {
        let Some(k) = class_of(size_bytes) else {
            return false;
        };
        let class = self.inflation[k].0 as usize;
        self.free_slots.0[class] <= self.empty_bytes.saturating_sub(reserve)
            && self.holds_all(need, reserve, copies)
    }

    /// Whether the empty slabs alone hold `need` (every class in whole slabs, as if no free
    /// slot existed) with `reserve` left over. While they do, a block may take an empty slab
    /// rather than a free slot of its class ([`Allocator::alloc_with`]): whatever it takes,
    /// everything still to come fits in what is left, so [`Space::fits`]'s promise holds.
    /// `copies` is the block about to be placed: each copy may take an empty slab.
    pub fn holds_all(&self, need: &ClassBytes, reserve: u64, copies: usize) -> bool {
        let in_slabs: u64 = self
            .inflated(need)
            .0
            .iter()
            .map(|&n| n.div_ceil(SLAB_BYTES) * SLAB_BYTES)
            .sum();
        in_slabs
            .saturating_add(reserve)
            .saturating_add(copies as u64 * SLAB_BYTES)
            <= self.empty_bytes
    }
}

#[cfg(test)]
fn bit_get(bits: &[u64], i: u64) -> bool {
    bits[(i / 64) as usize] >> (i % 64) & 1 == 1
}

fn bit_set(bits: &mut [u64], i: u64, value: bool) {
    let w = &mut bits[(i / 64) as usize];
    if value {
        *w |= 1 << (i % 64);
    } else {
        *w &= !(1 << (i % 64));
    }
}

/// The first set bit at or after `from` (below `n`), else the first one before it: next fit.
/// Bounded by the bitset's words.
fn next_set(bits: &[u64], from: u64, n: u64) -> Option<u64> {
    if n == 0 {
        return None;
    }
    let from = if from >= n { 0 } else { from };
    let first_word = (from / 64) as usize;
    let head = bits[first_word] & (u64::MAX << (from % 64));
    if head != 0 {
        return Some(first_word as u64 * 64 + u64::from(head.trailing_zeros()));
    }
    let words = bits.len();
    for j in 1..=words {
        let wi = (first_word + j) % words;
        let mut w = bits[wi];
        if wi == first_word {
            w &= !(u64::MAX << (from % 64));
        }
        if w != 0 {
            let i = wi as u64 * 64 + u64::from(w.trailing_zeros());
            return (i < n).then_some(i);
        }
    }
    None
}

/// Where [`SpaceMap::alloc_placed`] puts a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A free slot of its class only (none: no allocation).
    SlotOnly,
    /// A free slot of its class, else an empty slab: what [`Allocator::fits`] assumes.
    SlotFirst,
    /// Adjacent to the last block of its class (its fresh slab), else a new empty slab, else
    /// a free slot: only while empty slabs hold everything pending ([`Space::holds_all`]).
    Sequential,
    /// A free slot of the smallest larger class that has one among the classes whose bit is
    /// set (none: no allocation). The block takes the start of the slot, as a compressed or
    /// raidz block takes the start of its own, and the slab keeps its class: freeing the
    /// block frees the whole slot again. The rest of the slot stays unused while the block
    /// lives, so this is the last resort before an empty slab is taken from the reserve,
    /// and only from classes with slots beyond their pending need ([`Allocator::alloc_with`]).
    Borrow(u8),
}

/// The allocation bitmap of one top-level vdev.
#[derive(Debug)]
pub struct SpaceMap {
    vdev: VdevId,
    sectors: u64,
    /// One bit per sector, set when allocated; one word per slab. Bits past the last sector
    /// (in the last word) are set and never counted: that slab is never empty.
    words: Vec<u64>,
    allocated_sectors: u64,
    dirty_chunks: BTreeSet<u64>,
    /// Per slab: its class, EMPTY or UNDECIDED.
    class: Vec<u8>,
    /// Bitset over slabs: every sector free.
    empty: Vec<u64>,
    empty_slabs: u64,
    /// Per class `k` and fill bucket (`open_bucket`), bitset over the slabs of class `k`
    /// with a free slot in that bucket: a free slot is taken from the fullest bucket first
    /// (see [`SpaceMap::fullest_open`]).
    open: [[Vec<u64>; OPEN_BUCKETS]; CLASSES],
    /// Per class and bucket, how many slabs that bitset holds (so a search skips the empty
    /// ones without scanning them).
    open_slabs: [[u64; OPEN_BUCKETS]; CLASSES],
    /// Per class, sectors in free slots.
    free_slot_sectors: [u64; CLASSES],
    /// Per class, the slab to look at first (next fit: blocks of one txg land close together).
    cursor: [u64; CLASSES],
    /// Per class, the slab it last took empty (u64::MAX: none): filled slot after slot, so
    /// blocks placed one after another there are adjacent (see [`SpaceMap::alloc_placed`]).
    fresh: [u64; CLASSES],
    /// The layout of a raidz vdev: blocks take their raidz allocated size.
    raidz: Option<RaidzLayout>,
}

impl SpaceMap {
    /// An empty map over `asize_bytes` of allocatable space.
    pub fn new(vdev: VdevId, asize_bytes: u64) -> SpaceMap {
        let sectors = asize_bytes / SECTOR_BYTES;
        let slabs = sectors.div_ceil(SLAB_SECTORS);
        let bitset = || vec![0u64; slabs.div_ceil(64) as usize];
        let mut m = SpaceMap {
            vdev,
            sectors,
            words: vec![0; slabs as usize],
            allocated_sectors: 0,
            dirty_chunks: BTreeSet::new(),
            class: vec![EMPTY; slabs as usize],
            empty: bitset(),
            empty_slabs: 0,
            open: std::array::from_fn(|_| std::array::from_fn(|_| bitset())),
            open_slabs: [[0; OPEN_BUCKETS]; CLASSES],
            free_slot_sectors: [0; CLASSES],
            cursor: [0; CLASSES],
            fresh: [u64::MAX; CLASSES],
            raidz: None,
        };
        for slab in 0..slabs {
            bit_set(&mut m.empty, slab, true);
            m.empty_slabs += 1;
        }
        let tail = sectors % SLAB_SECTORS;
        if tail != 0 {
            // The last slab is short: its missing sectors are set, and it takes 4 KiB blocks.
            let last = slabs - 1;
            m.unaccount(last);
            m.words[last as usize] = u64::MAX << tail;
            m.class[last as usize] = 0;
            m.account(last);
        }
        m
    }

    /// Makes this the map of a raidz vdev of `layout` (before anything is allocated): a block
    /// of physical size `p` then takes `layout.asize_bytes(p)`.
    pub fn set_raidz(&mut self, layout: RaidzLayout) {
        debug_assert_eq!(layout.sector_bytes(), SECTOR_BYTES);
        self.raidz = Some(layout);
    }

    /// The raidz layout of this vdev, if it is one.
    pub fn raidz(&self) -> Option<RaidzLayout> {
        self.raidz
    }

    /// Bytes a block of `psize_bytes` physical bytes takes here: whole sectors, plus parity
    /// and skip sectors on a raidz vdev.
    pub fn asize_of(&self, psize_bytes: u64) -> u64 {
        match self.raidz {
            Some(layout) => layout.asize_bytes(psize_bytes.max(1)),
            None => psize_bytes.div_ceil(SECTOR_BYTES).max(1) * SECTOR_BYTES,
        }
    }

    /// The largest physical size (whole sectors, at most `cap_bytes`) of a block that fits in
    /// one slab here.
    pub fn block_bytes_max(&self, cap_bytes: u64) -> u64 {
        match self.raidz {
            Some(layout) => layout.psize_bytes_max(SLAB_BYTES).min(cap_bytes),
            None => SLAB_BYTES.min(cap_bytes),
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

    /// Bytes in empty slabs.
    pub fn empty_bytes(&self) -> u64 {
        self.empty_slabs * SLAB_BYTES
    }

    /// Bytes in the free slots of each class.
    pub fn free_slot_bytes(&self) -> ClassBytes {
        ClassBytes(self.free_slot_sectors.map(|s| s * SECTOR_BYTES))
    }

    fn bit(&self, sector: u64) -> bool {
        self.words[(sector / 64) as usize] >> (sector % 64) & 1 == 1
    }

    /// Takes a slab out of the indexes (before its word changes; [`SpaceMap::account`] puts
    /// it back).
    fn unaccount(&mut self, slab: u64) {
        let w = self.words[slab as usize];
        match self.class[slab as usize] {
            EMPTY => {
                debug_assert_eq!(w, 0);
                bit_set(&mut self.empty, slab, false);
                self.empty_slabs -= 1;
            }
            UNDECIDED => {}
            k => {
                let k = k as usize;
                let n = free_slots(w, k).count_ones() as usize;
                if n > 0 {
                    let b = open_bucket(k, n);
                    bit_set(&mut self.open[k][b], slab, false);
                    self.open_slabs[k][b] -= 1;
                }
                self.free_slot_sectors[k] -= (n as u64) << k;
            }
        }
    }

    /// Puts a slab back into the indexes after its word changed: an empty slab loses its class;
    /// a slab that had none (filled by a claim or a load) gets one (see the module docs).
    fn account(&mut self, slab: u64) {
        let i = slab as usize;
        let w = self.words[i];
        if w == 0 {
            self.class[i] = EMPTY;
            bit_set(&mut self.empty, slab, true);
            self.empty_slabs += 1;
            return;
        }
        if self.class[i] == EMPTY || self.class[i] == UNDECIDED {
            self.class[i] = if w == u64::MAX {
                UNDECIDED
            } else {
                infer_class(w)
            };
        }
        if self.class[i] == UNDECIDED {
            return;
        }
        let k = self.class[i] as usize;
        let n = free_slots(w, k).count_ones() as usize;
        if n > 0 {
            let b = open_bucket(k, n);
            bit_set(&mut self.open[k][b], slab, true);
            self.open_slabs[k][b] += 1;
            self.free_slot_sectors[k] += (n as u64) << k;
        }
    }

    fn set_run(&mut self, start: u64, count: u64, value: bool) {
        let end = start + count;
        let mut s = start;
        // Bounded by the run: one word per round.
        while s < end {
            let slab = s / SLAB_SECTORS;
            let lo = s % SLAB_SECTORS;
            let n = (end - s).min(SLAB_SECTORS - lo);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << lo
            };
            let w = self.words[slab as usize];
            if value {
                debug_assert_eq!(w & mask, 0, "sectors {s}..{} already allocated", s + n);
            } else {
                debug_assert_eq!(w & mask, mask, "sectors {s}..{} already free", s + n);
            }
            self.unaccount(slab);
            self.words[slab as usize] = if value { w | mask } else { w & !mask };
            self.account(slab);
            s += n;
        }
        let first = start / SPACEMAP_CHUNK_SECTORS;
        let last = (end - 1) / SPACEMAP_CHUNK_SECTORS;
        for c in first..=last {
            self.dirty_chunks.insert(c);
        }
        if value {
            self.allocated_sectors += count;
        } else {
            self.allocated_sectors -= count;
        }
    }

    /// Allocates `size_bytes` (rounded up to whole sectors, at most a slab) contiguously, in a
    /// free slot of its class or else in an empty slab; None if neither exists.
    pub fn alloc(&mut self, size_bytes: u64) -> Option<Dva> {
        self.alloc_placed(size_bytes, Placement::SlotFirst)
    }

    /// As [`SpaceMap::alloc`]; with `sequential`, the block goes into the slab its class last
    /// took empty while that has a free slot, else into a new empty slab, and only without
    /// any empty slab into another free slot of its class. Blocks placed one after another
    /// are then adjacent, and the txg sync writes them as one aggregated write, where free
    /// slots scattered by random rewrites would scatter the writes. The caller decides when
    /// empty slabs are plentiful enough to spend them so ([`Allocator::alloc_with`]).
    ///
    /// `size_bytes` is the block's physical size; the run allocated is [`SpaceMap::asize_of`]
    /// it, which the DVA records.
    pub fn alloc_placed(&mut self, size_bytes: u64, placement: Placement) -> Option<Dva> {
        let size_bytes = self.asize_of(size_bytes);
        let sequential = placement == Placement::Sequential;
        let count = size_bytes.div_ceil(SECTOR_BYTES).max(1);
        let k = class_of(size_bytes)?;
        let slabs = self.words.len() as u64;
        let fresh = self.fresh[k];
        // Still fresh while filled from its start without a gap (allocated sectors are a
        // prefix: no free inside yet), so its next slot follows the last block placed there.
        let fresh_open = fresh != u64::MAX && {
            let w = self.words[fresh as usize];
            self.class[fresh as usize] as usize == k
                && w & w.wrapping_add(1) == 0
                && free_slots(w, k) != 0
        };
        let mut class = k;
        let slab = if let Placement::Borrow(lenders) = placement {
            // The smallest larger class with a free slot wastes the least of it.
            class = (k + 1..CLASSES)
                .find(|&j| lenders >> j & 1 == 1 && self.free_slot_sectors[j] > 0)?;
            self.fullest_open(class)?
        } else if sequential && fresh_open {
            fresh
        } else if sequential && self.empty_slabs > 0 {
            next_set(&self.empty, self.cursor[k], slabs)?
        } else {
            // The counters say whether a search can succeed, so a full class or a full map
            // costs no scan of its bitset.
            let open = (self.free_slot_sectors[k] > 0)
                .then(|| self.fullest_open(k))
                .flatten();
            match open {
                Some(slab) => slab,
                None if self.empty_slabs > 0 && placement != Placement::SlotOnly => {
                    next_set(&self.empty, self.cursor[k], slabs)?
                }
                None => return None,
            }
        };
        if self.class[slab as usize] == EMPTY {
            self.fresh[k] = slab;
        }
        self.cursor[class] = slab;
        let w = self.words[slab as usize];
        let slot = u64::from(free_slots(w, class).trailing_zeros());
        debug_assert!(slot + count <= SLAB_SECTORS);
        debug_assert!(count <= 1 << class);
        let start = slab * SLAB_SECTORS + slot;
        self.unaccount(slab);
        if self.class[slab as usize] == EMPTY {
            // The slab becomes one of class k as the block goes in.
            self.class[slab as usize] = k as u8;
        }
        debug_assert_eq!(self.class[slab as usize] as usize, class);
        let mask = if count == SLAB_SECTORS {
            u64::MAX
        } else {
            ((1u64 << count) - 1) << slot
        };
        debug_assert_eq!(w & mask, 0);
        self.words[slab as usize] = w | mask;
        self.account(slab);
        self.allocated_sectors += count;
        self.dirty_chunks.insert(start / SPACEMAP_CHUNK_SECTORS);
        Some(Dva {
            vdev: self.vdev,
            offset_bytes: start * SECTOR_BYTES,
            asize_bytes: (count * SECTOR_BYTES) as u32,
        })
    }

    /// A slab of class `k` with a free slot from the fullest bucket that has one, the first
    /// from the class's cursor in that bucket (next fit within it; the fullest slabs' holes are
    /// scattered, so a txg's blocks land less close together than with next fit over all, and
    /// a search may scan more of the bucket's bitset: measured by a reviewer on 16 GiB at 40 %
    /// live, 111 against 81 ns per rewrite in batches of 1000 as a txg sync allocates).
    /// Fullest first, so that sparse slabs are not refilled and
    /// drain as copy-on-write frees their blocks, until they are empty and any class can take
    /// them: with next fit over every slab with a free slot, random rewrites left each slab a
    /// class ever took with a few live blocks, and the other classes (indirect blocks, log
    /// blocks) found only the reserve's empty slabs (docs/space.md, "Small pools").
    fn fullest_open(&self, k: usize) -> Option<u64> {
        let slabs = self.words.len() as u64;
        let b = self.open_slabs[k].iter().position(|&c| c > 0)?;
        next_set(&self.open[k][b], self.cursor[k], slabs)
    }

    /// A slab of class `from` with free slots of at most `bytes_max` in all, and those bytes:
    /// from the sparsest bucket first (the most free space changes hands per slab); None if
    /// there is none among the first [`GIVE_CANDIDATES_MAX`] slabs of each bucket.
    fn slab_to_give(&self, from: usize, bytes_max: u64) -> Option<(u64, u64)> {
        let slabs = self.words.len() as u64;
        (0..OPEN_BUCKETS).rev().find_map(|b| {
            let bits = &self.open[from][b];
            let mut at = 0;
            for _ in 0..self.open_slabs[from][b].min(GIVE_CANDIDATES_MAX) {
                let slab = next_set(bits, at, slabs)?;
                let free = u64::from(free_slots(self.words[slab as usize], from).count_ones());
                let bytes = (free << from) * SECTOR_BYTES;
                if bytes <= bytes_max {
                    return Some((slab, bytes));
                }
                at = slab + 1;
            }
            None
        })
    }

    /// Gives `slab` (of a class larger than `to`) to class `to`: its free slots become free
    /// slots of `to` (one slot of class `j` is `2^(j - to)` of them). Its blocks stay where
    /// they are; their sectors come back as slots of `to` when they are freed. Any class is
    /// safe for a slab, as at import: a slot is free only when all its bits are clear.
    fn give_slab(&mut self, slab: u64, to: usize) {
        debug_assert!((self.class[slab as usize] as usize) > to);
        self.unaccount(slab);
        self.class[slab as usize] = to as u8;
        self.account(slab);
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

    /// Sectors the map covers.
    pub fn sectors(&self) -> u64 {
        self.sectors
    }

    /// Whether sector `sector` is allocated (the audit compares every sector).
    pub fn is_sector_allocated(&self, sector: u64) -> bool {
        sector < self.sectors && self.bit(sector)
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
        // A chunk is a whole number of slabs (SPACEMAP_CHUNK_SECTORS is a multiple of 64).
        let mut s = first;
        while s < end {
            let slab = s / SLAB_SECTORS;
            let mut add = 0u64;
            for j in 0..(end - s).min(SLAB_SECTORS) {
                let i = (s + j - first) as usize;
                if bits[i / 8] >> (i % 8) & 1 == 1 {
                    add |= 1 << j;
                }
            }
            let w = self.words[slab as usize];
            let new = add & !w;
            if new != 0 {
                self.unaccount(slab);
                self.words[slab as usize] = w | new;
                self.allocated_sectors += u64::from(new.count_ones());
                self.account(slab);
            }
            s += SLAB_SECTORS;
        }
    }

    /// Checks the indexes against the bitmap (tests).
    #[cfg(test)]
    fn check_indexes(&self) {
        let mut empty = 0;
        let mut free = [0u64; CLASSES];
        for (i, &w) in self.words.iter().enumerate() {
            let slab = i as u64;
            assert_eq!(w == 0, self.class[i] == EMPTY, "slab {i}");
            assert_eq!(bit_get(&self.empty, slab), w == 0);
            empty += u64::from(w == 0);
            for (k, f) in free.iter_mut().enumerate() {
                let mine = self.class[i] as usize == k;
                let slots = if mine { free_slots(w, k) } else { 0 };
                let n = slots.count_ones() as usize;
                for (b, bits) in self.open[k].iter().enumerate() {
                    assert_eq!(
                        bit_get(bits, slab),
                        n > 0 && open_bucket(k, n) == b,
                        "slab {i} class {k} bucket {b}"
                    );
                }
                *f += u64::from(slots.count_ones()) << k;
            }
        }
        assert_eq!(empty, self.empty_slabs);
        assert_eq!(free, self.free_slot_sectors);
        for k in 0..CLASSES {
            for (b, bits) in self.open[k].iter().enumerate() {
                let count = (0..self.words.len() as u64)
                    .filter(|&slab| bit_get(bits, slab))
                    .count() as u64;
                assert_eq!(count, self.open_slabs[k][b], "class {k} bucket {b}");
            }
        }
        let real: u64 = (0..self.sectors).filter(|&s| self.bit(s)).count() as u64;
        assert_eq!(real, self.allocated_sectors);
    }
}

/// What the allocator may place on a top-level vdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VdevRole {
    /// Pool data (and log blocks when no log device has room).
    Data,
    /// A separate intent-log device: log blocks only.
    Log,
    /// Added, but not yet in a durable txg's configuration: nothing may be placed on it (a
    /// block there would be unreachable after a crash), and its space is not counted. Becomes
    /// `Data` or `Log` ([`Allocator::activate`]) once the txg that records it is durable.
    Pending {
        /// A log device once active.
        log: bool,
    },
    /// A log device being removed (`oxpool remove`), or one whose devices are all missing
    /// (imported with `-m`): nothing new is placed on it, and its blocks are freed as usual
    /// until none is left.
    Leaving,
    /// A removed vdev (a hole in the tree): its map has no sectors.
    Hole,
}

/// All top-level vdevs' maps, with the policy that spreads blocks over them.
#[derive(Debug)]
pub struct Allocator {
    maps: Vec<SpaceMap>,
    /// Per vdev: what may be placed there.
    role: Vec<VdevRole>,
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
            role: log
                .iter()
                .map(|&l| if l { VdevRole::Log } else { VdevRole::Data })
                .collect(),
            rotor: 0,
        }
    }

    /// One map per top-level vdev of `tops`, in order: sized by its allocatable bytes, a log
    /// device or not, raidz or not.
    pub fn for_tops<'a>(tops: impl Iterator<Item = &'a crate::vdev::TopVdev>) -> Allocator {
        let tops: Vec<&crate::vdev::TopVdev> = tops.collect();
        let asizes: Vec<u64> = tops.iter().map(|t| t.asize_bytes).collect();
        let logs: Vec<bool> = tops.iter().map(|t| t.log).collect();
        let mut a = Allocator::with_log_devices(&asizes, &logs);
        for ((map, role), top) in a.maps.iter_mut().zip(&mut a.role).zip(&tops) {
            if let Some(layout) = top.raidz_layout() {
                map.set_raidz(layout);
            }
            if top.is_hole() {
                *role = VdevRole::Hole;
            }
        }
        a
    }

    /// The largest physical size of a block (whole sectors, at most `cap_bytes`) that fits in
    /// one slab of every data vdev: the size of the pieces the pool's metadata is cut into.
    pub fn block_bytes_max(&self, cap_bytes: u64) -> u64 {
        self.maps
            .iter()
            .zip(&self.role)
            .filter(|(_, r)| matches!(r, VdevRole::Data | VdevRole::Pending { log: false }))
            .map(|(m, _)| m.block_bytes_max(cap_bytes))
            .min()
            .unwrap_or(cap_bytes)
            / SECTOR_BYTES
            * SECTOR_BYTES
    }

    /// Adds a top-level vdev (its id is the next index), [`VdevRole::Pending`] until
    /// [`Allocator::activate`].
    pub fn add_vdev(&mut self, asize_bytes: u64, log: bool) -> VdevId {
        let id = VdevId(self.maps.len() as u32);
        self.maps.push(SpaceMap::new(id, asize_bytes));
        self.role.push(VdevRole::Pending { log });
        id
    }

    /// Lets blocks be placed on a vdev added by [`Allocator::add_vdev`] (the txg recording
    /// it is durable).
    pub fn activate(&mut self, vdev: VdevId) {
        let role = &mut self.role[vdev.0 as usize];
        if let VdevRole::Pending { log } = *role {
            *role = if log { VdevRole::Log } else { VdevRole::Data };
        }
    }

    /// Starts (`leaving`) or ends the removal of a log device: while it leaves, nothing new
    /// is placed on it. Only a log device leaves or comes back.
    pub fn set_leaving(&mut self, vdev: VdevId, leaving: bool) {
        let role = &mut self.role[vdev.0 as usize];
        debug_assert!(matches!(role, VdevRole::Log | VdevRole::Leaving));
        *role = if leaving {
            VdevRole::Leaving
        } else {
            VdevRole::Log
        };
    }

    /// Makes a vdev that left a hole: its map gives way to one of no sectors. Only once
    /// nothing is allocated on it (a free of a block there would find no map).
    pub fn make_hole(&mut self, vdev: VdevId) {
        let i = vdev.0 as usize;
        assert_eq!(
            self.role[i],
            VdevRole::Leaving,
            "only a leaving vdev becomes a hole"
        );
        assert_eq!(self.maps[i].allocated_bytes(), 0, "a hole holds nothing");
        self.maps[i] = SpaceMap::new(vdev, 0);
        self.role[i] = VdevRole::Hole;
    }

    /// What may be placed on each vdev.
    pub fn roles(&self) -> &[VdevRole] {
        &self.role
    }

    /// Whether the pool has a separate log device.
    pub fn has_log_device(&self) -> bool {
        self.role.contains(&VdevRole::Log)
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

    /// Allocates `copies` copies of `size_bytes` (at most [`SLAB_BYTES`]), each on a
    /// different top-level vdev when there are enough and they have room, else on the same one.
    /// Returns the DVAs or None (out of space; any partial allocation is undone).
    pub fn alloc(&mut self, size_bytes: u64, copies: usize) -> Option<Vec<Dva>> {
        self.alloc_with(size_bytes, copies, false, &Keep::default())
    }

    /// As [`Allocator::alloc`], placing each copy as [`SpaceMap::alloc_placed`] does with
    /// `sequential`. Spending empty slabs on blocks that free slots of their class could hold
    /// is safe only while the empty slabs left could hold everything still to be allocated;
    /// the caller checks that ([`Space::holds_all`]).
    ///
    /// A block with no free slot of its class takes an empty slab while the pool's empty
    /// slabs are more than `keep.empty_bytes` (the part of the reserve that must stay empty
    /// slabs), else a free slot of a larger class that has slots beyond what its pending
    /// blocks need (`keep.need`: [`Placement::Borrow`]), and only without one an empty slab
    /// below the floor. Charged blocks then go where [`Space::fits`] counted them (their own
    /// slots, empty slabs down to the floor); what nobody charged (space-map chunks, a tree's
    /// new level, log blocks) takes the spare slots `fits` counted toward the reserve before
    /// it dips into the reserve's empty slabs. Borrowing from a class's pending need instead
    /// would push that class's blocks out to empty slabs nobody counted, and the sync could
    /// fail (found by review, 2026-11-30).
    pub fn alloc_with(
        &mut self,
        size_bytes: u64,
        copies: usize,
        sequential: bool,
        keep: &Keep,
    ) -> Option<Vec<Dva>> {
        debug_assert!((1..=3).contains(&copies));
        debug_assert!(size_bytes <= SLAB_BYTES, "{size_bytes} bytes in one block");
        let n = self.maps.len();
        let first = self.rotor % n;
        self.rotor = self.rotor.wrapping_add(1);
        let mut out = Vec::with_capacity(copies);
        // Try each vdev per copy, starting at the rotor, first those not used yet, then any
        // (the space check counts free space pool-wide, so a copy may not fail only because
        // the other vdevs are full); log devices hold log blocks only.
        // A block's first copy takes a free slot of its class on any vdev before an empty
        // slab (unless sequential): `fits` counts free slots pool-wide, so an empty slab taken
        // on one vdev while another has a free slot would spend room the promise counted on.
        // Further copies (ditto blocks) prefer vdevs not used yet, slot or empty slab, as ZFS
        // does: a copy on another device is what they are for. What that may spend beyond
        // the promise is bounded by those copies (docs/space.md, "Limits").
        // Each pass: distinct vdevs only, the placement, and whether only while the empty
        // slabs are above the floor.
        // (`Borrow(0)` stands for the classes with spare slots, worked out when reached.)
        const BORROW: Placement = Placement::Borrow(0);
        const FIRST: &[(bool, Placement, bool)] = &[
            (false, Placement::SlotOnly, false),
            (false, Placement::SlotFirst, true),
            (false, BORROW, false),
            (false, Placement::SlotFirst, false),
        ];
        const DITTO: &[(bool, Placement, bool)] = &[
            (true, Placement::SlotOnly, false),
            (true, Placement::SlotFirst, true),
            (false, Placement::SlotOnly, false),
            (false, Placement::SlotFirst, true),
            (true, BORROW, false),
            (false, BORROW, false),
            (true, Placement::SlotFirst, false),
            (false, Placement::SlotFirst, false),
        ];
        const SEQUENTIAL: &[(bool, Placement, bool)] = &[
            (true, Placement::Sequential, false),
            (false, Placement::Sequential, false),
            (false, BORROW, false),
        ];
        for c in 0..copies {
            // Per copy: a copy that borrowed took one of a class's spare slots.
            let mut lenders = None;
            let passes = match (sequential, c) {
                (true, _) => SEQUENTIAL,
                (false, 0) => FIRST,
                (false, _) => DITTO,
            };
            let mut got = None;
            'passes: for &(distinct, mut placement, above_floor) in passes {
                if above_floor && self.data_empty_bytes() <= keep.empty_bytes {
                    continue;
                }
                if placement == BORROW {
                    // First a whole slab of a class with slots to spare, given to this
                    // block's class: no slot is half wasted, and the next blocks of the
                    // class find slots of their own (borrowing one slot per block left a
                    // raidz2 pool 16 MiB of unused slot ends and its empty slabs below the
                    // reserve, where it refused writers: space.rs under load, 2026-11-30).
                    if let Some(d) = self.give_and_place(size_bytes, &keep.need, distinct, &out) {
                        got = Some(d);
                        break 'passes;
                    }
                    let mask = *lenders.get_or_insert_with(|| self.spare_classes(&keep.need));
                    if mask == 0 {
                        continue;
                    }
                    placement = Placement::Borrow(mask);
                }
                for k in 0..n {
                    let v = (first + c + k) % n;
                    if self.role[v] != VdevRole::Data
                        || (distinct && out.iter().any(|d: &Dva| d.vdev.0 as usize == v))
                    {
                        continue;
                    }
                    if let Some(d) = self.maps[v].alloc_placed(size_bytes, placement) {
                        got = Some(d);
                        break 'passes;
                    }
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

    /// Allocates one intent-log block: on a separate log device if there is one with room
    /// and `in_service` says it can take writes (round-robin over several), else on the
    /// pool's data vdevs if `data_ok` (placed as [`Allocator::alloc_with`] does with
    /// `keep`). Log blocks are allocated outside the txg sync, at
    /// commit time; they reach the persisted maps with the next sync like any allocation.
    pub fn alloc_log(
        &mut self,
        size_bytes: u64,
        data_ok: bool,
        keep: &Keep,
        in_service: impl Fn(VdevId) -> bool,
    ) -> Option<Dva> {
        let n = self.maps.len();
        let first = self.rotor % n;
        self.rotor = self.rotor.wrapping_add(1);
        for k in 0..n {
            let v = (first + k) % n;
            if self.role[v] == VdevRole::Log && in_service(VdevId(v as u32)) {
                if let Some(d) = self.maps[v].alloc(size_bytes) {
                    return Some(d);
                }
            }
        }
        if !data_ok {
            return None;
        }
        self.alloc_with(size_bytes, 1, false, keep).map(|v| v[0])
    }

    /// Returns a block's space (only called when its deferral has passed).
    pub fn free(&mut self, dva: &Dva) {
        self.maps[dva.vdev.0 as usize].free(dva);
    }

    /// Free space of the pool's data vdevs (log devices apart), by slab and class.
    pub fn space(&self) -> Space {
        let mut out = Space::default();
        for m in self.maps.iter().zip(&self.role).filter_map(|(m, r)| {
            matches!(r, VdevRole::Data | VdevRole::Pending { log: false }).then_some(m)
        }) {
            if m.raidz.is_some() {
                for (k, inf) in out.inflation.iter_mut().enumerate() {
                    let here = inflate_class(m.raidz, k);
                    // The costlier: more bytes, and within that the larger class.
                    let cost = |(c, mult): (u8, u64)| (mult << k, c);
                    if cost(here) > cost(*inf) {
                        *inf = here;
                    }
                }
            }
        }
        for (m, _) in self
            .maps
            .iter()
            .zip(&self.role)
            .filter(|(_, &r)| r == VdevRole::Data)
        {
            out.size_bytes += m.size_bytes();
            out.free_bytes += m.size_bytes() - m.allocated_bytes();
            out.empty_bytes += m.empty_bytes();
            out.free_slots += m.free_slot_bytes();
        }
        out
    }

    /// Gives a data vdev's slab of a larger class, with no more free slots than that class
    /// has beyond its part of `need` (pool-wide), to the class of a block of `size_bytes`
    /// there, and places the block in it: the sync's way to a slot when its class has none
    /// and the empty slabs are down to the floor. With `distinct`, not on a vdev `out` uses.
    fn give_and_place(
        &mut self,
        size_bytes: u64,
        need: &ClassBytes,
        distinct: bool,
        out: &[Dva],
    ) -> Option<Dva> {
        let space = self.space();
        let wanted = space.inflated(need);
        for v in 0..self.maps.len() {
            if self.role[v] != VdevRole::Data
                || (distinct && out.iter().any(|d| d.vdev.0 as usize == v))
            {
                continue;
            }
            let Some(to) = class_of(self.maps[v].asize_of(size_bytes)) else {
                continue;
            };
            if self.give_spare_slab(v, to, &wanted, &space) {
                return self.maps[v].alloc_placed(size_bytes, Placement::SlotOnly);
            }
        }
        None
    }

    /// Gives vdev `v`'s slab of the smallest class above `to` that has free slots beyond
    /// its part of `wanted` (inflated pending need; pool-wide, as `space` counts them), with
    /// no more free slots than that surplus, to class `to`. Whether it gave one.
    fn give_spare_slab(&mut self, v: usize, to: usize, wanted: &ClassBytes, space: &Space) -> bool {
        for from in to + 1..CLASSES {
            let surplus = space.free_slots.0[from].saturating_sub(wanted.0[from]);
            if let Some((slab, _)) = self.maps[v].slab_to_give(from, surplus) {
                self.maps[v].give_slab(slab, to);
                return true;
            }
        }
        false
    }

    /// Bitmask of the classes whose free slots (pool-wide) are more than `need` (charges,
    /// physical sizes) asks of them by at least one slot: those a block may borrow from.
    fn spare_classes(&self, need: &ClassBytes) -> u8 {
        let space = self.space();
        let need = space.inflated(need);
        (0..CLASSES)
            .filter(|&j| space.free_slots.0[j] >= need.0[j] + (SECTOR_BYTES << j))
            .fold(0u8, |m, j| m | 1 << j)
    }

    /// Bytes of empty slabs on the data vdevs.
    fn data_empty_bytes(&self) -> u64 {
        self.maps
            .iter()
            .zip(&self.role)
            .filter(|(_, &r)| r == VdevRole::Data)
            .map(|(m, _)| m.empty_bytes())
            .sum()
    }

    /// Number of data vdevs (log devices apart).
    pub fn data_vdevs(&self) -> usize {
        self.role.iter().filter(|&&r| r == VdevRole::Data).count()
    }

    /// Whether blocks needing `need` (bytes of slots per class, every copy counted) are sure
    /// to fit in the data vdevs with `reserve` left over ([`Space::fits`]: its empty part in
    /// empty slabs, the rest in empty slabs or spare free slots): each class first takes its
    /// own free slots, and what they cannot hold takes empty slabs. Sure, not just likely: an
    /// empty slab holds a block of any class wherever it is (see the module docs). The part
    /// of a slab a class takes and leaves partly empty becomes free slots of that class; the
    /// reserve must cover one such slab per class and vdev.
    pub fn fits(&self, need: &ClassBytes, reserve: Reserve) -> bool {
        self.space().fits(need, reserve)
    }

    /// [`Allocator::fits`], giving slabs of a larger class to a smaller one first when the
    /// smaller is short of free slots and the larger has more than its part of `need` asks
    /// (in whole slabs, the sparsest first). Returns whether `need` fits then.
    ///
    /// Why: free space held in the slots of one class is of no use to the others, and a
    /// slab comes back to every class only when its last block goes. A raidz2 pool refused
    /// every write at 29 % allocated, its free space in the data blocks' slots, while the
    /// metadata blocks had only the reserve (2026-11-30). A slab given away keeps its
    /// blocks, so it is done here, where a writer would otherwise be refused, and never
    /// below what the larger class's own pending blocks need: the promise of
    /// [`Allocator::fits`] stays the same, on the counters after the move.
    pub fn make_room(&mut self, need: &ClassBytes, reserve: Reserve) -> bool {
        for _ in 0..MAKE_ROOM_SLABS_MAX {
            let space = self.space();
            if space.fits(need, reserve) {
                return true;
            }
            let wanted = space.inflated(need);
            let gave = (0..CLASSES)
                .filter(|&k| wanted.0[k] > space.free_slots.0[k])
                .any(|to| {
                    (0..self.maps.len()).any(|v| {
                        self.role[v] == VdevRole::Data
                            && self.give_spare_slab(v, to, &wanted, &space)
                    })
                });
            if !gave {
                return false;
            }
        }
        self.fits(need, reserve)
    }

    /// Total allocatable and allocated bytes of the pool's data vdevs (log devices apart).
    pub fn totals_bytes(&self) -> (u64, u64) {
        self.maps
            .iter()
            .zip(&self.role)
            .filter(|(_, &r)| r == VdevRole::Data)
            .fold((0, 0), |(s, a), (m, _)| {
                (s + m.size_bytes(), a + m.allocated_bytes())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A vdev added and not yet active takes nothing (data, ditto copies, log blocks) and
    /// counts for no space; once active it does.
    #[test]
    fn a_pending_vdev_takes_no_block_until_active() {
        let mut a = Allocator::with_log_devices(&[64 * SLAB_BYTES], &[false]);
        let data = a.add_vdev(64 * SLAB_BYTES, false);
        let log = a.add_vdev(64 * SLAB_BYTES, true);
        let size_before = a.totals_bytes().0;
        assert_eq!(a.data_vdevs(), 1);
        assert!(!a.has_log_device());
        for _ in 0..50 {
            for d in a.alloc(4 * SECTOR_BYTES, 3).unwrap() {
                assert_eq!(d.vdev, VdevId(0), "a block on a pending vdev");
            }
            let l = a
                .alloc_log(32 * SECTOR_BYTES, true, &Keep::default(), |_| true)
                .unwrap();
            assert_eq!(l.vdev, VdevId(0), "a log block on a pending vdev");
        }
        assert_eq!(
            a.alloc_log(SECTOR_BYTES, false, &Keep::default(), |_| true),
            None
        );
        a.activate(data);
        a.activate(log);
        assert!(a.totals_bytes().0 > size_before);
        assert!(a.has_log_device());
        assert_eq!(
            a.alloc_log(SECTOR_BYTES, false, &Keep::default(), |_| true)
                .unwrap()
                .vdev,
            log
        );
        // A log vdev with no device in service takes no log block: the data vdevs do.
        assert_ne!(
            a.alloc_log(SECTOR_BYTES, true, &Keep::default(), |v| v != log)
                .unwrap()
                .vdev,
            log
        );
        assert_eq!(
            a.alloc_log(SECTOR_BYTES, false, &Keep::default(), |v| v != log),
            None
        );
        let used: std::collections::HashSet<VdevId> = (0..64)
            .flat_map(|_| a.alloc(4 * SECTOR_BYTES, 1).unwrap())
            .map(|d| d.vdev)
            .collect();
        assert!(used.contains(&data), "the active vdev is never used");
    }

    /// Sequential placement: with free slots scattered by frees, blocks placed one after
    /// another still land adjacent (in fresh slabs); without it they fill the scattered
    /// slots; with no empty slab left, sequential falls back to the slots.
    #[test]
    fn sequential_placement_keeps_blocks_adjacent() {
        let block = 4 * SECTOR_BYTES; // 16 KiB: 16 slots in a slab
        let mut m = SpaceMap::new(VdevId(0), 8 * SLAB_BYTES);
        let first: Vec<Dva> = (0..32).map(|_| m.alloc(block).unwrap()).collect();
        for d in first.iter().step_by(3) {
            m.free(d); // scattered free slots in the two full slabs
        }
        let seq: Vec<Dva> = (0..20)
            .map(|_| m.alloc_placed(block, Placement::Sequential).unwrap())
            .collect();
        for pair in seq.windows(2) {
            assert_eq!(
                pair[0].offset_bytes + block,
                pair[1].offset_bytes,
                "{pair:?}"
            );
        }
        assert!(
            seq[0].offset_bytes >= 2 * SLAB_BYTES,
            "not in the scattered slots"
        );
        let empty = m.empty_bytes();
        m.alloc_placed(block, Placement::SlotFirst).unwrap();
        assert_eq!(
            m.empty_bytes(),
            empty,
            "free slots first without sequential"
        );
        m.check_indexes();
        // Use up every empty slab: sequential then takes the remaining slots.
        while m.empty_bytes() > 0 {
            m.alloc_placed(SLAB_BYTES, Placement::Sequential).unwrap();
        }
        let mut n = 0;
        while let Some(d) = m.alloc_placed(block, Placement::Sequential) {
            assert!(d.offset_bytes < 4 * SLAB_BYTES);
            n += 1;
            assert!(n <= 64, "bounded");
        }
        assert!(n > 0);
        m.check_indexes();
    }

    /// Sequential placement stops when the block's class has more free slots than there are
    /// empty slabs beyond the reserve, whatever `holds_all` says, and only for that class.
    #[test]
    fn sequential_placement_stops_when_its_class_hoards_free_slots() {
        let block = 4 * SECTOR_BYTES; // 16 KiB, class 2
        let mut m = SpaceMap::new(VdevId(0), 16 * SLAB_BYTES);
        let placed: Vec<Dva> = (0..64).map(|_| m.alloc(block).unwrap()).collect();
        // Four slabs of class 2; free every other block: two slabs' worth of free slots.
        for d in placed.iter().step_by(2) {
            m.free(d);
        }
        let mut space = Space {
            size_bytes: m.size_bytes(),
            free_bytes: m.size_bytes() - m.allocated_bytes(),
            empty_bytes: m.empty_bytes(),
            free_slots: m.free_slot_bytes(),
            ..Space::default()
        };
        assert_eq!(space.free_slots.0[2], 2 * SLAB_BYTES);
        assert_eq!(space.empty_bytes, 12 * SLAB_BYTES);
        let need = ClassBytes::default();
        // Empty slabs beyond the reserve: 12 - 9 = 3 slabs, more than class 2's free slots.
        assert!(space.sequential_ok(&need, 9 * SLAB_BYTES, block, 1));
        // 12 - 11 = 1 slab: fewer than class 2's free slots, although everything pending
        // (nothing) still fits in the empty slabs.
        assert!(space.holds_all(&need, 11 * SLAB_BYTES, 1));
        assert!(!space.sequential_ok(&need, 11 * SLAB_BYTES, block, 1));
        // Another class has no free slots: it may still go sequentially.
        assert!(space.sequential_ok(&need, 11 * SLAB_BYTES, 8 * SECTOR_BYTES, 1));
        // And holds_all still bounds it.
        space.empty_bytes = 11 * SLAB_BYTES;
        assert!(!space.sequential_ok(&need, 11 * SLAB_BYTES, 8 * SECTOR_BYTES, 1));
    }

    /// `fits` counts free slots pool-wide: a block of a class takes a free slot of its class
    /// on any vdev before an empty slab on another, or the empty slabs `fits` kept for other
    /// classes would go to it.
    #[test]
    fn free_slots_on_any_vdev_come_before_empty_slabs() {
        let mut a = Allocator::new(&[2 * SLAB_BYTES, 2 * SLAB_BYTES]);
        let small = SECTOR_BYTES;
        let on_a: Vec<Dva> = (0..2 * SLAB_SECTORS)
            .map(|_| a.map_mut(VdevId(0)).alloc(small).unwrap())
            .collect();
        for d in on_a.iter().step_by(2) {
            a.free(d);
        }
        assert_eq!(a.map(VdevId(0)).empty_bytes(), 0);
        assert_eq!(a.map(VdevId(1)).empty_bytes(), 2 * SLAB_BYTES);
        let before = a.space();
        assert_eq!(before.free_slots.0[0], SLAB_SECTORS * SECTOR_BYTES);
        for _ in 0..SLAB_SECTORS {
            let d = a.alloc(small, 1).unwrap();
            assert_eq!(
                d[0].vdev,
                VdevId(0),
                "an empty slab taken while slots were free"
            );
        }
        // The empty slabs are all still there for the classes that need them.
        assert_eq!(a.space().empty_bytes, before.empty_bytes);
        assert!(a.alloc(4 * SLAB_SECTORS * SECTOR_BYTES / 4, 1).is_some());
    }

    #[test]
    fn alloc_free_accounting() {
        let mut m = SpaceMap::new(VdevId(0), 2 * SLAB_BYTES);
        let a = m.alloc(10_000).unwrap();
        assert_eq!(a.asize_bytes as u64, 3 * SECTOR_BYTES);
        assert_eq!(m.allocated_bytes(), 3 * SECTOR_BYTES);
        let b = m.alloc(SECTOR_BYTES).unwrap();
        assert_ne!(a.offset_bytes, b.offset_bytes);
        m.free(&a);
        assert_eq!(m.allocated_bytes(), SECTOR_BYTES);
        assert!(m.is_allocated(&b));
        assert!(!m.claim(&b));
        // Two classes, two slabs: the first is empty again, the second holds `b`.
        assert_eq!(m.empty_bytes(), SLAB_BYTES);
        m.check_indexes();
    }

    #[test]
    fn full_map_refuses_then_reuses_holes() {
        // One short slab of 8 sectors: it takes 4 KiB blocks only.
        let mut m = SpaceMap::new(VdevId(0), 8 * SECTOR_BYTES);
        let all: Vec<_> = (0..8).map(|_| m.alloc(SECTOR_BYTES).unwrap()).collect();
        assert!(m.alloc(SECTOR_BYTES).is_none());
        m.free(&all[2]);
        let d = m.alloc(SECTOR_BYTES).unwrap();
        assert_eq!(d.offset_bytes, 2 * SECTOR_BYTES);
        m.free(&all[4]);
        m.free(&all[5]);
        assert!(
            m.alloc(2 * SECTOR_BYTES).is_none(),
            "a hole of a 4 KiB slab"
        );
        m.check_indexes();
    }

    /// A class whose blocks were spread over many slabs (the txg sync places blocks
    /// sequentially in empty slabs while they are plentiful) gives slabs back under random
    /// rewrites: free slots are taken from the fullest slabs, so the sparse ones drain until
    /// they are empty and any class can take them. With next fit over every slab with a free
    /// slot, about 50 of the 256 slabs ended empty (docs/space.md, "Small pools").
    #[test]
    fn rewrites_give_a_spread_class_slabs_back() {
        let slabs = 256u64;
        let mut m = SpaceMap::new(VdevId(0), slabs * SLAB_BYTES);
        let block = 4 * SECTOR_BYTES; // 16 KiB: 16 slots a slab
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut live: Vec<Dva> = (0..slabs * 16).map(|_| m.alloc(block).unwrap()).collect();
        assert_eq!(m.empty_bytes(), 0);
        // Keep 40 % of the blocks, scattered over every slab.
        while live.len() as u64 > slabs * 16 * 2 / 5 {
            let i = rand() as usize % live.len();
            m.free(&live.swap_remove(i));
        }
        let empty_before = m.empty_bytes() / SLAB_BYTES;
        // Rewrite each live block about eight times over, copy-on-write: new place, old freed.
        for _ in 0..live.len() * 8 {
            let i = rand() as usize % live.len();
            let new = m.alloc(block).unwrap();
            m.free(&std::mem::replace(&mut live[i], new));
        }
        m.check_indexes();
        let empty_after = m.empty_bytes() / SLAB_BYTES;
        // 40 % of the space is live: most of the other 60 % should be whole empty slabs.
        assert!(
            empty_after >= slabs * 2 / 5,
            "{empty_after} of {slabs} slabs empty after the rewrites ({empty_before} before)"
        );
    }

    /// Random 4 KiB rewrites leave free space in single sectors everywhere; blocks of other
    /// classes still find room in empty slabs, and `fits` tells in advance whether they will.
    #[test]
    fn small_holes_never_starve_larger_blocks() {
        let slabs = 64;
        let mut a = Allocator::new(&[slabs * SLAB_BYTES]);
        let mut live: Vec<Dva> = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Half the map in 4 KiB blocks, then rewrite them at random many times over, with an
        // 8-sector block (an indirect block) now and then.
        for _ in 0..slabs * SLAB_SECTORS / 2 {
            live.push(a.alloc(SECTOR_BYTES, 1).unwrap()[0]);
        }
        let mut big: Vec<Dva> = Vec::new();
        for round in 0..20_000 {
            let i = rand() as usize % live.len();
            a.free(&live.swap_remove(i));
            live.push(a.alloc(SECTOR_BYTES, 1).unwrap()[0]);
            if round % 64 == 0 {
                let mut need = ClassBytes::default();
                need.add_blocks(8 * SECTOR_BYTES, 1, 1);
                assert!(
                    a.fits(&need, Reserve::default()),
                    "round {round}: half the map is free"
                );
                big.push(a.alloc(8 * SECTOR_BYTES, 1).expect("fits said yes")[0]);
                if big.len() > 16 {
                    a.free(&big.remove(0));
                }
            }
        }
        a.maps[0].check_indexes();
        // Fill the empty slabs: then `fits` says no, and it is right.
        let mut need = ClassBytes::default();
        need.add_blocks(8 * SECTOR_BYTES, 1, 1);
        while a.fits(&need, Reserve::default()) {
            a.alloc(8 * SECTOR_BYTES, 1).unwrap();
        }
        let before = a.space();
        while a.alloc(8 * SECTOR_BYTES, 1).is_some() {}
        assert_eq!(before.free_slots.0[3], 0, "no class-8 slot was left");
        a.maps[0].check_indexes();
    }

    /// `m` as an import finds it: its first chunk's bits loaded into a new map.
    fn reloaded(m: &SpaceMap) -> SpaceMap {
        let mut n = SpaceMap::new(VdevId(0), m.size_bytes());
        let mut bits = vec![0u8; oxpool_format::SPACEMAP_CHUNK_PAYLOAD_BYTES];
        m.chunk_bits(0, &mut bits);
        n.load_chunk_bits(0, &bits);
        n.check_indexes();
        n
    }

    #[test]
    fn import_guesses_classes_from_the_bits() {
        let mut m = SpaceMap::new(VdevId(0), 8 * SLAB_BYTES);
        let mut ind = Vec::new();
        for _ in 0..SLAB_SECTORS / 8 {
            ind.push(m.alloc(8 * SECTOR_BYTES).unwrap());
        }
        let small = m.alloc(SECTOR_BYTES).unwrap();
        let log = m.alloc(17 * SECTOR_BYTES).unwrap();
        m.free(&ind[3]);
        let n = reloaded(&m);
        let slab = |d: &Dva| (d.offset_bytes / SLAB_BYTES) as usize;
        assert_eq!(n.class[slab(&ind[0])], 3, "a slab of 8-sector blocks");
        assert_eq!(n.class[slab(&small)], 0);
        assert_eq!(
            n.class[slab(&log)],
            0,
            "one 17-sector block alone in its slab: too little to tell it from 4 KiB blocks"
        );
        // A full slab is decided by its first free.
        let mut full = SpaceMap::new(VdevId(0), 2 * SLAB_BYTES);
        let blocks: Vec<_> = (0..4)
            .map(|_| full.alloc(16 * SECTOR_BYTES).unwrap())
            .collect();
        let mut f = reloaded(&full);
        assert_eq!(f.class[0], UNDECIDED);
        f.free(&blocks[1]);
        assert_eq!(f.class[0], 4);
        f.check_indexes();
        assert_eq!(f.alloc(16 * SECTOR_BYTES).unwrap(), blocks[1]);
    }

    /// Blocks smaller than their slots (a raidz block's allocated size, a compressed block)
    /// keep their class across an import, so the space they free serves their class again;
    /// smaller blocks that only look like prefixes of larger slots keep theirs.
    #[test]
    fn import_keeps_the_class_of_blocks_smaller_than_their_slots() {
        let mut m = SpaceMap::new(VdevId(0), 4 * SLAB_BYTES);
        // Nine-sector blocks (a 16 KiB block on a 5-wide raidz2), 16-sector slots.
        let nines: Vec<Dva> = (0..8).map(|_| m.alloc(9 * SECTOR_BYTES).unwrap()).collect();
        m.free(&nines[2]);
        // Four-sector blocks with every other one freed: 4 of each 8 sectors set.
        let fours: Vec<Dva> = (0..16)
            .map(|_| m.alloc(4 * SECTOR_BYTES).unwrap())
            .collect();
        for d in fours.iter().step_by(2) {
            m.free(d);
        }
        let mut n = reloaded(&m);
        let slab = |d: &Dva| (d.offset_bytes / SLAB_BYTES) as usize;
        assert_ne!(slab(&nines[0]), slab(&fours[0]));
        assert_eq!(
            n.class[slab(&nines[0])],
            4,
            "9-sector blocks in 16-sector slots"
        );
        assert_eq!(n.class[slab(&fours[1])], 2, "4-sector blocks, half freed");
        // What a nine frees is a 16-sector slot again: another nine takes it.
        n.free(&nines[5]);
        let space = n.free_slot_bytes();
        assert_eq!(space.0[4], 2 * 16 * SECTOR_BYTES, "{space:?}");
        assert_eq!(space.0[2], 8 * 4 * SECTOR_BYTES, "{space:?}");
        assert_eq!(space.0[0], 0, "{space:?}");
        let again = n.alloc(9 * SECTOR_BYTES).unwrap();
        assert_eq!(slab(&again), slab(&nines[0]));
        n.check_indexes();
    }

    /// 4 KiB slabs keep their class where a few holes only look like blocks smaller than a
    /// larger slot: a full slab whose first free ends a slot, a slab filled sequentially to
    /// just past half a slot.
    #[test]
    fn four_kib_slabs_stay_four_kib_slabs() {
        let mut m = SpaceMap::new(VdevId(0), 2 * SLAB_BYTES);
        let ones: Vec<Dva> = (0..SLAB_SECTORS)
            .map(|_| m.alloc(SECTOR_BYTES).unwrap())
            .collect();
        let mut n = reloaded(&m);
        assert_eq!(n.class[0], UNDECIDED);
        n.free(&ones[63]);
        assert_eq!(n.class[0], 0, "a full slab, its last sector freed");
        n.free(&ones[3]);
        n.free(&ones[7]);
        let n = reloaded(&n);
        assert_eq!(n.class[0], 0, "holes ending 4-sector slots");
        let mut t = SpaceMap::new(VdevId(0), 2 * SLAB_BYTES);
        for _ in 0..41 {
            t.alloc(SECTOR_BYTES).unwrap();
        }
        assert_eq!(reloaded(&t).class[0], 0, "41 sectors filled in order");
    }

    #[test]
    fn copies_fall_back_to_one_vdev_when_the_others_are_full() {
        let mut a = Allocator::new(&[SLAB_BYTES, 4 * SLAB_BYTES]);
        // Fill vdev 0.
        while a.maps[0].alloc(SLAB_BYTES).is_some() {}
        for _ in 0..8 {
            let d = a.alloc(8 * SECTOR_BYTES, 2).unwrap();
            assert!(d.iter().all(|x| x.vdev.0 == 1));
        }
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
        n.check_indexes();
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

    /// A block whose class has no free slot takes the start of a larger class's free slot
    /// rather than fail (the sync's last resort); freeing it gives the whole slot back. A
    /// larger class never borrows a smaller one's slots.
    #[test]
    fn a_block_with_no_slot_of_its_class_borrows_a_larger_one() {
        let slabs = 8;
        let mut a = Allocator::new(&[slabs * SLAB_BYTES]);
        let slot = 16 * SECTOR_BYTES; // class 4: four slots a slab
        let all: Vec<Dva> = (0..slabs * 4)
            .map(|_| a.alloc(slot, 1).unwrap()[0])
            .collect();
        for d in all.iter().step_by(2) {
            a.free(d);
        }
        let space = a.space();
        assert_eq!(space.empty_bytes, 0);
        assert_eq!(space.free_slots.0[4], slabs * 2 * slot);
        let borrow = |a: &mut Allocator, sectors: u64| {
            a.map_mut(VdevId(0))
                .alloc_placed(sectors * SECTOR_BYTES, Placement::Borrow(u8::MAX))
        };
        let small = borrow(&mut a, 1).expect("a 4 KiB block in a 64 KiB slot");
        let mid = borrow(&mut a, 8).expect("a 32 KiB block in a 64 KiB slot");
        for d in [small, mid] {
            assert_eq!(d.offset_bytes % slot, 0, "{d:?} at the start of a slot");
            assert!(all
                .iter()
                .step_by(2)
                .any(|f| f.offset_bytes == d.offset_bytes));
        }
        assert_eq!(a.space().free_slots.0[4], (slabs * 2 - 2) * slot);
        a.map(VdevId(0)).check_indexes();
        a.free(&small);
        a.free(&mid);
        assert_eq!(a.space().free_slots.0[4], slabs * 2 * slot);
        a.map(VdevId(0)).check_indexes();
        assert!(a.alloc(32 * SECTOR_BYTES, 1).is_none());
    }

    /// A class short of free slots gets whole slabs of a larger class with slots to spare,
    /// the sparsest first, and never more than the larger class's own need leaves: then the
    /// blocks fit in their own class's slots, as `fits` promised.
    #[test]
    fn a_class_short_of_slots_gets_slabs_a_larger_class_can_spare() {
        let slabs = 8;
        let mut a = Allocator::new(&[slabs * SLAB_BYTES]);
        let slot = 16 * SECTOR_BYTES;
        let all: Vec<Dva> = (0..slabs * 4)
            .map(|_| a.alloc(slot, 1).unwrap()[0])
            .collect();
        // Slab 0 keeps one block of four, the others two.
        for (i, d) in all.iter().enumerate() {
            if i % 2 == 0 || i == 1 {
                a.free(d);
            }
        }
        let free4 = a.space().free_slots.0[4];
        assert_eq!(free4, (slabs * 2 + 1) * slot);
        let mut need = ClassBytes::default();
        need.add_blocks(SECTOR_BYTES, 1, 60);
        need.add_blocks(slot, 1, 12);
        assert!(
            !a.fits(&need, Reserve::default()),
            "no 4 KiB slot, no empty slab"
        );
        assert!(a.make_room(&need, Reserve::default()));
        let space = a.space();
        // Slab 0 (three free slots, 48 sectors) went first, then one slab of two (32).
        assert_eq!(space.free_slots.0[0], 80 * SECTOR_BYTES);
        assert_eq!(space.free_slots.0[4], free4 - 5 * slot);
        assert!(
            space.free_slots.0[4] >= 12 * slot,
            "class 4 keeps what it needs"
        );
        a.map(VdevId(0)).check_indexes();
        for _ in 0..60 {
            let d = a
                .alloc_with(SECTOR_BYTES, 1, false, &floor(u64::MAX))
                .unwrap()[0];
            assert!(
                d.offset_bytes < 2 * SLAB_BYTES,
                "{d:?} in a slab given away"
            );
        }
        for _ in 0..12 {
            a.alloc_with(slot, 1, false, &floor(u64::MAX)).unwrap();
        }
        // The live 64 KiB block in slab 0 comes back as 4 KiB slots.
        let before = a.space().free_slots.0[0];
        a.free(&all[3]);
        assert_eq!(a.space().free_slots.0[0], before + slot);
        a.map(VdevId(0)).check_indexes();
        // A need the larger class cannot spare for is refused, and nothing is given: one
        // free 64 KiB slot (in slab 2), needed by a 64 KiB block.
        a.free(&all[9]);
        let mut need = ClassBytes::default();
        need.add_blocks(
            SECTOR_BYTES,
            1,
            a.space().free_slots.0[0] / SECTOR_BYTES + 1,
        );
        need.add_blocks(slot, 1, 1);
        let before = a.space();
        assert_eq!(before.free_slots.0[4], slot);
        assert!(!a.make_room(&need, Reserve::default()));
        assert_eq!(a.space(), before);
    }

    /// A floor of empty slabs and no pending need.
    fn floor(empty_bytes: u64) -> Keep {
        Keep {
            empty_bytes,
            need: ClassBytes::default(),
        }
    }

    /// The review's case (2026-11-30): blocks of a small class with no slot of their own
    /// placed first, near the floor, while a larger class's free slots are just what its own
    /// pending blocks need. The small blocks must take empty slabs down to the floor, not
    /// the larger class's slots, or the larger blocks find neither (the sync fails).
    #[test]
    fn borrowing_never_takes_slots_a_larger_class_needs() {
        let slabs = 16;
        let mut a = Allocator::new(&[slabs * SLAB_BYTES]);
        let slot = 16 * SECTOR_BYTES;
        // 12 slabs of 64 KiB blocks, half of them freed: 24 free 64 KiB slots; 4 empty slabs.
        let big: Vec<Dva> = (0..12 * 4).map(|_| a.alloc(slot, 1).unwrap()[0]).collect();
        for d in big.iter().step_by(2) {
            a.free(d);
        }
        let mut need = ClassBytes::default();
        need.add_blocks(slot, 1, 24);
        need.add_blocks(SECTOR_BYTES, 1, 128);
        let reserve = Reserve {
            empty_bytes: 2 * SLAB_BYTES,
            slots_bytes: 0,
        };
        assert!(a.fits(&need, reserve));
        let keep = Keep {
            empty_bytes: reserve.empty_bytes,
            need,
        };
        for i in 0..128 {
            a.alloc_with(SECTOR_BYTES, 1, false, &keep)
                .unwrap_or_else(|| panic!("4 KiB block {i}"));
        }
        assert_eq!(
            a.space().empty_bytes,
            reserve.empty_bytes,
            "down to the floor"
        );
        // Then blocks nobody charged (space-map chunks): no 4 KiB slot is left, and the
        // 64 KiB slots are all needed, so they take an empty slab of the reserve.
        for i in 0..8 {
            a.alloc_with(SECTOR_BYTES, 1, false, &keep)
                .unwrap_or_else(|| panic!("uncharged block {i}"));
        }
        for i in 0..24 {
            a.alloc_with(slot, 1, false, &keep)
                .unwrap_or_else(|| panic!("64 KiB block {i}"));
        }
        // Borrowing the needed slots would have sent eight 64 KiB blocks to the reserve's
        // last slabs (and with less reserve, the sync to ENOSPC).
        assert_eq!(a.space().empty_bytes, reserve.empty_bytes - SLAB_BYTES);
        a.map(VdevId(0)).check_indexes();
    }

    /// Above the floor (the txg sync's reserve) a block with no slot of its class takes an
    /// empty slab; at or below it, a slab given by a larger class with slots to spare
    /// first (and the next blocks of its class find slots there), the empty slab only
    /// without one.
    #[test]
    fn below_the_floor_a_block_gets_a_spare_slab_before_an_empty_one() {
        let slot = 16 * SECTOR_BYTES;
        let setup = || {
            let mut a = Allocator::new(&[3 * SLAB_BYTES]);
            let full: Vec<Dva> = (0..8).map(|_| a.alloc(slot, 1).unwrap()[0]).collect();
            a.free(&full[1]);
            assert_eq!(a.space().empty_bytes, SLAB_BYTES);
            (a, full)
        };
        let (mut a, full) = setup();
        let given = a
            .alloc_with(SECTOR_BYTES, 1, false, &floor(SLAB_BYTES))
            .unwrap()[0];
        assert_eq!(given.offset_bytes, full[1].offset_bytes);
        assert_eq!(a.space().empty_bytes, SLAB_BYTES, "the empty slab is kept");
        // The slab was given whole: the next block finds a slot of its own class there.
        let below = a
            .alloc_with(SECTOR_BYTES, 1, false, &floor(SLAB_BYTES))
            .unwrap()[0];
        assert_eq!(below.offset_bytes, full[1].offset_bytes + SECTOR_BYTES);
        assert_eq!(
            a.space().empty_bytes,
            SLAB_BYTES,
            "the empty slab is still kept"
        );
        a.map(VdevId(0)).check_indexes();
        a.free(&below);
        a.free(&given);
        let (mut a, _) = setup();
        let above = a
            .alloc_with(SECTOR_BYTES, 1, false, &Keep::default())
            .unwrap()[0];
        assert_eq!(
            above.offset_bytes,
            2 * SLAB_BYTES,
            "above the floor: the empty slab"
        );
        a.map(VdevId(0)).check_indexes();
    }

    proptest! {
        /// The map agrees with a model set of sectors under random alloc (in a slot of its
        /// class or an empty slab, or borrowing a larger class's slot), free, and slabs given
        /// to smaller classes.
        #[test]
        fn map_matches_model(ops in proptest::collection::vec((0u8..5, 1u64..=64), 1..300)) {
            let mut m = SpaceMap::new(VdevId(0), 300 * SECTOR_BYTES);
            let mut live: Vec<Dva> = Vec::new();
            for (op, n) in ops {
                if op == 4 {
                    // Give a slab of a larger class to a smaller one, as make_room does.
                    let from = (n as usize % (CLASSES - 1)) + 1;
                    let to = (n as usize / CLASSES) % from;
                    let bytes_max = (n % 3 + 1) * 16 * SECTOR_BYTES;
                    if let Some((slab, bytes)) = m.slab_to_give(from, bytes_max) {
                        prop_assert!(bytes <= bytes_max);
                        m.give_slab(slab, to);
                    }
                } else if op < 2 || live.is_empty() {
                    let placement = match op {
                        1 => Placement::Borrow(u8::MAX),
                        _ => Placement::SlotFirst,
                    };
                    if let Some(d) = m.alloc_placed(n * SECTOR_BYTES, placement) {
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
                // The indexes (empty slabs, fill buckets, free-slot counts) after every step.
                m.check_indexes();
            }
        }
    }
}
