-- A read-write lock's write in one statement: one round trip and one commit, where a
-- transaction over the two rows took five round trips (BEGIN, two acquisitions, the look
-- for readers, COMMIT) and held its row and advisory locks across all of them, which
-- every contending writer waited out. The same steps as that transaction, in one call:
--
-- 1. The deadline travels with the call (`lock_timeout`, this transaction only), as in
--    every acquisition: no lock below is waited for past it (55P03, a lost race).
-- 2. The writer's and the grant's advisory locks, in key order, as each acquisition of
--    those keys takes them: another acquisition of either key waits for this commit, and
--    a reader, which holds the grant's lock shared while it inserts its row, either
--    committed before (seen in step 3) or commits after this write and then finds the
--    writer's row on its own look (it steps back).
-- 3. The looks, one query: a live writer's or grant row, a live reader's row. A VOLATILE
--    PL/pgSQL function takes a fresh snapshot for each statement (READ COMMITTED), so a
--    look sees every row committed before it, including those committed while this call
--    waited in step 2; a statement's single snapshot, taken before those waits, would not.
-- 4. Both rows in one INSERT, tokens drawn writer first (token order as before). Should
--    either row not be taken after all (a client that writes without the advisory lock
--    took it in between), the whole call is undone by raising 55P03: never one row alone.
--
-- `relaxed`: a relaxed table (V4) checks its token epoch before the draw, as ACQUIRE does.
-- The function is only an optimisation: dblock falls back to the transaction where it is
-- missing (a table not migrated to V5), and plain-SQL clients never need it.
-- Readers' rows (`<name>~read-<hex>`) indexed in byte order: the look for a lock's live
-- readers is a byte-order range (`COLLATE "C"`), which the primary key, in the database's
-- collation (C.UTF-8, en_US.UTF-8, ..), cannot serve; without this index every write, and
-- every wait of a writer for readers, scanned the whole table, dead rows included (pgbench,
-- one client, take + release: a write 0.75-0.85x of a mutex cycle as dead rows piled up,
-- 0.9-1.0x with it). Partial: the other rows, the locks, pay nothing for it.
CREATE INDEX IF NOT EXISTS {name}_readers_idx ON {table} (lock_key COLLATE "C")
    WHERE lock_key LIKE '%~read-%';

CREATE OR REPLACE FUNCTION {table}_take_write(
    writer text, grant_key text, owner text, lease_micros bigint, wait_millis bigint,
    readers_from text, readers_to text, relaxed boolean)
RETURNS TABLE (outcome text, writer_token bigint, writer_expires timestamptz,
               grant_token bigint, grant_expires timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    is_held boolean;
    is_read boolean;
    taken bigint;
BEGIN
    PERFORM set_config('lock_timeout', wait_millis::text, true);
    PERFORM pg_advisory_xact_lock(hashtextextended('{table}:' || writer, 0));
    PERFORM pg_advisory_xact_lock(hashtextextended('{table}:' || grant_key, 0));
    -- Both looks in one query (one executor run; each of its two scans sees the same
    -- fresh snapshot, taken after the waits above).
    SELECT EXISTS (SELECT 1 FROM {table} AS t
                    WHERE t.lock_key IN (writer, grant_key)
                      AND t.expire_time > clock_timestamp()),
           EXISTS (SELECT 1 FROM {table} AS t
                    WHERE t.lock_key COLLATE "C" >= readers_from
                      AND t.lock_key COLLATE "C" < readers_to
                      AND t.lock_key LIKE '%~read-%'
                      AND t.expire_time > clock_timestamp())
      INTO is_held, is_read;
    IF is_held OR is_read THEN
        RETURN QUERY SELECT CASE WHEN is_held THEN 'held' ELSE 'read' END, NULL::bigint,
                            NULL::timestamptz, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF relaxed THEN
        PERFORM (SELECT started FROM {table}_epoch) = pg_postmaster_start_time()
                OR {table}_new_epoch();
    END IF;
    RETURN QUERY
    WITH won AS (
        INSERT INTO {table} AS held (lock_key, lock_value, expire_time, fencing_token,
                                     acquired_at)
        VALUES (writer, owner, clock_timestamp() + lease_micros * INTERVAL '1 microsecond',
                nextval('{table}_fencing_seq'), clock_timestamp()),
               (grant_key, owner, clock_timestamp() + lease_micros * INTERVAL '1 microsecond',
                nextval('{table}_fencing_seq'), clock_timestamp())
        ON CONFLICT (lock_key) DO UPDATE
           SET lock_value = EXCLUDED.lock_value,
               expire_time = EXCLUDED.expire_time,
               fencing_token = EXCLUDED.fencing_token,
               acquired_at = EXCLUDED.acquired_at
         WHERE held.expire_time <= clock_timestamp()
        RETURNING held.lock_key, held.fencing_token, held.expire_time
    )
    SELECT 'won'::text, w.fencing_token, w.expire_time, g.fencing_token, g.expire_time
      FROM won AS w, won AS g
     WHERE w.lock_key = writer AND g.lock_key = grant_key;
    GET DIAGNOSTICS taken = ROW_COUNT;
    IF taken = 0 THEN
        RAISE EXCEPTION 'dblock: a row of the write on % was taken meanwhile', writer
              USING ERRCODE = '55P03';
    END IF;
END
$$;
