mod common;
mod conformance;

use common::{TestBackend, TestDb};
use dblock::{Locker, Postgres};
use sqlx::PgPool;

conformance::conformance_suite!(Postgres);

#[path = "postgres/relaxed.rs"]
mod relaxed;

#[path = "postgres/schemas.rs"]
mod schemas;

#[path = "postgres/write_in_one.rs"]
mod write_in_one;

/// The reaper finds a batch through the `expire_time` index and deletes it through the
/// primary key: no statement of a pass reads the whole table. With the batch's keys given
/// as `IN (subquery)`, the planner hash-joined them against a scan of the whole table,
/// analyzed or not, so every batch paid for the table's size (21 ms a batch beside
/// 100,000 rows instead of 3.5 ms, and the acquirers beside it waited). The table is
/// analyzed first, as autovacuum would: on a small table never analyzed the planner may
/// still prefer a scan and a sort for the batch's first few statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_never_scans_the_whole_table() {
    let Some(db) = TestDb::<Postgres>::open().await else {
        return;
    };
    // The scan counters are read on the reaper's own server session: behind a pooler a
    // pool's connection is not one session, and the counters would be another's.
    if !Postgres::sessions_of_their_own(&db.location).await {
        eprintln!("reaper_never_scans_the_whole_table: behind a pooler; checked on the direct run");
        return;
    }
    const ROWS: i64 = 20_000;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (lock_key, lock_value, expire_time)
         SELECT 'expired:' || g, 'plain', clock_timestamp() - INTERVAL '1 hour'
           FROM generate_series(1, $1) AS g",
        db.table
    )))
    .bind(ROWS)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {}", db.table)))
        .execute(&db.pool)
        .await
        .unwrap();

    // One connection: the reaper's statements and the counters' reads share a session.
    let pool = Postgres::connect(&db.location, 1).await;
    let locker = Locker::builder(pool.clone())
        .table(&db.table)
        .auto_renew(false)
        .listen(false)
        .build()
        .unwrap();
    let before = scans(&pool, &db.table).await;
    assert_eq!(locker.reap_expired().await.unwrap(), ROWS as u64);
    let after = scans(&pool, &db.table).await;
    assert_eq!(
        after.0 - before.0,
        0,
        "sequential scans of the lock table while reaping {ROWS} rows"
    );
    assert!(
        after.1 > before.1,
        "the reaper's index scans are counted: {before:?} -> {after:?}"
    );
    pool.close().await;
}

/// The table's (sequential, index) scan counters, this session's own statements included.
async fn scans(pool: &PgPool, table: &str) -> (i64, i64) {
    // Flushed when the session goes idle after this statement, before the next one runs.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}
