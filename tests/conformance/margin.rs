//! Issue 42's points 1 and 2 on every backend: a lease ends locally a margin before the
//! database can see it expire, and an acquisition answered after its lease's local
//! deadline makes no guard. (The fault suite's partition group runs the same claims as
//! hundreds of trials behind a black-holing proxy; these are the deterministic cases.)
//!
//! Wall-clock comparisons with the database's `expire_time` are sound here: the test
//! servers run on this machine, so the database clock is this machine's clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use dblock::{Error, Locker, LostReason};
use tokio::time::{sleep, timeout};

use super::lease::eventually;
use super::lease_env::{LeaseEnv, Outage};
use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// A margin far above any scheduling delay of a busy machine, so that "learned before the
/// database's expiry" is an invariant here rather than a race; the default margin's own
/// figures come from the fault suite's trials.
const WIDE_MARGIN: Duration = Duration::from_millis(600);

/// The holder's lease in the margin cases: renewed every 500 ms.
const LEASE: Duration = Duration::from_millis(1500);

pub async fn a_lease_ends_locally_before_the_database_sees_it_expire<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.faulty_locker(|builder| builder.lease_margin(WIDE_MARGIN));
    assert_eq!(
        locker.lease_margin(LEASE),
        WIDE_MARGIN + LEASE / 100,
        "the fixed part plus 1 % of the lease"
    );
    let watched = locker.try_acquire("margin:lost", LEASE).await.unwrap();
    let watched = watched.expect("a free key");
    let working = locker.try_acquire("margin:work", LEASE).await.unwrap();
    let working = working.expect("a free key");
    // Renewed at least once before the outage: the deadline counts from a renewal.
    assert!(
        eventually(PATIENCE, || async { locker.stats().renewed >= 2 }).await,
        "both leases renewed"
    );

    let started = Arc::new(AtomicBool::new(false));
    let dropped_at = Arc::new(std::sync::Mutex::new(None));
    env.outage_start().await;
    let work = {
        let (started, dropped_at) = (Arc::clone(&started), Arc::clone(&dropped_at));
        async move {
            // Records when `with_lock`-style supervision drops the work.
            struct Stamp(Arc<std::sync::Mutex<Option<chrono::DateTime<Utc>>>>);
            impl Drop for Stamp {
                fn drop(&mut self) {
                    *self.0.lock().unwrap() = Some(Utc::now());
                }
            }
            let _stamp = Stamp(dropped_at);
            started.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await
        }
    };
    let reason = timeout(PATIENCE, async {
        tokio::select! {
            reason = working.lost() => reason,
            _ = work => unreachable!("the work never ends by itself"),
        }
    })
    .await
    .expect("the lease ends while the database is unreachable");
    let learned = timeout(PATIENCE, watched.lost()).await.unwrap();
    let learned_at = Utc::now();
    env.outage_end().await;

    assert!(started.load(Ordering::SeqCst));
    assert!(
        matches!(
            reason,
            LostReason::Unreachable | LostReason::NoConnection | LostReason::Expired
        ),
        "{reason:?}"
    );
    assert_eq!(Some(learned), watched.lost_reason());
    let dropped_at = dropped_at.lock().unwrap().expect("the work was dropped");
    for (what, at, guard) in [
        ("lost()", learned_at, &watched),
        ("the work's drop", dropped_at, &working),
    ] {
        // The database clock: this machine's, as the module docs say.
        let expires = guard.expires_at();
        eprintln!(
            "{}: {what} {} ms before the database's expiry",
            DB::LABEL,
            (expires - at).num_milliseconds()
        );
        // Half the margin to spare: a wake-up late by 300 ms on a busy machine still
        // passes, a lease ended without a margin (a few ms before the expiry) does not.
        let early = chrono::Duration::from_std(WIDE_MARGIN / 2).unwrap();
        assert!(
            at + early <= expires,
            "{what} at {at}, not a margin before the row's expiry {expires}"
        );
    }
}

pub async fn an_answer_after_the_deadline_makes_no_guard<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "margin:late";
    let short = Duration::from_millis(400);
    // A holder whose fenced transaction keeps its row locked (a share lock on PostgreSQL
    // and MySQL, the database's write lock on SQLite) past its lease: an acquisition then
    // waits for that transaction, and answers long after its own deadline.
    let holder = db.locker.try_acquire(key, short).await.unwrap().unwrap();
    let mut fence = db.pool.begin().await.unwrap();
    holder.assert_held(&mut fence).await.unwrap();
    // The fenced transaction is kept from sitting idle (pinged) while it waits: on
    // PostgreSQL `assert_held` bounds its idle time by the lease's remaining time, and
    // the server would end it, freeing the row, as the lease runs out.
    let until = tokio::time::Instant::now() + PATIENCE;
    while !db.plain.is_expired(key).await {
        assert!(
            tokio::time::Instant::now() < until,
            "the holder's lease runs out by the database clock"
        );
        sqlx::Connection::ping(&mut *fence).await.unwrap();
        sleep(Duration::from_millis(20)).await;
    }
    let late_lease = Duration::from_millis(800);
    let locker = Locker::builder(db.another_pool().await)
        .table(&db.table)
        .build()
        .unwrap();
    let attempt = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.try_acquire(key, late_lease).await })
    };
    let worked = Arc::new(AtomicBool::new(false));
    let with_lock = {
        let (locker, worked) = (locker.clone(), Arc::clone(&worked));
        tokio::spawn(async move {
            locker
                .try_with_lock(key, late_lease, async |_| {
                    worked.store(true, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    // Both statements wait behind the fence for longer than their leases (the fence
    // pinged, as above).
    let waited = tokio::time::Instant::now() + late_lease * 2;
    while tokio::time::Instant::now() < waited {
        sqlx::Connection::ping(&mut *fence).await.unwrap();
        sleep(Duration::from_millis(20)).await;
    }
    fence.commit().await.unwrap();
    drop(holder);

    let answer = timeout(PATIENCE, attempt).await.unwrap().unwrap();
    let guard = match answer {
        // The answer came after the deadline: no guard (the point of the case), or the
        // statement gave up by itself at its deadline (a server-side bound).
        Err(Error::LockLost {
            reason: LostReason::Expired,
            ..
        })
        | Ok(None) => None,
        Ok(Some(guard)) => Some(guard),
        Err(err) if is_timeout(&err) => None,
        Err(err) => panic!("{}: {err}", DB::LABEL),
    };
    assert!(
        guard.is_none(),
        "{}: a guard came back from an answer after its deadline: {:?}",
        DB::LABEL,
        guard.map(|guard| (guard.expires_at(), guard.lost_reason()))
    );
    let worked_out = timeout(PATIENCE, with_lock).await.unwrap().unwrap();
    assert!(
        !worked.load(Ordering::SeqCst),
        "{}: the work started on a late answer ({worked_out:?})",
        DB::LABEL
    );
    // The late winners' rows go (released in the background, or expired by now): the
    // key is free again for a newcomer.
    assert!(
        eventually(PATIENCE, || async {
            matches!(db.locker.try_acquire(key, LONG).await, Ok(Some(_)))
        })
        .await,
        "{}: the key stays taken after the late answers",
        DB::LABEL
    );
}

/// Whether `err` says a statement or wait ran out of time (whatever the bound that cut
/// it short was).
fn is_timeout(err: &Error) -> bool {
    matches!(err, Error::Timeout { .. }) || err.to_string().contains("timed out")
}
