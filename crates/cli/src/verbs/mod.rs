//! What each verb does, written once for both places a command runs: in the `oxpool` process
//! on pools it opens itself, and inside `oxpool serve` on the pools it serves (for a client
//! of its control socket). Verbs print through a [`Console`] and find pools through a
//! [`Host`]; where serving changes what a verb must do (a new volume becomes an export, an
//! export disconnects clients), the verb says so where it matters.

pub mod device;
pub mod pool;
pub mod props;
mod rename;
pub mod send;
mod share;
pub mod snapshot;
mod stream;
pub mod unavailable;
pub mod volume;

use crate::args::{Command, VolCommand};
use crate::console::Console;
use crate::host::Host;
use anyhow::{anyhow, bail, Result};

/// `list`'s sort keys, most important first: every `-s` (ascending), then every `-S`.
fn sort_keys(ascending: Vec<String>, descending: Vec<String>) -> Vec<(String, bool)> {
    let ascending = ascending.into_iter().map(|c| (c, false));
    ascending
        .chain(descending.into_iter().map(|c| (c, true)))
        .collect()
}

/// Runs `command` on `host`'s pools, printing on `con`.
pub fn run(command: Command, host: &Host, con: &mut dyn Console) -> Result<()> {
    match command {
        Command::Create {
            volume_size: Some(size),
            blocksize,
            thin,
            props,
            pool: name,
            vdevs,
            ..
        } => {
            if !vdevs.is_empty() {
                bail!("create -V makes volume POOL/VOL and takes no devices");
            }
            // Thick unless -s, as `zfs create -V`: the volume reserves what writing all of it
            // takes. `-o refreservation=` says otherwise.
            let mut props = props;
            if !thin && !props.iter().any(|a| a.starts_with("refreservation=")) {
                props.push("refreservation=auto".to_string());
            }
            let command = VolCommand::Create {
                name,
                size,
                blocksize,
                thin,
                props,
            };
            volume::run(host, con, command)
        }
        Command::Create {
            volume_size: None,
            force,
            size,
            sparse,
            props,
            pool,
            vdevs,
            // Only with -V (clap requires it).
            blocksize: _,
            thin: _,
        } => pool::create(
            host,
            con,
            &pool,
            &vdevs,
            size.as_deref(),
            sparse,
            &props,
            force,
        ),
        Command::Import {
            dirs,
            missing_log,
            pool,
            new_name,
        } => pool::import(
            host,
            con,
            &dirs,
            pool.as_deref(),
            new_name.as_deref(),
            missing_log,
        ),
        Command::Add {
            force,
            size,
            sparse,
            pool,
            vdevs,
        } => pool::add(host, con, &pool, &vdevs, size.as_deref(), sparse, force),
        Command::Export { pool, force } => pool::export(host, &pool, force),
        Command::Destroy {
            force,
            dry_run,
            verbose,
            parsable,
            defer,
            recursive,
            dependents,
            pool,
        } => {
            let flags = snapshot::DestroyFlags {
                dry_run,
                verbose,
                parsable,
                defer,
                force,
            };
            if dependents && !pool.contains('#') && pool.contains('/') {
                // A volume or its snapshots, with every clone that depends on them.
                return snapshot::destroy_with_dependents(host, con, &pool, flags);
            }
            if dependents {
                bail!(
                    "-R is for a volume or its snapshots (POOL/VOL or POOL/VOL@SNAP, not -r \
                     POOL@SNAP): a pool has no clones of its own, a bookmark none at all"
                );
            }
            if pool.contains('#') {
                if dry_run || verbose || parsable || defer || recursive {
                    bail!(
                        "-n, -v, -p, -d and -r are not for a bookmark: it holds no space, and \
                         destroying it destroys it alone"
                    );
                }
                snapshot::destroy_bookmark(host, &pool)
            } else if pool.contains('@') {
                snapshot::destroy(host, con, &pool, flags, recursive)
            } else if pool.contains('/') {
                // A volume, as `zfs destroy [-nvpr] [-f] POOL/VOL` (`vol destroy` the same).
                if defer {
                    bail!("-d is for snapshots; a volume takes -n, -v, -p, -r and -f");
                }
                let command = VolCommand::Destroy {
                    name: pool,
                    force,
                    recursive,
                    dry_run,
                    verbose,
                    parsable,
                };
                volume::run(host, con, command)
            } else if dry_run || verbose || parsable || defer || recursive {
                bail!(
                    "-n, -v, -p and -r are for snapshots and volumes, -d for snapshots; a pool \
                     takes -f"
                )
            } else {
                pool::destroy(host, con, &pool, force)
            }
        }
        Command::Snapshot { names, recursive } => snapshot::snapshot(host, &names, recursive),
        Command::Rollback {
            recursive,
            force,
            snapshot: target,
        } => snapshot::rollback(host, &target, recursive, force),
        Command::Clone {
            snapshot: target,
            name,
            props,
        } => snapshot::clone(host, &target, &name, &props),
        Command::Promote { name } => snapshot::promote(host, &name),
        Command::Rename { from, to } => rename::rename(host, &from, &to),
        Command::Share { name } => share::share(host, &name),
        Command::Unshare { force, name } => share::unshare(host, &name, force),
        Command::Send {
            token,
            incremental,
            intermediates,
            dry_run,
            verbose,
            parsable,
            snapshot,
        } => send::send(
            host,
            con,
            snapshot.as_deref(),
            send::SendFlags {
                token: token.as_deref(),
                incremental: incremental.as_deref(),
                intermediates: intermediates.as_deref(),
                dry_run,
                verbose,
                parsable,
            },
        ),
        Command::Recv {
            force,
            resumable,
            abort,
            no_export,
            dry_run,
            verbose,
            target,
        } => send::recv(
            host,
            con,
            &target,
            send::RecvFlags {
                force,
                resumable,
                abort,
                no_export,
                verbose,
                dry_run,
            },
        ),
        Command::Bookmark { source, bookmark } => snapshot::bookmark(host, &source, &bookmark),
        Command::Hold {
            recursive,
            tag,
            names,
        } => {
            let names = snapshot::each_volumes(host, &names, recursive)?;
            snapshot::hold(host, con, &tag, &names, false)
        }
        Command::Release {
            recursive,
            tag,
            names,
        } => {
            let names = snapshot::each_volumes(host, &names, recursive)?;
            snapshot::hold(host, con, &tag, &names, true)
        }
        Command::Holds {
            scripted,
            recursive,
            names,
        } => {
            let names = snapshot::each_volumes(host, &names, recursive)?;
            snapshot::holds(host, con, &names, scripted)
        }
        Command::Audit { pool } => snapshot::audit(host, con, &pool),
        Command::List {
            scripted,
            parsable,
            no_header,
            types,
            columns,
            sort_ascending,
            sort_descending,
            pools,
            // Made a type by the caller (`main.rs`, `each_pool`).
            recursive: _,
        } => match types {
            Some(t) => snapshot::list_datasets(
                host,
                con,
                snapshot::ListTypes::parse(&t)?,
                columns.as_deref().unwrap_or(snapshot::DEFAULT_COLUMNS),
                &sort_keys(sort_ascending, sort_descending),
                scripted,
                parsable,
                no_header,
                &pools,
            ),
            None if !sort_ascending.is_empty() || !sort_descending.is_empty() => {
                bail!("-s and -S sort datasets: with -t TYPE, -r, or a POOL/VOL named")
            }
            None => pool::list(
                host,
                con,
                scripted,
                parsable,
                no_header,
                columns.as_deref().unwrap_or(pool::POOL_DEFAULT_COLUMNS),
                &pools,
            ),
        },
        Command::History { long, pools } => {
            // Bounded by the names given (one, from `each_pool`).
            for name in pool::listed(host, &pools)? {
                let listing = host.with_pool(&name, |p| Ok(p.history()))?;
                pool::print_history(con, &name, &listing, long)?;
            }
            Ok(())
        }
        Command::Sync { pools } => {
            // Bounded by the names given (one, from `each_pool`).
            for name in pool::listed(host, &pools)? {
                host.with_pool(&name, |p| Ok(p.sync()?))?;
            }
            Ok(())
        }
        Command::Status {
            verbose,
            unhealthy,
            // Paths are always whole (the flag's documentation).
            full_paths: _,
            pools,
        } => pool::status(host, con, &pools, verbose, unhealthy),
        Command::Offline {
            temporary,
            pool,
            device,
        } => device::offline(host, con, &pool, &device, temporary),
        Command::Online { pool, device, wait } => device::online(host, con, &pool, &device, wait),
        Command::Attach {
            force,
            wait,
            pool,
            device,
            new,
        } => device::attach(host, con, &pool, &device, &new, force, wait),
        Command::Detach { pool, device } => device::detach(host, con, &pool, &device),
        Command::Replace {
            force,
            wait,
            pool,
            old,
            new,
        } => device::replace(host, con, &pool, &old, new.as_deref(), force, wait),
        Command::Remove { pool, device } => device::remove(host, con, &pool, &device),
        Command::Clear { pool, device } => device::clear(host, con, &pool, device.as_deref()),
        Command::Inject {
            device,
            error,
            delay_ms,
            ops,
            frequency,
            clear,
            no_header,
            pool,
        } => {
            let pool = pool.ok_or_else(|| anyhow!("name the pool"))?;
            match (device, clear) {
                (Some(d), None) => device::inject_add(
                    host,
                    con,
                    &pool,
                    &d,
                    device::InjectSpec {
                        error: error.as_deref(),
                        delay_ms,
                        ops: ops.as_deref(),
                        frequency,
                    },
                ),
                (None, Some(c)) => device::inject_clear(host, con, &pool, &c),
                (None, None) => device::inject_list(host, con, &pool, no_header),
                (Some(_), Some(_)) => bail!("-c and -d do not go together"),
            }
        }
        Command::Scrub {
            wait,
            stop,
            pause,
            pool,
        } => pool::scrub(host, con, &pool, wait, stop, pause),
        Command::Vol { command } => volume::run(host, con, command),
        Command::Inherit {
            recursive,
            prop,
            targets,
        } => props::inherit(host, &prop, &targets, recursive),
        Command::Get {
            parsable,
            scripted,
            fields,
            sources,
            recursive,
            prop,
            target,
            more,
        } => {
            let style = props::GetStyle {
                parsable,
                scripted,
                fields: fields.as_deref(),
                sources: sources.as_deref(),
            };
            // After a volume, or when each names a dataset of the pool (`POOL/...`), more
            // targets (as `zfs get`); after a POOL, one other word is its device.
            let pool_prefix = format!("{}/", split_target(&target).0);
            let more_targets = target.contains('/')
                || more
                    .iter()
                    .all(|m| m.starts_with(&pool_prefix) && !m.starts_with('/'));
            let (mut targets, device) = match (more_targets, more.as_slice()) {
                (true, _) | (false, []) => (vec![target.as_str()], None),
                (false, [device]) => (vec![target.as_str()], Some(device.as_str())),
                (false, [_, extra, ..]) => bail!(
                    "unexpected '{extra}': oxpool get PROP POOL [DEVICE], or PROP TARGET... of \
                     one pool"
                ),
            };
            if more_targets {
                targets.extend(more.iter().map(String::as_str));
            }
            if recursive {
                if device.is_some() {
                    bail!("-r is for a pool's volumes, not a device");
                }
                // Each POOL named stands for its volumes, in the pool's order.
                let mut expanded = Vec::with_capacity(targets.len());
                for t in &targets {
                    match split_target(t) {
                        (pool, None) => expanded.extend(host.with_pool(pool, |p| {
                            Ok(p.volumes()
                                .iter()
                                .map(|v| v.full_name().to_string())
                                .collect::<Vec<_>>())
                        })?),
                        _ => expanded.push(t.to_string()),
                    }
                }
                if expanded.is_empty() {
                    // As `zfs get -r` of a pool with no datasets below it: nothing to show.
                    return Ok(());
                }
                // Each once, as `zfs get -r tank tank/a` lists tank/a once.
                let mut seen = std::collections::BTreeSet::new();
                let targets: Vec<&str> = expanded
                    .iter()
                    .map(String::as_str)
                    .filter(|t| seen.insert(*t))
                    .collect();
                return props::get(host, con, &prop, &targets, None, style);
            }
            props::get(host, con, &prop, &targets, device, style)
        }
        Command::Set { words } => {
            let (assignments, target, device) = props::set_words(&words)?;
            props::set(host, &assignments, target, device)
        }
        Command::Iostat {
            latency,
            histograms,
            json,
            pool,
            interval,
            count,
        } => crate::iostat::print(
            host.cache(),
            &pool,
            crate::iostat::Options {
                json,
                latency,
                histograms,
                interval_s: interval,
                count,
            },
        ),
        Command::Serve(_) => bail!("`serve` cannot run inside a server"),
        Command::Stream { command } => stream::run(con, command),
    }
}

/// `name=value`.
pub fn split_assignment(a: &str) -> Result<(&str, &str)> {
    a.split_once('=')
        .ok_or_else(|| anyhow!("expected PROP=VALUE, got '{a}'"))
}

/// The pool of a name: `POOL`, `POOL/VOL`, `POOL/VOL@SNAP`, `POOL/VOL#BOOKMARK` (and, to
/// be refused by what reads it, `POOL@...`).
pub fn pool_part(name: &str) -> &str {
    name.split(['/', '@', '#']).next().unwrap_or(name)
}

/// `POOL` or `POOL/VOL`: the pool, and the volume if one is named.
pub fn split_target(t: &str) -> (&str, Option<&str>) {
    match t.split_once('/') {
        Some((p, v)) => (p, Some(v)),
        None => (t, None),
    }
}

/// `POOL/VOL`, required.
pub fn volume_target(t: &str) -> Result<(&str, &str)> {
    match split_target(t) {
        (p, Some(v)) => Ok((p, v)),
        _ => Err(anyhow!("expected POOL/VOL, got '{t}'")),
    }
}
