//! The property verbs: `oxpool get` and `oxpool set`, on pools, volumes and devices.

use super::{split_assignment, split_target};
use crate::console::Console;
use crate::host::Host;
use anyhow::{bail, Result};
use oxpool_engine::props::{
    is_user_prop, PoolProps, VolumeProps, DEVICE_PROP_NAMES, POOL_PROP_NAMES, VOLUME_PROP_NAMES,
    VOLUME_STAT_NAMES,
};

/// How `oxpool get` prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct GetStyle<'a> {
    /// `-p`: exact values.
    pub parsable: bool,
    /// `-H`: no header, tab-separated.
    pub scripted: bool,
    /// `-o`: the fields to show, comma-separated, in order; `None` shows every field.
    pub fields: Option<&'a str>,
    /// `-s`: only rows whose SOURCE is one of these, comma-separated (`none` is `-`).
    pub sources: Option<&'a str>,
}

/// The SOURCE values `-s` keeps (`none` shown as `-`), checked before anything is read.
fn picked_sources(sources: &str) -> Result<Vec<&str>> {
    sources
        .split(',')
        .map(|s| match s {
            "local" | "default" | "inherited" | "temporary" | "received" => Ok(s),
            "none" => Ok("-"),
            _ => {
                bail!("-s {s}: a source is local, default, inherited, temporary, received or none")
            }
        })
        .collect()
}

/// The columns `-o` picks from `header` (upper case) by their lower-case names, in the order
/// asked. Checked before anything is read, so a bad list changes nothing and prints nothing.
fn picked_columns(fields: &str, header: &[&str]) -> Result<Vec<usize>> {
    if fields == "all" {
        return Ok((0..header.len()).collect());
    }
    let mut picked = Vec::new();
    for f in fields.split(',').filter(|f| !f.is_empty()) {
        // Lower case only, as `zfs get -o`.
        match header.iter().position(|h| h.to_ascii_lowercase() == f) {
            Some(c) => picked.push(c),
            None => bail!(
                "no field '{f}': the fields are {}",
                header
                    .iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    if picked.is_empty() {
        bail!("-o names no field");
    }
    Ok(picked)
}

/// Properties whose values are byte counts: shown human (`1.50G`) unless `-p`.
const SIZE_PROPS: &[&str] = &[
    "volsize",
    "volblocksize",
    "log_copy_max",
    "used",
    "available",
    "logicalused",
    "logicalreferenced",
    "referenced",
    "written",
    "usedbydataset",
    "usedbysnapshots",
    "usedbyrefreservation",
    "refreservation",
    "dirty_max",
    "cache_max",
    "data_cache_max",
    "freeing",
    "size",
    "allocated",
    "free",
];

/// A pool's read-only statistics, as `zpool get` shows them beside its settings: `size`,
/// `allocated`, `free` (as `oxpool list`), `capacity` (allocated, in percent of size) and
/// `health` (the pool's state); and `freeing` (what destroyed snapshots still hold).
const POOL_STAT_NAMES: &[&str] = &["size", "allocated", "free", "capacity", "health", "freeing"];

/// A property's value as `get` shows it: sizes human and `creation` as a date, unless
/// `parsable`.
fn shown(name: &str, value: String, parsable: bool) -> String {
    if parsable {
        // As `zfs get -p`: a ratio is a bare number (`1.53`, not `1.53x`), and so is a
        // percentage.
        if name == "compressratio" || name == "capacity" {
            return value.trim_end_matches(['x', '%']).to_string();
        }
        // As `zfs get -p`: a reservation of none is 0.
        if name == "refreservation" && value == "none" {
            return "0".into();
        }
        return value;
    }
    let size = SIZE_PROPS.contains(&name) || name.starts_with("written@");
    match value.parse::<u64>() {
        Ok(bytes) if size => crate::human(bytes),
        Ok(secs) if name == "creation" => crate::display::date(secs.saturating_mul(1_000_000_000)),
        _ => value,
    }
}

/// A setting's SOURCE as `zfs get` shows it: `default` while it holds its default value,
/// `local` once it holds another. The pool keeps a setting's value, not whether it was ever
/// set, so a value set equal to its default reads `default` where ZFS would say `local`.
fn setting_source(value: &str, default: Option<String>) -> &'static str {
    if default.as_deref() == Some(value) {
        "default"
    } else {
        "local"
    }
}

/// The SOURCE of a volume's property `name` holding `value` (raw): `volsize` is always
/// `local`, as in ZFS; a statistic is `-`.
fn volume_source(name: &str, value: &str) -> &'static str {
    match name {
        "volsize" => "local",
        _ if VOLUME_PROP_NAMES.contains(&name) => {
            setting_source(value, VolumeProps::new(0).get(name).ok())
        }
        _ => "-",
    }
}

/// The SOURCE of a pool's property `name` holding `value` (raw); `freeing` is `-`.
fn pool_source(name: &str, value: &str) -> &'static str {
    if POOL_PROP_NAMES.contains(&name) {
        setting_source(value, PoolProps::default().get(name).ok())
    } else {
        "-"
    }
}

/// `oxpool get [-p] [-H] [-o FIELD[,FIELD...]|all] PROP[,PROP...]|all TARGET [DEVICE]`.
pub fn get(
    host: &Host,
    con: &mut dyn Console,
    prop: &str,
    targets: &[&str],
    device: Option<&str>,
    style: GetStyle,
) -> Result<()> {
    let Some(first) = targets.first() else {
        bail!("name what to read: oxpool get PROP TARGET...");
    };
    let (pool, _) = split_target(first);
    if let Some(other) = targets.iter().find(|t| split_target(t).0 != pool) {
        bail!("get reads one pool's targets at a time: {other} is not in {pool}");
    }
    if device.is_some() && (targets.len() > 1 || split_target(first).1.is_some()) {
        bail!("a device belongs to a pool, not to a volume: oxpool get PROP POOL DEVICE");
    }
    let asked: Vec<&str> = prop.split(',').filter(|n| !n.is_empty()).collect();
    if asked.is_empty() {
        bail!("no property named");
    }
    let header: &[&str] = &["NAME", "PROPERTY", "VALUE", "SOURCE"];
    let columns: Vec<usize> = match style.fields {
        Some(fields) => picked_columns(fields, header)?,
        None => (0..header.len()).collect(),
    };
    let sources = style.sources.map(picked_sources).transpose()?;
    // Read first, printed after: a failure prints nothing (no header without lines).
    let rows = host.with_pool(pool, |p| {
        let mut rows: Vec<Vec<String>> = Vec::new();
        let names = |all: &[&'static str]| -> Vec<String> {
            if asked == ["all"] {
                all.iter().map(|s| s.to_string()).collect()
            } else {
                asked.iter().map(|s| s.to_string()).collect()
            }
        };
        let mut row = |what: &str, n: &str, value: String, source: &str| {
            rows.push(vec![
                what.to_string(),
                n.to_string(),
                shown(n, value, style.parsable),
                source.to_string(),
            ]);
        };
        if let Some(d) = device {
            let mut rows = Vec::new();
            for n in names(DEVICE_PROP_NAMES) {
                let (value, source) = p.get_device_prop(d, &n)?;
                rows.push(vec![d.to_string(), n, value, source.to_string()]);
            }
            return Ok(rows);
        }
        // Bounded by the command line.
        for &target in targets {
            let (_, vol) = split_target(target);
            match vol {
                Some(v) if v.contains('@') => {
                    for n in names(oxpool_engine::SNAPSHOT_PROP_NAMES) {
                        if is_user_prop(&n) {
                            // None kept here: shown unset, as `zfs get` shows any dataset's.
                            oxpool_engine::props::check_user_prop_name(&n)?;
                            p.get_dataset_prop(v, "guid")?;
                            row(target, &n, "-".to_string(), "-");
                            continue;
                        }
                        // A snapshot's properties are all read-only.
                        let value = p.get_dataset_prop(v, &n)?.unwrap_or_default();
                        row(target, &n, value, "-");
                    }
                }
                Some(v) if asked == ["receive_resume_token"] => {
                    // A full stream's partial receive has no volume yet; with neither, the
                    // name is unknown.
                    match p.get_dataset_prop(v, "receive_resume_token")? {
                        Some(value) if value != "-" || p.volume(v).is_ok() => {
                            row(target, "receive_resume_token", value, "-")
                        }
                        _ => bail!("{target}: not found (no volume, no partial receive)"),
                    }
                }
                Some(v) => {
                    let vol = p.volume(v)?;
                    let mut all: Vec<&'static str> = VOLUME_PROP_NAMES
                        .iter()
                        .chain(VOLUME_STAT_NAMES)
                        .copied()
                        .collect();
                    all.extend(
                        oxpool_engine::DATASET_STAT_NAMES
                            .iter()
                            .filter(|n| !all.contains(n))
                            .copied()
                            .collect::<Vec<_>>(),
                    );
                    let user = vol.props().user_props().clone();
                    let mut listed = names(&all);
                    if asked == ["all"] {
                        // User properties after the native ones, as `zfs get all`.
                        listed.extend(user.keys().cloned());
                    }
                    for n in listed {
                        if is_user_prop(&n) {
                            let source = if user.contains_key(&n) { "local" } else { "-" };
                            row(target, &n, vol.get_prop(&n)?, source);
                            continue;
                        }
                        let value = match p.get_dataset_prop(v, &n)? {
                            Some(value) => value,
                            None => vol.get_prop(&n)?,
                        };
                        let source = volume_source(&n, &value);
                        row(target, &n, value, source);
                    }
                }
                None => {
                    let all: Vec<&'static str> = POOL_PROP_NAMES
                        .iter()
                        .chain(POOL_STAT_NAMES)
                        .copied()
                        .collect();
                    let mut status = None;
                    for n in names(&all) {
                        if is_user_prop(&n) {
                            // None kept on a pool: shown unset, as `zpool get` shows them.
                            oxpool_engine::props::check_user_prop_name(&n)?;
                            row(target, &n, "-".to_string(), "-");
                            continue;
                        }
                        let mut space = || {
                            let s = status.get_or_insert_with(|| p.status());
                            (s.size_bytes, s.allocated_bytes, s.state.clone())
                        };
                        let value = match n.as_str() {
                            "size" => space().0.to_string(),
                            "allocated" => space().1.to_string(),
                            "free" => {
                                let (size, allocated, _) = space();
                                size.saturating_sub(allocated).to_string()
                            }
                            "capacity" => {
                                let (size, allocated, _) = space();
                                format!("{}%", allocated.saturating_mul(100) / size.max(1))
                            }
                            "health" => space().2,
                            _ => p.get_prop(&n)?,
                        };
                        let source = pool_source(&n, &value);
                        row(target, &n, value, source);
                    }
                }
            }
        }
        Ok(rows)
    })?;
    // Keep the rows of the sources asked, and the columns asked, in their order.
    let header: Vec<&str> = columns.iter().map(|&c| header[c]).collect();
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .filter(|r| sources.as_ref().is_none_or(|s| s.contains(&r[3].as_str())))
        .map(|r| columns.iter().map(|&c| r[c].clone()).collect())
        .collect();
    if style.scripted {
        for r in rows {
            writeln!(con.out(), "{}", r.join("\t"))?;
        }
        return Ok(());
    }
    // Columns as wide as their longest field, as `zfs get`.
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |fields: Vec<&str>| -> String {
        let last = fields.len() - 1;
        fields
            .iter()
            .enumerate()
            .map(|(c, f)| {
                if c == last {
                    f.to_string()
                } else {
                    format!("{f:<w$}  ", w = widths[c])
                }
            })
            .collect()
    };
    writeln!(con.out(), "{}", line(header))?;
    for r in &rows {
        writeln!(
            con.out(),
            "{}",
            line(r.iter().map(String::as_str).collect())
        )?;
    }
    Ok(())
}

/// The words of `oxpool set`: the assignments (each `PROP=VALUE`), the target, and the
/// device if one is named.
pub fn set_words(words: &[String]) -> Result<(Vec<&str>, &str, Option<&str>)> {
    let assignments: Vec<&str> = words
        .iter()
        .map(String::as_str)
        .take_while(|w| w.contains('='))
        .collect();
    let rest = &words[assignments.len()..];
    match (assignments.is_empty(), rest) {
        (true, _) => bail!("expected PROP=VALUE, got '{}'", words[0]),
        (false, []) => bail!("name what to set: oxpool set PROP=VALUE... POOL[/VOL] [DEVICE]"),
        (false, [target]) => Ok((assignments, target, None)),
        (false, [target, device]) => Ok((assignments, target, Some(device))),
        (false, [_, _, extra, ..]) => bail!(
            "unexpected '{extra}': oxpool set PROP=VALUE... POOL[/VOL] [DEVICE] (one target; \
             every PROP=VALUE before it)"
        ),
    }
}

/// `oxpool set PROP=VALUE... TARGET [DEVICE]`: takes effect for the next request of a
/// served pool (e.g. `sync=always`: the next write is durable before it is answered).
/// Several are set all or none: if one is refused, those set before it get their old values
/// back. `volsize` goes last, since a shrink cannot be undone.
pub fn set(host: &Host, assignments: &[&str], target: &str, device: Option<&str>) -> Result<()> {
    let mut pairs = Vec::with_capacity(assignments.len());
    for a in assignments {
        let (k, v) = split_assignment(a)?;
        if pairs.iter().any(|(seen, _)| *seen == k) {
            bail!("property '{k}' is set twice");
        }
        pairs.push((k, v));
    }
    pairs.sort_by_key(|(k, _)| *k == "volsize");
    let (pool, vol) = split_target(target);
    // Statistics kept outside the properties are refused by name here (the engine would
    // call them unknown).
    let read_only = |k: &str| match (vol, device) {
        (None, None) => POOL_STAT_NAMES.contains(&k),
        (Some(_), None) => oxpool_engine::DATASET_STAT_NAMES.contains(&k),
        _ => false,
    };
    if vol.is_some_and(|v| v.contains('@')) {
        bail!("'{target}': a snapshot's properties are read-only");
    }
    if let Some((k, _)) = pairs.iter().find(|(k, _)| vol.is_none() && is_user_prop(k)) {
        bail!("'{k}': user properties are kept on volumes (POOL/VOL), not on pools or devices");
    }
    if let Some((k, _)) = pairs.iter().find(|(k, _)| read_only(k)) {
        bail!("property '{k}' is read-only");
    }
    host.change_pool(pool, |p| {
        if let (Some(v2), None) = (vol, device) {
            // Every value checked first, together, on a copy: a refusal then changes
            // nothing, and a read-only name is called so (not unknown to the rollback).
            let mut q = p.volume(v2)?.props();
            for (k, v) in &pairs {
                match *k {
                    // `auto` is the pool's to say (what the volume as set so far takes).
                    "refreservation" => q.set(k, &p.resolve_refreservation(&q, v))?,
                    _ => q.set(k, v)?,
                }
            }
            VolumeProps::check_new_volsize(q.volsize_bytes)?;
            q.validate()?;
            p.check_user_props_budget(v2, &q)?;
        }
        // The value to restore each property to, all read before anything changes: a name
        // the target does not have is refused here, with nothing to undo. Only a change of
        // several needs them.
        let old = |k: &str| -> Result<Before> {
            Ok(match (vol, device) {
                (Some(v2), _) if is_user_prop(k) => {
                    match p.volume(v2)?.props().user_props().get(k) {
                        Some(value) => Before::Value(value.clone()),
                        None => Before::Unset,
                    }
                }
                (Some(v2), _) => Before::Value(p.volume(v2)?.props().get(k)?),
                (None, Some(d)) => match p.get_device_prop(d, k)? {
                    (value, "local") => Before::Value(value),
                    _ => Before::Value("inherit".to_string()),
                },
                (None, None) => Before::Value(p.get_prop(k)?),
            })
        };
        let befores: Vec<Option<Before>> = if pairs.len() > 1 {
            pairs
                .iter()
                .map(|(k, _)| old(k).map(Some))
                .collect::<Result<_>>()?
        } else {
            vec![None]
        };
        let apply = |k: &str, v: &str| -> Result<()> {
            match (vol, device) {
                (Some(_), Some(_)) => bail!(
                    "a device belongs to a pool, not to a volume: oxpool set PROP=VALUE POOL \
                     DEVICE"
                ),
                (Some(v2), None) => p.set_volume_prop(v2, k, v)?,
                (None, Some(d)) => p.set_device_prop(d, k, v)?,
                (None, None) => p.set_prop(k, v)?,
            }
            Ok(())
        };
        // A served shrink takes the volume out of the export table before anything is
        // applied: the other values (a wider `nbd_allow`, say) never hold while it is
        // offered at its old size, nor would a client let in by them see the shrink.
        let shrink = match (host, vol, device) {
            (Host::Live(served), Some(v2), None) => {
                match pairs.iter().find(|(k, _)| *k == "volsize") {
                    Some((_, v)) => unexport_for_shrink(served, p, v2, v)?,
                    None => None,
                }
            }
            _ => None,
        };
        let steps: Vec<_> = pairs.iter().zip(&befores).collect();
        let outcome = all_or_none(
            &steps,
            |((k, v), _)| apply(k, v),
            |((k, _), before)| match (before, vol) {
                (None, _) => Ok(()),
                (Some(Before::Value(v)), _) => apply(k, v),
                (Some(Before::Unset), Some(v2)) => Ok(p.unset_volume_user_prop(v2, k)?),
                (Some(Before::Unset), None) => Ok(()),
            },
            |((k, _), _)| k.to_string(),
        );
        if let Some((served, vol)) = shrink {
            // Offered again, at whatever size it now has.
            if let Err(e) = served.export_volume(vol) {
                match outcome {
                    Ok(()) => bail!("volsize is set, but the volume is not offered again: {e:#}"),
                    Err(first) => bail!("{first:#}; and it is not offered again: {e:#}"),
                }
            }
        }
        outcome
    })
}

/// `oxpool inherit PROP POOL/VOL...`, or `PROP POOL DEVICE`: the property back at its
/// default, as `zfs inherit` returns one to its parent's value (a volume's parent here is
/// the default; a device's is its pool). Every target is checked before any changes.
pub fn inherit(host: &Host, prop: &str, targets: &[String], recursive: bool) -> Result<()> {
    let (pool, _) = split_target(&targets[0]);
    // After a pool, the one word left is its device (a pool alone has nothing to inherit).
    if let [pool_only, device] = targets {
        if !pool_only.contains(['/', '@']) {
            // POOL then a path (`/dev/sdb`, `./a.img`): a device. Another word is another
            // target, refused below if it is of another pool.
            if recursive && device.starts_with(['/', '.']) {
                bail!("-r is for volumes: a device's property is inherited without it");
            }
            if !recursive {
                return set(host, &[&format!("{prop}=inherit")], pool_only, Some(device));
            }
        }
    }
    if recursive
        && !VOLUME_PROP_NAMES.contains(&prop)
        && (POOL_PROP_NAMES.contains(&prop) || DEVICE_PROP_NAMES.contains(&prop))
    {
        bail!(
            "'{prop}' is not a volume property: -r returns volumes' properties (a device \
             follows its pool's {prop} again with `oxpool inherit {prop} POOL DEVICE`)"
        );
    }
    let volume_prop = is_user_prop(prop) || VOLUME_PROP_NAMES.contains(&prop);
    let mut named = Vec::with_capacity(targets.len());
    // With -r, a pool named stands for every volume in it, read when the change runs.
    let mut every_volume = false;
    for t in targets {
        match split_target(t) {
            (p, _) if p != pool => {
                bail!("targets in one command must be of one pool ({pool} and {p})")
            }
            (_, None) if recursive => every_volume = true,
            (p, None) if volume_prop => bail!(
                "'{p}' is a pool, and '{prop}' is a volume property: `oxpool inherit -r {prop} \
                 {p}` returns every volume's to its default"
            ),
            (p, None) if POOL_PROP_NAMES.contains(&prop) => bail!(
                "'{p}' is a pool: its properties have no parent to inherit from; set one back \
                 with `oxpool set {prop}=VALUE {p}`"
            ),
            (p, None) => bail!("'{p}' is a pool, and it has no property '{prop}'"),
            (_, Some(v)) if v.contains('@') => {
                bail!("'{t}': a snapshot's properties are read-only")
            }
            (_, Some(v)) => named.push(v.to_string()),
        }
    }
    let volumes_of = |p: &oxpool_engine::Pool| -> Vec<String> {
        let mut volumes = named.clone();
        if every_volume {
            volumes.extend(p.volumes().iter().map(|v| v.name()));
            volumes.sort_unstable();
            volumes.dedup();
        }
        volumes
    };
    if is_user_prop(prop) {
        // Removed: a volume's user property has no parent's value to fall back to.
        return host.change_pool(pool, |p| {
            let volumes = volumes_of(p);
            for v in &volumes {
                p.volume(v)?;
            }
            for v in &volumes {
                p.unset_volume_user_prop(v, prop)?;
            }
            Ok(())
        });
    }
    match prop {
        "volsize" | "volblocksize" => {
            bail!("'{prop}' is the volume's own and cannot be inherited")
        }
        _ if oxpool_engine::DATASET_STAT_NAMES.contains(&prop)
            || oxpool_engine::props::VOLUME_STAT_NAMES.contains(&prop) =>
        {
            bail!("property '{prop}' is read-only")
        }
        _ if !VOLUME_PROP_NAMES.contains(&prop) => bail!("unknown volume property '{prop}'"),
        _ => {}
    }
    // In one change, all or none: every volume found and its value read first.
    host.change_pool(pool, |p| {
        let volumes = volumes_of(p);
        let steps = volumes
            .iter()
            .map(|v| {
                let vol = p.volume(v)?;
                let default = VolumeProps::new(vol.size_bytes()).get(prop)?;
                Ok((v.as_str(), default, vol.props().get(prop)?))
            })
            .collect::<Result<Vec<(&str, String, String)>>>()?;
        all_or_none(
            &steps,
            |(v, default, _)| Ok(p.set_volume_prop(v, prop, default)?),
            |(v, _, before)| Ok(p.set_volume_prop(v, prop, before)?),
            |(v, _, _)| format!("{prop} of {v}"),
        )
    })
}

/// What a property held before a change of several, to put back if a later one is refused.
enum Before {
    /// A value, set back with `set`.
    Value(String),
    /// A user property that was not set, removed again.
    Unset,
}

/// Applies every step in order; if one is refused, those applied before it are undone,
/// newest first, every one tried, and those that could not be are named (by `what`) with the
/// refusal. Bounded by `steps`.
fn all_or_none<T>(
    steps: &[T],
    apply: impl Fn(&T) -> Result<()>,
    undo: impl Fn(&T) -> Result<()>,
    what: impl Fn(&T) -> String,
) -> Result<()> {
    for (i, step) in steps.iter().enumerate() {
        if let Err(e) = apply(step) {
            let not_undone: Vec<String> = steps[..i]
                .iter()
                .rev()
                .filter_map(|done| {
                    undo(done)
                        .err()
                        .map(|u| format!("{} stays changed ({u:#})", what(done)))
                })
                .collect();
            if not_undone.is_empty() {
                return Err(e);
            }
            bail!("{e:#}; and {}", not_undone.join("; "));
        }
    }
    Ok(())
}

/// `volsize` of a served volume. Its size may not shrink while NBD clients have it open:
/// they were told the old size, and their requests past the new end would fail (EINVAL)
/// while their data there is gone (a new user's finding). `destroy`, `rollback` and
/// `unshare` refuse an open volume the same way, and as they do, a shrink takes the volume
/// out of the export table first (refused while open): no client can connect and be told
/// the old size between the check and the shrink. The caller offers it again after, at its
/// new size; what to offer is returned (`None`: no shrink, or the volume was not offered).
/// Growing is done in place (clients see the new size when they reconnect, as with
/// qemu-nbd). A value that does not parse is left to the engine to refuse.
fn unexport_for_shrink<'a>(
    served: &'a crate::served::Served,
    p: &oxpool_engine::Pool,
    volume: &str,
    value: &str,
) -> Result<Option<(&'a crate::served::Served, oxpool_engine::Volume)>> {
    let vol = p.volume(volume)?;
    let shrink =
        oxpool_engine::props::parse_size("volsize", value).is_ok_and(|b| b < vol.size_bytes());
    if !shrink {
        return Ok(None);
    }
    let full = format!("{}/{volume}", p.name());
    let was_exported = served.unexport_volume(&full, false, crate::served::Unexport::Shrink)?;
    Ok(was_exported.then_some((served, vol)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A step refused after others were applied undoes those, newest first, every one
    /// tried; one that cannot be undone is named with the refusal. What a refused change of
    /// several leaves (with `Before::Unset` putting an unset user property back unset)
    /// rests on this.
    #[test]
    fn all_or_none_undoes_what_it_applied_newest_first() {
        let log = RefCell::new(Vec::new());
        let steps = ["a", "b", "c", "d"];
        let apply = |s: &&str| {
            if *s == "c" {
                bail!("c refused");
            }
            log.borrow_mut().push(format!("set {s}"));
            Ok(())
        };
        let undo = |s: &&str| {
            log.borrow_mut().push(format!("undo {s}"));
            Ok(())
        };
        let e = all_or_none(&steps, apply, undo, |s| s.to_string()).unwrap_err();
        assert_eq!(e.to_string(), "c refused");
        assert_eq!(*log.borrow(), ["set a", "set b", "undo b", "undo a"]);
        log.borrow_mut().clear();
        let stuck = |s: &&str| match *s {
            "a" => bail!("device gone"),
            _ => Ok(()),
        };
        let e = all_or_none(&steps, apply, stuck, |s| s.to_string()).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "c refused; and a stays changed (device gone)"
        );
        assert!(all_or_none(&["a", "b"], apply, undo, |s| s.to_string()).is_ok());
    }
}
