#!/bin/bash
# Issue 19 goal 5, "true async": 4 ms added to every read of the pool's device (oxpool inject),
# one NBD connection, random reads at iodepth 1 and 64, 4K and 128K. A benchmark, not a test.
#
#   bench/async_latency.sh [OXPOOL_BINARY]     (default target/release/oxpool)
#   DELAY_MS=20 bench/async_latency.sh         (the added latency, default 4 ms)
#   REFERENCE=nbdkit bench/async_latency.sh    (also the same cells against a server that only
#                                               sleeps: nbdkit memory + delay filter)
#   SCHEDULER=on bench/async_latency.sh        (the pool's vdev queue mode, default auto)
#   JITTER=1 bench/async_latency.sh            (DELAY_MS-1, DELAY_MS or DELAY_MS+1 ms per read,
#                                               drawn per read, instead of exactly DELAY_MS)
#   POOL_DIR=/dev/shm bench/async_latency.sh   (the pool file in that directory, default
#                                               /var/tmp: on tmpfs the device adds no latency
#                                               of its own, so the injected delay is the only one)
#
# The 4K cell at iodepth 64 forms bursts: fio's first 64 requests reach the device together,
# each waits the same 4 ms, and nothing spreads them apart, so each burst is served by the
# device and the reactor one request after another (latencies spread evenly from 4.1 to 5.9 ms).
# With the vdev queue's limits (at most 10 sync reads at the device) the first burst is spread
# out and stays so (4.1 to 4.6 ms): SCHEDULER=on always applies them, and since 2026-12-03
# the default (auto) does too once a burst saturates the device (docs/io-scheduling.md).
#
# On the host's disk the 4K cell at iodepth 64 also measures the disk: the injected delay
# comes after the read, so the reads of a burst reach the disk together, and its time per
# read rose from 122 us at iodepth 1 to 753 us (bench/results/2026-11-29-session18). With
# POOL_DIR=/dev/shm the device adds nothing (47 us at iodepth 1).
#
# On the host's disk the 128K cell at iodepth 64 measures the disk's bandwidth: the disk
# serves 7,400-7,800 random 128K reads a second at any depth from 10 up (fio, O_DIRECT: 4,700
# at depth 1, 7,816 at 10, 7,600 at 64), while 90 % of 64 x 215 is 12,400. oxpool reached
# 7,249, 98 % of the disk's 7,386 measured just before (bench/results/2026-12-03-session43);
# the queue's limits applied (10 sync reads at the disk, each 1.3-1.4 ms there against 257
# us alone). Hence the second share printed: of the lesser of 64x and the device's rate.
# On tmpfs the device is not the bound (42K 128K reads a second); there the two vCPUs are,
# for any server: nbdkit-delay, which only sleeps, reached 65-77 % in the same cell. Until
# reads of adjacent blocks became one device read (2f7cc10), each 128K read was eight 16K
# device reads at 156-162 us. 20 ms keeps every cell below the disk's and the CPUs' ceiling
# (bench/results/2026-11-26-async-latency-20ms).
#
# Makes a pool on a 4 GiB file in a new directory under /var/tmp, a 1 GiB volume written whole
# (reads must reach the device: a hole is not read), data_cache_max=0 (every read goes to the
# device), serves it on 127.0.0.1:10809, adds the rule, runs fio (nbd engine, 8 s per cell),
# prints IOPS and mean latency per cell and the iodepth-64 IOPS as a share of 64 times the
# iodepth-1 IOPS (the goal: at least 90 %) and of the lesser of that and the device's own
# rate (measured first, see below), then stops the server by its PID and removes everything.
set -euo pipefail
B=$(realpath "${1:-target/release/oxpool}")
D=$(mktemp -d "${POOL_DIR:-/var/tmp}/oxasync.XXXX")
C=(--cache-file "$D/c")
PID=
cleanup() {
    if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; sleep 2; fi
    rm -rf "$D"
}
trap cleanup EXIT
# The device's own ceiling, before the pool exists (the device idle): random O_DIRECT reads at
# iodepth 64 of a 1 GiB file written whole in the same directory, no delay added. Whatever
# a server does, its reads at iodepth 64 with the delay cannot outrun the device: each read
# still occupies it for its own time (the 128K paragraph above). A 4K client read reads the
# whole 16K block that holds it (the default volblocksize), so the 4K cell's ceiling is the
# device's 16K rate.
devfail() {
    echo "the device measurement failed: fio with O_DIRECT on a file in $(dirname "$D")" >&2
    exit 1
}
fio --name=devfill --filename="$D/dev.img" --rw=write --bs=1M --size=1G --direct=1 \
    --ioengine=io_uring --end_fsync=1 >/dev/null 2>&1 || devfail
for cell in 4k:16k 128k:128k; do
    bs=${cell%%:*} dev_bs=${cell##*:}
    fio --name=dev --filename="$D/dev.img" --rw=randread --bs="$dev_bs" --iodepth=64 \
        --size=1G --direct=1 --ioengine=io_uring --time_based --runtime=6 \
        --output-format=json >"$D/dev-$bs.json" 2>/dev/null || devfail
    /usr/bin/python3 - "$D/dev-$bs.json" >"$D/dev-$bs.iops" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))
PY
    echo "device $dev_bs (the $bs cell's reads): iodepth 64 $(cat "$D/dev-$bs.iops") IOPS" \
        "(fio, O_DIRECT, no delay added)"
done
rm -f "$D/dev.img"
"$B" "${C[@]}" create g5 "$D/p.img" --size 4G >/dev/null
"$B" "${C[@]}" vol create g5/v --size 1G >/dev/null
"$B" "${C[@]}" set data_cache_max=0 g5
if [ -n "${SCHEDULER:-}" ]; then "$B" "${C[@]}" set scheduler="$SCHEDULER" g5; fi
"$B" "${C[@]}" serve >"$D/serve.log" 2>&1 &
PID=$!
for _ in $(seq 50); do [ -S "$D/c.run/server-$PID.sock" ] && break; sleep 0.1; done
URI=nbd://127.0.0.1:10809/g5/v
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 >/dev/null 2>&1
if [ -n "${JITTER:-}" ]; then
    # A latency that varies, as a real device's does: each rule hits independently and the
    # longest delay drawn applies, so reads take DELAY_MS-1 ms (37.5 %), DELAY_MS (37.5 %) or
    # DELAY_MS+1 ms (25 %); mean DELAY_MS - 0.125 ms.
    "$B" "${C[@]}" inject -d p.img -D "$((${DELAY_MS:-4} - 1))" -T read g5 >/dev/null
    "$B" "${C[@]}" inject -d p.img -D "${DELAY_MS:-4}" -T read -f 50 g5 >/dev/null
    "$B" "${C[@]}" inject -d p.img -D "$((${DELAY_MS:-4} + 1))" -T read -f 25 g5
else
    "$B" "${C[@]}" inject -d p.img -D "${DELAY_MS:-4}" -T read g5
fi
# The four cells against URI, labelled LABEL.
cells() {
    local uri=$1 label=$2 bs qd
    for bs in 4k 128k; do
        for qd in 1 64; do
            fio --name=r --ioengine=nbd --uri="$uri" --rw=randread --bs=$bs --iodepth=$qd --size=1G \
                --time_based --runtime=8 --output-format=json >"$D/r-$bs-$qd.json" 2>/dev/null
        done
        /usr/bin/python3 - "$D" "$bs" "$label" <<'PY'
import json, sys
d, bs, label = sys.argv[1], sys.argv[2], sys.argv[3]
def cell(qd):
    t = open(f"{d}/r-{bs}-{qd}.json").read()
    j = json.loads(t[t.index("{"):])["jobs"][0]["read"]
    return j["iops"], j["lat_ns"]["mean"] / 1e6
(i1, l1), (i64, l64) = cell(1), cell(64)
goal = " (goal >= 90 %)" if label.startswith("oxpool") else " (a reference, not a goal)"
# The ceiling: 64 times iodepth 1, or the device's own rate if that is lower.
# (nbdkit-delay reads memory: no device bounds it.)
device = int(open(f"{d}/dev-{bs}.iops").read())
bound = ""
if label.startswith("oxpool"):
    bound = f"; {100 * i64 / min(64 * i1, device):.0f} % of the lesser of 64x and the device's {device}"
print(f"{label} {bs}: iodepth 1 {i1:.0f} IOPS ({l1:.2f} ms), iodepth 64 {i64:.0f} IOPS "
      f"({l64:.2f} ms): {100 * i64 / (64 * i1):.0f} % of 64x{goal}{bound}")
PY
    done
}
cells "$URI" "oxpool${SCHEDULER:+ scheduler=$SCHEDULER}${JITTER:+ jitter}"
"$B" "${C[@]}" inject -c all >/dev/null
# The reference (REFERENCE=nbdkit): a server that stores nothing and only sleeps, nbdkit's
# memory plugin behind its delay filter with the same latency and 64 threads. What it reaches
# at iodepth 64 is what this client and machine allow any server.
if [ "${REFERENCE:-}" = nbdkit ]; then
    command -v nbdkit >/dev/null || { echo "REFERENCE=nbdkit needs nbdkit (apt-get install nbdkit)" >&2; exit 1; }
    # The oxpool server stops first: the reference gets the machine to itself.
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
    PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    nbdkit --foreground --exit-with-parent --ipaddr=127.0.0.1 --port="$PORT" --threads=64 \
        --filter=delay memory 1G rdelay="${DELAY_MS:-4}ms" &
    NBDKIT=$!
    READY=
    for _ in $(seq 50); do nbdinfo --size "nbd://127.0.0.1:$PORT" >/dev/null 2>&1 && READY=1 && break; sleep 0.1; done
    [ -n "$READY" ] || { echo "nbdkit did not start on port $PORT" >&2; kill "$NBDKIT" 2>/dev/null || true; exit 1; }
    cells "nbd://127.0.0.1:$PORT" nbdkit-delay
    kill "$NBDKIT" 2>/dev/null || true
    wait "$NBDKIT" 2>/dev/null || true
fi
