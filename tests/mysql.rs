mod common;
mod conformance;

use std::time::Duration;

use common::{TestBackend, TestDb};
use dblock::MySql;
use sqlx::{Connection, MySqlConnection};

conformance::conformance_suite!(MySql);

/// A plain client whose session is not in UTC: `NOW()` there is local time, and the
/// table must still store the instant it means (TIMESTAMP converts, DATETIME would not).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_client_in_another_time_zone() {
    let Some(db) = TestDb::<MySql>::open().await else {
        return;
    };
    let mut session = MySqlConnection::connect(&db.location).await.unwrap();
    sqlx::raw_sql("SET time_zone = '+08:00'")
        .execute(&mut session)
        .await
        .unwrap();
    let zone: String = sqlx::query_scalar("SELECT @@session.time_zone")
        .fetch_one(&mut session)
        .await
        .unwrap();
    assert_eq!(zone, "+08:00");

    let insert = |expiry: &str| {
        format!(
            "INSERT INTO {} (lock_key, lock_value, expire_time) VALUES (?, ?, {expiry})",
            db.table
        )
    };
    let lease = Duration::from_secs(30);

    // Live for 30 seconds, whatever the session's zone.
    sqlx::query(sqlx::AssertSqlSafe(insert("NOW() + INTERVAL 30 SECOND")))
        .bind("tz-live")
        .bind("tz-client")
        .execute(&mut session)
        .await
        .unwrap();
    assert!(
        db.locker
            .try_acquire("tz-live", lease)
            .await
            .unwrap()
            .is_none()
    );
    let holder = db.locker.holder("tz-live").await.unwrap().unwrap();
    assert_eq!(holder.owner, "tz-client");
    assert!(!holder.expired, "a +08:00 client's live row looks expired");

    // Expired a second ago in +08:00 is expired in UTC too.
    sqlx::query(sqlx::AssertSqlSafe(insert("NOW() - INTERVAL 1 SECOND")))
        .bind("tz-expired")
        .bind("tz-client")
        .execute(&mut session)
        .await
        .unwrap();
    assert!(
        db.locker
            .holder("tz-expired")
            .await
            .unwrap()
            .unwrap()
            .expired
    );
    let taker = db
        .locker
        .try_acquire("tz-expired", lease)
        .await
        .unwrap()
        .expect("a +08:00 client's expired row is taken over");

    // And the +08:00 client sees dblock's row as live.
    let live: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {} WHERE lock_key = ? AND expire_time > NOW()",
        db.table
    )))
    .bind("tz-expired")
    .fetch_one(&mut session)
    .await
    .unwrap();
    assert_eq!(live, 1);

    taker.release().await.unwrap();
    session.close().await.unwrap();
}

/// The migration claim that serializes runs across Galera nodes (where `GET_LOCK` is a
/// node's own): a claim row written by "another node" (a plain client here, with the
/// GET_LOCK of this server free) holds `migrate` of a fresh table back until it is
/// deleted, and an expired claim is taken over at once. (An up-to-date table's migrate
/// reads the history and returns without claiming anything: nothing to serialize.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migration_claim_holds_runs_on_other_nodes_back() {
    let Some(db) = TestDb::<MySql>::open_unmigrated().await else {
        return;
    };
    // The claim table as the dialect makes it (MIGRATION_CLAIM_TABLE), made first here:
    // "the other node" got there before this one.
    let claim_table = |table: &str| {
        format!(
            "CREATE TABLE IF NOT EXISTS {table}_migrating (id TINYINT NOT NULL PRIMARY KEY, \
             owner VARCHAR(64) NOT NULL, expire_time DATETIME(6) NOT NULL) ENGINE = InnoDB"
        )
    };
    let claim = |table: &str, expiry: &str| {
        format!(
            "INSERT INTO {table}_migrating (id, owner, expire_time) VALUES (1, 'other-node', {expiry})"
        )
    };
    let mut session = MySqlConnection::connect(&db.location).await.unwrap();
    for statement in [
        claim_table(&db.table),
        claim(&db.table, "NOW(6) + INTERVAL 30 SECOND"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut session)
            .await
            .unwrap();
    }
    let run = tokio::spawn({
        let locker = db.locker.clone();
        async move { locker.migrate().await }
    });
    // Held back: still running after several of its polls.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !run.is_finished(),
        "migrate ran while another node held the claim"
    );
    let unclaim = format!("DELETE FROM {}_migrating", db.table);
    sqlx::raw_sql(sqlx::AssertSqlSafe(unclaim.clone()))
        .execute(&mut session)
        .await
        .unwrap();
    let applied = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("migrate goes on once the claim is gone")
        .unwrap()
        .unwrap();
    assert_eq!(applied, MySql::MIGRATION_FILES, "the held-back run applied");
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM {}_migrating",
        db.table
    )))
    .fetch_one(&mut session)
    .await
    .unwrap();
    assert_eq!(left, 0, "a run deletes its own claim");

    // A claim whose run died (expired by the database clock) is taken over, on another
    // fresh table.
    let Some(other) = TestDb::<MySql>::open_unmigrated().await else {
        return;
    };
    for statement in [
        claim_table(&other.table),
        claim(&other.table, "NOW(6) - INTERVAL 1 SECOND"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut session)
            .await
            .unwrap();
    }
    let applied = tokio::time::timeout(Duration::from_secs(30), other.locker.migrate())
        .await
        .expect("an expired claim does not hold migrate back")
        .unwrap();
    assert_eq!(applied, MySql::MIGRATION_FILES);
}
