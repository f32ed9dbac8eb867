\set k random(1, 1000000000)
\set key :client_id * 10000000000 + :k
INSERT INTO prof_seed_u (lock_key, lock_value, expire_time) VALUES (:key, :owner, NOW() + INTERVAL '30 seconds');
DELETE FROM prof_seed_u WHERE lock_key = :key AND lock_value = :owner;
