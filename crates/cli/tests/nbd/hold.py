#!/usr/bin/python3
"""Holds an export open: writes and flushes a block, prints "open", waits for a line on stdin,
then tries to read: prints "still connected" or "disconnected: ERROR". Always exits 0; the
test reads what it printed."""
import sys

import nbd

h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 4096, 0)
h.flush()
print("open", flush=True)
sys.stdin.readline()
try:
    if h.pread(4096, 0) != b"\x5a" * 4096:
        print("wrong data", flush=True)
    else:
        print("still connected", flush=True)
except nbd.Error as e:
    print(f"disconnected: {e}", flush=True)
