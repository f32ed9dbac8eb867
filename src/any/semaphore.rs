//! [`AnySemaphore`] and its [`AnyPermit`]: the backend's [`Semaphore`] and [`Permit`]
//! through an [`AnyLocker`].

use std::time::Duration;

use super::held::{any_from, lease_methods, row_methods};
use super::{AnyLocker, dispatch};
use crate::admin::LockInfo;
use crate::error::Result;
use crate::semaphore::{Permit, Semaphore};

/// Up to `permits` holders of one name at once, across processes: the backend's
/// [`Semaphore`], made by [`AnyLocker::semaphore`], with the same rows, waiting, errors
/// and cancel safety (each method's documentation is the `Semaphore` method's it names).
/// Permits are [`AnyPermit`]s.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// // At most two exports at a time, across every replica of the service.
/// let exports = locker.semaphore("exports", 2);
/// let lease = Duration::from_secs(30);
/// let first = exports.try_acquire(lease).await?.expect("2 free");
/// let second = exports.acquire(lease, Duration::from_secs(5)).await?;
/// assert!(exports.try_acquire(lease).await?.is_none()); // both permits are out
/// assert_eq!(exports.available().await?, 0);
/// first.release().await?;
/// second.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AnySemaphore(SemaphoreOf);

#[derive(Debug, Clone)]
enum SemaphoreOf {
    #[cfg(feature = "postgres")]
    Postgres(Semaphore<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Semaphore<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Semaphore<sqlx::Sqlite>),
}

/// A held permit of an [`AnySemaphore`]: the backend's [`Permit`], with the same lease,
/// renewal, fencing and drop behaviour (a dropped permit is released in the
/// background). Fence writes with [`assert_held`](Self::assert_held) and
/// [`commit`](Self::commit) in an [`AnyTransaction`](crate::AnyTransaction).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let calls = locker.semaphore("partner-api", 3);
/// let permit = calls.try_acquire(Duration::from_secs(10)).await?.expect("free");
/// assert!(permit.number() < 3);
/// assert_eq!(permit.key(), format!("partner-api~permit-{}-of-3", permit.number()));
/// permit.ensure_held()?;
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the permit is released as soon as it is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct AnyPermit(PermitOf);

#[derive(Debug)]
enum PermitOf {
    #[cfg(feature = "postgres")]
    Postgres(Permit<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Permit<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Permit<sqlx::Sqlite>),
}

any_from!(AnyPermit, PermitOf, Permit);

impl AnyLocker {
    /// [`Locker::semaphore`](crate::Locker::semaphore): the semaphore `name` with
    /// `permits` permits (1 to [`MAX_PERMITS`](crate::MAX_PERMITS)). Touches no database.
    pub fn semaphore(&self, name: &str, permits: u32) -> AnySemaphore {
        AnySemaphore(dispatch!(into self, AnyLocker => SemaphoreOf, locker => {
            locker.semaphore(name, permits)
        }))
    }
}

impl AnySemaphore {
    /// [`Semaphore::name`].
    pub fn name(&self) -> &str {
        dispatch!(&self.0, SemaphoreOf, semaphore => semaphore.name())
    }

    /// [`Semaphore::permits`].
    pub fn permits(&self) -> u32 {
        dispatch!(&self.0, SemaphoreOf, semaphore => semaphore.permits())
    }

    /// [`Semaphore::try_acquire`]: `Ok(None)` when every permit is held.
    ///
    /// # Cancel safety
    /// As [`Semaphore::try_acquire`]: cancel safe.
    pub async fn try_acquire(&self, lease: Duration) -> Result<Option<AnyPermit>> {
        dispatch!(&self.0, SemaphoreOf, semaphore => {
            Ok(semaphore.try_acquire(lease).await?.map(AnyPermit::from))
        })
    }

    /// [`Semaphore::acquire`]: waits up to `wait`, then [`Error::Timeout`](crate::Error::Timeout).
    ///
    /// # Cancel safety
    /// As [`Semaphore::acquire`]: cancel safe.
    pub async fn acquire(&self, lease: Duration, wait: Duration) -> Result<AnyPermit> {
        dispatch!(&self.0, SemaphoreOf, semaphore => {
            semaphore.acquire(lease, wait).await.map(AnyPermit::from)
        })
    }

    /// [`Semaphore::holders`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holders(&self) -> Result<Vec<LockInfo>> {
        dispatch!(&self.0, SemaphoreOf, semaphore => semaphore.holders().await)
    }

    /// [`Semaphore::available`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn available(&self) -> Result<u32> {
        dispatch!(&self.0, SemaphoreOf, semaphore => semaphore.available().await)
    }
}

impl AnyPermit {
    /// [`Permit::number`]: which of the semaphore's permits this is, from 0.
    pub fn number(&self) -> u32 {
        dispatch!(&self.0, PermitOf, permit => permit.number())
    }

    lease_methods!(PermitOf, "LockGuard");
    row_methods!(PermitOf);

    /// [`Permit::release`]: gives the permit back.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`](crate::LockGuard::release): a dropped future's release
    /// finishes in the background.
    pub async fn release(self) -> Result<()> {
        dispatch!(self.0, PermitOf, permit => permit.release().await)
    }
}
