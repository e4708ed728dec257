//! [`IoBuf`]: the owned, page-aligned buffer every I/O moves in and out of.
//!
//! Allocations of block-sized buffers are recycled through a process-wide free list (the
//! pool): a dropped buffer of a pooled length goes back to the pool, and the next buffer of
//! that length comes from it, so steady-state I/O makes no heap allocation. The pool is shared
//! by every thread because buffers often die on another thread than the one that made them (a
//! dirty block is made by the writer and dropped by the txg sync).

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::arena::HugePageArena;

/// Alignment of every [`IoBuf`] allocation. 4096 covers O_DIRECT on every filesystem and block
/// device we target (`statx` reports 512 or 4096 as `dio_mem_align`).
pub const IO_BUF_ALIGN_BYTES: usize = 4096;

/// Most bytes of free buffers the pool keeps, all lengths together, beyond what live
/// [`PoolReservation`]s add. A buffer dropped while the pool is full is freed. Part of the
/// process's fixed memory (docs/memory.md).
pub const IO_BUF_POOL_BYTES_MAX: usize = 16 << 20;

/// Most block-buffer memory a server maps at start ([`IoBuf::warm_default_bytes`]).
pub const IO_BUF_WARM_BYTES_MAX: usize = 128 << 20;

/// Pooled lengths are multiples of this (the sector size, which every block size is).
const POOL_CLASS_BYTES: usize = 512;

/// Longest pooled buffer: the largest block (128 KiB). Longer buffers are rare and large, and
/// get lazily-zeroed pages from the system allocator instead.
const POOLED_LEN_MAX_BYTES: usize = 128 * 1024;

/// One free list per pooled length.
const POOL_CLASS_COUNT: usize = POOLED_LEN_MAX_BYTES / POOL_CLASS_BYTES;

/// A free allocation held by the pool.
struct FreeAllocation(NonNull<u8>);

// SAFETY: the pool owns the allocation exclusively; nothing else points to it.
unsafe impl Send for FreeAllocation {}

/// Free lists by length class (`len / POOL_CLASS_BYTES - 1`). Each holds allocations of exactly
/// that length. A list only grows when the pool reaches a new high-water mark, so in steady
/// state pushing allocates nothing; all lists together hold at most `IO_BUF_POOL_BYTES_MAX`.
static POOL: [Mutex<Vec<FreeAllocation>>; POOL_CLASS_COUNT] =
    [const { Mutex::new(Vec::new()) }; POOL_CLASS_COUNT];

/// Bytes of free allocations in `POOL` (at most `POOL_LIMIT_BYTES`).
static POOLED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The pool's bound: `IO_BUF_POOL_BYTES_MAX` plus the bytes of every live
/// [`PoolReservation`].
static POOL_LIMIT_BYTES: AtomicUsize = AtomicUsize::new(IO_BUF_POOL_BYTES_MAX);

/// While it lives, the pool keeps up to this many more bytes of free buffers
/// ([`IoBuf::reserve_pool`]); when it drops, the pool frees what is above its bound again.
#[must_use = "the reservation ends when it is dropped"]
#[derive(Debug)]
pub struct PoolReservation {
    bytes: usize,
}

impl Drop for PoolReservation {
    fn drop(&mut self) {
        POOL_LIMIT_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
        trim_pool();
    }
}

/// Frees pooled allocations until the pool is within its bound (largest lengths first).
fn trim_pool() {
    for (i, class) in POOL.iter().enumerate().rev() {
        let len = (i + 1) * POOL_CLASS_BYTES;
        // Bounded by the class's list, which only shrinks here.
        while POOLED_BYTES.load(Ordering::Relaxed) > POOL_LIMIT_BYTES.load(Ordering::Relaxed) {
            let Some(FreeAllocation(ptr)) = lock_class(class).pop() else {
                break;
            };
            POOLED_BYTES.fetch_sub(len, Ordering::Relaxed);
            // SAFETY: a pooled allocation of exactly `len` bytes, made by `new_allocation`,
            // owned by the pool alone and removed from it above.
            unsafe { free_allocation(ptr, len) }
        }
    }
}

/// New memory for a buffer of `len` (non-zero) bytes, aligned to [`IO_BUF_ALIGN_BYTES`],
/// zero-filled if `zeroed`; the second value is whether its bytes are initialised, which is
/// exactly when `zeroed`.
///
/// Block-sized lengths (those the pool keeps) come from the huge-page arena, other lengths,
/// and block-sized ones once the arena's range is used up, from the system allocator
/// (`alloc_zeroed` lets pages never touched cost nothing until they are). Memory from the
/// arena counts as not initialised either: a chunk it gave back with `MADV_FREE` reads as its
/// old bytes or as zeros, and may turn from one to the other until it is written, so every
/// byte must be written (zeroed, copied or received into) before anything reads it.
fn new_allocation(len: usize, zeroed: bool) -> (NonNull<u8>, bool) {
    debug_assert_ne!(len, 0);
    if pool_class(len).is_some() {
        if let Some(ptr) = HugePageArena::process().and_then(|arena| arena.allocate(len)) {
            if zeroed {
                // SAFETY: the slot holds at least `len` bytes and only this buffer uses it.
                unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
            }
            return (ptr, zeroed);
        }
    }
    let layout = IoBuf::layout(len);
    // SAFETY: `layout` has a non-zero size.
    let raw = unsafe {
        if zeroed {
            alloc::alloc_zeroed(layout)
        } else {
            alloc::alloc(layout)
        }
    };
    let Some(ptr) = NonNull::new(raw) else {
        alloc::handle_alloc_error(layout)
    };
    debug_assert_eq!(ptr.as_ptr() as usize % IO_BUF_ALIGN_BYTES, 0);
    (ptr, zeroed)
}

/// Frees memory made by [`new_allocation`].
///
/// # Safety
///
/// `ptr` came from `new_allocation(len, _)` with this `len`, is not freed yet, and is not
/// used afterwards.
unsafe fn free_allocation(ptr: NonNull<u8>, len: usize) {
    if HugePageArena::process().is_some_and(|arena| arena.release(ptr, len)) {
        return;
    }
    // SAFETY: by the caller, an allocation of the system allocator with this layout.
    unsafe { alloc::dealloc(ptr.as_ptr(), IoBuf::layout(len)) }
}

/// The pool's free list for buffers of `len` bytes, if that length is pooled.
fn pool_class(len: usize) -> Option<&'static Mutex<Vec<FreeAllocation>>> {
    if len == 0 || len > POOLED_LEN_MAX_BYTES || !len.is_multiple_of(POOL_CLASS_BYTES) {
        return None;
    }
    Some(&POOL[len / POOL_CLASS_BYTES - 1])
}

fn lock_class(
    class: &Mutex<Vec<FreeAllocation>>,
) -> std::sync::MutexGuard<'_, Vec<FreeAllocation>> {
    // A panic while holding this lock cannot leave the list inconsistent (push and pop only).
    class
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Heap buffer aligned to 4096 bytes (O_DIRECT), fixed length, zero-initialised. `Send + Sync`.
///
/// While an operation is in flight the buffer is owned by the ring's op table, not by the
/// caller, so the kernel may write into it even if the caller drops its future: the heap
/// allocation never moves, and it is freed only once the kernel has completed the operation.
pub struct IoBuf {
    /// Start of the allocation; dangling (but aligned) when `len == 0`.
    ptr: NonNull<u8>,
    /// Length in bytes; the allocation has exactly this size.
    len: usize,
}

// SAFETY: `IoBuf` uniquely owns its allocation (like `Box<[u8]>`); no interior mutability.
unsafe impl Send for IoBuf {}
// SAFETY: shared references only give `&[u8]`, which is `Sync`.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zero-filled buffer of `len` bytes, aligned to [`IO_BUF_ALIGN_BYTES`]: a recycled one
    /// from the pool (zeroed here) when there is one of that length, else a new allocation.
    ///
    /// Large buffers come from `calloc`-style zeroed pages, so a big zeroed buffer costs little
    /// until it is touched. Panics (via `handle_alloc_error`) if the allocation fails.
    pub fn zeroed(len: usize) -> IoBuf {
        if let Some(mut buf) = IoBuf::from_pool(len) {
            buf.fill(0);
            return buf;
        }
        IoBuf::allocate_zeroed(len)
    }

    /// A buffer of `len` bytes that the caller overwrites whole before reading it (a device
    /// read, where a short read is an error, or a decoder that must fill it exactly): a
    /// recycled one from the pool as its last user left it, not zeroed, else a new zeroed
    /// allocation. The bytes are always initialised; only their value is unspecified.
    ///
    /// Why: zeroing a pooled 16-128 KiB read buffer just before the device overwrites it was
    /// about 7 % of the server's CPU on cached-miss reads (issue 19's profile).
    pub fn for_overwrite(len: usize) -> IoBuf {
        IoBuf::from_pool(len).unwrap_or_else(|| IoBuf::allocate_zeroed(len))
    }

    /// Bytes of free buffers the pool holds now (at most [`IoBuf::pool_limit_bytes`]).
    pub fn pooled_bytes() -> usize {
        POOLED_BYTES.load(Ordering::Relaxed)
    }

    /// The pool's bound now: [`IO_BUF_POOL_BYTES_MAX`] plus the live reservations.
    pub fn pool_limit_bytes() -> usize {
        POOL_LIMIT_BYTES.load(Ordering::Relaxed)
    }

    /// Puts new buffers of `len` bytes in the pool until it holds `bytes` of that length (or
    /// its bound stops it), each page written once here: a thread with time to spare takes
    /// the page faults and zeroing of fresh memory off the path of the thread that takes the
    /// buffers (a receive's applying thread, for its reading thread, until the blocks of
    /// synced txgs come back). A length the pool does not keep is ignored.
    pub fn prefill_pool(len: usize, bytes: usize) {
        let Some(class) = pool_class(len) else {
            return;
        };
        let wanted = bytes / len;
        // Bounded by `wanted`: each round adds one buffer or stops.
        while lock_class(class).len() < wanted {
            let buf = IoBuf::allocate_zeroed(len);
            // `alloc_zeroed` may hand out pages never touched: write one byte of each (a
            // volatile write of the zero already there, which cannot be left out).
            for page in (0..len).step_by(IO_BUF_ALIGN_BYTES) {
                // SAFETY: `page` is within the allocation of `len` bytes, which only `buf`
                // points to.
                unsafe { std::ptr::write_volatile(buf.ptr.as_ptr().add(page), 0) };
            }
            if !buf.return_to_pool() {
                break; // The pool is full: `buf` is freed.
            }
            std::mem::forget(buf);
        }
    }

    /// Maps block-buffer memory ahead of its use, on a thread of its own (the huge-page
    /// arena's warmer): the first `bytes` at once, then always some chunks beyond the last
    /// one in use, for the life of the process. For a server: the kernel zeroes memory at its
    /// first touch (and this project's VM also has its host back it, 7.6 ms per 2 MiB chunk),
    /// and without the warmer those faults are taken on the reactor receiving into a new
    /// chunk, stalling every request on it: an eighth of a fresh server's CPU in its first
    /// 2 GiB of sequential writes, and the write tail of 4K sync writes at iodepth 16 while
    /// the data cache grew (issue 19, docs/memory.md). Buffers already in use keep their
    /// bytes. Nothing is done without an arena; an error if the thread cannot be started. A
    /// second call raises the first `bytes` of the running warmer.
    pub fn warm(bytes: usize) -> std::io::Result<()> {
        match HugePageArena::process() {
            Some(arena) => arena.start_warmer(bytes),
            None => Ok(()),
        }
    }

    /// What a server warms at start ([`IoBuf::warm`]): 1/128 of the process's memory
    /// ([`crate::machine::memory_bytes`]), at most [`IO_BUF_WARM_BYTES_MAX`]. A fresh
    /// server's first 2 GiB of 128K sequential writes, at about 1.6 GB/s, took 84 MB of new
    /// huge pages.
    pub fn warm_default_bytes() -> usize {
        (crate::machine::memory_bytes_in_memory() / 128).min(IO_BUF_WARM_BYTES_MAX)
    }

    /// Lets the pool keep `bytes` more of free buffers while the reservation lives: for work
    /// whose buffers come back in bursts larger than the pool and are needed again right
    /// after. A receive's blocks are freed a whole txg at a time when the txg is synced, and
    /// the blocks read next need as many: without the reservation most of them went back to
    /// the allocator and came out again as fresh pages (page faults and zeroing were a third
    /// of the receive's CPU). The bytes are memory the process may keep (docs/memory.md).
    pub fn reserve_pool(bytes: usize) -> PoolReservation {
        POOL_LIMIT_BYTES.fetch_add(bytes, Ordering::Relaxed);
        PoolReservation { bytes }
    }

    /// A recycled buffer of exactly `len` bytes, holding whatever its last user left in it.
    fn from_pool(len: usize) -> Option<IoBuf> {
        let class = pool_class(len)?;
        let FreeAllocation(ptr) = lock_class(class).pop()?;
        POOLED_BYTES.fetch_sub(len, Ordering::Relaxed);
        Some(IoBuf { ptr, len })
    }

    /// Gives the allocation to the pool if its length is pooled and the pool has room; false
    /// if the caller must free it.
    fn return_to_pool(&self) -> bool {
        let Some(class) = pool_class(self.len) else {
            return false;
        };
        let limit = POOL_LIMIT_BYTES.load(Ordering::Relaxed);
        let reserved = POOLED_BYTES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bytes| {
            (bytes + self.len <= limit).then_some(bytes + self.len)
        });
        if reserved.is_err() {
            return false;
        }
        lock_class(class).push(FreeAllocation(self.ptr));
        true
    }

    /// A buffer of `len` bytes from the pool (initialised, as its last user left it), or
    /// else a new allocation whose bytes are **not initialised** (the second value is false):
    /// for a receive that writes every byte before any is read, without zeroing fresh memory
    /// first (a third of the reactor's CPU on 128K writes once the pool ran dry).
    ///
    /// # Safety
    ///
    /// For an uninitialised buffer, the caller must write every byte through raw pointers
    /// ([`IoBuf::as_mut_ptr`], or the kernel) before it reads any, derefs the buffer or lets
    /// it drop (a dropped buffer may go to the pool, which hands out initialised bytes).
    pub(crate) unsafe fn for_receive(len: usize) -> (IoBuf, bool) {
        if let Some(buf) = IoBuf::from_pool(len) {
            return (buf, true);
        }
        if len == 0 {
            return (IoBuf::allocate_zeroed(0), true);
        }
        let (ptr, initialised) = new_allocation(len, false);
        (IoBuf { ptr, len }, initialised)
    }

    /// A new zero-filled allocation (not from the pool).
    fn allocate_zeroed(len: usize) -> IoBuf {
        if len == 0 {
            return IoBuf {
                ptr: Self::dangling(),
                len: 0,
            };
        }
        let (ptr, _) = new_allocation(len, true);
        IoBuf { ptr, len }
    }

    /// An aligned buffer holding a copy of `data` (from the pool when it has one of that
    /// length). A new allocation is not zeroed first: the copy is its first write (zeroing
    /// 128 KiB before copying over it was 8 % of a sequential-write server's CPU).
    pub fn from_slice(data: &[u8]) -> IoBuf {
        if let Some(mut buf) = IoBuf::from_pool(data.len()) {
            buf.copy_from_slice(data);
            return buf;
        }
        if data.is_empty() {
            return IoBuf::allocate_zeroed(0);
        }
        let (ptr, _) = new_allocation(data.len(), false);
        // SAFETY: the new allocation is valid for `data.len()` bytes and cannot overlap
        // `data`; after the copy every byte is initialised, before any slice of it exists.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len()) };
        IoBuf {
            ptr,
            len: data.len(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to the first byte (aligned to [`IO_BUF_ALIGN_BYTES`]).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable pointer to the first byte (aligned to [`IO_BUF_ALIGN_BYTES`]).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, IO_BUF_ALIGN_BYTES).expect("IoBuf: length overflows a Layout")
    }

    fn dangling() -> NonNull<u8> {
        // An aligned, non-null address that is never dereferenced for a zero-length buffer.
        NonNull::new(std::ptr::without_provenance_mut::<u8>(IO_BUF_ALIGN_BYTES))
            .expect("alignment is non-zero")
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if self.len != 0 && !self.return_to_pool() {
            // SAFETY: made by `new_allocation` for exactly this length, not freed before, and
            // not handed to the pool.
            unsafe { free_allocation(self.ptr, self.len) }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes (or dangling-aligned with len 0),
        // and `&self` guarantees nobody mutates them for the borrow's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::from_slice(self)
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("len", &self.len).finish()
    }
}

impl PartialEq for IoBuf {
    fn eq(&self, other: &IoBuf) -> bool {
        self[..] == other[..]
    }
}

impl Eq for IoBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_aligned_and_zero() {
        for len in [0, 1, 511, 4096, 128 * 1024 + 3] {
            let buf = IoBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.is_empty(), len == 0);
            assert_eq!(buf.as_ptr() as usize % IO_BUF_ALIGN_BYTES, 0);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn from_slice_and_clone_copy() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let buf = IoBuf::from_slice(&data);
        let mut copy = buf.clone();
        assert_eq!(&buf[..], &data[..]);
        copy[0] ^= 0xff;
        assert_ne!(buf, copy);
        assert_eq!(format!("{buf:?}"), "IoBuf { len: 10000 }");
    }

    #[test]
    fn dropped_buffers_are_recycled_zeroed() {
        // A length no other test of this crate uses, so concurrent tests do not take it.
        let len = 3 * 1024 + 512;
        let mut buf = IoBuf::zeroed(len);
        buf.fill(0xa5);
        let ptr = buf.as_ptr();
        drop(buf);
        let again = IoBuf::zeroed(len);
        assert_eq!(again.as_ptr(), ptr, "the freed allocation was not reused");
        assert!(again.iter().all(|&b| b == 0));
        drop(again);
        let copy = IoBuf::from_slice(&[7u8; 3 * 1024 + 512]);
        assert_eq!(copy.as_ptr(), ptr);
        assert!(copy.iter().all(|&b| b == 7));
        assert!(IoBuf::pooled_bytes() <= IoBuf::pool_limit_bytes());
    }

    /// New memory counts as initialised only when zeroed, and zeroed memory is zero even
    /// where another buffer wrote before (the arena hands out old bytes).
    #[test]
    fn new_memory_is_initialised_only_when_zeroed() {
        // A length no other test of this crate uses (the arena's 12 KiB slots).
        let len = 9 * 1024 + 512;
        let (ptr, initialised) = new_allocation(len, false);
        assert!(!initialised);
        // SAFETY: `len` bytes of new memory, used by nothing else, freed once.
        unsafe {
            std::ptr::write_bytes(ptr.as_ptr(), 0xa5, len);
            free_allocation(ptr, len);
        }
        let (again, initialised) = new_allocation(len, true);
        assert!(initialised);
        if HugePageArena::process().is_some() {
            assert_eq!(
                again, ptr,
                "the arena did not hand out the freed slot again"
            );
        }
        // SAFETY: zeroed, `len` bytes, used by nothing else, freed once after the read.
        let zero = unsafe { std::slice::from_raw_parts(again.as_ptr(), len) }
            .iter()
            .all(|&b| b == 0);
        // SAFETY: as above.
        unsafe { free_allocation(again, len) };
        assert!(zero, "zeroed memory holds a former buffer's bytes");
    }

    #[test]
    fn a_reservation_keeps_more_until_it_ends() {
        // A length no other test of this crate uses; more of it than the pool keeps alone.
        let len = 5 * 1024 + 512;
        let count = IO_BUF_POOL_BYTES_MAX / len + 64;
        // With room to spare for what other tests free meanwhile (they share the pool).
        let reservation = IoBuf::reserve_pool(count * len + IO_BUF_POOL_BYTES_MAX);
        assert!(IoBuf::pool_limit_bytes() >= IO_BUF_POOL_BYTES_MAX + count * len);
        let bufs: Vec<IoBuf> = (0..count).map(|_| IoBuf::zeroed(len)).collect();
        let places: std::collections::HashSet<usize> =
            bufs.iter().map(|b| b.as_ptr() as usize).collect();
        drop(bufs);
        // Every one was kept: as many come back from the pool, the very same allocations.
        let again: Vec<IoBuf> = (0..count).map(|_| IoBuf::for_overwrite(len)).collect();
        let reused = again
            .iter()
            .filter(|b| places.contains(&(b.as_ptr() as usize)))
            .count();
        assert_eq!(reused, count, "the reservation did not keep them all");
        drop(again);
        assert!(IoBuf::pooled_bytes() >= count * len);
        drop(reservation);
        // The bound is back (other tests' reservations aside), and the pool within it.
        assert!(IoBuf::pooled_bytes() <= IoBuf::pool_limit_bytes());
        assert!(lock_class(pool_class(len).unwrap()).len() * len <= IO_BUF_POOL_BYTES_MAX);
    }

    #[test]
    fn a_prefill_puts_zeroed_buffers_in_the_pool() {
        // A length no other test of this crate uses.
        let len = 6 * 1024 + 512;
        IoBuf::prefill_pool(len, 10 * len);
        assert_eq!(lock_class(pool_class(len).unwrap()).len(), 10);
        // Taken without a new allocation (the pool's own), zeroed.
        let bufs: Vec<IoBuf> = (0..10).map(|_| IoBuf::for_overwrite(len)).collect();
        assert_eq!(lock_class(pool_class(len).unwrap()).len(), 0);
        assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 0)));
        // A length the pool does not keep: nothing.
        IoBuf::prefill_pool(1000, 1 << 20);
        assert!(pool_class(1000).is_none());
    }

    #[test]
    fn unpooled_lengths_are_not_kept() {
        assert!(pool_class(0).is_none());
        assert!(pool_class(1000).is_none());
        assert!(pool_class(POOLED_LEN_MAX_BYTES + POOL_CLASS_BYTES).is_none());
        assert!(pool_class(POOLED_LEN_MAX_BYTES).is_some());
        assert!(pool_class(POOL_CLASS_BYTES).is_some());
    }
}
