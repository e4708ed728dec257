//! The control socket of `oxpool serve`: one thread accepts; each command gets a thread of
//! its own that runs it (commands are rare and some are long: a scrub with `-w`, a destroy
//! waiting for clients), with the client's console at the other end of the socket.
//!
//! A connection that is not from the serving user, that sends something other than a valid
//! request, or that vanishes mid-request ends there; nothing else is affected. The command
//! itself runs to its end even if its client goes away (as `zpool scrub` does when its
//! caller is interrupted): its output is dropped.

use crate::args::Cli;
use crate::console::Console;
use crate::control::runtime::current_uid;
use crate::host::Host;
use crate::served::Served;
use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use oxpool_control::{read_message, write_message, DecodeError, Message, ReadError};
use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Commands running at once; a connection beyond is answered "busy" and closed.
const COMMANDS_MAX: usize = 64;
/// How long a client may take to send its request once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a write to a client may block (one that stopped reading is dropped).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a command may wait for each piece of the client's standard input.
const STDIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Output buffered before it is sent as one frame.
const OUTPUT_CHUNK_BYTES: usize = 64 * 1024;
/// Longest error text sent (a longer one, e.g. quoting a huge argument, is cut).
const ERROR_TEXT_BYTES_MAX: usize = 4096;

/// The running control socket.
pub struct ControlServer {
    socket: PathBuf,
    stopping: Arc<AtomicBool>,
    /// The listening socket (a second handle on it), shut down to wake the blocked accept.
    listener: UnixListener,
    acceptor: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `socket` (mode 0600) and runs the commands it receives on `served`.
    pub fn start(served: Arc<Served>, socket: &Path) -> Result<ControlServer> {
        if socket.exists() {
            // Our own pid's name: a socket left by a process that had this pid before.
            std::fs::remove_file(socket)
                .with_context(|| format!("cannot remove stale {}", socket.display()))?;
        }
        // Created 0600 from the start (umask), not chmod-ed after: no moment where another
        // user could connect.
        // SAFETY: umask only changes this process's file-creation mask; restored below.
        let old_mask = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(socket);
        // SAFETY: as above.
        unsafe { libc::umask(old_mask) };
        let listener = bound.with_context(|| format!("cannot listen on {}", socket.display()))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let waker = listener
            .try_clone()
            .context("a second handle on the control socket")?;
        let acceptor = {
            let stopping = stopping.clone();
            std::thread::Builder::new()
                .name("oxpool-control".into())
                .spawn(move || accept_loop(listener, served, stopping))
                .context("spawn the control thread")?
        };
        Ok(ControlServer {
            socket: socket.to_path_buf(),
            stopping,
            listener: waker,
            acceptor: Some(acceptor),
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops accepting (commands still running see their console gone and stop waiting) and
    /// removes the socket.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wakes the blocking accept: shutting the listening socket down makes a blocked
        // accept(2) return (EINVAL on Linux) even when the socket's file is gone. Connecting
        // to the path, as this did before, never woke it once someone had removed the file
        // (a cleaner of the run directory), and the server then never exited.
        // SAFETY: shutdown(2) on a descriptor this struct owns and keeps open.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One running command's place in the count; given back when dropped, also when its thread
/// unwinds.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(listener: UnixListener, served: Arc<Served>, stopping: Arc<AtomicBool>) {
    let running = Arc::new(AtomicUsize::new(0));
    // Unbounded by design: one connection per iteration for the server's life.
    for stream in listener.incoming() {
        if stopping.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let busy = running.fetch_add(1, Ordering::AcqRel) >= COMMANDS_MAX;
        let slot = Running(running.clone());
        if busy {
            drop(slot);
            refuse(
                stream,
                "the server runs too many commands at once; try again",
            );
            continue;
        }
        let (served, stopping) = (served.clone(), stopping.clone());
        let _ = std::thread::Builder::new()
            .name("oxpool-command".into())
            .spawn(move || {
                let _slot = slot;
                // A bug in one command ends that command only.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    serve_connection(stream, served, stopping)
                }));
                if run.is_err() {
                    tracing::error!("control: a command panicked; its connection ends");
                }
            });
    }
}

/// `text`, cut to at most [`ERROR_TEXT_BYTES_MAX`] bytes (at a character boundary).
fn bounded(text: &str) -> String {
    if text.len() <= ERROR_TEXT_BYTES_MAX {
        return text.to_string();
    }
    let mut end = ERROR_TEXT_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Answers with an error and closes.
fn refuse(mut stream: UnixStream, why: &str) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = write_message(
        &mut stream,
        &Message::Exit {
            code: 1,
            error: bounded(why),
        },
    );
}

/// A reader that gives up once a deadline has passed, however the bytes trickle in: a
/// client cannot hold a command thread by sending its request a byte at a time.
struct Deadline<'a> {
    inner: &'a mut UnixStream,
    until: std::time::Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request took too long to arrive",
            ));
        }
        self.inner.set_read_timeout(Some(left))?;
        self.inner.read(buf)
    }
}

/// The uid of the process at the other end.
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(SO_PEERCRED) writes at most `len` bytes into the ucred we own.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

fn serve_connection(stream: UnixStream, served: Arc<Served>, stopping: Arc<AtomicBool>) {
    let owner = current_uid();
    match peer_uid(&stream) {
        Ok(uid) if uid == owner => {}
        Ok(uid) => {
            tracing::warn!(uid, "control: refused a command from another user");
            return refuse(
                stream,
                &format!(
                    "permission denied: uid {uid} may not administer this server; only uid \
                     {owner} (the user running `oxpool serve`) may use its control socket"
                ),
            );
        }
        Err(e) => return refuse(stream, &format!("cannot identify the client: {e}")),
    }
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut reader = match stream.try_clone() {
        Ok(r) => r,
        Err(_) => return,
    };
    let mut within = Deadline {
        inner: &mut reader,
        until: std::time::Instant::now() + REQUEST_TIMEOUT,
    };
    let request = match read_message(&mut within) {
        Ok(Some(Message::Request(r))) => r,
        // Connected and left: a probe for a live server.
        Ok(None) => return,
        Ok(Some(other)) => {
            return refuse(
                stream,
                &format!("expected a command request, got {}", kind_name(&other)),
            )
        }
        Err(ReadError::Decode(DecodeError::UnsupportedVersion(v))) => {
            return refuse(
                stream,
                &format!(
                    "this server speaks control protocol version 1, the command {v}: use the \
                     oxpool that runs the server"
                ),
            )
        }
        Err(e) => return refuse(stream, &format!("bad control request: {e}")),
    };
    if let Err(e) = check_cwd(&request.cwd) {
        return refuse(stream, &e.to_string());
    }
    // Long commands read nothing more unless they ask for standard input; then each piece of
    // it must come within STDIN_TIMEOUT.
    let _ = reader.set_read_timeout(Some(STDIN_TIMEOUT));
    let cli = match Cli::try_parse_from(
        std::iter::once("oxpool".to_string()).chain(request.args.iter().cloned()),
    ) {
        Ok(cli) => cli,
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid command line");
            let first = first.trim_start_matches("error: ");
            return refuse(stream, first);
        }
    };
    tracing::info!(args = ?request.args, "control: command");
    let mut console = RemoteConsole::new(stream, reader, &request.cwd, stopping);
    let host = Host::Live(served);
    let _recorded_as = crate::history::running(&request.args);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::verbs::run(cli.command, &host, &mut console)
    }))
    .unwrap_or_else(|_| {
        Err(anyhow!(
            "internal error: the command panicked (see the server's log)"
        ))
    });
    console.finish(result);
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::Request(_) => "a request",
        Message::Stdin(_) | Message::StdinEnd => "standard input",
        Message::Stdout(_) | Message::Stderr(_) => "output",
        Message::Progress { .. } => "progress",
        Message::StdinWanted => "a request for input",
        Message::Exit { .. } => "an exit status",
    }
}

/// The client's end of a command's output: frames in the order written, stdout and stderr
/// interleaved as the command wrote them.
struct Channel {
    stream: UnixStream,
    /// Buffered bytes and the stream they are for (`true`: stdout).
    buf: Vec<u8>,
    buf_is_stdout: bool,
    /// A write failed: the client is gone; everything more is dropped.
    gone: bool,
    /// The server is stopping: output fails, so a command streaming out ends.
    stopping: Arc<AtomicBool>,
}

impl Channel {
    fn send(&mut self, m: &Message) {
        if !self.gone && write_message(&mut self.stream, m).is_err() {
            self.gone = true;
        }
    }

    fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let data = std::mem::take(&mut self.buf);
        let m = if self.buf_is_stdout {
            Message::Stdout(data)
        } else {
            Message::Stderr(data)
        };
        self.send(&m);
    }

    fn write(&mut self, stdout: bool, data: &[u8]) -> std::io::Result<()> {
        if self.gone || self.stopping.load(Ordering::Acquire) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the client is gone, or the server is stopping",
            ));
        }
        if self.buf_is_stdout != stdout {
            self.flush();
            self.buf_is_stdout = stdout;
        }
        for piece in data.chunks(OUTPUT_CHUNK_BYTES) {
            self.buf.extend_from_slice(piece);
            if self.buf.len() >= OUTPUT_CHUNK_BYTES {
                self.flush();
            }
        }
        Ok(())
    }
}

/// Standard output or error of a remote console.
struct Stream {
    channel: Rc<RefCell<Channel>>,
    stdout: bool,
}

impl Write for Stream {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.channel.borrow_mut().write(self.stdout, data)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.channel.borrow_mut().flush();
        Ok(())
    }
}

/// Standard input of a remote console: asked for at the first read, then received.
struct Input {
    channel: Rc<RefCell<Channel>>,
    reader: UnixStream,
    asked: bool,
    ended: bool,
    pending: Vec<u8>,
    at: usize,
}

impl Read for Input {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if !self.asked {
            let mut chan = self.channel.borrow_mut();
            chan.flush();
            chan.send(&Message::StdinWanted);
            self.asked = true;
        }
        // Bounded: each pass receives a frame or ends.
        while self.at == self.pending.len() && !self.ended {
            match read_message(&mut self.reader) {
                Ok(Some(Message::Stdin(data))) => {
                    self.pending = data;
                    self.at = 0;
                }
                Ok(Some(Message::StdinEnd)) => self.ended = true,
                Ok(None) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the client left before the end of its input",
                    ))
                }
                Ok(Some(_)) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the client sent something else than its input",
                    ))
                }
                Err(e) => return Err(std::io::Error::other(e.to_string())),
            }
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A client's console, at the other end of the control socket.
struct RemoteConsole {
    channel: Rc<RefCell<Channel>>,
    out: Stream,
    err: Stream,
    input: Input,
    cwd: PathBuf,
    stopping: Arc<AtomicBool>,
}

impl RemoteConsole {
    fn new(
        stream: UnixStream,
        reader: UnixStream,
        cwd: &str,
        stopping: Arc<AtomicBool>,
    ) -> RemoteConsole {
        let channel = Rc::new(RefCell::new(Channel {
            stream,
            buf: Vec::new(),
            buf_is_stdout: true,
            gone: false,
            stopping: stopping.clone(),
        }));
        RemoteConsole {
            out: Stream {
                channel: channel.clone(),
                stdout: true,
            },
            err: Stream {
                channel: channel.clone(),
                stdout: false,
            },
            input: Input {
                channel: channel.clone(),
                reader,
                asked: false,
                ended: false,
                pending: Vec::new(),
                at: 0,
            },
            channel,
            cwd: PathBuf::from(cwd),
            stopping,
        }
    }

    /// Sends what is buffered and the exit status.
    fn finish(self, result: Result<()>) {
        let mut chan = self.channel.borrow_mut();
        chan.flush();
        let exit = match result {
            Ok(()) => Message::Exit {
                code: 0,
                error: String::new(),
            },
            Err(e) => Message::Exit {
                code: 1,
                error: bounded(&format!("{e:#}")),
            },
        };
        chan.send(&exit);
    }
}

impl Console for RemoteConsole {
    fn out(&mut self) -> &mut dyn Write {
        &mut self.out
    }
    fn err(&mut self) -> &mut dyn Write {
        &mut self.err
    }
    fn input(&mut self) -> &mut dyn Read {
        &mut self.input
    }
    fn progress(&mut self, label: &str, done: u64, total: u64) {
        let mut chan = self.channel.borrow_mut();
        chan.flush();
        chan.send(&Message::Progress {
            label: label.to_string(),
            done,
            total,
        });
    }
    fn progress_end(&mut self) {}
    fn gone(&self) -> bool {
        self.channel.borrow().gone || self.stopping.load(Ordering::Acquire)
    }
    fn cwd(&self) -> &Path {
        &self.cwd
    }
}

/// Fails unless the client's working directory is absolute (relative paths on its command
/// line are resolved against it, never against the server's).
fn check_cwd(path: &str) -> Result<()> {
    if !Path::new(path).is_absolute() {
        bail!("the client's working directory '{path}' is not absolute");
    }
    Ok(())
}
