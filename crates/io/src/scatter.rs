//! Owned buffers filled back to back, in order, by vectored receives
//! ([`crate::rt::net::Stream::recv_scatter`]) and copies ([`Scatter::copy_in`]).
//!
//! Why: an NBD WRITE of whole volume blocks is received straight into the buffers that become
//! the blocks' dirty state, instead of into one request buffer copied block by block
//! afterwards (that copy, into memory out of the cache, was 15 % of the server's CPU on 128K
//! sequential writes; issue 19). Buffers the pool cannot give are allocated without being
//! zeroed first, which the fill order makes sound: see [`Scatter::push_for_receive`].

use crate::driver::point_iovecs;
use crate::IoBuf;

/// Most `iovec`s one receive submits (the kernel's `IOV_MAX` is 1024); a longer scatter is
/// filled by several receives, as any receive may return short.
pub const SCATTER_IOVECS_MAX: usize = 256;

/// Owned buffers, seen as one range of their concatenated bytes, filled from the first byte
/// on. Keeps its vectors' capacity when emptied, so a connection reusing one allocates
/// nothing per request.
///
/// Invariant: bytes `[0, filled)` are initialised; the rest are initialised too unless
/// `may_be_uninit`, in which case nothing reads them, no slice covers them, and they are
/// zeroed (through raw pointers) before their buffers are let go.
#[derive(Debug, Default)]
pub struct Scatter {
    bufs: Vec<IoBuf>,
    /// Bytes written from the first one on.
    filled: usize,
    /// Some buffer was allocated without being initialised.
    may_be_uninit: bool,
    /// The array the kernel reads for the current submission (rebuilt for each one: a short
    /// receive resumes in the middle of a buffer).
    iovecs: Vec<libc::iovec>,
}

impl Scatter {
    /// An empty scatter with room for `count` buffers.
    pub fn with_capacity(count: usize) -> Scatter {
        Scatter {
            bufs: Vec::with_capacity(count),
            filled: 0,
            may_be_uninit: false,
            iovecs: Vec::with_capacity(count.min(SCATTER_IOVECS_MAX)),
        }
    }

    /// Appends `buf` (its bytes count as not yet filled: they are overwritten).
    pub fn push(&mut self, buf: IoBuf) {
        self.bufs.push(buf);
    }

    /// Appends a buffer of `len` bytes to be filled: a pooled one, or a new allocation that is
    /// not zeroed first (its bytes are written by the fill before anything reads them).
    pub fn push_for_receive(&mut self, len: usize) {
        // SAFETY: the invariant of the type: bytes past `filled` are never read nor covered by
        // a slice while `may_be_uninit`, and are zeroed before the buffer is let go (`clear`).
        let (buf, initialised) = unsafe { IoBuf::for_receive(len) };
        self.may_be_uninit |= !initialised;
        self.bufs.push(buf);
    }

    /// The buffers' lengths, in order.
    pub fn buf_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.bufs.iter().map(IoBuf::len)
    }

    /// Total bytes of the buffers.
    pub fn len_bytes(&self) -> usize {
        self.bufs.iter().map(IoBuf::len).sum()
    }

    /// Bytes filled so far, from the first one on.
    pub fn filled_bytes(&self) -> usize {
        self.filled
    }

    /// Whether it holds no buffer.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The buffers, to take them (draining keeps the capacity). Panics unless every byte is
    /// filled or every buffer was initialised.
    pub fn bufs_mut(&mut self) -> &mut Vec<IoBuf> {
        assert!(
            !self.may_be_uninit || self.filled == self.len_bytes(),
            "the buffers of a scatter taken before it was filled"
        );
        // Whatever the caller does with them, they are initialised from now on.
        self.may_be_uninit = false;
        &mut self.bufs
    }

    /// Copies `data` after the bytes filled so far (which must leave room for it).
    pub fn copy_in(&mut self, data: &[u8]) {
        let (mut skip, mut rest) = (self.filled, data);
        // Bounded by the buffer count.
        for buf in &mut self.bufs {
            if rest.is_empty() {
                break;
            }
            if skip >= buf.len() {
                skip -= buf.len();
                continue;
            }
            let take = (buf.len() - skip).min(rest.len());
            // SAFETY: `skip + take <= buf.len()`; raw pointers, because the destination may
            // not be initialised yet (no slice may cover it); `data` is another allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(rest.as_ptr(), buf.as_mut_ptr().add(skip), take)
            };
            rest = &rest[take..];
            skip = 0;
        }
        assert!(rest.is_empty(), "copy past the end of a scatter");
        self.filled += data.len();
    }

    /// Counts `count` more bytes as filled, written into a buffer taken out with
    /// [`Scatter::swap_at_filled`] and put back. Only for scatters of initialised buffers.
    pub fn mark_filled(&mut self, count: usize) {
        assert!(
            !self.may_be_uninit,
            "filled bytes of a scatter marked by hand"
        );
        assert!(
            self.filled + count <= self.len_bytes(),
            "marked past the end"
        );
        self.filled += count;
    }

    /// Swaps `with` for the buffer holding the first byte not filled yet, and returns that
    /// buffer's index, the buffer and the byte's offset in it (for a receive that takes one
    /// buffer, such as TLS's; [`Scatter::put_back`] returns it). Only for scatters of
    /// initialised buffers; `None` if it is full.
    pub fn swap_at_filled(&mut self, with: IoBuf) -> Option<(usize, IoBuf, usize)> {
        assert!(
            !self.may_be_uninit,
            "a buffer taken out of a scatter being filled"
        );
        let mut skip = self.filled;
        for (index, buf) in self.bufs.iter_mut().enumerate() {
            if skip < buf.len() {
                return Some((index, std::mem::replace(buf, with), skip));
            }
            skip -= buf.len();
        }
        None
    }

    /// The bytes not filled yet up to byte `end`, as pieces of the buffers in order, for a
    /// receive that writes into several at once (TLS decrypting a record that straddles two
    /// blocks); [`Scatter::mark_filled`] then counts what it wrote. Only for scatters of
    /// initialised buffers.
    pub fn unfilled_mut(&mut self, end: usize) -> impl Iterator<Item = &mut [u8]> {
        assert!(
            !self.may_be_uninit,
            "pieces of a scatter being filled taken by hand"
        );
        assert!(
            self.filled <= end && end <= self.len_bytes(),
            "pieces past the end"
        );
        let (mut skip, mut left) = (self.filled, end - self.filled);
        self.bufs.iter_mut().filter_map(move |buf| {
            if skip >= buf.len() {
                skip -= buf.len();
                return None;
            }
            let piece = &mut buf[skip..];
            skip = 0;
            let take = piece.len().min(left);
            left -= take;
            (take > 0).then_some(&mut piece[..take])
        })
    }

    /// Puts back at `index` the buffer [`Scatter::swap_at_filled`] took.
    pub fn put_back(&mut self, index: usize, buf: IoBuf) {
        let _placeholder = std::mem::replace(&mut self.bufs[index], buf);
    }

    /// Drops every buffer (their unfilled bytes zeroed first if they may not be initialised)
    /// and keeps the capacity.
    pub fn clear(&mut self) {
        if self.may_be_uninit {
            let mut skip = self.filled;
            for buf in &mut self.bufs {
                if skip >= buf.len() {
                    skip -= buf.len();
                    continue;
                }
                // SAFETY: `skip < buf.len()`; raw writes to bytes that may not be initialised,
                // so that the pool never hands out uninitialised bytes.
                unsafe { std::ptr::write_bytes(buf.as_mut_ptr().add(skip), 0, buf.len() - skip) };
                skip = 0;
            }
        }
        self.bufs.clear();
        self.filled = 0;
        self.may_be_uninit = false;
    }

    /// Counts `count` bytes the kernel wrote after the filled ones.
    pub(crate) fn received(&mut self, count: usize) {
        debug_assert!(self.filled + count <= self.len_bytes());
        self.filled += count;
    }

    /// Points the `iovec`s at bytes `[filled, end)` of the concatenation (at most
    /// [`SCATTER_IOVECS_MAX`] of them: the receive may cover less) and returns the array for
    /// the kernel, which writes through it.
    pub(crate) fn iovecs_for(&mut self, start: usize, end: usize) -> (*const libc::iovec, u32) {
        debug_assert_eq!(start, self.filled, "scatters are filled in order");
        // The scatter owns the buffers for as long as the op holds it, and nothing else
        // refers to them: the kernel may write through these pointers.
        let bufs = self.bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len()));
        point_iovecs(
            &mut self.iovecs,
            bufs,
            start,
            end - start,
            SCATTER_IOVECS_MAX,
        );
        debug_assert!(!self.iovecs.is_empty(), "a receive into no bytes");
        (self.iovecs.as_ptr(), self.iovecs.len() as u32)
    }
}

/// A scatter lent by a [`crate::scratch::Stash`] keeps its vectors' capacity (a run read of
/// the devices fills one per request).
impl crate::scratch::Reuse for Scatter {
    fn reset(&mut self) {
        self.clear();
    }

    fn heap_bytes(&self) -> usize {
        self.bufs.capacity() * std::mem::size_of::<IoBuf>()
            + self.iovecs.capacity() * std::mem::size_of::<libc::iovec>()
    }
}

impl Drop for Scatter {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scatter(lens: &[usize]) -> Scatter {
        let mut s = Scatter::with_capacity(lens.len());
        for &len in lens {
            s.push_for_receive(len);
        }
        s
    }

    fn concat(s: &mut Scatter) -> Vec<u8> {
        s.bufs_mut()
            .iter()
            .flat_map(|b| b.iter().copied())
            .collect()
    }

    #[test]
    fn unfilled_pieces_start_at_the_filled_byte_and_stop_at_end() {
        let mut s = Scatter::with_capacity(3);
        for len in [4, 8, 4] {
            s.push(IoBuf::zeroed(len));
        }
        s.mark_filled(3);
        let lens: Vec<usize> = s.unfilled_mut(14).map(|piece| piece.len()).collect();
        assert_eq!(lens, [1, 8, 2]);
        // Written through the pieces, then counted.
        let mut value = 0;
        for piece in s.unfilled_mut(14) {
            for byte in piece {
                value += 1;
                *byte = value;
            }
        }
        s.mark_filled(11);
        assert_eq!(
            concat(&mut s),
            [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0]
        );
        assert_eq!(s.unfilled_mut(14).count(), 0);
    }

    #[test]
    fn copy_in_fills_in_order_across_buffers() {
        let mut s = scatter(&[4, 8, 4]);
        s.copy_in(&[1, 2]);
        s.copy_in(&[3, 4, 5, 6, 7, 8, 9, 10, 11]);
        s.copy_in(&[12, 13, 14, 15, 16]);
        assert_eq!(s.filled_bytes(), 16);
        assert_eq!(concat(&mut s), (1..=16).collect::<Vec<u8>>());
        assert_eq!(s.len_bytes(), 16);
        s.clear();
        assert!(s.is_empty());
        assert_eq!(s.filled_bytes(), 0);
    }

    #[test]
    #[should_panic(expected = "copy past the end")]
    fn copy_in_past_the_end_panics() {
        scatter(&[4]).copy_in(&[1, 2, 3, 4, 5]);
    }

    #[test]
    #[should_panic(expected = "taken before it was filled")]
    fn buffers_of_a_fresh_scatter_are_not_handed_out_before_they_are_filled() {
        // Fresh allocations, whatever the pool holds: a length nothing else pools.
        let mut s = scatter(&[127 * 1024]);
        s.copy_in(&[1]);
        let _ = s.bufs_mut();
    }

    #[test]
    fn swap_at_filled_takes_the_buffer_being_filled() {
        let mut s = Scatter::with_capacity(2);
        s.push(IoBuf::zeroed(4));
        s.push(IoBuf::zeroed(4));
        s.mark_filled(5);
        let (index, mut buf, at) = s.swap_at_filled(IoBuf::zeroed(0)).unwrap();
        assert_eq!((index, buf.len(), at), (1, 4, 1));
        buf[1..4].copy_from_slice(&[7, 7, 7]);
        s.put_back(index, buf);
        s.mark_filled(3);
        assert_eq!(concat(&mut s), [0, 0, 0, 0, 0, 7, 7, 7]);
        assert!(s.swap_at_filled(IoBuf::zeroed(0)).is_none());
    }

    #[test]
    fn iovecs_cover_exactly_the_range_and_stop_at_the_cap() {
        let mut s = scatter(&[4, 8, 4]);
        s.copy_in(&[0; 3]);
        let (ptr, count) = s.iovecs_for(3, 13);
        // SAFETY: the array the scatter just built, of `count` entries.
        let v = unsafe { std::slice::from_raw_parts(ptr, count as usize) };
        assert_eq!(v.iter().map(|v| v.iov_len).collect::<Vec<_>>(), [1, 8, 1]);

        let mut many = scatter(&vec![512; SCATTER_IOVECS_MAX + 10]);
        let (_, count) = many.iovecs_for(0, 512 * (SCATTER_IOVECS_MAX + 10));
        assert_eq!(count as usize, SCATTER_IOVECS_MAX);
    }
}
