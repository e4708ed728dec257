//! What the machine gives this process: its memory, the lower of the machine's and the
//! memory limit of the control group the process runs in (a container on a large host must
//! not size its caches and buffers by the host).

/// Bytes of memory this process may use: the machine's physical memory, or its control
/// group's limit where that is lower (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`).
/// 4 GiB if the system says nothing.
pub fn memory_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page_bytes) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical_bytes = match (u64::try_from(pages), u64::try_from(page_bytes)) {
        (Ok(pages), Ok(page_bytes)) if pages > 0 && page_bytes > 0 => {
            pages.saturating_mul(page_bytes)
        }
        _ => 4 << 30,
    };
    control_group_limit_bytes().map_or(physical_bytes, |limit| limit.min(physical_bytes))
}

/// [`memory_bytes`] as a count of bytes in this address space (saturating).
pub(crate) fn memory_bytes_in_memory() -> usize {
    usize::try_from(memory_bytes()).unwrap_or(usize::MAX)
}

/// Whether the kernel charges every private writable mapping against the commit limit at
/// once (`vm.overcommit_memory = 2`), ignoring `MAP_NORESERVE`: then a reservation of
/// address space costs as much as the memory (and the buffer arena makes none).
pub fn overcommit_is_strict() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|mode| mode.trim() == "2")
}

/// Whether this kernel maps memory ahead of use on request (`MADV_POPULATE_WRITE`, Linux
/// 5.14), which the buffer arena's warmer needs; probed on a page of its own.
pub fn populate_write_supported() -> bool {
    // SAFETY: a new private anonymous mapping of one page, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the page mapped above.
    let supported = unsafe { libc::madvise(page, 4096, libc::MADV_POPULATE_WRITE) } == 0;
    // SAFETY: the page mapped above, used by nothing else.
    unsafe { libc::munmap(page, 4096) };
    supported
}

/// The memory limit of this process's control group, if it has one.
fn control_group_limit_bytes() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_in(&groups, |file| std::fs::read_to_string(file).ok())
}

/// The memory limit named by `groups` (the text of `/proc/self/cgroup`), reading the limit
/// files through `read`.
fn limit_in(groups: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    // Bounded by the text's lines (one per hierarchy).
    groups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            return None;
        };
        // "max" (v2) when unlimited parses as nothing; v1's near-2^63 is more than any
        // machine's memory and changes nothing.
        read(&file)?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files<'a>(entries: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |file| {
            entries
                .iter()
                .find(|(name, _)| *name == file)
                .map(|(_, text)| text.to_string())
        }
    }

    #[test]
    fn limits_are_read_from_the_process_s_memory_group() {
        let v2 = "0::/system.slice/oxpool.service\n";
        let at = "/sys/fs/cgroup/system.slice/oxpool.service/memory.max";
        assert_eq!(limit_in(v2, files(&[(at, "536870912\n")])), Some(512 << 20));
        assert_eq!(limit_in(v2, files(&[(at, "max\n")])), None);
        assert_eq!(limit_in(v2, files(&[])), None, "no file, no limit");
        let v1 = "5:devices:/\n4:cpu,memory:/docker/abc\n0::/\n";
        let at = "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes";
        assert_eq!(limit_in(v1, files(&[(at, "1073741824")])), Some(1 << 30));
        assert_eq!(limit_in("garbage\n", files(&[])), None);
    }

    #[test]
    fn memory_is_at_most_the_machines() {
        // SAFETY: sysconf has no preconditions.
        let physical = unsafe {
            libc::sysconf(libc::_SC_PHYS_PAGES) as u64 * libc::sysconf(libc::_SC_PAGESIZE) as u64
        };
        let memory = memory_bytes();
        assert!(
            memory > 0 && memory <= physical,
            "{memory} of {physical} bytes"
        );
    }
}
