#!/usr/bin/python3
"""Asks a real oxpool serve for change-map metadata contexts through libnbd.

Usage: meta_contexts.py URI [SNAP...]

URI names a writable export whose lineage has exactly the snapshots SNAP... (oldest first;
none is fine) and none named `nope`. Listing `oxpool:` or `oxpool:changed-since:` finds
exactly their change maps, listing everything names base:allocation and them; a change map
since an unknown snapshot (`nope`) or a bookmark (`#weekly`: bookmarks do not exist yet) is
cleanly not offered: asked beside base:allocation, only base:allocation (and the real ones)
is selected and BLOCK_STATUS works as before; asked alone, nothing is selected, and
BLOCK_STATUS is refused with EINVAL. With a snapshot, selecting its change map beside
base:allocation answers BLOCK_STATUS with both. Exits non-zero with a message on the first
failure.
"""

import errno
import sys

import nbd

KIB = 1024
UNKNOWN = "oxpool:changed-since:nope"
BOOKMARK = "oxpool:changed-since:#weekly"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def listed(uri, queries):
    """LIST_META_CONTEXT with `queries` (libnbd 1.14 sends the contexts added so far)."""
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_uri(uri)
    for query in queries:
        h.add_meta_context(query)
    names = []
    count = h.opt_list_meta_context(lambda name: names.append(name) or 0)
    check(count == len(names), "count %d for %r" % (count, names))
    h.opt_abort()
    return names


def main():
    uri = sys.argv[1]
    offered = ["oxpool:changed-since:" + snap for snap in sys.argv[2:]]

    got = listed(uri, [])
    check(got == [nbd.CONTEXT_BASE_ALLOCATION] + offered, "list everything found %r" % got)
    for queries in (["oxpool:"], ["oxpool:changed-since:"]):
        got = listed(uri, queries)
        check(got == offered, "list %r found %r" % (queries, got))
    got = listed(uri, [UNKNOWN, BOOKMARK])
    check(got == [], "list of the unknown and the bookmark found %r" % got)
    got = listed(uri, ["oxpool:", "base:"])
    check(got == [nbd.CONTEXT_BASE_ALLOCATION] + offered, "list oxpool: and base: found %r" % got)

    # Asked beside base:allocation: not offered, base:allocation (and the real ones) served.
    h = nbd.NBD()
    for context in [nbd.CONTEXT_BASE_ALLOCATION, UNKNOWN, BOOKMARK] + offered:
        h.add_meta_context(context)
    h.connect_uri(uri)
    check(h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation not selected")
    check(not h.can_meta_context(UNKNOWN), "a change map since an unknown snapshot selected")
    check(not h.can_meta_context(BOOKMARK), "a bookmark's change map selected without bookmarks")
    for context in offered:
        check(h.can_meta_context(context), "%s not selected" % context)
    seen = []

    def extent(metacontext, offset, entries, err):
        seen.append(metacontext)
        return 0

    h.block_status(64 * KIB, 0, extent)
    check(sorted(seen) == sorted([nbd.CONTEXT_BASE_ALLOCATION] + offered),
          "block status contexts %r" % seen)
    h.shutdown()

    # Asked alone: nothing selected; BLOCK_STATUS is refused by the server (libnbd's own
    # check is off to let the request through).
    h = nbd.NBD()
    h.add_meta_context(UNKNOWN)
    h.set_strict_mode(0)
    h.connect_uri(uri)
    check(not h.can_meta_context(UNKNOWN), "a change map since an unknown snapshot selected")
    try:
        h.block_status(64 * KIB, 0, extent)
    except nbd.Error as e:
        check(e.errnum == errno.EINVAL, "expected EINVAL, got %s (%s)" % (e.errno, e.string))
    else:
        raise AssertionError("block status without a selected context succeeded")
    # The connection goes on.
    h.pread(4096, 0)
    h.shutdown()
    print("meta_contexts: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, nbd.Error) as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
