//! [`AnyLocker`]: a [`Locker`] whose database is chosen at run time, from a URL (SQLite in
//! development, PostgreSQL in production), with the same calls. An enum over the
//! `Locker<DB>` of each compiled-in backend; every call matches the variant once (the
//! private `dispatch!` below) and hands it to that Locker, so no lock logic lives here.

mod builder;
mod election;
mod guard;
mod held;
mod job;
mod multi;
mod rwlock;
mod schedule;
mod semaphore;
mod tx;

use std::time::Duration;

#[cfg(feature = "web")]
use crate::admin::Waiters;
use crate::admin::{LockFilter, LockInfo};
use crate::error::{Error, Result};
use crate::history::{HistoryFilter, LockEvent};
use crate::locker::{Holder, Locker, run_holding};
use crate::migrate::MigrationScript;
use crate::reaper::{ReaperConfig, ReaperHandle};
use crate::stats::Stats;

pub use builder::{AnyLockerBuilder, DEFAULT_ANY_MAX_CONNECTIONS};
pub use election::{AnyElection, AnyLeadership};
pub use guard::AnyGuard;
pub use job::AnyJob;
pub use multi::AnyMultiGuard;
pub use rwlock::{AnyReadGuard, AnyRwLock, AnyWriteGuard};
pub use schedule::AnySchedule;
pub use semaphore::{AnyPermit, AnySemaphore};
pub use tx::AnyTransaction;

/// Runs `$body` with `$x` bound to the inner value of whichever variant `$value` is
/// (`dispatch!(self, AnyLocker, locker => locker.table())`); with `map`, wraps the
/// result back into the same variant of `$enum`; with `into`, into the same variant of
/// another enum (`dispatch!(into self, AnyLocker => SemaphoreOf, locker => ..)`). The one
/// place that lists the variants, so a backend's feature gate is written once per enum.
macro_rules! dispatch {
    ($value:expr, $enum:ident, $x:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "postgres")]
            $enum::Postgres($x) => $body,
            #[cfg(feature = "mysql")]
            $enum::MySql($x) => $body,
            #[cfg(feature = "sqlite")]
            $enum::Sqlite($x) => $body,
        }
    };
    (map $value:expr, $enum:ident, $x:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "postgres")]
            $enum::Postgres($x) => $enum::Postgres($body),
            #[cfg(feature = "mysql")]
            $enum::MySql($x) => $enum::MySql($body),
            #[cfg(feature = "sqlite")]
            $enum::Sqlite($x) => $enum::Sqlite($body),
        }
    };
    (into $value:expr, $enum:ident => $into:ident, $x:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "postgres")]
            $enum::Postgres($x) => $into::Postgres($body),
            #[cfg(feature = "mysql")]
            $enum::MySql($x) => $into::MySql($body),
            #[cfg(feature = "sqlite")]
            $enum::Sqlite($x) => $into::Sqlite($body),
        }
    };
}
use dispatch;

/// A [`Locker`] on whichever database a URL names, chosen at run time: build it with
/// [`AnyLocker::connect`] (or [`AnyLocker::builder`] for options), or from a `Locker`
/// you built yourself (`AnyLocker::from(locker)`).
///
/// It has the `Locker`'s calls, with the same defaults, errors and cancel safety (each
/// method's documentation is the `Locker` method's it names), each answering with an
/// Any type over the backend's: mutexes ([`AnyGuard`]), jobs ([`AnyJob`]), schedules
/// ([`AnySchedule`]), semaphores ([`AnySemaphore`]), read-write locks ([`AnyRwLock`]),
/// elections ([`AnyElection`]), several keys at once ([`AnyMultiGuard`]), and fencing in
/// a transaction of your own ([`AnyLocker::begin`], an [`AnyTransaction`], and every Any
/// guard's `assert_held` and `commit`), so code that takes the URL from configuration
/// needs no `match` and no sqlx bounds. What is left (reentrant owners, PostgreSQL's
/// options) is the backend's own `Locker`: match the variant. A variant exists only
/// with its cargo feature (`postgres`, `mysql`, `sqlite`), hence `#[non_exhaustive]`.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::AnyLocker;
///
/// // From configuration: "postgres://...", "mysql://...", or a SQLite file or memory.
/// let url = std::env::var("LOCK_DATABASE_URL").unwrap_or("sqlite::memory:".into());
/// let locker = AnyLocker::connect(&url).await?;
/// locker.migrate().await?;
///
/// let lease = Duration::from_secs(30);
/// let guard = locker.try_acquire("invoice:42", lease).await?.expect("nobody holds it");
/// assert!(locker.try_acquire("invoice:42", lease).await?.is_none());
/// guard.release().await?;
///
/// let token = locker
///     .with_lock("invoice:42", lease, Duration::from_secs(5), async |guard| {
///         Ok::<_, dblock::Error>(guard.fencing_token())
///     })
///     .await?;
/// assert!(token > 0);
///
/// // The other primitives, with no match on the backend.
/// let exports = locker.semaphore("exports", 2);
/// let permit = exports.try_acquire(lease).await?.expect("a free permit");
/// let leading = locker.election("relay").campaign("node-1", lease).await?;
/// let mut tx = locker.begin().await?;
/// leading.assert_held(&mut tx).await?; // fenced by the leader's term
/// leading.commit(tx).await?;
/// leading.resign().await?;
/// permit.release().await?;
///
/// // What AnyLocker does not wrap (a reentrant owner), the backend's own Locker has.
/// if let AnyLocker::Sqlite(sqlite) = &locker {
///     let owner = sqlite.owner();
///     owner.try_acquire("nested", lease).await?.expect("free").release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyLocker {
    /// PostgreSQL (`postgres://`, `postgresql://`).
    #[cfg(feature = "postgres")]
    Postgres(Locker<sqlx::Postgres>),
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    #[cfg(feature = "mysql")]
    MySql(Locker<sqlx::MySql>),
    /// SQLite (`sqlite:`).
    #[cfg(feature = "sqlite")]
    Sqlite(Locker<sqlx::Sqlite>),
}

#[cfg(feature = "postgres")]
impl From<Locker<sqlx::Postgres>> for AnyLocker {
    fn from(locker: Locker<sqlx::Postgres>) -> Self {
        AnyLocker::Postgres(locker)
    }
}

#[cfg(feature = "mysql")]
impl From<Locker<sqlx::MySql>> for AnyLocker {
    fn from(locker: Locker<sqlx::MySql>) -> Self {
        AnyLocker::MySql(locker)
    }
}

#[cfg(feature = "sqlite")]
impl From<Locker<sqlx::Sqlite>> for AnyLocker {
    fn from(locker: Locker<sqlx::Sqlite>) -> Self {
        AnyLocker::Sqlite(locker)
    }
}

impl AnyLocker {
    /// Connects to the database `url` names, with default options (as [`Locker::new`]):
    /// `postgres://` or `postgresql://`, `mysql://` or `mariadb://`, `sqlite:` (the
    /// scheme in any case; the rest as sqlx reads it). Shorthand for
    /// `AnyLocker::builder(url).connect()`, whose documentation says what is checked
    /// and which errors come back.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written; a dropped future leaves at most a pool that
    /// closes when dropped.
    pub async fn connect(url: &str) -> Result<AnyLocker> {
        Self::builder(url).connect().await
    }

    /// Options for a locker on the database `url` names; see [`AnyLockerBuilder`].
    pub fn builder(url: &str) -> AnyLockerBuilder {
        AnyLockerBuilder::new(url)
    }

    /// The database's name as sqlx gives it: `"PostgreSQL"`, `"MySQL"` (also for
    /// MariaDB) or `"SQLite"`.
    pub fn backend(&self) -> &'static str {
        fn name<DB: crate::dialect::Backend>(_: &Locker<DB>) -> &'static str {
            <DB as sqlx::Database>::NAME
        }
        dispatch!(self, AnyLocker, locker => name(locker))
    }

    /// [`Locker::table`].
    pub fn table(&self) -> &str {
        dispatch!(self, AnyLocker, locker => locker.table())
    }

    /// [`Locker::lease`].
    pub fn lease(&self) -> Duration {
        dispatch!(self, AnyLocker, locker => locker.lease())
    }

    /// [`Locker::lease_margin`].
    pub fn lease_margin(&self, lease: Duration) -> Duration {
        dispatch!(self, AnyLocker, locker => locker.lease_margin(lease))
    }

    /// [`Locker::auto_renew`].
    pub fn auto_renew(&self, on: bool) -> AnyLocker {
        dispatch!(map self, AnyLocker, locker => locker.auto_renew(on))
    }

    /// [`Locker::stats`].
    pub fn stats(&self) -> Stats {
        dispatch!(self, AnyLocker, locker => locker.stats())
    }

    /// [`Locker::waiting`].
    pub fn waiting(&self, key: &str) -> usize {
        dispatch!(self, AnyLocker, locker => locker.waiting(key))
    }

    /// [`Locker::listening`].
    pub fn listening(&self) -> bool {
        dispatch!(self, AnyLocker, locker => locker.listening())
    }

    /// [`Locker::renewing`].
    pub fn renewing(&self) -> usize {
        dispatch!(self, AnyLocker, locker => locker.renewing())
    }

    /// [`Locker::shutdown`].
    ///
    /// # Cancel safety
    /// As [`Locker::shutdown`]: cancel safe.
    pub async fn shutdown(&self) {
        dispatch!(self, AnyLocker, locker => locker.shutdown().await)
    }

    /// [`Locker::migration_sql`]: the SQL of this locker's database.
    pub fn migration_sql(&self) -> Vec<MigrationScript> {
        dispatch!(self, AnyLocker, locker => locker.migration_sql())
    }

    /// [`Locker::migrate`].
    ///
    /// # Cancel safety
    /// As [`Locker::migrate`]: a dropped run may leave a migration half-applied; call
    /// `migrate` again.
    pub async fn migrate(&self) -> Result<usize> {
        dispatch!(self, AnyLocker, locker => locker.migrate().await)
    }

    /// [`Locker::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_acquire`]: cancel safe.
    pub async fn try_acquire(&self, key: &str, lease: Duration) -> Result<Option<AnyGuard>> {
        dispatch!(self, AnyLocker, locker => {
            Ok(locker.try_acquire(key, lease).await?.map(AnyGuard::from))
        })
    }

    /// [`Locker::acquire`]: waits up to `wait`, then [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`]: cancel safe.
    pub async fn acquire(&self, key: &str, lease: Duration, wait: Duration) -> Result<AnyGuard> {
        dispatch!(self, AnyLocker, locker => {
            locker.acquire(key, lease, wait).await.map(AnyGuard::from)
        })
    }

    /// [`Locker::with_lock`], `work` receiving the [`AnyGuard`].
    ///
    /// # Cancel safety
    /// As [`Locker::with_lock`]: dropping the future drops `work` and the guard, whose
    /// lock is then released in the background.
    pub async fn with_lock<T, E>(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
        work: impl AsyncFnOnce(&AnyGuard) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<Error>,
    {
        let guard = self.acquire(key, lease, wait).await?;
        run_holding(guard, work).await
    }

    /// [`Locker::try_with_lock`], `work` receiving the [`AnyGuard`].
    ///
    /// # Cancel safety
    /// As [`Locker::with_lock`].
    pub async fn try_with_lock<T, E>(
        &self,
        key: &str,
        lease: Duration,
        work: impl AsyncFnOnce(&AnyGuard) -> Result<T, E>,
    ) -> Result<Option<T>, E>
    where
        E: From<Error>,
    {
        match self.try_acquire(key, lease).await? {
            Some(guard) => run_holding(guard, work).await.map(Some),
            None => Ok(None),
        }
    }

    /// [`Locker::job`]: a scheduled job's lock, run with [`AnyJob::run`].
    pub fn job(&self, key: &str) -> AnyJob<'_> {
        AnyJob::new(self, key)
    }

    /// [`Locker::holder`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holder(&self, key: &str) -> Result<Option<Holder>> {
        dispatch!(self, AnyLocker, locker => locker.holder(key).await)
    }

    /// [`Locker::list`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self, prefix: &str, limit: u32) -> Result<Vec<LockInfo>> {
        dispatch!(self, AnyLocker, locker => locker.list(prefix, limit).await)
    }

    /// [`Locker::list_matching`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list_matching(&self, filter: &LockFilter) -> Result<Vec<LockInfo>> {
        dispatch!(self, AnyLocker, locker => locker.list_matching(filter).await)
    }

    /// [`Locker::waiters_elsewhere`]: the console's locks page.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    #[cfg(feature = "web")]
    pub(crate) async fn waiters_elsewhere(&self, keys: &[&str]) -> Result<Waiters> {
        dispatch!(self, AnyLocker, locker => locker.waiters_elsewhere(keys).await)
    }

    /// [`Locker::force_release`].
    ///
    /// # Cancel safety
    /// As [`Locker::force_release`]: the row was deleted or it was not.
    pub async fn force_release(&self, key: &str) -> Result<bool> {
        dispatch!(self, AnyLocker, locker => locker.force_release(key).await)
    }

    /// [`Locker::force_release_by`].
    ///
    /// # Cancel safety
    /// As [`Locker::force_release_by`]: the row was deleted or it was not; dropped after
    /// the delete, the event may not be written.
    pub async fn force_release_by(&self, key: &str, operator: &str) -> Result<bool> {
        dispatch!(self, AnyLocker, locker => locker.force_release_by(key, operator).await)
    }

    /// [`Locker::history`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn history(&self, filter: &HistoryFilter) -> Result<Vec<LockEvent>> {
        dispatch!(self, AnyLocker, locker => locker.history(filter).await)
    }

    /// [`Locker::records_history`].
    pub fn records_history(&self) -> bool {
        dispatch!(self, AnyLocker, locker => locker.records_history())
    }

    /// [`Locker::reap_expired`].
    ///
    /// # Cancel safety
    /// As [`Locker::reap_expired`]: each batch commits on its own.
    pub async fn reap_expired(&self) -> Result<u64> {
        dispatch!(self, AnyLocker, locker => locker.reap_expired().await)
    }

    /// [`Locker::spawn_reaper`].
    pub fn spawn_reaper(&self, config: ReaperConfig) -> Result<ReaperHandle> {
        dispatch!(self, AnyLocker, locker => locker.spawn_reaper(config))
    }
}
