//! The one place that knows how each database spells dblock's statements: the bottom
//! layer. Nothing here imports from the rest of the crate except the leaf modules
//! (errors, identifiers).
//!
//! Two traits, one calling convention each:
//! - [`LockSql`]: the lock table's statements (acquire, release, extend, batched renewal,
//!   inspection, reaping, migrations). Every function takes one connection and the
//!   table's prepared [`LockSql::Statements`]; only the lock-table access layer
//!   (`table.rs`) calls them.
//! - [`TxSql`]: the transaction helpers' statements (row locks, versioned updates, the
//!   fencing check). Every function takes the caller's connection (a transaction derefs
//!   to one) and the statement text.
//!
//! Each is implemented for `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite`, one file
//! each; adding a database is one more file here.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Database, Transaction};

/// The parts of a dialect that are the same code for every database, spelled out for
/// each concrete sqlx type (sqlx's executor bounds do not lend themselves to generics).
/// The SQL stays in the dialect: `sql.reap`, `sql.force_release` and the module's own
/// `CHECK_FENCE`.
macro_rules! scripts_and_history {
    () => {
        fn reap_batch(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            batch: i64,
        ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>> + Send {
            let reap = sqlx::query(super::audited(&sql.reap)).bind(batch);
            async move { Ok(reap.execute(conn).await?.rows_affected()) }
        }

        fn force_release(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
        ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send {
            // PostgreSQL's RETURNING (its notification) is evaluated all the same.
            let delete = sqlx::query(super::audited(&sql.force_release)).bind(key.to_owned());
            async move { Ok(delete.execute(conn).await?.rows_affected() > 0) }
        }

        fn check_shape<'a>(
            conn: &'a mut <Self as sqlx::Database>::Connection,
            table: &'a str,
        ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'a {
            let tables = [
                format!("SELECT {} FROM {table} WHERE 1 = 0", Self::COLUMNS),
                format!("SELECT ticket, lock_key, expire_time FROM {table}_ticket WHERE 1 = 0"),
            ];
            async move {
                for select in tables {
                    sqlx::query(sqlx::AssertSqlSafe(select)).execute(&mut *conn).await?;
                }
                Ok(())
            }
        }

        fn run_script<'a>(
            conn: &'a mut <Self as sqlx::Database>::Connection,
            script: &'a str,
        ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'a {
            async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(script.to_owned()))
                    .execute(conn)
                    .await
                    .map(|_| ())
            }
        }

        fn history<'a>(
            conn: &'a mut <Self as sqlx::Database>::Connection,
            query: &'a str,
        ) -> impl std::future::Future<
            Output = Result<Vec<(i64, String, String, String)>, sqlx::Error>,
        > + Send
        + 'a {
            async move {
                let rows: Vec<(i32, String, String, String)> =
                    sqlx::query_as(sqlx::AssertSqlSafe(query.to_owned()))
                        .fetch_all(conn)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map(|(version, name, applied_on, checksum)| {
                        (i64::from(version), name, applied_on, checksum)
                    })
                    .collect())
            }
        }
    };
}

/// The waiting and fair-mode statements whose reading is the same for every database
/// (one bound key or list of tickets, one scalar or row count back); their SQL stays in
/// each dialect's `Statements`, and a list of tickets is bound as the dialect's own
/// `ticket_list` spells it (an array, or one JSON document).
macro_rules! waiters_and_tickets {
    () => {
        fn note_waiter(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
        ) -> impl std::future::Future<Output = Result<Option<i64>, sqlx::Error>> + Send {
            let query = sqlx::query_scalar(super::audited(&sql.note_waiter)).bind(key.to_owned());
            async move { query.fetch_optional(conn).await }
        }

        fn earlier_ticket(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
            ticket: i64,
        ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send {
            let query = sqlx::query_scalar(super::audited(&sql.earlier_ticket))
                .bind(key.to_owned())
                .bind(ticket);
            async move { query.fetch_one(conn).await }
        }

        fn drop_tickets(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            tickets: &[i64],
        ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send {
            let query = sqlx::query(super::audited(&sql.drop_tickets)).bind(ticket_list(tickets));
            async move { query.execute(conn).await.map(drop) }
        }

        fn purge_tickets(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
        ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>> + Send {
            let query = sqlx::query(super::audited(&sql.purge_tickets));
            async move { Ok(query.execute(conn).await?.rows_affected()) }
        }
    };
}

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

mod portable;
pub use portable::SqlValue;
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_imports)
)] // SQLite has no FOR UPDATE
pub(crate) use portable::{for_update, portable_ops, read_versioned, select_keys, write_versioned};

/// A gate in front of a database that lets one writer in at a time and makes the others
/// poll for it (SQLite's busy handler sleeps and retries; it keeps no queue). dblock's
/// statements pass it shared; the lease engine's pass it exclusively, which tokio's
/// `RwLock` grants ahead of every statement that arrives after the engine asked. So the
/// engine's renewal waits for at most the statements already running in this process,
/// never for an endless stream of this process's own acquisitions. One gate per database
/// file and process, shared by every Locker on it.
pub(crate) type WriteGate = std::sync::Arc<tokio::sync::RwLock<()>>;

/// What the database answered to a successful acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The fencing token written with the row.
    pub fencing_token: i64,
    /// The expiry the database computed from its own clock.
    pub expires_at: DateTime<Utc>,
}

/// The row a guard holds: key, owner value and the fencing token it was written with.
/// Checking the token too means a stale guard of a reused owner value (reentrant
/// [`Owner`](crate::Owner)) can never touch a newer acquisition.
#[derive(Debug, Clone, Copy)]
pub struct LockId<'a> {
    /// The lock key.
    pub key: &'a str,
    /// The owner value.
    pub owner: &'a str,
    /// The fencing token of this acquisition.
    pub fencing_token: i64,
}

/// One lease to renew in a batch: its row and the lease length to set.
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    /// The row, owner- and token-checked.
    pub id: LockId<'a>,
    /// The new lease, counted from the database's clock when the statement runs.
    pub lease_micros: i64,
}

/// A lock-table row as a batched renewal or an inspection saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// The key.
    pub key: String,
    /// The owner value in the row.
    pub owner: String,
    /// The fencing token in the row.
    pub fencing_token: i64,
    /// The row's expiry (the new one, when `renewed`).
    pub expires_at: DateTime<Utc>,
    /// Whether this statement renewed the row (it was the requested owner's and token's,
    /// and unexpired by the database clock).
    pub renewed: bool,
}

/// A row a batched release deleted ([`LockSql::release_batch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedRow {
    /// The key, free now.
    pub key: String,
    /// The row's fencing token.
    pub fencing_token: i64,
    /// Whether its lease had already run out by the database clock.
    pub expired: bool,
}

/// Who holds one key, as [`LockSql::inspect`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspected {
    /// The owner value.
    pub owner: String,
    /// The fencing token.
    pub fencing_token: i64,
    /// When the row was written by its acquisition, by the database clock.
    pub acquired_at: DateTime<Utc>,
    /// The lease's end by the database clock.
    pub expires_at: DateTime<Utc>,
    /// Whether that end has passed, by the database clock.
    pub expired: bool,
}

/// Which rows [`LockSql::list`] reads: keys from `from` (inclusive) up to `until`
/// (exclusive; `None`: no end), compared as bytes, in that order, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct ListQuery<'a> {
    /// The smallest key listed.
    pub from: &'a str,
    /// The first key past the range.
    pub until: Option<&'a str>,
    /// Only rows acquired at least this many microseconds ago (database clock).
    pub held_micros: Option<i64>,
    /// `Some(true)`: only rows whose lease has run out (database clock); `Some(false)`:
    /// only live ones; `None`: both.
    pub expired: Option<bool>,
    /// Most rows returned.
    pub limit: i64,
}

/// One row as [`LockSql::list`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The key.
    pub key: String,
    /// The row as [`LockSql::inspect`] would read it.
    pub row: Inspected,
    /// The database clock when the rows were read.
    pub read_at: DateTime<Utc>,
}

/// `(key, owner, fencing token, acquired at, expiry, expired, read at)`, the column order
/// of every dialect's list query.
pub(crate) type ListedRow = (
    String,
    String,
    i64,
    DateTime<Utc>,
    DateTime<Utc>,
    bool,
    DateTime<Utc>,
);

impl From<ListedRow> for Listed {
    fn from(
        (key, owner, fencing_token, acquired_at, expires_at, expired, read_at): ListedRow,
    ) -> Self {
        Listed {
            key,
            row: Inspected {
                owner,
                fencing_token,
                acquired_at,
                expires_at,
                expired,
            },
            read_at,
        }
    }
}

/// `(key, owner, fencing token, expiry, renewed)`, the column order of the dialects'
/// renewal answers.
impl From<(String, String, i64, DateTime<Utc>, bool)> for RowState {
    fn from(
        (key, owner, fencing_token, expires_at, renewed): (
            String,
            String,
            i64,
            DateTime<Utc>,
            bool,
        ),
    ) -> Self {
        RowState {
            key,
            owner,
            fencing_token,
            expires_at,
            renewed,
        }
    }
}

/// `(key, owner, fencing token, expiry)`, the column order of a renewal's answer and of
/// its read-back where a dialect renews in one statement and reads back the rest.
pub(crate) type RenewedRow = (String, String, i64, DateTime<Utc>);

/// Rows a renewal's statement returned, as [`RowState`]s: `renewed` says whether that
/// statement renewed them (the UPDATE's own rows) or only read them (the read-back).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn row_states(rows: Vec<RenewedRow>, renewed: bool) -> impl Iterator<Item = RowState> {
    rows.into_iter()
        .map(move |(key, owner, token, expires_at)| {
            RowState::from((key, owner, token, expires_at, renewed))
        })
}

/// The keys of `batch` that the renewed `rows` leave out: the ones to read back, to say
/// why they were not renewed.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn unrenewed<'a>(batch: &[Renewal<'a>], rows: &[RowState]) -> Vec<&'a str> {
    let renewed: std::collections::HashSet<&str> =
        rows.iter().map(|row| row.key.as_str()).collect();
    batch
        .iter()
        .map(|r| r.id.key)
        .filter(|key| !renewed.contains(key))
        .collect()
}

/// A list of numbers as one JSON array, for the databases that take a list as one JSON
/// parameter.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn json_list(numbers: &[i64]) -> String {
    serde_json::Value::from(numbers.to_vec()).to_string()
}

/// `(owner, fencing token, acquired at, expiry, expired)`, the column order of every
/// dialect's inspection query.
pub(crate) type InspectedRow = (String, i64, DateTime<Utc>, DateTime<Utc>, bool);

impl From<InspectedRow> for Inspected {
    fn from((owner, fencing_token, acquired_at, expires_at, expired): InspectedRow) -> Self {
        Inspected {
            owner,
            fencing_token,
            acquired_at,
            expires_at,
            expired,
        }
    }
}

/// Where a release listener connects.
pub struct ListenerOptions<DB: Database> {
    /// The connect options.
    pub options: <DB::Connection as sqlx::Connection>::Options,
    /// Whether the caller named this address for the listener (trusted to be a session
    /// of its own), rather than dblock taking the pool's, which may lead to a pooler.
    pub given: bool,
}

/// A release a listener heard: the row of `key` with `fencing_token` was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The key, free now.
    pub key: String,
    /// The token of the row that went (which tells a Locker's own releases apart).
    pub fencing_token: i64,
}

/// The releases a listener hears, one at a time.
pub trait Releases: Send {
    /// The next release. `Ok(None)`: the connection was lost and has been opened again,
    /// and releases in between may have been missed. An error: the listener is broken;
    /// drop it and listen anew.
    fn next(
        &mut self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Option<Released>, sqlx::Error>> + Send + '_>>;
}

/// How an error from a lock-table statement is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// The statement was rolled back as a deadlock victim: nothing changed, and the same
    /// statement may be sent again at once.
    Deadlock,
    /// Another session got in the way (duplicate key, lock wait, busy): the lock was not
    /// acquired, try again later.
    LostRace,
    /// Anything else: report it.
    Failure,
}

/// The lock table's statements for one database. Sealed and hidden: dblock's internals.
#[doc(hidden)]
pub trait LockSql: Database {
    /// Every lock-table statement of this dialect, with the table name spliced in once.
    type Statements: Send + Sync + 'static;

    /// Whether deleting a row a waiter marked notifies a listener ([`LockSql::listen`]).
    const NOTIFIES: bool = false;

    /// After a full reaper batch the reaper pauses this many times as long as the batch
    /// took, so that reaping a backlog takes about a fortieth of the server's time,
    /// counting work the server does for a batch after the statement returned.
    const REAP_PACE: u32 = 39;

    /// Every column of the lock table dblock reads or writes.
    const COLUMNS: &'static str = "lock_key, lock_value, expire_time, fencing_token, acquired_at";

    /// The migration files as `(refinery file name, SQL template with `{table}`)`.
    const MIGRATIONS: &'static [(&'static str, &'static str)];

    /// Builds the statements for a validated table name.
    fn statements(table: &str) -> Self::Statements;

    /// One attempt: insert the row, or take over an expired one, in one atomic step.
    /// `Ok(None)` when a live lease of another owner is in the way.
    fn acquire(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
    ) -> impl Future<Output = Result<Option<Acquired>, sqlx::Error>> + Send;

    /// Owner- and token-checked delete. `Some(expired)` when our row was deleted, saying
    /// whether its lease had already run out by the database clock; `None` when the row
    /// was not ours (any more).
    fn release(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
    ) -> impl Future<Output = Result<Option<bool>, sqlx::Error>> + Send;

    /// Owner- and token-checked delete of every row of `batch` in one statement (or one
    /// transaction), waking waiters as a release does: the rows that were ours and went,
    /// each saying whether its lease had already run out by the database clock. Rows that
    /// are not ours (any more) are left alone and not reported.
    fn release_batch(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        batch: &[LockId<'_>],
    ) -> impl Future<Output = Result<Vec<ReleasedRow>, sqlx::Error>> + Send;

    /// Owner- and token-checked extension of a live lease (never an upsert: it cannot take
    /// a lock back); the new expiry, or `None` when the row is no longer ours or expired.
    fn extend(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
        lease_micros: i64,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, sqlx::Error>> + Send;

    /// Renews every lease of `batch` that is still its owner's and unexpired, each
    /// owner- and token-checked, in one statement, and a second one only on backends that
    /// must read back why some lease was not renewed; returns the state of every row of
    /// the batch's keys that exists (a key without a row was deleted).
    fn renew(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        batch: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<RowState>, sqlx::Error>> + Send;

    /// Who holds `key` now, by the database clock.
    fn inspect(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<Option<Inspected>, sqlx::Error>> + Send;

    /// Rows of the table in key order (bytes), as `query` selects them.
    fn list(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        query: ListQuery<'_>,
    ) -> impl Future<Output = Result<Vec<Listed>, sqlx::Error>> + Send;

    /// Deletes the row of `key` whoever holds it (an operator's tool), waking waiters as
    /// a release does; whether there was one.
    fn force_release(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Instead of deleting it, lets our live row end at `acquired_at + min_hold_micros`
    /// (database clock), never later than it would have: `true` when that is still ahead,
    /// `false` when it has passed or the row is not ours (then release as usual).
    fn keep_min_hold(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
        min_hold_micros: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes at most `batch` expired rows; how many went.
    fn reap_batch(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        batch: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// A waiter is about to sleep: asks that the holder's release wake it (PostgreSQL
    /// marks the row, and deleting a marked row notifies) and reads how long the holder's
    /// lease has left by the database clock, in microseconds (0 once it has run out).
    /// `None` when the key has no row: it is free, try again at once.
    fn note_waiter(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

    /// Fair mode: takes a ticket for `key`, a lease of `lease_micros` in the ticket table;
    /// its number. Tickets of one key commit in the order of their numbers.
    fn take_ticket(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        lease_micros: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Fair mode: whether a live ticket for `key` numbered below `ticket` exists
    /// (`i64::MAX`: any live ticket).
    fn earlier_ticket(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        ticket: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Fair mode: renews the live tickets among `tickets`; the ones renewed.
    fn renew_tickets(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        tickets: &[i64],
        lease_micros: i64,
    ) -> impl Future<Output = Result<Vec<i64>, sqlx::Error>> + Send;

    /// Fair mode: deletes tickets (their waiters won or left), in one statement.
    fn drop_tickets(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        tickets: &[i64],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Fair mode: deletes every expired ticket (of waiters that died); how many.
    fn purge_tickets(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Opens a connection of its own that hears the releases of `table` (PostgreSQL
    /// `LISTEN`). `Ok(None)` when the backend has no notifications (MySQL, SQLite), or
    /// when the connection turns out not to be a session of its own (a transaction
    /// pooler in between): then waiters poll.
    fn listen(
        _options: ListenerOptions<Self>,
        _table: &str,
    ) -> impl Future<Output = Result<Option<Box<dyn Releases>>, sqlx::Error>> + Send {
        std::future::ready(Ok(None))
    }

    /// The process-wide [`WriteGate`] of the database `options` open, on backends whose
    /// writers wait for one another by polling (SQLite); `None` elsewhere.
    fn write_gate(_options: &<Self::Connection as sqlx::Connection>::Options) -> Option<WriteGate> {
        None
    }

    /// Reads an error of a lock-table statement.
    fn contention(err: &sqlx::Error) -> Contention;

    /// Whether the error says the lock table does not exist (not migrated yet).
    fn is_missing_table(err: &sqlx::Error) -> bool;

    /// The column the error says is missing, when a statement named a column the table
    /// does not have: a table of the configured name that dblock did not create.
    fn missing_column(err: &sqlx::Error) -> Option<String>;

    /// Whether the error is the mark of a connection pooler that hands one session's
    /// prepared statements to another (PgBouncer before 1.21 in transaction mode).
    fn is_pooler_mixup(_err: &sqlx::Error) -> bool {
        false
    }

    /// Asked on one of the pool's connections: a new connection, outside the pool (made
    /// from its `options`), that keeps the database alive when it lives only while a
    /// connection to it is open (in-memory SQLite); `None` elsewhere.
    fn keep_alive(
        _conn: &mut Self::Connection,
        _options: &<Self::Connection as sqlx::Connection>::Options,
    ) -> impl Future<Output = Result<Option<Self::Connection>, sqlx::Error>> + Send {
        std::future::ready(Ok(None))
    }

    /// On a [`LockSql::keep_alive`] connection, after migrating through the pool: fails
    /// with a configuration error if that connection cannot see `table`, i.e. every
    /// connection has a database of its own.
    fn check_shared(
        _conn: &mut Self::Connection,
        _table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        std::future::ready(Ok(()))
    }

    /// Serializes migration runs across processes, on this connection.
    fn lock_migrations(
        conn: &mut Self::Connection,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Ends what [`LockSql::lock_migrations`] started; `commit` is false after a failure.
    fn unlock_migrations(
        conn: &mut Self::Connection,
        table: &str,
        commit: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Fails with the database's "no such column" error if the migrated `table` (or its
    /// ticket table) lacks a column dblock uses: a table of that name that existed
    /// before, of another shape.
    fn check_shape<'a>(
        conn: &'a mut Self::Connection,
        table: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Runs a multi-statement script as one simple query.
    fn run_script<'a>(
        conn: &'a mut Self::Connection,
        script: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Reads refinery's history rows: `(version, name, applied_on, checksum)`.
    fn history<'a>(
        conn: &'a mut Self::Connection,
        query: &'a str,
    ) -> impl Future<Output = Result<Vec<(i64, String, String, String)>, sqlx::Error>> + Send + 'a;
}

/// What [`RowLocker::lock`](crate::RowLocker::lock) does about rows another transaction
/// has locked.
///
/// SQLite has no row locks: there every mode takes the database's write lock with
/// `BEGIN IMMEDIATE`, and "locked by someone else" means "another connection is writing".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RowLockMode {
    /// Wait until the rows are free (`FOR UPDATE`). The server's own limit still applies:
    /// MySQL's `innodb_lock_wait_timeout` (50 s by default), PostgreSQL's `lock_timeout`
    /// (none by default), SQLite's busy timeout (5 s in sqlx); past it,
    /// [`Error::RowLocked`](crate::Error::RowLocked).
    #[default]
    Wait,
    /// Fail at once with [`Error::RowLocked`](crate::Error::RowLocked) if any row is locked
    /// (`FOR UPDATE NOWAIT`).
    NoWait,
    /// Lock the rows that are free and leave out the others (`FOR UPDATE SKIP LOCKED`):
    /// the closure gets only the keys it locked. On SQLite nothing can be skipped (the
    /// lock is the whole database), so a busy database is
    /// [`Error::RowLocked`](crate::Error::RowLocked) at once.
    SkipLocked,
    /// Wait at most this long, then [`Error::RowLocked`](crate::Error::RowLocked).
    /// PostgreSQL counts milliseconds (`lock_timeout`, for the locking statement only);
    /// MySQL and MariaDB count whole seconds, so it is rounded up
    /// (`innodb_lock_wait_timeout` per statement); SQLite uses it as the busy timeout of
    /// `BEGIN IMMEDIATE`. Between 1 ms and [`MAX_WAIT`](crate::MAX_WAIT).
    Timeout(Duration),
}

/// The transaction helpers' statements for one database: row locks, versioned updates
/// and the fencing check. Sealed and hidden: dblock's internals.
#[doc(hidden)]
pub trait TxSql: Database {
    /// The bind mark of the `index`-th parameter, counting from 1: `$1` or `?`.
    fn bind_mark(index: usize) -> String;

    /// Turns the portable `SELECT .. ORDER BY key` into this database's row-locking query.
    fn row_lock_sql(select: &str, mode: RowLockMode) -> String;

    /// Opens the transaction a row lock runs in. SQLite overrides it: `BEGIN IMMEDIATE`.
    fn begin_row_lock(
        conn: &mut Self::Connection,
        _mode: RowLockMode,
    ) -> impl Future<Output = Result<Transaction<'_, Self>, sqlx::Error>> + Send {
        sqlx::Connection::begin(conn)
    }

    /// Runs the row-locking query of [`TxSql::row_lock_sql`] inside the transaction,
    /// applying the mode's timeout where the query itself cannot carry it. By default the
    /// query carries it (MySQL's hints, SQLite's busy timeout): PostgreSQL overrides this.
    fn lock_rows<K: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &str,
        keys: &[K],
        _mode: RowLockMode,
    ) -> impl Future<Output = Result<Vec<K>, sqlx::Error>> + Send {
        Self::fetch_keys(conn, sql, keys)
    }

    /// Whether [`TxSql::begin_row_lock`] in this mode changes the connection's settings,
    /// so that it must be closed afterwards rather than handed back to the pool.
    fn row_lock_changes_connection(_mode: RowLockMode) -> bool {
        false
    }

    /// Whether the error means "a row (or SQLite's database) is locked by someone else".
    fn is_row_locked(err: &sqlx::Error) -> bool;

    /// Runs a portable key query; binds the keys in order. See `portable_ops!`.
    fn fetch_keys<K: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &str,
        keys: &[K],
    ) -> impl Future<Output = Result<Vec<K>, sqlx::Error>> + Send;

    /// Reads `(value, version)` of the row `key`. See `portable_ops!`.
    fn read_versioned<K: SqlValue<Self>, V: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &Sql,
        key: &K,
    ) -> impl Future<Output = Result<Option<(V, i64)>, sqlx::Error>> + Send;

    /// Writes `value` to the row `key` if its version is still `version`; `true` if it did.
    fn write_versioned<K: SqlValue<Self>, V: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &Sql,
        value: &V,
        key: &K,
        version: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Inside the caller's transaction: `true` if `(key, owner, token)` holds an unexpired
    /// lease by the database clock, after locking that row against takeover, release and
    /// renewal until the transaction ends.
    fn check_fence(
        conn: &mut Self::Connection,
        table: &str,
        lock: LockId<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// One of the three supported databases: both halves of its dialect. Sealed: implemented
/// by dblock for `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite` only.
pub trait Backend: LockSql + TxSql + sealed::Sealed {}

impl<DB: LockSql + TxSql + sealed::Sealed> Backend for DB {}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Statement text built at run time from a validated identifier.
pub(crate) type Sql = std::sync::Arc<str>;

/// Splices a validated table name into a statement template.
pub(crate) fn sql(template: &str, table: &str) -> Sql {
    template.replace("{table}", table).into()
}

/// Marks dynamic SQL as audited: every identifier in it passed `validate_table_name`.
pub(crate) fn audited(sql: &Sql) -> sqlx::AssertSqlSafe<Sql> {
    sqlx::AssertSqlSafe(sql.clone())
}

/// The code of a database error, if the error came from the server.
#[cfg_attr(not(all(feature = "postgres", feature = "sqlite")), allow(dead_code))] // not every backend reads codes
pub(crate) fn db_code(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Whether the server reported a duplicate key.
#[cfg_attr(not(all(feature = "mysql", feature = "sqlite")), allow(dead_code))] // not every backend asks
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Lock ids as one JSON array of `{"k", "o", "t"}` objects (key, owner, token), for the
/// databases that take a batch as one JSON parameter.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn ids_json(batch: &[LockId<'_>]) -> String {
    let rows: Vec<serde_json::Value> = batch
        .iter()
        .map(|id| serde_json::json!({ "k": id.key, "o": id.owner, "t": id.fencing_token }))
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// The text between the first pair of `open` and `close` after `after` in `message`: the
/// name a database quoted in an error message.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn quoted_after(message: &str, after: &str, open: char, close: char) -> Option<String> {
    let rest = &message[message.find(after)? + after.len()..];
    let start = rest.find(open)? + open.len_utf8();
    let end = rest[start..].find(close)? + start;
    Some(rest[start..end].to_owned())
}

/// A batch as one JSON array of `{"k", "o", "t", "m"}` objects (key, owner, token, and
/// the lease as `lease` spells it), for the databases that take a batch as one JSON
/// parameter: no bind-parameter limit, and one statement text for any batch size.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn batch_json(
    batch: &[Renewal<'_>],
    lease: impl Fn(i64) -> serde_json::Value,
) -> String {
    let rows: Vec<serde_json::Value> = batch
        .iter()
        .map(|r| {
            serde_json::json!({
                "k": r.id.key, "o": r.id.owner, "t": r.id.fencing_token, "m": lease(r.lease_micros)
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}
