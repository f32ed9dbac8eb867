-- The lock history (`LockerBuilder::history`): one row per event of a lock (acquired,
-- released, lost, force-released, a job's run, ...), written in batches by the Locker that
-- saw it and trimmed to its retention by the reaper. The lock table stays the truth: a
-- crash loses at most the last batch of events, never a lock. `at` is the database
-- clock's time of the event; keys are exact bytes, as in the lock table.
CREATE TABLE IF NOT EXISTS {table}_events (
    id            BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at            TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    kind          VARCHAR(32)    CHARACTER SET ascii NOT NULL,
    lock_key      VARBINARY(128) NOT NULL,
    owner         VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    fencing_token BIGINT         NULL,
    detail        TEXT           CHARACTER SET utf8mb4 NULL,
    KEY {table}_events_key_idx (lock_key, at),
    KEY {table}_events_at_idx (at)
) ENGINE = InnoDB;
