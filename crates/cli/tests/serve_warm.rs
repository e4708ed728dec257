//! A server maps its first block buffers while it starts (`IoBuf::warm`), so that a fresh
//! server's first writes do not take the page faults and zeroing of new memory on the reactor
//! that receives them (issue 19). Checked in the process's own memory map: the buffer arena's
//! mapping holds at least that much memory before any client has connected.

#[path = "nbd/harness.rs"]
mod harness;

use harness::Env;
use std::time::{Duration, Instant};

/// The resident kibibytes of the buffer arena's range in `/proc/PID/smaps`: the largest
/// mapping advised for huge pages (`hg`), as large as the process's memory, at most 64 GiB.
fn arena_resident_kib(pid: u32) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    // (size, resident) of each mapping advised for huge pages; bounded by the file's lines.
    let mut advised = Vec::new();
    let mut current: Option<(u64, Option<u64>)> = None;
    for line in smaps.lines() {
        let head = line.split_once(' ').map_or(line, |(head, _)| head);
        if let Some((start, end)) = head.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                current = Some(((end - start) / 1024, None));
                continue;
            }
        }
        if let (Some(rss), Some(entry)) = (line.strip_prefix("Rss:"), current.as_mut()) {
            entry.1 = rss.trim().trim_end_matches("kB").trim().parse().ok();
        }
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((size_kib, Some(rss_kib))) = current.take() {
                if flags.split_whitespace().any(|flag| flag == "hg") {
                    advised.push((size_kib, rss_kib));
                }
            }
        }
    }
    advised.into_iter().max().map(|(_, rss_kib)| rss_kib)
}

/// Why warming cannot be seen here, if it cannot.
fn why_not_checkable(wanted_bytes: usize) -> Option<String> {
    if oxpool_io::machine::overcommit_is_strict() {
        return Some("vm.overcommit_memory is 2: the process has no buffer arena".into());
    }
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
        return Some("no transparent huge pages: the arena's range is not told apart".into());
    }
    if wanted_bytes < 16 << 20 {
        return Some(format!(
            "{wanted_bytes} bytes warmed: too few to tell from the buffers of the pools' opening"
        ));
    }
    (!oxpool_io::machine::populate_write_supported())
        .then(|| "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)".into())
}

#[test]
fn a_starting_server_maps_its_first_block_buffers() {
    let wanted_bytes = oxpool_io::IoBuf::warm_default_bytes();
    if let Some(why) = why_not_checkable(wanted_bytes) {
        println!("not checked: {why}");
        return;
    }
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let wanted_kib = (wanted_bytes / 1024) as u64;
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
