#!/bin/bash
# The client's ceiling over TLS: fio (libnbd/GnuTLS) against nbdkit's null plugin with --tls=require,
# beside plain oxpool and oxpool-tls (BIN), 128K sequential read qd8, 3 runs each, taking turns.
set -e
BIN=${BIN:-/work/main/target/release/oxpool}; RT=${RT:-8}
W=/var/tmp/tlsnull; rm -rf $W; mkdir -p $W/pki/server $W/home/.pki/libnbd
cleanup() { for p in $(cat $W/*.pid 2>/dev/null); do kill -TERM $p 2>/dev/null; done; sleep 3; rm -rf $W; }
trap cleanup EXIT
cd $W/pki
certtool --generate-privkey --bits 2048 --outfile ca-key.pem 2>/dev/null
printf 'cn = bench CA\nca\ncert_signing_key\nexpiration_days = 10\n' > ca.info
certtool --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile server/ca-cert.pem 2>/dev/null
certtool --generate-privkey --bits 2048 --outfile server/server-key.pem 2>/dev/null
printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 10\n' > s.info
certtool --generate-certificate --load-ca-certificate server/ca-cert.pem --load-ca-privkey ca-key.pem --load-privkey server/server-key.pem --template s.info --outfile server/server-cert.pem 2>/dev/null
cp server/ca-cert.pem $W/home/.pki/libnbd/
nbdkit --foreground --exit-with-parent --ipaddr=127.0.0.1 --port=10921 --tls=require --tls-certificates=$W/pki/server null size=2G > $W/null.log 2>&1 & echo $! > $W/null.pid
nbdkit --foreground --exit-with-parent --ipaddr=127.0.0.1 --port=10922 null size=2G > $W/null2.log 2>&1 & echo $! > $W/null2.pid
$BIN --cache-file $W/c create p $W/p.img --size 6G >/dev/null
$BIN --cache-file $W/c vol create p/vol0 --size 2G >/dev/null
$BIN --cache-file $W/c serve p --listen 127.0.0.1:10923 > $W/plain.log 2>&1 & echo $! > $W/plain.pid
for i in $(seq 50); do grep -q ready $W/plain.log && break; sleep 0.2; done
B2=${BIN_TLS:-$BIN}
$B2 --cache-file $W/c2 create q $W/q.img --size 6G >/dev/null
$B2 --cache-file $W/c2 vol create q/vol0 --size 2G >/dev/null
$B2 --cache-file $W/c2 serve q --listen 127.0.0.1:10924 --tls require --tls-certificates $W/pki/server > $W/tls.log 2>&1 & echo $! > $W/tls.pid
for i in $(seq 50); do grep -q ready $W/tls.log && break; sleep 0.2; done
sleep 1
export HOME=$W/home
for u in nbd://127.0.0.1:10923/p/vol0 nbds://localhost:10924/q/vol0; do
  fio --name=f --ioengine=nbd --uri=$u --rw=write --bs=1m --iodepth=8 --size=2G >/dev/null
  fio --name=f --ioengine=nbd --uri=$u --rw=read --bs=1m --iodepth=8 --size=2G >/dev/null
done
for r in 1 2 3; do
  for u in nbd://127.0.0.1:10922/ nbds://localhost:10921/ nbd://127.0.0.1:10923/p/vol0 nbds://localhost:10924/q/vol0; do
    iops=$(fio --name=f --ioengine=nbd --uri=$u --rw=read --bs=128k --iodepth=8 --size=2G --runtime=$RT --time_based --output-format=json | python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):]); print(round(j['jobs'][0]['read']['iops']), round(j['jobs'][0]['usr_cpu']+j['jobs'][0]['sys_cpu']))")
    echo "round $r $u: $iops (IOPS, fio CPU %)"
  done
done
