//! Where an fdatasync runs: on the calling thread when it is alone (queue depth 1: no other
//! device I/O of the thread in flight, at most one client request being served), on the
//! ring's kernel workers otherwise. One test in its own binary: the counters are per process.

use oxpool_io::completion::{RequestGuard, COMPLETIONS};
use oxpool_io::rt::{block_on, join_all, set_fsync_here_max, FSYNC_HERE_MAX_DEFAULT};
use oxpool_io::{Backend, FileBackend, IoBuf, IoFuture};
use std::sync::atomic::Ordering;
use std::time::Duration;

fn counts() -> (u64, u64) {
    (
        COMPLETIONS.fsyncs_inline.load(Ordering::Relaxed),
        COMPLETIONS.fsyncs_ring.load(Ordering::Relaxed),
    )
}

#[test]
fn a_lone_fdatasync_runs_on_the_calling_thread_and_others_on_the_ring() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dev = FileBackend::open(&dir.path().join("dev0"), Some(8 << 20)).unwrap();
    block_on(dev.write(0, IoBuf::from_slice(&[7u8; 4096]))).unwrap();

    // Alone: on this thread. The limit on their average latency is lifted here, so that a
    // loaded machine's slow flush does not change the answer; its own effect is checked last.
    set_fsync_here_max(Duration::from_secs(3600));
    let before = counts();
    for _ in 0..4 {
        block_on(dev.flush()).unwrap();
    }
    let after = counts();
    assert_eq!(
        after.0 - before.0,
        4,
        "lone fdatasyncs on the calling thread"
    );
    assert_eq!(after.1, before.1);

    // With a write of this thread in flight: on the ring (the write is started first).
    let before = counts();
    let futs: Vec<IoFuture<()>> = vec![
        IoFuture::boxed({
            let w = dev.write(1 << 20, IoBuf::from_slice(&[9u8; 65536]));
            async move { w.await.map(drop) }
        }),
        dev.flush(),
    ];
    for r in block_on(join_all(futs)) {
        r.unwrap();
    }
    let after = counts();
    assert_eq!(
        after.1 - before.1,
        1,
        "an fdatasync beside a write goes to the ring"
    );
    assert_eq!(after.0, before.0);

    // Two client requests being served on this thread: the other one must not wait behind a
    // blocking call.
    let before = counts();
    {
        let _a = RequestGuard::new();
        let _b = RequestGuard::new();
        block_on(dev.flush()).unwrap();
    }
    let after = counts();
    assert_eq!(
        after.1 - before.1,
        1,
        "with two requests in flight, on the ring"
    );
    // One request (the flush's own): on this thread again.
    let before = counts();
    {
        let _a = RequestGuard::new();
        block_on(dev.flush()).unwrap();
    }
    assert_eq!(counts().0 - before.0, 1);
    // The data is there.
    let back = block_on(dev.read(1 << 20, IoBuf::zeroed(65536))).unwrap();
    assert!(back.iter().all(|&x| x == 9));

    // A device slower than the limit (every fdatasync is, with a limit of zero): after the
    // first slow one, lone fdatasyncs go to the ring, but for one probe in 64 that measures
    // again.
    set_fsync_here_max(Duration::ZERO);
    let before = counts();
    for _ in 0..130 {
        block_on(dev.flush()).unwrap();
    }
    let after = counts();
    let (here, ring) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(here + ring, 130);
    assert!(
        (2..=4).contains(&here),
        "{here} on the thread, {ring} on the ring: one slow call, then probes only"
    );
    set_fsync_here_max(FSYNC_HERE_MAX_DEFAULT);
}
