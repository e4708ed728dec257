//! `oxpool serve`: serves every volume of the named pools (default: every known pool, or the
//! embedded default pool) over NBD until SIGINT or SIGTERM, then exports the pools cleanly.
//! While it runs, `oxpool` commands that name its pools go through its control socket and
//! run here, on the live pools (`control/`, `served.rs`).

use crate::control::runtime::RuntimeDir;
use crate::control::server::ControlServer;
use crate::devices::{open_device, NewFiles};
use crate::host::{open_pool, remember};
use crate::served::Served;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use oxpool_engine::cachefile;
use oxpool_engine::{Pool, PoolProps, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::net::Listener;
use oxpool_nbd::server::{EngineChangeMaps, Server, ServerConfig, ShutdownHandle, TcpCongestion};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Default TCP address: loopback only; all interfaces only when asked.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// Arguments of `oxpool serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Pools to serve (default: every known pool, or the embedded default).
    pub pools: Vec<String>,
    /// TCP address to listen on [default: 127.0.0.1:10809, unless --socket is given].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Unix socket to listen on (instead of TCP, or as well with --listen).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Volumes (POOL/VOL) to export read-only (repeatable).
    #[arg(long = "read-only", value_name = "POOL/VOL")]
    pub read_only: Vec<String>,
    /// Data directory of the embedded default pool.
    #[arg(long, default_value = "oxpool-data")]
    pub data_dir: PathBuf,
    /// Reactor threads serving connections [default: one per CPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub reactors: Option<u16>,
    /// Requests in flight per connection (request slots).
    #[arg(long, value_name = "N", default_value_t = 128,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub slots: u16,
    /// TCP congestion control of the connections: auto (the system's, but cubic for
    /// clients on this host that BBR would pace), system, or a name the kernel offers
    /// (docs/nbd.md).
    #[arg(long, value_name = "auto|system|NAME", default_value = "auto",
          value_parser = TcpCongestion::parse)]
    pub tcp_congestion: TcpCongestion,
    /// Seconds a client may take to finish its handshake (TLS included) before it is
    /// disconnected; 0: no limit (as qemu-nbd's --handshake-limit).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub handshake_limit: u32,
    /// Client connections open at once, over every export (as qemu-nbd's --shared, whose
    /// default is 1); a connection past it is closed at once, and the server logs why.
    #[arg(short = 'e', long = "shared", value_name = "NUM", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub shared: u32,
    /// TLS options (see docs/tls.md).
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

/// Size of the embedded default pool's sparse file.
pub const DEFAULT_POOL_FILE_BYTES: u64 = 8 << 30;
/// Size of the embedded default pool's volume.
pub const DEFAULT_VOLUME_BYTES: u64 = 4 << 30;

/// Creates the embedded default pool (`oxpool` with volume `vol0`) in `data_dir`, or opens it
/// if it exists there.
pub fn default_pool(cache: &Path, data_dir: &Path) -> Result<()> {
    let file = data_dir.join("oxpool-pool0.img");
    if file.exists() {
        let dev = open_device(&file, None)?;
        let pool = Pool::import(vec![dev.backend()], None)?;
        remember(cache, &pool)?;
        pool.export()?;
        return Ok(());
    }
    std::fs::create_dir_all(data_dir)?;
    // Sparse: the quick start should start in a moment and take no space it does not use.
    let dev = open_device(
        &file,
        Some(NewFiles {
            size_bytes: DEFAULT_POOL_FILE_BYTES,
            sparse: true,
        }),
    )?;
    let pool = Pool::create(
        "oxpool",
        vec![TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![dev.backend()],
        }],
        PoolProps::default(),
        false,
    )?;
    // Thick, as the `create -V` its history records makes it.
    pool.create_volume(
        "vol0",
        DEFAULT_VOLUME_BYTES,
        &[("refreservation".into(), "auto".into())],
    )?;
    // What made it, in its history (no command line did), as the equivalent commands.
    let file_name = file.display().to_string();
    crate::history::record_as(&pool, &["create", "oxpool", &file_name]);
    let size = crate::human(DEFAULT_VOLUME_BYTES);
    crate::history::record_as(&pool, &["create", "-V", &size, "oxpool/vol0"]);
    crate::console::say_out(format_args!(
        "created pool 'oxpool' on {} (sparse file of {}) with volume 'vol0' of {}",
        file.display(),
        crate::human(DEFAULT_POOL_FILE_BYTES),
        crate::human(DEFAULT_VOLUME_BYTES)
    ));
    remember(cache, &pool)?;
    pool.export()?;
    Ok(())
}

/// Runs the command.
pub fn run(cache: &Path, args: ServeArgs) -> Result<()> {
    // Before any thread exists (the pools' sync threads, the reactors, the control socket):
    // every thread inherits the mask, so SIGINT/SIGTERM reach only the thread that waits for
    // them.
    let signals = block_stop_signals()?;
    // TLS options are checked before any pool is opened: a mistake there changes nothing.
    let tls_config = crate::tls::server_tls(&args.tls, tls_listen_addr(&args))?;
    // So is the congestion control: a name this kernel lacks is refused before anything.
    args.tcp_congestion
        .check()
        .map_err(|err| anyhow!("--tcp-congestion {}: {err}", args.tcp_congestion.as_str()))?;

    let runtime = RuntimeDir::of_cache(cache);
    let pid = std::process::id();
    runtime.create(pid)?;
    runtime.clean_stale();

    let mut names = args.pools.clone();
    let named = !names.is_empty();
    if names.is_empty() {
        names = cachefile::read(cache)?
            .into_iter()
            .map(|p| p.name)
            .collect();
    }
    if names.is_empty() {
        default_pool(cache, &args.data_dir)?;
        names.push("oxpool".into());
    }
    // Block-buffer memory mapped while the pools open, and then ahead of use, not by the
    // receives of the writes that first need it (`IoBuf::warm`). Not waited for: if it cannot
    // be done, the I/O path maps it as it goes.
    if let Err(e) = oxpool_io::IoBuf::warm(oxpool_io::IoBuf::warm_default_bytes()) {
        tracing::warn!("no thread to map buffer memory ahead of use: {e}");
    }
    let mut pools = Vec::new();
    for name in &names {
        match open_pool(cache, name) {
            Ok(p) => pools.push(p),
            // Serving every known pool: one that cannot be opened (a device lost) does not
            // keep the others from being served, as ZFS imports at boot what it can. It is
            // said why, and `oxpool import` brings it in once it can be opened.
            Err(e) if !named => {
                crate::console::say_err(format_args!("oxpool: pool '{name}' is not served: {e:#}"));
            }
            Err(e) => return Err(e),
        }
    }
    if pools.is_empty() {
        bail!("no pool could be opened");
    }
    // The banner names the pools served, not those left out above.
    let names: Vec<String> = pools.iter().map(|(p, _)| p.name().to_string()).collect();
    for name in &args.read_only {
        let known = pools
            .iter()
            .any(|(p, _)| p.volumes().iter().any(|v| v.full_name() == *name));
        if !known {
            bail!("--read-only {name}: no such volume among the served pools");
        }
    }

    let mut listeners = Vec::new();
    let mut endpoints = Vec::new();
    let listen = match (&args.listen, &args.socket) {
        (Some(addr), _) => Some(addr.as_str()),
        (None, None) => Some(DEFAULT_LISTEN),
        (None, Some(_)) => None,
    };
    if let Some(listen) = listen {
        let (listener, addr) = bind_tcp(listen)?;
        listeners.push(Listener::tcp(listener));
        endpoints.push(Endpoint::Tcp(addr));
    }
    let mut socket_created = None;
    if let Some(path) = &args.socket {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        let listener = bind_unix(&path)?;
        listeners.push(Listener::unix(listener));
        socket_created = Some(path.clone());
        endpoints.push(Endpoint::Unix(path));
    }

    let mut config = ServerConfig::default();
    if let Some(reactors) = args.reactors {
        config.reactors = usize::from(reactors);
    }
    config.slots_per_connection = usize::from(args.slots);
    config.handshake_limit = std::time::Duration::from_secs(u64::from(args.handshake_limit));
    config.max_connections = args.shared as usize;
    config.tls = tls_config;
    config.tcp_congestion = args.tcp_congestion.clone();
    // Every volume and snapshot export offers `oxpool:changed-since:SNAP` for the snapshots
    // before it (docs/snapshots.md, "Change maps").
    config.change_maps = Arc::new(EngineChangeMaps);
    let tls = config.tls.policy != oxpool_nbd::TlsPolicy::Off;
    let tls_line = crate::tls::describe(&config.tls);
    let reactors = config.reactors;
    let server = Server::start(config, Vec::new(), listeners).context("start the server")?;
    let control_socket = runtime.socket_path(pid);
    let served = Arc::new(Served::new(
        cache,
        runtime,
        control_socket.clone(),
        server.exports(),
        args.read_only.clone(),
        endpoints,
        tls,
    ));
    crate::console::say_out(format_args!(
        "serving pool(s) {} with {reactors} reactor(s):",
        names.join(", ")
    ));
    crate::console::say_out(format_args!("{tls_line}"));
    // The socket first: a pool's record in the runtime directory always names a socket
    // that answers.
    let control = ControlServer::start(served.clone(), &control_socket)?;
    {
        let _one = served.membership();
        for (pool, devices) in pools {
            served.adopt(pool, devices)?;
        }
    }
    crate::console::say_out(format_args!(
        "control socket: {} (oxpool commands on these pools go through it)",
        control.socket().display()
    ));
    std::thread::Builder::new()
        .name("oxpool-signals".into())
        .spawn({
            let handle = server.shutdown_handle();
            move || wait_for_stop_signals(signals, handle)
        })
        .context("spawn the signal thread")?;
    crate::console::say_out(format_args!(
        "ready; SIGINT (Ctrl-C) or SIGTERM stops the server and exports the pools"
    ));

    // Live counters for `oxpool iostat`: written beside the cache file five times a second.
    let started_ms = crate::iostat::now_ms();
    let stop_stats = Arc::new(AtomicBool::new(false));
    let stats_thread = {
        let served = served.clone();
        let cache = cache.to_path_buf();
        let stop = stop_stats.clone();
        std::thread::Builder::new()
            .name("oxpool-stats".into())
            .spawn(move || publish_stats(&cache, &served, &stop, started_ms))
            .context("spawn the stats thread")?
    };
    let served_result = server.join();
    control.stop();
    stop_stats.store(true, Ordering::Relaxed);
    let _ = stats_thread.join();
    crate::console::say_err(format_args!("oxpool: server stopped; exporting the pools"));
    let (exported, failed) = served.shutdown();
    if let Some(path) = socket_created {
        let _ = std::fs::remove_file(path);
    }
    served_result.context("NBD server")?;
    if !failed.is_empty() {
        bail!("export failed: {}", failed.join("; "));
    }
    crate::console::say_out(format_args!("exported {}", exported.join(", ")));
    Ok(())
}

/// The stats thread: publishes every served pool's counters (pools come and go), and
/// withdraws those of pools no longer served; on the same beat, follows the pools' device
/// changes ([`Served::follow_device_changes`]).
fn publish_stats(cache: &Path, served: &Served, stop: &AtomicBool, started_ms: u64) {
    let mut published: Vec<String> = Vec::new();
    // Bounded by the server's life: it stops when the server does.
    while !stop.load(Ordering::Relaxed) {
        let process = crate::iostat::ProcessCounters::now(started_ms);
        let counters = served.counters();
        for gone in published
            .iter()
            .filter(|n| !counters.iter().any(|c| c.name() == *n))
        {
            crate::iostat::unpublish(cache, gone);
        }
        published = counters.iter().map(|c| c.name().to_string()).collect();
        for c in &counters {
            crate::iostat::publish(cache, c, &process);
        }
        drop(counters);
        // On the same beat, beside the counters: unlocking devices the pools dropped and
        // keeping the cache file's device paths current.
        served.follow_device_changes();
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for name in &published {
        crate::iostat::unpublish(cache, name);
    }
}

/// The TCP address `serve` will listen on (its first resolution), for the TLS default.
fn tls_listen_addr(args: &ServeArgs) -> Option<SocketAddr> {
    let listen = match (&args.listen, &args.socket) {
        (Some(addr), _) => addr.as_str(),
        (None, None) => DEFAULT_LISTEN,
        (None, Some(_)) => return None,
    };
    listen.to_socket_addrs().ok()?.next()
}

/// Where clients connect.
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Endpoint {
    /// The NBD URI of `export` here (the export name is the URI path without its slash);
    /// `nbds` when TLS is on.
    pub fn uri(&self, export: &str, tls: bool) -> String {
        let scheme = if tls { "nbds" } else { "nbd" };
        match self {
            Endpoint::Tcp(addr) => format!("{scheme}://{addr}/{export}"),
            Endpoint::Unix(path) => {
                format!("{scheme}+unix:///{export}?socket={}", path.display())
            }
        }
    }
}

fn bind_tcp(listen: &str) -> Result<(TcpListener, SocketAddr)> {
    let addrs: Vec<SocketAddr> = listen
        .to_socket_addrs()
        .with_context(|| format!("--listen {listen}: not an ADDR:PORT"))?
        .collect();
    let mut last_err = None;
    for addr in addrs {
        match TcpListener::bind(addr) {
            Ok(listener) => {
                // The actual address: with port 0 the kernel picked one.
                let bound = listener.local_addr()?;
                return Ok((listener, bound));
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(match last_err {
        Some(e) => anyhow!("cannot listen on {listen}: {e}"),
        None => anyhow!("--listen {listen}: resolves to no address"),
    })
}

/// Binds a unix socket; a stale socket file (nobody listening) from a crashed server is
/// replaced, anything else at the path is an error.
fn bind_unix(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!("--socket {}: exists and is not a socket", path.display());
        }
        if UnixStream::connect(path).is_ok() {
            bail!(
                "--socket {}: another server is listening there",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("remove stale {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

/// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it starts later).
fn block_stop_signals() -> Result<libc::sigset_t> {
    // SAFETY: sigset manipulation on a local, then pthread_sigmask with valid pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!(
                "cannot block SIGINT/SIGTERM: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
        Ok(set)
    }
}

/// The signal thread: the first SIGINT/SIGTERM starts a clean shutdown; a second one exits at
/// once (what was flushed is durable; the pool imports without an export).
fn wait_for_stop_signals(set: libc::sigset_t, handle: ShutdownHandle) {
    let mut received = 0u32;
    // Unbounded by design: lives until the process exits; each pass waits for a signal.
    loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: `set` is a valid signal set and `signal` a live out-parameter.
        let rc = unsafe { libc::sigwait(&set, &mut signal) };
        if rc != 0 {
            continue;
        }
        received += 1;
        if received == 1 {
            crate::console::say_err(format_args!(
                "oxpool: signal {signal}: stopping (finishing requests in flight; again to exit now)"
            ));
            handle.shutdown();
        } else {
            crate::console::say_err(format_args!(
                "oxpool: signal {signal} again: exiting without exporting"
            ));
            std::process::exit(130);
        }
    }
}
