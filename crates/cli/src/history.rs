//! What the pool's history records of a command (`oxpool history`, as `zpool history`): the
//! command line of each command that changed a pool, recorded in that pool when the change
//! succeeded (spa/history.rs keeps and writes them).
//!
//! The command runs on one thread, here or in a server's control connection, which says so
//! with [`running`] for the command's length; [`record`] then records its line in a pool once.

use std::cell::RefCell;

use oxpool_engine::Pool;

/// The command running on this thread: its line, and the pools it was recorded in.
struct Running {
    line: String,
    recorded: Vec<String>,
    /// The command turned out to change nothing (a dry run inside a change): no record.
    changed_nothing: bool,
}

thread_local! {
    static RUNNING: RefCell<Option<Running>> = const { RefCell::new(None) };
}

/// The command on this thread until dropped.
pub struct Command(());

impl Drop for Command {
    fn drop(&mut self) {
        RUNNING.with(|r| r.borrow_mut().take());
    }
}

/// Says that the command `args` (without the program name) runs on this thread until the
/// guard drops. `--cache-file` is left out of its line: it says where this host keeps its
/// pool list, not what was done to the pool.
pub fn running(args: &[String]) -> Command {
    let mut words = vec!["oxpool".to_string()];
    let mut skip_next = false;
    for a in args {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        if a == "--cache-file" {
            skip_next = true;
            continue;
        }
        if a.starts_with("--cache-file=") {
            continue;
        }
        words.push(crate::display::shell_word(a));
    }
    RUNNING.with(|r| {
        *r.borrow_mut() = Some(Running {
            line: words.join(" "),
            recorded: Vec::new(),
            changed_nothing: false,
        })
    });
    Command(())
}

/// Records the running command in `pool`'s history, once per pool and command (a command
/// that changes a pool in several steps is one record). Nothing if no command runs here.
pub fn record(pool: &Pool) {
    RUNNING.with(|r| {
        let mut r = r.borrow_mut();
        let Some(running) = r.as_mut() else {
            return;
        };
        let name = pool.name().to_string();
        if running.changed_nothing || running.recorded.contains(&name) {
            return;
        }
        // SAFETY: getuid cannot fail and touches no memory.
        let uid = unsafe { libc::getuid() };
        let time_s = crate::iostat::now_ms() / 1000;
        pool.record_history(&running.line, uid, &host_name(), time_s);
        running.recorded.push(name);
    });
}

/// Records in `pool` the command `args` (without the program name), as if it had run: what
/// a command did without its own command line (serve's default pool).
pub fn record_as(pool: &Pool, args: &[&str]) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let _running = running(&args);
    record(pool);
}

/// Says that the running command changed nothing after all (`destroy -n`, whose plan is
/// made inside a change): it is not recorded.
pub fn changed_nothing() {
    RUNNING.with(|r| {
        if let Some(running) = r.borrow_mut().as_mut() {
            running.changed_nothing = true;
        }
    });
}

/// This host's name (`uname -n`), or `-` if it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "-".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_leaves_out_the_cache_file_and_quotes_what_a_shell_would_split() {
        let args: Vec<String> = [
            "--cache-file",
            "/tmp/c",
            "set",
            "com.example:note=two words",
            "--cache-file=/x",
            "tank/vol0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let _running = running(&args);
        let line = RUNNING.with(|r| r.borrow().as_ref().unwrap().line.clone());
        assert_eq!(line, "oxpool set 'com.example:note=two words' tank/vol0");
        drop(_running);
        assert!(RUNNING.with(|r| r.borrow().is_none()));
    }
}
