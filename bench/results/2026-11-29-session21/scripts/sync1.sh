#!/bin/bash
fio --name=x --ioengine=nbd --uri=nbd://127.0.0.1:10899/bp/vol0 --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --time_based --runtime=10 --output-format=json 2>/dev/null | python3 -c '
import json,sys
t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["write"]
print("iops %.0f" % j["iops"])'
