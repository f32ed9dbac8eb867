-- Fair mode (LockerBuilder::fair): a waiter takes a ticket, and wins only when no live
-- earlier ticket for its key exists. Tickets are leases renewed by their waiter's Locker,
-- so a waiter that dies stops blocking the queue when its ticket expires. Plain-SQL
-- clients never touch this table: their rows in {table} still block everyone.
CREATE TABLE IF NOT EXISTS {table}_ticket (
    ticket      BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    lock_key    VARBINARY(128) NOT NULL,
    expire_time TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY {table}_ticket_key_idx (lock_key, ticket)
) ENGINE = InnoDB;

-- Tickets of one key are handed out one at a time: the trigger locks the key's fencing
-- bucket row until the ticket commits, and the number is drawn after the trigger, so a
-- later ticket of the same key always commits after an earlier one (a waiter checking for
-- earlier tickets sees every one of them).
DROP TRIGGER IF EXISTS {table}_ticket_order;
CREATE TRIGGER {table}_ticket_order BEFORE INSERT ON {table}_ticket FOR EACH ROW
BEGIN
    UPDATE {table}_fencing SET last_token = last_token WHERE bucket = CRC32(NEW.lock_key) % 16;
END;
