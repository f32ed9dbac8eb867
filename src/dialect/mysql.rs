//! MySQL 8 and MariaDB: every statement dblock sends to them, and how answers are read.
//!
//! sqlx always sets `CLIENT_FOUND_ROWS`, so an upsert's row count cannot tell a win from a
//! loss. Acquire is therefore an upsert that inserts, or takes over an expired row, and a
//! read of the row's owner (ours means we won): on MariaDB 10.5+ one statement, the upsert
//! with `RETURNING`; on MySQL 8, which has no `RETURNING`, and on MariaDB Galera (a commit
//! refused after the returned row is an error packet sqlx cannot read there), a `SELECT`
//! after it on the same connection. Which one is asked once per lock table
//! ([`LockSql::upsert_returns`]: `SELECT VERSION()`, and `wsrep_on`). Fencing tokens come
//! from the triggers of the migration. `UPDATE` has no `RETURNING` here, so
//! extend hands the new expiry back through `LAST_INSERT_ID(expr)`, which the server puts
//! in the OK packet: one statement, and the database's own arithmetic.
//!
//! There are no notifications here; waiters of other processes are woken by *bells*,
//! named locks (see "Bells" below, and the listener in `mysql/bells.rs`): the acquisition
//! reads, with the row, whether another process registered as waiting, and only then is
//! anything more sent (the bell's two statements, on the lease engine's connection).

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{Connection, MySql, MySqlConnection};

use crate::config::micros;

use super::{
    Acquired, Contention, Dialect, Durability, ErrorCodes, Inspected, ListQuery, Listed,
    ListenerOptions, LockId, LockSql, MigrateSql, NotifySql, ReleasedRow, Releases, RenewWait,
    Renewal, RowState, RowWait, Sql, TicketSql, TxSql, Watchers, audited, batch_json, ids_json,
    is_unique_violation, json_list, quoted_after, sql,
};

mod bells;
mod history;

use history::{READ_FOR_FORCE, RECORD_EVENTS, TRIM_EVENTS};

statements! { batch_sql;
    record_events: RECORD_EVENTS,
    read_events: &history::read_events(false),
    read_events_oldest: &history::read_events(true),
    trim_events: TRIM_EVENTS,
    read_for_force: READ_FOR_FORCE,
    check_fence_write: CHECK_FENCE_WRITE,
    check_fences_write: CHECK_FENCES_WRITE,
    acquire_returning: &format!("{}{RETURNING_OWNER},\n{WATCHERS}", noting_takeover()),
    read_owner: READ_OWNER,
    read_owner_watching: &read_owner_watching(),
    // The table's name, as the wait names hash it (`wait_names`).
    table_name: "{table}",
    take_bell: &format!("SELECT GET_LOCK({}, 0)", named(BELL, "?")),
    drop_bell: &format!("SELECT RELEASE_LOCK({})", named(BELL, "?")),
    release_live: RELEASE_LIVE,
    read_release_batch: READ_RELEASE_BATCH,
    read_batch: READ_BATCH,
    renew_waiting: RENEW_WAITING,
    probe_batch: PROBE_BATCH,
    live_tickets: LIVE_TICKETS,
    live_member: LIVE_MEMBER,
    release_pair: RELEASE_PAIR,
    waiters: &waiters(),
}

/// A list of tickets as MySQL takes it: one JSON array (read with `JSON_TABLE`).
fn ticket_list(tickets: &[i64]) -> String {
    json_list(tickets)
}

// Assignments run left to right and later ones see the new values: `lock_value` changes
// first, and only when the old lease expired; the others follow it. VALUES(fencing_token)
// is the token the insert trigger drew for this attempt, under the key's bucket lock.
const ACQUIRE: &str = "\
INSERT INTO {table} (lock_key, lock_value, expire_time, acquired_at)
VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, NOW(6))
ON DUPLICATE KEY UPDATE
    lock_value  = IF(expire_time <= NOW(6), VALUES(lock_value), lock_value),
    fencing_token = IF(lock_value = VALUES(lock_value), VALUES(fencing_token), fencing_token),
    acquired_at = IF(lock_value = VALUES(lock_value), VALUES(acquired_at), acquired_at),
    expire_time = IF(lock_value = VALUES(lock_value), VALUES(expire_time), expire_time)";

// MariaDB 10.5+ hands back the row as it stands after the upsert: the new holder's values
// when it inserted or took over, the current holder's when the key was held (checked on
// 10.11 and 11.8). So ACQUIRE with this tail is the whole attempt, in one round trip.
const RETURNING_OWNER: &str = "\nRETURNING lock_value, fencing_token, expire_time,
          CAST(@dblock_taken_from IS NOT NULL AS SIGNED)";

// On the RETURNING path the row count is not read (the statement ends with a result
// set), so the upsert notes a takeover itself: its VALUES (evaluated for every attempt,
// before the key is looked up) clear a session variable, and the first assignment of the
// duplicate-key path, only when the old lease expired, keeps the old owner in it. The
// RETURNING row (evaluated after the write) reads it: not NULL means taken over.
const TAKEN_FROM: &str = "@dblock_taken_from";

/// ACQUIRE noting a takeover in [`TAKEN_FROM`] (MariaDB's RETURNING path).
fn noting_takeover() -> String {
    let noted = ACQUIRE
        .replacen(
            "NOW(6))\nON DUPLICATE",
            &format!("IF(({TAKEN_FROM} := NULL) IS NULL, NOW(6), NOW(6)))\nON DUPLICATE"),
            1,
        )
        .replacen(
            "IF(expire_time <= NOW(6),",
            &format!("IF(expire_time <= NOW(6) AND ({TAKEN_FROM} := lock_value) IS NOT NULL,"),
            1,
        );
    debug_assert_eq!(noted.matches(TAKEN_FROM).count(), 2);
    noted
}

/// The server-side bounds (`max_statement_time`, seconds as MariaDB writes them) an
/// acquisition may carry, with their milliseconds. The bound is part of the statement's
/// text (`SET STATEMENT` takes no parameter), and sqlx prepares and caches one
/// statement per text on each connection, so the bound is one of these few values,
/// rounded down from what is left until the attempt's deadline: a cache of a hundred
/// statements never churns.
const STATEMENT_BOUNDS: [(u128, &str); 15] = [
    (1, "0.001"),
    (10, "0.01"),
    (50, "0.05"),
    (100, "0.1"),
    (250, "0.25"),
    (500, "0.5"),
    (1_000, "1"),
    (2_000, "2"),
    (5_000, "5"),
    (10_000, "10"),
    (30_000, "30"),
    (60_000, "60"),
    (300_000, "300"),
    (3_600_000, "3600"),
    (86_400_000, "86400"),
];

/// The largest of [`STATEMENT_BOUNDS`] within `wait` (the smallest when `wait` is below
/// it: 0 would mean no bound).
fn statement_bound(wait: std::time::Duration) -> &'static str {
    let millis = wait.as_millis();
    let mut bound = STATEMENT_BOUNDS[0].1;
    for (at_least, text) in STATEMENT_BOUNDS {
        if millis >= at_least {
            bound = text;
        }
    }
    bound
}

// MySQL 8: the same read, as a statement of its own after the upsert.
const READ_OWNER: &str =
    "SELECT lock_value, fencing_token, expire_time FROM {table} WHERE lock_key = ?";

// Bells. Named locks (GET_LOCK) belong to the server, not to a table or a transaction:
// a session holds one until it releases it or ends, and a session blocked in GET_LOCK is
// woken by the server when the holder lets go. Three names serve one queue of waiters:
// two *wait names* a waiting process's listener holds while its waiters wait (two, so
// that a holder can see a second process waiting beside its own: a name has one holder),
// and each row's *bell*, which its holder takes when its acquisition saw another process
// registered, and drops after the row's DELETE committed. Listeners of the waiting
// processes block on the bell (`bells.rs`). The names hash the database, the table and
// the key (a name has at most 64 characters; MD5 is only a spread here).

/// The kinds of name: a queue's two wait names, a row's bell.
const WAIT: [&str; 2] = ["w0", "w1"];
const BELL: &str = "b";

/// The server-side name of `kind` for the key at `arg` (a `?` or a column): 41 or 42
/// characters, the same for every session of this database and table.
fn named(kind: &str, arg: &str) -> String {
    format!(
        "CONCAT('dblock:', MD5(CONCAT_WS(0x1F, CAST(DATABASE() AS BINARY), '{{table}}', {arg})), ':{kind}')"
    )
}

/// The sessions holding the two wait names bound at the end (connection ids, `NULL` for
/// a free name): what an acquisition reads along with the row. The names are computed
/// here ([`wait_names`]), not by the statement: the server's `MD5` and concatenations
/// cost the uncontended cycle a few percent (bench/PROFILE.md, "MariaDB's acquisition,
/// part by part"). Short aliases keep the columns' descriptions, sent with every answer,
/// short too.
const WATCHERS: &str =
    "CAST(IS_USED_LOCK(?) AS SIGNED) AS w0, CAST(IS_USED_LOCK(?) AS SIGNED) AS w1";

/// The two wait names of `queue` on the lock table `table` of `database`, as [`named`]
/// computes them on the server: `MD5` of the database's, the table's and the queue's
/// bytes joined by 0x1F (`CONCAT_WS` skips a `NULL` database: no database selected), in
/// lowercase hex. The listener registers under the server's names, so both must agree
/// byte for byte (`client_wait_names_are_the_servers`).
fn wait_names(database: Option<&str>, table: &str, queue: &str) -> [String; 2] {
    use md5::{Digest, Md5};
    let mut hasher = Md5::new();
    if let Some(database) = database {
        hasher.update(database.as_bytes());
        hasher.update([0x1F]);
    }
    hasher.update(table.as_bytes());
    hasher.update([0x1F]);
    hasher.update(queue.as_bytes());
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(2 * digest.len());
    for byte in digest.iter() {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0xF)]));
    }
    WAIT.map(|kind| format!("dblock:{hex}:{kind}"))
}

/// The wait names of `queue` for this table's acquisitions; the first call asks the
/// session for its database (`DATABASE()`), once per lock table: every session of the
/// pool connects to the same one, as the listener does.
async fn wait_names_on(
    conn: &mut MySqlConnection,
    sql: &Statements,
    queue: &str,
) -> Result<[String; 2], sqlx::Error> {
    let database = match sql.database.get() {
        Some(known) => known,
        None => {
            let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()")
                .fetch_one(&mut *conn)
                .await?;
            sql.database.get_or_init(|| database)
        }
    };
    Ok(wait_names(database.as_deref(), &sql.table_name, queue))
}

/// MySQL 8's read after the upsert, with the watchers (not on Galera: READ_OWNER there).
fn read_owner_watching() -> String {
    format!(
        "SELECT lock_value, fencing_token, expire_time, {WATCHERS}\n  FROM {{table}} WHERE lock_key = ?"
    )
}

/// The key whose wait names a waiter of the row `key` holds: the group of a primitive's
/// member (`<name>~`, its waiters' queue), the key itself for a mutex. Listeners register
/// the queues they wait in the same way, so the waiters of a primitive's several queues
/// (an election's leader, a read-write lock's writer and readers) share one registration.
pub(super) fn registered_key(key: &str) -> &str {
    crate::config::group_of(key).unwrap_or(key)
}

/// For each key of a console page (`NotifySql::waiters`), the sessions other than the
/// asking Locker's listener (bound twice first; 0 for none) holding its queue's two wait
/// names: each one Locker's listener, registered while its waiters wait, so at most two.
/// The keys arrive as one JSON array of `{"k": key, "q": its queue}` (`registered_key`);
/// `q` is read as bytes, as the names of `lock_key` are hashed, `k` as text to hand back.
fn waiters() -> String {
    let [w0, w1] = WAIT.map(|kind| format!("IS_USED_LOCK({})", named(kind, "w.q")));
    format!(
        "SELECT k, CAST(IFNULL(s0 <> ?, 0) + IFNULL(s1 <> ?, 0) AS SIGNED)
  FROM (SELECT w.k, {w0} AS s0, {w1} AS s1
          FROM JSON_TABLE(?, '$[*]' COLUMNS (
                 k VARCHAR(128) PATH '$.k', q VARBINARY(128) PATH '$.q')) AS w) AS u
 WHERE s0 IS NOT NULL OR s1 IS NOT NULL"
    )
}

/// The listener's statements (`bells.rs`), for one table.
pub(super) struct BellSql {
    /// Takes one of the queue's wait names unless this session holds one: 1 when it
    /// holds one after, 0 when two other sessions hold them.
    pub(super) register: Sql,
    /// Lets go of the queue's wait names this session holds.
    pub(super) unregister: Sql,
    /// The live rows from the first bound key (inclusive) to the second (exclusive), at
    /// most the third: key, the session holding its bell, microseconds its lease has left.
    pub(super) discover: Sql,
    /// Blocks until the bound row's bell is let go (1; 0 if it was free already), at most
    /// the bound seconds (then 2). Whoever the server hands the bell to lets go of it in the
    /// same statement, so the next blocked session gets it at once.
    pub(super) block: Sql,
}

pub(super) fn bell_sql(table: &str) -> BellSql {
    let [w0, w1] = WAIT.map(|kind| named(kind, "?"));
    let bell = named(BELL, "?");
    let register = format!(
        "SELECT CASE WHEN IS_USED_LOCK({w0}) = CONNECTION_ID() OR IS_USED_LOCK({w1}) = CONNECTION_ID() THEN 1
            WHEN GET_LOCK({w0}, 0) = 1 THEN 1
            WHEN GET_LOCK({w1}, 0) = 1 THEN 1
            ELSE 0 END"
    );
    let unregister = format!("SELECT RELEASE_LOCK({w0}), RELEASE_LOCK({w1})");
    let discover = format!(
        "SELECT lock_key, CAST(IS_USED_LOCK({}) AS SIGNED),
       CAST(GREATEST(0, TIMESTAMPDIFF(MICROSECOND, NOW(6), expire_time)) AS SIGNED)
  FROM {{table}} WHERE lock_key >= ? AND lock_key < ? AND expire_time > NOW(6)
 ORDER BY lock_key LIMIT ?",
        named(BELL, "lock_key")
    );
    let block = format!(
        "SELECT CASE WHEN IS_USED_LOCK({bell}) IS NULL THEN 0
            WHEN GET_LOCK({bell}, ?) = 1 THEN 1 + 0 * COALESCE(RELEASE_LOCK({bell}), 0)
            ELSE 2 END"
    );
    BellSql {
        register: sql(&register, table),
        unregister: sql(&unregister, table),
        discover: sql(&discover, table),
        block: sql(&block, table),
    }
}

// A write's look for live readers, inside its transaction (`LockSql::live_member`). A
// locking read: it reads the rows as committed now, whatever snapshot the transaction's
// earlier reads fixed (MySQL 8's acquisition reads its row back; REPEATABLE READ would
// then answer as of that read). Readers that could commit beside the write are ordered
// by the grant's fencing counter: a reader's row draws its token from the grant's
// counter row, which the write's grant insert keeps locked until the write commits.
const LIVE_MEMBER: &str = "\
SELECT 1 FROM {table}
 WHERE lock_key >= ? AND lock_key < ? AND expire_time > NOW(6)
 LIMIT 1 LOCK IN SHARE MODE";

// A write's two rows in one statement where DELETE takes RETURNING (MariaDB; sent where
// the upsert's RETURNING is: 10.5+, not Galera): one round trip, where the batched
// release's transaction (a locking read, the DELETE, BEGIN and COMMIT) takes four. The
// key list finds both rows by the primary key, in its order.
const RELEASE_PAIR: &str = "\
DELETE FROM {table}
 WHERE lock_key IN (?, ?)
   AND ((lock_key = ? AND lock_value = ? AND fencing_token = ?)
        OR (lock_key = ? AND lock_value = ? AND fencing_token = ?))
RETURNING lock_key, fencing_token, CAST(expire_time <= NOW(6) AS SIGNED)";

// DELETE has no RETURNING on MySQL 8: the usual release deletes a live lease, and only
// when that finds nothing does a second one tell an expired row of ours from none.
const RELEASE_LIVE: &str = "DELETE FROM {table}
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)";
const RELEASE: &str =
    "DELETE FROM {table} WHERE lock_key = ? AND lock_value = ? AND fencing_token = ?";

// The batched release of the lease engine, in one transaction: DELETE has no RETURNING
// on MySQL 8, so the batch's rows that are still ours are read and locked first (the
// engine sorts the batch by key, so two batches lock in one order), then deleted.
const READ_RELEASE_BATCH: &str = "\
SELECT t.lock_key, t.fencing_token, CAST(t.expire_time <= NOW(6) AS SIGNED)
  FROM {batch} JOIN {table} AS t ON t.lock_key = w.k
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok
   FOR UPDATE";
const RELEASE_BATCH: &str = "\
DELETE t FROM {batch} JOIN {table} AS t ON t.lock_key = w.k
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok";

// The second assignment changes nothing; it only hands the new expiry (microseconds since
// the epoch, session time zone UTC as sqlx sets it) to the OK packet.
const EXTEND: &str = "\
UPDATE {table}
   SET expire_time = NOW(6) + INTERVAL ? MICROSECOND,
       acquired_at = IF(LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expire_time)) > 0,
                        acquired_at, acquired_at)
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)";

// The batch arrives as one JSON array (no bind-parameter limit, one statement text for
// any batch size); JSON_TABLE drives the join, each row found through the primary key.
const BATCH: &str = "JSON_TABLE(?, '$[*]' COLUMNS (
        k VARBINARY(128) PATH '$.k', o VARCHAR(64) PATH '$.o',
        tok BIGINT PATH '$.t', micros BIGINT PATH '$.m')) AS w";

// UPDATE has no RETURNING here. NOW(6) is one value for the whole statement, so every
// renewed row ends at NOW(6) + its lease: the second assignment changes nothing and only
// hands NOW(6) (microseconds since the epoch, session time zone UTC as sqlx sets it) to
// the OK packet, as EXTEND does. When fewer rows matched than the batch asked for, a read
// of the batch's rows follows on the same connection (READ_BATCH).
//
// It never waits for a row lock (RenewWait::Skip): a row another transaction holds (a
// fenced transaction's `LOCK IN SHARE MODE`, kept for hours when its connection went
// half-open) would hold up every lease of the batch, and the abandoned statement would
// keep the rows it had updated locked on the server. UPDATE has no SKIP LOCKED, and a
// locking derived table does not help (MariaDB 10.11 still waited on the locked row,
// for an UPDATE joined with `(SELECT .. FOR UPDATE SKIP LOCKED)`), so the statement
// fails at once instead: MariaDB waits `innodb_lock_wait_timeout = 0` (error 1205, the
// statement rolled back, its locks given back); then the rows that can be locked now
// are found (PROBE_BATCH) and renewed alone. MySQL 8 ignores the `/*M! .. */` text and
// reads the hint instead: its lock waits are whole seconds, one at least. A multi-
// statement transaction (lock, then update, then commit) was not taken: a connection
// cut between its statements would leave the locks on the server until it noticed.
const RENEW: &str = "\
/*M! SET STATEMENT innodb_lock_wait_timeout = 0 FOR */
UPDATE /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ {batch} JOIN {table} AS t ON t.lock_key = w.k
   SET t.expire_time = NOW(6) + INTERVAL w.micros MICROSECOND,
       t.acquired_at = IF(LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', NOW(6))) > 0,
                          t.acquired_at, t.acquired_at)
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok AND t.expire_time > NOW(6)";

// RENEW for leases that were busy (RenewWait::Briefly): it may wait for a row lock, as
// long as MariaDB's `max_statement_time` (100 ms; error 1969 after it, the statement
// rolled back). Its batches are one lease each, so that bounds the wait. SYSDATE(6), not
// NOW(6): NOW(6) is the statement's start, and an UPDATE that got its row after the
// holder of the lock ended (the fenced session ended by its idle timeout) renewed a
// lease that had run out while it waited; SYSDATE(6) is read when the row is checked,
// after the wait. (Statement-based replication cannot replay SYSDATE: MIXED logs this
// statement by row.) Only a lock obtained within the second parameter's microseconds of
// the statement's start counts: what the lease has left before its deadline, at most
// the wait (a renewal landing after the holder was told the lease is lost would keep the
// key from everyone). Its answer is read back, not taken from the OK packet.
const RENEW_WAITING: &str = "\
/*M! SET STATEMENT max_statement_time = 0.1 FOR */
UPDATE /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ {batch} JOIN {table} AS t ON t.lock_key = w.k
   SET t.expire_time = SYSDATE(6) + INTERVAL w.micros MICROSECOND
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok AND t.expire_time > SYSDATE(6)
   AND SYSDATE(6) < NOW(6) + INTERVAL ? MICROSECOND";

// The batch's rows that are still ours, live, and not locked by anyone else right now.
// Outside a transaction: the locks it takes go at its end, so nothing is held between
// statements; a row locked by someone in between makes the renewal of that subset fail
// at once as above (its leases are busy this time).
const PROBE_BATCH: &str = "\
SELECT t.lock_key FROM {batch} JOIN {table} AS t ON t.lock_key = w.k
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok AND t.expire_time > NOW(6)
   FOR UPDATE SKIP LOCKED";

// Each row of the batch's keys, with whether it is the asking lease's and live (1 or 0).
// A plain read: it waits for no lock.
const READ_BATCH: &str = "\
SELECT t.lock_key, t.lock_value, t.fencing_token, t.expire_time,
       CAST(t.lock_value = w.o AND t.fencing_token = w.tok AND t.expire_time > NOW(6) AS SIGNED)
  FROM {batch} JOIN {table} AS t ON t.lock_key = w.k";

// The number is AUTO_INCREMENT, drawn after the insert trigger has locked the key's
// fencing bucket (see the V2 migration): tickets of one key commit in number order.
const TAKE_TICKET: &str = "INSERT INTO {table}_ticket (lock_key, expire_time) VALUES (?, NOW(6) + INTERVAL ? MICROSECOND)";

const EARLIER_TICKET: &str = "\
SELECT EXISTS (SELECT 1 FROM {table}_ticket
                WHERE lock_key = ? AND ticket < ? AND expire_time > NOW(6))";

// No RETURNING: the renewed tickets are read back (same connection, right after).
const RENEW_TICKETS: &str = "\
UPDATE {table}_ticket SET expire_time = NOW(6) + INTERVAL ? MICROSECOND
 WHERE ticket IN (SELECT j.t FROM JSON_TABLE(?, '$[*]' COLUMNS (t BIGINT PATH '$')) AS j)
   AND expire_time > NOW(6)";
const LIVE_TICKETS: &str = "\
SELECT ticket FROM {table}_ticket
 WHERE ticket IN (SELECT j.t FROM JSON_TABLE(?, '$[*]' COLUMNS (t BIGINT PATH '$')) AS j)
   AND expire_time > NOW(6)";

const DROP_TICKETS: &str = "\
DELETE FROM {table}_ticket
 WHERE ticket IN (SELECT j.t FROM JSON_TABLE(?, '$[*]' COLUMNS (t BIGINT PATH '$')) AS j)";

const PURGE_TICKETS: &str = "DELETE FROM {table}_ticket WHERE expire_time < NOW(6)";

// The clock every other statement reads: a schedule asks it which period it is.
const CLOCK: &str = "SELECT NOW(6)";

const INSPECT: &str = "\
SELECT lock_value, fencing_token, acquired_at, expire_time, CAST(expire_time <= NOW(6) AS SIGNED)
  FROM {table} WHERE lock_key = ?";

// Keys are VARBINARY: the range is a byte range over the primary key.
const LIST: &str = "\
SELECT t.lock_key, t.lock_value, t.fencing_token, t.acquired_at, t.expire_time,
       CAST(t.expire_time <= c.db_now AS SIGNED), c.db_now
  FROM (SELECT NOW(6) AS db_now) AS c JOIN {table} AS t
 WHERE t.lock_key >= ? AND (? IS NULL OR t.lock_key < ?)
   AND (? IS NULL OR t.acquired_at <= c.db_now - INTERVAL ? MICROSECOND)
   AND (? IS NULL OR (t.expire_time <= c.db_now) = ?)
   AND (? IS NULL OR t.lock_key > ?)
 ORDER BY t.lock_key
 LIMIT ?";

// No bell is dropped here (it belongs to the holder's session, which learns of the loss
// at its next renewal): waiters that hear the row see it gone within a second (their
// blocked statement's bound), the others when their pause ends.
const FORCE_RELEASE: &str = "DELETE FROM {table} WHERE lock_key = ?";

// A job's minimum hold: the row stays until `acquired_at + ?`, by the database clock that
// wrote `acquired_at`, but never longer than its lease already runs. CLIENT_FOUND_ROWS:
// a matched row counts even if the new expiry equals the old one.
const KEEP_MIN_HOLD: &str = "\
UPDATE {table}
   SET expire_time = LEAST(expire_time, acquired_at + INTERVAL ? MICROSECOND)
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ?
   AND acquired_at + INTERVAL ? MICROSECOND > NOW(6) AND expire_time > NOW(6)";

const REAP: &str = "DELETE FROM {table} WHERE expire_time < NOW(6) ORDER BY expire_time LIMIT ?";

// No mark on the row here (a waiter registers through its listener's wait names): a
// waiter only learns how long the holder's lease has left.
const NOTE_WAITER: &str = "\
SELECT GREATEST(0, TIMESTAMPDIFF(MICROSECOND, NOW(6), expire_time)) FROM {table}
 WHERE lock_key = ?";

// Migration runs are serialized twice. GET_LOCK orders the runs of one server (and goes
// with its session if the process dies), but on a MariaDB Galera cluster it is the node's
// own: runs on two nodes raced, failed with 1213 / 1062, and once left a node's DDL
// waiting "to execute in isolation" for good (shared/docs/ha-facts.md, A5). So a run also
// claims the one row of `<table>_migrating` with a plain INSERT, which Galera certifies
// cluster-wide: a second node's INSERT fails (1062, or 1213 when both certify at once) and
// that run waits until the row is gone. The claim has a lease by the database clock, so a
// run that died without deleting it holds the others up for at most that long.
const MIGRATION_LOCK: &str = "SELECT GET_LOCK(CONCAT('dblock-migrate:', ?), 600)";
const MIGRATION_UNLOCK: &str = "SELECT RELEASE_LOCK(CONCAT('dblock-migrate:', ?))";
const MIGRATION_CLAIM_TABLE: &str = "\
CREATE TABLE IF NOT EXISTS {table}_migrating (
    id          TINYINT     NOT NULL PRIMARY KEY,
    owner       VARCHAR(64) NOT NULL,
    expire_time DATETIME(6) NOT NULL
) ENGINE = InnoDB";
const MIGRATION_CLAIM_OWNER: &str = "SET @dblock_migration_owner = UUID()";
const MIGRATION_CLAIM_EXPIRED: &str = "DELETE FROM {table}_migrating WHERE expire_time < NOW(6)";
const MIGRATION_CLAIM: &str = "\
INSERT INTO {table}_migrating (id, owner, expire_time)
VALUES (1, @dblock_migration_owner, NOW(6) + INTERVAL ? SECOND)";
const MIGRATION_UNCLAIM: &str =
    "DELETE FROM {table}_migrating WHERE owner = @dblock_migration_owner";
/// How long a claim outlives a run that died without deleting it (our migrations are a
/// few small DDL statements: seconds even through Galera's total-order DDL).
const MIGRATION_CLAIM_SECS: i64 = 60;
/// How long a run waits for another's claim before it gives up, as GET_LOCK does.
const MIGRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(600);
/// Pause between two attempts at a held claim.
const MIGRATION_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// ER_NO_SUCH_TABLE: the lock table was not migrated.
const ER_NO_SUCH_TABLE: u16 = 1146;
/// ER_BAD_FIELD_ERROR: a column the statement names does not exist.
const ER_BAD_FIELD_ERROR: u16 = 1054;
/// Error numbers that mean "another session got in the way".
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_LOCK_NOWAIT: u16 = 3572;
/// MariaDB: `max_statement_time` ran out (the statement was rolled back: it changed
/// nothing). An acquisition's bound (`SET STATEMENT`), a renewal's, the engine session's.
const ER_STATEMENT_TIMEOUT: u16 = 1969;
/// ER_CHECKREAD, "Record has changed since last read": MariaDB 11.6+ (where
/// `innodb_snapshot_isolation` is on by default) refuses a locking read or write in a
/// REPEATABLE READ transaction of a row changed since its snapshot, and rolls the whole
/// transaction back as it does a deadlock victim (MDEV-35235).
const ER_CHECKREAD: u16 = 1020;

fn error_number(err: &sqlx::Error) -> Option<u16> {
    match err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|e| e.number()),
        _ => None,
    }
}

/// A row of the batch read-back: key bytes, owner, token, expiry, the asking lease's and
/// live (0 or 1).
type BatchRow = (Vec<u8>, String, i64, DateTime<Utc>, i64);

/// Sends a renewal UPDATE for the batch `json`; `None` when a row lock stopped it (it then
/// changed nothing and holds nothing: the statement was rolled back).
async fn update_batch(
    conn: &mut MySqlConnection,
    statement: &Sql,
    json: &str,
    budget_micros: Option<i64>,
) -> Result<Option<sqlx::mysql::MySqlQueryResult>, sqlx::Error> {
    let mut update = sqlx::query(audited(statement)).bind(json);
    if let Some(budget) = budget_micros {
        update = update.bind(budget);
    }
    match update.execute(conn).await {
        Ok(done) => Ok(Some(done)),
        Err(err)
            if MySql::is_row_locked(&err) || error_number(&err) == Some(ER_STATEMENT_TIMEOUT) =>
        {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// After RENEW met a locked row: renews the leases of `batch` whose rows can be locked
/// now, without waiting; the keys it asked for (none, if another row was locked in
/// between: those leases are busy this time).
async fn renew_free<'a>(
    conn: &mut MySqlConnection,
    sql: &Statements,
    batch: &[Renewal<'a>],
) -> Result<HashSet<&'a str>, sqlx::Error> {
    let json = batch_json(batch, serde_json::Value::from);
    let free: Vec<Vec<u8>> = sqlx::query_scalar(audited(&sql.probe_batch))
        .bind(&json)
        .fetch_all(&mut *conn)
        .await?;
    let free: HashSet<&[u8]> = free.iter().map(Vec::as_slice).collect();
    let subset: Vec<Renewal<'a>> = batch
        .iter()
        .filter(|r| free.contains(r.id.key.as_bytes()))
        .copied()
        .collect();
    if subset.is_empty() {
        return Ok(HashSet::new());
    }
    let json = batch_json(&subset, serde_json::Value::from);
    Ok(match update_batch(conn, &sql.renew, &json, None).await? {
        Some(_) => subset.iter().map(|r| r.id.key).collect(),
        None => HashSet::new(),
    })
}

/// Splices the table name, and the batch's `JSON_TABLE` where a statement takes one.
fn batch_sql(template: &str, table: &str) -> Sql {
    sql(&template.replace("{batch}", BATCH), table)
}

impl super::sealed::Sealed for MySql {}

impl Dialect for MySql {
    const REFUSED_QUALIFIED: Option<&'static str> = Some(
        "MySQL/MariaDB takes no schema-qualified name here: a MySQL database is the schema, \
         so name the database in the connection URL and the table alone",
    );

    type Statements = Statements;
    // InnoDB deletes a reaped row twice: the DELETE marks it, then a purge thread removes
    // it from both indexes after the commit, in about as long again, which the reaper
    // cannot time. Twice the pause keeps reaping at a fortieth of the server's time (the
    // figures: bench/RESULTS.md, "Figures behind choices in the code").
    const REAP_PACE: u32 = 79;

    fn statements(table: &str, _durability: Durability) -> Statements {
        build_statements(table)
    }

    fn shares_token_counter(a: &str, b: &str) -> bool {
        token_counter(a) == token_counter(b)
    }
}

/// Whether a server reporting `version` (`SELECT VERSION()`) takes `RETURNING` on an
/// `INSERT`: MariaDB from 10.5 ("10.11.19-MariaDB-0+deb12u1", "11.8.2-MariaDB-log"); MySQL
/// ("8.0.36") never.
fn mariadb_with_returning(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut numbers = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (10, 5)
}

/// The fencing counter (`bucket`) a row keyed `key` draws its token from: the migration's
/// trigger takes `CRC32(lock_key) % 16`, MySQL's CRC32 being the common CRC-32 (ISO-HDLC,
/// as zlib's) of the key's bytes.
fn token_counter(key: &str) -> u32 {
    const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    CRC32.checksum(key.as_bytes()) % 16
}

/// One acquisition's input, as [`LockSql::acquire`] takes it.
struct Attempt<'a> {
    key: &'a str,
    owner: &'a str,
    lease_micros: i64,
    wait: std::time::Duration,
}

/// The row after an acquisition: owner, token, expiry, whether it was taken over
/// (`NULL` where not read), and the sessions holding the key's wait names (`NULL` where
/// not read).
type OwnerRow = (
    String,
    i64,
    DateTime<Utc>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// The row as MySQL 8's read after the upsert has it: [`OwnerRow`] without the takeover.
type ReadRow = (String, i64, DateTime<Utc>, Option<i64>, Option<i64>);

/// The acquisition ([`LockSql::acquire`]), and who waits for the row's queue when
/// `watch` (off on Galera) or when the statement reads it anyway (`RETURNING`).
async fn acquire_row(
    conn: &mut MySqlConnection,
    sql: &Statements,
    attempt: Attempt<'_>,
    upsert_returns: bool,
    watch: bool,
) -> Result<Option<(Acquired, Watchers)>, sqlx::Error> {
    let Attempt {
        key,
        owner,
        lease_micros,
        wait,
    } = attempt;
    let queue = registered_key(key);
    let row: Option<OwnerRow> = if upsert_returns {
        let [w0, w1] = wait_names_on(&mut *conn, sql, queue).await?;
        // MariaDB (the only server that takes RETURNING here): the attempt's deadline
        // travels with it as `max_statement_time` (checked on 10.11: it interrupts an
        // InnoDB row-lock wait, error 1969, a lost race), so an abandoned attempt
        // cannot commit after its caller gave up. MySQL 8 has no `SET STATEMENT`;
        // there (and on Galera) only the client-side bound and the clean-up apply.
        let bounded = format!(
            "SET STATEMENT max_statement_time={} FOR {}",
            statement_bound(wait),
            sql.acquire_returning
        );
        // Read to the end, not to the first row: the row comes before the statement
        // commits, and whatever follows it must be read now (a `fetch_optional` left
        // it for the connection's next user). Not used where a commit can be refused
        // after the row (Galera's certification: see LockTable::upsert_returns_on).
        // The table name in it was validated (`audited`); the bound is one of a fixed set.
        // The watchers come with the row: two IS_USED_LOCK calls, no round trip more
        // (checked on 10.11: RETURNING takes them).
        let rows: Vec<OwnerRow> = sqlx::query_as(sqlx::AssertSqlSafe(bounded))
            .bind(key)
            .bind(owner)
            .bind(lease_micros)
            .bind(w0)
            .bind(w1)
            .fetch_all(conn)
            .await?;
        rows.into_iter().next()
    } else {
        // With CLIENT_FOUND_ROWS: 1 for an insert (or a row left as it was: lost, as the
        // read below says), 2 for a row the duplicate-key path changed: taken over.
        let done = sqlx::query(audited(&sql.acquire))
            .bind(key)
            .bind(owner)
            .bind(lease_micros)
            .execute(&mut *conn)
            .await?;
        let taken_over = Some(i64::from(done.rows_affected() == 2));
        let row: Option<ReadRow> = if watch {
            let [w0, w1] = wait_names_on(&mut *conn, sql, queue).await?;
            sqlx::query_as(audited(&sql.read_owner_watching))
                .bind(w0)
                .bind(w1)
                .bind(key)
                .fetch_optional(conn)
                .await?
        } else {
            let row: Option<(String, i64, DateTime<Utc>)> =
                sqlx::query_as(audited(&sql.read_owner))
                    .bind(key)
                    .fetch_optional(conn)
                    .await?;
            row.map(|(holder, token, expires_at)| (holder, token, expires_at, None, None))
        };
        row.map(|(holder, token, expires_at, w0, w1)| {
            (holder, token, expires_at, taken_over, w0, w1)
        })
    };
    Ok(match row {
        Some((holder, fencing_token, expires_at, taken_over, w0, w1)) if holder == owner => {
            let session = |id: Option<i64>| id.and_then(|id| u64::try_from(id).ok());
            let acquired = Acquired {
                fencing_token,
                expires_at,
                taken_over: taken_over.is_some_and(|taken| taken != 0),
            };
            Some((acquired, Watchers([session(w0), session(w1)])))
        }
        _ => None,
    })
}

impl LockSql for MySql {
    async fn bound_session(
        conn: &mut MySqlConnection,
        bound: std::time::Duration,
    ) -> Result<(), sqlx::Error> {
        // MariaDB: statements end at `bound`, and an open transaction idle that long is
        // ended with its session (MySQL 8 has neither setting: an error, ignored).
        // Whole seconds for the transaction (at least 1), microseconds for statements.
        let set = format!(
            "SET SESSION max_statement_time = {:.6}, idle_transaction_timeout = {}",
            bound.as_secs_f64(),
            bound.as_secs().max(1)
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(set))
            .execute(conn)
            .await
            .map(drop)
    }

    async fn acquire(
        conn: &mut MySqlConnection,
        sql: &Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        upsert_returns: bool,
    ) -> Result<Option<Acquired>, sqlx::Error> {
        let attempt = Attempt {
            key,
            owner,
            lease_micros,
            wait,
        };
        let won = acquire_row(conn, sql, attempt, upsert_returns, false).await?;
        Ok(won.map(|(won, _)| won))
    }

    async fn acquire_watched(
        conn: &mut MySqlConnection,
        sql: &Statements,
        // A reader's row is acquired as any row here (see `LockSql::acquire_read`).
        (key, _grant): (&str, Option<&str>),
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        upsert_returns: bool,
        watch: bool,
    ) -> Result<Option<(Acquired, Watchers)>, sqlx::Error> {
        let attempt = Attempt {
            key,
            owner,
            lease_micros,
            wait,
        };
        acquire_row(conn, sql, attempt, upsert_returns, watch).await
    }

    async fn release(
        conn: &mut MySqlConnection,
        sql: &Statements,
        lock: LockId<'_>,
    ) -> Result<Option<bool>, sqlx::Error> {
        for (statement, expired) in [(&sql.release_live, false), (&sql.release, true)] {
            let done = sqlx::query(audited(statement))
                .bind(lock.key)
                .bind(lock.owner)
                .bind(lock.fencing_token)
                .execute(&mut *conn)
                .await?;
            if done.rows_affected() == 1 {
                return Ok(Some(expired));
            }
        }
        Ok(None)
    }

    async fn release_batch(
        conn: &mut MySqlConnection,
        sql: &Statements,
        batch: &[LockId<'_>],
    ) -> Result<Vec<ReleasedRow>, sqlx::Error> {
        let json = ids_json(batch);
        let mut tx = sqlx::Connection::begin(conn).await?;
        let rows: Vec<(Vec<u8>, i64, i64)> = sqlx::query_as(audited(&sql.read_release_batch))
            .bind(&json)
            .fetch_all(&mut *tx)
            .await?;
        if !rows.is_empty() {
            sqlx::query(audited(&sql.release_batch))
                .bind(&json)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(rows
            .into_iter()
            .map(|(key, fencing_token, expired)| ReleasedRow {
                // Keys were written as UTF-8 text; VARBINARY hands back the same bytes.
                key: String::from_utf8_lossy(&key).into_owned(),
                fencing_token,
                expired: expired != 0,
            })
            .collect())
    }

    async fn extend(
        conn: &mut MySqlConnection,
        sql: &Statements,
        lock: LockId<'_>,
        lease_micros: i64,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let done = sqlx::query(audited(&sql.extend))
            .bind(lease_micros)
            .bind(lock.key)
            .bind(lock.owner)
            .bind(lock.fencing_token)
            .execute(conn)
            .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let micros = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
        Ok(DateTime::from_timestamp_micros(micros))
    }

    async fn renew(
        conn: &mut MySqlConnection,
        sql: &Statements,
        batch: &[Renewal<'_>],
        wait: RenewWait,
    ) -> Result<Vec<RowState>, sqlx::Error> {
        let json = batch_json(batch, serde_json::Value::from);
        let (statement, budget) = match wait {
            RenewWait::Skip => (&sql.renew, None),
            RenewWait::Briefly(budget) => (&sql.renew_waiting, Some(micros(budget))),
        };
        // The keys of the leases the successful UPDATE was asked to renew: every one of
        // them that is ours and live afterwards was renewed by it (nothing else makes an
        // expired row live for that owner).
        let asked: HashSet<&str> = match update_batch(conn, statement, &json, budget).await? {
            // sqlx sets CLIENT_FOUND_ROWS: the count is of rows matched, so every lease of
            // the batch was renewed when it equals the batch's size.
            Some(done) if wait == RenewWait::Skip && done.rows_affected() == batch.len() as u64 => {
                let now = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
                return Ok(batch
                    .iter()
                    .map(|r| RowState {
                        key: r.id.key.to_owned(),
                        owner: r.id.owner.to_owned(),
                        fencing_token: r.id.fencing_token,
                        expires_at: DateTime::from_timestamp_micros(
                            now.saturating_add(r.lease_micros),
                        )
                        .unwrap_or(DateTime::<Utc>::MAX_UTC),
                        renewed: true,
                        busy: false,
                    })
                    .collect());
            }
            Some(_) => batch.iter().map(|r| r.id.key).collect(),
            // A row was locked, and nothing renewed: waiting briefly, that is the answer;
            // skipping, the rows free now are renewed alone.
            None if budget.is_some() => HashSet::new(),
            None => renew_free(conn, sql, batch).await?,
        };
        let rows: Vec<BatchRow> = sqlx::query_as(audited(&sql.read_batch))
            .bind(&json)
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(key, owner, token, expires_at, ours_and_live)| {
                // Keys were written as UTF-8 text; VARBINARY hands back the same bytes.
                let key = String::from_utf8_lossy(&key).into_owned();
                let ours_and_live = ours_and_live != 0;
                let renewed = ours_and_live && asked.contains(key.as_str());
                let mut row = RowState::from((key, owner, token, expires_at, renewed));
                row.busy = ours_and_live && !renewed;
                row
            })
            .collect())
    }

    async fn inspect(
        conn: &mut MySqlConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<Option<Inspected>, sqlx::Error> {
        // The expiry test comes back as an integer here.
        type Row = (String, i64, DateTime<Utc>, DateTime<Utc>, i64);
        let row: Option<Row> = sqlx::query_as(audited(&sql.inspect))
            .bind(key)
            .fetch_optional(conn)
            .await?;
        Ok(row.map(|(owner, token, acquired_at, expires_at, expired)| {
            Inspected::from((owner, token, acquired_at, expires_at, expired != 0))
        }))
    }

    async fn list(
        conn: &mut MySqlConnection,
        sql: &Statements,
        query: ListQuery<'_>,
    ) -> Result<Vec<Listed>, sqlx::Error> {
        type Row = (
            Vec<u8>,
            String,
            i64,
            DateTime<Utc>,
            DateTime<Utc>,
            i64,
            DateTime<Utc>,
        );
        let rows: Vec<Row> = sqlx::query_as(audited(&sql.list))
            .bind(query.from.as_bytes())
            .bind(query.until.map(str::as_bytes))
            .bind(query.until.map(str::as_bytes))
            .bind(query.held_micros)
            .bind(query.held_micros)
            .bind(query.expired)
            .bind(query.expired)
            .bind(query.after.map(str::as_bytes))
            .bind(query.after.map(str::as_bytes))
            .bind(query.limit)
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(key, owner, token, acquired_at, expires_at, expired, read_at)| {
                    // Keys are written as UTF-8 by dblock; a plain-SQL client's stray bytes
                    // are shown, not refused.
                    let key = String::from_utf8_lossy(&key).into_owned();
                    Listed::from((
                        key,
                        owner,
                        token,
                        acquired_at,
                        expires_at,
                        expired != 0,
                        read_at,
                    ))
                },
            )
            .collect())
    }

    async fn keep_min_hold(
        conn: &mut MySqlConnection,
        sql: &Statements,
        lock: LockId<'_>,
        min_hold_micros: i64,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(audited(&sql.keep_min_hold))
            .bind(min_hold_micros)
            .bind(lock.key)
            .bind(lock.owner)
            .bind(lock.fencing_token)
            .bind(min_hold_micros)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_pair(
        conn: &mut MySqlConnection,
        sql: &Statements,
        pair: [LockId<'_>; 2],
        upsert_returns: bool,
    ) -> Result<Vec<ReleasedRow>, sqlx::Error> {
        if !upsert_returns {
            return Self::release_batch(conn, sql, &pair).await;
        }
        let [a, b] = pair;
        // Read to the end, as the upsert's RETURNING is: rows come before the commit.
        let rows: Vec<(Vec<u8>, i64, i64)> = sqlx::query_as(audited(&sql.release_pair))
            .bind(a.key)
            .bind(b.key)
            .bind(a.key)
            .bind(a.owner)
            .bind(a.fencing_token)
            .bind(b.key)
            .bind(b.owner)
            .bind(b.fencing_token)
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(key, fencing_token, expired)| ReleasedRow {
                // Keys were written as UTF-8 text; VARBINARY hands back the same bytes.
                key: String::from_utf8_lossy(&key).into_owned(),
                fencing_token,
                expired: expired != 0,
            })
            .collect())
    }

    async fn live_member(
        conn: &mut MySqlConnection,
        sql: &Statements,
        from: &str,
        until: &str,
    ) -> Result<bool, sqlx::Error> {
        let found: Option<i64> = sqlx::query_scalar(audited(&sql.live_member))
            .bind(from)
            .bind(until)
            .fetch_optional(conn)
            .await?;
        Ok(found.is_some())
    }

    common_lock_statements!();

    async fn check_fence(
        conn: &mut MySqlConnection,
        sql: &Statements,
        lock: LockId<'_>,
        certified: bool,
    ) -> Result<bool, sqlx::Error> {
        if certified {
            let fence = sqlx::query(audited(&sql.check_fence_write))
                .bind(lock.key)
                .bind(lock.owner)
                .bind(lock.fencing_token);
            return Ok(fence.execute(conn).await?.rows_affected() == 1);
        }
        let found: Option<i64> = sqlx::query_scalar(audited(&sql.check_fence))
            .bind(lock.key)
            .bind(lock.owner)
            .bind(lock.fencing_token)
            .fetch_optional(conn)
            .await?;
        Ok(found.is_some())
    }

    async fn check_fences(
        conn: &mut MySqlConnection,
        sql: &Statements,
        locks: &[LockId<'_>],
        certified: bool,
    ) -> Result<u64, sqlx::Error> {
        let json = ids_json(locks);
        if certified {
            let fence = sqlx::query(audited(&sql.check_fences_write)).bind(&json);
            return Ok(fence.execute(conn).await?.rows_affected());
        }
        let found: Vec<i64> = sqlx::query_scalar(audited(&sql.check_fences))
            .bind(&json)
            .fetch_all(conn)
            .await?;
        Ok(found.len() as u64)
    }

    const MAY_CERTIFY_WRITES: bool = true;

    const MAY_RETURN_FROM_UPSERT: bool = true;

    async fn upsert_returns(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(conn)
            .await?;
        Ok(mariadb_with_returning(&version))
    }

    async fn certifies_writes(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        // SHOW VARIABLES, not @@wsrep_on: MySQL has no such variable, and an unknown one
        // is an error, here inside the caller's transaction. The session's value: a
        // session with wsrep_on off writes without replication.
        let row: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
            .fetch_optional(conn)
            .await?;
        Ok(row.is_some_and(|(_, value)| value.eq_ignore_ascii_case("ON")))
    }
}

impl TicketSql for MySql {
    async fn take_ticket(
        conn: &mut MySqlConnection,
        sql: &Statements,
        key: &str,
        lease_micros: i64,
    ) -> Result<i64, sqlx::Error> {
        let done = sqlx::query(audited(&sql.take_ticket))
            .bind(key)
            .bind(lease_micros)
            .execute(conn)
            .await?;
        i64::try_from(done.last_insert_id()).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }

    async fn renew_tickets(
        conn: &mut MySqlConnection,
        sql: &Statements,
        tickets: &[i64],
        lease_micros: i64,
    ) -> Result<Vec<i64>, sqlx::Error> {
        let list = ticket_list(tickets);
        let done = sqlx::query(audited(&sql.renew_tickets))
            .bind(lease_micros)
            .bind(&list)
            .execute(&mut *conn)
            .await?;
        // CLIENT_FOUND_ROWS: matched rows, and every matched row was renewed.
        if done.rows_affected() == tickets.len() as u64 {
            return Ok(tickets.to_vec());
        }
        sqlx::query_scalar(audited(&sql.live_tickets))
            .bind(&list)
            .fetch_all(conn)
            .await
    }

    common_ticket_statements!();
}

impl NotifySql for MySql {
    note_waiter!();

    async fn waiters(
        conn: &mut MySqlConnection,
        sql: &Statements,
        keys: &[&str],
        _waiter: i64,
        registration: Option<u64>,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        let queues: Vec<serde_json::Value> = keys
            .iter()
            .map(|key| serde_json::json!({ "k": key, "q": registered_key(key) }))
            .collect();
        let own = registration.unwrap_or(0);
        sqlx::query_as(audited(&sql.waiters))
            .bind(own)
            .bind(own)
            .bind(serde_json::Value::Array(queues).to_string())
            .fetch_all(conn)
            .await
    }

    const RINGS_BELLS: bool = true;

    async fn take_bell(
        conn: &mut MySqlConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<bool, sqlx::Error> {
        // 1 taken; 0 another session holds it; NULL an error (a killed query).
        let took: Option<i64> = sqlx::query_scalar(audited(&sql.take_bell))
            .bind(key)
            .fetch_one(conn)
            .await?;
        Ok(took == Some(1))
    }

    async fn drop_bell(
        conn: &mut MySqlConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(audited(&sql.drop_bell))
            .bind(key)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn listen(
        listener: ListenerOptions<MySql>,
        table: &str,
    ) -> Result<Option<Box<dyn Releases>>, sqlx::Error> {
        let mut registry = MySqlConnection::connect_with(&listener.options).await?;
        // Galera: named locks are a node's own (and refused outright where `wsrep_on`
        // since MDEV-30473): a bell rung on one node wakes nobody on another. Waiters poll
        // there, and acquisitions read no watchers (LockTable::watches).
        if MySql::certifies_writes(&mut registry).await? {
            registry.close().await.ok();
            return Ok(None);
        }
        let session: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
            .fetch_one(&mut registry)
            .await?;
        let session = u64::try_from(session).unwrap_or_default();
        let bells = bells::Bells::start(registry, session, listener, bell_sql(table));
        Ok(Some(Box::new(bells)))
    }
}

/// Takes the cluster-wide migration claim of `table` on this connection (see
/// `MIGRATION_CLAIM`), waiting while another run holds it.
async fn claim_migrations(conn: &mut MySqlConnection, table: &str) -> Result<(), sqlx::Error> {
    let spliced = |template: &str| sqlx::AssertSqlSafe(template.replace("{table}", table));
    sqlx::raw_sql(spliced(MIGRATION_CLAIM_TABLE))
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(spliced(MIGRATION_CLAIM_OWNER))
        .execute(&mut *conn)
        .await?;
    let until = tokio::time::Instant::now() + MIGRATION_WAIT;
    loop {
        sqlx::raw_sql(spliced(MIGRATION_CLAIM_EXPIRED))
            .execute(&mut *conn)
            .await?;
        let claimed = sqlx::query(spliced(MIGRATION_CLAIM))
            .bind(MIGRATION_CLAIM_SECS)
            .execute(&mut *conn)
            .await;
        match claimed {
            Ok(_) => return Ok(()),
            // Another run holds the claim (1062), or claimed it on another node in the
            // same instant (Galera's certification failure, 1213): wait for it.
            Err(err) if MySql::contention(&err) != Contention::Failure => {
                if tokio::time::Instant::now() >= until {
                    return Err(sqlx::Error::Protocol(format!(
                        "another process has been migrating {table} for {}s (its claim is \
                         the row of {table}_migrating)",
                        MIGRATION_WAIT.as_secs()
                    )));
                }
                tokio::time::sleep(MIGRATION_POLL).await;
            }
            Err(err) => return Err(err),
        }
    }
}

impl MigrateSql for MySql {
    const MIGRATIONS: &'static [(&'static str, &'static str)] = migration_scripts!("mysql"; "V1__distributed_lock.sql", "V2__tickets.sql", "V3__events.sql");

    async fn lock_migrations(conn: &mut MySqlConnection, table: &str) -> Result<(), sqlx::Error> {
        let got: Option<i64> = sqlx::query_scalar(MIGRATION_LOCK)
            .bind(table)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(sqlx::Error::Protocol(format!(
                "GET_LOCK for migrating {table} returned {got:?}"
            )));
        }
        claim_migrations(conn, table).await
    }

    async fn unlock_migrations(
        conn: &mut MySqlConnection,
        table: &str,
        _commit: bool,
    ) -> Result<(), sqlx::Error> {
        let unclaim = MIGRATION_UNCLAIM.replace("{table}", table);
        sqlx::raw_sql(sqlx::AssertSqlSafe(unclaim))
            .execute(&mut *conn)
            .await?;
        sqlx::query(MIGRATION_UNLOCK)
            .bind(table)
            .execute(conn)
            .await?;
        Ok(())
    }

    migration_io!();
}

impl ErrorCodes for MySql {
    fn contention(err: &sqlx::Error) -> Contention {
        // A competing acquire's upsert takes a shared lock on the row for its duplicate
        // check and then asks for an exclusive one; a release or renewal queued in between
        // makes InnoDB roll back one of them: the statement changed nothing.
        match error_number(err) {
            Some(ER_LOCK_DEADLOCK | ER_CHECKREAD) => Contention::Deadlock,
            Some(ER_LOCK_WAIT_TIMEOUT | ER_LOCK_NOWAIT | ER_STATEMENT_TIMEOUT) => {
                Contention::LostRace
            }
            _ if is_unique_violation(err) => Contention::LostRace,
            _ => Contention::Failure,
        }
    }

    fn is_missing_table(err: &sqlx::Error) -> bool {
        error_number(err) == Some(ER_NO_SUCH_TABLE)
    }

    fn missing_column(err: &sqlx::Error) -> Option<String> {
        // `Unknown column 'expire_time' in 'field list'` (or `'t.expire_time'`)
        if error_number(err) != Some(ER_BAD_FIELD_ERROR) {
            return None;
        }
        let sqlx::Error::Database(db) = err else {
            return None;
        };
        let name = quoted_after(db.message(), "Unknown column ", '\'', '\'')?;
        Some(name.rsplit('.').next().unwrap_or(&name).to_owned())
    }

    fn is_row_locked(err: &sqlx::Error) -> bool {
        // MariaDB answers NOWAIT with 1205 as well
        matches!(
            error_number(err),
            Some(ER_LOCK_WAIT_TIMEOUT | ER_LOCK_NOWAIT)
        )
    }
}

impl TxSql for MySql {
    fn bind_mark(_index: usize) -> String {
        "?".to_owned()
    }

    fn row_lock_sql(select: &str, mode: RowWait) -> String {
        let RowWait::Timeout(timeout) = mode else {
            return format!("{select}{}", super::for_update(mode));
        };
        // Per statement, so no session setting outlives the call: MySQL 8 reads the
        // optimizer hint, MariaDB (which ignores the hint) runs the `/*M! .. */` comment.
        // Both count whole seconds; a fraction would mean NOWAIT on MariaDB, so round up.
        let seconds = timeout.as_millis().div_ceil(1000).max(1);
        let body = select.strip_prefix("SELECT ").unwrap_or(select);
        format!(
            "SELECT /*+ SET_VAR(innodb_lock_wait_timeout = {seconds}) */ {body}{} /*M! WAIT {seconds} */",
            super::for_update(mode)
        )
    }

    super::portable_ops!();
}

// A locking read sees the latest committed row, whatever the transaction's snapshot; the
// shared lock holds off takeover, release and renewal until the caller's transaction ends.
// LOCK IN SHARE MODE rather than FOR SHARE: MariaDB does not know the latter. A shared
// lock, not an exclusive one (nor a write, as on Galera below): a rival's acquisition
// upsert of a held key takes a shared lock on the row (the duplicate-key check) and then
// asks for an exclusive one; an exclusive request of the holder's between those two is a
// deadlock, and InnoDB rolled back the holder's fenced transaction (the semaphore
// conformance test: most runs under two CPU burners, with the write below).
const CHECK_FENCE: &str = "\
SELECT fencing_token FROM {table}
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)
  LOCK IN SHARE MODE";

// On a MariaDB Galera cluster (LockSql::certifies_writes) the check is a write: a row lock
// is the node's own, and only a written row takes part in certification. A fenced
// transaction that only read the lock row committed on node 1 after a rival's takeover had
// committed on node 2 (fault scenario 10g: 10 of 40 under load); writing the row makes
// Galera refuse one of the two. The change is the smallest real one (a lease one
// microsecond longer): an UPDATE that sets a column to its own value writes no row event,
// so nothing to certify. There the deadlock above can roll the fenced transaction back
// when a rival on the same node tries the held key at that moment: a conflict that
// LockGuard::explain reads as such (the lock still held), as Galera's own are.
const CHECK_FENCE_WRITE: &str = "\
UPDATE {table} SET expire_time = expire_time + INTERVAL 1 MICROSECOND
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)";

// CHECK_FENCE and CHECK_FENCE_WRITE for several rows (a MultiGuard's), in one statement.
const CHECK_FENCES: &str = "\
SELECT t.fencing_token FROM {batch} JOIN {table} AS t ON t.lock_key = w.k
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok AND t.expire_time > NOW(6)
  LOCK IN SHARE MODE";
const CHECK_FENCES_WRITE: &str = "\
UPDATE {batch} JOIN {table} AS t ON t.lock_key = w.k
   SET t.expire_time = t.expire_time + INTERVAL 1 MICROSECOND
 WHERE t.lock_value = w.o AND t.fencing_token = w.tok AND t.expire_time > NOW(6)";

#[cfg(test)]
mod tests {
    use super::*;

    /// The names an acquisition binds are the names the listener's statements compute on
    /// the server (`named`): otherwise a holder never sees a waiter registered, and no
    /// bell rings. Keys with non-ASCII characters, the separator's byte, a group's mark,
    /// and the empty key.
    #[tokio::test]
    async fn client_wait_names_are_the_servers() {
        let Some(pool) = crate::dialect::test_mysql_server().await else {
            return;
        };
        let mut conn = pool.acquire().await.unwrap();
        let table = "dblock_names";
        let statements = MySql::statements(table, Durability::Durable);
        for queue in ["k", "orders~", "clé ✓ 鍵", "", "a\u{1F}b"] {
            let client = wait_names_on(&mut conn, &statements, queue).await.unwrap();
            for (kind, name) in WAIT.iter().zip(&client) {
                let named = sql(&format!("SELECT {}", named(kind, "?")), table);
                let server: Vec<u8> = sqlx::query_scalar(audited(&named))
                    .bind(queue)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert_eq!(String::from_utf8(server).unwrap(), *name, "{queue:?}");
            }
        }
        // No database selected: `CONCAT_WS` skips the `NULL`.
        let server: Vec<u8> = sqlx::query_scalar(
            "SELECT CONCAT('dblock:', MD5(CONCAT_WS(0x1F, NULL, 't', 'k')), ':w1')",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        assert_eq!(
            String::from_utf8(server).unwrap(),
            wait_names(None, "t", "k")[1]
        );
    }

    #[test]
    fn token_counters_are_mysqls_crc32() {
        // CRC-32's check value, and what MariaDB says:
        // `SELECT CRC32('catalog~write-grant') % 16` is 14.
        let crc32 = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
        assert_eq!(crc32.checksum(b"123456789"), 0xCBF4_3926);
        assert_eq!(token_counter("catalog~write-grant"), 14);
        assert!(MySql::shares_token_counter("a", "a"));
    }

    #[test]
    fn returning_is_mariadb_10_5_and_later() {
        assert!(mariadb_with_returning("10.11.19-MariaDB-0+deb12u1"));
        assert!(mariadb_with_returning("11.8.2-MariaDB-ubu2404-log"));
        assert!(mariadb_with_returning("10.5.0-MariaDB"));
        assert!(!mariadb_with_returning(
            "10.4.34-MariaDB-1:10.4.34+maria~ubu2004"
        ));
        assert!(!mariadb_with_returning("8.0.36"));
        assert!(!mariadb_with_returning("8.4.3-commercial"));
        assert!(!mariadb_with_returning(""));
    }
}
