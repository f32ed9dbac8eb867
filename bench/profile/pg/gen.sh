#!/bin/bash
# (pg_notify channel written as 'dblock:' || 'T': pgbench would read :T inside a literal as a variable)
# Generates the pgbench scripts, one per (variant, table). Keys: fresh random per
# transaction, unique per client (client_id * 1e10 + random). :owner and :lease come from -D.
cd /tmp/prof29/pg
HDR='\set k random(1, 1000000000)
\set key :client_id * 10000000000 + :k'
for T in prof_lock prof_lock_relaxed; do
  case $T in prof_lock) S=prof_seed; sfx=dur;; prof_lock_relaxed) S=prof_seed_u; sfx=unl;; esac
  if [ $T = prof_lock_relaxed ]; then
    EPOCH=",
           (SELECT started FROM ${T}_epoch) = pg_postmaster_start_time()
           OR ${T}_new_epoch()"
  else EPOCH=""; fi
  UPSERT_TAIL="ON CONFLICT (lock_key) DO UPDATE
   SET lock_value = EXCLUDED.lock_value,
       expire_time = EXCLUDED.expire_time,
       fencing_token = EXCLUDED.fencing_token,
       acquired_at = EXCLUDED.acquired_at
 WHERE held.expire_time <= clock_timestamp()"
  RELEASE="DELETE FROM $T WHERE lock_key = :key AND lock_value = :owner AND fencing_token = :fencing_token
RETURNING expire_time <= clock_timestamp(),
          CASE WHEN waiters THEN pg_notify('dblock:' || '$T', fencing_token || ':' || lock_key) IS NULL END;"
  # a. floor
  printf '%s\nSELECT 1;\nSELECT 1;\n' "$HDR" > a_floor.sql
  # b. seeds: plain INSERT of the 3 columns + owner-checked DELETE, seeds' own 3-column table
  cat > b_seeds_$sfx.sql <<EOF
$HDR
INSERT INTO $S (lock_key, lock_value, expire_time) VALUES (:key, :owner, NOW() + INTERVAL '30 seconds');
DELETE FROM $S WHERE lock_key = :key AND lock_value = :owner;
EOF
  # g. seeds' statements on dblock's table (5 cols + waiters, expire_time index), token 0 given (no nextval)
  cat > g_seedsondblock_$sfx.sql <<EOF
$HDR
INSERT INTO $T (lock_key, lock_value, expire_time, fencing_token) VALUES (:key, :owner, NOW() + INTERVAL '30 seconds', 0);
DELETE FROM $T WHERE lock_key = :key AND lock_value = :owner;
EOF
  # c. dblock ACQUIRE (+ EPOCH_CHECK for the relaxed table) + RELEASE, as in src/dialect/postgres.rs
  cat > c_dblock_$sfx.sql <<EOF
$HDR
WITH serialize AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended('$T:' || :key, 0))$EPOCH
)
INSERT INTO $T AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
SELECT :key, :owner, clock_timestamp() + :lease::bigint * INTERVAL '1 microsecond',
       nextval('${T}_fencing_seq'), clock_timestamp()
  FROM serialize
$UPSERT_TAIL
RETURNING fencing_token, expire_time \gset
$RELEASE
EOF
  # d. c without the advisory-lock CTE (and so without the epoch check), nextval inline
  cat > d_noadvisory_$sfx.sql <<EOF
$HDR
INSERT INTO $T AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
VALUES (:key, :owner, clock_timestamp() + :lease::bigint * INTERVAL '1 microsecond',
       nextval('${T}_fencing_seq'), clock_timestamp())
$UPSERT_TAIL
RETURNING fencing_token, expire_time \gset
$RELEASE
EOF
  # e. d without nextval (token constant 0)
  cat > e_nonextval_$sfx.sql <<EOF
$HDR
INSERT INTO $T AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
VALUES (:key, :owner, clock_timestamp() + :lease::bigint * INTERVAL '1 microsecond',
       0, clock_timestamp())
$UPSERT_TAIL
RETURNING fencing_token, expire_time \gset
$RELEASE
EOF
  # f. e without RETURNING (acquire and release)
  cat > f_noreturning_$sfx.sql <<EOF
$HDR
INSERT INTO $T AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
VALUES (:key, :owner, clock_timestamp() + :lease::bigint * INTERVAL '1 microsecond',
       0, clock_timestamp())
$UPSERT_TAIL;
DELETE FROM $T WHERE lock_key = :key AND lock_value = :owner AND fencing_token = 0;
EOF
done
# The A/B of bench/PROFILE.md's "Tried and not taken": the relaxed acquisition committing
# without a flush while the epoch matches (c2), and the same CASE without set_config (c3).
python3 - <<'PY'
s = open('c_dblock_unl.sql').read()
old = """           (SELECT started FROM prof_lock_relaxed_epoch) = pg_postmaster_start_time()
           OR prof_lock_relaxed_new_epoch()"""
case = """           CASE WHEN (SELECT started FROM prof_lock_relaxed_epoch) = pg_postmaster_start_time()
                THEN {} ELSE prof_lock_relaxed_new_epoch() END"""
assert old in s
open('c2_dblock_unl_async.sql', 'w').write(
    s.replace(old, case.format("set_config('synchronous_commit', 'off', true) IS NOT NULL")))
open('c3_case_only.sql', 'w').write(s.replace(old, case.format("true")))
PY
