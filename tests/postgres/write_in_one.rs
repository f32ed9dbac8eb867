//! A read-write lock's write in one statement (`{table}_take_write`, migration V5): how it
//! is ordered with a reader in flight, and the transaction it falls back to where the
//! function is missing.

use std::time::Duration;

use dblock::Postgres;
use sqlx::Connection;

use crate::common::{TestDb, wait_until};

const LONG: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(30);

/// A reader that committed its row while the write waited for the grant's advisory lock
/// (a reader holds it shared until its commit) is seen by the write's look for readers:
/// the write takes nothing. The look is a statement of its own inside the function, with a
/// snapshot taken after the wait; a look taken before the wait (the function's looks moved
/// above its advisory locks: seen failing so), or one snapshot for the whole call (the
/// look as a subquery of one statement), misses that row, and the write holds beside the
/// reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sees_a_reader_that_committed_while_it_waited() {
    let Some(db) = TestDb::<Postgres>::open().await else {
        return;
    };
    let table = &db.table;
    // The reader's acquisition as dblock sends it, played by a plain client in two steps:
    // the grant's advisory lock shared, then the reader's row, committed only later.
    let begin = format!(
        "BEGIN; SELECT pg_advisory_xact_lock_shared(hashtextextended('{table}:rw~write-grant', 0)); \
         INSERT INTO {table} (lock_key, lock_value, expire_time) \
         VALUES ('rw~read-00000000000000aa', 'plain-reader', now() + INTERVAL '30 seconds')"
    );
    let write = write_beside_a_plain_transaction(&db, &begin, "advisory").await;
    assert!(
        write.is_none(),
        "a write was granted beside a reader that committed first"
    );
    assert_eq!(db.plain.row_count().await, 1, "only the reader's row");
}

/// A table whose function is missing (migrated by an older dblock, or the function
/// dropped) takes its writes in a transaction, as before V5: still both rows or neither,
/// still one commit, and a reader still keeps a write out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_function_a_write_takes_a_transaction() {
    let Some(db) = TestDb::<Postgres>::open().await else {
        return;
    };
    let drop = format!("DROP FUNCTION {}_take_write", db.table);
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&db.pool)
        .await
        .unwrap();
    let lock = db.locker.rw_lock("ledger");
    for _ in 0..3 {
        let before = db.locker.stats();
        let write = lock.try_write(LONG).await.unwrap().expect("free");
        assert_eq!(db.locker.stats().attempts - before.attempts, 1);
        assert!(lock.try_read(LONG).await.unwrap().is_none(), "written");
        assert_eq!(
            db.plain.row_count().await,
            2,
            "the writer's row and the grant"
        );
        write.release().await.unwrap();
    }
    let read = lock.try_read(LONG).await.unwrap().expect("free");
    assert!(lock.try_write(LONG).await.unwrap().is_none(), "read");
    assert_eq!(db.plain.row_count().await, 1, "nothing of the write kept");
    read.release().await.unwrap();
}

/// Never one row alone: a plain client that inserts the grant's row without the advisory
/// lock, uncommitted while the write's statement runs, is not seen by the write's looks
/// (its snapshot) but stops the write's insert of that row (the unique check waits for the
/// client's commit, then finds the row live). The write has taken the writer's row by then:
/// the call raises 55P03 and undoes it, and the write answers "not acquired" with no row
/// of its own left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_takes_one_row_of_two_keeps_neither() {
    let Some(db) = TestDb::<Postgres>::open().await else {
        return;
    };
    let table = &db.table;
    let begin = format!(
        "BEGIN; INSERT INTO {table} (lock_key, lock_value, expire_time) \
         VALUES ('rw~write-grant', 'plain-client', now() + INTERVAL '30 seconds')"
    );
    let write = write_beside_a_plain_transaction(&db, &begin, "transactionid").await;
    assert!(
        write.is_none(),
        "a write beside the plain client's grant row"
    );
    assert_eq!(db.plain.row_count().await, 1, "only the plain client's row");
    let holder = db.locker.holder("rw~write-grant").await.unwrap().unwrap();
    assert_eq!(holder.owner, "plain-client");
}

/// The look for a lock's live readers (a byte-order range of keys) can be served by an
/// index, whatever the database's collation: V5's partial index of readers' rows, in
/// `COLLATE "C"`. Without it the look scans the whole table, dead rows included, at every
/// write. (Sequential scans are turned off here so that the plan shows whether an index
/// *can* serve it: on a table this small the planner would scan anyway.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_look_for_readers_can_use_an_index() {
    let Some(db) = TestDb::<Postgres>::open().await else {
        return;
    };
    // One transaction, `SET LOCAL`: behind a transaction pooler a session's `SET` could
    // land on another server connection than the `EXPLAIN` (and stay there for others).
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL enable_seqscan = off")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The look as LIVE_MEMBER and the function send it.
    let explain = format!(
        "EXPLAIN SELECT EXISTS (SELECT 1 FROM {} \
          WHERE lock_key COLLATE \"C\" >= 'rw~read-' AND lock_key COLLATE \"C\" < 'rw~read.' \
            AND lock_key LIKE '%~read-%' AND expire_time > clock_timestamp())",
        db.table
    );
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let plan = plan.join("\n");
    // An index scan: the readers' index, or (in a database whose collation is "C"
    // itself) perhaps the primary key; never a scan of the table.
    assert!(!plan.contains("Seq Scan"), "{plan}");
    assert!(plan.contains("Index"), "{plan}");
}

/// A plain client's transaction begun with `begin` (left open), then a `try_write` of the
/// lock `rw` that waits for it (a lock of `waits_on`'s type not granted, in `pg_locks`),
/// then the plain client's COMMIT: what the write answered. The lock's first write
/// happens before, so that the watched one goes straight to its statement.
async fn write_beside_a_plain_transaction(
    db: &TestDb<Postgres>,
    begin: &str,
    waits_on: &str,
) -> Option<dblock::WriteGuard<Postgres>> {
    let lock = db.locker.rw_lock("rw");
    let first = lock.try_write(LONG).await.unwrap().expect("free");
    first.release().await.unwrap();

    let mut plain = sqlx::PgConnection::connect(&db.location).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(begin.to_owned()))
        .execute(&mut plain)
        .await
        .unwrap();
    let write = tokio::spawn(async move { lock.try_write(LONG).await });
    wait_until(
        "the write waits for the plain client",
        PATIENCE,
        async || {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = $1 AND NOT granted",
            )
            .bind(waits_on)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            write.is_finished() || waiting > 0
        },
    )
    .await;
    sqlx::raw_sql("COMMIT").execute(&mut plain).await.unwrap();
    let write = write.await.expect("the write's task").expect("try_write");
    plain.close().await.unwrap();
    write
}
