#!/bin/bash
# usage: run1.sh VARIANT CLIENTS [SECONDS]  -> prints "cycles/s"
# One persistent `mariadb` CLI connection per client, fed its statement file in a loop.
# Cycles counted on the server: delta of Com_delete (floor: Com_select / 2) over SECONDS,
# after 1 s of warm-up.
V=$1; C=$2; D=${3:-10}
cd /tmp/prof29/my
MY="mariadb -h127.0.0.1 -uroot -N -B --skip-auto-rehash test"
ctr=Com_delete; div=1
[ "$V" = a_floor ] && { ctr=Com_select; div=2; }
pids=()
for ((c=0;c<C;c++)); do
  ( while :; do cat stmts/$V.$c.sql || exit; done | $MY >/dev/null 2>>/tmp/prof29/my/errors.log ) &
  pids+=($!)
done
sleep 1
io() { mariadb -h127.0.0.1 -uroot -N -B -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_data_fsyncs','Innodb_log_writes','Innodb_os_log_written')" | awk '{printf "%s ", $2}'; }
i0=$(io)
get() { mariadb -h127.0.0.1 -uroot -N -B -e "SHOW GLOBAL STATUS LIKE '$ctr'" | awk '{print $2}'; }
n0=$(get); t0=$(date +%s.%N)
sleep $D
n1=$(get); t1=$(date +%s.%N)
i1=$(io)
# fsyncs and redo bytes per cycle (deltas of SHOW GLOBAL STATUS / cycles), order: data_fsyncs log_writes log_written (SHOW STATUS order)
echo "$V $C $n0 $n1 $div $i0 $i1" | awk '{n=($4-$3)/$5; printf "%s %s cycles=%d data_fsyncs/cyc=%.3f log_writes/cyc=%.3f redo_bytes/cyc=%.0f\n",$1,$2,n,($9-$6)/n,($10-$7)/n,($11-$8)/n}' >> /tmp/prof29/results/mystats.txt
for p in "${pids[@]}"; do kill -- -$p 2>/dev/null; pkill -P $p 2>/dev/null; kill $p 2>/dev/null; done
wait 2>/dev/null
# rows of cycles cut off mid-way would make the next run's seeds INSERT of a repeated key fail
mariadb -h127.0.0.1 -uroot test -e "DELETE FROM prof_seed; DELETE FROM prof_lock; DELETE FROM prof_lock_nt"
awk -v a=$n0 -v b=$n1 -v t0=$t0 -v t1=$t1 -v d=$div 'BEGIN{printf "%.1f\n", (b-a)/d/(t1-t0)}'
