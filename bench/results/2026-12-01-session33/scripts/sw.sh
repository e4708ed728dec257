#!/bin/bash
# seqwrite 128k qd8 whole volume + end_fsync; server CPU per IO and per-thread CPU
PID=$(cat /var/tmp/s33/srv.pid)
declare -A T0; for t in /proc/$PID/task/*; do T0[$(cat $t/comm)]=$(( ${T0[$(cat $t/comm)]:-0} + $(awk '{print $14+$15}' $t/stat) )); done
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
fio --name=x --ioengine=nbd --uri=nbd://127.0.0.1:10899/${EXPORT-bp/vol0} --rw=write --bs=128k --iodepth=8 --size=2G --end_fsync=1 --output-format=json --output=/var/tmp/s33/fio.json
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
for t in /proc/$PID/task/*; do c=$(cat $t/comm); v=$(awk '{print $14+$15}' $t/stat); echo "$c $v"; done | awk '{a[$1]+=$2} END {for (k in a) printf "%s=%d ", k, a[k]; print ""}'
python3 - $t0 $t1 <<'P'
import json,sys
j=json.load(open('/var/tmp/s33/fio.json'))['jobs'][0]
r=j['write']; ios=r['total_ios']; cpu=(int(sys.argv[2])-int(sys.argv[1]))/100
print(f"iops {r['iops']:.0f} bw {r['bw']/1024:.0f} MiB/s runtime {r['runtime']}ms server cpu {cpu:.2f}s = {cpu*1e6/ios:.1f} us/IO fio usr+sys {j['usr_cpu']+j['sys_cpu']:.0f}%")
P
