//! `oxpool send` and `oxpool recv`, as `zfs send` and `zfs recv` for volumes: a snapshot as
//! a stream on standard output (full, `-i @BASE` or `-i #BOOKMARK` incremental, `-I @BASE` every snapshot in
//! between; `-n -v` the size without sending), and a stream from standard input into a
//! volume (`-F` rolls back what the target did since the base, or lets a full stream replace
//! a volume without snapshots; `-u` leaves a received new
//! volume unexported). On a served pool both run in the server, the stream going through
//! the control socket; the server exports what it received.

use super::snapshot::snapshot_target;
use super::volume_target;
use crate::console::Console;
use crate::control::client::ask;
use crate::control::runtime::{Found, RuntimeDir};
use crate::display::size_with_unit;
use crate::host::Host;
use crate::served::Unexport;
use anyhow::{anyhow, bail, Result};
use oxpool_engine::{ReceiveOptions, Received, SendOptions, SendStats, SendWhat};
use oxpool_format::ResumeToken;
use std::cell::RefCell;

/// The flags of `oxpool send`.
pub struct SendFlags<'a> {
    /// `-t TOKEN`.
    pub token: Option<&'a str>,
    /// `-i @BASE`.
    pub incremental: Option<&'a str>,
    /// `-I @BASE`.
    pub intermediates: Option<&'a str>,
    /// `-n`.
    pub dry_run: bool,
    /// `-v`.
    pub verbose: bool,
    /// `-p`.
    pub parsable: bool,
}

/// The pool `send -t TOKEN` sends from when none is named, as `zfs send -t` needs none: the
/// only pool known, or of several the one holding a snapshot with the token's guid (its pool
/// asked through its server when one serves it). Pools that cannot be opened are passed
/// over, and named if no pool is found.
pub fn pool_of_token(host: &Host, runtime: &RuntimeDir, token: &str) -> Result<String> {
    let token: ResumeToken = token
        .parse()
        .map_err(|e| anyhow!("cannot resume send: {e}"))?;
    let mut known = host.known_pools()?;
    known.sort();
    match known.as_slice() {
        [one] => return Ok(one.clone()),
        [] => bail!("no pool is known here: import the pool that holds the token's snapshot"),
        _ => {}
    }
    let guid = token.toguid.0;
    let mut holding = Vec::new();
    let mut unreadable = Vec::new();
    for pool in &known {
        match pool_has_snapshot(host, runtime, pool, guid) {
            Ok(true) => holding.push(pool.as_str()),
            Ok(false) => {}
            // Why, in a few words: the first line of the error's last cause.
            Err(e) => {
                let why = format!("{:#}", e.root_cause());
                let why = why.lines().next().unwrap_or_default().to_string();
                unreadable.push(format!("{pool} ({why})"));
            }
        }
    }
    match (holding.as_slice(), unreadable.as_slice()) {
        ([one], _) => Ok(one.to_string()),
        ([], []) => bail!(
            "no pool known here ({}) holds the token's snapshot (guid {guid})",
            known.join(", ")
        ),
        ([], cannot) => bail!(
            "no pool that could be read holds the token's snapshot (guid {guid}); not read: {}",
            cannot.join(", ")
        ),
        (several, _) => bail!(
            "several pools hold the token's snapshot (guid {guid}: {}): name the one to send \
             from: oxpool send -t TOKEN POOL",
            several.join(", ")
        ),
    }
}

/// Whether pool `pool` has a snapshot whose guid is `guid`: asked of the server that serves
/// it (its snapshot list, as `list -t snapshot -H -o guid POOL` prints it), or read here.
fn pool_has_snapshot(host: &Host, runtime: &RuntimeDir, pool: &str, guid: u64) -> Result<bool> {
    match runtime.server_of(pool)? {
        Found::Server(socket, stream) => {
            let args = ["list", "-t", "snapshot", "-H", "-o", "guid", pool];
            let (code, out) = ask(stream, &socket, args.map(String::from).to_vec())?;
            if code != 0 {
                bail!("cannot list the snapshots of {pool}");
            }
            let want = guid.to_string();
            Ok(String::from_utf8_lossy(&out)
                .lines()
                .any(|l| l.trim() == want))
        }
        Found::None => host.with_pool(pool, |p| {
            Ok(p.all_snapshots().iter().any(|s| s.guid == guid))
        }),
    }
}

/// `oxpool send [-n] [-v] [-p] [-i @BASE | -I @BASE] POOL/VOL@SNAP`, or
/// `oxpool send [-n] [-v] [-p] -t TOKEN [POOL[/VOL]]`.
pub fn send(
    host: &Host,
    con: &mut dyn Console,
    snapshot: Option<&str>,
    flags: SendFlags,
) -> Result<()> {
    // The command line names the pool, or the client found it (`pool_of_token`) and passed
    // it on: a server never sees `send -t` without one.
    let Some(snapshot) = snapshot.map(str::to_string) else {
        bail!("name the pool that holds the token's snapshot: oxpool send -t TOKEN POOL");
    };
    if let Some(token) = flags.token {
        return send_resume(host, con, &snapshot, token, flags);
    }
    let snapshot = snapshot.as_str();
    let SendFlags {
        token: _,
        incremental,
        intermediates,
        dry_run,
        verbose,
        parsable,
    } = flags;
    let (pool_name, volume, snap) = snapshot_target(snapshot)?;
    let base = match (incremental, intermediates) {
        (Some(_), Some(_)) => bail!("give -i or -I, not both"),
        (Some(b), None) | (None, Some(b)) => Some(base_name(pool_name, volume, b)?),
        (None, None) => None,
    };
    let opts = SendOptions {
        base: base.clone(),
        intermediates: intermediates.is_some(),
        prefetch_bytes_max: 0,
    };
    host.with_pool(pool_name, |p| {
        // -p alone reports too, as `zfs send -P` does.
        if dry_run || verbose || parsable {
            let est = p.send_estimate(volume, snap, &opts)?;
            let what = match (&base, intermediates.is_some()) {
                (None, _) => "full".to_string(),
                (Some(b), false) => format!("incremental from {}", shown_base(b)),
                (Some(b), true) => format!("incremental from {}, every snapshot", shown_base(b)),
            };
            // Standard output carries the stream: the report goes to standard error.
            let report: &mut dyn std::io::Write = if dry_run { con.out() } else { con.err() };
            if parsable {
                let volume = format!("{pool_name}/{volume}");
                // As zfs: `-i`'s base by its whole name, `-I`'s streams each from the short
                // name of the one before.
                let base = base
                    .as_deref()
                    .map(|b| match (intermediates, b.starts_with('#')) {
                        (Some(_), _) => b.to_string(),
                        (None, true) => format!("{volume}{b}"),
                        (None, false) => format!("{volume}@{b}"),
                    });
                print_parsable_estimate(report, &volume, base, &est)?;
            } else {
                let plural =
                    |n: u64, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
                writeln!(
                    report,
                    "{} {pool_name}/{volume}@{snap} ({what}): {}, {}, {}",
                    if dry_run { "would send" } else { "sending" },
                    plural(est.streams, "stream"),
                    plural(est.data_records, "block"),
                    plural(est.free_records, "freed range"),
                )?;
                writeln!(
                    report,
                    "total estimated size is {}",
                    size_with_unit(est.stream_bytes, false)
                )?;
            }
            if dry_run {
                return Ok(());
            }
        }
        p.send(volume, snap, &opts, con.out())?;
        Ok(())
    })
}

/// `send -nvp`'s lines in `zfs send -nvP`'s form, for the scripts that read it: a line a
/// stream (`full`, the snapshot, its bytes; or `incremental`, its base (`base` for the
/// first, the short name of the one before for the others), the snapshot, its bytes), then
/// `size` and the total.
fn print_parsable_estimate(
    report: &mut dyn std::io::Write,
    volume: &str,
    base: Option<String>,
    est: &SendStats,
) -> Result<()> {
    let mut from = base;
    for leg in &est.legs {
        let to = format!("{volume}@{}", leg.snapshot);
        match &from {
            None => writeln!(report, "full\t{to}\t{}", leg.stream_bytes)?,
            Some(f) => writeln!(report, "incremental\t{f}\t{to}\t{}", leg.stream_bytes)?,
        }
        from = Some(leg.snapshot.clone());
    }
    writeln!(report, "size\t{}", est.stream_bytes)?;
    Ok(())
}

/// `oxpool send -t TOKEN [POOL[/VOL]]`: the rest of the stream an interrupted `recv -s`
/// stopped in. The volume is needed only when several volumes of the pool hold the token's
/// snapshot guid (copies made within the pool).
fn send_resume(
    host: &Host,
    con: &mut dyn Console,
    target: &str,
    token: &str,
    flags: SendFlags,
) -> Result<()> {
    // The token names the snapshot; a snapshot or bookmark named beside it would be ignored.
    if target.contains(['@', '#']) {
        bail!(
            "with -t, name only the pool or volume that holds the token's snapshot, not {target}"
        );
    }
    let (pool_name, volume) = match target.split_once('/') {
        Some((pool, volume)) => (pool, Some(volume)),
        None => (target, None),
    };
    let token: ResumeToken = token
        .parse()
        .map_err(|e| anyhow!("cannot resume send: {e}"))?;
    let what = SendWhat::Resume {
        token: &token,
        volume,
    };
    let opts = SendOptions::default();
    host.with_pool(pool_name, |p| {
        if flags.dry_run || flags.verbose || flags.parsable {
            let est = p.send_estimate_what(&what, &opts)?;
            let report: &mut dyn std::io::Write = if flags.dry_run { con.out() } else { con.err() };
            writeln!(
                report,
                "{} resume send from volume offset {}: {} blocks, {} freed ranges",
                if flags.dry_run { "would" } else { "will" },
                token.offset_bytes,
                est.data_records,
                est.free_records,
            )?;
            // With -p the total in `zfs send -nvP`'s `size` line, which scripts look for;
            // the line above stays (the resumed stream's base has no name here to give).
            if flags.parsable {
                writeln!(report, "size\t{}", est.stream_bytes)?;
            } else {
                writeln!(
                    report,
                    "total estimated size is {}",
                    size_with_unit(est.stream_bytes, false)
                )?;
            }
            if flags.dry_run {
                return Ok(());
            }
        }
        p.send_what(&what, &opts, con.out())?;
        Ok(())
    })
}

/// The base as the engine names it: a snapshot's name (from `@B`, `B`, `VOL@B` or
/// `POOL/VOL@B` of the same volume) or a bookmark's `#B` (from `#B`, `VOL#B` or `POOL/VOL#B`).
fn base_name(pool: &str, volume: &str, base: &str) -> Result<String> {
    let same = |v: &str| v.is_empty() || v == volume || v == format!("{pool}/{volume}");
    let name = match (base.split_once('@'), base.split_once('#')) {
        (Some((v, s)), None) if same(v) => s.to_string(),
        (None, Some((v, b))) if same(v) && !b.is_empty() => format!("#{b}"),
        (None, None) => base.to_string(),
        _ => bail!("the base {base} is not a snapshot or bookmark of {pool}/{volume}"),
    };
    if name.is_empty() {
        bail!("name the base snapshot: -i @BASE (or a bookmark: -i #BOOKMARK)");
    }
    Ok(name)
}

/// How a base is shown: `@B`, or a bookmark's `#B`.
fn shown_base(base: &str) -> String {
    if base.starts_with('#') {
        base.to_string()
    } else {
        format!("@{base}")
    }
}

/// The flags of `oxpool recv`.
pub struct RecvFlags {
    /// `-F`.
    pub force: bool,
    /// `-s`.
    pub resumable: bool,
    /// `-A`.
    pub abort: bool,
    /// `-u`.
    pub no_export: bool,
    /// `-v`.
    pub verbose: bool,
    /// `-n`.
    pub dry_run: bool,
}

/// `recv -v`'s lines, on standard output as `zfs recv -v` prints them: what was received,
/// or with `-n` what would be.
fn print_received(con: &mut dyn Console, received: &[Received], dry_run: bool) -> Result<()> {
    for r in received {
        // A resumed stream's counts are its own (as `zfs recv -v` counts the bytes of the
        // stream it read): said so, with where it resumed.
        let resumed = match r.resumed_at_bytes {
            None => String::new(),
            Some(at) => format!(", resumed at volume offset {at}"),
        };
        // "stream of" the sent snapshot, as `zfs recv -v` says it ("from" would read as an
        // incremental's base).
        writeln!(
            con.out(),
            "{} {} ({} stream of {}{resumed}, {} block{}, {} freed range{})",
            if dry_run { "would receive" } else { "received" },
            r.snapshot,
            if r.incremental { "incremental" } else { "full" },
            r.source,
            r.data_records,
            if r.data_records == 1 { "" } else { "s" },
            r.free_records,
            if r.free_records == 1 { "" } else { "s" },
        )?;
    }
    Ok(())
}

/// `oxpool recv [-F] [-s] [-u] [-n] [-v] POOL/VOL[@SNAP]`, `oxpool recv -A POOL/VOL`.
pub fn recv(host: &Host, con: &mut dyn Console, target: &str, flags: RecvFlags) -> Result<()> {
    let RecvFlags {
        force,
        resumable,
        abort,
        no_export,
        verbose,
        dry_run,
    } = flags;
    let (pool_name, volume) = volume_target(target)?;
    // POOL/VOL@SNAP names the snapshot the stream makes, as `zfs recv` takes it.
    let (volume, snapshot) = match volume.split_once('@') {
        None => (volume, None),
        Some((v, s)) if !v.is_empty() && !s.is_empty() && !abort => (v, Some(s.to_string())),
        Some(_) if abort => bail!("recv -A takes the volume (POOL/VOL), not '{target}'"),
        Some(_) => bail!(
            "receive into a volume (POOL/VOL) or name the snapshot it makes (POOL/VOL@SNAP), \
             not '{target}'"
        ),
    };
    if abort {
        return host.change_pool(pool_name, |p| Ok(p.abort_receive(volume)?));
    }
    let opts = ReceiveOptions {
        force,
        resumable,
        dry_run,
        snapshot,
    };
    if dry_run {
        // Nothing changes: no export is taken down or offered, no data is written. The
        // refusal a receive would meet for a head open by clients is given (the snapshots
        // `-F` would take down are not checked: only the stream names them).
        if let Host::Live(served) = host {
            let head = format!("{pool_name}/{volume}");
            if let Some(n) = served.clients(&head).filter(|n| *n > 0) {
                bail!(
                    "cannot receive into '{head}': it is open by {n} NBD client connection(s) \
                     (its NBD clients must disconnect first)"
                );
            }
        }
        return host.with_pool(pool_name, |p| {
            // Said for the streams checked before one that fails too.
            let checked = RefCell::new(Vec::new());
            let on_kept = |r: &Received| checked.borrow_mut().push(r.clone());
            let result = p.receive_with(volume, con.input(), &opts, &|_, _| Ok(()), &on_kept);
            if verbose {
                print_received(con, &checked.into_inner(), true)?;
            }
            result?;
            Ok(())
        });
    }
    let said: RefCell<Result<()>> = RefCell::new(Ok(()));
    host.change_pool(pool_name, |p| {
        let served = match host {
            Host::Live(s) => Some(s),
            Host::Local { .. } => None,
        };
        let head = format!("{pool_name}/{volume}");
        let existed = p.volume(volume).is_ok();
        let before: Vec<String> = if existed {
            p.snapshots(volume)?.into_iter().map(|s| s.name).collect()
        } else {
            Vec::new()
        };
        // The head's contents change under its clients: they must be gone first. It comes
        // back only if it was exported (or is new, without -u).
        let head_was_exported = match (served, existed) {
            (Some(served), true) => served.unexport_volume(&head, false, Unexport::Receive)?,
            _ => false,
        };
        // The snapshots -F is to destroy (those after the stream's base, which only the
        // stream names) leave the export table before anything is applied: as `destroy` and
        // `rollback`, refused while a client has one open. Those still there after the
        // receive (it failed) come back.
        let taken_down: RefCell<Vec<String>> = RefCell::new(Vec::new());
        let before_destroy = |vol: &str, later: &[String]| -> std::result::Result<(), String> {
            let Some(served) = served else {
                return Ok(());
            };
            for s in later {
                match served.unexport_volume(
                    &format!("{pool_name}/{vol}@{s}"),
                    false,
                    Unexport::Receive,
                ) {
                    Ok(true) => taken_down.borrow_mut().push(s.clone()),
                    Ok(false) => {}
                    Err(e) => return Err(format!("{e:#}")),
                }
            }
            Ok(())
        };
        // Said with -v for the streams received before one that fails too (each is kept).
        let kept: RefCell<Vec<Received>> = RefCell::new(Vec::new());
        let on_kept = |r: &Received| kept.borrow_mut().push(r.clone());
        let received = p.receive_with(volume, con.input(), &opts, &before_destroy, &on_kept);
        // Printed now, but a failure to print (a closed standard output) is returned only
        // after the history, the exports and the pool's own steps after this closure: it
        // must not stop them.
        if verbose {
            *said.borrow_mut() = print_received(con, &kept.into_inner(), false);
        }
        // A receive that failed after streams of its input were received (each is kept, as
        // ZFS keeps the snapshots of a `send -I` package received before an error) changed
        // the pool: its history says so.
        if received.is_err() {
            let after: Vec<String> = p
                .snapshots(volume)
                .map(|s| s.into_iter().map(|s| s.name).collect())
                .unwrap_or_default();
            if after != before {
                crate::history::record(p);
            }
        }
        let taken_down = taken_down.into_inner();
        if let Some(served) = served {
            let after: Vec<String> = match p.snapshots(volume) {
                Ok(s) => s.into_iter().map(|s| s.name).collect(),
                Err(_) => Vec::new(),
            };
            // Received snapshots join the export table, and those taken down that are still
            // there come back; `-u` leaves a new volume and its snapshots unexported, and a
            // head that was not exported (received with -u) stays so, as ZFS leaves an
            // unmounted filesystem unmounted. The receive's own error comes first: an export
            // that fails after it is only said.
            let mut export_error: Option<anyhow::Error> = None;
            let mut export = |r: Result<()>| {
                if let Err(e) = r {
                    export_error.get_or_insert(e);
                }
            };
            let head_exported = head_was_exported || (!existed && !no_export);
            if head_exported {
                if let Ok(vol) = p.volume(volume) {
                    export(served.export_volume(vol));
                }
            }
            // New snapshots follow the head (exported only if it is); those taken down come
            // back whatever it is.
            for s in after
                .iter()
                .filter(|s| (head_exported && !before.contains(s)) || taken_down.contains(s))
            {
                export(
                    p.snapshot_volume(volume, s)
                        .map_err(anyhow::Error::from)
                        .and_then(|v| served.export_volume(v)),
                );
            }
            match (export_error, &received) {
                (Some(e), Err(_)) => {
                    writeln!(con.err(), "oxpool: after the failed receive: {e:#}")?
                }
                (Some(e), Ok(_)) => return Err(e),
                (None, _) => {}
            }
        }
        received?;
        Ok(())
    })?;
    said.into_inner()
}
