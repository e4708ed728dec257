#!/bin/bash
# usage: rr.sh [QD] [BS] [RW]: fio for 10s, prints IOPS and server CPU us/IO
QD=${1:-32}; BS=${2:-4k}; RW=${3:-randread}; PID=$(cat /var/tmp/s18/srv.pid)
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
fio --name=x --ioengine=nbd --uri=nbd://127.0.0.1:10899/${EXPORT:-bp/vol0} --rw=$RW --bs=$BS --iodepth=$QD --time_based --runtime=10 --norandommap --randrepeat=0 --output-format=json --output=/var/tmp/s18/fio.json
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 - $t0 $t1 <<'P'
import json,sys
j=json.load(open('/var/tmp/s18/fio.json'))['jobs'][0]
r=j['read'] if j['read']['io_bytes'] else j['write']
ios=r['total_ios']; cpu=(int(sys.argv[2])-int(sys.argv[1]))/100
print(f"iops {r['iops']:.0f} server cpu {cpu:.2f}s = {cpu*1e6/ios:.2f} us/IO ({cpu*10:.0f}% core) fio usr+sys {j['usr_cpu']+j['sys_cpu']:.0f}%")
P
