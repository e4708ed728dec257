//! The files `oxpool` keeps next to its pool cache file (`pools.inject`, `pools.errors`):
//! this machine's state about its pools, kept out of the pools themselves. Each is rewritten
//! whole under an flock of `NAME.lock`, so that two commands (on two pools) do not lose each
//! other's lines, and replaced atomically, so that a reader without the lock sees the old
//! file or the new one.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The file beside the cache file `cache` with extension `extension`.
pub fn path_of(cache: &Path, extension: &str) -> PathBuf {
    cache.with_extension(extension)
}

/// Runs `f` while holding an exclusive flock of `PATH.lock` (created, with its directory, if
/// needed); released when `f` returns.
pub fn locked<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| lock_path.display().to_string())?;
    // SAFETY: flock on a valid, owned file descriptor; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        bail!(
            "{}: cannot lock: {}",
            lock_path.display(),
            std::io::Error::last_os_error()
        );
    }
    f()
}

/// Replaces `path` with `text`: written whole to a temporary file, synced, renamed over it.
pub fn replace(path: &Path, text: &str) -> Result<()> {
    let ctx = || path.display().to_string();
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let mut f = std::fs::File::create(&tmp).with_context(ctx)?;
    f.write_all(text.as_bytes()).with_context(ctx)?;
    f.sync_all().with_context(ctx)?;
    std::fs::rename(&tmp, path).with_context(ctx)
}

/// The text of `path`, or `None` if there is no such file.
pub fn read_text(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| path.display().to_string()),
    }
}
