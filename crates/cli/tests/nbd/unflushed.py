#!/usr/bin/python3
"""`unflushed.py write URI SEED`: one 64 KiB write at offset 0, without FUA, without FLUSH;
then the connection is dropped. `unflushed.py check URI SEED`: prints "present" if offset 0
holds that write, "absent" otherwise."""
import random
import sys

import nbd

mode, uri, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = random.Random(seed).randbytes(65536)
h = nbd.NBD()
h.connect_uri(uri)
if mode == "write":
    h.pwrite(data, 0)
    print("written", flush=True)
else:
    print("present" if h.pread(65536, 0) == data else "absent", flush=True)
