//! Deleting expired rows: once ([`Locker::reap_expired`](crate::Locker::reap_expired)) or
//! in the background ([`Locker::spawn_reaper`](crate::Locker::spawn_reaper)). Takeover
//! does not need it; it keeps the table small. Every pass also deletes the expired
//! fair-mode tickets, of waiters that died.
//!
//! A pass deletes bounded batches through the `expire_time` index until one comes back
//! short, and paces itself: after each batch it pauses for the dialect's `REAP_PACE`
//! times as long as the batch took (39 times; 79 on MySQL / MariaDB, whose purge threads
//! delete each row a second time after the commit), so a large backlog is worked off in
//! the background without crowding out the acquisitions running beside it.
//!
//! Why a fortieth of the server's time: an acquirer that overlaps a batch (or, on InnoDB,
//! its purge) waits for it, and for the p99 of the acquirers beside it to stay within 2x
//! idle, fewer than 1% of their statements may overlap one; shorter pauses let more
//! overlap (the figures are in bench/RESULTS.md, "Figures behind choices in the code").
//! Reaping is housekeeping (an expired row never blocks an acquisition, it is taken
//! over), so a large backlog may take a minute or so.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{DEFAULT_REAP_BATCH, DEFAULT_REAP_INTERVAL, MAX_LEASE, validate_range};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::stats::Counters;
use crate::table::{LockTable, Via};

/// Most long-held rows one leak check reads and reports.
pub const LEAK_CHECK_LIMIT: u32 = 1_000;

/// The longest leak threshold: a year.
const MAX_LEAK_THRESHOLD: Duration = Duration::from_secs(365 * 24 * 3600);

/// How a background reaper runs.
///
/// # Default
/// Every [`DEFAULT_REAP_INTERVAL`] (60 s), [`DEFAULT_REAP_BATCH`] (1000) rows per statement,
/// no leak check.
///
/// # Examples
/// A configuration to pass to [`Locker::spawn_reaper`](crate::Locker::spawn_reaper):
/// ```
/// use std::time::Duration;
/// use dblock::{DEFAULT_REAP_BATCH, DEFAULT_REAP_INTERVAL, ReaperConfig};
///
/// let default = ReaperConfig::default();
/// assert_eq!(default.interval, DEFAULT_REAP_INTERVAL); // 60 s
/// assert_eq!(default.batch, DEFAULT_REAP_BATCH); // 1000 rows per statement
/// assert_eq!(default.leak_threshold, None); // no leak check
///
/// // Every 10 s, and warn about locks held for more than an hour.
/// let config = ReaperConfig {
///     interval: Duration::from_secs(10),
///     leak_threshold: Some(Duration::from_secs(3600)),
///     ..ReaperConfig::default()
/// };
/// assert_eq!(config.batch, 1000); // the rest as by default
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Pause between passes; a pass deletes batches until one comes back short.
    pub interval: Duration,
    /// Most rows one statement deletes.
    pub batch: u32,
    /// The leaked-lock check: after deleting expired rows, every pass also reads the
    /// live rows acquired longer ago than this (database clock), whoever holds them
    /// (other processes and plain-SQL clients too), logs a `WARN` event per key with
    /// owner and held time, and sets the gauge `distributed_lock_long_held`; see
    /// [`ReaperHandle::long_held`]. At most [`LEAK_CHECK_LIMIT`] rows per check; the
    /// gauge goes back to 0 when the reaper stops. `None` (the default): no check.
    /// Between 1 ms and a year.
    pub leak_threshold: Option<Duration>,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            interval: DEFAULT_REAP_INTERVAL,
            batch: DEFAULT_REAP_BATCH,
            leak_threshold: None,
        }
    }
}

/// A row the leak check found held longer than its threshold.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::ReaperConfig;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let threshold = Duration::from_millis(10);
/// let guard = locker.try_acquire("import:big", Duration::from_secs(30)).await?.unwrap();
/// tokio::time::sleep(Duration::from_millis(50)).await; // held longer than the threshold
///
/// let config = ReaperConfig { leak_threshold: Some(threshold), ..ReaperConfig::default() };
/// let reaper = locker.spawn_reaper(config)?;
/// let mut found = reaper.long_held();
/// let report = found.wait_for(|report| report.checks > 0).await?.clone();
/// let row = &report.rows[0];
/// assert_eq!((row.key.as_str(), row.owner.as_str()), ("import:big", guard.owner()));
/// assert_eq!(row.fencing_token, guard.fencing_token());
/// assert!(row.held_for >= threshold); // by the database clock
/// # reaper.stop().await;
/// # guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LongHeld {
    /// The key.
    pub key: String,
    /// The owner value (`lock_value`).
    pub owner: String,
    /// The fencing token.
    pub fencing_token: i64,
    /// How long it had been held at the check (database clock).
    pub held_for: Duration,
}

/// What the last leak check found.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::ReaperConfig;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let guard = locker.try_acquire("import:big", Duration::from_secs(30)).await?.unwrap();
/// tokio::time::sleep(Duration::from_millis(50)).await;
///
/// let reaper = locker.spawn_reaper(ReaperConfig {
///     leak_threshold: Some(Duration::from_millis(10)),
///     ..ReaperConfig::default()
/// })?;
/// let mut reports = reaper.long_held(); // updated after every check
/// let report = reports.wait_for(|report| report.checks > 0).await?.clone();
/// let keys: Vec<&str> = report.rows.iter().map(|row| row.key.as_str()).collect();
/// assert_eq!(keys, ["import:big"]); // one row per long-held key, in key order
///
/// reaper.stop().await;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeakReport {
    /// Checks run so far by this reaper.
    pub checks: u64,
    /// The rows the last check found, in key order.
    pub rows: Vec<LongHeld>,
}

/// A running reaper. Stop it with [`stop`](Self::stop); dropping the handle stops it too
/// (without waiting for it).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use dblock::ReaperConfig;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// // A row left by a client that died: its lease ended a minute ago.
/// dblock::sqlx::query(
///     "INSERT INTO distributed_lock (lock_key, lock_value, expire_time) \
///      VALUES ('job:orphan', 'crashed-node', datetime('now', '-1 minute'))",
/// )
/// .execute(locker.pool())
/// .await?;
///
/// // Its first pass runs at once, then one every 60 s (the default).
/// let reaper = locker.spawn_reaper(ReaperConfig::default())?;
/// reaper.subscribe().wait_for(|&deleted| deleted > 0).await?;
/// assert!(locker.holder("job:orphan").await?.is_none());
///
/// let deleted = reaper.stop().await; // stops it and waits; returns its total
/// assert_eq!(deleted, 1);
/// # Ok(()) }
/// ```
#[must_use = "dropping the handle stops the reaper"]
pub struct ReaperHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    deleted: watch::Receiver<u64>,
    long_held: watch::Receiver<LeakReport>,
}

impl ReaperHandle {
    /// Rows this reaper has deleted so far.
    pub fn deleted(&self) -> u64 {
        *self.deleted.borrow()
    }

    /// A receiver of the running total, updated after every pass that deleted rows.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.deleted.clone()
    }

    /// A receiver of the leak check's findings ([`ReaperConfig::leak_threshold`]),
    /// updated after every check; stays empty without a threshold.
    pub fn long_held(&self) -> watch::Receiver<LeakReport> {
        self.long_held.clone()
    }

    /// Stops the reaper, waits until it has stopped, and returns its total.
    ///
    /// # Cancel safety
    /// Cancel safe: the reaper is told to stop at once; dropping this future only skips
    /// the wait. A statement in flight finishes on its own.
    pub async fn stop(mut self) -> u64 {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
        self.deleted()
    }
}

impl Drop for ReaperHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ReaperHandle {
    /// Starts the reaper on `table`; `config` was validated by [`validate`].
    /// `retention`: the lock history's, when the Locker records one (its events are
    /// trimmed too).
    pub(crate) fn spawn<DB: Backend>(
        table: Arc<LockTable<DB>>,
        counters: Arc<Counters>,
        config: ReaperConfig,
        retention: Option<Duration>,
    ) -> Self {
        let stop = CancellationToken::new();
        let (total, deleted) = watch::channel(0u64);
        let (report, long_held) = watch::channel(LeakReport::default());
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                let sizes = (config.batch, retention);
                let pass = reap_all(&table, &counters, sizes, Some(&stopping));
                match pass.await {
                    Ok(0) => {}
                    Ok(n) => total.send_modify(|t| *t += n),
                    Err(err) => {
                        tracing::warn!(table = %table.name(), error = %err, "reaper pass failed")
                    }
                }
                if let Some(threshold) = config.leak_threshold {
                    let check = tokio::select! {
                        _ = stopping.cancelled() => break,
                        check = check_leaks(&table, threshold) => check,
                    };
                    match check {
                        Ok(rows) => report.send_modify(|r| {
                            r.checks += 1;
                            r.rows = rows;
                        }),
                        Err(err) => {
                            tracing::warn!(table = %table.name(), error = %err, "leak check failed")
                        }
                    }
                }
                tokio::select! {
                    _ = stopping.cancelled() => break,
                    _ = tokio::time::sleep(config.interval) => {}
                }
            }
            // No check runs any more: the gauge would show a stale count.
            if config.leak_threshold.is_some() {
                crate::metrics::long_held(table.name(), 0);
            }
        });
        ReaperHandle {
            stop,
            task: Some(task),
            deleted,
            long_held,
        }
    }
}

/// Checks a reaper's options before anything starts.
pub(crate) fn validate(config: &ReaperConfig) -> Result<()> {
    validate_range(
        "reaper interval",
        config.interval,
        Duration::from_millis(1),
        MAX_LEASE,
    )?;
    if config.batch == 0 {
        return Err(Error::InvalidConfig(
            "reaper batch must be at least 1".into(),
        ));
    }
    if let Some(threshold) = config.leak_threshold {
        validate_range(
            "leak threshold",
            threshold,
            Duration::from_millis(1),
            MAX_LEAK_THRESHOLD,
        )?;
    }
    Ok(())
}

/// One leak check: the live rows held longer than `threshold` (the reaper has just
/// deleted the expired ones), each logged at `WARN`.
async fn check_leaks<DB: Backend>(
    table: &LockTable<DB>,
    threshold: Duration,
) -> Result<Vec<LongHeld>> {
    // Live rows only, in the statement: expired ones (a failed reap, or expired since)
    // must not take places within the limit.
    let listed = table
        .list("", Some(threshold), Some(false), LEAK_CHECK_LIMIT)
        .await?;
    let rows: Vec<LongHeld> = listed
        .into_iter()
        .map(|listed| LongHeld {
            held_for: (listed.read_at - listed.row.acquired_at)
                .to_std()
                .unwrap_or_default(),
            key: listed.key,
            owner: listed.row.owner,
            fencing_token: listed.row.fencing_token,
        })
        .collect();
    crate::metrics::long_held(table.name(), rows.len());
    for row in &rows {
        tracing::warn!(table = %table.name(), key = %row.key, owner = %row.owner, fencing_token = row.fencing_token, held_for = ?row.held_for, ?threshold, "lock held longer than the leak threshold");
    }
    Ok(rows)
}

/// Deletes the expired fair-mode tickets (of waiters that died), whether or not anyone
/// waits now. A table made by hand without a ticket table (plain-SQL clients) has none to
/// purge; any other failure is only logged: the next pass tries again.
async fn purge_tickets<DB: Backend>(table: &LockTable<DB>) {
    match table.purge_tickets(Via::Pool).await {
        Ok(0) => {}
        Ok(purged) => tracing::debug!(table = %table.name(), purged, "purged expired tickets"),
        Err(Error::MissingTable { .. }) => {}
        Err(err) => {
            tracing::debug!(table = %table.name(), error = %err, "could not purge expired tickets")
        }
    }
}

/// Deletes at most `batch` events of the lock history older than `retention`, in one
/// statement (one per pass: a backlog goes over the following passes). A table migrated
/// before the history existed has none to trim; any other failure is only logged.
async fn trim_history<DB: Backend>(table: &LockTable<DB>, retention: Duration, batch: u32) {
    match table.trim_events(retention, batch).await {
        Ok(0) => {}
        Ok(trimmed) => tracing::debug!(table = %table.name(), trimmed, "trimmed the lock history"),
        Err(Error::MissingTable { .. }) => {}
        Err(err) => {
            tracing::debug!(table = %table.name(), error = %err, "could not trim the lock history")
        }
    }
}

/// Deletes every expired row, in batches of `batch`, pausing the dialect's pace times each
/// batch's duration between batches; stops early (between batches) when `stop` is
/// cancelled.
pub(crate) async fn reap_all<DB: Backend>(
    table: &LockTable<DB>,
    counters: &Counters,
    (batch, retention): (u32, Option<Duration>),
    stop: Option<&CancellationToken>,
) -> Result<u64> {
    let (mut total, pace) = (0, table.reap_pace());
    loop {
        let started = Instant::now();
        let deleted = table.reap_batch(batch).await?;
        total += deleted;
        counters.reaped.fetch_add(deleted, Ordering::Relaxed);
        if deleted < u64::from(batch) {
            if total > 0 {
                tracing::info!(table = %table.name(), deleted = total, "reaped expired locks");
            }
            purge_tickets(table).await;
            if let Some(retention) = retention {
                trim_history(table, retention, batch).await;
            }
            return Ok(total);
        }
        let pause = started.elapsed() * pace;
        match stop {
            Some(stop) => tokio::select! {
                _ = stop.cancelled() => return Ok(total),
                _ = tokio::time::sleep(pause) => {}
            },
            None => tokio::time::sleep(pause).await,
        }
    }
}
