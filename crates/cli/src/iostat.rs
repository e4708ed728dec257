//! `oxpool iostat [-l] [-w] POOL [INTERVAL [COUNT]]`: the I/O statistics of a pool that
//! `oxpool serve` is serving.
//!
//! The serving process owns the pool, so it publishes its counters in a small JSON file beside
//! the pool cache file (`<cache>.<pool>.stats`, replaced atomically every 200 ms) and
//! `oxpool iostat` reads it. The file's top level holds plain numbers (the intent-log counters,
//! the process's CPU time and context switches, the completion counters, pool totals: what the
//! benchmark harness reads); `devices` and `volumes` hold each leaf's and each volume's
//! operations, bytes and latency histograms.
//!
//! As with `zpool iostat`, the first report covers the time since the server started and each
//! later one the last INTERVAL seconds. The per-I/O figures divide by the volume operations
//! (client requests) of the same span.

use anyhow::{anyhow, Result};
use oxpool_engine::iostats::{
    latency_bucket_floor_us, LatencySnapshot, LeafIoSnapshot, VolumeIoSnapshot, VolumeStats,
    LATENCY_BUCKET_COUNT,
};
use oxpool_engine::vdev::queue::{QueueSnapshot, IO_CLASS_COUNT};
use oxpool_engine::vdev::DeviceStats;
use oxpool_engine::PoolCounters;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the serving process publishes `pool`'s counters.
pub fn stats_path(cache: &Path, pool: &str) -> PathBuf {
    let mut name = cache
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{pool}.stats"));
    cache.with_file_name(name)
}

/// The serving process's own counters, published with each pool's.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessCounters {
    /// When the server started, ms since the epoch.
    pub started_ms: u64,
    /// User plus system CPU time of the process, microseconds.
    pub cpu_us: u64,
    /// Voluntary plus involuntary context switches of the process.
    pub ctx_switches: u64,
}

impl ProcessCounters {
    /// Reads the process's resource usage now.
    pub fn now(started_ms: u64) -> ProcessCounters {
        // SAFETY: getrusage fills the zeroed struct we own.
        let ru = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut ru);
            ru
        };
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        ProcessCounters {
            started_ms,
            cpu_us: us(ru.ru_utime) + us(ru.ru_stime),
            ctx_switches: (ru.ru_nvcsw + ru.ru_nivcsw) as u64,
        }
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One published snapshot. The intent-log counters (`commits`, `log_bytes`, ...) are kept as
/// they come, in `log`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Stats {
    pid: u32,
    txg: u64,
    /// When this snapshot was taken, ms since the epoch.
    time_ms: u64,
    started_ms: u64,
    cpu_us: u64,
    ctx_switches: u64,
    completions_inline: u64,
    completions_batched: u64,
    completions_offloaded: u64,
    ring_waits: u64,
    ring_batch_waits: u64,
    /// Reactor spins before a sleep, and those that saw an event (a sleep saved).
    #[serde(default)]
    ring_spins: u64,
    #[serde(default)]
    ring_spin_hits: u64,
    /// fdatasyncs run on the calling reactor, and handed to the ring's kernel workers.
    #[serde(default)]
    fsyncs_inline: u64,
    #[serde(default)]
    fsyncs_ring: u64,
    /// Data-block cache: reads served from memory, reads that went to a device, bytes held.
    #[serde(default)]
    data_cache_hits: u64,
    #[serde(default)]
    data_cache_misses: u64,
    #[serde(default)]
    data_cache_bytes: u64,
    /// Compression: content bytes of the data blocks written, the bytes they took as stored
    /// (one copy), blocks stored compressed, all-zero blocks stored as holes, and content
    /// bytes decompressed after reads (process-wide).
    #[serde(default)]
    compress_logical_bytes: u64,
    #[serde(default)]
    compress_stored_bytes: u64,
    #[serde(default)]
    compressed_blocks: u64,
    #[serde(default)]
    zero_blocks: u64,
    #[serde(default)]
    decompressed_bytes: u64,
    /// Volume operations and bytes, all volumes.
    reads: u64,
    writes: u64,
    flushes: u64,
    read_bytes: u64,
    write_bytes: u64,
    #[serde(flatten)]
    log: serde_json::Map<String, serde_json::Value>,
    devices: Vec<DeviceStats>,
    volumes: Vec<VolumeStats>,
}

/// Writes the counters (best effort: a failed write only delays the next reading).
pub fn publish(cache: &Path, c: &PoolCounters, process: &ProcessCounters) {
    let path = stats_path(cache, c.name());
    let tmp = path.with_extension("stats.tmp");
    let log: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&c.log_stats().to_json()).unwrap_or_default();
    let completions = oxpool_io::completion::COMPLETIONS.snapshot();
    let cache = c.data_cache_stats();
    let compress = oxpool_engine::zio::compress::COMPRESS_COUNTERS.snapshot();
    let volumes = c.volume_stats();
    let sum = |f: &dyn Fn(&VolumeIoSnapshot) -> u64| volumes.iter().map(|v| f(&v.io)).sum();
    let stats = Stats {
        pid: std::process::id(),
        txg: c.synced_txg().0,
        time_ms: now_ms(),
        started_ms: process.started_ms,
        cpu_us: process.cpu_us,
        ctx_switches: process.ctx_switches,
        completions_inline: completions.inline,
        completions_batched: completions.batched,
        completions_offloaded: completions.offloaded,
        ring_waits: completions.waits,
        ring_batch_waits: completions.batch_waits,
        ring_spins: completions.spins,
        ring_spin_hits: completions.spin_hits,
        fsyncs_inline: completions.fsyncs_inline,
        fsyncs_ring: completions.fsyncs_ring,
        data_cache_hits: cache.hits,
        data_cache_misses: cache.misses,
        data_cache_bytes: cache.bytes,
        compress_logical_bytes: compress.logical_bytes,
        compress_stored_bytes: compress.stored_bytes,
        compressed_blocks: compress.compressed_blocks,
        zero_blocks: compress.zero_blocks,
        decompressed_bytes: compress.decompressed_bytes,
        reads: sum(&|v| v.read.ops),
        writes: sum(&|v| v.write.ops),
        flushes: sum(&|v| v.flush.ops),
        read_bytes: sum(&|v| v.read.bytes),
        write_bytes: sum(&|v| v.write.bytes),
        log,
        devices: c.device_stats(),
        volumes,
    };
    let Ok(mut body) = serde_json::to_string(&stats) else {
        return;
    };
    body.push('\n');
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// Removes the published counters (the server stopped).
pub fn unpublish(cache: &Path, pool: &str) {
    let _ = std::fs::remove_file(stats_path(cache, pool));
}

/// The published counters' text and content, if the process that published them is alive (a
/// server killed with -9 leaves its last file behind).
fn read_live(cache: &Path, pool: &str) -> Result<(String, Stats)> {
    let not_served = || {
        anyhow!(
            "pool '{pool}' is not being served (its counters live in the `oxpool serve` process)"
        )
    };
    let path = stats_path(cache, pool);
    let text = std::fs::read_to_string(&path).map_err(|_| not_served())?;
    let stats: Stats = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{}: malformed counters: {e}", path.display()))?;
    // SAFETY: kill with signal 0 only checks that the process exists.
    if stats.pid == 0 || unsafe { libc::kill(stats.pid as i32, 0) } != 0 {
        return Err(not_served());
    }
    Ok((text, stats))
}

/// What `oxpool iostat` shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Raw JSON instead of tables.
    pub json: bool,
    /// `-l`: average latencies.
    pub latency: bool,
    /// `-w`: latency histograms.
    pub histograms: bool,
    /// Seconds between reports (none: one report).
    pub interval_s: Option<f64>,
    /// Reports to print (none: until the server stops).
    pub count: Option<u64>,
}

/// Prints the reports.
pub fn print(cache: &Path, pool: &str, opts: Options) -> Result<()> {
    let interval = match opts.interval_s {
        Some(s) if !(s > 0.0 && s <= 86_400.0) => {
            return Err(anyhow!(
                "interval must be above 0 and at most 86400 seconds"
            ))
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let count = opts
        .count
        .unwrap_or(if interval.is_some() { u64::MAX } else { 1 });
    let mut prev: Option<Stats> = None;
    let mut next_at = Instant::now();
    // Bounded by COUNT, or by the server's life: a stopped server ends the loop with an error
    // after the reports already printed.
    for n in 0..count {
        if n > 0 {
            let interval = interval.expect("several reports only with an interval");
            next_at += interval;
            std::thread::sleep(next_at.saturating_duration_since(Instant::now()));
        }
        let (text, cur) = read_live(cache, pool)?;
        if opts.json {
            write_stdout(&text)?;
        } else {
            let mut out = String::new();
            report(&mut out, pool, prev.as_ref(), &cur, opts);
            write_stdout(&out)?;
        }
        prev = Some(cur);
    }
    Ok(())
}

/// Writes a report to standard output. A reader that went away (`oxpool iostat 1 | head`)
/// makes this an error the caller passes up, which `main` turns into a quiet exit, instead
/// of `print!`'s panic.
fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// `writeln!` to a report being built (writing to a `String` cannot fail).
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        let _ = std::fmt::Write::write_fmt($out, format_args!($($arg)*));
        $out.push('\n');
    }};
}

// ---- the report ----

/// Differences between two snapshots (or since the server started).
struct Span<'a> {
    prev: Option<&'a Stats>,
    cur: &'a Stats,
    seconds: f64,
}

impl Span<'_> {
    fn delta(&self, f: impl Fn(&Stats) -> u64) -> u64 {
        f(self.cur).saturating_sub(self.prev.map(&f).unwrap_or(0))
    }

    fn device(&self, d: &DeviceStats) -> LeafIoSnapshot {
        let before = self
            .prev
            .and_then(|p| p.devices.iter().find(|x| x.name == d.name));
        match before {
            Some(b) => d.io.since(&b.io),
            None => d.io,
        }
    }

    fn queue(&self, d: &DeviceStats) -> ([u64; IO_CLASS_COUNT], [u64; IO_CLASS_COUNT]) {
        let before: Option<&QueueSnapshot> = self
            .prev
            .and_then(|p| p.devices.iter().find(|x| x.name == d.name))
            .map(|x| &x.queue);
        let mut q = d.queue.queued;
        let mut b = d.queue.bypassed;
        if let Some(p) = before {
            for c in 0..IO_CLASS_COUNT {
                q[c] = q[c].saturating_sub(p.queued[c]);
                b[c] = b[c].saturating_sub(p.bypassed[c]);
            }
        }
        (q, b)
    }

    fn volume(&self, v: &VolumeStats) -> VolumeIoSnapshot {
        // By id where both snapshots have it: a volume renamed between them is the same
        // volume (its interval is its own delta, not its whole count), and one destroyed
        // and created again under its name is another.
        let same = |x: &&VolumeStats| match (x.id, v.id) {
            (Some(a), Some(b)) => a == b,
            _ => x.name == v.name,
        };
        let before = self.prev.and_then(|p| p.volumes.iter().find(same));
        match before {
            Some(b) => v.io.since(&b.io),
            None => v.io,
        }
    }

    fn log(&self, key: &str) -> u64 {
        let get = |s: &Stats| s.log.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        self.delta(get)
    }
}

/// Width of the name column.
const NAME_WIDTH: usize = 28;

fn report(out: &mut String, pool: &str, prev: Option<&Stats>, cur: &Stats, opts: Options) {
    let since_ms = prev.map(|p| p.time_ms).unwrap_or(cur.started_ms);
    let span = Span {
        prev,
        cur,
        seconds: (cur.time_ms.saturating_sub(since_ms) as f64 / 1000.0).max(0.001),
    };
    let what = if prev.is_some() {
        format!("last {:.1} s", span.seconds)
    } else {
        format!("since the server started, {:.1} s ago", span.seconds)
    };
    outln!(out, "pool {pool}, txg {} ({what})", cur.txg);
    table(out, pool, &span, opts.latency);
    if opts.histograms {
        histograms(out, &span);
    }
    footer(out, &span);
    outln!(out);
}

/// `1.2K`-style counts (decimal, as zpool iostat's operations).
fn count_str(v: f64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = v;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        if v >= 100.0 || v == v.trunc() {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    } else if v >= 10.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

fn bytes_str(v: f64) -> String {
    crate::human(v.round() as u64)
}

fn latency_str(us: f64, ops: u64) -> String {
    if ops == 0 {
        "-".into()
    } else if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 1_000_000.0 {
        format!("{:.1}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

fn table(out: &mut String, pool: &str, span: &Span, latency: bool) {
    let mut h1 = format!(
        "{:<NAME_WIDTH$} {:^15} {:^15}",
        "", "operations", "bandwidth"
    );
    let mut h2 = format!(
        "{:<NAME_WIDTH$} {:>7} {:>7} {:>7} {:>7}",
        "name", "read", "write", "read", "write"
    );
    if latency {
        h1.push_str(&format!(" {:^15} {:^15}", "total_wait", "disk_wait"));
        h2.push_str(&format!(
            " {:>7} {:>7} {:>7} {:>7}",
            "read", "write", "read", "write"
        ));
    }
    outln!(out, "{}", h1.trim_end());
    outln!(out, "{h2}");
    outln!(out, "{}", "-".repeat(h2.len()));
    let row = |out: &mut String,
               name: &str,
               io: &LeafIoSnapshot,
               vol_latency: Option<&VolumeIoSnapshot>| {
        let s = span.seconds;
        let mut line = format!(
            "{:<NAME_WIDTH$} {:>7} {:>7} {:>7} {:>7}",
            shorten(name, NAME_WIDTH),
            count_str(io.read.ops as f64 / s),
            count_str(io.write.ops as f64 / s),
            bytes_str(io.read.bytes as f64 / s),
            bytes_str(io.write.bytes as f64 / s),
        );
        if latency {
            match vol_latency {
                // A volume's time is what its caller waited: all of it is "total".
                Some(v) => line.push_str(&format!(
                    " {:>7} {:>7} {:>7} {:>7}",
                    latency_str(v.read.latency.average_us(), v.read.ops),
                    latency_str(v.write.latency.average_us(), v.write.ops),
                    "-",
                    "-"
                )),
                None => line.push_str(&format!(
                    " {:>7} {:>7} {:>7} {:>7}",
                    latency_str(io.read.total_wait.average_us(), io.read.ops),
                    latency_str(io.write.total_wait.average_us(), io.write.ops),
                    latency_str(io.read.disk_wait.average_us(), io.read.ops),
                    latency_str(io.write.disk_wait.average_us(), io.write.ops),
                )),
            }
        }
        outln!(out, "{line}");
    };
    // The pool: every device's I/O together.
    let devices: Vec<(&DeviceStats, LeafIoSnapshot)> = span
        .cur
        .devices
        .iter()
        .map(|d| (d, span.device(d)))
        .collect();
    row(out, pool, &sum_leaf(devices.iter().map(|(_, io)| io)), None);
    let mut i = 0;
    // Bounded by the devices: each pass consumes at least one.
    while i < devices.len() {
        let vdev = &devices[i].0.vdev;
        let group: Vec<_> = devices[i..]
            .iter()
            .take_while(|(d, _)| &d.vdev == vdev)
            .collect();
        if group.len() > 1 || group[0].0.name != *vdev {
            row(
                out,
                &format!("  {vdev}"),
                &sum_leaf(group.iter().map(|(_, io)| io)),
                None,
            );
            for (d, io) in &group {
                row(out, &format!("    {}", d.name), io, None);
            }
        } else {
            row(out, &format!("  {}", group[0].0.name), &group[0].1, None);
        }
        i += group.len();
    }
    if !span.cur.volumes.is_empty() {
        outln!(out, "{}", "-".repeat(h2.len()));
        for v in &span.cur.volumes {
            let io = span.volume(v);
            // Shown in the leaf layout: reads and writes (write-zeroes and trims included).
            let as_leaf = LeafIoSnapshot {
                read: oxpool_engine::iostats::LeafOpSnapshot {
                    ops: io.read.ops,
                    bytes: io.read.bytes,
                    ..Default::default()
                },
                write: oxpool_engine::iostats::LeafOpSnapshot {
                    ops: io.write.ops,
                    bytes: io.write.bytes,
                    ..Default::default()
                },
                ..Default::default()
            };
            row(out, &format!("  {}", v.name), &as_leaf, Some(&io));
        }
    }
}

fn sum_leaf<'a>(ios: impl Iterator<Item = &'a LeafIoSnapshot>) -> LeafIoSnapshot {
    let mut t = LeafIoSnapshot::default();
    for io in ios {
        for (to, from) in [
            (&mut t.read, &io.read),
            (&mut t.write, &io.write),
            (&mut t.flush, &io.flush),
        ] {
            to.ops += from.ops;
            to.bytes += from.bytes;
            to.total_wait = add_latency(&to.total_wait, &from.total_wait);
            to.disk_wait = add_latency(&to.disk_wait, &from.disk_wait);
        }
    }
    t
}

fn add_latency(a: &LatencySnapshot, b: &LatencySnapshot) -> LatencySnapshot {
    let mut out = *a;
    for k in 0..LATENCY_BUCKET_COUNT {
        out.buckets[k] += b.buckets[k];
    }
    out.sum_us += b.sum_us;
    out
}

/// Keeps the end of a long path (the file name is what tells devices apart).
fn shorten(name: &str, width: usize) -> String {
    let n = name.chars().count();
    if n <= width {
        return name.to_string();
    }
    let indent: String = name.chars().take_while(|c| *c == ' ').collect();
    let keep = width.saturating_sub(indent.len() + 3);
    let tail: String = name.chars().skip(n - keep).collect();
    format!("{indent}...{tail}")
}

fn bucket_label(k: usize) -> String {
    let us = latency_bucket_floor_us(k);
    if us < 1000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{}ms", us / 1000)
    } else {
        format!("{}s", us / 1_000_000)
    }
}

/// Prints histograms side by side: one row per bucket from the first to the last non-empty.
fn histogram_table(out: &mut String, title: &str, columns: &[(&str, &LatencySnapshot)]) {
    outln!(out);
    let first = (0..LATENCY_BUCKET_COUNT).find(|&k| columns.iter().any(|(_, h)| h.buckets[k] > 0));
    let last = (0..LATENCY_BUCKET_COUNT)
        .rev()
        .find(|&k| columns.iter().any(|(_, h)| h.buckets[k] > 0));
    let mut head = format!("{:<NAME_WIDTH$}", shorten(title, NAME_WIDTH));
    for (name, _) in columns {
        head.push_str(&format!(" {name:>11}"));
    }
    outln!(out, "{head}");
    let (Some(first), Some(last)) = (first, last) else {
        outln!(out, "{:<NAME_WIDTH$} (no I/O)", "");
        return;
    };
    for k in first..=last {
        let mut line = format!("{:<NAME_WIDTH$}", format!("{:>8}", bucket_label(k)));
        for (_, h) in columns {
            line.push_str(&format!(" {:>11}", h.buckets[k]));
        }
        outln!(out, "{line}");
    }
}

fn histograms(out: &mut String, span: &Span) {
    outln!(out);
    outln!(
        out,
        "latency histograms (I/Os per bucket; a bucket holds latencies from its label to twice it)"
    );
    for d in &span.cur.devices {
        let io = span.device(d);
        histogram_table(
            out,
            &d.name,
            &[
                ("total read", &io.read.total_wait),
                ("total write", &io.write.total_wait),
                ("disk read", &io.read.disk_wait),
                ("disk write", &io.write.disk_wait),
                ("flush", &io.flush.disk_wait),
            ],
        );
    }
    for v in &span.cur.volumes {
        let io = span.volume(v);
        histogram_table(
            out,
            &format!("volume {}", v.name),
            &[
                ("read", &io.read.latency),
                ("write", &io.write.latency),
                ("flush", &io.flush.latency),
            ],
        );
    }
}

fn per(v: u64, ios: u64) -> String {
    if ios == 0 {
        "-".into()
    } else {
        format!("{:.3}", v as f64 / ios as f64)
    }
}

fn footer(out: &mut String, span: &Span) {
    let ios = span.delta(|s| s.reads) + span.delta(|s| s.writes) + span.delta(|s| s.flushes);
    outln!(out);
    outln!(
        out,
        "per volume I/O ({ios} I/Os, {}/s):",
        count_str(ios as f64 / span.seconds)
    );
    let cpu_us = span.delta(|s| s.cpu_us);
    outln!(
        out,
        "  server cpu: {} us    context switches: {}",
        per(cpu_us, ios),
        per(span.delta(|s| s.ctx_switches), ios)
    );
    outln!(
        out,
        "  completions: inline {}  batched {}  offloaded {}",
        per(span.delta(|s| s.completions_inline), ios),
        per(span.delta(|s| s.completions_batched), ios),
        per(span.delta(|s| s.completions_offloaded), ios),
    );
    outln!(
        out,
        "  ring waits: {} ({} of them batching)  spins: {} ({} saw an event)",
        per(span.delta(|s| s.ring_waits), ios),
        per(span.delta(|s| s.ring_batch_waits), ios),
        per(span.delta(|s| s.ring_spins), ios),
        per(span.delta(|s| s.ring_spin_hits), ios),
    );
    outln!(
        out,
        "  fdatasyncs: on the reactor {}  by kernel workers {}",
        per(span.delta(|s| s.fsyncs_inline), ios),
        per(span.delta(|s| s.fsyncs_ring), ios),
    );
    let (hits, misses) = (
        span.delta(|s| s.data_cache_hits),
        span.delta(|s| s.data_cache_misses),
    );
    outln!(
        out,
        "  data cache: {} hits, {} misses ({} hit), {} cached",
        count_str(hits as f64),
        count_str(misses as f64),
        match hits + misses {
            0 => "-".to_string(),
            n => format!("{:.0}%", 100.0 * hits as f64 / n as f64),
        },
        bytes_str(span.cur.data_cache_bytes as f64),
    );
    let (logical, stored) = (
        span.delta(|s| s.compress_logical_bytes),
        span.delta(|s| s.compress_stored_bytes),
    );
    outln!(
        out,
        "  compression: {} of data written as {} ({}), {} blocks compressed, {} zero \
         blocks as holes",
        bytes_str(logical as f64),
        bytes_str(stored as f64),
        match stored {
            0 => "-".to_string(),
            n => format!("{:.2}x", logical as f64 / n as f64),
        },
        count_str(span.delta(|s| s.compressed_blocks) as f64),
        count_str(span.delta(|s| s.zero_blocks) as f64),
    );
    outln!(
        out,
        "  decompressed after reads: {}",
        bytes_str(span.delta(|s| s.decompressed_bytes) as f64)
    );
    outln!(out);
    outln!(
        out,
        "{:<NAME_WIDTH$} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>7}",
        "vdev queue",
        "scheduler",
        "queued",
        "bypassed",
        "active",
        "waiting",
        "disk_wait",
        "read_wait",
        "alone"
    );
    let mut limited_any = false;
    for d in &span.cur.devices {
        let (q, b) = span.queue(d);
        // Counts over the span; active, waiting and the recent disk waits (every I/O's, and
        // the sync reads' and those that ran alone: the `auto` rule's measures) are as of
        // now. A star: auto holds the class limits now (the device is slow or saturated).
        let scheduler = if d.queue.limited {
            limited_any = true;
            format!("{}*", d.scheduler)
        } else {
            d.scheduler.clone()
        };
        outln!(
            out,
            "{:<NAME_WIDTH$} {:>9} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>7}",
            shorten(&format!("  {}", d.name), NAME_WIDTH),
            scheduler,
            // Human counts and times keep the line within 100 columns whatever the values
            // (a server up for hours has counted billions).
            count_str(q.iter().sum::<u64>() as f64),
            count_str(b.iter().sum::<u64>() as f64),
            d.queue.active.iter().sum::<u32>(),
            d.queue.waiting,
            latency_str(d.queue.disk_wait_recent_us as f64, 1),
            latency_str(d.queue.sync_read_disk_wait_us as f64, 1),
            // No time alone yet (or none fresh): "-".
            latency_str(
                d.queue.sync_read_disk_wait_alone_us as f64,
                d.queue.sync_read_disk_wait_alone_us.min(1)
            ),
        );
    }
    if limited_any {
        outln!(
            out,
            "  * auto applies the class limits now: the device is slow or saturated"
        );
    }
    outln!(out);
    let commits = span.log("commits");
    let client = span.log("client_bytes");
    outln!(
        out,
        "intent log: {commits} commits, {} log bytes, {} device flushes ({} of them durable \
         log-block writes)",
        span.log("log_bytes"),
        span.log("device_flushes"),
        span.log("log_durable_writes")
    );
    outln!(
        out,
        "  device flushes per sync write: {}    log bytes per client byte: {}",
        per(span.log("device_flushes"), commits),
        per(span.log("log_bytes"), client)
    );
    // Blocks written early are not durable when written: their flush is counted apart.
    let early = span.log("log_early_blocks");
    outln!(
        out,
        "  log block write to durable: {} us on average",
        per(
            span.log("log_write_us"),
            span.log("log_blocks").saturating_sub(early)
        )
    );
    outln!(
        out,
        "  log blocks written early: {early}, flushed by their commits in {} us on average",
        per(span.log("log_early_flush_us"), early)
    );
    let delays = span.log("throttle_delays");
    let waits = span.log("throttle_waits");
    outln!(
        out,
        "write throttle: {delays} writes delayed, {} us on average; {waits} waited at \
         dirty_max, {} us on average",
        per(span.log("throttle_delay_us"), delays),
        per(span.log("throttle_wait_us"), waits)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::VolumeId;

    fn volume(name: &str, id: Option<u64>, reads: u64) -> VolumeStats {
        let mut io = VolumeIoSnapshot::default();
        io.read.ops = reads;
        VolumeStats {
            name: name.into(),
            id: id.map(VolumeId),
            io,
        }
    }

    fn stats(volumes: Vec<VolumeStats>) -> Stats {
        Stats {
            volumes,
            ..Stats::default()
        }
    }

    #[test]
    fn a_volumes_interval_is_its_own_delta_across_renames_and_recreations() {
        // vol0 renamed vol9 between the readings, and a new vol0 (another id) created.
        let before = stats(vec![volume("vol0", Some(2), 1000)]);
        let after = stats(vec![
            volume("vol9", Some(2), 1010),
            volume("vol0", Some(3), 5),
        ]);
        let span = Span {
            prev: Some(&before),
            cur: &after,
            seconds: 1.0,
        };
        assert_eq!(span.volume(&after.volumes[0]).read.ops, 10);
        assert_eq!(span.volume(&after.volumes[1]).read.ops, 5);
        // Statistics without ids (an older server) still match by name.
        let old = stats(vec![volume("vol0", None, 1000)]);
        let span = Span {
            prev: Some(&old),
            cur: &old,
            seconds: 1.0,
        };
        assert_eq!(span.volume(&old.volumes[0]).read.ops, 0);
    }
}
