#!/bin/bash
# g5fio.sh BS QD [extra fio args]
bs=$1; qd=$2; shift 2
fio --name=r --ioengine=nbd --uri=nbd://127.0.0.1:10809/g5/v --rw=randread --bs=$bs --iodepth=$qd --size=1G \
   --time_based --runtime=${RT:-8} --output-format=json "$@" 2>/dev/null | python3 -c '
import json,sys
t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["read"]
p=j["clat_ns"]["percentile"]
print("iops %.0f lat_mean %.2f ms clat p1 %.2f p50 %.2f p99 %.2f" % (j["iops"], j["lat_ns"]["mean"]/1e6, p["1.000000"]/1e6, p["50.000000"]/1e6, p["99.000000"]/1e6))'
