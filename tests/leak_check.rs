//! The leaked-lock check's gauge and events, on every backend: `distributed_lock_long_held`
//! is *set* by every check (not moved up and down), and the debugging recorder hands a
//! gauge's value over only once (its snapshot resets it), so this binary has a recorder of
//! its own and reads it only between checks it waited for, one case at a time.
//!
//! Its WARN log also shows that a lost lease says so in one WARN line (issue 43, point 5):
//! a guard dropped after its loss is released without a second one.

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
mod common;

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use dblock::{LeakReport, ReaperConfig};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::watch;
use tokio::time::timeout;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

use common::{TestBackend, TestDb};

const LONG: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(15);
const LONG_HELD: &str = "distributed_lock_long_held";

/// The recorder, installed once.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        let events = tracing_subscriber::registry().with(WarnLog);
        tracing::subscriber::set_global_default(events).expect("the only subscriber");
        snapshotter
    })
}

/// One case at a time: a snapshot resets every table's gauge, not only the reader's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The gauge's value for `table` as last set, if it was set since the last read.
fn long_held_gauge(table: &str) -> Option<f64> {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let ours = key.name() == LONG_HELD
                && key
                    .labels()
                    .any(|l| l.key() == "table" && l.value() == table);
            match value {
                DebugValue::Gauge(v) if ours => Some(v.into_inner()),
                _ => None,
            }
        })
}

/// `(message, table, key)` of every WARN event.
static WARNINGS: Mutex<Vec<(String, String, String)>> = Mutex::new(Vec::new());

const LONG_HELD_EVENT: &str = "lock held longer than the leak threshold";

fn warnings(table: &str, key: &str) -> usize {
    let warnings = WARNINGS.lock().unwrap_or_else(PoisonError::into_inner);
    warnings
        .iter()
        .filter(|(m, t, k)| m == LONG_HELD_EVENT && t == table && k == key)
        .count()
}

/// The messages of the WARN events about `key` (keys are unique to their test).
fn warnings_about(key: &str) -> Vec<String> {
    let warnings = WARNINGS.lock().unwrap_or_else(PoisonError::into_inner);
    let about = warnings.iter().filter(|(_, _, k)| k == key);
    about.map(|(message, _, _)| message.clone()).collect()
}

struct WarnLog;

impl<S: tracing::Subscriber> Layer<S> for WarnLog {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        #[derive(Default)]
        struct Fields {
            message: String,
            table: String,
            key: String,
        }
        impl Visit for Fields {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                let text = format!("{value:?}");
                match field.name() {
                    "message" => self.message = text,
                    "table" => self.table = text,
                    "key" => self.key = text,
                    _ => {}
                }
            }
            fn record_str(&mut self, field: &Field, value: &str) {
                self.record_debug(field, &format_args!("{value}"));
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if *event.metadata().level() == tracing::Level::WARN {
            let mut warnings = WARNINGS.lock().unwrap_or_else(PoisonError::into_inner);
            warnings.push((fields.message, fields.table, fields.key));
        }
    }
}

/// Waits for a check that began after this call, and returns its report.
async fn next_check(reports: &mut watch::Receiver<LeakReport>) -> LeakReport {
    // A check in flight now may have read before the caller's change: skip past it.
    let after = reports.borrow().checks + 1;
    timeout(PATIENCE, reports.wait_for(|r| r.checks > after))
        .await
        .expect("the reaper checks")
        .expect("the reaper runs")
        .clone()
}

/// A row held past the threshold sets the gauge to 1 and is logged once per check; after
/// its release the gauge is set back to 0 and the logging stops.
async fn gauge_and_events<DB: TestBackend>() {
    snapshotter();
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let leaked = db
        .locker
        .try_acquire("leaked", LONG)
        .await
        .unwrap()
        .unwrap();
    let fresh = db.locker.try_acquire("fresh", LONG).await.unwrap().unwrap();
    let sql = format!(
        "UPDATE {} SET acquired_at = {} WHERE lock_key = {}",
        db.table,
        DB::now_plus(-3600),
        DB::param(1)
    );
    assert_eq!(
        DB::exec(&db.pool, sql, vec!["leaked".into()])
            .await
            .unwrap(),
        1
    );
    let reaper = db
        .locker
        .spawn_reaper(ReaperConfig {
            interval: Duration::from_millis(50),
            leak_threshold: Some(Duration::from_secs(3540)),
            ..ReaperConfig::default()
        })
        .unwrap();
    let mut reports = reaper.long_held();
    let report = next_check(&mut reports).await;
    assert_eq!(report.rows.len(), 1);
    assert_eq!(long_held_gauge(&db.table), Some(1.0));
    // Once per check: as many events as checks that found it, give or take the one in
    // flight while they are counted.
    let checks = reports.borrow().checks;
    let events = warnings(&db.table, "leaked") as u64;
    assert!(
        (checks..=checks + 1).contains(&events),
        "{events} events in {checks} checks"
    );
    assert_eq!(
        warnings(&db.table, "fresh"),
        0,
        "a fresh row is not reported"
    );

    leaked.release().await.unwrap();
    let report = next_check(&mut reports).await;
    assert!(report.rows.is_empty(), "{report:?}");
    let _ = long_held_gauge(&db.table); // what checks before the release had set
    next_check(&mut reports).await;
    assert_eq!(
        long_held_gauge(&db.table),
        Some(0.0),
        "cleared after the release"
    );
    let stopped_at = warnings(&db.table, "leaked");
    next_check(&mut reports).await;
    assert_eq!(
        warnings(&db.table, "leaked"),
        stopped_at,
        "no events after the release"
    );
    reaper.stop().await;
    fresh.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leak_check() {
    gauge_and_events::<sqlx::Postgres>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_leak_check() {
    gauge_and_events::<sqlx::MySql>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_leak_check() {
    gauge_and_events::<sqlx::Sqlite>().await;
}

/// A lease lost at its deadline (nobody renews it), whose guard is then dropped: one WARN
/// line ("lock lost"), and none for the background release that finds nothing to do.
async fn a_lost_lease_warns_once<DB: TestBackend>() {
    snapshotter(); // installs the WARN log
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = format!("noise:{}", db.table);
    let guard = db
        .locker
        .try_acquire(&key, Duration::from_millis(300))
        .await;
    let guard = guard.unwrap().expect("a free key");
    timeout(PATIENCE, guard.lost())
        .await
        .expect("lost at its deadline");
    drop(guard);
    // A live guard dropped after it goes out in the same background pass; once its row is
    // gone, that pass has also dealt with the lost one.
    let marker = format!("{key}:marker");
    let live = db.locker.try_acquire(&marker, LONG).await.unwrap();
    drop(live.expect("a free key"));
    let gone = async {
        while db.locker.holder(&marker).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(PATIENCE, gone)
        .await
        .expect("the live guard's row released");
    assert_eq!(
        warnings_about(&key),
        ["lock lost"],
        "one WARN line for one lost lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_lease_warns_once() {
    a_lost_lease_warns_once::<sqlx::Postgres>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lost_lease_warns_once() {
    a_lost_lease_warns_once::<sqlx::MySql>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lost_lease_warns_once() {
    a_lost_lease_warns_once::<sqlx::Sqlite>().await;
}
