//! Scratch values (vectors, scatters) lent by a per-thread stash and given back, emptied with
//! their capacity kept, when dropped.
//!
//! Why: a request path that needs a short list per request (the blocks a 128 KiB read misses
//! in the cache, the buffers of its device read, their verdicts) would otherwise allocate and
//! free each list per request: 36 allocations per 128 KiB read from the devices, where malloc
//! and free were 4 % of the server's samples (issue 19). A stash per thread needs no lock: a
//! reactor's requests run on its thread. A value dropped on another thread joins that
//! thread's stash, which only moves memory between stashes. `WrittenForms` (a write's
//! compression decisions) is lent the same way.
//!
//! ```ignore
//! thread_local! {
//!     static BLOCKS: Stash<Vec<u64>> = const { Stash::new() };
//! }
//! let mut blocks = Scratch::take(&BLOCKS);
//! blocks.push(7);
//! ```

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

/// Most values one stash keeps: as many as the requests a reactor has in flight at once (a
/// connection's queue depth, 64 to 256 for the clients measured), each holding one. A stash
/// only grows to the most values lent at once, so this bounds a burst's leftovers.
pub const STASH_KEPT_MAX: usize = 256;

/// Heap bytes past which an emptied value is not kept: a rare huge request (32 MiB of 4 KiB
/// blocks) must not pin its lists' memory in every stash it passed through. 16 KiB holds the
/// lists of a 1 MiB read of 16 KiB blocks. A stash so holds at most 4 MiB.
pub const SCRATCH_BYTES_MAX: usize = 16 << 10;

/// A value a [`Stash`] can lend again: emptied when given back, and kept only if small.
pub trait Reuse: Default {
    /// Empties the value, keeping its capacity.
    fn reset(&mut self);
    /// The heap memory the emptied value holds, bytes (0: nothing worth keeping).
    fn heap_bytes(&self) -> usize;
}

impl<T> Reuse for Vec<T> {
    fn reset(&mut self) {
        self.clear();
    }

    fn heap_bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

/// One thread's emptied values of one type, lent by [`Scratch::take`]; declare it in a
/// `thread_local!` with `const { Stash::new() }`.
pub struct Stash<V> {
    free: RefCell<Vec<V>>,
}

impl<V> Stash<V> {
    /// An empty stash.
    pub const fn new() -> Stash<V> {
        Stash {
            free: RefCell::new(Vec::new()),
        }
    }
}

impl<V> Default for Stash<V> {
    fn default() -> Stash<V> {
        Stash::new()
    }
}

/// A value lent by a thread's [`Stash`] (or a new one if it had none), given back when
/// dropped.
pub struct Scratch<V: Reuse + 'static> {
    value: V,
    home: &'static LocalKey<Stash<V>>,
}

impl<V: Reuse + 'static> Scratch<V> {
    /// An empty value: one `home` kept on this thread, else a new one (which allocates only
    /// when it grows).
    pub fn take(home: &'static LocalKey<Stash<V>>) -> Scratch<V> {
        // `try_with`: a thread being torn down has no stash; the value is then just new.
        let value = home
            .try_with(|stash| stash.free.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_default();
        Scratch { value, home }
    }
}

impl<V: Reuse + 'static> Deref for Scratch<V> {
    type Target = V;

    fn deref(&self) -> &V {
        &self.value
    }
}

impl<V: Reuse + 'static> DerefMut for Scratch<V> {
    fn deref_mut(&mut self) -> &mut V {
        &mut self.value
    }
}

impl<V: Reuse + 'static> Drop for Scratch<V> {
    fn drop(&mut self) {
        let mut value = std::mem::take(&mut self.value);
        // Emptied before the stash is borrowed: dropping the elements may give back scratch
        // values of their own.
        value.reset();
        if !(1..=SCRATCH_BYTES_MAX).contains(&value.heap_bytes()) {
            return;
        }
        let _ = self.home.try_with(|stash| {
            let mut free = stash.free.borrow_mut();
            if free.len() < STASH_KEPT_MAX {
                free.push(value);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static NUMBERS: Stash<Vec<u64>> = const { Stash::new() };
    }

    fn kept() -> usize {
        NUMBERS.with(|s| s.free.borrow().len())
    }

    #[test]
    fn a_value_comes_back_empty_with_its_capacity() {
        let mut a = Scratch::take(&NUMBERS);
        a.extend(0..100);
        let ptr = a.as_ptr();
        drop(a);
        assert_eq!(kept(), 1);
        let b = Scratch::take(&NUMBERS);
        assert!(b.is_empty(), "given back emptied");
        assert!(b.capacity() >= 100);
        assert_eq!(b.as_ptr(), ptr, "the same memory, lent again");
        assert_eq!(kept(), 0, "lent, so no longer kept");
    }

    #[test]
    fn values_lent_at_once_are_distinct_and_all_come_back() {
        let mut lent: Vec<Scratch<Vec<u64>>> = (0..10).map(|_| Scratch::take(&NUMBERS)).collect();
        for (i, v) in lent.iter_mut().enumerate() {
            v.push(i as u64);
        }
        for (i, v) in lent.iter().enumerate() {
            assert_eq!(v.as_slice(), &[i as u64]);
        }
        let before = kept();
        drop(lent);
        assert_eq!(kept(), before + 10);
    }

    #[test]
    fn empty_and_oversized_values_are_not_kept() {
        let before = kept();
        drop(Scratch::take(&NUMBERS));
        assert_eq!(kept(), before, "no memory: nothing to keep");
        let mut big = Scratch::take(&NUMBERS);
        big.extend(0..(SCRATCH_BYTES_MAX / 8) as u64 + 1);
        drop(big);
        assert_eq!(kept(), before, "too large to keep");
    }

    #[test]
    fn a_stash_keeps_at_most_its_bound() {
        let lent: Vec<Scratch<Vec<u64>>> = (0..STASH_KEPT_MAX + 5)
            .map(|_| {
                let mut v = Scratch::take(&NUMBERS);
                v.push(1);
                v
            })
            .collect();
        drop(lent);
        assert_eq!(kept(), STASH_KEPT_MAX);
    }
}
