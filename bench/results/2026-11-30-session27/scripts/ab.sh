#!/bin/bash
# usage: ab.sh CELL(sw|rw) ROUNDS BIN_A BIN_B -> alternating fresh servers, harness-like 3 s warm-up, one cell each
CELL=$1; N=$2; A=$3; B=$4
case $CELL in sw) W="--rw=write --bs=128k --iodepth=8";; rw) W="--rw=randwrite --bs=4k --iodepth=32";; esac
D=/var/tmp/s26/pool; PORT=10899
for r in $(seq $N); do
  for BIN in $A $B; do
    [ $((r % 2)) = 0 ] && BIN=$([ $BIN = $A ] && echo $B || echo $A)
    sync; echo 1 > /proc/sys/vm/drop_caches
    $BIN --cache-file $D/cache serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
    P=$!; echo $P > /var/tmp/s26/srv.pid; echo $P > /var/tmp/s18/srv.pid
    for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
    fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/bp/vol0 $W --time_based --runtime=3 --randrepeat=0 --norandommap --output=/dev/null
    echo -n "$r $(basename $(dirname $(dirname $BIN))) $CELL: "
    bash /var/tmp/s27/$CELL.sh | tail -1
    kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
  done
done
