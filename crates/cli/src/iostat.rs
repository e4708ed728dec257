//! `oxpool iostat`: the counters of a pool that `oxpool serve` is serving.
//!
//! The serving process owns the pool, so it publishes its counters in a small file beside the
//! pool cache file (`<cache>.<pool>.stats`, replaced atomically several times a second) and
//! `oxpool iostat` reads it.

use anyhow::{anyhow, Result};
use oxpool_engine::PoolCounters;
use std::path::{Path, PathBuf};

/// Where the serving process publishes `pool`'s counters.
pub fn stats_path(cache: &Path, pool: &str) -> PathBuf {
    let mut name = cache
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{pool}.stats"));
    cache.with_file_name(name)
}

/// Writes the counters (best effort: a failed write only delays the next reading).
pub fn publish(cache: &Path, c: &PoolCounters) {
    let path = stats_path(cache, c.name());
    let tmp = path.with_extension("stats.tmp");
    let body = c.log_stats().to_json();
    let body = format!(
        "{},\"txg\":{},\"pid\":{}}}\n",
        &body[..body.len() - 1],
        c.synced_txg().0,
        std::process::id()
    );
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// Removes the published counters (the server stopped).
pub fn unpublish(cache: &Path, pool: &str) {
    let _ = std::fs::remove_file(stats_path(cache, pool));
}

/// The published counters' text, if the process that published them is alive (a server
/// killed with -9 leaves its last file behind).
fn live_text(cache: &Path, pool: &str) -> Result<String> {
    let not_served = || {
        anyhow!(
            "pool '{pool}' is not being served (its counters live in the `oxpool serve` process)"
        )
    };
    let text = std::fs::read_to_string(stats_path(cache, pool)).map_err(|_| not_served())?;
    let pid = text
        .split("\"pid\":")
        .nth(1)
        .and_then(|r| r.trim_end_matches(['}', '\n']).parse::<i32>().ok())
        .ok_or_else(not_served)?;
    // SAFETY: kill with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return Err(not_served());
    }
    Ok(text)
}

/// Reads the published counters of `pool` as (name, value) pairs in file order.
pub fn read(cache: &Path, pool: &str) -> Result<Vec<(String, u64)>> {
    let path = stats_path(cache, pool);
    let text = live_text(cache, pool)?;
    let inner = text.trim().trim_start_matches('{').trim_end_matches('}');
    let mut out = Vec::new();
    for field in inner.split(',').filter(|f| !f.is_empty()) {
        let (k, v) = field
            .split_once(':')
            .ok_or_else(|| anyhow!("{}: malformed", path.display()))?;
        let v: u64 = v
            .trim()
            .parse()
            .map_err(|_| anyhow!("{}: malformed value for {k}", path.display()))?;
        out.push((k.trim().trim_matches('"').to_string(), v));
    }
    Ok(out)
}

/// Prints the counters: raw JSON, or a table with the ratios the design is judged by.
pub fn print(cache: &Path, pool: &str, json: bool) -> Result<()> {
    if json {
        print!("{}", live_text(cache, pool)?);
        return Ok(());
    }
    let c = read(cache, pool)?;
    let get = |k: &str| c.iter().find(|(n, _)| n == k).map(|(_, v)| *v).unwrap_or(0);
    println!("pool {pool} (txg {})", get("txg"));
    for (k, v) in &c {
        println!("  {k:<16} {v}");
    }
    let commits = get("commits").max(1) as f64;
    let client = get("client_bytes").max(1) as f64;
    println!(
        "  device flushes per sync write: {:.3}",
        get("device_flushes") as f64 / commits
    );
    println!(
        "  log bytes per client byte:     {:.3}",
        get("log_bytes") as f64 / client
    );
    Ok(())
}
