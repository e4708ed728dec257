#!/bin/bash
# Session 41: fresh pool (6G file, 2G volume), precondition, then N rounds of syncwrite-4k-qd1 (10 s each): IOPS, server CPU/IO, per-thread CPU deltas
BIN=${BIN:-/work/main/target/release/oxpool}; PORT=10899; N=${N:-6}
export D=${D:-/var/tmp/s41/pool}; mkdir -p $D; rm -f $D/cache
if [ -f $D/dev0.img ]; then $BIN --cache-file $D/cache create -f bp $D/dev0.img >/dev/null
else $BIN --cache-file $D/cache create bp $D/dev0.img --size 6G >/dev/null; fi
$BIN --cache-file $D/cache vol create bp/vol0 --size 2G
[ -n "$SET" ] && $BIN --cache-file $D/cache set $SET bp
sync; echo 1 > /proc/sys/vm/drop_caches
$BIN --cache-file $D/cache serve bp --listen 127.0.0.1:$PORT > $D/serve.log 2>&1 &
P=$!; echo $P > $D/srv.pid
for i in $(seq 100); do grep -q "ready" $D/serve.log && break; sleep 0.1; done
fio --name=pre --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/bp/vol0 --rw=write --bs=1M --iodepth=8 --size=2G --output=/dev/null
thr() { for t in /proc/$P/task/*; do echo "$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done | awk '{a[$1]+=$2} END {for (k in a) print k, a[k]}' | sort; }
for r in $(seq $N); do
  thr > $D/t0; c0=$(awk '{print $14+$15}' /proc/$P/stat)
  $BIN --cache-file $D/cache iostat --json bp > $D/i0.json 2>/dev/null
  fio --name=s --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/bp/vol0 --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --time_based --runtime=10 --size=2G --output-format=json --output=$D/f.json
  c1=$(awk '{print $14+$15}' /proc/$P/stat); thr > $D/t1
  $BIN --cache-file $D/cache iostat --json bp > $D/i1.json 2>/dev/null
  python3 - $c0 $c1 <<'P'
import json,sys,os
FILT=os.environ.get('FILT','log_write,device_flush,written,misses,txg,sync')
j=json.load(open(os.environ['D']+'/f.json'))['jobs'][0]['write']; ios=j['total_ios']
cpu=(int(sys.argv[2])-int(sys.argv[1]))/100
t0=dict(l.split() for l in open(os.environ['D']+'/t0')); t1=dict(l.split() for l in open(os.environ['D']+'/t1'))
th=' '.join(f"{k}={int(t1[k])-int(t0.get(k,0))}" for k in t1 if int(t1[k])-int(t0.get(k,0))>0)
try:
  a=json.load(open(os.environ['D']+'/i0.json')); b=json.load(open(os.environ['D']+'/i1.json'))
  def flat(d,p=''):
    out={}
    for k,v in d.items():
      if isinstance(v,dict): out.update(flat(v,p+k+'.'))
      elif isinstance(v,(int,float)): out[p+k]=v
    return out
  fa,fb=flat(a),flat(b)
  keys=[k for k in fb if fb[k]-fa.get(k,0)>0 and any(s in k for s in FILT.split(','))]
  ctr=' '.join(f"{k.split('.')[-1]}={(fb[k]-fa.get(k,0))/ios:.2f}" for k in keys)
except Exception as e: ctr=str(e)
print(f"iops {j['iops']:.0f} cpu {cpu*1e6/ios:.0f} us/IO | {th} | {ctr}")
P
done
kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
