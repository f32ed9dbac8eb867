//! `Durability::Relaxed`: an `UNLOGGED` lock table of its own, refused where a durable one
//! stands (and the other way round), interoperable with plain SQL, and a token sequence
//! moved past every earlier server start's tokens. The crash itself is fault scenario 3b.

use std::time::Duration;

use dblock::{DEFAULT_RELAXED_TABLE, DEFAULT_TABLE, Durability, Error, Locker, Postgres};
use sqlx::PgPool;

use crate::common::TestDb;

const LEASE: Duration = Duration::from_secs(30);
/// How far the first acquisition after another server start moves the token sequence.
const EPOCH_STEP: i64 = 1 << 32;

fn relaxed(db: &TestDb<Postgres>) -> Locker<Postgres> {
    Locker::builder(db.pool.clone())
        .table(&db.table)
        .durability(Durability::Relaxed)
        .auto_renew(false)
        .build()
        .expect("a valid relaxed locker")
}

/// `p` (logged) or `u` (unlogged) for the relation `name`.
async fn persistence(pool: &PgPool, name: &str) -> String {
    sqlx::query_scalar("SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|err| panic!("{name}: {err}"))
}

#[tokio::test]
async fn relaxed_locks_get_a_table_of_their_own() {
    // Builder checks only: no connection is made (a lazy pool).
    let pool = PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none").unwrap();
    let fast = Locker::builder(pool.clone())
        .durability(Durability::Relaxed)
        .build()
        .unwrap();
    assert_eq!(fast.table(), DEFAULT_RELAXED_TABLE);
    let shared = Locker::builder(pool.clone())
        .durability(Durability::Relaxed)
        .table(DEFAULT_TABLE)
        .build();
    assert!(matches!(shared, Err(Error::InvalidConfig(_))), "{shared:?}");
    assert_eq!(Locker::new(pool).table(), DEFAULT_TABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_table_is_unlogged_and_its_sequence_logged() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    let fast = relaxed(&db);
    assert_eq!(
        fast.migrate().await.unwrap(),
        6,
        "V1-V3, the epoch step, V5 and V6"
    );
    assert_eq!(fast.migrate().await.unwrap(), 0, "idempotent");
    let t = &db.table;
    assert_eq!(persistence(&db.pool, t).await, "u");
    assert_eq!(persistence(&db.pool, &format!("{t}_ticket")).await, "u");
    assert_eq!(persistence(&db.pool, &format!("{t}_events")).await, "u");
    assert_eq!(
        persistence(&db.pool, &format!("{t}_fencing_seq")).await,
        "p"
    );
    assert_eq!(persistence(&db.pool, &format!("{t}_epoch")).await, "p");

    // Locks as usual.
    let guard = fast.try_acquire("relaxed", LEASE).await.unwrap().unwrap();
    assert!(fast.try_acquire("relaxed", LEASE).await.unwrap().is_none());
    guard.release().await.unwrap();

    // A durable Locker refuses the relaxed table, naming why, and writes nothing.
    let durable = Locker::builder(db.pool.clone()).table(t).build().unwrap();
    match durable.migrate().await {
        Err(Error::InvalidConfig(why)) => assert!(why.contains("UNLOGGED"), "{why}"),
        other => panic!("a durable migrate of a relaxed table: {other:?}"),
    }
    assert_eq!(persistence(&db.pool, t).await, "u");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_locker_refuses_a_durable_table() {
    let Some(db) = TestDb::<Postgres>::open().await else {
        return;
    };
    match relaxed(&db).migrate().await {
        Err(Error::InvalidConfig(why)) => assert!(why.contains("durable"), "{why}"),
        other => panic!("a relaxed migrate of a durable table: {other:?}"),
    }
    assert_eq!(persistence(&db.pool, &db.table).await, "p");
    let epoch: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("{}_epoch", db.table))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(epoch, None, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_clients_share_the_relaxed_table() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    let fast = relaxed(&db);
    fast.migrate().await.unwrap();
    // A plain client's INSERT of the three columns blocks dblock, its owner-checked
    // DELETE releases, its reaper DELETE removes an expired row.
    db.plain.insert("plain", "plain-owner", 30).await.unwrap();
    assert!(fast.try_acquire("plain", LEASE).await.unwrap().is_none());
    assert_eq!(db.plain.delete_owned("plain", "plain-owner").await, 1);
    let guard = fast.try_acquire("plain", LEASE).await.unwrap().unwrap();
    assert!(db.plain.insert("plain", "plain-owner", 30).await.is_err());
    assert_eq!(db.plain.delete_owned("plain", "plain-owner").await, 0);
    guard.release().await.unwrap();
    db.plain.insert("gone", "plain-owner", -1).await.unwrap();
    assert_eq!(db.plain.reap().await, 1);
}

/// What the first acquisition after another server start does, with the start faked by
/// moving the epoch row back: the sequence moves 2^32 ahead once, whatever the number of
/// acquisitions racing to be first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_server_start_moves_tokens_ahead_once() {
    let Some(db) = TestDb::<Postgres>::open_unmigrated().await else {
        return;
    };
    let fast = relaxed(&db);
    fast.migrate().await.unwrap();
    let before = fast.try_acquire("epoch:0", LEASE).await.unwrap().unwrap();
    let first = before.fencing_token();
    before.release().await.unwrap();
    assert!(first < EPOCH_STEP, "a fresh table starts low: {first}");

    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}_epoch SET started = '2000-01-01'",
        db.table
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let racers = (1..=8).map(|i| {
        let fast = fast.clone();
        tokio::spawn(async move {
            let key = format!("epoch:{i}");
            let guard = fast.try_acquire(&key, LEASE).await.unwrap().unwrap();
            let token = guard.fencing_token();
            guard.release().await.unwrap();
            token
        })
    });
    let tokens: Vec<i64> = futures::future::try_join_all(racers).await.unwrap();
    for token in &tokens {
        assert!(
            *token > first + EPOCH_STEP && *token < first + 2 * EPOCH_STEP,
            "moved once past {first}: {tokens:?}"
        );
    }
    let now_started: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT started = pg_postmaster_start_time() FROM {}_epoch",
        db.table
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(now_started, "the epoch row names this server start");

    // A read-write lock's write draws its tokens in one statement of its own
    // (`{table}_take_write`): it checks the epoch first too.
    let last = *tokens.iter().max().unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}_epoch SET started = '2000-01-01'",
        db.table
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let write = fast
        .rw_lock("epoch-rw")
        .try_write(LEASE)
        .await
        .unwrap()
        .unwrap();
    assert!(
        write.fencing_token() > last + EPOCH_STEP,
        "a write after another start moved past {last}: {}",
        write.fencing_token()
    );
    write.release().await.unwrap();
}
