-- dblock lease table for PostgreSQL. `{table}` is replaced by the configured, validated
-- table name. Every statement is idempotent so a failed run can simply be repeated.
CREATE SEQUENCE IF NOT EXISTS {table}_fencing_seq;

CREATE {unlogged}TABLE IF NOT EXISTS {table} (
    lock_key      VARCHAR(128) PRIMARY KEY,
    lock_value    VARCHAR(64)  NOT NULL,
    expire_time   TIMESTAMPTZ  NOT NULL,
    -- Plain-SQL clients that insert only the three columns above still get a token.
    fencing_token BIGINT       NOT NULL DEFAULT nextval('{table}_fencing_seq'),
    acquired_at   TIMESTAMPTZ  NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX IF NOT EXISTS {name}_expire_time_idx ON {table} (expire_time);
