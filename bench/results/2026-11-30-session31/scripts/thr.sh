#!/bin/bash
# usage: thr.sh CMD...: per-thread CPU ticks of the server over CMD
PID=$(cat /var/tmp/s18/srv.pid)
snap() { for t in /proc/$PID/task/*; do echo "$(cat $t/comm | tr ' ' _) $(awk '{print $14+$15}' $t/stat)"; done | sort; }
snap > /tmp/thr0; r0=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
"$@"
snap > /tmp/thr1; r1=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
join /tmp/thr0 /tmp/thr1 | awk '{d=$3-$2; if (d>0) print $1, d}'
echo "rss kB $r0 -> $r1"
