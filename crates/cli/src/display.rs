//! How pools are shown: sizes, `oxpool status`, dates.

use crate::progress::hms;
use oxpool_engine::{PoolStatus, ScanState, ScanStatus, VdevStatus};
use std::io::{self, Write};

/// Sizes as zfs prints them: 1.5G, 512M, 16K.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}")
    } else if v >= 10.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// A size as `zpool status` shows what a scrub repaired: `0B`, `512B`, `1.5M`.
pub fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes}B")
    } else {
        human(bytes)
    }
}

/// A size, human (`-p` off) or exact.
pub fn size(bytes: u64, exact: bool) -> String {
    if exact {
        bytes.to_string()
    } else {
        human(bytes)
    }
}

/// A time (ns since the epoch) as `zpool status` shows it: `Wed Nov 25 14:03:59 2026`, local.
pub fn date(ns: u64) -> String {
    let t = (ns / 1_000_000_000) as libc::time_t;
    let mut out = [0u8; 64];
    // SAFETY: localtime_r fills the zeroed tm we own; strftime writes at most out.len() bytes
    // into the buffer we own, with a NUL-terminated format.
    let n = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return format!("{t}");
        }
        libc::strftime(
            out.as_mut_ptr().cast(),
            out.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        )
    };
    String::from_utf8_lossy(&out[..n]).into_owned()
}

/// The `scan:` lines of `oxpool status`.
pub fn scan_lines(scan: &ScanStatus) -> Vec<String> {
    let errors = scan.counts.blocks_lost;
    match scan.state {
        ScanState::Finished => vec![format!(
            "scrub repaired {} in {} with {errors} errors on {}",
            human_bytes(scan.repaired_bytes),
            hms(scan.elapsed.as_secs()),
            date(scan.ended_ns.unwrap_or(scan.started_ns))
        )],
        ScanState::Canceled => {
            let why = scan
                .error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            vec![format!(
                "scrub canceled on {}{why}",
                date(scan.ended_ns.unwrap_or(scan.started_ns))
            )]
        }
        ScanState::Scanning => {
            let secs = scan.elapsed.as_secs_f64();
            let rate = if secs > 0.0 {
                scan.examined_bytes as f64 / secs
            } else {
                0.0
            };
            let left = scan.total_bytes.saturating_sub(scan.examined_bytes);
            let to_go = if rate > 0.0 {
                format!(", {} to go", hms((left as f64 / rate) as u64))
            } else {
                String::new()
            };
            vec![
                format!("scrub in progress since {}", date(scan.started_ns)),
                format!(
                    "{} / {} scanned at {}/s, {:.2}% done{to_go}",
                    human(scan.examined_bytes),
                    human(scan.total_bytes),
                    human(rate as u64),
                    scan.percent_done()
                ),
                format!(
                    "{} repaired, {errors} errors",
                    human_bytes(scan.repaired_bytes)
                ),
            ]
        }
    }
}

/// `oxpool status` of one pool.
pub fn print_status(out: &mut dyn Write, s: &PoolStatus) -> io::Result<()> {
    writeln!(out, "  pool: {}", s.name)?;
    writeln!(out, " state: {}", s.state)?;
    for (i, reason) in s.reasons.iter().enumerate() {
        let label = if i == 0 { "status:" } else { "       " };
        writeln!(out, "{label} {reason}")?;
    }
    if let Some(scan) = &s.scan {
        for (i, line) in scan_lines(scan).iter().enumerate() {
            if i == 0 {
                writeln!(out, "  scan: {line}")?;
            } else {
                writeln!(out, "\t{line}")?;
            }
        }
    }
    writeln!(out, "   txg: {}", s.txg)?;
    writeln!(out, "config:\n")?;
    writeln!(
        out,
        "\t{:<40} {:<9} {:>5} {:>5} {:>5}",
        "NAME", "STATE", "READ", "WRITE", "CKSUM"
    )?;
    writeln!(
        out,
        "\t{:<40} {:<9} {:>5} {:>5} {:>5}",
        s.name, s.state, 0, 0, 0
    )?;
    fn line(out: &mut dyn Write, v: &VdevStatus, depth: usize) -> io::Result<()> {
        let name = format!("{}{}", "  ".repeat(depth), v.name);
        // Why a device is in its state, after its counts (as `zpool status`'s notes).
        let note = v
            .reason
            .as_ref()
            .map(|r| format!("  {r}"))
            .unwrap_or_default();
        writeln!(
            out,
            "\t{:<40} {:<9} {:>5} {:>5} {:>5}{note}",
            name, v.state, v.read_errors, v.write_errors, v.checksum_errors
        )?;
        if v.repaired_bytes > 0 {
            writeln!(
                out,
                "\t{}  (repaired {} bytes)",
                "  ".repeat(depth),
                v.repaired_bytes
            )?;
        }
        for c in &v.children {
            line(out, c, depth + 1)?;
        }
        Ok(())
    }
    for v in &s.vdevs {
        line(out, v, 1)?;
    }
    // As `zpool status`: the hot spares, AVAIL or INUSE (and for which device).
    if !s.spares.is_empty() {
        writeln!(out, "\tspares")?;
        for sp in &s.spares {
            let note = sp
                .in_use_for
                .as_ref()
                .map(|w| format!("  in use for {w}"))
                .unwrap_or_default();
            writeln!(out, "\t  {:<38} {:<9}{note}", sp.name, sp.state)?;
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "errors: {}",
        if s.vdevs.iter().any(has_errors) {
            "see the counts above"
        } else {
            "No known data errors"
        }
    )
}

fn has_errors(v: &VdevStatus) -> bool {
    v.read_errors + v.write_errors + v.checksum_errors > 0 || v.children.iter().any(has_errors)
}
