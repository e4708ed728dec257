//! The snapshot verbs, as `zfs` has them: `snapshot`, `destroy POOL/VOL@SNAP`, `rollback`,
//! `clone`, `hold`, `release`, `holds`, `list -t snapshot`, and `audit`. On a served pool
//! they run in the server, which also keeps the NBD exports in step: each snapshot is
//! exported read-only as `POOL/VOL@SNAP`; a snapshot, or a volume being rolled back, that a
//! client has open is refused (`rollback -f` disconnects the volume's clients first).

use super::{split_assignment, volume_target};
use crate::console::Console;
use crate::display::size;
use crate::host::Host;
use crate::served::{Served, Unexport};
use anyhow::{anyhow, bail, Result};
use oxpool_engine::Pool;

/// `POOL/VOL@SNAP` split into (pool, volume, snapshot).
pub fn snapshot_target(t: &str) -> Result<(&str, &str, &str)> {
    let (pool, rest) = volume_target(t)?;
    match rest.split_once('@') {
        Some((v, s)) if !v.is_empty() && !s.is_empty() && !s.contains('@') && !v.contains('/') => {
            Ok((pool, v, s))
        }
        _ => Err(anyhow!("expected POOL/VOL@SNAP, got '{t}'")),
    }
}

/// The snapshots a destroy names: `@A`, a list `@A,B`, or a range `@A%C` (A through C, in
/// creation order; an empty end means the first or the last).
fn named_snapshots(pool: &Pool, volume: &str, spec: &str) -> Result<Vec<String>> {
    let all: Vec<String> = pool
        .snapshots(volume)?
        .into_iter()
        .map(|s| s.name)
        .collect();
    let mut out = Vec::new();
    for part in spec.split(',') {
        if let Some((a, c)) = part.split_once('%') {
            let find = |n: &str, default: usize| -> Result<usize> {
                if n.is_empty() {
                    return Ok(default);
                }
                all.iter()
                    .position(|s| s == n)
                    .ok_or_else(|| anyhow!("{}/{volume}@{n}: not found", pool.name()))
            };
            if all.is_empty() {
                // `@%` of a volume with no snapshots: nothing in range.
                continue;
            }
            let (i, j) = (find(a, 0)?, find(c, all.len() - 1)?);
            if i > j {
                bail!("range @{a}%{c}: {a} is newer than {c}");
            }
            out.extend(all[i..=j].iter().cloned());
        } else if all.iter().any(|s| s == part) {
            out.push(part.to_string());
        } else {
            bail!("{}/{volume}@{part}: not found", pool.name());
        }
    }
    out.dedup();
    Ok(out)
}

/// `oxpool snapshot [-r] POOL/VOL@SNAP...`: every one in one txg. With `-r`, `POOL@SNAP`
/// is SNAP of every volume in the pool, as `zfs snapshot -r` of a pool's root takes every
/// descendant: the volumes are read under the pool's admin lock, so a volume created by
/// another command is in or out whole.
pub fn snapshot(host: &Host, names: &[String], recursive: bool) -> Result<()> {
    let mut pool_name = None;
    // (volume, or None for every volume with -r; snapshot)
    let mut named: Vec<(Option<&str>, &str)> = Vec::new();
    for n in names {
        let (p, v, s) = match n.split_once('@') {
            Some((p, s)) if !p.is_empty() && !p.contains('/') && !s.is_empty() => {
                if !recursive {
                    bail!(
                        "'{n}': a pool holds no data of its own, only volumes; `oxpool \
                         snapshot -r {n}` snapshots every volume in it"
                    );
                }
                (p, None, s)
            }
            _ => {
                let (p, v, s) = snapshot_target(n)?;
                (p, Some(v), s)
            }
        };
        if pool_name.is_some_and(|q| q != p) {
            bail!(
                "snapshots in one command must be of one pool ({} and {p})",
                pool_name.unwrap()
            );
        }
        pool_name = Some(p);
        named.push((v, s));
    }
    let Some(pool_name) = pool_name else {
        bail!("name at least one POOL/VOL@SNAP");
    };
    host.change_pool(pool_name, |p| {
        let mut inside = Vec::new();
        for (v, s) in &named {
            match v {
                Some(v) => inside.push(format!("{v}@{s}")),
                None => {
                    let mut volumes: Vec<String> =
                        p.volumes().iter().map(|v| v.name().to_string()).collect();
                    if volumes.is_empty() {
                        bail!("'{pool_name}@{s}': pool '{pool_name}' has no volumes");
                    }
                    volumes.sort();
                    inside.extend(volumes.into_iter().map(|v| format!("{v}@{s}")));
                }
            }
        }
        // One name twice (`-r tank@s tank/a@s`) is refused, as the engine refuses it.
        p.snapshot(&inside)?;
        if let Host::Live(served) = host {
            for n in &inside {
                let (v, s) = n.split_once('@').expect("built above");
                // A snapshot follows its volume: not offered if the volume is not.
                if served.is_exported(&format!("{pool_name}/{v}")) {
                    served.export_volume(p.snapshot_volume(v, s)?)?;
                }
            }
        }
        Ok(())
    })
}

/// How `oxpool destroy POOL/VOL@SPEC` runs: its flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyFlags {
    /// `-n`: say what would go, change nothing.
    pub dry_run: bool,
    /// `-v`: say what goes.
    pub verbose: bool,
    /// `-p`: exact sizes.
    pub parsable: bool,
    /// `-d`: mark held or cloned snapshots, destroyed with their last hold and clone.
    pub defer: bool,
    /// `-f`: disconnect the NBD clients of the snapshots' exports first.
    pub force: bool,
}

/// The snapshots of `volume` that `spec` names and it has, for `destroy -r POOL@SPEC`: as
/// `zfs destroy -r`, a volume without them is passed over (a range counts where both its
/// ends are found).
fn snapshots_if_any(pool: &Pool, volume: &str, spec: &str) -> Result<Vec<String>> {
    let all: Vec<String> = pool
        .snapshots(volume)?
        .into_iter()
        .map(|s| s.name)
        .collect();
    // An empty end of a range stands for the first or the last: there only if any is.
    let has = |n: &str| (n.is_empty() && !all.is_empty()) || all.iter().any(|s| s == n);
    let present: Vec<&str> = spec
        .split(',')
        .filter(|part| match part.split_once('%') {
            Some((a, c)) => has(a) && has(c),
            None => has(part),
        })
        .collect();
    if present.is_empty() {
        return Ok(Vec::new());
    }
    named_snapshots(pool, volume, &present.join(","))
}

/// `oxpool destroy [-n] [-v] [-f] [-r] POOL/VOL@SPEC`, or `-r POOL@SPEC`: those snapshots
/// of every volume that has them. Every refusal (held, cloned, open by a client without
/// `-f`) is found before anything is destroyed. The volumes' snapshots are destroyed one
/// volume after the other under the pool's admin lock; a crash between two volumes leaves
/// the first ones destroyed, and the same command finishes the rest.
pub fn destroy(
    host: &Host,
    con: &mut dyn Console,
    target: &str,
    flags: DestroyFlags,
    recursive: bool,
) -> Result<()> {
    let DestroyFlags {
        dry_run,
        verbose,
        parsable,
        defer,
        force,
    } = flags;
    let (pool_name, volume, spec) = match target.split_once('@') {
        Some((p, spec)) if !p.is_empty() && !p.contains('/') => {
            if !recursive {
                bail!(
                    "'{target}': a pool holds no snapshots of its own; `oxpool destroy -r \
                     {target}` destroys that snapshot of every volume"
                );
            }
            (p, None, spec)
        }
        _ => {
            let (p, rest) = volume_target(target)?;
            let Some((volume, spec)) = rest.split_once('@') else {
                bail!("expected POOL/VOL@SNAP, got '{target}'");
            };
            (p, Some(volume), spec)
        }
    };
    host.change_pool(pool_name, |p| {
        let plan: Vec<(String, Vec<String>)> = match volume {
            Some(v) => {
                let snaps = named_snapshots(p, v, spec)?;
                if snaps.is_empty() {
                    bail!("'{target}': could not find any snapshots to destroy");
                }
                vec![(v.to_string(), snaps)]
            }
            None => {
                let mut volumes: Vec<String> =
                    p.volumes().iter().map(|v| v.name().to_string()).collect();
                volumes.sort();
                let mut plan = Vec::new();
                for v in volumes {
                    let snaps = snapshots_if_any(p, &v, spec)?;
                    if !snaps.is_empty() {
                        plan.push((v, snaps));
                    }
                }
                if plan.is_empty() {
                    bail!("'{target}': no volume of '{pool_name}' has such a snapshot");
                }
                plan
            }
        };
        // Every volume's refusals first: one refused changes nothing (a deferred destroy
        // refuses nothing the engine would; held or cloned ones are marked).
        let mut estimate = 0;
        let mut now: Vec<String> = Vec::new();
        let mut later: Vec<String> = Vec::new();
        for (v, snaps) in &plan {
            // With -d, those held or cloned are marked, the others destroyed now.
            let mut go = Vec::new();
            for s in snaps {
                if defer && p.destroy_refusal(v, s)?.is_some() {
                    later.push(format!("{pool_name}/{v}@{s}"));
                } else {
                    go.push(s.clone());
                }
            }
            if !go.is_empty() {
                estimate += p.destroy_estimate(v, &go)?;
            }
            now.extend(go.iter().map(|s| format!("{pool_name}/{v}@{s}")));
        }
        // A client with one open refuses the command (without -f): said before any plan,
        // by a dry run too. The real refusal below checks again, under the table's lock.
        if let Host::Live(served) = host {
            for (v, snaps) in &plan {
                for s in snaps {
                    served.check_unexport(
                        &format!("{pool_name}/{v}@{s}"),
                        force,
                        Unexport::Destroy,
                    )?;
                }
            }
        }
        // -p alone prints too, as `zfs destroy -p` turns -v on.
        if verbose || dry_run || parsable {
            print_destroy_plan(con, &now, &later, estimate, dry_run, parsable)?;
        }
        if dry_run {
            crate::history::changed_nothing();
            return Ok(());
        }
        // Out of the export table first, every volume's (refused while a client has one
        // open): all or none. Bounded by the plan: the pool's volumes.
        let mut removed: Vec<(&str, Vec<String>)> = Vec::new();
        if let Host::Live(served) = host {
            for (v, snaps) in &plan {
                match unexport_snapshots(served, p, v, snaps, force, Unexport::Destroy) {
                    Ok(out) => removed.push((v, out)),
                    Err(e) => {
                        offer_again(host, p, &removed)?;
                        return Err(e);
                    }
                }
            }
        }
        for (i, (v, snaps)) in plan.iter().enumerate() {
            let marked = if defer {
                p.destroy_snapshots_deferred(v, snaps)
                    .map(|(_, marked)| marked)
            } else {
                p.destroy_snapshots(v, snaps).map(|_| Vec::new())
            };
            let marked = match marked {
                Ok(marked) => marked,
                Err(e) => {
                    // This volume's and the later ones' are still there.
                    offer_again(host, p, removed.get(i..).unwrap_or_default())?;
                    return Err(e.into());
                }
            };
            // Marked ones are still there: served again if they were offered before (one
            // `unshare` left out stays out).
            if let Some((_, out)) = removed.get(i) {
                let back: Vec<String> =
                    marked.iter().filter(|s| out.contains(s)).cloned().collect();
                offer_again(host, p, &[(v.as_str(), back)])?;
            }
            // Said already by -v's plan (its `will mark` lines).
            if !(verbose || parsable) {
                for s in marked {
                    writeln!(
                        con.out(),
                        "{pool_name}/{v}@{s}: held or cloned; destroyed when its last hold and \
                         clone go"
                    )?;
                }
            }
        }
        Ok(())
    })
}

/// `destroy -n`'s and `-v`'s lines, as `zfs destroy -nv`'s: each of `now` (full names) that
/// would be (will be) destroyed, each of `later` that `-d` marks, then what goes with them
/// (`reclaim_bytes`). With `-p` (`parsable`), as `zfs destroy -nvp`: `destroy<TAB>NAME`,
/// `defer<TAB>NAME` and `reclaim<TAB>BYTES`. Ours beside ZFS's: the `mark`/`defer` lines
/// (ZFS says nothing of what -d marks) and a volume's `reclaim` line (ZFS gives one for
/// snapshots only): each tells what the command will do that its other lines do not.
pub fn print_destroy_plan(
    con: &mut dyn Console,
    now: &[String],
    later: &[String],
    reclaim_bytes: u64,
    dry_run: bool,
    parsable: bool,
) -> Result<()> {
    let out = con.out();
    if parsable {
        for n in now {
            writeln!(out, "destroy\t{n}")?;
        }
        for n in later {
            writeln!(out, "defer\t{n}")?;
        }
        writeln!(out, "reclaim\t{reclaim_bytes}")?;
        return Ok(());
    }
    let verb = if dry_run { "would" } else { "will" };
    for n in now {
        writeln!(out, "{verb} destroy {n}")?;
    }
    for n in later {
        writeln!(
            out,
            "{verb} mark {n}: held or cloned; destroyed when its last hold and clone go"
        )?;
    }
    writeln!(out, "{verb} reclaim {}", size(reclaim_bytes, false))?;
    Ok(())
}

/// Offers again the snapshot exports `removed` (volume, snapshots) of a served pool.
fn offer_again(host: &Host, p: &Pool, removed: &[(&str, Vec<String>)]) -> Result<()> {
    let Host::Live(served) = host else {
        return Ok(());
    };
    for (v, snaps) in removed {
        for s in snaps {
            served.export_volume(p.snapshot_volume(v, s)?)?;
        }
    }
    Ok(())
}

/// Takes snapshots `snaps` of `volume` out of the export table for `why`, all or none: on a
/// refusal, those taken out are offered again and the refusal returned. Returns those that
/// were offered, the ones to offer again if the change they make room for fails; one
/// `recv -u` or `unshare` left out is not among them, so it stays out.
fn unexport_snapshots(
    served: &Served,
    p: &Pool,
    volume: &str,
    snaps: &[String],
    force: bool,
    why: Unexport,
) -> Result<Vec<String>> {
    let mut removed: Vec<String> = Vec::new();
    for s in snaps {
        match served.unexport_volume(&format!("{}/{volume}@{s}", p.name()), force, why) {
            Ok(true) => removed.push(s.clone()),
            Ok(false) => {}
            Err(e) => {
                for s in &removed {
                    served.export_volume(p.snapshot_volume(volume, s)?)?;
                }
                return Err(e);
            }
        }
    }
    Ok(removed)
}

/// Snapshot exports of snapshots that no longer exist (a deferred destroy that happened on
/// a release or a clone's destroy) leave the export table.
pub fn drop_gone_snapshot_exports(
    host: &Host,
    p: &Pool,
    before: &[oxpool_engine::SnapshotInfo],
) -> Result<()> {
    let Host::Live(served) = host else {
        return Ok(());
    };
    let now: Vec<(String, String)> = p
        .all_snapshots()
        .into_iter()
        .map(|s| (s.volume, s.name))
        .collect();
    for s in before {
        if !now.contains(&(s.volume.clone(), s.name.clone())) {
            served.unexport_volume(
                &format!("{}/{}@{}", p.name(), s.volume, s.name),
                true,
                Unexport::Destroy,
            )?;
        }
    }
    Ok(())
}

/// `oxpool rollback [-r] [-f] POOL/VOL@SNAP`.
pub fn rollback(host: &Host, target: &str, destroy_later: bool, force: bool) -> Result<()> {
    let (pool_name, volume, snap) = snapshot_target(target)?;
    host.change_pool(pool_name, |p| {
        let later: Vec<String> = {
            let all = p.snapshots(volume)?;
            let i = all
                .iter()
                .position(|s| s.name == snap)
                .ok_or_else(|| anyhow!("{target}: not found"))?;
            all[i + 1..].iter().map(|s| s.name.clone()).collect()
        };
        let Host::Live(served) = host else {
            return Ok(p.rollback(volume, snap, destroy_later)?);
        };
        let head = format!("{pool_name}/{volume}");
        // Check first what the engine would refuse, so that no client is disconnected for
        // a rollback that cannot happen.
        if !later.is_empty() && !destroy_later {
            p.rollback(volume, snap, false)?;
        }
        if destroy_later {
            p.destroy_estimate(volume, &later)?;
        }
        // What is taken down comes back as it was: the head if it was exported, and on a
        // failure (or a refusal half way) the later snapshots that were.
        let head_was_exported = served.unexport_volume(&head, force, Unexport::Rollback)?;
        let mut taken_down = Vec::new();
        let mut refused = None;
        for s in &later {
            match served.unexport_volume(&format!("{head}@{s}"), force, Unexport::Rollback) {
                Ok(true) => taken_down.push(s),
                Ok(false) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let done = match refused {
            Some(e) => Err(e),
            None => p.rollback(volume, snap, destroy_later).map_err(Into::into),
        };
        if head_was_exported {
            served.export_volume(p.volume(volume)?)?;
        }
        if done.is_err() {
            for s in taken_down {
                served.export_volume(p.snapshot_volume(volume, s)?)?;
            }
        }
        done
    })
}

/// `oxpool clone POOL/VOL@SNAP POOL/NEW [-o prop=value]`.
pub fn clone(host: &Host, snapshot: &str, new: &str, props: &[String]) -> Result<()> {
    let (pool_name, volume, snap) = snapshot_target(snapshot)?;
    let (new_pool, new_name) = volume_target(new)?;
    if new_pool != pool_name {
        bail!("a clone must be in its origin's pool ({pool_name}, not {new_pool})");
    }
    let mut pairs = Vec::new();
    for a in props {
        let (k, v) = split_assignment(a)?;
        pairs.push((k.to_string(), v.to_string()));
    }
    host.change_pool(pool_name, |p| {
        let vol = p.clone_snapshot(volume, snap, new_name, &pairs)?;
        if let Host::Live(served) = host {
            served.export_volume(vol)?;
        }
        Ok(())
    })
}

/// `oxpool promote POOL/CLONE`. On a served pool the moved snapshots' exports take their
/// new names (`POOL/CLONE@SNAP`); one a client has open is refused first.
pub fn promote(host: &Host, name: &str) -> Result<()> {
    let (pool_name, clone) = volume_target(name)?;
    host.change_pool(pool_name, |p| {
        let before: Vec<(String, String)> = p
            .all_snapshots()
            .into_iter()
            .map(|s| (s.volume, s.name))
            .collect();
        let Host::Live(served) = host else {
            return Ok(p.promote(clone)?);
        };
        // Which exports move: every snapshot of the origin's volume up to the origin.
        let origin = p
            .dataset_space(clone)?
            .origin
            .ok_or_else(|| anyhow!("{name}: not a clone"))?;
        let (ovol, osnap) = origin
            .split_once('@')
            .and_then(|(v, s)| Some((v.split_once('/')?.1.to_string(), s.to_string())))
            .ok_or_else(|| anyhow!("{name}: origin '{origin}' unreadable"))?;
        let upto = before
            .iter()
            .filter(|(v, _)| *v == ovol)
            .position(|(_, s)| *s == osnap)
            .ok_or_else(|| anyhow!("{origin}: not found"))?;
        let moving: Vec<String> = before
            .iter()
            .filter(|(v, _)| *v == ovol)
            .take(upto + 1)
            .map(|(_, s)| s.clone())
            .collect();
        // Each moved snapshot keeps its own state: one `recv -u` or `unshare` left out stays
        // out, under its new name too.
        let removed = unexport_snapshots(served, p, &ovol, &moving, false, Unexport::Promote)?;
        match p.promote(clone) {
            Ok(()) => {
                for s in &removed {
                    served.export_volume(p.snapshot_volume(clone, s)?)?;
                }
                Ok(())
            }
            Err(e) => {
                for s in &removed {
                    served.export_volume(p.snapshot_volume(&ovol, s)?)?;
                }
                Err(e.into())
            }
        }
    })
}

/// `oxpool hold TAG SNAP...` and `oxpool release TAG SNAP...`. A release that lets a
/// snapshot marked by `destroy -d` go says so: unlike `zfs release`, which says nothing,
/// since here the snapshot may be an NBD export whose clients it disconnects (a new user
/// found a reader cut off by a silent release, where `destroy` refuses without `-f`).
pub fn hold(
    host: &Host,
    con: &mut dyn Console,
    tag: &str,
    names: &[String],
    release: bool,
) -> Result<()> {
    // Checked whole before anything changes (as destroy and snapshot are): every snapshot
    // exists, is named once, and has the tag (release) or not yet (hold).
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            bail!("{n} is named twice: nothing held or released");
        }
        let (pool_name, volume, snap) = snapshot_target(n)?;
        host.with_pool(pool_name, |p| {
            let held = p
                .snapshots(volume)?
                .into_iter()
                .find(|s| s.name == snap)
                .ok_or_else(|| anyhow!("{n}: not found"))?
                .holds
                .iter()
                .any(|t| t == tag);
            match (release, held) {
                (true, false) => bail!("hold '{tag}' on {n}: not found (nothing released)"),
                (false, true) => bail!("hold '{tag}' on {n}: already exists (nothing held)"),
                _ => Ok(()),
            }
        })?;
    }
    for n in names {
        let (pool_name, volume, snap) = snapshot_target(n)?;
        host.change_pool(pool_name, |p| {
            if release {
                let before = p.all_snapshots();
                p.release(tag, volume, snap)?;
                drop_gone_snapshot_exports(host, p, &before)?;
                let gone = !p
                    .all_snapshots()
                    .iter()
                    .any(|s| s.volume == volume && s.name == snap);
                if gone {
                    writeln!(
                        con.out(),
                        "{n} destroyed: destroy -d marked it, and this was its last hold \
                         (its NBD clients, if any, are disconnected)"
                    )?;
                }
            } else {
                p.hold(tag, volume, snap)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// The snapshots `names` stand for, with -r (`recursive`) as `zfs hold -r` reads them:
/// `POOL@SNAP` is SNAP of every volume of POOL that has it, in the order of the volumes'
/// names (refused if none has it); a volume has no descendants, so `POOL/VOL@SNAP` is that
/// snapshot alone. Without -r the names are as given.
pub fn each_volumes(host: &Host, names: &[String], recursive: bool) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let Some((pool_name, snap)) = n.split_once('@').filter(|(p, _)| !p.contains('/')) else {
            out.push(n.clone());
            continue;
        };
        if !recursive {
            bail!(
                "'{n}': a pool holds no snapshots of its own; -r names that snapshot of every \
                 volume"
            );
        }
        if pool_name.is_empty() || snap.is_empty() || snap.contains('@') {
            bail!("expected POOL@SNAP or POOL/VOL@SNAP, got '{n}'");
        }
        let found = host.with_pool(pool_name, |p| {
            let mut volumes: Vec<String> =
                p.volumes().iter().map(|v| v.name().to_string()).collect();
            volumes.sort();
            let mut found = Vec::new();
            for v in volumes {
                if p.snapshots(&v)?.iter().any(|s| s.name == snap) {
                    found.push(format!("{pool_name}/{v}@{snap}"));
                }
            }
            Ok(found)
        })?;
        if found.is_empty() {
            bail!("'{n}': no volume of '{pool_name}' has such a snapshot");
        }
        // A snapshot also named on its own beside POOL@SNAP is named once; the user's own
        // repetition (of either form) still reaches the check that refuses it as twice.
        out.extend(found.into_iter().filter(|f| !names.contains(f)));
    }
    Ok(out)
}

/// `oxpool bookmark POOL/VOL@SNAP|POOL/VOL#OTHER POOL/VOL#NAME|#NAME`.
pub fn bookmark(host: &Host, source: &str, bookmark: &str) -> Result<()> {
    let (pool_name, rest) = volume_target(source)?;
    let volume = rest
        .split_once(['@', '#'])
        .map(|(v, _)| v)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| anyhow!("expected POOL/VOL@SNAP or POOL/VOL#BOOKMARK, got '{source}'"))?;
    let new = match bookmark.strip_prefix('#') {
        Some(name) => format!("{volume}#{name}"),
        None => {
            let (p, v) = volume_target(bookmark)?;
            if p != pool_name {
                bail!("'{bookmark}': a bookmark belongs to the pool of its snapshot ({pool_name})");
            }
            v.to_string()
        }
    };
    host.change_pool(pool_name, |p| Ok(p.bookmark(rest, &new)?))
}

/// `oxpool destroy POOL/VOL#NAME`.
pub fn destroy_bookmark(host: &Host, target: &str) -> Result<()> {
    let (pool_name, rest) = volume_target(target)?;
    let Some((volume, name)) = rest.split_once('#') else {
        bail!("expected POOL/VOL#BOOKMARK, got '{target}'");
    };
    host.change_pool(pool_name, |p| Ok(p.destroy_bookmark(volume, name)?))
}

/// `oxpool holds SNAP...`.
pub fn holds(host: &Host, con: &mut dyn Console, names: &[String], scripted: bool) -> Result<()> {
    // Read first, printed after: a failure prints no header without lines.
    let mut rows = Vec::new();
    for n in names {
        let (pool_name, volume, snap) = snapshot_target(n)?;
        let tags = host.with_pool(pool_name, |p| {
            let all = p.snapshots(volume)?;
            let s = all
                .into_iter()
                .find(|s| s.name == snap)
                .ok_or_else(|| anyhow!("{n}: not found"))?;
            Ok(s.holds)
        })?;
        rows.extend(tags.into_iter().map(|t| (n, t)));
    }
    if scripted {
        for (n, t) in rows {
            writeln!(con.out(), "{n}\t{t}")?;
        }
        return Ok(());
    }
    writeln!(con.out(), "{:<32} TAG", "NAME")?;
    for (n, t) in rows {
        writeln!(con.out(), "{n:<32} {t}")?;
    }
    Ok(())
}

/// `oxpool audit POOL`: exits non-zero on any finding.
pub fn audit(host: &Host, con: &mut dyn Console, pool_name: &str) -> Result<()> {
    con.progress("audit", 0, 1);
    let report = host.with_pool(pool_name, |p| Ok(p.audit()?))?;
    con.progress_end();
    for problem in &report.problems {
        writeln!(con.out(), "{pool_name}: {problem}")?;
    }
    writeln!(
        con.out(),
        "{pool_name}: {} trees, {} blocks verified, {} leaked, {} problem{}",
        report.trees_walked,
        report.blocks_checked,
        crate::human(report.leaked_bytes),
        report.problems.len(),
        if report.problems.len() == 1 { "" } else { "s" }
    )?;
    if !report.is_clean() {
        bail!(
            "audit of {pool_name} found {} problems",
            report.problems.len()
        );
    }
    Ok(())
}

/// Which datasets `list -t` shows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ListTypes {
    volumes: bool,
    snapshots: bool,
    bookmarks: bool,
}

impl ListTypes {
    /// `volume`, `snapshot`, `bookmark`, `all`, or a comma-separated list of them
    /// (`filesystem` is not a type here yet).
    pub fn parse(s: &str) -> Result<ListTypes> {
        let mut t = ListTypes {
            volumes: false,
            snapshots: false,
            bookmarks: false,
        };
        for part in s.split(',') {
            match part {
                "volume" | "vol" => t.volumes = true,
                "snapshot" | "snap" => t.snapshots = true,
                "bookmark" => t.bookmarks = true,
                "all" => {
                    t.volumes = true;
                    t.snapshots = true;
                    t.bookmarks = true;
                }
                other => bail!("-t {other}: a type is volume, snapshot, bookmark or all"),
            }
        }
        Ok(t)
    }
}

/// The columns `list -t` shows by default.
pub const DEFAULT_COLUMNS: &str = "name,used,available,referenced,written,usedbysnapshots,origin";

/// A column of `list -t ... -o`.
#[derive(Clone, PartialEq, Eq)]
enum Column {
    Name,
    Type,
    Used,
    /// What writers may still fill (ZFS's `available`): the pool's, and a volume's own
    /// unused reservation.
    Available,
    Referenced,
    LogicalReferenced,
    Written,
    /// `written@SNAP`: since snapshot SNAP (`snap`, or `vol@snap` of an origin's volume).
    WrittenSince(String),
    UsedBySnapshots,
    UsedByDataset,
    /// `usedbyrefreservation`: what the volume's reservation holds unused.
    UsedByRefreservation,
    /// `refreservation`: `none` or a size.
    Refreservation,
    Origin,
    Clones,
    Creation,
    CreateTxg,
    Guid,
    Volsize,
    UserRefs,
}

impl Column {
    fn parse(s: &str) -> Result<Column> {
        Ok(match s {
            "name" => Column::Name,
            "type" => Column::Type,
            "used" => Column::Used,
            "available" | "avail" => Column::Available,
            "referenced" | "refer" => Column::Referenced,
            "logicalreferenced" | "lrefer" => Column::LogicalReferenced,
            "written" => Column::Written,
            w if w.starts_with("written@") && w.len() > "written@".len() => {
                Column::WrittenSince(w["written@".len()..].to_string())
            }
            "usedbysnapshots" | "usedsnap" => Column::UsedBySnapshots,
            "usedbydataset" | "usedds" => Column::UsedByDataset,
            "usedbyrefreservation" | "usedrefreserv" => Column::UsedByRefreservation,
            "refreservation" | "refreserv" => Column::Refreservation,
            "origin" => Column::Origin,
            "clones" => Column::Clones,
            "creation" => Column::Creation,
            "createtxg" => Column::CreateTxg,
            "guid" => Column::Guid,
            "volsize" => Column::Volsize,
            "userrefs" => Column::UserRefs,
            other => bail!(
                "-o {other}: a column is name, type, used, available, referenced, \
                 logicalreferenced, written, \
                 written@SNAP, usedbysnapshots, usedbydataset, usedbyrefreservation, \
                 refreservation, origin, clones, creation, createtxg, guid, volsize or userrefs"
            ),
        })
    }

    fn title(&self) -> String {
        match self {
            Column::Name => "NAME",
            Column::Type => "TYPE",
            Column::Used => "USED",
            Column::Available => "AVAIL",
            Column::Referenced => "REFER",
            Column::LogicalReferenced => "LREFER",
            Column::Written => "WRITTEN",
            // As zfs: WRITTEN@SNAP1.
            Column::WrittenSince(snap) => return format!("WRITTEN@{}", snap.to_uppercase()),
            Column::UsedBySnapshots => "USEDSNAP",
            Column::UsedByDataset => "USEDDS",
            Column::UsedByRefreservation => "USEDREFRESERV",
            Column::Refreservation => "REFRESERV",
            Column::Origin => "ORIGIN",
            Column::Clones => "CLONES",
            Column::Creation => "CREATION",
            Column::CreateTxg => "CREATETXG",
            Column::Guid => "GUID",
            Column::Volsize => "VOLSIZE",
            Column::UserRefs => "USERREFS",
        }
        .to_string()
    }

    /// Width in the table; names and lists are left-aligned, numbers right-aligned.
    fn width(&self) -> (usize, bool) {
        match self {
            Column::Name => (32, true),
            Column::Origin | Column::Clones => (24, true),
            Column::Type => (8, true),
            Column::Creation => (24, true),
            Column::Guid => (20, false),
            _ => (10, false),
        }
    }
}

/// A `written@SNAP` cell: `-` where SNAP is no older snapshot of the row's line (as zfs).
fn written_since(p: &Pool, target: &str, snap: &str, exact: bool) -> String {
    match p.written_since(target, snap) {
        Ok(bytes) => size(bytes, exact),
        Err(_) => "-".into(),
    }
}

/// A `creation` cell: the date, as `get creation` shows it; seconds since the epoch with -p
/// (as `zfs list -p`).
fn creation(secs: u64, exact: bool) -> String {
    if exact {
        secs.to_string()
    } else {
        crate::display::date(secs.saturating_mul(1_000_000_000))
    }
}

/// `-o a,b,c`.
pub fn parse_columns(s: &str) -> Result<Vec<String>> {
    let cols: Vec<String> = s.split(',').map(|c| c.trim().to_string()).collect();
    for c in &cols {
        Column::parse(c)?;
    }
    Ok(cols)
}

fn format_row(cols: &[Column], values: &[String]) -> String {
    let mut line = String::new();
    for (i, (c, v)) in cols.iter().zip(values).enumerate() {
        let (w, left) = c.width();
        let last = i + 1 == cols.len();
        match (left, last) {
            (true, true) => line += v,
            (true, false) => line += &format!("{v:<w$} "),
            (false, true) => line += &format!("{v:>w$}"),
            (false, false) => line += &format!("{v:>w$} "),
        }
    }
    line
}

/// The header of `oxpool list -t ... [-o COLUMNS]`.
pub fn datasets_header(con: &mut dyn Console, columns: &str) -> Result<()> {
    let cols: Vec<Column> = columns
        .split(',')
        .map(Column::parse)
        .collect::<Result<_>>()?;
    let titles: Vec<String> = cols.iter().map(|c| c.title()).collect();
    writeln!(con.out(), "{}", format_row(&cols, &titles))?;
    Ok(())
}

/// Which datasets of a pool `list` shows, from the name it was given.
#[derive(Default)]
struct DatasetFilter {
    /// Only this volume's (and its snapshots' or bookmarks').
    volume: Option<String>,
    /// Only this snapshot of it.
    snapshot: Option<String>,
    /// Only this bookmark of it.
    bookmark: Option<String>,
}

impl DatasetFilter {
    /// From `POOL`, `POOL/VOL`, `POOL/VOL@SNAP` or `POOL/VOL#BOOKMARK`.
    fn parse(target: &str) -> Result<DatasetFilter> {
        let Some((_, rest)) = target.split_once('/') else {
            if target.contains(['@', '#']) {
                bail!("{target}: a pool has no snapshots or bookmarks; name POOL/VOL@SNAP");
            }
            return Ok(DatasetFilter::default());
        };
        let (volume, snapshot, bookmark) = match (rest.split_once('@'), rest.split_once('#')) {
            (Some((v, s)), _) => (v, Some(s.to_string()), None),
            (None, Some((v, b))) => (v, None, Some(b.to_string())),
            (None, None) => (rest, None, None),
        };
        Ok(DatasetFilter {
            volume: Some(volume.to_string()),
            snapshot,
            bookmark,
        })
    }

    /// Whether the volume's own row is wanted (not only one of its snapshots or bookmarks).
    fn wants_volume_row(&self) -> bool {
        self.snapshot.is_none() && self.bookmark.is_none()
    }
}

/// `oxpool list -t TYPES [-o COLUMNS] [-s COL] [-S COL] [-H] [-p]
/// [POOL|POOL/VOL[@SNAP|#BOOKMARK]...]`: volumes, snapshots and bookmarks; sorted by `sort`
/// (each a column and whether descending, most important first), else in the pool's order.
#[allow(clippy::too_many_arguments)]
pub fn list_datasets(
    host: &Host,
    con: &mut dyn Console,
    types: ListTypes,
    columns: &str,
    sort: &[(String, bool)],
    scripted: bool,
    exact: bool,
    no_header: bool,
    pools: &[String],
) -> Result<()> {
    let cols: Vec<Column> = columns
        .split(',')
        .map(Column::parse)
        .collect::<Result<_>>()?;
    let keys: Vec<(Column, bool)> = sort
        .iter()
        .map(|(c, descending)| Ok((Column::parse(c)?, *descending)))
        .collect::<Result<_>>()?;
    let mut all_rows = Vec::new();
    let mut failed = Vec::new();
    for target in super::pool::listed(host, pools)? {
        // POOL, or a dataset of it: POOL/VOL (the volume, and its snapshots or bookmarks
        // with -t), POOL/VOL@SNAP or POOL/VOL#BOOKMARK (that one).
        let name = super::pool_part(&target).to_string();
        let wanted = DatasetFilter::parse(&target)?;
        // A snapshot or bookmark named, of a type not listed, would list nothing silently.
        if wanted.snapshot.is_some() && !types.snapshots {
            bail!("{target} is a snapshot: list it with -t snapshot (or all)");
        }
        if wanted.bookmark.is_some() && !types.bookmarks {
            bail!("{target} is a bookmark: list it with -t bookmark (or all)");
        }
        let rows = host.with_pool(&name, |p| {
            // Each row's fields, and its sort keys (exact, so that sizes and times compare
            // as numbers).
            let mut rows: Vec<(Vec<String>, Vec<String>)> = Vec::new();
            if let Some(v) = &wanted.volume {
                // As `zfs list`: a dataset named that does not exist is an error.
                p.volume(v)?;
                if let Some(s) = &wanted.snapshot {
                    p.snapshot_volume(v, s)?;
                }
                if let Some(b) = &wanted.bookmark {
                    if !p.bookmarks(v)?.iter().any(|x| x.name == *b) {
                        bail!("{target}: no such bookmark");
                    }
                }
            }
            // One figure for the pool's volumes, read once so that the rows agree.
            let available_bytes = p.available_bytes();
            for vol in p.volumes() {
                let v = vol.name().to_string();
                if wanted.volume.as_ref().is_some_and(|w| *w != v) {
                    continue;
                }
                if types.volumes && wanted.wants_volume_row() {
                    let s = p.dataset_space(&v)?;
                    let value = |c: &Column, exact: bool| match c {
                        Column::Name => vol.full_name().to_string(),
                        Column::Type => "volume".into(),
                        Column::Used => size(s.used_bytes, exact),
                        Column::Available => size(
                            available_bytes.saturating_add(s.used_by_refreservation_bytes),
                            exact,
                        ),
                        Column::Referenced => size(s.referenced_bytes, exact),
                        Column::LogicalReferenced => size(vol.logical_bytes(), exact),
                        Column::WrittenSince(snap) => written_since(p, &v, snap, exact),
                        Column::Written => size(s.written_bytes, exact),
                        Column::UsedByDataset => size(s.used_by_dataset_bytes, exact),
                        Column::UsedBySnapshots => size(s.used_by_snapshots_bytes, exact),
                        Column::UsedByRefreservation => size(s.used_by_refreservation_bytes, exact),
                        // As zfs: `none`, 0 with -p.
                        Column::Refreservation => match vol.props().refreservation_bytes {
                            0 if !exact => "none".into(),
                            b => size(b, exact),
                        },
                        Column::Origin => s.origin.clone().unwrap_or_else(|| "-".into()),
                        Column::Clones | Column::UserRefs => "-".into(),
                        Column::Creation => creation(s.creation_s, exact),
                        Column::CreateTxg => s.createtxg.to_string(),
                        Column::Guid => s.guid.to_string(),
                        Column::Volsize => size(vol.size_bytes(), exact),
                    };
                    rows.push((
                        cols.iter().map(|c| value(c, exact)).collect(),
                        keys.iter().map(|(c, _)| value(c, true)).collect(),
                    ));
                }
                if types.snapshots && wanted.bookmark.is_none() {
                    for s in p.snapshots(&v)? {
                        if wanted.snapshot.as_ref().is_some_and(|w| *w != s.name) {
                            continue;
                        }
                        let value = |c: &Column, exact: bool| match c {
                            Column::Name => format!("{}@{}", vol.full_name(), s.name),
                            Column::Type => "snapshot".into(),
                            Column::Used => size(s.used_bytes, exact),
                            Column::Referenced => size(s.referenced_bytes, exact),
                            Column::LogicalReferenced => size(s.logical_referenced_bytes, exact),
                            Column::WrittenSince(snap) => {
                                written_since(p, &format!("{v}@{}", s.name), snap, exact)
                            }
                            Column::Written => size(s.written_bytes, exact),
                            Column::UsedBySnapshots
                            | Column::UsedByDataset
                            | Column::UsedByRefreservation
                            | Column::Refreservation
                            | Column::Origin
                            | Column::Available => "-".into(),
                            Column::Clones if s.clones.is_empty() => "-".into(),
                            Column::Clones => s.clones.join(","),
                            Column::Creation => creation(s.creation_s, exact),
                            Column::CreateTxg => s.createtxg.to_string(),
                            Column::Guid => s.guid.to_string(),
                            Column::Volsize => size(s.volsize_bytes, exact),
                            Column::UserRefs => s.holds.len().to_string(),
                        };
                        rows.push((
                            cols.iter().map(|c| value(c, exact)).collect(),
                            keys.iter().map(|(c, _)| value(c, true)).collect(),
                        ));
                    }
                }
                if types.bookmarks && wanted.snapshot.is_none() {
                    for b in p.bookmarks(&v)? {
                        if wanted.bookmark.as_ref().is_some_and(|w| *w != b.name) {
                            continue;
                        }
                        // A bookmark holds no block: no space figure is its own.
                        let value = |c: &Column, exact: bool| match c {
                            Column::Name => format!("{}#{}", vol.full_name(), b.name),
                            Column::Type => "bookmark".into(),
                            Column::Creation => creation(b.creation_s, exact),
                            Column::CreateTxg => b.txg.to_string(),
                            Column::Guid => b.guid.to_string(),
                            Column::Volsize => size(b.volsize_bytes, exact),
                            _ => "-".into(),
                        };
                        rows.push((
                            cols.iter().map(|c| value(c, exact)).collect(),
                            keys.iter().map(|(c, _)| value(c, true)).collect(),
                        ));
                    }
                }
            }
            Ok(rows)
        });
        match rows {
            Ok(rows) => all_rows.extend(rows),
            // As `zfs list`: a pool that cannot be opened has no datasets to list, unless it
            // was named.
            Err(e) if pools.is_empty() => {
                if let Err(e) = super::unavailable::unavailable(host, &name, e) {
                    failed.push(e);
                }
            }
            Err(e) => failed.push(e),
        }
    }
    // Stable: rows equal in every key keep the pool's order, as `zfs list -s` keeps them.
    all_rows.sort_by(|(_, a), (_, b)| {
        keys.iter()
            .zip(a.iter().zip(b))
            .map(|((_, descending), (x, y))| {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if *descending {
                    order.reverse()
                } else {
                    order
                }
            })
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    if !scripted && !no_header && !all_rows.is_empty() {
        datasets_header(con, columns)?;
    }
    for (r, _) in all_rows {
        if scripted {
            writeln!(con.out(), "{}", r.join("\t"))?;
        } else {
            writeln!(con.out(), "{}", format_row(&cols, &r))?;
        }
    }
    super::pool::last_of(con, failed)
}

/// What `destroy -R` takes with its target, in the order it goes: each clone of the
/// snapshots destroyed, deepest first (a clone's own clones before it), as volume names
/// with their snapshots' names.
/// Refused if a receive into one of the volumes is under way or saved: its hidden dataset
/// is a clone that only `recv -A` (or the receive's end) removes.
fn dependents_of(p: &Pool, volume: &str, snaps: &[String]) -> Result<Vec<(String, Vec<String>)>> {
    let mut order = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let prefix = format!("{}/", p.name());
    let mut clones = Vec::new();
    for s in p.snapshots(volume)? {
        if snaps.contains(&s.name) {
            clones.extend(s.clones);
        }
    }
    for c in clones {
        let c = c.strip_prefix(&prefix).unwrap_or(&c).to_string();
        // A clone's whole line goes: all its snapshots, so all their clones.
        visit_dependents(p, &prefix, c, &mut seen, &mut order)?;
    }
    Ok(order)
}

/// Appends clone `volume` and its snapshots to `order` after its own clones (their clones
/// first), once.
/// Bounded: each volume of the pool is visited once (`seen`), and the recursion is as deep
/// as the chain of clones.
fn visit_dependents(
    p: &Pool,
    prefix: &str,
    volume: String,
    seen: &mut std::collections::BTreeSet<String>,
    order: &mut Vec<(String, Vec<String>)>,
) -> Result<()> {
    if let Some((receiving, _)) = volume.split_once('%') {
        bail!(
            "cannot destroy with its dependents: a receive into {prefix}{receiving} is under way \
             or saved by recv -s; let it end, or discard it with `oxpool recv -A \
             {prefix}{receiving}`"
        );
    }
    if !seen.insert(volume.clone()) {
        return Ok(());
    }
    let mut snaps = Vec::new();
    for s in p.snapshots(&volume)? {
        for c in s.clones {
            let c = c.strip_prefix(prefix).unwrap_or(&c).to_string();
            visit_dependents(p, prefix, c, seen, order)?;
        }
        snaps.push(s.name);
    }
    order.push((volume, snaps));
    Ok(())
}

/// `oxpool destroy -R [-n] [-v] [-p] [-f] POOL/VOL[@SPEC]`, as `zfs destroy -R`: the target
/// with every dependent: the clones of the snapshots it destroys (a volume: all of its
/// snapshots), each with its own snapshots and their clones, deepest first. Every refusal
/// (a held snapshot among them, an export open without `-f`) is found before anything is
/// destroyed. The pieces then go one after the other, each as `destroy -r` of a clone; a
/// crash between two leaves the first ones destroyed, and the same command finishes.
pub fn destroy_with_dependents(
    host: &Host,
    con: &mut dyn Console,
    target: &str,
    flags: DestroyFlags,
) -> Result<()> {
    if flags.defer {
        bail!("-d and -R: -R destroys the clones and the snapshots -d would wait for");
    }
    let (pool_name, rest) = volume_target(target)?;
    let (volume, spec) = match rest.split_once('@') {
        Some((v, spec)) => (v, Some(spec)),
        None => (rest, None),
    };
    let (snaps, dependents) = host.with_pool(pool_name, |p| {
        p.volume(volume)?;
        let snaps = match spec {
            Some(spec) => {
                let snaps = named_snapshots(p, volume, spec)?;
                if snaps.is_empty() {
                    bail!("'{target}': could not find any snapshots to destroy");
                }
                snaps
            }
            None => p.snapshots(volume)?.into_iter().map(|s| s.name).collect(),
        };
        let dependents = dependents_of(p, volume, &snaps)?;
        // Every piece's refusals first: one refused changes nothing.
        let mut pieces = dependents.clone();
        pieces.push((volume.to_string(), snaps.clone()));
        let mut now = Vec::new();
        let mut reclaim_bytes = 0;
        for (i, (v, vsnaps)) in pieces.iter().enumerate() {
            let whole_volume = i < dependents.len() || spec.is_none();
            for s in vsnaps {
                // Held or being sent: refused now, not after the clones went.
                if let Some(why) = p.destroy_refusal_besides_clones(v, s)? {
                    bail!("cannot destroy {target} with its dependents: {why}");
                }
            }
            now.extend(vsnaps.iter().map(|s| format!("{pool_name}/{v}@{s}")));
            if whole_volume {
                now.push(format!("{pool_name}/{v}"));
                reclaim_bytes += p.dataset_space(v)?.used_bytes;
            } else {
                reclaim_bytes += p.freed_estimate(v, vsnaps)?;
            }
        }
        if let Host::Live(served) = host {
            for n in &now {
                served.check_unexport(n, flags.force, Unexport::Destroy)?;
            }
        }
        if flags.verbose || flags.dry_run || flags.parsable {
            print_destroy_plan(con, &now, &[], reclaim_bytes, flags.dry_run, flags.parsable)?;
        }
        Ok((snaps, dependents))
    })?;
    if flags.dry_run {
        crate::history::changed_nothing();
        return Ok(());
    }
    // Said by the plan already.
    let quiet = DestroyFlags {
        verbose: false,
        parsable: false,
        ..flags
    };
    // A volume with its snapshots, as `destroy -r POOL/VOL` (its own checks again).
    let destroy_volume = |con: &mut dyn Console, v: &str| {
        let command = crate::args::VolCommand::Destroy {
            name: format!("{pool_name}/{v}"),
            force: flags.force,
            recursive: true,
            dry_run: false,
            verbose: false,
            parsable: false,
        };
        super::volume::run(host, con, command)
    };
    for (d, _) in &dependents {
        destroy_volume(con, d)?;
    }
    match spec {
        Some(_) => destroy(
            host,
            con,
            &format!("{pool_name}/{volume}@{}", snaps.join(",")),
            quiet,
            false,
        ),
        None => destroy_volume(con, volume),
    }
}
