//! Replication between two hosts over a link that drops: `oxpool recv -s` in one network
//! namespace behind `socat` listening on TCP, `oxpool send` streamed from the other through
//! `socat`, the two joined by a veth pair (iproute2). Mid-stream the link goes down (`ip
//! link set ... down`) with data in flight; the receiver's socat gives up after 3 idle
//! seconds, so `recv -s` sees its input end early and saves what it applied. The link comes
//! back, `send -t` with the receiver's `receive_resume_token` sends the rest, and the
//! received snapshot equals the source byte for byte; the receiving pool audits clean.
//!
//! Needs root (CI runs as root); without network namespaces the test says why and fails.
//! Every process it starts is stopped by its PID.

#[path = "nbd/harness.rs"]
mod harness;
#[path = "nbd/two_hosts.rs"]
mod two_hosts;

use harness::{random_bytes, run, Env};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use two_hosts::{TwoHosts, SERVER_IP};

const MIB: usize = 1 << 20;
const PORT: &str = "10810";

/// A child process killed by its PID when dropped (unless it was waited for).
struct Proc {
    child: Option<Child>,
    what: &'static str,
}

impl Proc {
    fn spawn(mut command: Command, what: &'static str) -> Proc {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Proc {
            child: Some(child),
            what,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits for it (at most `HANG_LIMIT`); its exit success and standard error.
    fn wait(mut self) -> (bool, String) {
        let mut child = self.child.take().unwrap();
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let deadline = Instant::now() + harness::HANG_LIMIT;
            // Bounded by the deadline.
            while child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "{} hung", self.what);
                std::thread::sleep(Duration::from_millis(50));
            }
            e.read_to_string(&mut stderr).unwrap();
        }
        let status = child.wait().unwrap();
        (status.success(), stderr)
    }

    fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `oxpool --cache-file CACHE ARGS` in namespace `ns`.
fn oxpool_in(env: &Env, ns: &str, cache: &str, args: &[&str]) -> Command {
    let mut command = TwoHosts::command_in(ns, env!("CARGO_BIN_EXE_oxpool"));
    command
        .arg("--cache-file")
        .arg(env.path(cache))
        .args(args)
        .current_dir(env.dir.path());
    command
}

/// Bytes the process has read so far (`rchar` of /proc/PID/io).
fn bytes_read(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The receiving end: `socat` listening in the server's namespace, its output piped into
/// `oxpool recv -s dest/copy` there. Returns (socat, recv).
fn receiver(env: &Env, hosts: &TwoHosts) -> (Proc, Proc) {
    let mut socat = TwoHosts::command_in(&hosts.server_ns, "socat");
    socat
        .args([
            "-u",
            "-T",
            "3",
            &format!("TCP-LISTEN:{PORT},bind={SERVER_IP},reuseaddr"),
            "STDOUT",
        ])
        .stdout(Stdio::piped());
    let mut socat = Proc::spawn(socat, "socat (receiver)");
    let stdout = socat.child.as_mut().unwrap().stdout.take().unwrap();
    let mut recv = oxpool_in(
        env,
        &hosts.server_ns,
        "dest.cache",
        &["recv", "-s", "dest/copy"],
    );
    recv.stdin(Stdio::from(stdout)).stderr(Stdio::piped());
    (socat, Proc::spawn(recv, "oxpool recv -s"))
}

/// The sending end: `socat` in the client's namespace connecting to the receiver (retrying
/// until it listens), fed by a thread writing `stream`. The thread writes the first
/// `pause_at` bytes, then waits for a word on the returned channel before writing the rest
/// (errors ignored: the link may be gone).
fn sender(
    hosts: &TwoHosts,
    stream: Vec<u8>,
    pause_at: usize,
) -> (Proc, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let mut socat = TwoHosts::command_in(&hosts.client_ns, "socat");
    socat
        .args([
            "-u",
            "STDIN",
            &format!("TCP:{SERVER_IP}:{PORT},retry=100,interval=0.1"),
        ])
        .stdin(Stdio::piped());
    let mut socat = Proc::spawn(socat, "socat (sender)");
    let mut stdin = socat.child.as_mut().unwrap().stdin.take().unwrap();
    let (go, wait) = mpsc::channel::<()>();
    let pump = std::thread::spawn(move || {
        if stdin.write_all(&stream[..pause_at]).is_err() {
            return;
        }
        let _ = wait.recv();
        let _ = stdin.write_all(&stream[pause_at..]);
    });
    (socat, go, pump)
}

/// `receive_resume_token` of dest/copy on the receiving host, if it has one.
fn resume_token(env: &Env, hosts: &TwoHosts) -> Option<String> {
    let got = run(
        oxpool_in(
            env,
            &hosts.server_ns,
            "dest.cache",
            &["get", "receive_resume_token", "dest/copy"],
        ),
        "oxpool get receive_resume_token",
    );
    String::from_utf8_lossy(&got.stdout)
        .split_whitespace()
        .find(|w| w.starts_with("oxp1-"))
        .map(str::to_string)
}

fn read_volume(env: &Env, ns: &str, cache: &str, vol: &str) -> Vec<u8> {
    let path: PathBuf = env.path("read.raw");
    run(
        oxpool_in(
            env,
            ns,
            cache,
            &["vol", "read", vol, path.to_str().unwrap()],
        ),
        "oxpool vol read",
    );
    std::fs::read(&path).unwrap()
}

#[test]
fn a_send_across_a_link_that_drops_resumes_from_the_token() {
    // Declared first so it is dropped last: the processes stop before the namespaces go.
    let hosts = TwoHosts::new("oxsr");
    let env = Env::new();
    env.tank(&[("vol0", "48M", &["compression=lz4"])]);
    let image = random_bytes(41, 48 * MIB);
    let source = env.path("source.raw");
    std::fs::write(&source, &image).unwrap();
    env.ok(&["vol", "write", "tank/vol0", source.to_str().unwrap()]);
    env.ok(&["snapshot", "tank/vol0@one"]);
    let dest = env.path("dest.img");
    run(
        oxpool_in(
            &env,
            &hosts.server_ns,
            "dest.cache",
            &[
                "create",
                "dest",
                dest.to_str().unwrap(),
                "--size",
                "1G",
                "--sparse",
            ],
        ),
        "oxpool create dest",
    );

    // The stream, made on the sending host.
    let send = oxpool_in(
        &env,
        &hosts.client_ns,
        "pools.cache",
        &["send", "tank/vol0@one"],
    );
    let stream = run(send, "oxpool send").stdout;
    assert!(stream.len() > 40 * MIB);

    let (recv_socat, recv) = receiver(&env, &hosts);
    let stream_len = stream.len();
    let pause_at = stream_len * 3 / 5;
    let (send_socat, go, pump) = sender(&hosts, stream, pause_at);
    // Wait until the receiver has read half the stream (it then has applied records well
    // into the volume), then cut the link and let the sender write the rest into it.
    let half = (pause_at / 2) as u64;
    let deadline = Instant::now() + harness::HANG_LIMIT;
    // Bounded by the deadline.
    while bytes_read(recv.pid()) < half {
        assert!(
            Instant::now() < deadline,
            "the receiver never read half the stream"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    hosts.set_link(false);
    go.send(()).unwrap();
    // The receiver's socat gives up after 3 idle seconds; recv sees its input end early.
    let (ok, stderr) = recv.wait();
    assert!(!ok, "the receive succeeded over a cut link: {stderr}");
    assert!(
        stderr.contains("partially received state saved"),
        "recv -s: {stderr}"
    );
    recv_socat.kill();
    send_socat.kill();
    pump.join().unwrap();
    hosts.set_link(true);

    // The token, from the receiving host's pool.
    let token = resume_token(&env, &hosts).expect("no receive_resume_token after the cut");
    assert!(
        stderr.contains(&token),
        "the error names the token: {stderr}"
    );

    // The rest of the stream, from the token, over the link again.
    let resume = oxpool_in(
        &env,
        &hosts.client_ns,
        "pools.cache",
        &["send", "-t", &token],
    );
    let rest = run(resume, "oxpool send -t").stdout;
    let (recv_socat, recv) = receiver(&env, &hosts);
    let rest_len = rest.len();
    let (send_socat, go, pump) = sender(&hosts, rest, rest_len);
    go.send(()).unwrap();
    let (ok, stderr) = recv.wait();
    assert!(ok, "the resumed receive failed: {stderr}");
    pump.join().unwrap();
    recv_socat.kill();
    send_socat.kill();
    // Only the rest was sent: what the receiver had read before the cut is not sent again.
    assert!(
        rest_len < stream_len - half as usize + MIB,
        "the resumed stream is {rest_len} bytes of {stream_len}; {half} were read before the cut"
    );

    assert!(
        read_volume(&env, &hosts.server_ns, "dest.cache", "dest/copy") == image,
        "the received volume differs from the source"
    );
    // The received snapshot is the sender's (its guid), and the head is still equal to it.
    let guid = |ns: &str, cache: &str, snap: &str| {
        let out = run(
            oxpool_in(&env, ns, cache, &["get", "-H", "-o", "value", "guid", snap]),
            "oxpool get guid",
        );
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        out.trim_end().parse::<u64>().ok()
    };
    let sent = guid(&hosts.client_ns, "pools.cache", "tank/vol0@one");
    assert!(sent.is_some_and(|g| g != 0));
    assert_eq!(guid(&hosts.server_ns, "dest.cache", "dest/copy@one"), sent);
    let written = run(
        oxpool_in(
            &env,
            &hosts.server_ns,
            "dest.cache",
            &["get", "-H", "-p", "-o", "value", "written", "dest/copy"],
        ),
        "oxpool get written",
    );
    let written = String::from_utf8_lossy(&written.stdout).into_owned();
    assert_eq!(written, "0\n", "the head moved on");
    let audit = run(
        oxpool_in(&env, &hosts.server_ns, "dest.cache", &["audit", "dest"]),
        "oxpool audit dest",
    );
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.contains(" 0 leaked, 0 problems"),
        "the receiving pool does not audit clean: {audit}"
    );
    assert_eq!(
        resume_token(&env, &hosts),
        None,
        "a token is left after the receive completed"
    );
}
