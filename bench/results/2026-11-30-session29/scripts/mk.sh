#!/bin/bash
# fresh served pool p of $1 size with a 2G vol0 (volblocksize $2), preconditioned
B=/work/main/target/release/oxpool; D=/var/tmp/s29/m; C="--cache-file $D/c"
[ -f $D/spid ] && kill -TERM $(cat $D/spid) 2>/dev/null; sleep 2
rm -f $D/p.img $D/c; $B $C create p $D/p.img --size $1 >/dev/null && $B $C vol create p/vol0 --size 2G -o volblocksize=$2
$B $C serve p --listen 127.0.0.1:10999 > $D/serve.log 2>&1 & echo $! > $D/spid
sleep 2
fio --name=pre --ioengine=nbd --uri=nbd://127.0.0.1:10999/p/vol0 --rw=write --bs=1M --iodepth=8 --size=2G --output=/dev/null
