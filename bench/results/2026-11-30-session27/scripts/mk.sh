#!/bin/bash
POOL_SIZE=${POOL_SIZE:-6G} bash /var/tmp/s27/serve2.sh && P=$(cat /var/tmp/s26/srv.pid) && kill -TERM $P; while kill -0 $P 2>/dev/null; do sleep 0.1; done
