#!/bin/bash
# a read storm (4k randread qd${QD:-32}) beside a commit stream (4k write + fsync, qd1), 10 s
U=nbd://127.0.0.1:10809/g5/v
fio --output-format=json --time_based --runtime=10 --ioengine=nbd --uri=$U --bs=4k \
  --name=storm --rw=randread --iodepth=${QD:-32} --offset=0 --size=768M \
  --name=commit --rw=randwrite --iodepth=1 --fsync=1 --offset=768M --size=256M 2>/dev/null | python3 -c '
import json,sys
t=sys.stdin.read(); js=json.loads(t[t.index("{"):])["jobs"]
r=js[0]["read"]; w=js[1]["write"]; s=js[1]["sync"]
print("storm %.0f IOPS; commit %.0f IOPS write lat %.0f us p99 %.0f us, fsync lat %.0f us p99 %.0f us" % (r["iops"], w["iops"], w["lat_ns"]["mean"]/1e3, w["clat_ns"]["percentile"]["99.000000"]/1e3, s["lat_ns"]["mean"]/1e3, s["lat_ns"]["percentile"]["99.000000"]/1e3))'
