//! Issue 9's cases: one Locker keeps many leases alive in a few statements a tick, tells
//! exactly the guards whose rows went that they are lost, and renews leases of different
//! lengths each on its own schedule. Written once, generic over the backend.
//!
//! What the cases rely on from [`Stats`](dblock::Stats): `renewals` counts renewal
//! statements sent (one may renew many rows), `lost` counts leases reported lost.

use std::collections::HashSet;
use std::time::Duration;

use dblock::{Backend, Error, LockGuard, Locker, LostReason};
use futures::stream::{self, StreamExt};
use tokio::time::{Instant, sleep, timeout, timeout_at};

use super::PATIENCE;
use super::lease::{SLACK, eventually};
use super::lease_env::{LeaseEnv, Outage};

/// Guards held through one locker in the many-guard cases.
const MANY: usize = 500;
/// Their lease; short, so that the window below spans many renewals.
const MANY_LEASE: Duration = Duration::from_millis(1500);
/// The locker's renew interval: below `MANY_LEASE / 3`, so it is every guard's tick.
const MANY_INTERVAL: Duration = Duration::from_millis(300);
/// Acquisitions and releases the test itself keeps in flight: few, so that its own
/// writes do not starve the locker's renewals of the database's write lock (SQLite).
const WRITES_IN_FLIGHT: usize = 4;
/// Reads of the holders the test keeps in flight.
const READS_IN_FLIGHT: usize = 8;

/// The key of the `n`-th guard.
fn many_key(n: usize) -> String {
    format!("many-{n}")
}

/// Takes `many-0` .. `many-<n-1>` through `locker`, within [`PATIENCE`]; the guards in
/// key order.
async fn hold_many<DB: Backend>(locker: &Locker<DB>, n: usize) -> Vec<LockGuard<DB>> {
    let acquiring = stream::iter(0..n)
        .map(|i| async move {
            let key = many_key(i);
            locker
                .try_acquire(&key, MANY_LEASE)
                .await
                .unwrap_or_else(|err| panic!("try_acquire {key}: {err}"))
                .unwrap_or_else(|| panic!("{key} is free"))
        })
        .buffered(WRITES_IN_FLIGHT)
        .collect();
    timeout(PATIENCE, acquiring).await.unwrap_or_else(|_| {
        panic!(
            "{n} acquisitions took more than {PATIENCE:?}; stats {:?}",
            locker.stats()
        )
    })
}

/// The guards of `guards` that have been told their lease is lost, with the reason.
fn lost_ones<'a, DB: Backend>(guards: &[&'a LockGuard<DB>]) -> Vec<(&'a str, LostReason)> {
    guards
        .iter()
        .filter_map(|g| g.lost_reason().map(|reason| (g.key(), reason)))
        .collect()
}

/// Fails if any of `guards` has been told its lease is lost.
fn assert_none_lost<DB: Backend>(guards: &[&LockGuard<DB>], when: &str) {
    let lost = lost_ones(guards);
    assert!(
        lost.is_empty(),
        "{} guards lost {when}, first: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
}

/// Reads every guard's row through `locker`: it must still carry the guard's owner value
/// and fencing token, and be live by the database clock.
async fn assert_rows_are_theirs<DB: Backend>(locker: &Locker<DB>, guards: &[&LockGuard<DB>]) {
    let rows: Vec<_> = stream::iter(guards)
        .map(|guard| async move { (guard, locker.holder(guard.key()).await) })
        .buffered(READS_IN_FLIGHT)
        .collect()
        .await;
    for (guard, row) in rows {
        let holder = row
            .expect("read the holder")
            .unwrap_or_else(|| panic!("{}: the row is gone", guard.key()));
        assert_eq!(
            (holder.owner.as_str(), holder.fencing_token, holder.expired),
            (guard.owner(), guard.fencing_token(), false),
            "{}: the row is no longer its live guard's",
            guard.key()
        );
    }
}

/// Releases every guard; each outcome, with its key, in key order.
async fn release_all<DB: Backend>(guards: Vec<LockGuard<DB>>) -> Vec<(String, Result<(), Error>)> {
    stream::iter(guards)
        .map(|guard| async move {
            let key = guard.key().to_owned();
            (key, guard.release().await)
        })
        .buffered(WRITES_IN_FLIGHT)
        .collect()
        .await
}

/// 500 guards held through one Locker stay held for five leases, and the Locker keeps
/// them alive in at most two renewal statements a tick, however many guards it holds.
///
/// Proves: batched renewal (`stats().renewals` over the steady-state window, after every
/// guard is acquired, is at most `2 * ceil(window / interval) + 2`), and that batching
/// loses nothing: a rival Locker's `try_acquire` on keys sampled across all 500 is refused
/// every time, no guard is ever told it is lost, and at the end every row still carries
/// its guard's owner value and fencing token, live by the database clock.
pub async fn many_guards_stay_held_in_few_statements<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker_renewing_every(MANY_INTERVAL).await;
    let rival = env.second_locker().await;
    let guards = hold_many(&locker, MANY).await;
    let all: Vec<&LockGuard<DB>> = guards.iter().collect();

    // Losses and rival wins are recorded, not failed on at once: a locker that cannot keep
    // up loses leases, and the first assertion should then still say how many statements
    // it sent.
    let mut lost_in_window = lost_ones(&all).len();
    let mut rival_wins = Vec::new();
    let window_start = Instant::now();
    let renewals_before = locker.stats().renewals;
    let hold_ends = window_start + MANY_LEASE * 5;
    let mut rival_tries = 0;
    let mut round = 0;
    while Instant::now() < hold_ends {
        // Five keys a round, a fifth of the set apart: a hundred rounds try every key once.
        for k in (0..5).map(|j| (round + j * (MANY / 5)) % MANY) {
            let key = many_key(k);
            if let Some(won) = rival.try_acquire(&key, MANY_LEASE).await.unwrap() {
                rival_wins.push(key);
                drop(won);
            }
            rival_tries += 1;
        }
        lost_in_window = lost_in_window.max(lost_ones(&all).len());
        round += 1;
        sleep(Duration::from_millis(50)).await;
    }
    let window = window_start.elapsed();
    let renewals = locker.stats().renewals - renewals_before;

    let ticks = window.div_duration_f64(MANY_INTERVAL).ceil() as u64;
    let budget = 2 * ticks + 2;
    assert!(
        renewals <= budget,
        "{renewals} renewal statements for {MANY} guards in {window:?} ({ticks} ticks of \
         {MANY_INTERVAL:?}): more than 2 a tick (budget {budget}); meanwhile {lost_in_window} \
         guards lost and {} rival wins; stats {:?}",
        rival_wins.len(),
        locker.stats()
    );
    assert_none_lost(&all, "while held");
    assert!(
        rival_wins.is_empty(),
        "a rival got keys while their guards held them: {rival_wins:?}"
    );
    assert!(
        rival_tries >= 50,
        "the rival tried only {rival_tries} times"
    );
    assert!(
        renewals >= ticks / 2,
        "{renewals} renewal statements in {ticks} ticks: the leases were not renewed"
    );
    assert_none_lost(&all, "at the end");
    assert_rows_are_theirs(&locker, &all).await;
    assert_eq!(locker.stats().lost, 0, "{:?}", locker.stats());

    drop(all);
    for (key, released) in release_all(guards).await {
        released.unwrap_or_else(|err| panic!("release {key}: {err}"));
    }
    assert_eq!(env.count_rows().await, 0);
}

/// Deleting 10 of 500 rows behind their guards' backs tells exactly those 10 guards,
/// `lost() == Deleted` within one renew interval (+ `SLACK`) of each deletion, and no one
/// else.
///
/// Proves that a batched renewal attributes each missing row to its own guard: the other
/// 490 guards are renewed again after the deletions (their `expires_at` moves on), are
/// never told they are lost, and keep their rows; the deleted rows are not brought back
/// (renewal is an owner- and token-checked update, never an upsert); `stats().lost` rose
/// by exactly 10; and releasing answers `Ok` for the 490, `NotHeld` for the 10.
pub async fn deleting_some_rows_fires_lost_for_exactly_those<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker_renewing_every(MANY_INTERVAL).await;
    let guards = hold_many(&locker, MANY).await;
    // Ten rows spread over the whole set: the first, the last, and eight in between.
    let victims: HashSet<usize> = (0..10).map(|i| i * (MANY - 1) / 9).collect();
    let (doomed, survivors): (Vec<_>, Vec<_>) = guards
        .iter()
        .enumerate()
        .partition(|(n, _)| victims.contains(n));
    let doomed: Vec<&LockGuard<DB>> = doomed.into_iter().map(|(_, g)| g).collect();
    let survivors: Vec<&LockGuard<DB>> = survivors.into_iter().map(|(_, g)| g).collect();
    assert_eq!((doomed.len(), survivors.len()), (10, MANY - 10));
    assert_none_lost(&survivors, "before any row was deleted");
    assert_none_lost(&doomed, "before any row was deleted");
    let lost_before = locker.stats().lost;

    let mut deleted = Vec::new();
    for guard in &doomed {
        env.delete_row(guard.key()).await;
        deleted.push((*guard, Instant::now() + MANY_INTERVAL + SLACK));
    }
    let expires_after_deletes: Vec<_> = survivors.iter().map(|g| g.expires_at()).collect();
    let told = deleted.iter().map(|&(guard, deadline)| async move {
        (guard.key(), timeout_at(deadline, guard.lost()).await)
    });
    let reasons = futures::future::join_all(told).await;
    for (key, reason) in reasons {
        let reason = reason.unwrap_or_else(|_| {
            panic!(
                "{key}: lost() did not fire within {MANY_INTERVAL:?} + {SLACK:?} of its deletion"
            )
        });
        assert_eq!(reason, LostReason::Deleted, "{key}");
    }

    // The survivors' renewals after the deletions have seen every row: wait for each to
    // move its expiry on, so that a wrong `lost()` would have fired by now.
    let renewed_again = eventually(MANY_INTERVAL * 2 + SLACK, || {
        let (survivors, before) = (&survivors, &expires_after_deletes);
        async move {
            survivors
                .iter()
                .zip(before)
                .all(|(g, before)| g.expires_at() > *before || g.lost_reason().is_some())
        }
    })
    .await;
    assert_none_lost(&survivors, "after other guards' rows were deleted");
    assert!(
        renewed_again,
        "not every survivor was renewed after the deletions"
    );
    // The counter may move just after `lost()` fires: wait for it, then check that it
    // stopped at 10 once the survivors' rows have been read.
    let counted = eventually(SLACK, || async { locker.stats().lost - lost_before >= 10 }).await;
    assert!(counted, "lost leases not counted: {:?}", locker.stats());
    assert_rows_are_theirs(&locker, &survivors).await;
    assert_eq!(
        locker.stats().lost - lost_before,
        10,
        "exactly the deleted rows' leases are reported lost: {:?}",
        locker.stats()
    );
    for guard in &doomed {
        assert_eq!(
            locker.holder(guard.key()).await.unwrap(),
            None,
            "{}: the deleted row came back",
            guard.key()
        );
    }

    assert_none_lost(&survivors, "at the end");
    drop((doomed, survivors));
    for (n, (key, released)) in release_all(guards).await.into_iter().enumerate() {
        if victims.contains(&n) {
            assert!(
                matches!(released, Err(Error::NotHeld { .. })),
                "release {key} after its row was deleted: {released:?}"
            );
        } else {
            released.unwrap_or_else(|err| panic!("release {key}: {err}"));
        }
    }
    assert_eq!(env.count_rows().await, 0);
}

/// Three guards of one Locker (default renew interval, 10 s) with leases of 600 ms,
/// 1.5 s and 3 s, renewing every 200 ms, 500 ms and 1 s, each renew on their own schedule.
///
/// Proves that one engine does not put every lease on one clock: over ~4 s, sampled every
/// ~20 ms, each guard's `expires_at` moves forward (never back) about as often as its own
/// interval says: at least 0.6x `window / interval` times, and at most
/// `window / (interval / 2) + 1` times (the engine may renew a lease up to half an
/// interval early, to ride along in a batch that goes anyway), so the 600 ms lease
/// (12 at least) is renewed far more often than the 3 s one (9 at most); meanwhile none of them is
/// ever lost, a rival is refused on every key every round, and the database never sees a
/// lapsed lease (`holder(key).expired == false`, owner and token the guard's).
pub async fn leases_of_different_lengths_renew_on_their_own_schedule<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    let locker = env.locker();
    let rival = env.second_locker().await;
    let leases = [
        ("pace-600ms", Duration::from_millis(600)),
        ("pace-1500ms", Duration::from_millis(1500)),
        ("pace-3s", Duration::from_secs(3)),
    ];
    let mut guards = Vec::new();
    for (key, lease) in leases {
        let guard = locker.try_acquire(key, lease).await.unwrap().expect("free");
        guards.push(guard);
    }
    let all: Vec<&LockGuard<DB>> = guards.iter().collect();

    let started = Instant::now();
    let hold_ends = started + Duration::from_secs(4);
    // Reads the guards' expiries every 20 ms, far more often than the shortest interval,
    // so that every renewal is seen as one change.
    let sampling = async {
        let mut last_seen: Vec<_> = guards.iter().map(|g| g.expires_at()).collect();
        let mut changes = [0u32; 3];
        while Instant::now() < hold_ends {
            for (n, guard) in guards.iter().enumerate() {
                let expires_at = guard.expires_at();
                assert!(
                    expires_at >= last_seen[n],
                    "{}: expires_at went back from {} to {expires_at}",
                    guard.key(),
                    last_seen[n]
                );
                if expires_at > last_seen[n] {
                    changes[n] += 1;
                    last_seen[n] = expires_at;
                }
            }
            sleep(Duration::from_millis(20)).await;
        }
        changes
    };
    // Meanwhile, every ~50 ms: the rival is refused on every key, nobody is lost, and the
    // database sees every row live and the guard's.
    let checking = async {
        let mut rounds = 0;
        while Instant::now() < hold_ends {
            for (guard, (_, lease)) in guards.iter().zip(leases) {
                let key = guard.key();
                assert!(
                    rival.try_acquire(key, lease).await.unwrap().is_none(),
                    "a rival got {key} while its guard held it"
                );
            }
            assert_none_lost(&all, "while held");
            assert_rows_are_theirs(locker, &all).await;
            rounds += 1;
            sleep(Duration::from_millis(50)).await;
        }
        rounds
    };
    let (changes, rounds) = tokio::join!(sampling, checking);
    let window = started.elapsed();
    assert!(rounds >= 10, "only {rounds} rounds of checks in {window:?}");

    for (n, (key, lease)) in leases.into_iter().enumerate() {
        let interval = lease / 3;
        let due = window.div_duration_f64(interval);
        let (least, most) = ((due * 0.6).floor() as u32, (due * 2.0).ceil() as u32 + 1);
        assert!(
            (least..=most).contains(&changes[n]),
            "{key} (lease {lease:?}, renewed every {interval:?}): expires_at moved \
             {} times in {window:?}, expected {least}..={most}; all guards: {changes:?}",
            changes[n]
        );
    }
    assert_none_lost(&all, "at the end");
    assert_eq!(locker.stats().lost, 0, "{:?}", locker.stats());
    drop(all);
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(env.count_rows().await, 0);
}

/// `extend` to a lease shorter than the renewal interval: the engine renews it in time
/// (within a third of the new lease), it is never lost, and a rival stays refused.
pub async fn extended_to_a_short_lease_stays_renewed<DB: Outage>() {
    let Some(env) = LeaseEnv::<DB>::open().await else {
        return;
    };
    // 30 s lease, renewed every 10 s; then extended to 900 ms: due within 300 ms.
    let guard = env
        .locker()
        .try_acquire("shortened", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    guard.extend(Duration::from_millis(900)).await.unwrap();
    let rival = env.second_locker().await;
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        assert_eq!(guard.lost_reason(), None, "lost after a shortening extend");
        assert!(
            rival
                .try_acquire("shortened", Duration::from_secs(1))
                .await
                .unwrap()
                .is_none(),
            "a rival got a key whose holder extended it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    guard.release().await.unwrap();
}
