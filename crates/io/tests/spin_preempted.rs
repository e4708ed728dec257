//! A thread whose CPU another thread keeps wanting stops spinning: its spins would take the
//! CPU from that thread (docs/completion.md, "Spinning before sleeping"). One test in its own
//! binary: the counters are per process.

use oxpool_io::completion::COMPLETIONS;
use oxpool_io::rt::{block_on, sleep};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Waits of a busy thread: each sleep in the ring follows a completion reaped moments before,
/// and the timer fires within the spin's bound, so every wait would spin.
const WAITS: u64 = 2000;

fn busy_waits() {
    for _ in 0..WAITS {
        block_on(sleep(Duration::from_micros(20)));
    }
}

/// The CPUs the process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is valid for writes and its size is given.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(
        rc,
        0,
        "sched_getaffinity: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: CPU_ISSET reads the set.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    assert!(!cpus.is_empty(), "the process may run on some CPU");
    cpus
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET adds one CPU to it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is valid and its size is given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

/// Spins of a thread on `cpu` doing [`busy_waits`].
fn spins_on(cpu: usize) -> u64 {
    std::thread::spawn(move || {
        pin_to(cpu);
        let before = COMPLETIONS.spins.load(Ordering::Relaxed);
        busy_waits();
        COMPLETIONS.spins.load(Ordering::Relaxed) - before
    })
    .join()
    .unwrap()
}

#[test]
fn a_thread_preempted_by_others_stops_spinning() {
    // Alone on its CPU (nothing else of this test runs there), nearly every wait spins;
    // another process that happens to run there preempts it too (a build beside the tests,
    // say), so the CPU that spun most in up to 4 rounds of 3 tries on each allowed CPU.
    let mut best = (0, 0);
    'rounds: for round in 0..4 {
        for cpu in allowed_cpus() {
            for _ in 0..3 {
                let spins = spins_on(cpu);
                if spins > best.1 {
                    best = (cpu, spins);
                }
                // One idle CPU is all it needs (a machine may have many).
                if best.1 > WAITS / 2 {
                    break 'rounds;
                }
            }
        }
        println!("round {round}: every CPU busy with other work (best {best:?}); again");
        std::thread::sleep(Duration::from_secs(1));
    }
    let (cpu, alone) = best;
    assert!(
        alone > WAITS / 2,
        "alone, only {alone} of {WAITS} waits spun on the best CPU ({cpu}): every CPU was \
         busy with other work"
    );
    // A thread on the same CPU that works and sleeps in turns, as a client or the txg sync
    // thread does: each time it wakes it takes the CPU from the spinning thread.
    let stop = Arc::new(AtomicBool::new(false));
    let rival = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            pin_to(cpu);
            // Bounded by the stop flag, set when the measured thread is done.
            while !stop.load(Ordering::Relaxed) {
                let busy_until = Instant::now() + Duration::from_micros(200);
                while Instant::now() < busy_until {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    let crowded = spins_on(cpu);
    stop.store(true, Ordering::Relaxed);
    rival.join().unwrap();
    println!("spins in {WAITS} waits: alone {alone}, sharing the CPU {crowded}");
    // A window of 64 spins sees the preemptions, then the thread sleeps 1024 times without
    // spinning before it tries again: two or three windows in 2000 waits.
    assert!(
        crowded < alone / 4,
        "sharing its CPU, the thread still spun {crowded} times ({alone} alone)"
    );
}
