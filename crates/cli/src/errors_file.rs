//! Where a pool's error counters and damaged-data log are kept between the commands that
//! open it: `pools.errors` beside `pools.cache`.
//!
//! Why: without a server, each command imports the pool and exports it after, and the
//! counters (`oxpool status`'s READ, WRITE, CKSUM, what self-healing repaired) and the log of
//! damaged data (`status -v`) live in the open pool only (`engine/src/pool/error_record.rs`).
//! A `vol read` that repaired a mirror's damaged side would leave nothing for the `status`
//! after it, and the device would look healthy. ZFS keeps its counters while the pool is
//! imported; here a pool is imported, for the user, while this machine knows it (the cache
//! file lists it). So the record is taken from the pool whenever a command lets it go (and
//! a server after each admin command and at its stop), put back at each open, zeroed by
//! `oxpool clear` as the pool's counters are, and forgotten at `export` and `destroy`.
//!
//! Why beside the cache file and not in the pool: like the counters of ZFS, the record
//! belongs to this import, not to the devices (another machine that imports them starts
//! from zero), and it needs no txg.
//!
//! Format: `#` comment lines, then tab-separated lines of three kinds, each for the pool of
//! guid `POOL` (hex): `device POOL DEVICE READ WRITE CHECKSUM REPAIRED_BYTES DEGRADED` (a
//! device by guid, hex; DEGRADED is why the fault rule made it so, empty if it is not),
//! `damaged POOL OFFSET LENGTH DATASET` (bytes), `unnamed POOL COUNT`. The last field of a
//! `device` or `damaged` line is taken whole. Written as `beside_cache.rs` says.
//!
//! The record outlives a reboot, unlike ZFS's counters (a boot imports the pools again):
//! here a pool stays imported, for this machine, until `export`.

use crate::beside_cache;
use anyhow::{anyhow, Result};
use oxpool_engine::spa::errlog::DamagedRange;
use oxpool_engine::vdev::DeviceErrors;
use oxpool_engine::{DeviceRecord, ErrorRecord, Pool};
use oxpool_format::Guid;
use std::path::{Path, PathBuf};

/// The file beside the cache file `cache`.
pub fn path_of(cache: &Path) -> PathBuf {
    beside_cache::path_of(cache, "errors")
}

/// Every pool's record, by pool guid, in the file's order.
type Records = Vec<(u64, ErrorRecord)>;

fn parse(path: &Path, text: &str) -> Result<Records> {
    let mut out: Records = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || anyhow!("{}: line {}: malformed", path.display(), n + 1);
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let dec = |s: &str| s.parse::<u64>().map_err(|_| bad());
        // The last field of a `device` (why it is degraded) or `damaged` line (the dataset)
        // is taken whole.
        let f: Vec<&str> = if line.starts_with("damaged\t") {
            line.splitn(5, '\t').collect()
        } else if line.starts_with("device\t") {
            line.splitn(8, '\t').collect()
        } else {
            line.split('\t').collect()
        };
        let pool = hex(f.get(1).ok_or_else(bad)?)?;
        let i = match out.iter().position(|(g, _)| *g == pool) {
            Some(i) => i,
            None => {
                out.push((pool, ErrorRecord::default()));
                out.len() - 1
            }
        };
        let record = &mut out[i].1;
        match f[..] {
            // Seven fields: written before the DEGRADED field (2026-11-30), not degraded.
            ["device", _, device, read, write, checksum, repaired]
            | ["device", _, device, read, write, checksum, repaired, _] => {
                let degraded = f.get(7).copied().unwrap_or("");
                record.devices.push(DeviceRecord {
                    guid: Guid(hex(device)?),
                    counts: DeviceErrors {
                        read: dec(read)?,
                        write: dec(write)?,
                        checksum: dec(checksum)?,
                        repaired_bytes: dec(repaired)?,
                    },
                    degraded: (!degraded.is_empty()).then(|| degraded.to_string()),
                });
            }
            ["damaged", _, offset, length, dataset] => {
                let (offset_bytes, length_bytes) = (dec(offset)?, dec(length)?);
                // Never trusted: a range must be one the log could hold.
                if length_bytes == 0
                    || offset_bytes.checked_add(length_bytes).is_none()
                    || dataset.is_empty()
                {
                    return Err(bad());
                }
                record.damaged.push(DamagedRange {
                    dataset: dataset.to_string(),
                    offset_bytes,
                    length_bytes,
                });
            }
            ["unnamed", _, count] => record.damaged_unnamed = dec(count)?,
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

fn text_of(records: &Records) -> String {
    let mut text = String::from(
        "# oxpool error counts of this machine's pools, kept from one command to the next \
         until `oxpool clear` or export; tab-separated\n",
    );
    for (pool, r) in records {
        for d in &r.devices {
            let c = &d.counts;
            // One line: a reason never holds a line break.
            let why = d
                .degraded
                .as_deref()
                .unwrap_or("")
                .replace(['\n', '\r'], " ");
            text += &format!(
                "device\t{pool:x}\t{:x}\t{}\t{}\t{}\t{}\t{why}\n",
                d.guid.0, c.read, c.write, c.checksum, c.repaired_bytes
            );
        }
        for d in &r.damaged {
            text += &format!(
                "damaged\t{pool:x}\t{}\t{}\t{}\n",
                d.offset_bytes, d.length_bytes, d.dataset
            );
        }
        if r.damaged_unnamed > 0 {
            text += &format!("unnamed\t{pool:x}\t{}\n", r.damaged_unnamed);
        }
    }
    text
}

fn read(path: &Path) -> Result<Records> {
    match beside_cache::read_text(path)? {
        Some(text) => parse(path, &text),
        None => Ok(Vec::new()),
    }
}

/// Sets the record of pool `guid` to what `record` makes of the one kept (none if that is
/// empty) under the file's lock; writes the file only if that changes it.
fn set(
    cache: &Path,
    guid: u64,
    record: impl FnOnce(&ErrorRecord) -> Option<ErrorRecord>,
) -> Result<()> {
    let path = path_of(cache);
    beside_cache::locked(&path, || {
        let mut records = read(&path)?;
        let before = records.clone();
        let kept = records
            .iter()
            .find(|(g, _)| *g == guid)
            .map(|(_, r)| r.clone())
            .unwrap_or_default();
        records.retain(|(g, _)| *g != guid);
        if let Some(r) = record(&kept).filter(|r| !r.is_empty()) {
            records.push((guid, r));
            records.sort_by_key(|(g, _)| *g);
        }
        if records != before {
            beside_cache::replace(&path, &text_of(&records))?;
        }
        Ok(())
    })
}

/// Puts the kept record of `pool` (just opened) back on it. A file that cannot be read is
/// said on `warnings` and left alone: counts are not worth a pool that does not open.
pub fn restore(cache: &Path, pool: &Pool, warnings: &mut dyn std::io::Write) -> Result<()> {
    match read(&path_of(cache)) {
        Ok(records) => {
            if let Some((_, r)) = records.iter().find(|(g, _)| *g == pool.guid().0) {
                pool.restore_error_record(r);
            }
        }
        Err(e) => writeln!(
            warnings,
            "oxpool: warning: error counts of earlier commands not restored ({e:#}); remove \
             the file to start counting again"
        )?,
    }
    Ok(())
}

/// Keeps what `pool`'s counters and damaged-data log hold now, for its next open (and what
/// was kept of devices it names but has not open: `Pool::error_record_after`).
pub fn keep(cache: &Path, pool: &Pool) -> Result<()> {
    set(cache, pool.guid().0, |kept| {
        Some(pool.error_record_after(kept))
    })
}

/// After `clear` of the whole pool: keeps what `pool` holds now and nothing of the devices
/// it has not open (missing now): `zpool clear` clears those too.
pub fn keep_cleared(cache: &Path, pool: &Pool) -> Result<()> {
    set(cache, pool.guid().0, |_| Some(pool.error_record()))
}

/// Forgets the record of pool `guid` (exported or destroyed: its next import starts from
/// zero, as ZFS's counters do).
pub fn forget(cache: &Path, guid: u64) -> Result<()> {
    set(cache, guid, |_| None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seed: u64) -> ErrorRecord {
        ErrorRecord {
            devices: vec![
                DeviceRecord {
                    guid: Guid(0xabc0 + seed),
                    counts: DeviceErrors {
                        read: 1,
                        write: 0,
                        checksum: 3 + seed,
                        repaired_bytes: 16384,
                    },
                    degraded: None,
                },
                DeviceRecord {
                    guid: Guid(0xdef0 + seed),
                    counts: DeviceErrors::default(),
                    degraded: Some("too many checksum errors (10 within 600 s)".into()),
                },
            ],
            damaged: vec![DamagedRange {
                dataset: "tank/vol 0".into(),
                offset_bytes: 65536,
                length_bytes: 16384,
            }],
            damaged_unnamed: seed,
        }
    }

    #[test]
    fn records_round_trip_per_pool_and_forget_drops_only_that_pool() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("pools.cache");
        set(&cache, 0x11, |_| Some(record(0))).unwrap();
        set(&cache, 0x22, |_| Some(record(5))).unwrap();
        let path = path_of(&cache);
        assert_eq!(
            read(&path).unwrap(),
            vec![(0x11, record(0)), (0x22, record(5))]
        );
        // An empty record is no record.
        set(&cache, 0x11, |kept| {
            assert_eq!(*kept, record(0), "the kept record is given to the change");
            Some(ErrorRecord::default())
        })
        .unwrap();
        assert_eq!(read(&path).unwrap(), vec![(0x22, record(5))]);
        forget(&cache, 0x22).unwrap();
        assert!(read(&path).unwrap().is_empty());
    }

    #[test]
    fn damaged_lines_are_errors_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pools.errors");
        for bad in [
            "device\t11\tabc\t1\t2\t3\n",
            "device\t11\tabc\t1\t2\tx\t4\t\n",
            "damaged\t11\t18446744073709551615\t2\ttank/v\n",
            "damaged\t11\t0\t0\ttank/v\n",
            "damaged\t11\t0\t4096\t\n",
            "unnamed\tzz\t1\n",
            "other\t11\t1\n",
            "device\n",
        ] {
            let text = format!("# header\n{bad}");
            let err = parse(&path, &text).unwrap_err().to_string();
            assert!(err.contains("line 2: malformed"), "{bad:?}: {err}");
        }
        // A device line of seven fields (before the DEGRADED field): not degraded.
        let old = parse(&path, "device\t11\tabc\t1\t2\t3\t4\n").unwrap();
        assert_eq!(old[0].1.devices[0].degraded, None);
        assert_eq!(old[0].1.devices[0].counts.repaired_bytes, 4);
    }
}
