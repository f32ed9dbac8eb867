//! Issue 43, point 1: every guard type has the same fencing surface. `ensure_held()` and
//! `remaining()` are local (no statement: a process frozen past its lease learns before
//! it acts, from its own clock), and `MultiGuard::assert_held` checks all its keys in one
//! statement inside the caller's transaction.

use std::time::Duration;

use dblock::{Error, Locker, LostReason};
use tokio::time::timeout;

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// The lease of the local-deadline cases, and a margin that ends it locally after about a
/// second while the database keeps the row live four seconds longer: "lost here, live
/// there" is then an invariant, however busy the machine, not a race.
const LEASE: Duration = Duration::from_secs(5);
const MARGIN: Duration = Duration::from_secs(4);

/// A Locker that does not renew (as a frozen process does not), with [`MARGIN`].
fn frozen_locker<DB: TestBackend>(db: &TestDb<DB>) -> Locker<DB> {
    Locker::builder(db.pool.clone())
        .table(&db.table)
        .renew_interval(Duration::from_millis(100))
        .lease_margin(MARGIN)
        .auto_renew(false)
        .build()
        .expect("valid options")
}

/// Asserts what a guard's local surface says before its local deadline.
macro_rules! held_now {
    ($guard:expr, $key:expr) => {{
        $guard.ensure_held().expect("held right after the grant");
        let left = $guard.remaining();
        assert!(
            left > Duration::ZERO && left <= LEASE - MARGIN,
            "{}: remaining {left:?}, the lease less its margin at most",
            $key
        );
    }};
}

/// Asserts what a guard's local surface says once its local deadline has passed, the
/// database still holding its row live.
macro_rules! lost_here {
    ($db:expr, $guard:expr, $key:expr) => {{
        tokio::time::timeout(PATIENCE, $guard.lost())
            .await
            .expect("lost at its local deadline");
        match $guard.ensure_held() {
            Err(Error::LockLost { key, reason }) => {
                assert_eq!(key, $key);
                assert_eq!(reason, LostReason::Expired, "nobody renews it");
            }
            other => panic!("{}: ensure_held past the deadline: {other:?}", $key),
        }
        assert_eq!($guard.remaining(), Duration::ZERO);
        // The database still has the row live: the answer came from this process's clock.
        assert!(
            !$db.plain.is_expired($key).await,
            "{}: live in the database",
            $key
        );
    }};
}

pub async fn every_guard_knows_locally_that_its_lease_ended<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = frozen_locker(&db);
    let mutex = locker.try_acquire("surface:mutex", LEASE).await.unwrap();
    let permit = locker
        .semaphore("surface-sem", 2)
        .try_acquire(LEASE)
        .await
        .unwrap();
    let read = locker
        .rw_lock("surface-read")
        .try_read(LEASE)
        .await
        .unwrap();
    let write = locker
        .rw_lock("surface-write")
        .try_write(LEASE)
        .await
        .unwrap();
    let election = locker.election("surface-election");
    let leading = election.campaign("node-a", LEASE).await.unwrap();
    let multi = locker
        .try_acquire_all(&["surface:a", "surface:b"], LEASE)
        .await
        .unwrap()
        .expect("free keys");
    let mutex = mutex.expect("a free key");
    let (permit, read, write) = (permit.unwrap(), read.unwrap(), write.unwrap());

    let permit_key = permit.key().to_owned();
    let read_key = read.key().to_owned();
    let grant_key = write.key().to_owned(); // the write derefs to its grant row's guard
    let leader_key = election.key();
    held_now!(mutex, "surface:mutex");
    held_now!(permit, permit_key.as_str());
    held_now!(read, read_key.as_str());
    held_now!(write, grant_key.as_str());
    held_now!(leading, leader_key.as_str());
    held_now!(multi, "surface:a");
    // From here on no statement goes out: the answers below are local.
    let statements = locker.stats().attempts + locker.stats().renewals;
    lost_here!(db, mutex, "surface:mutex");
    lost_here!(db, permit, permit_key.as_str());
    lost_here!(db, read, read_key.as_str());
    lost_here!(db, write, grant_key.as_str());
    lost_here!(db, leading, leader_key.as_str());
    assert_eq!(
        locker.stats().attempts + locker.stats().renewals,
        statements,
        "no statement was sent"
    );

    // The several-key guard (taken last, so its deadline may still be ahead: wait for
    // it): its local surface is its first lost key's, in key order.
    timeout(PATIENCE, multi.lost())
        .await
        .expect("lost at its deadline");
    multi.ensure_held().expect_err("its leases ended");
    assert_eq!(multi.remaining(), Duration::ZERO);
    let (key, reason) = multi.lost_reason().expect("lost");
    assert_eq!((key.as_str(), reason), ("surface:a", LostReason::Expired));
    assert!(
        !db.plain.is_expired("surface:b").await,
        "live in the database"
    );
}

pub async fn a_multi_guard_asserts_all_its_keys_in_its_transaction<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let keys = ["transfer:a", "transfer:b", "transfer:c"];
    let all = db.locker.try_acquire_all(&keys, LONG).await.unwrap();
    let all = all.expect("free keys");
    let mut tx = db.pool.begin().await.unwrap();
    all.assert_held(&mut tx).await.expect("all three held");
    all.commit(tx).await.expect("committed");

    // One key taken over by a rival: the check refuses, naming it.
    assert!(
        db.locker.force_release("transfer:b").await.unwrap(),
        "b was held"
    );
    let rival = db.locker.try_acquire("transfer:b", LONG).await.unwrap();
    let rival = rival.expect("b was free");
    let mut tx = db.pool.begin().await.unwrap();
    match all.assert_held(&mut tx).await {
        Err(Error::NotHeld { key, .. }) => assert_eq!(key, "transfer:b"),
        other => panic!("a multi-guard with a key taken over: {other:?}"),
    }
    drop(tx);
    // The rival's row is untouched by the refused check.
    let row = db
        .locker
        .holder("transfer:b")
        .await
        .unwrap()
        .expect("b is held");
    assert_eq!(row.owner, rival.owner());
    rival.release().await.unwrap();
    let released = all.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { ref key, .. }) if key == "transfer:b"),
        "{released:?}"
    );
}
