//! How much CPU the machine left idle lately: the `auto` completion policy hands CPU-heavy
//! completions (decompression, large checksums) to completion threads only when one of them
//! can run at once.
//!
//! Why: offloading pays only in parallel. With a core idle, a completion thread decompresses
//! while the reactor serves other requests (128 KiB half-compressible lz4 blocks from a disk,
//! two connections at iodepth 16: `worker` 17.6K reads/s against `inline`'s 16.6K). With every
//! core busy (the same reads from a pool file in memory, where the reactors and fio take both
//! cores), the hand-off only adds a wake-up and a thread competing for the same cores:
//! `worker` 26.1-27.2K against `inline`'s 27.5-33.5K, and `auto`, which offloaded whenever its
//! reactor was busy, 22.0-32.5K (bench/results/2026-11-28-session12).
//!
//! Measured from `/proc/stat` (the `cpu` line: idle and iowait against all time), at most once
//! per [`SAMPLE_INTERVAL`] per thread, and only when a heavy completion asks; the file is
//! opened once per thread, read with one `pread` into a stack buffer: nothing is allocated.
//! The figure is the idle share of the time between this thread's last two samples, at
//! least [`SAMPLE_INTERVAL`] apart (longer after a quiet spell: then it is that spell's
//! average, for one interval). The kernel counts that time in ticks of 10 ms per CPU, so on
//! 2 CPUs an interval of 100 ms holds about 20 ticks and the figure's step is about a tenth
//! of a core (a 10 ms interval held 1-4 ticks: every figure was 0 or above half a core).
//! `/proc/stat` describes the whole machine: in a container limited by a CPU quota the
//! host's idle cores count too, and `auto` offloads as it did before this rule.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Shortest time between two samples on one thread (the shortest period a figure describes):
/// long enough for about ten of the kernel's 10 ms ticks per CPU.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// Bytes of `/proc/stat` read: its first line (`cpu` and ten counters) fits with room to spare.
const STAT_HEAD_BYTES: usize = 256;

struct Sampler {
    /// `/proc/stat`, open (-1: not yet; -2: cannot be opened, no figure ever).
    fd: Cell<i32>,
    /// When the last sample was taken, and its idle and total jiffies.
    last: Cell<Option<(Instant, u64, u64)>>,
    /// Idle CPU over the last interval, in thousandths of one CPU (None: not measured yet).
    spare_per_mille: Cell<Option<u32>>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        let fd = self.fd.get();
        if fd >= 0 {
            // SAFETY: the sampler's own descriptor, closed once, at its thread's end.
            unsafe { libc::close(fd) };
        }
    }
}

thread_local! {
    static SAMPLER: Sampler = const {
        Sampler {
            fd: Cell::new(-1),
            last: Cell::new(None),
            spare_per_mille: Cell::new(None),
        }
    };
}

/// Idle CPU over the last sampled interval (at most [`SAMPLE_INTERVAL`] old, refreshed by
/// this call when older), in thousandths of one CPU: 1000 is one whole core idle, 0 none.
/// `None` until two samples exist, or where `/proc/stat` cannot be read.
pub fn spare_cpu_per_mille() -> Option<u32> {
    // `try_with`: a thread being torn down has no sampler left, and no figure.
    SAMPLER
        .try_with(|s| {
            let now = Instant::now();
            if let Some((at, _, _)) = s.last.get() {
                if now.saturating_duration_since(at) < SAMPLE_INTERVAL {
                    return s.spare_per_mille.get();
                }
            }
            let (idle, total) = read_stat(s)?;
            if let Some((_, idle0, total0)) = s.last.get() {
                if let Some(spare) = spare_between((idle0, total0), (idle, total), cpus()) {
                    s.spare_per_mille.set(Some(spare));
                }
            }
            s.last.set(Some((now, idle, total)));
            s.spare_per_mille.get()
        })
        .ok()
        .flatten()
}

/// Online CPUs, asked once per process (glibc reads a sysfs file for it on every call). Not
/// `available_parallelism`, which a CPU quota or an affinity mask lowers: `/proc/stat`'s
/// totals are the sum over every online CPU of the machine.
fn cpus() -> u64 {
    static CPUS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        u64::try_from(n).unwrap_or(1).max(1)
    })
}

/// Idle CPU between two `(idle, total)` samples of the `cpu` line on a machine of `cpus`
/// CPUs, in thousandths of one CPU; `None` when no time passed (or the counters went back).
fn spare_between(before: (u64, u64), after: (u64, u64), cpus: u64) -> Option<u32> {
    let total = after.1.checked_sub(before.1).filter(|&t| t > 0)?;
    let idle = after.0.checked_sub(before.0)?.min(total);
    u32::try_from(idle.checked_mul(1000)?.checked_mul(cpus)? / total).ok()
}

/// Reads the `cpu` line of `/proc/stat`: `(idle + iowait, all)` jiffies.
fn read_stat(s: &Sampler) -> Option<(u64, u64)> {
    if s.fd.get() == -1 {
        // SAFETY: a NUL-terminated path that lives for the program; flags only.
        let fd = unsafe { libc::open(c"/proc/stat".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        s.fd.set(if fd >= 0 { fd } else { -2 });
    }
    let fd = s.fd.get();
    if fd < 0 {
        return None;
    }
    let mut head = [0u8; STAT_HEAD_BYTES];
    // SAFETY: `head` is writable for its whole length; `fd` is this sampler's open file.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr().cast(), head.len(), 0) };
    let n = usize::try_from(n).ok()?;
    parse_cpu_line(&head[..n])
}

/// `(idle + iowait, sum of all fields)` of the first line of `/proc/stat` (`cpu  user nice
/// system idle iowait irq softirq steal guest guest_nice`; guest time is already counted in
/// user and nice, so the last two are left out). `None` for anything else.
fn parse_cpu_line(bytes: &[u8]) -> Option<(u64, u64)> {
    let line = bytes.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split_ascii_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let mut values = [0u64; 8];
    let mut count = 0;
    for (slot, field) in values.iter_mut().zip(fields) {
        *slot = field.parse().ok()?;
        count += 1;
    }
    if count < 5 {
        return None; // Not even idle and iowait.
    }
    let total = values.iter().try_fold(0u64, |acc, &v| acc.checked_add(v))?;
    Some((values[3] + values[4], total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_gives_idle_and_total() {
        let stat = b"cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n";
        assert_eq!(parse_cpu_line(stat), Some((840, 1000)));
        // Old kernels print fewer fields; garbage and other lines are refused, never a panic.
        assert_eq!(parse_cpu_line(b"cpu 1 2 3 4 5\n"), Some((9, 15)));
        assert_eq!(parse_cpu_line(b"cpu 1 2 3 4\n"), None);
        assert_eq!(parse_cpu_line(b"cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_cpu_line(b"cpu  1 x 3 4 5\n"), None);
        assert_eq!(parse_cpu_line(b""), None);
        assert_eq!(
            parse_cpu_line(b"cpu 18446744073709551615 1 0 0 0\n"),
            None,
            "overflow"
        );
    }

    #[test]
    fn spare_cpu_is_idle_share_times_cpus() {
        // Two CPUs, a quarter of all time idle: half a CPU spare.
        assert_eq!(spare_between((0, 0), (250, 1000), 2), Some(500));
        assert_eq!(spare_between((100, 1000), (100, 2000), 2), Some(0));
        assert_eq!(spare_between((0, 0), (1000, 1000), 4), Some(4000));
        assert_eq!(spare_between((5, 10), (5, 10), 2), None, "no time passed");
        assert_eq!(spare_between((5, 10), (4, 20), 2), None, "went back");
    }

    #[test]
    fn this_machine_gives_a_figure_after_an_interval() {
        // The first call only takes a sample (or reads a figure another test left).
        let _ = spare_cpu_per_mille();
        std::thread::sleep(SAMPLE_INTERVAL + SAMPLE_INTERVAL / 2);
        let spare = spare_cpu_per_mille().expect("/proc/stat readable on Linux");
        assert!(spare <= 1000 * cpus() as u32, "{spare}");
    }
}
