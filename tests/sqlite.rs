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
    assert_eq!(locker.migrate().await.unwrap(), 2);
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
