//! `oxpool iostat` shows the live counters of a served pool: sync writes (commits), log blocks
//! and bytes, device flushes, and the ratios the design is judged by.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{python, Env};

fn counter(json: &str, name: &str) -> u64 {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {json}"))
        + key.len();
    json[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn iostat_reports_sync_writes_and_flushes_of_a_served_pool() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    // A real client: writes, FLUSH, and FUA writes.
    let out = python("durable.py", &["write", &server.uri("tank/vol0"), "9"]);
    assert!(out.contains("durable: ok"), "{out}");
    // The counters are published several times a second: wait for the commits to show (a
    // bounded wait for a file, not a timing assertion).
    let mut json = String::new();
    for _ in 0..100 {
        json = env.ok(&["iostat", "--json", "tank"]);
        if counter(&json, "commits") >= 5 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // One FLUSH and four FUA writes: five commits, each with at least one device flush, and
    // the client's bytes.
    assert!(counter(&json, "commits") >= 5, "{json}");
    assert!(counter(&json, "device_flushes") >= 1, "{json}");
    assert!(counter(&json, "log_bytes") > 0, "{json}");
    assert!(counter(&json, "client_bytes") > 0, "{json}");
    let table = env.ok(&["iostat", "tank"]);
    assert!(table.contains("device flushes per sync write"), "{table}");
    server.kill9();
    // A pool nobody serves has no live counters: a clear error.
    let mut cmd = env.oxpool_command();
    let out = cmd.args(["iostat", "tank"]).output().unwrap();
    assert!(!out.status.success());
}
