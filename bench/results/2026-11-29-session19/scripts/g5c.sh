#!/bin/bash
# g5c.sh BIN DIR: 128K randread qd64 with 4ms delay; prints IOPS and server CPU us/IO
B=$1; D=$2; rm -rf $D; mkdir -p $D; C="--cache-file $D/c"
$B $C create g5 $D/p.img --size 4G >/dev/null; $B $C vol create g5/v --size 1G >/dev/null; $B $C set data_cache_max=0 g5
$B $C serve g5 --listen 127.0.0.1:10899 > $D/serve.log 2>&1 & PID=$!
for _ in $(seq 50); do grep -q ready $D/serve.log && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:10899/g5/v --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 >/dev/null 2>&1
$B $C inject -d p.img -D 4 -T read g5 >/dev/null
for bs in 128k 4k; do
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
fio --name=x --ioengine=nbd --uri=nbd://127.0.0.1:10899/g5/v --rw=randread --bs=$bs --iodepth=64 --runtime=8 --time_based --output-format=json --output=$D/f.json >/dev/null
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 -c "
import json; j=json.load(open('$D/f.json'))['jobs'][0]; r=j['read']; print('$bs iops %.0f cpu us/io %.1f fio cpu %.0f' % (r['iops'], ($t1-$t0)*1e4/r['total_ios'], j['usr_cpu']+j['sys_cpu']))"
done
kill -TERM $PID; wait $PID 2>/dev/null; rm -rf $D
