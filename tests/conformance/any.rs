//! [`AnyLocker`]: a locker built from the backend's URL, through the same calls as
//! [`Locker`](dblock::Locker). Each case checks that the call reached the database the
//! URL names (the lock table the test's own `Locker` reads) and kept its guarantees.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{AnyGuard, AnyLocker, Error, RetryPolicy};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, TestDb, wait_until};

const RACERS: usize = 16;

/// The test's table, unmigrated, and an AnyLocker on it built from the URL; the
/// AnyLocker migrates it (every migration, once).
pub(super) async fn open<DB: TestBackend>() -> Option<(TestDb<DB>, AnyLocker)> {
    let db = TestDb::<DB>::open_unmigrated().await?;
    let any = AnyLocker::builder(&DB::url(&db.location))
        .table(&db.table)
        .auto_renew(false)
        // Brisk retries: the default backoff (up to 500 ms) would make handovers slow.
        .retry(RetryPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(20),
        })
        .connect()
        .await
        .expect("connect by URL");
    assert_eq!(any.backend(), <DB as sqlx::Database>::NAME);
    assert_eq!(any.table(), db.table);
    assert_eq!(any.migrate().await.unwrap(), DB::MIGRATION_FILES);
    assert_eq!(
        any.migrate().await.unwrap(),
        0,
        "a second run applies nothing"
    );
    Some((db, any))
}

/// Sixteen racers through clones of one AnyLocker, three rounds: exactly one winner a
/// round, and the row in the table is the winner's.
pub async fn any_locker_has_one_winner_per_round<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    for round in 0..3 {
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut racers = JoinSet::new();
        for _ in 0..RACERS {
            let (any, barrier) = (any.clone(), Arc::clone(&barrier));
            racers.spawn(async move {
                barrier.wait().await;
                any.try_acquire("race", LONG).await
            });
        }
        let mut winners: Vec<AnyGuard> = Vec::new();
        while let Some(racer) = racers.join_next().await {
            if let Some(guard) = racer.unwrap().expect("losing is Ok(None), not an error") {
                winners.push(guard);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let winner = winners.pop().unwrap();
        // Read by the test's own Locker: the AnyLocker wrote to the URL's database.
        let holder = db.locker.holder("race").await.unwrap().expect("a row");
        assert_eq!(
            (holder.owner.as_str(), holder.fencing_token),
            (winner.owner(), winner.fencing_token()),
            "round {round}"
        );
        assert_eq!(any.holder("race").await.unwrap(), Some(holder));
        winner.release().await.unwrap();
        assert_eq!(
            db.locker.holder("race").await.unwrap(),
            None,
            "round {round}"
        );
    }
}

/// Eight workers, ten `with_lock`s each, around a read-yield-write of a counter row:
/// never two inside, and the counter ends at exactly 80.
pub async fn any_locker_with_lock_excludes<DB: TestBackend>() {
    const WORKERS: usize = 8;
    const ITERATIONS: i64 = 10;
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    db.plain.counter_create().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..WORKERS {
        let (any, plain, inside) = (any.clone(), db.plain.clone(), Arc::clone(&inside));
        workers.spawn(async move {
            for _ in 0..ITERATIONS {
                let wait = Duration::from_secs(120);
                any.with_lock("counter", LONG, wait, async |guard: &AnyGuard| {
                    assert_eq!(guard.key(), "counter");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two inside");
                    let value = plain.counter_get().await;
                    tokio::task::yield_now().await;
                    plain.counter_set(value + 1).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await
                .expect("with_lock with a generous wait");
            }
        });
    }
    while let Some(worker) = workers.join_next().await {
        worker.expect("worker failed");
    }
    assert_eq!(db.plain.counter_get().await, WORKERS as i64 * ITERATIONS);
    assert_eq!(db.locker.holder("counter").await.unwrap(), None, "released");
}

/// Tokens go up across a release, a takeover of an expired row, and a force-release;
/// the takeover's old guard is told `NotHeld` and the new holder keeps its row.
pub async fn any_locker_tokens_increase_and_release_is_owner_checked<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let first = any.try_acquire("k", LONG).await.unwrap().unwrap();
    let t1 = first.fencing_token();
    first.release().await.unwrap();

    let stale = any.try_acquire("k", SHORT).await.unwrap().unwrap();
    let t2 = stale.fencing_token();
    wait_until("the short lease expired", PATIENCE, async || {
        db.locker.holder("k").await.unwrap().unwrap().expired
    })
    .await;
    let taker = any
        .try_acquire("k", LONG)
        .await
        .unwrap()
        .expect("takes over");
    let t3 = taker.fencing_token();
    assert!(matches!(
        stale.extend(LONG).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(stale.release().await, Err(Error::NotHeld { .. })));
    let holder = db
        .locker
        .holder("k")
        .await
        .unwrap()
        .expect("the taker's row");
    assert_eq!(
        (holder.owner.as_str(), holder.fencing_token),
        (taker.owner(), t3)
    );

    assert!(
        any.force_release("k").await.unwrap(),
        "the taker's row went"
    );
    assert_eq!(db.locker.holder("k").await.unwrap(), None);
    let next = any.try_acquire("k", LONG).await.unwrap().unwrap();
    let t4 = next.fencing_token();
    assert!(
        matches!(&taker.release().await, Err(Error::NotHeld { key, .. }) if key == "k"),
        "a force-released guard's release says not held"
    );
    assert_eq!(
        db.locker.holder("k").await.unwrap().unwrap().owner,
        next.owner()
    );
    assert!(t1 < t2 && t2 < t3 && t3 < t4, "{t1} {t2} {t3} {t4}");
    let listed = any.list("", 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].key.as_str(), listed[0].fencing_token), ("k", t4));
    next.release().await.unwrap();
}

/// A wait that runs out is `Error::Timeout`, naming the holder.
pub async fn any_locker_times_out<DB: TestBackend>() {
    let Some((_db, any)) = open::<DB>().await else {
        return;
    };
    let guard = any.try_acquire("busy", LONG).await.unwrap().unwrap();
    let wait = Duration::from_millis(200);
    match any.acquire("busy", LONG, wait).await {
        Err(Error::Timeout { key, held_by, .. }) => {
            assert_eq!(key, "busy");
            assert_eq!(held_by.as_deref(), Some(guard.owner()));
        }
        other => panic!("expected Error::Timeout, got {other:?}"),
    }
    guard.release().await.unwrap();
    let free = any.acquire("busy", LONG, wait).await.expect("free again");
    free.release().await.unwrap();
}

/// Eight nodes run the same job at once: it runs exactly once, and its minimum hold
/// keeps the key (skipping a late node) after the work ended.
pub async fn any_locker_job_runs_once<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let mut nodes = JoinSet::new();
    for _ in 0..8 {
        let (any, runs, barrier) = (any.clone(), Arc::clone(&runs), Arc::clone(&barrier));
        nodes.spawn(async move {
            barrier.wait().await;
            any.job("nightly")
                .lock_at_most_for(LONG)
                .lock_at_least_for(LONG)
                .run(async |guard: &AnyGuard| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(guard.fencing_token())
                })
                .await
        });
    }
    let mut ran = Vec::new();
    while let Some(node) = nodes.join_next().await {
        if let Some(token) = node.unwrap().expect("a job run") {
            ran.push(token);
        }
    }
    assert_eq!((ran.len(), runs.load(Ordering::SeqCst)), (1, 1));
    let holder = db
        .locker
        .holder("nightly")
        .await
        .unwrap()
        .expect("held for its minimum");
    assert_eq!(holder.fencing_token, ran[0]);
    let late = any
        .job("nightly")
        .run(async |_: &AnyGuard| Ok::<_, Error>(()))
        .await;
    assert_eq!(late.unwrap(), None, "skipped while the minimum holds");
}

/// Bad input is a typed error and writes nothing: an unknown scheme, a reserved table
/// name, an empty key.
pub async fn any_locker_refuses_bad_input<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let location = DB::url(&db.location);
    let (_, rest) = location.split_once(':').expect("a scheme");
    // The same address under another scheme: refused for its scheme, not handed to a
    // backend that might read the rest.
    let unknown = AnyLocker::connect(&format!("redis:{rest}")).await;
    assert!(
        matches!(&unknown, Err(Error::InvalidConfig(why)) if why.contains("scheme \"redis\"")),
        "{unknown:?}"
    );
    let reserved = AnyLocker::builder(&location).table("order").connect().await;
    assert!(
        matches!(reserved, Err(Error::InvalidTableName { .. })),
        "{reserved:?}"
    );
    let empty = any.try_acquire("", LONG).await;
    assert!(matches!(empty, Err(Error::InvalidKey { .. })), "{empty:?}");
    assert!(matches!(
        any.acquire("k", Duration::ZERO, LONG).await,
        Err(Error::InvalidDuration { .. })
    ));
    assert_eq!(db.plain.row_count().await, 0, "nothing was written");
}
