#!/bin/bash
# usage: frag.sh BIN RUNS -> a 3 GiB pool, 2 GiB volume filled, then RUNS runs of rw.sh on one server, with device write sizes
BIN=$1; N=${2:-4}
POOL_SIZE=${POOL_SIZE:-3G} bash /var/tmp/s27/serve2.sh $BIN 10899 || exit 1
P=$(cat /var/tmp/s26/srv.pid)
DEV=vda
for r in $(seq $N); do
  a=($(awk -v d=$DEV '$3==d {print $8, $10}' /proc/diskstats))
  echo -n "run $r: "; bash /var/tmp/s27/rw.sh | tail -1 | tr '\n' ' '
  b=($(awk -v d=$DEV '$3==d {print $8, $10}' /proc/diskstats))
  w=$((b[0]-a[0])); s=$((b[1]-a[1]))
  echo "| dev writes $w, $((s/2/ (w>0?w:1) )) KiB avg"
done
$BIN --cache-file /var/tmp/s26/pool/cache list -p 2>/dev/null | head -3
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
