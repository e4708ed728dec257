//! Opening device files for the CLI: creating them (allocated, or sparse), locking them against a second
//! process, scanning directories for import.

use anyhow::{anyhow, Context, Result};
use oxpool_io::{Backend, FileBackend};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// An open device and the lock that keeps other oxpool processes off it.
pub struct Device {
    backend: Arc<FileBackend>,
    _lock: std::fs::File,
    /// The file, if this command created it.
    created: Option<PathBuf>,
}

impl Device {
    /// The device as the engine's backend.
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
}

/// The devices a command opened; dropped (unlocked) when the command ends.
#[derive(Default)]
pub struct Devices(Vec<Device>);

impl Devices {
    /// Adds one.
    pub fn push(&mut self, d: Device) {
        self.0.push(d);
    }

    /// Keeps only the devices named in `names` (the others are closed and unlocked).
    pub fn retain_named(&mut self, names: &[String]) {
        self.0
            .retain(|d| names.iter().any(|n| n == d.backend.name()));
    }

    /// Takes over `more`'s devices (and their locks).
    pub fn extend(&mut self, more: Devices) {
        self.0.extend(more.0);
    }

    /// All as backends.
    pub fn backends(&self) -> Vec<Arc<dyn Backend>> {
        self.0.iter().map(|d| d.backend()).collect()
    }

    /// Removes the files this command created (it failed: it should leave nothing behind, and
    /// a created file may be gigabytes of zeros); says on `warnings` what it could not remove.
    pub fn remove_created(&self, warnings: &mut dyn std::io::Write) {
        self.remove_created_except(&[], warnings)
    }

    /// As [`Devices::remove_created`], keeping the devices named in `keep` (a pool holds them).
    pub fn remove_created_except(&self, keep: &[String], warnings: &mut dyn std::io::Write) {
        let created = self
            .0
            .iter()
            .filter(|d| !keep.iter().any(|k| k == d.backend.name()))
            .filter_map(|d| d.created.as_ref());
        for path in created {
            if let Err(e) = std::fs::remove_file(path) {
                let _ = writeln!(
                    warnings,
                    "oxpool: could not remove {} it created: {e}",
                    path.display()
                );
            }
        }
    }
}

/// `$XDG_STATE_HOME/oxpool/pools.cache`, else `~/.local/state/oxpool/pools.cache`.
pub fn default_cache_file() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("oxpool/pools.cache")
}

/// How device files that do not exist yet are made.
#[derive(Clone, Copy, Debug)]
pub struct NewFiles {
    /// Size of each new file.
    pub size_bytes: u64,
    /// Sparse (instant, no space reserved; the first write to each region costs the host
    /// filesystem an allocation) instead of allocated and zero-written at creation (see
    /// [`oxpool_io::create_preallocated`] for why that is the default).
    pub sparse: bool,
}

/// A device file another process (or another open of this one) holds locked.
#[derive(Debug)]
pub struct InUse(pub String);

impl std::fmt::Display for InUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InUse {}

/// Opens `path` as a device, creating it as `create` says if it is missing, and locks it
/// (flock, exclusive, non-blocking).
pub fn open_device(path: &Path, create: Option<NewFiles>) -> Result<Device> {
    open_device_within(path, create, Duration::ZERO)
}

/// How often a device another process holds is tried again while waiting for it.
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// As [`open_device`], waiting up to `wait` for another process to release the device's
/// lock (tried every [`LOCK_RETRY`]), for a command that opens a pool another short command
/// may have open for a moment.
pub fn open_device_within(path: &Path, create: Option<NewFiles>, wait: Duration) -> Result<Device> {
    let mut created = None;
    if !path.exists() {
        let Some(new) = create else {
            return Err(anyhow!(
                "{}: no such file (give --size to create it)",
                path.display()
            ));
        };
        if !new.sparse {
            oxpool_io::create_preallocated(path, new.size_bytes).with_context(|| {
                format!(
                    "cannot create {} (allocating and zero-writing {}; --sparse skips that)",
                    path.display(),
                    crate::human(new.size_bytes)
                )
            })?;
        }
        created = Some(path.to_path_buf());
    }
    let create_sparse = create.filter(|n| n.sparse).map(|n| n.size_bytes);
    let backend = FileBackend::open(path, create_sparse)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let lock = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let deadline = std::time::Instant::now() + wait;
    // Bounded by the deadline.
    loop {
        // SAFETY: flock on a valid, owned file descriptor.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(anyhow::Error::new(InUse(format!(
                "{}: in use by another oxpool process: a server (with another cache file?) \
                 or a command that has the pool open, such as the other end of a `send | \
                 recv` within one pool (serve the pool to run both)",
                path.display()
            ))));
        }
        std::thread::sleep(LOCK_RETRY);
    }
    Ok(Device {
        backend: Arc::new(backend),
        _lock: lock,
        created,
    })
}

/// Regular files and block devices directly inside `dir`.
pub fn scan_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let e = e?;
        let ft = e.file_type()?;
        use std::os::unix::fs::FileTypeExt;
        if ft.is_file() || ft.is_block_device() {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The label of device `b`, read on this thread.
pub fn label(b: &dyn Backend) -> oxpool_engine::Result<oxpool_format::LabelConfig> {
    oxpool_io::rt::block_on(oxpool_engine::vdev::label::read_label(b))
}

/// The label of the device at `path`, read without taking it (no lock: another process may
/// hold it); None if it cannot be opened or has no valid label.
pub fn peek_label(path: &Path) -> Option<oxpool_format::LabelConfig> {
    let backend = FileBackend::open(path, None).ok()?;
    label(&backend).ok()
}

/// A pool the labels of some devices name, for `import -d DIR` with no pool given.
pub struct Probed {
    /// Its name (as the first device's label has it).
    pub name: String,
    /// Every name its devices' labels carry (more than one while a rename at import was
    /// cut short, or a device was away for it), `name` first.
    pub names: Vec<String>,
    /// Its guid.
    pub guid: u64,
    /// The devices found, as opened.
    pub paths: Vec<String>,
    /// Devices the newest tree among their labels names that none of them is (the paths
    /// the tree recorded): the pool is degraded at best without them.
    pub missing: Vec<String>,
    /// Devices found twice (two files holding one device's labels: a copy, one of them
    /// old), by the paths found.
    pub twice: Vec<(String, String)>,
}

/// A pool being probed: what is shown, the leaves found (guid, path) and the newest tree.
struct Probing {
    probed: Probed,
    leaves: Vec<(u64, String)>,
    tree: oxpool_format::VdevTreeConfig,
    /// The txg `tree`'s label was written for.
    newest: oxpool_format::Txg,
}

/// Pools named by the labels of `devs`, with what their trees say is missing.
pub fn probe_labels(devs: &Devices) -> Vec<Probed> {
    let mut out: Vec<Probing> = Vec::new();
    for d in &devs.0 {
        let b = d.backend();
        let Ok(cfg) = label(b.as_ref()) else {
            continue;
        };
        let name = b.name().to_string();
        let i = match out.iter().position(|p| p.probed.guid == cfg.pool_guid.0) {
            Some(i) => i,
            None => {
                let probed = Probed {
                    name: cfg.pool_name.clone(),
                    names: Vec::new(),
                    guid: cfg.pool_guid.0,
                    paths: Vec::new(),
                    missing: Vec::new(),
                    twice: Vec::new(),
                };
                out.push(Probing {
                    probed,
                    leaves: Vec::new(),
                    tree: cfg.tree.clone(),
                    newest: cfg.create_txg,
                });
                out.len() - 1
            }
        };
        let Probing {
            probed,
            leaves,
            tree,
            newest,
        } = &mut out[i];
        probed.paths.push(name.clone());
        if !probed.names.contains(&cfg.pool_name) {
            probed.names.push(cfg.pool_name.clone());
        }
        if let Some((_, first)) = leaves.iter().find(|(g, _)| *g == cfg.leaf_guid.0) {
            probed.twice.push((first.clone(), name.clone()));
        }
        leaves.push((cfg.leaf_guid.0, name));
        // The newest tree: the one last written (an old copy or a device offline through a
        // detach carries an older one, which would name devices gone since).
        if cfg.create_txg > *newest {
            *tree = cfg.tree;
            *newest = cfg.create_txg;
        }
    }
    out.into_iter()
        .map(|p| {
            let Probing {
                mut probed,
                leaves,
                tree,
                ..
            } = p;
            // A spare is not needed to import, unless it stands in for a device (a pair's
            // member, holding data).
            let in_use: Vec<u64> = tree
                .top
                .iter()
                .flat_map(|t| t.pairs.iter().map(|p| p.leaf.guid.0))
                .collect();
            let spares: Vec<u64> = tree
                .spares
                .iter()
                .map(|l| l.guid.0)
                .filter(|g| !in_use.contains(g))
                .collect();
            probed.missing = tree
                .leaves()
                .filter(|l| !spares.contains(&l.guid.0))
                .filter(|l| !leaves.iter().any(|(g, _)| *g == l.guid.0))
                .map(|l| l.path.clone())
                .collect();
            // A spare in use is named twice (a pair's member and a spare).
            let mut seen = Vec::new();
            probed.missing.retain(|m| {
                let first = !seen.contains(m);
                seen.push(m.clone());
                first
            });
            probed
        })
        .collect()
}
