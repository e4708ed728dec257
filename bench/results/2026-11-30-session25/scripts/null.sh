#!/bin/bash
nbdkit -U - null 2G --run 'fio --name=x --ioengine=nbd --uri="$uri" --rw=write --bs=128k --iodepth=8 --size=2G --end_fsync=1 --output-format=json --output=/var/tmp/s18/null.json' 
python3 -c "
import json; j=json.load(open('/var/tmp/s18/null.json'))['jobs'][0]['write']; print(f\"null {j['bw']/1024:.0f} MiB/s iops {j['iops']:.0f}\")"
