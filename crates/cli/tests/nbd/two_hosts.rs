//! Two hosts on one machine: two network namespaces joined by a veth pair (iproute2),
//! shared by the tests that need a client on another host.
//!
//! Needs root (CI runs as root). If the namespaces cannot be made, the test says why and
//! fails; it never passes without running. The namespaces (and with them the veth pair) are
//! deleted by name when dropped, also when the test fails.

#![allow(dead_code)] // Each test file uses a different part.

use crate::harness::{run, run_unchecked, Env};
use std::process::{Command, Output};

/// The server's address on its side of the veth pair (198.18.0.0/15 is set aside for
/// network tests, RFC 2544; it never leaves these namespaces).
pub const SERVER_IP: &str = "198.18.0.1";
/// The client's address.
pub const CLIENT_IP: &str = "198.18.0.2";

/// Two network namespaces joined by a veth pair; deleted (by name) when dropped.
pub struct TwoHosts {
    pub server_ns: String,
    pub client_ns: String,
    /// The client's end of the veth pair.
    veth_client: String,
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl TwoHosts {
    /// Namespaces `PREFIX-PID-server` and `PREFIX-PID-client` (a short prefix: interface
    /// names are at most 15 bytes).
    pub fn new(prefix: &str) -> TwoHosts {
        let id = std::process::id();
        let mut hosts = TwoHosts {
            server_ns: format!("{prefix}-{id}-server"),
            client_ns: format!("{prefix}-{id}-client"),
            veth_client: format!("ox{id}c"),
            created: Vec::new(),
        };
        if let Err(why) = hosts.set_up(id) {
            panic!(
                "cannot make two network namespaces joined by a veth pair (this test needs \
                 root and iproute2): {why}"
            );
        }
        hosts
    }

    fn set_up(&mut self, id: u32) -> Result<(), String> {
        let (server, client) = (self.server_ns.clone(), self.client_ns.clone());
        for ns in [&server, &client] {
            ip(&["netns", "add", ns])?;
            self.created.push(ns.clone());
        }
        // Interface names are at most 15 bytes.
        let (veth_server, veth_client) = (format!("ox{id}s"), self.veth_client.clone());
        ip(&[
            "link",
            "add",
            &veth_server,
            "type",
            "veth",
            "peer",
            "name",
            &veth_client,
        ])?;
        // Moved into the namespaces at once, so deleting them deletes the pair.
        ip(&["link", "set", &veth_server, "netns", &server])?;
        ip(&["link", "set", &veth_client, "netns", &client])?;
        for (ns, dev, addr) in [
            (&server, &veth_server, SERVER_IP),
            (&client, &veth_client, CLIENT_IP),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// `program` to run in namespace `ns` (`ip netns exec` execs it: the child's PID is
    /// the program's).
    pub fn command_in(ns: &str, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns, program]);
        command
    }

    /// Takes the link between the hosts down (`up` false) or brings it back.
    pub fn set_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        if let Err(e) = ip(&[
            "-n",
            &self.client_ns,
            "link",
            "set",
            &self.veth_client,
            state,
        ]) {
            panic!("cannot set the link {state}: {e}");
        }
    }

    /// `program args` run in the client's namespace (must succeed); its stdout.
    pub fn client(&self, program: &str, args: &[&str]) -> String {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.client_ns, program])
            .args(args);
        let output = run(command, &format!("{program} {args:?} on the client host"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Like `client`, for a command that must fail; libnbd's debug log is on, so its stderr
    /// carries the server's error message.
    pub fn client_refused(&self, program: &str, args: &[&str]) -> Output {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.client_ns, program])
            .args(args)
            .env("LIBNBD_DEBUG", "1");
        let output = run_unchecked(command, &format!("{program} {args:?} on the client host"));
        assert!(
            !output.status.success(),
            "{program} {args:?} should have been refused"
        );
        output
    }

    /// `oxpool --cache-file ... serve ARGS` in the server's namespace (`ip netns exec` execs
    /// it, so the process is oxpool itself, stopped by its PID).
    pub fn serve_command(&self, env: &Env, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                &self.server_ns,
                env!("CARGO_BIN_EXE_oxpool"),
            ])
            .arg("--cache-file")
            .arg(env.path("pools.cache"))
            .arg("serve")
            .args(args)
            .current_dir(env.dir.path());
        command
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for ns in self.created.drain(..) {
            if let Err(err) = ip(&["netns", "del", &ns]) {
                eprintln!("cleanup: {err}");
            }
        }
    }
}
