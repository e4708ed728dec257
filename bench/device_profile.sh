#!/usr/bin/env bash
# What this machine's disk and CPU can do, measured without any NBD server, so that a run's
# figures can be read against the machine they came from (sessions land on different hosts:
# one had a disk writing 3.7 GB/s, the next 0.44 GB/s, and the write cells went from bound
# by the CPU to bound by the disk).
#
#   bench/device_profile.sh [DIR]     (default DIR: /var/tmp, where bench/run puts its pools)
#
# fio (io_uring, O_DIRECT) on two 1 GiB files in DIR, 6 s per cell:
# - sequential 1M write and read at iodepth 16: the disk's bandwidth ceiling;
# - 4K random read at iodepth 1 and 32;
# - 4K write + fdatasync at iodepth 1 (the syncwrite-4k-qd1 cell's pattern), alone and then
#   while a second job writes 16K random blocks at 40 MB/s and at full speed: what other
#   writes cost a flush on this disk (a server that writes more bytes per client byte pays it
#   in its flushes; on a virtual disk a flush can cost in proportion to what was written
#   since the last one).
# Also: the CPU model and flags that matter here, and `openssl speed` for AES-128-GCM.
set -euo pipefail

DIR=${1:-/var/tmp}
SECONDS_PER_CELL=6
for tool in fio python3; do
    command -v "$tool" > /dev/null || { echo "device_profile: $tool is not installed" >&2; exit 1; }
done
WORK=$(mktemp -d "$DIR/oxbench-device.XXXXXX")
BG_PID=""
# Ends the background writer, if one runs (by its PID).
end_background() {
    if [ -n "$BG_PID" ]; then
        kill "$BG_PID" 2> /dev/null || true
        wait "$BG_PID" 2> /dev/null || true
        BG_PID=""
    fi
}
cleanup() {
    end_background
    rm -rf "$WORK"
}
trap cleanup EXIT

A=$WORK/a
B=$WORK/b
# Fully written files: no unwritten extents for the first writes to convert.
for f in "$A" "$B"; do
    dd if=/dev/zero of="$f" bs=1M count=1024 oflag=direct status=none
done
sync

# fio JSON on stdin -> one line: IOPS, MB/s, mean latency, and for sync jobs the fdatasync's.
cat > "$WORK/summarize.py" <<'PY'
import json, sys
text = sys.stdin.read()
job = json.loads(text[text.index("{"):])["jobs"][0]
d = job["write"] if job["write"]["io_bytes"] else job["read"]
line = "%.0f IOPS, %.0f MB/s, mean latency %.0f us" % (
    d["iops"], d["bw_bytes"] / 1e6, d["lat_ns"]["mean"] / 1000)
s = job.get("sync", {}).get("lat_ns", {})
if s.get("N"):
    line += "; fdatasync mean %.0f us, p99 %.0f us" % (
        s["mean"] / 1000, s["percentile"]["99.000000"] / 1000)
print(line)
PY

cell() { # LABEL FILE fio-args...
    local label=$1 file=$2
    shift 2
    printf '  %-44s ' "$label:"
    fio --name=d --filename="$file" --size=1G --direct=1 --runtime=$SECONDS_PER_CELL --time_based \
        --output-format=json "$@" 2> /dev/null | python3 "$WORK/summarize.py"
}

background() { # fio-args...: 16K random writes to the other file until killed
    fio --name=bg --filename="$B" --size=1G --direct=1 --ioengine=io_uring --iodepth=8 \
        --rw=randwrite --bs=16k --runtime=600 --time_based "$@" > /dev/null 2>&1 &
    BG_PID=$!
    sleep 1
}

stop_background() { # and let the disk settle before the next cell
    end_background
    sleep 2
}

echo "# Device profile of $(df --output=source "$DIR" | tail -1) ($DIR), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores," \
    "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')" \
    "model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ');" \
    "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|vaes|vpclmulqdq|sha_ni' | tr '\n' ' ')"
if command -v openssl > /dev/null; then
    echo "openssl speed -evp aes-128-gcm, 16 KiB blocks ($(openssl version | cut -d' ' -f1-2)):" \
        "$(openssl speed -seconds 2 -evp aes-128-gcm -bytes 16384 2> /dev/null | tail -1 | awk '{printf "%.2f GB/s", $2 * 1000 / 1e9}')"
fi
echo "disk:"
cell "sequential write 1M, iodepth 16" "$A" --ioengine=io_uring --rw=write --bs=1M --iodepth=16
cell "sequential read 1M, iodepth 16" "$A" --ioengine=io_uring --rw=read --bs=1M --iodepth=16
cell "random read 4K, iodepth 1" "$A" --ioengine=io_uring --rw=randread --bs=4k --iodepth=1
cell "random read 4K, iodepth 32" "$A" --ioengine=io_uring --rw=randread --bs=4k --iodepth=32
echo "4K write + fdatasync, iodepth 1 (psync):"
cell "alone" "$A" --ioengine=psync --rw=randwrite --bs=4k --fsync=1
background --rate=40m
cell "with 16K random writes at 40 MB/s" "$A" --ioengine=psync --rw=randwrite --bs=4k --fsync=1
stop_background
background
cell "with 16K random writes at full speed" "$A" --ioengine=psync --rw=randwrite --bs=4k --fsync=1
stop_background
