//! dblock's metrics as Prometheus scrapes them: a Prometheus recorder (no HTTP listener
//! here; a service would serve `handle.render()` on its `/metrics`), some contended work
//! on embedded SQLite, then the exposition text.
//!
//! `cargo run --example metrics`

use std::time::Duration;

use dblock::Locker;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Installed before the first lock call: dblock records into whatever recorder is
    // installed, and describes its metrics (units, help texts) at the first one. The
    // exporter renders a histogram as a summary (which cannot be aggregated across
    // replicas) unless it is given buckets: these make dblock's two `_seconds` metrics
    // Prometheus histograms (the README's recommended buckets).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0,
            ],
        )?
        .install_recorder()?;

    let path = std::env::temp_dir().join(format!("dblock-metrics-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;
    let locker = Locker::new(pool);
    locker.migrate().await?;

    // Four workers take turns on one key, three times each, holding it 20 ms a time: the
    // acquire times show the waits, `distributed_lock_waiters` the queue.
    let lease = Duration::from_secs(30);
    let mut workers = Vec::new();
    for _ in 0..4 {
        let locker = locker.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let work = async |_: &dblock::LockGuard<dblock::Sqlite>| {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, dblock::Error>(())
                };
                locker
                    .with_lock("report", lease, Duration::from_secs(5), work)
                    .await?;
            }
            Ok::<_, dblock::Error>(())
        }));
    }

    // A lease held a while is renewed (every lease / 3); meanwhile a try_acquire finds it
    // busy and a short wait times out. The lease is ten times the wait, so that a renewal
    // delayed on a busy machine cannot let the waiter in; the guard is kept until its
    // expiry has moved (the renewal happened), not for a fixed time.
    let guard = locker
        .try_acquire("nightly", Duration::from_millis(2_500))
        .await?
        .expect("nobody else holds this key");
    let first_expiry = guard.expires_at();
    let rival = locker.try_acquire("nightly", lease).await?;
    assert!(rival.is_none(), "held: the rival is refused");
    let waited = locker
        .acquire("nightly", lease, Duration::from_millis(250))
        .await;
    assert!(
        matches!(waited, Err(dblock::Error::Timeout { .. })),
        "{waited:?}"
    );
    let renewed = async {
        while guard.expires_at() == first_expiry {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), renewed).await?;
    guard.release().await?;

    for worker in workers {
        worker.await??;
    }
    locker.shutdown().await;
    std::fs::remove_file(&path).ok();

    let text = handle.render();
    println!("{text}");
    // Prometheus' conventions, as scraped: units in the names, `_total` on counters,
    // histograms (with buckets) for the timings.
    for (name, kind) in [
        ("distributed_lock_acquire_duration_seconds", "histogram"),
        ("distributed_lock_hold_duration_seconds", "histogram"),
        ("distributed_lock_failures_total", "counter"),
        ("distributed_lock_renewals_total", "counter"),
        ("distributed_lock_held", "gauge"),
        ("distributed_lock_waiters", "gauge"),
    ] {
        let declared = format!("# TYPE {name} {kind}");
        assert!(text.contains(&declared), "missing `{declared}` in:\n{text}");
    }
    assert!(text.contains("distributed_lock_acquire_duration_seconds_bucket{"));
    Ok(())
}
