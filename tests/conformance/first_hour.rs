//! Issue 14's cases: what a new user meets in the first hour. A release after the lease
//! ran out says so; a table that was never migrated, a huge key and conflicting builder
//! options each give an error that says what to do.

use std::time::Duration;

use dblock::{Error, Locker, LostReason};
use tokio::time::{Instant, sleep};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// Waits until the database itself says the lease of `key` has run out (its clock, not
/// ours, decides).
async fn until_expired<DB: TestBackend>(locker: &Locker<DB>, key: &str) {
    let give_up = Instant::now() + PATIENCE;
    while !locker
        .holder(key)
        .await
        .unwrap()
        .is_some_and(|holder| holder.expired)
    {
        assert!(Instant::now() < give_up, "{key} never expired");
        sleep(Duration::from_millis(20)).await;
    }
}

/// `release()` after the lease ran out (nobody took over) deletes the row and answers
/// `LockLost(Expired)`, not `Ok`: the work was not protected to its end. The same for a
/// reentrant owner's last guard; its first (nested) release is a plain `Ok`.
pub async fn release_after_expiry_says_so<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let short = Duration::from_millis(200);
    let locker = db.locker.auto_renew(false);

    let guard = locker.try_acquire("late", short).await.unwrap().unwrap();
    until_expired(&locker, "late").await;
    match guard.release().await {
        Err(Error::LockLost { key, reason }) => {
            assert_eq!((key.as_str(), reason), ("late", LostReason::Expired))
        }
        other => panic!("expected LockLost(Expired), got {other:?}"),
    }
    assert_eq!(locker.holder("late").await.unwrap(), None, "the row went");

    let owner = locker.owner();
    let outer = owner
        .try_acquire("late-owner", short)
        .await
        .unwrap()
        .unwrap();
    let inner = owner
        .try_acquire("late-owner", short)
        .await
        .unwrap()
        .unwrap();
    until_expired(&locker, "late-owner").await;
    inner
        .release()
        .await
        .expect("a nested release only gives up its hold");
    assert!(matches!(
        outer.release().await,
        Err(Error::LockLost {
            reason: LostReason::Expired,
            ..
        })
    ));
    assert_eq!(locker.holder("late-owner").await.unwrap(), None);

    // In time, release is Ok as ever.
    let guard = locker.try_acquire("on-time", LONG).await.unwrap().unwrap();
    guard.release().await.unwrap();
}

/// A locker on a table nobody migrated names the table and says to run `migrate()`.
pub async fn missing_table_says_migrate<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let outcomes = [
        db.locker.try_acquire("k", LONG).await.map(drop),
        db.locker.holder("k").await.map(drop),
        db.locker.reap_expired().await.map(drop),
    ];
    for outcome in outcomes {
        match outcome {
            Err(err @ Error::MissingTable { .. }) => {
                let text = err.to_string();
                assert!(text.contains(&db.table), "{text}");
                assert!(text.contains("migrate()"), "{text}");
            }
            other => panic!("expected MissingTable, got {other:?}"),
        }
    }
    db.locker.migrate().await.unwrap();
    assert!(db.locker.try_acquire("k", LONG).await.unwrap().is_some());
}

/// Error texts stay readable and name what the user set.
pub async fn error_texts_are_actionable<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    // A 10 KB key is cut in the text, with its length.
    let huge = "k".repeat(10 * 1024);
    let err = db.locker.try_acquire(&huge, LONG).await.unwrap_err();
    let text = err.to_string();
    assert!(text.len() < 200, "{} bytes: {text}", text.len());
    assert!(text.contains("(10240 bytes)"), "{text}");

    // A short default lease alone is fine: each lease renews at lease / 3 anyway.
    let builder = || Locker::builder(db.pool.clone()).table(&db.table);
    builder()
        .default_lease(Duration::from_secs(1))
        .build()
        .expect("a short default lease needs no other option");
    // Two options that conflict are both named, with the values given.
    let err = builder()
        .default_lease(Duration::from_secs(1))
        .renew_interval(Duration::from_secs(10))
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("renew_interval (10s)") && text.contains("default_lease (1s)"),
        "{text}"
    );
    // One set against a default: the default is named as such.
    let err = builder()
        .renew_interval(Duration::from_secs(20))
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("30s, the default"), "{text}");
}
