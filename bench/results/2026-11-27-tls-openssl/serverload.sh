#!/bin/bash
# serverload.sh BIN MODE(plain|tls) RW(read|write) RUNTIME [flat|g]: server CPU per I/O and IOPS
# of fio 128k qd8 against BIN serving pool tw (volume tw/v, 2 GiB) from cache file $W/cache;
# $W/tls/server holds the certificates (made as bench/oxbench.py's tls_pki does) and
# $W/tls/home/.pki/libnbd/ca-cert.pem the CA for fio. With flat or g, perf records the server
# (g: DWARF call graphs). Run it under flock /tmp/oxpool-bench.lock.
BIN=$1; MODE=$2; RW=$3; RT=${4:-8}; PERF=${5:-}
W=/var/tmp/tlsw; PORT=10899
TLS=(); SCHEME=nbd
if [ "$MODE" = tls ]; then TLS=(--tls require --tls-certificates $W/tls/server); SCHEME=nbds; fi
$BIN --cache-file $W/cache serve tw --listen 127.0.0.1:$PORT "${TLS[@]}" >$W/server.log 2>&1 &
SPID=$!
for i in $(seq 100); do grep -q ^ready $W/server.log && break; sleep 0.1; done
URI="$SCHEME://127.0.0.1:$PORT/tw/v"
# warm: one pass not measured
if [ "$RW" = read ]; then
HOME=$W/tls/home fio --name=w --ioengine=nbd --uri=$URI --rw=read --bs=1M --iodepth=8 --size=2G --output-format=json >/dev/null 2>&1
fi
HOME=$W/tls/home fio --name=w --ioengine=nbd --uri=$URI --rw=$RW --bs=128k --iodepth=8 --time_based --runtime=2 --output-format=json >/dev/null 2>&1
read -r u0 s0 < <(awk '{print $14, $15}' /proc/$SPID/stat)
if [ -n "$PERF" ]; then perf record -F 2000 $( [ "$PERF" = g ] && echo --call-graph=dwarf,16384 ) -p $SPID -o $W/perf-$MODE-$RW.data 2>/dev/null & PP=$!; fi
HOME=$W/tls/home fio --name=w --ioengine=nbd --uri=$URI --rw=$RW --bs=128k --iodepth=8 --time_based --runtime=$RT --output-format=json > $W/fio.json 2>$W/fio.err
read -r u1 s1 < <(awk '{print $14, $15}' /proc/$SPID/stat)
$BIN --cache-file $W/cache iostat --json tw | python3 -c "import json,sys; j=json.load(sys.stdin); print('  hits',j['data_cache_hits'],'misses',j['data_cache_misses'],'cache MiB',j['data_cache_bytes']>>20, end=' ')"
if [ -n "$PERF" ]; then kill -INT $PP; wait $PP; fi
kill $SPID; wait $SPID 2>/dev/null
python3 - "$u0" "$s0" "$u1" "$s1" <<'PY'
import json,sys
u0,s0,u1,s1=map(int,sys.argv[1:5])
t=open('/var/tmp/tlsw/fio.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]
d=j['read'] if j['read']['total_ios'] else j['write']
ios=d['total_ios']; rt=d['runtime']/1000
cpu=(u1-u0+s1-s0)*10000
print(f"ios={ios} iops={ios/rt:.0f} MB/s={d['bw_bytes']/1e6:.0f} us/IO={cpu/ios:.1f} (user {(u1-u0)*10000/ios:.1f} sys {(s1-s0)*10000/ios:.1f}) cpu%={cpu/1e4/rt:.0f}")
PY
