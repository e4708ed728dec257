#!/usr/bin/python3
"""READ replies, in clear text or over TLS, byte for byte, from every source the server reads
from.

Usage: reads.py write URI     (fills the volume; run on a fresh 8 MiB volume)
       reads.py read URI      (after a server restart: nothing dirty, nothing cached)

The server sends a large READ's data straight from the data cache's blocks (shared, not
copied into the reply: one sendmsg of the header and the blocks in clear text, encrypted
from them over TLS) when it can, and from its reply buffer otherwise: a block not cached
yet, dirty data, a hole, or a reply with a hole chunk to lay out. `read` reads the volume
three times over (the first pass fills the cache, the later ones hit it) with requests that
start and end inside blocks, up to 4 MiB + 512 bytes (more pieces than one sendmsg takes
with 4 KiB blocks), over structured replies (with and without DF) and simple replies, then
writes inside cached blocks and reads across them (dirty and cached parts in one reply).
Every reply is compared with what was written. URIs are nbd:// or nbds:// (which may carry
tls-certificates=DIR). Exits non-zero with a message on the first difference.
"""

import random
import sys

import nbd

KIB = 1024
MIB = 1024 * KIB
SIZE = 8 * MIB
# (offset, length) written as zeros: whole blocks trimmed to a hole, and zeros written as
# data inside blocks (a 4 KiB piece that reads as zeros inside data, and a smaller run).
ZERO_HOLE = (1 * MIB, 256 * KIB)
ZERO_DATA = [(3 * MIB + 4 * KIB, 4 * KIB), (5 * MIB + 100, 3000)]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expected():
    data = bytearray(random.Random(21).randbytes(SIZE))
    for off, length in [ZERO_HOLE, *ZERO_DATA]:
        data[off:off + length] = bytes(length)
    return data


def connect(uri, structured=True):
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)
    h.set_request_structured_replies(structured)
    h.connect_uri(uri)
    check(h.get_size() == SIZE, "export size %d" % h.get_size())
    check(h.get_structured_replies_negotiated() == structured, "structured replies")
    return h


def write(uri):
    h = connect(uri)
    data = expected()
    for off in range(0, SIZE, MIB):
        h.pwrite(bytes(data[off:off + MIB]), off)
    h.trim(ZERO_HOLE[1], ZERO_HOLE[0])
    for off, length in ZERO_DATA:
        h.pwrite(bytes(length), off)
    h.flush()
    h.shutdown()


def one_chunk(n):
    """A chunk callback checking that a DF read comes as one data chunk of `n` bytes."""
    def chunk(subbuf, off, status, err):
        check(status == nbd.READ_DATA and len(subbuf) == n, "DF read not one data chunk")
        return 0
    return chunk


def read_all(h, data, size, start, flags=0):
    """Reads [start, SIZE) in requests of `size` bytes, several in flight; compares each."""
    pending = []
    off = start
    while off < SIZE or pending:
        while off < SIZE and len(pending) < 8:
            n = min(size, SIZE - off)
            buf = nbd.Buffer(n)
            if flags:
                # DF is a flag of structured reads only; one data chunk is then expected.
                cookie = h.aio_pread_structured(buf, off, one_chunk(n), flags=flags)
            else:
                cookie = h.aio_pread(buf, off)
            pending.append((cookie, buf, off, n))
            off += n
        h.poll(-1)
        for item in list(pending):
            cookie, buf, o, n = item
            if h.aio_command_completed(cookie):
                got = buf.to_bytearray()
                if got != data[o:o + n]:
                    first = next(i for i in range(n) if got[i] != data[o + i])
                    raise AssertionError("READ %d+%d (flags %d) differs at byte %d"
                                         % (o, n, flags, o + first))
                pending.remove(item)


def read(uri):
    data = expected()
    for structured, flags in [(True, 0), (False, 0), (True, nbd.CMD_FLAG_DF)]:
        h = connect(uri, structured)
        # Cold (misses), then cached, with requests aligned and not to the 16K blocks; READs
        # of one block's length (sent from the cache's blocks) and of a sector less (copied).
        for size, start in [(128 * KIB, 0), (128 * KIB + 4 * KIB, 512), (MIB, 4096),
                            (32 * KIB + 512, 7 * KIB), (4 * MIB + 512, 512),
                            (16 * KIB, 0), (16 * KIB, 4096), (16 * KIB - 512, 7 * KIB)]:
            read_all(h, data, size, start, flags)
        check(data[:512] == h.pread(512, 0), "the first 512 bytes")
        h.shutdown()
    # Dirty pieces inside cached blocks: one reply with shared and copied parts.
    h = connect(uri)
    rnd = random.Random(22)
    for off in range(16 * KIB + 4 * KIB, SIZE, 512 * KIB):
        piece = rnd.randbytes(4 * KIB)
        h.pwrite(piece, off)
        data[off:off + len(piece)] = piece
    for size, start in [(128 * KIB, 0), (256 * KIB + 512, 1000)]:
        read_all(h, data, size, start)
    h.shutdown()
    print("reads: all reads identical")


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[1]](sys.argv[2])
