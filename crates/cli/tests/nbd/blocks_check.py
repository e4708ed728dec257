#!/usr/bin/python3
"""Reads an export block by block and compares each block with the expected image.

Usage: blocks_check.py URI IMAGE_FILE BLOCK_BYTES

A block that reads must equal the image's bytes there; a block may also fail with EIO (its
data is damaged beyond repair). Prints "ok N eio M" and, on the next line, the byte offsets
of the blocks that failed, space-separated. Exits 1 if any block came back with wrong
bytes or failed with another error.
"""

import errno
import sys

import nbd


def main():
    uri, image_file, block = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(image_file, "rb") as f:
        image = f.read()
    h = nbd.NBD()
    h.connect_uri(uri)
    assert h.get_size() == len(image), f"export of {h.get_size()} bytes, image {len(image)}"
    ok, failed, wrong = 0, [], []
    for offset in range(0, len(image), block):
        try:
            data = h.pread(block, offset)
        except nbd.Error as e:
            # libnbd gives the errno as a number or, in some versions, as its name.
            if e.errno not in (errno.EIO, "EIO"):
                print(f"block at {offset}: {e}", file=sys.stderr)
                sys.exit(1)
            failed.append(offset)
            continue
        if data != image[offset:offset + block]:
            wrong.append(offset)
        else:
            ok += 1
    h.shutdown()
    if wrong:
        print(f"wrong bytes in the blocks at {wrong[:20]}", file=sys.stderr)
        sys.exit(1)
    print(f"ok {ok} eio {len(failed)}")
    print(" ".join(str(o) for o in failed))


main()
