#!/bin/bash
# usage: cell.sh CELL(sw|rw) THP(madvise|never) -> fresh server on the pool made by mk.sh, one cell, server stopped
CELL=$1; THP=$2
BIN=/work/main/target/release/oxpool; PORT=10899
D=/var/tmp/s26/pool; OX="$BIN --cache-file $D/cache"
echo $THP > /sys/kernel/mm/transparent_hugepage/enabled
sync; echo 1 > /proc/sys/vm/drop_caches
$OX serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
P=$!; echo $P > /var/tmp/s26/srv.pid; echo $P > /var/tmp/s18/srv.pid
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
sleep 1
echo -n "$CELL thp=$THP: "
bash /var/tmp/s27/$CELL.sh | tail -1
grep -E "VmHWM" /proc/$P/status; kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
echo madvise > /sys/kernel/mm/transparent_hugepage/enabled
