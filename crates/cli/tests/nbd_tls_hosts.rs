//! Two hosts on one machine: `oxpool serve` in one network namespace, the real clients in
//! another, joined by a veth pair (iproute2). The server listens on its non-loopback address
//! with no `--tls` option: TLS is then required by default.
//!
//! Needs root (CI runs as root). If the namespaces cannot be made, the test says why and
//! fails; it never passes without running. The namespaces (and with them the veth pair) are
//! deleted by name when the test ends, also when it fails.

#[path = "nbd/harness.rs"]
mod harness;
#[path = "nbd/tls.rs"]
mod tls;

use harness::{random_bytes, run, run_unchecked, Env, ServerProcess};
use std::path::Path;
use std::process::{Command, Output};
use tls::*;

const MIB: usize = 1 << 20;

/// The server's address on its side of the veth pair (198.18.0.0/15 is set aside for
/// network tests, RFC 2544; it never leaves these namespaces).
const SERVER_IP: &str = "198.18.0.1";
const CLIENT_IP: &str = "198.18.0.2";
const PORT: &str = "10809";

/// Two network namespaces joined by a veth pair; deleted (by name) when dropped.
struct TwoHosts {
    server_ns: String,
    client_ns: String,
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
    fn new() -> TwoHosts {
        let id = std::process::id();
        let mut hosts = TwoHosts {
            server_ns: format!("oxtls-{id}-server"),
            client_ns: format!("oxtls-{id}-client"),
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
        let (veth_server, veth_client) = (format!("oxt{id}s"), format!("oxt{id}c"));
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

    /// `program args` run in the client's namespace (must succeed); its stdout.
    fn client(&self, program: &str, args: &[&str]) -> String {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.client_ns, program])
            .args(args);
        let output = run(command, &format!("{program} {args:?} on the client host"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Like `client`, for a command that must fail.
    fn client_refused(&self, program: &str, args: &[&str]) -> Output {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.client_ns, program])
            .args(args);
        let output = run_unchecked(command, &format!("{program} {args:?} on the client host"));
        assert!(
            !output.status.success(),
            "{program} {args:?} should have been refused"
        );
        output
    }

    /// `oxpool --cache-file ... serve ARGS` in the server's namespace (`ip netns exec` execs
    /// it, so the process is oxpool itself, stopped by its PID).
    fn serve_command(&self, env: &Env, args: &[&str]) -> Command {
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

#[test]
fn across_hosts_tls_is_required_by_default_on_a_non_loopback_address() {
    // Declared first so it is dropped last: the server is stopped before its namespace goes.
    let hosts = TwoHosts::new();
    let env = Env::new();
    env.tank(&[("vol0", "32M", &[])]);
    let pki = make_pki(&env, &[SERVER_IP]);
    let listen = format!("{SERVER_IP}:{PORT}");

    // No TLS option at all: refused to start without credentials (or, if this machine has
    // certificates in the default directory, started with TLS required). Never clear text.
    if !Path::new("/etc/pki/oxpool").exists() {
        let command = hosts.serve_command(&env, &["--listen", &listen]);
        let output = run_unchecked(command, "oxpool serve on a non-loopback address");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "served without TLS: {stderr}");
        assert!(
            stderr.contains("TLS is required on a non-loopback address"),
            "{stderr}"
        );
    } else {
        let server = ServerProcess::start(hosts.serve_command(&env, &["--listen", &listen]));
        assert!(
            server.output().contains("TLS: required"),
            "{}",
            server.output()
        );
        let (status, output) = server.stop();
        assert!(status.success(), "{output}");
    }

    // Certificates, still no --tls: required.
    let server = ServerProcess::start(hosts.serve_command(
        &env,
        &[
            "--listen",
            &listen,
            "--tls-certificates",
            pki.server.to_str().unwrap(),
        ],
    ));
    assert!(
        server.output().contains("TLS: required"),
        "{}",
        server.output()
    );
    assert_eq!(
        server.uris,
        vec![format!("nbds://{listen}/tank/vol0")],
        "{}",
        server.output()
    );

    let uri = x509_uri(&listen, "tank/vol0", &pki.client1);
    let info = hosts.client("nbdinfo", &[&uri]);
    assert!(info.contains("newstyle-fixed with TLS"), "{info}");
    let plain = hosts.client_refused("nbdinfo", &[&format!("nbd://{listen}/tank/vol0")]);
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("server replied with error"),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );

    // qemu-img in and out across the link.
    let image = random_bytes(31, 32 * MIB);
    let source = env.path("source.raw");
    std::fs::write(&source, &image).unwrap();
    let creds = qemu_x509(SERVER_IP, PORT, "tank/vol0", &pki.client1);
    let mut args = vec!["convert", "-n", "-f", "raw", source.to_str().unwrap()];
    args.extend([
        creds[0].as_str(),
        creds[1].as_str(),
        "--target-image-opts",
        &creds[3],
    ]);
    hosts.client("qemu-img", &args);
    let back = env.path("back.raw");
    let mut args: Vec<&str> = vec!["convert"];
    args.extend(creds.iter().map(String::as_str));
    args.extend(["-O", "raw", back.to_str().unwrap()]);
    hosts.client("qemu-img", &args);
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after qemu-img"
    );

    // nbdcopy with several connections across the link.
    let image = random_bytes(32, 32 * MIB);
    std::fs::write(&source, &image).unwrap();
    hosts.client(
        "nbdcopy",
        &["--connections=4", source.to_str().unwrap(), &uri],
    );
    let back = env.path("back2.raw");
    hosts.client(
        "nbdcopy",
        &["--connections=4", &uri, back.to_str().unwrap()],
    );
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after nbdcopy"
    );

    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
