//! Shared by the TLS tests: certificates and pre-shared keys made per run with the real
//! `certtool` and `psktool` (Debian gnutls-bin, as docs/tls.md tells users), laid out as qemu,
//! nbdkit and libnbd expect; the client options of qemu-img; and a raw NBD option client for
//! what no real client would send.

#![allow(dead_code)] // Each test file uses a different part.

use super::harness::{run, Env};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Every file a TLS test needs, in the test's temporary directory.
pub struct Pki {
    /// `--tls-certificates` of the server: ca-cert.pem, server-cert.pem, server-key.pem.
    pub server: PathBuf,
    /// A client with a certificate of the CA, common name `client1`.
    pub client1: PathBuf,
    /// A client with a certificate of the CA, common name `client2`.
    pub client2: PathBuf,
    /// A client trusting the server's CA, with a certificate from another CA.
    pub foreign: PathBuf,
    /// A client trusting the server's CA, with no certificate.
    pub anonymous: PathBuf,
    /// A client of the CA (common name `revoked`) whose certificate `server_crl` revokes.
    pub revoked: PathBuf,
    /// The server's files plus `ca-crl.pem` revoking `revoked`'s certificate.
    pub server_crl: PathBuf,
    /// The server's key file: identities `alice` and `bob`.
    pub psk_server: PathBuf,
    /// Client key directories (each holds `keys.psk`, as qemu's `tls-creds-psk` wants):
    /// alice's, bob's, alice with a wrong key, and an identity the server does not know.
    pub psk_alice: PathBuf,
    pub psk_bob: PathBuf,
    pub psk_wrong: PathBuf,
    pub psk_unknown: PathBuf,
}

fn certtool(args: &[&str], what: &str) {
    let mut command = Command::new("certtool");
    command.args(args);
    run(command, &format!("certtool {what}"));
}

fn private_key(path: &Path) {
    // RSA, as nbdkit's documentation does: qemu refuses client certificates whose key usage
    // lacks key encipherment, which certtool does not set for ECDSA keys.
    certtool(
        &[
            "--generate-privkey",
            "--bits",
            "2048",
            "--outfile",
            path.to_str().unwrap(),
        ],
        "private key",
    );
}

fn template(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// A CA in `dir` (ca-key.pem, ca-cert.pem).
fn make_ca(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("ca-key.pem");
    let cert = dir.join("ca-cert.pem");
    private_key(&key);
    let info = template(
        dir,
        "ca.info",
        &[
            format!("cn = {name}"),
            "ca".into(),
            "cert_signing_key".into(),
            // Without it OpenSSL rejects the CA's CRLs ("key usage does not include CRL
            // signing"), and with a CRL every client.
            "crl_signing_key".into(),
            "expiration_days = 30".into(),
        ],
    );
    certtool(
        &[
            "--generate-self-signed",
            "--load-privkey",
            key.to_str().unwrap(),
            "--template",
            info.to_str().unwrap(),
            "--outfile",
            cert.to_str().unwrap(),
        ],
        "CA",
    );
    (key, cert)
}

/// A certificate signed by the CA: `(key_out, cert_out)`.
fn make_cert(ca: &(PathBuf, PathBuf), key_out: &Path, cert_out: &Path, template_lines: &[String]) {
    private_key(key_out);
    let info = template(key_out.parent().unwrap(), "cert.info", template_lines);
    certtool(
        &[
            "--generate-certificate",
            "--load-ca-certificate",
            ca.1.to_str().unwrap(),
            "--load-ca-privkey",
            ca.0.to_str().unwrap(),
            "--load-privkey",
            key_out.to_str().unwrap(),
            "--template",
            info.to_str().unwrap(),
            "--outfile",
            cert_out.to_str().unwrap(),
        ],
        "certificate",
    );
}

fn client_dir(dir: &Path, ca_cert: &Path, signer: Option<(&(PathBuf, PathBuf), &str)>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(ca_cert, dir.join("ca-cert.pem")).unwrap();
    if let Some((ca, name)) = signer {
        make_cert(
            ca,
            &dir.join("client-key.pem"),
            &dir.join("client-cert.pem"),
            &[
                "organization = oxpool tests".into(),
                format!("cn = {name}"),
                "tls_www_client".into(),
                "encryption_key".into(),
                "signing_key".into(),
                "expiration_days = 30".into(),
            ],
        );
    }
}

fn psk_dir(dir: &Path, line: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("keys.psk"), format!("{line}\n")).unwrap();
    dir.to_path_buf()
}

/// Makes the files; the server certificate names `localhost`, `127.0.0.1` and `server_ips`.
pub fn make_pki(env: &Env, server_ips: &[&str]) -> Pki {
    let root = env.path("pki");
    let ca = make_ca(&root.join("ca"), "oxpool test CA");
    let other_ca = make_ca(&root.join("other-ca"), "another CA");

    let server = root.join("server");
    std::fs::create_dir_all(&server).unwrap();
    std::fs::copy(&ca.1, server.join("ca-cert.pem")).unwrap();
    let mut lines: Vec<String> = vec![
        "organization = oxpool tests".into(),
        "cn = localhost".into(),
        "dns_name = localhost".into(),
        "ip_address = 127.0.0.1".into(),
    ];
    for ip in server_ips {
        lines.push(format!("ip_address = {ip}"));
    }
    lines.extend(
        [
            "tls_www_server",
            "encryption_key",
            "signing_key",
            "expiration_days = 30",
        ]
        .map(String::from),
    );
    make_cert(
        &ca,
        &server.join("server-key.pem"),
        &server.join("server-cert.pem"),
        &lines,
    );

    let client1 = root.join("client1");
    client_dir(&client1, &ca.1, Some((&ca, "client1")));
    let client2 = root.join("client2");
    client_dir(&client2, &ca.1, Some((&ca, "client2")));
    let foreign = root.join("foreign");
    client_dir(&foreign, &ca.1, Some((&other_ca, "client1")));
    let anonymous = root.join("anonymous");
    client_dir(&anonymous, &ca.1, None);
    let revoked = root.join("revoked");
    client_dir(&revoked, &ca.1, Some((&ca, "revoked")));
    let server_crl = root.join("server-crl");
    std::fs::create_dir_all(&server_crl).unwrap();
    for name in ["ca-cert.pem", "server-cert.pem", "server-key.pem"] {
        std::fs::copy(server.join(name), server_crl.join(name)).unwrap();
    }
    let crl_info = template(
        &root,
        "crl.info",
        &["crl_next_update = 30".into(), "crl_number = 1".into()],
    );
    certtool(
        &[
            "--generate-crl",
            "--load-ca-privkey",
            ca.0.to_str().unwrap(),
            "--load-ca-certificate",
            ca.1.to_str().unwrap(),
            "--load-certificate",
            revoked.join("client-cert.pem").to_str().unwrap(),
            "--template",
            crl_info.to_str().unwrap(),
            "--outfile",
            server_crl.join("ca-crl.pem").to_str().unwrap(),
        ],
        "CRL",
    );

    // psktool makes the server's file, as a user would.
    let psk_server = root.join("server.psk");
    for user in ["alice", "bob"] {
        let mut command = Command::new("psktool");
        command.args(["-u", user, "-p", psk_server.to_str().unwrap()]);
        run(command, "psktool");
    }
    let text = std::fs::read_to_string(&psk_server).unwrap();
    let line = |user: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{user}:")))
            .unwrap_or_else(|| panic!("psktool wrote no key for {user}: {text}"))
            .to_string()
    };
    let alice = line("alice");
    let wrong_key = alice
        .split_once(':')
        .map(|(_, key)| key.chars().rev().collect::<String>())
        .unwrap();
    Pki {
        psk_alice: psk_dir(&root.join("psk-alice"), &alice),
        psk_bob: psk_dir(&root.join("psk-bob"), &line("bob")),
        psk_wrong: psk_dir(&root.join("psk-wrong"), &format!("alice:{wrong_key}")),
        psk_unknown: psk_dir(
            &root.join("psk-unknown"),
            &format!("carol:{}", alice.split_once(':').unwrap().1),
        ),
        server,
        client1,
        client2,
        foreign,
        anonymous,
        revoked,
        server_crl,
        psk_server,
    }
}

/// `nbds://HOST:PORT/EXPORT?tls-certificates=DIR` for libnbd's tools.
pub fn x509_uri(host_port: &str, export: &str, client_dir: &Path) -> String {
    format!(
        "nbds://{host_port}/{export}?tls-certificates={}",
        client_dir.display()
    )
}

/// `nbds://USER@HOST:PORT/EXPORT?tls-psk-file=FILE` for libnbd's tools.
pub fn psk_uri(host_port: &str, export: &str, user: &str, key_dir: &Path) -> String {
    format!(
        "nbds://{user}@{host_port}/{export}?tls-psk-file={}",
        key_dir.join("keys.psk").display()
    )
}

/// qemu-img's arguments for an NBD export through TLS: the `--object` and the image options.
pub fn qemu_x509(host: &str, port: &str, export: &str, client_dir: &Path) -> [String; 4] {
    [
        "--object".into(),
        format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            client_dir.display()
        ),
        "--image-opts".into(),
        format!("driver=nbd,host={host},port={port},export={export},tls-creds=tls0"),
    ]
}

/// qemu-img's arguments for an NBD export through TLS with a pre-shared key.
pub fn qemu_psk(host: &str, port: &str, export: &str, user: &str, key_dir: &Path) -> [String; 4] {
    [
        "--object".into(),
        format!(
            "tls-creds-psk,id=tls0,endpoint=client,username={user},dir={}",
            key_dir.display()
        ),
        "--image-opts".into(),
        format!("driver=nbd,host={host},port={port},export={export},tls-creds=tls0"),
    ]
}

/// `host:port` of the server's TCP listener, from its `nbds://` URI.
pub fn tcp_addr(uris: &[String]) -> String {
    let uri = uris
        .iter()
        .find(|u| u.starts_with("nbds://"))
        .unwrap_or_else(|| panic!("no nbds:// URI in {uris:?}"));
    let rest = &uri["nbds://".len()..];
    rest[..rest.find('/').unwrap()].to_string()
}

/// A raw NBD client for the option phase: sends what it is told, reads replies.
pub struct RawClient {
    pub stream: TcpStream,
}

/// Option codes and reply types, from the protocol text.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_TLS_REQD: u32 = 0x8000_0005;

impl RawClient {
    /// Connects, reads the greeting and sends the client flags (fixed newstyle, no zeroes).
    pub fn connect(addr: &str) -> RawClient {
        let mut stream = TcpStream::connect(addr).expect("connect");
        // A guard against a hang, not a performance assertion.
        stream
            .set_read_timeout(Some(super::harness::HANG_LIMIT))
            .unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        stream.write_all(&3u32.to_be_bytes()).unwrap();
        RawClient { stream }
    }

    pub fn option_bytes(option: u32, data: &[u8]) -> Vec<u8> {
        let mut bytes = b"IHAVEOPT".to_vec();
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// One option reply: (option, type, data); `None` if the server closed first.
    pub fn reply(&mut self) -> Option<(u32, u32, Vec<u8>)> {
        let mut header = [0u8; 20];
        read_or_closed(&mut self.stream, &mut header)?;
        assert_eq!(&header[..8], &0x0003_e889_0455_65a9u64.to_be_bytes());
        let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        let mut data = vec![0u8; len];
        read_or_closed(&mut self.stream, &mut data)?;
        Some((option, kind, data))
    }

    /// Whether the server closed the connection (EOF or a reset) after at most a TLS alert's
    /// worth of bytes, within the hang guard.
    pub fn closed_by_server(&mut self) -> bool {
        let mut buf = [0u8; 256];
        let mut received = 0;
        // Bounded: at most a few reads before the byte cap.
        while received <= 64 {
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
                Ok(count) => received += count,
            }
        }
        false
    }
}

/// GO/INFO data: name, no information requests.
pub fn go_data(name: &str) -> Vec<u8> {
    let mut bytes = (name.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(&0u16.to_be_bytes());
    bytes
}

fn read_or_closed(stream: &mut TcpStream, buf: &mut [u8]) -> Option<()> {
    match stream.read_exact(buf) {
        Ok(()) => Some(()),
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
            panic!(
                "no answer from the server within {:?}",
                Duration::from_secs(120)
            )
        }
        Err(_) => None,
    }
}
