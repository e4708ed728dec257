//! The runtime directory beside the pool cache file: which running server owns which pool.
//!
//! `<cache>.run/` (mode 0755, so that another user learns whose server it is and gets a clear
//! "permission denied" rather than a confusing lock error) holds:
//! - `server-<pid>.sock`: the control socket of each running `oxpool serve` (mode 0600: only
//!   the serving user may connect);
//! - `pool-<name>`: a symbolic link to the socket of the server that owns pool `<name>`,
//!   made when the server starts serving the pool and removed when it stops.
//!
//! A server killed with SIGKILL leaves its socket and links behind; nobody listens there any
//! more, so a connection is refused and the command treats the pool as not served (its
//! devices' locks died with the process). The next server cleans them up.

use anyhow::{anyhow, Context, Result};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Longest path a unix socket address holds (sun_path is 108 bytes with its NUL).
const SOCKET_PATH_BYTES_MAX: usize = 107;

/// The runtime directory of the cache file `cache`.
#[derive(Clone, Debug)]
pub struct RuntimeDir {
    dir: PathBuf,
}

/// A server found in the runtime directory.
#[derive(Debug)]
pub enum Found {
    /// No server owns it (or the one that did is gone).
    None,
    /// A server is listening there: its socket, and a connection to it.
    Server(PathBuf, UnixStream),
}

impl RuntimeDir {
    /// The runtime directory of cache file `cache` (not created).
    pub fn of_cache(cache: &Path) -> RuntimeDir {
        let mut name = cache
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| "pools.cache".into());
        name.push(".run");
        let cache = std::path::absolute(cache).unwrap_or_else(|_| cache.to_path_buf());
        RuntimeDir {
            dir: cache.with_file_name(name),
        }
    }

    /// The socket a server of process `pid` listens on.
    pub fn socket_path(&self, pid: u32) -> PathBuf {
        self.dir.join(format!("server-{pid}.sock"))
    }

    fn pool_link(&self, pool: &str) -> PathBuf {
        self.dir.join(format!("pool-{pool}"))
    }

    /// Creates the directory (0755) and checks that a socket path fits in an address.
    pub fn create(&self, pid: u32) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let meta = std::fs::metadata(&self.dir)?;
        if meta.uid() == current_uid() {
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755))?;
        }
        let socket = self.socket_path(pid);
        if socket.as_os_str().len() > SOCKET_PATH_BYTES_MAX {
            anyhow::bail!(
                "control socket path {} is longer than {SOCKET_PATH_BYTES_MAX} bytes; use a \
                 shorter --cache-file path",
                socket.display()
            );
        }
        Ok(())
    }

    /// Records that the server listening on `socket` owns `pool` (replacing a record left by
    /// a server that died).
    pub fn claim(&self, pool: &str, socket: &Path) -> Result<()> {
        let link = self.pool_link(pool);
        let tmp = self
            .dir
            .join(format!(".pool-{pool}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let target = socket.file_name().map(PathBuf::from).unwrap_or_default();
        std::os::unix::fs::symlink(&target, &tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        std::fs::rename(&tmp, &link).with_context(|| format!("cannot create {}", link.display()))
    }

    /// Removes the record of `pool` if it names `socket`.
    pub fn release(&self, pool: &str, socket: &Path) {
        let link = self.pool_link(pool);
        if let Ok(target) = std::fs::read_link(&link) {
            if Some(target.as_os_str()) == socket.file_name() {
                let _ = std::fs::remove_file(&link);
            }
        }
    }

    /// The server that owns `pool`, if one is running. A socket that refuses the connection
    /// is a dead server's (ignored); one that this user may not use is an error naming it.
    pub fn server_of(&self, pool: &str) -> Result<Found> {
        let link = self.pool_link(pool);
        match std::fs::read_link(&link) {
            Ok(target) => probe(&self.dir.join(target)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Found::None),
            Err(e) => Err(anyhow!("cannot read {}: {e}", link.display())),
        }
    }

    /// Every running server's socket (dead servers' sockets are skipped).
    pub fn servers(&self) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(anyhow!("cannot read {}: {e}", self.dir.display())),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("server-") && name.ends_with(".sock") {
                if let Found::Server(path, _) = probe(&entry.path())? {
                    out.push(path);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes what dead servers left: sockets nobody listens on and the links to them.
    pub fn clean_stale(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut dead = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("server-") && name.ends_with(".sock") {
                if let Err(e) = UnixStream::connect(entry.path()) {
                    if e.kind() == ErrorKind::ConnectionRefused {
                        let _ = std::fs::remove_file(entry.path());
                        dead.push(name);
                    }
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("pool-") {
                if let Ok(target) = std::fs::read_link(entry.path()) {
                    if dead.iter().any(|d| target.as_os_str() == d.as_str()) {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
        }
    }
}

/// Whether a server listens on `socket`.
fn probe(socket: &Path) -> Result<Found> {
    match UnixStream::connect(socket) {
        Ok(stream) => Ok(Found::Server(socket.to_path_buf(), stream)),
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) => {
            Ok(Found::None)
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Err(permission_denied(socket)),
        Err(e) => Err(anyhow!("cannot connect to {}: {e}", socket.display())),
    }
}

/// The error a user gets for a server that is not theirs.
pub fn permission_denied(socket: &Path) -> anyhow::Error {
    let owner = std::fs::metadata(socket)
        .map(|m| format!("uid {}", m.uid()))
        .unwrap_or_else(|_| "another user".into());
    anyhow!(
        "permission denied: {} is the control socket of a server run by {owner}; only that \
         user may administer its pools",
        socket.display()
    )
}

/// This process's effective user id.
pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
