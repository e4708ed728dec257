#!/usr/bin/python3
"""A database's commits: small writes, each followed by a FLUSH, one at a time.

Usage: commits.py URI SEED N -> N times: a 4 KiB write then a FLUSH; then reads every write
                                back; prints "commits: ok"
"""

import random
import sys

import nbd


def main():
    uri, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    blocks = h.get_size() // 4096
    written = {}
    for _ in range(n):
        at = rng.randrange(blocks) * 4096
        data = rng.randbytes(4096)
        h.pwrite(data, at)
        h.flush()
        written[at] = data
    for at, data in written.items():
        if h.pread(4096, at) != data:
            print("FAIL: the write at %d reads back wrong" % at, file=sys.stderr)
            sys.exit(1)
    h.shutdown()
    print("commits: ok")


if __name__ == "__main__":
    main()
