//! The pool cache file: which pools this machine knows and where their devices are, so
//! `oxpool serve` and `oxpool import` find them without scanning. It is a hint, never the
//! truth: import still reads every device's labels.
//!
//! Format: one pool per line, `name<TAB>guid-hex<TAB>path<TAB>path...`; lines starting with
//! `#` are comments. Written atomically (temporary file, fsync, rename).

use crate::{EngineError, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A pool the machine knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPool {
    /// Pool name.
    pub name: String,
    /// Pool guid.
    pub guid: u64,
    /// Device paths.
    pub devices: Vec<PathBuf>,
}

/// Reads the cache file; a missing file is an empty list.
pub fn read(path: &Path) -> Result<Vec<CachedPool>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngineError::io(&path.display().to_string(), e)),
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split('\t');
        let bad = || {
            EngineError::invalid(format!(
                "{}: line {}: malformed entry",
                path.display(),
                n + 1
            ))
        };
        let name = f.next().ok_or_else(bad)?.to_string();
        let guid = u64::from_str_radix(f.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        let devices: Vec<PathBuf> = f.map(PathBuf::from).collect();
        if devices.is_empty() {
            return Err(bad());
        }
        out.push(CachedPool {
            name,
            guid,
            devices,
        });
    }
    Ok(out)
}

/// Replaces the cache file with `pools`.
pub fn write(path: &Path, pools: &[CachedPool]) -> Result<()> {
    let io = |e| EngineError::io(&path.display().to_string(), e);
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    writeln!(
        f,
        "# oxpool pool cache: name, guid, devices (tab-separated)"
    )
    .map_err(io)?;
    for p in pools {
        let devs: Vec<String> = p.devices.iter().map(|d| d.display().to_string()).collect();
        writeln!(f, "{}\t{:x}\t{}", p.name, p.guid, devs.join("\t")).map_err(io)?;
    }
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Adds or replaces the entry for `pool` (by name, and by guid: a pool imported under a new
/// name leaves no entry under its old one).
pub fn upsert(path: &Path, pool: CachedPool) -> Result<()> {
    update(path, |pools| {
        pools.retain(|p| p.name != pool.name && p.guid != pool.guid);
        pools.push(pool);
    })
}

/// Removes the entry for `name`.
pub fn remove(path: &Path, name: &str) -> Result<()> {
    update(path, |pools| pools.retain(|p| p.name != name))
}

/// Reads, changes and writes the file under an flock of `PATH.lock`: two processes (a
/// server recording a device change, a command creating a pool) never lose each other's
/// entries nor write the same temporary file at once.
fn update(path: &Path, change: impl FnOnce(&mut Vec<CachedPool>)) -> Result<()> {
    use std::os::fd::AsRawFd;
    let lock_path = path.with_extension("lock");
    let io = |e| EngineError::io(&lock_path.display().to_string(), e);
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io)?;
    // SAFETY: flock on a valid, owned file descriptor; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    let mut pools = read(path)?;
    change(&mut pools);
    write(path, &pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/pools.cache");
        assert!(read(&path).unwrap().is_empty());
        let p = CachedPool {
            name: "tank".into(),
            guid: 0xabc,
            devices: vec!["/a".into(), "/b".into()],
        };
        upsert(&path, p.clone()).unwrap();
        upsert(
            &path,
            CachedPool {
                name: "t2".into(),
                guid: 0xdef,
                ..p.clone()
            },
        )
        .unwrap();
        assert_eq!(read(&path).unwrap().len(), 2);
        // The same pool (guid) under a new name replaces its old entry (import NEWNAME).
        let renamed = CachedPool {
            name: "tank3".into(),
            ..p.clone()
        };
        upsert(&path, renamed.clone()).unwrap();
        let names: Vec<String> = read(&path).unwrap().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["t2", "tank3"]);
        upsert(&path, p.clone()).unwrap();
        remove(&path, "tank").unwrap();
        assert_eq!(read(&path).unwrap()[0].name, "t2");
        std::fs::write(&path, "bad line\n").unwrap();
        assert!(read(&path).is_err());
    }
}
