#!/bin/bash
# runs "$@"; prints vda's utilization and mean queue depth over it
a=($(awk '$3=="vda"{print $13, $14}' /proc/diskstats)); t0=$(date +%s%N); "$@"; t1=$(date +%s%N); b=($(awk '$3=="vda"{print $13, $14}' /proc/diskstats))
python3 -c "dt=($t1-$t0)/1e6; print(f'vda: busy {(${b[0]}-${a[0]})/dt*100:.0f} %, mean queue {(${b[1]}-${a[1]})/dt:.2f}')"
