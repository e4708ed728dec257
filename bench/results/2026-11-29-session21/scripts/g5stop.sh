#!/bin/bash
PID=$(cat /var/tmp/s21/g5pid); D=$(cat /var/tmp/s21/g5dir)
kill $PID; sleep 2; rm -rf "$D"
