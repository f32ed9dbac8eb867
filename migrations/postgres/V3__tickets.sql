-- Fair mode (LockerBuilder::fair): a waiter takes a ticket, and wins only when no live
-- earlier ticket for its key exists. Tickets are leases renewed by their waiter's Locker,
-- so a waiter that dies stops blocking the queue when its ticket expires. Plain-SQL
-- clients never touch this table: their rows in {table} still block everyone.
CREATE SEQUENCE IF NOT EXISTS {table}_ticket_seq;

CREATE {unlogged}TABLE IF NOT EXISTS {table}_ticket (
    ticket      BIGINT       PRIMARY KEY DEFAULT nextval('{table}_ticket_seq'),
    lock_key    VARCHAR(128) NOT NULL,
    expire_time TIMESTAMPTZ  NOT NULL
);

CREATE INDEX IF NOT EXISTS {name}_ticket_key_idx ON {table}_ticket (lock_key, ticket);
