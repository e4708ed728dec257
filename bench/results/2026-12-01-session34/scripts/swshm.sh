#!/bin/bash
# seqwrite 128k qd8 2G + end_fsync against a pool on tmpfs; server CPU per IO; optional perf
set -u
B=${B:-/var/tmp/s34/oxpool-base}
D=$(mktemp -d /dev/shm/sw.XXXX)
OX="$B --cache-file $D/c"
$OX create bp $D/p.img --size 6G >/dev/null
$OX vol create bp/vol0 --size 2G >/dev/null
$OX serve bp --listen 127.0.0.1:10899 > $D/serve.log 2>&1 &
P=$!
for i in $(seq 100); do grep -q ready $D/serve.log && break; sleep 0.1; done
fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=write --bs=128k --iodepth=8 --time_based --runtime=3 --output=/dev/null
for r in ${ROUNDS:-1 2}; do
if [ -n "${PERF:-}" ]; then perf record -F 4000 -g -p $P -o $PERF > /dev/null 2>&1 & PP=$!; sleep 0.3; fi
t0=$(awk '{print $14+$15}' /proc/$P/stat)
fio --name=x --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=write --bs=128k --iodepth=8 --size=2G --end_fsync=1 --output-format=json --output=$D/fio.json
t1=$(awk '{print $14+$15}' /proc/$P/stat)
if [ -n "${PERF:-}" ]; then kill -INT $PP; wait $PP; fi
python3 - $t0 $t1 $D/fio.json <<'P'
import json,sys
j=json.load(open(sys.argv[3]))['jobs'][0]
r=j['write']; ios=r['total_ios']; cpu=(int(sys.argv[2])-int(sys.argv[1]))/100
print(f"iops {r['iops']:.0f} bw {r['bw']/1024:.0f} MiB/s server {cpu*1e6/ios:.1f} us/IO fio {j['usr_cpu']+j['sys_cpu']:.0f}%")
P
done
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
rm -rf $D
