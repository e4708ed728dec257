#!/bin/bash
# usage: prof.sh OUT -> fresh pool + server, 3 s seqwrite warm-up, perf record over one seqwrite cell
OUT=$1; BIN=${BIN:-/work/main/target/release/oxpool}; PORT=10899; D=/var/tmp/s32/pool
bash /var/tmp/s32/mk.sh
sync; echo 1 > /proc/sys/vm/drop_caches
$BIN --cache-file $D/cache serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
P=$!; echo $P > /var/tmp/s18/srv.pid
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
fio --name=pre --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/bp/vol0 --rw=write --bs=1M --iodepth=8 --size=2G --output=/dev/null
sleep 1; fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/bp/vol0 --rw=write --bs=128k --iodepth=8 --time_based --runtime=3 --output=/dev/null
if [ -n "$OUT" ]; then perf record -F 4000 -g -p $P -o $OUT > /dev/null 2>&1 & PP=$!; sleep 0.3; fi
EXPORT=bp/vol0 bash /var/tmp/s18/sw.sh | tail -2
[ -n "$OUT" ] && { kill -INT $PP; wait $PP; }
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
