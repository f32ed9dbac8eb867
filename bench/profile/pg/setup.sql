-- Scratch tables for profiling (dropped by teardown.sql).
-- seeds' 3-column table, as in benches/compare/handwritten.rs (PgSeed::create_table)
CREATE TABLE prof_seed (
    lock_key    VARCHAR(128) PRIMARY KEY,
    lock_value  VARCHAR(64)  NOT NULL,
    expire_time TIMESTAMPTZ  NOT NULL);
CREATE UNLOGGED TABLE prof_seed_u (
    lock_key    VARCHAR(128) PRIMARY KEY,
    lock_value  VARCHAR(64)  NOT NULL,
    expire_time TIMESTAMPTZ  NOT NULL);

-- dblock durable table: migrations/postgres V1 + V2 ({unlogged} = '')
CREATE SEQUENCE IF NOT EXISTS prof_lock_fencing_seq;
CREATE TABLE IF NOT EXISTS prof_lock (
    lock_key      VARCHAR(128) PRIMARY KEY,
    lock_value    VARCHAR(64)  NOT NULL,
    expire_time   TIMESTAMPTZ  NOT NULL,
    fencing_token BIGINT       NOT NULL DEFAULT nextval('prof_lock_fencing_seq'),
    acquired_at   TIMESTAMPTZ  NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS prof_lock_expire_time_idx ON prof_lock (expire_time);
ALTER TABLE prof_lock ADD COLUMN IF NOT EXISTS waiters BOOLEAN NOT NULL DEFAULT false;

-- dblock relaxed table: V1 + V2 with {unlogged} = 'UNLOGGED ' (sequence stays logged) + V4 epoch
CREATE SEQUENCE IF NOT EXISTS prof_lock_relaxed_fencing_seq;
CREATE UNLOGGED TABLE IF NOT EXISTS prof_lock_relaxed (
    lock_key      VARCHAR(128) PRIMARY KEY,
    lock_value    VARCHAR(64)  NOT NULL,
    expire_time   TIMESTAMPTZ  NOT NULL,
    fencing_token BIGINT       NOT NULL DEFAULT nextval('prof_lock_relaxed_fencing_seq'),
    acquired_at   TIMESTAMPTZ  NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS prof_lock_relaxed_expire_time_idx ON prof_lock_relaxed (expire_time);
ALTER TABLE prof_lock_relaxed ADD COLUMN IF NOT EXISTS waiters BOOLEAN NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS prof_lock_relaxed_epoch (
    id      SMALLINT    PRIMARY KEY CHECK (id = 1),
    started TIMESTAMPTZ NOT NULL
);
INSERT INTO prof_lock_relaxed_epoch (id, started) VALUES (1, pg_postmaster_start_time())
    ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION prof_lock_relaxed_new_epoch() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO prof_lock_relaxed_epoch (id, started) VALUES (1, '-infinity')
        ON CONFLICT (id) DO NOTHING;
    PERFORM 1 FROM prof_lock_relaxed_epoch WHERE id = 1 FOR UPDATE;
    IF (SELECT started FROM prof_lock_relaxed_epoch WHERE id = 1) IS DISTINCT FROM pg_postmaster_start_time() THEN
        PERFORM setval('prof_lock_relaxed_fencing_seq',
                       (SELECT last_value FROM prof_lock_relaxed_fencing_seq) + 4294967296);
        UPDATE prof_lock_relaxed_epoch SET started = pg_postmaster_start_time() WHERE id = 1;
    END IF;
    RETURN true;
END
$$;
