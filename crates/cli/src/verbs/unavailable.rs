//! `oxpool status` of a pool this machine knows (its cache file lists it) that cannot be
//! opened: why, what to do, and its devices in the shape of its vdev tree, as `zpool status`
//! shows an UNAVAIL pool. The tree is the one the newest label found among the pool's
//! devices records (each label holds the whole tree); each device in it is said found (by
//! its guid, wherever it is) or what is at its path instead, and each vdev whether it has
//! enough devices. With no label found, the devices the cache file lists, one per line.

use crate::host;
use anyhow::Result;
use oxpool_engine::cachefile;
use oxpool_engine::VdevStatus;
use oxpool_format::{
    LabelConfig, LeafConfig, PairKind, TopVdevConfig, TopVdevKind, VdevTreeConfig,
};
use std::path::{Path, PathBuf};

use crate::host::Host;

/// A pool this machine knows that could not be opened.
pub struct UnavailablePool {
    /// Why, as the open said it.
    pub why: String,
    /// The devices the cache file lists, each with what is at its path.
    pub devices: Vec<(PathBuf, DeviceFound)>,
    /// The vdev tree of the newest label found among them (none: no label found).
    pub tree: Option<VdevTreeConfig>,
}

/// What is at a path the cache file lists for a pool that could not be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceFound {
    /// Nothing.
    Missing,
    /// A device whose label names this pool (its leaf guid).
    Ours(u64),
    /// A device whose label names this pool (its leaf guid), smaller than the pool
    /// recorded: its bytes, and the size recorded (a truncated file).
    Truncated(u64, u64, u64),
    /// A device with no valid label (damaged, blank, or not a pool device).
    NoLabel,
    /// A device of another pool (its name and guid).
    Another(String, u64),
}

impl DeviceFound {
    /// What `path` holds for the pool of guid `guid`, and its label if it is the pool's.
    fn at(path: &Path, guid: u64) -> (DeviceFound, Option<LabelConfig>) {
        if !path.exists() {
            return (DeviceFound::Missing, None);
        }
        match crate::devices::peek_label(path) {
            Some(l) if l.pool_guid.0 == guid => {
                let leaf = l.leaf_guid.0;
                let recorded = l
                    .tree
                    .leaves()
                    .find(|c| c.guid.0 == leaf)
                    .map(|c| c.size_bytes);
                // A file's length (a block device's is not in its metadata).
                let bytes = std::fs::metadata(path)
                    .ok()
                    .filter(|m| m.is_file())
                    .map(|m| m.len());
                match (bytes, recorded) {
                    (Some(b), Some(r)) if b < r => (DeviceFound::Truncated(leaf, b, r), Some(l)),
                    _ => (DeviceFound::Ours(leaf), Some(l)),
                }
            }
            Some(l) => (DeviceFound::Another(l.pool_name, l.pool_guid.0), None),
            None => (DeviceFound::NoLabel, None),
        }
    }

    /// The pool's leaf guid the device's label names, if it is the pool's.
    fn leaf(&self) -> Option<u64> {
        match self {
            DeviceFound::Ours(g) | DeviceFound::Truncated(g, _, _) => Some(*g),
            _ => None,
        }
    }

    /// The STATE column and the note of a device line.
    fn state_and_note(&self) -> (&'static str, String) {
        match self {
            DeviceFound::Ours(_) => ("-", "found".to_string()),
            DeviceFound::Truncated(_, bytes, recorded) => (
                "UNAVAIL",
                format!("truncated: {bytes} bytes, the pool recorded {recorded}"),
            ),
            DeviceFound::NoLabel => ("UNAVAIL", "found, with no valid label".to_string()),
            DeviceFound::Missing => ("UNAVAIL", "not found".to_string()),
            DeviceFound::Another(pool, guid) => (
                "UNAVAIL",
                format!("holds a device of another pool, '{pool}' (guid {guid:x})"),
            ),
        }
    }
}

/// `err`, from opening pool `name` here, as an [`UnavailablePool`] if the open failed for
/// what the pool's devices hold or lack ([`host::Unavailable`]) and the cache file lists it;
/// else `err` itself (a pool nobody knows, a device in use, a served pool's error).
pub fn unavailable(host: &Host, name: &str, err: anyhow::Error) -> Result<UnavailablePool> {
    let Host::Local { cache } = host else {
        return Err(err);
    };
    if err.downcast_ref::<host::Unavailable>().is_none() {
        return Err(err);
    }
    let known = cachefile::read(cache)
        .ok()
        .and_then(|pools| pools.into_iter().find(|p| p.name == name));
    let Some(entry) = known else {
        return Err(err);
    };
    let mut newest: Option<LabelConfig> = None;
    let mut devices = Vec::new();
    for d in entry.devices {
        let (found, label) = DeviceFound::at(&d, entry.guid);
        if let Some(l) = label {
            if newest.as_ref().is_none_or(|n| l.create_txg > n.create_txg) {
                newest = Some(l);
            }
        }
        devices.push((d, found));
    }
    Ok(UnavailablePool {
        why: unavailable_why(&err),
        devices,
        tree: newest.map(|l| l.tree),
    })
}

/// Why a pool could not be opened, without the "cannot open pool" the error starts with
/// (the reason names the pool itself).
pub fn unavailable_why(err: &anyhow::Error) -> String {
    match err.downcast_ref::<host::Unavailable>() {
        Some(u) => u.0.root_cause().to_string(),
        None => format!("{err:#}"),
    }
}

/// The engine's reason for a device of an open pool it did not get at import.
const NOT_FOUND_AT_IMPORT: &str = "not found at import";

/// In the status of a pool that opened without some devices: says, for each device the
/// import did not get, what is at its path when something is (another pool's device, one
/// with no valid label, this pool's device cut short), rather than "not found".
pub fn explain_not_found(status: &mut oxpool_engine::PoolStatus) {
    let guid = status.guid;
    let mut explain = |v: &mut VdevStatus| {
        if v.state == "UNAVAIL"
            && v.children.is_empty()
            && v.reason.as_deref() == Some(NOT_FOUND_AT_IMPORT)
        {
            let (found, label) = DeviceFound::at(Path::new(&v.name), guid);
            // The device's own label records it at this very path: it is this device, back
            // since the import (a served pool opened without it). Else another device of the
            // pool is there: import would have taken this one's own label.
            let back = |g: u64| {
                label.as_ref().is_some_and(|l| {
                    l.tree
                        .leaves()
                        .any(|leaf| leaf.guid.0 == g && Path::new(&leaf.path) == Path::new(&v.name))
                })
            };
            v.reason = match found {
                DeviceFound::Missing => return,
                DeviceFound::Ours(g) if back(g) => Some(
                    "back at its path since the import (`oxpool export` and `oxpool import` \
                     open it)"
                        .to_string(),
                ),
                DeviceFound::Ours(g) => Some(format!("holds another device of this pool ({g:x})")),
                other => Some(other.state_and_note().1),
            };
        }
    };
    fn each(v: &mut VdevStatus, f: &mut dyn FnMut(&mut VdevStatus)) {
        f(v);
        for c in &mut v.children {
            each(c, f);
        }
    }
    for v in status.vdevs.iter_mut().chain(status.logs.iter_mut()) {
        each(v, &mut explain);
    }
}

/// Width of the NAME column.
const NAME_WIDTH: usize = 40;

/// One line of the config: `depth` levels in, as `zpool status` indents.
fn line(
    out: &mut dyn std::io::Write,
    depth: usize,
    name: &str,
    state: &str,
    note: &str,
) -> Result<()> {
    let indent = 2 * depth;
    let width = NAME_WIDTH.saturating_sub(indent);
    let text = format!("\t{:indent$}{name:<width$} {state:<9}  {note}", "");
    writeln!(out, "{}", text.trim_end())?;
    Ok(())
}

/// `oxpool status` of a pool that could not be opened, in `zpool status`'s shape.
pub fn print_unavailable(
    out: &mut dyn std::io::Write,
    name: &str,
    u: &UnavailablePool,
) -> Result<()> {
    writeln!(out, "  pool: {name}")?;
    writeln!(out, " state: UNAVAIL")?;
    writeln!(out, "status: {}", u.why)?;
    writeln!(
        out,
        "action: make its devices available (or find them with 'oxpool import -d DIR'), then \
         run the command again"
    )?;
    let Some(tree) = &u.tree else {
        writeln!(
            out,
            "config: the devices the cache file lists (no label found)\n"
        )?;
        line(out, 0, "NAME", "STATE", "")?;
        line(out, 0, name, "UNAVAIL", "")?;
        for (path, found) in &u.devices {
            let (state, note) = found.state_and_note();
            line(out, 1, &path.display().to_string(), state, &note)?;
        }
        writeln!(out)?;
        return Ok(());
    };
    writeln!(out, "config: as the newest label found records it\n")?;
    line(out, 0, "NAME", "STATE", "")?;
    line(out, 0, name, "UNAVAIL", "")?;
    let tops = |log: bool| {
        tree.top
            .iter()
            .filter(move |t| t.log == log && t.kind != TopVdevKind::Hole)
    };
    for t in tops(false) {
        print_top(out, u, t)?;
    }
    if tops(true).next().is_some() {
        line(out, 0, "logs", "", "")?;
        for t in tops(true) {
            print_top(out, u, t)?;
        }
    }
    if !tree.spares.is_empty() {
        line(out, 0, "spares", "", "")?;
        for s in &tree.spares {
            print_leaf(out, u, 1, s)?;
        }
    }
    // Paths the cache file lists that the tree does not name (by guid found there, or by
    // path): left over from an older shape, or another device put there.
    let named = |path: &Path, found: &DeviceFound| {
        tree.leaves()
            .any(|l| found.leaf() == Some(l.guid.0) || same_path(Path::new(&l.path), path))
    };
    let others: Vec<&(PathBuf, DeviceFound)> =
        u.devices.iter().filter(|(p, f)| !named(p, f)).collect();
    if !others.is_empty() {
        line(out, 0, "other paths the cache file lists", "", "")?;
        for (path, found) in others {
            let (state, note) = found.state_and_note();
            line(out, 1, &path.display().to_string(), state, &note)?;
        }
    }
    writeln!(out)?;
    Ok(())
}

/// Whether two paths name the same file (or the same missing path).
fn same_path(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// What the pool's leaf `leaf` is: found (its label, wherever it is), or what is at its
/// recorded path instead.
fn leaf_found(u: &UnavailablePool, leaf: &LeafConfig) -> (String, DeviceFound) {
    if let Some((path, found)) = u
        .devices
        .iter()
        .find(|(_, f)| f.leaf() == Some(leaf.guid.0))
    {
        return (path.display().to_string(), found.clone());
    }
    let at_path = u
        .devices
        .iter()
        .find(|(p, _)| same_path(p, Path::new(&leaf.path)))
        .map(|(_, f)| f.clone())
        // The pool's, but another leaf's label: not this leaf.
        .filter(|f| f.leaf().is_none());
    (leaf.path.clone(), at_path.unwrap_or(DeviceFound::Missing))
}

fn print_leaf(
    out: &mut dyn std::io::Write,
    u: &UnavailablePool,
    depth: usize,
    leaf: &LeafConfig,
) -> Result<bool> {
    let (path, found) = leaf_found(u, leaf);
    let (state, note) = found.state_and_note();
    line(out, depth, &path, state, &note)?;
    Ok(matches!(found, DeviceFound::Ours(_)))
}

/// A top-level vdev: its line, then its children's (a pair as a group of its two members).
fn print_top(out: &mut dyn std::io::Write, u: &UnavailablePool, t: &TopVdevConfig) -> Result<()> {
    let found = |l: &LeafConfig| matches!(leaf_found(u, l).1, DeviceFound::Ours(_));
    // A child is there if either member of its pair is.
    let present = t
        .children
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            found(c)
                || t.pairs
                    .iter()
                    .any(|p| p.child as usize == *i && found(&p.leaf))
        })
        .count();
    let missing = t.children.len() - present;
    let redundancy = match &t.kind {
        TopVdevKind::Mirror => t.children.len().saturating_sub(1),
        TopVdevKind::Raidz(r) => r.parity as usize,
        _ => 0,
    };
    let (state, note) = match missing {
        0 => ("-", String::new()),
        m if m <= redundancy => ("DEGRADED", format!("{m} of its devices not found")),
        _ => ("UNAVAIL", "insufficient replicas".to_string()),
    };
    let depth = match &t.kind {
        TopVdevKind::Mirror => {
            line(out, 1, &format!("mirror-{}", t.id.0), state, &note)?;
            2
        }
        TopVdevKind::Raidz(r) => {
            line(
                out,
                1,
                &format!("raidz{}-{}", r.parity, t.id.0),
                state,
                &note,
            )?;
            2
        }
        _ => 1,
    };
    for (i, child) in t.children.iter().enumerate() {
        match t.pairs.iter().find(|p| p.child as usize == i) {
            Some(pair) => {
                let group = match pair.kind {
                    PairKind::Replacing => "replacing",
                    PairKind::Spare => "spare",
                };
                line(out, depth, &format!("{group}-{i}"), "", "")?;
                print_leaf(out, u, depth + 1, child)?;
                print_leaf(out, u, depth + 1, &pair.leaf)?;
            }
            None => {
                print_leaf(out, u, depth, child)?;
            }
        }
    }
    Ok(())
}
