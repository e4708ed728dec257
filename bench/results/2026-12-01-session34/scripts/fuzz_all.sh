#!/bin/bash
# every fuzz target for SECS seconds each, one after another
cd /work/main/fuzz
SECS=${SECS:-180}
cargo +nightly fuzz build -O > /var/tmp/s34/fuzz/build.log 2>&1 || { echo build failed; exit 1; }
for t in $(cargo +nightly fuzz list); do
  mkdir -p /var/tmp/s34/fuzz/corpus/$t /var/tmp/s34/fuzz/art/$t
  cargo +nightly fuzz run -O $t /var/tmp/s34/fuzz/corpus/$t -- -max_total_time=$SECS -artifact_prefix=/var/tmp/s34/fuzz/art/$t/ -print_final_stats=1 > /var/tmp/s34/fuzz/$t.log 2>&1
  echo "$t rc=$? $(grep -E 'stat::number_of_executed_units' /var/tmp/s34/fuzz/$t.log)"
done
