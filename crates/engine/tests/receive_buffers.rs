//! The memory a receive keeps for reuse is bounded: while it reads a stream, the I/O buffer
//! pool may keep the effective `dirty_max` more of free block buffers (the blocks of each
//! synced txg, for the blocks read next: `IoBuf::reserve_pool`), and when the receive
//! returns (received, refused, cut, or kept for resume) the pool is back within
//! `IO_BUF_POOL_BYTES_MAX`. That the pool then hands the same buffers out again is
//! `oxpool_io`'s `a_reservation_keeps_more_until_it_ends`.
//!
//! Its own binary: the pool's bound is process-wide, and the receives of other test binaries
//! would raise it meanwhile. The two tests here run one at a time.

mod common;

use common::*;
use oxpool_engine::{Pool, ReceiveOptions, SendOptions};
use oxpool_format::TopVdevKind;
use oxpool_io::{IoBuf, IO_BUF_POOL_BYTES_MAX};
use std::io::{IoSliceMut, Read};
use std::sync::{Mutex, MutexGuard};

const MIB: u64 = 1 << 20;

fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A stream on the receive's input that notes the pool's bound at every read (the receive
/// reads its input on the calling thread, while it runs).
struct Watched<'a> {
    stream: &'a [u8],
    limit_bytes_max: usize,
}

impl Read for Watched<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.limit_bytes_max = self.limit_bytes_max.max(IoBuf::pool_limit_bytes());
        self.stream.read(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        self.limit_bytes_max = self.limit_bytes_max.max(IoBuf::pool_limit_bytes());
        self.stream.read_vectored(bufs)
    }
}

/// A 4 MiB volume's full stream.
fn full_stream() -> Vec<u8> {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("src", 4 * MIB, &[]).unwrap();
    write(&vol, 0, &pattern(7, (4 * MIB) as usize));
    pool.snapshot(&["src@a".to_string()]).unwrap();
    let mut out = Vec::new();
    pool.send("src", "a", &SendOptions::default(), &mut out)
        .unwrap();
    out
}

/// Receives `stream` into `target/copy`; the pool's bound during the receive at its largest.
fn receive(target: &Pool, stream: &[u8], resumable: bool) -> (bool, usize) {
    let mut input = Watched {
        stream,
        limit_bytes_max: 0,
    };
    let opts = ReceiveOptions {
        force: false,
        resumable,
        dry_run: false,
        snapshot: None,
    };
    let ok = target.receive("copy", &mut input, &opts).is_ok();
    (ok, input.limit_bytes_max)
}

/// The bound seen during a receive: raised by the target's effective `dirty_max`, which is
/// the property (256M in the tests) capped at an eighth of the pool's allocatable space (a
/// little under an eighth of its device).
fn assert_raised(during_bytes: usize) {
    let raised_bytes = during_bytes.saturating_sub(IO_BUF_POOL_BYTES_MAX);
    let eighth_bytes = (DEVICE_BYTES / 8) as usize;
    assert!(
        raised_bytes > eighth_bytes * 9 / 10 && raised_bytes <= eighth_bytes,
        "the bound during the receive: {during_bytes} bytes"
    );
}

fn assert_back_within_bound(when: &str) {
    assert_eq!(
        IoBuf::pool_limit_bytes(),
        IO_BUF_POOL_BYTES_MAX,
        "the pool's bound after {when}"
    );
    assert!(
        IoBuf::pooled_bytes() <= IO_BUF_POOL_BYTES_MAX,
        "{} bytes of free buffers kept after {when}",
        IoBuf::pooled_bytes()
    );
}

#[test]
fn a_receive_raises_the_buffer_pools_bound_by_dirty_max_while_it_runs_only() {
    let _one = one_at_a_time();
    let stream = full_stream();
    let (target, _mems) = mem_pool(TopVdevKind::Single, 1);
    assert_back_within_bound("creating the pools");
    let (ok, during) = receive(&target, &stream, false);
    assert!(ok, "the receive failed");
    assert_raised(during);
    assert_back_within_bound("a receive");
    assert_eq!(
        read_all(&target.volume("copy").unwrap()),
        pattern(7, (4 * MIB) as usize)
    );
}

#[test]
fn the_bound_comes_back_after_a_refused_or_cut_receive() {
    let _one = one_at_a_time();
    let stream = full_stream();
    let (target, _mems) = mem_pool(TopVdevKind::Single, 1);
    // Cut in the middle, without and with -s (the partial receive is kept).
    for resumable in [false, true] {
        let (ok, during) = receive(&target, &stream[..stream.len() / 2], resumable);
        assert!(!ok, "a cut stream was received");
        assert_raised(during);
        assert_back_within_bound(&format!("a cut receive (resumable: {resumable})"));
    }
    target.abort_receive("copy").unwrap();
    // Received, then refused: a full stream onto the volume it made.
    assert!(receive(&target, &stream, false).0);
    let (ok, _) = receive(&target, &stream, false);
    assert!(!ok, "a full stream onto an existing volume was received");
    assert_back_within_bound("a refused receive");
}
