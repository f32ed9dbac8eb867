-- The lock history (`LockerBuilder::history`): one row per event of a lock (acquired,
-- released, lost, force-released, a job's run, ...), written in batches by the Locker that
-- saw it and trimmed to its retention by the reaper. The lock table stays the truth: a
-- crash loses at most the last batch of events, never a lock. `at` is the database
-- clock's time of the event, as UTC text like the lock table's times.
CREATE TABLE IF NOT EXISTS {table}_events (
    id            INTEGER      PRIMARY KEY AUTOINCREMENT,
    at            DATETIME     NOT NULL,
    kind          VARCHAR(32)  NOT NULL,
    lock_key      VARCHAR(128) NOT NULL,
    owner         TEXT         NOT NULL,
    fencing_token INTEGER,
    detail        TEXT
);

CREATE INDEX IF NOT EXISTS {table}_events_key_idx ON {table}_events (lock_key, at);
CREATE INDEX IF NOT EXISTS {table}_events_at_idx ON {table}_events (at);
