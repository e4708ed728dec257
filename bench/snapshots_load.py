#!/usr/bin/python3
"""Snapshots under client load (issue 16's fio benchmarks). A benchmark, not a test.

    bench/snapshots_load.py [--oxpool target/release/oxpool] [--runtime 20] [--dir /var/tmp]

Serves a 1 GiB volume of a fresh pool (20 GiB, sparse) and runs fio (nbd engine, 4k random writes, iodepth 32,
time based) three times:
  1. alone: the baseline IOPS;
  2. while `oxpool snapshot` takes 100 snapshots, spread over the run: goal, within 10 % of 1;
  3. while `oxpool destroy` destroys 1,000 snapshots (taken beforehand while fio wrote, so
     each holds blocks of its own): goal, at least 70 % of 1, and no write waiting more than
     a txg (fio's largest completion latency is printed).
Prints one line per run and the ratios, as JSON too (--json FILE)."""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

from oxserve import Server, run


def fio(uri, runtime, name):
    out = run(
        [
            "fio", "--name", name, "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite",
            "--bs=4k", "--iodepth=32", f"--runtime={runtime}", "--time_based",
            "--size=1G", "--output-format=json",
        ]
    ).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    return {"iops": job["iops"], "clat_ms_max": job["clat_ns"]["max"] / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oxpool", default="target/release/oxpool")
    ap.add_argument("--runtime", type=int, default=20)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(dir=a.dir, prefix="oxsnapbench-")
    cache = os.path.join(work, "pools.cache")
    ox = lambda *args: run([a.oxpool, "--cache-file", cache, *args])
    try:
        # Room for what the snapshots hold: every 4k write into a 16K block keeps the old
        # block while a snapshot references it (a sparse file: only what is written counts).
        ox("create", "tank", os.path.join(work, "tank.img"), "--size", "20G", "--sparse")
        ox("vol", "create", "tank/vol0", "--size", "1G")
        server = Server(a.oxpool, cache, ["--listen", "127.0.0.1:0"])
        try:
            # Precondition: the whole volume written once.
            run(["fio", "--name=pre", "--ioengine=nbd", f"--uri={server.uri}", "--rw=write",
                 "--bs=1M", "--iodepth=8", "--size=1G"])
            results = {}
            results["alone"] = fio(server.uri, a.runtime, "alone")

            def snapshots(n, spread_s):
                for i in range(n):
                    ox("snapshot", f"tank/vol0@during{i}")
                    time.sleep(spread_s / n)

            t = threading.Thread(target=snapshots, args=(100, a.runtime * 0.9))
            t.start()
            results["with_100_snapshots"] = fio(server.uri, a.runtime, "snapshots")
            t.join()
            # 1,000 snapshots taken while fio writes, so each holds blocks of its own.
            def many():
                for i in range(1000):
                    ox("snapshot", f"tank/vol0@old{i}")

            t = threading.Thread(target=many)
            t.start()
            fio(server.uri, 30, "fill")
            t.join()
            start = time.time()
            destroy = subprocess.Popen(
                [a.oxpool, "--cache-file", cache, "destroy", "tank/vol0@old0%old999"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            results["while_destroying_1000"] = fio(server.uri, a.runtime, "destroy")
            destroy.wait()
            results["destroy_s"] = time.time() - start
            results["freeing_after"] = ox("get", "-H", "-o", "value", "freeing", "tank").stdout.strip()
        finally:
            server.stop()
        base = results["alone"]["iops"]
        for k in ("alone", "with_100_snapshots", "while_destroying_1000"):
            r = results[k]
            print(f"{k:<24} {r['iops']:>10.0f} IOPS  {r['iops'] / base:5.2f}x  "
                  f"clat max {r['clat_ms_max']:.1f} ms")
        print(f"destroy of 1,000 snapshots took {results['destroy_s']:.1f} s; "
              f"freeing right after fio: {results['freeing_after']}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
