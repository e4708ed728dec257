#!/usr/bin/python3
"""Asks a real oxpool serve for change-map metadata contexts through libnbd.

Usage: meta_contexts.py URI

URI names a writable export with no snapshots. Until the engine provides change maps, the
server offers none: listing `oxpool:` or `oxpool:changed-since:` finds nothing (and still
ends cleanly), listing everything names only base:allocation, and selecting
`oxpool:changed-since:SNAP` or `...:#BOOKMARK` beside base:allocation selects only
base:allocation, whose BLOCK_STATUS then works as before; selecting a change map alone
selects nothing, and BLOCK_STATUS is refused with EINVAL. Exits non-zero with a message on
the first failure.
"""

import errno
import sys

import nbd

KIB = 1024
SNAP = "oxpool:changed-since:monday"
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

    check(listed(uri, []) == [nbd.CONTEXT_BASE_ALLOCATION], "list everything")
    for queries in (["oxpool:"], ["oxpool:changed-since:"], [SNAP, BOOKMARK]):
        got = listed(uri, queries)
        check(got == [], "list %r found %r" % (queries, got))
    got = listed(uri, ["oxpool:", "base:"])
    check(got == [nbd.CONTEXT_BASE_ALLOCATION], "list oxpool: and base: found %r" % got)

    # Asked beside base:allocation: not offered, base:allocation still served.
    h = nbd.NBD()
    for context in (nbd.CONTEXT_BASE_ALLOCATION, SNAP, BOOKMARK):
        h.add_meta_context(context)
    h.connect_uri(uri)
    check(h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation not selected")
    check(not h.can_meta_context(SNAP), "a snapshot's change map selected without snapshots")
    check(not h.can_meta_context(BOOKMARK), "a bookmark's change map selected without bookmarks")
    seen = []

    def extent(metacontext, offset, entries, err):
        seen.append(metacontext)
        return 0

    h.block_status(64 * KIB, 0, extent)
    check(seen == [nbd.CONTEXT_BASE_ALLOCATION], "block status contexts %r" % seen)
    h.shutdown()

    # Asked alone: nothing selected; BLOCK_STATUS is refused by the server (libnbd's own
    # check is off to let the request through).
    h = nbd.NBD()
    h.add_meta_context(SNAP)
    h.set_strict_mode(0)
    h.connect_uri(uri)
    check(not h.can_meta_context(SNAP), "a change map selected without snapshots")
    try:
        h.block_status(64 * KIB, 0, extent)
    except nbd.Error as e:
        check(e.errnum == errno.EINVAL, "expected EINVAL, got %s (%s)" % (e.errno, e.string))
    else:
        raise AssertionError("block status without a selected context succeeded")
    # The connection goes on.
    check(h.pread(4096, 0) == bytes(4096), "read after the refused block status")
    h.shutdown()
    print("meta_contexts: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, nbd.Error) as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
