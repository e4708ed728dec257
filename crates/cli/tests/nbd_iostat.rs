//! `oxpool iostat` shows the live counters of a served pool: operations, bandwidth and latency
//! histograms per device and volume, the per-I/O counters (CPU, context switches,
//! completions), the vdev queues, sync writes (commits), log blocks and bytes, device flushes.

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
    // Log blocks take device time to become durable: the sum is counted per block.
    assert!(counter(&json, "log_blocks") >= 1, "{json}");
    assert!(counter(&json, "log_write_us") > 0, "{json}");
    let table = env.ok(&["iostat", "tank"]);
    assert!(table.contains("device flushes per sync write"), "{table}");
    assert!(table.contains("log block write to durable"), "{table}");

    // The I/O statistics: the client's operations reached the volume and the devices, with
    // latencies in the histograms, and the per-I/O counters are published.
    let stats: serde_json::Value = serde_json::from_str(&json).unwrap();
    for key in [
        "cpu_us",
        "ctx_switches",
        "completions_inline",
        "completions_batched",
        "completions_offloaded",
        "ring_waits",
    ] {
        assert!(stats[key].is_u64(), "no {key} in {json}");
    }
    assert!(counter(&json, "writes") >= 5, "{json}");
    assert!(counter(&json, "flushes") >= 1, "{json}");
    let histogram_count = |h: &serde_json::Value| -> u64 {
        h["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum()
    };
    let vol = &stats["volumes"][0];
    assert_eq!(vol["name"], "vol0", "{json}");
    assert!(vol["io"]["write"]["ops"].as_u64().unwrap() >= 5, "{json}");
    assert!(
        histogram_count(&vol["io"]["write"]["latency"]) >= 5,
        "{json}"
    );
    let dev = &stats["devices"][0];
    let dev_writes = dev["io"]["write"]["ops"].as_u64().unwrap();
    assert!(dev_writes > 0, "{json}");
    assert_eq!(
        histogram_count(&dev["io"]["write"]["total_wait"]),
        dev_writes
    );
    assert_eq!(
        histogram_count(&dev["io"]["write"]["disk_wait"]),
        dev_writes
    );
    let queued: u64 = ["queued", "bypassed"]
        .iter()
        .flat_map(|k| dev["queue"][k].as_array().unwrap().clone())
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(
        queued >= dev_writes,
        "every device write went through the queue or around it"
    );
    // The `auto` rule's measures of saturation are there, in the JSON and the table (its
    // time alone is 0 until a sync read ran alone, which this test does not ensure).
    assert!(
        dev["queue"]["sync_read_disk_wait_alone_us"].is_u64(),
        "{json}"
    );
    assert!(dev["queue"]["sync_read_disk_wait_us"].is_u64(), "{json}");
    assert!(dev["queue"]["limited"].is_boolean(), "{json}");

    assert!(table.contains("context switches") && table.contains("completions: inline"));
    assert!(
        table.contains("vdev queue") && table.contains("auto") && table.contains("read_wait"),
        "{table}"
    );
    let lat = env.ok(&["iostat", "-l", "tank"]);
    assert!(
        lat.contains("total_wait") && lat.contains("disk_wait"),
        "{lat}"
    );
    assert!(
        lat.contains("vol0") && lat.lines().all(|l| l.len() <= 100),
        "{lat}"
    );
    let hist = env.ok(&["iostat", "-w", "tank"]);
    assert!(
        hist.contains("latency histograms") && hist.contains("volume vol0"),
        "{hist}"
    );
    assert!(
        hist.contains("total write") && hist.contains("us "),
        "{hist}"
    );
    // An interval and a count: the first report since the start, then one per interval.
    let two = env.ok(&["iostat", "tank", "0.2", "2"]);
    assert!(
        two.contains("since the server started") && two.contains("(last "),
        "{two}"
    );
    // A reader that goes away (`oxpool iostat tank 0.05 | head -1`) ends the reports
    // quietly, with SIGPIPE's status, not a panic's message and backtrace.
    let mut cmd = env.oxpool_command();
    let mut child = cmd
        .args(["iostat", "tank", "0.05"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    assert!(first.starts_with(b"pool tank"), "{first:?}");
    drop(stdout);
    // Bounded: the next report, 50 ms later, meets the closed pipe.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(141),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "stderr: {stderr}");
    server.kill9();
    // A pool nobody serves has no live counters: a clear error.
    let mut cmd = env.oxpool_command();
    let out = cmd.args(["iostat", "tank"]).output().unwrap();
    assert!(!out.status.success());
    // Killed: the pool audits clean.
    env.ok(&["audit", "tank"]);
}

/// Compression through a real client: nbdcopy writes text to a volume with `compression=zstd`
/// and reads it back; `oxpool iostat` shows the bytes before and after compression and the
/// bytes decompressed by the reads.
#[test]
fn iostat_shows_bytes_before_and_after_compression() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &["compression=zstd", "volblocksize=64K"])]);
    // Txgs every second, so the written blocks reach the devices (and the counters) soon.
    env.ok(&["set", "txg_timeout=1", "tank"]);
    let text: String = (0..400_000)
        .map(|i| format!("line {i}: the quick brown fox\n"))
        .collect();
    let input = env.path("text.bin");
    std::fs::write(&input, &text.as_bytes()[..8 << 20]).unwrap();
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");
    harness::tool("nbdcopy", &[input.to_str().unwrap(), &uri]);
    // Bounded wait for a txg sync to publish the written blocks (not a timing assertion).
    let mut json = String::new();
    for _ in 0..200 {
        json = env.ok(&["iostat", "--json", "tank"]);
        if counter(&json, "compress_logical_bytes") >= 8 << 20 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let logical = counter(&json, "compress_logical_bytes");
    let stored = counter(&json, "compress_stored_bytes");
    assert!(logical >= 8 << 20, "{json}");
    assert!(
        stored * 2 < logical,
        "zstd kept {stored} of {logical} bytes: {json}"
    );
    assert!(counter(&json, "compressed_blocks") >= 128, "{json}");
    // Read back through the server: blocks come from the devices and are decompressed.
    let output = env.path("back.bin");
    harness::tool("nbdcopy", &[&uri, output.to_str().unwrap()]);
    let back = std::fs::read(&output).unwrap();
    assert!(
        back[..8 << 20] == text.as_bytes()[..8 << 20],
        "read back differs"
    );
    for _ in 0..100 {
        json = env.ok(&["iostat", "--json", "tank"]);
        if counter(&json, "decompressed_bytes") >= 8 << 20 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(counter(&json, "decompressed_bytes") >= 8 << 20, "{json}");
    let table = env.ok(&["iostat", "tank"]);
    let line = table
        .lines()
        .find(|l| l.contains("compression:"))
        .unwrap_or_else(|| panic!("no compression line in:\n{table}"));
    assert!(
        line.contains("of data written as") && line.contains('x') && line.len() <= 100,
        "{line}"
    );
    assert!(table.contains("decompressed after reads"), "{table}");
    server.kill9();
    // Killed: the pool audits clean.
    env.ok(&["audit", "tank"]);
}

/// Reads the pool's counters until `name` reaches `at_least` (a bounded wait for counters
/// published a few times a second, not a timing assertion); returns the last JSON.
fn counters_when(env: &Env, name: &str, at_least: u64) -> String {
    let mut json = String::new();
    for _ in 0..100 {
        json = env.ok(&["iostat", "--json", "tank"]);
        if counter(&json, name) >= at_least {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    json
}

/// A database's commits over NBD (a small write, then a FLUSH, one at a time): with
/// `logearly=on`, set on the served pool, the log blocks are written early, as the writes
/// arrive, and the FLUSHes only flush; with `logearly=off` (the default) they are written at
/// the FLUSHes again.
#[test]
fn small_writes_followed_by_flushes_are_logged_early_with_logearly_on() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let got = env.ok(&["get", "logearly", "tank"]);
    assert!(got.contains(" off"), "not off by default: {got}");
    env.ok(&["set", "logearly=on", "tank"]);
    let got = env.ok(&["get", "logearly", "tank"]);
    assert!(got.contains(" on"), "{got}");
    let out = python("commits.py", &[&server.uri("tank/vol0"), "1", "40"]);
    assert!(out.contains("commits: ok"), "{out}");
    let json = counters_when(&env, "commits", 40);
    let early = counter(&json, "log_early_blocks");
    // The first commit anchors the log (its writes wait for a txg), and a commit may come
    // before an early write starts: most, not all, of the forty.
    assert!(
        early >= 20,
        "{early} of 40 log blocks written early: {json}"
    );
    assert!(counter(&json, "log_early_flush_us") > 0, "{json}");
    let table = env.ok(&["iostat", "tank"]);
    assert!(table.contains("log blocks written early: "), "{table}");
    // No writer came near dirty_max: the throttle's line, with nothing in it.
    assert!(
        table.contains("write throttle: 0 writes delayed, - us on average; 0 waited"),
        "{table}"
    );
    assert_eq!(counter(&json, "throttle_waits"), 0, "{json}");
    env.ok(&["set", "logearly=off", "tank"]);
    let got = env.ok(&["get", "logearly", "tank"]);
    assert!(got.contains(" off"), "{got}");
    let out = python("commits.py", &[&server.uri("tank/vol0"), "2", "40"]);
    assert!(out.contains("commits: ok"), "{out}");
    let json = counters_when(&env, "commits", 80);
    assert_eq!(counter(&json, "log_early_blocks"), early, "{json}");
    assert!(counter(&json, "log_blocks") >= early + 30, "{json}");
    drop(server);
    let audit = env.ok(&["audit", "tank"]);
    assert!(audit.contains(" 0 problems"), "{audit}");
}
