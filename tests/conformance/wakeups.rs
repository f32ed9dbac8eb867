//! Wake-ups across Lockers: on PostgreSQL and SQLite a release elsewhere wakes a sleeping
//! waiter at once (its Locker's listener hears it), the listener comes back after it was
//! killed, and waiting holds no pool connection on any backend.

use std::time::Duration;

use dblock::{LockGuard, Locker, RetryPolicy};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb, wait_until};

/// The backoff of the waiters that listen: capped at a minute, so that a waiter whose
/// listener is up sleeps at least 30 s (half the cap) after a lost attempt. Granted
/// sooner than that after a release, it was woken by the release's notification, however
/// busy the machine (a bound on the wake-up's own latency failed with two CPU burners
/// beside CI: 171 ms against 150).
const SLEEPY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(10),
    max: Duration::from_secs(60),
};
/// A grant sooner than this after the release was the notification's doing: without it
/// the waiter would sleep on until the holder's lease ([`LONG`], 30 s) or its pause
/// (30-60 s) ended, whichever comes first.
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// A second "process" on the test's table: its own pool, its own listener.
async fn another_locker<DB: TestBackend>(db: &TestDb<DB>) -> Locker<DB> {
    Locker::builder(db.another_pool().await)
        .table(&db.table)
        .auto_renew(false)
        .build()
        .expect("a valid table name")
}

/// [`another_locker`] whose waiters, once listening, sleep [`SLEEPY`]'s long pauses.
async fn sleepy_locker<DB: TestBackend>(db: &TestDb<DB>) -> Locker<DB> {
    Locker::builder(db.another_pool().await)
        .table(&db.table)
        .auto_renew(false)
        .retry(SLEEPY)
        .build()
        .expect("a valid table name")
}

type Waiter<DB> = JoinHandle<(LockGuard<DB>, Instant)>;

/// `locker.acquire(key)` on a task of its own; it answers the guard and when it got it.
fn wait_for<DB: TestBackend>(locker: &Locker<DB>, key: &'static str) -> Waiter<DB> {
    let locker = locker.clone();
    tokio::spawn(async move {
        let guard = locker.acquire(key, LONG, PATIENCE).await.unwrap();
        (guard, Instant::now())
    })
}

async fn granted<DB: TestBackend>(waiter: Waiter<DB>) -> (LockGuard<DB>, Instant) {
    timeout(PATIENCE, waiter)
        .await
        .expect("the waiter gets the lock after the release")
        .expect("the waiter's task")
}

/// Starts `locker`'s listener (a waiter on `key`, held elsewhere, has to sleep) and
/// waits until it is up. The key is one of its own: the notification of its release,
/// whenever it arrives, wakes nobody waiting on another key.
pub(super) async fn start_listener<DB: TestBackend>(
    db: &TestDb<DB>,
    locker: &Locker<DB>,
    key: &'static str,
) {
    let holder = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    let waiter = wait_for(locker, key);
    wait_until("the waiter's Locker listens", PATIENCE, async || {
        locker.listening()
    })
    .await;
    holder.release().await.unwrap();
    let (guard, _) = granted(waiter).await;
    guard.release().await.unwrap();
}

/// One release elsewhere while `locker`'s waiter sleeps: the waiter is woken by it (the
/// listener's counter says so, exactly once) and holds the lock within [`WOKEN_WITHIN`].
async fn woken_by_release<DB: TestBackend>(
    db: &TestDb<DB>,
    locker: &Locker<DB>,
    key: &'static str,
) {
    let holder = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    assert!(!db.plain.marked(key).await, "a new row has no waiter yet");
    let before = locker.stats();
    let waiter = wait_for(locker, key);
    // The waiter marks the row after its lost attempt and, its listener being up, then
    // sleeps at least 30 s: the release below comes well inside that sleep.
    wait_until("the waiter marked the row", PATIENCE, async || {
        db.plain.marked(key).await
    })
    .await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    holder.release().await.unwrap();
    let (guard, acquired) = granted(waiter).await;
    let after = locker.stats();
    assert_eq!(
        after.wakeups - before.wakeups,
        1,
        "the release was heard and woke the waiter: {before:?} -> {after:?}"
    );
    let took = acquired - released;
    assert!(
        took < WOKEN_WITHIN,
        "the woken waiter took {took:?} after the release"
    );
    assert_eq!(after.listener_connects, before.listener_connects);
    guard.release().await.unwrap();
}

/// A waiter of another Locker (its own pool) on a key held here: on PostgreSQL and SQLite,
/// once it has marked the row, the release wakes it at once, round after round (its pause
/// would be 30 s and more), and on PostgreSQL its listener is one session on the server.
/// On MySQL/MariaDB the waiter still gets the lock by polling, and its Locker does not
/// claim to hear the key: with bells (`bells.rs`), its listener registered too late for
/// this hold (the holder took the key before anyone waited, and took no bell).
pub async fn releases_elsewhere_wake_waiters<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "woken";
    let other = another_locker(&db).await;
    assert!(!other.listening(), "no waiter yet, no listener");
    if !db.hears_releases().await {
        let holder = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
        let waiter = wait_for(&other, key);
        // A second attempt: the waiter has slept once (no signal says so otherwise).
        wait_until("the waiter tried again", PATIENCE, async || {
            other.stats().attempts >= 2
        })
        .await;
        assert!(!other.listening(), "{} cannot listen here", DB::LABEL);
        holder.release().await.unwrap();
        let (guard, _) = granted(waiter).await;
        let stats = other.stats();
        assert_eq!(stats.wakeups, 0, "{stats:?}");
        let connects = if DB::WAKES_BY_BELLS { 0..=1 } else { 0..=0 };
        assert!(connects.contains(&stats.listener_connects), "{stats:?}");
        guard.release().await.unwrap();
        return;
    }
    let other = sleepy_locker(&db).await;
    start_listener(&db, &other, "warm-up").await;
    assert_eq!(other.stats().listener_connects, 1);
    if DB::LISTENER_SESSIONS {
        assert_eq!(db.plain.listeners().await, 1, "one listener per Locker");
    }
    for _round in 0..3 {
        woken_by_release(&db, &other, key).await;
    }
    assert!(other.listening());
    if DB::LISTENER_SESSIONS {
        assert_eq!(db.plain.listeners().await, 1, "still one listener");
    }
}

/// PostgreSQL: the listener's session is terminated while a waiter sleeps. The release
/// that follows goes unheard, yet the waiter gets the lock (the listener's reconnection
/// wakes every waiter, and each sleeps at most until its cap anyway); the listener comes
/// back on a new session of its own, and releases wake waiters again.
pub async fn killed_listener_comes_back<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    if !db.hears_releases().await || !DB::LISTENER_SESSIONS {
        return;
    }
    let key = "relisten";
    let other = sleepy_locker(&db).await;
    start_listener(&db, &other, "warm-up").await;
    assert_eq!(other.stats().listener_connects, 1);

    let holder = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    let waiter = wait_for(&other, key);
    wait_until("the waiter marked the row", PATIENCE, async || {
        db.plain.marked(key).await
    })
    .await;
    assert_eq!(db.plain.kill_listeners().await, 1, "one listener to kill");
    holder.release().await.unwrap();
    let (guard, _) = granted(waiter).await;
    guard.release().await.unwrap();

    wait_until("the listener is back", PATIENCE, async || {
        other.stats().listener_connects == 2 && other.listening()
    })
    .await;
    // The terminated session is gone, its successor listens in its place.
    wait_until("one listener session", PATIENCE, async || {
        db.plain.listeners().await == 1
    })
    .await;
    woken_by_release(&db, &other, key).await;
    assert_eq!(other.stats().listener_connects, 2);
}

/// Twenty waiters on a held key, their Locker on a pool of two: while they wait, every
/// connection of the pool is back in it (none is kept by a waiter, nor by the listener,
/// which has a connection of its own), so another key is acquired at once on the same
/// pool. After the release all twenty get the lock in turn.
pub async fn waiters_hold_no_connection<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const WAITERS: usize = 20;
    const MAX: u32 = 2;
    let key = "crowded";
    let small = DB::connect(&db.location, MAX).await;
    let locker = Locker::builder(small.clone())
        .table(&db.table)
        .auto_renew(false)
        .build()
        .unwrap();
    let holder = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    // Each releases at once: the next in the queue is granted only after that.
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let guard = locker.acquire(key, LONG, PATIENCE).await.unwrap();
                let token = guard.fencing_token();
                guard.release().await.unwrap();
                token
            })
        })
        .collect();
    wait_until("every waiter is queued", PATIENCE, async || {
        locker.waiting(key) == WAITERS
    })
    .await;
    let hears = db.hears_releases().await;
    if hears {
        wait_until("the waiters' Locker listens", PATIENCE, async || {
            locker.listening()
        })
        .await;
    }
    // The head sends an attempt now and then, on a connection it returns at once.
    wait_until("every pool connection is idle", PATIENCE, async || {
        assert!(small.size() <= MAX, "the pool grew to {}", small.size());
        small.num_idle() == small.size() as usize
    })
    .await;
    let started = Instant::now();
    let elsewhere = timeout(
        Duration::from_secs(1),
        locker.try_acquire("elsewhere", LONG),
    )
    .await
    .expect("a connection of the pool is free while the waiters wait")
    .unwrap()
    .expect("a free key");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(250),
        "try_acquire took {took:?}"
    );
    elsewhere.release().await.unwrap();
    if hears && DB::LISTENER_SESSIONS {
        assert_eq!(
            db.plain.listeners().await,
            1,
            "one listener, outside the pool"
        );
    }
    assert!(small.size() <= MAX);
    assert_eq!(locker.waiting(key), WAITERS);

    holder.release().await.unwrap();
    let mut tokens = Vec::new();
    for waiter in waiters {
        tokens.push(timeout(PATIENCE, waiter).await.unwrap().unwrap());
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        WAITERS,
        "each waiter won once, one after another"
    );
    assert_eq!(locker.waiting(key), 0);
    assert_eq!(locker.holder(key).await.unwrap(), None);
    small.close().await;
}
