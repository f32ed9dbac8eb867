//! Many tasks, one key: exactly one holder at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{LockGuard, Locker, RetryPolicy};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, TestDb, wait_until};

const RACERS: usize = 16;
const ROUNDS: usize = 5;

/// Starts `RACERS` try_acquires on `key` at once; returns the winners.
async fn race<DB: TestBackend>(locker: &Locker<DB>, key: &'static str) -> Vec<LockGuard<DB>> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut racers = JoinSet::new();
    for _ in 0..RACERS {
        let locker = locker.clone();
        let barrier = Arc::clone(&barrier);
        racers.spawn(async move {
            barrier.wait().await;
            locker.try_acquire(key, LONG).await
        });
    }
    let mut winners = Vec::new();
    while let Some(racer) = racers.join_next().await {
        // Losing is Ok(None); a deadlock or duplicate key must never surface as an error.
        let outcome = racer.expect("racer panicked");
        if let Some(guard) = outcome.expect("try_acquire failed while racing") {
            winners.push(guard);
        }
    }
    winners
}

/// Sixteen racers for a free key, five rounds: one winner each round.
pub async fn one_winner_per_round<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "race";
    let mut last_token = i64::MIN;
    for round in 0..ROUNDS {
        let mut winners = race(&db.locker, key).await;
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let winner = winners.pop().unwrap();
        let holder = db.locker.holder(key).await.unwrap().expect("a row");
        assert_eq!(holder.owner, winner.owner(), "round {round}");
        assert_eq!(
            holder.fencing_token,
            winner.fencing_token(),
            "round {round}"
        );
        assert!(!holder.expired, "round {round}");
        assert!(winner.fencing_token() > last_token, "round {round}");
        last_token = winner.fencing_token();
        winner.release().await.expect("the winner releases");
        assert_eq!(db.locker.holder(key).await.unwrap(), None, "round {round}");
    }
}

/// Sixteen racers for a key whose row has expired (the takeover path): one winner.
pub async fn one_winner_takes_over_an_expired_row<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "race";
    for round in 0..ROUNDS {
        let stale = db.locker.try_acquire(key, SHORT).await.unwrap().unwrap();
        wait_until("the lease expired", PATIENCE, async || {
            db.locker.holder(key).await.unwrap().unwrap().expired
        })
        .await;
        let mut winners = race(&db.locker, key).await;
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let winner = winners.pop().unwrap();
        assert!(
            winner.fencing_token() > stale.fencing_token(),
            "round {round}"
        );
        let holder = db.locker.holder(key).await.unwrap().expect("a row");
        assert_eq!(holder.owner, winner.owner(), "round {round}");
        assert!(matches!(
            stale.release().await,
            Err(dblock::Error::NotHeld { .. })
        ));
        winner.release().await.expect("the winner releases");
    }
}

const WORKERS: usize = 8;
const ITERATIONS: i64 = 50;

/// Eight tasks increment a counter in the database by read, yield, write, each under the
/// lock: no increment may be lost, and no two tasks may be inside at once.
pub async fn mutual_exclusion<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    db.plain.counter_create().await;
    // Brisk retries: the default backoff (up to 500 ms) would make 400 handovers slow.
    let locker = Locker::builder(db.pool.clone())
        .table(&db.table)
        .retry(RetryPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(20),
        })
        .build()
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(WORKERS));
    // A JoinSet aborts the other workers as soon as one fails and this test unwinds.
    let mut workers = JoinSet::new();
    for _ in 0..WORKERS {
        let (locker, plain) = (locker.clone(), db.plain.clone());
        let (inside, barrier) = (Arc::clone(&inside), Arc::clone(&barrier));
        workers.spawn(async move {
            barrier.wait().await;
            for _ in 0..ITERATIONS {
                let guard = locker
                    .acquire("counter", LONG, Duration::from_secs(120))
                    .await
                    .expect("acquire with a generous wait");
                let entered = Inside::enter(&inside);
                let value = plain.counter_get().await;
                tokio::task::yield_now().await;
                // Renewing while others hammer the key must not fail either.
                guard.extend(LONG).await.expect("extend");
                plain.counter_set(value + 1).await;
                drop(entered);
                guard.release().await.expect("release");
            }
        });
    }
    while let Some(worker) = workers.join_next().await {
        worker.expect("worker failed");
    }
    assert_eq!(db.plain.counter_get().await, WORKERS as i64 * ITERATIONS);
    assert_eq!(db.locker.holder("counter").await.unwrap(), None);
}

/// Counts the tasks inside the critical section; more than one is a failure.
struct Inside<'a>(&'a AtomicUsize);

impl<'a> Inside<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two holders inside the critical section");
        Inside(count)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
