//! [`AnyGuard`]: the guard of an [`AnyLocker`](crate::AnyLocker), an enum over the
//! backend's [`LockGuard`]; every method is the `LockGuard`'s.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::held::{take_tx, tx_of};
use super::{AnyTransaction, dispatch};
use crate::error::{Error, LostReason, Result};
use crate::guard::LockGuard;
use crate::locker::Held;

/// A lock held through an [`AnyLocker`](crate::AnyLocker): the backend's [`LockGuard`],
/// with the same methods, renewal and drop behaviour (see [`LockGuard`]), including the
/// fencing of writes in an [`AnyTransaction`] ([`assert_held`](Self::assert_held),
/// [`commit`](Self::commit)). Match the variant for the backend's guard itself.
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
/// let mut tx = locker.begin().await?;
/// guard.assert_held(&mut tx).await?; // the protected writes go in `tx`
/// guard.commit(tx).await?;
/// if let AnyGuard::Sqlite(sqlite) = &guard {
///     // The backend's own guard.
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

    /// [`LockGuard::assert_held`] in `tx`: `Ok` if the row is still this guard's,
    /// locking it until `tx` ends; [`Error::NotHeld`](crate::Error::NotHeld) if not
    /// (then roll `tx` back). [`Error::InvalidConfig`](crate::Error::InvalidConfig) if
    /// `tx` is another database's (nothing is sent).
    ///
    /// # Cancel safety
    /// As [`LockGuard::assert_held`]: a dropped check leaves `tx` to its owner, who
    /// should roll it back.
    pub async fn assert_held(&self, tx: &mut AnyTransaction) -> Result<()> {
        dispatch!(self, AnyGuard, guard => guard.assert_held(tx_of(tx)?).await)
    }

    /// [`LockGuard::commit`]: commits `tx`, reading a conflict rollback as
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lock is gone.
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) if `tx` is another
    /// database's (it is rolled back).
    ///
    /// # Cancel safety
    /// As [`LockGuard::commit`]: dropped before the answer, the transaction may or may
    /// not have committed.
    pub async fn commit(&self, tx: AnyTransaction) -> Result<()> {
        dispatch!(self, AnyGuard, guard => guard.commit(take_tx(tx)?).await)
    }

    /// [`LockGuard::explain`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn explain(&self, err: sqlx::Error) -> Error {
        dispatch!(self, AnyGuard, guard => guard.explain(err).await)
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
