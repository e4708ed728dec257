#!/bin/bash
# fresh server, warm-up like the harness, then sw.sh with vda sampled every 100 ms
BIN=/work/main/target/release/oxpool; PORT=10899
D=/var/tmp/s26/pool; OX="$BIN --cache-file $D/cache"
$OX serve bp --listen 127.0.0.1:$PORT $SERVE_ARGS > $D/serve.log 2>&1 &
P=$!; echo $P > /var/tmp/s18/srv.pid
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
sleep 1; fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=write --bs=128k --iodepth=8 --time_based --runtime=3 --output=/dev/null
sleep 2
( python3 /var/tmp/s28/qd.py 4 /var/tmp/s28/qd.trace ) &
S=$!
bash /var/tmp/s28/sw.sh | tail -2
wait $S
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
