#!/usr/bin/python3
"""Writes data that must survive a kill -9, or checks that it did.

Usage: durable.py write URI SEED   -> writes, FLUSHes, writes with FUA, prints "durable: ok"
       durable.py verify URI SEED  -> reads both back and checks them

What must survive: every write answered before a FLUSH was answered, and every FUA write
that was answered.
"""

import random
import sys

import nbd

def extents(seed, size):
    rng = random.Random(seed)
    out = []
    for i in range(16):
        length = rng.randint(1, 512 * 1024)
        offset = rng.randrange(0, size - length)
        fua = i >= 12  # the last four are FUA writes after the FLUSH
        out.append((offset, rng.randbytes(length), fua))
    return out


def main():
    mode, uri, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    # Later extents may overlap earlier ones: apply in order to know the expected bytes.
    plan = extents(seed, size)
    if mode == "write":
        for offset, data, fua in plan:
            if fua:
                continue
            h.pwrite(data, offset)
        h.flush()
        for offset, data, fua in plan:
            if fua:
                h.pwrite(data, offset, nbd.CMD_FLAG_FUA)
        print("durable: ok", flush=True)
        # No disconnect: the server is killed while this connection is still open.
        return
    # The export's expected contents where the plan wrote (a 64 MiB model is cheap).
    model = bytearray(size)
    order = [e for e in plan if not e[2]] + [e for e in plan if e[2]]
    for offset, data, _ in order:
        model[offset:offset + len(data)] = data
    for offset, data, _ in plan:
        got = h.pread(len(data), offset)
        want = bytes(model[offset:offset + len(data)])
        if got != want:
            bad = next(i for i in range(len(data)) if got[i] != want[i])
            print("FAIL: %d+%d differs at +%d" % (offset, len(data), bad), file=sys.stderr)
            sys.exit(1)
    h.shutdown()
    print("durable: verified")


if __name__ == "__main__":
    try:
        main()
    except nbd.Error as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
