//! The seam between the NBD server and the engine's change maps.
//!
//! A served volume may offer `oxpool:changed-since:SNAP` and `oxpool:changed-since:#BOOKMARK`
//! metadata contexts: per extent, whether it was written, trimmed or zeroed since that
//! snapshot (bit 0 of the extent's status). The engine knows the answer from its block
//! pointers' birth txgs (exactly, and after any crash); the server asks it through
//! [`ChangeMaps`], given once for the whole server ([`super::ServerConfig::change_maps`]).
//! [`EngineChangeMaps`] answers from the engine ([`Volume::changed_extents`]): what `oxpool
//! serve` uses. The default, [`NoChangeMaps`], offers none: clients that ask for a change map
//! are answered as the protocol says for a context the server does not have (not selected),
//! and `base:allocation` is served as before.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use oxpool_engine::{EngineError, PinnedBase, Volume};
use oxpool_format::{Guid, Txg};

use crate::proto::{BasePin, ChangeBase, ChangeMapCatalog};

/// One extent of a change map, in offset order from the start of the query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeExtent {
    /// Its length (non-zero).
    pub length_bytes: u64,
    /// Written, trimmed or zeroed since the base (a superset of the changed bytes is allowed,
    /// a miss never is).
    pub changed: bool,
}

/// The future [`ChangeMaps::changed_extents`] returns. Not `Send`: it runs on the reactor
/// that serves the connection, like every volume operation.
pub type ChangeExtentsFuture<'a> =
    Pin<Box<dyn Future<Output = oxpool_engine::Result<Vec<ChangeExtent>>> + 'a>>;

/// Where served volumes' change maps come from.
///
/// Called by the handshake (which maps a volume offers: the snapshots and bookmarks it has
/// now) and by BLOCK_STATUS (the extents). Shared by every reactor thread.
pub trait ChangeMaps: Send + Sync + fmt::Debug {
    /// The change maps `volume` offers now, at most `limit`, in a stable order.
    fn bases(&self, volume: &Volume, limit: usize) -> Vec<ChangeBase>;

    /// What `volume`'s change map since `base` resolves to now (None if it offers none):
    /// resolved once, when a client selects it, so that a rename of the base, or a new
    /// snapshot under its old name, leaves the client's map since what it chose.
    fn pin(&self, volume: &Volume, base: &ChangeBase) -> Option<BasePin>;

    /// The change map of `volume` since `base`, as pinned by [`ChangeMaps::pin`] when the
    /// client chose it, over `[offset_bytes, offset_bytes + length_bytes)`: extents in order
    /// from `offset_bytes`, covering at least its first byte and at most the range (a prefix
    /// is enough: the client asks again for the rest). An error (for example a base
    /// destroyed since the handshake) fails that BLOCK_STATUS request with its errno, not
    /// the connection.
    fn changed_extents<'a>(
        &'a self,
        volume: &'a Volume,
        base: &'a ChangeBase,
        pin: BasePin,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> ChangeExtentsFuture<'a>;
}

/// The engine's change maps: a volume offers one since each snapshot of its lineage (for a
/// snapshot export, each one before it; for a clone, its origin's chain too), computed by
/// birth txg from the block trees and the data not yet synced ([`Volume::change_bases`],
/// [`Volume::changed_extents`]). Bookmarks come with the engine's bookmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineChangeMaps;

/// The engine's name of a base.
fn engine_base(base: &ChangeBase) -> oxpool_engine::ChangeBase {
    match base {
        ChangeBase::Snapshot(name) => oxpool_engine::ChangeBase::Snapshot(name.clone()),
        ChangeBase::Bookmark(name) => oxpool_engine::ChangeBase::Bookmark(name.clone()),
    }
}

/// The engine's pinned base from the pin the handshake kept (guid, txg) and the kind the
/// base's name says.
fn engine_pin(base: &ChangeBase, pin: BasePin) -> PinnedBase {
    PinnedBase {
        bookmark: matches!(base, ChangeBase::Bookmark(_)),
        guid: Guid(pin.0),
        txg: Txg(pin.1),
    }
}

impl ChangeMaps for EngineChangeMaps {
    fn bases(&self, volume: &Volume, limit: usize) -> Vec<ChangeBase> {
        volume
            .change_bases(limit)
            .into_iter()
            // Only names a client can select (engine names always are: A-Z a-z 0-9 _ . -).
            .filter_map(|base| {
                let leaf = match &base {
                    oxpool_engine::ChangeBase::Snapshot(name) => name.clone(),
                    oxpool_engine::ChangeBase::Bookmark(name) => format!("#{name}"),
                };
                ChangeBase::parse(leaf.as_bytes())
            })
            .collect()
    }

    fn pin(&self, volume: &Volume, base: &ChangeBase) -> Option<BasePin> {
        let pin = volume.pin_change_base(&engine_base(base))?;
        Some(BasePin(pin.guid.0, pin.txg.0))
    }

    fn changed_extents<'a>(
        &'a self,
        volume: &'a Volume,
        base: &'a ChangeBase,
        pin: BasePin,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> ChangeExtentsFuture<'a> {
        Box::pin(async move {
            let extents = volume
                .changed_extents_since(&engine_pin(base, pin), offset_bytes, length_bytes)
                .await
                .map_err(|e| match e {
                    // The base (or the snapshot served) was destroyed since the handshake:
                    // the request is no longer valid (EINVAL), nothing failed (not EIO).
                    EngineError::NotFound(what) => {
                        EngineError::Invalid(format!("{what} (selected as {base})"))
                    }
                    e => e,
                })?;
            Ok(extents
                .into_iter()
                .map(|e| ChangeExtent {
                    length_bytes: e.length_bytes,
                    changed: e.changed,
                })
                .collect())
        })
    }
}

/// Offers no change map.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoChangeMaps;

impl ChangeMaps for NoChangeMaps {
    fn bases(&self, _: &Volume, _: usize) -> Vec<ChangeBase> {
        Vec::new()
    }

    fn pin(&self, _: &Volume, _: &ChangeBase) -> Option<BasePin> {
        None
    }

    fn changed_extents<'a>(
        &'a self,
        _: &'a Volume,
        base: &'a ChangeBase,
        _: BasePin,
        _: u64,
        _: u64,
    ) -> ChangeExtentsFuture<'a> {
        // Unreachable through the handshake, which selects only what `pin` resolves.
        let message = format!("no change map since {base}");
        Box::pin(async move { Err(EngineError::Invalid(message)) })
    }
}

/// One handshake's view of the change maps: the volumes it offers (by export index) and the
/// server's [`ChangeMaps`].
#[derive(Debug)]
pub(crate) struct ExportCatalog {
    pub(crate) volumes: Vec<Volume>,
    pub(crate) maps: std::sync::Arc<dyn ChangeMaps>,
}

impl ChangeMapCatalog for ExportCatalog {
    fn pin(&self, export_index: usize, base: &ChangeBase) -> Option<BasePin> {
        self.volumes
            .get(export_index)
            .and_then(|volume| self.maps.pin(volume, base))
    }

    fn offered(&self, export_index: usize, limit: usize) -> Vec<ChangeBase> {
        self.volumes
            .get(export_index)
            .map_or_else(Vec::new, |volume| self.maps.bases(volume, limit))
    }
}
