//! [`AnySchedule`]: a job run once per period across nodes through an [`AnyLocker`], the
//! backend's [`Schedule`].

use std::time::Duration;

use super::{AnyLocker, dispatch};
use crate::error::{Error, Result};
use crate::schedule::{Period, Schedule, ScheduleHandle, ScheduleStats, Tick};

/// A job that runs once per `period` across all nodes that schedule it: the backend's
/// [`Schedule`], made by [`AnyLocker::schedule`], with the same guarantees, rows,
/// defaults and errors (each method's documentation is the `Schedule` method's it names).
/// The work receives the [`Period`], whose `fencing_token` fences its writes.
///
/// # Examples
/// Two nodes wake in the same period: the first runs it, the second skips.
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::Turn;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let hourly = || locker.schedule("report:hourly", Duration::from_secs(3600));
/// let (node_a, node_b) = (hourly(), hourly());
/// let tick = node_a.run_once(async |period| Ok::<_, dblock::Error>(period.number)).await?;
/// assert!(matches!(tick.turn, Turn::Ran { output, .. } if output == tick.period));
/// let late = node_b.run_once(async |_| Ok::<_, dblock::Error>(0)).await?;
/// assert!(matches!(late.turn, Turn::Skipped)); // node A ran this period
/// # Ok(()) }
/// ```
#[must_use = "a schedule does nothing until it is run"]
#[derive(Debug, Clone)]
pub struct AnySchedule(ScheduleOf);

#[derive(Debug, Clone)]
enum ScheduleOf {
    #[cfg(feature = "postgres")]
    Postgres(Schedule<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Schedule<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(Schedule<sqlx::Sqlite>),
}

impl AnyLocker {
    /// [`Locker::schedule`](crate::Locker::schedule): a job run once per `period` across
    /// nodes. Nothing is checked or written until it runs.
    pub fn schedule(&self, name: &str, period: Duration) -> AnySchedule {
        AnySchedule(dispatch!(into self, AnyLocker => ScheduleOf, locker => {
            locker.schedule(name, period)
        }))
    }
}

impl AnySchedule {
    /// [`Schedule::offset`]. Default: zero.
    pub fn offset(self, offset: Duration) -> Self {
        AnySchedule(dispatch!(map self.0, ScheduleOf, schedule => schedule.offset(offset)))
    }

    /// [`Schedule::start_within`]. Default: the whole period.
    pub fn start_within(self, window: Duration) -> Self {
        AnySchedule(dispatch!(map self.0, ScheduleOf, schedule => schedule.start_within(window)))
    }

    /// [`Schedule::name`].
    pub fn name(&self) -> &str {
        dispatch!(&self.0, ScheduleOf, schedule => schedule.name())
    }

    /// [`Schedule::stats`].
    pub fn stats(&self) -> ScheduleStats {
        dispatch!(&self.0, ScheduleOf, schedule => schedule.stats())
    }

    /// [`Schedule::run_once`]: one wake-up, now.
    ///
    /// # Cancel safety
    /// As [`Schedule::run_once`]: dropping the future drops `work`; its lock is released
    /// in the background, still kept until after the period's end.
    pub async fn run_once<T, E>(
        &self,
        work: impl AsyncFnOnce(Period) -> Result<T, E>,
    ) -> Result<Tick<T>, E>
    where
        E: From<Error>,
    {
        dispatch!(&self.0, ScheduleOf, schedule => schedule.run_once(work).await)
    }

    /// [`Schedule::run`]: in the background until the handle is stopped or dropped.
    pub fn run<F, Fut, E>(&self, work: F) -> Result<ScheduleHandle>
    where
        F: Fn(Period) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: From<Error> + std::fmt::Display + Send + 'static,
    {
        dispatch!(&self.0, ScheduleOf, schedule => schedule.run(work))
    }
}
