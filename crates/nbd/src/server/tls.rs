//! TLS settings of the server: the policy (`--tls off|on|require`), the credentials (X.509
//! certificates from a directory laid out as qemu, nbdkit and libnbd lay theirs, or pre-shared
//! keys from a `psktool` file), and who may open which export.
//!
//! The TLS library is OpenSSL (the `openssl` crate over the system's libssl): it is the one
//! maintained library with a Rust binding that does both X.509 and the external pre-shared
//! keys GnuTLS clients (qemu, libnbd) use, for TLS 1.2 and 1.3; rustls has no PSK. One library
//! for both means one session type on the reactors and one set of interoperability tests.
//! `docs/tls.md` has the reasoning and the commands.
//!
//! The per-connection session (encryption on the reactor that owns the connection) is
//! `tls_session`; after a TLS 1.3 AES-GCM handshake its records are `tls_records`' (from the
//! traffic secrets captured here).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openssl::nid::Nid;
use openssl::ssl::{
    Ssl, SslAcceptor, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions,
    SslVerifyMode, SslVersion,
};
use openssl::x509::store::X509Lookup;
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::X509;

use super::tls_records::{Records, Secret, Suite};
use crate::proto::{ExportAccess, TlsPolicy};

/// Certificate directory file names, as qemu's `tls-creds-x509`, nbdkit and libnbd use them.
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// The server's certificate (chain) in the certificate directory.
pub const SERVER_CERT_FILE: &str = "server-cert.pem";
/// The server's private key in the certificate directory.
pub const SERVER_KEY_FILE: &str = "server-key.pem";
/// Optional certificate revocation list in the certificate directory.
pub const CA_CRL_FILE: &str = "ca-crl.pem";

/// Largest pre-shared key accepted, in bytes (OpenSSL's `PSK_MAX_PSK_LEN`).
pub const PSK_KEY_MAX_BYTES: usize = 512;
/// Longest PSK identity accepted (OpenSSL's `PSK_MAX_IDENTITY_LEN` is 256 with the NUL).
pub const PSK_IDENTITY_MAX_BYTES: usize = 255;
/// Most identities one key file may hold: the file is read once at start, and a bound keeps a
/// mistaken path (a huge file) from eating memory.
pub const PSK_IDENTITIES_MAX: usize = 65536;

/// TLS 1.3 suites in the server's order: AES-128-GCM first (fastest with AES-NI, and the
/// one the SHA-256 hash of an external PSK allows), then the others.
const TLS13_SUITES: &str =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

/// TLS 1.2 PSK suites: ephemeral ECDH only (forward secrecy); GnuTLS clients offer them
/// first (`+ECDHE-PSK`).
const TLS12_PSK_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES128-CBC-SHA256:\
                                 ECDHE-PSK-AES256-CBC-SHA384";

/// A credentials error, one line for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(String);

impl TlsSetupError {
    fn new(message: impl Into<String>) -> TlsSetupError {
        TlsSetupError(message.into())
    }
}

/// What a client proved about itself during the TLS handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsIdentity {
    /// A client certificate signed by the configured CA (only with peer verification): its
    /// subject's common name.
    Certificate(String),
    /// The PSK identity (user name) whose key the client proved it holds.
    Psk(String),
}

impl TlsIdentity {
    /// The name matched against an export's `nbd_allow` list.
    pub fn name(&self) -> &str {
        match self {
            TlsIdentity::Certificate(name) | TlsIdentity::Psk(name) => name,
        }
    }
}

impl fmt::Display for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsIdentity::Certificate(name) => write!(f, "certificate CN={name}"),
            TlsIdentity::Psk(name) => write!(f, "PSK identity {name}"),
        }
    }
}

/// Which kind of credentials the server holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialKind {
    /// X.509 certificates (optionally with client certificates verified).
    X509 {
        /// Client certificates are required and verified against the CA.
        verify_peer: bool,
    },
    /// Pre-shared keys.
    Psk {
        /// Identities in the key file.
        identities: usize,
    },
}

/// Server credentials, shared by every connection (an OpenSSL context is thread-safe and
/// reference counted; cloning is cheap).
#[derive(Clone)]
pub struct TlsCredentials {
    context: SslContext,
    kind: CredentialKind,
    /// Where the PSK callback leaves the identity it was last asked about, per session.
    psk_identity_index: Option<openssl::ex_data::Index<Ssl, PskLookup>>,
    /// Where the key log callback leaves a session's TLS 1.3 application traffic secrets.
    secrets_index: SecretsIndex,
}

/// The application traffic secrets of a TLS 1.3 handshake, as OpenSSL's key log callback
/// hands them over (`CLIENT_TRAFFIC_SECRET_0`, `SERVER_TRAFFIC_SECRET_0`): our record layer
/// (`tls_records.rs`) takes over from them. Held per session until the handshake is done,
/// then taken (and the copy here dropped).
#[derive(Default)]
pub(crate) struct TrafficSecrets {
    client: Option<Secret>,
    server: Option<Secret>,
}

type SecretsIndex = openssl::ex_data::Index<Ssl, Mutex<TrafficSecrets>>;

/// What the PSK callback found for the last identity a session's client offered (a TLS 1.3
/// client may offer several; OpenSSL asks until one is found).
#[derive(Clone, Debug, PartialEq, Eq)]
enum PskLookup {
    /// In the key file: the client must now prove it holds the key.
    Known(String),
    /// Not in the key file, as the client sent it, escaped for the log
    /// ([`quoted_identity`]). Kept so that a failed handshake is reported as what it is:
    /// OpenSSL's own error is a follow-on one (in TLS 1.3 it falls back to a certificate
    /// handshake, and with no certificate fails with "no suitable signature algorithm").
    Unknown(String),
}

/// Bytes of a client's PSK identity shown in the log; the rest is counted, not shown.
const IDENTITY_SHOWN_MAX_BYTES: usize = 64;

/// A PSK identity the client sent, for the log: quoted, its first
/// [`IDENTITY_SHOWN_MAX_BYTES`] bytes shown with every byte that is not printable ASCII (a
/// control character, an escape sequence, invalid UTF-8) and the quote and backslash escaped
/// as `\xNN`, so that a client cannot forge or hide log lines; longer ones say how long.
fn quoted_identity(identity: &[u8]) -> String {
    let shown = &identity[..identity.len().min(IDENTITY_SHOWN_MAX_BYTES)];
    let mut out = String::with_capacity(shown.len() + 2);
    out.push('\'');
    for &byte in shown {
        if (0x20..0x7f).contains(&byte) && byte != b'\'' && byte != b'\\' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out.push('\'');
    if identity.len() > shown.len() {
        out.push_str(&format!("... ({} bytes)", identity.len()));
    }
    out
}

/// Keeps the two application traffic secrets of each session's key log lines
/// (`LABEL client-random secret`, in hex); the handshake secrets and TLS 1.2's lines are not
/// kept.
fn capture_traffic_secrets(builder: &mut SslContextBuilder, index: SecretsIndex) {
    builder.set_keylog_callback(move |ssl, line| {
        let mut fields = line.split(' ');
        let (Some(label), Some(_client_random), Some(hex), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return;
        };
        let Some(slot) = ssl.ex_data(index) else {
            return;
        };
        let mut secrets = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match label {
            "CLIENT_TRAFFIC_SECRET_0" => secrets.client = decode_hex(hex).map(Secret::new),
            "SERVER_TRAFFIC_SECRET_0" => secrets.server = decode_hex(hex).map(Secret::new),
            _ => {}
        }
    });
}

impl fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCredentials")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

fn openssl_error(what: &str, err: impl fmt::Display) -> TlsSetupError {
    TlsSetupError::new(format!("{what}: {err}"))
}

impl TlsCredentials {
    /// X.509 credentials from `dir`: `ca-cert.pem`, `server-cert.pem`, `server-key.pem` and,
    /// if present, `ca-crl.pem`. With `verify_peer`, clients must present a certificate
    /// signed by the CA (and not revoked by the CRL); its common name becomes the client's
    /// identity. Without it, no client certificate is asked for.
    pub fn from_certificate_dir(dir: &Path, verify_peer: bool) -> Result<Self, TlsSetupError> {
        let file = |name: &str| -> Result<PathBuf, TlsSetupError> {
            let path = dir.join(name);
            std::fs::metadata(&path)
                .map_err(|err| TlsSetupError::new(format!("{}: {err}", path.display())))?;
            Ok(path)
        };
        let ca = file(CA_CERT_FILE)?;
        let cert = file(SERVER_CERT_FILE)?;
        let key = file(SERVER_KEY_FILE)?;
        let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| openssl_error("TLS context", e))?;
        builder
            .set_certificate_chain_file(&cert)
            .map_err(|e| openssl_error(&cert.display().to_string(), e))?;
        builder
            .set_private_key_file(&key, SslFiletype::PEM)
            .map_err(|e| openssl_error(&key.display().to_string(), e))?;
        builder.check_private_key().map_err(|e| {
            openssl_error(
                &format!("{} and {}", cert.display(), key.display()),
                format!("the key does not match the certificate ({e})"),
            )
        })?;
        builder
            .set_ca_file(&ca)
            .map_err(|e| openssl_error(&ca.display().to_string(), e))?;
        if verify_peer {
            // Tell clients which CA to pick a certificate for.
            let pem =
                std::fs::read(&ca).map_err(|e| openssl_error(&ca.display().to_string(), e))?;
            for ca_cert in X509::stack_from_pem(&pem)
                .map_err(|e| openssl_error(&ca.display().to_string(), e))?
            {
                builder
                    .add_client_ca(&ca_cert)
                    .map_err(|e| openssl_error(&ca.display().to_string(), e))?;
            }
            builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
            let crl = dir.join(CA_CRL_FILE);
            if crl.exists() {
                let store = builder.cert_store_mut();
                store
                    .add_lookup(X509Lookup::file())
                    .map_err(|e| openssl_error(&crl.display().to_string(), e))?
                    .load_crl_file(&crl, SslFiletype::PEM)
                    .map_err(|e| openssl_error(&crl.display().to_string(), e))?;
                store
                    .set_flags(X509VerifyFlags::CRL_CHECK)
                    .map_err(|e| openssl_error(&crl.display().to_string(), e))?;
            }
        }
        let secrets_index = common_settings(&mut builder)?;
        Ok(TlsCredentials {
            context: builder.build().into_context(),
            kind: CredentialKind::X509 { verify_peer },
            psk_identity_index: None,
            secrets_index,
        })
    }

    /// PSK credentials from a `psktool` key file: one `identity:hexkey` line per client.
    pub fn from_psk_file(path: &Path) -> Result<Self, TlsSetupError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TlsSetupError::new(format!("{}: {e}", path.display())))?;
        let keys = Arc::new(
            parse_psk_file(&text)
                .map_err(|e| TlsSetupError::new(format!("{}: {e}", path.display())))?,
        );
        let index =
            Ssl::new_ex_index::<PskLookup>().map_err(|e| openssl_error("TLS context", e))?;
        let mut builder = SslContextBuilder::new(SslMethod::tls_server())
            .map_err(|e| openssl_error("TLS context", e))?;
        builder
            .set_cipher_list(TLS12_PSK_CIPHERS)
            .map_err(|e| openssl_error("TLS 1.2 PSK ciphers", e))?;
        let identities = keys.len();
        builder.set_psk_server_callback(move |ssl, identity, key_out| {
            let Some(identity) = identity else {
                return Ok(0);
            };
            let Some((name, key)) = keys.iter().find(|(name, _)| name.as_bytes() == identity)
            else {
                // Unknown: 0 makes OpenSSL refuse the handshake (no PSK, no certificate).
                // Noted for the failure's log line (`handshake_failure`).
                ssl.set_ex_data(index, PskLookup::Unknown(quoted_identity(identity)));
                return Ok(0);
            };
            if key.len() > key_out.len() {
                return Ok(0);
            }
            key_out[..key.len()].copy_from_slice(key);
            ssl.set_ex_data(index, PskLookup::Known(name.clone()));
            Ok(key.len())
        });
        let secrets_index = common_settings(&mut builder)?;
        Ok(TlsCredentials {
            context: builder.build(),
            kind: CredentialKind::Psk { identities },
            psk_identity_index: Some(index),
            secrets_index,
        })
    }

    /// Which kind of credentials these are.
    pub fn kind(&self) -> CredentialKind {
        self.kind
    }

    /// A new server-side session object for one connection.
    pub(crate) fn new_ssl(&self) -> Result<Ssl, openssl::error::ErrorStack> {
        let mut ssl = Ssl::new(&self.context)?;
        ssl.set_ex_data(self.secrets_index, Mutex::new(TrafficSecrets::default()));
        Ok(ssl)
    }

    /// Our record layer for the finished handshake of `ssl`, if it agreed on TLS 1.3 with an
    /// AES-GCM suite (and the key log gave both secrets); otherwise OpenSSL's stays.
    pub(crate) fn take_records(&self, ssl: &openssl::ssl::SslRef) -> Option<Records> {
        let secrets = {
            let slot = ssl.ex_data(self.secrets_index)?;
            let mut guard = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            std::mem::take(&mut *guard)
        };
        if ssl.version2() != Some(SslVersion::TLS1_3) || !handed_over_whole(ssl) {
            return None;
        }
        let suite = Suite::from_standard_name(ssl.current_cipher()?.standard_name()?)?;
        let (Some(client), Some(server)) = (secrets.client, secrets.server) else {
            return None;
        };
        Records::new(suite, client, server).ok()
    }

    /// Why the handshake of `ssl` failed, when the server knows better than OpenSSL's error:
    /// the client offered a PSK identity the key file does not have (OpenSSL's error is
    /// then a follow-on one, such as "no suitable signature algorithm").
    pub(crate) fn handshake_failure(&self, ssl: &openssl::ssl::SslRef) -> Option<String> {
        match ssl.ex_data(self.psk_identity_index?)? {
            PskLookup::Unknown(quoted) => Some(format!(
                "unknown PSK identity {quoted} (not in the server's key file)"
            )),
            PskLookup::Known(_) => None,
        }
    }

    /// The identity the client proved in the finished handshake of `ssl`, if any.
    pub(crate) fn identity(&self, ssl: &openssl::ssl::SslRef) -> Option<TlsIdentity> {
        if let Some(index) = self.psk_identity_index {
            // A known identity whose key the finished handshake proved. (An unknown one
            // finishes no handshake: OpenSSL has no key for it, and no certificate.)
            if let Some(PskLookup::Known(name)) = ssl.ex_data(index) {
                return Some(TlsIdentity::Psk(name.clone()));
            }
        }
        if matches!(self.kind, CredentialKind::X509 { verify_peer: true }) {
            // Only a verified certificate is an identity: without verification anyone can
            // present any name.
            let cert = ssl.peer_certificate()?;
            let entry = cert.subject_name().entries_by_nid(Nid::COMMONNAME).next()?;
            let name = entry.data().to_string().ok()?;
            // A name with control characters (a NUL hiding a suffix) matches no list.
            if name.is_empty() || name.chars().any(char::is_control) {
                return None;
            }
            return Some(TlsIdentity::Certificate(name));
        }
        None
    }
}

extern "C" {
    // libssl's (1.1.1 and later); the openssl crate does not wrap them.
    fn SSL_has_pending(ssl: *const openssl_sys::SSL) -> std::os::raw::c_int;
    fn SSL_SESSION_get_max_fragment_length(session: *const openssl_sys::SSL_SESSION) -> u8;
}

/// Whether OpenSSL's record layer can be left after the handshake of `ssl`: it holds no
/// client record it has read but not processed (read-ahead is off, so it should not), and
/// no smaller record size was agreed (RFC 6066's max_fragment_length: our records are
/// 16 KiB).
fn handed_over_whole(ssl: &openssl::ssl::SslRef) -> bool {
    use foreign_types::ForeignTypeRef;
    // SAFETY: a live SSL object, borrowed for the call.
    let pending = unsafe { SSL_has_pending(ssl.as_ptr()) };
    let Some(session) = ssl.session() else {
        return false;
    };
    // SAFETY: the session of that SSL object, borrowed for the call.
    let fragment = unsafe { SSL_SESSION_get_max_fragment_length(session.as_ptr()) };
    // TLSEXT_max_fragment_length_DISABLED is 0.
    pending == 0 && fragment == 0
}

/// Settings for both kinds: TLS 1.2 at least (the protocol's minimum), the server's suite
/// order, no session tickets (NBD clients do not resume, a ticket is work and bytes for
/// nothing, and our record layer numbers the server's records from 0), no renegotiation, no
/// read-ahead, the traffic secrets captured. Returns where the secrets are kept.
fn common_settings(builder: &mut SslContextBuilder) -> Result<SecretsIndex, TlsSetupError> {
    builder
        .set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(|e| openssl_error("TLS versions", e))?;
    builder
        .set_ciphersuites(TLS13_SUITES)
        .map_err(|e| openssl_error("TLS 1.3 suites", e))?;
    builder.set_options(
        SslOptions::CIPHER_SERVER_PREFERENCE
            | SslOptions::NO_TICKET
            | SslOptions::NO_RENEGOTIATION
            | SslOptions::NO_COMPRESSION,
    );
    builder
        .set_num_tickets(0)
        .map_err(|e| openssl_error("TLS session tickets", e))?;
    // No read-ahead: OpenSSL reads a record's header and then its body, so at the end of the
    // handshake the client's first records are still in our receive buffer for our record
    // layer (with read-ahead, OpenSSL would have taken them into its own). Where OpenSSL's
    // record layer stays (TLS 1.2, ChaCha20), small records take two BIO reads instead of one.
    builder.set_read_ahead(false);
    let index = Ssl::new_ex_index::<Mutex<TrafficSecrets>>()
        .map_err(|e| openssl_error("TLS context", e))?;
    capture_traffic_secrets(builder, index);
    Ok(index)
}

/// Parses a `psktool` key file: `identity:hexkey` lines; blank lines and `#` comments are
/// skipped. Errors name the line, never the key.
pub fn parse_psk_file(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut keys: Vec<(String, Vec<u8>)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let number = number + 1;
        let Some((identity, hex)) = line.split_once(':') else {
            return Err(format!("line {number}: expected identity:hexkey"));
        };
        if identity.is_empty() || identity.len() > PSK_IDENTITY_MAX_BYTES {
            return Err(format!(
                "line {number}: the identity must have 1 to {PSK_IDENTITY_MAX_BYTES} bytes"
            ));
        }
        let key = decode_hex(hex).ok_or_else(|| {
            format!("line {number}: the key is not an even number of hexadecimal digits")
        })?;
        if key.is_empty() || key.len() > PSK_KEY_MAX_BYTES {
            return Err(format!(
                "line {number}: the key must have 1 to {PSK_KEY_MAX_BYTES} bytes"
            ));
        }
        if keys.iter().any(|(name, _)| name == identity) {
            return Err(format!(
                "line {number}: identity '{identity}' appears twice"
            ));
        }
        if keys.len() == PSK_IDENTITIES_MAX {
            return Err(format!("more than {PSK_IDENTITIES_MAX} identities"));
        }
        keys.push((identity.to_string(), key));
    }
    if keys.is_empty() {
        return Err("no identity:hexkey line".into());
    }
    Ok(keys)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    };
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// The server's TLS settings.
#[derive(Clone, Debug, Default)]
pub struct TlsConfig {
    /// Off, optional (`--tls on`) or required (`--tls require`).
    pub policy: TlsPolicy,
    /// Needed unless the policy is `Off`.
    pub credentials: Option<TlsCredentials>,
}

impl TlsConfig {
    /// Checks that a policy other than `Off` has credentials.
    pub fn validate(&self) -> Result<(), TlsSetupError> {
        if self.policy != TlsPolicy::Off && self.credentials.is_none() {
            return Err(TlsSetupError::new(
                "TLS is on but no credentials were given (certificates or pre-shared keys)",
            ));
        }
        Ok(())
    }
}

/// Who may open one export: `None` is everyone who can connect; a list names the client
/// identities (certificate common names or PSK identities) that may.
pub type AllowList = Option<Vec<String>>;

/// This client's access to each export, given each export's allow list, whether TLS is up on
/// the connection and the identity the client proved.
///
/// An export with a list is never open without TLS: before (or without) TLS it is
/// `TlsRequired` when the server offers TLS, `Denied` when it does not; after TLS it is
/// `Allowed` only for an identity on its list.
pub fn export_access(
    allow_lists: impl IntoIterator<Item = AllowList>,
    policy: TlsPolicy,
    tls_active: bool,
    identity: Option<&TlsIdentity>,
) -> Vec<ExportAccess> {
    allow_lists
        .into_iter()
        .map(|list| match list {
            None => ExportAccess::Allowed,
            Some(names) if tls_active => {
                let allowed = identity.is_some_and(|id| names.iter().any(|n| n == id.name()));
                if allowed {
                    ExportAccess::Allowed
                } else {
                    ExportAccess::Denied
                }
            }
            Some(_) if policy == TlsPolicy::Off => ExportAccess::Denied,
            Some(_) => ExportAccess::TlsRequired,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_parse_and_bad_lines_are_named() {
        let keys = parse_psk_file("alice:0a0B\n\n# c\nbob:ff\n").unwrap();
        assert_eq!(
            keys,
            vec![
                ("alice".into(), vec![0x0a, 0x0b]),
                ("bob".into(), vec![0xff])
            ]
        );
        assert_eq!(
            parse_psk_file("alice:abc").unwrap_err(),
            "line 1: the key is not an even number of hexadecimal digits"
        );
        assert!(parse_psk_file("x:zz").is_err());
        assert!(parse_psk_file("nokey").unwrap_err().contains("line 1"));
        assert!(parse_psk_file(":00").is_err());
        assert!(parse_psk_file("a:00\na:01").unwrap_err().contains("twice"));
        assert!(parse_psk_file("\n").is_err());
        assert!(parse_psk_file(&format!("a:{}", "00".repeat(PSK_KEY_MAX_BYTES + 1))).is_err());
    }

    /// A PSK handshake between these credentials (the server, on a thread) and an OpenSSL
    /// client offering `identity` with `key` (at most `version`): the client's identity as
    /// the server has it, or the server's reason for the failure (`handshake_failure`, else
    /// OpenSSL's error).
    fn psk_handshake(
        credentials: &TlsCredentials,
        identity: &[u8],
        key: &[u8],
        version: SslVersion,
    ) -> Result<Option<TlsIdentity>, String> {
        use openssl::ssl::{HandshakeError, SslConnector, SslVerifyMode};
        use std::os::unix::net::UnixStream;
        use std::time::Duration;

        let (server_end, client_end) = UnixStream::pair().unwrap();
        for end in [&server_end, &client_end] {
            end.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        }
        let server = {
            let credentials = credentials.clone();
            std::thread::spawn(move || {
                let ssl = credentials.new_ssl().unwrap();
                match ssl.accept(server_end) {
                    Ok(stream) => Ok(credentials.identity(stream.ssl())),
                    Err(HandshakeError::Failure(mid)) => Err(credentials
                        .handshake_failure(mid.ssl())
                        .unwrap_or_else(|| mid.error().to_string())),
                    Err(err) => Err(err.to_string()),
                }
            })
        };
        let mut client = SslConnector::builder(SslMethod::tls_client()).unwrap();
        client.set_max_proto_version(Some(version)).unwrap();
        client.set_cipher_list(TLS12_PSK_CIPHERS).unwrap();
        client.set_verify(SslVerifyMode::NONE);
        let (identity, key) = (identity.to_vec(), key.to_vec());
        client.set_psk_client_callback(move |_, _hint, identity_out, key_out| {
            identity_out[..identity.len()].copy_from_slice(&identity);
            identity_out[identity.len()] = 0;
            key_out[..key.len()].copy_from_slice(&key);
            Ok(key.len())
        });
        let config = client.build().configure().unwrap();
        // The client fails too when the server does; the server's side is what is checked.
        let _ = config
            .verify_hostname(false)
            .connect("localhost", client_end);
        server.join().unwrap()
    }

    #[test]
    fn an_unknown_psk_identity_is_named_in_the_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.psk");
        let key = [0x5au8; 32];
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&path, format!("alice:{hex}\n")).unwrap();
        let credentials = TlsCredentials::from_psk_file(&path).unwrap();

        for version in [SslVersion::TLS1_3, SslVersion::TLS1_2] {
            assert_eq!(
                psk_handshake(&credentials, b"alice", &key, version),
                Ok(Some(TlsIdentity::Psk("alice".into()))),
                "{version:?}"
            );
            // Before, OpenSSL's follow-on error: in TLS 1.3 "no suitable signature
            // algorithm" (a certificate handshake, for lack of a known PSK).
            assert_eq!(
                psk_handshake(&credentials, b"mallory", &key, version),
                Err("unknown PSK identity 'mallory' (not in the server's key file)".into()),
                "{version:?}"
            );
        }
        // From the client, so escaped (no terminal escapes, no forged lines) and bounded.
        let err = psk_handshake(
            &credentials,
            b"evil\x1b[2J\nWARN forged 'x' \\",
            &key,
            SslVersion::TLS1_3,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "unknown PSK identity 'evil\\x1b[2J\\x0aWARN forged \\x27x\\x27 \\x5c' \
             (not in the server's key file)"
        );
        let long = [b'm'; 200];
        let err = psk_handshake(&credentials, &long, &key, SslVersion::TLS1_3).unwrap_err();
        assert_eq!(
            err,
            format!(
                "unknown PSK identity '{}'... (200 bytes) (not in the server's key file)",
                "m".repeat(IDENTITY_SHOWN_MAX_BYTES)
            )
        );
    }

    #[test]
    fn access_follows_lists_tls_and_identity() {
        let lists = || {
            vec![
                None,
                Some(vec!["alice".to_string()]),
                Some(vec!["bob".to_string()]),
            ]
        };
        use ExportAccess::*;
        assert_eq!(
            export_access(lists(), TlsPolicy::Optional, false, None),
            vec![Allowed, TlsRequired, TlsRequired]
        );
        assert_eq!(
            export_access(lists(), TlsPolicy::Off, false, None),
            vec![Allowed, Denied, Denied]
        );
        let alice = TlsIdentity::Psk("alice".into());
        assert_eq!(
            export_access(lists(), TlsPolicy::Required, true, Some(&alice)),
            vec![Allowed, Allowed, Denied]
        );
        assert_eq!(
            export_access(lists(), TlsPolicy::Required, true, None),
            vec![Allowed, Denied, Denied]
        );
        let cert = TlsIdentity::Certificate("bob".into());
        assert_eq!(
            export_access(lists(), TlsPolicy::Optional, true, Some(&cert)),
            vec![Allowed, Denied, Allowed]
        );
    }
}
