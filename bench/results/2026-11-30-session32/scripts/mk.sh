#!/bin/bash
BIN=${BIN:-/work/main/target/release/oxpool}; D=/var/tmp/s32/pool
rm -f $D/cache; mkdir -p $D
if [ -f $D/dev0.img ]; then $BIN --cache-file $D/cache create -f bp $D/dev0.img >/dev/null
else $BIN --cache-file $D/cache create bp $D/dev0.img --size 6G >/dev/null; fi
$BIN --cache-file $D/cache vol create bp/vol0 --size 2G
