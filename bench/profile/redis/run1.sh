#!/bin/bash
# usage: redis/run1.sh CLIENTS [SECONDS] -> cycles/s of the Python raw-socket SET NX PX + EVALSHA loop
python3 /tmp/prof29/redis/cycle.py $1 ${2:-10}
