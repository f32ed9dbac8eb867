#!/bin/bash
# usage: perf/perf_my.sh VARIANT TAG : my/run1.sh VARIANT 8 (20 s); perf record -g on mariadbd (all threads) 10 s, perf trace -s 5 s
V=$1; TAG=$2; cd /tmp/prof29
my/run1.sh $V 8 20 > perf/$TAG.tps.txt 2>/dev/null &
B=$!
sleep 3
P=$(pgrep -x mariadbd)
perf record -g -o perf/$TAG.data -p $P -- sleep 10 2> perf/$TAG.record.log
perf trace -s -p $P -o perf/$TAG.trace.txt -- sleep 5 2>/dev/null
wait $B
perf report -i perf/$TAG.data --no-children --sort symbol --stdio 2>/dev/null | grep -v '^$' > perf/$TAG.report_full.txt
perf report -i perf/$TAG.data --no-children --sort symbol --stdio -g none --percent-limit 0.7 2>/dev/null | grep -v '^$' > perf/$TAG.report.txt
perf report -i perf/$TAG.data --children --sort symbol --stdio -g none --percent-limit 2 2>/dev/null | grep -v '^$' > perf/$TAG.report_children.txt
cat perf/$TAG.tps.txt
