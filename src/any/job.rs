//! [`AnyJob`]: a scheduled job's lock through an [`AnyLocker`], the backend's [`Job`].

use std::time::Duration;

use super::{AnyGuard, AnyLocker, dispatch};
use crate::error::{Error, Result};
use crate::job::Job;

/// A scheduled job's lock, built by [`AnyLocker::job`]: the backend's [`Job`], with the
/// same options, defaults and errors; `work` receives an [`AnyGuard`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let nightly = || {
///     locker
///         .job("report:nightly")
///         .lock_at_most_for(Duration::from_secs(600))
///         .lock_at_least_for(Duration::from_secs(60))
/// };
/// let ran = nightly().run(async |_guard| Ok::<_, dblock::Error>("sent")).await?;
/// assert_eq!(ran, Some("sent"));
/// // Later in the same period, on another node: skipped.
/// assert_eq!(nightly().run(async |_guard| Ok::<_, dblock::Error>("sent")).await?, None);
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is run"]
#[derive(Debug)]
pub struct AnyJob<'a>(JobOf<'a>);

#[derive(Debug)]
enum JobOf<'a> {
    #[cfg(feature = "postgres")]
    Postgres(Job<'a, sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Job<'a, sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Job<'a, sqlx::Sqlite>),
}

impl<'a> AnyJob<'a> {
    pub(super) fn new(locker: &'a AnyLocker, key: &str) -> Self {
        AnyJob(match locker {
            #[cfg(feature = "postgres")]
            AnyLocker::Postgres(locker) => JobOf::Postgres(locker.job(key)),
            #[cfg(feature = "mysql")]
            AnyLocker::MySql(locker) => JobOf::MySql(locker.job(key)),
            #[cfg(feature = "sqlite")]
            AnyLocker::Sqlite(locker) => JobOf::Sqlite(locker.job(key)),
        })
    }

    /// [`Job::lock_at_most_for`]. Default: the locker's default lease.
    pub fn lock_at_most_for(self, at_most: Duration) -> Self {
        AnyJob(dispatch!(map self.0, JobOf, job => job.lock_at_most_for(at_most)))
    }

    /// [`Job::lock_at_least_for`]. Default: zero.
    pub fn lock_at_least_for(self, at_least: Duration) -> Self {
        AnyJob(dispatch!(map self.0, JobOf, job => job.lock_at_least_for(at_least)))
    }

    /// [`Job::run`], `work` receiving the [`AnyGuard`]: `Ok(None)` when another owner
    /// holds the key.
    ///
    /// # Cancel safety
    /// As [`Job::run`]: dropping the future drops `work` and releases the lock in the
    /// background, still honouring `lock_at_least_for`.
    pub async fn run<T, E>(
        self,
        work: impl AsyncFnOnce(&AnyGuard) -> Result<T, E>,
    ) -> Result<Option<T>, E>
    where
        E: From<Error>,
    {
        dispatch!(self.0, JobOf, job => job.run_as(AnyGuard::from, work).await)
    }
}
