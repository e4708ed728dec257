#!/bin/bash
# randread 4k, QD (default 32), 10 s, on the served pool; server CPU per IO (user, sys)
PID=$(cat /var/tmp/s26/srv.pid)
read u0 s0 < <(awk '{print $14, $15}' /proc/$PID/stat)
fio --name=x --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=randread --bs=4k --iodepth=${QD:-32} --time_based --runtime=${T:-10} --randrepeat=0 --norandommap --output-format=json --output=/var/tmp/s27/rr.json
read u1 s1 < <(awk '{print $14, $15}' /proc/$PID/stat)
python3 - $u0 $s0 $u1 $s1 <<'P'
import json,sys
u0,s0,u1,s1=map(int,sys.argv[1:])
j=json.load(open('/var/tmp/s27/rr.json'))['jobs'][0]
r=j['read']; ios=r['total_ios']
print(f"iops {r['iops']:.0f} server user {(u1-u0)*1e4/ios:.2f} sys {(s1-s0)*1e4/ios:.2f} us/IO fio usr+sys {j['usr_cpu']+j['sys_cpu']:.0f}%")
P
