#!/usr/bin/env python3
"""Goal 5's lockstep, seen from the server: a timeline of the reactor's io_uring operations
and the disk's requests in 100 us bins.

    perf record -a -e io_uring:io_uring_submit_req -e io_uring:io_uring_complete \
        -e block:block_rq_issue -e block:block_rq_complete -o g5b.data -- sleep 0.5
    perf script -i g5b.data > g5b.txt
    timeline.py g5b.txt [START_S] [SPAN_MS]

s<OP>: the reactor submitted OP; c<OP>: its completion was posted to the ring (TIMER: an
injected delay's timeout expired, result -ETIME); block_rq_*: the guest disk's requests.
fio's own io_uring events are left out (fio's nbd engine is libnbd, which does not use one).
"""
import collections
import re
import sys

path = sys.argv[1]
start_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
span_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 12.0
events = []
for line in open(path):
    m = re.search(r"\] (\d+\.\d+):\s+(\S+): (.*)", line)
    if not m:
        continue
    t, name, rest = float(m.group(1)), m.group(2), m.group(3)
    comm = line.split()[0]
    if name.startswith("block:"):
        events.append((t, name.split(":")[1], None, None, None))
        continue
    mm = re.search(r"user_data (0x[0-9a-f]+), (?:result (-?\d+)|opcode (\w+))", rest)
    if not mm or comm.startswith("fio"):
        continue
    events.append((t, name.split(":")[1], mm.group(1), mm.group(2), mm.group(3)))
if not events:
    sys.exit("no events")
opcode = {}
for e in events:
    if e[1] == "io_uring_submit_req":
        opcode[e[2]] = e[4]
t0 = events[0][0] + start_s
bins = collections.defaultdict(collections.Counter)
for t, name, user_data, result, op in events:
    if not t0 <= t <= t0 + span_ms / 1000:
        continue
    b = int((t - t0) * 1e4)
    if name == "io_uring_submit_req":
        bins[b]["s" + op] += 1
    elif name == "io_uring_complete":
        bins[b]["c" + ("TIMER" if result == "-62" else opcode.get(user_data, "?"))] += 1
    else:
        bins[b][name] += 1
for b in range(int(span_ms * 10)):
    if bins[b]:
        print(f"{b / 10:5.1f} ms", " ".join(f"{k}={v}" for k, v in sorted(bins[b].items())))
