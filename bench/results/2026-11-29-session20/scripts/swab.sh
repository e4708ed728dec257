#!/bin/bash
# usage: swab.sh ROUNDS: fresh server without fill, seqwrite 128k qd8 2G + end_fsync; A_BIN vs B_BIN
R=${1:-3}
for i in $(seq $R); do
  for v in A B; do
    eval "BINV=\${${v}_BIN}"; eval "ENVV=\${${v}_ENV}"
    env $ENVV NOFILL=1 bash /var/tmp/s18/serve.sh $BINV >/dev/null 2>&1
    sleep 1
    echo -n "$v: "; bash /var/tmp/s18/sw.sh | tail -1
    kill -TERM $(cat /var/tmp/s18/srv.pid); sleep 3
  done
done
