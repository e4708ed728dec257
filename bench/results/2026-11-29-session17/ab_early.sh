#!/bin/bash
# A/B of logearly on/off: 4K random write cells on one served pool, alternating; FIOARGS
# (default "--iodepth=1 --fsync=1", a write + flush at queue depth 1) sets depth and flushes.
B=/work/main/target/release/oxpool; W=/var/tmp/s17ab; rm -rf $W; mkdir -p $W
N=${N:-4}; RT=${RT:-8}; PORT=10913; FIOARGS=${FIOARGS:---iodepth=1 --fsync=1}
$B --cache-file $W/c create p $W/p.img --size 6G >/dev/null
$B --cache-file $W/c vol create p/vol0 --size 2G >/dev/null
$B --cache-file $W/c serve p --listen 127.0.0.1:$PORT > $W/log 2>&1 & echo $! > $W/pid
for i in $(seq 100); do grep -q ready $W/log && break; sleep 0.1; done
U=nbd://127.0.0.1:$PORT/p/vol0
fio --name=pre --ioengine=nbd --uri=$U --rw=write --bs=1m --iodepth=8 --size=2G >/dev/null
ctr() { $B --cache-file $W/c iostat --json p | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['log_blocks'], d.get('log_early_blocks',0), d['device_flushes'], d.get('log_early_flush_us',0), d['log_write_us'], d['log_durable_writes'])"; }
for r in $(seq $N); do
  for mode in on off; do
    $B --cache-file $W/c set logearly=$mode p
    c0=$(ctr)
    fio --name=s --ioengine=nbd --uri=$U --rw=randwrite --bs=4k $FIOARGS --size=2G --runtime=$RT --time_based --output-format=json > $W/f.json
    c1=$(ctr)
    python3 -c "
import json; t=open('$W/f.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]; w=j['write']; s=j['sync']
a=list(map(int,'$c0'.split())); b=list(map(int,'$c1'.split())); n=w['total_ios']
d=[y-x for x,y in zip(a,b)]
print('round $r logearly=$mode: %5.0f IOPS, write mean %4.0f us, flush mean %4.0f us | per write: log blocks %.2f early %.2f dev flushes %.2f early flush %.0f us' % (w['iops'], w['lat_ns']['mean']/1000, s['lat_ns']['mean']/1000, d[0]/n, d[1]/n, d[2]/n, d[3]/max(d[1],1)))"
  done
done
kill -TERM $(cat $W/pid); while kill -0 $(cat $W/pid) 2>/dev/null; do sleep 0.1; done; rm -rf $W
