#!/usr/bin/python3
"""Raidz over NBD and the scrub (issue 18's benchmarks). A benchmark, not a test.

    bench/raidz.py [--oxpool target/release/oxpool] [--dir /var/tmp] [--device-size 1G]
                   [--volsize 3G] [--volblocksize 128K] [--iodepths 8,1] [--repeat 3]
                   [--policies auto,inline,worker] [--json FILE] [--keep]

Makes a pool `tank` of one raidz2 of 6 allocated (zero-written) files of --device-size in a
new directory under --dir, holding a volume `tank/vol0` of --volsize with --volblocksize
(128K: bulk data on raidz, the seed case of OpenZFS PR 18562 is 1 MiB sequential writes on
raidz2 with 128K records) and `compression=off` (this measures the raidz path and the
completion policies; lz4's cost is issue 19's and 20's). Then, --repeat times, each
`completion` policy in turn (the order rotates each repeat, the machine being shared and
noisy), for each iodepth of --iodepths:

  - `oxpool set completion=POLICY tank`, serve, fio's nbd engine writes the whole volume
    sequentially (128K requests, `end_fsync=1`: the final flush is timed in), stop;
  - the pool files are written back and dropped from the page cache, serve again (the data
    cache is empty), fio reads the whole volume sequentially (128K), stop.

Each cell records fio's bandwidth and the server's CPU seconds (utime + stime of the whole
process) per GiB moved. Before each write cell the script waits until a 4 KiB write +
fdatasync next to the data costs what it cost before the run (bench/send.py's `settle`).

Then the scrub of the full pool (the volume was written whole): the files are dropped from
the page cache, fio reads the six files at once (six jobs, each its file sequentially from
offset 0 over the pool's allocated bytes / 6, 1M, iodepth 8, O_DIRECT, io_uring), and
`oxpool scrub -w tank` runs on the exported pool (it imports, scrubs to the end and exports),
timed; `oxpool status tank` alone (import and export, no scrub) is timed too and subtracted.
The scrub's rate is the pool's allocated bytes (data and parity, what it reads) over that
time, against fio's aggregate rate; --repeat times, alternating which goes first.

Goals (issue 18), on the medians: `auto` at least as good as the better of `inline` and
`worker` in every cell; scrub rate at least 70 % of fio's. Parity generation per core is
`cargo bench -p oxpool-engine --bench raidz` (docs/raidz.md).
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
import time

from oxbench import drop_page_cache, proc_sample
from oxserve import Server, run
from send import disk_name, parse_size, probe_median_ms, settle, timed

GIB = 1 << 30
DEVICES = 6
REQUEST_BYTES = 128 * 1024


def log(msg):
    print(msg, flush=True)


def fio_nbd(uri, rw, size, iodepth, extra=()):
    """fio's nbd engine over the whole volume: (bytes per second, bytes moved)."""
    cmd = ["fio", "--name=raidz", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
           f"--bs={REQUEST_BYTES}", f"--iodepth={iodepth}", f"--size={size}",
           "--output-format=json", *extra]
    out = run(cmd).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if rw == "read" else job["write"]
    # Wall time of the job, the final flush included (end_fsync is inside job_runtime).
    runtime_s = job["job_runtime"] / 1e3
    return side["io_bytes"] / runtime_s, side["io_bytes"]


def fio_files_at_once(disk, files, per_file_bytes):
    """Six jobs, each one file sequentially: aggregate bytes per second."""
    cmd = ["fio", "--group_reporting", "--output-format=json", "--ioengine=io_uring",
           "--direct=1", "--rw=read", "--bs=1M", "--iodepth=8",
           f"--size={per_file_bytes}", "--offset=0"]
    for i, f in enumerate(files):
        cmd += [f"--name=dev{i}", f"--filename={f}"]
    out = tempfile.TemporaryFile()
    t = timed(cmd, disk, stdout=out)
    out.seek(0)
    job = json.load(out)["jobs"][0]
    t["fio_bw_bytes_per_s"] = job["read"]["bw_bytes"]
    t["fio_io_bytes"] = job["read"]["io_bytes"]
    del t["stderr"]
    return t


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oxpool", default="target/release/oxpool")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--device-size", default="1G")
    ap.add_argument("--volsize", default="3G")
    ap.add_argument("--volblocksize", default="128K")
    ap.add_argument("--iodepths", default="8,1")
    ap.add_argument("--policies", default="auto,inline,worker")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    oxpool = os.path.abspath(a.oxpool)
    volsize = parse_size(a.volsize)
    iodepths = [int(d) for d in a.iodepths.split(",")]
    policies = a.policies.split(",")
    work = tempfile.mkdtemp(dir=a.dir, prefix="oxraidz-")
    disk = disk_name(work)
    cache = os.path.join(work, "pools.cache")
    files = [os.path.join(work, f"dev{i}.img") for i in range(DEVICES)]
    probe = os.path.join(work, "flush-probe")

    def ox(*args, **kw):
        return run([oxpool, "--cache-file", cache, *args], **kw)

    results = {
        "device_size": a.device_size, "volsize_bytes": volsize, "volblocksize": a.volblocksize,
        "iodepths": iodepths, "policies": policies, "repeat": a.repeat, "disk": disk,
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                 "loadavg_start": os.getloadavg()},
        "settle": [], "cells": [], "scrub": [],
    }
    try:
        baseline_ms = probe_median_ms(probe, 9)
        results["flush_baseline_ms"] = baseline_ms
        ox("create", "tank", "raidz2", *files, "--size", a.device_size)
        ox("vol", "create", "tank/vol0", "--size", a.volsize, "-o",
           f"volblocksize={a.volblocksize}", "-o", "compression=off")
        log(f"work directory {work} on {disk}; raidz2 of {DEVICES} x {a.device_size}, "
            f"volume {a.volsize}; flush probe baseline {baseline_ms:.2f} ms")

        def cell(policy, rw, iodepth, rnd):
            ox("set", f"completion={policy}", "tank")
            if rw == "write":
                results["settle"].append(settle(probe, baseline_ms, f"{policy} write"))
            drop_page_cache(files)
            server = Server(oxpool, cache, ["tank", "--listen", "127.0.0.1:0"])
            try:
                cpu0 = proc_sample(server.proc.pid)["cpu_s"]
                extra = ["--end_fsync=1"] if rw == "write" else []
                bw, moved = fio_nbd(server.uri, rw, volsize, iodepth, extra)
                cpu_s = proc_sample(server.proc.pid)["cpu_s"] - cpu0
            finally:
                server.stop()
            c = {"round": rnd, "policy": policy, "rw": rw, "iodepth": iodepth,
                 "bw_bytes_per_s": bw, "server_cpu_s_per_gib": cpu_s / (moved / GIB)}
            results["cells"].append(c)
            log(f"  {policy:<7} {rw:<5} qd{iodepth:<2} {bw / 1e6:8.1f} MB/s, "
                f"server {c['server_cpu_s_per_gib']:.2f} CPU s/GiB")

        for rnd in range(a.repeat):
            order = policies[rnd % len(policies):] + policies[:rnd % len(policies)]
            log(f"round {rnd + 1}: {', '.join(order)}")
            for iodepth in iodepths:
                for policy in order:
                    cell(policy, "write", iodepth, rnd)
                    cell(policy, "read", iodepth, rnd)

        # The scrub of the full pool against fio reading the same files at once.
        alloc = int(ox("list", "-H", "-p", "tank").stdout.split("\t")[2])
        results["alloc_bytes"] = alloc
        per_file = alloc // DEVICES // (1 << 20) * (1 << 20)
        for rnd in range(a.repeat):
            r = {}

            def fio_side():
                drop_page_cache(files)
                r["fio"] = fio_files_at_once(disk, files, per_file)

            def scrub_side():
                drop_page_cache(files)
                r["open_export"] = timed([oxpool, "--cache-file", cache, "status", "tank"], disk)
                drop_page_cache(files)
                r["scrub"] = timed([oxpool, "--cache-file", cache, "scrub", "-w", "tank"], disk)

            for step in ((fio_side, scrub_side) if rnd % 2 == 0 else (scrub_side, fio_side)):
                step()
            scrub_s = max(r["scrub"]["wall_s"] - r["open_export"]["wall_s"], 1e-3)
            r["scrub_bytes_per_s"] = alloc / scrub_s
            r["ratio"] = r["scrub_bytes_per_s"] / r["fio"]["fio_bw_bytes_per_s"]
            for k in ("open_export", "scrub"):
                r[k].pop("stderr", None)
            results["scrub"].append(r)
            log(f"  scrub {alloc / GIB:.2f} GiB in {scrub_s:.1f} s: "
                f"{r['scrub_bytes_per_s'] / 1e6:.0f} MB/s against fio's "
                f"{r['fio']['fio_bw_bytes_per_s'] / 1e6:.0f} MB/s ({r['ratio'] * 100:.0f} %); "
                f"scrub CPU {r['scrub']['user_s'] + r['scrub']['sys_s']:.1f} s")

        # Summary on the medians.
        log("\nmedians (MB/s; auto against the better of inline and worker):")
        summary = {}
        for iodepth in iodepths:
            for rw in ("write", "read"):
                m = {p: median([c["bw_bytes_per_s"] for c in results["cells"]
                                if c["policy"] == p and c["rw"] == rw
                                and c["iodepth"] == iodepth]) for p in policies}
                cpu = {p: median([c["server_cpu_s_per_gib"] for c in results["cells"]
                                  if c["policy"] == p and c["rw"] == rw
                                  and c["iodepth"] == iodepth]) for p in policies}
                others = [m[p] for p in policies if p != "auto"]
                ratio = m.get("auto", float("nan")) / max(others) if others else float("nan")
                summary[f"{rw}-qd{iodepth}"] = {"mb_per_s": {p: m[p] / 1e6 for p in m},
                                                "cpu_s_per_gib": cpu, "auto_vs_best": ratio}
                log(f"  {rw:<5} qd{iodepth:<2} " + "  ".join(
                    f"{p} {m[p] / 1e6:7.1f} ({cpu[p]:.2f} s/GiB)" for p in policies)
                    + f"  auto/best {ratio:.3f}")
        ratio = median([r["ratio"] for r in results["scrub"]])
        summary["scrub_vs_fio"] = ratio
        log(f"  scrub {ratio * 100:.0f} % of fio's sequential read of the six files (goal 70 %)")
        results["summary"] = summary
        results["host"]["loadavg_end"] = os.getloadavg()
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
