//! Options of an accepted connection's TCP socket: no Nagle delay, and the congestion control
//! (`oxpool serve --tcp-congestion`, docs/nbd.md "TCP congestion control").
//!
//! Why the server chooses a congestion control at all: BBR (a common system-wide choice,
//! `net.ipv4.tcp_congestion_control = bbr`) paces every socket, and without the `fq` queueing
//! discipline the kernel paces with a timer of its own per socket. On a connection from this
//! same host (loopback) there is no network whose queues pacing could spare, only its cost:
//! measured on the development machine (128 KiB sequential reads at iodepth 8 over loopback,
//! every block cached), the server's replies paced by BBR ran at 17-19K reads/s and 52-58 us
//! of server CPU per read, the same server with cubic on its sockets at 29-31K and 32-34 us
//! (30 % of the reactor's samples were the pacing's timer bookkeeping under
//! `tcp_write_xmit`). So by default (`auto`) a same-host connection that would be paced gets
//! cubic, the kernel's own default; connections from other hosts keep the system's choice.
//!
//! The switch happens after `accept`, when BBR has already marked the socket as needing
//! pacing; the kernel does not clear that mark when the congestion control changes, so the
//! socket is still paced, but at cubic's rate (1.2 to 2 times its window per round trip),
//! which on loopback is far above what it sends: measured, 31.2-32.0 us of server CPU per
//! 128 KiB read after the switch, 31.7-32.8 with cubic as the system's congestion control
//! (no BBR at any time), 48.7-53.7 with BBR.

use std::io;
use std::mem::ManuallyDrop;
use std::net::{IpAddr, TcpStream};
use std::os::fd::{FromRawFd, RawFd};

/// What `auto` gives a same-host connection whose congestion control paces: the kernel's
/// default congestion control, built into every kernel we target.
pub const SAME_HOST_CONGESTION: &str = "cubic";

/// Longest congestion control name the kernel takes (`TCP_CA_NAME_MAX`, 16, with its NUL).
const CONGESTION_NAME_BYTES_MAX: usize = 15;

/// Which TCP congestion control the server's connections use (`--tcp-congestion`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TcpCongestion {
    /// The system's, except on a connection from this host whose congestion control paces
    /// (BBR): [`SAME_HOST_CONGESTION`] there.
    #[default]
    Auto,
    /// The system's on every connection (`net.ipv4.tcp_congestion_control`).
    System,
    /// This one on every TCP connection: a name the kernel offers
    /// (`net.ipv4.tcp_available_congestion_control`).
    Named(String),
}

impl TcpCongestion {
    /// Parses `auto`, `system` or a congestion control's name; an error (one line) for a name
    /// the kernel could not take. Whether the kernel offers it: [`TcpCongestion::check`].
    pub fn parse(value: &str) -> Result<TcpCongestion, String> {
        match value {
            "auto" => Ok(TcpCongestion::Auto),
            "system" => Ok(TcpCongestion::System),
            name if !name.is_empty()
                && name.len() <= CONGESTION_NAME_BYTES_MAX
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') =>
            {
                Ok(TcpCongestion::Named(name.to_string()))
            }
            other => Err(format!(
                "'{other}' is not auto, system or a congestion control's name (at most \
                 {CONGESTION_NAME_BYTES_MAX} of a-z, 0-9 and _)"
            )),
        }
    }

    /// For a named congestion control: that this process may set it (on a scratch socket),
    /// else why not, in one line naming what the kernel offers. `auto` and `system` pass.
    pub fn check(&self) -> Result<(), String> {
        let TcpCongestion::Named(name) = self else {
            return Ok(());
        };
        // A scratch socket, closed when dropped.
        let scratch = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("cannot check the congestion control '{name}': {e}"))?;
        use std::os::fd::AsRawFd;
        set_congestion(scratch.as_raw_fd(), name).map_err(|e| {
            let offered = |knob: &str| {
                std::fs::read_to_string(format!("/proc/sys/net/ipv4/{knob}"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "unknown".to_string())
            };
            match e.raw_os_error() {
                Some(libc::ENOENT) => format!(
                    "the kernel has no TCP congestion control '{name}' (available: {})",
                    offered("tcp_available_congestion_control")
                ),
                Some(libc::EPERM) => format!(
                    "this process may not use the TCP congestion control '{name}': it is not \
                     in net.ipv4.tcp_allowed_congestion_control ({})",
                    offered("tcp_allowed_congestion_control")
                ),
                _ => format!("cannot use the TCP congestion control '{name}': {e}"),
            }
        })
    }

    /// The option's value as the user writes it.
    pub fn as_str(&self) -> &str {
        match self {
            TcpCongestion::Auto => "auto",
            TcpCongestion::System => "system",
            TcpCongestion::Named(name) => name,
        }
    }
}

/// Sets an accepted connection's socket options: no Nagle delay (replies are small and the
/// writer already batches them) and the congestion control `congestion` asks for. Failures
/// are logged and the connection goes on with what it has: none of these options is needed
/// for correctness. On a unix socket there is nothing to set.
pub(crate) fn configure(fd: RawFd, congestion: &TcpCongestion) {
    // SAFETY: `fd` is a socket the caller's stream owns and keeps open for this call; the
    // `TcpStream` only borrows it (never dropped, so never closed) to read its addresses.
    let stream = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return; // not a TCP socket (a unix socket), or already gone
    };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on an open socket with a pointer to a live c_int of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "nbd: TCP_NODELAY");
    }
    let wanted = match congestion {
        TcpCongestion::System => return,
        TcpCongestion::Named(name) => name.as_str(),
        TcpCongestion::Auto => {
            if !same_host(peer.ip(), local.ip()) {
                return;
            }
            match get_congestion(fd) {
                Ok(current) if paces(&current) => SAME_HOST_CONGESTION,
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "nbd: reading the congestion control");
                    return;
                }
            }
        }
    };
    if let Err(e) = set_congestion(fd, wanted) {
        tracing::debug!(error = %e, congestion = wanted, "nbd: setting the congestion control");
    }
}

/// Whether a connection between these addresses stays on this host: a loopback peer, or a
/// peer at our own address (the kernel routes both over the loopback device).
pub fn same_host(peer: IpAddr, local: IpAddr) -> bool {
    let (peer, local) = (peer.to_canonical(), local.to_canonical());
    peer.is_loopback() || peer == local
}

/// Whether a congestion control paces its socket's sending by itself (the BBR family sets
/// `SK_PACING_NEEDED`; cubic, reno and the others send as their window allows).
pub fn paces(congestion: &str) -> bool {
    congestion.starts_with("bbr")
}

fn set_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: setsockopt on an open socket with a pointer to `name`'s live bytes and their
    // length (the kernel copies at most that many and needs no NUL).
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The socket's congestion control's name.
pub fn get_congestion(fd: RawFd) -> io::Result<String> {
    let mut name = [0u8; CONGESTION_NAME_BYTES_MAX + 1];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: getsockopt on an open socket into a live buffer of `len` bytes; the kernel
    // writes at most `len` and stores the length it wrote in `len`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let written = &name[..(len as usize).min(name.len())];
    let end = written
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(written.len());
    Ok(String::from_utf8_lossy(&written[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};
    use std::os::fd::AsRawFd;

    #[test]
    fn parses_the_option() {
        assert_eq!(TcpCongestion::parse("auto"), Ok(TcpCongestion::Auto));
        assert_eq!(TcpCongestion::parse("system"), Ok(TcpCongestion::System));
        assert_eq!(
            TcpCongestion::parse("cubic"),
            Ok(TcpCongestion::Named("cubic".into()))
        );
        for bad in ["", "Cubic", "a b", "x;y", "sixteen_bytes_xx"] {
            let err = TcpCongestion::parse(bad).unwrap_err();
            assert!(err.contains("not auto, system"), "{bad}: {err}");
        }
        assert_eq!(TcpCongestion::default().as_str(), "auto");
    }

    #[test]
    fn same_host_is_loopback_or_our_own_address() {
        let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let mapped_lo = IpAddr::V6(Ipv4Addr::new(127, 0, 0, 2).to_ipv6_mapped());
        let ours = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let theirs = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
        assert!(same_host(lo4, lo4));
        assert!(same_host(lo6, lo6));
        assert!(same_host(mapped_lo, IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
        assert!(same_host(ours, ours));
        assert!(same_host(
            IpAddr::V6(Ipv4Addr::new(198, 18, 0, 1).to_ipv6_mapped()),
            ours
        ));
        assert!(!same_host(theirs, ours));
        assert!(paces("bbr") && paces("bbr3"));
        assert!(!paces("cubic") && !paces("reno") && !paces("dctcp"));
    }

    /// `check` names what the kernel offers for a name it lacks, and takes one it has
    /// (reno is built into every kernel).
    #[test]
    fn check_refuses_a_congestion_control_the_kernel_lacks() {
        let err = TcpCongestion::Named("nosuchcc".into()).check().unwrap_err();
        assert!(
            err.contains("no TCP congestion control 'nosuchcc'") && err.contains("available:"),
            "{err}"
        );
        assert_eq!(TcpCongestion::Named("reno".into()).check(), Ok(()));
        assert_eq!(TcpCongestion::Auto.check(), Ok(()));
    }

    /// A named congestion control is set on the accepted socket, whatever the socket had;
    /// `system` leaves it as it was; `auto` replaces a pacing one (bbr) on a loopback
    /// connection with cubic and leaves one that does not pace (reno).
    #[test]
    fn configure_sets_the_congestion_control_asked_for() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let fd = accepted.as_raw_fd();
        set_congestion(fd, "bbr").unwrap_or_else(|e| {
            panic!("this test needs the kernel's bbr congestion control (tcp_bbr): {e}")
        });
        configure(fd, &TcpCongestion::System);
        assert_eq!(get_congestion(fd).unwrap(), "bbr");
        configure(fd, &TcpCongestion::Auto);
        assert_eq!(get_congestion(fd).unwrap(), SAME_HOST_CONGESTION);
        configure(fd, &TcpCongestion::Named("reno".into()));
        assert_eq!(get_congestion(fd).unwrap(), "reno");
        configure(fd, &TcpCongestion::Auto);
        assert_eq!(get_congestion(fd).unwrap(), "reno");
        drop(client);
    }
}
