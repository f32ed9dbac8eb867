//! Operators' tools on a [`Locker`]: list the locks of a table, and clear a stuck one.
//! They read and delete rows whoever wrote them (this process, others, plain-SQL clients).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{MAX_KEY_BYTES, validate_key, validate_range};
use crate::dialect::{Backend, Listed};
use crate::error::{Error, Result};
use crate::locker::Locker;

/// Most rows one [`Locker::list`] call returns.
pub const MAX_LIST_LIMIT: u32 = 10_000;

/// The longest [`LockFilter::held_longer_than`]: a thousand years, older than any lock,
/// and far inside every backend's timestamp range (PostgreSQL's ends near 290,000 years).
pub const MAX_HELD_LONGER_THAN: Duration = Duration::from_secs(1000 * 366 * 24 * 3600);

/// One row of the lock table, as [`Locker::list`] read it. Times are the database's.
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
/// for info in locker.list("invoice:", 100).await? {
///     println!(
///         "{} held by {} (token {}) for {:?}, {:?} left, expired: {}",
///         info.key,
///         info.owner,
///         info.fencing_token,
///         info.held_for(),
///         info.expires_in(),
///         info.expired,
///     );
///     assert!(info.expires_in() <= Duration::from_secs(30)); // from the database clock
/// }
/// # guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key.
    pub key: String,
    /// The owner value (`lock_value`).
    pub owner: String,
    /// The fencing token of the acquisition that wrote the row.
    pub fencing_token: i64,
    /// When that acquisition wrote the row (a plain-SQL client's insert: the insert).
    pub acquired_at: DateTime<Utc>,
    /// When the lease ends (or ended).
    pub expires_at: DateTime<Utc>,
    /// Whether the lease has run out; the row stays until it is taken over or reaped.
    pub expired: bool,
    /// The database clock when the row was read: the "now" of [`held_for`](Self::held_for)
    /// and [`expires_in`](Self::expires_in), so no client clock enters them.
    pub read_at: DateTime<Utc>,
}

impl LockInfo {
    /// What the row is, from its key: `"semaphore"` (`<name>~permit-<i>-of-<n>`),
    /// `"read"` (`<name>~read-<id>`), `"write"` (`<name>~write`, `<name>~write-grant`),
    /// `"leader"` (`<name>~leader`), or `"mutex"` (any other key: a lock of
    /// [`Locker::try_acquire`], a job's, several keys' or a plain-SQL client's).
    pub fn kind(&self) -> &'static str {
        kind_of(&self.key)
    }

    /// How long the row had been held when it was read.
    pub fn held_for(&self) -> Duration {
        (self.read_at - self.acquired_at)
            .to_std()
            .unwrap_or_default()
    }

    /// How long the lease had left when it was read; zero once it has run out.
    pub fn expires_in(&self) -> Duration {
        (self.expires_at - self.read_at)
            .to_std()
            .unwrap_or_default()
    }
}

/// What the lock table knows of other Lockers' waiters for a page of keys
/// ([`Locker::waiters_elsewhere`]): the console's locks page shows it.
#[cfg(feature = "web")]
#[derive(Debug, Clone, Default)]
pub(crate) struct Waiters {
    /// Whether [`of`](Self::of) counts Lockers (SQLite, MySQL/MariaDB); `false`: it only
    /// says whether a waiter marked the row (PostgreSQL: 1 or 0).
    pub(crate) counted: bool,
    /// The keys with any, and how many.
    keys: std::collections::HashMap<String, u32>,
}

#[cfg(feature = "web")]
impl Waiters {
    /// How many other Lockers wait for `key` (where not [`counted`](Self::counted): 1 if
    /// a waiter marked its row, else 0).
    pub(crate) fn of(&self, key: &str) -> u32 {
        self.keys.get(key).copied().unwrap_or(0)
    }
}

impl From<Listed> for LockInfo {
    fn from(listed: Listed) -> Self {
        LockInfo {
            key: listed.key,
            owner: listed.row.owner,
            fencing_token: listed.row.fencing_token,
            acquired_at: listed.row.acquired_at,
            expires_at: listed.row.expires_at,
            expired: listed.row.expired,
            read_at: listed.read_at,
        }
    }
}

/// Which rows [`Locker::list_matching`] returns: keys with a prefix, optionally only the
/// expired ones or those held longer than some time (database clock), in key order.
///
/// # Default
/// Every key, expired or not, at most 100 rows.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::LockFilter;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let lease = Duration::from_secs(30);
/// let mut guards = Vec::new();
/// for key in ["job:a", "job:b", "invoice:42"] {
///     guards.push(locker.try_acquire(key, lease).await?.unwrap());
/// }
///
/// let jobs = locker.list_matching(&LockFilter::new().prefix("job:")).await?;
/// let keys: Vec<&str> = jobs.iter().map(|info| info.key.as_str()).collect();
/// assert_eq!(keys, ["job:a", "job:b"]); // in key order
///
/// // Every key, but only the expired rows: none here.
/// assert!(locker.list_matching(&LockFilter::new().expired_only()).await?.is_empty());
/// // Locks that may have leaked: held for more than an hour.
/// let old = LockFilter::new().held_longer_than(Duration::from_secs(3600)).limit(10);
/// assert!(locker.list_matching(&old).await?.is_empty());
/// # for guard in guards { guard.release().await?; }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockFilter {
    prefix: String,
    after: Option<String>,
    expired_only: bool,
    held_longer_than: Option<Duration>,
    limit: u32,
}

impl Default for LockFilter {
    fn default() -> Self {
        LockFilter {
            prefix: String::new(),
            after: None,
            expired_only: false,
            held_longer_than: None,
            limit: 100,
        }
    }
}

impl LockFilter {
    /// Every key (no prefix), at most 100 rows.
    pub fn new() -> Self {
        LockFilter::default()
    }

    /// Only keys that start with `prefix` (compared as bytes; empty: every key).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Only keys after `key` (exclusive, in the same byte order): pass the last key of a
    /// page to read the next one. With a prefix, both hold.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use dblock::LockFilter;
    ///
    /// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let locker = dblock::Locker::new(pool);
    /// # locker.migrate().await?;
    /// let mut guards = Vec::new();
    /// for key in ["job:a", "job:b", "job:c"] {
    ///     guards.push(locker.try_acquire(key, Duration::from_secs(30)).await?.unwrap());
    /// }
    /// let first = locker.list_matching(&LockFilter::new().prefix("job:").limit(2)).await?;
    /// let last = &first.last().unwrap().key; // "job:b"
    /// let next = locker
    ///     .list_matching(&LockFilter::new().prefix("job:").after(last.as_str()).limit(2))
    ///     .await?;
    /// assert_eq!(next.len(), 1);
    /// assert_eq!(next[0].key, "job:c");
    /// # for guard in guards { guard.release().await?; }
    /// # Ok(()) }
    /// ```
    pub fn after(mut self, key: impl Into<String>) -> Self {
        self.after = Some(key.into());
        self
    }

    /// Only rows whose lease has run out.
    pub fn expired_only(mut self) -> Self {
        self.expired_only = true;
        self
    }

    /// Only rows acquired at least `held` ago (at most [`MAX_HELD_LONGER_THAN`]): locks that may
    /// have leaked. Expired rows are listed too until they are reaped; add
    /// [`expired_only`](Self::expired_only) or read [`LockInfo::expired`].
    pub fn held_longer_than(mut self, held: Duration) -> Self {
        self.held_longer_than = Some(held);
        self
    }

    /// At most `limit` rows, between 1 and [`MAX_LIST_LIMIT`].
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.prefix.len() > MAX_KEY_BYTES || self.prefix.contains('\0') {
            // No key can have such a prefix; say why as for a key.
            validate_key(&self.prefix)?;
        }
        if let Some(after) = &self.after {
            // An empty `after` is a page before every key; any other must be a key.
            if !after.is_empty() {
                validate_key(after)?;
            }
        }
        if let Some(held) = self.held_longer_than {
            validate_range(
                "held_longer_than",
                held,
                Duration::ZERO,
                MAX_HELD_LONGER_THAN,
            )?;
        }
        if !(1..=MAX_LIST_LIMIT).contains(&self.limit) {
            return Err(Error::InvalidConfig(format!(
                "list limit {} must be between 1 and {MAX_LIST_LIMIT}",
                self.limit
            )));
        }
        Ok(())
    }
}

impl<DB: Backend> Locker<DB> {
    /// An operator's view: the rows whose key starts with `prefix` (empty: all), in key
    /// order (bytes), at most `limit` (1 to [`MAX_LIST_LIMIT`]). Lists every row of the
    /// table, whoever wrote it, expired ones too (see [`LockInfo::expired`]). On MySQL and
    /// SQLite the prefix is a range of the primary key; on PostgreSQL keys are compared
    /// as bytes whatever the database's collation, which filters the table instead.
    ///
    /// Errors: [`Error::InvalidKey`] for a prefix no key can have or an
    /// [`after`](LockFilter::after) that is no key, [`Error::InvalidConfig`] for a limit
    /// out of range, [`Error::InvalidDuration`] for a held time over
    /// [`MAX_HELD_LONGER_THAN`] (nothing is read).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self, prefix: &str, limit: u32) -> Result<Vec<LockInfo>> {
        self.list_matching(&LockFilter::new().prefix(prefix).limit(limit))
            .await
    }

    /// [`list`](Self::list) with more conditions: see [`LockFilter`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list_matching(&self, filter: &LockFilter) -> Result<Vec<LockInfo>> {
        filter.validate()?;
        let rows = self
            .core
            .table
            .list_after(
                &filter.prefix,
                filter.after.as_deref().filter(|after| !after.is_empty()),
                filter.held_longer_than,
                filter.expired_only.then_some(true),
                filter.limit,
            )
            .await?;
        Ok(rows.into_iter().map(LockInfo::from).collect())
    }

    /// For each of `keys`, the Lockers other than this one (of other processes, mostly)
    /// waiting for it, as the database knows them, in one statement: on SQLite the
    /// Lockers with a live mark on the key or its group, on MySQL/MariaDB the Lockers
    /// registered for its queue (at most two), on PostgreSQL only whether a waiter marked
    /// the row (see [`Waiters`]). Lockers, not callers; plain-SQL waiters leave no trace.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    #[cfg(feature = "web")]
    pub(crate) async fn waiters_elsewhere(&self, keys: &[&str]) -> Result<Waiters> {
        let registration = self.core.queues.own_registration();
        let keys = self.core.table.waiters(keys, registration).await?;
        Ok(Waiters {
            counted: DB::COUNTS_WAITERS,
            keys: keys.into_iter().collect(),
        })
    }

    /// An operator's tool: deletes the row of `key` whoever holds it; `true` if there was
    /// one. Use it for a lock whose holder is stuck or gone; the holder is not asked.
    ///
    /// What follows: a renewed holder's guard reports [`lost`](crate::LockGuard::lost)
    /// with [`LostReason::Deleted`](crate::LostReason::Deleted) at its Locker's next
    /// renewal (within one renewal interval), and its work under
    /// [`with_lock`](Self::with_lock) is cancelled. A guard that is not renewed
    /// ([`Locker::auto_renew`]`(false)`, and every [`job`](Self::job)) is not told: it
    /// learns at its release (`Error::NotHeld`), or its `lost()` fires `Expired` at its
    /// deadline, and a job's work runs on until then. This Locker's waiters for the key
    /// try at once, and on PostgreSQL waiters elsewhere are woken as by a release. The
    /// next acquisition's fencing token is still greater than the deleted row's, so a
    /// resource that checks tokens refuses the old holder's late writes.
    ///
    /// A Locker that records history ([`LockerBuilder::history`](crate::LockerBuilder::history))
    /// writes a [`ForceReleased`](crate::EventKind::ForceReleased) event with the operator
    /// `"unknown"`; [`force_release_by`](Self::force_release_by) names the operator, and
    /// writes the event whether or not the Locker records.
    ///
    /// Errors: [`Error::InvalidKey`] (nothing is deleted), [`Error::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: the row is deleted or it is not; dropping the future does not undo a
    /// delete the database already ran.
    pub async fn force_release(&self, key: &str) -> Result<bool> {
        if self.records_history() {
            // Recorded as an operator's action, by nobody named.
            return self.force_release_by(key, "unknown").await;
        }
        validate_key(key)?;
        let core = &self.core;
        let deleted = core.table.force_release(key).await?;
        if deleted {
            tracing::warn!(key, table = core.table.name(), "lock force-released");
            core.queues.released(key);
        }
        Ok(deleted)
    }
}

/// The kind of the row keyed `key` (see [`LockInfo::kind`]).
pub(crate) fn kind_of(key: &str) -> &'static str {
    let Some((_, part)) = key.rsplit_once(crate::queue::GROUP_MARK) else {
        return "mutex";
    };
    if part.starts_with("permit-") && part.contains("-of-") {
        "semaphore"
    } else if part.starts_with("read-") {
        "read"
    } else if part == "write" || part == "write-grant" {
        "write"
    } else if part == "leader" {
        "leader"
    } else {
        "mutex"
    }
}

#[cfg(test)]
mod kind_tests {
    use super::kind_of;

    #[test]
    fn rows_say_what_they_are() {
        assert_eq!(kind_of("exports~permit-0-of-3"), "semaphore");
        assert_eq!(kind_of("catalog~read-0123456789abcdef"), "read");
        assert_eq!(kind_of("catalog~write"), "write");
        assert_eq!(kind_of("catalog~write-grant"), "write");
        assert_eq!(kind_of("scheduler~leader"), "leader");
        assert_eq!(kind_of("invoice:42"), "mutex");
        assert_eq!(kind_of("a~b"), "mutex");
    }
}
