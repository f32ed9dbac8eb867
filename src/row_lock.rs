//! [`RowLocker`]: pessimistic locking of the caller's own rows (`SELECT .. FOR UPDATE`),
//! with the caller's work run inside the same transaction.

use std::time::Duration;

use sqlx::{Pool, Transaction};

use crate::config::{MAX_WAIT, validate_range};
use crate::dialect::{Backend, RowWait, SqlValue, select_keys};
use crate::error::{Error, Result};
use crate::ident::Ident;

/// What [`RowLocker::lock`] does about rows another transaction has locked.
///
/// SQLite has no row locks: there every mode takes the database's write lock with
/// `BEGIN IMMEDIATE`, and "locked by someone else" means "another connection is writing".
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use dblock::RowLockMode;
///
/// // Give up after 2 s instead of waiting as long as the server lets a lock wait.
/// let mode = RowLockMode::Timeout(Duration::from_secs(2));
/// assert_ne!(mode, RowLockMode::default()); // the default is `Wait`
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RowLockMode {
    /// Wait until the rows are free (`FOR UPDATE`). The server's own limit still applies:
    /// MySQL's `innodb_lock_wait_timeout` (50 s by default), PostgreSQL's `lock_timeout`
    /// (none by default), SQLite's busy timeout (5 s in sqlx); past it,
    /// [`Error::RowLocked`].
    #[default]
    Wait,
    /// Fail at once with [`Error::RowLocked`] if any row is locked (`FOR UPDATE NOWAIT`).
    NoWait,
    /// Lock the rows that are free and leave out the others (`FOR UPDATE SKIP LOCKED`):
    /// the closure gets only the keys it locked. On SQLite nothing can be skipped (the
    /// lock is the whole database), so a busy database is [`Error::RowLocked`] at once.
    SkipLocked,
    /// Wait at most this long, then [`Error::RowLocked`]. PostgreSQL counts milliseconds
    /// (`lock_timeout`, for the locking statement only); MySQL and MariaDB count whole
    /// seconds, so it is rounded up (`innodb_lock_wait_timeout` per statement); SQLite
    /// uses it as the busy timeout of `BEGIN IMMEDIATE`. Between 1 ms and
    /// [`MAX_WAIT`](crate::MAX_WAIT).
    Timeout(Duration),
}

impl From<RowLockMode> for RowWait {
    fn from(mode: RowLockMode) -> Self {
        match mode {
            RowLockMode::Wait => RowWait::Wait,
            RowLockMode::NoWait => RowWait::NoWait,
            RowLockMode::SkipLocked => RowWait::SkipLocked,
            RowLockMode::Timeout(timeout) => RowWait::Timeout(timeout),
        }
    }
}

/// Most keys one [`RowLocker::lock`] call takes: every key is one bind parameter, and
/// a lock on thousands of rows is better taken in batches.
pub const MAX_ROW_LOCK_KEYS: usize = 1000;

/// Locks rows of one of the caller's tables by key and runs the caller's work in the
/// same transaction: commit when the work returns `Ok`, roll back when it returns `Err`
/// or is dropped. Cheap to clone.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dblock::Result<()> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # sqlx::query("CREATE TABLE product (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)")
/// #     .execute(&pool)
/// #     .await?;
/// # sqlx::query("INSERT INTO product (id, stock) VALUES (42, 1)").execute(&pool).await?;
/// use dblock::{RowLockMode, RowLocker};
///
/// let products = RowLocker::new(pool, "product", "id")?;
/// let sold = products
///     .lock(&[42_i64], RowLockMode::Wait, async |tx, locked| {
///         // `locked` holds the keys of the rows that exist and are now ours.
///         // SQLite's bind mark; `$1` on PostgreSQL, `?` on MySQL.
///         let sql = "UPDATE product SET stock = stock - 1 WHERE id = ?1 AND stock > 0";
///         let done = sqlx::query(sql).bind(42_i64).execute(&mut **tx).await?;
///         Ok::<_, dblock::Error>(!locked.is_empty() && done.rows_affected() == 1)
///     })
///     .await?; // committed: the work returned Ok
/// assert!(sold);
/// # Ok(()) }
/// ```
pub struct RowLocker<DB: Backend> {
    pool: Pool<DB>,
    table: Ident,
    key_column: Ident,
}

impl<DB: Backend> Clone for RowLocker<DB> {
    fn clone(&self) -> Self {
        RowLocker {
            pool: self.pool.clone(),
            table: self.table.clone(),
            key_column: self.key_column.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for RowLocker<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowLocker")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.table.as_str())
            .field("key_column", &self.key_column.as_str())
            .finish()
    }
}

impl<DB: Backend> RowLocker<DB> {
    /// Rows of `table`, found by `key_column` (normally the primary key). Both names must
    /// be plain identifiers, as for the lock table ([`Error::InvalidTableName`]
    /// otherwise); nothing touches the database.
    pub fn new(pool: Pool<DB>, table: &str, key_column: &str) -> Result<Self> {
        Ok(RowLocker {
            pool,
            table: Ident::new(table)?,
            key_column: Ident::new(key_column)?,
        })
    }

    /// Begins a transaction, locks the rows whose key is in `keys` (in key order, so
    /// that callers locking overlapping sets cannot deadlock each other), and runs `work`
    /// with the transaction and the keys it locked: keys without a row, and with
    /// [`RowLockMode::SkipLocked`] rows held by others, are left out. Commits if `work`
    /// returns `Ok`, rolls back if it returns `Err`, and returns what `work` returned.
    ///
    /// Run every statement of the work on `tx` (`&mut **tx` is the connection): the
    /// locks are held until it ends. On MySQL/MariaDB the transaction's snapshot is taken
    /// at its first plain read, which comes after the locks, so plain reads see the
    /// latest committed rows. On SQLite the transaction is `BEGIN IMMEDIATE`: it holds
    /// the database's write lock, the nearest thing SQLite has to a row lock.
    ///
    /// Errors (converted into `E`): [`Error::RowLocked`] when a row is busy (see
    /// [`RowLockMode`]); [`Error::InvalidDuration`] for a timeout out of range and
    /// [`Error::InvalidConfig`] for more than [`MAX_ROW_LOCK_KEYS`] keys, before anything
    /// is sent; [`Error::Database`] otherwise, including a failed commit.
    ///
    /// # Cancel safety
    /// Dropping the future rolls the transaction back (sqlx runs the `ROLLBACK` before
    /// the connection is used again) and releases every row lock; nothing the work wrote
    /// is committed, unless the drop comes while the `COMMIT` itself is in flight, when
    /// the outcome is unknown, as for any commit. On SQLite, a mode other than
    /// [`RowLockMode::Wait`] changes the connection's busy timeout, so that connection is
    /// closed afterwards instead of going back to the pool, dropped or not.
    pub async fn lock<K, T, E>(
        &self,
        keys: &[K],
        mode: RowLockMode,
        work: impl AsyncFnOnce(&mut Transaction<'_, DB>, Vec<K>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        K: SqlValue<DB>,
        E: From<Error>,
    {
        if let RowLockMode::Timeout(timeout) = mode {
            validate_range(
                "row lock timeout",
                timeout,
                Duration::from_millis(1),
                MAX_WAIT,
            )?;
        }
        if keys.len() > MAX_ROW_LOCK_KEYS {
            return Err(Error::InvalidConfig(format!(
                "{} keys given to lock at once; at most {MAX_ROW_LOCK_KEYS}",
                keys.len()
            ))
            .into());
        }
        let mut conn = self.pool.acquire().await.map_err(Error::from)?;
        let wait = RowWait::from(mode);
        if DB::row_lock_changes_connection(wait) {
            conn.close_on_drop();
        }
        let mut tx = DB::begin_row_lock(&mut conn, wait)
            .await
            .map_err(row_error::<DB>)?;
        let locked = if keys.is_empty() {
            Vec::new()
        } else {
            let select = select_keys::<DB>(&self.table, &self.key_column, keys.len());
            DB::lock_rows(&mut tx, &DB::row_lock_sql(&select, wait), keys, wait)
                .await
                .map_err(row_error::<DB>)?
        };
        match work(&mut tx, locked).await {
            Ok(output) => {
                tx.commit().await.map_err(row_error::<DB>)?;
                Ok(output)
            }
            Err(err) => {
                if let Err(rollback) = tx.rollback().await {
                    // The work's error is the one to report; the failed rollback is logged.
                    tracing::warn!(table = %self.table, error = %rollback, "rollback failed");
                }
                Err(err)
            }
        }
    }
}

/// Reads a database error met while locking rows or fencing: a busy row is
/// [`Error::RowLocked`], anything else [`Error::Database`].
pub(crate) fn row_error<DB: Backend>(err: sqlx::Error) -> Error {
    if DB::is_row_locked(&err) {
        Error::RowLocked(err)
    } else {
        Error::Database(err)
    }
}
