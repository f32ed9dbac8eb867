#!/bin/bash
# usage: perf/perf_pg.sh SCRIPT TAG
# pgbench 8 clients on SCRIPT; after 2 s, perf record -g on the 8 backends for 10 s (cpu-clock:
# this VM has no hardware PMU), then perf trace -s (syscall counts and times) on them for 5 s.
S=$1; TAG=$2; cd /tmp/prof29
pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 8 -j 2 -T 20 \
  -D owner=6f1c2e0a-3b7d-4c55-9a1e-2f8b7d0c4e91 -D lease=30000000 -f pg/$S test > perf/$TAG.pgbench.txt 2>&1 &
B=$!
sleep 2
PIDS=$(psql -h 127.0.0.1 -U postgres test -Atc "select string_agg(pid::text, ',') from pg_stat_activity where application_name = 'pgbench'")
echo "backends: $PIDS" > perf/$TAG.pids
perf record -g -o perf/$TAG.data -p $PIDS -- sleep 10 2> perf/$TAG.record.log
perf trace -s -p $PIDS -o perf/$TAG.trace.txt -- sleep 5 2>/dev/null
wait $B
perf report -i perf/$TAG.data --no-children --sort symbol --stdio 2>/dev/null | grep -v '^$' > perf/$TAG.report_full.txt
perf report -i perf/$TAG.data --no-children --sort symbol --stdio -g none --percent-limit 0.7 2>/dev/null | grep -v '^$' > perf/$TAG.report.txt
perf report -i perf/$TAG.data --children --sort symbol --stdio -g none --percent-limit 2 2>/dev/null | grep -v '^$' > perf/$TAG.report_children.txt
grep tps perf/$TAG.pgbench.txt
