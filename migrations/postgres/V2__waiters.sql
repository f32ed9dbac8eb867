-- Wake-ups across processes. A waiter of another process sets `waiters` on the row it
-- waits for; whoever deletes that row (release, reaper) then sends NOTIFY on the channel
-- 'dblock:{table}' with the key, and the waiters' listeners try again at once. Plain-SQL
-- clients never see it: the column has a default, and their rows simply never notify.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS waiters BOOLEAN NOT NULL DEFAULT false;
