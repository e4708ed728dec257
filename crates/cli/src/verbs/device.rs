//! The device verbs: `offline`, `online`, `clear`, and `inject` (fault injection, as ZFS's
//! `zinject`, whose rules `inject_file.rs` keeps).

use crate::console::Console;
use crate::devices::open_device;
use crate::host::Host;
use crate::inject_file::{self, SavedRule};
use anyhow::{anyhow, bail, Result};
use oxpool_engine::cachefile;
use oxpool_engine::vdev::{InjectKind, InjectOps, InjectRule};
use oxpool_engine::Pool;
use oxpool_format::Guid;
use std::path::Path;

/// The names a device argument may stand for, most literal first: as given, then the
/// canonical path of what it names relative to the command's directory (pools know their
/// devices by canonical path).
fn device_candidates(con: &dyn Console, device: &str) -> Vec<String> {
    let mut out = vec![device.to_string()];
    if let Ok(p) = std::fs::canonicalize(con.path(Path::new(device))) {
        let p = p.display().to_string();
        if p != device {
            out.push(p);
        }
    }
    out
}

/// The pool's name for the present device `device` names (see [`device_candidates`]).
fn resolve(pool: &Pool, con: &dyn Console, device: &str) -> Result<String> {
    resolve_with(con, device, |c| Ok(pool.device(c)?.1))
}

/// As [`resolve`], for a device present or not: an UNAVAIL one resolves to the path the pool
/// recorded for it.
fn resolve_member(pool: &Pool, con: &dyn Console, device: &str) -> Result<String> {
    resolve_with(con, device, |c| Ok(pool.member_path(c)?))
}

/// The first of `device`'s candidates that `lookup` knows, or the first candidate's error.
fn resolve_with(
    con: &dyn Console,
    device: &str,
    lookup: impl Fn(&str) -> Result<String>,
) -> Result<String> {
    let mut first_err = None;
    for c in device_candidates(con, device) {
        match lookup(&c) {
            Ok(name) => return Ok(name),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(first_err.expect("at least one candidate"))
}

/// `oxpool offline [-t] POOL DEVICE`.
pub fn offline(
    host: &Host,
    con: &mut dyn Console,
    pool: &str,
    device: &str,
    temporary: bool,
) -> Result<()> {
    if temporary && matches!(host, Host::Local { .. }) {
        bail!(
            "-t: no server serves pool '{pool}', so a temporary offline would end with this \
             command; take it offline without -t, or serve the pool first"
        );
    }
    host.change_pool(pool, |p| {
        let d = resolve(p, con, device)?;
        Ok(p.offline(&d, temporary)?)
    })
}

/// `oxpool online [-w] POOL DEVICE`.
pub fn online(
    host: &Host,
    con: &mut dyn Console,
    pool: &str,
    device: &str,
    wait: bool,
) -> Result<()> {
    match host {
        // No server to carry the resilver on: with -w it ends in this command, else at
        // the next imports (it is persisted).
        Host::Local { .. } => host.change_pool(pool, |p| {
            let d = resolve(p, con, device)?;
            p.online(&d)?;
            if wait {
                super::pool::wait_for_scan(con, p)?;
            }
            warn_if_still_out(con, p, &d)
        }),
        Host::Live(served) => {
            let d = host.change_pool(pool, |p| {
                let d = resolve(p, con, device)?;
                p.online(&d)?;
                Ok(d)
            })?;
            // Not under the pool's lock: waiting must not hold up other changes.
            let served = served.pool(pool)?;
            if wait {
                super::pool::wait_for_scan(con, &served.pool)?;
            }
            warn_if_still_out(con, &served.pool, &d)
        }
    }
}

/// As `zpool online`: a device returned to service that failed again at once (its resilver
/// could not write it, say) is left FAULTED by the fault rule; the command says so rather
/// than end as if it had worked.
fn warn_if_still_out(con: &mut dyn Console, p: &Pool, device: &str) -> Result<()> {
    fn find<'a>(
        v: &'a oxpool_engine::VdevStatus,
        name: &str,
    ) -> Option<&'a oxpool_engine::VdevStatus> {
        if v.name == name && v.children.is_empty() {
            return Some(v);
        }
        v.children.iter().find_map(|c| find(c, name))
    }
    let s = p.status();
    let leaf = s.vdevs.iter().chain(&s.logs).find_map(|v| find(v, device));
    if let Some(v) = leaf.filter(|v| !matches!(v.state.as_str(), "ONLINE" | "DEGRADED")) {
        writeln!(
            con.err(),
            "warning: {device} was returned to service but is {}{}; `oxpool replace {} {device} \
             NEW` replaces a device that no longer works",
            v.state,
            v.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            p.name()
        )?;
    }
    Ok(())
}

/// `oxpool clear POOL [DEVICE]`.
pub fn clear(host: &Host, con: &mut dyn Console, pool: &str, device: Option<&str>) -> Result<()> {
    host.change_pool(pool, |p| {
        let d = device.map(|d| resolve(p, con, d)).transpose()?;
        p.clear(d.as_deref())?;
        if d.is_none() {
            // The counts kept of devices missing now are cleared too.
            crate::errors_file::keep_cleared(host.cache(), p)?;
        }
        Ok(())
    })
}

/// What `oxpool inject -d` was asked to do.
pub struct InjectSpec<'a> {
    /// `-e`: `io` or `corrupt`.
    pub error: Option<&'a str>,
    /// `-D`: added latency, milliseconds.
    pub delay_ms: Option<u32>,
    /// `-T`: read, write, flush, all.
    pub ops: Option<&'a str>,
    /// `-f`: percentage of the I/Os hit.
    pub frequency: Option<f64>,
}

impl InjectSpec<'_> {
    /// The rule (its id and device left for the caller).
    fn rule(&self) -> Result<InjectRule> {
        let kind = match (self.error, self.delay_ms) {
            (_, Some(ms)) => InjectKind::Delay { delay_ms: ms },
            (None | Some("io"), None) => InjectKind::Io,
            (Some("corrupt"), None) => InjectKind::Corrupt,
            (Some(other), None) => bail!("-e {other}: expected io or corrupt"),
        };
        let ops = match self.ops {
            Some(o) => InjectOps::parse(o)
                .ok_or_else(|| anyhow!("-T {o}: expected read, write, flush or all"))?,
            None if kind == InjectKind::Corrupt => InjectOps::Read,
            None => InjectOps::All,
        };
        let percent = self.frequency.unwrap_or(100.0);
        if !(percent > 0.0 && percent <= 100.0) {
            bail!("-f {percent}: a percentage above 0 and at most 100");
        }
        let rule = InjectRule {
            id: 0,
            device: Guid(0),
            kind,
            ops,
            frequency_ppm: ((percent * 10_000.0).round() as u32).max(1),
        };
        rule.validate().map_err(|e| anyhow!(e))?;
        Ok(rule)
    }
}

/// How `oxpool inject` shows a rule's kind.
fn kind_name(kind: InjectKind) -> String {
    match kind {
        InjectKind::Io => "io".into(),
        InjectKind::Corrupt => "corrupt".into(),
        InjectKind::Delay { delay_ms } => format!("delay {delay_ms}ms"),
    }
}

fn percent(ppm: u32) -> String {
    let p = f64::from(ppm) / 10_000.0;
    if p.fract() == 0.0 {
        format!("{p:.0}%")
    } else {
        format!("{p}%")
    }
}

/// The device of the exported pool `pool` (known to the cache file) that `device` names:
/// the pool's guid, the device's guid and path, from the devices' labels.
fn exported_device(
    cache: &Path,
    con: &dyn Console,
    pool: &str,
    device: &str,
) -> Result<(u64, Guid, String)> {
    let entry = cachefile::read(cache)?
        .into_iter()
        .find(|p| p.name == pool)
        .ok_or_else(|| {
            anyhow!(
                "pool '{pool}' not found (not in {}; try `oxpool import`)",
                cache.display()
            )
        })?;
    let candidates = device_candidates(con, device);
    let mut by_name = Vec::new();
    for path in &entry.devices {
        let p = path.display().to_string();
        let named = candidates.iter().any(|c| {
            *c == p || (!c.contains('/') && path.file_name().is_some_and(|f| f == c.as_str()))
        });
        // A guid names a device only through its label: every device is read then.
        let hex_guid = u64::from_str_radix(device, 16).is_ok();
        if !named && !hex_guid {
            continue;
        }
        let dev = open_device(path, None)?;
        let label = crate::devices::label(dev.backend().as_ref())?;
        if label.pool_guid.0 != entry.guid {
            continue;
        }
        if named || format!("{:x}", label.leaf_guid.0) == device {
            by_name.push((label.leaf_guid, p));
        }
    }
    match by_name.as_slice() {
        [(guid, path)] => Ok((entry.guid, *guid, path.clone())),
        [] => bail!("device '{device}' in pool '{pool}'"),
        several => bail!(
            "'{device}' names {} devices of pool '{pool}': give the path",
            several.len()
        ),
    }
}

/// `oxpool inject -d DEVICE [-e io|corrupt | -D MS] [-T TYPE] [-f PERCENT] POOL`.
pub fn inject_add(
    host: &Host,
    con: &mut dyn Console,
    pool: &str,
    device: &str,
    spec: InjectSpec<'_>,
) -> Result<()> {
    let mut rule = spec.rule()?;
    let cache = host.cache();
    let (pool_guid, device_path) = match host {
        Host::Local { .. } => {
            let (pool_guid, guid, path) = exported_device(cache, con, pool, device)?;
            rule.device = guid;
            (pool_guid, path)
        }
        Host::Live(_) => host.with_pool(pool, |p| {
            let name = resolve(p, con, device)?;
            rule.device = p.device(&name)?.0;
            Ok((p.guid().0, name))
        })?,
    };
    let id = inject_file::update(cache, |all| {
        // Unique across the machine's pools: `oxpool inject -c ID` needs no pool.
        rule.id = all.take_id();
        if let Host::Live(_) = host {
            host.with_pool(pool, |p| Ok(p.inject_add(rule.clone())?))?;
        }
        all.rules.push(SavedRule {
            pool: pool.to_string(),
            pool_guid,
            rule: rule.clone(),
            device_path: device_path.clone(),
        });
        Ok(rule.id)
    })?;
    writeln!(
        con.out(),
        "injection rule {id}: {} on {} of {device_path}, {} of them{}",
        kind_name(rule.kind),
        rule.ops.as_str(),
        percent(rule.frequency_ppm),
        match host {
            Host::Local { .. } => " (from when the pool is next opened)",
            Host::Live(_) => "",
        }
    )?;
    Ok(())
}

/// The header of the rules' listing.
pub fn inject_header(con: &mut dyn Console) -> Result<()> {
    writeln!(
        con.out(),
        "{:>4}  {:<16} {:<40} {:<12} {:<6} {:>8} {:>8}",
        "ID",
        "POOL",
        "DEVICE",
        "TYPE",
        "OPS",
        "FREQ",
        "HITS"
    )?;
    Ok(())
}

/// `oxpool inject POOL`: the rules of POOL, with the I/Os each hit (while it is served).
pub fn inject_list(host: &Host, con: &mut dyn Console, pool: &str, no_header: bool) -> Result<()> {
    let rows: Vec<(InjectRule, String, Option<u64>)> = match host {
        Host::Local { cache } => inject_file::rules(cache)?
            .into_iter()
            .filter(|s| s.pool == pool)
            .map(|s| (s.rule, s.device_path, None))
            .collect(),
        Host::Live(_) => host.with_pool(pool, |p| {
            Ok(p.inject_rules()
                .into_iter()
                .map(|(dev, r)| (r.rule, dev, Some(r.hits)))
                .collect())
        })?,
    };
    if !no_header {
        inject_header(con)?;
    }
    for (rule, device, hits) in rows {
        writeln!(
            con.out(),
            "{:>4}  {:<16} {:<40} {:<12} {:<6} {:>8} {:>8}",
            rule.id,
            pool,
            device,
            kind_name(rule.kind),
            rule.ops.as_str(),
            percent(rule.frequency_ppm),
            hits.map_or("-".to_string(), |h| h.to_string())
        )?;
    }
    Ok(())
}

/// `oxpool inject -c ID|all POOL`.
pub fn inject_clear(host: &Host, con: &mut dyn Console, pool: &str, which: &str) -> Result<()> {
    let id = match which {
        "all" => None,
        n => Some(
            n.parse::<u64>()
                .map_err(|_| anyhow!("-c {n}: expected a rule id or all"))?,
        ),
    };
    let removed = inject_file::update(host.cache(), |all| {
        let before = all.rules.len();
        all.rules
            .retain(|s| !(s.pool == pool && id.is_none_or(|id| s.rule.id == id)));
        let from_file = before - all.rules.len();
        let live = match host {
            Host::Local { .. } => from_file,
            Host::Live(_) => host.with_pool(pool, |p| Ok(p.inject_clear(id)))?,
        };
        Ok(from_file.max(live))
    })?;
    if let (Some(id), 0) = (id, removed) {
        bail!("no injection rule {id} on pool '{pool}'");
    }
    writeln!(
        con.out(),
        "removed {removed} injection rule{}",
        if removed == 1 { "" } else { "s" }
    )?;
    Ok(())
}

/// Opens the device at `path` (relative to the command's directory) to join `pool`
/// (`swapped`: it may be at the path of the device it replaces).
fn open_new(
    pool: &Pool,
    con: &dyn Console,
    path: &str,
    swapped: bool,
    devs: &mut crate::devices::Devices,
) -> Result<std::sync::Arc<dyn oxpool_io::Backend>> {
    // Before opening it: the pool's own open device would answer "in use" (named as the
    // pool names it, through a link, or as a second hard link).
    if !swapped {
        super::pool::refuse_pool_device(pool, con, path)?;
    }
    let file = con.path(Path::new(path));
    if !file.exists() {
        // attach and replace take no --size (open_device's hint): the device must exist.
        bail!(
            "{}: no such file (attach and replace take an existing device; create it first, \
             e.g. `truncate -s SIZE {}`)",
            file.display(),
            file.display()
        );
    }
    let d = match open_device(&file, None) {
        Ok(d) => d,
        // The file at the replaced device's own path, locked: by the pool itself, which
        // still has it open when it was overwritten in place rather than swapped for a new
        // file (a new user zeroed a raidz member with dd and replaced it at its path).
        Err(e) if swapped && e.downcast_ref::<crate::devices::InUse>().is_some() => bail!(
            "{path} is in use, most likely by this pool, whose device it still is: a file \
             overwritten in place is the same file. A replace at the same path needs a new \
             file there (move the old one away, create the new one at {path}, then replace \
             again), or give NEW (`oxpool replace {} {path} NEW`)",
            pool.name()
        ),
        Err(e) => return Err(e),
    };
    let backend = d.backend();
    devs.push(d);
    Ok(backend)
}

/// Runs `change` (which adds a device to pool `pool`) and, when asked or when no server
/// carries the resilver on, waits for it with a progress line.
fn with_new_device(
    host: &Host,
    con: &mut dyn Console,
    pool: &str,
    wait: bool,
    change: impl FnOnce(&Pool, &dyn Console, &mut crate::devices::Devices) -> Result<()>,
) -> Result<()> {
    match host {
        // No server to carry it on: this command resilvers to the end (an export in the
        // middle would only postpone it to the next import).
        Host::Local { .. } => host.change_pool(pool, |p| {
            let mut devs = crate::devices::Devices::default();
            change(p, con, &mut devs)?;
            wait_for_resilver(con, p)
        }),
        Host::Live(served) => {
            host.change_served_pool(pool, |p, sp| {
                let mut devs = crate::devices::Devices::default();
                change(p, con, &mut devs)?;
                if let Some(sp) = sp {
                    sp.keep_devices(devs);
                }
                crate::host::remember(host.cache(), p)?;
                Ok(())
            })?;
            if !wait {
                return Ok(());
            }
            // Not under the pool's lock: waiting must not hold up other changes.
            let p = served.pool(pool)?;
            wait_for_resilver(con, &p.pool)
        }
    }
}

/// Shows the resilver's progress until no device is left to resilver (or whoever asked is
/// gone: it goes on), then the pool's status.
fn wait_for_resilver(con: &mut dyn Console, pool: &Pool) -> Result<()> {
    let label = format!("resilver {}", pool.name());
    // Bounded: the scan ends, or the client leaves.
    loop {
        let scanning = pool
            .scan_status()
            .filter(|s| s.state == oxpool_engine::ScanState::Scanning);
        match scanning {
            Some(s) => con.progress(&label, s.issued_bytes, s.total_bytes),
            None if !pool.resilvering() => break,
            None => {
                con.progress_end();
                let why = pool
                    .scan_status()
                    .and_then(|s| s.error)
                    .unwrap_or_else(|| "it did not repair every block".to_string());
                bail!(
                    "the resilver of {} ended without finishing: {why}; see `oxpool status {}`",
                    pool.name(),
                    pool.name()
                );
            }
        }
        if con.gone() {
            return Ok(());
        }
        pool.scan_wait(std::time::Duration::from_millis(500));
    }
    con.progress_end();
    crate::display::print_status(con.out(), &pool.status(), false)?;
    Ok(())
}

/// `oxpool attach [-f] [-w] POOL DEVICE NEW`.
pub fn attach(
    host: &Host,
    con: &mut dyn Console,
    pool: &str,
    device: &str,
    new: &str,
    force: bool,
    wait: bool,
) -> Result<()> {
    let words = [new.to_string()];
    super::pool::refuse_devices_of_imported(host.cache(), con, &words, Some(pool))?;
    with_new_device(host, con, pool, wait, |p, con, devs| {
        let d = resolve(p, con, device)?;
        let backend = open_new(p, con, new, false, devs)?;
        Ok(p.attach(&d, backend, force)?)
    })
}

/// `oxpool detach POOL DEVICE`.
pub fn detach(host: &Host, con: &mut dyn Console, pool: &str, device: &str) -> Result<()> {
    host.change_pool(pool, |p| {
        let d = resolve(p, con, device).unwrap_or_else(|_| device.to_string());
        p.detach(&d)?;
        crate::host::remember(host.cache(), p)?;
        Ok(())
    })
}

/// `oxpool replace [-f] [-w] POOL OLD [NEW]`.
pub fn replace(
    host: &Host,
    con: &mut dyn Console,
    pool: &str,
    old: &str,
    new: Option<&str>,
    force: bool,
    wait: bool,
) -> Result<()> {
    let words: Vec<String> = new.iter().map(|n| n.to_string()).collect();
    super::pool::refuse_devices_of_imported(host.cache(), con, &words, Some(pool))?;
    with_new_device(host, con, pool, wait, |p, con, devs| {
        // An absent device (UNAVAIL) is named by the path the pool recorded for it, also by
        // its file name alone.
        let o = resolve_member(p, con, old)?;
        let backend = match new {
            Some(new) => open_new(p, con, new, false, devs)?,
            // Without NEW, the device at OLD's path was swapped for a new one.
            None => open_swapped(p, con, &o, devs)?,
        };
        Ok(p.replace(&o, backend, force)?)
    })
}

/// The new device at `path`, the path of the pool's device that `oxpool replace POOL OLD`
/// names: refused while the file there still has that pool's label, i.e. it is the old
/// device itself, not a new one swapped in at its place (opening it would only say "in use",
/// since the pool holds it).
fn open_swapped(
    pool: &Pool,
    con: &dyn Console,
    path: &str,
    devs: &mut crate::devices::Devices,
) -> Result<std::sync::Arc<dyn oxpool_io::Backend>> {
    let file = con.path(Path::new(path));
    // Opened without its lock, to read the label only.
    if let Ok(backend) = oxpool_io::FileBackend::open(&file, None) {
        if crate::devices::label(&backend).is_ok_and(|l| l.pool_guid == pool.guid()) {
            bail!(
                "{path} still has pool '{}''s label: it is the device itself, not a new one \
                 swapped in at its path; give NEW (`oxpool replace {} {path} NEW`), or \
                 `oxpool online` it if it came back",
                pool.name(),
                pool.name()
            );
        }
    }
    open_new(pool, con, path, true, devs)
}

/// `oxpool remove POOL DEVICE`: an unused hot spare, or a log device (a log mirror by its
/// name).
pub fn remove(host: &Host, con: &mut dyn Console, pool: &str, device: &str) -> Result<()> {
    host.change_pool(pool, |p| {
        let mut candidates = device_candidates(con, device).into_iter();
        let first = candidates.next().expect("at least one candidate");
        let result = p.remove(&first);
        // Another name of the device only if this one named nothing: a refused removal of
        // a log device has run its syncs already.
        let result = match result {
            Err(e @ oxpool_engine::EngineError::NotFound(_)) => {
                candidates.find_map(|c| p.remove(&c).ok()).ok_or(e)
            }
            ok => ok,
        };
        result?;
        crate::host::remember(host.cache(), p)?;
        Ok(())
    })
}
