-- Wake-ups and turns across processes. A Locker whose waiter has to sleep marks the key its
-- waiters queue for (a lock's key, or a semaphore's, read-write lock's or election's group
-- `<name>~`) with its own number; its listener keeps the mark while they wait. Deleting a
-- row (release, reaper, force release, a plain client) counts a poke on the marks of its
-- key and its group, with the deleted row's token, which the marking Lockers' listeners
-- read to wake their waiters; and a Locker whose release finds a mark of another Locker
-- leaves the key to that Locker's waiters first, rather than to its own next waiter at
-- once.
--
-- A table of its own, not a column of {table}: SQLite has no ADD COLUMN IF NOT EXISTS,
-- and every script must stay safe to apply twice. Plain-SQL clients never touch it.
CREATE TABLE IF NOT EXISTS {table}_waiter (
    lock_key      VARCHAR(128) NOT NULL,
    waiter        INTEGER      NOT NULL,
    -- The token of the row the waiter lost against when it marked (a later row of the key
    -- is marked again).
    fencing_token INTEGER      NOT NULL,
    -- Refreshed by the marking Locker's listener while it waits: a mark of a Locker that
    -- died stops counting here, and is deleted once expired.
    expire_time   DATETIME     NOT NULL,
    -- Rows of the key or group deleted since the mark was made, and the last one's token
    -- (a Locker's listener skips its own releases, whose waiters it woke already).
    pokes          INTEGER     NOT NULL DEFAULT 0,
    released_token INTEGER     NOT NULL DEFAULT 0,
    PRIMARY KEY (lock_key, waiter)
) WITHOUT ROWID;

-- `rtrim(k, replace(k, '~', ''))` is the key up to and including its last '~' (its group;
-- '' without one). The WHEN keeps an unmarked row's delete to two index probes.
CREATE TRIGGER IF NOT EXISTS {table}_waiter_poke AFTER DELETE ON {table}
WHEN EXISTS (SELECT 1 FROM {table}_waiter
              WHERE lock_key IN (OLD.lock_key, rtrim(OLD.lock_key, replace(OLD.lock_key, '~', ''))))
BEGIN
    UPDATE {table}_waiter SET pokes = pokes + 1, released_token = OLD.fencing_token
     WHERE lock_key IN (OLD.lock_key, rtrim(OLD.lock_key, replace(OLD.lock_key, '~', '')));
END;
