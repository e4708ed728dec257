#!/bin/bash
# one qd16 write+flush cell on the served pool p (port 10999); prints IOPS, write p50/p99/p99.9, flush p50/p99, txgs, slow writes (>3 ms)
B=${B:-/work/main/target/release/oxpool}; C="--cache-file /var/tmp/s29/m/c"; D=/var/tmp/s29/m
txg(){ $B $C iostat --json p | python3 -c "import json,sys; print(json.load(sys.stdin)['txg'])"; }
t0=$(txg)
fio --name=sw --ioengine=nbd --uri=nbd://127.0.0.1:10999/p/vol0 --rw=randwrite --bs=${BS:-4k} --iodepth=${QD:-16} --fsync=1 --size=2G --time_based --runtime=${RT:-8} --write_lat_log=$D/lat --log_avg_msec=0 --output-format=json --output=$D/q16.json >/dev/null
t1=$(txg)
python3 - $((t1-t0)) "$1" <<'P'
import json,sys
j=json.load(open('/var/tmp/s29/m/q16.json'))['jobs'][0]
w=j['write']['clat_ns']['percentile']; s=j['sync']['lat_ns']['percentile']
rows=[l.split(',') for l in open('/var/tmp/s29/m/lat_clat.1.log')]
slow=sum(1 for r in rows if int(r[1])>3_000_000)
print(sys.argv[2], 'iops',round(j['write']['iops']), 'write p50/p99/p99.9', w['50.000000']//1000, w['99.000000']//1000, w['99.900000']//1000, 'flush p50/p99', s['50.000000']//1000, s['99.000000']//1000, 'txgs', sys.argv[1], 'slow', slow, 'of', len(rows))
P
