//! The pools a running `oxpool serve` owns, and their NBD exports, changed while it serves:
//! `import`, `create`, `export` and `destroy` through the control socket add and remove pools,
//! `vol create` and `vol destroy` add and remove exports.
//!
//! Locks, outermost first: `membership` (one change of the set of pools at a time), a pool's
//! `admin` (one change of that pool at a time: properties, volumes, devices), the `pools` map
//! (held only to look up or insert, never across I/O). Commands that only read a pool (status,
//! get, list) take no lock but the map's, and run beside anything.

use crate::control::runtime::RuntimeDir;
use crate::devices::Devices;
use crate::serve::Endpoint;
use anyhow::{anyhow, bail, Result};
use oxpool_engine::{Pool, PoolCounters};
use oxpool_nbd::server::{Disconnect, Exports, ServerExport};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a pool leaving the server waits for the commands running on it to finish; if
/// one still runs then, the pool stays and the export fails, having changed nothing.
const COMMANDS_WAIT: Duration = Duration::from_secs(60);

/// One served pool.
pub struct ServedPool {
    /// The pool.
    pub pool: Pool,
    /// Its devices' locks (a device added later joins them).
    devices: Mutex<Devices>,
    /// Held by every command that changes the pool.
    admin: Mutex<()>,
    /// Leaving the server (export, destroy): no command may start on it.
    leaving: AtomicBool,
    /// The device paths last checked against the cache file (so that a cache file that
    /// cannot be written is reported once per change, not on every beat).
    paths_checked: Mutex<Vec<String>>,
}

impl ServedPool {
    /// Serializes a change of the pool with every other change of it.
    pub fn admin(&self) -> MutexGuard<'_, ()> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps the locks of devices added to the pool for as long as it is served.
    pub fn keep_devices(&self, more: Devices) {
        self.devices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(more);
    }

    /// Closes and unlocks the files of devices the pool no longer has (detached, or
    /// replaced once their replacement was resilvered), so they can be used again, as ZFS
    /// frees a detached device at once; and records the pool's device paths in `cache` when
    /// they changed. Names are taken under the devices' lock, so a device a command is adding
    /// is either in them or not yet among the locks.
    pub(crate) fn follow_device_changes(&self, cache: &Path) -> Result<()> {
        {
            let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
            // Not in the middle of a change: a detached device keeps its lock until its
            // labels are cleared (the next beat lets it go).
            let Some(names) = self.pool.open_device_names_settled() else {
                return Ok(());
            };
            devices.retain_named(&names);
        }
        let paths = self.pool.device_paths();
        let mut checked = self.paths_checked.lock().unwrap_or_else(|p| p.into_inner());
        if *checked == paths {
            return Ok(());
        }
        *checked = paths;
        crate::host::remember_if_changed(cache, &self.pool)
    }
}

/// Why a command stops offering an export: the words of its refusal when a client has the
/// export open.
#[derive(Clone, Copy, Debug)]
pub enum Unexport {
    /// `destroy` of a snapshot, `vol destroy` (`-f` disconnects).
    Destroy,
    /// `rollback` of the volume, or of the later snapshots it destroys (`-f` disconnects).
    Rollback,
    /// `promote`: the origin's snapshots move to the clone.
    Promote,
    /// `recv` onto the volume (no `-f`: its clients must go first).
    Receive,
    /// `unshare` (`-f` disconnects).
    Unshare,
    /// `set volsize` smaller: its clients were told the old size.
    Shrink,
}

impl Unexport {
    /// The action refused and what the user can do.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Unexport::Destroy => ("destroy", "-f disconnects them"),
            Unexport::Rollback => ("roll back", "rollback -f disconnects them"),
            Unexport::Promote => (
                "promote the clone over",
                "its NBD clients must disconnect first",
            ),
            Unexport::Receive => ("receive into", "its NBD clients must disconnect first"),
            Unexport::Unshare => ("unshare", "unshare -f disconnects them"),
            Unexport::Shrink => (
                "shrink",
                "they were told its size; oxpool unshare -f disconnects them, share offers it again",
            ),
        }
    }
}

/// What one server serves.
pub struct Served {
    cache: PathBuf,
    runtime: RuntimeDir,
    socket: PathBuf,
    exports: Exports,
    /// Volumes `--read-only` named, by their names now (a rename renames them here too, or
    /// a later `share` of the volume would offer it writable).
    read_only: Mutex<Vec<String>>,
    endpoints: Vec<Endpoint>,
    /// Whether clients connect with TLS (the URIs say `nbds`).
    tls: bool,
    membership: Mutex<()>,
    pools: Mutex<BTreeMap<String, Arc<ServedPool>>>,
}

impl Served {
    /// A server with no pools yet; `socket` is its control socket in `runtime`.
    pub fn new(
        cache: &Path,
        runtime: RuntimeDir,
        socket: PathBuf,
        exports: Exports,
        read_only: Vec<String>,
        endpoints: Vec<Endpoint>,
        tls: bool,
    ) -> Served {
        Served {
            cache: cache.to_path_buf(),
            runtime,
            socket,
            exports,
            read_only: Mutex::new(read_only),
            endpoints,
            tls,
            membership: Mutex::new(()),
            pools: Mutex::new(BTreeMap::new()),
        }
    }

    /// The pool cache file.
    pub fn cache(&self) -> &Path {
        &self.cache
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<String, Arc<ServedPool>>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serializes a change of the set of pools (import, create, export, destroy).
    pub fn membership(&self) -> MutexGuard<'_, ()> {
        self.membership.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The served pool `name`, for a command to run on. Refused once the pool is leaving:
    /// the check comes after the clone, and `release` marks the pool before it counts the
    /// clones, so either this command sees the mark or `release` waits for it.
    pub fn pool(&self, name: &str) -> Result<Arc<ServedPool>> {
        let pool = self.map().get(name).cloned().ok_or_else(|| {
            anyhow!("pool '{name}' is not served here (it was exported or destroyed)")
        })?;
        if pool.leaving.load(Ordering::SeqCst) {
            bail!("pool '{name}' is being exported or destroyed");
        }
        Ok(pool)
    }

    /// Whether pool `name` is served here.
    pub fn serves(&self, name: &str) -> bool {
        self.map().contains_key(name)
    }

    /// Names of the served pools.
    pub fn names(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    /// Follows the served pools' device changes, those of commands and those made without
    /// one (a resilver detaching the device it replaced, a hot spare stepping in): see
    /// [`ServedPool::follow_device_changes`]. Says on standard error what it could not record.
    pub fn follow_device_changes(&self) {
        let pools: Vec<Arc<ServedPool>> = self.map().values().cloned().collect();
        for sp in pools {
            if sp.leaving.load(Ordering::SeqCst) {
                continue;
            }
            if let Err(e) = sp.follow_device_changes(&self.cache) {
                crate::console::say_err(format_args!(
                    "oxpool: pool '{}': cannot record its devices in {}: {e:#}",
                    sp.pool.name(),
                    self.cache.display()
                ));
            }
        }
    }

    /// Counters of every served pool (for `oxpool iostat`).
    pub fn counters(&self) -> Vec<PoolCounters> {
        self.map().values().map(|p| p.pool.counters()).collect()
    }

    /// Starts serving `pool` (just opened, imported or created; the caller holds
    /// `membership`): its volumes become exports and the runtime directory names this server
    /// as its owner. Returns the new exports' names.
    pub fn adopt(&self, pool: Pool, devices: Devices) -> Result<Vec<String>> {
        let name = pool.name().to_string();
        if self.serves(&name) {
            bail!("pool '{name}' is served already");
        }
        let served = Arc::new(ServedPool {
            pool,
            devices: Mutex::new(devices),
            admin: Mutex::new(()),
            leaving: AtomicBool::new(false),
            paths_checked: Mutex::new(Vec::new()),
        });
        let mut added = Vec::new();
        for volume in served.pool.volumes() {
            let export = volume.full_name().to_string();
            self.export_volume(volume)?;
            added.push(export);
        }
        // Each snapshot, read-only, as POOL/VOL@SNAP.
        for snap in served.pool.all_snapshots() {
            let view = served.pool.snapshot_volume(&snap.volume, &snap.name)?;
            added.push(view.full_name().to_string());
            self.export_volume(view)?;
        }
        self.map().insert(name.clone(), served);
        self.runtime.claim(&name, &self.socket)?;
        Ok(added)
    }

    /// Whether `full_name` (`pool/vol` or `pool/vol@snap`) is offered now. A volume received
    /// with `recv -u` or unshared is not, until `share` or the server starts again; its new
    /// snapshots follow it.
    pub fn is_exported(&self, full_name: &str) -> bool {
        self.exports.clients(full_name).is_some()
    }

    /// Client connections that have `full_name` open now (None: it is not offered).
    pub fn clients(&self, full_name: &str) -> Option<usize> {
        self.exports.clients(full_name)
    }

    /// Offers a volume over NBD from now on (and says where, on the server's output).
    pub fn export_volume(&self, volume: oxpool_engine::Volume) -> Result<()> {
        let name = volume.full_name().to_string();
        let read_only = self
            .read_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&name);
        let access = if read_only || volume.read_only() {
            "read-only"
        } else {
            "read-write"
        };
        let size = crate::human(volume.size_bytes());
        self.exports
            .add(ServerExport {
                name: name.clone(),
                volume,
                read_only,
            })
            .map_err(|e| anyhow!("{e}"))?;
        for endpoint in &self.endpoints {
            crate::console::say_out(format_args!(
                "  {}  ({size}, {access})",
                endpoint.uri(&name, self.tls)
            ));
        }
        Ok(())
    }

    /// Follows `rename` of `from` to `to` (names inside pool `pool`: a volume, a snapshot,
    /// a bookmark) in the export table: a volume's export and its snapshots' take the new
    /// names, a snapshot's its own, in one step. The exports keep their connections (their
    /// clients' I/O goes on) and are offered under the new names only from then on. One that
    /// was not offered (`recv -u`, `unshare`) stays so.
    pub fn rename_exports(&self, pool: &str, from: &str, to: &str) -> Result<()> {
        let (old, new) = (format!("{pool}/{from}"), format!("{pool}/{to}"));
        let (old_volume, new_volume) = (old.clone(), new.clone());
        let renames: Vec<(String, String)> = if from.contains(['@', '#']) {
            // A bookmark is never offered; a snapshot is, under its own name.
            vec![(old, new)]
        } else {
            let snaps = format!("{old}@");
            let mut r: Vec<(String, String)> = self
                .exports
                .names()
                .into_iter()
                .filter_map(|n| {
                    let snap = n.strip_prefix(&snaps)?.to_string();
                    Some((n, format!("{new}@{snap}")))
                })
                .collect();
            r.push((old, new));
            r
        };
        if !from.contains(['@', '#']) {
            let mut ro = self.read_only.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = ro.iter_mut().find(|n| **n == old_volume) {
                *n = new_volume.clone();
            }
        }
        if !from.contains('#') {
            self.exports.rename_default(&old_volume, &new_volume);
        }
        let offered = self.exports.names();
        let renames: Vec<(String, String)> = renames
            .into_iter()
            .filter(|(o, _)| offered.contains(o))
            .collect();
        if renames.is_empty() {
            return Ok(());
        }
        self.exports.rename(&renames).map_err(|e| {
            anyhow!("renamed, but its NBD exports keep their old names ({e}): restart the server")
        })?;
        for (_, n) in &renames {
            for endpoint in &self.endpoints {
                crate::console::say_out(format_args!("  {}  (renamed)", endpoint.uri(n, self.tls)));
            }
        }
        Ok(())
    }

    /// Whether [`Served::unexport_volume`] would refuse now (clients have `full_name` open
    /// and `force` is not given), with the refusal it would give: a dry run (`destroy -n`)
    /// says what the command would meet. Changes nothing.
    pub fn check_unexport(&self, full_name: &str, force: bool, why: Unexport) -> Result<()> {
        match self.clients(full_name) {
            Some(clients) if clients > 0 && !force => {
                let e = oxpool_nbd::server::ExportError::InUse {
                    name: full_name.to_string(),
                    clients,
                };
                let (action, remedy) = why.words();
                Err(anyhow!("cannot {action} {e} ({remedy})"))
            }
            _ => Ok(()),
        }
    }

    /// Stops offering volume `full_name` (`pool/vol`) for `why` (the command and its remedy,
    /// for the refusal). With `force`, its clients are disconnected (their requests in
    /// flight answered first); without, it is refused while any client has it open. A
    /// volume that was never exported is fine: false then, true if an export was removed.
    pub fn unexport_volume(&self, full_name: &str, force: bool, why: Unexport) -> Result<bool> {
        let mode = if force {
            Disconnect::Force
        } else {
            Disconnect::Refuse
        };
        match self.exports.remove(full_name, mode) {
            Ok(_) => Ok(true),
            Err(oxpool_nbd::server::ExportError::NotFound(_)) => Ok(false),
            // With `force` the remedy was taken already: the error alone.
            Err(e) if force => Err(anyhow!("cannot {} {e}", why.words().0)),
            Err(e) => {
                let (action, remedy) = why.words();
                Err(anyhow!("cannot {action} {e} ({remedy})"))
            }
        }
    }

    /// Stops serving pool `name` (the caller holds `membership`) and hands it back, to be
    /// exported or destroyed. In order, so that a failure at any step leaves the pool served
    /// as it was:
    /// 1. it is marked leaving: no command starts on it;
    /// 2. the commands running on it finish (at most [`COMMANDS_WAIT`]; a command still
    ///    running then fails the release, and the mark goes);
    /// 3. its exports leave the NBD server in one step: with `refuse_if_open`, refused as a
    ///    whole while any client is connected; otherwise the clients are disconnected after
    ///    their requests in flight are answered. A connection that does not end even after
    ///    its socket is shut down may still have requests inside the engine: the exports come
    ///    back and the release fails (the pool must not be exported under them);
    /// 4. it leaves the table of pools and the runtime directory (a running scan stops at the
    ///    export, persisted, and resumes at the next import).
    pub fn release(&self, name: &str, refuse_if_open: bool) -> Result<(Pool, Devices)> {
        let served = self.pool(name)?;
        let in_use = |export: &str, clients: usize| {
            anyhow!(
                "pool '{name}' is in use: {export} is open by {clients} NBD client \
                 connection(s) (-f disconnects them)"
            )
        };
        if refuse_if_open {
            // Refused before the mark, so that other commands on the pool are not refused
            // meanwhile; step 3 checks again, under the table's lock.
            let prefix = format!("{name}/");
            let open = self.exports.names().into_iter().find_map(|e| {
                if !e.starts_with(&prefix) {
                    return None;
                }
                let n = self.exports.clients(&e).filter(|&n| n > 0)?;
                Some((e, n))
            });
            if let Some((export, clients)) = open {
                return Err(in_use(&export, clients));
            }
        }
        served.leaving.store(true, Ordering::SeqCst);
        let fail = |why: anyhow::Error| {
            served.leaving.store(false, Ordering::SeqCst);
            Err(why)
        };
        // The map's reference and ours; every other is a command running on the pool.
        let deadline = Instant::now() + COMMANDS_WAIT;
        // Bounded by the deadline.
        while Arc::strong_count(&served) > 2 {
            if Instant::now() >= deadline {
                return fail(anyhow!(
                    "pool '{name}' is in use by another command (a long `vol read`?); nothing \
                     was changed; try again"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mode = if refuse_if_open {
            Disconnect::Refuse
        } else {
            Disconnect::Force
        };
        let removed = match self.exports.remove_all(&format!("{name}/"), mode) {
            Ok(removed) => removed,
            Err(oxpool_nbd::server::ExportError::InUse {
                name: export,
                clients,
            }) => return fail(in_use(&export, clients)),
            Err(e) => return fail(anyhow!("{e}")),
        };
        if !removed.stuck.is_empty() {
            for export in removed.exports {
                let _ = self.exports.add(export);
            }
            let stuck: Vec<String> = removed
                .stuck
                .iter()
                .map(|(e, n)| format!("{e} ({n})"))
                .collect();
            return fail(anyhow!(
                "pool '{name}': client connections of {} did not end even after their sockets \
                 were shut down; it stays served",
                stuck.join(", ")
            ));
        }
        drop(removed);
        self.map().remove(name);
        self.runtime.release(name, &self.socket);
        // A running scrub or resilver is not canceled: the export stops it where it is,
        // persisted, and the next import resumes it.
        // Only `pool()` calls that are about to see the mark may hold a clone for a moment.
        let mut served = served;
        let mut tries = 0;
        // Bounded: 10 s of tries for clones that live a few instructions.
        let served = loop {
            match Arc::try_unwrap(served) {
                Ok(s) => break s,
                Err(again) if tries < 10_000 => {
                    served = again;
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(again) => {
                    // Never dropped without an export: served again.
                    again.leaving.store(false, Ordering::SeqCst);
                    for volume in again.pool.volumes() {
                        self.export_volume(volume)?;
                    }
                    self.map().insert(name.to_string(), again);
                    self.runtime.claim(name, &self.socket)?;
                    bail!("pool '{name}' is still referenced by another command; it stays served");
                }
            }
        };
        let devices = served
            .devices
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        Ok((served.pool, devices))
    }

    /// Exports every pool (the server is stopping; its NBD server has stopped, and commands
    /// still running see their client gone). Returns the names exported and the failures.
    pub fn shutdown(&self) -> (Vec<String>, Vec<String>) {
        let _one = self.membership();
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for name in self.names() {
            // A command still running gets a few waits before the pool is left unexported.
            let mut released = self.release(&name, false);
            for _ in 0..4 {
                if released.is_ok() {
                    break;
                }
                released = self.release(&name, false);
            }
            match released {
                Ok((pool, devices)) => {
                    let cache = self.cache();
                    match pool.export_then(|p| crate::host::keep_error_counts(cache, p)) {
                        Ok(()) => done.push(name),
                        Err(e) => failed.push(format!("{name}: {e}")),
                    }
                    drop(devices);
                }
                Err(e) => failed.push(format!("{name}: {e:#}")),
            }
        }
        (done, failed)
    }
}
