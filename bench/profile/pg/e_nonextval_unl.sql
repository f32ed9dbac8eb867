\set k random(1, 1000000000)
\set key :client_id * 10000000000 + :k
INSERT INTO prof_lock_relaxed AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
VALUES (:key, :owner, clock_timestamp() + :lease::bigint * INTERVAL '1 microsecond',
       0, clock_timestamp())
ON CONFLICT (lock_key) DO UPDATE
   SET lock_value = EXCLUDED.lock_value,
       expire_time = EXCLUDED.expire_time,
       fencing_token = EXCLUDED.fencing_token,
       acquired_at = EXCLUDED.acquired_at
 WHERE held.expire_time <= clock_timestamp()
RETURNING fencing_token, expire_time \gset
DELETE FROM prof_lock_relaxed WHERE lock_key = :key AND lock_value = :owner AND fencing_token = :fencing_token
RETURNING expire_time <= clock_timestamp(),
          CASE WHEN waiters THEN pg_notify('dblock:' || 'prof_lock_relaxed', fencing_token || ':' || lock_key) IS NULL END;
