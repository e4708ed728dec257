#!/bin/bash
# Repeated 4K write+flush qd1 cells on one preconditioned pool (like the harness's rounds).
B=/work/main/target/release/oxpool; W=/var/tmp/syncr; rm -rf $W; mkdir -p $W
$B --cache-file $W/c create p $W/p.img --size 6G >/dev/null
$B --cache-file $W/c vol create p/vol0 --size 2G >/dev/null
$B --cache-file $W/c serve p --listen 127.0.0.1:10911 > $W/log 2>&1 & echo $! > $W/pid
for i in $(seq 50); do grep -q ready $W/log && break; sleep 0.2; done
U=nbd://127.0.0.1:10911/p/vol0
fio --name=pre --ioengine=nbd --uri=$U --rw=write --bs=1m --iodepth=8 --size=2G --end_fsync=1 >/dev/null
for r in 1 2 3 4 5; do
  fio --name=s --ioengine=nbd --uri=$U --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --size=2G --runtime=10 --time_based --output-format=json > $W/f.json
  python3 -c "
import json; t=open('$W/f.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]; w=j['write']; s=j['sync']
print('round $r: %.0f IOPS, sync mean %.0f us p99 %.0f us' % (w['iops'], s['lat_ns']['mean']/1000, s['lat_ns']['percentile'].get('99.000000',0)/1000))"
  $B --cache-file $W/c iostat --json p 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print({k:d[k] for k in d if k in ('log_durable_writes','log_write_us','device_flushes','commits','log_blocks')})" 2>/dev/null
  sleep 3
done
kill -TERM $(cat $W/pid); sleep 3; rm -rf $W
