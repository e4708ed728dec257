#!/bin/bash
# runs "$@" and prints the machine's CPU use over it: user, system, softirq, iowait, idle (in CPU-seconds)
a=($(head -1 /proc/stat)); "$@"; b=($(head -1 /proc/stat))
python3 -c "
a=[int(x) for x in '${a[*]:1}'.split()]; b=[int(x) for x in '${b[*]:1}'.split()]
d=[(y-x)/100 for x,y in zip(a,b)]
print(f'machine: user {d[0]+d[1]:.2f} system {d[2]:.2f} irq {d[5]:.2f} softirq {d[6]:.2f} iowait {d[4]:.2f} idle {d[3]:.2f} steal {d[7]:.2f} (CPU-s)')"
