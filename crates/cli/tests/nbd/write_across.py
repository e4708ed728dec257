#!/usr/bin/python3
"""Writes across an administrative change: connects to the URI (first argument), writes and
flushes block A (0x11) at 0, prints "open", waits for a line on stdin, then on the same
connection writes and flushes block B (0x22) at 4096 and reads both back: prints "wrote"
or "disconnected: ERROR" / "wrong data". Always exits 0; the test reads what it printed."""
import sys

import nbd

h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x11" * 4096, 0)
h.flush()
print("open", flush=True)
sys.stdin.readline()
try:
    h.pwrite(b"\x22" * 4096, 4096)
    h.flush()
    got = h.pread(8192, 0)
    if got != b"\x11" * 4096 + b"\x22" * 4096:
        print("wrong data", flush=True)
    else:
        print("wrote", flush=True)
except nbd.Error as e:
    print(f"disconnected: {e}", flush=True)
