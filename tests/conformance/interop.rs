//! The lock table is a documented format: a client with hand-written SQL and dblock must
//! respect each other's rows.

use std::time::Duration;

use dblock::{Error, Holder};

use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, TestDb, is_unique_violation, wait_until};

pub async fn plain_sql_interop<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let plain = &db.plain;

    // A plain row with only the three columns blocks dblock for its lease.
    plain.insert("plain-live", "plain-owner", 30).await.unwrap();
    assert!(
        db.locker
            .try_acquire("plain-live", LONG)
            .await
            .unwrap()
            .is_none()
    );
    let holder = db.locker.holder("plain-live").await.unwrap().unwrap();
    assert_eq!(holder.owner, "plain-owner");
    assert!(!holder.expired);
    assert!(matches!(
        db.locker
            .acquire("plain-live", LONG, Duration::from_millis(100))
            .await,
        Err(Error::Timeout { .. })
    ));

    // dblock's row makes the plain INSERT fail with a duplicate key.
    let guard = db
        .locker
        .try_acquire("crate-live", LONG)
        .await
        .unwrap()
        .unwrap();
    let err = plain
        .insert("crate-live", "intruder", 30)
        .await
        .expect_err("the key is taken");
    assert!(is_unique_violation(&err), "{err}");

    // Owner-checked deletes with a wrong value remove nothing, on either kind of row.
    assert_eq!(plain.delete_owned("crate-live", "intruder").await, 0);
    assert_eq!(plain.delete_owned("plain-live", guard.owner()).await, 0);
    let crate_live = Some((guard.owner().to_owned(), guard.fencing_token(), false));
    let who = |holder: Option<Holder>| holder.map(|h| (h.owner, h.fencing_token, h.expired));
    assert_eq!(
        who(db.locker.holder("crate-live").await.unwrap()),
        crate_live
    );

    // A plain reaper removes exactly the expired rows: one expired dblock row, not the
    // live dblock row, not the live plain row.
    let expiring = db
        .locker
        .try_acquire("crate-expired", SHORT)
        .await
        .unwrap()
        .unwrap();
    // Poll with the reaper's own clock (MySQL NOW() and SQLite datetime('now') have
    // whole seconds).
    wait_until(
        "the plain client sees the row expired",
        PATIENCE,
        async || plain.is_expired("crate-expired").await,
    )
    .await;
    assert_eq!(plain.row_count().await, 3);
    assert_eq!(plain.reap().await, 1);
    assert_eq!(plain.row_count().await, 2);
    assert_eq!(db.locker.holder("crate-expired").await.unwrap(), None);
    assert_eq!(
        who(db.locker.holder("crate-live").await.unwrap()),
        crate_live
    );
    assert_eq!(
        db.locker.holder("plain-live").await.unwrap().unwrap().owner,
        "plain-owner"
    );
    assert!(matches!(
        expiring.release().await,
        Err(Error::NotHeld { .. })
    ));

    // A plain row that has expired is taken over, with a larger token.
    plain
        .insert("plain-expired", "plain-owner", -1)
        .await
        .unwrap();
    let stale = db.locker.holder("plain-expired").await.unwrap().unwrap();
    assert!(stale.expired, "{stale:?}");
    let taker = db
        .locker
        .try_acquire("plain-expired", LONG)
        .await
        .unwrap()
        .expect("an expired plain row is taken over");
    assert!(taker.fencing_token() > stale.fencing_token);
    assert_eq!(plain.delete_owned("plain-expired", "plain-owner").await, 0);
    taker.release().await.unwrap();

    // The plain client's own owner-checked delete is a release dblock respects.
    assert_eq!(plain.delete_owned("plain-live", "plain-owner").await, 1);
    let after = db.locker.try_acquire("plain-live", LONG).await.unwrap();
    after
        .expect("free after the plain release")
        .release()
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(plain.row_count().await, 0);
}

/// Keys are exact byte strings: keys that differ only in case, trailing space or
/// Unicode normalization are different locks.
pub async fn keys_are_exact<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let keys = ["job", "Job", "job ", " job", "jöb", "jo\u{308}b", "job\t"];
    let mut guards = Vec::new();
    for key in keys {
        let guard = db.locker.try_acquire(key, LONG).await.unwrap();
        let guard = guard.unwrap_or_else(|| panic!("{key:?} is its own lock"));
        assert_eq!(guard.key(), key);
        guards.push(guard);
    }
    assert_eq!(db.plain.row_count().await, keys.len() as i64);
    for (key, guard) in keys.iter().zip(&guards) {
        let holder = db.locker.holder(key).await.unwrap().unwrap();
        assert_eq!(holder.owner, guard.owner(), "{key:?}");
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(db.plain.row_count().await, 0);
}
