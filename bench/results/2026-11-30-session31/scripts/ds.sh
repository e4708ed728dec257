#!/bin/bash
# usage: ds.sh CMD...: vda reads/writes, sectors, over CMD
a=($(awk '$3=="vda"{print $4,$6,$8,$10,$12}' /proc/diskstats))
"$@"
b=($(awk '$3=="vda"{print $4,$6,$8,$10,$12}' /proc/diskstats))
r=$((b[0]-a[0])); w=$((b[2]-a[2])); rs=$((b[1]-a[1])); ws=$((b[3]-a[3]))
echo "reads $r ($((rs/2/ (r>0?r:1))) KiB avg) writes $w ($((ws/2/(w>0?w:1))) KiB avg) total write MiB $((ws/2048))"
