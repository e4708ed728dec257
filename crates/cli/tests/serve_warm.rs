//! A server maps its first block buffers while it starts (`IoBuf::warm`), so that a fresh
//! server's first writes do not take the page faults and zeroing of new memory on the reactor
//! that receives them (issue 19). Checked in the process's own memory map: the buffer arena's
//! mapping holds at least that much memory before any client has connected.

#[path = "nbd/harness.rs"]
mod harness;

use harness::Env;
use std::time::{Duration, Instant};

/// The resident kibibytes of the buffer arena's range in `/proc/PID/smaps`: the anonymous
/// mapping advised for huge pages, as large as the machine's memory in whole 2 MiB chunks, at
/// most 64 GiB (the advice splits it from the alignment slack around it).
fn arena_resident_kib(pid: u32) -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let memory_bytes = unsafe {
        libc::sysconf(libc::_SC_PHYS_PAGES) as u64 * libc::sysconf(libc::_SC_PAGESIZE) as u64
    };
    let chunk_bytes = 2u64 << 20;
    let range_bytes = memory_bytes.min(64 << 30) / chunk_bytes * chunk_bytes;
    let mapping_kib = range_bytes / 1024;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut lines = smaps.lines();
    // Bounded by the file's lines.
    while let Some(line) = lines.next() {
        let Some((range, _)) = line.split_once(' ') else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        if (end - start) / 1024 != mapping_kib {
            continue;
        }
        return lines
            .take_while(|l| !l.starts_with("VmFlags"))
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
    }
    None
}

#[test]
fn a_starting_server_maps_its_first_block_buffers() {
    let strict_overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .is_ok_and(|mode| mode.trim() == "2");
    if strict_overcommit {
        println!("vm.overcommit_memory is 2: the process has no buffer arena to warm");
        return;
    }
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let wanted_kib = (oxpool_io::IoBuf::warm_default_bytes() / 1024) as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let resident_kib = loop {
        let resident = arena_resident_kib(server.pid());
        if resident.is_some_and(|kib| kib >= wanted_kib) || Instant::now() > deadline {
            break resident;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("arena resident: {resident_kib:?} KiB, warmed at start: {wanted_kib} KiB");
    let resident_kib = resident_kib.expect("the buffer arena's mapping is in smaps");
    assert!(
        resident_kib >= wanted_kib,
        "the arena holds {resident_kib} KiB a minute after the start, not the {wanted_kib} KiB \
         warmed at start"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
