#!/bin/bash
# redis-benchmark (C client) of the two commands of the cycle, separately; the cycle rate is
# estimated as 1 / (1/rate(SET NX PX) + 1/rate(EVALSHA)). EVALSHA runs on keys that mostly do
# not exist (returns 0 after the GET, no DEL): slightly cheaper than the real release.
SHA=$(redis-cli SCRIPT LOAD "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end")
for c in 1 8; do
  s=$(redis-benchmark -h 127.0.0.1 -n $((c==1?40000:100000)) -c $c -r 1000000000 --csv SET 'prof:__rand_int__' owner NX PX 30000 | tail -1 | cut -d, -f2 | tr -d '"')
  e=$(redis-benchmark -h 127.0.0.1 -n $((c==1?40000:100000)) -c $c -r 1000000000 --csv EVALSHA $SHA 1 'prof:__rand_int__' owner | tail -1 | cut -d, -f2 | tr -d '"')
  echo "clients=$c SET_NX_PX=$s EVALSHA=$e cycle_est=$(awk -v s=$s -v e=$e 'BEGIN{printf "%.0f", 1/(1/s+1/e)}')"
done
