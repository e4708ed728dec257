//! [`HugePageArena`]: the memory of block-sized I/O buffers, carved from 2 MiB chunks of one
//! reserved address range that the kernel may back with transparent huge pages.
//!
//! Why: every O_DIRECT write pins its buffer's pages for the time of the write, page by page
//! on a 4 KiB-page heap. With 16 KiB blocks, pinning was 7-9 % of a sequential-write server's
//! CPU (issue 19, `gup_fast_fallback` in the txg sync); with the blocks on a huge page the
//! kernel pins a whole 2 MiB folio at once (2.2-2.6 %), and the copy of a request into its blocks
//! takes fewer TLB misses.
//!
//! Layout: the range is cut into chunks of [`CHUNK_BYTES`]. A chunk in use serves one slot
//! size (a multiple of 4096 up to 128 KiB); its free slots are a bitmap, so free memory is
//! never written to. A chunk whose last slot is released gives its memory back to the kernel
//! (`MADV_FREE`: taken when the kernel needs it, kept and reused at no cost until then) and
//! goes to the list of empty chunks, from which any slot size takes it again. Nothing is
//! allocated after the arena is made: the chunk table is sized for the whole range up front
//! (80 bytes per 2 MiB), and the lists run through it.
//!
//! Never-used chunks are taken in index order, so a server's warmer thread
//! ([`HugePageArena::start_warmer`]) can map them before they are needed: a first touch
//! zeroes 2 MiB (and on a VM may make the host back them, milliseconds), which the thread
//! touching it otherwise takes, a reactor with every request on it waiting.
//!
//! A slot's bytes are not stable until written: a chunk given back with `MADV_FREE` reads as
//! its old bytes or as zeros, and may turn from one to the other at any moment until it is
//! written. Users write every byte of a slot before they read it (`IoBuf` counts arena
//! memory as uninitialised until then).
//!
//! Under strict overcommit (`vm.overcommit_memory = 2`) the kernel ignores `MAP_NORESERVE`
//! and would charge the whole range against the commit limit at once, so the process makes
//! no arena there and its buffers come from the system allocator.

use std::ptr::NonNull;
use std::sync::{Condvar, Mutex};

/// Bytes of one chunk: the size of a huge page on x86-64 and of a PMD-mapped one on arm64
/// with 4 KiB pages.
pub(crate) const CHUNK_BYTES: usize = 2 << 20;

/// Slot sizes are multiples of this, so that every slot is page-aligned (O_DIRECT).
const SLOT_UNIT_BYTES: usize = 4096;

/// Chunks the warmer keeps mapped beyond the last chunk the arena has taken into use (32
/// MiB), so that the I/O path does not take the first-touch fault of a new chunk itself
/// while the arena grows more slowly than the warmer maps. A first touch of a huge page
/// zeroes 2 MiB, and on this project's VM also makes the host back it: 7.6 ms per chunk in
/// the median (issue 19: each stalled a reactor and every request on it, the write tail at
/// iodepth 16). The arena grew by about 19 chunks a second while the data cache filled
/// under 4K writes at iodepth 16, and the warmer maps about 130 a second there.
const WARM_AHEAD_CHUNKS: u32 = 16;

/// Largest slot: the largest block.
pub(crate) const SLOT_MAX_BYTES: usize = 128 * 1024;

/// Slot sizes served: 4 KiB, 8 KiB, ... 128 KiB.
const CLASS_COUNT: usize = SLOT_MAX_BYTES / SLOT_UNIT_BYTES;

/// Most slots in a chunk (of the smallest size).
const SLOTS_PER_CHUNK_MAX: usize = CHUNK_BYTES / SLOT_UNIT_BYTES;

/// Words of a chunk's free-slot bitmap.
const FREE_WORDS: usize = SLOTS_PER_CHUNK_MAX / 64;

/// Largest range the process arena reserves (64 GiB): beyond it, buffers come from the
/// system allocator.
const PROCESS_RESERVE_BYTES_MAX: usize = 64 << 30;

/// A chunk's place in the range and in the chunk table: chunk `i` starts `i * CHUNK_BYTES`
/// after the range's start. The lists of chunks run through the table by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChunkIndex(u32);

impl ChunkIndex {
    /// End of a list of chunks.
    const NONE: ChunkIndex = ChunkIndex(u32::MAX);

    fn get(self) -> usize {
        self.0 as usize
    }
}

/// What the arena knows of one chunk. Guarded by the arena's lock.
#[derive(Clone, Copy)]
struct Chunk {
    /// Slot size class (`slot bytes / 4096 - 1`) while the chunk is in use.
    class: u8,
    /// Slots handed out and not released.
    live_slots: u16,
    /// Bit `i` set: slot `i` is free.
    free: [u64; FREE_WORDS],
    /// Neighbours in the list the chunk is on (its class's chunks with a free slot, or the
    /// empty chunks); `NONE` at the ends and when the chunk is full.
    prev: ChunkIndex,
    next: ChunkIndex,
}

impl Chunk {
    const EMPTY: Chunk = Chunk {
        class: 0,
        live_slots: 0,
        free: [0; FREE_WORDS],
        prev: ChunkIndex::NONE,
        next: ChunkIndex::NONE,
    };

    /// Takes the lowest free slot, if any.
    fn take_slot(&mut self) -> Option<usize> {
        for (word_index, word) in self.free.iter_mut().enumerate() {
            if *word != 0 {
                let bit = word.trailing_zeros() as usize;
                *word &= !(1u64 << bit);
                self.live_slots += 1;
                return Some(word_index * 64 + bit);
            }
        }
        None
    }

    fn has_free_slot(&self) -> bool {
        self.free.iter().any(|&word| word != 0)
    }
}

/// Slots of `class`'s size in one chunk.
fn slots_per_chunk(class: usize) -> usize {
    CHUNK_BYTES / slot_bytes(class)
}

fn slot_bytes(class: usize) -> usize {
    (class + 1) * SLOT_UNIT_BYTES
}

/// The class serving buffers of `len` bytes, if the arena serves that length.
fn class_of(len: usize) -> Option<usize> {
    (len != 0 && len <= SLOT_MAX_BYTES).then(|| len.div_ceil(SLOT_UNIT_BYTES) - 1)
}

/// The arena's lists and chunk table.
struct State {
    chunks: Vec<Chunk>,
    /// Chunks never used yet: `next_unused..chunks.len()`.
    next_unused: u32,
    /// Head of each class's list of chunks that have a free slot.
    with_free_slot: [ChunkIndex; CLASS_COUNT],
    /// Head of the list of empty chunks (their memory given back with `MADV_FREE`).
    empty: ChunkIndex,
    /// Chunks whose memory was given back, over the arena's life.
    chunks_released: u64,
    /// Chunks below this one are mapped: by the warmer, or by their users (every chunk below
    /// `next_unused` was). Memory the kernel took back from an empty chunk under pressure is
    /// not tracked: its next user maps it again.
    warmed_until: u32,
    /// The warmer maps at least the chunks below this one (a server's start).
    warm_floor: u32,
    /// Whether a warmer thread runs ([`HugePageArena::start_warmer`]); only then does the
    /// I/O path wake it.
    warmer_running: bool,
}

/// Page-aligned memory for I/O buffers of up to [`SLOT_MAX_BYTES`], in huge-page chunks of
/// one reserved range. See the module documentation.
pub(crate) struct HugePageArena {
    /// Start of the range, aligned to [`CHUNK_BYTES`].
    base: usize,
    /// Bytes of the range (whole chunks).
    range_bytes: usize,
    /// The mapping to unmap on drop: its start and length (the range plus alignment slack).
    mapping: (usize, usize),
    state: Mutex<State>,
    /// Wakes the warmer: the arena took a new chunk while the warmer was at most half of
    /// [`WARM_AHEAD_CHUNKS`] ahead, or the floor was raised.
    warm_wanted: Condvar,
}

impl HugePageArena {
    /// An arena of `range_bytes` (rounded down to whole chunks), or `None` if the range
    /// cannot be reserved. Reserving costs address space only: no memory is touched.
    pub(crate) fn new(range_bytes: usize) -> Option<HugePageArena> {
        let chunk_count = (range_bytes / CHUNK_BYTES).min(ChunkIndex::NONE.get() - 1);
        if chunk_count == 0 {
            return None;
        }
        let range_bytes = chunk_count * CHUNK_BYTES;
        // One chunk more than the range, so that an aligned start fits in it.
        let mapping_bytes = range_bytes + CHUNK_BYTES;
        // SAFETY: a new private anonymous mapping; no existing memory is affected.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapping_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return None;
        }
        let base = (mapping as usize).next_multiple_of(CHUNK_BYTES);
        // Huge pages where the kernel has them to give ("madvise" is Debian's default); an
        // error (THP compiled out) leaves ordinary pages, which work the same.
        // SAFETY: the range lies within the mapping made above.
        unsafe { libc::madvise(base as *mut libc::c_void, range_bytes, libc::MADV_HUGEPAGE) };
        Some(HugePageArena {
            base,
            range_bytes,
            mapping: (mapping as usize, mapping_bytes),
            state: Mutex::new(State {
                chunks: vec![Chunk::EMPTY; chunk_count],
                next_unused: 0,
                with_free_slot: [ChunkIndex::NONE; CLASS_COUNT],
                empty: ChunkIndex::NONE,
                chunks_released: 0,
                warmed_until: 0,
                warm_floor: 0,
                warmer_running: false,
            }),
            warm_wanted: Condvar::new(),
        })
    }

    /// The arena of the process, sized to the machine's memory (at most 64 GiB of address
    /// space), made on first use; `None` if it could not be.
    pub(crate) fn process() -> Option<&'static HugePageArena> {
        static ARENA: std::sync::OnceLock<Option<HugePageArena>> = std::sync::OnceLock::new();
        ARENA
            .get_or_init(|| {
                if crate::machine::overcommit_is_strict() {
                    return None;
                }
                HugePageArena::new(
                    crate::machine::memory_bytes_in_memory().min(PROCESS_RESERVE_BYTES_MAX),
                )
            })
            .as_ref()
    }

    /// Maps `chunk` as write faults would, without writing to it (`MADV_POPULATE_WRITE`:
    /// pages already there, and so their bytes, stay). EINVAL on a kernel before Linux
    /// 5.14; ENOMEM or EFAULT when the kernel gives up finding memory for it. Short of
    /// memory (in a memory cgroup at its limit, say) it reclaims first and may invoke the
    /// OOM killer, as any fault may. The process's `mmap_lock` is held (shared) for the
    /// whole chunk: an mmap or munmap elsewhere in the process waits for it.
    fn populate(&self, chunk: ChunkIndex) -> std::io::Result<()> {
        assert!((chunk.get() + 1) * CHUNK_BYTES <= self.range_bytes);
        // SAFETY: the chunk lies within the mapping, which outlives `self`'s borrow;
        // POPULATE_WRITE maps missing pages and writes no byte.
        let result = unsafe {
            libc::madvise(
                (self.base + chunk.get() * CHUNK_BYTES) as *mut libc::c_void,
                CHUNK_BYTES,
                libc::MADV_POPULATE_WRITE,
            )
        };
        match result {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Starts the warmer on a thread of its own unless one runs: it maps the chunks below
    /// `floor_bytes` first, then keeps up to [`WARM_AHEAD_CHUNKS`] mapped beyond the last
    /// chunk taken into use, for the life of the process, sleeping while at least half of
    /// them are. A running warmer gets the higher floor. The memory it maps stays the
    /// process's, as if used.
    pub(crate) fn start_warmer(&'static self, floor_bytes: usize) -> std::io::Result<()> {
        let floor = floor_bytes.min(self.range_bytes).div_ceil(CHUNK_BYTES) as u32;
        let start = {
            let mut state = self.lock();
            state.warm_floor = state.warm_floor.max(floor);
            !std::mem::replace(&mut state.warmer_running, true)
        };
        if !start {
            self.warm_wanted.notify_one();
            return Ok(());
        }
        let spawned = std::thread::Builder::new()
            .name("oxpool-warm".into())
            .spawn(move || self.run_warmer());
        if let Err(e) = spawned {
            self.lock().warmer_running = false;
            return Err(e);
        }
        Ok(())
    }

    /// The warmer thread's loop. Ends only on a kernel that cannot map ahead: the I/O path
    /// then maps chunks as it takes them, as without a warmer. A chunk it cannot map for
    /// want of memory is tried again a second later, or when the arena takes a new chunk.
    fn run_warmer(&self) {
        /// Clears `warmer_running` however the thread ends, a panic included: the I/O path
        /// then stops waking it, and a later `start_warmer` starts another.
        struct Stopped<'a>(&'a HugePageArena);
        impl Drop for Stopped<'_> {
            fn drop(&mut self) {
                let mut state = self
                    .0
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                state.warmer_running = false;
            }
        }
        let _stopped = Stopped(self);
        let mut failure_told = false;
        // Unbounded by design (the process's lifetime), but each round maps one chunk (at
        // most the range's count in all), or sleeps until woken, or a second after a
        // failure: it never spins.
        loop {
            let chunk = {
                let mut state = self.lock();
                // Once per wake-up, spurious ones included.
                loop {
                    if let Some(chunk) = state.warm_next() {
                        break chunk;
                    }
                    state = self
                        .warm_wanted
                        .wait(state)
                        .expect("the buffer arena's lock");
                }
            };
            match self.populate(chunk) {
                Ok(()) => {
                    let mut state = self.lock();
                    state.warmed_until = state.warmed_until.max(chunk.0 + 1);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!("buffer memory is not mapped ahead of use: {e}");
                    return;
                }
                Err(e) => {
                    if !std::mem::replace(&mut failure_told, true) {
                        tracing::warn!(
                            "buffer memory could not be mapped ahead of use ({e}); \
                             trying again"
                        );
                    }
                    let state = self.lock();
                    drop(
                        self.warm_wanted
                            .wait_timeout(state, std::time::Duration::from_secs(1))
                            .expect("the buffer arena's lock"),
                    );
                }
            }
        }
    }

    /// A slot for a buffer of `len` bytes (1 to 128 KiB), aligned to 4096, whose bytes must
    /// be written before they are read (see the module documentation); `None` if the arena
    /// does not serve `len` or its range is used up.
    pub(crate) fn allocate(&self, len: usize) -> Option<NonNull<u8>> {
        let class = class_of(len)?;
        let mut state = self.lock();
        let mut chunk = state.with_free_slot[class];
        let mut wake_warmer = false;
        if chunk == ChunkIndex::NONE {
            chunk = state.take_empty_chunk()?;
            wake_warmer = state.warmer_running && state.warmer_wanted();
            let slots = slots_per_chunk(class);
            let c = &mut state.chunks[chunk.get()];
            c.class = class as u8;
            c.live_slots = 0;
            c.free = [0; FREE_WORDS];
            for slot in 0..slots {
                c.free[slot / 64] |= 1 << (slot % 64);
            }
            state.push(ListHead::Class(class), chunk);
        }
        let c = &mut state.chunks[chunk.get()];
        debug_assert_eq!(c.class as usize, class);
        let slot = c
            .take_slot()
            .expect("a chunk on its class's list has a free slot");
        if !c.has_free_slot() {
            state.unlink(ListHead::Class(class), chunk);
        }
        drop(state);
        if wake_warmer {
            // Rare: once per chunk taken while the warmer is at most half way ahead.
            self.warm_wanted.notify_one();
        }
        let offset = chunk.get() * CHUNK_BYTES + slot * slot_bytes(class);
        debug_assert!(offset + slot_bytes(class) <= self.range_bytes);
        NonNull::new((self.base + offset) as *mut u8)
    }

    /// Takes back the slot of a buffer of `len` bytes at `ptr`: true if it was the arena's
    /// (then `ptr` must not be used again), false if `ptr` is not in the arena's range.
    pub(crate) fn release(&self, ptr: NonNull<u8>, len: usize) -> bool {
        let address = ptr.as_ptr() as usize;
        if address < self.base || address >= self.base + self.range_bytes {
            return false;
        }
        let offset = address - self.base;
        let chunk = ChunkIndex((offset / CHUNK_BYTES) as u32);
        let mut state = self.lock();
        let c = &mut state.chunks[chunk.get()];
        let class = c.class as usize;
        let slot_len = slot_bytes(class);
        let slot = (offset % CHUNK_BYTES) / slot_len;
        assert_eq!(
            Some(class),
            class_of(len),
            "a buffer released to a chunk of another size"
        );
        assert_eq!(
            offset % CHUNK_BYTES % slot_len,
            0,
            "a pointer inside a slot"
        );
        let bit = 1u64 << (slot % 64);
        assert_eq!(c.free[slot / 64] & bit, 0, "a slot released twice");
        assert!(c.live_slots > 0, "a slot released from an empty chunk");
        let was_full = !c.has_free_slot();
        c.free[slot / 64] |= bit;
        c.live_slots -= 1;
        let now_empty = c.live_slots == 0;
        if was_full {
            state.push(ListHead::Class(class), chunk);
        }
        if now_empty {
            state.unlink(ListHead::Class(class), chunk);
            // The memory goes back to the kernel, which frees it only when it needs it; a
            // write before then keeps it. Under the lock, so that nobody takes the chunk
            // before the advice is given (a few microseconds per 2 MiB).
            // SAFETY: the chunk lies within the mapping, and no buffer points into it.
            unsafe {
                libc::madvise(
                    (self.base + chunk.get() * CHUNK_BYTES) as *mut libc::c_void,
                    CHUNK_BYTES,
                    libc::MADV_FREE,
                )
            };
            state.chunks_released += 1;
            state.push(ListHead::Empty, chunk);
        }
        true
    }

    /// Chunks given back to the kernel so far.
    #[cfg(test)]
    fn chunks_released(&self) -> u64 {
        self.lock().chunks_released
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update of the state is completed before the lock is let go, except by a
        // failed assertion, after which the arena must not be used: a poisoned lock panics.
        self.state.lock().expect("the buffer arena's lock")
    }
}

impl Drop for HugePageArena {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the arena is gone, so no slot is in use (every
        // buffer releases its slot to the arena that made it, which outlives it).
        unsafe { libc::munmap(self.mapping.0 as *mut libc::c_void, self.mapping.1) };
    }
}

/// Which list of chunks.
#[derive(Clone, Copy)]
enum ListHead {
    Class(usize),
    Empty,
}

impl State {
    fn head(&mut self, list: ListHead) -> &mut ChunkIndex {
        match list {
            ListHead::Class(class) => &mut self.with_free_slot[class],
            ListHead::Empty => &mut self.empty,
        }
    }

    /// Puts `chunk` at the front of `list`.
    fn push(&mut self, list: ListHead, chunk: ChunkIndex) {
        let old = *self.head(list);
        self.chunks[chunk.get()].prev = ChunkIndex::NONE;
        self.chunks[chunk.get()].next = old;
        if old != ChunkIndex::NONE {
            self.chunks[old.get()].prev = chunk;
        }
        *self.head(list) = chunk;
    }

    /// Takes `chunk` out of `list`, which it is on.
    fn unlink(&mut self, list: ListHead, chunk: ChunkIndex) {
        let Chunk { prev, next, .. } = self.chunks[chunk.get()];
        if prev == ChunkIndex::NONE {
            debug_assert_eq!(*self.head(list), chunk);
            *self.head(list) = next;
        } else {
            self.chunks[prev.get()].next = next;
        }
        if next != ChunkIndex::NONE {
            self.chunks[next.get()].prev = prev;
        }
        self.chunks[chunk.get()].prev = ChunkIndex::NONE;
        self.chunks[chunk.get()].next = ChunkIndex::NONE;
    }

    /// The chunk up to which the warmer maps: its floor, or [`WARM_AHEAD_CHUNKS`] beyond the
    /// chunks taken into use, within the range.
    fn warm_target(&self) -> u32 {
        let ahead = self.next_unused.saturating_add(WARM_AHEAD_CHUNKS);
        ahead.max(self.warm_floor).min(self.chunks.len() as u32)
    }

    /// Whether the warmer should be woken: it is behind its target and at most half of
    /// [`WARM_AHEAD_CHUNKS`] ahead of use (so it is woken once per several chunks, and
    /// then maps up to its target).
    fn warmer_wanted(&self) -> bool {
        self.warmed_until < self.warm_target()
            && self.warmed_until <= self.next_unused.saturating_add(WARM_AHEAD_CHUNKS / 2)
    }

    /// The next chunk the warmer maps, or `None` at its target. Chunks taken into use were
    /// mapped by their users. (A warmer the arena has caught up with may map the chunk the
    /// arena takes next while the arena's user faults it: the kernel maps it once, and the
    /// fault waits no longer than it would have alone. Skipping that chunk instead made its
    /// user take the whole fault whenever the warmer had merely fallen behind.)
    fn warm_next(&mut self) -> Option<ChunkIndex> {
        self.warmed_until = self.warmed_until.max(self.next_unused);
        (self.warmed_until < self.warm_target()).then_some(ChunkIndex(self.warmed_until))
    }

    /// An empty chunk: one given back earlier, else one never used; `None` when the range
    /// is used up.
    fn take_empty_chunk(&mut self) -> Option<ChunkIndex> {
        let chunk = self.empty;
        if chunk != ChunkIndex::NONE {
            self.unlink(ListHead::Empty, chunk);
            return Some(chunk);
        }
        if (self.next_unused as usize) < self.chunks.len() {
            self.next_unused += 1;
            return Some(ChunkIndex(self.next_unused - 1));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena(chunks: usize) -> HugePageArena {
        HugePageArena::new(chunks * CHUNK_BYTES).expect("reserving a test range")
    }

    #[test]
    fn slots_are_aligned_distinct_and_hold_their_bytes() {
        let arena = arena(4);
        let mut taken = Vec::new();
        for len in [512, 4096, 5 * 1024 + 512, 16 * 1024, 128 * 1024] {
            for fill in 0..3u8 {
                let ptr = arena.allocate(len).expect("room in the arena");
                assert_eq!(ptr.as_ptr() as usize % 4096, 0);
                // SAFETY: a fresh slot of at least `len` bytes, used by nothing else.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), fill + 1, len) };
                taken.push((ptr, len, fill + 1));
            }
        }
        for &(ptr, len, fill) in &taken {
            // SAFETY: written above; no two slots overlap if every byte is still its own.
            let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
            assert!(
                bytes.iter().all(|&b| b == fill),
                "slots of {len} bytes overlap"
            );
        }
        for (ptr, len, _) in taken {
            assert!(arena.release(ptr, len));
        }
    }

    #[test]
    fn a_released_slot_is_taken_again() {
        let arena = arena(2);
        let first = arena.allocate(16 * 1024).unwrap();
        let second = arena.allocate(16 * 1024).unwrap();
        assert!(arena.release(first, 16 * 1024));
        assert_eq!(arena.allocate(16 * 1024), Some(first));
        assert!(arena.release(first, 16 * 1024));
        assert!(arena.release(second, 16 * 1024));
    }

    #[test]
    fn an_empty_chunk_goes_back_to_the_kernel_and_serves_another_size() {
        let arena = arena(1);
        // Fill the only chunk with 128 KiB slots: no room for anything else.
        let big: Vec<_> = (0..slots_per_chunk(class_of(128 * 1024).unwrap()))
            .map(|_| arena.allocate(128 * 1024).unwrap())
            .collect();
        assert_eq!(arena.allocate(128 * 1024), None, "the range is used up");
        assert_eq!(
            arena.allocate(4096),
            None,
            "a full chunk serves no other size"
        );
        let (last, rest) = big.split_last().unwrap();
        for &ptr in rest {
            assert!(arena.release(ptr, 128 * 1024));
        }
        assert_eq!(
            arena.chunks_released(),
            0,
            "a chunk with a live slot was released"
        );
        assert_eq!(arena.allocate(4096), None);
        assert!(arena.release(*last, 128 * 1024));
        assert_eq!(arena.chunks_released(), 1);
        // The emptied chunk now serves 4 KiB slots, all 512 of them.
        let small: Vec<_> = (0..512).map(|_| arena.allocate(4096).unwrap()).collect();
        assert_eq!(small[0].as_ptr() as usize, arena.base);
        assert_eq!(arena.allocate(4096), None);
        for ptr in small {
            assert!(arena.release(ptr, 4096));
        }
        assert_eq!(arena.chunks_released(), 2);
    }

    #[test]
    fn chunks_with_a_free_slot_are_found_after_others_fill() {
        let arena = arena(3);
        let per_chunk = slots_per_chunk(class_of(64 * 1024).unwrap());
        let slots: Vec<_> = (0..3 * per_chunk)
            .map(|_| arena.allocate(64 * 1024).unwrap())
            .collect();
        assert_eq!(arena.allocate(64 * 1024), None);
        // One slot freed in the first and in the last chunk: both are found again.
        let freed = [slots[0], slots[3 * per_chunk - 1]];
        for ptr in freed {
            assert!(arena.release(ptr, 64 * 1024));
        }
        let mut again = [
            arena.allocate(64 * 1024).unwrap(),
            arena.allocate(64 * 1024).unwrap(),
        ];
        again.sort();
        let mut expected = freed;
        expected.sort();
        assert_eq!(again, expected);
        assert_eq!(arena.allocate(64 * 1024), None);
    }

    #[test]
    fn a_chunk_emptied_in_the_middle_of_its_list_leaves_it_whole() {
        let arena = arena(3);
        let len = 64 * 1024;
        let per_chunk = slots_per_chunk(class_of(len).unwrap());
        let slots: Vec<_> = (0..3 * per_chunk)
            .map(|_| arena.allocate(len).unwrap())
            .collect();
        let chunk_of = |ptr: NonNull<u8>| (ptr.as_ptr() as usize - arena.base) / CHUNK_BYTES;
        // One slot freed in each chunk, the middle one second: the list is 2, 1, 0.
        for chunk in [0, 1, 2] {
            assert!(arena.release(slots[chunk * per_chunk], len));
        }
        // Chunk 1 empties: it leaves the middle of its size's list for the empty list.
        for &ptr in &slots[per_chunk + 1..2 * per_chunk] {
            assert!(arena.release(ptr, len));
        }
        assert_eq!(arena.chunks_released(), 1);
        // The list still holds chunks 2 and 0, whose free slots come first; then chunk 1,
        // from the empty list.
        let mut first = [arena.allocate(len).unwrap(), arena.allocate(len).unwrap()];
        first.sort();
        assert_eq!(first, [slots[0], slots[2 * per_chunk]]);
        let from_empty = arena.allocate(len).unwrap();
        assert_eq!(chunk_of(from_empty), 1);
    }

    #[test]
    fn memory_outside_the_range_or_of_unserved_lengths_is_not_the_arenas() {
        let arena = arena(1);
        let outside = Box::new([0u8; 64]);
        let ptr = NonNull::from(&outside[0]);
        assert!(!arena.release(ptr, 64));
        assert_eq!(arena.allocate(0), None);
        assert_eq!(arena.allocate(SLOT_MAX_BYTES + 1), None);
    }

    #[test]
    #[should_panic(expected = "a slot released twice")]
    fn a_slot_released_twice_is_caught() {
        let arena = arena(1);
        let a = arena.allocate(8192).unwrap();
        let _keep = arena.allocate(8192).unwrap();
        assert!(arena.release(a, 8192));
        arena.release(a, 8192);
    }

    /// Pages of chunk `chunk` the kernel has mapped (`mincore`).
    fn resident_pages(arena: &HugePageArena, chunk: usize) -> usize {
        let mut pages = vec![0u8; CHUNK_BYTES / 4096];
        // SAFETY: the chunk lies within the arena's mapping; `pages` has a byte per page.
        let result = unsafe {
            libc::mincore(
                (arena.base + chunk * CHUNK_BYTES) as *mut libc::c_void,
                CHUNK_BYTES,
                pages.as_mut_ptr(),
            )
        };
        assert_eq!(result, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().filter(|&&page| page & 1 != 0).count()
    }

    #[test]
    fn populating_maps_a_chunk_and_keeps_the_bytes_of_its_slots() {
        if !crate::machine::populate_write_supported() {
            println!("this kernel has no MADV_POPULATE_WRITE: nothing is mapped ahead");
            return;
        }
        let arena = arena(6);
        // Chunk 0 filled, written and given back (MADV_FREE), then a slot of it taken again
        // and written: populating must keep that slot's bytes.
        let slot_bytes = 128 * 1024;
        let all: Vec<_> = (0..CHUNK_BYTES / slot_bytes)
            .map(|_| arena.allocate(slot_bytes).unwrap())
            .collect();
        for &ptr in &all {
            // SAFETY: a fresh slot of `slot_bytes`, used by nothing else.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0xee, slot_bytes) };
        }
        for ptr in all {
            assert!(arena.release(ptr, slot_bytes));
        }
        assert_eq!(arena.chunks_released(), 1);
        let ptr = arena.allocate(64 * 1024).unwrap();
        assert_eq!(
            ptr.as_ptr() as usize,
            arena.base,
            "the chunk given back is taken again"
        );
        // SAFETY: a slot of 64 KiB, used by nothing else.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0x5a, 64 * 1024) };
        for chunk in 0..3 {
            arena.populate(ChunkIndex(chunk)).unwrap();
        }
        assert_mapped(&arena, 0..3, true);
        assert_mapped(&arena, 3..6, false);
        // SAFETY: the slot written above, still this test's.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), 64 * 1024) };
        assert!(
            bytes.iter().all(|&b| b == 0x5a),
            "populating changed a live buffer"
        );
        assert!(arena.release(ptr, 64 * 1024));
    }

    /// Waits until the warmer has mapped the chunks below `chunk` (a minute at most).
    fn wait_warmed(arena: &HugePageArena, chunk: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        // Bounded by the deadline.
        loop {
            let state = arena.lock();
            if state.warmed_until >= chunk {
                return;
            }
            assert!(state.warmer_running, "the warmer stopped");
            drop(state);
            assert!(
                std::time::Instant::now() < deadline,
                "the warmer mapped up to chunk {} in a minute, not {chunk}",
                arena.lock().warmed_until
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Asserts that each of `chunks` is wholly resident (`mapped`) or not at all.
    fn assert_mapped(arena: &HugePageArena, chunks: std::ops::Range<usize>, mapped: bool) {
        for chunk in chunks {
            let pages = resident_pages(arena, chunk);
            if mapped {
                assert_eq!(pages, CHUNK_BYTES / 4096, "chunk {chunk} was not mapped");
            } else {
                assert_eq!(pages, 0, "chunk {chunk} was mapped");
            }
        }
    }

    #[test]
    fn the_warmers_target_and_wake_ups_follow_use() {
        let arena = arena(40);
        let mut state = arena.lock();
        // (floor, next unused, warmed until) -> (target, woken, next chunk to map, warmed
        // until after the choice)
        let cases = [
            ((0, 0, 0), (16, true, Some(0), 0)),
            ((0, 10, 5), (26, true, Some(10), 10)),
            ((0, 10, 26), (26, false, None, 26)),
            ((0, 17, 26), (33, false, Some(26), 26)),
            ((0, 18, 26), (34, true, Some(26), 26)),
            ((30, 2, 20), (30, false, Some(20), 20)),
            ((100, 2, 20), (40, false, Some(20), 20)),
            ((0, 40, 38), (40, true, None, 40)),
            ((0, 40, 40), (40, false, None, 40)),
        ];
        for ((floor, next, warmed), (target, woken, chunk, after)) in cases {
            state.warm_floor = floor;
            state.next_unused = next;
            state.warmed_until = warmed;
            let case = format!("floor {floor}, next unused {next}, warmed until {warmed}");
            assert_eq!(state.warm_target(), target, "target, {case}");
            assert_eq!(state.warmer_wanted(), woken, "woken, {case}");
            assert_eq!(state.warm_next().map(|c| c.0), chunk, "next chunk, {case}");
            assert_eq!(state.warmed_until, after, "warmed until, {case}");
        }
        state.next_unused = 0;
    }

    #[test]
    fn the_warmer_maps_its_floor_then_stays_ahead_of_use() {
        if !crate::machine::populate_write_supported() {
            println!("this kernel has no MADV_POPULATE_WRITE: there is no warmer to check");
            return;
        }
        const CHUNKS: usize = 40;
        // Leaked, with its 80 MiB of address space: the warmer thread uses the arena for
        // the process's life, and sleeps once this test is done.
        let arena: &'static HugePageArena = Box::leak(Box::new(arena(CHUNKS)));
        // Chunk 0 taken into use before the warmer starts (and not checked below: how much
        // of it is resident depends on whether its first touch got a huge page).
        let ptr = arena.allocate(64 * 1024).unwrap();
        // SAFETY: a slot of 64 KiB, used by nothing else.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0x5a, 64 * 1024) };
        // Twenty chunks and a byte: a floor of 21 chunks, beyond the 1 + 16 ahead of use.
        arena.start_warmer(20 * CHUNK_BYTES + 1).unwrap();
        wait_warmed(arena, 21);
        assert_mapped(arena, 1..21, true);
        assert_mapped(arena, 21..CHUNKS, false);
        // Chunks 1 to 12 taken into use (untouched by this test): taking chunk 12 leaves the
        // warmer 8 ahead, half of 16, which wakes it (no chunk before did), and it maps up to
        // 16 beyond them, and no further.
        let slot_bytes = 128 * 1024;
        let per_chunk = CHUNK_BYTES / slot_bytes;
        let mut taken: Vec<_> = (0..12 * per_chunk)
            .map(|_| arena.allocate(slot_bytes).unwrap())
            .collect();
        assert_eq!(arena.lock().next_unused, 13);
        wait_warmed(arena, 13 + WARM_AHEAD_CHUNKS);
        assert_mapped(arena, 21..29, true);
        assert_mapped(arena, 29..CHUNKS, false);
        // Up to the range's end: the warmer stops there.
        taken.extend((0..(CHUNKS - 13) * per_chunk).map(|_| arena.allocate(slot_bytes).unwrap()));
        assert!(arena.allocate(slot_bytes).is_none(), "the range is used up");
        wait_warmed(arena, CHUNKS as u32);
        assert_eq!(arena.lock().warmed_until, CHUNKS as u32);
        assert!(arena.lock().warmer_running);
        for p in taken {
            assert!(arena.release(p, slot_bytes));
        }
        assert!(arena.release(ptr, 64 * 1024));
    }

    #[test]
    fn the_range_is_advised_for_huge_pages() {
        let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if enabled.is_empty() || enabled.contains("[never]") {
            println!("transparent huge pages are off here ({enabled:?}): nothing to check");
            return;
        }
        let arena = arena(2);
        let ptr = arena.allocate(128 * 1024).unwrap();
        // SAFETY: a slot of 128 KiB; touching it maps the chunk.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 1, 128 * 1024) };
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", arena.base);
        let entry = smaps
            .split_inclusive('\n')
            .skip_while(|line| !line.starts_with(&start))
            .take_while(|line| !line.starts_with("VmFlags"))
            .collect::<String>();
        assert!(!entry.is_empty(), "the arena's mapping is not in smaps");
        let eligible = entry
            .lines()
            .find_map(|line| line.strip_prefix("THPeligible:"))
            .map(str::trim);
        assert_eq!(
            eligible,
            Some("1"),
            "the arena is not eligible for huge pages:\n{entry}"
        );
        assert!(arena.release(ptr, 128 * 1024));
    }
}
