//! Metadata contexts: `base:allocation` and oxpool's change maps,
//! `oxpool:changed-since:SNAP` and `oxpool:changed-since:#BOOKMARK`.
//!
//! A change map flags (bit 0 of an extent's status, [`BlockStatusFlags::CHANGED`]) every
//! range of the export written, trimmed or zeroed after a snapshot (or the snapshot a bookmark
//! marks). Which ones an export offers is the server's business: the handshake asks a
//! [`ChangeMapCatalog`] only when a client sends LIST or SET_META_CONTEXT, so a server with
//! thousands of snapshots pays nothing per connection.
//!
//! [`BlockStatusFlags::CHANGED`]: super::BlockStatusFlags::CHANGED

use std::fmt;

use super::types::MetaContextId;
use super::wire;

/// Namespace of oxpool's own contexts. `LIST_META_CONTEXT` with the query `oxpool:` lists
/// all of them.
pub const OXPOOL_NAMESPACE: &str = "oxpool:";

/// Prefix of a change map's context name; what follows is its base, `SNAP` or `#BOOKMARK`.
/// `LIST_META_CONTEXT` with this query alone lists every change map of the export.
pub const CHANGED_SINCE_PREFIX: &str = "oxpool:changed-since:";

/// Longest base name (without the `#` of a bookmark): ZFS's limit for a whole dataset name,
/// which a snapshot's or a bookmark's own part never exceeds.
pub const CHANGE_BASE_BYTES_MAX: usize = 256;

/// Most change maps one `SET_META_CONTEXT` may select (more is `NBD_REP_ERR_TOO_BIG`): each
/// costs a reply chunk and a tree walk per BLOCK_STATUS.
pub const CHANGE_MAPS_SELECTED_MAX: usize = 8;

/// Most change maps one `LIST_META_CONTEXT` names (the protocol lets a server omit contexts
/// from a list that would be too long); bounds the reply to about 300 KiB.
pub const CHANGE_MAPS_LISTED_MAX: usize = 1024;

/// What a change map is relative to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChangeBase {
    /// A snapshot of the served volume (the part after `@`).
    Snapshot(String),
    /// A bookmark of the served volume (the part after `#`).
    Bookmark(String),
}

impl ChangeBase {
    /// Parses the leaf after [`CHANGED_SINCE_PREFIX`]: `SNAP` or `#BOOKMARK`, each name 1 to
    /// [`CHANGE_BASE_BYTES_MAX`] bytes of UTF-8 without `@`, `#`, `/`, NUL or control
    /// characters. `None` for anything else.
    pub fn parse(leaf: &[u8]) -> Option<ChangeBase> {
        let (bookmark, name) = match leaf.strip_prefix(b"#") {
            Some(name) => (true, name),
            None => (false, leaf),
        };
        if name.is_empty() || name.len() > CHANGE_BASE_BYTES_MAX {
            return None;
        }
        let name = std::str::from_utf8(name).ok()?;
        if name
            .chars()
            .any(|c| c.is_control() || matches!(c, '@' | '#' | '/'))
        {
            return None;
        }
        let name = name.to_owned();
        Some(if bookmark {
            ChangeBase::Bookmark(name)
        } else {
            ChangeBase::Snapshot(name)
        })
    }

    /// The snapshot's or bookmark's name (without `#`).
    pub fn name(&self) -> &str {
        match self {
            ChangeBase::Snapshot(name) | ChangeBase::Bookmark(name) => name,
        }
    }

    /// The context name: `oxpool:changed-since:SNAP` or `oxpool:changed-since:#BOOKMARK`.
    pub fn context_name(&self) -> String {
        format!("{CHANGED_SINCE_PREFIX}{self}")
    }
}

/// The leaf: `SNAP` or `#BOOKMARK`.
impl fmt::Display for ChangeBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeBase::Snapshot(name) => f.write_str(name),
            ChangeBase::Bookmark(name) => write!(f, "#{name}"),
        }
    }
}

/// What the server's catalog resolved a change map's base to when the client selected it,
/// handed back with every BLOCK_STATUS: opaque to the protocol. It lets a base keep meaning
/// what it meant at SET_META_CONTEXT when the name is later given to something else (a
/// snapshot renamed away and a new one taken under its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BasePin(pub u64, pub u64);

/// A metadata context this server serves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MetaContext {
    /// `base:allocation`: HOLE and ZERO.
    BaseAllocation,
    /// `oxpool:changed-since:BASE`: CHANGED, since what the base named when selected.
    ChangedSince(ChangeBase, BasePin),
}

impl MetaContext {
    /// The context's name, as the client asks for it.
    pub fn name(&self) -> String {
        match self {
            MetaContext::BaseAllocation => wire::BASE_ALLOCATION.to_owned(),
            MetaContext::ChangedSince(base, _) => base.context_name(),
        }
    }
}

/// A context the client selected for the export it chose, with the id its BLOCK_STATUS
/// chunks carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SelectedContext {
    /// The id the server gave it in `NBD_REP_META_CONTEXT`.
    pub id: MetaContextId,
    /// Which context.
    pub context: MetaContext,
}

impl SelectedContext {
    /// `base:allocation` with its id.
    pub fn base_allocation() -> SelectedContext {
        SelectedContext {
            id: MetaContextId::BASE_ALLOCATION,
            context: MetaContext::BaseAllocation,
        }
    }
}

/// Which change maps each export offers, asked by the handshake when a client lists or
/// selects contexts (by export index, as in the handshake's export list).
pub trait ChangeMapCatalog: fmt::Debug {
    /// What `oxpool:changed-since:<base>` of export `export_index` resolves to now, or
    /// None if the export does not offer it.
    fn pin(&self, export_index: usize, base: &ChangeBase) -> Option<BasePin>;

    /// The change maps export `export_index` offers now, at most `limit`, in a stable order.
    fn offered(&self, export_index: usize, limit: usize) -> Vec<ChangeBase>;
}

/// A catalog that offers no change map: only `base:allocation` is served.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmptyCatalog;

impl ChangeMapCatalog for EmptyCatalog {
    fn pin(&self, _: usize, _: &ChangeBase) -> Option<BasePin> {
        None
    }

    fn offered(&self, _: usize, _: usize) -> Vec<ChangeBase> {
        Vec::new()
    }
}
