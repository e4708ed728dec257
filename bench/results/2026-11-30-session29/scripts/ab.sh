#!/bin/bash
# A/B of logearly on/off with a given binary on a fresh served pool in /var/tmp/s29/m
B=${1:-/work/main/target/release/oxpool}; ROUNDS=${ROUNDS:-3}; PORT=10999
D=/var/tmp/s29/m; C="--cache-file $D/c"
rm -f $D/p.img $D/c; $B $C create p $D/p.img --size 6G >/dev/null && $B $C vol create p/vol0 --size 2G
$B $C serve p --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 & SPID=$!
sleep 2
fio --name=pre --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/p/vol0 --rw=write --bs=1M --iodepth=8 --size=2G --output=/dev/null
F="fio --name=sw --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/p/vol0 --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --size=2G --time_based --runtime=5 --output-format=json"
iops(){ python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(sys.argv[2], round(j['write']['iops']), j['write']['clat_ns']['percentile']['50.000000']//1000, j['sync']['lat_ns']['percentile']['50.000000']//1000)" $1 $2; }
for r in $(seq $ROUNDS); do for v in ${VALUES:-on off}; do $B $C set logearly=$v p; $F --output=$D/x.json; iops $D/x.json $v; done; done
$B $C iostat p 2>/dev/null | head -0
kill -TERM $SPID; wait $SPID
