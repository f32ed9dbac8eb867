//! [`Locker`]: the entry point. Validates input, hands acquisitions to the lock
//! algorithm (`acquire.rs`) with the Locker's [`Core`], and wraps won leases in guards.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;

use crate::acquire::{self, Gate, Request};
use crate::config::{
    DEFAULT_LEASE, DEFAULT_REAP_BATCH, DEFAULT_RELAXED_TABLE, DEFAULT_RENEW_INTERVAL,
    DEFAULT_TABLE, Durability, LeaseMargin, MAX_LEASE, MIN_LEASE, RetryPolicy,
    default_owner_prefix, validate_acquire, validate_key, validate_lease, validate_owner_prefix,
    validate_range, validate_table_name,
};
use crate::core::{Core, Listen, Settings};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::key_label::KeyLabel;
use crate::lease::Lease;
use crate::line::Terms;
use crate::metrics::{self, Kind};
use crate::migrate::MigrationScript;
use crate::reaper::{ReaperConfig, ReaperHandle, reap_all};
use crate::stats::Stats;
use crate::table::{ConnectOptions, LockTable};

/// Hands out leases on keys in one lock table. Cheap to clone: clones share the pool, the
/// statement text, the counters and one lease engine.
///
/// Build it from the application's own pool with [`Locker::new`], or with
/// [`Locker::builder`] to change the defaults.
///
/// # The lease engine
/// Every Locker has one background task, started with its first renewed lease, that
/// renews all leases held through the Locker (its clones, guards and [`Owner`](crate::Owner)s)
/// in batched statements: one batch per renewal interval in the steady state, whatever the
/// number of guards (a batch is one statement for up to 10,000 leases, plus a read-back
/// when a lease was lost), and deletes the rows of guards dropped without
/// [`release`](LockGuard::release) in batches too. Its statements run on one connection
/// of its own, outside the pool (an idle one detached from the pool, or a new one, when
/// it first has work), so the application's use of the pool cannot delay a renewal. It stops when
/// the last clone and the last guard are dropped, or at [`Locker::shutdown`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::Locker;
///
/// let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = Locker::new(pool); // default table and options
/// locker.migrate().await?; // creates the lock table; a second run applies nothing
///
/// let lease = Duration::from_secs(30);
/// let guard = locker.try_acquire("invoice:42", lease).await?.expect("nobody holds it");
/// // While it is held, one attempt answers Ok(None): losing is not an error.
/// assert!(locker.try_acquire("invoice:42", lease).await?.is_none());
/// let first = guard.fencing_token();
/// guard.release().await?;
///
/// // Acquire (waiting up to 5 s), run the work, release.
/// let token = locker
///     .with_lock("invoice:42", lease, Duration::from_secs(5), async |guard| {
///         Ok::<_, dblock::Error>(guard.fencing_token())
///     })
///     .await?;
/// assert!(token > first); // fencing tokens never go backwards
/// # Ok(()) }
/// ```
pub struct Locker<DB: Backend> {
    pub(crate) core: Arc<Core<DB>>,
    auto_renew: bool,
}

impl<DB: Backend> Clone for Locker<DB> {
    fn clone(&self) -> Self {
        Locker {
            core: Arc::clone(&self.core),
            auto_renew: self.auto_renew,
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Locker<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.table())
            .field("auto_renew", &self.auto_renew)
            .finish_non_exhaustive()
    }
}

/// Who holds a key right now, as [`Locker::holder`] reads it.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let guard = locker.try_acquire("invoice:42", Duration::from_secs(30)).await?.unwrap();
///
/// let holder = locker.holder("invoice:42").await?.expect("the key has a row");
/// assert_eq!(holder.owner, guard.owner());
/// assert_eq!(holder.fencing_token, guard.fencing_token());
/// assert!(!holder.expired); // by the database clock
/// println!("held since {} until {}", holder.acquired_at, holder.expires_at);
///
/// guard.release().await?;
/// assert_eq!(locker.holder("invoice:42").await?, None); // no row: nobody holds it
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The owner value (`lock_value`) in the row.
    pub owner: String,
    /// The fencing token in the row.
    pub fencing_token: i64,
    /// When the row was written by its acquisition, by the database clock.
    pub acquired_at: DateTime<Utc>,
    /// When the lease ends (or ended), by the database clock.
    pub expires_at: DateTime<Utc>,
    /// Whether the lease has run out by the database clock (the row may still be there
    /// until it is taken over or reaped).
    pub expired: bool,
}

/// Options for a [`Locker`]; see each method for its default.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::Locker;
///
/// let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = Locker::builder(pool.clone())
///     .table("billing_lock") // default: distributed_lock
///     .owner_prefix("billing-7f3:") // default: "<host>:<pid>:"
///     .default_lease(Duration::from_secs(10)) // default: 30 s
///     .build()?; // checks the options; touches no database
/// locker.migrate().await?;
/// assert_eq!((locker.table(), locker.lease()), ("billing_lock", Duration::from_secs(10)));
///
/// let guard = locker.try_acquire("invoice:42", locker.lease()).await?.unwrap();
/// assert!(guard.owner().starts_with("billing-7f3:")); // operators see who holds it
/// guard.release().await?;
///
/// // A lease must be renewed at least twice before it runs out.
/// let too_slow = Locker::builder(pool).renew_interval(Duration::from_secs(20)).build();
/// assert!(matches!(too_slow, Err(dblock::Error::InvalidConfig(_))));
/// # Ok(()) }
/// ```
pub struct LockerBuilder<DB: Backend> {
    pool: Pool<DB>,
    /// `None`: the default of the durability.
    table: Option<String>,
    durability: Durability,
    /// `None`: not set, [`default_owner_prefix`] applies.
    owner_prefix: Option<String>,
    retry: RetryPolicy,
    /// `None`: not set, the default applies.
    default_lease: Option<Duration>,
    renew_interval: Option<Duration>,
    /// `None`: the default margin ([`DEFAULT_LEASE_MARGIN`], capped per lease).
    lease_margin: Option<Duration>,
    auto_renew: bool,
    listen: bool,
    listener_options: Option<ConnectOptions<DB>>,
    fair: bool,
    key_label: KeyLabel,
    /// `None`: not set, [`DEFAULT_STATEMENT_TIMEOUT`](crate::DEFAULT_STATEMENT_TIMEOUT).
    statement_timeout: Option<Duration>,
    /// The lock history's retention; `None`: no history recorded.
    history: Option<Duration>,
}

impl<DB: Backend> LockerBuilder<DB> {
    /// The lock table. Default: [`DEFAULT_TABLE`] (`distributed_lock`), or
    /// [`DEFAULT_RELAXED_TABLE`] with [`Durability::Relaxed`]. Must be a plain identifier
    /// (`[A-Za-z_][A-Za-z0-9_]*`, at most 40 bytes) that no backend reserves (not `order`,
    /// `user`, `key`, ...); checked by [`build`](Self::build).
    ///
    /// On PostgreSQL the name may be schema-qualified, `schema.table` (each part such an
    /// identifier, the schema not `pg_*`, the whole at most
    /// [`MAX_QUALIFIED_TABLE_NAME_BYTES`](crate::MAX_QUALIFIED_TABLE_NAME_BYTES)): every
    /// relation [`migrate`](Locker::migrate) makes for it (its fencing sequence, ticket
    /// table, `<table>_history`, indexes) goes into that schema, which must exist already:
    /// dblock creates no schema, whose owner and grants are the operator's to choose (until
    /// it exists, the table is [`Error::MissingTable`]). Unqualified names resolve through
    /// the `search_path`, as before. MySQL/MariaDB refuse a qualified name (a MySQL
    /// database is the schema: name it in the connection URL), and so does SQLite; both
    /// as [`Error::InvalidTableName`], before anything is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let locker = dblock::Locker::builder(pool.clone()).table("job_locks").build()?;
    /// assert_eq!(locker.table(), "job_locks");
    /// // `locks.job_locks` would name a schema's table on PostgreSQL; SQLite has none.
    /// let qualified = dblock::Locker::builder(pool).table("locks.job_locks").build();
    /// assert!(matches!(qualified, Err(dblock::Error::InvalidTableName { .. })));
    /// # Ok(()) }
    /// ```
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = Some(name.into());
        self
    }

    /// Text put before the random part of every owner value (32 hex digits of a random
    /// UUID, which keeps owner values unguessable), so operators can tell who holds a
    /// lock. Default: `"<host>:<pid>:"`, this machine's short host name (at most 20 bytes
    /// of `[A-Za-z0-9_-]`) and the process id, as in `web-7f3c:4182:9c1d0e2f...`; give
    /// your own (a service and replica name, say), or `""` for bare random values. At
    /// most 32 bytes, no control characters.
    pub fn owner_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.owner_prefix = Some(prefix.into());
        self
    }

    /// How [`Locker::acquire`] spaces its attempts and a watchdog its retries.
    /// Default: [`RetryPolicy::default`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The lease [`Locker::lease`] returns for callers without an opinion.
    /// Default: [`DEFAULT_LEASE`] (30 s). When [`renew_interval`](Self::renew_interval)
    /// is set too, it must be at least twice that.
    ///
    /// How to pick: a holder that dies keeps the key until its row expires, between
    /// `lease - renew interval` and `lease` after its death (renewal every
    /// `min(10 s, lease / 3)`), and a living holder rides out a stall (a GC pause, a slow
    /// network, a database failover) of about `lease - renew interval - margin`, the
    /// margin being `min(100 ms, lease / 10) + lease / 100` (see
    /// [`Locker::lease_margin`]), less one retry pause. 30 s suits locks around work; for
    /// an [`Election`](crate::Election), where the lease is the failover time, 10-15 s
    /// (client-go's leader election uses 15 s). A shorter lease means more renewals (one
    /// batched statement per Locker and interval) and a lock lost to a shorter stall. The
    /// README's "How long a lease" has a table.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = Some(lease);
        self
    }

    /// How often the lease engine renews a held lease; each guard renews every
    /// `min(interval, its lease / 3)`, so short leases are renewed often enough whatever
    /// this says. Default: [`DEFAULT_RENEW_INTERVAL`] (10 s). At least 1 ms, and at most
    /// half the default lease (checked only against a lease you set or the 30 s default).
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// The fixed part of every lease's safety margin: how long before the database may
    /// see a lease expire that this Locker ends it locally (its guards' `lost()` completes,
    /// `with_lock` drops its work), plus the drift part, `lease / 100`. Default:
    /// [`DEFAULT_LEASE_MARGIN`](crate::DEFAULT_LEASE_MARGIN) (100 ms), capped at a tenth of each lease. Raise it for
    /// clients whose tasks may be scheduled late by more than that (a loaded machine, long
    /// GC-like stalls of the runtime). At most [`MAX_LEASE`]; every lease acquired must
    /// exceed its margin plus its renew interval ([`Error::InvalidDuration`], nothing
    /// sent), and so must the [`default_lease`](Self::default_lease) (checked here).
    /// [`Locker::lease_margin`] says the margin of a given lease.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// use std::time::Duration;
    /// use dblock::Locker;
    ///
    /// let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let default = Locker::new(pool.clone());
    /// assert_eq!(default.lease_margin(Duration::from_secs(3)), Duration::from_millis(130));
    /// assert_eq!(default.lease_margin(Duration::from_secs(30)), Duration::from_millis(400));
    ///
    /// let wary = Locker::builder(pool.clone()).lease_margin(Duration::from_millis(500)).build()?;
    /// assert_eq!(wary.lease_margin(Duration::from_secs(30)), Duration::from_millis(800));
    /// // A 600 ms lease renewed every 200 ms cannot also end 506 ms early.
    /// let refused = wary.try_acquire("k", Duration::from_millis(600)).await;
    /// assert!(matches!(refused, Err(dblock::Error::InvalidDuration { .. })));
    /// // Nor can the default lease, checked when the Locker is built.
    /// let too_wide = Locker::builder(pool).lease_margin(Duration::from_secs(20)).build();
    /// assert!(matches!(too_wide, Err(dblock::Error::InvalidConfig(_))));
    /// # Ok(()) }
    /// ```
    pub fn lease_margin(mut self, fixed: Duration) -> Self {
        self.lease_margin = Some(fixed);
        self
    }

    /// Whether guards are renewed by the lease engine. Default: `true`. Can also be changed per
    /// acquisition with [`Locker::auto_renew`].
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Whether waiters are woken by releases in other processes, by a listener opened when
    /// a waiter first has to sleep, outside the pool: on PostgreSQL one `LISTEN`
    /// connection per Locker; on SQLite on a database file one connection that notices
    /// other connections' commits every few milliseconds while the Locker has waiters; on
    /// MySQL/MariaDB a *bell* listener (one connection that registers the keys its waiters
    /// wait for, and up to four blocked in the server on the named locks of the rows they
    /// wait for). See the README's "Waiting". Default: `true`. Without it (or on an
    /// in-memory SQLite database, MariaDB Galera, or for a MySQL/MariaDB hold whose holder
    /// took no bell), a waiter whose lock is held elsewhere sleeps until the holder's lease
    /// ends or its backoff runs out, whichever is sooner; releases through the same Locker
    /// wake its waiters either way. A Locker without a listener still rings bells for the
    /// waiters of other processes.
    ///
    /// The listener connects where the pool does, unless
    /// [`listener_options`](LockerBuilder::listener_options) says otherwise, and only if
    /// that connection is a session of its own: through a transaction pooler (PgBouncer
    /// `pool_mode = transaction`) it would steal other clients' notifications, so there
    /// it is not opened and waiters poll (PostgreSQL; on MySQL/MariaDB the named locks
    /// need sessions of their own too: a proxy that multiplexes sessions would break
    /// them).
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = on;
        self
    }

    /// Fair mode: strict first come, first served across processes, like Curator's
    /// sequential nodes and Redisson's fair lock. Default: `false`.
    ///
    /// A waiting [`acquire`](Locker::acquire) that loses its first attempt takes a ticket
    /// (a row in `<table>_ticket`), and an attempt is made only when no live ticket with
    /// a lower number exists for that key; [`try_acquire`](Locker::try_acquire) and a
    /// zero wait succeed only when nobody is queued. Tickets are leases of the
    /// [`default_lease`](Self::default_lease), renewed by the Locker's engine at the
    /// [`renew_interval`](Self::renew_interval) while their waiters wait: a waiter that
    /// dies holds up the queue until its ticket expires, one that is cancelled or times
    /// out not at all. [`LockGuard::ticket`](crate::LockGuard::ticket) says which ticket
    /// a grant waited on.
    ///
    /// The cost: an attempt is two statements (the ticket check, then the usual one),
    /// taking a ticket one more, and every local waiter of the key looks on each release
    /// (not only the first). A row written by a plain-SQL client still blocks everyone;
    /// tickets only order dblock's own waiters.
    ///
    /// On a MariaDB Galera cluster (`wsrep_on`) ticket numbers come in per-node strides,
    /// not in arrival order: the first waiting acquisition of a fair Locker there answers
    /// [`Error::InvalidConfig`] with that reason, before any ticket is written.
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// Adds a `key` label to the acquisition, hold and failure metrics
    /// (`distributed_lock_acquire_duration_seconds`, `distributed_lock_hold_duration_seconds`,
    /// `distributed_lock_failures_total`; feature `metrics`), so that an operator sees
    /// which locks are contended. Default: [`KeyLabel::Off`], only `table`.
    ///
    /// **Mind the cardinality**: each distinct value is a time series of its own for the
    /// life of the process. [`KeyLabel::Prefix`] (the key up to its first `:`) stays
    /// bounded when keys are named `<kind>:<id>`; [`KeyLabel::Full`] is for a few fixed
    /// keys only. The gauges and renewal counter keep only `table`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// use dblock::KeyLabel;
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// // `invoice:42` is recorded with `key="invoice"`.
    /// let locker = dblock::Locker::builder(pool)
    ///     .metrics_key_label(KeyLabel::Prefix)
    ///     .build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    pub fn metrics_key_label(mut self, label: KeyLabel) -> Self {
        self.key_label = label;
        self
    }

    /// The bound on every lock-table statement that neither a lease nor a wait bounds:
    /// [`list`](Locker::list), [`holder`](Locker::holder), the database clock,
    /// [`force_release`](Locker::force_release), reaper batches, fair mode's tickets, the
    /// lease engine's batches (renewal also stops at each lease's deadline) and the pool
    /// checkout before each of them. A statement without an answer by then is abandoned,
    /// its connection closed (not handed back to the pool), and the call fails with a
    /// retryable error: [`Error::PoolTimeout`] if no connection could be had (saying
    /// why), else [`Error::Database`] with a timed-out I/O error. Acquisition attempts
    /// are bounded by their lease, [`Locker::acquire`] by its wait, and releases and
    /// extensions by their lease instead (README, "Connections", has the whole table).
    ///
    /// Default: [`DEFAULT_STATEMENT_TIMEOUT`](crate::DEFAULT_STATEMENT_TIMEOUT) (10 s);
    /// between [`MIN_STATEMENT_TIMEOUT`](crate::MIN_STATEMENT_TIMEOUT) (100 ms) and
    /// [`MAX_STATEMENT_TIMEOUT`](crate::MAX_STATEMENT_TIMEOUT) (1 h), checked by
    /// [`build`](Self::build) ([`Error::InvalidDuration`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// use std::time::Duration;
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let locker = dblock::Locker::builder(pool.clone())
    ///     .statement_timeout(Duration::from_secs(3))
    ///     .build()?;
    /// # let _ = locker;
    /// let zero = dblock::Locker::builder(pool).statement_timeout(Duration::ZERO).build();
    /// assert!(matches!(zero, Err(dblock::Error::InvalidDuration { .. })));
    /// # Ok(()) }
    /// ```
    pub fn statement_timeout(mut self, bound: Duration) -> Self {
        self.statement_timeout = Some(bound);
        self
    }

    /// Records the lock history, kept `retention` long (at least 1 s, at most
    /// [`MAX_HISTORY_WITHIN`](crate::MAX_HISTORY_WITHIN)), in `<table>_events` (made by
    /// [`migrate`](Locker::migrate)), read with [`Locker::history`] or `dblock history`.
    /// Default: off.
    ///
    /// What is recorded, with the key, the owner value, the fencing token and the
    /// database clock's time: acquisitions ([`EventKind::Acquired`](crate::EventKind::Acquired)
    /// of a free key, [`EventKind::TakenOver`](crate::EventKind::TakenOver) of an expired
    /// row),
    /// releases (explicit, on drop, at the end of `with_lock`), handoffs to the next
    /// waiter, losses with their [`LostReason`](crate::LostReason), force-releases with
    /// the operator's name, a [`Job`](crate::Job)'s runs and skips, a schedule's periods,
    /// skips and overruns. A semaphore's permits, a read-write lock's reads and writes and
    /// a leader's terms are the acquisitions, releases and losses of their rows
    /// (`<name>~permit-<i>-of-<n>`, `<name>~read-..`, `<name>~write`, `<name>~leader`;
    /// [`LockEvent::row_kind`](crate::LockEvent::row_kind)).
    ///
    /// Off the caller's path: an event is noted in memory (no statement, no await), and
    /// one task of the Locker writes what was noted every
    /// [`HISTORY_FLUSH_INTERVAL`](crate::HISTORY_FLUSH_INTERVAL) (1 s) in one statement, up
    /// to [`HISTORY_BATCH`](crate::HISTORY_BATCH) events (more wait for the next tick);
    /// [`Locker::shutdown`] writes what is left. An event's time is the database clock's:
    /// the statement writes its clock's reading less the event's age by the process's
    /// monotonic clock (no client wall clock enters). While the database is away, events
    /// wait, up to [`HISTORY_BUFFER`](crate::HISTORY_BUFFER); newer ones are dropped and
    /// counted ([`Stats::history_dropped`](crate::Stats::history_dropped)).
    ///
    /// The lock table stays the truth; the history is a record of it, and may lack what
    /// a Locker had not written yet when its process ended without
    /// [`shutdown`](Locker::shutdown) (a crash, a kill, a Locker dropped): at most the
    /// events of its last second, or, with the database away, all it kept. A force-release
    /// by [`Locker::force_release_by`] is written at once, whatever this option says.
    ///
    /// Trimming is the reaper's ([`Locker::spawn_reaper`], [`Locker::reap_expired`]):
    /// each pass deletes up to its batch of events older than `retention`. Without a
    /// reaper nothing is trimmed.
    ///
    /// The Locker must be built inside a tokio runtime (the writer is a task of it).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// use std::time::Duration;
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let locker = dblock::Locker::builder(pool).history(week).build()?;
    /// assert!(locker.records_history());
    /// # Ok(()) }
    /// ```
    pub fn history(mut self, retention: Duration) -> Self {
        self.history = Some(retention);
        self
    }

    /// Checks every option and builds the locker. Nothing touches the database.
    pub fn build(self) -> Result<Locker<DB>> {
        if let Some(retention) = self.history {
            let (least, most) = (Duration::from_secs(1), crate::recorder::MAX_HISTORY_WITHIN);
            validate_range("history retention", retention, least, most)?;
        }
        let table = match (self.table, self.durability) {
            (Some(table), _) => table,
            (None, Durability::Relaxed) => DEFAULT_RELAXED_TABLE.to_owned(),
            (None, _) => DEFAULT_TABLE.to_owned(),
        };
        validate_table_name(&table, DB::REFUSED_QUALIFIED)?;
        if self.durability == Durability::Relaxed && table == DEFAULT_TABLE {
            return Err(Error::InvalidConfig(format!(
                "Durability::Relaxed needs a table of its own, not the durable default \
                 {DEFAULT_TABLE:?}: leave the table unset ({DEFAULT_RELAXED_TABLE:?}) or \
                 name another"
            )));
        }
        let owner_prefix = self.owner_prefix.unwrap_or_else(default_owner_prefix);
        validate_owner_prefix(&owner_prefix)?;
        self.retry.validate()?;
        let default_lease = self.default_lease.unwrap_or(DEFAULT_LEASE);
        validate_lease(default_lease)?;
        let renew_interval = self.renew_interval.unwrap_or(DEFAULT_RENEW_INTERVAL);
        validate_range("renew interval", renew_interval, MIN_LEASE, MAX_LEASE)?;
        // Only options the caller set can conflict: the default interval is capped per
        // lease (lease / 3) anyway, so a short default lease alone is fine.
        if let Some(interval) = self.renew_interval
            && interval > default_lease / 2
        {
            let lease = match self.default_lease {
                Some(lease) => format!("default_lease ({lease:?})"),
                None => format!("default_lease ({DEFAULT_LEASE:?}, the default)"),
            };
            return Err(Error::InvalidConfig(format!(
                "renew_interval ({interval:?}) must be at most half of {lease}: a lease must \
                 be renewed at least twice before it runs out; set a shorter renew_interval \
                 or a longer default_lease"
            )));
        }
        if let Some(fixed) = self.lease_margin
            && fixed > MAX_LEASE
        {
            return Err(Error::InvalidDuration {
                what: "lease margin",
                value: fixed,
                reason: format!("must be at most {MAX_LEASE:?}"),
            });
        }
        let margin = LeaseMargin {
            fixed: self.lease_margin,
        };
        let default_renew = self
            .auto_renew
            .then(|| renew_interval.min(default_lease / 3));
        if let Err(err) = margin.check(default_lease, default_renew) {
            return Err(Error::InvalidConfig(format!("default_lease: {err}")));
        }
        let statement_timeout = self
            .statement_timeout
            .unwrap_or(crate::config::DEFAULT_STATEMENT_TIMEOUT);
        validate_range(
            "statement timeout",
            statement_timeout,
            crate::config::MIN_STATEMENT_TIMEOUT,
            crate::config::MAX_STATEMENT_TIMEOUT,
        )?;
        let table = LockTable::new(self.pool, table, self.retry, self.durability)
            .with_statement_timeout(statement_timeout);
        Ok(Locker {
            core: Arc::new(Core::new(Settings {
                table,
                retry: self.retry,
                listen: Listen {
                    on: self.listen,
                    options: self.listener_options,
                },
                fair: self.fair,
                owner_prefix,
                default_lease,
                renew_interval,
                margin,
                key_label: self.key_label,
                history: self.history,
            })),
            auto_renew: self.auto_renew,
        })
    }
}

#[cfg(feature = "postgres")]
impl LockerBuilder<sqlx::Postgres> {
    /// Where the release listener connects (see [`listen`](LockerBuilder::listen)),
    /// instead of where the pool does. Give it when the pool goes through a transaction
    /// pooler: a direct address of the server (or a session-mode pooler), so that waiters
    /// in other processes are woken by releases rather than polling. Default: the pool's
    /// address, used only if it proves to be a session of its own.
    pub fn listener_options(mut self, options: sqlx::postgres::PgConnectOptions) -> Self {
        self.listener_options = Some(options);
        self
    }

    /// Whether the lock table's rows survive a server crash. Default:
    /// [`Durability::Durable`].
    ///
    /// [`Durability::Relaxed`] trades that for speed, as a Redis lock without persistence
    /// does: [`migrate`](Locker::migrate) creates the table `UNLOGGED` (default name
    /// [`DEFAULT_RELAXED_TABLE`]; never the durable default), so its rows write no
    /// write-ahead log and no commit waits for a disk flush. **A server crash or a
    /// failover loses every held lock**: crash recovery empties unlogged tables, and
    /// standbys never have their rows. Holders learn it at their next renewal, within
    /// one renewal interval of the server's return, as
    /// [`LostReason::Deleted`](crate::LostReason::Deleted); fencing tokens still never go
    /// backwards (the token sequence stays logged, and the first acquisition after every
    /// server start moves it 2^32 ahead, past any token that was handed out but not yet
    /// flushed), and [`LockGuard::assert_held`](crate::LockGuard::assert_held) still
    /// refuses a stale holder's writes. A clean restart empties nothing.
    ///
    /// [`migrate`](Locker::migrate) refuses ([`Error::InvalidConfig`]) a table made with
    /// the other durability, so durable and relaxed locks never share a table. PostgreSQL
    /// only: MySQL/MariaDB has no unlogged InnoDB table (its log flush,
    /// `innodb_flush_log_at_trx_commit`, is a server-wide setting), and SQLite's
    /// `synchronous = OFF` may corrupt the database file on a power loss, not only lose
    /// its last commits.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> dblock::Result<()> {
    /// use dblock::{Durability, Locker};
    ///
    /// let fast = Locker::builder(pool).durability(Durability::Relaxed).build()?;
    /// fast.migrate().await?; // creates distributed_lock_relaxed, UNLOGGED
    /// # Ok(()) }
    /// ```
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
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
            table: None,
            durability: Durability::Durable,
            owner_prefix: None,
            retry: RetryPolicy::default(),
            default_lease: None,
            renew_interval: None,
            lease_margin: None,
            auto_renew: true,
            listen: true,
            listener_options: None,
            fair: false,
            key_label: KeyLabel::Off,
            statement_timeout: None,
            history: None,
        }
    }

    /// The pool this locker runs on.
    pub fn pool(&self) -> &Pool<DB> {
        self.core.table.pool()
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        self.core.table.name()
    }

    /// The configured default lease ([`DEFAULT_LEASE`] unless the builder changed it).
    pub fn lease(&self) -> Duration {
        self.core.default_lease
    }

    /// How long before the database may see a lease of `lease` expire that this Locker
    /// ends it locally: `min(100 ms, lease / 10) + lease / 100` by default (see
    /// [`LockerBuilder::lease_margin`]). A guard's lease ends locally at the send time of
    /// the last statement that set its expiry plus `lease - lease_margin(lease)`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// use std::time::Duration;
    /// let locker = dblock::Locker::new(dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?);
    /// assert_eq!(locker.lease_margin(Duration::from_secs(10)), Duration::from_millis(200));
    /// assert_eq!(locker.lease_margin(Duration::from_millis(100)), Duration::from_millis(11));
    /// # Ok(()) }
    /// ```
    pub fn lease_margin(&self, lease: Duration) -> Duration {
        self.core.margin.of(lease)
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
        self.core.counters.snapshot()
    }

    /// How many callers of this locker (and its clones and owners) are waiting in
    /// [`acquire`](Self::acquire) for `key` right now. Waiters of one locker queue in
    /// arrival order: only the first sends attempts, and a release of the key through
    /// this locker hands it the turn at once.
    pub fn waiting(&self, key: &str) -> usize {
        self.core.queues.waiting(key)
    }

    /// Whether releases in other processes wake this locker's waiters at once right now
    /// (see [`LockerBuilder::listen`]): its listener is up and, on MySQL/MariaDB, hears
    /// the bells of every row its waiters wait for (it does not for a holder that took
    /// no bell: one that took the key before anyone waited, or a plain-SQL client).
    /// `false` until a waiter first has to sleep, while the listener reconnects, and
    /// always on an in-memory SQLite database, MariaDB Galera, or behind a transaction
    /// pooler.
    pub fn listening(&self) -> bool {
        self.core.listening()
    }

    /// How many leases this locker's engine is renewing right now.
    pub fn renewing(&self) -> usize {
        self.core.engine.renewing()
    }

    /// Stops this locker's lease engine and waits for it: renewal ends (every lease still
    /// held lapses at its deadline, and its guard's [`lost`](LockGuard::lost) then fires
    /// `Expired`), and background releases of dropped guards are finished (each retried
    /// until its lease would have ended anyway). Acquisitions after it are not renewed.
    /// The engine also stops by itself when the last clone of the locker and its last
    /// guard are dropped; call this to know that its work is done.
    ///
    /// # Cancel safety
    /// Cancel safe: the engine is told to stop at once; dropping the future only skips
    /// the wait.
    pub async fn shutdown(&self) {
        self.core.shutdown().await;
    }

    /// The SQL [`migrate`](Self::migrate) runs for this Locker's table, script by script
    /// in order, for teams that apply schema changes with their own tool (Flyway,
    /// Liquibase, sqlx-migrate) instead of calling `migrate` at start-up. Nothing is sent
    /// to the database. Apply every script, each as one unit (they are idempotent); a
    /// later dblock version may add scripts, which its release notes list. The scripts
    /// create the lock table, `<table>_ticket` (fair mode), and per backend a fencing
    /// sequence (`<table>_fencing_seq`, PostgreSQL), a counter table and triggers
    /// (`<table>_fencing`, MySQL/MariaDB and SQLite), on SQLite the waiters' marks
    /// (`<table>_waiter`) and their trigger, and for a relaxed table
    /// `<table>_epoch` and `<table>_new_epoch()`; `migrate` itself
    /// also keeps refinery's history in `<table>_history` (and on MySQL a
    /// `<table>_migrating` claim table), which an external tool does not need.
    /// `dblock migrate --print-sql` prints the same.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let locker = dblock::Locker::new(pool);
    /// for script in locker.migration_sql() {
    ///     println!("-- {}\n{}", script.name, script.sql);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn migration_sql(&self) -> Vec<MigrationScript> {
        self.core.table.migration_sql()
    }

    /// Creates or upgrades the lock table (refinery migrations, history in
    /// `<table>_history`). Safe to call from many processes at once: runs are serialized
    /// by a database lock, and a second run applies nothing. Returns how many migrations
    /// were applied. On MySQL/MariaDB that lock is `GET_LOCK` plus a claim row in
    /// `<table>_migrating`, which also holds across the nodes of a MariaDB Galera cluster
    /// (`GET_LOCK` is a node's own there); a run that died while holding the claim delays
    /// the others by at most a minute.
    ///
    /// # Cancel safety
    /// Dropping the future may leave a migration half-applied; every migration is written
    /// to be re-run, so call `migrate` again. The connection it used is closed, not
    /// returned to the pool, so no migration lock leaks.
    pub async fn migrate(&self) -> Result<usize> {
        self.core.table.migrate().await
    }

    /// One attempt to take `key` for `lease`, in one statement on PostgreSQL and MariaDB
    /// 10.5+, two on MySQL 8, MariaDB Galera and SQLite. Takes over a row whose lease has expired (by the database clock).
    /// `Ok(None)` when another owner holds a live lease, or lost the race in the same
    /// instant (duplicate key, deadlock, busy): losing is never an error.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidDuration`] (nothing is written), or
    /// [`Error::Database`]: the statement or its answer was lost. If the database did
    /// grant the lock, the row is deleted in the background as soon as the database can
    /// be reached again (trying until a statement timeout past the lease's end).
    ///
    /// Answers by the lease's end (at least 1 s after the send) whatever the network does:
    /// a database that does not answer by then is [`Error::PoolTimeout`] (no connection
    /// could be had; its `cause` says why) or [`Error::Database`] (a timed-out I/O error),
    /// and the statement cannot wait on the server past that moment either (README,
    /// "Connections").
    ///
    /// # Cancel safety
    /// Cancel safe. The statement runs on the caller's task; if this future is dropped
    /// while it is in flight, the lock engine lets it finish and releases a lock that the
    /// database granted at once, so no row is left held by nobody.
    pub async fn try_acquire(&self, key: &str, lease: Duration) -> Result<Option<LockGuard<DB>>> {
        validate_key(key)?;
        validate_lease(lease)?;
        let (owner, mut gate) = (self.core.new_owner(), None);
        // Boxed, as in `acquire`: each wrapper below would otherwise hold a copy of it.
        let attempt = Box::pin(self.attempt(key, &owner, lease, None, &mut gate));
        let lease = metrics::try_acquire(&self.core.metrics, Kind::Mutex, key, attempt).await?;
        Ok(lease.map(|lease| self.guard(lease)))
    }

    /// Takes `key` for `lease`, waiting up to `wait`, then fails with [`Error::Timeout`].
    /// `wait` of zero makes a single attempt. Database errors end the wait at once: an
    /// outage is not contention. Holds no pool connection while it sleeps. Answers within
    /// `wait` + [`WAIT_SLACK`](crate::WAIT_SLACK) (1 s) + 0.5 s even when the database does
    /// not answer: an attempt still in flight then is cut (it finishes in the background,
    /// removing what it won) and the wait ends with [`Error::Timeout`].
    ///
    /// Callers waiting for the same key through this locker queue in arrival order: only
    /// the first sends attempts, and a release of the key through this locker wakes it at
    /// once (see [`waiting`](Self::waiting)). On PostgreSQL a release elsewhere wakes it
    /// too, through the locker's listener ([`LockerBuilder::listen`]), and on
    /// MySQL/MariaDB a release whose holder rang a bell for it. Without a wake-up
    /// it sleeps until the holder's lease ends (database clock) or the next backoff
    /// delay ([`RetryPolicy`]: exponential, full jitter, capped) runs out, whichever is
    /// sooner. A [fair](LockerBuilder::fair) locker orders waiters of all processes by
    /// tickets instead.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire). A cancelled waiter leaves the
    /// queue at once (in fair mode its ticket is deleted in the background).
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard<DB>> {
        validate_acquire(key, lease, wait)?;
        let owner = self.core.new_owner();
        // A release of the key through this Locker may hand the row to this waiter in its
        // own statement, written for this lease.
        let offer = Terms {
            lease,
            renew: self.renew_every(lease),
        };
        // Boxed: the metrics wrapper and its span each hold the future they are given by
        // value, so an unboxed one is stored (and copied) once per layer.
        let won = Box::pin(acquire::wait_for(
            &self.core,
            key,
            wait,
            Some(offer),
            async |ticket| self.attempt(key, &owner, lease, ticket, &mut None).await,
        ));
        let won = metrics::acquire(&self.core.metrics, Kind::Mutex, key, wait, won).await?;
        Ok(self.guard(won))
    }

    /// Acquires `key` (waiting up to `wait`), runs `work` with the guard, and releases the
    /// lock whether `work` succeeded or not. Returns what `work` returned; `work`'s error
    /// type `E` takes dblock's errors through `From<dblock::Error>` (as with
    /// [`RowLocker::lock`](crate::RowLocker::lock)), so `dblock::Error` itself, or an
    /// application error with a `From` impl, both work.
    ///
    /// If the lease is lost while `work` runs, `work`'s future is dropped at its next
    /// await point and [`Error::LockLost`] carries the reason. After `work` succeeded, the
    /// release's own verdict counts: [`Error::LockLost`] (`Expired`) or
    /// [`Error::NotHeld`] mean the lease ended between `work`'s end and the release.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, whose lock is then released in the
    /// background (see [`LockGuard`]).
    pub async fn with_lock<T, E>(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
        work: impl AsyncFnOnce(&LockGuard<DB>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        let guard = self.acquire(key, lease, wait).await?;
        run_holding(guard, work).await
    }

    /// [`with_lock`](Self::with_lock) with a single attempt: `Ok(None)` when another owner
    /// holds `key` (not an error: someone else is doing the work), otherwise what `work`
    /// returned. The lease is renewed while `work` runs if the Locker renews, as with
    /// `with_lock`. For work
    /// that must run once per period across nodes, see [`job`](Self::job).
    ///
    /// # Cancel safety
    /// As [`with_lock`](Self::with_lock).
    pub async fn try_with_lock<T, E>(
        &self,
        key: &str,
        lease: Duration,
        work: impl AsyncFnOnce(&LockGuard<DB>) -> Result<T, E>,
    ) -> Result<Option<T>, E>
    where
        E: From<Error>,
    {
        match self.try_acquire(key, lease).await? {
            Some(guard) => run_holding(guard, work).await.map(Some),
            None => Ok(None),
        }
    }

    /// Who holds `key` now, or `None` when there is no row.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holder(&self, key: &str) -> Result<Option<Holder>> {
        validate_key(key)?;
        let row = self.core.table.inspect(key).await?;
        Ok(row.map(|row| Holder {
            owner: row.owner,
            fencing_token: row.fencing_token,
            acquired_at: row.acquired_at,
            expires_at: row.expires_at,
            expired: row.expired,
        }))
    }

    /// One acquisition attempt with an owner value chosen by the caller (validated input).
    ///
    /// The engine's future itself, not awaited in an async fn of its own (one state
    /// machine fewer to poll through and to copy).
    pub(crate) fn attempt<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        lease: Duration,
        ticket: Option<i64>,
        gate: &'a mut Gate,
    ) -> impl Future<Output = Result<Option<Arc<Lease>>>> + 'a {
        let renew = self.renew_every(lease);
        let request = Request {
            key,
            owner,
            lease,
            renew,
            ticket,
            beside: None,
        };
        acquire::attempt(&self.core, request, gate)
    }

    /// How often a lease of `lease` taken through this handle is renewed; `None`: never.
    pub(crate) fn renew_every(&self, lease: Duration) -> Option<Duration> {
        self.auto_renew
            .then(|| self.core.renew_interval.min(lease / 3))
    }

    /// A guard on a won lease.
    pub(crate) fn guard(&self, lease: Arc<Lease>) -> LockGuard<DB> {
        LockGuard::new(Arc::clone(&self.core), lease)
    }

    /// Deletes every expired row once, in batches of [`DEFAULT_REAP_BATCH`]; returns how
    /// many went. Live leases are never deleted; several reapers at once are safe (on
    /// PostgreSQL they skip rows another one is deleting). Between batches it pauses
    /// 39 times as long as the batch took (79 times on MySQL / MariaDB, whose purge
    /// deletes each row again after the commit), so other acquirers keep their pace: a
    /// backlog of 100,000 rows may take a minute or so (bench/RESULTS.md, section 6).
    /// A Locker that records history ([`LockerBuilder::history`]) also deletes up to
    /// [`DEFAULT_REAP_BATCH`] events older than its retention (not counted in the answer).
    ///
    /// # Cancel safety
    /// Cancel safe: each batch commits on its own; dropping the future stops between or
    /// during batches, and what was deleted stays deleted.
    pub async fn reap_expired(&self) -> Result<u64> {
        let retention = self.core.history.as_ref().map(|h| h.retention);
        reap_all(
            &self.core.table,
            &self.core.counters,
            (DEFAULT_REAP_BATCH, retention),
            None,
        )
        .await
    }

    /// Starts a background task that deletes expired rows every `config.interval`, in
    /// batches of `config.batch` (paced as [`reap_expired`](Self::reap_expired)). Errors
    /// are logged and the next pass tries again. A Locker that records history
    /// ([`LockerBuilder::history`]) also trims it each pass: one statement deletes up to
    /// `config.batch` events older than its retention.
    pub fn spawn_reaper(&self, config: ReaperConfig) -> Result<ReaperHandle> {
        crate::reaper::validate(&config)?;
        Ok(ReaperHandle::spawn(
            Arc::clone(&self.core.table),
            Arc::clone(&self.core.counters),
            config,
            self.core.history.as_ref().map(|h| h.retention),
        ))
    }
}

/// What [`run_holding`] needs of a guard: a [`LockGuard`], or an
/// [`AnyGuard`](crate::AnyGuard) over one, so that the work receives the guard type its
/// caller asked for while the hold-and-release logic stays in one place.
pub(crate) trait Held: Sized {
    /// The locked key.
    fn held_key(&self) -> &str;
    /// Completes with the reason when the lease is lost.
    fn on_lost(&self) -> impl Future<Output = crate::error::LostReason> + Send + '_;
    /// The guard's release.
    fn release_held(self) -> impl Future<Output = Result<()>> + Send;
}

impl<DB: Backend> Held for LockGuard<DB> {
    fn held_key(&self) -> &str {
        self.key()
    }

    fn on_lost(&self) -> impl Future<Output = crate::error::LostReason> + Send + '_ {
        self.lost()
    }

    fn release_held(self) -> impl Future<Output = Result<()>> + Send {
        self.release()
    }
}

/// Runs `work` while `guard` holds its lock, then releases it whether `work` succeeded
/// or not; a lost lease cancels `work` (see [`Locker::with_lock`]).
pub(crate) async fn run_holding<G: Held, T, E>(
    guard: G,
    work: impl AsyncFnOnce(&G) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<Error>,
{
    let key = guard.held_key().to_owned();
    let key = key.as_str();
    let outcome = tokio::select! {
        biased;
        reason = guard.on_lost() => Err(reason),
        output = work(&guard) => Ok(output),
    };
    match outcome {
        Ok(Ok(output)) => {
            guard.release_held().await?;
            Ok(output)
        }
        Ok(Err(err)) => {
            // The work's error is the one to report; the release still runs.
            if let Err(release) = guard.release_held().await {
                tracing::debug!(key, error = %release, "release after failed work");
            }
            Err(err)
        }
        Err(reason) => {
            // The row is no longer ours; this only stops renewal and tidies up.
            guard.release_held().await.ok();
            Err(Error::LockLost {
                key: key.to_owned(),
                reason,
            }
            .into())
        }
    }
}
