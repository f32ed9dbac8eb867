\set k random(1, 1000000000)
\set key :client_id * 10000000000 + :k
INSERT INTO prof_lock_relaxed (lock_key, lock_value, expire_time, fencing_token) VALUES (:key, :owner, NOW() + INTERVAL '30 seconds', 0);
DELETE FROM prof_lock_relaxed WHERE lock_key = :key AND lock_value = :owner;
