#!/usr/bin/python3
"""Change maps of a real oxpool serve, through libnbd (`oxpool:changed-since:SNAP`).

Usage:
  change_maps.py fill URI SEED           write the whole export with random bytes, flush
  change_maps.py change URI SEED LO HI   random writes (some unaligned), trims, write-zeroes
                                         and a partial refill of a trimmed range, none of
                                         them touching bytes [LO, HI); flush
  change_maps.py map URI SNAP            print the change map since SNAP: one line
                                         "OFFSET LENGTH FLAGS" per run (adjacent runs with the
                                         same flags joined)
  change_maps.py backup HEAD SNAPURI SNAP
                                         the incremental backup loop: read the snapshot's
                                         bytes through its export SNAPURI (the old copy), then
                                         copy onto it only the extents HEAD's change map since
                                         SNAP flags, read from HEAD; the copy must then equal
                                         HEAD byte for byte. Prints what it copied.
  change_maps.py across URI SNAP OFFSET  one connection with the map since SNAP selected
                                         across an administrative change: writes 4 KiB of
                                         0x11 at 0, flushes, prints "open", waits for a line
                                         on stdin, writes 4 KiB of 0x22 at OFFSET, flushes,
                                         then prints the map as "map" does, on the same
                                         connection

Exits non-zero with a message on the first failure.
"""

import random
import sys

import nbd

MIB = 1024 * 1024
# Largest read or write one request makes (the server's limit is larger).
CHUNK = 4 * MIB
CHANGED = 1


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def context(snap):
    return "oxpool:changed-since:" + snap


def connect(uri, contexts=()):
    h = nbd.NBD()
    for c in contexts:
        h.add_meta_context(c)
    h.connect_uri(uri)
    for c in contexts:
        check(h.can_meta_context(c), "%s not selected on %s" % (c, uri))
    return h


def read_all(h):
    size = h.get_size()
    out = bytearray(size)
    for off in range(0, size, CHUNK):
        n = min(CHUNK, size - off)
        out[off:off + n] = h.pread(n, off)
    return out


def change_map(h, snap):
    """[(offset, length, flags)] over the whole export, adjacent equal runs joined."""
    name = context(snap)
    size = h.get_size()
    runs = []
    pos = 0
    # Bounded: every reply covers at least one byte (checked).
    while pos < size:
        got = []

        def extent(metacontext, offset, entries, err):
            if metacontext == name:
                check(offset == pos, "reply for %d, asked %d" % (offset, pos))
                got.extend(zip(entries[0::2], entries[1::2]))
            return 0

        h.block_status(min(size - pos, 1 << 30), pos, extent)
        check(got, "no extent of %s at %d" % (name, pos))
        for length, flags in got:
            check(length > 0, "empty extent at %d" % pos)
            check(flags & ~CHANGED == 0, "unknown flags %#x at %d" % (flags, pos))
            if runs and runs[-1][2] == flags and runs[-1][0] + runs[-1][1] == pos:
                runs[-1] = (runs[-1][0], runs[-1][1] + length, flags)
            else:
                runs.append((pos, length, flags))
            pos += length
    check(pos == size, "the map covers %d of %d bytes" % (pos, size))
    return runs


def fill(uri, seed):
    h = connect(uri)
    rng = random.Random(seed)
    size = h.get_size()
    for off in range(0, size, CHUNK):
        n = min(CHUNK, size - off)
        h.pwrite(rng.randbytes(n), off)
    h.flush()
    h.shutdown()
    print("fill: %d bytes" % size)


def change(uri, seed, lo, hi):
    h = connect(uri)
    rng = random.Random(seed)
    size = h.get_size()

    def outside(off, n):
        return off + n <= lo or off >= hi

    def pick(most):
        # Bounded in practice: the untouched range is a small part of the export.
        for _ in range(10000):
            n = rng.randint(1, most)
            off = rng.randrange(0, size - n)
            if outside(off, n):
                return off, n
        raise AssertionError("no room outside [%d, %d)" % (lo, hi))

    ops = {"write": 0, "trim": 0, "zero": 0}
    for _ in range(60):
        kind = rng.choice(["write", "write", "trim", "zero"])
        off, n = pick(MIB if kind != "write" else 256 * 1024)
        if kind == "write":
            h.pwrite(rng.randbytes(n), off)
        elif kind == "trim":
            h.trim(n, off)
        else:
            h.zero(n, off)
        ops[kind] += 1
    # A trimmed range partly written again.
    off, _ = pick(2 * MIB)
    h.trim(2 * MIB, off)
    h.pwrite(rng.randbytes(100 * 1024 + 7), off + 12345)
    h.flush()
    h.shutdown()
    print("change: %r and a partial refill" % ops)


def print_map(uri, snap):
    h = connect(uri, [context(snap)])
    for off, length, flags in change_map(h, snap):
        print("%d %d %d" % (off, length, flags))
    h.shutdown()


def backup(head_uri, snap_uri, snap):
    old = connect(snap_uri)
    copy = read_all(old)
    old.shutdown()
    head = connect(head_uri, [context(snap)])
    check(head.get_size() == len(copy), "sizes differ")
    copied = 0
    for off, length, flags in change_map(head, snap):
        if not flags & CHANGED:
            continue
        for at in range(off, off + length, CHUNK):
            n = min(CHUNK, off + length - at)
            copy[at:at + n] = head.pread(n, at)
        copied += length
    now = read_all(head)
    head.shutdown()
    if copy != now:
        first = next(i for i in range(len(now)) if copy[i] != now[i])
        raise AssertionError("the copy differs from the head at byte %d" % first)
    print("backup: copied %d of %d bytes; identical" % (copied, len(now)))


def across(uri, snap, offset):
    h = connect(uri, [context(snap)])
    h.pwrite(b"\x11" * 4096, 0)
    h.flush()
    print("open", flush=True)
    sys.stdin.readline()
    h.pwrite(b"\x22" * 4096, offset)
    h.flush()
    for off, length, flags in change_map(h, snap):
        print("%d %d %d" % (off, length, flags))
    h.shutdown()


def main():
    mode = sys.argv[1]
    if mode == "fill":
        fill(sys.argv[2], int(sys.argv[3]))
    elif mode == "change":
        change(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "map":
        print_map(sys.argv[2], sys.argv[3])
    elif mode == "across":
        across(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "backup":
        backup(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise AssertionError("unknown mode %r" % mode)


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, nbd.Error) as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
