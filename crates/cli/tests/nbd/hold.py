#!/usr/bin/python3
"""Holds an export open: writes and flushes a block (unless the second argument is "ro", which
only reads), prints "open", waits for a line on stdin, then tries to read: prints "still
connected" or "disconnected: ERROR". Always exits 0; the test reads what it printed."""
import sys

import nbd

read_only = len(sys.argv) > 2 and sys.argv[2] == "ro"
h = nbd.NBD()
# An nbds:// URI may name the client's certificates directory (tls-certificates=DIR).
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
if read_only:
    h.pread(4096, 0)
else:
    h.pwrite(b"\x5a" * 4096, 0)
    h.flush()
print("open", flush=True)
sys.stdin.readline()
try:
    block = h.pread(4096, 0)
    if not read_only and block != b"\x5a" * 4096:
        print("wrong data", flush=True)
    else:
        print("still connected", flush=True)
except nbd.Error as e:
    print(f"disconnected: {e}", flush=True)
