#!/usr/bin/python3
"""A well-behaved client that keeps verifying its data while others misbehave.

Usage: healthy.py URI ITERATIONS SEED

Two connections to the same export: each iteration writes a random extent on the first
(sometimes with FUA), reads it back on the second (after a FLUSH on the first every few
iterations: multi-conn consistency), and checks every byte. Prints "healthy: N iterations" and
exits 0 on success.
"""

import random
import sys

import nbd

KIB = 1024


def main():
    uri, iterations, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    writer = nbd.NBD()
    writer.connect_uri(uri)
    reader = nbd.NBD()
    reader.connect_uri(uri)
    size = writer.get_size()
    # Work in the upper half of the export, away from the malformed clients' writes.
    base = size // 2
    for i in range(iterations):
        length = rng.randint(1, 256 * KIB)
        offset = base + rng.randrange(0, size - base - length)
        data = rng.randbytes(length)
        flags = nbd.CMD_FLAG_FUA if i % 3 == 0 else 0
        writer.pwrite(data, offset, flags)
        if i % 4 == 0:
            writer.flush()
            got = reader.pread(length, offset)
        else:
            got = writer.pread(length, offset)
        if got != data:
            print("FAIL: iteration %d: data at %d+%d differs" % (i, offset, length), file=sys.stderr)
            sys.exit(1)
    writer.shutdown()
    reader.shutdown()
    print("healthy: %d iterations" % iterations)


if __name__ == "__main__":
    try:
        main()
    except nbd.Error as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
