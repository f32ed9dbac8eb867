//! Issue 4's metrics and issue 6's spans, read back on every backend: names, labels and
//! exact values through a recording recorder ([`record`]), and the `acquire` / `release`
//! spans through a recording tracing layer.
//!
//! Each case works in a lock table of its own ([`TestDb`]) and reads only the metrics and
//! spans of that table, so the cases run in parallel in one binary with one global
//! recorder. Times are bounded by what the case measured around the calls.

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
mod common;
#[path = "metrics/record.rs"]
mod record;

use std::time::Duration;

use dblock::{Error, KeyLabel, Locker, LostReason};
use tokio::time::{Instant, timeout};
use tracing::Instrument;

use common::{TestBackend, TestDb, wait_until};
use record::{Metrics, SpanRecord, labels};

const ACQUIRE_TIME: &str = "distributed_lock_acquire_duration_seconds";
const FAILURE_COUNT: &str = "distributed_lock_failures_total";
const HOLD_TIME: &str = "distributed_lock_hold_duration_seconds";
const HELD: &str = "distributed_lock_held";
const WAITERS: &str = "distributed_lock_waiters";
const RENEWALS: &str = "distributed_lock_renewals_total";
const JOB_RUNS: &str = "distributed_lock_job_runs_total";
const JOB_SKIPS: &str = "distributed_lock_job_skips_total";
const JOB_OVERRUNS: &str = "distributed_lock_job_overruns_total";

/// A lease that never runs out during a case.
const LONG: Duration = Duration::from_secs(30);
/// Bound for anything awaited or polled: far above what a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(15);

/// The case's database, with the recorder installed first.
async fn open<DB: TestBackend>() -> Option<TestDb<DB>> {
    record::install();
    TestDb::open().await
}

fn metrics<DB: TestBackend>(db: &TestDb<DB>) -> Metrics {
    record::of_table(&db.table)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Asserts `lower <= value <= upper` (seconds), saying which bound failed.
fn assert_within(what: &str, value: f64, lower: Duration, upper: Duration) {
    assert!(
        secs(lower) <= value && value <= secs(upper),
        "{what}: {value} s is outside the measured [{}, {}] s",
        secs(lower),
        secs(upper)
    );
}

/// Acquired, busy (`try_acquire`, and a zero-wait `acquire`) and timeout: one histogram
/// value each with the right `outcome`, a `timeout` failure, the held gauge up while held
/// and back to 0 after the release, one hold time within the measured interval, and an
/// `extend` counted as one renewal. Every metric has exactly its documented labels.
pub async fn outcomes_are_labelled<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let locker = &db.locker;
    let t0 = Instant::now();
    let guard = locker.try_acquire("k", LONG).await.unwrap().expect("free");
    let t1 = Instant::now();
    assert!(locker.try_acquire("k", LONG).await.unwrap().is_none());
    match locker.acquire("k", LONG, Duration::ZERO).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a zero wait on a held key: {other:?}"),
    }
    let wait = Duration::from_millis(200);
    let t2 = Instant::now();
    match locker.acquire("k", LONG, wait).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a wait on a held key: {other:?}"),
    }
    let t3 = Instant::now();

    let m = metrics(&db);
    let counts = m.histogram_counts(ACQUIRE_TIME);
    let expected = [
        (labels(&[("outcome", "acquired"), ("kind", "mutex")]), 1),
        (labels(&[("outcome", "busy"), ("kind", "mutex")]), 2),
        (labels(&[("outcome", "timeout"), ("kind", "mutex")]), 1),
    ];
    assert_eq!(counts, expected.into_iter().collect(), "acquire outcomes");
    let acquired = m.histogram(ACQUIRE_TIME, &[("outcome", "acquired"), ("kind", "mutex")]);
    assert_within("acquired time", acquired[0], Duration::ZERO, t1 - t0);
    let timed_out = m.histogram(ACQUIRE_TIME, &[("outcome", "timeout"), ("kind", "mutex")]);
    assert_within("timeout time", timed_out[0], wait, t3 - t2);
    let failures = m.counters_named(FAILURE_COUNT);
    let expected = [(labels(&[("reason", "timeout")]), 1)];
    assert_eq!(
        failures,
        expected.into_iter().collect(),
        "only the timeout failed"
    );
    assert_eq!(m.gauge(HELD, &[]), 1.0, "one lease held");
    assert_eq!(m.gauge(WAITERS, &[]), 0.0, "the timed-out waiters left");
    assert!(
        m.histogram(HOLD_TIME, &[]).is_empty(),
        "nothing released yet"
    );
    assert_eq!(m.unit(ACQUIRE_TIME), Some(metrics::Unit::Seconds));
    assert_eq!(m.unit(HOLD_TIME), Some(metrics::Unit::Seconds));

    guard.extend(LONG).await.unwrap();
    assert_eq!(
        metrics(&db).counter(RENEWALS, &[]),
        1,
        "an extend is a renewal"
    );

    let t4 = Instant::now();
    guard.release().await.unwrap();
    let t5 = Instant::now();
    let m = metrics(&db);
    assert_eq!(m.gauge(HELD, &[]), 0.0, "released");
    let held = m.histogram(HOLD_TIME, &[]);
    assert_eq!(held.len(), 1, "one hold time: {held:?}");
    assert_within("hold time", held[0], t4 - t1, t5 - t0);

    let documented = |name: &str| -> Vec<String> {
        let mut labels = vec!["table".to_owned()];
        match name {
            ACQUIRE_TIME => labels.extend(["outcome".to_owned(), "kind".to_owned()]),
            FAILURE_COUNT => labels.push("reason".to_owned()),
            _ => {}
        }
        labels.sort();
        labels
    };
    for (name, labels) in m.label_names() {
        assert!(name.starts_with("distributed_lock_"), "{name}");
        assert_eq!(labels, documented(&name), "the labels of {name}");
    }
}

/// Acquisitions that fail (no lock table) are `error` outcomes and `error` failures, from
/// `try_acquire` and from a waiting `acquire` alike.
pub async fn errors_are_counted<DB: TestBackend>() {
    record::install();
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let err = db.locker.try_acquire("k", LONG).await.unwrap_err();
    assert!(matches!(err, Error::MissingTable { .. }), "{err:?}");
    let err = db.locker.acquire("k", LONG, LONG).await.unwrap_err();
    assert!(matches!(err, Error::MissingTable { .. }), "{err:?}");
    let m = metrics(&db);
    let expected = [(labels(&[("outcome", "error"), ("kind", "mutex")]), 2)];
    let counts = m.histogram_counts(ACQUIRE_TIME);
    assert_eq!(counts, expected.into_iter().collect());
    let expected = [(labels(&[("reason", "error")]), 2)];
    let failures = m.counters_named(FAILURE_COUNT);
    assert_eq!(failures, expected.into_iter().collect());
    assert_eq!(m.gauge(HELD, &[]), 0.0);
}

/// A row deleted behind a renewed guard's back: `lost_deleted` once, the hold ends at the
/// loss (held back to 0, one hold time within the measured interval), and the release
/// that follows records nothing more. Renewals match the engine's own count.
pub async fn deleted_lease_is_counted_once<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let locker = Locker::builder(db.pool.clone())
        .table(&db.table)
        .renew_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let guard = locker.try_acquire("k", LONG).await.unwrap().expect("free");
    let t1 = Instant::now();
    wait_until("the engine renewed once", PATIENCE, async || {
        locker.stats().renewed >= 1
    })
    .await;
    let t2 = Instant::now();
    assert_eq!(db.plain.delete("k").await, 1);
    let reason = timeout(PATIENCE, guard.lost()).await.expect("lost() fires");
    let t3 = Instant::now();
    assert_eq!(reason, LostReason::Deleted);

    let m = metrics(&db);
    let failures = m.counters_named(FAILURE_COUNT);
    let expected = [(labels(&[("reason", "lost_deleted")]), 1)];
    assert_eq!(failures, expected.into_iter().collect());
    assert_eq!(m.gauge(HELD, &[]), 0.0, "a lost lease is not held");
    let held = m.histogram(HOLD_TIME, &[]);
    assert_eq!(held.len(), 1, "one hold time: {held:?}");
    assert_within("hold time", held[0], t2 - t1, t3 - t0);
    assert_eq!(
        m.counter(RENEWALS, &[]),
        locker.stats().renewed,
        "every renewal counted"
    );

    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
    let m = metrics(&db);
    assert_eq!(
        m.gauge(HELD, &[]),
        0.0,
        "the release after the loss lowers nothing"
    );
    assert_eq!(
        m.histogram(HOLD_TIME, &[]).len(),
        1,
        "nor times the hold again"
    );
    assert_eq!(m.counter(FAILURE_COUNT, &[("reason", "lost_deleted")]), 1);
    locker.shutdown().await;
}

/// A lease nobody renews ends at its deadline: `lost_expired`, and a hold time of at
/// least the lease.
pub async fn expired_lease_is_counted<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let lease = Duration::from_millis(300);
    let t0 = Instant::now();
    let guard = db.locker.try_acquire("k", lease).await.unwrap().unwrap();
    let reason = timeout(PATIENCE, guard.lost()).await.expect("lost() fires");
    let t1 = Instant::now();
    assert_eq!(reason, LostReason::Expired);
    let m = metrics(&db);
    assert_eq!(m.counter(FAILURE_COUNT, &[("reason", "lost_expired")]), 1);
    assert_eq!(m.gauge(HELD, &[]), 0.0);
    let held = m.histogram(HOLD_TIME, &[]);
    assert_eq!(held.len(), 1, "one hold time: {held:?}");
    // The lease ends locally a margin before the database's expiry.
    let local = lease - db.locker.lease_margin(lease);
    assert_within("hold time", held[0], local, t1 - t0);
    drop(guard);
}

/// A loss that only the release finds (a guard that is not renewed: its row deleted by
/// hand, or its lease run out) is counted like one the engine finds, once.
pub async fn a_loss_found_by_the_release_is_counted<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let deleted = db
        .locker
        .try_acquire("deleted", LONG)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(db.plain.delete("deleted").await, 1);
    assert!(matches!(
        deleted.release().await,
        Err(Error::NotHeld { .. })
    ));
    let short = Duration::from_millis(300);
    let expired = db
        .locker
        .try_acquire("expired", short)
        .await
        .unwrap()
        .unwrap();
    wait_until(
        "the lease ran out by the database clock",
        PATIENCE,
        async || {
            db.locker
                .holder("expired")
                .await
                .unwrap()
                .is_some_and(|h| h.expired)
        },
    )
    .await;
    let released = expired.release().await;
    assert!(
        matches!(
            released,
            Err(Error::LockLost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{released:?}"
    );
    let m = metrics(&db);
    assert_eq!(m.counter(FAILURE_COUNT, &[("reason", "lost_deleted")]), 1);
    assert_eq!(m.counter(FAILURE_COUNT, &[("reason", "lost_expired")]), 1);
    assert_eq!(m.gauge(HELD, &[]), 0.0);
    assert_eq!(m.histogram(HOLD_TIME, &[]).len(), 2, "one hold time each");
}

/// The waiters gauge follows the queue: up for each waiter, down when one is cancelled,
/// and when one wins.
pub async fn waiters_are_counted_until_they_leave<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let locker = db.locker.clone();
    let guard = locker.try_acquire("k", LONG).await.unwrap().expect("free");
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move { locker.acquire("k", LONG, PATIENCE).await }
    });
    wait_until("one waiter queued", PATIENCE, async || {
        locker.waiting("k") == 1
    })
    .await;
    let cancelled = tokio::spawn({
        let locker = locker.clone();
        async move { locker.acquire("k", LONG, PATIENCE).await }
    });
    wait_until("two waiters queued", PATIENCE, async || {
        locker.waiting("k") == 2
    })
    .await;
    assert_eq!(metrics(&db).gauge(WAITERS, &[]), 2.0);
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    assert_eq!(
        metrics(&db).gauge(WAITERS, &[]),
        1.0,
        "the cancelled one left"
    );

    guard.release().await.unwrap();
    let second = waiter
        .await
        .unwrap()
        .expect("the waiter wins after the release");
    let m = metrics(&db);
    assert_eq!(m.gauge(WAITERS, &[]), 0.0, "the winner left the queue");
    assert_eq!(m.gauge(HELD, &[]), 1.0);
    assert_eq!(
        m.histogram(ACQUIRE_TIME, &[("outcome", "acquired"), ("kind", "mutex")])
            .len(),
        2
    );
    second.release().await.unwrap();
    let m = metrics(&db);
    assert_eq!(m.gauge(HELD, &[]), 0.0);
    assert_eq!(m.histogram(HOLD_TIME, &[]).len(), 2);
}

/// A reentrant owner's nested guards share one lease: one held, one hold time, however
/// many guards; each acquisition is an `acquired` outcome.
pub async fn nested_guards_count_one_lease<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let owner = db.locker.owner();
    let outer = owner.try_acquire("k", LONG).await.unwrap().expect("free");
    let inner = owner.acquire("k", LONG, LONG).await.unwrap();
    let m = metrics(&db);
    assert_eq!(m.gauge(HELD, &[]), 1.0, "one lease");
    assert_eq!(
        m.histogram(ACQUIRE_TIME, &[("outcome", "acquired"), ("kind", "mutex")])
            .len(),
        2
    );
    outer.release().await.unwrap();
    let m = metrics(&db);
    assert_eq!(m.gauge(HELD, &[]), 1.0, "still held by the inner guard");
    assert!(m.histogram(HOLD_TIME, &[]).is_empty());
    inner.release().await.unwrap();
    let m = metrics(&db);
    assert_eq!(m.gauge(HELD, &[]), 0.0);
    assert_eq!(m.histogram(HOLD_TIME, &[]).len(), 1);
}

/// A dropped guard's background release ends its hold too (the engine's shutdown waits
/// for that release).
pub async fn dropped_guard_ends_its_hold<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let guard = db
        .locker
        .try_acquire("k", LONG)
        .await
        .unwrap()
        .expect("free");
    drop(guard);
    db.locker.shutdown().await;
    let m = metrics(&db);
    assert_eq!(m.gauge(HELD, &[]), 0.0);
    assert_eq!(m.histogram(HOLD_TIME, &[]).len(), 1);
}

/// `acquire` and `release` are spans with key, table and outcome, children of the
/// caller's span, also through `with_lock`.
pub async fn spans_nest_under_the_callers_span<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let locker = &db.locker;
    let request = tracing::info_span!("request", table = %db.table);
    async {
        let guard = locker.try_acquire("k", LONG).await.unwrap().expect("free");
        assert!(locker.try_acquire("k", LONG).await.unwrap().is_none());
        let waited = locker.acquire("k", LONG, Duration::from_millis(50)).await;
        assert!(matches!(waited, Err(Error::Timeout { .. })));
        guard.release().await.unwrap();
        let work = async |_: &dblock::LockGuard<DB>| Ok::<_, Error>(());
        locker.with_lock("w", LONG, LONG, work).await.unwrap();
    }
    .instrument(request)
    .await;

    let spans = record::spans();
    let table = db.table.as_str();
    let field = |span: &SpanRecord, name: &str| span.fields.get(name).cloned();
    let parent = spans
        .iter()
        .position(|s| s.name == "request" && field(s, "table").as_deref() == Some(table))
        .expect("the request span");
    let ours: Vec<(&str, String, String)> = spans
        .iter()
        .filter(|s| field(s, "table").as_deref() == Some(table) && s.name != "request")
        .map(|s| {
            assert_eq!(s.parent, Some(parent), "{s:?} is a child of the request");
            let key = field(s, "key").expect("a key field");
            (s.name, key, field(s, "outcome").unwrap_or_default())
        })
        .collect();
    let owned = |(name, key, outcome): (&'static str, &str, &str)| {
        (name, key.to_owned(), outcome.to_owned())
    };
    let expected: Vec<_> = [
        ("acquire", "k", "acquired"),
        ("acquire", "k", "busy"),
        ("acquire", "k", "timeout"),
        ("release", "k", "released"),
        ("acquire", "w", "acquired"),
        ("release", "w", "released"),
    ]
    .into_iter()
    .map(owned)
    .collect();
    assert_eq!(ours, expected);
}

/// Every primitive's acquisitions are timed under its own `kind`: one `acquired` value
/// each, and a `busy` permit of a full semaphore.
pub async fn primitives_are_labelled_by_kind<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let locker = &db.locker;
    let semaphore = locker.semaphore("s", 1);
    let permit = semaphore.try_acquire(LONG).await.unwrap().expect("free");
    assert!(semaphore.try_acquire(LONG).await.unwrap().is_none());
    let read = locker.rw_lock("r").read(LONG, PATIENCE).await.unwrap();
    let write = locker
        .rw_lock("w")
        .try_write(LONG)
        .await
        .unwrap()
        .expect("free");
    let lead = locker.election("e").campaign("me", LONG).await.unwrap();
    let both = locker
        .try_acquire_all(&["a", "b"], LONG)
        .await
        .unwrap()
        .expect("free");
    let counts = metrics(&db).histogram_counts(ACQUIRE_TIME);
    let expected = [
        (labels(&[("outcome", "acquired"), ("kind", "semaphore")]), 1),
        (labels(&[("outcome", "busy"), ("kind", "semaphore")]), 1),
        (labels(&[("outcome", "acquired"), ("kind", "read")]), 1),
        (labels(&[("outcome", "acquired"), ("kind", "write")]), 1),
        (labels(&[("outcome", "acquired"), ("kind", "leader")]), 1),
        (labels(&[("outcome", "acquired"), ("kind", "multi")]), 1),
    ];
    assert_eq!(
        counts,
        expected.into_iter().collect(),
        "acquisitions by kind"
    );
    permit.release().await.unwrap();
    read.release().await.unwrap();
    write.release().await.unwrap();
    lead.resign().await.unwrap();
    both.release().await.unwrap();
}

/// `metrics_key_label`: with [`KeyLabel::Prefix`] the acquisition, failure and hold
/// metrics carry `key` = the key up to its first `:`, with [`KeyLabel::Full`] the whole
/// key; the gauges and the renewal counter keep only `table`. Exact label sets, read
/// back from the recorder.
pub async fn key_label_names_the_key<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let keyed = |label| {
        Locker::builder(db.pool.clone())
            .table(&db.table)
            .auto_renew(false)
            .metrics_key_label(label)
            .build()
            .unwrap()
    };
    let prefix = keyed(KeyLabel::Prefix);
    let full = keyed(KeyLabel::Full);
    let guard = prefix
        .try_acquire("invoice:1", LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(
        prefix
            .try_acquire("invoice:1", LONG)
            .await
            .unwrap()
            .is_none()
    );
    db.plain.insert("report", "plain-client", 60).await.unwrap();
    match prefix
        .acquire("report", LONG, Duration::from_millis(100))
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a wait on a held key: {other:?}"),
    }
    let whole = full.try_acquire("invoice:2", LONG).await.unwrap().unwrap();
    guard.release().await.unwrap();
    whole.release().await.unwrap();

    let m = metrics(&db);
    let expected = [
        (
            labels(&[
                ("outcome", "acquired"),
                ("kind", "mutex"),
                ("key", "invoice"),
            ]),
            1,
        ),
        (
            labels(&[("outcome", "busy"), ("kind", "mutex"), ("key", "invoice")]),
            1,
        ),
        (
            labels(&[("outcome", "timeout"), ("kind", "mutex"), ("key", "report")]),
            1,
        ),
        (
            labels(&[
                ("outcome", "acquired"),
                ("kind", "mutex"),
                ("key", "invoice:2"),
            ]),
            1,
        ),
    ];
    assert_eq!(
        m.histogram_counts(ACQUIRE_TIME),
        expected.into_iter().collect()
    );
    let expected = [(labels(&[("reason", "timeout"), ("key", "report")]), 1)];
    assert_eq!(
        m.counters_named(FAILURE_COUNT),
        expected.into_iter().collect()
    );
    assert_eq!(m.histogram(HOLD_TIME, &[("key", "invoice")]).len(), 1);
    assert_eq!(m.histogram(HOLD_TIME, &[("key", "invoice:2")]).len(), 1);
    assert!(
        m.histogram(HOLD_TIME, &[]).is_empty(),
        "no hold without its key"
    );
    assert_eq!(m.gauge(HELD, &[]), 0.0, "the held gauge has no key label");
}

/// Job runs, skips and overruns, labelled `table` and `job`: `Job::run` counts a run and
/// a skip (under its key); a schedule counts its runs, the skip of a second node in the
/// same period, and a run that ends after its period's end (under its name).
pub async fn jobs_are_counted<DB: TestBackend>() {
    let Some(db) = open::<DB>().await else {
        return;
    };
    let locker = &db.locker;
    let job = || locker.job("report").lock_at_least_for(LONG);
    assert!(
        job()
            .run(async |_| Ok::<_, Error>(()))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        job()
            .run(async |_| Ok::<_, Error>(()))
            .await
            .unwrap()
            .is_none()
    );

    // Long enough that a busy machine's delays fit in its quarters.
    const PERIOD: Duration = Duration::from_secs(2);
    let (node_a, node_b) = (
        locker.schedule("rollup", PERIOD),
        locker.schedule("rollup", PERIOD),
    );
    let quick = async |_: dblock::Period| Ok::<_, Error>(());
    let first = node_a.run_once(quick).await.unwrap();
    let skipped = node_b.run_once(quick).await.unwrap();
    assert_eq!(first.period, skipped.period, "one period");
    // Halfway through the next period, a run of three quarters of a period: an overrun.
    tokio::time::sleep_until(first.next_period_at + PERIOD / 2).await;
    let slow = async |_: dblock::Period| {
        // Outlasting the period is the point.
        tokio::time::sleep(PERIOD * 3 / 4).await;
        Ok::<_, Error>(())
    };
    let overran = node_a.run_once(slow).await.unwrap();
    assert!(
        matches!(overran.turn, dblock::Turn::Ran { overran: true, .. }),
        "{overran:?}"
    );

    let m = metrics(&db);
    let by_job = |name| m.counters_named(name);
    let expected = |report, rollup| {
        [
            (labels(&[("job", "report")]), report),
            (labels(&[("job", "rollup")]), rollup),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    };
    assert_eq!(by_job(JOB_RUNS), expected(1, 2), "runs");
    assert_eq!(by_job(JOB_SKIPS), expected(1, 1), "skips");
    assert_eq!(by_job(JOB_OVERRUNS), expected(0, 1), "overruns");
    for (name, labels) in m.label_names() {
        if name.starts_with("distributed_lock_job_") {
            assert_eq!(labels, ["job", "table"], "the labels of {name}");
        }
    }
}

/// One multi-threaded tokio test per case for backend `$db`.
macro_rules! cases {
    ($db:ty) => {
        cases!(@each $db;
            outcomes_are_labelled,
            errors_are_counted,
            deleted_lease_is_counted_once,
            expired_lease_is_counted,
            a_loss_found_by_the_release_is_counted,
            waiters_are_counted_until_they_leave,
            nested_guards_count_one_lease,
            dropped_guard_ends_its_hold,
            spans_nest_under_the_callers_span,
            primitives_are_labelled_by_kind,
            key_label_names_the_key,
            jobs_are_counted,
        );
    };
    (@each $db:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case::<$db>().await;
            }
        )*
    };
}

mod postgres {
    cases!(dblock::Postgres);
}

mod mysql {
    cases!(dblock::MySql);
}

mod sqlite {
    cases!(dblock::Sqlite);
}
