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
macro_rules! scripts_and_history {
    () => {
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
pub(crate) fn db_code(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Whether the server reported a duplicate key.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}
