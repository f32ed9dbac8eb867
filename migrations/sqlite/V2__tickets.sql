-- Fair mode (LockerBuilder::fair): a waiter takes a ticket, and wins only when no live
-- earlier ticket for its key exists. Tickets are leases renewed by their waiter's Locker,
-- so a waiter that dies stops blocking the queue when its ticket expires. SQLite has one
-- writer at a time, so tickets commit in the order of their numbers.
CREATE TABLE IF NOT EXISTS {table}_ticket (
    ticket      INTEGER      NOT NULL PRIMARY KEY AUTOINCREMENT,
    lock_key    VARCHAR(128) NOT NULL,
    expire_time DATETIME     NOT NULL
);

CREATE INDEX IF NOT EXISTS {table}_ticket_key_idx ON {table}_ticket (lock_key, ticket);
