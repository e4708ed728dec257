//! How pools are shown: sizes, `oxpool status`, dates.

use crate::progress::hms;
use oxpool_engine::{PoolStatus, ScanKind, ScanState, ScanStatus, VdevStatus};
use std::io::{self, Write};

/// Sizes as zfs prints them: 1.50G, 32.8M, 512M, 16K.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let mut index = 0;
    let mut whole = bytes;
    while whole >= 1024 && index < UNITS.len() - 1 {
        whole /= 1024;
        index += 1;
    }
    if index == 0 {
        return bytes.to_string();
    }
    let unit = 1u64 << (10 * index);
    if bytes.is_multiple_of(unit) {
        return format!("{}{}", bytes / unit, UNITS[index]);
    }
    // As ZFS's nicenum: three significant digits where five characters allow (32.8M,
    // 1.50G, 118M).
    let v = bytes as f64 / unit as f64;
    (0..=2)
        .rev()
        .map(|precision| format!("{v:.precision$}{}", UNITS[index]))
        .find(|s| s.len() <= 5)
        .unwrap_or_else(|| format!("{v:.0}{}", UNITS[index]))
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

/// A size of bytes that may be under 1K, human with a unit (`263B`, as `zfs send -nv`) or
/// exact.
pub fn size_with_unit(bytes: u64, exact: bool) -> String {
    if exact {
        bytes.to_string()
    } else {
        human_bytes(bytes)
    }
}

/// A path in a line of space-separated paths: as is when it holds only characters a shell
/// leaves alone, else in single quotes (a `'` inside as `'\''`), so a path with a space reads
/// as one path and pastes into a shell as one word.
pub fn shell_word(path: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:@%+=,-".contains(c);
    if !path.is_empty() && path.chars().all(plain) {
        return path.to_string();
    }
    format!("'{}'", path.replace('\'', "'\\''"))
}

/// A time (ns since the epoch) as `zpool status` shows it: `Wed Nov 25 14:03:59 2026`, local.
pub fn date(ns: u64) -> String {
    date_as(ns, c"%a %b %e %H:%M:%S %Y")
}

/// A time (ns since the epoch), local, in strftime's `format`.
pub fn date_as(ns: u64, format: &std::ffi::CStr) -> String {
    let t = (ns / 1_000_000_000) as libc::time_t;
    let mut out = [0u8; 64];
    // SAFETY: localtime_r fills the zeroed tm we own; strftime writes at most out.len() bytes
    // into the buffer we own, with a NUL-terminated format.
    let n = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return format!("{t}");
        }
        libc::strftime(out.as_mut_ptr().cast(), out.len(), format.as_ptr(), &tm)
    };
    String::from_utf8_lossy(&out[..n]).into_owned()
}

/// The `scan:` lines of `oxpool status`, as `zpool status` shows them.
pub fn scan_lines(scan: &ScanStatus) -> Vec<String> {
    let errors = scan.counts.blocks_lost;
    let kind = scan.kind.as_str();
    let resilver = scan.kind == ScanKind::Resilver;
    let repaired = if resilver { "resilvered" } else { "repaired" };
    let visited = match scan.window {
        Some((from, to)) if resilver => format!(
            "{} blocks visited (born in txgs {}-{})",
            scan.blocks_visited, from.0, to.0
        ),
        _ => format!("{} blocks visited", scan.blocks_visited),
    };
    let end = date(scan.ended_ns.unwrap_or(scan.started_ns));
    match scan.state {
        ScanState::Finished => vec![
            if resilver {
                format!(
                    "resilvered {} in {} with {errors} errors on {end}",
                    human_bytes(scan.repaired_bytes),
                    hms(scan.elapsed.as_secs()),
                )
            } else {
                format!(
                    "scrub repaired {} in {} with {errors} errors on {end}",
                    human_bytes(scan.repaired_bytes),
                    hms(scan.elapsed.as_secs()),
                )
            },
            visited,
        ],
        ScanState::Canceled => {
            let why = scan
                .error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            vec![format!("{kind} canceled on {end}{why}")]
        }
        ScanState::Paused => vec![
            format!(
                "{kind} paused since {}",
                date(scan.paused_ns.unwrap_or(scan.started_ns))
            ),
            format!("{kind} started on {}", date(scan.started_ns)),
            format!(
                "{} scanned, {} issued, {} total",
                human_bytes(scan.examined_bytes),
                human_bytes(scan.issued_bytes),
                human_bytes(scan.total_bytes)
            ),
            format!(
                "{} {repaired}, {:.2}% done",
                human_bytes(scan.repaired_bytes),
                scan.percent_done()
            ),
            visited,
        ],
        ScanState::Scanning => {
            let to_go = match scan.time_left() {
                Some(left) => format!("{} to go", hms(left.as_secs())),
                None => "no estimated completion time".to_string(),
            };
            vec![
                format!("{kind} in progress since {}", date(scan.started_ns)),
                format!(
                    "{} scanned at {}/s, {} issued at {}/s, {} total",
                    human_bytes(scan.examined_bytes),
                    human_bytes(scan.scan_rate_bytes_per_s()),
                    human_bytes(scan.issued_bytes),
                    human_bytes(scan.issue_rate_bytes_per_s()),
                    human_bytes(scan.total_bytes)
                ),
                format!(
                    "{} {repaired}, {:.2}% done, {to_go}",
                    human_bytes(scan.repaired_bytes),
                    scan.percent_done()
                ),
                format!("{visited}, {errors} errors"),
            ]
        }
    }
}

/// `oxpool status` of one pool.
pub fn print_status(out: &mut dyn Write, s: &PoolStatus, verbose: bool) -> io::Result<()> {
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
        // A count like the error counts (kept until `clear` or export), not the last scan's:
        // said so, since the scan line above may say "repaired 0B".
        if v.repaired_bytes > 0 {
            writeln!(
                out,
                "\t{}  (repaired {} since the import or the last clear)",
                "  ".repeat(depth),
                human_bytes(v.repaired_bytes)
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
    // As `zpool status`: separate intent-log vdevs under `logs`, after the data vdevs.
    if !s.logs.is_empty() {
        writeln!(out, "\tlogs")?;
        for v in &s.logs {
            line(out, v, 1)?;
        }
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
    print_damaged(out, s, verbose)
}

/// The `errors:` part of `oxpool status`: damaged data (blocks no copy could give back),
/// listed by volume and range with `-v` (ZFS's "Permanent errors" list), else counted.
fn print_damaged(out: &mut dyn Write, s: &PoolStatus, verbose: bool) -> io::Result<()> {
    let ranges = s.damaged.len() as u64 + s.damaged_unnamed_blocks;
    if s.damaged.is_empty() && s.damaged_unnamed_blocks == 0 {
        let counted = if s.vdevs.iter().chain(&s.logs).any(has_errors) {
            " (device errors: see the counts above)"
        } else {
            ""
        };
        return writeln!(out, "errors: No known data errors{counted}");
    }
    if !verbose {
        return writeln!(
            out,
            "errors: {ranges} damaged data range{}, use '-v' for a list",
            if ranges == 1 { "" } else { "s" }
        );
    }
    writeln!(
        out,
        "errors: Permanent errors have been detected in the following volumes:\n"
    )?;
    for r in &s.damaged {
        writeln!(
            out,
            "\t{}: bytes {}-{} ({})",
            r.dataset,
            r.offset_bytes,
            r.offset_bytes + r.length_bytes - 1,
            size(r.length_bytes, false)
        )?;
    }
    if s.damaged_unnamed_blocks > 0 {
        writeln!(
            out,
            "\tand {} more damaged blocks (the list is full)",
            s.damaged_unnamed_blocks
        )?;
    }
    Ok(())
}

fn has_errors(v: &VdevStatus) -> bool {
    v.read_errors + v.write_errors + v.checksum_errors > 0 || v.children.iter().any(has_errors)
}

#[cfg(test)]
mod tests {

    #[test]
    fn paths_with_spaces_or_quotes_are_one_shell_word() {
        assert_eq!(super::shell_word("/dev/sdb"), "/dev/sdb");
        assert_eq!(
            super::shell_word("/var/my devs/a.img"),
            "'/var/my devs/a.img'"
        );
        assert_eq!(super::shell_word("it's"), "'it'\\''s'");
        assert_eq!(super::shell_word(""), "''");
    }

    use super::*;

    #[test]
    fn sizes_have_three_significant_digits_as_zfs_prints_them() {
        assert_eq!(human(512), "512");
        assert_eq!(human(16 << 10), "16K");
        assert_eq!(human(64 << 20), "64M");
        assert_eq!(human(34_340_864), "32.8M");
        assert_eq!(human(3 << 29), "1.50G");
        assert_eq!(human(123_456_789), "118M");
        assert_eq!(human(1023 * 1024 + 1000), "1024K");
        assert_eq!(human(u64::MAX), "16.0E");
    }
}
