#!/bin/bash
# experiment: 4K qd64 with 4ms injected, tmpfs pool
set -euo pipefail
B=${B:-/work/main/target/release/oxpool}
D=$(mktemp -d ${POOL_DIR:-/dev/shm}/g5.XXXX)
C=(--cache-file "$D/c")
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; sleep 1; fi; rm -rf "$D"; }
trap cleanup EXIT
"$B" "${C[@]}" create g5 "$D/p.img" --size 2G >/dev/null
"$B" "${C[@]}" vol create g5/v --size 512M >/dev/null
"$B" "${C[@]}" set data_cache_max=0 g5
"$B" "${C[@]}" serve --listen 127.0.0.1:10899 >"$D/serve.log" 2>&1 &
PID=$!
for _ in $(seq 50); do [ -S "$D/c.run/server-$PID.sock" ] && break; sleep 0.1; done
URI=nbd://127.0.0.1:10899/g5/v
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=512M --end_fsync=1 > $D/fill.log 2>&1 || { cat $D/fill.log $D/serve.log; exit 1; }
"$B" "${C[@]}" inject -d p.img -D 4 -T read g5 >/dev/null
for qd in ${QDS:-1 64}; do
if [ -n "${HOOK:-}" ]; then (sleep 3; SPID=$PID bash -c "$HOOK") & fi
${FIOPFX:-} fio --name=r --ioengine=nbd --uri="$URI" --rw=randread --bs=${BS:-4k} --iodepth=$qd --size=512M --time_based --runtime=${RT:-6} --output-format=json > $D/r.json 2>/dev/null
python3 - $D/r.json $qd <<'PY'
import json,sys
t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]
r=j["read"]; p=r["clat_ns"]["percentile"]
print(f"qd{sys.argv[2]} iops {r['iops']:.0f} lat {r['lat_ns']['mean']/1e6:.2f}ms p1 {p['1.000000']/1e6:.2f} p50 {p['50.000000']/1e6:.2f} p99 {p['99.000000']/1e6:.2f} usr {j['usr_cpu']:.1f} sys {j['sys_cpu']:.1f}")
PY
done
