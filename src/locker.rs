//! [`Locker`]: the entry point. Validates input, runs the acquire loop, and hands out
//! guards. The SQL itself lives in the dialects.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use tokio::time::Instant;

use crate::config::{
    DEFAULT_TABLE, RetryPolicy, micros, validate_key, validate_lease, validate_owner_prefix,
    validate_table_name, validate_wait,
};
use crate::dialect::{Backend, Contention};
use crate::error::{Error, Result};
use crate::guard::{LockGuard, PendingRelease};

/// What a [`Locker`] shares with its clones, guards and background tasks.
pub(crate) struct Shared<DB: Backend> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: DB::Statements,
    pub(crate) table: String,
    pub(crate) owner_prefix: String,
    pub(crate) retry: RetryPolicy,
}

/// Hands out leases on keys in one lock table. Cheap to clone: clones share the pool and
/// the prepared statement text.
///
/// Build it from the application's own pool with [`Locker::new`], or with
/// [`Locker::builder`] to change the table name, owner prefix or retry policy.
pub struct Locker<DB: Backend> {
    pub(crate) shared: Arc<Shared<DB>>,
}

impl<DB: Backend> Clone for Locker<DB> {
    fn clone(&self) -> Self {
        Locker {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Locker<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.shared.table)
            .finish_non_exhaustive()
    }
}

/// Who holds a key right now, as [`Locker::holder`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The owner value (`lock_value`) in the row.
    pub owner: String,
    /// The fencing token in the row.
    pub fencing_token: i64,
    /// Whether the lease has run out by the database clock (the row may still be there
    /// until it is taken over or reaped).
    pub expired: bool,
}

/// Options for a [`Locker`]; see each method for its default.
pub struct LockerBuilder<DB: Backend> {
    pool: Pool<DB>,
    table: String,
    owner_prefix: String,
    retry: RetryPolicy,
}

impl<DB: Backend> LockerBuilder<DB> {
    /// The lock table. Default: [`DEFAULT_TABLE`] (`distributed_lock`). Must be a plain
    /// identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 bytes); checked by [`build`](Self::build).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Text put before the random part of every owner value, so operators can tell who
    /// holds a lock (for example `"billing-7f3:"`). Default: empty. At most 32 bytes.
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.owner_prefix = prefix.into();
        self
    }

    /// How [`Locker::acquire`] spaces its attempts. Default: [`RetryPolicy::default`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Checks every option and builds the locker. Nothing touches the database.
    pub fn build(self) -> Result<Locker<DB>> {
        validate_table_name(&self.table)?;
        validate_owner_prefix(&self.owner_prefix)?;
        self.retry.validate()?;
        Ok(Locker {
            shared: Arc::new(Shared {
                sql: DB::statements(&self.table),
                pool: self.pool,
                table: self.table,
                owner_prefix: self.owner_prefix,
                retry: self.retry,
            }),
        })
    }
}

impl<DB: Backend> Locker<DB> {
    /// A locker on the default table `distributed_lock` with default options.
    pub fn new(pool: Pool<DB>) -> Self {
        Self::builder(pool)
            .build()
            .expect("the default options are valid")
    }

    /// A builder to change the defaults.
    pub fn builder(pool: Pool<DB>) -> LockerBuilder<DB> {
        LockerBuilder {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            owner_prefix: String::new(),
            retry: RetryPolicy::default(),
        }
    }

    /// The pool this locker runs on.
    pub fn pool(&self) -> &Pool<DB> {
        &self.shared.pool
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        &self.shared.table
    }

    /// Creates or upgrades the lock table (refinery migrations, history in
    /// `<table>_history`). Safe to call from many processes at once: runs are serialized
    /// by a database lock, and a second run applies nothing. Returns how many migrations
    /// were applied.
    ///
    /// # Cancel safety
    /// Dropping the future may leave a migration half-applied; every migration is written
    /// to be re-run, so call `migrate` again. The connection it used is closed, not
    /// returned to the pool, so no migration lock leaks.
    pub async fn migrate(&self) -> Result<usize> {
        crate::migrate::run(&self.shared.pool, &self.shared.table).await
    }

    /// One attempt to take `key` for `lease`, in one statement on PostgreSQL and two on
    /// MySQL and SQLite. Takes over a row whose lease has expired (by the database clock).
    /// `Ok(None)` when another owner holds a live lease, or lost the race in the same
    /// instant (duplicate key, deadlock, busy): losing is never an error.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidDuration`] (nothing is written), or
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the database committed the acquisition,
    /// an owner-checked delete of that row is spawned at once, so no lock is left held by
    /// nobody (it needs a tokio runtime; without one the lease simply expires).
    pub async fn try_acquire(&self, key: &str, lease: Duration) -> Result<Option<LockGuard<DB>>> {
        validate_key(key)?;
        validate_lease(lease)?;
        self.attempt(key, &self.new_owner(), lease).await
    }

    /// Takes `key` for `lease`, retrying with exponential backoff and full jitter (see
    /// [`RetryPolicy`]) until `wait` has passed, then fails with [`Error::Timeout`]. Holds
    /// no pool connection while it sleeps. `wait` of zero makes a single attempt.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire).
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard<DB>> {
        validate_key(key)?;
        validate_lease(lease)?;
        validate_wait(wait)?;
        let started = Instant::now();
        let deadline = started + wait;
        let owner = self.new_owner();
        let mut delays = self.shared.retry.delays();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            if let Some(guard) = self.attempt(key, &owner, lease).await? {
                return Ok(guard);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    key: key.to_owned(),
                    waited: now - started,
                    attempts,
                });
            }
            let delay = delays.next().unwrap_or_default().min(deadline - now);
            tokio::time::sleep(delay).await;
        }
    }

    /// Acquires `key` (waiting up to `wait`), runs `work` with the guard, and releases the
    /// lock whether `work` succeeded or not. Returns what `work` returned, or
    /// [`Error::NotHeld`] if the lease was lost before the release.
    ///
    /// # Cancel safety
    /// Dropping the future drops the guard, whose lock is then released in the background
    /// (see [`LockGuard`]).
    pub async fn with_lock<T>(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
        work: impl AsyncFnOnce(&LockGuard<DB>) -> T,
    ) -> Result<T> {
        let guard = self.acquire(key, lease, wait).await?;
        let output = work(&guard).await;
        guard.release().await?;
        Ok(output)
    }

    /// Who holds `key` now, or `None` when there is no row.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holder(&self, key: &str) -> Result<Option<Holder>> {
        validate_key(key)?;
        let row = DB::inspect(&self.shared.pool, &self.shared.sql, key).await?;
        Ok(row.map(|(owner, fencing_token, expired)| Holder {
            owner,
            fencing_token,
            expired,
        }))
    }

    /// A fresh, unguessable owner value: the prefix and 32 hex digits of a random UUID.
    fn new_owner(&self) -> String {
        format!(
            "{}{}",
            self.shared.owner_prefix,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// One acquisition attempt with an owner value chosen by the caller.
    async fn attempt(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<LockGuard<DB>>> {
        let shared = &self.shared;
        // Armed before the statement is sent: if we are dropped or the reply is lost, it
        // deletes whatever row this owner may have committed.
        let pending = PendingRelease::arm(Arc::clone(shared), key, owner);
        match DB::try_acquire(&shared.pool, &shared.sql, key, owner, micros(lease)).await {
            Ok(Some(acquired)) => {
                tracing::debug!(
                    key,
                    owner,
                    fencing_token = acquired.fencing_token,
                    "lock acquired"
                );
                Ok(Some(pending.into_guard(acquired)))
            }
            Ok(None) => {
                pending.disarm();
                Ok(None)
            }
            Err(err) if DB::contention(&err) == Contention::LostRace => {
                tracing::trace!(key, error = %err, "lost an acquisition race");
                pending.disarm();
                Ok(None)
            }
            Err(err) => Err(err.into()),
        }
    }
}
