//! Where a command's output goes and its input comes from: this process's own terminal, or,
//! for a command a server runs on a client's behalf, the client's over the control socket.
//! Verbs print through a [`Console`] only, so what a served pool's command prints is byte for
//! byte what the same command prints on an exported pool.

use crate::progress::Bar;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

/// A command's terminal.
pub trait Console {
    /// Standard output.
    fn out(&mut self) -> &mut dyn Write;
    /// Standard error (warnings; the final error is the caller's to print).
    fn err(&mut self) -> &mut dyn Write;
    /// Standard input.
    fn input(&mut self) -> &mut dyn Read;
    /// How far a long operation has come: a bar on a terminal's standard error, nothing
    /// elsewhere.
    fn progress(&mut self, label: &str, done: u64, total: u64);
    /// The long operation is over: the bar goes away.
    fn progress_end(&mut self);
    /// Whether whoever asked is gone (a client that disconnected or was interrupted): wait
    /// loops stop waiting, and the operation goes on without them.
    fn gone(&self) -> bool;
    /// The directory relative paths on the command line are relative to.
    fn cwd(&self) -> &Path;

    /// A path from the command line, as its user meant it.
    fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.cwd().join(p)
        }
    }
}

/// A writer that counts the bytes written through it.
pub struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// This process's standard streams.
pub struct LocalConsole {
    out: Counted<std::io::Stdout>,
    /// Standard output while muted.
    muted: Option<std::io::Sink>,
    err: std::io::Stderr,
    input: std::io::Stdin,
    bar: Bar,
    cwd: PathBuf,
}

impl LocalConsole {
    /// The process's own streams and working directory.
    pub fn new() -> LocalConsole {
        LocalConsole {
            out: Counted {
                inner: std::io::stdout(),
                bytes: 0,
            },
            muted: None,
            err: std::io::stderr(),
            input: std::io::stdin(),
            bar: Bar::new(std::io::stderr().is_terminal()),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        }
    }
}

impl LocalConsole {
    /// Bytes printed to standard output so far.
    pub fn out_bytes(&self) -> u64 {
        self.out.bytes
    }

    /// While `muted`, standard output is discarded (a listing run for its errors only);
    /// standard error is not.
    pub fn set_muted(&mut self, muted: bool) {
        self.muted = muted.then(std::io::sink);
    }
}

impl Console for LocalConsole {
    fn out(&mut self) -> &mut dyn Write {
        match &mut self.muted {
            Some(sink) => sink,
            None => &mut self.out,
        }
    }
    fn err(&mut self) -> &mut dyn Write {
        &mut self.err
    }
    fn input(&mut self) -> &mut dyn Read {
        &mut self.input
    }
    fn progress(&mut self, label: &str, done: u64, total: u64) {
        self.bar.draw(&mut self.err, label, done, total);
    }
    fn progress_end(&mut self) {
        self.bar.clear(&mut self.err);
    }
    fn gone(&self) -> bool {
        false
    }
    fn cwd(&self) -> &Path {
        &self.cwd
    }
}

/// Writes one line to this process's standard output, ignoring a failure. For what a server
/// says while it runs (exports added, its shutdown): its output may be a pipe whose reader
/// has left (`oxpool serve | head -3`), where `println!` would panic in the thread saying it.
pub fn say_out(line: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// As [`say_out`], to standard error. The signal thread says "stopping" here: had it
/// panicked on a closed pipe, no later SIGTERM or SIGINT could stop the server.
pub fn say_err(line: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
