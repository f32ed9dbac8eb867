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
//! Each call looks its metric up in the installed recorder (as the facade's macros do)
//! instead of keeping handles: a handle taken before the application installed its
//! recorder would record nowhere, for good. The keys, though, are made once per lock
//! table ([`TableMetrics`]): a key is its labels in a `Vec` and their hash, and making
//! them on every call cost instructions and allocations every cycle, even with no
//! recorder (bench/RESULTS.md, "Figures behind choices in the code").
//!
//! # Spans
//! A call the caller waits on is a span, so that the caller's own span (a request) shows
//! the time spent in it. The convention, for `acquire`, `release` and job runs:
//! 1. Make the span at the start of the call, on the caller's task, so that its parent is
//!    the caller's current span: `tracing::info_span!("<name>", key, table, outcome =
//!    tracing::field::Empty)`.
//! 2. Run the call through [`in_span`] (given a closure that makes its future), which
//!    enters the span at every poll if a subscriber wants it (the crate's events inside
//!    nest under it) and records `outcome`, a word from the README's table, once the
//!    future is done (a disabled span is neither entered nor recorded). A call whose
//!    future is dropped leaves `outcome` empty, and records no metric.

// Without the feature the names, and the labels' words, are left unused.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::error::{Error, LostReason, Result};
use crate::key_label::KeyLabel;

/// Histogram, seconds: from the call of `try_acquire` / `acquire` to its outcome.
pub(crate) const ACQUIRE_TIME: &str = "distributed_lock_acquire_duration_seconds";
/// Counter: timeouts, lost leases and acquisition errors, by `reason`.
pub(crate) const FAILURE_COUNT: &str = "distributed_lock_failures_total";
/// Histogram, seconds: from a lease's acquisition to its release or loss.
pub(crate) const HOLD_TIME: &str = "distributed_lock_hold_duration_seconds";
/// Gauge: leases held by this process.
pub(crate) const HELD: &str = "distributed_lock_held";
/// Gauge: callers waiting in `acquire`.
pub(crate) const WAITERS: &str = "distributed_lock_waiters";
/// Counter: leases renewed (by the lease engine, and `LockGuard::extend`).
pub(crate) const RENEWALS: &str = "distributed_lock_renewals_total";
/// Gauge: leases held longer than the leak check's threshold.
pub(crate) const LONG_HELD: &str = "distributed_lock_long_held";
/// Counter: scheduled-job runs (the work was called), by `job`.
pub(crate) const JOB_RUNS: &str = "distributed_lock_job_runs_total";
/// Counter: scheduled-job runs skipped because another owner held the job, by `job`.
pub(crate) const JOB_SKIPS: &str = "distributed_lock_job_skips_total";
/// Counter: scheduled-job runs that lasted past the end of their period, by `job`.
pub(crate) const JOB_OVERRUNS: &str = "distributed_lock_job_overruns_total";

/// What a job's counters count: [`JOB_RUNS`], [`JOB_SKIPS`], [`JOB_OVERRUNS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobEvent {
    /// The work was called.
    Run,
    /// Another owner held the job: the work was not called.
    Skip,
    /// A run of a schedule lasted past its period's end.
    Overrun,
}

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
    /// Every outcome, in declaration order (the index of [`TableMetrics`]' keys).
    const ALL: [Outcome; 4] = [
        Outcome::Acquired,
        Outcome::Busy,
        Outcome::Timeout,
        Outcome::Error,
    ];

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

/// What was acquired: the `kind` label of [`ACQUIRE_TIME`] and the field of the `acquire`
/// span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A key's lock (`Locker::try_acquire` / `acquire`, an `Owner`'s).
    Mutex,
    /// A semaphore's permit.
    Semaphore,
    /// A read of a read-write lock.
    Read,
    /// A write of a read-write lock.
    Write,
    /// An election's lead.
    Leader,
    /// Several keys at once.
    Multi,
}

impl Kind {
    /// Every kind, in declaration order (the index of [`TableMetrics`]' keys).
    const ALL: [Kind; 6] = [
        Kind::Mutex,
        Kind::Semaphore,
        Kind::Read,
        Kind::Write,
        Kind::Leader,
        Kind::Multi,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Semaphore => "semaphore",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Leader => "leader",
            Kind::Multi => "multi",
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
    /// Every failure (the index of [`TableMetrics`]' keys, see [`index`](Self::index)).
    const ALL: [Failure; 7] = [
        Failure::Timeout,
        Failure::Lost(LostReason::Expired),
        Failure::Lost(LostReason::TakenOver),
        Failure::Lost(LostReason::Deleted),
        Failure::Lost(LostReason::Unreachable),
        Failure::Lost(LostReason::NoConnection),
        Failure::Error,
    ];

    /// Its place in [`ALL`](Self::ALL).
    fn index(self) -> usize {
        match self {
            Failure::Timeout => 0,
            Failure::Lost(LostReason::Expired) => 1,
            Failure::Lost(LostReason::TakenOver) => 2,
            Failure::Lost(LostReason::Deleted) => 3,
            Failure::Lost(LostReason::Unreachable) => 4,
            Failure::Lost(LostReason::NoConnection) => 5,
            Failure::Error => 6,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Lost(LostReason::Expired) => "lost_expired",
            Failure::Lost(LostReason::TakenOver) => "lost_taken_over",
            Failure::Lost(LostReason::Deleted) => "lost_deleted",
            Failure::Lost(LostReason::Unreachable) => "lost_unreachable",
            Failure::Lost(LostReason::NoConnection) => "lost_no_connection",
            Failure::Error => "error",
        }
    }
}

/// The metrics of one lock table: its name (the `table` label every metric carries, and
/// the spans' `table` field) and, with the feature on, every key its calls record to,
/// made once. Cloning it is an `Arc` clone.
#[derive(Clone)]
pub(crate) struct TableMetrics(Arc<Keys>);

struct Keys {
    table: Arc<str>,
    /// Whether the acquisition, hold and failure metrics name the key too: their keys
    /// below are then the start of one, completed per call (see `keyed`).
    key_label: KeyLabel,
    #[cfg(feature = "metrics")]
    acquire_time: [[::metrics::Key; Outcome::ALL.len()]; Kind::ALL.len()],
    #[cfg(feature = "metrics")]
    failure: [::metrics::Key; Failure::ALL.len()],
    #[cfg(feature = "metrics")]
    hold_time: ::metrics::Key,
    #[cfg(feature = "metrics")]
    held: ::metrics::Key,
    #[cfg(feature = "metrics")]
    waiters: ::metrics::Key,
    #[cfg(feature = "metrics")]
    renewals: ::metrics::Key,
}

impl TableMetrics {
    /// The metrics of the lock table `table`, with a `key` label as `key_label` says.
    pub(crate) fn new(table: &str, key_label: KeyLabel) -> Self {
        let table: Arc<str> = table.into();
        #[cfg(feature = "metrics")]
        let key = |name: &'static str, extra: &[(&'static str, &'static str)]| {
            let mut labels = vec![::metrics::Label::new("table", Arc::clone(&table))];
            labels.extend(
                extra
                    .iter()
                    .map(|(key, value)| ::metrics::Label::new(*key, *value)),
            );
            ::metrics::Key::from_parts(name, labels)
        };
        TableMetrics(Arc::new(Keys {
            #[cfg(feature = "metrics")]
            acquire_time: Kind::ALL.map(|k| {
                Outcome::ALL.map(|o| {
                    key(
                        ACQUIRE_TIME,
                        &[("outcome", o.as_str()), ("kind", k.as_str())],
                    )
                })
            }),
            #[cfg(feature = "metrics")]
            failure: Failure::ALL.map(|f| key(FAILURE_COUNT, &[("reason", f.as_str())])),
            #[cfg(feature = "metrics")]
            hold_time: key(HOLD_TIME, &[]),
            #[cfg(feature = "metrics")]
            held: key(HELD, &[]),
            #[cfg(feature = "metrics")]
            waiters: key(WAITERS, &[]),
            #[cfg(feature = "metrics")]
            renewals: key(RENEWALS, &[]),
            table,
            key_label,
        }))
    }

    /// The lock table's name.
    pub(crate) fn table(&self) -> &str {
        &self.0.table
    }
}

/// Runs `op` inside `span` and records its `outcome` field from what `op` returned, if a
/// subscriber wants the span (see the module docs: the convention for every span of the
/// crate). `span` must have been made on the caller's task, before this is awaited.
///
/// `op` makes the future where it is awaited: a future passed in by value is stored
/// twice by an async fn (as its argument, and as what it awaits), so `release`'s was
/// twice the size of its work, and copied whole on each move.
pub(crate) async fn in_span<F: Future>(
    span: Span,
    op: impl FnOnce() -> F,
    outcome: impl FnOnce(&F::Output) -> &'static str,
) -> F::Output {
    // A disabled span (no subscriber wants it) is not entered at each poll: entering and
    // leaving one does nothing a subscriber sees, and costs instructions at every poll.
    if span.is_disabled() {
        // Nobody can read the field either: recording it still went through tracing's
        // `log` bridge.
        return op().await;
    }
    let done = op().instrument(span.clone()).await;
    span.record("outcome", outcome(&done));
    done
}

// The two below return `acquisition`'s future itself rather than await it in an async fn
// of their own: each async layer is one more state machine that every poll walks through
// and every move copies.

/// One acquisition attempt (`try_acquire`) in an `acquire` span, its time and outcome
/// recorded.
pub(crate) fn try_acquire<'a, T: 'a>(
    metrics: &'a TableMetrics,
    kind: Kind,
    key: &'a str,
    attempt: impl Future<Output = Result<Option<T>>> + 'a,
) -> impl Future<Output = Result<Option<T>>> + 'a {
    acquisition(metrics, kind, key, attempt, Outcome::of_attempt)
}

/// A waiting acquisition (`acquire`, waiting up to `wait`) in an `acquire` span, its time
/// and outcome recorded.
pub(crate) fn acquire<'a, T: 'a>(
    metrics: &'a TableMetrics,
    kind: Kind,
    key: &'a str,
    wait: Duration,
    acquire: impl Future<Output = Result<T>> + 'a,
) -> impl Future<Output = Result<T>> + 'a {
    acquisition(metrics, kind, key, acquire, move |acquired| {
        Outcome::of_wait(acquired, wait)
    })
}

async fn acquisition<T>(
    metrics: &TableMetrics,
    kind: Kind,
    key: &str,
    op: impl Future<Output = Result<T>>,
    outcome: impl Fn(&Result<T>) -> Outcome,
) -> Result<T> {
    let started = Instant::now();
    let span = tracing::info_span!(
        "acquire",
        key,
        kind = kind.as_str(),
        table = metrics.table(),
        outcome = tracing::field::Empty
    );
    let acquired = in_span(span, || op, |acquired| outcome(acquired).as_str()).await;
    let outcome = outcome(&acquired);
    acquire_time(metrics, kind, outcome, key, started.elapsed().as_secs_f64());
    match outcome {
        Outcome::Timeout => failure(metrics, Failure::Timeout, key),
        Outcome::Error => failure(metrics, Failure::Error, key),
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

/// What the facade's macros give the recorder with each key: this module as the target,
/// at level INFO.
#[cfg(feature = "metrics")]
static METADATA: ::metrics::Metadata<'static> =
    ::metrics::Metadata::new(module_path!(), ::metrics::Level::INFO, Some(module_path!()));

/// The installed recorder's histogram for `key`.
#[cfg(feature = "metrics")]
fn histogram(key: &::metrics::Key) -> ::metrics::Histogram {
    describe();
    ::metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
}

/// The installed recorder's counter for `key`.
#[cfg(feature = "metrics")]
fn counter(key: &::metrics::Key) -> ::metrics::Counter {
    describe();
    ::metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
}

/// The installed recorder's gauge for `key`, moved by `delta`.
#[cfg(feature = "metrics")]
fn move_gauge(key: &::metrics::Key, delta: i64) {
    describe();
    let gauge = ::metrics::with_recorder(|recorder| recorder.register_gauge(key, &METADATA));
    if delta >= 0 {
        gauge.increment(delta as f64);
    } else {
        gauge.decrement(delta.unsigned_abs() as f64);
    }
}

/// `base` itself, made once, when no `key` label is wanted (the default: no cost per
/// call); else `base` with the `key` label for `key`, made now.
#[cfg(feature = "metrics")]
fn keyed<'a>(
    metrics: &TableMetrics,
    base: &'a ::metrics::Key,
    key: &str,
) -> std::borrow::Cow<'a, ::metrics::Key> {
    match metrics.0.key_label.value(key) {
        None => std::borrow::Cow::Borrowed(base),
        Some(value) => {
            let labels: Vec<::metrics::Label> = base
                .labels()
                .cloned()
                .chain([::metrics::Label::new("key", value.to_owned())])
                .collect();
            std::borrow::Cow::Owned(::metrics::Key::from_parts(base.name().to_owned(), labels))
        }
    }
}

/// Records an acquisition's time (seconds) and outcome.
pub(crate) fn acquire_time(
    metrics: &TableMetrics,
    kind: Kind,
    outcome: Outcome,
    key: &str,
    seconds: f64,
) {
    #[cfg(feature = "metrics")]
    {
        let base = &metrics.0.acquire_time[kind as usize][outcome as usize];
        histogram(&keyed(metrics, base, key)).record(seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, kind, outcome, key, seconds);
}

/// Counts a failure of `key`.
pub(crate) fn failure(metrics: &TableMetrics, failure: Failure, key: &str) {
    #[cfg(feature = "metrics")]
    counter(&keyed(metrics, &metrics.0.failure[failure.index()], key)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, failure, key);
}

/// Records how long a lease of `key` was held (seconds), once per lease.
pub(crate) fn hold_time(metrics: &TableMetrics, key: &str, seconds: f64) {
    #[cfg(feature = "metrics")]
    histogram(&keyed(metrics, &metrics.0.hold_time, key)).record(seconds);
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, key, seconds);
}

/// Moves the count of held leases by `delta` (+1 when a lease starts, -1 when it ends).
pub(crate) fn held(metrics: &TableMetrics, delta: i64) {
    #[cfg(feature = "metrics")]
    move_gauge(&metrics.0.held, delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, delta);
}

/// Moves the count of waiters by `delta` (+1 when one joins a queue, -1 when it leaves).
pub(crate) fn waiters(metrics: &TableMetrics, delta: i64) {
    #[cfg(feature = "metrics")]
    move_gauge(&metrics.0.waiters, delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, delta);
}

/// Counts `n` leases renewed.
pub(crate) fn renewals(metrics: &TableMetrics, n: u64) {
    #[cfg(feature = "metrics")]
    counter(&metrics.0.renewals).increment(n);
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, n);
}

/// Sets the count of leases held longer than the leak check's threshold. Called once per
/// leak check, so its key is made here.
pub(crate) fn long_held(table: &str, count: usize) {
    #[cfg(feature = "metrics")]
    {
        describe();
        ::metrics::gauge!(LONG_HELD, "table" => table.to_owned()).set(count as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, count);
}

/// Counts one `event` of the job `job` (a [`Job`](crate::Job)'s key, a schedule's name).
/// Jobs are few, so their name is a label, and its key is made here, per call.
pub(crate) fn job(metrics: &TableMetrics, job: &str, event: JobEvent) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let name = match event {
            JobEvent::Run => JOB_RUNS,
            JobEvent::Skip => JOB_SKIPS,
            JobEvent::Overrun => JOB_OVERRUNS,
        };
        ::metrics::counter!(name, "table" => metrics.table().to_owned(), "job" => job.to_owned())
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (metrics, job, event);
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
        describe_counter!(
            JOB_RUNS,
            "Scheduled-job runs on this process (Job::run and schedules), by job"
        );
        describe_counter!(
            JOB_SKIPS,
            "Scheduled-job runs skipped on this process because another owner held the job, by job"
        );
        describe_counter!(
            JOB_OVERRUNS,
            "Runs of a schedule on this process that lasted past the end of their period, by job"
        );
        describe_gauge!(
            LONG_HELD,
            "Live rows of the lock table, whoever holds them, acquired longer ago than the leak check's threshold at its last check"
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each outcome and failure records to the key made for it (the keys are found by
    /// position), with the table's label and its own.
    #[test]
    fn every_outcome_and_failure_has_its_own_key() {
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, i, "{outcome:?}");
        }
        for (i, failure) in Failure::ALL.into_iter().enumerate() {
            assert_eq!(failure.index(), i, "{failure:?}");
        }
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, i, "{kind:?}");
        }
        #[cfg(feature = "metrics")]
        {
            let metrics = TableMetrics::new("locks", KeyLabel::Off);
            let labels = |key: &::metrics::Key| {
                key.labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect::<Vec<_>>()
            };
            let key = &metrics.0.acquire_time[Kind::Semaphore as usize][Outcome::Timeout as usize];
            assert_eq!(key.name(), ACQUIRE_TIME);
            assert_eq!(
                labels(key),
                ["table=locks", "outcome=timeout", "kind=semaphore"]
            );
            let key = &metrics.0.failure[Failure::Lost(LostReason::Deleted).index()];
            assert_eq!(key.name(), FAILURE_COUNT);
            assert_eq!(labels(key), ["table=locks", "reason=lost_deleted"]);
            assert_eq!(labels(&metrics.0.held), ["table=locks"]);
        }
    }
}
