-- seeds' table as in benches/compare/handwritten.rs (MySeed::create_table)
CREATE TABLE prof_seed (
    lock_key    VARCHAR(128) NOT NULL,
    lock_value  VARCHAR(64)  NOT NULL,
    expire_time DATETIME     NOT NULL,
    PRIMARY KEY (lock_key)) ENGINE = InnoDB;
-- migrations/mysql/V1 with {table} = prof_lock
CREATE TABLE IF NOT EXISTS prof_lock_fencing (
    bucket     TINYINT UNSIGNED NOT NULL PRIMARY KEY,
    last_token BIGINT           NOT NULL
) ENGINE = InnoDB;
INSERT IGNORE INTO prof_lock_fencing (bucket, last_token) VALUES
    (0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0),
    (8, 0), (9, 0), (10, 0), (11, 0), (12, 0), (13, 0), (14, 0), (15, 0);
CREATE TABLE IF NOT EXISTS prof_lock (
    lock_key      VARBINARY(128) NOT NULL,
    lock_value    VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    expire_time   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    fencing_token BIGINT       NOT NULL DEFAULT 0,
    acquired_at   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (lock_key),
    KEY prof_lock_expire_time_idx (expire_time)
) ENGINE = InnoDB;
DROP TRIGGER IF EXISTS prof_lock_fence_insert;
DELIMITER //
CREATE TRIGGER prof_lock_fence_insert BEFORE INSERT ON prof_lock FOR EACH ROW
BEGIN
    UPDATE prof_lock_fencing SET last_token = LAST_INSERT_ID(last_token + 1)
     WHERE bucket = CRC32(NEW.lock_key) % 16;
    SET NEW.fencing_token = LAST_INSERT_ID();
END//
DELIMITER ;
-- the same table without the trigger
CREATE TABLE prof_lock_nt LIKE prof_lock;
