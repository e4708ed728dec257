#!/bin/bash
# Alternating builds on one pool (6G file, 2G volume written once): goal 1's cell (sw.sh),
# a fresh server each run, stopped by its PID.
D=/var/tmp/s33; C="--cache-file $D/pool/cache"
ROUNDS=${ROUNDS:-3}
if [ ! -f $D/pool/cache ]; then
  $D/oxpool-base $C create bp $D/pool/dev0.img --size 6G >/dev/null
  $D/oxpool-base $C vol create bp/vol0 --size 2G
  FILL=1
fi
serve() { (setsid $1 $C serve --listen 127.0.0.1:10899 > $D/serve.log 2>&1 & echo $! > $D/srv.pid); for i in $(seq 50); do grep -q ready $D/serve.log && break; sleep 0.2; done; }
stop() { kill -TERM $(cat $D/srv.pid); while kill -0 $(cat $D/srv.pid) 2>/dev/null; do sleep 0.1; done; }
if [ -n "$FILL" ]; then serve $D/oxpool-base; fio --name=f --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=write --bs=1M --iodepth=8 --size=2G --end_fsync=1 >/dev/null; stop; fi
for r in $(seq $ROUNDS); do
  for b in ${BUILDS:-base 1024}; do
    serve $D/oxpool-$b; sync; sleep 3
    echo -n "round $r $b: "; EXPORT=bp/vol0 $D/sw.sh | tail -1
    stop
  done
done
