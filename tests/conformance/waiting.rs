//! Waiting acquires and `with_lock`.

use std::time::Duration;

use dblock::{Error, LockGuard, Locker};
use tokio::time::Instant;

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// A waiting acquire wins as soon as the holder releases mid-wait.
pub async fn acquire_waits_for_release<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "handover";
    let first = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    let locker = db.locker.clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move { locker.acquire(key, LONG, PATIENCE).await });

    // No signal exists for "the waiter has retried": hold the lock for a while, long
    // enough for several attempts, then check the waiter is still waiting.
    let held_for = Duration::from_millis(300);
    tokio::time::sleep(held_for).await;
    assert!(!waiter.is_finished(), "the waiter must not get a held lock");
    let first_token = first.fencing_token();
    first.release().await.unwrap();

    let second = waiter
        .await
        .unwrap()
        .expect("the waiter wins after the release");
    assert!(started.elapsed() >= held_for);
    assert!(second.fencing_token() > first_token);
    let holder = db.locker.holder(key).await.unwrap().unwrap();
    assert_eq!(holder.owner, second.owner());
    second.release().await.unwrap();
}

/// A waiting acquire gives up with Timeout when the holder keeps the lock.
pub async fn acquire_times_out<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "kept";
    let kept = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = db.locker.acquire(key, LONG, wait).await;
    let elapsed = started.elapsed();
    match result {
        Err(Error::Timeout {
            key: k,
            waited,
            attempts,
            held_by,
            held_until,
            held_here,
        }) => {
            assert_eq!(k, key);
            assert!(waited >= wait, "{waited:?}");
            assert!(attempts >= 2, "{attempts} attempts");
            // The error says who kept the key, and until when (database clock).
            assert_eq!(held_by.as_deref(), Some(kept.owner()));
            assert_eq!(held_until, Some(kept.expires_at()));
            // Kept by this same Locker: the text says so plainly.
            assert!(held_here, "the holder is this Locker");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(elapsed >= wait && elapsed < wait + PATIENCE, "{elapsed:?}");

    // A zero wait is a single attempt.
    match db.locker.acquire(key, LONG, Duration::ZERO).await {
        Err(Error::Timeout { attempts: 1, .. }) => {}
        other => panic!("expected Timeout after 1 attempt, got {other:?}"),
    }

    // with_lock times out the same way and never runs its closure.
    let mut ran = false;
    let with = db
        .locker
        .with_lock(key, LONG, wait, async |_| {
            ran = true;
            Ok::<_, Error>(())
        })
        .await;
    assert!(matches!(with, Err(Error::Timeout { .. })), "{with:?}");
    assert!(!ran);

    let holder = db.locker.holder(key).await.unwrap().unwrap();
    assert_eq!(holder.owner, kept.owner());
    kept.release().await.unwrap();
}

/// with_lock hands back the closure's value and releases, whether the work succeeded or
/// failed; the work's own error type carries dblock's errors through `From`.
pub async fn with_lock_returns_and_releases<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "scoped";
    let locker = &db.locker;

    let value = locker
        .with_lock(key, LONG, PATIENCE, async |guard: &LockGuard<DB>| {
            // Held while the closure runs.
            let holder = locker.holder(key).await.unwrap().unwrap();
            assert_eq!(holder.owner, guard.owner());
            assert_eq!(guard.key(), key);
            Ok::<_, Error>(42)
        })
        .await
        .expect("with_lock");
    assert_eq!(value, 42);
    assert_eq!(locker.holder(key).await.unwrap(), None);

    let failed: Result<u8, WorkError> = locker
        .with_lock(key, LONG, PATIENCE, async |_| {
            Err(WorkError::Work("work failed"))
        })
        .await;
    assert!(
        matches!(failed, Err(WorkError::Work("work failed"))),
        "{failed:?}"
    );
    assert_eq!(locker.holder(key).await.unwrap(), None);

    // Released for real: the next with_lock gets it at once.
    let again = locker
        .with_lock(key, LONG, Duration::ZERO, async |_| Ok::<_, Error>(()))
        .await;
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(db.plain.row_count().await, 0);
}

/// An application's own error type for work under a lock.
#[derive(Debug)]
enum WorkError {
    Work(&'static str),
    #[allow(dead_code)] // only ever built by `From`, read through Debug
    Lock(Error),
}

impl From<Error> for WorkError {
    fn from(err: Error) -> Self {
        WorkError::Lock(err)
    }
}

/// A semaphore's wait that runs out names the permit row it waited for (not the bare
/// `<name>~` its waiters line up under), and says plainly when the holder is this very
/// Locker; a holder elsewhere is named by its owner value only.
pub async fn a_primitive_timeout_names_its_row_and_this_process<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let calls = db.locker.semaphore("partner-api", 1);
    let permit = calls
        .try_acquire(LONG)
        .await
        .unwrap()
        .expect("a free permit");
    let wait = Duration::from_millis(200);
    let err = calls.acquire(LONG, wait).await.expect_err("no permit free");
    match &err {
        Error::Timeout {
            key,
            held_by,
            held_here,
            ..
        } => {
            assert_eq!(key, permit.key(), "the row waited for");
            assert!(key.len() > "partner-api~".len(), "{key:?}");
            assert_eq!(held_by.as_deref(), Some(permit.owner()));
            assert!(held_here, "held by this Locker");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(err.to_string().contains("held by this process"), "{err}");

    let elsewhere = Locker::builder(db.another_pool().await)
        .table(&db.table)
        .owner_prefix("elsewhere:")
        .build()
        .unwrap();
    let err = elsewhere
        .semaphore("partner-api", 1)
        .acquire(LONG, wait)
        .await;
    match err {
        Err(Error::Timeout { held_here, .. }) => assert!(!held_here, "another Locker's"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    permit.release().await.unwrap();

    // A write that timed out behind a reader names the reader's row and its holder, not
    // the lock's queue (`pricing~`).
    let pricing = db.locker.rw_lock("pricing");
    let read = pricing.try_read(LONG).await.unwrap().expect("free");
    let err = pricing.write(LONG, wait).await.expect_err("a reader holds");
    match &err {
        Error::Timeout {
            key,
            held_by,
            held_here,
            ..
        } => {
            assert_eq!(key, read.key(), "the reader's row");
            assert_eq!(held_by.as_deref(), Some(read.owner()));
            assert!(held_here, "held by this Locker");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    read.release().await.unwrap();
}
