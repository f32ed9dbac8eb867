//! A schedule run in the background ([`Schedule::run`]) and the handle that owns it.

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{Period, Schedule, ScheduleStats, State, Turn};
use crate::dialect::Backend;
use crate::error::{Error, Result};

/// A schedule running in the background, returned by [`Schedule::run`]. It owns the task:
/// [`stop`](Self::stop) ends it and waits for it; dropping the handle ends it too,
/// without waiting (a run in progress still finishes first).
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
/// let (ran, mut periods) = tokio::sync::mpsc::unbounded_channel();
/// let handle = locker
///     .schedule("metrics:rollup", Duration::from_secs(60))
///     .run(move |period| {
///         let ran = ran.clone();
///         async move {
///             // ... the job's work ...
///             ran.send(period.number).ok();
///             Ok::<_, dblock::Error>(())
///         }
///     })?;
/// // The first wake-up is at once, for the current minute (no node ran it yet).
/// let first = periods.recv().await.expect("a run");
/// let stats = handle.stop().await; // stops it and waits
/// assert_eq!(stats.runs, 1);
/// assert!(first > 0);
/// # Ok(()) }
/// ```
#[must_use = "dropping the handle stops the schedule"]
pub struct ScheduleHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    state: Arc<State>,
}

impl std::fmt::Debug for ScheduleHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduleHandle")
            .field("stats", &self.stats())
            .finish()
    }
}

impl ScheduleHandle {
    /// The schedule's counters so far (shared with the [`Schedule`] it was started from).
    pub fn stats(&self) -> ScheduleStats {
        self.state.stats()
    }

    /// Stops the schedule and waits until its task has ended, then returns its counters.
    /// A run in progress is not interrupted: this waits for it (at most one period, the
    /// run's lease).
    ///
    /// # Cancel safety
    /// Cancel safe: the schedule is told to stop at once; dropping this future only skips
    /// the wait.
    pub async fn stop(mut self) -> ScheduleStats {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
        self.stats()
    }
}

impl Drop for ScheduleHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<DB: Backend> Schedule<DB> {
    /// Runs the schedule in the background until the returned handle is stopped or
    /// dropped: a wake-up ([`run_once`](Self::run_once)) at once, then one at the start
    /// of every period (by the database clock, timed on this node's monotonic clock).
    /// `work` is called once per period this node wins, with that [`Period`]; a capturing
    /// closure clones what its future needs (`move |period| { let x = x.clone(); async
    /// move { .. } }`), as for any `tokio::spawn`. Its errors, and database errors, are
    /// logged (`WARN`) and the schedule goes on; a database error is tried again after
    /// the Locker's longest retry pause ([`RetryPolicy`](crate::RetryPolicy)).
    ///
    /// Errors: [`Error::InvalidKey`] or [`Error::InvalidDuration`] (nothing is started or
    /// written). Needs a tokio runtime.
    pub fn run<F, Fut, E>(&self, work: F) -> Result<ScheduleHandle>
    where
        F: Fn(Period) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: From<Error> + std::fmt::Display + Send + 'static,
    {
        self.validate()?;
        let stop = CancellationToken::new();
        let (schedule, stopping) = (self.clone(), stop.clone());
        let pause = self.locker.core.retry.max;
        let task = tokio::spawn(async move {
            // A run in progress is not raced against the stop: stopping waits for it.
            while !stopping.is_cancelled() {
                // The closure makes `F: Fn -> Fut` an `AsyncFnOnce`; `&work` is not one.
                #[allow(clippy::redundant_closure)]
                let woke = schedule.wake(|period| work(period)).await;
                let next = match woke {
                    Ok(tick) => {
                        if let Turn::Ran {
                            output: Err(err), ..
                        } = &tick.turn
                        {
                            tracing::warn!(schedule = %schedule.name, period = tick.period, error = %err, "scheduled work failed");
                        }
                        tick.next_period_at
                    }
                    Err(err) => {
                        tracing::warn!(schedule = %schedule.name, error = %err, "schedule wake-up failed; trying again");
                        Instant::now() + pause
                    }
                };
                tokio::select! {
                    _ = stopping.cancelled() => break,
                    _ = sleep_until(next) => {}
                }
            }
        });
        Ok(ScheduleHandle {
            stop,
            task: Some(task),
            state: Arc::clone(&self.state),
        })
    }
}
