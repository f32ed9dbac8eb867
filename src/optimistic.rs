//! [`Versioned`]: optimistic updates of one value column guarded by a version column
//! (`UPDATE .. SET value = ?, version = version + 1 WHERE key = ? AND version = ?`),
//! retried with backoff when another writer got there first.

use sqlx::Pool;
use tokio::time::Instant;

use crate::config::RetryPolicy;
use crate::dialect::{Backend, Sql, SqlValue, read_versioned, write_versioned};
use crate::error::{Error, Result};
use crate::ident::Ident;
use crate::retry::Backoff;

/// How many times [`Versioned::update`] reads and tries to write before it gives up with
/// [`Error::VersionConflict`], unless the builder says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// What the caller's closure decides about the value it was shown.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # sqlx::query("CREATE TABLE product (id INTEGER PRIMARY KEY, stock BIGINT, version BIGINT)")
/// #     .execute(&pool)
/// #     .await?;
/// # sqlx::query("INSERT INTO product VALUES (42, 5, 0)").execute(&pool).await?;
/// use dblock::{Decision, Outcome, Versioned};
///
/// /// Sells ten units if there are ten; otherwise writes nothing and says why.
/// async fn sell_ten(units: i64) -> Decision<i64, &'static str> {
///     if units >= 10 { Decision::Write(units - 10) } else { Decision::Refuse("not enough stock") }
/// }
///
/// let stock = Versioned::builder(pool, "product", "stock").build()?;
/// let outcome = stock.update(&42_i64, sell_ten).await?; // 5 in stock
/// // A refusal is not an error, and not retried: it was made on the latest committed value.
/// assert_eq!(outcome, Outcome::Refused { reason: "not enough stock", attempts: 1 });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<V, R> {
    /// Write this new value, if the row is still the one that was read.
    Write(V),
    /// Write nothing and hand this back to the caller (not enough stock, say). Not an
    /// error and not retried: the decision was made on the latest committed value.
    Refuse(R),
}

/// How a [`Versioned::update`] ended, when it did not fail.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # sqlx::query("CREATE TABLE product (id INTEGER PRIMARY KEY, stock BIGINT, version BIGINT)")
/// #     .execute(&pool)
/// #     .await?;
/// # sqlx::query("INSERT INTO product VALUES (42, 5, 0)").execute(&pool).await?;
/// use dblock::{Decision, Outcome, Versioned};
///
/// async fn sell_three(units: i64) -> Decision<i64, i64> {
///     if units >= 3 { Decision::Write(units - 3) } else { Decision::Refuse(units) }
/// }
///
/// let stock = Versioned::builder(pool, "product", "stock").build()?;
/// // 5 in stock: written at the first attempt, and the version moved from 0 to 1.
/// let first = stock.update(&42_i64, sell_three).await?;
/// assert_eq!(first, Outcome::Written { value: 2, version: 1, attempts: 1 });
/// // 2 left: refused with the closure's reason; nothing is written.
/// let second = stock.update(&42_i64, sell_three).await?;
/// assert_eq!(second, Outcome::Refused { reason: 2, attempts: 1 });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<V, R> {
    /// The new value was written.
    Written {
        /// The value now in the row.
        value: V,
        /// The row's version after the write.
        version: i64,
        /// Reads and write attempts it took, 1 when nobody else wrote in between.
        attempts: u32,
    },
    /// The closure refused.
    Refused {
        /// What the closure refused with.
        reason: R,
        /// The attempt on which it refused, counting from 1.
        attempts: u32,
    },
}

/// One value column of one of the caller's tables, updated optimistically: read the value
/// and version, let the caller's closure decide, write only if the version has not moved,
/// and otherwise read again after a jittered backoff. Cheap to clone.
///
/// The table needs a key column (default `id`), the value column, and an integer version
/// column (default `version`, read as `i64`, so `BIGINT` on PostgreSQL) that every writer
/// of the value also increments. Several columns changing together need the row-lock
/// helper, [`RowLocker`](crate::RowLocker), instead.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dblock::Result<()> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// use dblock::{Decision, Outcome, Versioned};
///
/// sqlx::query("CREATE TABLE product (id INTEGER PRIMARY KEY, stock BIGINT, version BIGINT)")
///     .execute(&pool)
///     .await?;
/// sqlx::query("INSERT INTO product VALUES (42, 5, 0)").execute(&pool).await?;
///
/// let stock = Versioned::builder(pool, "product", "stock").build()?;
/// match stock
///     .update(&42_i64, async |units: i64| {
///         if units >= 3 { Decision::Write(units - 3) } else { Decision::Refuse(units) }
///     })
///     .await?
/// {
///     Outcome::Written { value, .. } => println!("sold 3, {value} left"),
///     Outcome::Refused { reason, .. } => println!("only {reason} left"),
/// }
/// # Ok(()) }
/// ```
pub struct Versioned<DB: Backend> {
    pool: Pool<DB>,
    table: Ident,
    read: Sql,
    write: Sql,
    max_attempts: u32,
    retry: RetryPolicy,
}

impl<DB: Backend> Clone for Versioned<DB> {
    fn clone(&self) -> Self {
        Versioned {
            pool: self.pool.clone(),
            table: self.table.clone(),
            read: self.read.clone(),
            write: self.write.clone(),
            max_attempts: self.max_attempts,
            retry: self.retry,
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Versioned<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Versioned")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.table.as_str())
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

/// Options for a [`Versioned`]; see each method for its default.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, qty BIGINT, rev BIGINT)")
/// #     .execute(&pool)
/// #     .await?;
/// # sqlx::query("INSERT INTO inventory VALUES ('sku-1', 0, 0)").execute(&pool).await?;
/// use dblock::{Decision, Outcome, Versioned};
///
/// let restock = Versioned::builder(pool.clone(), "inventory", "qty")
///     .key_column("sku") // default: id
///     .version_column("rev") // default: version
///     .max_attempts(3) // default: 10 (DEFAULT_MAX_ATTEMPTS)
///     .build()?; // checks the names; touches no database
/// let sku = "sku-1".to_owned();
/// let outcome = restock.update(&sku, async |qty: i64| Decision::<_, ()>::Write(qty + 10)).await?;
/// assert!(matches!(outcome, Outcome::Written { value: 10, .. }));
///
/// // Names must be plain identifiers, so they can go into SQL text unquoted.
/// let bad = Versioned::builder(pool, "inventory; --", "qty").build();
/// assert!(matches!(bad, Err(dblock::Error::InvalidTableName { .. })));
/// # Ok(()) }
/// ```
pub struct VersionedBuilder<DB: Backend> {
    pool: Pool<DB>,
    table: String,
    value_column: String,
    key_column: String,
    version_column: String,
    max_attempts: u32,
    retry: RetryPolicy,
}

impl<DB: Backend> VersionedBuilder<DB> {
    /// The column that finds the row. Default: `id`.
    pub fn key_column(mut self, name: impl Into<String>) -> Self {
        self.key_column = name.into();
        self
    }

    /// The version column. Default: `version`.
    pub fn version_column(mut self, name: impl Into<String>) -> Self {
        self.version_column = name.into();
        self
    }

    /// Reads and write attempts before [`Error::VersionConflict`]; at least 1.
    /// Default: [`DEFAULT_MAX_ATTEMPTS`].
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The sleeps between attempts. Default: [`RetryPolicy::default`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Checks every option and builds the helper. Every name must be a plain identifier,
    /// as for the lock table ([`Error::InvalidTableName`]); nothing touches the database.
    pub fn build(self) -> Result<Versioned<DB>> {
        let table = Ident::new(self.table)?;
        let key = Ident::new(self.key_column)?;
        let value = Ident::new(self.value_column)?;
        let version = Ident::new(self.version_column)?;
        if self.max_attempts == 0 {
            return Err(Error::InvalidConfig(
                "max_attempts must be at least 1".into(),
            ));
        }
        self.retry.validate()?;
        Ok(Versioned {
            read: read_versioned::<DB>(&table, &key, &value, &version),
            write: write_versioned::<DB>(&table, &key, &value, &version),
            pool: self.pool,
            table,
            max_attempts: self.max_attempts,
            retry: self.retry,
        })
    }
}

impl<DB: Backend> Versioned<DB> {
    /// A builder for the column `value_column` of `table`.
    pub fn builder(
        pool: Pool<DB>,
        table: impl Into<String>,
        value_column: impl Into<String>,
    ) -> VersionedBuilder<DB> {
        VersionedBuilder {
            pool,
            table: table.into(),
            value_column: value_column.into(),
            key_column: "id".to_owned(),
            version_column: "version".to_owned(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry: RetryPolicy::default(),
        }
    }

    /// Reads the value and version of the row `key`, asks `decide` what to do with the
    /// value, and writes its new value if the version has not moved since the read. When
    /// it has (another writer won), sleeps per the [`RetryPolicy`] (holding no
    /// connection) and starts over with a fresh read, calling `decide` again.
    ///
    /// Returns [`Outcome::Written`], or [`Outcome::Refused`] with the closure's own
    /// reason; [`Error::VersionConflict`] when every attempt lost;
    /// [`Error::Database`] wrapping `sqlx::Error::RowNotFound` when there is no row
    /// `key`, or any other database error.
    ///
    /// # Cancel safety
    /// Each attempt is one read and one single-statement write, each committed on its
    /// own. Dropped before a write was sent, nothing was written; dropped while a write
    /// is in flight, it may or may not have been applied, and the version column tells
    /// which. The closure may be called again after an earlier call's write lost, so it
    /// should only decide, not act.
    ///
    /// # The closure
    /// Any async closure or closure returning a future, capturing what it likes by
    /// reference or by value, also inside `tokio::spawn` and web handlers (which need the
    /// whole future to be `Send`): `async |stock: i64| ..`, `async move |stock: i64| ..`,
    /// `|stock: i64| async move { .. }`. Each attempt calls a clone of it, so it must be
    /// `Clone` (references are; a captured `String` is cloned once per attempt): to
    /// count its calls, capture a reference to an atomic or a `Mutex`, not a `&mut`.
    /// (Why not `AsyncFnMut`: the compiler cannot yet prove that a future borrowed from
    /// a capturing `AsyncFnMut` closure is `Send` for every borrow, and failed with
    /// "implementation of `Send` is not general enough" at the spawn, not at the closure.)
    pub async fn update<K, V, R, F>(&self, key: &K, decide: F) -> Result<Outcome<V, R>>
    where
        K: SqlValue<DB>,
        V: SqlValue<DB>,
        F: AsyncFnOnce(V) -> Decision<V, R> + Clone,
    {
        // The attempts, not time, bound the loop.
        let mut backoff = Backoff::new(&self.retry, Instant::now() + crate::config::MAX_WAIT);
        for attempts in 1..=self.max_attempts {
            if attempts > 1 {
                backoff.pause().await;
            }
            let (current, version) = {
                let mut conn = self.pool.acquire().await?;
                DB::read_versioned::<K, V>(&mut conn, &self.read, key)
                    .await?
                    .ok_or(sqlx::Error::RowNotFound)?
            };
            let value = match decide.clone()(current).await {
                Decision::Write(value) => value,
                Decision::Refuse(reason) => return Ok(Outcome::Refused { reason, attempts }),
            };
            let written = {
                let mut conn = self.pool.acquire().await?;
                DB::write_versioned(&mut conn, &self.write, &value, key, version).await?
            };
            if written {
                return Ok(Outcome::Written {
                    value,
                    version: version + 1,
                    attempts,
                });
            }
            tracing::trace!(table = %self.table, attempts, "version moved; reading again");
        }
        Err(Error::VersionConflict {
            table: self.table.to_string(),
            attempts: self.max_attempts,
        })
    }
}
