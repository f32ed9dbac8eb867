//! Scenario 6: 100 waiters share a pool of 4 connections with the holder. Their retries
//! keep every connection busy, yet the holder's renewals keep landing (its lease is held
//! for several intervals), its release goes through, and then exactly one waiter gets the
//! lock. Waiters cancelled while they wait leave no row behind.
//!
//! The waiters belong to ten Lockers ("processes" sharing the pool), ten each: the
//! waiters of one Locker queue locally and only the head of each queue sends attempts,
//! so one Locker's hundred waiters alone would hardly load the pool. The Lockers do not
//! listen for releases: the pressure on the pool is the point, not the wake-up.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dblock::{Locker, RetryPolicy};
use sqlx::pool::PoolOptions;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::db::FaultDb;
use crate::report::secs;
use crate::{Ctx, Res, eventually};

pub const NAME: &str = "6 100 waiters on a pool of 4";

const WAITERS: usize = 100;
/// The Lockers the waiters belong to (in turn): as many heads attempt at once.
const LOCKERS: usize = 10;
const POOL_SIZE: u32 = 4;
/// Renewed every 667 ms.
const LEASE: Duration = Duration::from_secs(2);
/// Two leases, six renewal intervals.
const HAMMER: Duration = Duration::from_secs(4);
/// Waiters retry fast (sleeps up to 20 ms), so the pool is always in demand.
const WAITER_RETRY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(1),
    max: Duration::from_millis(20),
};

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = "fault:pool";
    let pool = PoolOptions::<DB>::new()
        .max_connections(POOL_SIZE)
        .connect(&ctx.url)
        .await?;
    let holder = Locker::new(pool.clone());
    let lockers = (0..LOCKERS)
        .map(|_| {
            Locker::builder(pool.clone())
                .retry(WAITER_RETRY)
                .listen(false)
                .build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let guard = holder.try_acquire(key, LEASE).await?.ok_or("key held")?;

    let stop = CancellationToken::new();
    let winners: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut tasks = JoinSet::new();
    for n in 0..WAITERS {
        let waiters = lockers[n % LOCKERS].clone();
        let (stop, winners) = (stop.clone(), Arc::clone(&winners));
        tasks.spawn(async move {
            let acquired = tokio::select! {
                // Cancelling a waiting acquire must leave nothing behind.
                _ = stop.cancelled() => return Ok(()),
                acquired = waiters.acquire(key, LEASE, Duration::from_secs(60)) => acquired,
            };
            let guard = acquired?;
            winners
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(guard.fencing_token());
            stop.cancelled().await;
            guard.release().await
        });
    }
    let winner_count = || winners.lock().unwrap_or_else(|e| e.into_inner()).len();

    // While the waiters hammer, the holder's lease must keep moving forward.
    let started = Instant::now();
    let (mut last_renewal, mut expiry, mut longest_gap) =
        (started, guard.expires_at(), Duration::ZERO);
    let mut renewals = 0;
    while started.elapsed() < HAMMER {
        sleep(Duration::from_millis(5)).await;
        if guard.expires_at() != expiry {
            expiry = guard.expires_at();
            longest_gap = longest_gap.max(last_renewal.elapsed());
            last_renewal = Instant::now();
            renewals += 1;
        }
        ensure!(
            guard.lost_reason().is_none(),
            "the holder lost its lease ({:?}) under pool pressure after {} renewals",
            guard.lost_reason(),
            renewals
        );
        ensure!(
            winner_count() == 0,
            "a waiter got the lock while it was held"
        );
    }
    let attempts: u64 = lockers.iter().map(|l| l.stats().attempts).sum();
    // One head per Locker: each waiter alone would have sent thousands.
    let queued_attempts = lockers[0].stats().attempts;
    ensure!(
        attempts > WAITERS as u64 * 2,
        "the waiters made only {attempts} attempts: the pool was not under pressure"
    );
    // The lease (2 s) could not have lasted 4 s without at least two renewals; more
    // are expected (every 667 ms), and the longest gap is reported.
    ensure!(
        renewals >= 2,
        "only {renewals} renewals in {} of pressure (longest gap {})",
        secs(HAMMER),
        secs(longest_gap)
    );
    let row = ctx
        .locker
        .holder(key)
        .await?
        .ok_or("the holder's row is gone")?;
    ensure!(
        row.owner == guard.owner() && !row.expired,
        "the row is not the holder's: {row:?}"
    );

    let releasing = Instant::now();
    guard.release().await.map_err(|e| {
        format!(
            "the holder's release under pressure, after {}: {e}",
            secs(releasing.elapsed())
        )
    })?;
    let release_took = releasing.elapsed();
    let handover = eventually("a waiter gets the lock", LEASE * 2, async || {
        Ok(winner_count() > 0)
    })
    .await?;
    // Give the other 99 a while to get it wrongly (no event says they did not).
    sleep(LEASE / 2).await;
    let won: Vec<i64> = winners.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(
        won.len() == 1,
        "{} waiters hold the lock: {won:?}",
        won.len()
    );
    let row = ctx
        .locker
        .holder(key)
        .await?
        .ok_or("the winner's row is gone")?;
    ensure!(
        row.fencing_token == won[0] && !row.expired,
        "the row {row:?} is not the winner's (token {})",
        won[0]
    );

    stop.cancel();
    while let Some(joined) = tasks.join_next().await {
        joined?.map_err(|e| format!("a waiter: {e}"))?;
    }
    let left = eventually("no row is left", LEASE * 2, async || {
        Ok(ctx.locker.holder(key).await?.is_none())
    })
    .await;
    pool.close().await;
    left?;
    Ok(format!(
        "{attempts} waiter attempts in {} ({queued_attempts} by the ten waiters of one Locker); holder renewed {renewals}x (longest gap {}, interval {}); \
         release {}; one waiter got it {} later; 99 cancelled, no row left",
        secs(HAMMER),
        secs(longest_gap),
        secs(LEASE / 3),
        secs(release_took),
        secs(handover)
    ))
}
