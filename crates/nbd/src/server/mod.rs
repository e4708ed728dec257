//! The NBD server: reactor threads that serve volumes over TCP or unix sockets.
//!
//! # Threads
//!
//! [`Server::start`] spawns `reactors` threads. Each runs one [`LocalExecutor`] on its own
//! io_uring ring and owns the connections assigned to it: their sockets, requests and the
//! volume operations those requests start all run on that thread, so a completion comes back
//! to the thread that submitted it. Reactor 0 also runs the accept loop of every listener and
//! hands each accepted connection to a reactor, round-robin, through that reactor's mailbox (a
//! bounded queue whose consumer parks its waker there; wakers ring the owning thread's ring).
//!
//! # Per connection
//!
//! See `conn`: a reader task, a fixed array of request slots each with its own request task,
//! a writer task. Nothing is shared between connections but the volume.
//!
//! # Shutdown
//!
//! [`ShutdownHandle::shutdown`] stops the accept loops, then each reactor tells its
//! connections to stop reading; requests already read complete and their replies are sent;
//! then the sockets close and the reactor threads end. [`Server::join`] waits for that. A
//! connection that cannot finish within [`ServerConfig::shutdown_grace`] (a client that stopped
//! reading its replies) is dropped.

mod change_maps;
mod conn;
mod exports;
mod socket;
mod task;
pub mod tls;
mod tls_records;
mod tls_session;

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use oxpool_engine::{EngineError, Volume};
use oxpool_io::rt::net::{Listener, Stream};
use oxpool_io::rt::{self, LocalExecutor};

use crate::proto::{Errno, ExportCaps, ExportInfo, MAX_BLOCK_BYTES};
pub use change_maps::{
    ChangeExtent, ChangeExtentsFuture, ChangeMaps, EngineChangeMaps, NoChangeMaps,
};
pub use conn::parts_reply_counts;
use conn::ReactorConns;
pub use exports::{Disconnect, ExportError, Exports, Removed, EXPORTS_MAX};
use exports::{ExportTable, ReactorCommand};
pub use socket::{TcpCongestion, SAME_HOST_CONGESTION};
use task::{select, CatchUnwind, Either};
pub use tls::{TlsConfig, TlsCredentials, TlsIdentity};

/// Connections waiting in one reactor's mailbox before new ones are refused. Reached only if
/// a reactor stops taking connections (it is stuck): the acceptor then closes new ones rather
/// than queueing without bound.
const MAILBOX_CAPACITY: usize = 256;

/// Commands waiting in one reactor's mailbox (export removals, a few at a time: the
/// administrator's calls are serialized per export and each waits for its command's effect).
const MAILBOX_COMMANDS_MAX: usize = 1024;

/// Pause after an accept error such as EMFILE before trying again, so that a persistent error
/// does not spin the reactor.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Smallest per-connection buffer budget: one maximal request (a 32 MiB READ reply with its
/// chunk headers) must always fit, or the connection could wait forever.
pub const CONNECTION_BUFFER_MIN_BYTES: usize = MAX_BLOCK_BYTES as usize + 64 * 1024;

/// One volume to serve.
#[derive(Clone, Debug)]
pub struct ServerExport {
    /// Export name clients ask for (`pool/volume`).
    pub name: String,
    /// The volume.
    pub volume: Volume,
    /// Refuse WRITE, TRIM and WRITE_ZEROES with EPERM (advertised as READ_ONLY).
    pub read_only: bool,
}

/// Tunables of the server; [`ServerConfig::default`] documents the defaults.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Reactor threads (at least 1).
    pub reactors: usize,
    /// Request slots per connection: the most requests in flight on one connection. When all
    /// are busy the connection stops reading (back-pressure). 1..=4096.
    pub slots_per_connection: usize,
    /// Bytes of request buffers one connection may hold (WRITE payloads, READ replies); a
    /// request that would exceed it waits until earlier ones finish. Raised to
    /// [`CONNECTION_BUFFER_MIN_BYTES`] if smaller.
    pub connection_buffer_bytes: usize,
    /// Connections served at once, over all reactors; more are closed at accept.
    pub max_connections: usize,
    /// How long shutdown waits for in-flight requests and their replies before dropping the
    /// connections that are left.
    pub shutdown_grace: Duration,
    /// How long a client may take from connecting to the end of its handshake (TLS
    /// included) before the connection is closed; zero: no limit. A client that connects
    /// and says nothing otherwise holds a connection (one of `max_connections`) and, after
    /// STARTTLS, its TLS buffers for as long as it likes (qemu-nbd's `--handshake-limit`,
    /// with its default of 10 s).
    pub handshake_limit: Duration,
    /// TLS: off by default.
    pub tls: TlsConfig,
    /// The TCP connections' congestion control: by default the system's, except cubic for
    /// connections from this host that BBR would pace (see the `socket` module).
    pub tcp_congestion: TcpCongestion,
    /// Where the volumes' change maps (`oxpool:changed-since:*` metadata contexts) come
    /// from: [`EngineChangeMaps`] for the engine's; [`NoChangeMaps`] (the default) offers
    /// none.
    pub change_maps: Arc<dyn ChangeMaps>,
}

/// The default [`ServerConfig::handshake_limit`]: qemu-nbd's.
pub const HANDSHAKE_LIMIT_DEFAULT: Duration = Duration::from_secs(10);

impl Default for ServerConfig {
    /// One reactor per CPU, 128 slots and 64 MiB of buffers per connection, 1024 connections,
    /// 30 s of shutdown grace, 10 s for a handshake, no TLS, the `auto` congestion control,
    /// no change maps.
    fn default() -> Self {
        ServerConfig {
            reactors: std::thread::available_parallelism().map_or(1, |n| n.get()),
            slots_per_connection: 128,
            connection_buffer_bytes: 64 << 20,
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(30),
            handshake_limit: HANDSHAKE_LIMIT_DEFAULT,
            tls: TlsConfig::default(),
            tcp_congestion: TcpCongestion::default(),
            change_maps: Arc::new(NoChangeMaps),
        }
    }
}

/// A running server; [`Server::join`] waits for its threads after a shutdown.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// Stops a running server from any thread (e.g. a signal handler thread). Cheap to clone.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    /// Stops accepting, lets every connection finish the requests it has read, and ends the
    /// reactor threads. Returns at once; [`Server::join`] waits. Idempotent.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }
}

impl Server {
    /// Starts the reactor threads serving `exports` to clients of `listeners`. Exports can be
    /// added and removed while it serves, through [`Server::exports`].
    pub fn start(
        config: ServerConfig,
        exports: Vec<ServerExport>,
        listeners: Vec<Listener>,
    ) -> io::Result<Server> {
        config
            .tls
            .validate()
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        let tls = config.tls.clone();
        config
            .tcp_congestion
            .check()
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        let tcp_congestion = config.tcp_congestion.clone();
        let change_maps = config.change_maps.clone();
        let config = Limits::from_config(&config);
        let exports = ExportTable::new(exports)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let mailboxes = (0..config.reactors)
            .map(|_| Mailbox::default())
            .collect::<Vec<_>>();
        let shared = Arc::new(Shared {
            stopping: AtomicBool::new(false),
            mailboxes,
            accept_wakers: Mutex::new(vec![None; listeners.len()]),
            next_reactor: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            limits: config,
            tls,
            tcp_congestion,
            change_maps,
            exports,
        });
        let mut threads = Vec::with_capacity(config.reactors);
        let mut listeners = Some(listeners);
        for index in 0..config.reactors {
            let thread_shared = shared.clone();
            let listeners = if index == 0 {
                listeners.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            let spawned = std::thread::Builder::new()
                .name(format!("nbd-reactor-{index}"))
                .spawn(move || reactor_thread(index, thread_shared, listeners));
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(err) => {
                    shared.shutdown();
                    for thread in threads {
                        let _ = thread.join();
                    }
                    return Err(err);
                }
            }
        }
        Ok(Server { shared, threads })
    }

    /// A handle that adds and removes exports while the server runs.
    pub fn exports(&self) -> Exports {
        Exports {
            shared: self.shared.clone(),
        }
    }

    /// A handle that stops this server.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            shared: self.shared.clone(),
        }
    }

    /// Waits until every reactor thread has ended (after a shutdown). An error means a reactor
    /// thread panicked (a bug; its connections were lost, the others were served).
    pub fn join(self) -> io::Result<()> {
        let mut panicked = 0;
        for thread in self.threads {
            if thread.join().is_err() {
                panicked += 1;
            }
        }
        if panicked > 0 {
            return Err(io::Error::other(format!(
                "{panicked} NBD reactor thread(s) panicked"
            )));
        }
        Ok(())
    }
}

/// What the protocol layer says about a served volume: everything the codec supports, and
/// multi-connection consistency, which the engine gives (`Volume::flush` makes every change
/// to the volume completed before it durable, whichever connection made it).
pub(crate) fn export_info(export: &ServerExport) -> ExportInfo {
    ExportInfo {
        name: export.name.clone(),
        description: format!("oxpool volume {}", export.volume.full_name()),
        size_bytes: export.volume.size_bytes(),
        preferred_block_bytes: export.volume.block_size_bytes(),
        read_only: export.read_only || export.volume.read_only(),
        caps: ExportCaps {
            multi_conn: true,
            ..ExportCaps::default()
        },
    }
}

/// [`ServerConfig`] after clamping to sane bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) reactors: usize,
    pub(crate) slots: usize,
    pub(crate) buffer_bytes: usize,
    pub(crate) max_connections: usize,
    pub(crate) shutdown_grace: Duration,
    pub(crate) handshake_limit: Duration,
}

impl Limits {
    fn from_config(config: &ServerConfig) -> Limits {
        Limits {
            reactors: config.reactors.clamp(1, 1024),
            slots: config.slots_per_connection.clamp(1, 4096),
            buffer_bytes: config
                .connection_buffer_bytes
                .max(CONNECTION_BUFFER_MIN_BYTES),
            max_connections: config.max_connections.max(1),
            shutdown_grace: config.shutdown_grace,
            handshake_limit: config.handshake_limit,
        }
    }
}

/// State every reactor thread and the shutdown handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    stopping: AtomicBool,
    mailboxes: Vec<Mailbox>,
    /// The parked waker of each listener's accept loop (indexed by listener).
    accept_wakers: Mutex<Vec<Option<Waker>>>,
    next_reactor: AtomicUsize,
    /// Connections accepted and not yet closed, over all reactors.
    connections: AtomicUsize,
    limits: Limits,
    tls: TlsConfig,
    tcp_congestion: TcpCongestion,
    change_maps: Arc<dyn ChangeMaps>,
    exports: ExportTable,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        let wakers: Vec<Waker> = lock(&self.accept_wakers)
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for waker in wakers {
            waker.wake();
        }
        for mailbox in &self.mailboxes {
            mailbox.wake();
        }
    }

    /// Gives `command` to every reactor (each applies it to its own connections).
    fn post(&self, command: ReactorCommand) {
        for (index, mailbox) in self.mailboxes.iter().enumerate() {
            if !mailbox.command(command) {
                tracing::error!(reactor = index, ?command, "nbd: reactor command queue full");
            }
        }
    }

    /// Hands an accepted connection to the next reactor, or closes it when the server is
    /// stopping, full, or that reactor's mailbox is full.
    fn dispatch(self: &Arc<Self>, stream: Stream) {
        if self.stopping() {
            return;
        }
        let open = self.connections.fetch_add(1, Ordering::AcqRel);
        let permit = ConnectionPermit(self.clone());
        if open >= self.limits.max_connections {
            // Bounded: a client reconnecting in a loop would otherwise fill the log.
            if let Some(left_out) = FULL_WARNINGS.allow() {
                tracing::warn!(
                    limit = self.limits.max_connections,
                    left_out,
                    "nbd: too many connections (oxpool serve --shared); closing a new one"
                );
            }
            return;
        }
        let index = self.next_reactor.fetch_add(1, Ordering::Relaxed) % self.mailboxes.len();
        if !self.mailboxes[index].push(stream, permit) {
            tracing::warn!(
                reactor = index,
                "nbd: reactor mailbox full; closing a new connection"
            );
        }
    }
}

/// The bound on the log lines of connections closed for the limit (`left_out` counts the
/// lines not written since the last one).
static FULL_WARNINGS: oxpool_io::warn_limit::WarnLimit = oxpool_io::warn_limit::WarnLimit::new(10);

/// Counts one open connection in [`Shared::connections`] until dropped.
#[derive(Debug)]
pub(crate) struct ConnectionPermit(Arc<Shared>);

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A reactor's inbox of accepted connections.
#[derive(Debug, Default)]
struct Mailbox {
    state: Mutex<MailboxState>,
}

#[derive(Debug, Default)]
struct MailboxState {
    queue: VecDeque<(Stream, ConnectionPermit)>,
    commands: VecDeque<ReactorCommand>,
    waker: Option<Waker>,
}

/// What a reactor takes from its mailbox.
enum Delivery {
    Connection(Stream, ConnectionPermit),
    Command(ReactorCommand),
}

impl Mailbox {
    /// Queues a connection and wakes the reactor; false (and the connection is closed) when
    /// the mailbox is full.
    fn push(&self, stream: Stream, permit: ConnectionPermit) -> bool {
        let waker = {
            let mut state = lock(&self.state);
            if state.queue.len() >= MAILBOX_CAPACITY {
                return false;
            }
            state.queue.push_back((stream, permit));
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// Queues a command and wakes the reactor; false when the queue is full.
    fn command(&self, command: ReactorCommand) -> bool {
        let waker = {
            let mut state = lock(&self.state);
            if state.commands.len() >= MAILBOX_COMMANDS_MAX {
                return false;
            }
            state.commands.push_back(command);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    fn wake(&self) {
        let waker = lock(&self.state).waker.take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // These locks guard plain queues with no invariant a panic could break.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn reactor_thread(index: usize, shared: Arc<Shared>, listeners: Vec<Listener>) {
    let executor = LocalExecutor::new();
    executor.run_until(reactor_main(index, shared, listeners));
    // Tasks still pending after the grace period are dropped with the executor here.
    tracing::debug!(reactor = index, "nbd: reactor stopped");
}

/// The reactor's own task: starts the accept loops (reactor 0), takes connections from the
/// mailbox until shutdown, then stops its connections and waits for them, within the grace
/// period.
async fn reactor_main(index: usize, shared: Arc<Shared>, listeners: Vec<Listener>) {
    let conns = Rc::new(ReactorConns::new());
    for (listener_index, listener) in listeners.into_iter().enumerate() {
        let shared = shared.clone();
        rt::spawn_local(CatchUnwind::new(
            "accept",
            accept_loop(listener_index, listener, shared),
        ));
    }
    let mailbox = &shared.mailboxes[index];
    // Unbounded by design: one connection per iteration for the server's lifetime; the
    // iteration waits when the mailbox is empty.
    loop {
        let next = poll_fn(|cx| {
            let mut state = lock(&mailbox.state);
            if let Some(command) = state.commands.pop_front() {
                return Poll::Ready(Some(Delivery::Command(command)));
            }
            if let Some((stream, permit)) = state.queue.pop_front() {
                return Poll::Ready(Some(Delivery::Connection(stream, permit)));
            }
            // Registered under the lock that `push` and `wake` take: no wake-up is lost.
            state.waker = Some(cx.waker().clone());
            if shared.stopping() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        match next {
            None => break,
            Some(Delivery::Connection(stream, permit)) => {
                conn::spawn_connection(stream, permit, shared.clone(), conns.clone())
            }
            Some(Delivery::Command(command)) => conns.apply(command),
        }
    }
    // Connections still queued were never started: close them.
    lock(&mailbox.state).queue.clear();
    conns.stop_all();
    let drained = wait_until_drained(&conns);
    match select(drained, rt::sleep(shared.limits.shutdown_grace)).await {
        Either::Left(()) => {}
        Either::Right(()) => tracing::warn!(
            reactor = index,
            connections = conns.live(),
            "nbd: shutdown grace period over; dropping connections that did not finish"
        ),
    }
}

/// Errors of the engine as NBD errors: the protocol defines only a few values; anything
/// without an exact match (a missing or destroyed volume, a suspended pool) is EIO.
pub(crate) fn errno_for(err: &EngineError) -> Errno {
    match err.errno() {
        libc::EPERM => Errno::Perm,
        libc::ENOMEM => Errno::NoMem,
        libc::EINVAL => Errno::Inval,
        libc::ENOSPC => Errno::NoSpc,
        libc::EOVERFLOW => Errno::Overflow,
        libc::ENOTSUP => Errno::NotSup,
        libc::ESHUTDOWN => Errno::Shutdown,
        _ => Errno::Io,
    }
}

async fn wait_until_drained(conns: &ReactorConns) {
    task::wait_until(conns.drained_waker(), || conns.live() == 0).await;
}

/// Accepts connections on one listener until shutdown, handing each to a reactor.
async fn accept_loop(listener_index: usize, listener: Listener, shared: Arc<Shared>) {
    // Unbounded by design: one connection per iteration until shutdown; every iteration
    // waits for a client (or pauses after an error).
    loop {
        let stop = poll_fn(|cx| {
            // Registered before the check: a shutdown after the check finds this waker.
            lock(&shared.accept_wakers)[listener_index] = Some(cx.waker().clone());
            if shared.stopping() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        match select(listener.accept(), stop).await {
            Either::Right(()) => break,
            Either::Left(Ok(stream)) => shared.dispatch(stream),
            Either::Left(Err(err)) => {
                let fatal = matches!(
                    err.raw_os_error(),
                    Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP)
                );
                if fatal {
                    tracing::error!(%err, "nbd: accept failed; this listener stops");
                    break;
                }
                tracing::warn!(%err, "nbd: accept failed; retrying");
                rt::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
    // The listener (and its fd) closes here, once the cancelled accept has completed.
    drop(listener);
}
