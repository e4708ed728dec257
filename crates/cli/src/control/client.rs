//! The client side of the control socket: sends a command line to the server that owns the
//! pool, and plays back what the command prints, its progress (a bar on a terminal) and its
//! exit status, feeding it standard input if it asks.

use crate::progress::Bar;
use anyhow::{anyhow, Result};
use oxpool_control::{read_message, write_message, Message, Request, PAYLOAD_BYTES_MAX};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Bytes of standard input per frame.
const STDIN_CHUNK_BYTES: usize = 256 * 1024;
const _: () = assert!(STDIN_CHUNK_BYTES + 64 <= PAYLOAD_BYTES_MAX);

/// Runs `args` (the command line after the program name) in the server at the other end of
/// `stream` (connected to `socket`); returns the command's exit status. Interrupting this
/// process leaves the command running in the server.
pub fn forward(stream: UnixStream, socket: &Path, args: Vec<String>) -> Result<i32> {
    forward_counted(stream, socket, args, false).map(|(code, _)| code)
}

/// As [`forward`], also returning how many bytes the command printed to standard output
/// (`status -x` says "all pools are healthy" when no pool printed anything). With
/// `discard_stdout`, that output is not printed (a listing run for its errors only).
pub fn forward_counted(
    mut stream: UnixStream,
    socket: &Path,
    args: Vec<String>,
    discard_stdout: bool,
) -> Result<(i32, u64)> {
    let mut stdout_bytes = 0u64;
    let stderr_is_terminal = std::io::stderr().is_terminal();
    let lost = |e: &dyn std::fmt::Display| lost_connection(socket, e);
    let sent = send_request(&mut stream, args, stderr_is_terminal)?;
    let mut bar = Bar::new(stderr_is_terminal);
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr();
    let mut pump = None;
    // Bounded by the command: the server sends a finite stream ending with Exit.
    loop {
        let message = match (read_message(&mut stream), &sent) {
            (Ok(m), _) => m,
            (Err(_), Err(e)) => return Err(lost(e)),
            (Err(e), Ok(())) => return Err(lost(&e)),
        };
        match message {
            Some(Message::Stdout(_)) if discard_stdout => {}
            Some(Message::Stdout(data)) => {
                bar.clear(&mut stderr);
                stdout.write_all(&data)?;
                stdout_bytes += data.len() as u64;
            }
            Some(Message::Stderr(data)) => {
                bar.clear(&mut stderr);
                stdout.flush()?;
                stderr.write_all(&data)?;
            }
            Some(Message::Progress { label, done, total }) => {
                stdout.flush()?;
                bar.draw(&mut stderr, &label, done, total);
            }
            Some(Message::StdinWanted) => {
                if pump.is_none() {
                    let writer = stream.try_clone()?;
                    pump = Some(std::thread::spawn(move || pump_stdin(writer)));
                }
            }
            Some(Message::Exit { code, error }) => {
                bar.clear(&mut stderr);
                stdout.flush()?;
                if !error.is_empty() {
                    eprintln!("oxpool: {error}");
                }
                return Ok((code, stdout_bytes));
            }
            Some(other) => return Err(lost(&format!("unexpected {other:?}"))),
            None => match &sent {
                Err(e) => return Err(lost(e)),
                Ok(()) => return Err(lost(&"it closed the connection")),
            },
        }
    }
}

/// Runs `args` in the server at the other end of `stream` as [`forward`] does, for a question
/// one command asks (which pool holds a snapshot): what the command prints to standard
/// output is kept and returned with its exit status; its standard error and progress are
/// dropped, and it gets no standard input.
pub fn ask(mut stream: UnixStream, socket: &Path, args: Vec<String>) -> Result<(i32, Vec<u8>)> {
    let sent = send_request(&mut stream, args, false)?;
    let lost = |e: &dyn std::fmt::Display| lost_connection(socket, e);
    let mut out = Vec::new();
    // Bounded by the command: the server sends a finite stream ending with Exit.
    loop {
        match (read_message(&mut stream), &sent) {
            (Ok(Some(Message::Stdout(data))), _) => out.extend_from_slice(&data),
            (Ok(Some(Message::Stderr(_) | Message::Progress { .. })), _) => {}
            (Ok(Some(Message::Exit { code, .. })), _) => return Ok((code, out)),
            (Ok(Some(other)), _) => return Err(lost(&format!("unexpected {other:?}"))),
            (Ok(None), Err(e)) | (Err(_), Err(e)) => return Err(lost(e)),
            (Ok(None), Ok(())) => return Err(lost(&"it closed the connection")),
            (Err(e), Ok(())) => return Err(lost(&e)),
        }
    }
}

/// The error of a connection to the server at `socket` lost in the middle of a command.
fn lost_connection(socket: &Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow!(
        "lost the connection to the server at {} ({e}); the command may still run there",
        socket.display()
    )
}

/// Sends the request to run `args` (in this process's working directory). A server that
/// refuses (another user's, one too busy) answers and closes without reading: the write may
/// fail and the answer still be there to read, so that failure is returned for the caller
/// to report only if no answer comes. A command line too long to send is an error at once.
fn send_request(
    stream: &mut UnixStream,
    args: Vec<String>,
    stderr_is_terminal: bool,
) -> Result<std::io::Result<()>> {
    let cwd = std::env::current_dir()?;
    let cwd = cwd
        .to_str()
        .ok_or_else(|| anyhow!("the working directory is not UTF-8"))?
        .to_string();
    let sent = write_message(
        stream,
        &Message::Request(Request {
            args,
            cwd,
            stderr_is_terminal,
        }),
    );
    if let Err(e) = &sent {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            return Err(anyhow!(
                "the command line is too long to send to the server: {e}"
            ));
        }
    }
    Ok(sent)
}

/// Sends standard input to the server, then its end. If reading it fails, the end is not
/// sent: the connection's writing side is shut instead, so the command sees its input cut
/// short and fails rather than taking a truncated input for the whole.
fn pump_stdin(mut stream: UnixStream) {
    let mut input = std::io::stdin().lock();
    let mut buf = vec![0u8; STDIN_CHUNK_BYTES];
    // Bounded by the input's length.
    loop {
        match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if write_message(&mut stream, &Message::Stdin(buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("oxpool: cannot read standard input: {e}");
                let _ = stream.shutdown(std::net::Shutdown::Write);
                return;
            }
        }
    }
    let _ = write_message(&mut stream, &Message::StdinEnd);
}
