//! A scatter's buffer dropped half filled goes back to the pool zeroed past what was filled:
//! the pool never hands out bytes nobody wrote since the memory was last freed. In a process
//! of its own, because the buffer pool is process-wide: among the library's unit tests,
//! another test filling the pool to its bound made the dropped buffer go to the allocator
//! instead, and the check read a new buffer.

use oxpool_io::{IoBuf, Scatter};

#[test]
fn a_half_filled_scatter_zeroes_the_rest_before_letting_go() {
    let len = 16 * 1024;
    // The pool full of buffers of another length: a buffer of `len` dropped now goes back to
    // the allocator, bytes and all.
    IoBuf::prefill_pool(4096, IoBuf::pool_limit_bytes());
    assert!(IoBuf::pooled_bytes() + len > IoBuf::pool_limit_bytes());
    // Memory a former buffer filled with 0xa5, freed; a second buffer keeps its chunk in
    // use, so that the allocator keeps the bytes as they are.
    let _sibling = IoBuf::zeroed(len);
    let mut former = IoBuf::zeroed(len);
    former.fill(0xa5);
    drop(former);
    // A receive into new memory (that memory, as allocators reuse it) stops after 100 bytes.
    let mut s = Scatter::with_capacity(1);
    s.push_for_receive(len);
    s.copy_in(&[9; 100]);
    // Room in the pool for it, so that it comes back as the scatter left it.
    let _room = IoBuf::reserve_pool(len);
    drop(s);
    let again = IoBuf::for_overwrite(len);
    assert!(again[..100].iter().all(|&b| b == 9), "not the same buffer");
    assert!(
        again[100..].iter().all(|&b| b == 0),
        "the unfilled rest was handed out as a former buffer left it"
    );
}
