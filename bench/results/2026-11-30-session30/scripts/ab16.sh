#!/bin/bash
# alternating builds: fresh served pool (mk.sh, 6G pool, 2G vol, 16K), then one q16 cell; $1 rounds
S=/work/main/bench/results/2026-11-30-session29/scripts
for r in $(seq 1 ${1:-3}); do
 for b in ${BUILDS:-base warm}; do
  sed "s#^B=.*#B=/var/tmp/s30/oxpool-$b; D=/var/tmp/s29/m; C=\"--cache-file \$D/c\"#" $S/mk.sh > /var/tmp/s30/mk.sh
  bash /var/tmp/s30/mk.sh 6G 16K; sleep 3
  B=/var/tmp/s30/oxpool-$b bash $S/q16.sh "r$r $b"
 done
done
kill -TERM $(cat /var/tmp/s29/m/spid)
