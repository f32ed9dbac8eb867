-- The lock history (`LockerBuilder::history`): one row per event of a lock (acquired,
-- released, lost, force-released, a job's run, ...), written in batches by the Locker that
-- saw it and trimmed to its retention by the reaper. The lock table stays the truth: a
-- crash loses at most the last batch of events, never a lock. `at` is the database
-- clock's time of the event. Keys are indexed in byte order (COLLATE "C"), as the history
-- is read by key or key prefix, newest first.
CREATE {unlogged}TABLE IF NOT EXISTS {table}_events (
    id            BIGSERIAL   PRIMARY KEY,
    at            TIMESTAMPTZ NOT NULL,
    kind          TEXT        NOT NULL,
    lock_key      TEXT        NOT NULL,
    owner         TEXT        NOT NULL,
    fencing_token BIGINT,
    detail        TEXT
);

CREATE INDEX IF NOT EXISTS {name}_events_key_idx ON {table}_events (lock_key COLLATE "C", at);
CREATE INDEX IF NOT EXISTS {name}_events_at_idx ON {table}_events (at);
