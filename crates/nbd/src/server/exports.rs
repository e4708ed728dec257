//! The exports a running server offers, changed while it serves.
//!
//! The table is read once per connection (its handshake offers what the table holds at that
//! moment, with each volume's size as it is then, so a client that reconnects after a resize
//! sees the new size) and written by the administrator (`oxpool vol create`, `vol destroy`,
//! `import`, `export` on a served pool). Nothing here is on the request path: a connection
//! looks at the table at its handshake and at its end, never per request.
//!
//! Removing an export is ordered so that no client can slip in between the check and the
//! removal: the export leaves the table and is marked revoked under the table's lock (a
//! handshake that chose it before then fails to register and closes), then the connections
//! already registered are told to stop. A stopped connection finishes the requests it has
//! read, sends their replies and closes; one that does not finish within the server's grace
//! period (a client that stopped reading) has its socket shut down.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use oxpool_engine::Volume;

use super::{export_info, ServerExport, Shared};
use crate::proto::{ExportInfo, OfferCheck};

/// Exports one server may offer at once: a bound on the table (and on a LIST reply).
pub const EXPORTS_MAX: usize = 4096;

/// How long [`Exports::remove`] waits, after shutting down the sockets of clients that did not
/// finish within the grace period, for their connections to end.
const BREAK_WAIT: Duration = Duration::from_secs(10);

/// Identity of one export for its whole life in the table (a name may come back later as a
/// new export; an id never does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ExportId(pub(crate) u64);

/// What a change of the export table can fail with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportError {
    /// An export of that name exists.
    Exists(String),
    /// No export of that name.
    NotFound(String),
    /// Clients have the export open and the removal was not forced.
    InUse {
        /// Export name.
        name: String,
        /// Connections that have it open.
        clients: usize,
    },
    /// The table holds [`EXPORTS_MAX`] exports.
    Full,
    /// Forced off, some clients' connections had still not ended after their sockets were
    /// shut down (the export is removed all the same: they can no longer reach it).
    Stuck {
        /// Export name.
        name: String,
        /// Connections still open.
        clients: usize,
    },
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::Exists(name) => write!(f, "export '{name}' exists"),
            ExportError::NotFound(name) => write!(f, "no export '{name}'"),
            ExportError::InUse { name, clients } => write!(
                f,
                "'{name}': it is open by {clients} NBD client connection(s)"
            ),
            ExportError::Full => write!(f, "the server offers {EXPORTS_MAX} exports already"),
            ExportError::Stuck { name, clients } => write!(
                f,
                "'{name}': {clients} client connection(s) did not close after being disconnected"
            ),
        }
    }
}

impl std::error::Error for ExportError {}

/// Whether [`Exports::remove`] disconnects clients that have the export open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disconnect {
    /// Refuse with [`ExportError::InUse`] while any client has it open.
    Refuse,
    /// Stop those clients' connections (their requests in flight are answered first).
    Force,
}

struct Entry {
    id: ExportId,
    export: ServerExport,
}

struct TableState {
    /// In the order they were added.
    entries: Vec<Entry>,
    /// Registered connections per export, including exports removed whose connections have
    /// not ended yet.
    connections: HashMap<ExportId, usize>,
    next_id: u64,
    /// The only export an empty name may select: the first one the table ever held, for
    /// good (a client reconnecting without a name must never land on another volume; while
    /// no export is that one, an empty name selects nothing). By name and dataset guid, not
    /// by export id: an export taken out and offered again (a refused destroy, a shrink,
    /// `unshare` then `share`) is the same volume and stays the default, while a volume
    /// destroyed and created again under its name is another, and does not. Even it is
    /// selected only while it is the sole export the client may open
    /// (`Handshake::find_export`): the order of the exports is the order of their names at
    /// the server's start, so "the first" of several would be another volume after a
    /// restart with a volume whose name sorts before it.
    default: Option<(String, oxpool_format::Guid)>,
}

/// The export table, shared by the reactors and the administrator.
pub(crate) struct ExportTable {
    state: Mutex<TableState>,
    /// Signalled whenever a connection ends.
    connection_ended: Condvar,
}

impl fmt::Debug for ExportTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("ExportTable")
            .field("exports", &state.entries.len())
            .finish()
    }
}

/// What one handshake offers: the exports' descriptions as of now, and the volume and id
/// behind each (same indices).
pub(crate) struct Offer {
    pub(crate) infos: Vec<ExportInfo>,
    pub(crate) targets: Vec<(ExportId, Volume)>,
    /// Index of the pinned default export, if it is still offered (an empty name selects it
    /// only while it is the sole export the client may open).
    pub(crate) default_index: Option<usize>,
}

impl ExportTable {
    pub(crate) fn new(exports: Vec<ServerExport>) -> Result<ExportTable, ExportError> {
        let table = ExportTable {
            state: Mutex::new(TableState {
                entries: Vec::new(),
                connections: HashMap::new(),
                next_id: 1,
                default: None,
            }),
            connection_ended: Condvar::new(),
        };
        for export in exports {
            table.add(export)?;
        }
        Ok(table)
    }

    fn lock(&self) -> MutexGuard<'_, TableState> {
        // The table's invariants hold between statements; a panic elsewhere cannot break them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, export: ServerExport) -> Result<(), ExportError> {
        let mut state = self.lock();
        if state.entries.iter().any(|e| e.export.name == export.name) {
            return Err(ExportError::Exists(export.name));
        }
        if state.entries.len() >= EXPORTS_MAX {
            return Err(ExportError::Full);
        }
        let id = ExportId(state.next_id);
        state.next_id += 1;
        if state.default.is_none() {
            state.default = Some((export.name.clone(), export.volume.dataset_guid()));
        }
        state.entries.push(Entry { id, export });
        Ok(())
    }

    /// The exports as a handshake offers them now.
    pub(crate) fn offer(&self) -> Offer {
        let state = self.lock();
        Offer {
            infos: state
                .entries
                .iter()
                .map(|e| export_info(&e.export))
                .collect(),
            targets: state
                .entries
                .iter()
                .map(|e| (e.id, e.export.volume.clone()))
                .collect(),
            default_index: state.default.as_ref().and_then(|(name, guid)| {
                state
                    .entries
                    .iter()
                    .position(|e| e.export.name == *name && e.export.volume.dataset_guid() == *guid)
            }),
        }
    }

    /// Whether export `id` is still in the table under `name`.
    pub(crate) fn still_offered(&self, id: ExportId, name: &str) -> bool {
        let state = self.lock();
        Self::offered_as(&state, id, name)
    }

    fn offered_as(state: &TableState, id: ExportId, name: &str) -> bool {
        state
            .entries
            .iter()
            .any(|e| e.id == id && e.export.name == name)
    }

    /// Counts a connection that negotiated export `id` as `name`; false if the export left
    /// the table, or was renamed, since the handshake read it (the connection must close: a
    /// rename may have given `name` to another volume). The handshake checked this at GO
    /// ([`OfferedNames`]); this closes the window between that check and the count.
    pub(crate) fn register(&self, id: ExportId, name: &str) -> bool {
        let mut state = self.lock();
        if !Self::offered_as(&state, id, name) {
            return false;
        }
        *state.connections.entry(id).or_insert(0) += 1;
        true
    }

    /// A registered connection ended.
    pub(crate) fn unregister(&self, id: ExportId) {
        let mut state = self.lock();
        if let Some(n) = state.connections.get_mut(&id) {
            debug_assert!(*n > 0);
            *n -= 1;
            if *n == 0 {
                state.connections.remove(&id);
            }
        }
        drop(state);
        self.connection_ended.notify_all();
    }

    /// Connections registered on `id` now.
    fn connections(state: &TableState, id: ExportId) -> usize {
        state.connections.get(&id).copied().unwrap_or(0)
    }

    /// Waits until no connection of `id` is left, or `limit` has passed; returns how many are.
    fn wait_closed(&self, id: ExportId, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut state = self.lock();
        // Bounded by the deadline: each pass waits for a connection to end or for the time left.
        loop {
            let open = Self::connections(&state, id);
            let left = deadline.saturating_duration_since(Instant::now());
            if open == 0 || left.is_zero() {
                return open;
            }
            state = self
                .connection_ended
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One handshake's answer to whether the export a client chooses is still offered under the
/// name the handshake listed (by export index, as in its list).
pub(crate) struct OfferedNames {
    pub(crate) shared: Arc<Shared>,
    pub(crate) listed: Vec<(ExportId, String)>,
}

impl fmt::Debug for OfferedNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OfferedNames")
            .field("listed", &self.listed.len())
            .finish()
    }
}

impl OfferCheck for OfferedNames {
    fn still_offered(&self, export_index: usize) -> bool {
        self.listed
            .get(export_index)
            .is_some_and(|(id, name)| self.shared.exports.still_offered(*id, name))
    }
}

/// The administrator's handle on a running server's exports. Cheap to clone; usable from any
/// thread but a reactor's (its calls block).
#[derive(Clone)]
pub struct Exports {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Exports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exports").finish()
    }
}

impl Exports {
    fn table(&self) -> &ExportTable {
        &self.shared.exports
    }

    /// Offers a new export from now on (`nbdinfo --list` shows it at once).
    pub fn add(&self, export: ServerExport) -> Result<(), ExportError> {
        self.table().add(export)
    }

    /// The names of the exports offered now, in order.
    pub fn names(&self) -> Vec<String> {
        let state = self.table().lock();
        state
            .entries
            .iter()
            .map(|e| e.export.name.clone())
            .collect()
    }

    /// Renames exports, each `(old, new)` of `renames`, all in one step under the table's
    /// lock (a volume and its snapshots' exports): an export keeps its identity, so the
    /// connections that have it open stay connected and registered, and every handshake
    /// from then on offers it under the new name only. The pinned default export (the empty
    /// name) follows a rename of its volume: it is pinned by name and dataset guid to keep a
    /// client from landing on another volume, and a renamed volume is the same volume.
    /// Refused, nothing renamed, if an old name is missing or a new one is taken by an
    /// export not renamed here.
    pub fn rename(&self, renames: &[(String, String)]) -> Result<(), ExportError> {
        let mut state = self.table().lock();
        for (old, _) in renames {
            if !state.entries.iter().any(|e| e.export.name == *old) {
                return Err(ExportError::NotFound(old.clone()));
            }
        }
        for (_, new) in renames {
            let taken = state
                .entries
                .iter()
                .any(|e| e.export.name == *new && !renames.iter().any(|(o, _)| *o == *new));
            if taken {
                return Err(ExportError::Exists(new.clone()));
            }
        }
        // Positions first, then names: a new name may be another one's old name.
        let at: Vec<Option<usize>> = renames
            .iter()
            .map(|(old, _)| state.entries.iter().position(|e| e.export.name == *old))
            .collect();
        let default_at = state
            .default
            .as_ref()
            .and_then(|(n, _)| renames.iter().position(|(old, _)| old == n));
        for ((_, new), i) in renames.iter().zip(at) {
            if let Some(i) = i {
                state.entries[i].export.name = new.clone();
            }
        }
        if let (Some(i), Some((name, _))) = (default_at, state.default.as_mut()) {
            *name = renames[i].1.clone();
        }
        Ok(())
    }

    /// Volume or snapshot `old` is now `new` (`pool/vol`, `pool/vol@snap`): if the pinned
    /// default export is it (or, for a volume, one of its snapshots) and is not offered now
    /// (`recv -u`, `unshare`), the pin takes the new name, so that it is the default again
    /// once offered. An offered default follows in [`Exports::rename`].
    pub fn rename_default(&self, old: &str, new: &str) {
        let mut state = self.table().lock();
        let Some((name, _)) = state.default.as_ref() else {
            return;
        };
        if state.entries.iter().any(|e| e.export.name == *name) {
            return;
        }
        let renamed = if name == old {
            Some(new.to_string())
        } else if old.contains('@') {
            None
        } else {
            name.strip_prefix(old)
                .and_then(|rest| rest.strip_prefix('@'))
                .map(|snap| format!("{new}@{snap}"))
        };
        if let (Some(renamed), Some((name, _))) = (renamed, state.default.as_mut()) {
            *name = renamed;
        }
    }

    /// Client connections that have export `name` open now (`None`: no such export).
    pub fn clients(&self, name: &str) -> Option<usize> {
        let state = self.table().lock();
        let entry = state.entries.iter().find(|e| e.export.name == name)?;
        Some(ExportTable::connections(&state, entry.id))
    }

    /// Stops offering export `name`. With [`Disconnect::Refuse`] it fails while a client has
    /// it open; with [`Disconnect::Force`] the clients' connections are stopped (requests
    /// they sent are answered first) and this returns once they are closed. Returns the
    /// export (its volume handle), removed in either case of success.
    pub fn remove(&self, name: &str, mode: Disconnect) -> Result<ServerExport, ExportError> {
        let removed = self.remove_where(|n| n == name, mode)?;
        let Some(export) = removed.exports.into_iter().next() else {
            return Err(ExportError::NotFound(name.to_string()));
        };
        match removed.stuck.into_iter().next() {
            None => Ok(export),
            Some((name, clients)) => Err(ExportError::Stuck { name, clients }),
        }
    }

    /// Stops offering every export whose name starts with `prefix` (a pool's: `pool/`), in
    /// one step: with [`Disconnect::Refuse`] none is removed if a client has any open; with
    /// [`Disconnect::Force`] all are removed and their clients disconnected (as
    /// [`Exports::remove`]). Returns what was removed and the connections that had not
    /// closed even after their sockets were shut down.
    pub fn remove_all(&self, prefix: &str, mode: Disconnect) -> Result<Removed, ExportError> {
        self.remove_where(|n| n.starts_with(prefix), mode)
    }

    fn remove_where(
        &self,
        matches: impl Fn(&str) -> bool,
        mode: Disconnect,
    ) -> Result<Removed, ExportError> {
        let table = self.table();
        let removed: Vec<(ExportId, ServerExport)> = {
            let mut state = table.lock();
            if mode == Disconnect::Refuse {
                let busy = state.entries.iter().find_map(|e| {
                    let clients = ExportTable::connections(&state, e.id);
                    (matches(&e.export.name) && clients > 0).then(|| ExportError::InUse {
                        name: e.export.name.clone(),
                        clients,
                    })
                });
                if let Some(busy) = busy {
                    return Err(busy);
                }
            }
            // Out of the table under the lock: from here no handshake can register on them.
            let (gone, kept) = std::mem::take(&mut state.entries)
                .into_iter()
                .partition(|e| matches(&e.export.name));
            state.entries = kept;
            gone.into_iter().map(|e: Entry| (e.id, e.export)).collect()
        };
        let open = |ids: &[ExportId], limit: Duration| -> Vec<ExportId> {
            let deadline = Instant::now() + limit;
            ids.iter()
                .copied()
                .filter(|&id| {
                    let left = deadline.saturating_duration_since(Instant::now());
                    table.wait_closed(id, left) > 0
                })
                .collect()
        };
        let ids: Vec<ExportId> = removed.iter().map(|(id, _)| *id).collect();
        let mut still = open(&ids, Duration::ZERO);
        for &id in &still {
            self.shared.post(ReactorCommand::Stop(id));
        }
        still = open(&still, self.shared.limits.shutdown_grace);
        if !still.is_empty() {
            tracing::warn!(
                exports = still.len(),
                "nbd: clients did not finish within the grace period; shutting their sockets down"
            );
            for &id in &still {
                self.shared.post(ReactorCommand::Break(id));
            }
            still = open(&still, BREAK_WAIT);
        }
        let stuck = {
            let state = table.lock();
            removed
                .iter()
                .filter(|(id, _)| still.contains(id))
                .map(|(id, e)| (e.name.clone(), ExportTable::connections(&state, *id)))
                .collect()
        };
        Ok(Removed {
            exports: removed.into_iter().map(|(_, e)| e).collect(),
            stuck,
        })
    }
}

/// What [`Exports::remove_all`] did.
#[derive(Debug)]
pub struct Removed {
    /// The exports removed (their volume handles).
    pub exports: Vec<ServerExport>,
    /// Exports whose client connections had still not ended after their sockets were shut
    /// down, with how many: their requests may still be inside the engine.
    pub stuck: Vec<(String, usize)>,
}

/// What the administrator asks every reactor to do to the connections of one export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReactorCommand {
    /// Stop reading requests; answer those read; close.
    Stop(ExportId),
    /// Shut the socket down now (after [`ReactorCommand::Stop`] did not end them in time).
    Break(ExportId),
}
