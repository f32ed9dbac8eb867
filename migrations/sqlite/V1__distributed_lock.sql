-- dblock lease table for SQLite. `{table}` is replaced by the configured, validated table
-- name. Times are UTC text 'YYYY-MM-DD HH:MM:SS.SSS' (SQLite's clock has milliseconds);
-- plain-SQL clients may write datetime('now', '+30 seconds'), which sorts the same way.
CREATE TABLE IF NOT EXISTS {table} (
    lock_key      VARCHAR(128) NOT NULL PRIMARY KEY,
    lock_value    VARCHAR(64)  NOT NULL,
    expire_time   DATETIME     NOT NULL,
    fencing_token INTEGER      NOT NULL DEFAULT 0,
    acquired_at   DATETIME     NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
);

CREATE INDEX IF NOT EXISTS {table}_expire_time_idx ON {table} (expire_time);

-- One counter row. The acquiring upsert writes `last_token + 1` into the lock row and the
-- triggers below move the counter up to it, all in that one statement; SQLite has one
-- writer at a time, so tokens are ordered exactly like acquisitions. Plain-SQL rows keep
-- the default 0 and leave the counter alone.
CREATE TABLE IF NOT EXISTS {table}_fencing (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    last_token INTEGER NOT NULL
);

INSERT OR IGNORE INTO {table}_fencing (id, last_token) VALUES (1, 0);

CREATE TRIGGER IF NOT EXISTS {table}_fence_insert AFTER INSERT ON {table}
WHEN NEW.fencing_token > (SELECT last_token FROM {table}_fencing WHERE id = 1)
BEGIN
    UPDATE {table}_fencing SET last_token = NEW.fencing_token WHERE id = 1;
END;

CREATE TRIGGER IF NOT EXISTS {table}_fence_takeover AFTER UPDATE OF fencing_token ON {table}
WHEN NEW.fencing_token > (SELECT last_token FROM {table}_fencing WHERE id = 1)
BEGIN
    UPDATE {table}_fencing SET last_token = NEW.fencing_token WHERE id = 1;
END;
