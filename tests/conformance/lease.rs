//! Issue 3's cases: leases that stay alive, say when they are lost, clean up after
//! themselves, nest for one owner, and survive cancellation. Written once, generic over
//! the backend; [`LeaseEnv`] gives each case a renewing locker and a fault hook.

use std::time::Duration;

use dblock::{Backend, Error, LockGuard, LostReason, ReaperConfig};
use tokio::time::{Instant, sleep, timeout};

use super::lease_env::{LeaseEnv, Outage};

/// How long the tests allow past a bound they assert, for scheduling noise on a busy
/// two-core machine. Bounds are functional (within one renewal interval), not speed.
pub(super) const SLACK: Duration = Duration::from_millis(1500);

/// Polls `check` until it holds or `limit` passes; the answer says which.
pub(super) async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

pub async fn holder_keeps_lock_three_leases_long<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker();
    let lease = Duration::from_millis(900);
    let guard = locker
        .try_acquire("long-work", lease)
        .await
        .unwrap()
        .expect("free key");
    let token = guard.fencing_token();
    let work_ends = Instant::now() + lease * 3;
    let mut rival_tries = 0;
    while Instant::now() < work_ends {
        let rival = locker.try_acquire("long-work", lease).await.unwrap();
        assert!(
            rival.is_none(),
            "a rival got the lock while the holder worked"
        );
        assert_eq!(guard.lost_reason(), None);
        rival_tries += 1;
        sleep(Duration::from_millis(50)).await;
    }
    assert!(rival_tries > 10);
    assert!(
        locker.stats().renewals >= 3,
        "the watchdog renewed: {:?}",
        locker.stats()
    );
    let holder = locker.holder("long-work").await.unwrap().expect("row");
    assert_eq!(
        (holder.owner.as_str(), holder.fencing_token),
        (guard.owner(), token)
    );
    guard.release().await.unwrap();
    assert_eq!(locker.holder("long-work").await.unwrap(), None);
}

async fn lost_within_interval<DB: Backend>(
    guard: &LockGuard<DB>,
    interval: Duration,
) -> LostReason {
    timeout(interval + SLACK, guard.lost())
        .await
        .expect("lost() fires within one renewal interval")
}

pub async fn deleted_row_fires_lost<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let lease = Duration::from_millis(1500);
    let guard = env
        .locker()
        .try_acquire("deleted", lease)
        .await
        .unwrap()
        .unwrap();
    env.delete_row("deleted").await;
    assert_eq!(
        lost_within_interval(&guard, lease / 3).await,
        LostReason::Deleted
    );
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
}

pub async fn stolen_row_fires_lost<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let lease = Duration::from_millis(1500);
    let guard = env
        .locker()
        .try_acquire("stolen", lease)
        .await
        .unwrap()
        .unwrap();
    env.steal_row("stolen", "thief").await;
    assert_eq!(
        lost_within_interval(&guard, lease / 3).await,
        LostReason::TakenOver
    );
    // The thief's row stays: release is owner-checked.
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
    let holder = env
        .locker()
        .holder("stolen")
        .await
        .unwrap()
        .expect("thief's row");
    assert_eq!(holder.owner, "thief");
}

pub async fn with_lock_is_cancelled_on_loss<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let lease = Duration::from_millis(1500);
    let (started, started_rx) = tokio::sync::oneshot::channel();
    let work = env
        .locker()
        .with_lock("cancelled-work", lease, Duration::ZERO, async |_guard| {
            started.send(()).unwrap();
            // Work that would never end on its own.
            std::future::pending::<Result<(), Error>>().await
        });
    let deleter = async {
        started_rx.await.unwrap();
        env.delete_row("cancelled-work").await;
    };
    let (outcome, ()) = tokio::join!(timeout(lease + SLACK, work), deleter);
    match outcome.expect("with_lock returned after the loss") {
        Err(Error::LockLost { key, reason }) => {
            assert_eq!(
                (key.as_str(), reason),
                ("cancelled-work", LostReason::Deleted)
            );
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
}

pub async fn short_outage_keeps_lease<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let lease = Duration::from_secs(4);
    let guard = env
        .locker()
        .try_acquire("short-outage", lease)
        .await
        .unwrap()
        .unwrap();
    env.outage_start().await;
    sleep(lease / 3 + Duration::from_millis(700)).await; // at least one renewal fails
    env.outage_end().await;
    // Renewal recovers; give it two intervals, then check the lease is still ours.
    sleep(lease / 3 * 2).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "an outage shorter than the lease fired lost()"
    );
    assert!(
        env.locker().stats().renewal_errors >= 1,
        "the outage was felt: {:?}",
        env.locker().stats()
    );
    guard.release().await.unwrap();
}

pub async fn long_outage_fires_lost<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let lease = Duration::from_millis(1500);
    let guard = env
        .locker()
        .try_acquire("long-outage", lease)
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    env.outage_start().await;
    let reason = timeout(lease + SLACK, guard.lost())
        .await
        .expect("lost() fires once the lease is over");
    assert_eq!(reason, LostReason::Unreachable);
    assert!(
        started.elapsed() >= lease / 2,
        "lost() fired before the lease could have ended"
    );
    env.outage_end().await;
    drop(guard);
}

pub async fn no_renewal_after_release<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker();
    let lease = Duration::from_millis(300); // renewed every 100 ms
    let guard = locker
        .try_acquire("quiet-after-release", lease)
        .await
        .unwrap()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            locker.stats().renewals >= 3
        })
        .await,
        "the watchdog renews"
    );
    guard.release().await.unwrap();
    let at_release = locker.stats().renewals;
    // Absence can only be observed by waiting: several intervals pass with no statement.
    sleep(lease * 2).await;
    assert_eq!(
        locker.stats().renewals,
        at_release,
        "a renewal was sent after release"
    );
}

pub async fn reaper_deletes_exactly_the_expired<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    // Two lockers on pools of their own (not the fault-injection pool, whose SQLite busy
    // timeout is kept short on purpose), as two processes would run them.
    let (one, other) = (env.second_locker().await, env.second_locker().await);
    env.insert_bulk(5_000, 5_000).await;
    assert_eq!(env.count_rows().await, 10_000);
    let (a, b) = tokio::join!(one.reap_expired(), other.reap_expired());
    assert_eq!(
        a.unwrap() + b.unwrap(),
        5_000,
        "two reapers agree on the total"
    );
    assert_eq!(env.count_rows().await, 5_000);
    assert_eq!(
        env.locker().reap_expired().await.unwrap(),
        0,
        "live rows are never reaped"
    );
    // A live row is never taken either.
    assert!(
        env.locker()
            .try_acquire("bulk-9999", Duration::from_secs(1))
            .await
            .unwrap()
            .is_none()
    );
}

pub async fn background_reaper_reports_and_stops<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    env.insert_bulk(250, 10).await;
    let reaper = env
        .locker()
        .spawn_reaper(ReaperConfig {
            interval: Duration::from_millis(50),
            batch: 100,
            ..ReaperConfig::default()
        })
        .unwrap();
    let mut totals = reaper.subscribe();
    timeout(
        Duration::from_secs(10),
        totals.wait_for(|deleted| *deleted >= 250),
    )
    .await
    .expect("the reaper deletes the expired rows")
    .unwrap();
    assert_eq!(reaper.stop().await, 250);
    assert_eq!(env.count_rows().await, 10);
}

pub async fn owner_nests_and_excludes_others<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker();
    let lease = Duration::from_secs(5);
    let owner = locker.owner();
    let outer = owner
        .try_acquire("nested", lease)
        .await
        .unwrap()
        .expect("free");
    let inner = owner
        .acquire("nested", lease, Duration::ZERO)
        .await
        .expect("nested, no self-deadlock");
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(inner.owner(), owner.value());
    let stranger = locker.owner();
    assert!(
        stranger
            .try_acquire("nested", lease)
            .await
            .unwrap()
            .is_none()
    );
    assert!(locker.try_acquire("nested", lease).await.unwrap().is_none());
    // Releasing the outer guard first keeps the row: the inner one still holds it.
    outer.release().await.unwrap();
    let holder = locker.holder("nested").await.unwrap().expect("still held");
    assert_eq!(holder.owner, owner.value());
    assert!(
        stranger
            .try_acquire("nested", lease)
            .await
            .unwrap()
            .is_none()
    );
    inner.release().await.unwrap();
    assert_eq!(locker.holder("nested").await.unwrap(), None);
    let after = stranger
        .try_acquire("nested", lease)
        .await
        .unwrap()
        .expect("free again");
    assert!(after.fencing_token() > holder.fencing_token);
    after.release().await.unwrap();
}

pub async fn cancelled_acquires_leave_no_orphans<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker();
    let lease = Duration::from_secs(30);
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8u64 {
        let locker = locker.clone();
        tasks.spawn(async move {
            let mut kept = 0;
            for round in 0..250u64 {
                let key = format!("cancel-{}", (worker + round) % 4);
                // Budgets from 0 to ~3 ms cut the acquire at every await point it has.
                let budget = Duration::from_micros(fastrand::u64(0..3_000));
                if let Ok(Ok(guard)) = timeout(
                    budget,
                    locker.acquire(&key, lease, Duration::from_millis(5)),
                )
                .await
                {
                    kept += 1;
                    if round % 2 == 0 {
                        guard.release().await.ok();
                    } else {
                        drop(guard); // released in the background
                    }
                }
            }
            kept
        });
    }
    let mut kept = 0;
    while let Some(done) = tasks.join_next().await {
        kept += done.unwrap();
    }
    // Every guard is gone, so every row must go: cancelled acquisitions that won are
    // released by their own task, dropped guards in the background.
    assert!(
        eventually(Duration::from_secs(20), || async {
            env.count_rows().await == 0
        })
        .await,
        "rows left without a live guard: {} (kept {kept}, stats {:?})",
        env.count_rows().await,
        locker.stats()
    );
    assert!(
        locker.stats().attempts >= 100,
        "the acquires ran: {:?}",
        locker.stats()
    );
}
