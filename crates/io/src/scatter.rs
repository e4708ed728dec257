//! Owned buffers filled back to back by one vectored receive ([`crate::Stream::recv_scatter`]).
//!
//! Why: an NBD WRITE of whole volume blocks is received straight into the buffers that become
//! the blocks' dirty state, instead of into one request buffer copied block by block
//! afterwards (that copy, into memory out of the cache, was 15 % of the server's CPU on 128K
//! sequential writes; issue 19).

use crate::IoBuf;

/// Most `iovec`s one receive submits (the kernel's `IOV_MAX` is 1024); a longer scatter is
/// filled by several receives, as any receive may return short.
pub const SCATTER_IOVECS_MAX: usize = 256;

/// Owned buffers, seen as one range of their concatenated bytes. Keeps its vectors' capacity
/// when emptied, so a connection reusing one allocates nothing per request.
#[derive(Debug, Default)]
pub struct Scatter {
    bufs: Vec<IoBuf>,
    /// The array the kernel reads for the current submission (rebuilt for each one: a short
    /// receive resumes in the middle of a buffer).
    iovecs: Vec<libc::iovec>,
}

impl Scatter {
    /// An empty scatter with room for `count` buffers.
    pub fn with_capacity(count: usize) -> Scatter {
        Scatter {
            bufs: Vec::with_capacity(count),
            iovecs: Vec::with_capacity(count.min(SCATTER_IOVECS_MAX)),
        }
    }

    /// Appends `buf` after the others.
    pub fn push(&mut self, buf: IoBuf) {
        self.bufs.push(buf);
    }

    /// Total bytes of the buffers.
    pub fn len_bytes(&self) -> usize {
        self.bufs.iter().map(IoBuf::len).sum()
    }

    /// Whether it holds no buffer.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The buffers, in order.
    pub fn bufs(&self) -> &[IoBuf] {
        &self.bufs
    }

    /// The buffers, to take them (draining keeps the capacity).
    pub fn bufs_mut(&mut self) -> &mut Vec<IoBuf> {
        &mut self.bufs
    }

    /// Copies `data` into the concatenated bytes from `at` on (which must have room for it).
    pub fn copy_in(&mut self, at: usize, data: &[u8]) {
        let (mut skip, mut rest) = (at, data);
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
            buf[skip..skip + take].copy_from_slice(&rest[..take]);
            rest = &rest[take..];
            skip = 0;
        }
        assert!(rest.is_empty(), "copy past the end of a scatter");
    }

    /// The buffer holding byte `at` of the concatenation, and `at`'s offset in it.
    pub fn locate(&self, at: usize) -> Option<(usize, usize)> {
        let mut skip = at;
        for (index, buf) in self.bufs.iter().enumerate() {
            if skip < buf.len() {
                return Some((index, skip));
            }
            skip -= buf.len();
        }
        None
    }

    /// Points the `iovec`s at bytes `[start, end)` of the concatenation (at most
    /// [`SCATTER_IOVECS_MAX`] of them: the receive may cover less) and returns the array for
    /// the kernel, which writes through it.
    pub(crate) fn iovecs_for(&mut self, start: usize, end: usize) -> (*const libc::iovec, u32) {
        self.iovecs.clear();
        let (mut skip, mut left) = (start, end - start);
        for buf in &mut self.bufs {
            if left == 0 || self.iovecs.len() == SCATTER_IOVECS_MAX {
                break;
            }
            if skip >= buf.len() {
                skip -= buf.len();
                continue;
            }
            let take = (buf.len() - skip).min(left);
            self.iovecs.push(libc::iovec {
                // SAFETY: `skip < buf.len()`: in bounds. The scatter owns the buffer for as
                // long as the op holds it, and nothing else refers to it.
                iov_base: unsafe { buf.as_mut_ptr().add(skip) } as *mut libc::c_void,
                iov_len: take,
            });
            left -= take;
            skip = 0;
        }
        debug_assert!(!self.iovecs.is_empty(), "a receive into no bytes");
        (self.iovecs.as_ptr(), self.iovecs.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scatter(lens: &[usize]) -> Scatter {
        let mut s = Scatter::with_capacity(lens.len());
        for &len in lens {
            s.push(IoBuf::zeroed(len));
        }
        s
    }

    #[test]
    fn copy_in_spans_buffers_and_locate_finds_bytes() {
        let mut s = scatter(&[4, 8, 4]);
        s.copy_in(2, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        let all: Vec<u8> = s.bufs().iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(all, [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 0]);
        assert_eq!(s.len_bytes(), 16);
        assert_eq!(s.locate(0), Some((0, 0)));
        assert_eq!(s.locate(4), Some((1, 0)));
        assert_eq!(s.locate(13), Some((2, 1)));
        assert_eq!(s.locate(16), None);
    }

    #[test]
    #[should_panic(expected = "copy past the end")]
    fn copy_in_past_the_end_panics() {
        scatter(&[4]).copy_in(2, &[1, 2, 3]);
    }

    #[test]
    fn iovecs_cover_exactly_the_range_and_stop_at_the_cap() {
        let mut s = scatter(&[4, 8, 4]);
        let (ptr, count) = s.iovecs_for(3, 13);
        // SAFETY: the array the scatter just built, of `count` entries.
        let v = unsafe { std::slice::from_raw_parts(ptr, count as usize) };
        assert_eq!(v.iter().map(|v| v.iov_len).collect::<Vec<_>>(), [1, 8, 1]);
        assert_eq!(v[0].iov_base as *const u8, unsafe {
            s.bufs()[0].as_ptr().add(3)
        });

        let mut many = scatter(&vec![1; SCATTER_IOVECS_MAX + 10]);
        let (_, count) = many.iovecs_for(0, SCATTER_IOVECS_MAX + 10);
        assert_eq!(count as usize, SCATTER_IOVECS_MAX);
    }
}
