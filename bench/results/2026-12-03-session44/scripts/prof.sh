#!/bin/bash
# usage: prof.sh OUT [rw bs iodepth] -> fresh pool + server, perf record over one cell
OUT=$1; RW=${2:-write}; BS=${3:-128k}; QD=${4:-8}
BIN=${BIN:-/work/main/target/release/oxpool}; PORT=10899; D=/var/tmp/s44/pool
rm -f $D/cache; mkdir -p $D
if [ -f $D/dev0.img ]; then $BIN --cache-file $D/cache create -f bp $D/dev0.img >/dev/null
else $BIN --cache-file $D/cache create bp $D/dev0.img --size 6G >/dev/null; fi
$BIN --cache-file $D/cache vol create bp/vol0 --size 2G
sync; echo 1 > /proc/sys/vm/drop_caches
$BIN --cache-file $D/cache serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
P=$!
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
U=nbd://127.0.0.1:$PORT/bp/vol0
fio --name=pre --ioengine=nbd --uri=$U --rw=write --bs=1M --iodepth=8 --size=2G --output=/dev/null
sleep 1
if [ -n "$OUT" ]; then ${PERFCMD:-perf record -F 4000 -g} -p $P -o $OUT > /dev/null 2>&1 & PP=$!; sleep 0.3; fi
T0=$(awk '{print $14+$15}' /proc/$P/stat)
fio --name=c --ioengine=nbd --uri=$U --rw=$RW --bs=$BS --iodepth=$QD ${TIME:+--time_based --runtime=$TIME} --size=2G --end_fsync=1 --output-format=terse --terse-version=3 > $D/fio.txt
T1=$(awk '{print $14+$15}' /proc/$P/stat)
[ -n "$OUT" ] && { kill -INT $PP; wait $PP; }
python3 - $D/fio.txt $T0 $T1 <<'PY'
import sys
f=open(sys.argv[1]).read().strip().split(';')
riops=float(f[7]); wiops=float(f[48]); rt=max(float(f[8]),float(f[49]))
ios=riops*rt/1000 + 0; ios=(riops+wiops)*max(float(f[8]),float(f[49]))/1000
cpu=(int(sys.argv[3])-int(sys.argv[2]))/100.0
print(f"read {riops:.0f} write {wiops:.0f} IOPS, runtime {rt:.0f} ms, server cpu {cpu:.2f}s = {cpu*1e6/ios:.1f} us/IO")
PY
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
