//! [`AnyRwLock`] and its guards: the backend's [`RwLock`], [`ReadGuard`] and
//! [`WriteGuard`] through an [`AnyLocker`].

use std::time::Duration;

use super::held::{any_from, lease_methods, row_methods};
use super::{AnyLocker, dispatch};
use crate::error::Result;
use crate::rwlock::{ReadGuard, RwLock, WriteGuard};

/// Any number of readers or one writer, across processes, writers first: the backend's
/// [`RwLock`], made by [`AnyLocker::rw_lock`], with the same rows, waiting, errors and
/// cancel safety (each method's documentation is the `RwLock` method's it names).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let prices = locker.rw_lock("price-list");
/// let lease = Duration::from_secs(30);
/// let (a, b) = (prices.try_read(lease).await?, prices.try_read(lease).await?);
/// assert!(a.is_some() && b.is_some()); // readers share
/// assert!(prices.try_write(lease).await?.is_none()); // a writer waits for them
/// a.unwrap().release().await?;
/// b.unwrap().release().await?;
/// let write = prices.write(lease, Duration::from_secs(5)).await?;
/// assert!(prices.try_read(lease).await?.is_none()); // and excludes them
/// write.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AnyRwLock(RwLockOf);

#[derive(Debug, Clone)]
enum RwLockOf {
    #[cfg(feature = "postgres")]
    Postgres(RwLock<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(RwLock<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(RwLock<sqlx::Sqlite>),
}

/// A held read of an [`AnyRwLock`]: the backend's [`ReadGuard`], with the same lease,
/// fencing and drop behaviour.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let read = locker.rw_lock("config").read(Duration::from_secs(30), Duration::from_secs(5)).await?;
/// assert!(read.key().starts_with("config~read-"));
/// read.ensure_held()?;
/// read.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the read is released as soon as it is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct AnyReadGuard(ReadOf);

#[derive(Debug)]
enum ReadOf {
    #[cfg(feature = "postgres")]
    Postgres(ReadGuard<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(ReadGuard<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(ReadGuard<sqlx::Sqlite>),
}

/// A held write of an [`AnyRwLock`]: the backend's [`WriteGuard`]. Its
/// [`fencing_token`](Self::fencing_token) is the grant row's, above every earlier
/// reader's and writer's; [`lost`](Self::lost), [`lost_reason`](Self::lost_reason),
/// [`ensure_held`](Self::ensure_held) and [`remaining`](Self::remaining) watch both of
/// its rows; the row calls (`key`, `assert_held`, `commit`, ...) are the grant row's, as
/// the `WriteGuard`'s deref gives them.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let write = locker.rw_lock("config").try_write(Duration::from_secs(30)).await?.unwrap();
/// assert_eq!(write.key(), "config~write-grant");
/// let mut tx = locker.begin().await?;
/// write.assert_held(&mut tx).await?;
/// write.commit(tx).await?;
/// write.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the write is released as soon as it is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct AnyWriteGuard(WriteOf);

#[derive(Debug)]
enum WriteOf {
    #[cfg(feature = "postgres")]
    Postgres(WriteGuard<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(WriteGuard<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(WriteGuard<sqlx::Sqlite>),
}

any_from!(AnyReadGuard, ReadOf, ReadGuard);
any_from!(AnyWriteGuard, WriteOf, WriteGuard);

impl AnyLocker {
    /// [`Locker::rw_lock`](crate::Locker::rw_lock): the read-write lock `name`. Touches
    /// no database.
    pub fn rw_lock(&self, name: &str) -> AnyRwLock {
        AnyRwLock(dispatch!(into self, AnyLocker => RwLockOf, locker => locker.rw_lock(name)))
    }
}

impl AnyRwLock {
    /// [`RwLock::name`].
    pub fn name(&self) -> &str {
        dispatch!(&self.0, RwLockOf, lock => lock.name())
    }

    /// [`RwLock::try_read`]: `Ok(None)` while a writer holds or waits.
    ///
    /// # Cancel safety
    /// As [`RwLock::try_read`]: cancel safe.
    pub async fn try_read(&self, lease: Duration) -> Result<Option<AnyReadGuard>> {
        dispatch!(&self.0, RwLockOf, lock => {
            Ok(lock.try_read(lease).await?.map(AnyReadGuard::from))
        })
    }

    /// [`RwLock::read`]: waits up to `wait`, then [`Error::Timeout`](crate::Error::Timeout).
    ///
    /// # Cancel safety
    /// As [`RwLock::read`]: cancel safe.
    pub async fn read(&self, lease: Duration, wait: Duration) -> Result<AnyReadGuard> {
        dispatch!(&self.0, RwLockOf, lock => {
            lock.read(lease, wait).await.map(AnyReadGuard::from)
        })
    }

    /// [`RwLock::try_write`]: `Ok(None)` while a reader or another writer holds.
    ///
    /// # Cancel safety
    /// As [`RwLock::try_write`]: cancel safe.
    pub async fn try_write(&self, lease: Duration) -> Result<Option<AnyWriteGuard>> {
        dispatch!(&self.0, RwLockOf, lock => {
            Ok(lock.try_write(lease).await?.map(AnyWriteGuard::from))
        })
    }

    /// [`RwLock::write`]: waits up to `wait`, then [`Error::Timeout`](crate::Error::Timeout).
    ///
    /// # Cancel safety
    /// As [`RwLock::write`]: cancel safe.
    pub async fn write(&self, lease: Duration, wait: Duration) -> Result<AnyWriteGuard> {
        dispatch!(&self.0, RwLockOf, lock => {
            lock.write(lease, wait).await.map(AnyWriteGuard::from)
        })
    }
}

impl AnyReadGuard {
    lease_methods!(ReadOf, "LockGuard");
    row_methods!(ReadOf);

    /// [`ReadGuard::release`].
    ///
    /// # Cancel safety
    /// As [`ReadGuard::release`]: a dropped future's release finishes in the background.
    pub async fn release(self) -> Result<()> {
        dispatch!(self.0, ReadOf, read => read.release().await)
    }
}

impl AnyWriteGuard {
    lease_methods!(WriteOf, "WriteGuard");
    row_methods!(WriteOf);

    /// [`WriteGuard::release`]: both rows, in one statement.
    ///
    /// # Cancel safety
    /// As [`WriteGuard::release`]: a dropped future's release finishes in the background.
    pub async fn release(self) -> Result<()> {
        dispatch!(self.0, WriteOf, write => write.release().await)
    }
}
