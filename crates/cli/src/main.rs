//! `oxpool`: pools, volumes, properties and the NBD server, in the zpool/zfs manner.
//!
//! A command on a pool that a running `oxpool serve` owns is sent to that server's control
//! socket and runs there, on the live pool; it prints exactly what it would have printed on
//! an exported pool. With no server owning the pool, the command opens it (through the pool
//! cache file), does its work and exports it again, so the pool is consistent on disk when the
//! command returns. Device files are locked (flock) while a pool is open, so two processes
//! never open one pool.

mod args;
mod beside_cache;
mod console;
mod control;
mod devices;
mod display;
mod errors_file;
mod history;
mod host;
mod inject_file;
mod iostat;
mod progress;
mod serve;
mod served;
mod tls;
mod verbs;

use anyhow::{anyhow, bail, Result};
use args::{Cli, Command, VolCommand};
use clap::Parser;
use console::LocalConsole;
use control::runtime::{Found, RuntimeDir};
use devices::default_cache_file;
pub use display::human;
use host::Host;
use std::collections::{BTreeMap, BTreeSet};

/// The log's level from `OXPOOL_LOG` (`error`, `warn`, `info`, `debug`, `trace`): warnings
/// by default; `debug` shows each connection's handshake and TLS session (its version,
/// suite and record layer). A value not understood is said, and the default kept.
fn log_level(setting: Option<&str>) -> (tracing::Level, Option<String>) {
    let Some(setting) = setting.filter(|s| !s.is_empty()) else {
        return (tracing::Level::WARN, None);
    };
    match setting.parse::<tracing::Level>() {
        Ok(level) => (level, None),
        Err(_) => (
            tracing::Level::WARN,
            Some(format!(
                "OXPOOL_LOG={setting}: not a level (error, warn, info, debug, trace); using warn"
            )),
        ),
    }
}

fn main() {
    let cli = Cli::parse();
    let (log_level, log_problem) = log_level(std::env::var("OXPOOL_LOG").ok().as_deref());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(log_level)
        .with_target(false)
        // A log line that cannot be written is dropped: by default tracing-subscriber says
        // so with `eprintln!`, which panics when standard error is a pipe whose reader left
        // (`oxpool serve 2>&1 | head`), in whichever thread logged: the txg sync's.
        .log_internal_errors(false)
        .init();
    if let Some(problem) = log_problem {
        tracing::warn!("{problem}");
    }
    match run(cli) {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        // The reader of standard output went away (`oxpool iostat tank 1 | head`): stop quietly,
        // with the status of a process killed by SIGPIPE, as a C tool with the default
        // disposition would (Rust ignores SIGPIPE, and the server in this same binary must).
        Err(e) if is_broken_pipe(&e) => std::process::exit(EXIT_BROKEN_PIPE),
        Err(e) => {
            eprintln!("oxpool: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Exit status after standard output's reader went away: 128 + SIGPIPE.
const EXIT_BROKEN_PIPE: i32 = 128 + libc::SIGPIPE;

/// Whether `e` is, at its root, an EPIPE from a write to a pipe whose reader went away:
/// standard output, or a FIFO the command writes (`vol read -o FIFO`), as a C tool would die
/// of SIGPIPE on either. A socket to a server that went away is reported as a lost
/// connection, with its own message, before it gets here (`control::client::forward`).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Which pool a command is about, for finding the server that owns it.
enum Target {
    /// This pool.
    Pool(String),
    /// A pool that is not open anywhere yet (create, import): a running server takes it.
    NewPool,
    /// Every pool it lists, one by one (list, status, vol list).
    EachPool,
    /// No pool (serve, iostat, listing importable pools, stream dump): runs here.
    Here,
}

fn target(command: &Command) -> Target {
    let pool_of = |name: &str| Target::Pool(verbs::pool_part(name).to_string());
    match command {
        Command::Create {
            volume_size: Some(_),
            pool,
            ..
        } => pool_of(pool),
        Command::Create { .. } | Command::Import { pool: Some(_), .. } => Target::NewPool,
        Command::Import { pool: None, .. }
        | Command::Inject { pool: None, .. }
        | Command::Iostat { .. }
        | Command::Serve(_)
        | Command::Stream { .. } => Target::Here,
        Command::List { .. }
        | Command::Status { .. }
        | Command::Sync { .. }
        | Command::History { .. } => Target::EachPool,
        Command::Add { pool, .. }
        | Command::Export { pool, .. }
        | Command::Destroy { pool, .. }
        | Command::Audit { pool }
        | Command::Offline { pool, .. }
        | Command::Online { pool, .. }
        | Command::Attach { pool, .. }
        | Command::Detach { pool, .. }
        | Command::Replace { pool, .. }
        | Command::Remove { pool, .. }
        | Command::Clear { pool, .. }
        | Command::Inject {
            pool: Some(pool), ..
        }
        | Command::Scrub { pool, .. } => pool_of(pool),
        Command::Rollback { snapshot, .. }
        | Command::Clone { snapshot, .. }
        | Command::Send {
            snapshot: Some(snapshot),
            ..
        } => pool_of(snapshot),
        // `send -t TOKEN` alone: resolved to its pool before this (`pool_of_token`).
        Command::Send { snapshot: None, .. } => Target::Here,
        Command::Recv { target, .. } => pool_of(target),
        Command::Promote { name } | Command::Share { name } | Command::Unshare { name, .. } => {
            pool_of(name)
        }
        Command::Bookmark { source, .. } | Command::Rename { from: source, .. } => pool_of(source),
        Command::Snapshot { names, .. }
        | Command::Hold { names, .. }
        | Command::Release { names, .. }
        | Command::Holds { names, .. } => pool_of(names.first().map_or("", |n| n.as_str())),
        Command::Get { target, .. } => pool_of(target),
        Command::Inherit { targets, .. } => pool_of(targets.first().map_or("", |n| n.as_str())),
        // A line that does not parse is refused, with why, here.
        Command::Set { words } => match verbs::props::set_words(words) {
            Ok((_, target, _)) => pool_of(target),
            Err(_) => Target::Here,
        },
        Command::Vol { command } => match command {
            VolCommand::List { .. } => Target::EachPool,
            VolCommand::Create { name, .. }
            | VolCommand::Destroy { name, .. }
            | VolCommand::Write { name, .. }
            | VolCommand::Read { name, .. } => pool_of(name),
        },
    }
}

/// The command line after the program name, to send to a server.
fn own_args() -> Result<Vec<String>> {
    std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .map_err(|a| anyhow!("argument {a:?} is not UTF-8: it cannot go to the server"))
        })
        .collect()
}

fn run(mut cli: Cli) -> Result<i32> {
    let cache = cli.cache_file.clone().unwrap_or_else(default_cache_file);
    let runtime = RuntimeDir::of_cache(&cache);
    let local = Host::Local {
        cache: cache.clone(),
    };
    // A stream is refused a terminal here, before any pool is opened and before a server
    // (whose standard output is the control socket) could write it to one, as `zfs send`.
    if matches!(cli.command, Command::Send { dry_run: false, .. })
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        bail!("a stream cannot be written to a terminal: redirect standard output");
    }
    // `send -t TOKEN` without a pool: the pool holding the token's snapshot, named on the
    // command line a server gets too.
    let mut found_pool = None;
    if let Command::Send {
        snapshot: snapshot @ None,
        token: Some(token),
        ..
    } = &mut cli.command
    {
        let pool = verbs::send::pool_of_token(&local, &runtime, token)?;
        *snapshot = Some(pool.clone());
        found_pool = Some(pool);
    }
    let forwarded = || -> Result<Vec<String>> {
        let mut args = own_args()?;
        args.extend(found_pool.clone());
        Ok(args)
    };
    let mut con = LocalConsole::new();
    match target(&cli.command) {
        Target::Here => {
            if let Command::Serve(args) = cli.command {
                serve::run(&cache, args)?;
                return Ok(0);
            }
            if let Command::Inject { .. } = cli.command {
                return inject_each_pool(cli.command, &local, &runtime);
            }
        }
        Target::Pool(pool) => {
            if let Found::Server(socket, stream) = runtime.server_of(&pool)? {
                return control::client::forward(stream, &socket, forwarded()?);
            }
        }
        Target::NewPool => match runtime.servers()?.as_slice() {
            [] => {}
            [socket] => {
                let stream = std::os::unix::net::UnixStream::connect(socket)
                    .map_err(|e| anyhow!("cannot connect to {}: {e}", socket.display()))?;
                return control::client::forward(stream, socket, own_args()?);
            }
            several => bail!(
                "several servers run on {} ({}): stop all but one to create or import a pool",
                cache.display(),
                several
                    .iter()
                    .map(|s| s.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        Target::EachPool => return each_pool(cli.command, &local, &runtime),
    }
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let _recorded_as = history::running(&args);
    verbs::run(cli.command, &local, &mut con)?;
    Ok(0)
}

/// `list`, `status` and `vol list` over several pools: the header once, then each pool's
/// lines from wherever the pool is (its server, or opened here).
fn each_pool(mut command: Command, local: &Host, runtime: &RuntimeDir) -> Result<i32> {
    let mut con = LocalConsole::new();
    // `list tank/vol0` (no -t) lists that volume, as `zfs list tank/vol0`, and a snapshot or
    // bookmark named lists it; with -r, or beside a dataset, a pool named lists its volumes.
    // Each name lists its own type then (`list -r tank tank/a@s`: tank's volumes and that
    // snapshot), as `zfs list` lists a name given whatever the type it recurses over.
    let mut own_types: BTreeMap<String, String> = BTreeMap::new();
    // Names whose rows are among another name's (a volume of a pool also named): listed once,
    // run for their errors only (`tank/nosuch` beside `tank` is still refused).
    let mut muted: BTreeSet<String> = BTreeSet::new();
    if let Command::List {
        types,
        pools,
        recursive,
        ..
    } = &mut command
    {
        let mut seen: Vec<String> = Vec::new();
        for n in pools.drain(..) {
            if !seen.contains(&n) {
                seen.push(n);
            }
        }
        let is_dataset = |n: &str| n.contains(['/', '@', '#']);
        if types.is_none() && (*recursive || seen.iter().any(|n| is_dataset(n))) {
            let kind_of = |n: &str| {
                if n.contains('@') {
                    "snapshot"
                } else if n.contains('#') {
                    "bookmark"
                } else {
                    "volume"
                }
            };
            let mut union: Vec<&str> = Vec::new();
            for n in &seen {
                own_types.insert(n.clone(), kind_of(n).to_string());
                if !union.contains(&kind_of(n)) {
                    union.push(kind_of(n));
                }
            }
            if union.is_empty() {
                // -r alone: every pool's volumes.
                union.push("volume");
            }
            *types = Some(union.join(","));
        }
        // With the same types, a dataset's rows are among its pool's, and a snapshot's or
        // bookmark's among its volume's (`-t snapshot tank/a tank/a@s`).
        for n in seen.iter().filter(|n| is_dataset(n)) {
            let volume = n.split(['@', '#']).next().unwrap_or(n);
            let ancestors = [verbs::pool_part(n), volume];
            let types_of = |m: &str| own_types.get(m).or(types.as_ref()).cloned();
            if seen
                .iter()
                .any(|m| m != n && ancestors.contains(&m.as_str()) && types_of(m) == types_of(n))
            {
                muted.insert(n.clone());
            }
        }
        *pools = seen;
    }
    // Whether the listing has a header: printed by the first pool's part that has lines (its
    // `no_header` false until something is printed), so an error alone prints none.
    let (named, scripted, headed): (Vec<String>, bool, bool) = match &command {
        Command::List {
            pools,
            scripted,
            types,
            columns,
            sort_ascending,
            sort_descending,
            ..
        } => {
            // Checked before any header is printed.
            let sorted: Vec<&String> = sort_ascending.iter().chain(sort_descending).collect();
            match types {
                Some(t) => {
                    verbs::snapshot::ListTypes::parse(t)?;
                    let columns = columns
                        .clone()
                        .unwrap_or_else(|| verbs::snapshot::DEFAULT_COLUMNS.to_string());
                    verbs::snapshot::parse_columns(&columns)?;
                    for c in sorted {
                        verbs::snapshot::parse_columns(c).map_err(|e| anyhow!("-s/-S: {e:#}"))?;
                    }
                }
                None if !sorted.is_empty() => {
                    bail!("-s and -S sort datasets: with -t TYPE, -r, or a POOL/VOL named")
                }
                None => {
                    // The pool listing's columns (`zpool list -o name,size`).
                    let columns = columns
                        .clone()
                        .unwrap_or_else(|| verbs::pool::POOL_DEFAULT_COLUMNS.to_string());
                    verbs::pool::parse_pool_columns(&columns)?;
                }
            };
            (pools.clone(), *scripted, true)
        }
        Command::Status { pools, .. } => (pools.clone(), true, false),
        Command::Sync { pools } | Command::History { pools, .. } => (pools.clone(), true, false),
        Command::Vol {
            command: VolCommand::List {
                pools, scripted, ..
            },
        } => (pools.clone(), *scripted, true),
        _ => unreachable!("each_pool is for list, status, sync, history and vol list"),
    };
    let names = verbs::pool::listed(local, &named)?;
    // `list` takes datasets too (`tank/vol0`, `tank/vol0@snap`): each goes to its pool.
    let pool_part = |n: &str| verbs::pool_part(n).to_string();
    if let (Command::Status { .. }, true) = (&command, names.is_empty()) {
        use std::io::Write;
        writeln!(std::io::stdout(), "no pools available")?;
        return Ok(0);
    }
    // Pools neither served nor known here first: each fails with why, and with no header
    // if no pool is left to list, as `zpool list nosuch` says only that it does not exist.
    let known = local.known_pools()?;
    let (unknown, names): (Vec<String>, Vec<String>) = names.into_iter().partition(|n| {
        let pool = pool_part(n);
        !known.contains(&pool) && matches!(runtime.server_of(&pool), Ok(Found::None))
    });
    let listing_pools = matches!(&command, Command::List { types: None, .. });
    if listing_pools && !scripted && named.is_empty() && names.is_empty() {
        use std::io::Write;
        writeln!(std::io::stdout(), "no pools available")?;
    }
    // As `zfs list`: a pool that cannot be opened has no datasets to list, unless named.
    let skip_unavailable = matches!(&command, Command::List { types: Some(_), .. })
        || matches!(&command, Command::Vol { .. });
    let skip_unavailable = skip_unavailable && named.is_empty();
    let mut failed = 0;
    // Bounded by the names listed.
    let mut failed_names: BTreeSet<String> = BTreeSet::new();
    let mut served_out_bytes = 0;
    for name in unknown.into_iter().chain(names) {
        // The header goes with the first lines printed; none before.
        let no_header = !headed || served_out_bytes + con.out_bytes() > 0;
        // One pool's part: the same verb with that pool.
        let one = match &command {
            Command::List {
                scripted,
                parsable,
                types,
                columns,
                sort_ascending,
                sort_descending,
                ..
            } => Command::List {
                scripted: *scripted,
                parsable: *parsable,
                recursive: false,
                no_header,
                types: own_types.get(&name).or(types.as_ref()).cloned(),
                columns: columns.clone(),
                sort_ascending: sort_ascending.clone(),
                sort_descending: sort_descending.clone(),
                pools: vec![name.clone()],
            },
            Command::Sync { .. } => Command::Sync {
                pools: vec![name.clone()],
            },
            Command::History { long, .. } => Command::History {
                long: *long,
                pools: vec![name.clone()],
            },
            Command::Status {
                verbose,
                unhealthy,
                full_paths,
                ..
            } => Command::Status {
                verbose: *verbose,
                unhealthy: *unhealthy,
                full_paths: *full_paths,
                pools: vec![name.clone()],
            },
            Command::Vol {
                command:
                    VolCommand::List {
                        scripted, parsable, ..
                    },
            } => Command::Vol {
                command: VolCommand::List {
                    scripted: *scripted,
                    parsable: *parsable,
                    no_header,
                    pools: vec![name.clone()],
                },
            },
            _ => unreachable!(),
        };
        // A pool that cannot be listed is reported, and the others are listed still.
        let printed_before = served_out_bytes + con.out_bytes();
        let mute = muted.contains(&name);
        if mute && failed_names.contains(pool_part(&name).as_str()) {
            // Its pool's error is printed already; the name fails with it.
            failed += 1;
            continue;
        }
        con.set_muted(mute);
        let done = match runtime.server_of(&pool_part(&name)) {
            Ok(Found::Server(socket, stream)) => {
                control::client::forward_counted(stream, &socket, command_line(&one), mute).map(
                    |(code, bytes)| {
                        served_out_bytes += bytes;
                        code == 0
                    },
                )
            }
            Ok(Found::None) => match verbs::run(one, local, &mut con) {
                Err(e) if skip_unavailable => {
                    verbs::unavailable::unavailable(local, &name, e).map(|_| true)
                }
                done => done.map(|()| true),
            },
            Err(e) => Err(e),
        };
        con.set_muted(false);
        let ok = succeeded(done);
        failed += u32::from(!ok);
        if !ok {
            failed_names.insert(name.clone());
        }
        let passed_over = ok && served_out_bytes + con.out_bytes() == printed_before;
        if let (
            Command::Status {
                unhealthy: true, ..
            },
            true,
            false,
        ) = (&command, passed_over, named.is_empty())
        {
            // Named, as `zpool status -x tank` says it.
            writeln!(console::Console::out(&mut con), "pool '{name}' is healthy")?;
        }
    }
    if let (Command::List { types: Some(_), .. }, 0, 0) =
        (&command, served_out_bytes + con.out_bytes(), failed)
    {
        // As `zfs list` says it, on standard error: nothing matched.
        eprintln!("no datasets available");
    }
    if let Command::Status {
        unhealthy: true, ..
    } = command
    {
        // Every pool passed over (an error printed is on standard error, and counts below).
        if served_out_bytes + con.out_bytes() == 0 && failed == 0 {
            use std::io::Write;
            writeln!(std::io::stdout(), "all pools are healthy")?;
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// `oxpool inject` without a pool: lists the rules of every pool that has some, or clears
/// rule `-c ID` (or all of them) wherever it is; each pool's part runs where the pool is
/// (its server, or here on the rules file).
fn inject_each_pool(command: Command, local: &Host, runtime: &RuntimeDir) -> Result<i32> {
    let Command::Inject {
        device,
        clear,
        pool: None,
        ..
    } = command
    else {
        unreachable!("inject without a pool")
    };
    if device.is_some() {
        bail!("name the pool: oxpool inject -d DEVICE ... POOL");
    }
    let rules = inject_file::rules(local.cache())?;
    let mut pools: Vec<String> = Vec::new();
    for s in &rules {
        let wanted = match clear.as_deref() {
            None | Some("all") => true,
            Some(id) => id.parse::<u64>().ok() == Some(s.rule.id),
        };
        if wanted && !pools.contains(&s.pool) {
            pools.push(s.pool.clone());
        }
    }
    if let Some(id) = clear.as_deref().filter(|id| *id != "all") {
        if pools.is_empty() {
            bail!("no injection rule {id}");
        }
    }
    let mut con = LocalConsole::new();
    if clear.is_none() {
        verbs::device::inject_header(&mut con)?;
    }
    let mut failed = 0;
    for name in pools {
        let mut args = vec!["inject".to_string()];
        match &clear {
            Some(c) => args.extend(["-c".to_string(), c.clone()]),
            None => args.push("--no-header".to_string()),
        }
        args.push(name.clone());
        let done = match runtime.server_of(&name) {
            Ok(Found::Server(socket, stream)) => {
                control::client::forward(stream, &socket, args).map(|code| code == 0)
            }
            Ok(Found::None) => {
                let one = Command::Inject {
                    device: None,
                    error: None,
                    delay_ms: None,
                    ops: None,
                    frequency: None,
                    clear: clear.clone(),
                    no_header: true,
                    pool: Some(name.clone()),
                };
                verbs::run(one, local, &mut con).map(|()| true)
            }
            Err(e) => Err(e),
        };
        failed += u32::from(!succeeded(done));
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// The command line of one pool's part of a listing.
fn command_line(command: &Command) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    let (verb, scripted, parsable, pools): (&[&str], bool, bool, &[String]) = match command {
        Command::List {
            scripted,
            parsable,
            pools,
            types,
            columns,
            sort_ascending,
            sort_descending,
            no_header,
            ..
        } => {
            if let Some(t) = types {
                args.extend(["-t".to_string(), t.clone()]);
            }
            if let Some(c) = columns {
                args.extend(["-o".to_string(), c.clone()]);
            }
            for c in sort_ascending {
                args.extend(["-s".to_string(), c.clone()]);
            }
            for c in sort_descending {
                args.extend(["-S".to_string(), c.clone()]);
            }
            if *no_header {
                args.push("--no-header".to_string());
            }
            (&["list"], *scripted, *parsable, pools)
        }
        Command::Status {
            verbose,
            unhealthy,
            full_paths,
            pools,
        } => {
            if *verbose {
                args.push("-v".into());
            }
            if *unhealthy {
                args.push("-x".into());
            }
            if *full_paths {
                args.push("-P".into());
            }
            (&["status"], false, false, pools)
        }
        Command::Sync { pools } => (&["sync"], false, false, pools),
        Command::History { long, pools } => {
            if *long {
                args.push("-l".into());
            }
            (&["history"], false, false, pools)
        }
        Command::Vol {
            command:
                VolCommand::List {
                    scripted,
                    parsable,
                    pools,
                    no_header,
                },
        } => {
            if *no_header {
                args.push("--no-header".to_string());
            }
            (&["vol", "list"], *scripted, *parsable, pools)
        }
        _ => unreachable!("a listing"),
    };
    let options = std::mem::take(&mut args);
    args.extend(verb.iter().map(|s| s.to_string()));
    args.extend(options);
    if scripted {
        args.push("-H".into());
    }
    if parsable {
        args.push("-p".into());
    }
    args.extend(pools.iter().cloned());
    args
}

/// Whether one pool's part of a command over several pools succeeded; an error is printed
/// here (a server that failed printed why itself).
fn succeeded(done: Result<bool>) -> bool {
    match done {
        Ok(ok) => ok,
        // The reader went away: the other pools' lines have nowhere to go either.
        Err(e) if is_broken_pipe(&e) => std::process::exit(EXIT_BROKEN_PIPE),
        Err(e) => {
            eprintln!("oxpool: {e:#}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::log_level;
    use tracing::Level;

    #[test]
    fn oxpool_log_sets_the_level_and_a_bad_value_is_said() {
        assert_eq!(log_level(None), (Level::WARN, None));
        assert_eq!(log_level(Some("")), (Level::WARN, None));
        assert_eq!(log_level(Some("debug")), (Level::DEBUG, None));
        assert_eq!(log_level(Some("ERROR")), (Level::ERROR, None));
        let (level, problem) = log_level(Some("loud"));
        assert_eq!(level, Level::WARN);
        assert!(problem.unwrap().contains("OXPOOL_LOG=loud"));
    }
}
