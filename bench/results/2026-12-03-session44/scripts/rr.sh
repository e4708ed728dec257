#!/bin/bash
# fresh pool+server, prewrite, fill the cache, then randread 4k QD for T s (perf record if OUT)
OUT=$1; QD=${QD:-32}; T=${T:-8}
BIN=${BIN:-/work/main/target/release/oxpool}; PORT=10899; D=/var/tmp/s44/pool
rm -f $D/cache; mkdir -p $D
if [ -f $D/dev0.img ]; then $BIN --cache-file $D/cache create -f bp $D/dev0.img >/dev/null
else $BIN --cache-file $D/cache create bp $D/dev0.img --size 6G >/dev/null; fi
$BIN --cache-file $D/cache vol create bp/vol0 --size 2G
$BIN --cache-file $D/cache serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
P=$!
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
U=nbd://127.0.0.1:$PORT/bp/vol0
fio --name=pre --ioengine=nbd --uri=$U --rw=write --bs=1M --iodepth=8 --size=2G --end_fsync=1 --output=/dev/null
fio --name=fill --ioengine=nbd --uri=$U --rw=read --bs=1M --iodepth=8 --size=2G --output=/dev/null
sleep ${SETTLE:-8}
if [ -n "$OUT" ]; then ${PERFCMD:-perf record -F 4000 -g} -p $P -o $OUT > /dev/null 2>&1 & PP=$!; sleep 0.3; fi
read u0 s0 < <(awk '{print $14, $15}' /proc/$P/stat)
fio --name=x --ioengine=nbd --uri=$U --rw=randread --bs=4k --iodepth=$QD --time_based --runtime=$T --randrepeat=0 --norandommap --output-format=json --output=$D/rr.json
read u1 s1 < <(awk '{print $14, $15}' /proc/$P/stat)
[ -n "$OUT" ] && { kill -INT $PP; wait $PP; }
python3 - $u0 $s0 $u1 $s1 $D/rr.json <<'P'
import json,sys
u0,s0,u1,s1=map(int,sys.argv[1:5])
t=open(sys.argv[5]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]
r=j['read']; ios=r['total_ios']
print(f"iops {r['iops']:.0f} server user {(u1-u0)*1e4/ios:.2f} sys {(s1-s0)*1e4/ios:.2f} us/IO fio usr+sys {j['usr_cpu']+j['sys_cpu']:.0f}%")
P
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
