//! A thread that turned spinning off never spins before it sleeps in its ring; one that did
//! not spins while it is busy. One test in its own binary: the counters are per process.

use oxpool_io::completion::COMPLETIONS;
use oxpool_io::rt::{block_on, set_spin, sleep};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Short waits in a row, as a busy thread has: each sleep in the ring follows a completion
/// reaped moments before, which is when a thread spins.
fn busy_waits() {
    for _ in 0..200 {
        block_on(sleep(Duration::from_micros(20)));
    }
}

#[test]
fn a_thread_with_spinning_off_never_spins() {
    let spins = || COMPLETIONS.spins.load(Ordering::Relaxed);
    let off = std::thread::spawn(move || {
        set_spin(false);
        let before = spins();
        busy_waits();
        spins() - before
    })
    .join()
    .unwrap();
    assert_eq!(off, 0, "spun with spinning off");
    let on = std::thread::spawn(move || {
        let before = spins();
        busy_waits();
        spins() - before
    })
    .join()
    .unwrap();
    assert!(on > 0, "a busy thread with spinning on never spun");
}
