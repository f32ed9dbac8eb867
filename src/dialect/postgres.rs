//! PostgreSQL: every statement dblock sends to PostgreSQL, and how its answers are read.
//!
//! Acquire is one statement: an upsert that inserts, or takes over an expired row, and
//! returns a row only when we won. The fencing token is drawn from a sequence while a
//! transaction-scoped advisory lock on the key is held, so a later winner of the same key
//! always draws later (a plain `DEFAULT nextval` would be drawn before the unique check,
//! and a slow inserter could win with an older number).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;

use crate::config::micros as config_micros;
use sqlx::{PgConnection, Postgres};

use super::{
    Acquired, Contention, Dialect, Durability, ErrorCodes, HandOff, ListenerOptions, LockId,
    LockSql, MigrateSql, NotifySql, Released, ReleasedRow, Releases, RenewWait, Renewal,
    RenewedRow, RowState, RowWait, SqlValue, TicketSql, TxSql, WriteInOne, audited, db_code,
    quoted_after, read_back_states, row_states, sql, unrenewed,
};

mod history;

use history::{FORCE_RELEASE_ROW, RECORD_EVENTS, TRIM_EVENTS};

statements! { sql;
    record_events: RECORD_EVENTS,
    read_events: &history::read_events(false),
    read_events_oldest: &history::read_events(true),
    trim_events: TRIM_EVENTS,
    force_release_row: FORCE_RELEASE_ROW,
    read_keys: READ_KEYS,
    renew_waiting: &renew_waiting(),
    hand_off: HAND_OFF,
    acquire_read: &read_acquire(ACQUIRE),
    live_member: LIVE_MEMBER,
    take_write: &take_write(false),
    waiters: WAITERS,
}

/// A lease (or a minimum hold) as PostgreSQL takes it: microseconds.
fn lease_param(micros: i64) -> i64 {
    micros
}

/// A minimum held time as PostgreSQL takes it: microseconds.
fn since_param(micros: i64) -> i64 {
    micros
}

/// A list of tickets as PostgreSQL takes it: an array.
fn ticket_list(tickets: &[i64]) -> &[i64] {
    tickets
}

/// A list of keys as PostgreSQL takes it: an array.
fn key_list(keys: Vec<&str>) -> Vec<&str> {
    keys
}

/// `lock_timeout` for a statement that may wait until `wait` has passed: whole
/// milliseconds, rounded down (so that the server gives up no later than the client), at
/// least 1 (0 would mean no bound at all). A bound parameter, not text: one prepared
/// statement serves every value.
fn lock_timeout(wait: std::time::Duration) -> i64 {
    i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).max(1)
}

// The attempt's deadline travels with it (`$4`, milliseconds): `set_config(..., true)`
// sets `lock_timeout` for this statement's own transaction only, and the `FROM` makes
// it run before the advisory lock is asked for; so neither that lock nor the row lock
// of a conflicting row is waited for past the deadline (55P03, a lost race), and an
// abandoned attempt cannot commit once its caller has given up. No extra round trip.
// `xmax <> 0` says the row was taken over: a row inserted by this statement has no
// xmax, while ON CONFLICT DO UPDATE locks the old row first, and its lock stays on the
// new version as its xmax (the known way to tell the two paths apart, at no cost).
const ACQUIRE: &str = "\
WITH serialize AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended('{table}:' || $1, 0))
      FROM (SELECT set_config('lock_timeout', $4::bigint::text, true)) AS bound
)
INSERT INTO {table} AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
SELECT $1, $2, clock_timestamp() + $3::bigint * INTERVAL '1 microsecond',
       nextval('{table}_fencing_seq'), clock_timestamp()
  FROM serialize
ON CONFLICT (lock_key) DO UPDATE
   SET lock_value = EXCLUDED.lock_value,
       expire_time = EXCLUDED.expire_time,
       fencing_token = EXCLUDED.fencing_token,
       acquired_at = EXCLUDED.acquired_at
 WHERE held.expire_time <= clock_timestamp()
RETURNING fencing_token, expire_time, held.xmax <> 0";

// A relaxed (UNLOGGED) table's acquisition is ACQUIRE drawing its token only once the
// token sequence has been moved past whatever the server handed out before its last start
// (V4__relaxed_epoch.sql): a crash empties the table, and a token drawn in a transaction
// that wrote no WAL of its own may be drawn again after crash recovery. This check joins
// the advisory lock in ACQUIRE's first step, so it runs before the draw; the one-row
// epoch read costs a primary-key lookup, the function runs once per server start.
const SERIALIZE: &str = "SELECT pg_advisory_xact_lock(hashtextextended('{table}:' || $1, 0))";
const EPOCH_CHECK: &str = ",
           (SELECT started FROM {table}_epoch) = pg_postmaster_start_time()
           OR {table}_new_epoch()";

/// ACQUIRE for a relaxed table: the epoch check beside the advisory lock.
fn relaxed_acquire() -> String {
    relaxed(ACQUIRE)
}

/// A statement that draws a token (ACQUIRE, HAND_OFF), for a relaxed table.
fn relaxed(draws: &str) -> String {
    draws.replacen(SERIALIZE, &format!("{SERIALIZE}{EPOCH_CHECK}"), 1)
}

// The lease engine's own connection, bounded on the server's side (`LockSql::
// bound_session`): a client that stops acknowledging ($1, ms) or answering keepalives
// (after $2 s idle, every $3 s, 3 probes) is dropped, with the row locks its session
// held. Only TCP settings: the lane may be a connection through a transaction pooler
// (PgBouncer), where a session-level `statement_timeout` or
// `idle_in_transaction_session_timeout` would stay on a server connection that other
// clients use next and cut their long statements; TCP bounds only drop a peer that is
// gone. The engine's statements carry their own waits (`lock_timeout` in the statement)
// and are bounded on this side.
const BOUND_SESSION: &str = "\
SELECT set_config('tcp_user_timeout', $1, false),
       set_config('tcp_keepalives_idle', $2, false),
       set_config('tcp_keepalives_interval', $3, false),
       set_config('tcp_keepalives_count', '3', false)";

// A read-write lock's reader (`LockSql::acquire_read`): ACQUIRE holding the write grant's
// advisory lock ($5, the grant's key) shared while it draws its token and until it
// commits. A write's transaction takes that lock exclusively when it inserts the grant
// row (ACQUIRE's own lock on the grant's key) and holds it until it commits: so a reader
// row commits either before that, where the write's look for readers (LIVE_MEMBER, a
// statement after it) sees it, or after the write committed, where the reader's look for
// the writer's row sees that. Without it, a reader could commit and look between the
// write's look and its commit, and hold beside it. Readers share the lock: they never
// wait for one another.
const READ_SERIALIZE: &str =
    "SELECT pg_advisory_xact_lock_shared(hashtextextended('{table}:' || $5, 0)),
           pg_advisory_xact_lock(";

/// An acquisition statement (ACQUIRE, or a relaxed table's) as a reader's.
fn read_acquire(acquire: &str) -> String {
    acquire.replacen("SELECT pg_advisory_xact_lock(", READ_SERIALIZE, 1)
}

// A write's look for live readers, inside its transaction: a statement of its own, so
// that (READ COMMITTED) it sees every row committed before it began. The `LIKE` (true of
// every reader's row, `<name>~read-<hex>`) lets the readers' index of V5 serve the
// byte-order range; on a table without it, the same scan as before.
const LIVE_MEMBER: &str = "\
SELECT EXISTS (SELECT 1 FROM {table}
                WHERE lock_key COLLATE \"C\" >= $1 AND lock_key COLLATE \"C\" < $2
                  AND lock_key LIKE '%~read-%'
                  AND expire_time > clock_timestamp())";

// A read-write lock's write in one statement: the function of V5__write_in_one.sql (its
// comments say how it orders with readers and acquisitions). `relaxed`: a relaxed table's
// call checks the token epoch before the draw, as its ACQUIRE does.
fn take_write(relaxed: bool) -> String {
    format!(
        "SELECT outcome, writer_token, writer_expires, grant_token, grant_expires
           FROM {{table}}_take_write($1, $2, $3, $4, $5, $6, $7, {relaxed})"
    )
}

// The function is missing: a table not migrated to V5 yet (`undefined_function`).
const UNDEFINED_FUNCTION: &str = "42883";

// Which of a table's relations are unlogged ('u') or logged ('p'): the lock table's.
const PERSISTENCE: &str = "SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)";

// A row that a waiter of another process marked (`NOTE_WAITER`) wakes it: NOTIFY is sent
// at commit, by the same statement, with `token:key` (see `Released`). Unmarked rows notify nobody, so the uncontended cycle
// does not pay for the notification queue's lock (a large share of the commit rate with
// several clients: bench/RESULTS.md, "Figures behind choices in the code").
const RELEASE: &str = "\
DELETE FROM {table} WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3
RETURNING expire_time <= clock_timestamp(),
          CASE WHEN waiters THEN pg_notify('dblock:{table}', fencing_token || ':' || lock_key) IS NULL END";

// A release that gives the row to the next waiter of the releasing Locker (`to_owner`,
// $4) in one statement: one commit per handoff instead of the DELETE's and the waiter's
// INSERT's. The new token is drawn under ACQUIRE's advisory lock, so token order holds
// as for any acquisition; the row being ours and live, nobody else can win it meanwhile.
// A row marked by a waiter of another process (`waiters`), or whose lease has run out,
// is deleted instead, as RELEASE deletes it (that waiter is notified): local waiters do
// not pass a process that waits too. The two CTEs' conditions exclude each other; when
// the row changed after the statement's snapshot (a waiter marked it meanwhile), neither
// may apply, and the caller sends RELEASE to find out.
const HAND_OFF: &str = "\
WITH serialize AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended('{table}:' || $1, 0))
      FROM (SELECT set_config('lock_timeout', $6::bigint::text, true)) AS bound
), handed AS (
    UPDATE {table} AS held
       SET lock_value = $4,
           expire_time = clock_timestamp() + $5::bigint * INTERVAL '1 microsecond',
           fencing_token = nextval('{table}_fencing_seq'),
           acquired_at = clock_timestamp()
      FROM serialize
     WHERE held.lock_key = $1 AND held.lock_value = $2 AND held.fencing_token = $3
       AND NOT held.waiters AND held.expire_time > clock_timestamp()
    RETURNING held.fencing_token, held.expire_time
), released AS (
    DELETE FROM {table} AS held
     USING serialize
     WHERE held.lock_key = $1 AND held.lock_value = $2 AND held.fencing_token = $3
       AND (held.waiters OR held.expire_time <= clock_timestamp())
    RETURNING held.expire_time <= clock_timestamp() AS expired,
              CASE WHEN held.waiters THEN pg_notify('dblock:{table}', held.fencing_token || ':' || held.lock_key) IS NULL END AS notified
)
SELECT fencing_token, expire_time, NULL::boolean, NULL::boolean FROM handed
UNION ALL
SELECT NULL, NULL, expired, notified FROM released";

// The batched release of the lease engine (guards dropped without `release()`): one
// DELETE for the whole batch, each row still owner- and token-checked, waking marked
// rows' waiters as RELEASE does.
const RELEASE_BATCH: &str = "\
DELETE FROM {table} AS t
 USING unnest($1::text[], $2::text[], $3::bigint[]) AS w(k, o, tok)
 WHERE t.lock_key = w.k AND t.lock_value = w.o AND t.fencing_token = w.tok
RETURNING t.lock_key::text, t.fencing_token, t.expire_time <= clock_timestamp(),
          CASE WHEN t.waiters THEN pg_notify('dblock:{table}', t.fencing_token || ':' || t.lock_key) IS NULL END";

const EXTEND: &str = "\
UPDATE {table} SET expire_time = clock_timestamp() + $3::bigint * INTERVAL '1 microsecond'
 WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $4
   AND expire_time > clock_timestamp()
RETURNING expire_time";

// One statement for the whole batch: the UPDATE renews the rows that are still ours,
// each found through the primary key (the join is driven by the arrays). Only when it
// renewed fewer rows than it was asked to does a read of those keys follow, to say why
// (the other dialects do the same). A single statement that also reported the rows it
// did not renew (an outer SELECT joined with the UPDATE's RETURNING) is not robust:
// once PostgreSQL switches a prepared statement to its generic plan (after five runs),
// it does not know the arrays' length, and it nested a loop over the RETURNING rows,
// slow enough to lose every lease of a large batch (bench/RESULTS.md, "Figures behind
// choices in the code"). For the same reason the rows to renew are locked in a subquery
// that yields whole batch entries, not a list of keys: with `t.lock_key = ANY(ARRAY(
// <locked keys>))` the generic plan drove the update from that list and matched it
// against the arrays by a nested loop (every lease against every lease).
//
// The rows are locked first, `SKIP LOCKED`: a row another transaction holds (a fenced
// transaction's `FOR SHARE`, kept for hours when its connection went half-open) is left
// out instead of waited for, and the read-back finds it live and still ours (`busy`). A
// statement that waited would lose every lease of its batch at their deadlines and,
// abandoned by the engine, keep the rows it had already updated locked on the server
// until the holder of that one row let go. `FOR NO KEY UPDATE` is the lock the UPDATE
// itself takes; the UPDATE repeats the subquery's conditions, checked again on the row
// it now holds.
const RENEW: &str = "\
UPDATE {table} AS t
   SET expire_time = clock_timestamp() + w.micros * INTERVAL '1 microsecond'
  FROM (SELECT f.lock_key AS k, l.o, l.tok, l.micros
          FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS l(k, o, tok, micros)
          JOIN {table} AS f ON f.lock_key = l.k
         WHERE f.lock_value = l.o AND f.fencing_token = l.tok
           AND f.expire_time > clock_timestamp()
           FOR NO KEY UPDATE OF f SKIP LOCKED) AS w
 WHERE t.lock_key = w.k AND t.lock_value = w.o AND t.fencing_token = w.tok
   AND t.expire_time > clock_timestamp()
RETURNING t.lock_key::text, t.lock_value::text, t.fencing_token, t.expire_time";

// The renewal of leases that were busy (RenewWait::Briefly): RENEW waiting for the row
// locks, but at most `lock_timeout` (100 ms) each, set for this statement's implicit
// transaction only. The uncorrelated subquery is an InitPlan under a One-Time Filter: it
// runs before the first row is read, so before any lock wait (checked with EXPLAIN,
// generic plan). When the time runs out the statement fails whole (55P03), and so gives
// every lock back. The outer UPDATE checks the lease again once the row is locked, by the
// clock of that moment: an UPDATE that waits for a row checks its conditions (and
// computes its SET) before the wait, and when the holder of the lock ends without
// changing the row (the fenced session ended by its idle timeout), it then renewed a
// lease that had run out meanwhile (seen in the stuck-fence conformance case). And only
// a lock obtained within $5 microseconds of the statement's start counts (the engine
// passes what the lease has left before its deadline, at most the wait): a renewal
// landing after the holder was told the lease is lost would keep the key from everyone.
fn renew_waiting() -> String {
    let waiting = RENEW
        .replacen(
            "FOR NO KEY UPDATE OF f SKIP LOCKED",
            "AND (SELECT set_config('lock_timeout', '100ms', true)) IS NOT NULL\n           FOR NO KEY UPDATE OF f",
            1,
        )
        .replacen(
            "\n   AND t.expire_time > clock_timestamp()\n",
            "\n   AND t.expire_time > clock_timestamp()\n   AND clock_timestamp() < statement_timestamp() + $5::bigint * INTERVAL '1 microsecond'\n",
            1,
        );
    debug_assert!(!waiting.contains("SKIP LOCKED") && waiting.contains("$5"));
    waiting
}

// The rows of keys a renewal did not renew, and whether each is live by the database
// clock. A plain read: it waits for no lock.
const READ_KEYS: &str = "\
SELECT lock_key::text, lock_value::text, fencing_token, expire_time,
       expire_time > clock_timestamp()
  FROM {table} WHERE lock_key = ANY($1)";

// Tickets of one key are handed out one at a time (the advisory lock is held until the
// ticket commits), so a later ticket always commits after an earlier one: a waiter that
// checks for earlier tickets after its own committed sees every one of them.
const TAKE_TICKET: &str = "\
WITH serialize AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended('{table}_ticket:' || $1, 0))
)
INSERT INTO {table}_ticket (ticket, lock_key, expire_time)
SELECT nextval('{table}_ticket_seq'), $1, clock_timestamp() + $2::bigint * INTERVAL '1 microsecond'
  FROM serialize
RETURNING ticket";

const EARLIER_TICKET: &str = "\
SELECT EXISTS (SELECT 1 FROM {table}_ticket
                WHERE lock_key = $1 AND ticket < $2 AND expire_time > clock_timestamp())";

const RENEW_TICKETS: &str = "\
UPDATE {table}_ticket SET expire_time = clock_timestamp() + $2::bigint * INTERVAL '1 microsecond'
 WHERE ticket = ANY($1) AND expire_time > clock_timestamp()
RETURNING ticket";

const DROP_TICKETS: &str = "DELETE FROM {table}_ticket WHERE ticket = ANY($1)";

const PURGE_TICKETS: &str = "DELETE FROM {table}_ticket WHERE expire_time < clock_timestamp()";

// The clock every other statement reads: a schedule asks it which period it is.
const CLOCK: &str = "SELECT clock_timestamp()";

const INSPECT: &str = "\
SELECT lock_value, fencing_token, acquired_at, expire_time, expire_time <= clock_timestamp()
  FROM {table} WHERE lock_key = $1";

// Keys compare as bytes (`COLLATE "C"`), the order MySQL's VARBINARY and SQLite's BINARY
// keys have: under a linguistic collation (en_US, the official image's default) the
// primary key's order is not a byte order, and a byte range over it would miss keys with
// punctuation after the prefix. The price: the range is a filter over the table, not an
// index scan; a lock table holds the locks held now, so that is a short read.
const LIST: &str = "\
SELECT t.lock_key::text, t.lock_value::text, t.fencing_token, t.acquired_at, t.expire_time,
       t.expire_time <= c.db_now, c.db_now
  FROM (SELECT clock_timestamp() AS db_now) AS c, {table} AS t
 WHERE t.lock_key COLLATE \"C\" >= $1
   AND ($2::text IS NULL OR t.lock_key COLLATE \"C\" < $2)
   AND ($3::bigint IS NULL OR t.acquired_at <= c.db_now - $3 * INTERVAL '1 microsecond')
   AND ($4::boolean IS NULL OR (t.expire_time <= c.db_now) = $4)
   AND ($6::text IS NULL OR t.lock_key COLLATE \"C\" > $6)
 ORDER BY t.lock_key COLLATE \"C\"
 LIMIT $5";

// Whoever holds it; waiters that marked the row are woken as by a release.
const FORCE_RELEASE: &str = "\
DELETE FROM {table} WHERE lock_key = $1
RETURNING fencing_token,
          CASE WHEN waiters THEN pg_notify('dblock:{table}', fencing_token || ':' || lock_key) IS NULL END";

// A job's minimum hold: the row stays until `acquired_at + $4`, by the database clock that
// wrote `acquired_at`, but never longer than its lease already runs.
const KEEP_MIN_HOLD: &str = "\
UPDATE {table}
   SET expire_time = LEAST(expire_time, acquired_at + $4::bigint * INTERVAL '1 microsecond')
 WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3
   AND acquired_at + $4::bigint * INTERVAL '1 microsecond' > clock_timestamp()
   AND expire_time > clock_timestamp()";

// The outer condition repeats the expiry test: a row renewed after the inner scan is kept.
// A reaped row that waiters marked wakes them, like a release. `= ANY(ARRAY(..))` makes the
// batch's keys one array, looked up through the primary key: with `IN (subquery)` the
// planner hash-joined against a scan of the whole table, analyzed or not
// (tests/postgres.rs counts scans; the timings are in bench/RESULTS.md).
const REAP: &str = "\
DELETE FROM {table} WHERE lock_key = ANY(ARRAY(
    SELECT lock_key FROM {table} WHERE expire_time < clock_timestamp()
     ORDER BY expire_time LIMIT $1 FOR UPDATE SKIP LOCKED))
  AND expire_time < clock_timestamp()
RETURNING CASE WHEN waiters THEN pg_notify('dblock:{table}', fencing_token || ':' || lock_key) IS NULL END";

// A waiter about to sleep marks the row, so that its release notifies, and learns how long
// the holder's lease has left by the database clock (0 when it has run out).
const NOTE_WAITER: &str = "\
UPDATE {table} SET waiters = true WHERE lock_key = $1
RETURNING GREATEST(0, (EXTRACT(EPOCH FROM expire_time - clock_timestamp()) * 1000000)::bigint)";

// The keys of a console page (`NotifySql::waiters`) whose rows a waiter marked
// (NOTE_WAITER). The flag says only that a waiter of some Locker (the asking one's too)
// marked the row since it was written: it stays when that waiter gives up, and goes only
// with the row (a takeover of an expired row keeps it). One primary-key probe a key.
const WAITERS: &str = "\
SELECT lock_key::text, 1::bigint FROM {table} WHERE lock_key = ANY($1::text[]) AND waiters";

// The whole run is one transaction holding a transaction-scoped advisory lock: it cannot
// outlive its statements or split from them, so it works through a transaction pooler
// (PgBouncer's transaction mode pins a transaction to one server connection), and a run
// that fails or is cut off rolls back whole. Runs are still serialized across processes:
// the second waits for the first to commit, then finds everything applied.
const MIGRATION_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('dblock-migrate:' || $1, 0))";

impl super::sealed::Sealed for Postgres {}

impl Dialect for Postgres {
    const REFUSED_QUALIFIED: Option<&'static str> = None;

    type Statements = Statements;

    fn statements(table: &str, durability: Durability) -> Statements {
        let mut statements = build_statements(table);
        if durability == Durability::Relaxed {
            statements.acquire = sql(&relaxed_acquire(), table);
            statements.hand_off = sql(&relaxed(HAND_OFF), table);
            statements.acquire_read = sql(&read_acquire(&relaxed_acquire()), table);
            statements.take_write = sql(&take_write(true), table);
        }
        statements
    }
}

impl LockSql for Postgres {
    async fn acquire(
        conn: &mut PgConnection,
        sql: &Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        _upsert_returns: bool,
    ) -> Result<Option<Acquired>, sqlx::Error> {
        let row: Option<(i64, DateTime<Utc>, bool)> = sqlx::query_as(audited(&sql.acquire))
            .bind(key)
            .bind(owner)
            .bind(lease_param(lease_micros))
            .bind(lock_timeout(wait))
            .fetch_optional(conn)
            .await?;
        Ok(row.map(|(fencing_token, expires_at, taken_over)| Acquired {
            fencing_token,
            expires_at,
            taken_over,
        }))
    }

    async fn acquire_read(
        conn: &mut PgConnection,
        sql: &Statements,
        (key, grant): (&str, &str),
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        _upsert_returns: bool,
    ) -> Result<Option<Acquired>, sqlx::Error> {
        let row: Option<(i64, DateTime<Utc>, bool)> = sqlx::query_as(audited(&sql.acquire_read))
            .bind(key)
            .bind(owner)
            .bind(lease_param(lease_micros))
            .bind(lock_timeout(wait))
            .bind(grant)
            .fetch_optional(conn)
            .await?;
        Ok(row.map(|(fencing_token, expires_at, taken_over)| Acquired {
            fencing_token,
            expires_at,
            taken_over,
        }))
    }

    async fn acquire_write(
        conn: &mut PgConnection,
        sql: &Statements,
        (writer, grant): (&str, &str),
        (from, until): (&str, &str),
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
    ) -> Result<Option<WriteInOne>, sqlx::Error> {
        type Row = (
            String,
            Option<i64>,
            Option<DateTime<Utc>>,
            Option<i64>,
            Option<DateTime<Utc>>,
        );
        let row: Result<Row, sqlx::Error> = sqlx::query_as(audited(&sql.take_write))
            .bind(writer)
            .bind(grant)
            .bind(owner)
            .bind(lease_param(lease_micros))
            .bind(lock_timeout(wait))
            .bind(from)
            .bind(until)
            .fetch_one(conn)
            .await;
        let row = match row {
            Err(err) if db_code(&err).as_deref() == Some(UNDEFINED_FUNCTION) => return Ok(None),
            row => row?,
        };
        Ok(Some(match row {
            (_, Some(w), Some(w_expires), Some(g), Some(g_expires)) => {
                let writer = Acquired {
                    fencing_token: w,
                    expires_at: w_expires,
                    taken_over: false,
                };
                let grant = Acquired {
                    fencing_token: g,
                    expires_at: g_expires,
                    taken_over: false,
                };
                WriteInOne::Won(writer, grant)
            }
            (outcome, ..) if outcome == "read" => WriteInOne::Read,
            _ => WriteInOne::Held,
        }))
    }

    async fn live_member(
        conn: &mut PgConnection,
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

    const HANDS_OFF: bool = true;

    async fn bound_session(
        conn: &mut PgConnection,
        bound: std::time::Duration,
    ) -> Result<(), sqlx::Error> {
        let millis = bound.as_millis().max(1).to_string();
        let secs = bound.as_secs().max(2);
        let (idle, interval) = ((secs / 2).to_string(), (secs / 5).max(1).to_string());
        sqlx::query(BOUND_SESSION)
            .bind(&millis)
            .bind(&idle)
            .bind(&interval)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn hand_off(
        conn: &mut PgConnection,
        sql: &Statements,
        from: LockId<'_>,
        to_owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
    ) -> Result<Option<HandOff>, sqlx::Error> {
        type Row = (
            Option<i64>,
            Option<DateTime<Utc>>,
            Option<bool>,
            Option<bool>,
        );
        let row: Option<Row> = sqlx::query_as(audited(&sql.hand_off))
            .bind(from.key)
            .bind(from.owner)
            .bind(from.fencing_token)
            .bind(to_owner)
            .bind(lease_param(lease_micros))
            .bind(lock_timeout(wait))
            .fetch_optional(conn)
            .await?;
        Ok(row.map(|row| match row {
            (Some(fencing_token), Some(expires_at), _, _) => HandOff::To(Acquired {
                fencing_token,
                expires_at,
                taken_over: false,
            }),
            (_, _, expired, notified) => HandOff::Released {
                expired: expired.unwrap_or(false),
                notified: notified.is_some(),
            },
        }))
    }

    async fn check_fences(
        conn: &mut PgConnection,
        sql: &Statements,
        locks: &[LockId<'_>],
        _certified: bool,
    ) -> Result<u64, sqlx::Error> {
        let keys: Vec<&str> = locks.iter().map(|id| id.key).collect();
        let owners: Vec<&str> = locks.iter().map(|id| id.owner).collect();
        let tokens: Vec<i64> = locks.iter().map(|id| id.fencing_token).collect();
        let found: Vec<i64> = sqlx::query_scalar(audited(&sql.check_fences))
            .bind(keys)
            .bind(owners)
            .bind(tokens)
            .fetch_all(conn)
            .await?;
        Ok(found.len() as u64)
    }

    async fn release_batch(
        conn: &mut PgConnection,
        sql: &Statements,
        batch: &[LockId<'_>],
    ) -> Result<Vec<ReleasedRow>, sqlx::Error> {
        let keys: Vec<&str> = batch.iter().map(|id| id.key).collect();
        let owners: Vec<&str> = batch.iter().map(|id| id.owner).collect();
        let tokens: Vec<i64> = batch.iter().map(|id| id.fencing_token).collect();
        let rows: Vec<(String, i64, bool, Option<bool>)> =
            sqlx::query_as(audited(&sql.release_batch))
                .bind(keys)
                .bind(owners)
                .bind(tokens)
                .fetch_all(conn)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(key, fencing_token, expired, _)| ReleasedRow {
                key,
                fencing_token,
                expired,
            })
            .collect())
    }

    async fn renew(
        conn: &mut PgConnection,
        sql: &Statements,
        batch: &[Renewal<'_>],
        wait: RenewWait,
    ) -> Result<Vec<RowState>, sqlx::Error> {
        let keys: Vec<&str> = batch.iter().map(|r| r.id.key).collect();
        let owners: Vec<&str> = batch.iter().map(|r| r.id.owner).collect();
        let tokens: Vec<i64> = batch.iter().map(|r| r.id.fencing_token).collect();
        let micros: Vec<i64> = batch.iter().map(|r| r.lease_micros).collect();
        let (statement, budget) = match wait {
            RenewWait::Skip => (&sql.renew, None),
            RenewWait::Briefly(budget) => (&sql.renew_waiting, Some(config_micros(budget))),
        };
        let mut renewal = sqlx::query_as(audited(statement))
            .bind(keys)
            .bind(owners)
            .bind(tokens)
            .bind(micros);
        if let Some(budget) = budget {
            renewal = renewal.bind(budget);
        }
        let renewed: Vec<RenewedRow> = match renewal.fetch_all(&mut *conn).await {
            Ok(renewed) => renewed,
            // The wait ran out: nothing was renewed, and the read-back says which rows
            // are still ours and live (busy).
            Err(err) if Self::is_row_locked(&err) => Vec::new(),
            Err(err) => return Err(err),
        };
        renewed_then_read_back!(conn, sql, batch, renewed)
    }

    returning_lock_statements!();
    common_lock_statements!();
    fence_read_back!();
}

impl TicketSql for Postgres {
    returning_ticket_statements!();
    common_ticket_statements!();
}

impl NotifySql for Postgres {
    const NOTIFIES: bool = true;

    note_waiter!();

    const COUNTS_WAITERS: bool = false;

    /// A flag per row: who marked it is not kept, so nothing is left out.
    async fn waiters(
        conn: &mut PgConnection,
        sql: &Statements,
        keys: &[&str],
        _waiter: i64,
        _registration: Option<u64>,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(audited(&sql.waiters))
            .bind(keys)
            .fetch_all(conn)
            .await
    }

    async fn listen(
        listener: ListenerOptions<Postgres>,
        table: &str,
    ) -> Result<Option<Box<dyn Releases>>, sqlx::Error> {
        open_listener(listener, table).await
    }
}

impl MigrateSql for Postgres {
    const MIGRATIONS: &'static [(&'static str, &'static str)] = migration_scripts!("postgres"; "V1__distributed_lock.sql", "V2__waiters.sql", "V3__tickets.sql", "V5__write_in_one.sql", "V6__events.sql");

    const COLUMNS: &'static str =
        "lock_key, lock_value, expire_time, fencing_token, acquired_at, waiters";

    const RELAXED_MIGRATIONS: &'static [(&'static str, &'static str)] =
        migration_scripts!("postgres"; "V4__relaxed_epoch.sql");

    async fn durability_mismatch(
        conn: &mut PgConnection,
        table: &str,
        durability: Durability,
    ) -> Result<Option<String>, sqlx::Error> {
        let persistence: Option<String> = sqlx::query_scalar(PERSISTENCE)
            .bind(table)
            .fetch_optional(conn)
            .await?;
        let relaxed = durability == Durability::Relaxed;
        Ok(match persistence.as_deref() {
            Some("p") if relaxed => Some(format!(
                "table {table:?} is a durable (logged) lock table, and this Locker is \
                 Durability::Relaxed: relaxed locks need a table of their own"
            )),
            Some("u") if !relaxed => Some(format!(
                "table {table:?} is a relaxed (UNLOGGED) lock table, and this Locker is \
                 Durability::Durable: build it with durability(Durability::Relaxed), or \
                 use another table"
            )),
            _ => None,
        })
    }

    async fn lock_migrations(conn: &mut PgConnection, table: &str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await?;
        sqlx::query(MIGRATION_LOCK)
            .bind(table)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn unlock_migrations(
        conn: &mut PgConnection,
        _table: &str,
        commit: bool,
    ) -> Result<(), sqlx::Error> {
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        sqlx::raw_sql(end).execute(conn).await?;
        Ok(())
    }

    migration_io!();
}

impl ErrorCodes for Postgres {
    fn contention(err: &sqlx::Error) -> Contention {
        match db_code(err).as_deref() {
            Some("40P01") => Contention::Deadlock,
            // unique violation, serialization failure, lock not available
            Some("23505" | "40001" | "55P03") => Contention::LostRace,
            _ => Contention::Failure,
        }
    }

    fn is_conflict_rollback(err: &sqlx::Error) -> bool {
        // deadlock victim, serialization failure (REPEATABLE READ and SERIALIZABLE), and
        // the idle-in-transaction timeout that the fence check set to the lease's
        // remaining time (CHECK_FENCE): the server ended the fenced session, and the
        // transaction with it, because it sat idle until the lease could have run out
        matches!(db_code(err).as_deref(), Some("40P01" | "40001" | "25P03"))
    }

    fn is_pooler_mixup(err: &sqlx::Error) -> bool {
        // sqlx names its prepared statements per connection (sqlx_s_1, ...): behind a
        // pooler that moves transactions between server connections without tracking
        // them, a name is missing (26000) or already taken (42P05) on the server
        // connection a statement lands on, or a different statement answers under it
        // (08P01, "bind message supplies N parameters, but prepared statement requires M").
        match err {
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("26000" | "42P05") => db.message().contains("sqlx_s_"),
                Some("08P01") => db.message().starts_with("bind message supplies"),
                _ => false,
            },
            _ => false,
        }
    }

    fn is_missing_table(err: &sqlx::Error) -> bool {
        // undefined_table (also for a qualified table whose schema does not exist)
        db_code(err).as_deref() == Some("42P01")
    }

    fn missing_column(err: &sqlx::Error) -> Option<String> {
        // undefined_column: `column "expire_time" does not exist`, `column t.expire_time
        // does not exist`, `column "waiters" of relation "t" does not exist`
        let sqlx::Error::Database(db) = err else {
            return None;
        };
        if db.code().as_deref() != Some("42703") {
            return None;
        }
        let message = db.message();
        quoted_after(message, "column ", '"', '"').or_else(|| {
            let name = message.strip_prefix("column ")?.split(' ').next()?;
            Some(name.rsplit('.').next().unwrap_or(name).to_owned())
        })
    }

    fn is_row_locked(err: &sqlx::Error) -> bool {
        // lock_not_available: NOWAIT, or lock_timeout ran out
        db_code(err).as_deref() == Some("55P03")
    }
}

/// The channel the releases of `table` are announced on (see `RELEASE`).
fn channel(table: &str) -> String {
    format!("dblock:{table}")
}

/// A setting the listener puts in its startup packet, with a value of its own. A
/// connection that reads it back is a session of its own; PgBouncer refuses the
/// connection or drops the setting (it forwards only the settings it tracks), and a
/// transaction pooler would hand our `LISTEN` to whichever client uses that server
/// connection next, so behind one the listener is not opened and waiters poll.
const SESSION_MARK: &str = "dblock.listener_session";
const READ_SESSION_MARK: &str = "SELECT current_setting('dblock.listener_session', true)";

/// The listener's server-side TCP bounds (milliseconds, seconds, seconds, probes): a dead
/// client is dropped after about 30 s, whether it is silent or has data unacknowledged.
const LISTENER_TCP_USER_TIMEOUT: &str = "30000";
const LISTENER_KEEPALIVE_IDLE: &str = "15";
const LISTENER_KEEPALIVE_INTERVAL: &str = "5";
const LISTENER_KEEPALIVE_COUNT: &str = "3";

async fn open_listener(
    listener: ListenerOptions<Postgres>,
    table: &str,
) -> Result<Option<Box<dyn Releases>>, sqlx::Error> {
    let mark = uuid::Uuid::new_v4().simple().to_string();
    let mut options = listener.options;
    if !listener.given {
        // The server drops the listener's session when its client stops acknowledging
        // (`tcp_user_timeout`) or answering keepalives: a black-holed listener does not
        // keep a backend for hours. Startup options, so that PgListener's own reconnects
        // keep them; a server or pooler that refuses them gets no listener (see below).
        options = options.application_name("dblock-listener").options([
            (SESSION_MARK, mark.as_str()),
            ("tcp_user_timeout", LISTENER_TCP_USER_TIMEOUT),
            ("tcp_keepalives_idle", LISTENER_KEEPALIVE_IDLE),
            ("tcp_keepalives_interval", LISTENER_KEEPALIVE_INTERVAL),
            ("tcp_keepalives_count", LISTENER_KEEPALIVE_COUNT),
        ]);
    }
    // A pool of one, only for PgListener's reconnections: it is not the caller's pool,
    // so the listener never takes one of its connections.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_lazy_with(options);
    let mut pg = match PgListener::connect_with(&pool).await {
        Ok(pg) => pg,
        Err(err) if !listener.given && refuses_startup_setting(&err) => {
            tracing::info!(error = %err, "the server refused the listener's session mark (a pooler?): waiters poll");
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    pg.ignore_pool_close_event(true);
    if !listener.given {
        // A simple query: no prepared statement is left on a connection that may be a
        // pooler's, shared with other clients.
        let row = sqlx::raw_sql(READ_SESSION_MARK).fetch_one(&mut pg).await?;
        let seen: Option<String> = sqlx::Row::try_get(&row, 0)?;
        if seen.as_deref() != Some(mark.as_str()) {
            tracing::info!(
                "the listener's connection is not a session of its own (a transaction pooler?): \
                 waiters poll; give the listener a direct address (LockerBuilder::listener_options)"
            );
            return Ok(None);
        }
    }
    pg.listen(&channel(table)).await?;
    Ok(Some(Box::new(PgReleases(pg))))
}

/// The server (or a pooler) refused the connection with an error of its own rather than
/// being unreachable: PgBouncer answers a startup setting it does not track with
/// `unsupported startup parameter` (before 1.20) or `unsupported options startup
/// parameter` (1.20 and later). Either way the pool's address is no place for LISTEN.
fn refuses_startup_setting(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(_))
}

struct PgReleases(PgListener);

impl Releases for PgReleases {
    fn next(
        &mut self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<Released>, sqlx::Error>> + Send + '_>,
    > {
        Box::pin(async move {
            loop {
                let Some(heard) = self.0.try_recv().await? else {
                    return Ok(None);
                };
                // `token:key`, as RELEASE and REAP send it; anything else on the channel
                // is not ours to read.
                let parsed = heard.payload().split_once(':').and_then(|(token, key)| {
                    let fencing_token = token.parse().ok()?;
                    Some(Released {
                        key: key.to_owned(),
                        fencing_token,
                    })
                });
                if let Some(released) = parsed {
                    return Ok(Some(released));
                }
            }
        })
    }

    fn check(
        &mut self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), sqlx::Error>> + Send + '_>>
    {
        // A simple query (no prepared statement: the listener may be behind a pooler);
        // notifications that arrive meanwhile are kept for `next`.
        Box::pin(async move {
            sqlx::raw_sql("SELECT 1")
                .execute(&mut self.0)
                .await
                .map(drop)
        })
    }
}

impl TxSql for Postgres {
    fn bind_mark(index: usize) -> String {
        format!("${index}")
    }

    fn row_lock_sql(select: &str, mode: RowWait) -> String {
        format!("{select}{}", super::for_update(mode))
    }

    async fn lock_rows<K: SqlValue<Self>>(
        conn: &mut PgConnection,
        sql: &str,
        keys: &[K],
        mode: RowWait,
    ) -> Result<Vec<K>, sqlx::Error> {
        let RowWait::Timeout(timeout) = mode else {
            return Self::fetch_keys(conn, sql, keys).await;
        };
        // Transaction-local, and put back right after: the timeout is for taking these
        // row locks, not for whatever the caller runs next in the same transaction.
        let millis = timeout.as_millis().max(1);
        let (previous, _): (String, String) = sqlx::query_as(SET_LOCK_TIMEOUT)
            .bind(format!("{millis}ms"))
            .fetch_one(&mut *conn)
            .await?;
        let locked = Self::fetch_keys(conn, sql, keys).await?;
        sqlx::query(RESTORE_LOCK_TIMEOUT)
            .bind(previous)
            .execute(&mut *conn)
            .await?;
        Ok(locked)
    }

    super::portable_ops!();
}

// Returns the old value, read before the new one is set: OFFSET 0 keeps the subquery from
// being merged into the outer query, so its row exists before the outer list is computed.
const SET_LOCK_TIMEOUT: &str = "\
SELECT saved.previous, set_config('lock_timeout', $1, true)
  FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS saved";
const RESTORE_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

// FOR SHARE, not FOR KEY SHARE: a takeover or renewal updates non-key columns, which
// FOR KEY SHARE would let through. A takeover that raced us is waited for and re-checked
// (READ COMMITTED re-evaluates the WHERE on the new row version).
//
// The row stays locked until the caller's transaction ends; if its connection goes
// half-open, until the server notices (about two hours on default settings), and for all
// that time neither renewal nor any rival can have the row. So the check also bounds the
// transaction's idle time (`idle_in_transaction_session_timeout`, for this transaction
// only) by what the lease has left: the server then ends a session that stays idle in the
// transaction that long, and the row is free. Past that moment the lease has run out by
// the database clock (renewal skips a locked row, so it cannot move it), and the guard
// says lost. A shorter timeout of the caller's own is kept. Set in the outer query, over
// the locked row: an EvalPlanQual re-check that drops the row sets nothing.
const CHECK_FENCE: &str = "\
SELECT f.fencing_token,
       set_config('idle_in_transaction_session_timeout',
                  (CASE WHEN b.was > 0 AND b.was < b.left_ms THEN b.was ELSE b.left_ms END)::text,
                  true)
  FROM (SELECT fencing_token, expire_time FROM {table}
         WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3
           AND expire_time > clock_timestamp()
           FOR SHARE) AS f,
       LATERAL (SELECT GREATEST(1, ceil(EXTRACT(EPOCH FROM f.expire_time - clock_timestamp()) * 1000))::bigint AS left_ms,
                       (EXTRACT(EPOCH FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint AS was) AS b";

// CHECK_FENCE for several rows (a MultiGuard's): each row locked as there, and the idle
// bound set to what is left of the lease that ends first. Row locks cannot be taken where
// a window is computed, hence the nesting.
const CHECK_FENCES: &str = "\
SELECT f.fencing_token,
       set_config('idle_in_transaction_session_timeout',
                  (CASE WHEN b.was > 0 AND b.was < b.left_ms THEN b.was ELSE b.left_ms END)::text,
                  true)
  FROM (SELECT held.fencing_token, min(held.expire_time) OVER () AS first_end
          FROM (SELECT t.fencing_token, t.expire_time
                  FROM {table} AS t
                  JOIN unnest($1::text[], $2::text[], $3::bigint[]) AS w(k, o, tok)
                    ON t.lock_key = w.k AND t.lock_value = w.o AND t.fencing_token = w.tok
                 WHERE t.expire_time > clock_timestamp()
                 ORDER BY t.lock_key
                   FOR SHARE OF t) AS held) AS f,
       LATERAL (SELECT GREATEST(1, ceil(EXTRACT(EPOCH FROM f.first_end - clock_timestamp()) * 1000))::bigint AS left_ms,
                       (EXTRACT(EPOCH FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint AS was) AS b";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waiting_renewal_is_the_renewal_with_a_bounded_wait() {
        let waiting = renew_waiting();
        assert!(!waiting.contains("SKIP LOCKED"), "{waiting}");
        assert!(waiting.contains("statement_timestamp() + $5"), "{waiting}");
        let bound = waiting.find("'lock_timeout'").expect("the bound is set");
        let lock = waiting
            .find("FOR NO KEY UPDATE")
            .expect("the rows are locked");
        assert!(bound < lock, "{waiting}");
    }

    #[test]
    fn the_relaxed_acquisition_checks_the_epoch_before_the_draw() {
        let relaxed = relaxed_acquire();
        let check = relaxed.find("_new_epoch()").expect("the epoch check is in");
        let draw = relaxed.find("nextval(").expect("the token draw");
        assert!(check < draw, "{relaxed}");
        assert_eq!(relaxed.replacen(EPOCH_CHECK, "", 1), ACQUIRE);
    }
}
