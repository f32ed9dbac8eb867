//! Schema-qualified lock tables (`schema.table`): every relation dblock makes lives in the
//! table's schema, the same table name in two schemas is two lock tables, fencing tokens,
//! takeover, wake-ups and the operators' tools work there, and a schema that does not
//! exist is a missing table with nothing created.

use std::time::Duration;

use dblock::{Error, LockFilter, Locker, Postgres, RetryPolicy};
use sqlx::PgPool;
use tokio::time::{Instant, timeout};

use crate::common::schemas::Schemas;
use crate::common::{TestDb, wait_until};

const LONG: Duration = Duration::from_secs(30);
/// Bound for anything awaited or polled: far above what a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(15);
/// A waiter whose listener is up sleeps at least 30 s after a lost attempt (half the
/// cap): granted sooner after a release, the release's notification woke it.
const SLEEPY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(10),
    max: Duration::from_secs(60),
};
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// The relations of `schema`, by name.
async fn relations(pool: &PgPool, schema: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = $1 ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn scalar(pool: &PgPool, sql: String) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap()
}

fn locker(pool: &PgPool, table: &str) -> Locker<Postgres> {
    Locker::builder(pool.clone())
        .table(table)
        .auto_renew(false)
        .build()
        .expect("a valid qualified name")
}

/// One schema's lock table end to end: migrated into its schema (and only there), two
/// schemas' same-named tables independent, tokens from the schema's own sequence, plain
/// SQL's expired row taken over, admin list and force_release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_holds_its_lock_table() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    let schemas = Schemas::new(&db.pool, &db.location, 2, 2).await;
    let (one, two) = (&schemas.names[0], &schemas.names[1]);
    let table = format!("{one}.distributed_lock");
    let first = locker(&db.pool, &table);
    let second = locker(&db.pool, &format!("{two}.distributed_lock"));
    assert_eq!(first.table(), table);
    assert_eq!(first.migrate().await.unwrap(), 5);
    assert_eq!(
        first.migrate().await.unwrap(),
        0,
        "the history is found again"
    );
    assert_eq!(
        second.migrate().await.unwrap(),
        5,
        "another schema, another table"
    );

    let expected = [
        "distributed_lock",
        "distributed_lock_events",
        "distributed_lock_events_at_idx",
        "distributed_lock_events_id_seq",
        "distributed_lock_events_key_idx",
        "distributed_lock_events_pkey",
        "distributed_lock_expire_time_idx",
        "distributed_lock_fencing_seq",
        "distributed_lock_history",
        "distributed_lock_history_pkey",
        "distributed_lock_pkey",
        "distributed_lock_readers_idx",
        "distributed_lock_ticket",
        "distributed_lock_ticket_key_idx",
        "distributed_lock_ticket_pkey",
        "distributed_lock_ticket_seq",
    ];
    assert_eq!(relations(&db.pool, one).await, expected);
    assert_eq!(relations(&db.pool, two).await, expected);
    let history = format!("SELECT COUNT(*) FROM {table}_history");
    assert_eq!(scalar(&db.pool, history).await, 5);

    // Two schemas, two lock tables: the same key is free in each.
    let held = first.try_acquire("k", LONG).await.unwrap().expect("free");
    let elsewhere = second
        .try_acquire("k", LONG)
        .await
        .unwrap()
        .expect("free there");
    assert!(first.try_acquire("k", LONG).await.unwrap().is_none());
    let token = held.fencing_token();
    held.release().await.unwrap();
    elsewhere.release().await.unwrap();
    let again = first
        .try_acquire("k", LONG)
        .await
        .unwrap()
        .expect("released");
    assert!(again.fencing_token() > token);
    let drawn = format!("SELECT last_value FROM {table}_fencing_seq");
    assert_eq!(
        scalar(&db.pool, drawn.clone()).await,
        again.fencing_token(),
        "the schema's own sequence drew the token"
    );

    // A plain-SQL client's expired row (its token drawn by the column's default from the
    // schema's sequence) is taken over, with a later token.
    let plain: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (lock_key, lock_value, expire_time)
         VALUES ('expired', 'plain', clock_timestamp() - INTERVAL '1 hour')
         RETURNING fencing_token"
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(plain, again.fencing_token() + 1);
    let taken = first
        .try_acquire("expired", LONG)
        .await
        .unwrap()
        .expect("expired");
    assert!(taken.fencing_token() > plain);
    assert_eq!(scalar(&db.pool, drawn).await, taken.fencing_token());

    // The operators' tools.
    let listed: Vec<String> = first
        .list_matching(&LockFilter::new())
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.key)
        .collect();
    assert_eq!(listed, ["expired", "k"]);
    assert!(second.list("", 10).await.unwrap().is_empty());
    assert!(first.force_release("expired").await.unwrap());
    assert!(first.holder("expired").await.unwrap().is_none());
    assert!(matches!(taken.release().await, Err(Error::NotHeld { .. })));
    again.release().await.unwrap();
}

/// A schema that does not exist: migrate fails and creates nothing (no schema, no
/// table), and the lock calls say the table is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_a_missing_table() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    let schemas = Schemas::new(&db.pool, &db.location, 1, 0).await;
    let missing = &schemas.names[0];
    let table = format!("{missing}.distributed_lock");
    let locker = locker(&db.pool, &table);
    let refused = locker
        .migrate()
        .await
        .expect_err("dblock creates no schema");
    let said = format!("{refused:?}");
    assert!(
        said.contains(&format!("schema \\\"{missing}\\\" does not exist")),
        "{said}"
    );
    let count = format!("SELECT COUNT(*) FROM pg_namespace WHERE nspname = '{missing}'");
    assert_eq!(scalar(&db.pool, count).await, 0);
    match locker.try_acquire("k", LONG).await {
        Err(Error::MissingTable { table: t, .. }) => assert_eq!(t, table),
        other => panic!("{other:?}"),
    }
}

/// A waiter of another Locker (its own pool and listener) on a schema's table is woken by
/// a release at once: the channel names the qualified table on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_a_schema_wakes_its_waiters() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    if !db.hears_releases().await {
        eprintln!("a_release_in_a_schema_wakes_its_waiters: behind a pooler, waiters poll");
        return;
    }
    let schemas = Schemas::new(&db.pool, &db.location, 1, 1).await;
    let table = format!("{}.distributed_lock", schemas.names[0]);
    let holder = locker(&db.pool, &table);
    holder.migrate().await.unwrap();
    let waiter = Locker::builder(db.another_pool().await)
        .table(&table)
        .auto_renew(false)
        .retry(SLEEPY)
        .build()
        .unwrap();
    let marked = |key: &'static str| {
        let pool = db.pool.clone();
        let sql =
            format!("SELECT COALESCE(bool_or(waiters), false) FROM {table} WHERE lock_key = $1");
        async move {
            sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(sql))
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    // Round one starts the waiter's listener; round two is woken through it.
    for key in ["warm-up", "woken"] {
        let held = holder.try_acquire(key, LONG).await.unwrap().unwrap();
        let before = waiter.stats();
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let guard = waiter.acquire(key, LONG, PATIENCE).await.unwrap();
                (guard, Instant::now())
            })
        };
        if key == "warm-up" {
            wait_until("the waiter listens", PATIENCE, async || waiter.listening()).await;
        } else {
            wait_until("the waiter marked the row", PATIENCE, async || {
                marked(key).await
            })
            .await;
        }
        let released = Instant::now();
        held.release().await.unwrap();
        let (guard, acquired) = timeout(PATIENCE, waiting).await.unwrap().unwrap();
        if key == "woken" {
            assert_eq!(
                waiter.stats().wakeups - before.wakeups,
                1,
                "woken by the release"
            );
            let took = acquired - released;
            assert!(took < WOKEN_WITHIN, "the woken waiter took {took:?}");
        }
        guard.release().await.unwrap();
    }
}

/// A relaxed (UNLOGGED) table in a schema: its epoch table and function go there too,
/// and it acquires with tokens from the schema's sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_table_in_a_schema() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    let schemas = Schemas::new(&db.pool, &db.location, 1, 1).await;
    let schema = &schemas.names[0];
    let table = format!("{schema}.fast_lock");
    let relaxed = Locker::builder(db.pool.clone())
        .table(&table)
        .durability(dblock::Durability::Relaxed)
        .auto_renew(false)
        .build()
        .unwrap();
    assert_eq!(relaxed.migrate().await.unwrap(), 6);
    let names = relations(&db.pool, schema).await;
    assert!(names.iter().any(|n| n == "fast_lock_epoch"), "{names:?}");
    let function = format!(
        "SELECT COUNT(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = '{schema}' AND p.proname = 'fast_lock_new_epoch'"
    );
    assert_eq!(scalar(&db.pool, function).await, 1);
    let guard = relaxed.try_acquire("k", LONG).await.unwrap().expect("free");
    let drawn = format!("SELECT last_value FROM {table}_fencing_seq");
    assert_eq!(scalar(&db.pool, drawn).await, guard.fencing_token());
    guard.release().await.unwrap();
}
