#!/bin/bash
# A/B: server CPU per I/O for uncached reads. B=binary POOL_DIR BS QD DELAY_MS(0: none)
set -euo pipefail
B=${B:-/work/main/target/release/oxpool}
D=$(mktemp -d "${POOL_DIR:-/var/tmp}/oxab.XXXX")
C=(--cache-file "$D/c")
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; sleep 1; fi; rm -rf "$D"; }
trap cleanup EXIT
"$B" "${C[@]}" create g5 "$D/p.img" --size 4G >/dev/null
"$B" "${C[@]}" vol create g5/v --size 1G >/dev/null
"$B" "${C[@]}" set data_cache_max=0 g5
"$B" "${C[@]}" serve >"$D/serve.log" 2>&1 &
PID=$!
for _ in $(seq 50); do [ -S "$D/c.run/server-$PID.sock" ] && break; sleep 0.1; done
URI=nbd://127.0.0.1:10809/g5/v
fio --name=fill --ioengine=nbd --uri=$URI --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 >/dev/null 2>&1
[ "${DELAY_MS:-4}" != 0 ] && "$B" "${C[@]}" inject -d p.img -D "${DELAY_MS:-4}" -T read g5 >/dev/null
sleep 1
t0=$(awk '{print $14+$15}' /proc/$PID/stat)
fio --name=r --ioengine=nbd --uri="$URI" --rw=randread --bs=${BS:-128k} --iodepth=${QD:-64} --size=1G --time_based --runtime=${RUNTIME:-10} --output-format=json > "$D/r.json" 2>/dev/null
t1=$(awk '{print $14+$15}' /proc/$PID/stat)
python3 -c "
import json; t=open('$D/r.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]['read']
ios=j['total_ios']; print('IOPS', round(j['iops']), 'lat', round(j['lat_ns']['mean']/1e6,2), 'ms', 'server cpu us/IO', round(($t1-$t0)*1e4/ios,1))"
