//! The pool verbs: create, import, export, destroy, add, list, status, scrub.

use super::unavailable::{print_unavailable, unavailable, unavailable_why};
use crate::console::Console;
use crate::devices::{open_device, probe_labels, scan_dir, Devices, NewFiles, Probed};
use crate::display::{print_status, shell_word, size};
use crate::host::{self, open_pool, remember, Host};
use anyhow::{bail, Result};
use oxpool_engine::cachefile;
use oxpool_engine::props::parse_size;
use oxpool_engine::{Pool, PoolProps, PoolRef, ScanKind, ScanState, TopSpec};
use oxpool_format::{Guid, TopVdevKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often `scrub -w` redraws its progress.
const SCRUB_PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

/// `oxpool create`. In a server, the new pool is served at once.
#[allow(clippy::too_many_arguments)]
pub fn create(
    host: &Host,
    con: &mut dyn Console,
    name: &str,
    vdevs: &[String],
    size: Option<&str>,
    sparse: bool,
    props: &[String],
    force: bool,
) -> Result<()> {
    let _one = match host {
        Host::Live(served) => Some(served.membership()),
        Host::Local { .. } => None,
    };
    let cache = host.cache();
    if cachefile::read(cache)?.iter().any(|p| p.name == name) {
        bail!("pool '{name}' already exists");
    }
    let create = new_files(size, sparse)?;
    let mut pool_props = PoolProps::default();
    for a in props {
        let (k, v) = super::split_assignment(a)?;
        pool_props.set(k, v)?;
    }
    refuse_paths_twice(con, vdevs, &Known::default(), name)?;
    refuse_devices_of_imported(cache, con, vdevs, None)?;
    let (vdevs, spares) = split_spares(vdevs)?;
    let mut devs = Devices::default();
    // Until the pool exists with its spares, a failure removes the files this command made
    // (once it exists, they are the pool's: `import` finds it).
    let made = parse_vdevs(con, vdevs, create, &mut devs).and_then(|tops| {
        let spares = open_all(con, spares, create, &mut devs)?;
        let pool = Pool::create(name, tops, pool_props, force)?;
        if !spares.is_empty() {
            if let Err(e) = pool.add_spares(spares, force) {
                // As if never made: a create that fails creates nothing.
                if let Err(d) = pool.destroy() {
                    return Err(anyhow::anyhow!(
                        "{e}; and the pool just made could not be destroyed ({d}): `oxpool \
                         import -d DIR {name}` finds it, `oxpool destroy` removes it"
                    ));
                }
                return Err(e.into());
            }
        }
        Ok(pool)
    });
    let pool = match made {
        Ok(pool) => pool,
        Err(e) => {
            devs.remove_created(con.err());
            return Err(e);
        }
    };
    remember(cache, &pool)?;
    crate::history::record(&pool);
    match host {
        Host::Local { .. } => pool.export()?,
        Host::Live(served) => {
            // Its creation's record durable before the pool is offered.
            pool.sync()?;
            served.adopt(pool, devs)?;
        }
    }
    Ok(())
}

/// `oxpool import [-d DIR]... [POOL|ID [NEWNAME]]`. In a server, the imported pool is served
/// at once (under NEWNAME if given: its volumes' exports are NEWNAME/VOL).
pub fn import(
    host: &Host,
    con: &mut dyn Console,
    dirs: &[PathBuf],
    name: Option<&str>,
    new_name: Option<&str>,
    missing_log: bool,
) -> Result<()> {
    let _one = match (host, name) {
        (Host::Live(served), Some(_)) => Some(served.membership()),
        _ => None,
    };
    // A bad new name is refused before any device is read.
    if let Some(new) = new_name {
        oxpool_engine::spa::check_name("pool", new)?;
        oxpool_engine::spa::check_new_pool_name(new)?;
    }
    let cache = host.cache();
    let mut paths: Vec<PathBuf> = Vec::new();
    if dirs.is_empty() {
        let known = cachefile::read(cache)?;
        // Unlike `zpool import`, nothing scans /dev: with no directory named, only the
        // devices of pools this machine knows are looked at, and an exported pool is known
        // no more.
        let is_known = |n: &str| {
            known
                .iter()
                .any(|p| p.name == n || oxpool_engine::parse_id(n) == Some(Guid(p.guid)))
        };
        if let Some(n) = name.filter(|n| !is_known(n)) {
            if let (Host::Live(served), None) = (host, new_name) {
                if served.serves(n) {
                    bail!("pool '{n}' is imported already (this server serves it)");
                }
            }
            bail!(
                "pool '{n}' is not known here: name the directory that holds its devices: \
                 oxpool import -d DIR {n}{}",
                new_name.map(|n| format!(" {n}")).unwrap_or_default()
            );
        }
        for p in known {
            paths.extend(p.devices);
        }
    }
    for d in dirs {
        paths.extend(scan_dir(&con.path(d))?);
    }
    let mut devs = Devices::default();
    for p in &paths {
        // Devices of pools open elsewhere (or in this server) are locked: not candidates.
        if let Ok(d) = open_device(p, None) {
            devs.push(d);
        }
    }
    match name {
        Some(n) => {
            // The pool the labels name so, or whose id it is. Of several, the one this
            // machine does not know already (the other is imported here: its devices were
            // searched too); else none, and the engine refuses them, listing their ids.
            let found = probe_labels(&devs);
            // By any name its labels carry: a device away during a rename keeps the old one.
            let matching: Vec<&Probed> = found
                .iter()
                .filter(|f| {
                    f.names
                        .iter()
                        .any(|name| PoolRef::NameOrId(n).matches(name, Guid(f.guid)))
                })
                .collect();
            if let (Host::Live(served), true) = (host, matching.is_empty()) {
                // Its devices are locked by the server: found only as the pool it serves
                // (a new name taken is said below, first).
                if served.serves(n) && !new_name.is_some_and(|m| served.serves(m)) {
                    bail!(
                        "pool '{n}' is imported already (this server serves it){}",
                        match new_name {
                            Some(_) => ": a pool is renamed at import only; export it first",
                            None => "",
                        }
                    );
                }
            }
            let known = cachefile::read(cache)?;
            let fresh: Vec<&Probed> = matching
                .iter()
                .copied()
                .filter(|f| !known.iter().any(|k| k.guid == f.guid))
                .collect();
            let chosen = match (matching.as_slice(), fresh.as_slice()) {
                ([one], _) | (_, [one]) => Some(*one),
                _ => None,
            };
            // The engine gets the pool this command chose, by id; with none chosen (none
            // found, or several of that name), the name, and it says why, listing the pools
            // it found. Both read the same labels, so none chosen here is none there.
            let which = chosen.map_or(PoolRef::NameOrId(n), |c| PoolRef::Id(Guid(c.guid)));
            // The name it will have here.
            let target = new_name.or(chosen.map(|c| c.name.as_str())).unwrap_or(n);
            refuse_name_in_use(host, cache, dirs, n, new_name, target, chosen)?;
            let pool = Pool::import_as(
                devs.backends(),
                which,
                new_name,
                oxpool_engine::ImportOptions { missing_log },
            )?;
            // A rename a crash interrupted brings the pool up under the name its last txg
            // recorded, which its labels may not have shown: that name must be free too.
            if pool.name() != target {
                let name = pool.name().to_string();
                if let Err(e) = refuse_name_in_use(host, cache, dirs, n, Some(&name), &name, chosen)
                {
                    pool.export()?;
                    return Err(e);
                }
            }
            // The candidates that are not this pool's are unlocked (another import needs them).
            devs.retain_named(&pool.open_device_names());
            // A pool this machine did not know starts from zero, whatever an old record
            // says (one left by a cache file removed by hand, say).
            let known = cachefile::read(cache)?
                .iter()
                .any(|p| p.guid == pool.guid().0);
            if !known {
                if let Err(e) = crate::errors_file::forget(cache, pool.guid().0) {
                    writeln!(
                        con.err(),
                        "oxpool: warning: old error counts not dropped: {e:#}"
                    )?;
                }
            }
            remember(cache, &pool)?;
            crate::history::record(&pool);
            host::adopt_host_state(cache, &pool, con.err())?;
            let imported = pool.name().to_string();
            let guid = pool.guid().0;
            match host {
                Host::Local { .. } => {
                    host::keep_error_counts(cache, &pool);
                    pool.export()?
                }
                Host::Live(served) => {
                    // Its import's record durable before the pool is offered.
                    pool.sync()?;
                    served.adopt(pool, devs)?;
                }
            }
            match chosen.filter(|c| c.name != imported) {
                Some(c) => writeln!(
                    con.out(),
                    "imported pool '{}' (id {guid:x}) as '{imported}'",
                    c.name
                )?,
                None => writeln!(con.out(), "imported pool '{imported}'")?,
            }
        }
        None => {
            // List what could be imported: one line per pool found in the labels.
            let found = probe_labels(&devs);
            if found.is_empty() {
                let hint = if dirs.is_empty() {
                    " (only the devices of known pools were searched: oxpool import -d DIR)"
                } else {
                    ""
                };
                writeln!(con.out(), "no pools available to import{hint}")?;
            }
            // Pools this machine knows already are marked: importing one again only records
            // where its devices are now (after they moved), unlike `zpool import`, which
            // lists only pools not imported.
            let known = cachefile::read(cache)?;
            for probed in found {
                let mark = if known.iter().any(|p| p.guid == probed.guid) {
                    "  (imported already)"
                } else {
                    ""
                };
                // As `zpool import` shows a pool's missing devices: import may still take it
                // (redundancy) or say why not.
                let words = |paths: &[String]| -> String {
                    let quoted: Vec<String> = paths.iter().map(|p| shell_word(p)).collect();
                    quoted.join(" ")
                };
                let mut notes = String::new();
                if !probed.missing.is_empty() {
                    notes += &format!("  missing: {}", words(&probed.missing));
                }
                for (a, b) in &probed.twice {
                    let (a, b) = (shell_word(a), shell_word(b));
                    notes += &format!("  ({a} and {b} hold one device: one is a copy)");
                }
                writeln!(
                    con.out(),
                    "pool: {}  id: {:x}  devices: {}{notes}{mark}",
                    probed.name,
                    probed.guid,
                    words(&probed.paths)
                )?;
            }
        }
    }
    Ok(())
}

/// Refuses an import whose pool would take the name `target` of another pool this machine
/// knows (its cache file entry, and every list, would then show only one of them), or
/// would rename a pool imported here already (as `zpool import` refuses an imported pool:
/// export it first). `n` is the name or id asked for, `chosen` the pool the labels found
/// for it (None: none, or several, which the engine's import refuses with their ids). One
/// line each, with what to do.
fn refuse_name_in_use(
    host: &Host,
    cache: &Path,
    dirs: &[PathBuf],
    n: &str,
    new_name: Option<&str>,
    target: &str,
    chosen: Option<&Probed>,
) -> Result<()> {
    let known = cachefile::read(cache)?;
    let dir_args: String = dirs
        .iter()
        .map(|d| format!(" -d {}", shell_word(&d.display().to_string())))
        .collect();
    if let Some(c) = chosen {
        // The same pool again: only its devices' paths are recorded anew, unless renamed.
        if let Some(same) = known.iter().find(|p| p.guid == c.guid) {
            if same.name != target {
                bail!(
                    "cannot import '{n}' (id {:x}) as '{target}': it is imported already as \
                     '{}'; export it first (oxpool export {}), then import it under the new \
                     name",
                    c.guid,
                    same.name,
                    same.name
                );
            }
            return Ok(());
        }
    }
    let other = known.iter().find(|p| p.name == target);
    let served = matches!(host, Host::Live(s) if s.serves(target));
    if other.is_none() && !served {
        return Ok(());
    }
    let id = match other {
        Some(o) => format!(" (id {:x})", o.guid),
        None => String::new(),
    };
    let Some(c) = chosen else {
        // Nothing found to import: the pool of that name is the one here (a server holds its
        // devices), or another's devices are not where looked.
        let how = if served {
            " (this server serves it)"
        } else {
            ""
        };
        bail!("pool '{target}' is imported already{id}{how}");
    };
    if new_name.is_some() {
        bail!(
            "cannot import '{n}' (id {:x}) as '{target}': a pool named {target} is imported \
             already{id}; choose another name",
            c.guid
        );
    }
    bail!(
        "cannot import '{n}' (id {:x}): a pool named {target} is imported already{id}; import \
         it under another name: oxpool import{dir_args} {:x} NEWNAME (or export that one \
         first: oxpool export {target})",
        c.guid,
        c.guid
    )
}

/// `oxpool export [-f] POOL`. A served pool is refused while clients have it open; with
/// `-f` they are disconnected (after their requests in flight are answered) and the server
/// stops serving it.
pub fn export(host: &Host, name: &str, force: bool) -> Result<()> {
    match host {
        Host::Local { cache } => match open_pool(cache, name) {
            Ok((pool, _locks)) => {
                // In the history the pool takes with it (the export's sync writes it).
                crate::history::record(&pool);
                pool.export()?
            }
            // As `zpool export` of a pool that cannot be opened: this machine forgets it
            // (it was listed UNAVAIL); its devices are left as they are.
            Err(e) if e.downcast_ref::<host::Unavailable>().is_some() => {
                eprintln!(
                    "oxpool: pool '{name}' could not be opened ({}); forgotten by this \
                     machine, its devices untouched (`oxpool import -d DIR {name}` finds it \
                     again)",
                    unavailable_why(&e)
                );
            }
            Err(e) => return Err(e),
        },
        Host::Live(served) => {
            let _one = served.membership();
            // A client's disk going away under it is refused, as `zpool export` refuses a
            // busy pool: -f disconnects them (after answering what they sent).
            let (pool, devices) = served.release(name, !force)?;
            crate::history::record(&pool);
            pool.export()?;
            drop(devices);
        }
    }
    host::forget(host.cache(), name)?;
    Ok(())
}

/// `oxpool destroy [-f] POOL`.
pub fn destroy(host: &Host, con: &mut dyn Console, name: &str, force: bool) -> Result<()> {
    match host {
        Host::Local { cache } => match open_pool(cache, name) {
            Ok((pool, _locks)) => pool.destroy()?,
            Err(e) => destroy_unavailable(cache, con, name, force, e)?,
        },
        Host::Live(served) => {
            let _one = served.membership();
            let (pool, devices) = served.release(name, !force)?;
            pool.destroy()?;
            drop(devices);
        }
    }
    host::forget(host.cache(), name)?;
    Ok(())
}

/// `oxpool destroy [-f] POOL` of a pool the cache file lists that cannot be opened (`err`,
/// [`host::Unavailable`]; other errors are returned as they are). Without `-f`, refused:
/// its devices may be missing only for now, and a destroy cannot be taken back (`export`
/// forgets the pool and leaves its devices alone). With `-f`, the labels of the devices
/// found at the listed paths that still name this pool (by guid) are cleared, each said on
/// a line, and the pool is forgotten.
fn destroy_unavailable(
    cache: &Path,
    con: &mut dyn Console,
    name: &str,
    force: bool,
    err: anyhow::Error,
) -> Result<()> {
    if err.downcast_ref::<host::Unavailable>().is_none() {
        return Err(err);
    }
    let Some(entry) = cachefile::read(cache)?.into_iter().find(|p| p.name == name) else {
        return Err(err);
    };
    if !force {
        bail!(
            "cannot destroy pool '{name}': it cannot be opened ({}); `oxpool export {name}` \
             forgets it and leaves its devices as they are, `oxpool destroy -f {name}` also \
             clears the labels of those of its devices that are found",
            unavailable_why(&err)
        );
    }
    // Opened (and locked) first, all of them: a device in use by another process stops the
    // destroy before any label is cleared.
    let mut ours = Vec::new();
    for path in &entry.devices {
        if !path.exists() {
            writeln!(
                con.out(),
                "{}: not found (if it comes back, it still carries the pool's labels)",
                path.display()
            )?;
            continue;
        }
        let dev = match open_device(path, None) {
            Ok(d) => d,
            // In use: another pool's device (served) is left alone; else this pool's is in
            // use somewhere, and nothing is cleared.
            Err(e) => match crate::devices::peek_label(path) {
                Some(l) if l.pool_guid.0 != entry.guid => {
                    writeln!(
                        con.out(),
                        "{}: left as it is (a device of another pool, '{}', guid {:x}, in use)",
                        path.display(),
                        l.pool_name,
                        l.pool_guid.0
                    )?;
                    continue;
                }
                _ => return Err(e),
            },
        };
        // Only a device whose start still carries this pool's label: one reused by another
        // tool (a filesystem, an LVM header) keeps only its end labels, which must not count.
        let front = oxpool_io::rt::block_on(oxpool_engine::vdev::label::read_front_label(
            dev.backend().as_ref(),
        ));
        match front {
            Ok(l) if l.pool_guid.0 == entry.guid => ours.push((path, dev)),
            Ok(l) => writeln!(
                con.out(),
                "{}: left as it is (a device of another pool, '{}', guid {:x})",
                path.display(),
                l.pool_name,
                l.pool_guid.0
            )?,
            Err(e) => writeln!(
                con.out(),
                "{}: left as it is (no label of this pool at its start: {e})",
                path.display()
            )?,
        }
    }
    if ours.is_empty() {
        writeln!(
            con.out(),
            "none of the devices of pool '{name}' is found: only forgotten"
        )?;
    }
    for (path, dev) in &ours {
        oxpool_io::rt::block_on(oxpool_engine::vdev::label::clear_labels(
            dev.backend().as_ref(),
        ))
        .map_err(|e| anyhow::anyhow!("{}: clearing its labels failed: {e}", path.display()))?;
        writeln!(con.out(), "{}: labels cleared", path.display())?;
    }
    Ok(())
}

/// `oxpool add POOL [log] [mirror|raidz[1-3]] PATH...`: in place, while the pool serves.
pub fn add(
    host: &Host,
    con: &mut dyn Console,
    name: &str,
    vdevs: &[String],
    size: Option<&str>,
    sparse: bool,
    force: bool,
) -> Result<()> {
    let create = new_files(size, sparse)?;
    refuse_devices_of_imported(host.cache(), con, vdevs, Some(name))?;
    let (vdevs, spares) = split_spares(vdevs)?;
    if vdevs.is_empty() {
        return add_spares(host, con, name, spares, create, force);
    }
    if !spares.is_empty() {
        // ZFS adds both in one command; here the spares would be a second change, and a
        // failure of it would leave the first done.
        bail!(
            "add the hot spares by themselves, after the vdevs: oxpool add {name} spare {}",
            spares.join(" ")
        );
    }
    host.change_served_pool(name, |pool, served| {
        refuse_known_paths(pool, con, vdevs)?;
        let mut devs = Devices::default();
        // As in create: until the pool holds the new devices, a failure removes the files
        // this command made.
        let made = parse_vdevs(con, vdevs, create, &mut devs)
            .and_then(|tops| Ok(pool.add_vdevs(tops, force)?));
        if let Err(e) = made {
            // Once the pool holds a new device (its commit failed half way, say), its file is
            // the pool's: removing it could leave a pool that no longer imports.
            let ours = pool.open_device_names();
            devs.remove_created_except(&ours, con.err());
            return Err(e);
        }
        if let Some(served) = served {
            served.keep_devices(devs);
        }
        remember(host.cache(), pool)?;
        Ok(())
    })
}

/// Refuses, before any device is opened, a path `add` names twice or one already in the
/// pool: opening it would find it locked, and the message would blame another process.
fn refuse_known_paths(pool: &Pool, con: &dyn Console, words: &[String]) -> Result<()> {
    refuse_paths_twice(con, words, &Known::devices_of(pool), pool.name())
}

/// Refuses `path` (a device for `attach` or `replace`) if it is one of the pool's devices,
/// however named (see [`refuse_paths_twice`]).
pub(super) fn refuse_pool_device(pool: &Pool, con: &dyn Console, path: &str) -> Result<()> {
    let path_named = canonical(&con.path(Path::new(path)));
    if Known::devices_of(pool).holds(&path_named, file_identity(&path_named)) {
        bail!("{path} is already in pool '{}'", pool.name());
    }
    Ok(())
}

/// Devices a pool has: their [`canonical`] paths and, of those that exist, their
/// [`file_identity`].
#[derive(Default)]
struct Known {
    paths: Vec<PathBuf>,
    ids: Vec<(u64, u64)>,
}

impl Known {
    fn devices_of(pool: &Pool) -> Known {
        let paths: Vec<PathBuf> = pool
            .device_paths()
            .iter()
            .map(|p| canonical(Path::new(p)))
            .collect();
        let ids = paths.iter().filter_map(|p| file_identity(p)).collect();
        Known { paths, ids }
    }

    /// Whether the file at canonical `path`, of identity `id`, is one of them.
    fn holds(&self, path: &Path, id: Option<(u64, u64)>) -> bool {
        self.paths.iter().any(|p| p == path) || id.is_some_and(|id| self.ids.contains(&id))
    }
}

/// Dangling symbolic links followed at most (Linux follows at most 40 in a lookup,
/// `MAXSYMLINKS`; here each is the last component of the path before it).
const SYMLINKS_FOLLOWED_MAX: usize = 40;

/// A path as the file system names it; one that does not exist yet (a file `create` makes)
/// by its directory's such path and its name, so that `s.img` and `./s.img` are one, and a
/// dangling symbolic link by the path it names, so that a link to a file the same command
/// makes is that file (else the link, opened after the file was made, found it locked, and
/// the message blamed another process). A lone dangling link is not created through: its
/// open fails.
fn canonical(p: &Path) -> PathBuf {
    let mut p = p.to_path_buf();
    for _ in 0..SYMLINKS_FOLLOWED_MAX {
        if let Ok(c) = std::fs::canonicalize(&p) {
            return c;
        }
        // A dangling link: where it points (relative to the link's directory).
        match std::fs::read_link(&p) {
            Ok(target) => {
                p = match p.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                }
            }
            Err(_) => break,
        }
    }
    match (p.parent().map(std::fs::canonicalize), p.file_name()) {
        (Some(Ok(dir)), Some(name)) => dir.join(name),
        _ => p,
    }
}

/// Which file an existing path is: two hard links to one file have different paths and one
/// device and inode; two nodes of one block device have different inodes (and locks) and one
/// device number, which is the identity of a block device.
fn file_identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(p).ok()?;
    Some(match m.file_type().is_block_device() {
        true => (u64::MAX, m.rdev()),
        false => (m.dev(), m.ino()),
    })
}

/// Refuses, with -f or without, a device among `words` whose label names a pool imported
/// here (in the cache file) other than `own`: ZFS's -f takes a device of an exported or
/// foreign pool, never one of an active pool, whose data writing it would destroy (a new
/// user's `create -f other r1.img` over a device of an imported raidz left it DEGRADED).
/// A pool served with another cache file holds its devices locked: opening them refuses.
pub(crate) fn refuse_devices_of_imported(
    cache: &Path,
    con: &dyn Console,
    words: &[String],
    own: Option<&str>,
) -> Result<()> {
    let known = cachefile::read(cache)?;
    // Bounded by the words of one command.
    for w in words.iter().filter(|w| !is_keyword(w)) {
        let Some(label) = crate::devices::peek_label(&con.path(Path::new(w))) else {
            continue;
        };
        let Some(pool) = known.iter().find(|p| p.guid == label.pool_guid.0) else {
            continue;
        };
        if Some(pool.name.as_str()) != own {
            bail!(
                "{w} is a device of pool '{}', imported here: not taken, with -f or without \
                 (export or destroy that pool first, or detach or remove the device from it)",
                pool.name
            );
        }
    }
    Ok(())
}

/// Refuses a path that `words` names twice (`a.img` and `./a.img` too, a symbolic link to a
/// file another word names, a second hard link to one), or one of `ours`, the devices pool
/// `pool` has already: opening it a second time would find it locked, and the message would
/// blame another process.
fn refuse_paths_twice(con: &dyn Console, words: &[String], ours: &Known, pool: &str) -> Result<()> {
    let mut seen: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    // Bounded by the words of one command.
    for w in words {
        if is_keyword(w) {
            continue;
        }
        let path = canonical(&con.path(Path::new(w)));
        let id = file_identity(&path);
        if ours.holds(&path, id) {
            bail!("{w} is already in pool '{pool}'");
        }
        if seen
            .iter()
            .any(|(p, i)| *p == path || (id.is_some() && *i == id))
        {
            bail!("{w} is named twice");
        }
        seen.push((path, id));
    }
    Ok(())
}

/// `oxpool add POOL spare PATH...`: hot spares.
fn add_spares(
    host: &Host,
    con: &mut dyn Console,
    name: &str,
    paths: &[String],
    create: Option<NewFiles>,
    force: bool,
) -> Result<()> {
    if paths.is_empty() {
        bail!("spare needs devices");
    }
    host.change_served_pool(name, |pool, served| {
        refuse_known_paths(pool, con, paths)?;
        let mut devs = Devices::default();
        let made = open_all(con, paths, create, &mut devs)
            .and_then(|backends| Ok(pool.add_spares(backends, force)?));
        if let Err(e) = made {
            let ours = pool.device_paths();
            devs.remove_created_except(&ours, con.err());
            return Err(e);
        }
        if let Some(served) = served {
            served.keep_devices(devs);
        }
        remember(host.cache(), pool)?;
        Ok(())
    })
}

/// The pools a listing covers: those named, or every pool the cache file knows.
pub fn listed(host: &Host, named: &[String]) -> Result<Vec<String>> {
    if named.is_empty() {
        host.known_pools()
    } else {
        Ok(named.to_vec())
    }
}

/// A column of `oxpool list` (of pools): the names `-o` takes for it, its header, its width
/// and whether it is aligned left.
struct PoolColumn {
    names: &'static [&'static str],
    header: &'static str,
    width: usize,
    left: bool,
}

/// Every column of the pool listing, in the order of a row's fields.
const POOL_COLUMNS: &[PoolColumn] = &[
    PoolColumn {
        names: &["name"],
        header: "NAME",
        width: 16,
        left: true,
    },
    PoolColumn {
        names: &["size"],
        header: "SIZE",
        width: 10,
        left: false,
    },
    PoolColumn {
        names: &["alloc", "allocated"],
        header: "ALLOC",
        width: 10,
        left: false,
    },
    PoolColumn {
        names: &["free"],
        header: "FREE",
        width: 10,
        left: false,
    },
    PoolColumn {
        names: &["cap", "capacity"],
        header: "CAP",
        width: 5,
        left: false,
    },
    PoolColumn {
        names: &["health"],
        header: "HEALTH",
        width: 9,
        left: false,
    },
    PoolColumn {
        names: &["txg"],
        header: "TXG",
        width: 8,
        left: false,
    },
];

/// The columns `oxpool list` shows without `-o`.
pub const POOL_DEFAULT_COLUMNS: &str = "name,size,alloc,free,health,txg";

/// The pool listing's columns `-o` names (as `zpool list -o name,size`), as indexes into a
/// row's fields; an unknown one is refused with the names there are.
pub fn parse_pool_columns(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|c| {
            POOL_COLUMNS
                .iter()
                .position(|col| col.names.contains(&c))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown pool column '{c}': name, size, alloc, free, cap, health, txg \
                         (a dataset's columns with -t TYPE, -r, or a POOL/VOL named)"
                    )
                })
        })
        .collect()
}

/// One line of the pool listing: `fields` (all of a row's) at `columns`, as `zpool list`
/// lays them out, or tab-separated when `scripted`.
fn pool_line(fields: &[String], columns: &[usize], scripted: bool) -> String {
    let picked = columns
        .iter()
        .map(|&c| (&POOL_COLUMNS[c], fields[c].as_str()));
    if scripted {
        return picked.map(|(_, f)| f).collect::<Vec<_>>().join("\t");
    }
    picked
        .map(|(col, f)| match col.left {
            true => format!("{f:<w$}", w = col.width),
            false => format!("{f:>w$}", w = col.width),
        })
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end()
        .to_string()
}

/// The header of `oxpool list` with `columns` (`-o`).
pub fn list_header(con: &mut dyn Console, columns: &str) -> Result<()> {
    let columns = parse_pool_columns(columns)?;
    let headers: Vec<String> = POOL_COLUMNS.iter().map(|c| c.header.to_string()).collect();
    writeln!(con.out(), "{}", pool_line(&headers, &columns, false))?;
    Ok(())
}

/// `oxpool list [-H] [-p] [-o COLUMNS] [POOL...]`.
pub fn list(
    host: &Host,
    con: &mut dyn Console,
    scripted: bool,
    exact: bool,
    no_header: bool,
    columns: &str,
    named: &[String],
) -> Result<()> {
    let picked = parse_pool_columns(columns)?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for name in listed(host, named)? {
        let fields = match host.with_pool(&name, |p| Ok(p.status())) {
            Ok(s) => [
                s.name.clone(),
                size(s.size_bytes, exact),
                size(s.allocated_bytes, exact),
                size(s.size_bytes - s.allocated_bytes, exact),
                format!(
                    "{}%",
                    s.allocated_bytes.saturating_mul(100) / s.size_bytes.max(1)
                ),
                s.state.clone(),
                s.txg.to_string(),
            ],
            // A pool this machine knows but cannot open is listed UNAVAIL, as `zpool list`
            // lists it; `oxpool status` says why.
            Err(e) => match unavailable(host, &name, e) {
                Ok(_) => {
                    let mut fields = ["-"; 7].map(String::from);
                    fields[0] = name.clone();
                    fields[5] = "UNAVAIL".to_string();
                    fields
                }
                Err(e) => {
                    failed.push(e);
                    continue;
                }
            },
        };
        rows.push(fields);
    }
    // As `zpool list`: the pools it can list (with the header only if there are some), then
    // why it could not list the others.
    if !scripted && !no_header && !rows.is_empty() {
        list_header(con, columns)?;
    }
    for fields in rows {
        writeln!(con.out(), "{}", pool_line(&fields, &picked, scripted))?;
    }
    last_of(con, failed)
}

/// Ok if `failed` is empty; else every error but the last on `con`'s error stream, as `main`
/// prints one, and the last returned (the command exits 1).
pub fn last_of(con: &mut dyn Console, mut failed: Vec<anyhow::Error>) -> Result<()> {
    let Some(last) = failed.pop() else {
        return Ok(());
    };
    for e in failed {
        writeln!(con.err(), "oxpool: {e:#}")?;
    }
    Err(last)
}

/// `oxpool history [-l] POOL`'s lines for one pool, as `zpool history` prints them: a
/// heading, then one line per record (`2026-12-02.16:10:05 oxpool snapshot tank/vol0@mon`),
/// then a blank line. A chunk that could not be read fails the command after the rest is
/// printed, naming it.
pub fn print_history(
    con: &mut dyn Console,
    pool: &str,
    listing: &oxpool_engine::HistoryListing,
    long: bool,
) -> Result<()> {
    writeln!(con.out(), "History for '{pool}':")?;
    for r in &listing.records {
        let when =
            crate::display::date_as(r.time_s.saturating_mul(1_000_000_000), c"%Y-%m-%d.%H:%M:%S");
        if long {
            let user = user_name(r.uid).map_or(String::new(), |n| format!(" ({n})"));
            // A record not yet written has no txg: it waits for the next sync.
            let txg = match r.txg.0 {
                0 => "not yet synced".to_string(),
                t => format!("txg {t}"),
            };
            writeln!(
                con.out(),
                "{when} {} [user {}{user} on {}, {txg}]",
                printable(&r.line),
                r.uid,
                printable(&r.host)
            )?;
        } else {
            writeln!(con.out(), "{when} {}", printable(&r.line))?;
        }
    }
    writeln!(con.out())?;
    if listing.dropped > 0 {
        writeln!(
            con.err(),
            "oxpool: {} record(s) of '{pool}' were dropped before a sync could write them",
            listing.dropped
        )?;
    }
    if let Some(first) = listing.unreadable.first() {
        bail!(
            "pool '{pool}': {} part(s) of the history could not be read, their records are \
             missing above: {first}",
            listing.unreadable.len()
        );
    }
    Ok(())
}

/// `s` with its control characters escaped (`\n`, `\u{1b}`): a record is one line, and
/// one read from a pool made elsewhere sends no escape sequence to the terminal.
fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// The name of user `uid`, if the system knows it.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: getpwuid_r writes into the passwd and the buffer we own (its length given);
    // `found` is either null or points at `pw`, whose strings point into `buf`, read before
    // either is dropped.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found);
        if rc != 0 || found.is_null() || pw.pw_name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// `oxpool status [POOL...]`.
pub fn status(
    host: &Host,
    con: &mut dyn Console,
    named: &[String],
    verbose: bool,
    unhealthy_only: bool,
) -> Result<()> {
    let names = listed(host, named)?;
    if names.is_empty() {
        writeln!(con.out(), "no pools available")?;
    }
    for name in names {
        match host.with_pool(&name, |p| Ok(p.status())) {
            Ok(s) if unhealthy_only && healthy(&s) => {}
            Ok(mut s) => {
                super::unavailable::explain_not_found(&mut s);
                // With no server, a scan advances only while a command has the pool open:
                // said, or a resilver "in progress" at 0.09% across commands looks stuck (a
                // new user).
                let scanning = s.scan.as_ref().filter(|c| c.state == ScanState::Scanning);
                if let (Host::Local { .. }, Some(scan)) = (host, scanning) {
                    let also = match scan.kind {
                        ScanKind::Scrub => format!(", or `oxpool scrub -w {name}` here"),
                        _ => String::new(),
                    };
                    s.reasons.push(format!(
                        "no server has the pool open, so the {} advances only while a command \
                         does: `oxpool serve` carries it on{also}",
                        scan.kind.as_str()
                    ));
                }
                print_status(con.out(), &s, verbose)?
            }
            Err(e) => print_unavailable(con.out(), &name, &unavailable(host, &name, e)?)?,
        }
    }
    Ok(())
}

/// Whether `status -x` passes over a pool, as `zpool status -x` does one with nothing to
/// act on: ONLINE with no reason given, no device (data, log, its children) with errors or
/// not ONLINE, no damaged data, no resilver running, every spare available or in use.
fn healthy(s: &oxpool_engine::PoolStatus) -> bool {
    fn clean(v: &oxpool_engine::VdevStatus) -> bool {
        v.state == "ONLINE"
            && v.read_errors == 0
            && v.write_errors == 0
            && v.checksum_errors == 0
            && v.children.iter().all(clean)
    }
    let resilvering = s
        .scan
        .as_ref()
        .is_some_and(|c| c.kind == ScanKind::Resilver && c.state == ScanState::Scanning);
    s.state == "ONLINE"
        && s.reasons.is_empty()
        && s.vdevs.iter().chain(&s.logs).all(clean)
        && s.damaged.is_empty()
        && s.damaged_unnamed_blocks == 0
        && !resilvering
        && s.spares.iter().all(|sp| sp.state != "UNAVAIL")
}

/// `oxpool scrub [-w | -s | -p] POOL`.
pub fn scrub(
    host: &Host,
    con: &mut dyn Console,
    name: &str,
    wait: bool,
    stop: bool,
    pause: bool,
) -> Result<()> {
    if stop {
        return host.change_pool(name, |pool| Ok(pool.scrub_cancel()?));
    }
    if pause {
        return host.change_pool(name, |pool| Ok(pool.scrub_pause()?));
    }
    match host {
        // No server to carry it on: with -w this command runs it to its end; without, it
        // continues at the next imports (its position is persisted).
        Host::Local { .. } => host.change_pool(name, |pool| {
            // The import resumed a scrub the pool recorded: that one is the scrub asked for.
            let running = pool
                .scan_status()
                .is_some_and(|s| s.kind == ScanKind::Scrub && s.state == ScanState::Scanning);
            if !running {
                pool.scrub_start()?;
            }
            if wait {
                return wait_for_scan(con, pool);
            }
            writeln!(
                con.out(),
                "scrub of {name} started; it goes on whenever the pool is open \
                 (oxpool scrub -w {name} runs it to its end)"
            )?;
            Ok(())
        }),
        Host::Live(served) => {
            host.change_pool(name, |pool| Ok(pool.scrub_start()?))?;
            if !wait {
                return Ok(());
            }
            // Not under the pool's lock: waiting must not hold up other changes.
            let pool = served.pool(name)?;
            wait_for_scan(con, &pool.pool)
        }
    }
}

/// Shows the running scan's progress until it ends or pauses (or whoever asked is gone: it
/// goes on), then what it found.
pub(crate) fn wait_for_scan(con: &mut dyn Console, pool: &Pool) -> Result<()> {
    // Bounded: the scan ends, or the client leaves.
    let status = loop {
        let Some(s) = pool.scan_status() else {
            bail!("no scrub or resilver of pool '{}'", pool.name());
        };
        if s.state != ScanState::Scanning {
            break s;
        }
        let label = format!("{} {}", s.kind.as_str(), pool.name());
        con.progress(&label, s.issued_bytes, s.total_bytes);
        if con.gone() {
            return Ok(());
        }
        pool.scan_wait(SCRUB_PROGRESS_INTERVAL);
    };
    con.progress_end();
    let c = status.counts;
    let kind = status.kind.as_str();
    writeln!(
        con.out(),
        "{kind} of {}: {} blocks visited, {} copies checked, {} bad, {} repaired, {} blocks lost",
        pool.name(),
        status.blocks_visited,
        c.copies_checked,
        c.copies_bad,
        c.copies_repaired,
        c.blocks_lost
    )?;
    print_status(con.out(), &pool.status(), false)?;
    match (status.state, status.error) {
        (ScanState::Canceled, Some(e)) => bail!("{kind} of {} stopped: {e}", pool.name()),
        (ScanState::Canceled, None) => bail!("{kind} of {} was canceled", pool.name()),
        (ScanState::Paused, _) => bail!("{kind} of {} was paused", pool.name()),
        _ if c.blocks_lost == 1 => bail!("1 block has no good copy"),
        _ if c.blocks_lost > 0 => bail!("{} blocks have no good copy", c.blocks_lost),
        _ => Ok(()),
    }
}

/// How `--size` and `--sparse` say missing device files are made.
fn new_files(size: Option<&str>, sparse: bool) -> Result<Option<NewFiles>> {
    Ok(match size {
        Some(s) => {
            let size_bytes = parse_size("--size", s)?;
            if size_bytes == 0 {
                bail!("--size must be more than 0");
            }
            Some(NewFiles { size_bytes, sparse })
        }
        None if sparse => bail!("--sparse needs --size: it says how missing files are created"),
        None => None,
    })
}

/// The parity of a raidz group keyword: `raidz` and `raidz1` are 1, `raidz2` 2, `raidz3` 3
/// (as `zpool`).
fn raidz_parity(word: &str) -> Option<u8> {
    match word {
        "raidz" | "raidz1" => Some(1),
        "raidz2" => Some(2),
        "raidz3" => Some(3),
        _ => None,
    }
}

/// The vdev words before the keyword `spare` and the hot spares after it (as `zpool
/// create`'s last class). Refused: `spare` with no device, and a keyword among the spares.
fn split_spares(words: &[String]) -> Result<(&[String], &[String])> {
    let Some(at) = words.iter().position(|w| w == "spare") else {
        return Ok((words, &[]));
    };
    let spares = &words[at + 1..];
    if spares.is_empty() {
        bail!("spare needs devices");
    }
    if let Some(w) = spares.iter().find(|w| is_keyword(w)) {
        bail!("{w} after spare: the hot spares come last, single devices");
    }
    Ok((&words[..at], spares))
}

/// Whether `word` is a vdev keyword of `zpool create` rather than a path.
fn is_keyword(word: &str) -> bool {
    matches!(
        word,
        "log" | "mirror" | "spare" | "cache" | "special" | "dedup"
    ) || raidz_parity(word).is_some()
}

/// Opens (with `create`, creates) each of `paths`, kept in `devs`.
fn open_all(
    con: &dyn Console,
    paths: &[String],
    create: Option<NewFiles>,
    devs: &mut Devices,
) -> Result<Vec<Arc<dyn oxpool_io::Backend>>> {
    paths
        .iter()
        .map(|p| {
            let d = open_device(&con.path(Path::new(p)), create)?;
            let backend = d.backend();
            devs.push(d);
            Ok(backend)
        })
        .collect()
}

/// Parses `[mirror|raidz[1-3]] PATH... [mirror|raidz[1-3] PATH...] [log [mirror] PATH...]`
/// into top-level vdevs, opening (and with `create`, creating) the devices.
fn parse_vdevs(
    con: &dyn Console,
    words: &[String],
    create: Option<NewFiles>,
    devs: &mut Devices,
) -> Result<Vec<TopSpec>> {
    let mut tops = Vec::new();
    let mut log = false;
    let mut i = 0;
    let open = |p: &str, devs: &mut Devices| -> Result<_> {
        let d = open_device(&con.path(Path::new(p)), create)?;
        let backend = d.backend();
        devs.push(d);
        Ok(backend)
    };
    // Bounded: every round consumes at least one word.
    while i < words.len() {
        match words[i].as_str() {
            "log" => {
                log = true;
                i += 1;
            }
            class @ ("cache" | "special" | "dedup") => {
                bail!("{class} vdevs are not supported (oxpool has data, log and spare devices)")
            }
            group @ ("mirror" | "raidz" | "raidz1" | "raidz2" | "raidz3") => {
                let start = i + 1;
                let mut end = start;
                while end < words.len() && !is_keyword(&words[end]) {
                    end += 1;
                }
                if let Some(parity) = raidz_parity(group) {
                    if log {
                        bail!("a log device is a single device or a mirror, not {group}");
                    }
                    // The engine checks the width (the fewest devices it allows) before any
                    // device is written.
                    if end == start {
                        bail!("{group} needs devices");
                    }
                    let mut group = Vec::new();
                    for p in &words[start..end] {
                        group.push(open(p, devs)?);
                    }
                    tops.push(TopSpec::raidz(parity, group));
                    i = end;
                    continue;
                }
                if end - start < 2 {
                    bail!("a mirror needs at least two devices");
                }
                let mut group = Vec::new();
                for p in &words[start..end] {
                    group.push(open(p, devs)?);
                }
                tops.push(TopSpec {
                    log,
                    kind: TopVdevKind::Mirror,
                    devices: group,
                });
                i = end;
            }
            path => {
                tops.push(TopSpec {
                    log,
                    kind: TopVdevKind::Single,
                    devices: vec![open(path, devs)?],
                });
                i += 1;
            }
        }
    }
    Ok(tops)
}
