//! Idle means idle (issue 5): a server with a connected, silent client spins at most briefly
//! after its last request and then sleeps in its rings. Measured as CPU time the kernel
//! charged to the process while nothing happened: a resource bound, not a timing assertion.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{tool, Env};
use std::io::Read;
use std::time::Duration;

/// utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat).
fn cpu_ticks(pid: u32) -> u64 {
    let mut stat = String::new();
    std::fs::File::open(format!("/proc/{pid}/stat"))
        .unwrap()
        .read_to_string(&mut stat)
        .unwrap();
    // The command name (field 2) may contain spaces; fields after it are plain.
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn ticks_per_s() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(t > 0);
    t as u64
}

#[test]
fn an_idle_server_uses_under_one_percent_of_a_cpu() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    // Some work first, so the reactors have been busy (and spinning has been paying) before
    // they go idle; then a client that stays connected and says nothing.
    let uri = server.uri("tank/vol0");
    let out = tool(
        "fio",
        &[
            "--name=warm",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=8",
            "--size=64M",
            "--io_size=16M",
        ],
    );
    assert!(out.contains("err= 0"), "{out}");
    let addr = server.tcp_addr();
    let idle_client = std::net::TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let window_s = 6;
    let before = cpu_ticks(server.pid());
    std::thread::sleep(Duration::from_secs(window_s));
    let used = cpu_ticks(server.pid()) - before;
    // 1 % of one CPU over the window, in ticks (at least one tick of slack for the rounding of
    // the kernel's accounting).
    let allowed = (ticks_per_s() * window_s / 100).max(1) + 1;
    assert!(
        used <= allowed,
        "idle server used {used} ticks in {window_s} s (allowed {allowed}, 1 % of a CPU)"
    );
    drop(idle_client);
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
