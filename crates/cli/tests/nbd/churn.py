#!/usr/bin/python3
"""A client that writes until the server dies, printing what it was promised.

Usage: churn.py write URI SEED   -> writes 32 KiB records into distinct slots, forever: every
                                   third one with FUA, the others in pairs followed by a FLUSH;
                                   prints "durable N" for each slot the server promised (FUA
                                   answered, or written before an answered FLUSH)
       churn.py verify URI SEED N... -> checks that every listed slot holds its record
"""

import random
import sys

import nbd

SLOT_BYTES = 32 * 1024


def record(seed, slot):
    return random.Random(seed * 1_000_003 + slot).randbytes(SLOT_BYTES)


def main():
    mode, uri, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    h = nbd.NBD()
    h.connect_uri(uri)
    slots = h.get_size() // SLOT_BYTES
    if mode == "write":
        unflushed = []
        slot = 0
        while slot < slots:
            data = record(seed, slot)
            if slot % 3 == 0:
                h.pwrite(data, slot * SLOT_BYTES, nbd.CMD_FLAG_FUA)
                print("durable %d" % slot, flush=True)
            else:
                h.pwrite(data, slot * SLOT_BYTES)
                unflushed.append(slot)
                if len(unflushed) == 2:
                    h.flush()
                    for s in unflushed:
                        print("durable %d" % s, flush=True)
                    unflushed = []
            slot += 1
        print("done", flush=True)
        return
    for s in map(int, sys.argv[4:]):
        got = h.pread(SLOT_BYTES, s * SLOT_BYTES)
        if got != record(seed, s):
            print("FAIL: slot %d lost" % s, file=sys.stderr)
            sys.exit(1)
    h.shutdown()
    print("verified %d" % (len(sys.argv) - 4))


if __name__ == "__main__":
    main()
