#!/bin/bash
# usage: ab31b.sh ROUNDS A B: alternating binaries, fresh filled 6G pool each: seqwrite x3
for r in $(seq ${1:-2}); do
  for v in $2 $3; do
    bash /var/tmp/s18/serve.sh /var/tmp/s31/oxpool-$v 10899 >/dev/null 2>&1
    for k in 1 2 3; do echo "$v r$r sw$k: $(bash /var/tmp/s18/sw.sh 2>/dev/null | tail -1)"; done
    kill -TERM $(cat /var/tmp/s18/srv.pid); while kill -0 $(cat /var/tmp/s18/srv.pid) 2>/dev/null; do sleep 0.1; done
  done
done
