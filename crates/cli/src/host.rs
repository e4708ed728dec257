//! Where a command finds its pools: opened by the command itself (no server owns them), or,
//! for a command a server runs on a client's behalf, the server's live pools.

use crate::devices::{open_device, open_device_within, Devices};
use crate::served::{Served, ServedPool};
use anyhow::{anyhow, Result};
use oxpool_engine::cachefile;
use oxpool_engine::Pool;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The pools a command works on.
#[derive(Clone)]
pub enum Host {
    /// Pools no server owns: the command imports each one it needs and exports it after.
    Local {
        /// The pool cache file.
        cache: PathBuf,
    },
    /// The pools of the running server (the command runs inside it).
    Live(Arc<Served>),
}

impl Host {
    /// The pool cache file.
    pub fn cache(&self) -> &Path {
        match self {
            Host::Local { cache } => cache,
            Host::Live(served) => served.cache(),
        }
    }

    /// Runs `f`, which only reads, on pool `name`.
    pub fn with_pool<T>(&self, name: &str, f: impl FnOnce(&Pool) -> Result<T>) -> Result<T> {
        match self {
            Host::Local { cache } => with_local_pool(cache, name, f),
            Host::Live(served) => f(&served.pool(name)?.pool),
        }
    }

    /// Runs `f`, which changes pool `name`, one change of the pool at a time; the change is
    /// durable when this returns (a served pool syncs, as `zfs set` waits for its txg; an
    /// opened one is exported).
    pub fn change_pool<T>(&self, name: &str, f: impl FnOnce(&Pool) -> Result<T>) -> Result<T> {
        self.change_served_pool(name, |pool, _| f(pool))
    }

    /// As [`Host::change_pool`], also giving `f` the served pool (in a server).
    pub fn change_served_pool<T>(
        &self,
        name: &str,
        f: impl FnOnce(&Pool, Option<&ServedPool>) -> Result<T>,
    ) -> Result<T> {
        match self {
            Host::Local { cache } => with_local_pool(cache, name, |pool| {
                let value = f(pool, None)?;
                // Written by the export's sync, with the change.
                crate::history::record(pool);
                Ok(value)
            }),
            Host::Live(served) => {
                let pool = served.pool(name)?;
                let _one_change = pool.admin();
                let value = f(&pool.pool, Some(&pool))?;
                crate::history::record(&pool.pool);
                pool.pool.sync()?;
                // A `clear` is not undone by a crash of the server; counts found since the
                // last change are kept too.
                keep_error_counts(served.cache(), &pool.pool);
                // A device the change dropped (detached, removed) is free for other uses
                // when the command returns, as ZFS frees it, not at the server's next beat.
                // A cache file that cannot be written is the beat's to report.
                let _ = pool.follow_device_changes(served.cache());
                Ok(value)
            }
        }
    }

    /// The pools a command over "every pool" visits: those the cache file knows.
    pub fn known_pools(&self) -> Result<Vec<String>> {
        Ok(cachefile::read(self.cache())?
            .into_iter()
            .map(|p| p.name)
            .collect())
    }
}

/// Imports pool `name` for `f` and exports it after, whatever `f` returned (a pool dropped
/// without export loses what was not synced yet).
fn with_local_pool<T>(cache: &Path, name: &str, f: impl FnOnce(&Pool) -> Result<T>) -> Result<T> {
    let (pool, _locks) = open_pool(cache, name)?;
    let result = f(&pool);
    // Whatever `f` changed, even if it then failed (an attach whose resilver failed keeps its
    // new device): the next command finds the pool by these paths. A cache file that cannot
    // be written does not fail a command that did its work: the labels still name every
    // device for the next open.
    if let Err(e) = remember_if_changed(cache, &pool) {
        crate::console::say_err(format_args!(
            "oxpool: warning: could not record pool '{name}''s devices in {}: {e:#}",
            cache.display()
        ));
    }
    // After the final sync: its write errors are counted too.
    let exported = pool.export_then(|p| keep_error_counts(cache, p));
    let value = result?;
    exported?;
    Ok(value)
}

/// [`remember`], when the pool's device paths differ from those the cache file lists for it
/// (a command that only reads the pool writes nothing).
pub fn remember_if_changed(cache: &Path, pool: &Pool) -> Result<()> {
    let listed = cachefile::read(cache)?
        .into_iter()
        .find(|p| p.guid == pool.guid().0)
        .map(|p| p.devices);
    let mut now = canonical_paths(pool);
    now.sort();
    let unchanged = listed.is_some_and(|mut l| {
        l.sort();
        l == now
    });
    if unchanged {
        return Ok(());
    }
    remember(cache, pool)
}

/// The pool's device paths as the cache file records them (canonical where the file exists).
fn canonical_paths(pool: &Pool) -> Vec<PathBuf> {
    pool.device_paths()
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or_else(|_| PathBuf::from(p)))
        .collect()
}

/// How long a command that opens a pool waits for another process to let go of one of its
/// devices before saying it is in use: another short command may have the pool open for a
/// moment (`send -t` with no pool looks in each pool known here, while the `recv` at the
/// other end of its pipeline opens one of them). A server holds its devices for good: the
/// command then fails after this wait, as before.
const POOL_LOCK_WAIT: Duration = Duration::from_secs(3);

/// Opens (imports) a pool the cache file knows; the returned locks keep its devices ours.
pub fn open_pool(cache: &Path, name: &str) -> Result<(Pool, Devices)> {
    let entry = cachefile::read(cache)?
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| {
            anyhow!(
                "pool '{name}' not found (not in {}; try `oxpool import`)",
                cache.display()
            )
        })?;
    let mut devs = Devices::default();
    let mut missing = Vec::new();
    for (i, path) in entry.devices.iter().enumerate() {
        // Listed twice (a spare in use was, before device_paths listed each path once): one
        // open, since a second flock of the same file would say "in use".
        if entry.devices[..i].contains(path) {
            continue;
        }
        // A missing device is tolerated (a mirror can run degraded; import decides whether
        // enough is present); one that exists but cannot be opened or is in use is an error.
        // A device at a listed path whose label names another pool (by guid) is not this
        // pool's (its device was moved or reused): left alone, as missing. Else an import
        // by name could open that other pool, of the same name, under this entry.
        if !path.exists() {
            missing.push(path.display().to_string());
            continue;
        }
        let another_pool = |l: &oxpool_format::LabelConfig| l.pool_guid.0 != entry.guid;
        match open_device_within(path, None, POOL_LOCK_WAIT) {
            Ok(d) => {
                if crate::devices::label(d.backend().as_ref()).is_ok_and(|l| another_pool(&l)) {
                    missing.push(path.display().to_string());
                } else {
                    devs.push(d);
                }
            }
            // In use: by a server of this pool (an error), or one of another pool's device.
            Err(e) => match crate::devices::peek_label(path) {
                Some(l) if another_pool(&l) => missing.push(path.display().to_string()),
                _ => return Err(e),
            },
        }
    }
    if devs.backends().is_empty() {
        return Err(anyhow::Error::new(Unavailable(anyhow!(
            "pool '{name}': none of its devices is found ({})",
            missing.join(", ")
        ))));
    }
    // The cache file may be behind the pool (a server that attached or replaced a device
    // and stopped before recording it): the labels' vdev tree names every device by the
    // path it was last opened at, as ZFS's import finds devices by its config's paths.
    for path in paths_labels_add(&devs, entry.guid, &entry.devices) {
        // Only a candidate: taken if its own label is this pool's (by guid: another pool of
        // the same name at an old path must not join the import).
        if let Ok(d) = open_device(&path, None) {
            if crate::devices::label(d.backend().as_ref())
                .is_ok_and(|l| l.pool_guid.0 == entry.guid)
            {
                devs.push(d);
            }
        }
    }
    // Missing devices show as UNAVAIL in `oxpool status`; import refuses the pool if what is
    // missing is needed, naming it.
    // By guid, not name: a device away during a rename at import still carries the old
    // name in its labels, and is this pool's all the same (review).
    let which = oxpool_engine::PoolRef::Id(oxpool_format::Guid(entry.guid));
    let opts = oxpool_engine::ImportOptions::default();
    let pool = Pool::import_as(devs.backends(), which, None, opts).map_err(|e| {
        anyhow::Error::new(Unavailable(
            anyhow::Error::new(e).context(format!("cannot open pool '{name}'")),
        ))
    })?;
    // Devices with no readable label were passed too (damaged ones of this pool): the pool
    // they make must be this one.
    if pool.guid().0 != entry.guid {
        let found = pool.guid().0;
        drop(pool);
        return Err(anyhow::Error::new(Unavailable(anyhow!(
            "cannot open pool '{name}': the devices found hold another pool of that name \
             (guid {found:x}, this machine knows guid {:x})",
            entry.guid
        ))));
    }
    // The files the pool did not take (a detached or replaced device the cache file still
    // listed, a blank file swapped in at a device's path) are closed and unlocked: this
    // command may name them as new devices.
    devs.retain_named(&pool.open_device_names());
    adopt_host_state(cache, &pool, &mut std::io::stderr())?;
    Ok((pool, devs))
}

/// Sets what this machine keeps about `pool` (just opened) on it: its fault injection rules
/// (`oxpool inject`) act from now on, and the error counts of the commands before this one
/// are back (`errors_file.rs`).
pub fn adopt_host_state(
    cache: &Path,
    pool: &Pool,
    warnings: &mut dyn std::io::Write,
) -> Result<()> {
    crate::inject_file::apply(cache, pool, warnings)?;
    crate::errors_file::restore(cache, pool, warnings)
}

/// Keeps `pool`'s error counts for its next open (before it is let go, or after a served
/// pool's admin command). A file that cannot be written is said, and does not fail a
/// command that did its work.
pub fn keep_error_counts(cache: &Path, pool: &Pool) {
    if let Err(e) = crate::errors_file::keep(cache, pool) {
        crate::console::say_err(format_args!(
            "oxpool: warning: could not keep pool '{}''s error counts: {e:#}",
            pool.name()
        ));
    }
}

/// This machine forgets pool `name` (exported or destroyed): the cache file's entry and the
/// error counts kept for it.
pub fn forget(cache: &Path, name: &str) -> Result<()> {
    let guid = cachefile::read(cache)?
        .into_iter()
        .find(|p| p.name == name)
        .map(|p| p.guid);
    cachefile::remove(cache, name)?;
    if let Some(guid) = guid {
        // The pool is forgotten already: a file that cannot be written is said, and does
        // not fail the export or destroy that was done.
        if let Err(e) = crate::errors_file::forget(cache, guid) {
            crate::console::say_err(format_args!(
                "oxpool: warning: could not forget pool '{name}''s error counts: {e:#}"
            ));
        }
    }
    Ok(())
}

/// Why [`open_pool`] could not open a pool whose devices it could open: none of them
/// exists, or import refused what they hold (a device it needs is missing, labels are
/// damaged). `list` and `status` show such a pool UNAVAIL; other failures (a device in use
/// by another process, no permission) stay errors.
#[derive(Debug)]
pub struct Unavailable(pub anyhow::Error);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Unavailable {}

/// Records the pool and its devices in the cache file.
pub fn remember(cache: &Path, pool: &Pool) -> Result<()> {
    let devices = canonical_paths(pool);
    cachefile::upsert(
        cache,
        cachefile::CachedPool {
            name: pool.name().to_string(),
            guid: pool.guid().0,
            devices,
        },
    )?;
    Ok(())
}

/// Paths that the vdev trees in the labels of `devs` (those of the pool `pool_guid`) name and
/// `listed` does not, that exist.
fn paths_labels_add(devs: &Devices, pool_guid: u64, listed: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for b in devs.backends() {
        let Ok(label) = crate::devices::label(b.as_ref()) else {
            continue;
        };
        if label.pool_guid.0 != pool_guid {
            continue;
        }
        for leaf in label.tree.leaves() {
            let path = std::fs::canonicalize(&leaf.path).unwrap_or_else(|_| (&leaf.path).into());
            if path.exists() && !listed.contains(&path) && !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}
