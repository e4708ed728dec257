//! `oxpool serve` over TLS with the real clients, unmodified: nbdinfo, nbdcopy (libnbd,
//! GnuTLS) and qemu-img (GnuTLS), with X.509 certificates (with and without client
//! certificates) and pre-shared keys; the protocol's refusals checked byte by byte with a raw
//! client; and the `nbd_allow` volume property.

#[path = "nbd/harness.rs"]
mod harness;
#[path = "nbd/tls.rs"]
mod tls;

use harness::{hold, python, random_bytes, release, run_unchecked, tool, Env, ServerProcess};
use std::process::Command;
use tls::*;

const MIB: usize = 1 << 20;

/// The message oxpool sends with NBD_REP_ERR_POLICY. libnbd reports ERR_POLICY and
/// ERR_TLS_REQD alike (ENOTSUP), but its debug log shows the server's message.
const POLICY_MESSAGE: &str = "this client may not open this export";

/// What GnuTLS (libnbd, qemu) reports when the server refuses the TLS handshake with an alert.
const TLS_REFUSED: &str = "A TLS fatal alert has been received";

/// Runs a client that must fail (with libnbd's debug log on); returns its stderr.
fn refused(program: &str, args: &[&str]) -> String {
    let mut command = Command::new(program);
    command.args(args).env("LIBNBD_DEBUG", "1");
    let output = run_unchecked(command, &format!("{program} {args:?}"));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "{program} {args:?} should have been refused:\n{}{stderr}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

/// `qemu-img convert` of `source` (a raw file) into the export, then back into `back`.
fn qemu_round_trip(env: &Env, creds: &[String; 4], source: &std::path::Path, back: &str) {
    let mut args: Vec<String> = vec!["convert".into(), "-n".into(), "-f".into(), "raw".into()];
    args.push(source.to_str().unwrap().into());
    args.extend_from_slice(&creds[..2]);
    args.push("--target-image-opts".into());
    args.push(creds[3].clone());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tool("qemu-img", &args);
    let back = env.path(back);
    let mut args: Vec<&str> = vec!["convert"];
    args.extend(creds.iter().map(String::as_str));
    args.extend(["-O", "raw", back.to_str().unwrap()]);
    tool("qemu-img", &args);
}

#[test]
fn x509_nbdinfo_qemu_img_and_nbdcopy_move_identical_bytes() {
    let env = Env::new();
    env.tank(&[("vol0", "32M", &[])]);
    let pki = make_pki(&env, &[]);
    // With its debug log: each TLS session's record layer is in it.
    let mut command = env.oxpool_command();
    command.env("OXPOOL_LOG", "debug").args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--tls",
        "require",
        "--tls-certificates",
        pki.server.to_str().unwrap(),
    ]);
    let server = ServerProcess::start(command);
    assert!(
        server.uris.iter().all(|u| u.starts_with("nbds://")),
        "{:?}",
        server.uris
    );
    let addr = tcp_addr(&server.uris);
    let (host, port) = addr.split_once(':').unwrap();
    let uri = x509_uri(&addr, "tank/vol0", &pki.client1);

    let info = tool("nbdinfo", &[&uri]);
    assert!(info.contains("newstyle-fixed with TLS"), "{info}");
    assert!(info.contains("export-size: 33554432"), "{info}");
    // nbdcopy opens its several connections below only to a server that offers multi-conn.
    assert!(info.contains("can_multi_conn: true"), "{info}");

    // qemu-img in and out.
    let image = random_bytes(21, 32 * MIB);
    let source = env.path("source.raw");
    std::fs::write(&source, &image).unwrap();
    let creds = qemu_x509(host, port, "tank/vol0", &pki.client1);
    qemu_round_trip(&env, &creds, &source, "back.raw");
    assert!(
        std::fs::read(env.path("back.raw")).unwrap() == image,
        "bytes differ after qemu-img through TLS"
    );

    // TLS 1.2 (GnuTLS told not to offer 1.3) works too.
    let mut tls12 = creds.clone();
    tls12[1].push_str(",priority=NORMAL:-VERS-TLS1.3");
    let mut args = vec!["info"];
    args.extend(tls12.iter().map(String::as_str));
    let info = tool("qemu-img", &args);
    assert!(info.contains("33554432"), "{info}");

    // nbdcopy with several connections, each its own TLS session.
    let image = random_bytes(22, 32 * MIB);
    std::fs::write(&source, &image).unwrap();
    tool(
        "nbdcopy",
        &[
            "--connections=4",
            "--requests=16",
            source.to_str().unwrap(),
            &uri,
        ],
    );
    let back = env.path("back2.raw");
    tool(
        "nbdcopy",
        &["--connections=4", &uri, back.to_str().unwrap()],
    );
    assert!(
        std::fs::read(&back).unwrap() == image,
        "bytes differ after nbdcopy through TLS"
    );

    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    // GnuTLS agrees on TLS 1.3 with AES-128-GCM: our record layer carried those sessions
    // (every byte above went through it); the TLS 1.2 session stayed with OpenSSL's.
    let sessions: Vec<&str> = output.lines().filter(|l| l.contains("TLS on")).collect();
    let ours = sessions
        .iter()
        .filter(|l| l.contains("TLSv1.3") && l.contains("oxpool records"))
        .count();
    let openssl12 = sessions
        .iter()
        .filter(|l| l.contains("TLSv1.2") && l.contains("OpenSSL records"))
        .count();
    // nbdinfo, two qemu-img runs, two nbdcopy runs (of up to 4 connections each; nbdcopy
    // opens fewer on a machine with fewer CPUs): at least 5 sessions.
    assert!(ours >= 5, "{ours} sessions on our record layer:\n{output}");
    assert_eq!(openssl12, 1, "the TLS 1.2 session:\n{output}");
}

/// READ replies over TLS come from the data cache's blocks in place when they can (see
/// `read_in_parts` in the server): reads.py compares every reply, cold and cached,
/// structured (with and without DF) and simple, with holes, zeros inside data and dirty
/// pieces inside cached blocks, with what it wrote before the server restarted.
#[test]
fn tls_reads_from_cached_dirty_and_hole_blocks_are_identical() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &["volblocksize=16K"])]);
    let pki = make_pki(&env, &[]);
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--tls",
        "require",
        "--tls-certificates",
        pki.server.to_str().unwrap(),
    ];
    let server = env.serve(&args);
    let uri = x509_uri(&tcp_addr(&server.uris), "tank/vol0", &pki.client1);
    python("reads.py", &["write", &uri]);
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    // A new server: nothing dirty and nothing cached, so the first reads miss the cache.
    let server = env.serve(&args);
    let uri = x509_uri(&tcp_addr(&server.uris), "tank/vol0", &pki.client1);
    let out = python("reads.py", &["read", &uri]);
    assert!(out.contains("reads: all reads identical"), "{out}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn client_certificates_are_verified_and_nbd_allow_names_them() {
    let env = Env::new();
    env.tank(&[
        ("vol0", "16M", &[]),
        ("secret", "16M", &["nbd_allow=client1"]),
    ]);
    let pki = make_pki(&env, &[]);
    let server = env.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-certificates",
        pki.server.to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    assert!(
        server.output().contains("client certificates verified"),
        "{}",
        server.output()
    );
    let addr = tcp_addr(&server.uris);

    // client1 sees and opens both.
    let list = tool("nbdinfo", &["--list", &x509_uri(&addr, "", &pki.client1)]);
    assert!(list.contains("export=\"tank/secret\""), "{list}");
    assert!(list.contains("export=\"tank/vol0\""), "{list}");
    let info = tool("nbdinfo", &[&x509_uri(&addr, "tank/secret", &pki.client1)]);
    assert!(info.contains("with TLS"), "{info}");

    // client2 (same CA) opens vol0, but neither sees nor opens secret.
    let list = tool("nbdinfo", &["--list", &x509_uri(&addr, "", &pki.client2)]);
    assert!(list.contains("export=\"tank/vol0\""), "{list}");
    assert!(!list.contains("tank/secret"), "{list}");
    let err = refused("nbdinfo", &[&x509_uri(&addr, "tank/secret", &pki.client2)]);
    assert!(err.contains(POLICY_MESSAGE), "{err}");

    // Without a certificate, or with one from another CA: refused in the TLS handshake.
    for dir in [&pki.anonymous, &pki.foreign] {
        let err = refused("nbdinfo", &[&x509_uri(&addr, "tank/vol0", dir)]);
        // In TLS 1.3 the client's certificate is judged after the client finished its
        // handshake, so GnuTLS may see the alert in its first record read instead.
        assert!(err.contains("TLS fatal alert"), "{err}");
        assert!(
            !err.contains("server replied"),
            "refused in TLS, before any option: {err}"
        );
    }
    // The server goes on serving.
    tool("nbdinfo", &[&x509_uri(&addr, "tank/vol0", &pki.client1)]);
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");

    // With ca-crl.pem in the directory, a revoked certificate is refused; others are not.
    let server = env.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-certificates",
        pki.server_crl.to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    let addr = tcp_addr(&server.uris);
    let err = refused("nbdinfo", &[&x509_uri(&addr, "tank/vol0", &pki.revoked)]);
    assert!(err.contains("TLS fatal alert"), "{err}");
    tool("nbdinfo", &[&x509_uri(&addr, "tank/vol0", &pki.client1)]);
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn psk_nbdinfo_and_qemu_img_move_identical_bytes_and_wrong_keys_are_refused() {
    let env = Env::new();
    env.tank(&[
        ("vol0", "16M", &[]),
        ("alices", "16M", &["nbd_allow=alice"]),
    ]);
    env.ok(&["snapshot", "tank/vol0@s"]);
    let pki = make_pki(&env, &[]);
    let server = env.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-psk",
        pki.psk_server.to_str().unwrap(),
    ]);
    assert!(
        server.output().contains("TLS: required; pre-shared keys"),
        "{}",
        server.output()
    );
    let addr = tcp_addr(&server.uris);
    let (host, port) = addr.split_once(':').unwrap();

    let info = tool(
        "nbdinfo",
        &[&psk_uri(&addr, "tank/vol0", "alice", &pki.psk_alice)],
    );
    assert!(info.contains("newstyle-fixed with TLS"), "{info}");

    let image = random_bytes(23, 16 * MIB);
    let source = env.path("source.raw");
    std::fs::write(&source, &image).unwrap();
    let creds = qemu_psk(host, port, "tank/alices", "alice", &pki.psk_alice);
    qemu_round_trip(&env, &creds, &source, "back.raw");
    assert!(
        std::fs::read(env.path("back.raw")).unwrap() == image,
        "bytes differ after qemu-img with a pre-shared key"
    );

    // TLS 1.2 PSK suites, as GnuTLS offers them without TLS 1.3.
    let mut tls12 = qemu_psk(host, port, "tank/vol0", "alice", &pki.psk_alice);
    tls12[1].push_str(",priority=NORMAL:-VERS-TLS1.3:+ECDHE-PSK:+DHE-PSK:+PSK");
    let mut args = vec!["info"];
    args.extend(tls12.iter().map(String::as_str));
    let info = tool("qemu-img", &args);
    assert!(info.contains("16777216"), "{info}");

    // bob: vol0 yes; alice's volume neither listed nor opened.
    let list = tool(
        "nbdinfo",
        &["--list", &psk_uri(&addr, "", "bob", &pki.psk_bob)],
    );
    assert!(list.contains("export=\"tank/vol0\""), "{list}");
    assert!(!list.contains("tank/alices"), "{list}");
    let err = refused(
        "nbdinfo",
        &[&psk_uri(&addr, "tank/alices", "bob", &pki.psk_bob)],
    );
    assert!(err.contains(POLICY_MESSAGE), "{err}");
    let bob = qemu_psk(host, port, "tank/alices", "bob", &pki.psk_bob);
    let mut args = vec!["info"];
    args.extend(bob.iter().map(String::as_str));
    let err = refused("qemu-img", &args);
    assert!(err.contains(POLICY_MESSAGE), "{err}");

    // A wrong key, an unknown identity: the TLS handshake fails (the server's alert ends it),
    // before any NBD option is answered.
    for (who, key) in [("alice", &pki.psk_wrong), ("carol", &pki.psk_unknown)] {
        let err = refused("nbdinfo", &[&psk_uri(&addr, "tank/vol0", who, key)]);
        assert!(err.contains(TLS_REFUSED), "{who}: {err}");
        assert!(!err.contains("server replied"), "{who}: {err}");
    }
    let wrong = qemu_psk(host, port, "tank/vol0", "alice", &pki.psk_wrong);
    let mut args = vec!["info"];
    args.extend(wrong.iter().map(String::as_str));
    let err = refused("qemu-img", &args);
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.contains(TLS_REFUSED), "{err}");

    tool(
        "nbdinfo",
        &[&psk_uri(&addr, "tank/vol0", "alice", &pki.psk_alice)],
    );

    // A change of a served volume's nbd_allow reaches the exports of its snapshots, which
    // serve its data (they kept the list they were exported with before).
    tool(
        "nbdinfo",
        &[&psk_uri(&addr, "tank/vol0@s", "bob", &pki.psk_bob)],
    );
    env.ok(&["set", "nbd_allow=alice", "tank/vol0"]);
    for export in ["tank/vol0", "tank/vol0@s"] {
        let err = refused("nbdinfo", &[&psk_uri(&addr, export, "bob", &pki.psk_bob)]);
        assert!(err.contains(POLICY_MESSAGE), "{export}: {err}");
        tool(
            "nbdinfo",
            &[&psk_uri(&addr, export, "alice", &pki.psk_alice)],
        );
    }
    env.ok(&["set", "nbd_allow=*", "tank/vol0"]);
    tool(
        "nbdinfo",
        &[&psk_uri(&addr, "tank/vol0@s", "bob", &pki.psk_bob)],
    );
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
    // Each refused handshake (two nbdinfo, one qemu-img) left a warning naming the client
    // (by address, unless it had already reset: then it says so).
    let refusals: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("TLS handshake failed") && l.contains("peer="))
        .collect();
    assert!(
        refusals.len() >= 3 && refusals.iter().any(|l| l.contains("peer=127.0.0.1:")),
        "warnings of refused handshakes:\n{output}"
    );
}

#[test]
fn plain_text_clients_get_tls_reqd_when_tls_is_required() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let pki = make_pki(&env, &[]);
    let server = env.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls",
        "require",
        "--tls-certificates",
        pki.server.to_str().unwrap(),
    ]);
    let addr = tcp_addr(&server.uris);

    let mut client = RawClient::connect(&addr);
    client.send(&RawClient::option_bytes(OPT_LIST, &[]));
    assert_eq!(
        client.reply().map(|r| (r.0, r.1)),
        Some((OPT_LIST, REP_ERR_TLS_REQD))
    );
    client.send(&RawClient::option_bytes(OPT_GO, &go_data("tank/vol0")));
    assert_eq!(
        client.reply().map(|r| (r.0, r.1)),
        Some((OPT_GO, REP_ERR_TLS_REQD))
    );
    client.send(&RawClient::option_bytes(OPT_STRUCTURED_REPLY, &[]));
    assert_eq!(
        client.reply().map(|r| (r.0, r.1)),
        Some((OPT_STRUCTURED_REPLY, REP_ERR_TLS_REQD))
    );
    // EXPORT_NAME cannot carry the error: the server hangs up.
    client.send(&RawClient::option_bytes(OPT_EXPORT_NAME, b"tank/vol0"));
    assert!(client.closed_by_server());

    // The real client without TLS is refused too; with TLS it works.
    refused("nbdinfo", &[&format!("nbd://{addr}/tank/vol0")]);
    let info = tool("nbdinfo", &[&x509_uri(&addr, "tank/vol0", &pki.client1)]);
    assert!(info.contains("with TLS"), "{info}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn optional_tls_serves_plain_clients_but_not_volumes_with_an_allow_list() {
    let env = Env::new();
    env.tank(&[
        ("vol0", "16M", &[]),
        ("secret", "16M", &["nbd_allow=alice"]),
    ]);
    let pki = make_pki(&env, &[]);
    let server = env.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls",
        "on",
        "--tls-psk",
        pki.psk_server.to_str().unwrap(),
    ]);
    let addr = tcp_addr(&server.uris);
    let plain = tool("nbdinfo", &[&format!("nbd://{addr}/tank/vol0")]);
    assert!(plain.contains("without TLS"), "{plain}");
    let list = tool("nbdinfo", &["--list", &format!("nbd://{addr}/")]);
    assert!(!list.contains("tank/secret"), "{list}");
    let mut client = RawClient::connect(&addr);
    client.send(&RawClient::option_bytes(OPT_GO, &go_data("tank/secret")));
    assert_eq!(
        client.reply().map(|r| (r.0, r.1)),
        Some((OPT_GO, REP_ERR_TLS_REQD))
    );
    client.send(&RawClient::option_bytes(OPT_ABORT, &[]));
    let info = tool(
        "nbdinfo",
        &[&psk_uri(&addr, "tank/secret", "alice", &pki.psk_alice)],
    );
    assert!(info.contains("with TLS"), "{info}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

/// `oxpool serve` with TLS required (the certificates of `pki`) on one reactor, so that all
/// connections share it: a bad one must not hold up the others.
fn serve_tls_one_reactor(env: &Env, pki: &Pki) -> ServerProcess {
    env.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-certificates",
        pki.server.to_str().unwrap(),
        "--reactors",
        "1",
    ])
}

/// A clear-text client that asked for STARTTLS and got its ACK.
fn starttls_acked(addr: &str) -> RawClient {
    let mut client = RawClient::connect(addr);
    client.send(&RawClient::option_bytes(OPT_STARTTLS, &[]));
    assert_eq!(
        client.reply().map(|r| (r.0, r.1)),
        Some((OPT_STARTTLS, REP_ACK))
    );
    client
}

/// Reads one option reply from `stream` (its data too); returns its type.
fn option_reply_kind(stream: &mut impl std::io::Read) -> u32 {
    let mut header = [0u8; 20];
    stream.read_exact(&mut header).expect("an option reply");
    assert_eq!(&header[..8], &0x0003_e889_0455_65a9u64.to_be_bytes());
    let len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
    let mut data = vec![0; len];
    stream
        .read_exact(&mut data)
        .expect("the option reply's data");
    u32::from_be_bytes(header[12..16].try_into().unwrap())
}

/// A TCP stream whose next write can have one bit flipped on its way: a record damaged on
/// the wire.
#[derive(Debug)]
struct Tampered {
    stream: std::net::TcpStream,
    flip_byte_at: Option<usize>,
}

impl std::io::Read for Tampered {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl std::io::Write for Tampered {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let Some(at) = self.flip_byte_at.take() else {
            return self.stream.write(data);
        };
        let mut damaged = data.to_vec();
        damaged[at] ^= 0x10;
        self.stream.write_all(&damaged)?;
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// After the handshake the server's own record layer (TLS 1.3, AES-GCM) carries the session:
/// a record damaged on the wire is refused with a bad_record_mac alert and ends that
/// connection alone; a verifying client keeps its own and a new one is served.
#[test]
fn a_record_damaged_after_the_handshake_gets_bad_record_mac_and_ends_only_that_connection() {
    use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
    use std::io::{Read, Write};

    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let pki = make_pki(&env, &[]);
    let server = serve_tls_one_reactor(&env, &pki);
    let addr = tcp_addr(&server.uris);
    let uri = x509_uri(&addr, "tank/vol0", &pki.client1);
    let held = hold(&uri);

    let raw = starttls_acked(&addr);
    let mut connector = SslConnector::builder(SslMethod::tls_client()).unwrap();
    connector.set_verify(SslVerifyMode::NONE);
    connector
        .set_min_proto_version(Some(SslVersion::TLS1_3))
        .unwrap();
    let tampered = Tampered {
        stream: raw.stream,
        flip_byte_at: None,
    };
    let mut tls = connector
        .build()
        .connect("localhost", tampered)
        .expect("TLS handshake");
    // First an intact option: answered (the record layer works both ways): one reply per
    // export, then the ACK.
    tls.write_all(&RawClient::option_bytes(OPT_LIST, &[]))
        .unwrap();
    let kinds: Vec<u32> = (0..2).map(|_| option_reply_kind(&mut tls)).collect();
    assert_eq!(kinds, [REP_SERVER, REP_ACK]);
    // Then one bit of the next record's ciphertext flipped (past its 5-byte header).
    tls.get_mut().flip_byte_at = Some(12);
    tls.write_all(&RawClient::option_bytes(OPT_LIST, &[]))
        .unwrap();
    let err = tls
        .read(&mut [0u8; 64])
        .expect_err("the server must not answer a damaged record");
    let message = format!("{err:?}");
    assert!(
        message.contains("bad record mac"),
        "expected a bad_record_mac alert: {message}"
    );

    assert_eq!(release(held), "still connected");
    let info = tool("nbdinfo", &[&uri]);
    assert!(info.contains("with TLS"), "{info}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}

#[test]
fn plain_text_after_starttls_and_garbage_in_the_tls_handshake_end_only_that_connection() {
    let env = Env::new();
    env.tank(&[("vol0", "16M", &[])]);
    let pki = make_pki(&env, &[]);
    let server = serve_tls_one_reactor(&env, &pki);
    let addr = tcp_addr(&server.uris);
    let uri = x509_uri(&addr, "tank/vol0", &pki.client1);
    // A verified TLS client keeps its connection open through all that follows (on the same
    // single reactor): the bad connections end, this one must not.
    let held = hold(&uri);

    // An option injected right behind STARTTLS, before any TLS (CVE-2021-3716): at most the
    // ACK comes back, then the connection ends; the injected option is never answered.
    let mut injected = RawClient::connect(&addr);
    let mut bytes = RawClient::option_bytes(OPT_STARTTLS, &[]);
    bytes.extend(RawClient::option_bytes(OPT_STRUCTURED_REPLY, &[]));
    injected.send(&bytes);
    // Bounded: the server sends at most the ACK before closing.
    for _ in 0..2 {
        match injected.reply() {
            Some((OPT_STARTTLS, REP_ACK, _)) => continue,
            Some(other) => panic!("answered after STARTTLS in plain text: {other:?}"),
            None => break,
        }
    }
    assert!(injected.closed_by_server());

    // A client that stops halfway through a TLS record holds only its own connection: a
    // verifying client is served meanwhile, on the same (single) reactor.
    let mut stalled = starttls_acked(&addr);
    stalled.send(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]);
    let info = tool("nbdinfo", &[&uri]);
    assert!(info.contains("with TLS"), "{info}");
    // Then garbage instead of the rest of its ClientHello: that connection ends.
    stalled.send(&[0x5a; 600]);
    assert!(stalled.closed_by_server());

    // Not TLS at all after the ACK: that connection ends too.
    let mut garbage = starttls_acked(&addr);
    garbage.send(b"GET / HTTP/1.1\r\nHost: oxpool\r\n\r\n");
    assert!(garbage.closed_by_server());
    assert_eq!(release(held), "still connected");

    // And the server still serves, bytes intact.
    let image = random_bytes(24, 4 * MIB);
    let source = env.path("source.raw");
    std::fs::write(&source, &image).unwrap();
    tool("nbdcopy", &[source.to_str().unwrap(), &uri]);
    let back = env.path("back.raw");
    tool("nbdcopy", &[&uri, back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap()[..4 * MIB] == image[..]);
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
