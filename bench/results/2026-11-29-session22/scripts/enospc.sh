set -u
D=/var/tmp/s22/enospc/w; rm -rf $D; mkdir -p $D; cd $D; O=${O:-/work/main/target/release/oxpool}; X(){ timeout 120 $O --cache-file $D/cache "$@" >/dev/null 2>$D/last.err || { echo "FAIL: $*: $(cat $D/last.err)"; }; }
head -c 16M /dev/urandom >r16; head -c 32M /dev/urandom >A; head -c 4M /dev/urandom >B; head -c 8M /dev/zero >z8; head -c 16K /dev/urandom >r16k
python3 -c "t=open('/work/main/docs/send.md','rb').read(); open('text16','wb').write((t*(16*2**20//len(t)+1))[:16*2**20])"
X create p p.img --size 512M
X vol create p/v1 --size 64M; X vol write p/v1 r16; X snapshot p/v1@a; X vol write p/v1 --offset 8M r16; X snapshot p/v1@b
for s in d e f; do X vol write p/v1 --offset 40M r16; X snapshot p/v1@$s; done; X destroy p/v1@a,b
X vol create p/d --size 32M; X vol write p/d A; X snapshot p/d@s1; X vol write p/d --offset 5000 B; X snapshot p/d@s2; X vol write p/d --offset 20M B
X rollback -r p/d@s1; X vol write p/d --offset 20M B; X snapshot p/d@s2; X clone p/d@s1 p/c1; X vol write p/c1 B; X promote p/c1; X vol destroy -r p/d
for c in off lz4 zstd zle zstd-19; do X vol create p/c_$c --size 16M -o compression=$c; X vol write p/c_$c text16; done
for c in off lz4 zle; do X vol write p/c_$c z8; done
X vol create p/sz --size 16M; X vol write p/sz text16; X snapshot p/sz@full; X set volsize=8M p/sz; X set volsize=32M p/sz; X rollback p/sz@full
X vol create p/s --size 32M; X vol write p/s A; X snapshot p/s@m1; X vol write p/s --offset 1M B; X snapshot p/s@m2; X vol write p/s --offset 10M B; X snapshot p/s@m3
X rollback p/s@m3; X vol write p/s --offset 20M B; X snapshot p/s@m4; X vol write p/s --offset 5M B; X snapshot p/s@m6
X vol write p/s --offset 7M B; X snapshot p/s@m7; X vol write p/s A; X snapshot p/s@m8
$O --cache-file $D/cache list -p p
$O --cache-file $D/cache serve p --listen 127.0.0.1:11170 > serve.log 2>&1 & SP=$!; sleep 3
fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:11170/p/v1 --rw=randwrite --bs=4k --iodepth=8 --time_based --runtime=5 --size=64M 2>&1 | grep -E "err=|write:" | head -3
kill -TERM $SP; wait $SP
$O --cache-file $D/cache list -p p; X vol create p/new --size 1M; X vol write p/new r16k; $O --cache-file $D/cache audit p | tail -1
