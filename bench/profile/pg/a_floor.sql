\set k random(1, 1000000000)
\set key :client_id * 10000000000 + :k
SELECT 1;
SELECT 1;
