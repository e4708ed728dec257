#!/bin/bash
R=${R:-/work/main/bench/results/2026-12-02-session38}
cd /work/main
echo "start $(date -u +%T)"
bash bench/device_profile.sh > $R/device-before.txt 2>&1
echo "profile done $(date -u +%T)"
# The disk's own rate for goal 1's bytes: 2 GiB of 128K direct writes at iodepth 8 with a
# final fsync, onto a file written once (as the pool's file is), three times.
for i in 1 2 3; do BS=128k QD=8 bash /work/main/bench/results/2026-11-30-session26/scripts/disk.sh; done > $R/disk-128k-qd8.txt 2>&1
rm -f /var/tmp/s18/disk.img
bench/run --no-build --variants oxpool --peers qemu-nbd,nbdkit,nbdkit-null --workloads seqwrite-128k-qd8,seqread-128k-qd8,randread-4k-qd1,randread-4k-qd32,randread-4k-1x64,syncwrite-4k-qd1,randwrite-4k-qd32,randread-16k-qd32 --runtime 10 --ramp 3 --repeat 3 --size 2G --out $R/main > $R/main.log 2>&1
echo "main done $(date -u +%T)"
# Goal 3 again, and the write tail at iodepth 16 (the warmer), three rounds.
bench/run --no-build --variants oxpool --peers qemu-nbd --workloads syncwrite-4k-qd1,syncwrite-4k-qd16 --runtime 10 --ramp 3 --repeat 3 --size 2G --out $R/syncwrite > $R/syncwrite.log 2>&1
echo "syncwrite done $(date -u +%T)"
REFERENCE=nbdkit bash bench/async_latency.sh > $R/async-latency-4ms.txt 2>&1
SCHEDULER=on bash bench/async_latency.sh > $R/async-latency-4ms-scheduler-on.txt 2>&1
JITTER=1 bash bench/async_latency.sh > $R/async-latency-4ms-jitter.txt 2>&1
DELAY_MS=20 bash bench/async_latency.sh > $R/async-latency-20ms.txt 2>&1
POOL_DIR=/dev/shm REFERENCE=nbdkit bash bench/async_latency.sh > $R/async-latency-4ms-tmpfs.txt 2>&1
echo "async done $(date -u +%T)"
echo "end $(date -u +%T)"
