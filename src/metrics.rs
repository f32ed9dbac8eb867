//! What dblock tells operators besides its events: metrics, and the spans of the calls a
//! caller waits on. A leaf: the layers above call these small functions at the one place
//! each thing happens, and nothing here knows about lockers or leases.
//!
//! # Metrics
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade (cargo feature
//! `metrics`, on by default) into whatever recorder the application installed; the
//! library has no exporter. With the feature off every function below is empty and the
//! `metrics` crate is not a dependency. The names, labels and units are listed once, in
//! the README ("Metrics and tracing"); every metric carries the label `table`.
//!
//! Each call looks its metric up in the installed recorder (the facade's macros) instead
//! of keeping handles: a handle taken before the application installed its recorder would
//! record nowhere, for good. That is a map lookup per call, next to a database round trip;
//! the `table` label is the engine's shared name (`Arc<str>`), so making the key
//! allocates nothing.
//!
//! # Spans
//! A call the caller waits on is a span, so that the caller's own span (a request) shows
//! the time spent in it. The convention, for `acquire`, `release` and job runs:
//! 1. Make the span at the start of the call, on the caller's task, so that its parent is
//!    the caller's current span: `tracing::info_span!("<name>", key, table, outcome =
//!    tracing::field::Empty)`.
//! 2. Run the call's future through [`in_span`], which enters the span at every poll (the
//!    crate's events inside nest under it) and records `outcome`, a word from the README's
//!    table, once the future is done. A call whose future is dropped leaves `outcome`
//!    empty, and records no metric.

// Without the feature the names, and the labels' words, are left unused.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::error::{Error, LostReason, Result};

/// Histogram, seconds: from the call of `try_acquire` / `acquire` to its outcome.
pub(crate) const ACQUIRE_TIME: &str = "distributed_lock_acquire_time";
/// Counter: timeouts, lost leases and acquisition errors, by `reason`.
pub(crate) const FAILURE_COUNT: &str = "distributed_lock_failure_count";
/// Histogram, seconds: from a lease's acquisition to its release or loss.
pub(crate) const HOLD_TIME: &str = "distributed_lock_hold_time";
/// Gauge: leases held by this process.
pub(crate) const HELD: &str = "distributed_lock_held";
/// Gauge: callers waiting in `acquire`.
pub(crate) const WAITERS: &str = "distributed_lock_waiters";
/// Counter: leases renewed (by the lease engine, and `LockGuard::extend`).
pub(crate) const RENEWALS: &str = "distributed_lock_renewals";
/// Gauge: leases held longer than the leak check's threshold.
pub(crate) const LONG_HELD: &str = "distributed_lock_long_held";

/// What an acquisition came to: the `outcome` label of [`ACQUIRE_TIME`] and the field of
/// the `acquire` span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The lock was won.
    Acquired,
    /// Held by someone else, and the caller did not wait (`try_acquire`, a zero wait).
    Busy,
    /// The wait ran out ([`Error::Timeout`]).
    Timeout,
    /// Any other error.
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }

    /// One attempt's outcome: `None` is busy.
    fn of_attempt<T>(attempt: &Result<Option<T>>) -> Self {
        match attempt {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) => Outcome::Busy,
            Err(err) => Outcome::of_error(err),
        }
    }

    /// A waiting acquisition's outcome: a zero wait that timed out made a single attempt,
    /// and lost it: busy, as `try_acquire` would say.
    fn of_wait<T>(acquired: &Result<T>, wait: Duration) -> Self {
        match acquired {
            Ok(_) => Outcome::Acquired,
            Err(Error::Timeout { .. }) if wait.is_zero() => Outcome::Busy,
            Err(err) => Outcome::of_error(err),
        }
    }

    fn of_error(err: &Error) -> Self {
        match err {
            Error::Timeout { .. } => Outcome::Timeout,
            _ => Outcome::Error,
        }
    }
}

/// What [`FAILURE_COUNT`] counts, as its `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A waiting acquisition ran out of time.
    Timeout,
    /// A held lease was lost.
    Lost(LostReason),
    /// An acquisition failed with another error.
    Error,
}

impl Failure {
    fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Lost(LostReason::Expired) => "lost_expired",
            Failure::Lost(LostReason::TakenOver) => "lost_taken_over",
            Failure::Lost(LostReason::Deleted) => "lost_deleted",
            Failure::Lost(LostReason::Unreachable) => "lost_unreachable",
            Failure::Error => "error",
        }
    }
}

/// Runs `op` inside `span` and records its `outcome` field from what `op` returned (see
/// the module docs: the convention for every span of the crate). `span` must have been
/// made on the caller's task, before this is awaited.
pub(crate) async fn in_span<T>(
    span: Span,
    op: impl Future<Output = T>,
    outcome: impl FnOnce(&T) -> &'static str,
) -> T {
    let done = op.instrument(span.clone()).await;
    span.record("outcome", outcome(&done));
    done
}

/// One acquisition attempt (`try_acquire`) in an `acquire` span, its time and outcome
/// recorded.
pub(crate) async fn try_acquire<T>(
    table: &Arc<str>,
    key: &str,
    attempt: impl Future<Output = Result<Option<T>>>,
) -> Result<Option<T>> {
    acquisition(table, key, attempt, Outcome::of_attempt).await
}

/// A waiting acquisition (`acquire`, waiting up to `wait`) in an `acquire` span, its time
/// and outcome recorded.
pub(crate) async fn acquire<T>(
    table: &Arc<str>,
    key: &str,
    wait: Duration,
    acquire: impl Future<Output = Result<T>>,
) -> Result<T> {
    acquisition(table, key, acquire, |acquired| {
        Outcome::of_wait(acquired, wait)
    })
    .await
}

async fn acquisition<T>(
    table: &Arc<str>,
    key: &str,
    op: impl Future<Output = Result<T>>,
    outcome: impl Fn(&Result<T>) -> Outcome,
) -> Result<T> {
    let started = Instant::now();
    let span = tracing::info_span!(
        "acquire",
        key,
        table = &**table,
        outcome = tracing::field::Empty
    );
    let acquired = in_span(span, op, |acquired| outcome(acquired).as_str()).await;
    let outcome = outcome(&acquired);
    acquire_time(table, outcome, started.elapsed().as_secs_f64());
    match outcome {
        Outcome::Timeout => failure(table, Failure::Timeout),
        Outcome::Error => failure(table, Failure::Error),
        Outcome::Acquired | Outcome::Busy => {}
    }
    acquired
}

/// The `release` span of a guard's release.
pub(crate) fn release_span(key: &str, table: &str) -> Span {
    tracing::info_span!("release", key, table, outcome = tracing::field::Empty)
}

/// The `outcome` of a release whose guard was nested in another (a reentrant `Owner`):
/// only its hold was given back.
pub(crate) const NESTED: &str = "nested";

/// The `outcome` of a release, from what it returned.
pub(crate) fn release_outcome(released: &Result<()>) -> &'static str {
    match released {
        Ok(()) => "released",
        Err(Error::LockLost { .. }) => "expired",
        Err(Error::NotHeld { .. }) => "not_held",
        Err(_) => "error",
    }
}

// The metrics themselves. With the feature off each body is empty (the arguments are
// only "used"), so every hook compiles to nothing.

/// Records an acquisition's time (seconds) and outcome.
pub(crate) fn acquire_time(table: &Arc<str>, outcome: Outcome, seconds: f64) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let outcome = outcome.as_str();
        ::metrics::histogram!(ACQUIRE_TIME, "table" => Arc::clone(table), "outcome" => outcome)
            .record(seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, outcome, seconds);
}

/// Counts a failure.
pub(crate) fn failure(table: &Arc<str>, failure: Failure) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let reason = failure.as_str();
        ::metrics::counter!(FAILURE_COUNT, "table" => Arc::clone(table), "reason" => reason)
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, failure);
}

/// Records how long a lease was held (seconds), once per lease.
pub(crate) fn hold_time(table: &Arc<str>, seconds: f64) {
    #[cfg(feature = "metrics")]
    {
        describe();
        ::metrics::histogram!(HOLD_TIME, "table" => Arc::clone(table)).record(seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, seconds);
}

/// Moves the count of held leases by `delta` (+1 when a lease starts, -1 when it ends).
pub(crate) fn held(table: &Arc<str>, delta: i64) {
    #[cfg(feature = "metrics")]
    move_gauge(::metrics::gauge!(HELD, "table" => Arc::clone(table)), delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (table, delta);
}

/// Moves the count of waiters by `delta` (+1 when one joins a queue, -1 when it leaves).
pub(crate) fn waiters(table: &Arc<str>, delta: i64) {
    #[cfg(feature = "metrics")]
    move_gauge(
        ::metrics::gauge!(WAITERS, "table" => Arc::clone(table)),
        delta,
    );
    #[cfg(not(feature = "metrics"))]
    let _ = (table, delta);
}

/// Counts `n` leases renewed.
pub(crate) fn renewals(table: &Arc<str>, n: u64) {
    #[cfg(feature = "metrics")]
    {
        describe();
        ::metrics::counter!(RENEWALS, "table" => Arc::clone(table)).increment(n);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, n);
}

/// Sets the count of leases held longer than the leak check's threshold.
pub(crate) fn long_held(table: &str, count: usize) {
    #[cfg(feature = "metrics")]
    {
        describe();
        ::metrics::gauge!(LONG_HELD, "table" => table.to_owned()).set(count as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, count);
}

#[cfg(feature = "metrics")]
fn move_gauge(gauge: ::metrics::Gauge, delta: i64) {
    describe();
    if delta >= 0 {
        gauge.increment(delta as f64);
    } else {
        gauge.decrement(delta.unsigned_abs() as f64);
    }
}

/// Gives the installed recorder each metric's unit and meaning (the `# HELP` lines of a
/// Prometheus scrape), once per process: at the first metric recorded, by which time an
/// application has normally installed its recorder.
#[cfg(feature = "metrics")]
fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        describe_histogram!(
            ACQUIRE_TIME,
            Unit::Seconds,
            "Time from a call of try_acquire or acquire to its outcome"
        );
        describe_counter!(
            FAILURE_COUNT,
            "Acquisitions that timed out or failed, and leases lost, by reason"
        );
        describe_histogram!(
            HOLD_TIME,
            Unit::Seconds,
            "Time from a lease's acquisition to its release or loss"
        );
        describe_gauge!(HELD, "Leases held by this process");
        describe_gauge!(WAITERS, "Callers of this process waiting in acquire");
        describe_counter!(
            RENEWALS,
            "Leases renewed (by the lease engine, and by extend)"
        );
        describe_gauge!(
            LONG_HELD,
            "Live rows of the lock table, whoever holds them, acquired longer ago than the leak check's threshold at its last check"
        );
    });
}
