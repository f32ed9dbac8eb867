#!/bin/bash
# usage: pg/run1.sh SCRIPT CLIENTS [SECONDS] -> prints "tps" (pgbench, without connection time)
S=$1; C=$2; D=${3:-10}; J=$(( C < 2 ? 1 : 2 ))
cd /tmp/prof29/pg
W="select wal_records||' '||wal_fpi||' '||wal_bytes||' '||wal_sync from pg_stat_wal"
w0=$(psql -h 127.0.0.1 -U postgres test -Atc "$W")
out=$(pgbench -h 127.0.0.1 -U postgres -n -M prepared -c $C -j $J -T $D \
      -D owner=6f1c2e0a-3b7d-4c55-9a1e-2f8b7d0c4e91 -D lease=30000000 -f $S test 2>&1)
w1=$(psql -h 127.0.0.1 -U postgres test -Atc "$W")
x=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
# WAL per cycle: records fpi bytes syncs (pg_stat_wal deltas / transactions; includes autovacuum etc.)
echo "$S $C $x $w0 $w1" | awk '{x=$3; printf "%s %s xacts=%d rec/cyc=%.2f fpi/cyc=%.3f bytes/cyc=%.0f syncs/cyc=%.3f\n",$1,$2,x,($8-$4)/x,($9-$5)/x,($10-$6)/x,($11-$7)/x}' >> /tmp/prof29/results/walstats.txt
echo "$out" >> /tmp/prof29/results/pgbench_raw.log
f=$(echo "$out" | grep -c 'number of failed transactions: 0 ')
tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
[ "$f" = 1 ] && [ -n "$tps" ] || { echo "ERR"; exit 1; }
echo $tps
