#!/bin/bash
# the disk's own rate for the same bytes: 2 GiB sequential, 1M direct writes at iodepth 16,
# end_fsync, onto a file already written once (as the pool's file is)
F=/var/tmp/s18/disk.img; mkdir -p /var/tmp/s18
[ -f $F ] || fio --name=p --filename=$F --size=2G --rw=write --bs=1M --iodepth=16 --ioengine=io_uring --direct=1 --end_fsync=1 --output=/dev/null
fio --name=d --filename=$F --size=2G --rw=write --bs=${BS:-1M} --iodepth=${QD:-16} --ioengine=io_uring --direct=1 --end_fsync=1 --output-format=json --output=/var/tmp/s18/disk.json
python3 -c "
import json; j=json.load(open('/var/tmp/s18/disk.json'))['jobs'][0]['write']; print(f\"disk bs=${BS:-1M} qd=${QD:-16} {j['bw']/1024:.0f} MiB/s runtime {j['runtime']}ms\")"
