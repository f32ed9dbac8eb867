//! Migrations: idempotent, and safe to start from several places at once.

use std::sync::Arc;

use dblock::Locker;
use tokio::sync::Barrier;

use super::LONG;
use crate::common::{TestBackend, TestDb};

/// `TestDb::open` applied V1; running again applies nothing and breaks nothing.
pub async fn migrate_is_rerunnable<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let guard = db.locker.try_acquire("kept", LONG).await.unwrap().unwrap();
    assert_eq!(db.locker.migrate().await.unwrap(), 0);
    assert_eq!(db.locker.migrate().await.unwrap(), 0);
    // The rows survive a re-run.
    let holder = db.locker.holder("kept").await.unwrap().unwrap();
    assert_eq!(holder.owner, guard.owner());
    guard.release().await.unwrap();
}

/// Two "processes" (separate pools) migrate a fresh table at the same moment: both
/// succeed, and V1 is applied exactly once.
pub async fn concurrent_migrations<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let other = Locker::builder(db.another_pool().await)
        .table(&db.table)
        .build()
        .unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let runs = [db.locker.clone(), other].map(|locker| {
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            locker.migrate().await
        })
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.push(run.await.unwrap().expect("a concurrent migrate succeeds"));
    }
    applied.sort();
    assert_eq!(applied, [0, 1]);
    assert_eq!(db.locker.migrate().await.unwrap(), 0);
    let guard = db.locker.try_acquire("k", LONG).await.unwrap().unwrap();
    guard.release().await.unwrap();
}
