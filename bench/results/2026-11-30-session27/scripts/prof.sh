#!/bin/bash
# usage: prof.sh CELL OUT -> fresh server, perf record during the cell
CELL=$1; OUT=$2
BIN=/work/main/target/release/oxpool; PORT=10899
D=/var/tmp/s26/pool; OX="$BIN --cache-file $D/cache"
sync; echo 1 > /proc/sys/vm/drop_caches
$OX serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
P=$!; echo $P > /var/tmp/s26/srv.pid; echo $P > /var/tmp/s18/srv.pid
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
sleep 1; [ -n "$WARM" ] && fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=$WARM --bs=$WBS --iodepth=$WQD --time_based --runtime=3 --randrepeat=0 --norandommap --output=/dev/null
perf record -F 4000 -g -p $P -o $OUT > /dev/null 2>&1 &
PP=$!
sleep 0.3
bash /var/tmp/s27/$CELL.sh | tail -1
kill -INT $PP; wait $PP
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
