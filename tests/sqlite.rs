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
