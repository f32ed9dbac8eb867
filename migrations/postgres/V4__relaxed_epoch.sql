-- Only for a relaxed lock table (LockerBuilder::durability(Durability::Relaxed)), which
-- V1 and V3 created UNLOGGED. Its fencing sequence stays logged, but a transaction that
-- writes only unlogged rows commits without waiting for the WAL to reach the disk, so
-- after a crash the sequence can restart below tokens that were already handed out. This
-- logged one-row table remembers the server start its tokens were drawn under; the first
-- acquisition after another start (crash recovery, restart, a promoted standby) moves the
-- sequence 2^32 ahead, which no crash can have skipped (the WAL buffers hold at most a
-- few million draws), and commits that move with a flush, before any token is drawn.
CREATE TABLE IF NOT EXISTS {table}_epoch (
    id      SMALLINT    PRIMARY KEY CHECK (id = 1),
    started TIMESTAMPTZ NOT NULL
);

INSERT INTO {table}_epoch (id, started) VALUES (1, pg_postmaster_start_time())
    ON CONFLICT (id) DO NOTHING;

-- Called by the acquisition only when the epoch row does not match this server start.
-- The row lock makes one caller move the sequence; the others wait for it, then find
-- the row matching and draw after the move.
CREATE OR REPLACE FUNCTION {table}_new_epoch() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {table}_epoch (id, started) VALUES (1, '-infinity')
        ON CONFLICT (id) DO NOTHING;
    PERFORM 1 FROM {table}_epoch WHERE id = 1 FOR UPDATE;
    IF (SELECT started FROM {table}_epoch WHERE id = 1) IS DISTINCT FROM pg_postmaster_start_time() THEN
        PERFORM setval('{table}_fencing_seq',
                       (SELECT last_value FROM {table}_fencing_seq) + 4294967296);
        UPDATE {table}_epoch SET started = pg_postmaster_start_time() WHERE id = 1;
    END IF;
    RETURN true;
END
$$;
