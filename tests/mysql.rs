mod common;
mod conformance;

use std::time::Duration;

use common::TestDb;
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
