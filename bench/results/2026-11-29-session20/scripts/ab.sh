#!/bin/bash
# usage: ab.sh ROUNDS  with env A_ENV, B_ENV (env assignments for the server), A_BIN/B_BIN
R=${1:-3}
for i in $(seq $R); do
  for v in A B; do
    eval "ENVV=\${${v}_ENV}"; eval "BINV=\${${v}_BIN:-/work/main/target/release/oxpool}"
    env $ENVV bash /var/tmp/s18/serve.sh $BINV >/dev/null 2>&1
    sleep 1
    echo -n "$v: "; bash /var/tmp/s18/sw.sh | tail -1
    kill -TERM $(cat /var/tmp/s18/srv.pid); sleep 1
  done
done
