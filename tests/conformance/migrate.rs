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

/// Eight "processes" (separate pools) migrate a fresh table at the same moment: all
/// succeed, the migrations are applied exactly once, and the others apply nothing. Through a
/// transaction pooler this fails if the migration lock can split from its statements.
pub async fn concurrent_migrations<DB: TestBackend>() {
    const RUNS: usize = 8;
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let mut lockers = vec![db.locker.clone()];
    for _ in 1..RUNS {
        let pool = db.another_pool().await;
        lockers.push(Locker::builder(pool).table(&db.table).build().unwrap());
    }
    let barrier = Arc::new(Barrier::new(RUNS));
    let runs: Vec<_> = lockers
        .into_iter()
        .map(|locker| {
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                tokio::time::timeout(std::time::Duration::from_secs(60), locker.migrate()).await
            })
        })
        .collect();
    let mut applied = Vec::new();
    for run in runs {
        let outcome = run.await.unwrap().expect("no migrate hangs");
        applied.push(outcome.expect("a concurrent migrate succeeds"));
    }
    applied.sort();
    // One run applies every migration of the backend; the others find nothing to do.
    assert_eq!(applied[..RUNS - 1], [0; RUNS - 1]);
    assert_eq!(applied[RUNS - 1], DB::MIGRATION_FILES, "{applied:?}");
    assert_eq!(db.locker.migrate().await.unwrap(), 0);
    let guard = db.locker.try_acquire("k", LONG).await.unwrap().unwrap();
    guard.release().await.unwrap();
}

/// The scripts `migration_sql` prints, applied by another tool (here a plain client's
/// `raw_sql`, each script as one unit) instead of `migrate`: dblock then locks on that
/// table with no `migrate` call, fencing tokens included; and a later `migrate` applies
/// the same scripts again harmlessly (they are idempotent).
pub async fn printed_sql_applied_by_another_tool<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let scripts = db.locker.migration_sql();
    assert_eq!(scripts.len(), DB::MIGRATION_FILES);
    assert!(scripts[0].name.starts_with("V1__"), "{:?}", scripts[0].name);
    for script in &scripts {
        assert!(
            !script.sql.contains('{'),
            "a placeholder left: {}",
            script.sql
        );
        <DB as TestBackend>::run_script(&db.pool, script.sql.clone())
            .await
            .unwrap_or_else(|err| panic!("{}: {err}", script.name));
    }
    let take = async || db.locker.try_acquire("printed", LONG).await.unwrap();
    let first = take().await.expect("a free key");
    assert!(take().await.is_none(), "held");
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = take().await.expect("released");
    assert!(
        second.fencing_token() > token,
        "tokens rise on the printed schema"
    );
    second.release().await.unwrap();
    assert_eq!(db.locker.migrate().await.unwrap(), DB::MIGRATION_FILES);
}

/// A newer dblock migrated the table further (a rolling upgrade: its replicas start beside
/// this version's): this version's `migrate` finds its own steps all applied, leaves the
/// later ones alone and answers 0, and locks as before. Handed to refinery, the run is
/// refused (a version missing from its list), and the replica would not start.
pub async fn a_newer_dblocks_steps_are_left_alone<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let later = format!(
        "INSERT INTO {}_history (version, name, applied_on, checksum) \
         VALUES (9999, 'from_a_newer_dblock', '2026-12-07T00:00:00Z', '1')",
        db.table
    );
    <DB as TestBackend>::run_script(&db.pool, later)
        .await
        .expect("a later step in the history");
    assert_eq!(db.locker.migrate().await.unwrap(), 0);
    let guard = db.locker.try_acquire("after", LONG).await.unwrap();
    guard.expect("locks as before").release().await.unwrap();
}
