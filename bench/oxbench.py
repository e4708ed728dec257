#!/usr/bin/python3
"""The oxpool benchmark harness: fio (nbd engine) against oxpool, qemu-nbd and nbdkit on one disk.

Run it through `bench/run` (which installs the tools it needs); `bench/run --help` for options,
bench/README.md for what the report means. A benchmark, not a test: it asserts nothing about
timings, it writes a report.

Per workload, the servers take turns (oxpool variants, then the peers; the order rotates each
repeat) and each cell is: drop the data files from the page cache, start the server, for a read
workload read the whole device once (filling whatever cache the server has), warm up with a
short fio run, sample /proc, the measured fio run, sample /proc, stop the server.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import fnmatch
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
import traceback
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"
POOL = "oxbench"

# The environment of the NBD clients (fio, nbdinfo). With TLS servers in the run, HOME points
# at a directory whose .pki/libnbd/ca-cert.pem is the run's CA: fio's nbd engine cannot pass
# `tls-certificates=` in its URI (libnbd allows local file access only when the program asks),
# and libnbd looks in $HOME/.pki/libnbd when it is not told.
CLIENT_ENV: dict | None = None
PERCENTILES = ["50", "90", "99", "99.9"]


class BenchError(Exception):
    """A failure of one server or one cell: reported, never fatal to the run."""


class StartError(BenchError):
    """The server did not come up: it is not benchmarked further (no minute-long timeouts per cell)."""


# ---------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class Workload:
    name: str
    desc: str
    rw: str
    bs: str
    iodepth: int
    numjobs: int = 1
    fsync: int = 0
    # Part of the iodepth sweep only: run by default in full mode, in --quick mode only when
    # named by --workloads.
    sweep: bool = False
    # fio's buffer_compress_percentage (with refill_buffers: new data for every I/O): None
    # leaves fio's default buffers. A read workload with it first writes the whole device
    # with such data (so the reads meet blocks stored compressed).
    compress_pct: int | None = None
    # fio's end_fsync: the job writes the volume's size once (fixed size, not time-based) and
    # ends with a flush, timed in. So every byte written reaches the disk inside the measured
    # time: a server that parks writes in the page cache pays for them, and one that rewrites
    # the same pages in its cache for a whole time-based run cannot skip writing them
    # (issue 19's harness rule).
    end_fsync: bool = False
    # Run only when named by --workloads (cells made for some variants: compression, issue 20).
    on_demand: bool = False

    @property
    def reads(self) -> bool:
        return "read" in self.rw


WORKLOADS = [
    Workload("randread-4k-qd1", "4k random read, iodepth 1", "randread", "4k", 1),
    Workload("randread-4k-qd4", "4k random read, iodepth 4 (sweep)", "randread", "4k", 4, sweep=True),
    Workload("randread-4k-qd8", "4k random read, iodepth 8 (sweep)", "randread", "4k", 8, sweep=True),
    Workload("randread-4k-qd16", "4k random read, iodepth 16 (sweep)", "randread", "4k", 16, sweep=True),
    Workload("randread-4k-qd32", "4k random read, iodepth 32", "randread", "4k", 32),
    Workload("randwrite-4k-qd32", "4k random write, iodepth 32, as many writes as the volume "
             "has blocks, then a flush timed in", "randwrite", "4k", 32, end_fsync=True),
    Workload("seqwrite-128k-qd8", "128k sequential write, iodepth 8, the whole volume once, "
             "then a flush timed in", "write", "128k", 8, end_fsync=True),
    Workload("seqread-128k-qd8", "128k sequential read, iodepth 8", "read", "128k", 8),
    Workload("syncwrite-4k-qd1", "4k random write + flush after each write (fio fsync=1), iodepth 1",
             "randwrite", "4k", 1, fsync=1),
    Workload("syncwrite-4k-qd16", "4k random write + flush after each write (fio fsync=1), iodepth 16",
             "randwrite", "4k", 16, fsync=1),
    Workload("randread-4k-1x64", "4k random read, 1 connection at iodepth 64", "randread", "4k", 64),
    Workload("randread-4k-4x16", "4k random read, 4 connections at iodepth 16 each (numjobs=4)",
             "randread", "4k", 16, numjobs=4),
    # One default block (16 KiB) per read, on demand: the reply size the writer neither
    # copied into its batch nor shared until 2026-11-29 (session 21).
    Workload("randread-16k-qd32", "16k random read (one default block), iodepth 32",
             "randread", "16k", 32, on_demand=True),
    # Compression (issue 20), on demand: with the oxpool-c128k-* variants (bench/README.md).
    Workload("seqwrite-128k-flush-c0", "128k sequential write, iodepth 8, final flush timed in, "
             "incompressible data (buffer_compress_percentage=0)", "write", "128k", 8,
             compress_pct=0, end_fsync=True, on_demand=True),
    Workload("seqwrite-128k-flush-c50", "128k sequential write, iodepth 8, final flush timed in, "
             "50 % compressible data (buffer_compress_percentage=50)", "write", "128k", 8,
             compress_pct=50, end_fsync=True, on_demand=True),
    Workload("seqread-128k-c50-2x16", "128k sequential read of 50 % compressible data, "
             "2 connections at iodepth 16 (reactors saturated)", "read", "128k", 16, numjobs=2,
             compress_pct=50, on_demand=True),
    Workload("seqread-128k-c50-qd1", "128k sequential read of 50 % compressible data, "
             "1 connection at iodepth 1", "read", "128k", 1, compress_pct=50, on_demand=True),
]


def select_workloads(patterns: str | None, quick: bool) -> list[Workload]:
    if not patterns:
        return [w for w in WORKLOADS if not (quick and w.sweep) and not w.on_demand]
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = [w for w in WORKLOADS if any(fnmatch.fnmatchcase(w.name, p) for p in pats)]
    if not chosen:
        raise SystemExit(f"no workload matches {patterns!r}; see --list")
    return chosen


# ---------------------------------------------------------------------------------------------
# Small helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", text, re.I)
    if not m:
        raise SystemExit(f"bad size {text!r} (e.g. 2G, 512M)")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


def human_size(n: int) -> str:
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}iB"
    return f"{n} B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


def log_digest(path: Path, since: int, lines: int = 8) -> str:
    """The server's log written since byte offset `since`, with timestamps stripped and repeated
    messages collapsed: what went wrong in this cell, without a page of identical warnings."""
    try:
        with open(path, errors="replace") as f:
            f.seek(since)
            text = f.read()
    except OSError:
        return "(no log)"
    out: list[list] = []
    for line in text.splitlines():
        msg = re.sub(r"^\d{4}-\d\d-\d\dT[\d:.]+Z\s+", "", line).strip()
        if not msg:
            continue
        if out and out[-1][0] == msg:
            out[-1][1] += 1
        else:
            out.append([msg, 1])
    out = [o for o in out if not o[0].startswith("====")]
    return "\n".join(m + (f"  (x{n})" if n > 1 else "") for m, n in out[-lines:]) or "(nothing logged)"


def cmd_output(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a server never outlives the harness, even if the harness is killed.
    _libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def flush_probe_ms(probe: Path) -> float:
    """One 4 KiB write + fdatasync of a small file next to the data: what a flush costs the
    disk right now."""
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        t0 = time.monotonic()
        os.pwrite(fd, os.urandom(4096), 0)
        os.fdatasync(fd)
        return (time.monotonic() - t0) * 1e3
    finally:
        os.close(fd)


def probe_median_ms(probe: Path, n: int) -> float:
    return statistics.median(flush_probe_ms(probe) for _ in range(n))


# Longest wait for the disk to settle after writing the data files.
SETTLE_WAIT_S_MAX = 120


def wait_for_quiet_disk(probe: Path, baseline_ms: float, what: str) -> tuple[bool, str]:
    """Waits until a flush costs about what it cost before the run wrote anything (median of 5
    probes within 2x the baseline, or 0.2 ms above it), at most SETTLE_WAIT_S_MAX seconds;
    returns whether it did, and the line logged about it.
    Creating and preconditioning the data files writes gigabytes; on a virtual disk the host
    writes them back afterwards, and until it has, every guest flush waits for it (measured:
    4-5x slower flushes for over 10 s after 12 GiB, with spikes of 175 ms), which would land
    on whichever cells run first."""
    limit = max(2 * baseline_ms, baseline_ms + 0.2)
    t0 = time.monotonic()
    os.sync()
    # Bounded: one round per second, SETTLE_WAIT_S_MAX seconds at most.
    while True:
        now = probe_median_ms(probe, 5)
        waited = time.monotonic() - t0
        settled = now <= limit
        if settled:
            msg = f"disk settled after {what} in {waited:.0f} s (flush {now:.2f} ms, baseline {baseline_ms:.2f} ms)"
            break
        if waited >= SETTLE_WAIT_S_MAX:
            msg = (f"disk NOT settled {waited:.0f} s after {what} (flush {now:.2f} ms, baseline "
                   f"{baseline_ms:.2f} ms): measuring anyway")
            break
        time.sleep(1)
    log(msg)
    return settled, msg


def drop_page_cache(paths: list[Path]) -> None:
    """Write back and evict the data files from the page cache (only these files: no global
    drop_caches on a shared machine), so every cell starts cold and without another server's
    dirty pages being written back under it."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# /proc sampling


def read_ctx(pid: int) -> dict[int, int]:
    """Context switches (voluntary + nonvoluntary) of each live thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            n = 0
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        n += int(line.split()[1])
            out[int(tid)] = n
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass  # thread exited meanwhile
    return out


class CtxSampler(threading.Thread):
    """Counts the context switches of all threads of a process over a window, including threads
    created and gone within it (nbdkit runs a thread per connection: by the time fio has
    disconnected they are gone, and with them their counters). /proc has no per-process total
    that keeps exited threads' switches, so poll every thread every 100 ms and keep the last
    value seen: a thread that exits loses at most its last 100 ms."""

    def __init__(self, pid: int, period_s: float = 0.1):
        super().__init__(daemon=True)
        self.pid = pid
        self.period_s = period_s
        self.base = read_ctx(pid)  # threads alive at the start: count from here
        self.last = dict(self.base)  # threads born later count from 0
        self.stopping = threading.Event()

    def poll(self):
        try:
            for tid, n in read_ctx(self.pid).items():
                self.last[tid] = n
        except (FileNotFoundError, ProcessLookupError):
            pass

    def run(self):
        while not self.stopping.wait(self.period_s):
            self.poll()

    def finish(self) -> tuple[int, int]:
        """(context switches in the window, threads seen)"""
        self.stopping.set()
        self.join()
        self.poll()
        return sum(n - self.base.get(tid, 0) for tid, n in self.last.items()), len(self.last)


def proc_sample(pid: int) -> dict:
    """CPU time of the whole process (utime+stime of /proc/PID/stat include every thread, also
    exited ones) and its storage I/O bytes (/proc/PID/io, likewise)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    user_s = int(fields[11]) / CLK_TCK  # fields 14 and 15 of proc(5)
    sys_s = int(fields[12]) / CLK_TCK
    io = {}
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, v = line.split(":")
                io[k] = int(v)
    except OSError:
        pass
    return {"t": time.monotonic(), "cpu_s": user_s + sys_s, "user_s": user_s, "sys_s": sys_s,
            "threads": int(fields[17]),
            "write_bytes": io.get("write_bytes"), "read_bytes": io.get("read_bytes")}


def disk_of(path: Path) -> str | None:
    """The /proc/diskstats name of the block device holding path, if it is one."""
    st = os.stat(path)
    key = (os.major(st.st_dev), os.minor(st.st_dev))
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if (int(p[0]), int(p[1])) == key:
                return p[2]
    return None


def diskstats_of(disk: str | None) -> list[str] | None:
    """The disk's line of /proc/diskstats, split into fields, if it is there."""
    if disk is None:
        return None
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == disk:
                return p
    return None


def disk_flushes(disk: str | None) -> int | None:
    """Flush requests the disk completed (field 16 of /proc/diskstats, kernels >= 5.5)."""
    p = diskstats_of(disk)
    return int(p[18]) if p is not None and len(p) >= 19 else None


def disk_times(disk: str | None) -> tuple[int, int] | None:
    """Requests the disk completed (reads and writes) and the milliseconds they spent there,
    summed (fields 4, 7, 8 and 11 of /proc/diskstats)."""
    p = diskstats_of(disk)
    if p is None or len(p) < 11:
        return None
    return int(p[3]) + int(p[7]), int(p[6]) + int(p[10])


# ---------------------------------------------------------------------------------------------
# Servers


class Server:
    """One column of the report: something that serves one volume over NBD."""

    kind = "peer"
    # A raw file has no state but its bytes, which preconditioning wrote: nothing to reset
    # between workloads. A pool has (allocation, fragmentation, logs, a suspended state).
    stateful = False

    def __init__(self, name: str, desc: str, workdir: Path, size: int):
        self.name = name
        self.desc = desc
        self.workdir = workdir
        self.size = size
        self.error: str | None = None  # set when the server cannot be used at all
        self.notes: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = workdir / f"{name}.log"
        self.starts = 0
        self.log_mark = 0

    # Overridden --------------------------------------------------------------------------
    def data_files(self) -> list[Path]:
        raise NotImplementedError

    def prepare(self) -> None:
        raise NotImplementedError

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def uri(self, port: int) -> str:
        raise NotImplementedError

    def counters(self) -> dict | None:
        return None

    # Common ------------------------------------------------------------------------------
    def command_line(self) -> str:
        return shlex.join(self.command("PORT"))

    def start(self, ready_timeout: float = 90.0) -> str:
        assert self.proc is None
        self.port = free_port()
        self.starts += 1
        logf = open(self.log_path, "a")
        logf.write(f"\n==== start #{self.starts}: {shlex.join(self.command(self.port))}\n")
        logf.flush()
        self.log_mark = logf.tell()
        self.proc = subprocess.Popen(self.command(self.port), stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent, cwd=self.workdir)
        logf.close()
        uri = self.uri(self.port)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.proc = None
                raise StartError(f"{self.name} exited with status {rc} before serving; log:\n"
                                 + log_digest(self.log_path, self.log_mark))
            probe = subprocess.run(["nbdinfo", "--size", uri], capture_output=True, text=True,
                                   timeout=30, env=CLIENT_ENV)
            if probe.returncode == 0:
                got = int(probe.stdout.strip() or 0)
                if got != self.size:
                    self.stop()
                    raise StartError(f"{self.name} exports {got} bytes, expected {self.size}")
                return uri
            if time.monotonic() > deadline:
                self.stop()
                raise StartError(f"{self.name} did not serve {uri} within {ready_timeout:.0f} s; "
                                 f"log:\n" + log_digest(self.log_path, self.log_mark))
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM by PID, wait; SIGTERM again, wait; SIGKILL. Never by name."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            proc.send_signal(sig)
            try:
                proc.wait(wait_s)
                if sig == signal.SIGKILL or wait_s == 10:
                    self.notes.append(f"start #{self.starts}: needed {sig.name} (second or forced stop)")
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.returncode not in (0, -signal.SIGTERM, 143, None):
            self.notes.append(f"start #{self.starts}: exited with status {proc.returncode} when stopped")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


_TLS_PKI: dict[str, Path] = {}


def tls_pki(workdir: Path) -> dict[str, Path]:
    """The run's TLS files, made once with certtool (gnutls-bin) as docs/tls.md shows: a CA,
    a server certificate for localhost/127.0.0.1 in `server` (ca-cert.pem, server-cert.pem,
    server-key.pem: the directory layout of oxpool, nbdkit and qemu), and `home`, a HOME whose
    .pki/libnbd/ca-cert.pem makes libnbd (fio, nbdinfo) trust that CA. Every TLS server of the
    run uses the same certificates."""
    if _TLS_PKI:
        return _TLS_PKI
    root = workdir / "tls"
    server = root / "server"
    libnbd = root / "home" / ".pki" / "libnbd"
    server.mkdir(parents=True)
    libnbd.mkdir(parents=True)

    def certtool(*args: str) -> None:
        r = subprocess.run(["certtool", *args], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BenchError(f"certtool {' '.join(args)} failed: {r.stderr.strip()[-400:]}")

    (root / "ca.info").write_text("cn = oxbench CA\nca\ncert_signing_key\nexpiration_days = 30\n")
    (root / "server.info").write_text(
        "organization = oxbench\ncn = localhost\ndns_name = localhost\n"
        f"ip_address = {HOST}\ntls_www_server\nencryption_key\nsigning_key\n"
        "expiration_days = 30\n")
    certtool("--generate-privkey", "--bits", "2048", "--outfile", str(root / "ca-key.pem"))
    certtool("--generate-self-signed", "--load-privkey", str(root / "ca-key.pem"),
             "--template", str(root / "ca.info"), "--outfile", str(server / "ca-cert.pem"))
    certtool("--generate-privkey", "--bits", "2048", "--outfile", str(server / "server-key.pem"))
    certtool("--generate-certificate", "--load-ca-certificate", str(server / "ca-cert.pem"),
             "--load-ca-privkey", str(root / "ca-key.pem"),
             "--load-privkey", str(server / "server-key.pem"),
             "--template", str(root / "server.info"), "--outfile", str(server / "server-cert.pem"))
    shutil.copy(server / "ca-cert.pem", libnbd / "ca-cert.pem")
    _TLS_PKI.update(server=server, home=root / "home")
    return _TLS_PKI


class QemuNbd(Server):
    def __init__(self, workdir: Path, size: int):
        super().__init__("qemu-nbd", "raw file, --cache=none --aio=io_uring", workdir, size)
        self.file = workdir / "qemu-nbd.raw"

    def data_files(self):
        return [self.file]

    def prepare(self):
        with open(self.file, "wb") as f:
            f.truncate(self.size)

    def command(self, port):
        return ["qemu-nbd", "--format=raw", "--cache=none", "--aio=io_uring", f"--bind={HOST}",
                f"--port={port}", "--export-name=vol0", "--persistent", "--shared=16", str(self.file)]

    def uri(self, port):
        return f"nbd://{HOST}:{port}/vol0"


class Nbdkit(Server):
    def __init__(self, workdir: Path, size: int, name="nbdkit", extra=(), tls=False):
        desc = "file plugin" + (", " + " ".join(extra) if extra else " (defaults: page cache)")
        if tls:
            desc += ", --tls=require (X.509, the oxpool-tls certificates)"
        super().__init__(name, desc, workdir, size)
        self.file = workdir / f"{name}.raw"
        self.extra = list(extra)
        self.tls = tls

    def data_files(self):
        return [self.file]

    def prepare(self):
        if self.tls:
            tls_pki(self.workdir)
        with open(self.file, "wb") as f:
            f.truncate(self.size)

    def command(self, port):
        tls = []
        if self.tls:
            tls = ["--tls=require", f"--tls-certificates={tls_pki(self.workdir)['server']}"]
        return ["nbdkit", "--foreground", "--exit-with-parent", f"--ipaddr={HOST}", f"--port={port}",
                *tls, "file", f"file={self.file}", *self.extra]

    def uri(self, port):
        return f"{'nbds' if self.tls else 'nbd'}://{HOST}:{port}/"


class NbdkitNull(Server):
    """nbdkit's null plugin: answers every request without storing anything. Not a peer (no
    ratio is taken against it): it shows what a server that does no storage work at all gets
    through this client on this machine in this run. Where it is no faster than the best peer,
    the cell is bound by the client (fio and the loopback copies), not by the servers, and no
    server can be much faster than that peer there; the "client CPU" row tells the same."""

    kind = "reference"

    def __init__(self, workdir: Path, size: int):
        super().__init__("nbdkit-null", "null plugin: no storage (reference, not a peer)", workdir, size)

    def data_files(self):
        return []

    def prepare(self):
        pass

    def command(self, port):
        return ["nbdkit", "--foreground", "--exit-with-parent", f"--ipaddr={HOST}", f"--port={port}",
                "null", f"size={self.size}"]

    def uri(self, port):
        return f"nbd://{HOST}:{port}/"


PEERS = {
    "qemu-nbd": lambda wd, size: QemuNbd(wd, size),
    "nbdkit": lambda wd, size: Nbdkit(wd, size),
    # Not run by default: nbdkit with its page-cache avoidance on (closer to O_DIRECT servers).
    "nbdkit-nocache": lambda wd, size: Nbdkit(wd, size, "nbdkit-nocache", ["cache=none"]),
    # The reference column (kind "reference": never the best peer).
    "nbdkit-null": lambda wd, size: NbdkitNull(wd, size),
    # Not run by default: nbdkit over TLS (--tls=require) with the certificates the oxpool-tls
    # variant uses, for issue #21's cells (`--peers nbdkit-tls,nbdkit`).
    "nbdkit-tls": lambda wd, size: Nbdkit(wd, size, "nbdkit-tls", tls=True),
}


class Oxpool(Server):
    kind = "oxpool"
    stateful = True

    def __init__(self, variant: dict, binary: Path | None, binary_error: str | None,
                 workdir: Path, size: int, pool_size: int):
        super().__init__(variant["name"], variant.get("description", ""), workdir, size)
        self.variant = variant
        self.binary = binary
        self.pool_file = workdir / f"{self.name}.pool"
        self.cache_file = workdir / f"{self.name}.cache"
        self.pool_size = pool_size
        if binary_error:
            self.error = binary_error

    def subst(self, text: str) -> list[str]:
        return shlex.split(text.format(oxpool=shlex.quote(str(self.binary)),
                                       cache=shlex.quote(str(self.cache_file)), pool=POOL,
                                       vol=f"{POOL}/vol0"))

    def run_cli(self, args: list[str], what: str, timeout=300) -> None:
        with open(self.log_path, "a") as logf:
            logf.write(f"==== {what}: {shlex.join(args)}\n")
            logf.flush()
            r = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                               timeout=timeout, cwd=self.workdir)
        if r.returncode != 0:
            raise BenchError(f"{what} failed (status {r.returncode}): {shlex.join(args)}\n"
                             + tail(self.log_path, 8))

    def data_files(self):
        return [self.pool_file]

    def prepare(self):
        if self.variant.get("tls"):
            tls_pki(self.workdir)
        ox = [str(self.binary), "--cache-file", str(self.cache_file)]
        if self.pool_file.exists():
            # A new pool over the old file (-f: it holds the old pool's labels). The file stays
            # allocated and written: deleting and recreating it would make the host discard
            # and then zero-write 6 GiB before every workload, and the host's writeback of
            # that slowed the guest's flushes five-fold for tens of seconds.
            create = ["create", "-f", POOL, str(self.pool_file)]
        else:
            # `oxpool create` allocates and zero-writes the file (its default), as the peers'
            # raw files are fully written by preconditioning.
            create = ["create", POOL, str(self.pool_file), "--size", str(self.pool_size)]
        self.run_cli(ox + create + self.variant.get("create_args", []), "oxpool create")
        self.run_cli(ox + ["vol", "create", f"{POOL}/vol0", "--size", str(self.size),
                           *self.variant.get("vol_args", [])], "oxpool vol create")
        for c in self.variant.get("setup", []):
            self.run_cli(self.subst(c), "variant setup")

    def reset(self):
        """A new pool in place of the old one (as prepare made it), on the same file."""
        assert not self.alive()
        self.cache_file.unlink(missing_ok=True)
        with open(self.log_path, "a") as logf:
            logf.write("\n==== new pool for the next workload\n")
        self.prepare()

    def command(self, port):
        tls = []
        if self.variant.get("tls"):
            tls = ["--tls", "require", "--tls-certificates", str(tls_pki(self.workdir)["server"])]
        return [str(self.binary), "--cache-file", str(self.cache_file), "serve", POOL,
                "--listen", f"{HOST}:{port}", *tls, *self.variant.get("serve_args", [])]

    def uri(self, port):
        scheme = "nbds" if self.variant.get("tls") else "nbd"
        return f"{scheme}://{HOST}:{port}/{POOL}/vol0"

    def counters(self):
        c = self.variant.get("counters")
        if not c:
            return None
        try:
            r = subprocess.run(self.subst(c), capture_output=True, text=True, timeout=30)
            data = json.loads(r.stdout)
            return {k: v for k, v in data.items()
                    if isinstance(v, (int, float)) and k not in NOT_COUNTERS}
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            self.notes.append(f"counters command failed: {e}")
            return None


# Keys of `oxpool iostat --json` that are not cumulative counters worth a per-I/O row: ids,
# clocks, levels, and what the harness measures itself (CPU, context switches, I/O counts).
NOT_COUNTERS = {"pid", "txg", "time_ms", "started_ms", "data_cache_bytes", "cpu_us",
                "ctx_switches", "reads", "writes", "flushes", "read_bytes", "write_bytes"}


def load_variants(path: Path, wanted: str | None) -> list[dict]:
    variants = tomllib.loads(path.read_text()).get("variant", [])
    names = [v["name"] for v in variants]
    if wanted in (None, ""):
        return [v for v in variants if v.get("enabled", True)]
    if wanted == "none":
        return []
    if wanted == "all":
        return variants
    chosen = []
    for n in wanted.split(","):
        if n not in names:
            raise SystemExit(f"unknown variant {n!r}; variants.toml has: {', '.join(names)}")
        chosen.append(variants[names.index(n)])
    return chosen


def build_oxpool(no_build: bool, binary: str | None,
                 features: str | None = None) -> tuple[Path | None, str | None]:
    """(binary, error). A failed build is an error in the report, not a crash of the harness.
    `features`: cargo features of the build (e.g. vendored-openssl, docs/tls.md)."""
    if binary:
        p = Path(binary).resolve()
        return (p, None) if p.exists() else (None, f"oxpool binary {p} does not exist")
    p = REPO / "target" / "release" / "oxpool"
    if not no_build:
        cmd = ["cargo", "build", "--release", "-p", "oxpool"]
        if features:
            cmd += ["--features", features]
        log(f"building oxpool: {shlex.join(cmd)}")
        try:
            r = subprocess.run(cmd, cwd=REPO,
                               capture_output=True, text=True, timeout=3600)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"cargo build failed to run: {e}"
        if r.returncode != 0:
            return None, f"{shlex.join(cmd)} failed:\n" + "\n".join(
                r.stderr.strip().splitlines()[-15:])
    if not p.exists():
        return None, f"{p} does not exist (build it, or pass --oxpool)"
    return p, None


# ---------------------------------------------------------------------------------------------
# fio


def tcp_congestion() -> str:
    """The system's TCP congestion control, or why it is unknown."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError as e:
        return f"unknown ({e})"


def fio_cmd(w: Workload, uri: str, runtime: float, out: Path,
            size_bytes: int | None = None) -> list[str]:
    """The fio command of `w`: time-based for `runtime` seconds, or, with `size_bytes`, that
    many bytes per job (a fixed-size write cell, `Workload.end_fsync`)."""
    length = (["--time_based", f"--runtime={runtime:g}"] if size_bytes is None
              else [f"--size={size_bytes}"])
    cmd = ["fio", f"--name={w.name}", "--ioengine=nbd", f"--uri={uri}", f"--rw={w.rw}",
           f"--bs={w.bs}", f"--iodepth={w.iodepth}", f"--numjobs={w.numjobs}", "--group_reporting",
           *length,
           # A fresh random sequence each run (else the warm-up would pre-read the measured
           # offsets), and no random map (uniform random, less fio CPU on a 2-core machine).
           "--randrepeat=0", "--norandommap",
           "--lat_percentiles=1", "--percentile_list=" + ":".join(PERCENTILES),
           "--output-format=json", f"--output={out}"]
    if w.fsync:
        cmd.append(f"--fsync={w.fsync}")
    if w.end_fsync:
        cmd.append("--end_fsync=1")
    cmd += compress_args(w.compress_pct)
    return cmd


def compress_args(pct: int | None) -> list[str]:
    """fio's data for a compressibility: each 512-byte chunk (buffer_compress_chunk) is
    (100 - pct) % random bytes then zeros, new for every I/O."""
    if pct is None:
        return []
    return [f"--buffer_compress_percentage={pct}", "--refill_buffers=1"]


def prewrite(server: "Server", uri: str, tmp: Path, tag: str, pct: int) -> None:
    """Writes the whole device with data of compressibility `pct` (for a read workload that
    must meet it), sequentially, 1M at a time, with a final flush."""
    out = tmp / f"prewrite-{tag}.json"
    cmd = ["fio", "--name=prewrite", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
           "--iodepth=8", "--end_fsync=1", "--output-format=json", f"--output={out}",
           *compress_args(pct)]
    job = run_fio(cmd, out, timeout=max(600, server.size / (2 << 20)))
    if job["write"]["io_bytes"] < server.size:
        raise BenchError(f"the prewrite wrote {job['write']['io_bytes']} of {server.size} bytes")


def run_fio(cmd: list[str], out: Path, timeout: float) -> dict:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=CLIENT_ENV)
    except subprocess.TimeoutExpired:
        raise BenchError(f"fio did not finish within {timeout:.0f} s")
    try:
        text = out.read_text()
        data = json.loads(text[text.index("{"):])  # fio may print notes before the JSON
    except (OSError, ValueError):
        raise BenchError(f"fio failed (status {r.returncode}): "
                         + (r.stderr.strip() or r.stdout.strip())[-800:])
    job = data["jobs"][0]
    if r.returncode != 0 or job.get("error"):
        errs = [l for l in (r.stderr + r.stdout).splitlines() if "error" in l.lower()]
        more = f" (and {len(errs) - 2} more)" if len(errs) > 2 else ""
        raise BenchError(f"fio error {job.get('error')} (status {r.returncode}): "
                         + "\n".join(errs[:2]) + more)
    return job


def precondition(server: Server, uri: str, tmp: Path) -> str:
    """Write the whole volume once so reads hit data, not holes."""
    out = tmp / f"precondition-{server.name}.json"
    cmd = ["fio", "--name=precondition", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
           "--iodepth=8", "--output-format=json", f"--output={out}"]
    t0 = time.monotonic()
    job = run_fio(cmd, out, timeout=max(600, server.size / (2 << 20)))
    written = job["write"]["io_bytes"]
    if written < server.size:
        raise BenchError(f"preconditioning wrote {written} of {server.size} bytes")
    return f"{human_size(written)} in {time.monotonic() - t0:.1f} s"


def start_and_precondition(s: Server, tmp: Path) -> str:
    uri = s.start()
    try:
        return precondition(s, uri, tmp)
    finally:
        s.stop()


def metrics_of(w: Workload, job: dict, before: dict, after: dict, flush0, flush1,
               cnt0: dict | None, cnt1: dict | None) -> dict:
    r, wr = job["read"], job["write"]
    ios = r["total_ios"] + wr["total_ios"]
    if ios == 0:
        raise BenchError("fio completed no I/O")
    main = r if w.reads else wr
    pct = main["lat_ns"].get("percentile", {})

    def p(q):
        v = pct.get(f"{float(q):.6f}")
        return v / 1000 if v is not None else None

    wall = after["t"] - before["t"]
    cpu = after["cpu_s"] - before["cpu_s"]
    m = {
        "iops": r["iops"] + wr["iops"],
        "mbps": (r["bw_bytes"] + wr["bw_bytes"]) / 1e6,
        "ios": ios,
        "lat_mean_us": main["lat_ns"]["mean"] / 1000,
        **{f"p{q}_us": p(q) for q in PERCENTILES},
        "cpu_us_per_io": cpu * 1e6 / ios,
        "cpu_user_us_per_io": (after["user_s"] - before["user_s"]) * 1e6 / ios,
        "cpu_sys_us_per_io": (after["sys_s"] - before["sys_s"]) * 1e6 / ios,
        "cpu_pct": 100 * cpu / wall if wall > 0 else None,
        "ctx_per_io": (after["ctx"] - before["ctx"]) / ios,
        "threads": after["threads"],
        "fio_cpu_pct": job["usr_cpu"] + job["sys_cpu"],
    }
    if wr["total_ios"] and after["write_bytes"] is not None and before["write_bytes"] is not None:
        m["write_amp"] = (after["write_bytes"] - before["write_bytes"]) / wr["io_bytes"]
    if w.fsync:
        sync = job.get("sync", {})
        m["nbd_flush_per_write"] = sync.get("total_ios", 0) / max(wr["total_ios"], 1)
        if sync.get("lat_ns", {}).get("N"):
            m["flush_mean_us"] = sync["lat_ns"]["mean"] / 1000
            for q in ("50", "99"):
                v = sync["lat_ns"].get("percentile", {}).get(f"{float(q):.6f}")
                if v is not None:
                    m[f"flush_p{q}_us"] = v / 1000
        if flush0 is not None and flush1 is not None:
            m["disk_flush_per_write"] = (flush1 - flush0) / max(wr["total_ios"], 1)
    if cnt0 is not None and cnt1 is not None:
        for k in cnt1:
            if k in cnt0:
                m[f"ctr:{k}"] = (cnt1[k] - cnt0[k]) / ios
    return m


def run_cell(server: Server, w: Workload, args, tmp: Path, disk: str | None, all_files: list[Path],
             tag: str, settle: Callable[[str], None]) -> dict:
    drop_page_cache(all_files)
    if not w.reads:
        # A write cell's flushes wait for whatever the disk still writes back from the cell
        # before it (another server's gigabytes: on a virtual disk the host writes them back
        # after the guest's fsync returned), which would land on whichever server runs next;
        # issue 19 asks for the wait before every write cell.
        settle(f"the cell before {tag}")
    uri = server.start()
    try:
        return measure(server, w, args, tmp, disk, tag, uri)
    except BenchError as e:
        raise BenchError(f"{e}\nserver log of this cell:\n{log_digest(server.log_path, server.log_mark)}")
    finally:
        server.stop()


def fill(server: Server, uri: str, tmp: Path, tag: str) -> None:
    """Read the whole device once, sequentially: a read workload then measures each server in
    its steady state (oxpool's data cache and nbdkit's page cache hold the volume, as they do
    on a server that has run for a while; qemu-nbd with --cache=none has no cache to fill),
    not how fast a cold cache fills. A 2 s warm-up did not fill them: 4 KiB random reads of a
    freshly started server swung between 150K and 345K IOPS with the state of the host's
    cache of the data file."""
    out = tmp / f"fill-{tag}.json"
    cmd = ["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=read", "--bs=1M",
           "--iodepth=8", "--output-format=json", f"--output={out}"]
    job = run_fio(cmd, out, timeout=max(600, server.size / (2 << 20)))
    if job["read"]["io_bytes"] < server.size:
        raise BenchError(f"the fill read {job['read']['io_bytes']} of {server.size} bytes")


def measure(server: Server, w: Workload, args, tmp: Path, disk: str | None, tag: str, uri: str) -> dict:
    if w.reads and w.compress_pct is not None:
        prewrite(server, uri, tmp, tag, w.compress_pct)
    if w.reads and not args.no_fill:
        fill(server, uri, tmp, tag)
    if args.ramp > 0:
        warm = tmp / f"warm-{tag}.json"
        run_fio(fio_cmd(w, uri, args.ramp, warm), warm, args.ramp + 120)
    out = tmp / f"fio-{tag}.json"
    cnt0 = server.counters()
    flush0 = disk_flushes(disk)
    times0 = disk_times(disk)
    s0 = proc_sample(server.proc.pid)
    ctx = CtxSampler(server.proc.pid)
    ctx.start()
    try:
        # A fixed-size cell's timeout: the volume written at 5 MB/s at worst.
        size = server.size if w.end_fsync else None
        timeout = args.runtime + 180 if size is None else max(600, server.size / 5e6)
        job = run_fio(fio_cmd(w, uri, args.runtime, out, size), out, timeout)
    finally:
        ctx_n, threads_seen = ctx.finish()
    if not server.alive():
        raise BenchError(f"{server.name} died during the run (status {server.proc.returncode})")
    s1 = proc_sample(server.proc.pid)
    s0["ctx"], s1["ctx"] = 0, ctx_n
    s1["threads"] = threads_seen
    flush1 = disk_flushes(disk)
    times1 = disk_times(disk)
    cnt1 = server.counters()
    m = metrics_of(w, job, s0, s1, flush0, flush1, cnt0, cnt1)
    # The disk's own time per request in the cell: a virtual disk's host sometimes stalls it
    # for seconds (tens of milliseconds per request, session 17's syncwrite-stall/), and then
    # the cell measures the host, not the server.
    if times0 is not None and times1 is not None and times1[0] > times0[0]:
        m["disk_await_ms"] = (times1[1] - times0[1]) / (times1[0] - times0[0])
    return m


# ---------------------------------------------------------------------------------------------
# Report

# (key, label, better): better is "max", "min" or None (no ratio).
ROWS = [
    ("iops", "IOPS", "max"),
    ("mbps", "MB/s", "max"),
    ("p50_us", "p50 latency (us)", "min"),
    ("p90_us", "p90 latency (us)", "min"),
    ("p99_us", "p99 latency (us)", "min"),
    ("p99.9_us", "p99.9 latency (us)", "min"),
    ("cpu_us_per_io", "server CPU (us/IO)", "min"),
    # The server's own code against the kernel's work for it (on loopback the kernel's
    # includes the client's TCP receive of every reply the server sends).
    ("cpu_user_us_per_io", "server user CPU (us/IO)", "min"),
    ("cpu_sys_us_per_io", "server system CPU (us/IO)", "min"),
    ("cpu_pct", "server CPU (% of one core)", None),
    ("ctx_per_io", "server context switches/IO", "min"),
    # fio's own CPU: near 100 % the client, not the server, bounds the cell.
    ("fio_cpu_pct", "client (fio) CPU (% of one core)", None),
    # No ratio: nbdkit's page cache defers its writes past the window (it shows < 1).
    ("write_amp", "server bytes written / client bytes", None),
    # The kernel's time per request at the disk (whole disk): a few tenths of a millisecond
    # on flash; tens of milliseconds mean the host stalled the disk in this cell.
    ("disk_await_ms", "disk await per request (ms, whole disk)", None),
    ("flush_p50_us", "flush p50 latency (us)", "min"),
    ("flush_p99_us", "flush p99 latency (us)", "min"),
    ("nbd_flush_per_write", "NBD flushes/write (client side)", None),
    ("disk_flush_per_write", "disk flushes/write (whole disk, see notes)", "min"),
]


def fmt(v, key="") -> str:
    if v is None:
        return "n/a"
    if key in ("iops",):
        return f"{v:,.0f}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def median_metrics(cells: list) -> dict | None:
    ok = [c for c in cells if isinstance(c, dict)]
    if not ok:
        return None
    keys = {k for c in ok for k in c}
    out = {}
    for k in keys:
        vals = [c[k] for c in ok if c.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    out["_n"] = len(ok)
    iops = [c["iops"] for c in ok]
    out["_iops_range"] = (min(iops), max(iops))
    return out


def ratio_cols(servers: list[Server]) -> list[Server]:
    return [s for s in servers if s.kind == "oxpool"]


def best_peer(med: dict, peers: list[Server], key: str, better: str):
    vals = [med[p.name][key] for p in peers
            if med.get(p.name) and med[p.name].get(key) is not None]
    if not vals:
        return None
    return max(vals) if better == "max" else min(vals)


def workload_table(w: Workload, servers: list[Server], cells: dict, repeat: int) -> list[str]:
    med = {s.name: median_metrics(cells.get(s.name, [])) for s in servers}
    peers = [s for s in servers if s.kind == "peer"]
    oxs = ratio_cols(servers)
    head = ["metric"] + [s.name for s in servers] + [f"{o.name} / best peer" for o in oxs if peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, better in ROWS:
        if not any(med[s.name] and med[s.name].get(key) is not None for s in servers):
            continue
        row = [label]
        for s in servers:
            row.append(fmt(med[s.name].get(key), key) if med[s.name] else "error" if cells.get(s.name) else "not run")
        if peers:
            for o in oxs:
                bp = best_peer(med, peers, key, better) if better else None
                v = med[o.name].get(key) if med[o.name] else None
                row.append(f"{v / bp:.2f}" if better and v is not None and bp else "")
        lines.append("| " + " | ".join(row) + " |")
    ctr_keys = sorted({k for s in servers if med[s.name] for k in med[s.name] if k.startswith("ctr:")})
    for k in ctr_keys:
        row = [f"{k[4:]}/IO (oxpool counter)"] + [
            fmt(med[s.name].get(k)) if med[s.name] else "-" for s in servers] + [""] * (len(oxs) if peers else 0)
        lines.append("| " + " | ".join(row) + " |")
    if repeat > 1:
        row = ["IOPS min-max over repeats"]
        for s in servers:
            m = med[s.name]
            row.append(f"{m['_iops_range'][0]:,.0f}-{m['_iops_range'][1]:,.0f} (n={m['_n']})" if m else "-")
        row += [""] * (len(oxs) if peers else 0)
        lines.append("| " + " | ".join(row) + " |")
    errors = []
    for s in servers:
        for i, c in enumerate(cells.get(s.name, [])):
            if isinstance(c, str):
                errors.append(f"- {s.name}, repeat {i + 1}: " + c.replace("\n", "\n  "))
    if errors:
        lines += ["", "Errors:", "", "```", *[e for e in errors], "```"]
    return lines


def summary_table(workloads, servers, results) -> list[str]:
    peers = [s for s in servers if s.kind == "peer"]
    oxs = ratio_cols(servers)
    refs = [s for s in servers if s.kind == "reference"]
    head = ["workload"] + [f"{s.name} IOPS" for s in servers]
    if peers:
        for o in oxs:
            head += [f"{o.name}/best IOPS", f"{o.name}/best p99"]
        head += [f"{r.name}/best IOPS" for r in refs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in workloads:
        med = {s.name: median_metrics(results[w.name].get(s.name, [])) for s in servers}
        row = [f"[{w.name}](#{w.name})"]
        for s in servers:
            row.append(fmt(med[s.name]["iops"], "iops") if med[s.name] else
                       ("error" if results[w.name].get(s.name) else "not run"))
        if peers:
            for o in oxs:
                for key, better in (("iops", "max"), ("p99_us", "min")):
                    bp = best_peer(med, peers, key, better)
                    v = med[o.name].get(key) if med[o.name] else None
                    row.append(f"{v / bp:.2f}" if v is not None and bp else "n/a")
            bp = best_peer(med, peers, "iops", "max")
            for r in refs:
                v = med[r.name].get("iops") if med[r.name] else None
                row.append(f"{v / bp:.2f}" if v is not None and bp else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def machine_info(args, workdir: Path, disk, binary: Path | None) -> list[str]:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // (1024 * 1024)} GiB"
    except OSError:
        pass
    fs = " ".join(cmd_output(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", str(workdir)]).split())
    rev = cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return [
        f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"- machine: {os.cpu_count()} CPUs ({cpu}), {mem} RAM, kernel {platform.release()}",
        f"- TCP congestion control (system, net.ipv4.tcp_congestion_control): {tcp_congestion()}; "
        "peers use it, oxpool's default (`--tcp-congestion auto`) uses cubic instead of BBR on "
        "same-host connections (docs/nbd.md)",
        f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"- tools: {cmd_output(['fio', '--version'])}, {cmd_output(['qemu-nbd', '--version'])}, "
        f"{cmd_output(['nbdkit', '--version'])}",
        f"- oxpool: commit {rev}{' + uncommitted changes' if dirty else ''}"
        f"{f' (cargo features: {args.features})' if args.features and not args.oxpool else ''}"
        f"{'' if binary else ' (no binary)'}",
        f"- data: {workdir} on {fs} (disk {disk or 'unknown'}), volume size {human_size(args.size_bytes)} "
        f"for every server",
        f"- mode: {'quick' if args.quick else 'full'}: {args.runtime:g} s measured per cell after "
        f"{args.ramp:g} s warm-up{'' if args.no_fill else ' (read workloads: after one sequential read of the whole device)'}, "
        f"{args.repeat} repeat(s), median reported; "
        + ("oxpool pools kept from one workload to the next (--age)" if args.age else
           "a fresh, preconditioned oxpool pool for each workload"),
    ]


def shown(servers, workloads, results) -> list:
    """Columns: servers that ran at least one cell (an unusable one is in Problems instead)."""
    return [s for s in servers if any(results[w.name].get(s.name) for w in workloads)]


def write_report(path: Path, link_prefix: str, ctx: dict) -> None:
    args, all_servers, workloads, results = ctx["args"], ctx["servers"], ctx["workloads"], ctx["results"]
    servers = shown(all_servers, workloads, results)
    L = ["# oxpool benchmark", ""]
    if ctx.get("interrupted"):
        L += ["**Interrupted: partial results.**", ""]
    L += ctx["machine"] + ["- finished: " + ctx.get("finished", "no")]
    L += ["", "## Servers", "", "| column | what | command |", "|---|---|---|"]
    for s in all_servers:
        cmdl = s.command_line() if not (s.kind == "oxpool" and s.binary is None) else "-"
        L.append(f"| {s.name} | {s.desc} | `{cmdl}` |")
    L += ["", "Ratios are oxpool / best peer of the same row: for IOPS and MB/s the best peer is the "
          "fastest (ratio > 1: oxpool is ahead); for latency, CPU, context switches and flushes it "
          "is the lowest (ratio < 1: oxpool is ahead). nbdkit-null (if run) is a reference, not a "
          "peer: nbdkit's null plugin stores nothing, so `nbdkit-null/best IOPS` near 1 marks a cell "
          "the client bounds (see the client CPU row). See bench/README.md for every row."]
    problems = [(s, s.error) for s in all_servers if s.error]
    notes = [(s, n) for s in all_servers for n in s.notes]
    if problems or notes or ctx.get("notes"):
        L += ["", "## Problems", ""]
        for s, e in problems:
            L += [f"- **{s.name} could not be benchmarked**:", "", "```", e.strip(), "```", ""]
        for s, n in notes:
            L.append(f"- {s.name}: {n}")
        for n in ctx.get("notes", []):
            L.append(f"- {n}")
    if ctx.get("precondition"):
        L += ["", "Preconditioning (whole volume written with fio, 1M sequential, iodepth 8; first time): "
              + "; ".join(f"{k}: {v}" for k, v in ctx["precondition"].items()) + "."]
    L += ["", "## Summary", ""]
    missing = [s.name for s in all_servers if s not in servers]
    if missing:
        L += [f"Not benchmarked (see Problems): {', '.join(missing)}.", ""]
    L += summary_table(workloads, servers, results)
    if ctx.get("plots"):
        L += ["", "## Plots", ""]
        for title, fname in ctx["plots"]:
            L += [f"![{title}]({link_prefix}{fname})", ""]
    L += ["", "## Workloads"]
    for w in workloads:
        L += ["", f"### {w.name}", "", w.desc + ("; group_reporting" if w.numjobs > 1 else "")
              + ("; the latency rows are the writes' (fio times the flushes apart: flush rows)"
                 if w.fsync else "") + ".", ""]
        L += workload_table(w, servers, results[w.name], args.repeat)
    path.write_text("\n".join(L) + "\n")


def write_outputs(outdir: Path, ctx: dict) -> None:
    workloads, servers, results = ctx["workloads"], ctx["servers"], ctx["results"]
    try:
        ctx["plots"] = make_plots(outdir, workloads, servers, results)
    except Exception as e:  # plots are a convenience: never lose the tables for them
        ctx["notes"].append(f"plotting failed: {e}")
        ctx["plots"] = []
    write_report(outdir / "report.md", "", ctx)
    latest = BENCH / "results" / "latest.md"
    latest.parent.mkdir(parents=True, exist_ok=True)
    write_report(latest, os.path.relpath(outdir, latest.parent) + "/", ctx)
    (outdir / "results.json").write_text(json.dumps(
        {"workloads": {w.name: results[w.name] for w in workloads},
         "servers": {s.name: {"desc": s.desc, "error": s.error, "notes": s.notes} for s in servers},
         "args": vars(ctx["args"])}, indent=1, default=str))
    # A server's log goes with the results only when something went wrong with it.
    for s in servers:
        failed = s.error or s.notes or any(isinstance(c, str) for w in workloads
                                           for c in results[w.name].get(s.name, []))
        if failed and s.log_path.exists():
            text = s.log_path.read_text(errors="replace")
            (outdir / f"{s.name}.log").write_text(text[-50_000:])
    log(f"report: {outdir / 'report.md'} (and {latest})")


def make_plots(outdir: Path, workloads, servers, results) -> list[tuple[str, str]]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    plots = []
    names = [s.name for s in shown(servers, workloads, results)]

    def med(wname, sname):
        return median_metrics(results.get(wname, {}).get(sname, []))

    # IOPS against iodepth: 4k random read over one connection.
    sweep = sorted((w for w in workloads if w.rw == "randread" and w.bs == "4k" and w.numjobs == 1),
                   key=lambda w: w.iodepth)
    if len(sweep) >= 2:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for n in names:
            pts = [(w.iodepth, m["iops"]) for w in sweep if (m := med(w.name, n))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_xticks([w.iodepth for w in sweep], [str(w.iodepth) for w in sweep])
        ax.set_xlabel("iodepth (one NBD connection)")
        ax.set_ylabel("IOPS")
        ax.set_ylim(bottom=0)
        ax.set_title("4k random read: IOPS against iodepth")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(outdir / "iops-vs-iodepth.png", dpi=90)
        plt.close(fig)
        plots.append(("IOPS against iodepth, 4k random read", "iops-vs-iodepth.png"))

    # Latency percentiles at iodepth 1.
    for wname in ("randread-4k-qd1", "syncwrite-4k-qd1"):
        if wname not in results:
            continue
        data = [(n, m) for n in names if (m := med(wname, n))]
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        width = 0.8 / len(data)
        for i, (n, m) in enumerate(data):
            xs = [j + i * width for j in range(len(PERCENTILES))]
            ax.bar(xs, [m.get(f"p{q}_us") or 0 for q in PERCENTILES], width, label=n)
        ax.set_xticks([j + width * (len(data) - 1) / 2 for j in range(len(PERCENTILES))],
                      [f"p{q}" for q in PERCENTILES])
        ax.set_yscale("log")
        ax.set_ylabel("latency (us, log scale)")
        ax.set_title(f"{wname}: latency percentiles")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fname = f"latency-{wname}.png"
        fig.savefig(outdir / fname, dpi=90)
        plt.close(fig)
        plots.append((f"latency percentiles, {wname}", fname))
    return plots


# ---------------------------------------------------------------------------------------------
# Main


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/run",
        description="Benchmark oxpool against qemu-nbd and nbdkit with fio's nbd engine; writes "
                    "a markdown report and PNG plots to bench/results/.")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 5 s per cell after 2 s warm-up, 1 repeat, no iodepth sweep")
    ap.add_argument("--runtime", type=float, help="measured seconds per cell (default 20, quick 5)")
    ap.add_argument("--ramp", type=float, help="warm-up seconds before each measured run (default 5, quick 2)")
    ap.add_argument("--no-fill", action="store_true",
                    help="do not read the whole device before each read cell (cold caches)")
    ap.add_argument("--repeat", type=int, help="rounds over all servers per workload (default 3, quick 1)")
    ap.add_argument("--workloads", help="comma-separated names or globs, e.g. 'randread-*,syncwrite-4k-qd1'")
    ap.add_argument("--variants", help="oxpool variants from bench/variants.toml, comma-separated; "
                                       "'all', 'none' (default: the enabled ones)")
    ap.add_argument("--peers", default="qemu-nbd,nbdkit,nbdkit-null",
                    help=f"peer servers, comma-separated, or 'none' (available: {', '.join(PEERS)})")
    ap.add_argument("--dir", default="/var/tmp/oxpool-bench",
                    help="directory for the data files, on the disk under test (default %(default)s)")
    ap.add_argument("--size", default="2G", help="volume size for every server (default %(default)s)")
    ap.add_argument("--pool-size", help="oxpool pool file size (default 3 x --size: room for copy-on-write and the intent log)")
    ap.add_argument("--out", help="output directory (default bench/results/<date>)")
    ap.add_argument("--oxpool", help="use this oxpool binary instead of building one")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build; use target/release/oxpool")
    ap.add_argument("--features", help="cargo features of the oxpool build, e.g. vendored-openssl "
                                       "(OpenSSL built from source: docs/tls.md)")
    ap.add_argument("--age", action="store_true",
                    help="keep each oxpool pool from one workload to the next (default: a fresh, "
                         "preconditioned pool per workload)")
    ap.add_argument("--keep-data", action="store_true", help="leave the data files and raw fio output in --dir")
    ap.add_argument("--list", action="store_true", help="list workloads and variants, and exit")
    args = ap.parse_args(argv)
    args.runtime = args.runtime if args.runtime is not None else (5 if args.quick else 20)
    args.ramp = args.ramp if args.ramp is not None else (2 if args.quick else 5)
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    args.size_bytes = parse_size(args.size)
    args.pool_size_bytes = (parse_size(args.pool_size) if args.pool_size
                            else args.size_bytes * 3)
    return args


def main(argv) -> int:
    args = parse_args(argv)
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:22} {w.desc}{'  [sweep: full mode only]' if w.sweep else ''}")
        for v in tomllib.loads((BENCH / "variants.toml").read_text()).get("variant", []):
            print(f"variant {v['name']:16} {'enabled ' if v.get('enabled', True) else 'disabled'} "
                  f"{v.get('description', '')}")
        return 0
    workloads = select_workloads(args.workloads, args.quick)
    variants = load_variants(BENCH / "variants.toml", args.variants)
    peer_names = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in peer_names:
        if p not in PEERS:
            raise SystemExit(f"unknown peer {p!r} (available: {', '.join(PEERS)})")

    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    outdir = Path(args.out).resolve() if args.out else BENCH / "results" / stamp
    outdir.mkdir(parents=True, exist_ok=True)
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    workdir = base / f"run-{stamp}"
    workdir.mkdir()
    tmp = workdir / "fio"
    tmp.mkdir()

    notes = []
    fstype = cmd_output(["findmnt", "-n", "-o", "FSTYPE", "-T", str(workdir)])
    if fstype in ("tmpfs", "ramfs"):
        notes.append(f"**{workdir} is on {fstype}, not on a disk**: numbers measure memory, not the disk")
    need = args.size_bytes * len(peer_names) + args.pool_size_bytes * len(variants) + (256 << 20)
    free = shutil.disk_usage(workdir).free
    if free < need:
        shutil.rmtree(workdir, ignore_errors=True)
        raise SystemExit(f"{workdir}: {human_size(free)} free, need about {need >> 20} MiB")
    disk = disk_of(workdir)
    if disk is None:
        notes.append("the data directory's block device is not in /proc/diskstats: no disk flush counts")

    binary, binary_error = (None, None)
    if variants:
        binary, binary_error = build_oxpool(args.no_build, args.oxpool, args.features)
        if binary_error:
            log(binary_error)
    servers: list[Server] = [Oxpool(v, binary, binary_error, workdir, args.size_bytes,
                                     args.pool_size_bytes) for v in variants]
    servers += [PEERS[p](workdir, args.size_bytes) for p in peer_names]
    all_files = [f for s in servers for f in s.data_files()]
    if any(getattr(s, "tls", False) or getattr(s, "variant", {}).get("tls") for s in servers):
        global CLIENT_ENV
        try:
            CLIENT_ENV = dict(os.environ, HOME=str(tls_pki(workdir)["home"]))
        except BenchError as e:
            raise SystemExit(f"cannot make the TLS certificates: {e}")
    results: dict[str, dict[str, list]] = {w.name: {} for w in workloads}
    ctx = {"args": args, "servers": servers, "workloads": workloads, "results": results,
           "notes": notes, "precondition": {},
           "machine": machine_info(args, workdir, disk, binary)}

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    status = 0
    try:
        log(f"servers: {', '.join(s.name for s in servers)}; workloads: {', '.join(w.name for w in workloads)}")
        log(f"data in {workdir}, results in {outdir}")
        probe = workdir / "flush-probe"
        baseline_ms = probe_median_ms(probe, 9)
        notes.append(f"flush probe (4 KiB write + fdatasync in the data directory) before any data was written: {baseline_ms:.2f} ms")
        # Prepare and precondition every server once. A failure here is for the whole run.
        for s in servers:
            if s.error:
                continue
            try:
                log(f"{s.name}: preparing and preconditioning {human_size(s.size)}")
                s.prepare()
                ctx["precondition"][s.name] = start_and_precondition(s, tmp)
                log(f"{s.name}: preconditioned ({ctx['precondition'][s.name]})")
            except (BenchError, OSError, subprocess.SubprocessError) as e:
                s.error = str(e)
                s.stop()
                log(f"{s.name}: unusable: {str(e).splitlines()[0]}")
        notes.append(wait_for_quiet_disk(probe, baseline_ms, "preparing the servers")[1])

        def settle_before_cell(what: str) -> None:
            settled, msg = wait_for_quiet_disk(probe, baseline_ms, what)
            if not settled:
                notes.append(msg)

        for i, w in enumerate(workloads):
            skip: set[str] = set()  # servers out of this workload (failed to start)
            if i > 0 and not args.age:
                # Each workload starts on a freshly created, fully written pool, so its numbers
                # do not depend on which workloads ran before it (or on --workloads), and an
                # oxpool failure in one workload (a suspended pool) does not cost the others.
                for s in servers:
                    if s.error or not s.stateful:
                        continue
                    try:
                        t0 = time.monotonic()
                        s.reset()
                        done = start_and_precondition(s, tmp)
                        log(f"{w.name} {s.name}: new pool, preconditioned ({done}; "
                            f"{time.monotonic() - t0:.1f} s in all)")
                    except (BenchError, OSError, subprocess.SubprocessError) as e:
                        s.stop()
                        skip.add(s.name)
                        results[w.name].setdefault(s.name, []).append(f"fresh pool setup failed: {e}")
                        log(f"{w.name} {s.name}: fresh pool setup failed: {str(e).splitlines()[0]}")
                notes.append(wait_for_quiet_disk(probe, baseline_ms, f"the new pools for {w.name}")[1])
            for rep in range(args.repeat):
                k = rep % len(servers) if servers else 0
                for s in servers[k:] + servers[:k]:  # rotate the order each repeat
                    if s.error or s.name in skip:
                        continue
                    tag = f"{w.name}-{s.name}-{rep}"
                    try:
                        m = run_cell(s, w, args, tmp, disk, all_files, tag, settle_before_cell)
                        results[w.name].setdefault(s.name, []).append(m)
                        log(f"{w.name} [{rep + 1}/{args.repeat}] {s.name:14} {m['iops']:>10,.0f} IOPS  "
                            f"{m['mbps']:8.1f} MB/s  p99 {fmt(m['p99_us'])} us  "
                            f"cpu {m['cpu_us_per_io']:.1f} us/IO  ctx {m['ctx_per_io']:.2f}/IO"
                            + (f"  disk await {m['disk_await_ms']:.2f} ms"
                               if "disk_await_ms" in m else ""))
                    except (BenchError, OSError, subprocess.SubprocessError) as e:
                        results[w.name].setdefault(s.name, []).append(str(e))
                        log(f"{w.name} [{rep + 1}/{args.repeat}] {s.name}: error: {str(e).splitlines()[0]}")
                        if isinstance(e, StartError):
                            skip.add(s.name)
        ctx["finished"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z") + \
            f", load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    except KeyboardInterrupt:
        ctx["interrupted"] = True
        status = 130
        log("interrupted: stopping servers, writing partial report")
    except Exception:
        ctx["interrupted"] = True
        status = 1
        notes.append("harness error:\n\n```\n" + traceback.format_exc() + "```")
        traceback.print_exc()
    finally:
        for s in servers:
            s.stop()
        try:
            write_outputs(outdir, ctx)
        finally:
            if args.keep_data:
                log(f"data kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
                try:
                    base.rmdir()  # only if empty: never remove what we did not create
                except OSError:
                    pass
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
