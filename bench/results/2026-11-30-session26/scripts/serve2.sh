#!/bin/bash
# usage: serve.sh BIN PORT  -> starts server in background, writes pid to srv.pid
BIN=${1:-/work/main/target/release/oxpool}; PORT=${2:-10899}
D=/var/tmp/s26/pool; rm -rf $D; mkdir -p $D
OX="$BIN --cache-file $D/cache"
$OX create bp $D/pool.img --size ${POOL_SIZE:-3G} >/dev/null || exit 1
$OX vol create bp/vol0 --size 2G >/dev/null || exit 1
$OX serve bp --listen 127.0.0.1:$PORT $SERVE_ARGS > $D/serve.log 2>&1 &
echo $! > /var/tmp/s26/srv.pid
for i in $(seq 50); do grep -q "ready" $D/serve.log && break; sleep 0.2; done
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/bp/vol0 --rw=write --bs=1M --iodepth=8 --end_fsync=1 --output=/dev/null
