#!/usr/bin/python3
"""Send and receive against fio on the same disk (issue 17's goals). A benchmark, not a test.

    bench/send.py [--oxpool target/release/oxpool] [--dir /var/tmp] [--size 2G]
                  [--percent 1] [--repeat 3] [--json FILE] [--keep] [--no-diagnostics]

Makes two pools on allocated (zero-written) files in a new directory under --dir: `tank`,
holding a volume `tank/vol0` of --size with the defaults (volblocksize 16K, lz4), and `copy`,
the receiving side. Serves tank, writes the whole volume once through NBD (nbdcopy from
nbdkit's `random` plugin: data that does not compress), snapshots it (@a), rewrites
--percent % of its blocks at random offsets (fio's nbd engine, randwrite of one block each,
random data, every block at most once), snapshots again (@b), and stops the server. Saves
the full stream of @a to a file in the same directory, and writes a scratch file of --size
there with fio once (so the timed fio writes overwrite allocated blocks, as the receive
overwrites the pool's zero-written file). Then, --repeat times, in one run so the ratios
compare like with like on a noisy machine:

  read side (the order of the two alternates between repeats)
    - fio reads the pool file sequentially (--size bytes from offset 0, 1M, iodepth 8,
      O_DIRECT, io_uring);
    - `oxpool send tank/vol0@a > /dev/null`, timed until it exits (it opens the pool,
      sends, exports);
    - `oxpool send -i @a tank/vol0@b > /dev/null`;
    - `oxpool status tank`: what opening and exporting the pool alone costs;
    - diagnostics (not goals; --no-diagnostics skips them): fio reading the pool file at the
      send's request size (one 16 KiB block, iodepth 32), and the full send again with the
      vdev queue off (`oxpool set scheduler=off tank`, then back to auto);
  write side (the order alternates too)
    - fio writes the scratch file sequentially (--size bytes, 1M, iodepth 8, O_DIRECT,
      end_fsync=1);
    - `oxpool recv copy/vol0 < stream` into a new pool `copy` on its old file, timed until it
      exits (the receive's final sync and the export included), with the stream in the page
      cache (as a stream from the network: the disk only writes);
    - the same with the stream dropped from the page cache first (the disk reads the stream
      and writes the pool: a second figure, not the goal's).

Before each timed step the files it touches are written back and dropped from the page cache
(fdatasync + posix_fadvise(DONTNEED), as bench/oxbench.py does: no global drop_caches on a
shared machine), and, after steps that wrote, the script waits until a 4 KiB write +
fdatasync next to the data costs what it cost before the run (at most 60 s), so one step's
writeback does not land on the next. Every oxpool command's user + system CPU time (from
wait4), the time its main thread and its busiest other thread spent on a CPU and runnable
waiting for one (/proc/PID/task/TID/schedstat, sampled every 50 ms), and the disk's read
and written bytes (/proc/diskstats of the device holding --dir, whole disk: an upper bound)
are recorded with its wall time.

Goals (issue 17), on the medians: full send rate >= 80 % of fio's sequential read of the
pool file; incremental send <= 5 % of the full send's time; receive rate (stream cached)
>= 70 % of fio's sequential write. Rates are the volume's bytes over the wall time.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from oxbench import drop_page_cache, flush_probe_ms
from oxserve import Server, run

KIB = 1024
MIB = 1 << 20
GIB = 1 << 30
BLOCK = 16 * KIB
SETTLE_WAIT_S_MAX = 60


def log(msg):
    print(msg, flush=True)


def parse_size(s):
    units = {"G": GIB, "M": MIB, "K": KIB}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


# ---------------------------------------------------------------------------------------------
# The disk


def disk_name(path):
    """The block device holding `path`, as /proc/diskstats names it."""
    st = os.stat(path)
    link = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    return os.path.basename(link)


def disk_bytes(name):
    """(read, written) bytes of the device so far."""
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == name:
                return int(p[5]) * 512, int(p[9]) * 512
    return 0, 0


def probe_median_ms(probe, n):
    return statistics.median(flush_probe_ms(probe) for _ in range(n))


def settle(probe, baseline_ms, what):
    """Waits until a flush costs about what it cost before the run wrote anything (median of
    5 probes within 2x the baseline, or 0.2 ms above it), at most SETTLE_WAIT_S_MAX: on a
    virtual disk the host writes the guest's gigabytes back after the guest is done, and
    every guest I/O waits for it meanwhile (bench/README.md)."""
    limit = max(2 * baseline_ms, baseline_ms + 0.2)
    t0 = time.monotonic()
    os.sync()
    # Bounded: one round per second, SETTLE_WAIT_S_MAX seconds at most.
    while True:
        now = probe_median_ms(probe, 5)
        waited = time.monotonic() - t0
        if now <= limit or waited >= SETTLE_WAIT_S_MAX:
            break
        time.sleep(1)
    settled = now <= limit
    return {"what": what, "waited_s": round(waited, 1), "flush_ms": round(now, 2),
            "settled": settled}


# ---------------------------------------------------------------------------------------------
# Timed commands


def thread_times_s(pid):
    """For each live thread of `pid`, by thread id: (seconds on a CPU, seconds runnable but
    waiting for one), from /proc/PID/task/TID/schedstat (nanoseconds). What is left of the
    thread's life is time it slept: waiting for I/O, a lock, another thread."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu_ns, runqueue_ns = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(on_cpu_ns) / 1e9, int(runqueue_ns) / 1e9)
    return out


def timed(cmd, disk, stdin=None, stdout=subprocess.DEVNULL):
    """Runs `cmd` to its end: wall seconds, its CPU seconds (user, system, from wait4: the
    process and every thread), its main thread's and its busiest other thread's time on a
    CPU and waiting for one (sampled every 50 ms: a thread loses at most its last 50 ms; the
    busiest is the one with the most CPU time), the disk's bytes
    read and written meanwhile, its stderr."""
    err = tempfile.TemporaryFile()
    r0, w0 = disk_bytes(disk)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=err)
    threads = {}
    done = threading.Event()

    def sample():
        # Bounded: ends when the command has exited (`done`).
        while not done.is_set():
            threads.update(thread_times_s(p.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    r1, w1 = disk_bytes(disk)
    main_thread = threads.get(p.pid, (0.0, 0.0))
    others = sorted((t for tid, t in threads.items() if tid != p.pid), reverse=True)
    busiest = others[0] if others else (0.0, 0.0)
    err.seek(0)
    stderr = err.read().decode(errors="replace")
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {stderr.strip()[-500:]}")
    return {
        "wall_s": wall,
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "main_thread_cpu_s": main_thread[0],
        "main_thread_runqueue_s": main_thread[1],
        "busiest_other_thread_cpu_s": busiest[0],
        "busiest_other_thread_runqueue_s": busiest[1],
        "threads": len(threads),
        "disk_read_bytes": r1 - r0,
        "disk_written_bytes": w1 - w0,
        "stderr": stderr.strip(),
    }


def fio(disk, name, path, rw, size, extra=()):
    """One fio job over `size` bytes of `path` from offset 0, 1M requests, iodepth 8,
    O_DIRECT (`extra` comes last, so it may override them): the timed command, with fio's
    own figures."""
    cmd = ["fio", f"--name={name}", f"--filename={path}", f"--rw={rw}", "--bs=1M",
           "--iodepth=8", "--ioengine=io_uring", "--direct=1", f"--size={size}",
           "--offset=0", "--output-format=json", *extra]
    out = tempfile.TemporaryFile()
    t = timed(cmd, disk, stdout=out)
    out.seek(0)
    job = json.load(out)["jobs"][0]
    side = job["read"] if rw == "read" else job["write"]
    assert side["io_bytes"] == size, f"fio {rw} moved {side['io_bytes']} bytes, not {size}"
    t["fio_runtime_s"] = job["job_runtime"] / 1e3
    t["fio_bw_bytes_per_s"] = side["bw_bytes"]
    del t["stderr"]
    return t


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oxpool", default="target/release/oxpool")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--size", default="2G")
    ap.add_argument("--percent", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--no-diagnostics", dest="diagnostics", action="store_false",
                    help="skip fio at the block size and the send with scheduler=off")
    a = ap.parse_args()
    size = parse_size(a.size)
    oxpool = os.path.abspath(a.oxpool)
    work = tempfile.mkdtemp(dir=a.dir, prefix="oxsend-")
    disk = disk_name(work)
    cache = os.path.join(work, "pools.cache")
    tank_img = os.path.join(work, "tank.img")
    copy_img = os.path.join(work, "copy.img")
    stream = os.path.join(work, "full.stream")
    scratch = os.path.join(work, "fio-write.dat")
    probe = os.path.join(work, "flush-probe")

    def ox(*args, **kw):
        return run([oxpool, "--cache-file", cache, *args], **kw)

    results = {
        "size_bytes": size,
        "percent": a.percent,
        "repeat": a.repeat,
        "dir": a.dir,
        "disk": disk,
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                 "loadavg_start": os.getloadavg()},
        "settle": [],
    }
    try:
        baseline_ms = probe_median_ms(probe, 9)
        results["flush_baseline_ms"] = baseline_ms
        log(f"work directory {work} on {disk}; flush probe baseline {baseline_ms:.2f} ms; "
            f"load average {os.getloadavg()[0]:.1f}")
        # Room for the volume, the blocks @a keeps after the rewrite, and metadata.
        pool_size = f"{(size + size // 2 + GIB) >> 20}M"
        t = time.perf_counter()
        ox("create", "tank", tank_img, "--size", pool_size)
        ox("create", "copy", copy_img, "--size", pool_size)
        results["create_two_pools_s"] = time.perf_counter() - t
        ox("vol", "create", "tank/vol0", "--size", a.size)

        # The data, through the engine: NBD.
        server = Server(oxpool, cache, ["tank", "--listen", "127.0.0.1:0"])
        try:
            t = time.perf_counter()
            run(["nbdcopy", "--", "[", "nbdkit", "--exit-with-parent", "-r", "random",
                 f"size={size}", "]", server.uri])
            results["fill_s"] = time.perf_counter() - t
            ox("snapshot", "tank/vol0@a")
            nblocks = size // BLOCK
            changed = int(nblocks * a.percent / 100)
            t = time.perf_counter()
            # fio's random map: each block at most once, so `changed` distinct blocks.
            run(["fio", "--name=change", "--ioengine=nbd", f"--uri={server.uri}",
                 "--rw=randwrite", f"--bs={BLOCK}", f"--size={size}",
                 f"--io_size={changed * BLOCK}", "--iodepth=8", "--refill_buffers",
                 "--randseed=288545018"])
            results["change_s"] = time.perf_counter() - t
            ox("snapshot", "tank/vol0@b")
        finally:
            server.stop()
        log(f"filled {a.size} in {results['fill_s']:.0f} s; rewrote {changed} of {nblocks} "
            f"blocks in {results['change_s']:.1f} s")

        # The streams' exact sizes, and the changed blocks counted by the engine.
        est = {}
        for what, args in (("full", ["tank/vol0@a"]), ("incremental", ["-i", "@a", "tank/vol0@b"])):
            out = ox("send", "-n", "-v", "-p", *args).stdout
            log(out.strip())
            blocks = int(out.split(" blocks")[0].rsplit(" ", 1)[1])
            total = int(out.strip().rsplit(" ", 1)[1])
            est[what] = {"data_records": blocks, "stream_bytes": total}
        assert est["incremental"]["data_records"] == changed, (
            f"the incremental sends {est['incremental']['data_records']} blocks, "
            f"{changed} were changed")
        results["streams"] = est
        results["properties"] = ox("get", "all", "tank/vol0").stdout.strip()

        with open(stream, "wb") as f:
            results["save_stream"] = timed([oxpool, "--cache-file", cache, "send", "tank/vol0@a"],
                                           disk, stdout=f)
        assert os.path.getsize(stream) == est["full"]["stream_bytes"]
        # Allocated once: the timed writes overwrite, as the receive does in its pool file.
        fio(disk, "layout", scratch, "write", size, ["--end_fsync=1"])
        results["settle"].append(settle(probe, baseline_ms, "preparing"))

        rounds = []
        send_cmd = [oxpool, "--cache-file", cache, "send", "tank/vol0@a"]
        for i in range(a.repeat):
            r = {}

            def fio_read():
                drop_page_cache([tank_img])
                r["fio_read"] = fio(disk, "read", tank_img, "read", size)

            def send_full():
                drop_page_cache([tank_img])
                r["send_full"] = timed(send_cmd, disk)

            def fio_write():
                drop_page_cache([scratch])
                r["settle_fio_write"] = settle(probe, baseline_ms, f"round {i + 1} before fio write")
                r["fio_write"] = fio(disk, "write", scratch, "write", size, ["--end_fsync=1"])

            def recv(cold):
                ox("destroy", "copy")
                ox("create", "copy", copy_img)
                drop_page_cache([copy_img] + ([stream] if cold else []))
                key = "recv_cold_stream" if cold else "recv"
                r["settle_" + key] = settle(probe, baseline_ms, f"round {i + 1} before {key}")
                if not cold:
                    # In the page cache: read once (a no-op if it is there already).
                    with open(stream, "rb") as f:
                        while f.read(16 * MIB):
                            pass
                with open(stream, "rb") as f:
                    r[key] = timed([oxpool, "--cache-file", cache, "recv", "copy/vol0"], disk,
                                   stdin=f)

            r["settle_read"] = settle(probe, baseline_ms, f"round {i + 1} before reads")
            pair = [fio_read, send_full] if i % 2 == 0 else [send_full, fio_read]
            for step in pair:
                step()
            drop_page_cache([tank_img])
            r["send_incremental"] = timed([oxpool, "--cache-file", cache, "send", "-i", "@a",
                                           "tank/vol0@b"], disk)
            r["open_export"] = timed([oxpool, "--cache-file", cache, "status", "tank"], disk)
            if a.diagnostics:
                # Where the send's time goes: the disk at the send's request size (one block,
                # several in flight), and the send without the vdev queue's class limits.
                drop_page_cache([tank_img])
                r["fio_read_block"] = fio(disk, "read-block", tank_img, "read", size,
                                          [f"--bs={BLOCK}", "--iodepth=32"])
                ox("set", "scheduler=off", "tank")
                drop_page_cache([tank_img])
                r["send_full_scheduler_off"] = timed(send_cmd, disk)
                ox("set", "scheduler=auto", "tank")
            pair = [fio_write, lambda: recv(False)] if i % 2 == 0 else [lambda: recv(False), fio_write]
            for step in pair:
                step()
            recv(True)
            rounds.append(r)
            log(f"round {i + 1}: fio read {size / r['fio_read']['fio_runtime_s'] / 1e6:.0f} MB/s, "
                f"send {r['send_full']['wall_s']:.2f} s "
                f"({size / r['send_full']['wall_s'] / 1e6:.0f} MB/s, "
                f"CPU {r['send_full']['user_s'] + r['send_full']['sys_s']:.2f} s, busiest thread "
                f"{r['send_full']['busiest_other_thread_cpu_s']:.2f} s + "
                f"{r['send_full']['busiest_other_thread_runqueue_s']:.2f} s runnable), "
                f"incremental {r['send_incremental']['wall_s']:.3f} s, "
                f"open+export {r['open_export']['wall_s']:.3f} s; "
                f"fio write {size / r['fio_write']['fio_runtime_s'] / 1e6:.0f} MB/s, "
                f"recv {r['recv']['wall_s']:.2f} s ({size / r['recv']['wall_s'] / 1e6:.0f} MB/s, "
                f"CPU {r['recv']['user_s'] + r['recv']['sys_s']:.2f} s, main thread "
                f"{r['recv']['main_thread_cpu_s']:.2f} s + "
                f"{r['recv']['main_thread_runqueue_s']:.2f} s runnable), "
                f"recv cold stream {r['recv_cold_stream']['wall_s']:.2f} s"
                + (f"; fio read {BLOCK >> 10}K qd32 "
                   f"{size / r['fio_read_block']['fio_runtime_s'] / 1e6:.0f} MB/s, send with "
                   f"scheduler=off {r['send_full_scheduler_off']['wall_s']:.2f} s"
                   if a.diagnostics else ""))
        results["rounds"] = rounds

        def med(step, field="wall_s"):
            return statistics.median(r[step][field] for r in rounds)

        def cpu(step):
            return statistics.median(r[step]["user_s"] + r[step]["sys_s"] for r in rounds)

        fio_read_s, fio_write_s = med("fio_read", "fio_runtime_s"), med("fio_write", "fio_runtime_s")
        send_s, incr_s, recv_s = med("send_full"), med("send_incremental"), med("recv")
        summary = {
            "fio_read_MBps": size / fio_read_s / 1e6,
            "fio_read_wall_s": med("fio_read"),
            "send_full_s": send_s,
            "send_full_MBps": size / send_s / 1e6,
            "send_full_cpu_s": cpu("send_full"),
            "send_full_main_thread_cpu_s": med("send_full", "main_thread_cpu_s"),
            "send_full_busiest_other_thread_cpu_s": med("send_full", "busiest_other_thread_cpu_s"),
            "send_full_busiest_other_thread_runqueue_s": med("send_full",
                                                             "busiest_other_thread_runqueue_s"),
            "send_full_disk_read_bytes": med("send_full", "disk_read_bytes"),
            "send_vs_fio_read": fio_read_s / send_s,
            "send_incremental_s": incr_s,
            "send_incremental_cpu_s": cpu("send_incremental"),
            "incremental_vs_full": incr_s / send_s,
            "open_export_s": med("open_export"),
            "fio_write_MBps": size / fio_write_s / 1e6,
            "fio_write_wall_s": med("fio_write"),
            "recv_s": recv_s,
            "recv_MBps": size / recv_s / 1e6,
            "recv_cpu_s": cpu("recv"),
            "recv_main_thread_cpu_s": med("recv", "main_thread_cpu_s"),
            "recv_main_thread_runqueue_s": med("recv", "main_thread_runqueue_s"),
            "recv_busiest_other_thread_cpu_s": med("recv", "busiest_other_thread_cpu_s"),
            "recv_disk_written_bytes": med("recv", "disk_written_bytes"),
            "recv_vs_fio_write": fio_write_s / recv_s,
            "recv_cold_stream_s": med("recv_cold_stream"),
            "recv_cold_stream_vs_fio_write": fio_write_s / med("recv_cold_stream"),
        }
        if a.diagnostics:
            summary.update({
                "fio_read_block_MBps": size / med("fio_read_block", "fio_runtime_s") / 1e6,
                "fio_read_block_vs_fio_read": fio_read_s / med("fio_read_block", "fio_runtime_s"),
                "send_full_scheduler_off_s": med("send_full_scheduler_off"),
                "send_scheduler_off_vs_fio_read": fio_read_s / med("send_full_scheduler_off"),
            })
        summary["goals"] = {
            "send >= 80 % of fio read": summary["send_vs_fio_read"] >= 0.8,
            "incremental <= 5 % of full": summary["incremental_vs_full"] <= 0.05,
            "recv >= 70 % of fio write": summary["recv_vs_fio_write"] >= 0.7,
        }
        results["summary"] = summary
        results["host"]["loadavg_end"] = os.getloadavg()
        s = summary
        yes = lambda ok: "met" if ok else "NOT met"
        log(f"\nvolume {a.size} ({size} bytes, random data), {a.repeat} rounds, medians:")
        log(f"fio sequential read of the pool file (1M, qd8): {s['fio_read_MBps']:.0f} MB/s")
        log(f"full send to /dev/null: {s['send_full_s']:.2f} s, {s['send_full_MBps']:.0f} MB/s: "
            f"{100 * s['send_vs_fio_read']:.0f} % of fio (goal >= 80 %: "
            f"{yes(s['goals']['send >= 80 % of fio read'])}); CPU {s['send_full_cpu_s']:.2f} s "
            f"(main thread {s['send_full_main_thread_cpu_s']:.2f} s, busiest other "
            f"{s['send_full_busiest_other_thread_cpu_s']:.2f} s on a CPU + "
            f"{s['send_full_busiest_other_thread_runqueue_s']:.2f} s waiting for one)")
        if a.diagnostics:
            log(f"  fio at the send's request size ({BLOCK >> 10}K, qd32): "
                f"{s['fio_read_block_MBps']:.0f} MB/s ({100 * s['fio_read_block_vs_fio_read']:.0f} "
                f"% of 1M reads); send with scheduler=off: {s['send_full_scheduler_off_s']:.2f} s "
                f"({100 * s['send_scheduler_off_vs_fio_read']:.0f} % of fio)")
        log(f"incremental send ({a.percent} % of the blocks): {s['send_incremental_s']:.3f} s, "
            f"{100 * s['incremental_vs_full']:.1f} % of the full send (goal <= 5 %: "
            f"{yes(s['goals']['incremental <= 5 % of full'])}); opening and exporting the pool "
            f"alone: {s['open_export_s']:.3f} s")
        log(f"fio sequential write (1M, qd8, end_fsync): {s['fio_write_MBps']:.0f} MB/s")
        log(f"recv (stream cached): {s['recv_s']:.2f} s, {s['recv_MBps']:.0f} MB/s: "
            f"{100 * s['recv_vs_fio_write']:.0f} % of fio (goal >= 70 %: "
            f"{yes(s['goals']['recv >= 70 % of fio write'])}); CPU {s['recv_cpu_s']:.2f} s "
            f"(main thread {s['recv_main_thread_cpu_s']:.2f} s on a CPU + "
            f"{s['recv_main_thread_runqueue_s']:.2f} s waiting for one, busiest other "
            f"{s['recv_busiest_other_thread_cpu_s']:.2f} s)")
        log(f"recv (stream read from the disk): {s['recv_cold_stream_s']:.2f} s: "
            f"{100 * s['recv_cold_stream_vs_fio_write']:.0f} % of fio write")
        log(f"load average {results['host']['loadavg_start'][0]:.1f} at the start, "
            f"{results['host']['loadavg_end'][0]:.1f} at the end")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
