//! The seam between the NBD server and the engine's change maps.
//!
//! A served volume may offer `oxpool:changed-since:SNAP` and `oxpool:changed-since:#BOOKMARK`
//! metadata contexts: per extent, whether it was written, trimmed or zeroed since that
//! snapshot (bit 0 of the extent's status). The engine knows the answer from its block
//! pointers' birth txgs (exactly, and after any crash); the server asks it through
//! [`ChangeMaps`], given once for the whole server ([`super::ServerConfig::change_maps`]).
//! The default, [`NoChangeMaps`], offers none: clients that ask for a change map are
//! answered as the protocol says for a context the server does not have (not selected), and
//! `base:allocation` is served as before.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use oxpool_engine::{EngineError, Volume};

use crate::proto::{ChangeBase, ChangeMapCatalog};

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

    /// Whether `volume` offers a change map since `base` now.
    fn offers(&self, volume: &Volume, base: &ChangeBase) -> bool;

    /// The change map of `volume` since `base` over `[offset_bytes, offset_bytes +
    /// length_bytes)`: extents in order from `offset_bytes`, covering at least its first byte
    /// and at most the range (a prefix is enough: the client asks again for the rest). An
    /// error (for example a base destroyed since the handshake) fails that BLOCK_STATUS
    /// request with its errno, not the connection.
    fn changed_extents<'a>(
        &'a self,
        volume: &'a Volume,
        base: &'a ChangeBase,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> ChangeExtentsFuture<'a>;
}

/// Offers no change map (until the engine provides them).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoChangeMaps;

impl ChangeMaps for NoChangeMaps {
    fn bases(&self, _: &Volume, _: usize) -> Vec<ChangeBase> {
        Vec::new()
    }

    fn offers(&self, _: &Volume, _: &ChangeBase) -> bool {
        false
    }

    fn changed_extents<'a>(
        &'a self,
        _: &'a Volume,
        base: &'a ChangeBase,
        _: u64,
        _: u64,
    ) -> ChangeExtentsFuture<'a> {
        // Unreachable through the handshake, which selects only what `offers` accepts.
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
    fn offers(&self, export_index: usize, base: &ChangeBase) -> bool {
        self.volumes
            .get(export_index)
            .is_some_and(|volume| self.maps.offers(volume, base))
    }

    fn offered(&self, export_index: usize, limit: usize) -> Vec<ChangeBase> {
        self.volumes
            .get(export_index)
            .map_or_else(Vec::new, |volume| self.maps.bases(volume, limit))
    }
}
