#!/bin/bash
R=/work/main/bench/results/2026-11-29-session24
cd /work/main
echo "start $(date -u +%T)"
bash bench/device_profile.sh > $R/device-before.txt 2>&1
echo "profile done $(date -u +%T)"
bench/run --no-build --variants oxpool --peers qemu-nbd,nbdkit,nbdkit-null --workloads seqwrite-128k-qd8,seqread-128k-qd8,randread-4k-qd1,randread-4k-qd32,randread-4k-1x64,syncwrite-4k-qd1,randwrite-4k-qd32,randread-16k-qd32 --runtime 10 --ramp 3 --repeat 3 --size 2G --out $R/main > $R/main.log 2>&1
echo "main done $(date -u +%T)"
REFERENCE=nbdkit bash bench/async_latency.sh > $R/async-latency-4ms.txt 2>&1
SCHEDULER=on bash bench/async_latency.sh > $R/async-latency-4ms-scheduler-on.txt 2>&1
JITTER=1 bash bench/async_latency.sh > $R/async-latency-4ms-jitter.txt 2>&1
DELAY_MS=20 bash bench/async_latency.sh > $R/async-latency-20ms.txt 2>&1
POOL_DIR=/dev/shm REFERENCE=nbdkit bash bench/async_latency.sh > $R/async-latency-4ms-tmpfs.txt 2>&1
echo "async done $(date -u +%T)"
echo "end $(date -u +%T)"
