-- dblock lease table for MySQL 8 / MariaDB 10.6+. `{table}` is replaced by the configured,
-- validated table name. MySQL commits DDL implicitly, so every statement is written to be
-- repeated safely after a half-applied run.

-- Fencing counters: 16 buckets, a key always uses the same one (CRC32 of the key), so
-- tokens rise per key while unrelated keys rarely wait on each other.
CREATE TABLE IF NOT EXISTS {table}_fencing (
    bucket     TINYINT UNSIGNED NOT NULL PRIMARY KEY,
    last_token BIGINT           NOT NULL
) ENGINE = InnoDB;

INSERT IGNORE INTO {table}_fencing (bucket, last_token) VALUES
    (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0),
    (8, 0), (9, 0), (10, 0), (11, 0), (12, 0), (13, 0), (14, 0), (15, 0);

-- TIMESTAMP (not DATETIME) so that a plain-SQL client writing NOW() + INTERVAL 30 SECOND
-- in any session time zone stores the right instant. Explicit defaults keep MySQL from
-- adding ON UPDATE CURRENT_TIMESTAMP to them. Keys are exact bytes: VARBINARY, because
-- every utf8mb4 collation both servers share (utf8mb4_bin too) is PAD SPACE, where 'a' and
-- 'a ' are one primary key.
CREATE TABLE IF NOT EXISTS {table} (
    lock_key      VARBINARY(128) NOT NULL,
    lock_value    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    expire_time   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    fencing_token BIGINT       NOT NULL DEFAULT 0,
    acquired_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (lock_key),
    KEY {table}_expire_time_idx (expire_time)
) ENGINE = InnoDB;

-- The token is drawn while the key's bucket row is locked and that lock is held until the
-- acquisition commits: the next winner of the same key draws after it, so tokens never
-- go backwards, whoever inserts (dblock or a plain-SQL client). Losing attempts draw too:
-- gaps are fine.
DROP TRIGGER IF EXISTS {table}_fence_insert;
CREATE TRIGGER {table}_fence_insert BEFORE INSERT ON {table} FOR EACH ROW
BEGIN
    UPDATE {table}_fencing SET last_token = LAST_INSERT_ID(last_token + 1)
     WHERE bucket = CRC32(NEW.lock_key) % 16;
    SET NEW.fencing_token = LAST_INSERT_ID();
END;

-- A takeover (ON DUPLICATE KEY UPDATE) copies the token this trigger drew for the attempted
-- insert, still under the bucket lock: no UPDATE trigger is needed, and none must exist
-- (an UPDATE trigger would hide the LAST_INSERT_ID that extend reports through).
DROP TRIGGER IF EXISTS {table}_fence_takeover;
