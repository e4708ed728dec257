#!/usr/bin/python3
"""Change map against a full read (issue 17's figure). A benchmark, not a test.

    bench/change_map.py [--oxpool target/release/oxpool] [--dir /var/tmp] [--size 32G]
                        [--percent 1] [--repeat 3] [--json FILE]

Makes a pool on a sparse file in --dir and a volume of --size (compression off: the fill
is random data anyway), serves it, writes the whole volume once (nbdcopy from nbdkit's
random plugin), snapshots it (@base), then rewrites --percent % of its blocks, chosen at
random over the whole volume (16 KiB each, random data; the worst case for pruning: almost
every level-1 indirect block holds one), and snapshots again so the changes are synced.
Then, --repeat times each, alternating:
  - the change map since @base over the whole volume, through libnbd (BLOCK_STATUS on
    `oxpool:changed-since:base`, one request after another, as a backup tool asks), checked
    to flag exactly the rewritten blocks;
  - a full read of the volume with `nbdcopy URI null:` (several requests in flight: the
    fastest full read an NBD client makes).
Prints the medians and the ratio (goal: the map in under 2 % of the full read's time), and
`nbdinfo --map` once for a command-line figure. The data lives on the host's disk: the
pool's devices are opened O_DIRECT, so the host page cache does not serve the reads.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import nbd

from oxserve import Server, run

KIB = 1024
BLOCK = 16 * KIB


def change_blocks(uri, blocks, seed):
    """Rewrites `blocks` (block numbers) with random data, one write after another."""
    h = nbd.NBD()
    h.connect_uri(uri)
    rng = random.Random(seed)
    data = rng.randbytes(BLOCK)
    for b in blocks:
        h.pwrite(data, b * BLOCK)
    h.flush()
    h.shutdown()


def change_map(uri):
    """The map since @base over the whole volume: (seconds, flagged bytes, extents, requests)."""
    name = "oxpool:changed-since:base"
    h = nbd.NBD()
    h.add_meta_context(name)
    h.connect_uri(uri)
    assert h.can_meta_context(name), "the change map is not offered"
    size = h.get_size()
    flagged = extents = requests = 0
    pos = 0
    start = time.perf_counter()
    # Bounded: every reply covers at least one byte.
    while pos < size:
        got = []

        def extent(metacontext, offset, entries, err):
            if metacontext == name:
                got.extend(zip(entries[0::2], entries[1::2]))
            return 0

        h.block_status(min(size - pos, 1 << 30), pos, extent)
        requests += 1
        assert got, f"no extent at {pos}"
        for length, flags in got:
            if flags & 1:
                flagged += length
                extents += 1
            pos += length
    seconds = time.perf_counter() - start
    h.shutdown()
    return seconds, flagged, extents, requests


def full_read(uri):
    start = time.perf_counter()
    run(["nbdcopy", uri, "null:"])
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oxpool", default="target/release/oxpool")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--size", default="32G")
    ap.add_argument("--percent", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    units = {"G": 1 << 30, "M": 1 << 20}
    size = int(a.size[:-1]) * units[a.size[-1]]
    work = tempfile.mkdtemp(dir=a.dir, prefix="oxchangemap-")
    cache = os.path.join(work, "pools.cache")
    ox = lambda *args: run([a.oxpool, "--cache-file", cache, *args])
    results = {"size_bytes": size, "percent": a.percent}
    try:
        # Room for the volume, the changed blocks the snapshot keeps, and metadata.
        pool_bytes = size + size // 8 + (1 << 30)
        ox("create", "tank", os.path.join(work, "tank.img"), "--size",
           f"{pool_bytes >> 20}M", "--sparse")
        ox("vol", "create", "tank/vol0", "--size", a.size, "-o", "compression=off")
        server = Server(a.oxpool, cache, ["--listen", "127.0.0.1:0"])
        try:
            t = time.perf_counter()
            run(["nbdcopy", "--", "[", "nbdkit", "--exit-with-parent", "-r", "random",
                 f"size={size}", "]", server.uri])
            results["fill_s"] = time.perf_counter() - t
            ox("snapshot", "tank/vol0@base")
            nblocks = size // BLOCK
            changed = random.Random(1).sample(range(nblocks), int(nblocks * a.percent / 100))
            t = time.perf_counter()
            change_blocks(server.uri, changed, 2)
            results["change_s"] = time.perf_counter() - t
            # Synced: the map comes from the tree walk, as for a backup taken later.
            ox("snapshot", "tank/vol0@changed")
            want = len(changed) * BLOCK
            maps, reads = [], []
            for i in range(a.repeat):
                seconds, flagged, extents, requests = change_map(server.uri)
                assert flagged == want, f"flagged {flagged} bytes, changed {want}"
                maps.append(seconds)
                reads.append(full_read(server.uri))
                print(f"round {i + 1}: map {seconds:.3f} s ({extents} extents, {requests} "
                      f"requests), full read {reads[-1]:.1f} s", flush=True)
            t = time.perf_counter()
            run(["nbdinfo", "--map=oxpool:changed-since:base", server.uri])
            results["nbdinfo_map_s"] = time.perf_counter() - t
            results.update(
                changed_blocks=len(changed),
                flagged_extents=extents,
                map_s=maps,
                full_read_s=reads,
            )
        finally:
            server.stop()
        m, r = statistics.median(maps), statistics.median(reads)
        results["ratio"] = m / r
        print(f"volume {a.size}, {a.percent} % of its {nblocks} blocks changed "
              f"({len(changed)} blocks, {extents} extents)")
        print(f"change map since @base: median {m:.3f} s of {a.repeat} "
              f"({', '.join(f'{x:.3f}' for x in maps)})")
        print(f"full read (nbdcopy URI null:): median {r:.1f} s "
              f"({', '.join(f'{x:.1f}' for x in reads)}), {size / r / 1e6:.0f} MB/s")
        print(f"ratio: {100 * m / r:.2f} % of the full read (goal: under 2 %)")
        print(f"nbdinfo --map (prints every extent): {results['nbdinfo_map_s']:.2f} s; "
              f"fill {results['fill_s']:.0f} s, changes {results['change_s']:.1f} s")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
