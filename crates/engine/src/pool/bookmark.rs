//! Bookmarks (`oxpool bookmark POOL/VOL@SNAP POOL/VOL#NAME`): what an incremental send and a
//! change map need of a snapshot, its guid, txg and size, kept after the snapshot is gone.
//! A bookmark holds no block: the birth-txg rule needs only the txg to tell what changed
//! after it, so a sender can destroy what it has replicated and still send incrementals.
//!
//! A bookmark is a record in its dataset's bookmark table (`dsl/table.rs`), changed in memory
//! under the dataset's lock and made durable by the txg this waits for, as a hold is.

use super::Pool;
use crate::dsl::snapshot::Lineage;
use crate::spa::check_name;
use crate::{EngineError, Result};
use oxpool_format::{BookmarkMeta, Guid, Txg};

/// A bookmark, as `oxpool list -t bookmark` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BookmarkInfo {
    /// The volume's name in the pool.
    pub volume: String,
    /// The name after the `#`.
    pub name: String,
    /// The guid of the snapshot it was made from.
    pub guid: u64,
    /// That snapshot's txg (`createtxg`).
    pub txg: u64,
    /// That snapshot's creation time, seconds since the Unix epoch.
    pub creation_s: u64,
    /// The volume's size in that snapshot.
    pub volsize_bytes: u64,
}

/// What an incremental needs of its base, a snapshot or a bookmark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IncrementalBase {
    pub guid: oxpool_format::Guid,
    pub txg: Txg,
    pub volsize_bytes: u64,
}

/// Splits `VOL#NAME`.
fn split_bookmark_name(full: &str) -> Result<(&str, &str)> {
    match full.split_once('#') {
        Some((v, b)) if !v.is_empty() && !v.contains('@') && !b.is_empty() => Ok((v, b)),
        _ => Err(EngineError::invalid(format!(
            "'{full}': a bookmark is named VOLUME#BOOKMARK"
        ))),
    }
}

impl Pool {
    /// Makes bookmark `bookmark` (`VOL#NAME`) of `source`, a snapshot `VOL@SNAP` or another
    /// bookmark `VOL#OTHER` of the same volume.
    pub fn bookmark(&self, source: &str, bookmark: &str) -> Result<()> {
        let (volume, name) = split_bookmark_name(bookmark)?;
        check_name("bookmark", name)?;
        let (src_volume, base) = match source.split_once('@') {
            Some((v, s)) => (v, format!("@{s}")),
            None => {
                let (v, b) = split_bookmark_name(source)?;
                (v, format!("#{b}"))
            }
        };
        if src_volume != volume {
            return Err(EngineError::invalid(format!(
                "'{source}' and '{bookmark}': a bookmark belongs to the volume of its snapshot"
            )));
        }
        self.spa.txg.check_writable()?;
        let ds = self.dataset(volume)?;
        {
            let mut l = ds.lineage.lock().unwrap();
            if l.bookmarks().iter().any(|b| b.name == name) {
                return Err(EngineError::Exists(format!(
                    "{}/{volume}#{name}",
                    self.spa.name
                )));
            }
            let record = match base.strip_prefix('@') {
                Some(snap) => {
                    let (_, s) = l.find(snap).ok_or_else(|| self.no_snapshot(volume, snap))?;
                    BookmarkMeta {
                        name: name.to_string(),
                        guid: s.guid,
                        txg: s.txg,
                        creation_s: s.creation_s,
                        volsize_bytes: s.volsize_bytes,
                    }
                }
                None => {
                    let other = &base[1..];
                    let b = l
                        .bookmarks()
                        .iter()
                        .find(|b| b.name == other)
                        .ok_or_else(|| self.no_bookmark(volume, other))?;
                    BookmarkMeta {
                        name: name.to_string(),
                        ..b.clone()
                    }
                }
            };
            let marks = l.bookmarks_mut();
            let at = marks.partition_point(|b| (b.txg, &b.name) < (record.txg, &record.name));
            marks.insert(at, record);
        }
        self.spa.sync_now()
    }

    /// Destroys bookmark `volume#name`.
    pub fn destroy_bookmark(&self, volume: &str, name: &str) -> Result<()> {
        self.spa.txg.check_writable()?;
        let ds = self.dataset(volume)?;
        {
            let mut l = ds.lineage.lock().unwrap();
            let i = l
                .bookmarks()
                .iter()
                .position(|b| b.name == name)
                .ok_or_else(|| self.no_bookmark(volume, name))?;
            l.bookmarks_mut().remove(i);
        }
        self.spa.sync_now()
    }

    /// The bookmarks of `volume`, oldest first.
    pub fn bookmarks(&self, volume: &str) -> Result<Vec<BookmarkInfo>> {
        let ds = self.dataset(volume)?;
        let l = ds.lineage.lock().unwrap();
        Ok(l.bookmarks()
            .iter()
            .map(|b| BookmarkInfo {
                volume: volume.to_string(),
                name: b.name.clone(),
                guid: b.guid.0,
                txg: b.txg.0,
                creation_s: b.creation_s,
                volsize_bytes: b.volsize_bytes,
            })
            .collect())
    }

    /// Every bookmark of every volume, by volume then oldest first.
    pub fn all_bookmarks(&self) -> Vec<BookmarkInfo> {
        let names: Vec<String> = self.dsl.all().iter().map(|d| d.name()).collect();
        names
            .iter()
            .filter_map(|n| self.bookmarks(n).ok())
            .flatten()
            .collect()
    }

    pub(crate) fn no_bookmark(&self, volume: &str, name: &str) -> EngineError {
        EngineError::NotFound(format!("{}/{volume}#{name}", self.spa.name))
    }

    /// The base `base` names for an incremental of `volume`: `NAME` a snapshot (after the
    /// `@`), `#NAME` a bookmark.
    /// The base with guid `guid` among `l`'s snapshots and bookmarks (a resumed send's token
    /// names its base by guid).
    pub(crate) fn incremental_base_by_guid(l: &Lineage, guid: Guid) -> Option<IncrementalBase> {
        let snap = l
            .snapshots()
            .iter()
            .find(|s| s.guid == guid)
            .map(|s| IncrementalBase {
                guid,
                txg: s.txg,
                volsize_bytes: s.volsize_bytes,
            });
        snap.or_else(|| {
            l.bookmarks()
                .iter()
                .find(|b| b.guid == guid)
                .map(|b| IncrementalBase {
                    guid,
                    txg: b.txg,
                    volsize_bytes: b.volsize_bytes,
                })
        })
    }

    pub(crate) fn incremental_base(&self, volume: &str, base: &str) -> Result<IncrementalBase> {
        let ds = self.dataset(volume)?;
        let l = ds.lineage.lock().unwrap();
        match base.strip_prefix('#') {
            Some(name) => l
                .bookmarks()
                .iter()
                .find(|b| b.name == name)
                .map(|b| IncrementalBase {
                    guid: b.guid,
                    txg: b.txg,
                    volsize_bytes: b.volsize_bytes,
                })
                .ok_or_else(|| self.no_bookmark(volume, name)),
            None => l
                .find(base)
                .map(|(_, s)| IncrementalBase {
                    guid: s.guid,
                    txg: s.txg,
                    volsize_bytes: s.volsize_bytes,
                })
                .ok_or_else(|| self.no_snapshot(volume, base)),
        }
    }
}
