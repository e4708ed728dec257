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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a pool leaving the server waits for commands still reading it (status, get) to
/// finish before it is exported anyway.
const READERS_WAIT: Duration = Duration::from_secs(60);

/// One served pool.
pub struct ServedPool {
    /// The pool.
    pub pool: Pool,
    /// Its devices' locks (a device added later joins them).
    devices: Mutex<Devices>,
    /// Held by every command that changes the pool.
    admin: Mutex<()>,
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
}

/// What one server serves.
pub struct Served {
    cache: PathBuf,
    runtime: RuntimeDir,
    socket: PathBuf,
    exports: Exports,
    read_only: Vec<String>,
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
            read_only,
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

    /// The served pool `name`.
    pub fn pool(&self, name: &str) -> Result<Arc<ServedPool>> {
        self.map().get(name).cloned().ok_or_else(|| {
            anyhow!("pool '{name}' is not served here (it was exported or destroyed)")
        })
    }

    /// Whether pool `name` is served here.
    pub fn serves(&self, name: &str) -> bool {
        self.map().contains_key(name)
    }

    /// Names of the served pools.
    pub fn names(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
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
        });
        let mut added = Vec::new();
        for volume in served.pool.volumes() {
            let export = volume.full_name().to_string();
            self.export_volume(volume)?;
            added.push(export);
        }
        self.map().insert(name.clone(), served);
        self.runtime.claim(&name, &self.socket)?;
        Ok(added)
    }

    /// Offers a volume over NBD from now on (and says where, on the server's output).
    pub fn export_volume(&self, volume: oxpool_engine::Volume) -> Result<()> {
        let name = volume.full_name().to_string();
        let read_only = self.read_only.contains(&name);
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
            println!("  {}  ({size}, {access})", endpoint.uri(&name, self.tls));
        }
        Ok(())
    }

    /// Stops offering volume `full_name` (`pool/vol`). With `force`, its clients are
    /// disconnected (their requests in flight answered first); without, it is refused while
    /// any client has it open. A volume that was never exported is fine.
    pub fn unexport_volume(&self, full_name: &str, force: bool) -> Result<()> {
        let mode = if force {
            Disconnect::Force
        } else {
            Disconnect::Refuse
        };
        match self.exports.remove(full_name, mode) {
            Ok(_) => Ok(()),
            Err(oxpool_nbd::server::ExportError::NotFound(_)) => Ok(()),
            Err(e) => Err(anyhow!("cannot destroy {e}")),
        }
    }

    /// NBD clients that have `full_name` open.
    pub fn clients(&self, full_name: &str) -> usize {
        self.exports.clients(full_name).unwrap_or(0)
    }

    /// Stops serving pool `name` (the caller holds `membership`) and hands it back, to be
    /// exported or destroyed. In order: changes of the pool in progress finish (its `admin`
    /// lock, held from here on, so none starts and none adds an export behind this); with
    /// `refuse_if_open`, any NBD client connected refuses it, changing nothing; it leaves the
    /// map (new commands do not find it) and the runtime directory; its exports go (clients
    /// disconnected after their requests in flight are answered); a scrub stops; commands
    /// still reading it get [`READERS_WAIT`].
    pub fn release(&self, name: &str, refuse_if_open: bool) -> Result<(Pool, Devices)> {
        let served = self.pool(name)?;
        {
            let _no_change = served.admin();
            let prefix = format!("{name}/");
            let exports: Vec<String> = self
                .exports
                .names()
                .into_iter()
                .filter(|e| e.starts_with(&prefix))
                .collect();
            if refuse_if_open {
                let open: Vec<String> = exports
                    .iter()
                    .filter(|e| self.clients(e) > 0)
                    .map(|e| format!("{e} ({} client(s))", self.clients(e)))
                    .collect();
                if !open.is_empty() {
                    bail!(
                        "pool '{name}' is in use: {} (-f disconnects the clients)",
                        open.join(", ")
                    );
                }
            }
            self.map().remove(name);
            self.runtime.release(name, &self.socket);
            let mut stuck = Vec::new();
            for export in &exports {
                if let Err(e) = self.exports.remove(export, Disconnect::Force) {
                    stuck.push(e.to_string());
                }
            }
            if !stuck.is_empty() {
                tracing::warn!(pool = name, "{}", stuck.join("; "));
            }
            // A `scrub -w` waiting on it ends now rather than holding it.
            let _ = served.pool.scrub_cancel();
        }
        let deadline = Instant::now() + READERS_WAIT;
        let mut served = served;
        // Bounded by the deadline; commands that only read a pool hold it for moments.
        let served = loop {
            match Arc::try_unwrap(served) {
                Ok(s) => break s,
                Err(again) if Instant::now() < deadline => {
                    served = again;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(again) => {
                    // Served again as it was (its clients may reconnect): a pool dropped
                    // later without an export would lose what is not synced.
                    for volume in again.pool.volumes() {
                        self.export_volume(volume)?;
                    }
                    self.map().insert(name.to_string(), again);
                    self.runtime.claim(name, &self.socket)?;
                    bail!(
                        "pool '{name}' is in use by another command (a long `vol read`?); \
                         it is still served; try again"
                    )
                }
            }
        };
        let devices = served
            .devices
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        Ok((served.pool, devices))
    }

    /// Exports every pool (the server is stopping; its NBD server has stopped). Returns the
    /// names exported and the failures.
    pub fn shutdown(&self) -> (Vec<String>, Vec<String>) {
        let _one = self.membership();
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for name in self.names() {
            match self.release(&name, false) {
                Ok((pool, devices)) => {
                    match pool.export() {
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
