#!/bin/bash
# Poll each oxpool server of a bench run once a second: cumulative iostat JSON with a timestamp.
RUN=$1; OUT=$2; B=/work/main/target/release/oxpool
while true; do
  for f in $RUN/*.cache; do
    [ -e "$f" ] || continue
    v=$(basename $f .cache)
    j=$(timeout 2 $B --cache-file $f iostat --json oxbench 2>/dev/null | head -1)
    [ -n "$j" ] && echo "$(date +%s.%N) $v $j" >> $OUT
  done
  sleep 0.5
done
