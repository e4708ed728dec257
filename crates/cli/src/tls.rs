//! `oxpool serve`'s TLS options, as nbdkit spells them: `--tls off|on|require`,
//! `--tls-certificates DIR`, `--tls-verify-peer`, `--tls-psk FILE`. See docs/tls.md.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use oxpool_nbd::proto::TlsPolicy;
use oxpool_nbd::server::tls::{CredentialKind, TlsConfig, TlsCredentials};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TlsArg {
    /// Clear text only (STARTTLS is refused).
    Off,
    /// TLS for clients that ask for it; volumes with an `nbd_allow` list only through TLS.
    On,
    /// TLS for every client: nothing is served before STARTTLS.
    Require,
}

/// The TLS options of `oxpool serve`.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// TLS: off, on (clients choose) or require [default: require when --listen is not a
    /// loopback address or a TLS option is given (credentials, --tls-verify-peer), else off].
    #[arg(long, value_enum)]
    pub tls: Option<TlsArg>,
    /// Directory with ca-cert.pem, server-cert.pem, server-key.pem and optionally ca-crl.pem
    /// (the layout qemu, nbdkit and libnbd use) [default when TLS is on without --tls-psk:
    /// /etc/pki/oxpool as root, else ~/.pki/oxpool].
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Require client certificates signed by ca-cert.pem (and not revoked by ca-crl.pem);
    /// their common names are the identities nbd_allow lists.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Pre-shared keys instead of certificates: a psktool key file of identity:hexkey lines.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_certificates")]
    pub tls_psk: Option<PathBuf>,
}

/// nbdkit's default certificate directory, with oxpool's name.
fn default_certificate_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/etc/pki/oxpool");
    }
    match std::env::var_os("HOME") {
        Some(home) => Path::new(&home).join(".pki/oxpool"),
        None => PathBuf::from("/etc/pki/oxpool"),
    }
}

/// `--tls` when not given: `require` when another host can reach the TCP address (it is not
/// a loopback address) or a TLS option was given (credentials, `--tls-verify-peer`), else
/// `off`.
fn default_mode(tcp: Option<SocketAddr>, credentials_given: bool) -> TlsArg {
    let exposed = tcp.is_some_and(|addr| !addr.ip().is_loopback());
    if exposed || credentials_given {
        TlsArg::Require
    } else {
        TlsArg::Off
    }
}

/// The server's TLS configuration from the options and the TCP address it listens on.
pub fn server_tls(args: &TlsArgs, tcp: Option<SocketAddr>) -> Result<TlsConfig> {
    let credentials_given = args.tls_certificates.is_some() || args.tls_psk.is_some();
    let tls_asked = credentials_given || args.tls_verify_peer;
    let mode = args.tls.unwrap_or_else(|| default_mode(tcp, tls_asked));
    if mode == TlsArg::Off {
        // Only `--tls off` itself: any TLS option makes the default `require`.
        if tls_asked {
            bail!("--tls off: the TLS options given would not be used");
        }
        return Ok(TlsConfig::default());
    }
    if args.tls_verify_peer && args.tls_psk.is_some() {
        bail!("--tls-verify-peer is for certificates; with --tls-psk the key is the proof");
    }
    let credentials = match &args.tls_psk {
        Some(file) => TlsCredentials::from_psk_file(file)?,
        None => {
            let dir = args
                .tls_certificates
                .clone()
                .unwrap_or_else(default_certificate_dir);
            TlsCredentials::from_certificate_dir(&dir, args.tls_verify_peer).map_err(|err| {
                if args.tls_certificates.is_none() && args.tls_verify_peer {
                    anyhow::anyhow!(
                        "--tls-verify-peer checks client certificates against the server's CA, \
                         and {err}: give --tls-certificates DIR"
                    )
                } else if args.tls_certificates.is_none() && args.tls.is_none() {
                    anyhow::anyhow!(
                        "TLS is required on a non-loopback address, and {err}: give \
                         --tls-certificates DIR or --tls-psk FILE (or --tls off to serve in \
                         clear text)"
                    )
                } else {
                    anyhow::anyhow!("--tls-certificates: {err}")
                }
            })?
        }
    };
    Ok(TlsConfig {
        policy: match mode {
            TlsArg::On => TlsPolicy::Optional,
            _ => TlsPolicy::Required,
        },
        credentials: Some(credentials),
    })
}

/// One line saying how TLS is set up, for the server's banner.
pub fn describe(config: &TlsConfig) -> String {
    let policy = match config.policy {
        TlsPolicy::Off => return "TLS: off".into(),
        TlsPolicy::Optional => "on (clients choose)",
        TlsPolicy::Required => "required",
    };
    let credentials = match config.credentials.as_ref().map(|c| c.kind()) {
        Some(CredentialKind::X509 { verify_peer: true }) => {
            "X.509, client certificates verified".to_string()
        }
        Some(CredentialKind::X509 { verify_peer: false }) => "X.509".to_string(),
        Some(CredentialKind::Psk { identities }) => {
            format!("pre-shared keys ({identities} identities)")
        }
        None => "no credentials".to_string(),
    };
    format!("TLS: {policy}; {credentials}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> TlsArgs {
        TlsArgs {
            tls: None,
            tls_certificates: None,
            tls_verify_peer: false,
            tls_psk: None,
        }
    }

    #[test]
    fn tls_is_required_by_default_off_loopback() {
        let addr = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        assert_eq!(default_mode(addr("127.0.0.1:10809"), false), TlsArg::Off);
        assert_eq!(default_mode(addr("[::1]:10809"), false), TlsArg::Off);
        assert_eq!(default_mode(None, false), TlsArg::Off);
        assert_eq!(default_mode(addr("0.0.0.0:10809"), false), TlsArg::Require);
        assert_eq!(default_mode(addr("[::]:10809"), false), TlsArg::Require);
        assert_eq!(
            default_mode(addr("192.0.2.7:10809"), false),
            TlsArg::Require
        );
        assert_eq!(default_mode(addr("127.0.0.1:10809"), true), TlsArg::Require);
        let config = server_tls(&args(), addr("127.0.0.1:1")).unwrap();
        assert_eq!(config.policy, TlsPolicy::Off);
    }

    #[test]
    fn contradictory_options_are_refused() {
        let mut off_with_keys = args();
        off_with_keys.tls = Some(TlsArg::Off);
        off_with_keys.tls_psk = Some("/nonexistent".into());
        assert!(server_tls(&off_with_keys, None).is_err());
        let mut verify_psk = args();
        verify_psk.tls_psk = Some("/nonexistent".into());
        verify_psk.tls_verify_peer = true;
        let err = server_tls(&verify_psk, None).unwrap_err().to_string();
        assert!(err.contains("--tls-verify-peer"), "{err}");
        // --tls-verify-peer alone asks for TLS, with the default certificates: what is
        // missing is said about it, not about --tls off, which was not given.
        let mut verify_alone = args();
        verify_alone.tls_verify_peer = true;
        let loopback = Some("127.0.0.1:1".parse::<SocketAddr>().unwrap());
        match server_tls(&verify_alone, loopback) {
            Ok(config) => assert_eq!(config.policy, TlsPolicy::Required),
            Err(err) => {
                let err = err.to_string();
                assert!(
                    err.contains("--tls-verify-peer")
                        && err.contains("--tls-certificates DIR")
                        && !err.contains("--tls off"),
                    "{err}"
                );
            }
        }
        let mut missing = args();
        missing.tls_certificates = Some("/nonexistent-dir".into());
        let err = server_tls(&missing, None).unwrap_err().to_string();
        assert!(err.contains("/nonexistent-dir/ca-cert.pem"), "{err}");
    }
}
