//! dblock behind a PgBouncer that does not track prepared statements (before 1.21, or
//! `max_prepared_statements = 0`) in transaction mode: the mix-up of sessions is a typed
//! error naming the fix, not a stray "prepared statement does not exist".
//!
//! Needs `DBLOCK_TEST_OLD_PGBOUNCER_URL`: a PgBouncer in transaction mode with
//! `max_prepared_statements = 0` and one server connection (`default_pool_size = 1`), so
//! that two clients' statements meet on it, in front of the server that
//! `DBLOCK_TEST_POSTGRES_URL` reaches directly (for the set-up). `.ci/run` starts one;
//! without it the test is skipped with a message, and `DBLOCK_TEST_REQUIRE=old-pgbouncer`
//! makes that a failure.

use std::time::Duration;

use dblock::{Error, Locker};
use sqlx::postgres::PgPoolOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_up_prepared_statements_are_named() {
    let Some(url) = std::env::var("DBLOCK_TEST_OLD_PGBOUNCER_URL")
        .ok()
        .filter(|url| !url.is_empty())
    else {
        let required = std::env::var("DBLOCK_TEST_REQUIRE").unwrap_or_default();
        assert!(
            !required.split(',').any(|b| b.trim() == "old-pgbouncer"),
            "DBLOCK_TEST_OLD_PGBOUNCER_URL is unset but DBLOCK_TEST_REQUIRE names old-pgbouncer"
        );
        eprintln!("skipping: DBLOCK_TEST_OLD_PGBOUNCER_URL unset (an old-style PgBouncer)");
        return;
    };
    let pool = |n| {
        PgPoolOptions::new()
            .max_connections(n)
            .connect_lazy(&url)
            .unwrap()
    };
    let table = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // Migrated straight on the server: through this pooler any statement may meet a
    // stale prepared statement of an earlier client on its one server connection.
    let direct = std::env::var("DBLOCK_TEST_POSTGRES_URL")
        .expect("DBLOCK_TEST_POSTGRES_URL: the server behind the pooler, for the set-up");
    let direct = PgPoolOptions::new().connect(&direct).await.unwrap();
    let setup = Locker::builder(direct.clone())
        .table(&table)
        .build()
        .unwrap();
    setup.migrate().await.unwrap();
    // Two clients, one server connection: the second client's first statement finds the
    // first client's `sqlx_s_1` (or misses its own) there.
    let lockers: Vec<Locker<sqlx::Postgres>> = (0..2)
        .map(|_| Locker::builder(pool(1)).table(&table).build().unwrap())
        .collect();
    let mut mixups = 0;
    for round in 0..20 {
        for locker in &lockers {
            let key = format!("k{round}");
            match locker.try_acquire(&key, Duration::from_secs(5)).await {
                Ok(Some(guard)) => drop(guard.release().await),
                Ok(None) => {}
                Err(err @ Error::PoolerMixesSessions { .. }) => {
                    let text = err.to_string();
                    assert!(
                        text.contains("session mode") && text.contains("1.21"),
                        "{text}"
                    );
                    mixups += 1;
                }
                Err(other) => panic!("expected PoolerMixesSessions, got {other:?}"),
            }
        }
    }
    assert!(
        mixups > 0,
        "no mix-up seen in 40 attempts through the old-style pooler"
    );
    let cleanup = direct;
    for sql in [
        format!("DROP TABLE IF EXISTS {table}, {table}_history"),
        format!("DROP SEQUENCE IF EXISTS {table}_fencing_seq"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&cleanup)
            .await
            .unwrap();
    }
}
