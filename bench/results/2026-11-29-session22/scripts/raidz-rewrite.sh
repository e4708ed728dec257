#!/bin/bash
# A 60 MiB volume on a 5-wide raidz2 of 64 MiB files, written, then rewritten by separate
# commands (each imports the pool). O=binary. Before ae22e73: "out of space" at the first rewrite.
O=${O:-/work/main/target/release/oxpool}; D=${D:-/var/tmp/s22/r2}
rm -rf $D; mkdir -p $D/d; cd $D; ox() { timeout 120 $O --cache-file $D/cache "$@"; }
head -c 60M /dev/urandom > a60; head -c 60M /dev/urandom > b60
ox create z2 raidz2 $D/d/z2{a,b,c,d,e}.img --size 64M >/dev/null
ox vol create z2/v --size 60M; ox vol write z2/v a60
for i in 1 2 3 4; do ox vol write z2/v b60; echo rc=$?; ox vol write z2/v a60; echo rc=$?; done
ox vol read z2/v - | cmp - a60 && echo SAME; ox list -p z2; ox audit z2 | tail -1
