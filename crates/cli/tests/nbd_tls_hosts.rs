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
#[path = "nbd/two_hosts.rs"]
mod two_hosts;

use harness::{random_bytes, run_unchecked, Env, ServerProcess};
use std::path::Path;
use tls::*;
use two_hosts::{TwoHosts, SERVER_IP};

const MIB: usize = 1 << 20;

const PORT: &str = "10809";

#[test]
fn across_hosts_tls_is_required_by_default_on_a_non_loopback_address() {
    // Declared first so it is dropped last: the server is stopped before its namespace goes.
    let hosts = TwoHosts::new("oxtls");
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
    // Refused with the protocol's NBD_REP_ERR_TLS_REQD, whose message libnbd logs.
    let plain = hosts.client_refused("nbdinfo", &[&format!("nbd://{listen}/tank/vol0")]);
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(stderr.contains("server replied with error"), "{stderr}");
    assert!(
        stderr.contains("TLS is required: send NBD_OPT_STARTTLS first"),
        "{stderr}"
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
