//! SQLite, the embedded default: every statement dblock sends to SQLite, and how answers
//! are read.
//!
//! SQLite has one writer at a time. Acquire is two statements: a read of whether the key
//! is held by a live lease (then it has lost, without queueing for the write lock), then
//! one upsert (insert, or take over an expired row) that takes the next fencing token from
//! the counter row and returns it; a trigger moves the counter forward in the same
//! statement. The "database clock" is the clock of the machine running SQLite, in
//! milliseconds.
//!
//! Waiters of other processes are told of releases by their Locker's listener
//! (`listener.rs`): a connection to the same file that notices other connections'
//! commits (`PRAGMA data_version`) and reads the marks its waiters left in
//! `{table}_waiter`, which deleting a row pokes (migration V3).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Sqlite, SqliteConnection};

use super::{
    Acquired, Contention, Dialect, Durability, ErrorCodes, ListenerOptions, LockId, LockSql,
    MigrateSql, NotifySql, ReleasedRow, Releases, RenewWait, Renewal, RenewedRow, RowState,
    RowWait, Sql, TicketSql, TxSql, WriteGate, audited, batch_json, db_code, ids_json,
    is_unique_violation, json_list, read_back_states, row_states, sql, unrenewed,
};

mod history;
mod listener;

use history::{FORCE_RELEASE_ROW, RECORD_EVENTS, TRIM_EVENTS};

statements! { sqlite_sql;
    record_events: RECORD_EVENTS,
    read_events: &history::read_events(false),
    read_events_oldest: &history::read_events(true),
    trim_events: TRIM_EVENTS,
    force_release_row: FORCE_RELEASE_ROW,
    held: HELD,
    read_keys: READ_KEYS,
    live_member: LIVE_MEMBER,
    mark: MARK,
    release_marked: RELEASE_MARKED,
    waiters: WAITERS,
}

/// A lease (or a minimum hold) as SQLite takes it: a date modifier.
fn lease_param(micros: i64) -> String {
    modifier(micros)
}

/// A minimum held time as SQLite takes it: a date modifier going back
/// (`-3600.000000 seconds`).
fn since_param(micros: i64) -> String {
    modifier(micros).replacen('+', "-", 1)
}

/// A list of tickets as SQLite takes it: one JSON array (read with `json_each`).
fn ticket_list(tickets: &[i64]) -> String {
    json_list(tickets)
}

/// A list of keys as SQLite takes it: one JSON array of strings.
fn key_list(keys: Vec<&str>) -> String {
    serde_json::Value::from(keys).to_string()
}

const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";

// The key's row, if any: whether it is live, its owner and token. A live row ends the
// attempt (lost); otherwise the upsert below decides, and a row it finds changed since
// this read is a lost race too, tried again later.
const HELD: &str = "\
SELECT expire_time > {now}, lock_value, fencing_token FROM {table} WHERE lock_key = ?1";

// The upsert writes only what HELD saw (?4, ?5: the expired row's token and owner, or
// NULL for no row): the insert only when it saw no row or the row is still there (it
// then conflicts), the takeover only of that row. So a win tells which it was, from the
// read the attempt makes anyway: RETURNING sees only the new row, and a trigger would
// cost every takeover a write more.
const ACQUIRE: &str = "\
INSERT INTO {table} (lock_key, lock_value, expire_time, fencing_token, acquired_at)
SELECT ?1, ?2, strftime('%Y-%m-%d %H:%M:%f', 'now', ?3),
       (SELECT last_token + 1 FROM {table}_fencing WHERE id = 1), {now}
 WHERE ?4 IS NULL OR EXISTS (SELECT 1 FROM {table} WHERE lock_key = ?1)
ON CONFLICT (lock_key) DO UPDATE
   SET lock_value = excluded.lock_value,
       expire_time = excluded.expire_time,
       fencing_token = excluded.fencing_token,
       acquired_at = excluded.acquired_at
 WHERE {table}.expire_time <= {now} AND {table}.fencing_token = ?4
   AND {table}.lock_value = ?5
RETURNING fencing_token, expire_time";

const RELEASE: &str = "\
DELETE FROM {table} WHERE lock_key = ?1 AND lock_value = ?2 AND fencing_token = ?3
RETURNING expire_time <= {now}";

// The lease engine's release (`LockSql::release_marked`): RELEASE, and whether a live mark
// of another Locker (not ?4) is on the key or its group (see V3__waiters.sql), whose
// waiters then go first. Read in the DELETE's own step (the marks stay: the trigger only
// pokes them), so no extra statement when nobody waits.
const RELEASE_MARKED: &str = "\
DELETE FROM {table} WHERE lock_key = ?1 AND lock_value = ?2 AND fencing_token = ?3
RETURNING expire_time <= {now},
          EXISTS (SELECT 1 FROM {table}_waiter
                   WHERE lock_key IN (?1, rtrim(?1, replace(?1, '~', '')))
                     AND waiter <> ?4 AND expire_time > {now})";

// The batched release of the lease engine: the batch's rows are found through the
// primary key (the join is driven by the JSON array), each still owner- and
// token-checked.
const RELEASE_BATCH: &str = "\
DELETE FROM {table} WHERE rowid IN (
    SELECT t.rowid FROM json_each(?1) AS w
      JOIN {table} AS t ON t.lock_key = w.value ->> '$.k'
     WHERE t.lock_value = w.value ->> '$.o' AND t.fencing_token = w.value ->> '$.t')
RETURNING lock_key, fencing_token, expire_time <= {now}";

const EXTEND: &str = "\
UPDATE {table} SET expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', ?3)
 WHERE lock_key = ?1 AND lock_value = ?2 AND fencing_token = ?4 AND expire_time > {now}
RETURNING expire_time";

// The batch is one JSON array; RETURNING may name only the updated table, so renewed
// rows are matched back by key, owner and token.
const RENEW: &str = "\
UPDATE {table}
   SET expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', w.value ->> '$.m')
  FROM json_each(?1) AS w
 WHERE {table}.lock_key = w.value ->> '$.k' AND {table}.lock_value = w.value ->> '$.o'
   AND {table}.fencing_token = w.value ->> '$.t' AND {table}.expire_time > {now}
RETURNING lock_key, lock_value, fencing_token, expire_time";

// The rows of keys a renewal did not renew, and whether each is live, to say why.
const READ_KEYS: &str = "\
SELECT lock_key, lock_value, fencing_token, expire_time, expire_time > {now} FROM {table}
 WHERE lock_key IN (SELECT value FROM json_each(?1))";

// The clock every other statement reads: a schedule asks it which period it is.
const CLOCK: &str = "SELECT {now}";

const INSPECT: &str = "\
SELECT lock_value, fencing_token, acquired_at, expire_time, expire_time <= {now}
  FROM {table} WHERE lock_key = ?1";

// Keys use the BINARY collation: the range is a byte range over the primary key. ?3 is a
// date modifier going back the minimum held time ('-3600.000000 seconds').
const LIST: &str = "\
SELECT t.lock_key, t.lock_value, t.fencing_token, t.acquired_at, t.expire_time,
       t.expire_time <= c.db_now, c.db_now
  FROM (SELECT {now} AS db_now) AS c, {table} AS t
 WHERE t.lock_key >= ?1 AND (?2 IS NULL OR t.lock_key < ?2)
   AND (?3 IS NULL OR t.acquired_at <= strftime('%Y-%m-%d %H:%M:%f', c.db_now, ?3))
   AND (?4 IS NULL OR (t.expire_time <= c.db_now) = ?4)
   AND (?6 IS NULL OR t.lock_key > ?6)
 ORDER BY t.lock_key
 LIMIT ?5";

// A write's look for live readers, inside its transaction (`LockSql::live_member`): the
// transaction holds the database's write lock since its first insert, so no reader
// commits between this read and the write's commit.
const LIVE_MEMBER: &str = "\
SELECT EXISTS (SELECT 1 FROM {table}
                WHERE lock_key >= ?1 AND lock_key < ?2 AND expire_time > {now})";

// The delete pokes the waiters' marks, as a release does (V3__waiters.sql's trigger).
const FORCE_RELEASE: &str = "DELETE FROM {table} WHERE lock_key = ?1";

// A job's minimum hold: the row stays until `acquired_at + ?4`, by the database clock that
// wrote `acquired_at`, but never longer than its lease already runs.
const KEEP_MIN_HOLD: &str = "\
UPDATE {table}
   SET expire_time = min(expire_time, strftime('%Y-%m-%d %H:%M:%f', acquired_at, ?4))
 WHERE lock_key = ?1 AND lock_value = ?2 AND fencing_token = ?3
   AND strftime('%Y-%m-%d %H:%M:%f', acquired_at, ?4) > {now} AND expire_time > {now}";

// One writer at a time: tickets commit in number order.
const TAKE_TICKET: &str = "\
INSERT INTO {table}_ticket (lock_key, expire_time)
VALUES (?1, strftime('%Y-%m-%d %H:%M:%f', 'now', ?2))
RETURNING ticket";

const EARLIER_TICKET: &str = "\
SELECT EXISTS (SELECT 1 FROM {table}_ticket
                WHERE lock_key = ?1 AND ticket < ?2 AND expire_time > {now})";

const RENEW_TICKETS: &str = "\
UPDATE {table}_ticket SET expire_time = strftime('%Y-%m-%d %H:%M:%f', 'now', ?2)
 WHERE ticket IN (SELECT value FROM json_each(?1)) AND expire_time > {now}
RETURNING ticket";

const DROP_TICKETS: &str =
    "DELETE FROM {table}_ticket WHERE ticket IN (SELECT value FROM json_each(?1))";

const PURGE_TICKETS: &str = "DELETE FROM {table}_ticket WHERE expire_time < {now}";

// A waiter about to sleep (`NotifySql::note_waiter_in`) reads how long the holder's lease
// of the row it waits for (?1) has left (NULL: no row), and whether its Locker (?3)
// already marked its queue's key (?2), with at least half a mark's life left: a lock's key
// for that very row (token 0 for none), as PostgreSQL marks rows; a group (a semaphore's
// permits, whose rows change hands all the time) whatever row it named. Only when it has
// not does MARK write: a waiter that loses again and again against one row writes once,
// the other listeners, which notice every commit, are not kept reading by waiters' marks,
// and the writers of a busy semaphore do not queue for SQLite's one write lock behind
// marks that say nothing new.
const NOTE_WAITER: &str = "\
SELECT t.left_micros,
       EXISTS (SELECT 1 FROM {table}_waiter AS w
                WHERE w.lock_key = ?2 AND w.waiter = ?3
                  AND (?2 <> ?1 OR w.fencing_token = coalesce(t.fencing_token, 0))
                  AND w.expire_time > {mark_fresh})
  FROM (SELECT 1) AS one
  LEFT JOIN (SELECT MAX(0, CAST(ROUND((julianday(expire_time) - julianday({now})) * 86400000000) AS INTEGER)) AS left_micros,
                    fencing_token
               FROM {table} WHERE lock_key = ?1) AS t ON 1";

// The mark: the queue's key, for the row now live (0: none), whatever NOTE_WAITER read, so
// that the Locker waits marked even while the row changes hands quickly (a semaphore's
// permit); and whether that row is live, read in the same step: a mark written while it
// is will be poked by its delete, but a release between NOTE_WAITER's read and this write
// pokes nothing, and the waiter, told the row is gone, tries again at once. A mark that
// exists keeps its pokes (the listener compares them with what it last read).
const MARK: &str = "\
INSERT INTO {table}_waiter (lock_key, waiter, fencing_token, expire_time)
VALUES (?2, ?3,
        coalesce((SELECT fencing_token FROM {table} WHERE lock_key = ?1 AND expire_time > {now}), 0),
        {mark_until})
ON CONFLICT (lock_key, waiter) DO UPDATE
   SET fencing_token = excluded.fencing_token, expire_time = excluded.expire_time
RETURNING EXISTS (SELECT 1 FROM {table} WHERE lock_key = ?1 AND expire_time > {now})";

// The listener's statements (`listener.rs`): its Locker's marks, with their pokes, the
// token of the last row released, and whether each has at least half its life left; the
// refresh of the marks of keys still waited for; and the deletion of every expired mark
// (of Lockers that stopped or died).
const MARKS: &str = "\
SELECT lock_key, pokes, released_token, expire_time > {mark_fresh}
  FROM {table}_waiter WHERE waiter = ?1";

const REFRESH_MARKS: &str = "\
UPDATE {table}_waiter SET expire_time = {mark_until}
 WHERE waiter = ?1 AND lock_key IN (SELECT value FROM json_each(?2))";

const PURGE_MARKS: &str = "DELETE FROM {table}_waiter WHERE expire_time <= {now}";

// For each key of a console page (`NotifySql::waiters`), the Lockers other than the asking
// one (?2) with a live mark on the key or on its group (`<name>~`, the queue a primitive's
// waiters mark; the group as the poke trigger computes it): a mark is one Locker whose
// waiters wait, kept alive by its listener while they do. Two primary-key probes a key.
const WAITERS: &str = "\
SELECT k.value, COUNT(DISTINCT w.waiter)
  FROM json_each(?1) AS k
  JOIN {table}_waiter AS w
    ON w.lock_key IN (k.value, rtrim(k.value, replace(k.value, '~', '')))
 WHERE w.waiter <> ?2 AND w.expire_time > {now}
 GROUP BY k.value";

// A mark lasts a second unless its Locker's listener refreshes it (at half that, while its
// waiters wait): a Locker that died is waited for by nobody after a second at most.
const MARK_UNTIL: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 seconds')";
const MARK_FRESH: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now', '+0.5 seconds')";

/// How long a Locker whose release found a mark of another Locker keeps its own waiters of
/// that key back, unless its listener hears the release sooner (see
/// [`NotifySql::YIELD_FOR`]): the other Locker's listener looks every 1.5 to 4.5 ms
/// (`listener.rs`), and its waiter's attempt takes a millisecond or so; the rest is room
/// for a busy machine. The wait ends with the yielding Locker's own listener's next look
/// whenever it has waiters of the key itself, so that both start even.
const YIELD_FOR: Duration = Duration::from_millis(15);

/// The file behind the `main` database, empty for an in-memory one.
const MAIN_FILE: &str = "SELECT file FROM pragma_database_list WHERE name = 'main'";

const REAP: &str = "\
DELETE FROM {table} WHERE rowid IN (
    SELECT rowid FROM {table} WHERE expire_time < {now} ORDER BY expire_time LIMIT ?1)";

fn sqlite_sql(template: &str, table: &str) -> Sql {
    let template = template
        .replace("{mark_until}", MARK_UNTIL)
        .replace("{mark_fresh}", MARK_FRESH);
    sql(&template.replace("{now}", NOW), table)
}

/// A lease as an SQLite date modifier: `+30.000000 seconds`.
fn modifier(lease_micros: i64) -> String {
    format!(
        "+{}.{:06} seconds",
        lease_micros / 1_000_000,
        lease_micros % 1_000_000
    )
}

impl super::sealed::Sealed for Sqlite {}

impl Dialect for Sqlite {
    const REFUSED_QUALIFIED: Option<&'static str> = Some(
        "SQLite takes no schema-qualified name: tables of attached databases are not supported",
    );

    type Statements = Statements;

    fn statements(table: &str, _durability: Durability) -> Statements {
        build_statements(table)
    }

    fn write_gate(options: &sqlx::sqlite::SqliteConnectOptions) -> Option<WriteGate> {
        static GATES: std::sync::LazyLock<
            std::sync::Mutex<HashMap<std::path::PathBuf, std::sync::Weak<tokio::sync::RwLock<()>>>>,
        > = std::sync::LazyLock::new(Default::default);
        let file = options.get_filename();
        let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
        let mut gates = GATES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gate) = gates.get(&file).and_then(std::sync::Weak::upgrade) {
            return Some(gate);
        }
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = WriteGate::default();
        gates.insert(file, std::sync::Arc::downgrade(&gate));
        Some(gate)
    }
}

impl LockSql for Sqlite {
    async fn acquire(
        conn: &mut SqliteConnection,
        sql: &Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
        // No lock to wait for: SQLite's busy handler bounds a write's wait.
        _wait: std::time::Duration,
        _upsert_returns: bool,
    ) -> Result<Option<Acquired>, sqlx::Error> {
        // Without this read every losing attempt queued for the single write lock, waiting
        // in SQLite's busy handler on a pooled connection: a hundred waiters on a small
        // pool then starved the holder's own renewal and release (its lease was lost).
        let held: Option<(bool, String, i64)> = sqlx::query_as(audited(&sql.held))
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        let expired = match held {
            Some((true, _, _)) => return Ok(None),
            Some((false, holder, token)) => Some((token, holder)),
            None => None,
        };
        // One statement, atomic on its own; the migration's trigger moves the counter
        // forward whenever a row is written with a new token.
        let row: Option<(i64, DateTime<Utc>)> = sqlx::query_as(audited(&sql.acquire))
            .bind(key)
            .bind(owner)
            .bind(lease_param(lease_micros))
            .bind(expired.as_ref().map(|(token, _)| *token))
            .bind(expired.as_ref().map(|(_, holder)| holder.as_str()))
            .fetch_optional(conn)
            .await?;
        Ok(row.map(|(fencing_token, expires_at)| Acquired {
            fencing_token,
            expires_at,
            taken_over: expired.is_some(),
        }))
    }

    async fn check_fences(
        conn: &mut SqliteConnection,
        sql: &Statements,
        locks: &[LockId<'_>],
        _certified: bool,
    ) -> Result<u64, sqlx::Error> {
        let found: Vec<i64> = sqlx::query_scalar(audited(&sql.check_fences))
            .bind(ids_json(locks))
            .fetch_all(conn)
            .await?;
        Ok(found.len() as u64)
    }

    async fn release_marked(
        conn: &mut SqliteConnection,
        sql: &Statements,
        lock: LockId<'_>,
        waiter: i64,
    ) -> Result<Option<(bool, bool)>, sqlx::Error> {
        sqlx::query_as(audited(&sql.release_marked))
            .bind(lock.key)
            .bind(lock.owner)
            .bind(lock.fencing_token)
            .bind(waiter)
            .fetch_optional(conn)
            .await
    }

    async fn release_batch(
        conn: &mut SqliteConnection,
        sql: &Statements,
        batch: &[LockId<'_>],
    ) -> Result<Vec<ReleasedRow>, sqlx::Error> {
        let rows: Vec<(String, i64, bool)> = sqlx::query_as(audited(&sql.release_batch))
            .bind(ids_json(batch))
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(key, fencing_token, expired)| ReleasedRow {
                key,
                fencing_token,
                expired,
            })
            .collect())
    }

    async fn renew(
        conn: &mut SqliteConnection,
        sql: &Statements,
        batch: &[Renewal<'_>],
        // No row locks: the write lock is waited for by the busy handler, as by any writer.
        _wait: RenewWait,
    ) -> Result<Vec<RowState>, sqlx::Error> {
        let renewed: Vec<RenewedRow> = sqlx::query_as(audited(&sql.renew))
            .bind(batch_json(batch, |micros| modifier(micros).into()))
            .fetch_all(&mut *conn)
            .await?;
        renewed_then_read_back!(conn, sql, batch, renewed)
    }

    async fn live_member(
        conn: &mut SqliteConnection,
        sql: &Statements,
        from: &str,
        until: &str,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(audited(&sql.live_member))
            .bind(from)
            .bind(until)
            .fetch_one(conn)
            .await
    }

    returning_lock_statements!();
    common_lock_statements!();
    fence_read_back!();
}

impl TicketSql for Sqlite {
    returning_ticket_statements!();
    common_ticket_statements!();
}

impl NotifySql for Sqlite {
    const NOTIFIES: bool = true;
    const YIELD_FOR: Duration = YIELD_FOR;

    /// Only reads what the holder's lease has left: a mark names its Locker, and dblock's
    /// waiters leave theirs through `note_waiter_in`.
    async fn note_waiter(
        conn: &mut SqliteConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (left, _): (Option<i64>, bool) = sqlx::query_as(audited(&sql.note_waiter))
            .bind(key)
            .bind(key)
            .bind(0_i64)
            .fetch_one(conn)
            .await?;
        Ok(left)
    }

    async fn note_waiter_in(
        conn: &mut SqliteConnection,
        sql: &Statements,
        key: &str,
        queue: &str,
        waiter: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (left, marked): (Option<i64>, bool) = sqlx::query_as(audited(&sql.note_waiter))
            .bind(key)
            .bind(queue)
            .bind(waiter)
            .fetch_one(&mut *conn)
            .await?;
        // An expired row is taken over by the next attempt, which the waiter makes when
        // its pause (`left`, zero) ends: no mark needed.
        if marked || left == Some(0) {
            return Ok(left);
        }
        let live: bool = sqlx::query_scalar(audited(&sql.mark))
            .bind(key)
            .bind(queue)
            .bind(waiter)
            .fetch_one(conn)
            .await?;
        // Taken meanwhile, for a lease not read: the waiter looks again soon (`left` 0).
        Ok(live.then(|| left.unwrap_or(0)))
    }

    async fn waiters(
        conn: &mut SqliteConnection,
        sql: &Statements,
        keys: &[&str],
        waiter: i64,
        _registration: Option<u64>,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(audited(&sql.waiters))
            .bind(key_list(keys.to_vec()))
            .bind(waiter)
            .fetch_all(conn)
            .await
    }

    async fn listen(
        listener: ListenerOptions<Sqlite>,
        table: &str,
    ) -> Result<Option<Box<dyn Releases>>, sqlx::Error> {
        listener::open(listener, table).await
    }
}

impl MigrateSql for Sqlite {
    const MIGRATIONS: &'static [(&'static str, &'static str)] = migration_scripts!("sqlite"; "V1__distributed_lock.sql", "V2__tickets.sql", "V3__waiters.sql", "V4__events.sql");

    const MORE_TABLES: &'static [(&'static str, &'static str)] = &[(
        "_waiter",
        "lock_key, waiter, fencing_token, expire_time, pokes, released_token",
    )];

    async fn lock_migrations(conn: &mut SqliteConnection, _table: &str) -> Result<(), sqlx::Error> {
        sqlx::query("BEGIN IMMEDIATE").execute(conn).await?;
        Ok(())
    }

    async fn unlock_migrations(
        conn: &mut SqliteConnection,
        _table: &str,
        commit: bool,
    ) -> Result<(), sqlx::Error> {
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        sqlx::query(end).execute(conn).await?;
        Ok(())
    }

    async fn keep_alive(
        conn: &mut SqliteConnection,
        options: &sqlx::sqlite::SqliteConnectOptions,
    ) -> Result<Option<SqliteConnection>, sqlx::Error> {
        // An in-memory database has no file: `main` is listed with an empty one.
        let file: Option<String> = sqlx::query_scalar(MAIN_FILE).fetch_optional(conn).await?;
        if file.is_some_and(|file| !file.is_empty()) {
            return Ok(None);
        }
        Ok(Some(sqlx::ConnectOptions::connect(options).await?))
    }

    async fn check_shared(conn: &mut SqliteConnection, table: &str) -> Result<(), sqlx::Error> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")
                .bind(table)
                .fetch_optional(conn)
                .await?;
        if found.is_none() {
            return Err(sqlx::Error::Configuration(
                "this in-memory SQLite database is private to each connection, so the pool's \
                 connections do not share the lock table and it vanishes when the pool closes \
                 the connection that holds it: open it with a shared cache \
                 (`sqlite::memory:` does; or `file:NAME?mode=memory&cache=shared`), or use a \
                 database file"
                    .into(),
            ));
        }
        Ok(())
    }

    migration_io!();
}

impl ErrorCodes for Sqlite {
    fn contention(err: &sqlx::Error) -> Contention {
        // SQLITE_BUSY and SQLITE_LOCKED with their extended codes: another writer.
        let busy = db_code(err)
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff);
        if matches!(busy, Some(5 | 6)) || is_unique_violation(err) {
            Contention::LostRace
        } else {
            Contention::Failure
        }
    }

    fn is_missing_table(err: &sqlx::Error) -> bool {
        // SQLITE_ERROR carries no finer code for this; the message is stable.
        matches!(err, sqlx::Error::Database(db) if db.message().starts_with("no such table"))
    }

    fn missing_column(err: &sqlx::Error) -> Option<String> {
        // SQLITE_ERROR again: `no such column: expire_time`, `table t has no column named
        // expire_time` (an INSERT's column list).
        let sqlx::Error::Database(db) = err else {
            return None;
        };
        let message = db.message();
        let name = match message.strip_prefix("no such column: ") {
            Some(name) => name,
            None => message.split_once(" has no column named ")?.1,
        };
        let name = name.split_whitespace().next()?;
        Some(name.rsplit('.').next().unwrap_or(name).to_owned())
    }

    fn is_row_locked(err: &sqlx::Error) -> bool {
        // SQLITE_BUSY / SQLITE_LOCKED: contention() minus its duplicate-key case
        Self::contention(err) == Contention::LostRace && !is_unique_violation(err)
    }
}

impl TxSql for Sqlite {
    fn bind_mark(index: usize) -> String {
        format!("?{index}")
    }

    fn row_lock_sql(select: &str, _mode: RowWait) -> String {
        // No row locks: begin_row_lock's BEGIN IMMEDIATE already holds the write lock.
        select.to_owned()
    }

    async fn begin_row_lock(
        conn: &mut SqliteConnection,
        mode: RowWait,
    ) -> Result<sqlx::Transaction<'_, Self>, sqlx::Error> {
        let busy_millis = match mode {
            RowWait::Wait => None,
            RowWait::NoWait | RowWait::SkipLocked => Some(0),
            RowWait::Timeout(timeout) => Some(timeout.as_millis().max(1)),
        };
        if let Some(millis) = busy_millis {
            // The busy timeout belongs to the connection: row_lock_changes_connection
            // has the caller close it afterwards instead of handing it back changed.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "PRAGMA busy_timeout = {millis}"
            )))
            .execute(&mut *conn)
            .await?;
        }
        sqlx::Connection::begin_with(conn, "BEGIN IMMEDIATE").await
    }

    fn row_lock_changes_connection(mode: RowWait) -> bool {
        mode != RowWait::Wait
    }

    super::portable_ops!();
}

// A write that changes nothing, so that a deferred transaction takes the write lock here:
// from now until it ends no other writer (takeover, release, renewal) can commit.
// CHECK_FENCE for several rows (a MultiGuard's), in one statement.
const CHECK_FENCES: &str = "\
UPDATE {table} SET lock_value = lock_value
 WHERE rowid IN (
    SELECT t.rowid FROM json_each(?1) AS w
      JOIN {table} AS t ON t.lock_key = w.value ->> '$.k'
     WHERE t.lock_value = w.value ->> '$.o' AND t.fencing_token = w.value ->> '$.t'
       AND t.expire_time > {now})
RETURNING fencing_token";

const CHECK_FENCE: &str = "\
UPDATE {table} SET lock_value = lock_value
 WHERE lock_key = ?1 AND lock_value = ?2 AND fencing_token = ?3
   AND expire_time > strftime('%Y-%m-%d %H:%M:%f', 'now')
RETURNING fencing_token";
