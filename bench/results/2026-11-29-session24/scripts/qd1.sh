#!/bin/bash
# experiment: 4K randread, cached, at QD, server CPU per IO
set -euo pipefail
B=${B:-/work/main/target/release/oxpool}
D=$(mktemp -d /var/tmp/qd1.XXXX)
C=(--cache-file "$D/c")
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; sleep 1; fi; rm -rf "$D"; }
trap cleanup EXIT
"$B" "${C[@]}" create g5 "$D/p.img" --size 4G >/dev/null
"$B" "${C[@]}" vol create g5/v --size 1G >/dev/null
${SRVPFX:-} "$B" "${C[@]}" serve --listen 127.0.0.1:10899 >"$D/serve.log" 2>&1 &
PID=$!
for _ in $(seq 50); do [ -S "$D/c.run/server-$PID.sock" ] && break; sleep 0.1; done
URI=nbd://127.0.0.1:10899/g5/v
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 >/dev/null 2>&1
fio --name=warm --ioengine=nbd --uri=$URI --rw=read --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
for qd in ${QDS:-1}; do
if [ -n "${HOOK:-}" ]; then (sleep 3; SPID=$PID bash -c "$HOOK") & fi
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
fio --name=r --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --iodepth=$qd --size=1G --time_based --runtime=${RT:-8} --output-format=json > $D/r.json 2>/dev/null
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 - $D/r.json $qd $((t1-t0)) <<'PY'
import json,sys,os
t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]
r=j["read"]; ticks=int(sys.argv[3]); hz=os.sysconf('SC_CLK_TCK')
ios=r['total_ios']
print(f"qd{sys.argv[2]} iops {r['iops']:.0f} lat {r['lat_ns']['mean']/1e3:.1f}us srv_cpu/io {ticks/hz/ios*1e6:.1f}us fio usr {j['usr_cpu']:.1f} sys {j['sys_cpu']:.1f}")
PY
done
