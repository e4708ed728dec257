//! `oxpool serve --tcp-congestion`: with the server host's default congestion control set to
//! BBR (per network namespace), a client on the same host (over loopback, or to the server's
//! own address) gets cubic on the server's side of its connection under the default `auto`,
//! a client on another host keeps BBR; `system` leaves BBR everywhere; a name is set on every
//! connection. Read from the kernel with `ss -ti` while a real client (libnbd) holds the
//! export open.
//!
//! Needs root, iproute2 and the kernel's bbr (CI runs as root). If the namespaces cannot be
//! made, the test says why and fails; it never passes without running.

#[path = "nbd/harness.rs"]
mod harness;
#[path = "nbd/two_hosts.rs"]
mod two_hosts;

use harness::{hold_by, release, run, Env, ServerProcess, PYTHON};
use std::process::Child;
use two_hosts::{TwoHosts, SERVER_IP};

const PORT: &str = "10809";

/// `hold.py` (libnbd: connects, reads a block, waits for a line on stdin) on `uri`, run in
/// network namespace `ns`, once it has the export open.
fn hold_in(ns: &str, uri: &str) -> Child {
    hold_by(TwoHosts::command_in(ns, PYTHON), uri, "ro")
}

/// The congestion control of each established connection of the server's side (local port
/// `PORT`) in namespace `ns`, from `ss -Htin`: the name is the token of the socket's info
/// line that is one of the kernel's congestion controls.
fn server_side_congestion(ns: &str) -> Vec<String> {
    let mut command = TwoHosts::command_in(ns, "ss");
    command.args([
        "-H",
        "-t",
        "-i",
        "-n",
        "state",
        "established",
        "sport",
        "=",
        &format!(":{PORT}"),
    ]);
    let output = run(command, "ss -ti in the server's namespace");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let known = ["cubic", "reno", "bbr"];
    let found: Vec<String> = text
        .lines()
        .filter_map(|line| {
            line.split_whitespace()
                .find(|token| known.contains(token))
                .map(str::to_string)
        })
        .collect();
    assert!(
        !found.is_empty() || text.trim().is_empty(),
        "unparsed ss output: {text}"
    );
    found
}

/// The congestion control of the server's side of one connection from `client_ns` to
/// `addr`, while the client holds it open.
fn congestion_of_connection(hosts: &TwoHosts, client_ns: &str, addr: &str) -> String {
    let holder = hold_in(client_ns, &format!("nbd://{addr}:{PORT}/tank/vol0"));
    let found = server_side_congestion(&hosts.server_ns);
    assert_eq!(release(holder), "still connected");
    assert_eq!(
        found.len(),
        1,
        "one connection to {addr} expected: {found:?}"
    );
    found[0].clone()
}

fn serve(hosts: &TwoHosts, env: &Env, extra: &[&str]) -> ServerProcess {
    let listen = format!("0.0.0.0:{PORT}");
    let mut args = vec!["--listen", &listen, "--tls", "off"];
    args.extend_from_slice(extra);
    ServerProcess::start(hosts.serve_command(env, &args))
}

#[test]
fn same_host_clients_are_not_paced_by_bbr_and_other_hosts_keep_the_system_choice() {
    // Declared first so it is dropped last: the servers stop before their namespace goes.
    let hosts = TwoHosts::new("oxcc");
    // /proc/sys/net is the namespace's own for a process in it.
    let mut sysctl = TwoHosts::command_in(&hosts.server_ns, "sh");
    sysctl.args(["-c", "echo bbr > /proc/sys/net/ipv4/tcp_congestion_control"]);
    let output = sysctl.output().expect("run sh");
    assert!(
        output.status.success(),
        "this test needs the kernel's bbr congestion control as a namespace's default: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let env = Env::new();
    env.tank(&[("vol0", "32M", &[])]);

    // Default (auto): same host, over loopback and to the server's own address: cubic.
    // Another host: the system's bbr.
    let server = serve(&hosts, &env, &[]);
    assert_eq!(
        congestion_of_connection(&hosts, &hosts.server_ns, "127.0.0.1"),
        "cubic"
    );
    assert_eq!(
        congestion_of_connection(&hosts, &hosts.server_ns, SERVER_IP),
        "cubic"
    );
    assert_eq!(
        congestion_of_connection(&hosts, &hosts.client_ns, SERVER_IP),
        "bbr"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");

    // system: bbr even over loopback.
    let server = serve(&hosts, &env, &["--tcp-congestion", "system"]);
    assert_eq!(
        congestion_of_connection(&hosts, &hosts.server_ns, "127.0.0.1"),
        "bbr"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");

    // A name: on every connection, from any host.
    let server = serve(&hosts, &env, &["--tcp-congestion", "reno"]);
    assert_eq!(
        congestion_of_connection(&hosts, &hosts.client_ns, SERVER_IP),
        "reno"
    );
    assert_eq!(
        congestion_of_connection(&hosts, &hosts.server_ns, "127.0.0.1"),
        "reno"
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// A congestion control the kernel lacks: `serve` says so in one line, naming what it has,
/// and starts nothing (no pool opened, no socket bound).
#[test]
fn a_congestion_control_the_kernel_lacks_is_refused_before_anything_starts() {
    let env = Env::new();
    env.tank(&[("vol0", "32M", &[])]);
    let mut command = env.oxpool_command();
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--tcp-congestion",
        "nosuchcc",
    ]);
    let output = command.output().expect("run oxpool serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "served with an unknown congestion control"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--tcp-congestion nosuchcc: the kernel has no TCP congestion control")
            && stderr.contains("available:"),
        "{stderr}"
    );
    // The pool is untouched and free: it imports again for the next command.
    let listed = env.ok(&["list", "-H"]);
    assert!(listed.contains("tank"), "{listed}");
}
