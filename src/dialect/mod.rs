//! The one place that knows how each database spells the lock operations.
//!
//! [`Backend`] is implemented for `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite`, one
//! file each. Every SQL statement of a database and the way its result is read lives in
//! that database's file; the algorithm (validation, retries, guards, renewal) is written
//! once, in terms of these operations, in the rest of the crate.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// The parts of a dialect that are the same code for every database, spelled out for
/// each concrete sqlx type (sqlx's executor bounds do not lend themselves to generics).
/// The SQL stays in the dialect: `sql.reap` and the module's own `CHECK_FENCE`.
macro_rules! scripts_and_history {
    () => {
        fn reap_batch(
            pool: &sqlx::Pool<Self>,
            sql: &Self::Statements,
            batch: i64,
        ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>> + Send {
            let reap = sqlx::query(super::audited(&sql.reap)).bind(batch);
            async move { Ok(reap.execute(pool).await?.rows_affected()) }
        }

        async fn check_fence(
            conn: &mut <Self as sqlx::Database>::Connection,
            table: &str,
            key: &str,
            owner: &str,
            fencing_token: i64,
        ) -> Result<bool, sqlx::Error> {
            let found: Option<i64> =
                sqlx::query_scalar(super::audited(&super::sql(CHECK_FENCE, table)))
                    .bind(key)
                    .bind(owner)
                    .bind(fencing_token)
                    .fetch_optional(conn)
                    .await?;
            Ok(found.is_some())
        }

        fn run_script<'a>(
            conn: &'a mut sqlx::pool::PoolConnection<Self>,
            script: &'a str,
        ) -> impl std::future::Future<Output = Result<(), sqlx::Error>> + Send + 'a {
            async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(script.to_owned()))
                    .execute(&mut **conn)
                    .await
                    .map(|_| ())
            }
        }

        fn history<'a>(
            conn: &'a mut sqlx::pool::PoolConnection<Self>,
            query: &'a str,
        ) -> impl std::future::Future<
            Output = Result<Vec<(i64, String, String, String)>, sqlx::Error>,
        > + Send
        + 'a {
            async move {
                let rows: Vec<(i32, String, String, String)> =
                    sqlx::query_as(sqlx::AssertSqlSafe(query.to_owned()))
                        .fetch_all(&mut **conn)
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

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

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

/// How an error seen while acquiring is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// Another session got in the way (duplicate key, deadlock, lock wait, busy):
    /// the lock was not acquired, try again later.
    LostRace,
    /// Anything else: report it.
    Failure,
}

/// One of the three supported databases. Sealed: implemented by dblock for
/// `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite` only.
///
/// Its items are dblock's internals (the dialect): SQL text and how results are read.
pub trait Backend: Database + sealed::Sealed {
    /// Every statement of this dialect, with the table name spliced in once.
    #[doc(hidden)]
    type Statements: Send + Sync + 'static;

    /// The migration files as `(refinery file name, SQL template with `{table}`)`.
    #[doc(hidden)]
    const MIGRATIONS: &'static [(&'static str, &'static str)];

    /// Builds the statements for a validated table name.
    #[doc(hidden)]
    fn statements(table: &str) -> Self::Statements;

    /// One attempt: insert the row, or take over an expired one, in one atomic step.
    /// `Ok(None)` when a live lease of another owner is in the way.
    #[doc(hidden)]
    fn try_acquire(
        pool: &Pool<Self>,
        sql: &Self::Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
    ) -> impl Future<Output = Result<Option<Acquired>, sqlx::Error>> + Send;

    /// Owner- and token-checked delete; `true` when our row was deleted.
    #[doc(hidden)]
    fn release(
        pool: &Pool<Self>,
        sql: &Self::Statements,
        lock: LockId<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Owner- and token-checked extension of a live lease (never an upsert: it cannot take
    /// a lock back); the new expiry, or `None` when the row is no longer ours or expired.
    #[doc(hidden)]
    fn extend(
        pool: &Pool<Self>,
        sql: &Self::Statements,
        lock: LockId<'_>,
        lease_micros: i64,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, sqlx::Error>> + Send;

    /// Who holds `key` now, by the database clock: `(owner, fencing token, expired?)`.
    #[doc(hidden)]
    fn inspect(
        pool: &Pool<Self>,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<Option<(String, i64, bool)>, sqlx::Error>> + Send;

    /// Deletes at most `batch` expired rows; how many went.
    #[doc(hidden)]
    fn reap_batch(
        pool: &Pool<Self>,
        sql: &Self::Statements,
        batch: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Reads an acquisition error: lost race or real failure.
    #[doc(hidden)]
    fn contention(err: &sqlx::Error) -> Contention;

    /// Serializes migration runs across processes, on this connection.
    #[doc(hidden)]
    fn lock_migrations(
        conn: &mut PoolConnection<Self>,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Ends what [`Backend::lock_migrations`] started; `commit` is false after a failure.
    #[doc(hidden)]
    fn unlock_migrations(
        conn: &mut PoolConnection<Self>,
        table: &str,
        commit: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Runs a multi-statement script as one simple query.
    #[doc(hidden)]
    fn run_script<'a>(
        conn: &'a mut PoolConnection<Self>,
        script: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Reads refinery's history rows: `(version, name, applied_on, checksum)`.
    #[doc(hidden)]
    fn history<'a>(
        conn: &'a mut PoolConnection<Self>,
        query: &'a str,
    ) -> impl Future<Output = Result<Vec<(i64, String, String, String)>, sqlx::Error>> + Send + 'a;

    // Row locks, optimistic updates and fencing (row_lock.rs, optimistic.rs, fencing.rs).

    /// The bind mark of the `index`-th parameter, counting from 1: `$1` or `?`.
    #[doc(hidden)]
    fn bind_mark(index: usize) -> String;

    /// Turns the portable `SELECT .. ORDER BY key` into this database's row-locking query.
    #[doc(hidden)]
    fn row_lock_sql(select: &str, mode: RowLockMode) -> String;

    /// Opens the transaction a row lock runs in. SQLite overrides it: `BEGIN IMMEDIATE`.
    #[doc(hidden)]
    fn begin_row_lock(
        conn: &mut PoolConnection<Self>,
        _mode: RowLockMode,
    ) -> impl Future<Output = Result<Transaction<'_, Self>, sqlx::Error>> + Send {
        sqlx::Connection::begin(&mut **conn)
    }

    /// Runs the row-locking query of [`Backend::row_lock_sql`] inside the transaction,
    /// applying the mode's timeout where the query itself cannot carry it. By default the
    /// query carries it (MySQL's hints, SQLite's busy timeout): PostgreSQL overrides this.
    #[doc(hidden)]
    fn lock_rows<K: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &str,
        keys: &[K],
        _mode: RowLockMode,
    ) -> impl Future<Output = Result<Vec<K>, sqlx::Error>> + Send {
        Self::fetch_keys(conn, sql, keys)
    }

    /// Whether the error means "a row (or SQLite's database) is locked by someone else".
    #[doc(hidden)]
    fn is_row_locked(err: &sqlx::Error) -> bool;

    /// Runs a portable key query; binds the keys in order. See `portable_ops!`.
    #[doc(hidden)]
    fn fetch_keys<K: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &str,
        keys: &[K],
    ) -> impl Future<Output = Result<Vec<K>, sqlx::Error>> + Send;

    /// Reads `(value, version)` of the row `key`. See `portable_ops!`.
    #[doc(hidden)]
    fn read_versioned<K: SqlValue<Self>, V: SqlValue<Self>>(
        pool: &Pool<Self>,
        sql: &Sql,
        key: &K,
    ) -> impl Future<Output = Result<Option<(V, i64)>, sqlx::Error>> + Send;

    /// Writes `value` to the row `key` if its version is still `version`; `true` if it did.
    #[doc(hidden)]
    fn write_versioned<K: SqlValue<Self>, V: SqlValue<Self>>(
        pool: &Pool<Self>,
        sql: &Sql,
        value: &V,
        key: &K,
        version: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Inside the caller's transaction: `true` if `(key, owner, token)` holds an unexpired
    /// lease by the database clock, after locking that row against takeover, release and
    /// renewal until the transaction ends.
    #[doc(hidden)]
    fn check_fence(
        conn: &mut Self::Connection,
        table: &str,
        key: &str,
        owner: &str,
        fencing_token: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

mod sealed {
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

// Row locks, optimistic updates and fencing: the statements shared by every dialect.
mod portable;
use crate::row_lock::RowLockMode;
pub use portable::SqlValue;
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_imports)
)] // SQLite has no FOR UPDATE
pub(crate) use portable::{for_update, portable_ops, read_versioned, select_keys, write_versioned};
use sqlx::Transaction;
