#!/bin/bash
# usage: rwab.sh ROUNDS: fresh server per round, randwrite 4k qd32 10 s; A_BIN vs B_BIN alternating
R=${1:-3}
for i in $(seq $R); do
  for v in A B; do
    eval "BINV=\${${v}_BIN}"; eval "ENVV=\${${v}_ENV}"
    env $ENVV bash /var/tmp/s18/serve.sh $BINV >/dev/null 2>&1
    sleep 1
    echo -n "$v: "; bash /var/tmp/s18/rr.sh 32 4k randwrite | tail -1
    kill -TERM $(cat /var/tmp/s18/srv.pid); sleep 2
  done
done
