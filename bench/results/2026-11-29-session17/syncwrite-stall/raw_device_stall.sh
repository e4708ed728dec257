#!/bin/bash
# The disk alone, no server: 16K random reads and writes (half each) at iodepth 16 on a 4 GiB
# file for 60 s, IOPS per second. Shows whether the device stalls by itself under the kind of
# traffic a txg sync of 4K random sync writes makes (read-modify-write of 16K blocks).
W=${W:-/var/tmp/rawstall}; rm -rf $W; mkdir -p $W; cd $W
fio --name=a --filename=$W/f --size=4G --rw=randrw --rwmixread=50 --bs=16k --iodepth=16 \
    --ioengine=io_uring --direct=1 --runtime=60 --time_based --log_avg_msec=1000 \
    --write_iops_log=a --group_reporting > out.txt 2>&1
grep -E "read:|write:" out.txt
echo "second read_IOPS write_IOPS"
paste <(awk -F, '$3==0{print int($1/1000), $2}' a_iops.1.log) <(awk -F, '$3==1{print $2+0}' a_iops.1.log)
cd /; rm -rf $W
