#!/bin/bash
# alternating rounds: A_BIN and B_BIN each serve a fresh filled pool; 2 sw.sh runs each, with disk queue
for r in $(seq ${1:-3}); do
  for v in A B; do
    bin=$([ $v = A ] && echo $A_BIN || echo $B_BIN)
    bash /var/tmp/s18/serve.sh $bin 10899
    for k in 1 2; do echo -n "$v r$r: "; bash /var/tmp/s18/q.sh bash /var/tmp/s18/sw.sh 2>/dev/null | tail -2 | tr '\n' ' '; echo; done
    kill -TERM $(cat /var/tmp/s18/srv.pid); while kill -0 $(cat /var/tmp/s18/srv.pid) 2>/dev/null; do sleep 0.1; done
  done
done
