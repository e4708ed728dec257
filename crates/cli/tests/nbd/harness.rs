//! Shared by the `nbd_*` tests: a temporary directory with its own pool cache file, pools on
//! sparse files in it, the real `oxpool serve` started on a free port and always killed by
//! its PID, and the real NBD clients run with a hang guard.
//!
//! A client tool that is missing makes the test fail (scripts/test installs them); nothing is
//! skipped.

#![allow(dead_code)] // Each test file uses a different part.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a client tool or the server may take before the test calls it hung. A guard
/// against hangs, not a performance assertion: far above what any step needs.
pub const HANG_LIMIT: Duration = Duration::from_secs(120);

/// The python that has the `nbd` module (python3-libnbd); a pyenv `python3` on PATH may not.
pub const PYTHON: &str = "/usr/bin/python3";

/// A python script of tests/nbd.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nbd")
        .join(name)
}

/// A temporary directory holding the cache file, the pools' files and anything else a test
/// writes; removed when dropped.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env {
            dir: tempfile::tempdir().expect("create a temporary directory"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn oxpool_command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_oxpool"));
        command
            .arg("--cache-file")
            .arg(self.path("pools.cache"))
            .current_dir(self.dir.path());
        command
    }

    /// Runs an `oxpool` command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let mut command = self.oxpool_command();
        command.args(args);
        let output = run(command, &format!("oxpool {args:?}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Creates pool `tank`, a mirror of the sparse files `first` and `second` (in the test's
    /// directory) of `size` each; returns their paths.
    pub fn mirror_tank(&self, first: &str, second: &str, size: &str) -> (PathBuf, PathBuf) {
        let (a, b) = (self.path(first), self.path(second));
        self.ok(&[
            "create",
            "tank",
            "mirror",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--size",
            size,
            "--sparse",
        ]);
        (a, b)
    }

    /// Creates pool `tank` on a sparse 1 GiB file with the given volumes (name, size, extra
    /// `-o` properties). Sparse: these tests are about the protocol and the clients, and a
    /// zero-written gigabyte per test would cost CI a second each and a gigabyte of disk.
    pub fn tank(&self, volumes: &[(&str, &str, &[&str])]) {
        let file = self.path("tank.img");
        self.ok(&[
            "create",
            "tank",
            file.to_str().unwrap(),
            "--size",
            "1G",
            "--sparse",
        ]);
        for (name, size, props) in volumes {
            let full = format!("tank/{name}");
            let mut args = vec!["vol", "create", full.as_str(), "--size", size];
            for prop in *props {
                args.push("-o");
                args.push(prop);
            }
            self.ok(&args);
        }
    }

    /// Starts `oxpool serve ARGS` and waits until it prints its URIs.
    pub fn serve(&self, args: &[&str]) -> ServerProcess {
        let mut command = self.oxpool_command();
        command.arg("serve").args(args);
        ServerProcess::start(command)
    }

    /// Runs an `oxpool` command that may fail; returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut command = self.oxpool_command();
        command.args(args);
        run_unchecked(command, &format!("oxpool {args:?}"))
    }

    /// Runs an `oxpool` command that must fail; returns its stderr, which must be one line.
    pub fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            !output.status.success(),
            "oxpool {args:?} should have failed"
        );
        let err = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
        err
    }
}

/// A running `oxpool serve`, killed (SIGKILL, by PID) when dropped unless stopped before.
pub struct ServerProcess {
    child: Option<Child>,
    /// The URIs it printed, one per export and listener.
    pub uris: Vec<String>,
    /// Everything it printed so far on stdout and stderr (filled by reader threads).
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl ServerProcess {
    /// Starts `command` (an `oxpool serve`) and waits until it is ready.
    pub fn start(mut command: Command) -> ServerProcess {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start oxpool serve");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (lines_tx, lines_rx) = channel::<String>();
        let out_pipe = child.stdout.take().expect("stdout piped");
        let err_pipe = child.stderr.take().expect("stderr piped");
        let out_buffer = stdout.clone();
        let out_reader = std::thread::spawn(move || {
            for line in BufReader::new(out_pipe).lines() {
                let Ok(line) = line else { break };
                out_buffer.lock().unwrap().push_str(&format!("{line}\n"));
                let _ = lines_tx.send(line);
            }
        });
        let err_buffer = stderr.clone();
        let err_reader = std::thread::spawn(move || {
            let mut text = String::new();
            let mut pipe = err_pipe;
            let mut chunk = [0u8; 4096];
            // Bounded by the child's lifetime: read returns 0 when it exits.
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
                        *err_buffer.lock().unwrap() = text.clone();
                    }
                }
            }
        });
        let mut server = ServerProcess {
            child: Some(child),
            uris: Vec::new(),
            stdout,
            stderr,
            readers: vec![out_reader, err_reader],
        };
        server.wait_ready(lines_rx);
        server
    }

    fn wait_ready(&mut self, lines: Receiver<String>) {
        let deadline = Instant::now() + HANG_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(uri) = line.split_whitespace().find(|w| w.starts_with("nbd")) {
                        self.uris.push(uri.to_string());
                    }
                    if line.starts_with("ready") {
                        assert!(
                            !self.uris.is_empty(),
                            "server printed no URI:\n{}",
                            self.output()
                        );
                        return;
                    }
                }
                Err(_) => panic!("oxpool serve did not become ready:\n{}", self.output()),
            }
        }
    }

    /// The URI of export `name` (`pool/vol`) on the first listener that serves it.
    pub fn uri(&self, export: &str) -> String {
        let suffix = format!("/{export}");
        self.uris
            .iter()
            .find(|u| u.ends_with(&suffix) || u.contains(&format!("{suffix}?")))
            .unwrap_or_else(|| panic!("no URI for {export} in {:?}", self.uris))
            .clone()
    }

    /// The control socket it printed.
    pub fn control_socket(&self) -> PathBuf {
        let out = self.stdout.lock().unwrap();
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("control socket: "))
            .unwrap_or_else(|| panic!("no control socket in:\n{out}"));
        PathBuf::from(line.split(" (").next().unwrap())
    }

    /// `host:port` of the TCP listener.
    pub fn tcp_addr(&self) -> String {
        let uri = self
            .uris
            .iter()
            .find(|u| u.starts_with("nbd://"))
            .expect("a TCP URI");
        let rest = &uri["nbd://".len()..];
        rest[..rest.find('/').unwrap()].to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Stdout and stderr so far, for failure messages.
    pub fn output(&self) -> String {
        format!(
            "--- stdout\n{}--- stderr\n{}",
            self.stdout.lock().unwrap(),
            self.stderr.lock().unwrap()
        )
    }

    /// Sends SIGTERM and waits for the exit; returns the status and everything printed.
    pub fn stop(self) -> (ExitStatus, String) {
        self.stop_with(libc::SIGTERM)
    }

    /// Sends `signal` (SIGTERM or SIGINT) and waits for the exit.
    pub fn stop_with(mut self, signal: libc::c_int) -> (ExitStatus, String) {
        let child = self.child.as_mut().expect("running");
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let status = wait_bounded(child, "oxpool serve after a stop signal");
        self.child = None;
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        (status, self.output())
    }

    /// SIGKILL, no cleanup of any kind (a crash).
    pub fn kill9(mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // By PID (Child::kill), never by name.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Tries `done` until it holds, every 20 ms, failing after 10 s: for what the server does
/// just after a client has gone (it counts a connection closed once it has read the
/// disconnect). A bound on a wait, not a timing assertion.
pub fn until_bounded(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // Bounded by the deadline.
    while !done() {
        assert!(Instant::now() < deadline, "{what}: still not so after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit, killing it (by PID) and failing after [`HANG_LIMIT`].
pub fn wait_bounded(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + HANG_LIMIT;
    // Bounded by the deadline.
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {HANG_LIMIT:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion within [`HANG_LIMIT`]; a missing program is a failure.
pub fn run_unchecked(mut command: Command, what: &str) -> Output {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| {
        panic!(
            "{what}: cannot run {:?}: {e} (scripts/test installs the NBD client tools)",
            command.get_program()
        )
    });
    // Drain the pipes on threads so a chatty tool cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let status = wait_bounded(&mut child, what);
    Output {
        status,
        stdout: out_thread.join().unwrap(),
        stderr: err_thread.join().unwrap(),
    }
}

/// Runs a command that must succeed.
pub fn run(command: Command, what: &str) -> Output {
    let output = run_unchecked(command, what);
    assert!(
        output.status.success(),
        "{what} failed ({}):\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `program args...` that must succeed; returns its stdout.
pub fn tool(program: &str, args: &[&str]) -> String {
    let mut command = Command::new(program);
    command.args(args);
    let output = run(command, &format!("{program} {args:?}"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs a python libnbd script of tests/nbd that must succeed; returns its stdout.
pub fn python(name: &str, args: &[&str]) -> String {
    let mut command = Command::new(PYTHON);
    command.arg(script(name)).args(args);
    let output = run(command, &format!("{name} {args:?}"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Deterministic pseudo-random bytes (xorshift), so tests need no RNG crate.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The NBD URI of `export` on `server`'s TCP listener (also for exports added after it
/// started).
pub fn tcp_uri(server: &ServerProcess, export: &str) -> String {
    format!("nbd://{}/{export}", server.tcp_addr())
}

/// `nbdinfo --list` of `server`'s TCP listener.
pub fn exports(server: &ServerProcess) -> String {
    tool(
        "nbdinfo",
        &["--list", &format!("nbd://{}", server.tcp_addr())],
    )
}

/// `qemu-img convert` of a raw file onto an export (its whole size).
pub fn put(file: impl AsRef<std::path::Path>, uri: &str) {
    let file = file.as_ref().to_str().expect("a UTF-8 path");
    tool(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", file, uri],
    );
}

/// `hold.py` on `uri`, once it has the export open (it wrote and flushed a block).
pub fn hold(uri: &str) -> Child {
    hold_with(uri, "rw")
}

/// `hold.py` on `uri`, once it has the export open, only reading (a read-only export, or
/// content the test must keep).
pub fn hold_reading(uri: &str) -> Child {
    hold_with(uri, "ro")
}

fn hold_with(uri: &str, mode: &str) -> Child {
    hold_by(Command::new(PYTHON), uri, mode)
}

/// `hold.py` on `uri` in `mode` ("rw" or "ro"), run by `python` (the interpreter, or a
/// command that runs it: in a network namespace), once it has the export open.
pub fn hold_by(mut python: Command, uri: &str, mode: &str) -> Child {
    let mut child = python
        .arg(script("hold.py"))
        .arg(uri)
        .arg(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hold.py");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "open", "hold.py did not open {uri}");
    child
}

/// Lets `hold.py` try a read; returns what it says.
pub fn release(mut child: Child) -> String {
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut rest)
        .unwrap();
    assert!(child.wait().unwrap().success(), "hold.py failed: {rest}");
    rest.trim().to_string()
}
