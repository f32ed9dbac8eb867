-- Lock keys are compared byte for byte. utf8mb4_bin is a PAD SPACE collation (MariaDB,
-- and MySQL's utf8mb4_bin too), under which 'job' and 'job ' are equal: two distinct keys
-- shared one row and one lock, and a key with a trailing space could read or take over
-- the other's row. VARBINARY compares bytes without padding on every MySQL and MariaDB
-- version, and counts its limit in bytes, as dblock does (128). Safe to re-run.
ALTER TABLE {table} MODIFY lock_key VARBINARY(128) NOT NULL;
