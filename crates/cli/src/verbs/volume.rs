//! The volume verbs: `oxpool vol create | list | destroy | write | read`.

use super::snapshot::print_destroy_plan;
use super::{split_assignment, volume_target};
use crate::args::VolCommand;
use crate::console::Console;
use crate::display::size;
use crate::host::Host;
use crate::served::Unexport;
use anyhow::{bail, Context, Result};
use oxpool_engine::props::parse_size;
use std::io::{Read, Write};
use std::path::Path;

/// Bytes `vol read` and `vol write` move per step: memory stays bounded (the pool's
/// `dirty_max` bounds what is dirty).
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// Runs one `oxpool vol` verb.
pub fn run(host: &Host, con: &mut dyn Console, cmd: VolCommand) -> Result<()> {
    match cmd {
        VolCommand::Create {
            name,
            size,
            blocksize,
            thin: _,
            props,
        } => {
            let (pool, v) = volume_target(&name)?;
            let size = parse_size("volsize (-V)", &size)?;
            let mut pairs = Vec::new();
            if let Some(b) = blocksize {
                if props.iter().any(|a| a.starts_with("volblocksize=")) {
                    bail!("volblocksize given twice: -b and -o volblocksize=");
                }
                pairs.push(("volblocksize".to_string(), b));
            }
            for a in &props {
                let (k, val) = split_assignment(a)?;
                pairs.push((k.to_string(), val.to_string()));
            }
            host.change_pool(pool, |p| {
                let volume = p.create_volume(v, size, &pairs)?;
                if let Host::Live(served) = host {
                    // Listed by `nbdinfo --list` from now on.
                    served.export_volume(volume)?;
                }
                Ok(())
            })
        }
        VolCommand::List {
            scripted,
            parsable,
            no_header,
            pools,
        } => list(host, con, scripted, parsable, no_header, &pools),
        VolCommand::Destroy {
            name,
            force,
            recursive,
            dry_run,
            verbose,
            parsable,
        } => {
            let (pool, v) = volume_target(&name)?;
            // What the engine would refuse is checked first (no such volume; snapshots
            // without -r; with -r, a held or cloned one), so that -f disconnects no client
            // for a destroy that cannot be done. Then, on a served pool, out of the export
            // table (refused while open, unless -f) before anything is destroyed: a refusal
            // changes nothing (its snapshots went first, before a new user found `-r`
            // destroying them and then refusing), and no client can open it between the
            // check and the destroy.
            host.with_pool(pool, |p| {
                let mut snaps = Vec::new();
                if !recursive {
                    p.check_destroy_volume(v)?;
                } else {
                    p.volume(v)?;
                    snaps = p.snapshots(v)?.into_iter().map(|s| s.name).collect();
                    p.destroy_estimate(v, &snaps)?;
                }
                // A client with it (or, with -r, one of its snapshots) open refuses the
                // command without -f: said before any plan, by a dry run too.
                if let Host::Live(served) = host {
                    for n in std::iter::once(name.clone())
                        .chain(snaps.iter().map(|s| format!("{name}@{s}")))
                    {
                        served.check_unexport(&n, force, Unexport::Destroy)?;
                    }
                }
                if dry_run || verbose || parsable {
                    // As `zfs destroy -nv`: the snapshots, then the volume; then (ours: ZFS
                    // gives `reclaim` for snapshots only) what goes with them all: the
                    // volume's `used` (its own blocks and its snapshots'; a clone's shared
                    // ones stay with the origin).
                    let mut now: Vec<String> =
                        snaps.iter().map(|s| format!("{name}@{s}")).collect();
                    now.push(name.clone());
                    let used = p.dataset_space(v)?.used_bytes;
                    print_destroy_plan(con, &now, &[], used, dry_run, parsable)?;
                }
                Ok(())
            })?;
            if dry_run {
                return Ok(());
            }
            let was_exported = match host {
                Host::Live(served) => served.unexport_volume(&name, force, Unexport::Destroy)?,
                _ => false,
            };
            let destroyed = destroy_volume(host, con, &name, force, recursive);
            if let (Err(e), true, Host::Live(served)) = (&destroyed, was_exported, host) {
                // Back as it was: one `recv -u` or `unshare` left out stays out.
                let back = host
                    .with_pool(pool, |p| Ok(p.volume(v)?))
                    .and_then(|volume| served.export_volume(volume));
                if let Err(again) = back {
                    bail!("{e:#}; and {name} could not be offered again: {again:#}");
                }
            }
            destroyed
        }
        VolCommand::Write {
            name,
            offset,
            input,
        } => {
            let (pool, v) = volume_target(&name)?;
            let offset = parse_size("--offset", &offset)?;
            let mut file = None;
            if input != Path::new("-") {
                let path = con.path(&input);
                file =
                    Some(std::fs::File::open(&path).with_context(|| path.display().to_string())?);
            }
            host.with_pool(pool, |p| {
                if let Some((volume, snap)) = v.split_once('@') {
                    // Named as `zfs` would say it, rather than "not found".
                    p.snapshot_volume(volume, snap)?;
                    bail!("{name}: a snapshot is read-only; write to {pool}/{volume}");
                }
                let vol = p.volume(v)?;
                // A file's length is known: a write past the end is refused whole, before
                // any byte is written (from standard input, the chunk that would cross the
                // end is refused, after the ones before it).
                if let Some(len) = file
                    .as_ref()
                    .and_then(|f| f.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                {
                    let end = offset.saturating_add(len);
                    if end > vol.size_bytes() {
                        bail!(
                            "{name}: {len} bytes at offset {offset} would end at {end}, past \
                             its end ({} bytes): nothing written",
                            vol.size_bytes()
                        );
                    }
                }
                let reader: &mut dyn Read = match file.as_mut() {
                    Some(f) => f,
                    None => con.input(),
                };
                let mut buf = vec![0u8; COPY_CHUNK_BYTES];
                let mut pos = offset;
                // Bounded by the input's length: each pass consumes a chunk or ends.
                loop {
                    let mut n = 0;
                    while n < buf.len() {
                        match reader.read(&mut buf[n..])? {
                            0 => break,
                            k => n += k,
                        }
                    }
                    if n == 0 {
                        break;
                    }
                    oxpool_io::rt::block_on(vol.write(pos, &buf[..n], false))?;
                    pos += n as u64;
                }
                // Durable when the command returns, served pool or not.
                oxpool_io::rt::block_on(vol.flush())?;
                Ok(())
            })
        }
        VolCommand::Read {
            name,
            offset,
            length,
            output,
        } => {
            let (pool, v) = volume_target(&name)?;
            let offset = parse_size("--offset", &offset)?;
            let mut file = None;
            // A file this command makes is removed if the read fails: an empty or partial
            // file would pass for the volume's bytes (one that was there is left as `cp`
            // leaves it).
            let mut made = None;
            if output != Path::new("-") {
                let path = con.path(&output);
                // Not even a link: a dangling one would be removed, not the file made.
                if std::fs::symlink_metadata(&path).is_err() {
                    made = Some(path.clone());
                }
                file =
                    Some(std::fs::File::create(&path).with_context(|| path.display().to_string())?);
            }
            let read = host.with_pool(pool, |p| {
                // A snapshot reads as the volume did when it was taken.
                let vol = match v.split_once('@') {
                    Some((volume, snap)) => p.snapshot_volume(volume, snap)?,
                    None => p.volume(v)?,
                };
                let len = match &length {
                    Some(l) => parse_size("--length", l)?,
                    None => vol.size_bytes().saturating_sub(offset),
                };
                // Refused whole, before any byte is read or written, in the terms asked.
                let end = offset.saturating_add(len);
                if end > vol.size_bytes() {
                    bail!(
                        "{name}: {len} bytes at offset {offset} would end at {end}, past its \
                         end ({} bytes): nothing read",
                        vol.size_bytes()
                    );
                }
                let out: &mut dyn Write = match file.as_mut() {
                    Some(f) => f,
                    None => con.out(),
                };
                let mut buf = vec![0u8; COPY_CHUNK_BYTES];
                let mut pos = offset;
                while pos < offset + len {
                    let n = ((offset + len - pos) as usize).min(buf.len());
                    oxpool_io::rt::block_on(vol.read(pos, &mut buf[..n]))?;
                    out.write_all(&buf[..n])?;
                    pos += n as u64;
                }
                out.flush()?;
                Ok(())
            });
            if read.is_err() {
                if let Some(path) = made {
                    drop(file);
                    let _ = std::fs::remove_file(path);
                }
            }
            read
        }
    }
}

/// The header of `oxpool vol list`.
pub fn list_header(con: &mut dyn Console) -> Result<()> {
    writeln!(
        con.out(),
        "{:<32} {:>10} {:>10} {:>12}",
        "NAME",
        "VOLSIZE",
        "USED",
        "VOLBLOCKSIZE"
    )?;
    Ok(())
}

/// `oxpool vol list [-H] [-p] [POOL...]`.
fn list(
    host: &Host,
    con: &mut dyn Console,
    scripted: bool,
    exact: bool,
    no_header: bool,
    named: &[String],
) -> Result<()> {
    let mut headed = scripted || no_header;
    for name in super::pool::listed(host, named)? {
        let rows: Vec<[String; 4]> = host.with_pool(&name, |p| {
            p.volumes()
                .iter()
                .map(|v| {
                    // `used` as `get used` and `zfs list` have it: snapshots' space too.
                    let used = p.dataset_space(&v.name())?.used_bytes;
                    Ok([
                        v.full_name().to_string(),
                        size(v.size_bytes(), exact),
                        size(used, exact),
                        size(u64::from(v.block_size_bytes()), exact),
                    ])
                })
                .collect()
        })?;
        for r in rows {
            if !headed {
                // With the first line: none before an error, or with no volume.
                list_header(con)?;
                headed = true;
            }
            if scripted {
                writeln!(con.out(), "{}", r.join("\t"))?;
            } else {
                writeln!(
                    con.out(),
                    "{:<32} {:>10} {:>10} {:>12}",
                    r[0],
                    r[1],
                    r[2],
                    r[3]
                )?;
            }
        }
    }
    Ok(())
}

/// `vol destroy [-r] POOL/VOL` once a served volume is out of the export table: its
/// snapshots first with `-r` (each refused, with the reason, if it cannot go), then the
/// volume.
fn destroy_volume(
    host: &Host,
    con: &mut dyn Console,
    name: &str,
    force: bool,
    recursive: bool,
) -> Result<()> {
    let (pool, v) = volume_target(name)?;
    if recursive {
        let snaps: Vec<String> = host.with_pool(pool, |p| {
            Ok(p.snapshots(v)?.into_iter().map(|s| s.name).collect())
        })?;
        if !snaps.is_empty() {
            let spec = format!("{name}@{}", snaps.join(","));
            let flags = super::snapshot::DestroyFlags {
                force,
                ..Default::default()
            };
            super::snapshot::destroy(host, con, &spec, flags, false)?;
        }
    }
    host.change_pool(pool, |p| {
        let before = p.all_snapshots();
        p.destroy_volume(v)?;
        if let Host::Live(_) = host {
            // A clone's origin marked by `destroy -d` went with it.
            super::snapshot::drop_gone_snapshot_exports(host, p, &before)?;
        }
        Ok(())
    })
}
