#!/bin/bash
# usage: ab31.sh ROUNDS: alternating old/new binaries, fresh filled 6G pool each: seqwrite x2 then randwrite
for r in $(seq ${1:-2}); do
  for v in old new; do
    bash /var/tmp/s18/serve.sh /var/tmp/s31/oxpool-$v 10899 >/dev/null 2>&1
    for k in 1 2; do echo "$v r$r sw$k: $(bash /var/tmp/s18/sw.sh 2>/dev/null | tail -1)"; done
    echo "$v r$r rw: $(bash /var/tmp/s18/rr.sh 32 4k randwrite | tail -1)"
    kill -TERM $(cat /var/tmp/s18/srv.pid); while kill -0 $(cat /var/tmp/s18/srv.pid) 2>/dev/null; do sleep 0.1; done
  done
done
