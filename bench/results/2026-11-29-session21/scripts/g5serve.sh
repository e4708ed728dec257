#!/bin/bash
# g5serve.sh BIN [POOL_DIR]: pool + 1G vol filled, data_cache_max=0, inject 4ms reads; serves on 10809; prints PID; dir in /var/tmp/s21/g5dir
set -euo pipefail
B=$1; PD=${2:-/var/tmp}
D=$(mktemp -d "$PD/oxg5.XXXX"); echo "$D" > /var/tmp/s21/g5dir
C=(--cache-file "$D/c")
"$B" "${C[@]}" create g5 "$D/p.img" --size 4G >/dev/null
"$B" "${C[@]}" vol create g5/v --size 1G >/dev/null
"$B" "${C[@]}" set data_cache_max=0 g5
if [ -n "${SCHEDULER:-}" ]; then "$B" "${C[@]}" set scheduler="$SCHEDULER" g5; fi
setsid "$B" "${C[@]}" serve >"$D/serve.log" 2>&1 < /dev/null &
PID=$!; echo $PID > /var/tmp/s21/g5pid
for _ in $(seq 50); do [ -S "$D/c.run/server-$PID.sock" ] && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:10809/g5/v --rw=write --bs=1M --iodepth=8 --size=1G --end_fsync=1 >/dev/null 2>&1
[ "${DELAY_MS:-4}" = 0 ] || "$B" "${C[@]}" inject -d p.img -D "${DELAY_MS:-4}" -T read g5 >/dev/null
echo "PID $PID DIR $D"
