//! [`Locker`]: the entry point. Validates input, runs the acquire loop, and hands out
//! guards. The SQL itself lives in the dialects.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::{
    DEFAULT_LEASE, DEFAULT_RENEW_INTERVAL, DEFAULT_TABLE, MIN_LEASE, RetryPolicy, micros,
    validate_acquire, validate_key, validate_lease, validate_owner_prefix, validate_range,
    validate_table_name,
};
use crate::dialect::{Backend, Contention, LockId};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::owner::Owner;
use crate::stats::{Counters, Stats};

/// What a [`Locker`] shares with its clones, guards and background tasks.
pub(crate) struct Shared<DB: Backend> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: DB::Statements,
    pub(crate) table: String,
    pub(crate) owner_prefix: String,
    pub(crate) retry: RetryPolicy,
    pub(crate) default_lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) counters: Counters,
}

/// Hands out leases on keys in one lock table. Cheap to clone: clones share the pool, the
/// statement text and the counters.
///
/// Build it from the application's own pool with [`Locker::new`], or with
/// [`Locker::builder`] to change the defaults.
pub struct Locker<DB: Backend> {
    pub(crate) shared: Arc<Shared<DB>>,
    auto_renew: bool,
}

impl<DB: Backend> Clone for Locker<DB> {
    fn clone(&self) -> Self {
        Locker {
            shared: Arc::clone(&self.shared),
            auto_renew: self.auto_renew,
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Locker<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.shared.table)
            .field("auto_renew", &self.auto_renew)
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
    default_lease: Duration,
    renew_interval: Duration,
    auto_renew: bool,
}

impl<DB: Backend> LockerBuilder<DB> {
    /// The lock table. Default: [`DEFAULT_TABLE`] (`distributed_lock`). Must be a plain
    /// identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 bytes) that no backend reserves
    /// (not `order`, `user`, `key`, ...); checked by [`build`](Self::build).
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

    /// How [`Locker::acquire`] spaces its attempts and a watchdog its retries.
    /// Default: [`RetryPolicy::default`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The lease [`Locker::lease`] returns for callers without an opinion.
    /// Default: [`DEFAULT_LEASE`] (30 s). Must be at least twice the renew interval.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// How often the watchdog renews a held lease; each guard renews every
    /// `min(interval, its lease / 3)`. Default: [`DEFAULT_RENEW_INTERVAL`] (10 s).
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = interval;
        self
    }

    /// Whether guards are renewed by a watchdog. Default: `true`. Can also be changed per
    /// acquisition with [`Locker::auto_renew`].
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Checks every option and builds the locker. Nothing touches the database.
    pub fn build(self) -> Result<Locker<DB>> {
        validate_table_name(&self.table)?;
        validate_owner_prefix(&self.owner_prefix)?;
        self.retry.validate()?;
        validate_lease(self.default_lease)?;
        validate_range(
            "renew interval",
            self.renew_interval,
            MIN_LEASE,
            self.default_lease / 2,
        )?;
        Ok(Locker {
            shared: Arc::new(Shared {
                sql: DB::statements(&self.table),
                pool: self.pool,
                table: self.table,
                owner_prefix: self.owner_prefix,
                retry: self.retry,
                default_lease: self.default_lease,
                renew_interval: self.renew_interval,
                counters: Counters::default(),
            }),
            auto_renew: self.auto_renew,
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
            default_lease: DEFAULT_LEASE,
            renew_interval: DEFAULT_RENEW_INTERVAL,
            auto_renew: true,
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

    /// The configured default lease ([`DEFAULT_LEASE`] unless the builder changed it).
    pub fn lease(&self) -> Duration {
        self.shared.default_lease
    }

    /// A clone of this locker whose acquisitions are (or are not) renewed by a watchdog.
    /// Without renewal a guard's lease simply ends at [`LockGuard::expires_at`] unless
    /// extended by hand, and [`LockGuard::lost`] fires `Expired` then.
    pub fn auto_renew(&self, on: bool) -> Locker<DB> {
        Locker {
            auto_renew: on,
            ..self.clone()
        }
    }

    /// The counters of this locker and its clones.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// A reentrant owner identity: guards it acquires for a key it already holds nest
    /// instead of waiting for themselves. See [`Owner`].
    pub fn owner(&self) -> Owner<DB> {
        Owner::new(self.clone(), self.new_owner())
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
    /// [`Error::Database`]: the statement or its answer was lost. If the database did
    /// grant the lock, the row is deleted in the background as soon as the database can
    /// be reached again (trying until the lease would have ended).
    ///
    /// # Cancel safety
    /// Cancel safe. The statement runs in a task of its own; if this future is dropped at
    /// any point, a lock that the database granted is released at once by that task, so
    /// no row is left held by nobody.
    pub async fn try_acquire(&self, key: &str, lease: Duration) -> Result<Option<LockGuard<DB>>> {
        validate_key(key)?;
        validate_lease(lease)?;
        self.attempt(key, &self.new_owner(), lease, true).await
    }

    /// Takes `key` for `lease`, retrying with exponential backoff and full jitter (see
    /// [`RetryPolicy`]) until `wait` has passed, then fails with [`Error::Timeout`]. Holds
    /// no pool connection while it sleeps. `wait` of zero makes a single attempt.
    /// Database errors end the wait at once: an outage is not contention.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire).
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard<DB>> {
        validate_acquire(key, lease, wait)?;
        let owner = self.new_owner();
        self.retry_until(key, wait, || self.attempt(key, &owner, lease, true))
            .await
    }

    /// Acquires `key` (waiting up to `wait`), runs `work` with the guard, and releases the
    /// lock whether `work` succeeded or not. Returns what `work` returned.
    ///
    /// If the lease is lost while `work` runs, `work`'s future is dropped at its next
    /// await point and [`Error::LockLost`] carries the reason. [`Error::NotHeld`] means the
    /// lease ended between `work`'s end and the release.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, whose lock is then released in the
    /// background (see [`LockGuard`]).
    pub async fn with_lock<T>(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
        work: impl AsyncFnOnce(&LockGuard<DB>) -> T,
    ) -> Result<T> {
        let guard = self.acquire(key, lease, wait).await?;
        let outcome = tokio::select! {
            biased;
            reason = guard.lost() => Err(reason),
            output = work(&guard) => Ok(output),
        };
        match outcome {
            Ok(output) => {
                guard.release().await?;
                Ok(output)
            }
            Err(reason) => {
                // The row is no longer ours; this only stops the watchdog and tidies up.
                guard.release().await.ok();
                Err(Error::LockLost {
                    key: key.to_owned(),
                    reason,
                })
            }
        }
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

    /// Calls `attempt` until it wins or `wait` has passed, sleeping between attempts.
    pub(crate) async fn retry_until<F, Fut>(
        &self,
        key: &str,
        wait: Duration,
        mut attempt: F,
    ) -> Result<LockGuard<DB>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<LockGuard<DB>>>>,
    {
        let started = Instant::now();
        let deadline = started + wait;
        let mut delays = self.shared.retry.delays();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            if let Some(guard) = attempt().await? {
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

    /// One acquisition attempt with an owner value chosen by the caller (validated input).
    /// `single_use`: no attempt will use this owner value after this one fails (true for
    /// a plain locker's fresh values, false for a reentrant [`Owner`]'s fixed one).
    pub(crate) async fn attempt(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        single_use: bool,
    ) -> Result<Option<LockGuard<DB>>> {
        let shared = Arc::clone(&self.shared);
        let renew = self
            .auto_renew
            .then(|| shared.renew_interval.min(lease / 3));
        let (key, owner) = (key.to_owned(), owner.to_owned());
        let (reply, answer) = oneshot::channel();
        // The statement runs to completion in its own task even if the caller goes away.
        // A won lock travels back as a guard: if the caller is gone, the guard is dropped
        // right here and releases it.
        tokio::spawn(async move {
            Counters::bump(&shared.counters.attempts);
            let sent_at = Instant::now();
            let outcome =
                DB::try_acquire(&shared.pool, &shared.sql, &key, &owner, micros(lease)).await;
            let outcome = match outcome {
                Ok(Some(acquired)) => {
                    Counters::bump(&shared.counters.acquired);
                    tracing::debug!(key, owner, fencing_token = acquired.fencing_token, expires_at = %acquired.expires_at, "lock acquired");
                    let lease = Lease::start(shared, key, owner, acquired, lease, sent_at, renew);
                    Ok(Some(LockGuard::new(lease)))
                }
                Ok(None) => Ok(None),
                Err(err) if DB::contention(&err) == Contention::LostRace => {
                    tracing::trace!(key, error = %err, "lost an acquisition race");
                    Ok(None)
                }
                Err(err) if single_use => {
                    // The reply was lost, not necessarily the statement, and the connection
                    // that lost it is likely down for a while. Answer now, then keep trying
                    // to remove a row this owner may have committed until its lease would
                    // have ended anyway: nobody else will ever use this owner value.
                    drop(reply.send(Err(Error::from(err))));
                    release_if_owned(&shared, &key, &owner, sent_at + lease).await;
                    return;
                }
                Err(err) => {
                    // A reentrant owner may try again with the same value as soon as it has
                    // the answer: clean up once, before answering, so that no cleanup can
                    // delete its next acquisition.
                    release_if_owned(&shared, &key, &owner, Instant::now()).await;
                    Err(Error::from(err))
                }
            };
            drop(reply.send(outcome));
        });
        answer
            .await
            .unwrap_or(Err(Error::Database(sqlx::Error::WorkerCrashed)))
    }
}

/// After an acquisition whose outcome is unknown: deletes the row if `owner` holds it,
/// retrying failed statements with the retry policy's sleeps until `until`.
async fn release_if_owned<DB: Backend>(
    shared: &Shared<DB>,
    key: &str,
    owner: &str,
    until: Instant,
) {
    let mut delays = shared.retry.delays();
    loop {
        let done = match DB::inspect(&shared.pool, &shared.sql, key).await {
            Ok(Some((holder, fencing_token, _))) if holder == owner => {
                let id = LockId {
                    key,
                    owner,
                    fencing_token,
                };
                DB::release(&shared.pool, &shared.sql, id).await.is_ok()
            }
            // No row, or someone else's: nothing of ours to remove.
            Ok(_) => true,
            Err(_) => false,
        };
        let retry_at = Instant::now() + delays.next().unwrap_or_default();
        if done || retry_at >= until {
            if !done {
                tracing::warn!(
                    key,
                    owner,
                    "could not check for a row left by a failed acquisition; it will expire"
                );
            }
            return;
        }
        tokio::time::sleep_until(retry_at).await;
    }
}
