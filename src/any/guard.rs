//! [`AnyGuard`]: the guard of an [`AnyLocker`](crate::AnyLocker), an enum over the
//! backend's [`LockGuard`]; every method is the `LockGuard`'s.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::dispatch;
use crate::error::{LostReason, Result};
use crate::guard::LockGuard;
use crate::locker::Held;

/// A lock held through an [`AnyLocker`](crate::AnyLocker): the backend's [`LockGuard`],
/// with the same methods, renewal and drop behaviour (see [`LockGuard`]). Match the
/// variant for what only the backend's guard has, such as
/// [`LockGuard::assert_held`] in a transaction of that database.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::{AnyGuard, AnyLocker};
///
/// let locker = AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let guard = locker.acquire("invoice:42", Duration::from_secs(30), Duration::from_secs(5)).await?;
/// println!("{} held by {} with token {}", guard.key(), guard.owner(), guard.fencing_token());
/// assert_eq!(guard.lost_reason(), None);
///
/// if let AnyGuard::Sqlite(sqlite) = &guard {
///     // The backend's own guard: `assert_held` in a SQLite transaction, for example.
///     assert_eq!(sqlite.key(), "invoice:42");
/// }
/// guard.release().await?; // Ok only if the lease was still live
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped; keep it and call release().await"]
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyGuard {
    /// A PostgreSQL lock.
    #[cfg(feature = "postgres")]
    Postgres(LockGuard<sqlx::Postgres>),
    /// A MySQL / MariaDB lock.
    #[cfg(feature = "mysql")]
    MySql(LockGuard<sqlx::MySql>),
    /// A SQLite lock.
    #[cfg(feature = "sqlite")]
    Sqlite(LockGuard<sqlx::Sqlite>),
}

#[cfg(feature = "postgres")]
impl From<LockGuard<sqlx::Postgres>> for AnyGuard {
    fn from(guard: LockGuard<sqlx::Postgres>) -> Self {
        AnyGuard::Postgres(guard)
    }
}

#[cfg(feature = "mysql")]
impl From<LockGuard<sqlx::MySql>> for AnyGuard {
    fn from(guard: LockGuard<sqlx::MySql>) -> Self {
        AnyGuard::MySql(guard)
    }
}

#[cfg(feature = "sqlite")]
impl From<LockGuard<sqlx::Sqlite>> for AnyGuard {
    fn from(guard: LockGuard<sqlx::Sqlite>) -> Self {
        AnyGuard::Sqlite(guard)
    }
}

impl AnyGuard {
    /// [`LockGuard::key`].
    pub fn key(&self) -> &str {
        dispatch!(self, AnyGuard, guard => guard.key())
    }

    /// [`LockGuard::owner`].
    pub fn owner(&self) -> &str {
        dispatch!(self, AnyGuard, guard => guard.owner())
    }

    /// [`LockGuard::fencing_token`].
    pub fn fencing_token(&self) -> i64 {
        dispatch!(self, AnyGuard, guard => guard.fencing_token())
    }

    /// [`LockGuard::expires_at`] (database clock).
    pub fn expires_at(&self) -> DateTime<Utc> {
        dispatch!(self, AnyGuard, guard => guard.expires_at())
    }

    /// [`LockGuard::ticket`].
    pub fn ticket(&self) -> Option<i64> {
        dispatch!(self, AnyGuard, guard => guard.ticket())
    }

    /// [`LockGuard::lost_reason`].
    pub fn lost_reason(&self) -> Option<LostReason> {
        dispatch!(self, AnyGuard, guard => guard.lost_reason())
    }

    /// [`LockGuard::ensure_held`]: a local check, no statement.
    pub fn ensure_held(&self) -> Result<()> {
        dispatch!(self, AnyGuard, guard => guard.ensure_held())
    }

    /// [`LockGuard::remaining`]: the lease left by this process's clock.
    pub fn remaining(&self) -> Duration {
        dispatch!(self, AnyGuard, guard => guard.remaining())
    }

    /// [`LockGuard::lost`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> LostReason {
        dispatch!(self, AnyGuard, guard => guard.lost().await)
    }

    /// [`LockGuard::extend`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::extend`]: the lease was either extended or left as it was.
    pub async fn extend(&self, lease: Duration) -> Result<DateTime<Utc>> {
        dispatch!(self, AnyGuard, guard => guard.extend(lease).await)
    }

    /// [`LockGuard::release`]: [`Error::NotHeld`](crate::Error::NotHeld) when the row is
    /// no longer ours.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`]: a dropped future's release finishes in the background.
    pub async fn release(self) -> Result<()> {
        dispatch!(self, AnyGuard, guard => guard.release().await)
    }
}

impl Held for AnyGuard {
    fn held_key(&self) -> &str {
        self.key()
    }

    fn on_lost(&self) -> impl Future<Output = LostReason> + Send + '_ {
        self.lost()
    }

    fn release_held(self) -> impl Future<Output = Result<()>> + Send {
        self.release()
    }
}
