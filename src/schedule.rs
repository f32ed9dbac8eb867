//! Schedules ([`Locker::schedule`]): a job run once per period across nodes, the periods
//! counted from the Unix epoch and told apart by the database clock.
//!
//! Why it is safe: period `n`'s run holds the row `<name>@<n mod 2>`, acquired with a
//! lease of one period and kept (by the release's minimum hold) until half a period after
//! the period's end, by the database clock. A second acquisition of that row within
//! period `n` is therefore impossible, and one made later is recognised by its own
//! acquisition time (the returned expiry minus the lease, database clock) and not run.
//! Since the lease is one period and the row is acquired during period `n`, it has
//! expired by the start of period `n + 2`, which takes it over: two rows per schedule,
//! reused for ever.

mod handle;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::config::{MAX_LEASE, micros, validate_key, validate_range};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::locker::{Locker, run_holding};
use crate::metrics::{self, JobEvent};
use crate::recorder::EventKind::{JobOverran, JobSkipped, Period as PeriodClaimed};
use crate::recorder::Record;

pub use handle::ScheduleHandle;

/// The shortest period of a schedule: 100 ms (below it a period is mostly round trips).
pub const MIN_PERIOD: Duration = Duration::from_millis(100);
/// The longest period of a schedule: one day, the longest lease ([`MAX_LEASE`]), since a
/// run's lease is one period.
pub const MAX_PERIOD: Duration = MAX_LEASE;

/// A job that runs once per `period` across all nodes that schedule it, built by
/// [`Locker::schedule`]; start it in the background with [`run`](Self::run), or drive its
/// wake-ups yourself with [`run_once`](Self::run_once).
///
/// Period `n` starts at the Unix epoch plus [`offset`](Self::offset) plus `n` periods, so
/// every node agrees which period it is; *which* period it is at a wake-up is read from
/// the database clock, never the node's. The node's clock only times the sleep until the
/// next period. The node that wakes first in a period runs the work; the others find the
/// period's row held and skip. Every node must use the same name, period and offset.
///
/// # What it guarantees
/// - **At most once per period**, whatever the nodes' clocks and timers do: see the
///   module's reasoning in the README ("Scheduled jobs: once per period across nodes").
/// - **At least once per period** as long as some node wakes in it (a late timer still
///   runs the period's work, late) and reaches the database.
/// - A run may last at most one period from its acquisition: its lease is one period and
///   not renewed, and work still running then is cancelled at its next await point with
///   [`Error::LockLost`] (counted as an overrun). A run that ends after its period's end
///   is an overrun; the node then wakes at once for the current period.
///
/// # Rows
/// Two rows per schedule, `<name>@0` and `<name>@1` (even and odd periods), taken over
/// period after period: nothing piles up and no reaper is needed.
///
/// # Defaults
/// `offset`: zero (periods start at multiples of `period` since the Unix epoch, UTC).
///
/// # Examples
/// Two nodes wake in the same period: the first runs it, the second skips.
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::Turn;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let hourly = || locker.schedule("report:hourly", Duration::from_secs(3600));
/// let (node_a, node_b) = (hourly(), hourly());
///
/// let tick = node_a
///     .run_once(async |period| Ok::<_, dblock::Error>(period.number))
///     .await?;
/// assert!(matches!(tick.turn, Turn::Ran { output, .. } if output == tick.period));
///
/// let late = node_b.run_once(async |_| Ok::<_, dblock::Error>(0)).await?;
/// assert!(matches!(late.turn, Turn::Skipped)); // node A ran this period
/// assert_eq!((node_a.stats().runs, node_b.stats().skips), (1, 1));
/// # Ok(()) }
/// ```
#[must_use = "a schedule does nothing until it is run"]
pub struct Schedule<DB: Backend> {
    /// Non-renewing: a run's lease is a bound.
    locker: Locker<DB>,
    name: String,
    period: Duration,
    offset: Duration,
    /// Run a period only if woken within this long after its start (`None`: any time
    /// in the period, catching up).
    start_within: Option<Duration>,
    state: Arc<State>,
}

impl<DB: Backend> Clone for Schedule<DB> {
    fn clone(&self) -> Self {
        Schedule {
            locker: self.locker.clone(),
            name: self.name.clone(),
            period: self.period,
            offset: self.offset,
            start_within: self.start_within,
            state: Arc::clone(&self.state),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Schedule<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("period", &self.period)
            .field("offset", &self.offset)
            .finish()
    }
}

/// What a schedule's clones share: the last period it handled and its counters.
#[derive(Default)]
struct State {
    last: Mutex<Option<i64>>,
    runs: AtomicU64,
    skips: AtomicU64,
    overruns: AtomicU64,
    missed: AtomicU64,
}

impl State {
    fn stats(&self) -> ScheduleStats {
        ScheduleStats {
            runs: self.runs.load(Relaxed),
            skips: self.skips.load(Relaxed),
            overruns: self.overruns.load(Relaxed),
            missed: self.missed.load(Relaxed),
        }
    }
}

/// A schedule's counters, from [`Schedule::stats`] or [`ScheduleHandle::stats`]. Over the
/// periods from its first wake-up to its last, `runs + skips + missed` is their number.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let schedule = locker.schedule("cleanup", std::time::Duration::from_secs(60));
/// assert_eq!(schedule.stats(), dblock::ScheduleStats::default()); // all zero at first
/// schedule.run_once(async |_| Ok::<_, dblock::Error>(())).await?;
/// assert_eq!(schedule.stats().runs, 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleStats {
    /// Periods whose work this schedule ran (whether the work succeeded or not).
    pub runs: u64,
    /// Periods it skipped because their row was held: another node ran them.
    pub skips: u64,
    /// Runs that ended after their period's end (by the database clock read at the
    /// wake-up plus the node's monotonic clock since).
    pub overruns: u64,
    /// Periods it did not attempt: it woke up after they ended (a run before lasted into
    /// them, or the process stalled), its acquisition came after the period's end, or a
    /// database error stopped the attempt. Another node may have run them.
    pub missed: u64,
}

/// The period a run is for, given to the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Period {
    /// Its number: periods since the Unix epoch (plus the schedule's offset).
    pub number: i64,
    /// Its start (UTC).
    pub start: DateTime<Utc>,
    /// Its end, the next period's start (UTC).
    pub end: DateTime<Utc>,
    /// The fencing token of the run's lock: pass it on to fence the work's writes.
    pub fencing_token: i64,
}

/// What one wake-up of a schedule did: see [`Schedule::run_once`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Tick<T> {
    /// The period of the wake-up, by the database clock (see [`Period::number`]).
    pub period: i64,
    /// What happened in it.
    pub turn: Turn<T>,
    /// When the next period starts, on this node's monotonic clock (from the database
    /// clock read at this wake-up): sleep until then.
    pub next_period_at: Instant,
}

/// What a wake-up did with its period.
#[derive(Debug)]
#[non_exhaustive]
pub enum Turn<T> {
    /// This node ran the period's work, which returned `output`; `overran`: it ended
    /// after the period's end.
    Ran {
        /// What the work returned.
        output: T,
        /// Whether the run ended after its period's end.
        overran: bool,
    },
    /// The period's row was held: another node ran (or runs) it.
    Skipped,
    /// This node's acquisition was made after the period had ended (by the database
    /// clock), so the work was not run: counted as missed.
    Late,
    /// This schedule (or a clone) had already handled this period: the node woke early.
    AlreadyHandled,
    /// The period had started longer ago than [`Schedule::start_within`] allows (by the
    /// database clock), so this node did not run it (nor take its row): counted as missed.
    StartMissed,
}

impl<DB: Backend> Locker<DB> {
    /// A job run once per `period` across nodes: see [`Schedule`]. Nothing is checked or
    /// written until it runs. `period` is between [`MIN_PERIOD`] and [`MAX_PERIOD`];
    /// `name` plus two bytes (`@0`) is a key.
    pub fn schedule(&self, name: &str, period: Duration) -> Schedule<DB> {
        Schedule {
            locker: self.auto_renew(false),
            name: name.to_owned(),
            period,
            offset: Duration::ZERO,
            start_within: None,
            state: Arc::default(),
        }
    }
}

impl<DB: Backend> Schedule<DB> {
    /// Shifts the periods' starts by `offset` after the multiples of the period since the
    /// Unix epoch: a daily schedule with an offset of two hours runs at 02:00 UTC. Less
    /// than the period. Default: zero.
    pub fn offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }

    /// Runs a period only if a node wakes within `window` after its start (database
    /// clock), and skips it otherwise ([`Turn::StartMissed`], counted as missed): no
    /// catch-up. For work that is only worth doing on time, such as an hourly report
    /// after every node was restarted mid-hour. `window` is between 1 ms and the period.
    ///
    /// Default: the whole period. A node that wakes late in a period nobody ran yet runs
    /// it late, as a [`run`](Self::run) loop does at its start; so a service started a
    /// moment before a period's end runs that period, then the next one at its start.
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let locker = dblock::Locker::new(pool);
    /// # locker.migrate().await?;
    /// // The hourly report runs in the first five minutes of its hour, or not at all.
    /// let hourly = locker
    ///     .schedule("report:hourly", Duration::from_secs(3600))
    ///     .start_within(Duration::from_secs(300));
    /// # let _ = hourly;
    /// # Ok(()) }
    /// ```
    pub fn start_within(mut self, window: Duration) -> Self {
        self.start_within = Some(window);
        self
    }

    /// The schedule's name (its rows are `<name>@0` and `<name>@1`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The counters so far, shared with the schedule's clones and its handle.
    pub fn stats(&self) -> ScheduleStats {
        self.state.stats()
    }

    /// One wake-up, now: reads the database clock, and unless this schedule already
    /// handled the current period, tries to take it and runs `work` if it did (see
    /// [`Turn`]). For driving the wake-ups with a timer of your own (sleep until
    /// [`Tick::next_period_at`] between calls); [`run`](Self::run) does that in the
    /// background. The counters and [`metrics`](crate#metrics-and-tracing) are updated.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidDuration`] (a period or offset out
    /// of range; nothing is written), a database error (the period counts as missed), or
    /// `work`'s own error (after counting the run; a run that outlasts its lease returns
    /// [`Error::LockLost`]), through `From<dblock::Error>`.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work`; its lock is released in the background, still
    /// kept until after the period's end, so no other node runs that period.
    pub async fn run_once<T, E>(
        &self,
        work: impl AsyncFnOnce(Period) -> Result<T, E>,
    ) -> Result<Tick<T>, E>
    where
        E: From<Error>,
    {
        let tick = self.wake(work).await?;
        let turn = match tick.turn {
            Turn::Ran { output, overran } => Turn::Ran {
                output: output?,
                overran,
            },
            Turn::Skipped => Turn::Skipped,
            Turn::Late => Turn::Late,
            Turn::AlreadyHandled => Turn::AlreadyHandled,
            Turn::StartMissed => Turn::StartMissed,
        };
        Ok(Tick {
            period: tick.period,
            turn,
            next_period_at: tick.next_period_at,
        })
    }

    /// [`run_once`](Self::run_once), with the work's outcome left in the turn.
    async fn wake<T, E>(
        &self,
        work: impl AsyncFnOnce(Period) -> Result<T, E>,
    ) -> Result<Tick<Result<T, E>>>
    where
        E: From<Error>,
    {
        self.validate()?;
        let now = self.locker.core.table.clock().await?;
        let read = Instant::now();
        let number = self.period_of(now);
        let end = self.start_of(number + 1);
        // Read after the statement returned: never before the period's start by the
        // database clock (an early wake-up is harmless all the same: AlreadyHandled).
        let next_period_at = read + (end - now).to_std().unwrap_or_default();
        let tick = |turn| Tick {
            period: number,
            turn,
            next_period_at,
        };
        if !self.claim(number) {
            return Ok(tick(Turn::AlreadyHandled));
        }
        if self.started_too_long_ago(number, now) {
            self.state.missed.fetch_add(1, Relaxed);
            return Ok(tick(Turn::StartMissed));
        }
        let metrics = &self.locker.core.metrics;
        let guard = match self
            .locker
            .try_acquire(&self.key(number), self.period)
            .await
        {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                self.state.skips.fetch_add(1, Relaxed);
                metrics::job(metrics, &self.name, JobEvent::Skip);
                let (core, key) = (&self.locker.core, self.key(number));
                (core.history).record_detail(JobSkipped, &key, &core.owner_prefix, None, number);
                return Ok(tick(Turn::Skipped));
            }
            Err(err) => {
                self.state.missed.fetch_add(1, Relaxed);
                return Err(err);
            }
        };
        // The acquisition's own time by the database clock: it set the expiry one lease
        // (one period) after it.
        let acquired_at = guard.expires_at() - chrono_duration(self.period);
        if acquired_at >= end {
            // The period ended while the statement was on its way: its row had already
            // been let go (or never taken), and running now could run it twice.
            self.state.missed.fetch_add(1, Relaxed);
            if let Err(err) = guard.release().await {
                tracing::debug!(key = %self.key(number), error = %err, "release after a late acquisition");
            }
            return Ok(tick(Turn::Late));
        }
        if self.started_too_long_ago(number, acquired_at) {
            // The acquisition itself arrived past the window (a slow statement): let the
            // row go at once, as if never taken; another node would be as late.
            self.state.missed.fetch_add(1, Relaxed);
            if let Err(err) = guard.release().await {
                tracing::debug!(key = %self.key(number), error = %err, "release after a start missed");
            }
            return Ok(tick(Turn::StartMissed));
        }
        // Kept half a period past the end, so that a node whose acquisition of this row
        // arrives around the end finds it held or sees it is late; never past the lease.
        let keep_until = end + chrono_duration(self.period / 2);
        let min_hold = (keep_until - acquired_at).to_std().unwrap_or_default();
        guard.set_min_hold(min_hold.min(self.period));
        self.state.runs.fetch_add(1, Relaxed);
        metrics::job(metrics, &self.name, JobEvent::Run);
        let period = Period {
            number,
            start: self.start_of(number),
            end,
            fencing_token: guard.fencing_token(),
        };
        let (history, owner, token) = (
            &self.locker.core.history,
            guard.owner().to_owned(),
            Some(guard.fencing_token()),
        );
        history.record_detail(PeriodClaimed, guard.key(), &owner, token, number);
        let output = run_holding(guard, async move |_| work(period).await).await;
        let overran = now + chrono_duration(read.elapsed()) > end;
        if overran {
            self.state.overruns.fetch_add(1, Relaxed);
            metrics::job(metrics, &self.name, JobEvent::Overrun);
            history.record_detail(JobOverran, &self.key(number), &owner, token, number);
        }
        Ok(tick(Turn::Ran { output, overran }))
    }

    /// Marks period `number` handled, counting the periods skipped over since the last
    /// one as missed; `false` if it (or a later one) was handled already.
    fn claim(&self, number: i64) -> bool {
        let mut last = self.state.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = *last {
            if number <= last {
                return false;
            }
            let skipped = u64::try_from(number - last - 1).unwrap_or(0);
            self.state.missed.fetch_add(skipped, Relaxed);
        }
        *last = Some(number);
        true
    }

    /// Whether `at` (database clock) is past period `number`'s start window, if it has one.
    fn started_too_long_ago(&self, number: i64, at: DateTime<Utc>) -> bool {
        self.start_within
            .is_some_and(|window| at - self.start_of(number) > chrono_duration(window))
    }

    fn validate(&self) -> Result<()> {
        // The name alone must be a key too (not empty), and with its suffix not too long.
        validate_key(&self.name)?;
        validate_key(&self.key(0))?;
        validate_range("period", self.period, MIN_PERIOD, MAX_PERIOD)?;
        validate_range(
            "offset",
            self.offset,
            Duration::ZERO,
            self.period.saturating_sub(Duration::from_micros(1)),
        )?;
        match self.start_within {
            Some(window) => validate_range(
                "start_within",
                window,
                Duration::from_millis(1),
                self.period,
            ),
            None => Ok(()),
        }
    }

    /// The row of period `number`: one per parity (see the module docs).
    fn key(&self, number: i64) -> String {
        format!("{}@{}", self.name, number.rem_euclid(2))
    }

    /// The period `at` falls in.
    fn period_of(&self, at: DateTime<Utc>) -> i64 {
        (at.timestamp_micros() - micros(self.offset)).div_euclid(micros(self.period))
    }

    /// The start of period `number`.
    fn start_of(&self, number: i64) -> DateTime<Utc> {
        let micros = number * micros(self.period) + micros(self.offset);
        DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// A std duration (at most a day here) as chrono's.
fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}
