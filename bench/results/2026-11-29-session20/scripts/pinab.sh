#!/bin/bash
# usage: pinab.sh ROUNDS CMD...: free vs reactor-1 pinned to CPU 1, alternating; CMD prints one line
R=$1; shift
for i in $(seq $R); do for mode in free pinr; do
  bash /var/tmp/s18/serve.sh /var/tmp/s18/ox-f4fe >/dev/null 2>&1; sleep 1; PID=$(cat /var/tmp/s18/srv.pid)
  RT=$(grep -l "nbd-reactor-1" /proc/$PID/task/*/comm | head -1 | xargs dirname | xargs basename)
  [ $mode = pinr ] && taskset -p -c 1 $RT >/dev/null
  echo -n "$mode "; "$@" | tail -1
  kill -TERM $PID; sleep 1
done; done
