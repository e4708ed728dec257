//! `rename`, as `zfs rename`: a volume, a snapshot or a bookmark takes another name in its
//! pool; nothing else about it changes (its guid, blocks, snapshots, holds, clones).
//!
//! Why no sync task (docs/DESIGN.md 5.2): a rename changes one record and no block. A
//! volume's name is one field of the pool's metadata; a snapshot's or a bookmark's is one
//! record of its volume's table. Each is changed in memory under the lock the sync reads it
//! under (the dataset registry's, the volume's lineage), as holds and bookmarks are, so every
//! txg's metadata holds the old name or the new one, never both nor neither, and the
//! uberblock of the txg this waits for makes the new one durable before it returns.
//!
//! What refers to a volume or snapshot does so by id or guid, not by name, and so follows:
//! a clone's origin (volume id and snapshot guid), holds (in the snapshot's record),
//! incremental sends and receives (lineage matched by guid), the intent log (by volume id;
//! its replay finds the volume under the name of the same metadata), snapshot changes a
//! command checked but the sync has not applied yet (by volume id and snapshot guid). A
//! change map's base is pinned to its snapshot's guid when a client selects it: a rename
//! keeps that client's map, and only a new selection resolves the name again.

use super::recv::{is_hidden, HIDDEN_SUFFIX};
use super::Pool;
use crate::dsl::snapshot::SnapOp;
use crate::spa::check_name;
use crate::{EngineError, Result};

/// What a name inside a pool names: `VOL`, `VOL@SNAP` or `VOL#BOOKMARK`.
enum Target<'a> {
    Volume(&'a str),
    Snapshot(&'a str, &'a str),
    Bookmark(&'a str, &'a str),
}

fn parse(name: &str) -> Result<Target<'_>> {
    let bad = || {
        EngineError::invalid(format!(
            "'{name}': name a volume VOL, a snapshot VOL@SNAP or a bookmark VOL#BOOKMARK"
        ))
    };
    match (name.split_once('@'), name.split_once('#')) {
        (None, None) if !name.is_empty() => Ok(Target::Volume(name)),
        (Some((v, s)), None) if !v.is_empty() && !s.is_empty() => Ok(Target::Snapshot(v, s)),
        (None, Some((v, b))) if !v.is_empty() && !b.is_empty() => Ok(Target::Bookmark(v, b)),
        _ => Err(bad()),
    }
}

impl Pool {
    /// Renames `from` to `to`, names inside the pool of one kind: a volume `VOL` to `NEW`, a
    /// snapshot `VOL@SNAP` to `VOL@NEW`, a bookmark `VOL#BM` to `VOL#NEW` (a snapshot or a
    /// bookmark stays with its volume). Durable when this returns. Refused, nothing changed,
    /// if `from` is missing, `to` exists or is not a valid name, or the kinds differ.
    /// Handles to a renamed volume keep working; they show the new name from then on.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.spa.txg.check_writable()?;
        match (parse(from)?, parse(to)?) {
            (Target::Volume(f), Target::Volume(t)) => self.rename_volume(f, t),
            (Target::Snapshot(fv, fs), Target::Snapshot(tv, ts)) => {
                self.same_volume(fv, tv, "snapshot")?;
                self.rename_snapshot(fv, fs, ts)
            }
            (Target::Bookmark(fv, fb), Target::Bookmark(tv, tb)) => {
                self.same_volume(fv, tv, "bookmark")?;
                self.rename_bookmark(fv, fb, tb)
            }
            _ => Err(EngineError::invalid(format!(
                "cannot rename {pool}/{from} to {pool}/{to}: a volume, a snapshot or a \
                 bookmark keeps its kind",
                pool = self.spa.name
            ))),
        }
    }

    fn same_volume(&self, from: &str, to: &str, kind: &str) -> Result<()> {
        if from == to {
            return Ok(());
        }
        Err(EngineError::invalid(format!(
            "cannot rename a {kind} of {pool}/{from} to one of {pool}/{to}: a {kind} stays \
             with its volume",
            pool = self.spa.name
        )))
    }

    fn rename_volume(&self, from: &str, to: &str) -> Result<()> {
        check_name("volume", to)?;
        {
            // The pool's table first, then the registry's, as create and destroy take them.
            let mut volumes = self.volumes.lock().unwrap();
            let full = |n: &str| format!("{}/{n}", self.spa.name);
            if is_hidden(from) || !volumes.contains_key(from) {
                return Err(EngineError::NotFound(full(from)));
            }
            if volumes.contains_key(to) {
                return Err(EngineError::Exists(full(to)));
            }
            self.dsl.rename(from, to, HIDDEN_SUFFIX)?;
            let vol = volumes.remove(from).expect("checked above");
            volumes.insert(to.to_string(), vol);
        }
        let pool = &self.spa.name;
        self.spa
            .error_log
            .rename(&format!("{pool}/{from}"), &format!("{pool}/{to}"));
        self.spa.txg.mark_dirty();
        tracing::info!(pool = self.spa.name, from, to, "volume renamed");
        self.spa.sync_now()
    }

    /// Refused while a snapshot change of the volume naming `from` or `to` is queued for
    /// the next sync: a snapshot queued as `to` would make two of one name, and a destroy's
    /// or rollback's command (which goes by guid) names the snapshot as it was asked.
    fn snapshot_change_queued(&self, volume: &str, names: [&str; 2]) -> Result<()> {
        let id = self.dataset(volume)?.id;
        let queued = self.dsl.queued_ops().into_iter().any(|(d, o)| {
            d == id
                && match &o {
                    SnapOp::Create { name, .. }
                    | SnapOp::Destroy { name, .. }
                    | SnapOp::Rollback { name, .. } => names.contains(&name.as_str()),
                    SnapOp::Promote | SnapOp::Receive(_) => true,
                }
        });
        if queued {
            return Err(EngineError::Busy(format!(
                "{}/{volume}: a change of its snapshots is being applied; try again",
                self.spa.name
            )));
        }
        Ok(())
    }

    fn rename_snapshot(&self, volume: &str, from: &str, to: &str) -> Result<()> {
        check_name("snapshot", to)?;
        let ds = self.dataset(volume)?;
        self.snapshot_change_queued(volume, [from, to])?;
        let guid = {
            let mut l = ds.lineage.lock().unwrap();
            let i = l
                .find(from)
                .ok_or_else(|| self.no_snapshot(volume, from))?
                .0;
            if l.find(to).is_some() {
                return Err(EngineError::Exists(format!(
                    "{}/{volume}@{to}",
                    self.spa.name
                )));
            }
            // In place: only its chunk of the snapshot table is rewritten.
            let s = l.snapshot_mut(i);
            s.name = to.to_string();
            s.guid
        };
        self.dsl
            .rename_views(ds.id, guid, &format!("{volume}@{to}"));
        let pool = &self.spa.name;
        self.spa.error_log.rename(
            &format!("{pool}/{volume}@{from}"),
            &format!("{pool}/{volume}@{to}"),
        );
        tracing::info!(pool = self.spa.name, volume, from, to, "snapshot renamed");
        self.spa.sync_now()
    }

    fn rename_bookmark(&self, volume: &str, from: &str, to: &str) -> Result<()> {
        check_name("bookmark", to)?;
        let ds = self.dataset(volume)?;
        {
            let mut l = ds.lineage.lock().unwrap();
            let marks = l.bookmarks();
            let i = marks
                .iter()
                .position(|b| b.name == from)
                .ok_or_else(|| self.no_bookmark(volume, from))?;
            if marks.iter().any(|b| b.name == to) {
                return Err(EngineError::Exists(format!(
                    "{}/{volume}#{to}",
                    self.spa.name
                )));
            }
            // Kept sorted by txg, then name: taken out and put back in its place.
            let marks = l.bookmarks_mut();
            let mut record = marks.remove(i);
            record.name = to.to_string();
            let at = marks.partition_point(|b| (b.txg, &b.name) < (record.txg, &record.name));
            marks.insert(at, record);
        }
        tracing::info!(pool = self.spa.name, volume, from, to, "bookmark renamed");
        self.spa.sync_now()
    }
}
