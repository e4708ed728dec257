//! [`IoBuf`]: the owned, page-aligned buffer every I/O moves in and out of.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`IoBuf`] allocation. 4096 covers O_DIRECT on every filesystem and block
/// device we target (`statx` reports 512 or 4096 as `dio_mem_align`).
pub const IO_BUF_ALIGN_BYTES: usize = 4096;

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
    /// Allocates a zero-filled buffer of `len` bytes, aligned to [`IO_BUF_ALIGN_BYTES`].
    ///
    /// Large buffers come from `calloc`-style zeroed pages, so a big zeroed buffer costs little
    /// until it is touched. Panics (via `handle_alloc_error`) if the allocation fails.
    pub fn zeroed(len: usize) -> IoBuf {
        if len == 0 {
            return IoBuf {
                ptr: Self::dangling(),
                len: 0,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        debug_assert_eq!(ptr.as_ptr() as usize % IO_BUF_ALIGN_BYTES, 0);
        IoBuf { ptr, len }
    }

    /// Allocates an aligned buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut buf = IoBuf::uninit_for_copy(data.len());
        buf.copy_from_slice(data);
        buf
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

    /// An allocation whose contents are about to be overwritten entirely. Zeroed anyway: the
    /// cost is small next to the copy, and it keeps `IoBuf` free of uninitialised bytes.
    fn uninit_for_copy(len: usize) -> IoBuf {
        IoBuf::zeroed(len)
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
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with exactly this layout and not freed before.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
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
}
