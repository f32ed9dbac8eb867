mod common;
mod conformance;

conformance::conformance_suite!(dblock::Sqlite);

/// `sqlite::memory:` (sqlx gives it a shared cache): migrate, then lock, on the same pool,
/// and the database outlives every pooled connection closing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_database_works() {
    use std::time::Duration;
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    let locker = dblock::Locker::new(pool.clone());
    assert_eq!(locker.migrate().await.unwrap(), 4);
    let guard = locker
        .try_acquire("mem", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the in-memory table is there for every pooled connection");
    // Every pooled connection gone (as idle timeouts would do): the locker's own
    // connection keeps the database, so the lock is still there.
    let token = guard.fencing_token();
    drop(guard);
    locker.shutdown().await;
    pool.close().await;
    let again = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let fresh = dblock::Locker::new(again);
    let next = fresh
        .try_acquire("mem", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the table survived the pool");
    assert!(next.fencing_token() > token);
}

/// A private in-memory database (one per connection) cannot hold a lock table for a pool:
/// `migrate()` says so with a typed error instead of "no such table" later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_in_memory_database_is_refused() {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect("sqlite://?mode=memory&cache=private")
        .await
        .unwrap();
    match dblock::Locker::new(pool).migrate().await {
        Err(dblock::Error::InvalidConfig(why)) => {
            assert!(why.contains("shared cache"), "{why}")
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// SQLite's "partition": another connection holds the database's write lock (a stuck
/// write transaction, a process frozen mid-write). Writers then wait in SQLite's busy
/// handler, up to sqlx's busy timeout (5 s), which no network bound covers; dblock's own
/// bounds cut them short: an acquisition at its deadline (at least 1 s), a release at its
/// lease's, and the lease ends locally a margin before it could expire. Fails without the
/// bounds (each call then takes the whole busy timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_write_lock_bounds_every_write() {
    use std::time::Duration;
    use tokio::time::Instant;

    let Some(db) = common::TestDb::<dblock::Sqlite>::open().await else {
        return;
    };
    // sqlx's default busy timeout (5 s): the wait the bounds must cut short.
    let locker = dblock::Locker::builder(db.another_pool().await)
        .table(&db.table)
        .build()
        .unwrap();
    let lease = Duration::from_secs(1);
    let held = locker.try_acquire("held", lease).await.unwrap().unwrap();

    let mut blocker = db.pool.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    // The bound is 1 s; the busy timeout 5 s. 3.5 s leaves room for a busy machine.
    let limit = Duration::from_millis(3500);
    let started = Instant::now();
    let attempt = locker.try_acquire("other", lease).await;
    let took = started.elapsed();
    eprintln!("try_acquire under a held write lock: {attempt:?} after {took:?}");
    assert!(attempt.is_err(), "no lock while the write lock is held");
    assert!(took < limit, "try_acquire took {took:?}");

    // The held lease cannot be renewed meanwhile: its renewal, bounded too, gives up,
    // and the lease ends (at its local deadline, which the attempt above outlasted).
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("the lease ends");
    assert!(
        matches!(
            reason,
            dblock::LostReason::Unreachable | dblock::LostReason::NoConnection
        ),
        "{reason:?}"
    );

    let started = Instant::now();
    let released = held.release().await;
    let took = started.elapsed();
    eprintln!("release under a held write lock: {released:?} after {took:?}");
    assert!(took < limit, "release took {took:?}");

    sqlx::query("ROLLBACK")
        .execute(&mut *blocker)
        .await
        .unwrap();
    locker.shutdown().await;
}

/// A waiter that loses again and again against one row leaves its mark once: neither its
/// lost attempts nor its mark, once made, write to the database again (each write would
/// make every other Locker's listener, which notices any commit, read the marks again).
/// Counted by triggers of the test's own on the lock table and the marks table; the
/// waiter's Locker listens, as any does once a waiter sleeps, and its pauses are 1-2 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_keeps_losing_writes_its_mark_once() {
    use std::time::Duration;

    use common::counted::{count_writes, writes};

    let Some(db) = common::TestDb::<dblock::Sqlite>::open().await else {
        return;
    };
    let t = &db.table;
    count_writes(&db, &[t.clone(), format!("{t}_waiter")]).await;
    let lease = Duration::from_secs(30);
    let holder = db.locker.try_acquire("busy", lease).await.unwrap().unwrap();
    let waiter = dblock::Locker::builder(db.another_pool().await)
        .table(t)
        .auto_renew(false)
        .retry(dblock::RetryPolicy {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
        })
        .build()
        .unwrap();
    let before = writes(&db).await;
    // Shorter than half a mark's life (a second): no refresh falls in it.
    let waited = waiter
        .acquire("busy", lease, Duration::from_millis(400))
        .await;
    assert!(
        matches!(waited, Err(dblock::Error::Timeout { .. })),
        "{waited:?}"
    );
    let (attempts, written) = (waiter.stats().attempts, writes(&db).await - before);
    eprintln!("{attempts} lost attempts, {written} writes");
    assert!(attempts >= 20, "only {attempts} attempts");
    assert_eq!(written, 1, "the mark, once, after {attempts} lost attempts");
    holder.release().await.unwrap();
    waiter.shutdown().await;
}

/// A release whose key a waiter of another Locker marked leaves the key to that waiter:
/// a caller of the releasing Locker who asks for it again at once does not take it back
/// first (as it would in microseconds, while the other Locker's listener looks only every
/// few milliseconds). Six rounds; the waiter elsewhere must come first in most of them
/// (it did in all, with the rule; in none or one without it: the re-acquisition is a
/// millisecond, the listener's look up to 4.5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_leaves_the_key_to_a_waiter_elsewhere() {
    use std::time::Duration;

    let Some(db) = common::TestDb::<dblock::Sqlite>::open().await else {
        return;
    };
    // Twelve rounds, a third of them at least: the rule's hold-back is bounded (15 ms), and
    // on a machine busy enough the other listener looks later than that now and then
    // (3 of 6 seen with two CPU burners beside the test); without the rule 0-1 of 6.
    const ROUNDS: usize = 12;
    let (key, lease, patience) = ("yielded", Duration::from_secs(30), Duration::from_secs(15));
    let here = db.locker.clone();
    // Long pauses: the waiter elsewhere gets the key only by hearing the release.
    let there = dblock::Locker::builder(db.another_pool().await)
        .table(&db.table)
        .auto_renew(false)
        .retry(dblock::RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    let mut first_elsewhere = 0;
    for _ in 0..ROUNDS {
        let held = here.try_acquire(key, lease).await.unwrap().unwrap();
        let waiter = {
            let there = there.clone();
            tokio::spawn(async move {
                let guard = there.acquire(key, lease, patience).await.unwrap();
                let token = guard.fencing_token();
                guard.release().await.unwrap();
                token
            })
        };
        common::wait_until(
            "the waiter elsewhere sleeps, marked",
            patience,
            async || there.listening() && db.plain.marked(key).await,
        )
        .await;
        held.release().await.unwrap();
        let again = here.acquire(key, lease, patience).await.unwrap();
        let token_here = again.fencing_token();
        again.release().await.unwrap();
        let token_there = waiter.await.unwrap();
        if token_there < token_here {
            first_elsewhere += 1;
        }
    }
    eprintln!("the waiter elsewhere came first in {first_elsewhere} of {ROUNDS} rounds");
    assert!(
        first_elsewhere * 3 >= ROUNDS,
        "{first_elsewhere} of {ROUNDS}"
    );
    there.shutdown().await;
}

/// [`a_release_leaves_the_key_to_a_waiter_elsewhere`] for a semaphore's permit: this
/// Locker holds all three permits, a waiter of another Locker waits for one, and a task
/// here releases one and asks again at once. The waiter elsewhere must come first in most
/// of six rounds (it did in all with the rule; without it the task here takes the permit
/// back before queueing, in microseconds). A fresh Locker elsewhere each round: its mark
/// then names a permit held in that round, for `marked`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_goes_to_a_waiter_elsewhere() {
    use std::time::Duration;

    let Some(db) = common::TestDb::<dblock::Sqlite>::open().await else {
        return;
    };
    // Twelve rounds, a third of them at least: the rule's hold-back is bounded (15 ms), and
    // on a machine busy enough the other listener looks later than that now and then
    // (3 of 6 seen with two CPU burners beside the test); without the rule 0-1 of 6.
    const ROUNDS: usize = 12;
    const PERMITS: u32 = 3;
    let (name, lease, patience) = ("pool", Duration::from_secs(30), Duration::from_secs(15));
    let here = db.locker.semaphore(name, PERMITS);
    let mut first_elsewhere = 0;
    for _ in 0..ROUNDS {
        let there = dblock::Locker::builder(db.another_pool().await)
            .table(&db.table)
            .auto_renew(false)
            .retry(dblock::RetryPolicy {
                initial: Duration::from_millis(10),
                max: Duration::from_secs(60),
            })
            .build()
            .unwrap();
        let mut held = Vec::new();
        for _ in 0..PERMITS {
            held.push(here.try_acquire(lease).await.unwrap().unwrap());
        }
        let waiter = {
            let semaphore = there.semaphore(name, PERMITS);
            tokio::spawn(async move {
                let permit = semaphore.acquire(lease, patience).await.unwrap();
                let token = permit.fencing_token();
                permit.release().await.unwrap();
                token
            })
        };
        common::wait_until(
            "the waiter elsewhere sleeps, marked",
            patience,
            async || {
                let mut marked = false;
                for permit in &held {
                    marked |= db.plain.marked(permit.key()).await;
                }
                there.listening() && marked
            },
        )
        .await;
        held.pop().unwrap().release().await.unwrap();
        let again = here.acquire(lease, patience).await.unwrap();
        let token_here = again.fencing_token();
        again.release().await.unwrap();
        let token_there = waiter.await.unwrap();
        if token_there < token_here {
            first_elsewhere += 1;
        }
        for permit in held {
            permit.release().await.unwrap();
        }
        there.shutdown().await;
    }
    eprintln!("the waiter elsewhere came first in {first_elsewhere} of {ROUNDS} rounds");
    assert!(
        first_elsewhere * 3 >= ROUNDS,
        "{first_elsewhere} of {ROUNDS}"
    );
}
