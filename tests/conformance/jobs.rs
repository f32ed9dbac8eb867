//! Scheduled-job locks: `try_with_lock` skips a held key, `job(..)` keeps the key for its
//! minimum time by the database clock, bounds it by its maximum, and makes N nodes with
//! late timers run a periodic job exactly once per period.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dblock::{Error, Locker, LostReason};
use tokio::time::{Instant, sleep_until, timeout};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb, wait_until};

/// `try_with_lock` makes one attempt: a held key skips the work (`None`, not an error);
/// a free one runs it and releases.
pub async fn try_with_lock_skips_a_held_key<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    let held = locker.try_acquire("report", LONG).await.unwrap().unwrap();
    let ran = AtomicU32::new(0);
    let work = async |_: &dblock::LockGuard<DB>| {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("done")
    };
    assert_eq!(
        locker.try_with_lock("report", LONG, work).await.unwrap(),
        None
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "skipped work does not run");
    held.release().await.unwrap();
    let done = locker.try_with_lock("report", LONG, work).await.unwrap();
    assert_eq!((done, ran.load(Ordering::SeqCst)), (Some("done"), 1));
    assert_eq!(
        locker.holder("report").await.unwrap(),
        None,
        "released after the work"
    );
}

/// Work that ends before `lock_at_least_for` leaves the row until exactly that long after
/// the acquisition by the database clock, whether it succeeded or failed; meanwhile the
/// job skips; afterwards it runs again. Work that outlasts the minimum deletes the row.
pub async fn job_keeps_the_key_for_its_minimum<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    // Long enough that the checks below fit inside it on a loaded machine.
    const AT_LEAST: Duration = Duration::from_secs(3);
    let locker = &db.locker;
    let ran = AtomicU32::new(0);
    let work = async |_: &dblock::LockGuard<DB>| {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(7)
    };
    let job = || {
        locker
            .job("nightly")
            .lock_at_most_for(LONG)
            .lock_at_least_for(AT_LEAST)
    };
    assert_eq!(job().run(work).await.unwrap(), Some(7));
    let kept = locker
        .holder("nightly")
        .await
        .unwrap()
        .expect("kept after the work");
    assert_eq!(
        kept.expires_at - kept.acquired_at,
        chrono::Duration::from_std(AT_LEAST).unwrap()
    );
    assert_eq!(job().run(work).await.unwrap(), None, "skipped while kept");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    wait_until("the minimum hold ends", PATIENCE, async || {
        locker
            .holder("nightly")
            .await
            .unwrap()
            .is_some_and(|h| h.expired)
    })
    .await;
    assert_eq!(
        job().run(work).await.unwrap(),
        Some(7),
        "runs again after it"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);

    // Failed work: its error comes back, and the minimum still holds.
    let failed = locker
        .job("failing")
        .lock_at_least_for(AT_LEAST)
        .run(async |_| Err::<(), _>(Error::InvalidConfig("the work failed".into())))
        .await;
    assert!(matches!(failed, Err(Error::InvalidConfig(_))), "{failed:?}");
    let kept = locker
        .holder("failing")
        .await
        .unwrap()
        .expect("kept after failed work");
    assert_eq!(
        kept.expires_at - kept.acquired_at,
        chrono::Duration::from_std(AT_LEAST).unwrap()
    );

    // Work longer than the minimum: the release deletes the row as usual.
    let outlasting = locker
        .job("short-minimum")
        .lock_at_least_for(Duration::from_millis(1))
        .run(async |guard| {
            // Holding the lock past the minimum is the point (no signal to wait for).
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, Error>(guard.fencing_token())
        })
        .await
        .unwrap();
    assert!(outlasting.is_some());
    assert_eq!(locker.holder("short-minimum").await.unwrap(), None);
}

/// `lock_at_most_for` is a bound: the lease is not renewed, and work that outlasts it is
/// cancelled with `LockLost(Expired)`. Bad durations are refused before anything is written.
pub async fn job_is_bounded_by_its_maximum<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    // A renewing Locker: the job must not renew all the same.
    let locker = Locker::builder(db.pool.clone())
        .table(&db.table)
        .renew_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let started = Instant::now();
    let outcome = timeout(
        PATIENCE,
        locker
            .job("stuck-job")
            .lock_at_most_for(Duration::from_millis(300))
            .run(async |_| {
                assert_eq!(locker.renewing(), 0, "a job's lease is not renewed");
                std::future::pending::<Result<(), Error>>().await
            }),
    )
    .await
    .expect("the work is cancelled when the lease ends");
    assert!(
        matches!(
            outcome,
            Err(Error::LockLost {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{outcome:?}"
    );
    // The work stops at the lease's local deadline: a margin before the database could
    // let another node in.
    let lease = Duration::from_millis(300);
    assert!(started.elapsed() >= lease - locker.lease_margin(lease));

    let attempts = locker.stats().attempts;
    let too_long = locker
        .job("bad")
        .lock_at_most_for(Duration::from_secs(1))
        .lock_at_least_for(Duration::from_secs(2))
        .run(async |_| Ok::<_, Error>(()))
        .await;
    assert!(
        matches!(
            too_long,
            Err(Error::InvalidDuration {
                what: "lock_at_least_for",
                ..
            })
        ),
        "{too_long:?}"
    );
    let no_key = locker.job("").run(async |_| Ok::<_, Error>(())).await;
    assert!(
        matches!(no_key, Err(Error::InvalidKey { .. })),
        "{no_key:?}"
    );
    assert_eq!(
        locker.stats().attempts,
        attempts,
        "refused before any attempt"
    );
}

/// Ticks of the scheduled-job scenario.
const TICKS: u32 = 10;
const TICK: Duration = Duration::from_secs(1);
const WORKERS: u32 = 4;

/// Four nodes, each with its own pool, run a 50 ms job on every 1 s tick, each waking
/// 0-300 ms late (which one is first changes every tick). With `lock_at_least_for(800 ms)`
/// every tick runs exactly once; without it, the late nodes run it again.
pub async fn scheduled_job_runs_once_per_tick<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let mut nodes = Vec::new();
    for _ in 0..WORKERS {
        let locker = Locker::builder(db.another_pool().await)
            .table(&db.table)
            .build()
            .unwrap();
        nodes.push(locker);
    }
    let runs = run_ticks(&nodes, TICKS, Some(Duration::from_millis(800))).await;
    assert_eq!(
        runs,
        vec![1; TICKS as usize],
        "runs per tick with lock_at_least_for"
    );
    wait_until("the last tick's minimum hold ends", PATIENCE, async || {
        let holder = db.locker.holder("every-second").await.unwrap();
        holder.is_none_or(|h| h.expired)
    })
    .await;

    // The same nodes without a minimum hold: the job ends before the late nodes wake.
    let runs = run_ticks(&nodes, 3, None).await;
    assert!(
        runs.iter().any(|&n| n > 1),
        "without lock_at_least_for some tick must run more than once: {runs:?}"
    );
}

/// Runs `ticks` ticks on `nodes`; how many times the job ran in each.
async fn run_ticks<DB: TestBackend>(
    nodes: &[Locker<DB>],
    ticks: u32,
    at_least: Option<Duration>,
) -> Vec<u32> {
    let counts: Arc<Vec<AtomicU32>> = Arc::new((0..ticks).map(|_| AtomicU32::new(0)).collect());
    let start = Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for (n, locker) in nodes.iter().enumerate() {
        let (locker, counts) = (locker.clone(), Arc::clone(&counts));
        tasks.push(tokio::spawn(async move {
            for tick in 0..ticks {
                let late = Duration::from_millis(100 * u64::from((n as u32 + tick) % WORKERS));
                sleep_until(start + TICK * tick + late).await;
                // The bound is a lease that never runs out in a test. With 10 s a CI run
                // once failed here with `LockLost(Expired)`: the work takes 50 ms and the
                // lease is not renewed, so only a stall about that long (of the server
                // before the DELETE, or of the acquisition's reply) can end it.
                let mut job = locker.job("every-second").lock_at_most_for(LONG);
                if let Some(at_least) = at_least {
                    job = job.lock_at_least_for(at_least);
                }
                let began = Instant::now();
                let ran = job
                    .run(async |_| {
                        // The job's own work (holding is the point).
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok::<_, Error>(())
                    })
                    .await
                    .unwrap_or_else(|err| {
                        panic!(
                            "node {n}, tick {tick}: the run failed after {:?}: {err:?}",
                            began.elapsed()
                        )
                    });
                if ran.is_some() {
                    counts[tick as usize].fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for task in tasks {
        timeout(TICK * (ticks + 10), task).await.unwrap().unwrap();
    }
    counts.iter().map(|c| c.load(Ordering::SeqCst)).collect()
}
