#!/bin/bash
# samples vda's written sectors every 100 ms for $1 seconds: MB/s per interval
prev=$(awk '$3=="vda"{print $10}' /proc/diskstats)
for i in $(seq $(( $1 * 10 ))); do sleep 0.1; cur=$(awk '$3=="vda"{print $10}' /proc/diskstats); printf "%d " $(( (cur-prev)*512/100000 )); prev=$cur; done; echo
