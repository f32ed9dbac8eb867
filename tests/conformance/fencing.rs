//! Writes fenced by `assert_held` in the caller's own transaction, ended by
//! `LockGuard::commit`: a conflict rollback is a lost lock when the lock is gone, and an
//! ordinary database error while it is held.

use std::time::Duration;

use dblock::Error;

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// Long enough that `assert_held` runs inside it on a busy machine, short enough to wait
/// out.
const RUNS_OUT: Duration = Duration::from_secs(2);

/// A fenced write commits; a write refused as a conflict rollback is `NotHeld` once the
/// lease ran out and `Database` while it lives; nothing of a refused transaction is
/// written (the counter is exact).
pub async fn fenced_writes_tell_a_lost_lock_from_a_conflict<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    db.plain.counter_create().await;
    let counter = db.plain.counter_table();
    let guard = db
        .locker
        .try_acquire("fenced", LONG)
        .await
        .unwrap()
        .unwrap();
    let nothing = Box::pin(async {});
    DB::fenced_add_after(&db.pool, &guard, &counter, nothing)
        .await
        .expect("a fenced write under a live lock commits");
    assert_eq!(db.plain.counter_get().await, 1);
    guard.release().await.unwrap();

    if DB::STRICT_SNAPSHOT.is_none() {
        println!(
            "{}: no conflict rollback to provoke (one writer at a time); commit case only",
            DB::LABEL
        );
        return;
    }
    // While the transaction is open, another session adds 100 to the counter (and, for the
    // lost case, the lease runs out): the fenced write is then refused as a conflict.
    let mut expected = 1;
    for lost in [false, true] {
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            let lease = if lost { RUNS_OUT } else { LONG };
            let key = format!("fenced-{lost}-{attempts}");
            let guard = db.locker.try_acquire(&key, lease).await.unwrap().unwrap();
            let (locker, plain, key) = (&db.locker, &db.plain, key.as_str());
            let meanwhile = Box::pin(async move {
                // Polled by hand: an async closure here makes the boxed future's `Send`
                // depend on a lifetime the compiler cannot name.
                let until = tokio::time::Instant::now() + PATIENCE;
                while lost && !locker.holder(key).await.unwrap().expect("the row").expired {
                    assert!(
                        tokio::time::Instant::now() < until,
                        "the lease never ran out"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                plain.counter_set(plain.counter_get().await + 100).await;
            });
            let outcome = DB::fenced_add_after(&db.pool, &guard, &counter, meanwhile).await;
            match outcome {
                // The machine was too slow for the short lease: the check said so.
                Err(("check", Error::NotHeld { .. })) if lost && attempts < 3 => continue,
                outcome => break outcome,
            }
        };
        expected += 100;
        match outcome {
            Err(("write", Error::NotHeld { .. })) if lost => {}
            Err(("write", Error::Database(_))) if !lost => {}
            other => panic!("lost = {lost}: expected the write refused, got {other:?}"),
        }
        assert_eq!(
            db.plain.counter_get().await,
            expected,
            "nothing refused was written"
        );
    }
}
