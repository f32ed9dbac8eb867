#!/bin/bash
# Interleaved passes: pass 1 in list order, pass 2 reversed, pass 3 in order again ...
# Each item: SYSTEM VARIANT CLIENTS; output lines: pass system variant clients tps
PASSES=${PASSES:-3}; D=${D:-10}
cd /tmp/prof29
items=()
for c in 1 8; do
  for v in a_floor b_seeds_dur g_seedsondblock_dur f_noreturning_dur e_nonextval_dur d_noadvisory_dur c_dblock_dur \
           b_seeds_unl g_seedsondblock_unl f_noreturning_unl e_nonextval_unl d_noadvisory_unl c_dblock_unl; do
    items+=("pg $v $c"); done
  for v in a_floor b_seeds b2_seeds_trig b3_seeds_notrig c_dblock e_noreturning f_notrig; do items+=("my $v $c"); done
  items+=("redis py_set_evalsha $c")
done
for ((p=1;p<=PASSES;p++)); do
  if (( p % 2 == 0 )); then order=($(seq $((${#items[@]}-1)) -1 0)); else order=($(seq 0 $((${#items[@]}-1)))); fi
  for i in "${order[@]}"; do
    set -- ${items[$i]}
    case $1 in
      pg) r=$(pg/run1.sh $2.sql $3 $D);;
      my) r=$(my/run1.sh $2 $3 $D 2>/dev/null);;
      redis) r=$(redis/run1.sh $3 $D);;
    esac
    echo "$p $1 $2 $3 $r $(date -u +%H:%M:%S)" | tee -a results/runs.txt
  done
done
echo ALLDONE | tee -a results/runs.txt
