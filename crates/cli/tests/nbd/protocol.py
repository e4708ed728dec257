#!/usr/bin/python3
"""Drives oxpool's NBD server with libnbd and checks every reply.

Usage: protocol.py RW_URI RO_URI

RW_URI names a fresh, writable export of 64 MiB with volblocksize 16K; RO_URI a read-only
export. Covers structured replies (data and hole chunks, DF), base:allocation block status
(REQ_ONE), FUA, trim, write-zeroes (NO_HOLE, FAST_ZERO), cache, flush, many requests in
flight, simple replies, and every error the server answers (each followed by a request that
must still work). Exits non-zero with a message on the first failure.
"""

import errno
import os
import random
import sys

import nbd

KIB = 1024
MIB = 1024 * KIB
BLOCK = 16 * KIB
SIZE = 64 * MIB


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def connect(uri, structured=True, strict=True):
    h = nbd.NBD()
    h.set_request_structured_replies(structured)
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if not strict:
        # Let libnbd send what it would refuse itself, to see the server's answer.
        h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


def chunks_of(h, count, offset, flags=0):
    """pread_structured: returns (data, [(offset, length, kind)]) in arrival order."""
    chunks = []

    def chunk(subbuf, off, status, err):
        kind = {nbd.READ_DATA: "data", nbd.READ_HOLE: "hole"}.get(status, "error")
        chunks.append((off, len(subbuf), kind))
        if kind == "hole":
            check(subbuf == bytes(len(subbuf)), "hole chunk buffer is not zeros")
        return 0

    data = h.pread_structured(count, offset, chunk, flags)
    return data, chunks


def extents_of(h, count, offset, flags=0):
    """block_status: [(offset, length, flags)] for base:allocation."""
    out = []

    def extent(metacontext, off, entries, err):
        check(metacontext == nbd.CONTEXT_BASE_ALLOCATION, "unexpected context " + metacontext)
        pos = off
        for i in range(0, len(entries), 2):
            out.append((pos, entries[i], entries[i + 1]))
            pos += entries[i]
        return 0

    h.block_status(count, offset, extent, flags)
    return out


def expect_error(expected, what, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except nbd.Error as e:
        check(e.errnum == expected,
              "%s: expected %s, got %s (%s)" % (what, errno.errorcode[expected], e.errno, e.string))
        return
    raise AssertionError("%s: expected %s, but it succeeded" % (what, errno.errorcode[expected]))


def pattern(seed, length):
    return random.Random(seed).randbytes(length)


def test_flags(h, ro):
    check(h.get_structured_replies_negotiated(), "structured replies not negotiated")
    check(h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation not negotiated")
    for name in ["can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_cache",
                 "can_multi_conn", "can_df"]:
        check(getattr(h, name)(), name + " is false on the writable export")
    check(not h.is_read_only(), "writable export says read-only")
    check(h.get_size() == SIZE, "size %d" % h.get_size())
    check(ro.is_read_only(), "read-only export not flagged READ_ONLY")
    check(not ro.can_trim() and not ro.can_zero(), "read-only export advertises trim/zero")
    check(ro.can_multi_conn() and ro.can_flush(), "read-only export lacks multi-conn/flush")


def test_holes_and_data(h):
    # A fresh volume is one hole.
    ext = extents_of(h, SIZE, 0)
    check(ext and ext[0][0] == 0 and ext[0][2] == nbd.STATE_HOLE | nbd.STATE_ZERO,
          "fresh volume is not a hole: %r" % ext[:3])
    data, chunks = chunks_of(h, 256 * KIB, 0)
    check(data == bytes(256 * KIB), "fresh read is not zeros")
    check(all(kind == "hole" for _, _, kind in chunks), "fresh read sent data: %r" % chunks)

    # 64 KiB of data at 1 MiB (FUA), then a read across it: hole, data, hole, in order.
    payload = pattern(1, 64 * KIB)
    h.pwrite(payload, 1 * MIB, nbd.CMD_FLAG_FUA)
    start = 1 * MIB - BLOCK
    data, chunks = chunks_of(h, 64 * KIB + 2 * BLOCK, start)
    check(data == bytes(BLOCK) + payload + bytes(BLOCK), "read across the write differs")
    kinds = [(off - start, length, kind) for off, length, kind in sorted(chunks)]
    check(kinds == [(0, BLOCK, "hole"), (BLOCK, 64 * KIB, "data"), (BLOCK + 64 * KIB, BLOCK, "hole")],
          "chunks %r" % kinds)

    # DF: one chunk for the same range.
    data, chunks = chunks_of(h, 64 * KIB + 2 * BLOCK, start, nbd.CMD_FLAG_DF)
    check(len(chunks) == 1 and data == bytes(BLOCK) + payload + bytes(BLOCK),
          "DF read: %r" % chunks)

    # Block status matches; REQ_ONE gives exactly one extent.
    ext = extents_of(h, 4 * MIB, 0)
    want_data = [(1 * MIB, 64 * KIB)]
    got_data = [(off, length) for off, length, fl in ext if fl == 0]
    check(got_data == want_data, "data extents %r" % ext)
    check(sum(length for _, length, _ in ext) >= 4 * MIB or ext[-1][0] + ext[-1][1] <= SIZE,
          "extents do not cover a prefix")
    one = extents_of(h, 4 * MIB, 0, nbd.CMD_FLAG_REQ_ONE)
    check(len(one) == 1 and one[0] == (0, 1 * MIB, 3), "REQ_ONE: %r" % one)
    one = extents_of(h, 16 * KIB, 1 * MIB, nbd.CMD_FLAG_REQ_ONE)
    check(len(one) == 1 and one[0][2] == 0 and 0 < one[0][1] <= 16 * KIB, "REQ_ONE data: %r" % one)

    # Trim the second block of the write: a hole again, reading zeros.
    h.trim(BLOCK, 1 * MIB + BLOCK, nbd.CMD_FLAG_FUA)
    ext = extents_of(h, 64 * KIB, 1 * MIB)
    check(ext[:3] == [(1 * MIB, BLOCK, 0), (1 * MIB + BLOCK, BLOCK, 3), (1 * MIB + 2 * BLOCK, 2 * BLOCK, 0)],
          "after trim: %r" % ext)
    expect = payload[:BLOCK] + bytes(BLOCK) + payload[2 * BLOCK:]
    check(h.pread(64 * KIB, 1 * MIB) == expect, "read after trim")

    # Write-zeroes: NO_HOLE, FAST_ZERO, FUA, and an unaligned one.
    h.zero(BLOCK, 1 * MIB + 2 * BLOCK, nbd.CMD_FLAG_NO_HOLE)
    h.zero(BLOCK, 1 * MIB + 3 * BLOCK, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_FUA)
    check(h.pread(64 * KIB, 1 * MIB) == payload[:BLOCK] + bytes(3 * BLOCK), "read after zero")
    h.pwrite(pattern(2, 3 * BLOCK), 2 * MIB)
    h.zero(1000, 2 * MIB + 5)
    want = bytearray(pattern(2, 3 * BLOCK))
    want[5:1005] = bytes(1000)
    check(h.pread(3 * BLOCK, 2 * MIB) == bytes(want), "unaligned zero")

    # Unaligned write and read.
    odd = pattern(3, 12345)
    h.pwrite(odd, 3 * MIB + 777)
    check(h.pread(12345, 3 * MIB + 777) == odd, "unaligned read back")
    check(h.pread(777, 3 * MIB) == bytes(777), "bytes before the unaligned write")

    # Cache and flush succeed.
    h.cache(1 * MIB, 0)
    h.flush()


def test_in_flight(h):
    # 128 writes then 128 reads in flight at once; completions come in any order.
    count, length = 128, 8 * KIB
    base = 8 * MIB
    bufs = []
    for i in range(count):
        buf = nbd.Buffer.from_bytearray(bytearray(pattern(100 + i, length)))
        bufs.append(buf)
        h.aio_pwrite(buf, base + i * length)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    reads = []
    for i in range(count):
        buf = nbd.Buffer(length)
        reads.append(buf)
        h.aio_pread(buf, base + i * length)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for i in range(count):
        check(reads[i].to_bytearray() == bytearray(pattern(100 + i, length)), "aio read %d" % i)
    # One large request at the maximum size.
    big = pattern(7, 32 * MIB)
    h.pwrite(big, 16 * MIB)
    check(h.pread(32 * MIB, 16 * MIB) == big, "32 MiB read back")


def test_errors(uri, ro_uri):
    h = connect(uri, strict=False)
    ok = lambda: check(h.pread(512, 0) is not None, "connection unusable after an error")
    expect_error(errno.EINVAL, "read past the end", h.pread, 4096, SIZE - 1024)
    ok()
    expect_error(errno.ENOSPC, "write past the end", h.pwrite, bytes(4096), SIZE - 1024)
    ok()
    expect_error(errno.ENOSPC, "zero past the end", h.zero, 4096, SIZE)
    ok()
    expect_error(errno.EINVAL, "trim past the end", h.trim, 4096, SIZE)
    ok()
    expect_error(errno.EINVAL, "cache past the end", h.cache, 4096, SIZE)
    ok()
    expect_error(errno.EINVAL, "block status past the end", extents_of, h, 4096, SIZE)
    ok()
    expect_error(errno.EINVAL, "offset overflow", h.pread, 4096, 2**64 - 2048)
    ok()
    expect_error(errno.EINVAL, "zero-length read", h.pread, 0, 0)
    ok()
    expect_error(errno.EINVAL, "zero-length write", h.pwrite, b"", 0)
    ok()
    expect_error(errno.EINVAL, "read over 32 MiB", h.pread, 32 * MIB + 1, 0)
    ok()
    expect_error(errno.EINVAL, "NO_HOLE on a read", h.pread, 512, 0, nbd.CMD_FLAG_NO_HOLE)
    ok()
    expect_error(errno.EINVAL, "REQ_ONE on a write", h.pwrite, bytes(512), 0, nbd.CMD_FLAG_REQ_ONE)
    ok()
    expect_error(errno.EINVAL, "FAST_ZERO on a trim", h.trim, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
    ok()
    h.shutdown()

    ro = connect(ro_uri, strict=False)
    expect_error(errno.EPERM, "write to read-only", ro.pwrite, bytes(512), 0)
    expect_error(errno.EPERM, "trim on read-only", ro.trim, 4096, 0)
    expect_error(errno.EPERM, "zero on read-only", ro.zero, 4096, 0)
    check(ro.pread(4096, 0) == bytes(4096), "read on read-only")
    ro.flush()
    ro.shutdown()

    # Without structured replies: simple replies for data and errors; no block status.
    s = connect(uri, structured=False, strict=False)
    check(not s.get_structured_replies_negotiated(), "structured replies negotiated anyway")
    check(s.pread(64 * KIB, 1 * MIB)[:BLOCK] == pattern(1, BLOCK), "simple read")
    expect_error(errno.EINVAL, "simple: read past the end", s.pread, 4096, SIZE)
    expect_error(errno.ENOSPC, "simple: write past the end", s.pwrite, bytes(4096), SIZE)
    check(s.pread(512, 0) == bytes(512), "simple reply after errors")
    s.shutdown()


def main():
    uri, ro_uri = sys.argv[1], sys.argv[2]
    h = connect(uri)
    ro = connect(ro_uri)
    test_flags(h, ro)
    test_holes_and_data(h)
    test_in_flight(h)
    test_errors(uri, ro_uri)
    ro.shutdown()
    h.shutdown()
    print("protocol: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, nbd.Error) as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
