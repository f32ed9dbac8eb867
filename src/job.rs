//! Scheduled-job locks in the manner of ShedLock: [`Locker::job`] runs work at most once
//! at a time across processes, skips (rather than waits) when another node runs it, and
//! can keep the key locked for a minimum time so that a node waking late in the same
//! period skips too.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::config::{validate_key, validate_lease, validate_range};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::locker::{Held, Locker, run_holding};
use crate::metrics::{self, JobEvent};
use crate::recorder::EventKind::{JobRan, JobSkipped};
use crate::recorder::Record;

/// A scheduled job's lock, built by [`Locker::job`]; run it with [`run`](Self::run).
///
/// # Defaults
/// `lock_at_most_for`: the Locker's default lease
/// ([`LockerBuilder::default_lease`](crate::LockerBuilder::default_lease), 30 s unless
/// set). `lock_at_least_for`: zero (the key is free as soon as the work ends).
///
/// # Examples
/// Every node schedules the same job; the first to wake in a period runs it, and the
/// minimum hold makes the nodes that wake later in that period skip it.
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let nightly = || {
///     locker
///         .job("report:nightly")
///         .lock_at_most_for(Duration::from_secs(600)) // the lease; not renewed
///         .lock_at_least_for(Duration::from_secs(60)) // held this long, however quick the run
/// };
///
/// let ran = nightly().run(async |_guard| Ok::<_, dblock::Error>("report sent")).await?;
/// assert_eq!(ran, Some("report sent"));
///
/// // Another node whose timer fires a little later in the same period: skipped.
/// let late = nightly().run(async |_guard| Ok::<_, dblock::Error>("report sent")).await?;
/// assert_eq!(late, None);
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is run"]
pub struct Job<'a, DB: Backend> {
    locker: &'a Locker<DB>,
    key: String,
    at_most: Duration,
    at_least: Duration,
}

impl<DB: Backend> std::fmt::Debug for Job<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("key", &self.key)
            .field("lock_at_most_for", &self.at_most)
            .field("lock_at_least_for", &self.at_least)
            .finish()
    }
}

impl<DB: Backend> Locker<DB> {
    /// A ShedLock-style job lock on `key`: see [`Job`]. Nothing is checked or written
    /// until [`Job::run`].
    pub fn job(&self, key: &str) -> Job<'_, DB> {
        Job {
            locker: self,
            key: key.to_owned(),
            at_most: self.lease(),
            at_least: Duration::ZERO,
        }
    }
}

impl<DB: Backend> Job<'_, DB> {
    /// The longest the key stays locked: the lease, which is not renewed. If the node dies
    /// the key frees itself this long after the acquisition; if the work runs longer, the
    /// lease ends, the work is cancelled at its next await point and [`Error::LockLost`]
    /// is returned: at the lease's local deadline, a margin
    /// ([`Locker::lease_margin`](crate::Locker::lease_margin)) before another node can
    /// start. Choose it well above the
    /// work's longest run. Between [`MIN_LEASE`](crate::MIN_LEASE) and
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn lock_at_most_for(mut self, at_most: Duration) -> Self {
        self.at_most = at_most;
        self
    }

    /// The shortest the key stays locked, counted from the acquisition by the database
    /// clock: work that ends sooner leaves the row in place until then (its lease is cut
    /// to end at that moment), so that a node whose timer fires late in the same period
    /// finds the key held and skips. At most `lock_at_most_for`.
    pub fn lock_at_least_for(mut self, at_least: Duration) -> Self {
        self.at_least = at_least;
        self
    }

    /// Runs `work` if the key is free: `Ok(None)` when another owner holds it (the run is
    /// skipped; not an error), otherwise what `work` returned. One attempt, no waiting.
    /// Whether `work` succeeds or fails, the lock is released afterwards, honouring
    /// `lock_at_least_for`; a release that finds the lease already over reports
    /// [`Error::LockLost`] after successful work, as [`Locker::with_lock`] does, and a
    /// release that fails with a database error reports it (the work did run; the
    /// release goes on in the background, still honouring the minimum). The lease is
    /// never renewed, so a [`force_release`](Locker::force_release) does not stop the
    /// work: it runs on until `lock_at_most_for`.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidDuration`] (for a lease out of range,
    /// or `lock_at_least_for` above `lock_at_most_for`; nothing is written), or the
    /// acquisition's database error; `work`'s own error type `E` takes them through
    /// `From<dblock::Error>`.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and releases the lock in the background, still
    /// honouring `lock_at_least_for`.
    pub async fn run<T, E>(
        self,
        work: impl AsyncFnOnce(&LockGuard<DB>) -> Result<T, E>,
    ) -> Result<Option<T>, E>
    where
        E: From<Error>,
    {
        self.run_as(std::convert::identity, work).await
    }

    /// [`run`](Self::run) with the won guard wrapped by `wrap` before `work` sees it (an
    /// [`AnyJob`](crate::AnyJob) hands `work` an [`AnyGuard`](crate::AnyGuard)).
    pub(crate) async fn run_as<G: Held, T, E>(
        self,
        wrap: impl FnOnce(LockGuard<DB>) -> G,
        work: impl AsyncFnOnce(&G) -> Result<T, E>,
    ) -> Result<Option<T>, E>
    where
        E: From<Error>,
    {
        let span = tracing::info_span!(
            "job",
            key = %self.key,
            table = self.locker.table(),
            outcome = tracing::field::Empty
        );
        let run = async {
            let guard = match self.acquire().await {
                Ok(Some(guard)) => guard,
                Ok(None) => {
                    metrics::job(&self.locker.core.metrics, &self.key, JobEvent::Skip);
                    let (core, key) = (&self.locker.core, &self.key);
                    (core.history).record_detail(JobSkipped, key, &core.owner_prefix, None, "held");
                    tracing::Span::current().record("outcome", "skipped");
                    return Ok(None);
                }
                Err(err) => {
                    tracing::Span::current().record("outcome", "error");
                    return Err(err.into());
                }
            };
            metrics::job(&self.locker.core.metrics, &self.key, JobEvent::Run);
            let (owner, token, started) = (
                guard.owner().to_owned(),
                guard.fencing_token(),
                Instant::now(),
            );
            let outcome = run_holding(wrap(guard), work).await;
            let (core, took) = (&self.locker.core, format!("{:?}", started.elapsed()));
            (core.history).record_detail(JobRan, &self.key, &owner, Some(token), took);
            let said = if outcome.is_ok() { "ran" } else { "failed" };
            tracing::Span::current().record("outcome", said);
            outcome.map(Some)
        };
        run.instrument(span).await
    }

    /// Checks the options, then one attempt without renewal (`lock_at_most_for` is a
    /// bound, not a starting length), with the minimum hold set on the won lease.
    async fn acquire(&self) -> Result<Option<LockGuard<DB>>> {
        self.validate()?;
        let locker = self.locker.auto_renew(false);
        let guard = locker.try_acquire(&self.key, self.at_most).await?;
        if let Some(guard) = &guard
            && !self.at_least.is_zero()
        {
            guard.set_min_hold(self.at_least);
        }
        Ok(guard)
    }

    fn validate(&self) -> Result<()> {
        validate_key(&self.key)?;
        validate_lease(self.at_most)?;
        validate_range(
            "lock_at_least_for",
            self.at_least,
            Duration::ZERO,
            self.at_most,
        )
    }
}
