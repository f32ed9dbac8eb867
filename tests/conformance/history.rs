//! The lock history: what a recording Locker writes (each event's key, owner, token and
//! database time), in how many statements, how it is read and trimmed, and that a Locker
//! without it writes nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use dblock::{Error, EventKind, HistoryFilter, LockEvent, Locker, ReaperConfig};
use tokio::time::Instant;

use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, TestDb, wait_until};

/// A Locker on the test's table that records history (kept an hour), with `prefix` as its
/// owner prefix.
fn recording<DB: TestBackend>(db: &TestDb<DB>, prefix: &str) -> Locker<DB> {
    Locker::builder(db.pool.clone())
        .table(&db.table)
        .owner_prefix(prefix)
        .history(Duration::from_secs(3600))
        .build()
        .unwrap()
}

/// The database clock, read through the list of a row held for the purpose.
async fn db_now<DB: TestBackend>(db: &TestDb<DB>) -> DateTime<Utc> {
    let rows = db.locker.list("~clock", 1).await.unwrap();
    rows.first().expect("the clock row is held").read_at
}

/// Every event of the table, oldest first.
async fn all<DB: TestBackend>(locker: &Locker<DB>) -> Vec<LockEvent> {
    let filter = HistoryFilter::new().limit(10_000).oldest_first();
    locker.history(&filter).await.unwrap()
}

/// The events of `key` in the order their Locker noted them (ids: each Locker writes its
/// events in that order). By time they may swap where two were noted a moment apart and
/// written in two statements (see `LockEvent::at`).
fn of_key<'a>(events: &'a [LockEvent], key: &str) -> Vec<&'a LockEvent> {
    let mut of_key: Vec<&LockEvent> = events.iter().filter(|event| event.key == key).collect();
    of_key.sort_by_key(|event| event.id);
    of_key
}

fn kinds(events: &[&LockEvent]) -> Vec<EventKind> {
    events.iter().map(|event| event.kind).collect()
}

async fn count_events<DB: TestBackend>(db: &TestDb<DB>) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {}_events", db.table);
    DB::fetch_i64(&db.pool, sql, vec![]).await.unwrap().unwrap()
}

/// A recording Locker writes, per key and in order: an acquisition and its release; an
/// acquisition and its loss (the row deleted behind the guard's back) with the reason; an
/// operator's force-release with the deleted row's owner and token and the operator's
/// name; a job's run (its row's acquisition and release, then the run) and a skip; a
/// leader's term (the `~leader` row's acquisition and release). Every event's time lies
/// between two readings of the database clock taken before the events and after their
/// write.
pub async fn history_records_what_happened_to_each_lock<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _clock = db
        .locker
        .try_acquire("~clock", LONG)
        .await
        .unwrap()
        .unwrap();
    let locker = recording(&db, "node-a:1:");
    assert!(locker.records_history());
    let before = db_now(&db).await;

    let a = locker.try_acquire("h:a", LONG).await.unwrap().unwrap();
    let a_token = a.fencing_token();
    let a_owner = a.owner().to_owned();
    a.release().await.unwrap();

    let b = locker.try_acquire("h:b", LONG).await.unwrap().unwrap();
    let b_token = b.fencing_token();
    assert_eq!(db.plain.delete("h:b").await, 1);
    assert!(matches!(b.release().await, Err(Error::NotHeld { .. })));

    let c = db.locker.try_acquire("h:c", LONG).await.unwrap().unwrap();
    assert!(locker.force_release_by("h:c", "cli:tester").await.unwrap());

    let ran = locker
        .job("h:job")
        .run(async |_| Ok::<_, Error>(1))
        .await
        .unwrap();
    assert_eq!(ran, Some(1));
    let held = db
        .locker
        .try_acquire("h:busy", LONG)
        .await
        .unwrap()
        .unwrap();
    let skipped = locker.job("h:busy").run(async |_| Ok::<_, Error>(2)).await;
    assert_eq!(skipped.unwrap(), None);

    let leadership = locker
        .election("h:lead")
        .campaign("me", LONG)
        .await
        .unwrap();
    let term = leadership.term();
    leadership.resign().await.unwrap();

    // Read after the write: an event's time is the write's database clock less its age,
    // so it lies between the clock read before the event and the one after the write
    // (how close to the event is shutdown_writes_the_noted_history's to check).
    locker.shutdown().await;
    let after = db_now(&db).await;
    let events = all(&db.locker).await;
    for event in &events {
        assert!(
            before <= event.at && event.at <= after,
            "{event:?} not within [{before}, {after}]"
        );
    }

    let on_a = of_key(&events, "h:a");
    assert_eq!(kinds(&on_a), [EventKind::Acquired, EventKind::Released]);
    for event in &on_a {
        assert_eq!(
            (event.owner.as_str(), event.fencing_token),
            (a_owner.as_str(), Some(a_token))
        );
        assert_eq!(event.row_kind(), "mutex");
    }
    assert!(on_a[0].at <= on_a[1].at && on_a[0].id < on_a[1].id);

    let on_b = of_key(&events, "h:b");
    assert_eq!(kinds(&on_b), [EventKind::Acquired, EventKind::Lost]);
    assert_eq!(on_b[1].fencing_token, Some(b_token));
    assert_eq!(on_b[1].detail.as_deref(), Some("the lock row was deleted"));

    let on_c = of_key(&events, "h:c");
    assert_eq!(kinds(&on_c), [EventKind::ForceReleased]);
    assert_eq!(on_c[0].owner, c.owner(), "the deleted row's owner");
    assert_eq!(on_c[0].fencing_token, Some(c.fencing_token()));
    assert_eq!(on_c[0].detail.as_deref(), Some("cli:tester"));

    let on_job = of_key(&events, "h:job");
    assert_eq!(
        kinds(&on_job),
        [EventKind::Acquired, EventKind::Released, EventKind::JobRan]
    );
    assert!(on_job[0].owner.starts_with("node-a:1:"));
    let on_busy = of_key(&events, "h:busy");
    assert_eq!(kinds(&on_busy), [EventKind::JobSkipped]);
    assert_eq!(on_busy[0].owner, "node-a:1:", "the skipping process");

    let on_lead = of_key(&events, "h:lead~leader");
    assert_eq!(kinds(&on_lead), [EventKind::Acquired, EventKind::Released]);
    assert_eq!(on_lead[0].row_kind(), "leader");
    assert_eq!(on_lead[0].fencing_token, Some(term));
    assert_eq!(events.len(), 11, "nothing else: {events:#?}");
    held.release().await.unwrap();
}

/// With 2,000 guards acquired and held, the recorder writes their events in at most one
/// statement a tick ([`dblock::HISTORY_FLUSH_INTERVAL`]), and, once written, sends nothing
/// while nothing happens (renewals are no events).
pub async fn history_takes_one_statement_a_tick<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const GUARDS: usize = 2_000;
    let locker = recording(&db, "many:1:");
    let started = Instant::now();
    let keys: Vec<String> = (0..GUARDS).map(|i| format!("many:{i}")).collect();
    let mut guards = Vec::with_capacity(GUARDS);
    for chunk in keys.chunks(50) {
        let attempts = chunk.iter().map(|key| locker.try_acquire(key, LONG));
        for guard in futures::future::join_all(attempts).await {
            guards.push(guard.unwrap().unwrap());
        }
    }
    let written = async || locker.stats().history_events == GUARDS as u64;
    wait_until("every acquisition is written", PATIENCE, written).await;
    let elapsed = started.elapsed();
    let ticks = elapsed.as_secs() + 1;
    let batches = locker.stats().history_batches;
    assert!(
        batches <= ticks,
        "{batches} history statements in {elapsed:?} ({ticks} ticks at most)"
    );
    // Held for three ticks more: renewed, but nothing to write.
    tokio::time::sleep(3 * dblock::HISTORY_FLUSH_INTERVAL).await;
    assert_eq!(
        locker.stats().history_batches,
        batches,
        "no statement without events"
    );
    assert_eq!(count_events(&db).await, GUARDS as i64);
    assert_eq!(locker.stats().history_dropped, 0);
    drop(guards);
    locker.shutdown().await;
}

/// The filters select exactly: a key, a prefix (bytes), an owner prefix, kinds, a time
/// range, a limit, and the order.
pub async fn history_filters_select_exactly<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let one = recording(&db, "one:1:");
    let two = recording(&db, "two:2:");
    for (locker, key) in [(&one, "f:a"), (&two, "f:b"), (&one, "f;"), (&two, "g:a")] {
        let guard = locker.try_acquire(key, LONG).await.unwrap().unwrap();
        guard.release().await.unwrap();
    }
    one.shutdown().await;
    two.shutdown().await;
    let read = async |filter: HistoryFilter| -> Vec<(String, EventKind)> {
        let events = db.locker.history(&filter).await.unwrap();
        events.into_iter().map(|e| (e.key, e.kind)).collect()
    };
    // Every event, oldest first: the order is (time, id) by the database's own values;
    // each filter must select exactly these events' matching ones, in this order.
    let events = all(&db.locker).await;
    assert_eq!(events.len(), 8);
    for pair in events.windows(2) {
        assert!(
            (pair[0].at, pair[0].id) < (pair[1].at, pair[1].id),
            "{pair:?}"
        );
    }
    let expected = |keep: &dyn Fn(&LockEvent) -> bool| -> Vec<(String, EventKind)> {
        let kept = events.iter().filter(|e| keep(e));
        kept.map(|e| (e.key.clone(), e.kind)).collect()
    };
    use EventKind::{Acquired, Released};

    let mut newest = read(HistoryFilter::new()).await;
    assert_eq!(read(HistoryFilter::new().limit(3)).await, newest[..3]);
    newest.reverse();
    assert_eq!(newest, expected(&|_| true), "newest first by default");
    assert_eq!(
        read(HistoryFilter::new().key("f:a").oldest_first()).await,
        expected(&|e| e.key == "f:a")
    );
    let prefixed = HistoryFilter::new()
        .prefix("f:")
        .kinds([Acquired])
        .oldest_first();
    assert_eq!(
        read(prefixed).await,
        expected(&|e| e.key.starts_with("f:") && e.kind == Acquired),
        "`f;` is past the prefix"
    );
    assert_eq!(read(HistoryFilter::new().prefix("f:")).await.len(), 4);
    let owned = HistoryFilter::new()
        .owner("two:2:")
        .kinds([Released])
        .oldest_first();
    assert_eq!(
        read(owned).await,
        expected(&|e| e.owner.starts_with("two:2:") && e.kind == Released)
    );
    assert_eq!(read(HistoryFilter::new().owner("two:2:")).await.len(), 4);
    assert!(read(HistoryFilter::new().kinds([])).await.is_empty());

    // A time range by the events' own (database) times: since is inclusive, until not.
    let middle = events[4].at;
    assert_eq!(
        read(HistoryFilter::new().since(middle).oldest_first()).await,
        expected(&|e| e.at >= middle)
    );
    assert_eq!(
        read(HistoryFilter::new().until(middle).oldest_first()).await,
        expected(&|e| e.at < middle)
    );
    assert!(
        read(HistoryFilter::new().until(events[0].at))
            .await
            .is_empty()
    );
    let within = read(HistoryFilter::new().within(Duration::from_secs(3600))).await;
    assert_eq!(within.len(), 8);
    assert!(matches!(
        db.locker.history(&HistoryFilter::new().limit(0)).await,
        Err(Error::InvalidConfig(_))
    ));
}

/// The reaper deletes the events older than the retention and keeps the younger ones;
/// a Locker without history trims nothing.
pub async fn history_is_trimmed_to_its_retention<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    for (key, age) in [("old", -7200), ("older", -86_400), ("young", -1800)] {
        let sql = format!(
            "INSERT INTO {}_events (at, kind, lock_key, owner) VALUES ({}, 'acquired', {}, 'x')",
            db.table,
            DB::now_plus(age),
            DB::param(1)
        );
        assert_eq!(DB::exec(&db.pool, sql, vec![key.into()]).await.unwrap(), 1);
    }
    db.locker.reap_expired().await.unwrap();
    assert_eq!(count_events(&db).await, 3, "no history, no trimming");
    let locker = recording(&db, "trim:1:");
    let reaper = locker.spawn_reaper(ReaperConfig::default()).unwrap();
    wait_until("the old events are trimmed", PATIENCE, async || {
        count_events(&db).await == 1
    })
    .await;
    reaper.stop().await;
    let left = all(&db.locker).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key, "young");
}

/// A Locker without history writes no event and sends no history statement, whatever
/// happens; `force_release_by` writes its event all the same.
pub async fn no_history_writes_nothing<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    assert!(!locker.records_history());
    let guard = locker.try_acquire("off", LONG).await.unwrap().unwrap();
    guard.release().await.unwrap();
    locker
        .try_acquire("off", LONG)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = locker.try_acquire("held", LONG).await.unwrap().unwrap();
    assert!(locker.force_release("held").await.unwrap());
    tokio::time::sleep(2 * dblock::HISTORY_FLUSH_INTERVAL).await;
    assert_eq!(locker.stats().history_batches, 0);
    assert_eq!(count_events(&db).await, 0);
    drop(held);

    let _ops = locker.try_acquire("ops", LONG).await.unwrap().unwrap();
    assert!(
        locker
            .force_release_by("ops", "console:admin")
            .await
            .unwrap()
    );
    let events = all(locker).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::ForceReleased);
    assert_eq!(events[0].detail.as_deref(), Some("console:admin"));

    // A table migrated before the history existed: the row goes all the same.
    let drop = format!("DROP TABLE {}_events", db.table);
    DB::exec(&db.pool, drop, vec![]).await.unwrap();
    let _old = locker.try_acquire("old", LONG).await.unwrap().unwrap();
    assert!(
        locker
            .force_release_by("old", "console:admin")
            .await
            .unwrap()
    );
    assert_eq!(locker.holder("old").await.unwrap(), None);
    assert!(matches!(
        locker.history(&HistoryFilter::new()).await,
        Err(Error::MissingTable { .. })
    ));
}

/// `shutdown` writes what is noted and not written yet, before the next tick, each event
/// dated when it happened, not when it was written: events noted before a reading of the
/// database clock, and written after it (a quarter of a tick later), are dated before it.
pub async fn shutdown_writes_the_noted_history<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let _clock = db
        .locker
        .try_acquire("~clock", LONG)
        .await
        .unwrap()
        .unwrap();
    let locker = recording(&db, "stop:1:");
    let before = db_now(&db).await;
    let guard = locker.try_acquire("stop", LONG).await.unwrap().unwrap();
    guard.release().await.unwrap();
    // A guard dropped without release: the engine releases it as it stops.
    drop(locker.try_acquire("dropped", LONG).await.unwrap().unwrap());
    // Time passing before the write (not a synchronization: the gap being measured).
    tokio::time::sleep(dblock::HISTORY_FLUSH_INTERVAL / 4).await;
    let between = db_now(&db).await;
    locker.shutdown().await;
    let events = all(&db.locker).await;
    let stop: Vec<&LockEvent> = of_key(&events, "stop");
    assert_eq!(stop.len(), 2);
    for event in stop {
        assert!(
            before <= event.at && event.at < between,
            "{event:?}: [{before}, {between})"
        );
    }
    let events = all(&db.locker).await;
    let written: Vec<(&str, EventKind)> = events.iter().map(|e| (e.key.as_str(), e.kind)).collect();
    assert_eq!(written.len(), 4, "{written:?}");
    assert!(written.contains(&("stop", EventKind::Released)));
    assert!(written.contains(&("dropped", EventKind::Released)));
}

/// A release that hands the row to the next local waiter in its own statement
/// (PostgreSQL) writes the holder's `Released`, then `HandedOff` with the waiter's owner
/// and new token and the previous owner as detail; elsewhere the waiter's own
/// acquisition follows the release. (On PostgreSQL the first waiter's turn comes from a
/// delete, its lost attempt having marked the row; the second's is handed off.)
pub async fn history_records_a_handoff<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = recording(&db, "hand:1:");
    let first = locker.try_acquire("h:hand", LONG).await.unwrap().unwrap();
    let mut waiters = Vec::new();
    for n in 1..=2 {
        let waiter = locker.clone();
        waiters.push(tokio::spawn(async move {
            let guard = waiter.acquire("h:hand", LONG, PATIENCE).await.unwrap();
            let held = (guard.owner().to_owned(), guard.fencing_token());
            // The work under the lock (no signal to wait for: holding is the point),
            // long enough for the next waiter to stand its offer of a handoff.
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
            held
        }));
        let queued = async || locker.waiting("h:hand") == n;
        wait_until("the waiter queues", PATIENCE, queued).await;
    }
    first.release().await.unwrap();
    let mut held = Vec::new();
    for waiter in waiters {
        held.push(waiter.await.unwrap());
    }
    locker.shutdown().await;
    let events = all(&db.locker).await;
    let on_key = of_key(&events, "h:hand");
    let handed = if DB::HANDOFF_IN_RELEASE {
        EventKind::HandedOff
    } else {
        EventKind::Acquired
    };
    use EventKind::{Acquired, Released};
    let expected = [Acquired, Released, Acquired, Released, handed, Released];
    assert_eq!(kinds(&on_key), expected, "{on_key:#?}");
    let (a, b) = (&held[0], &held[1]);
    assert_eq!(
        (on_key[2].owner.as_str(), on_key[2].fencing_token),
        (a.0.as_str(), Some(a.1))
    );
    assert_eq!(
        (on_key[4].owner.as_str(), on_key[4].fencing_token),
        (b.0.as_str(), Some(b.1))
    );
    if DB::HANDOFF_IN_RELEASE {
        assert_eq!(on_key[4].detail.as_deref(), Some(a.0.as_str()));
    }
}

/// An acquisition that took over an expired row records `taken_over`, one of a free key
/// `acquired`: through `try_acquire` and through a several-key acquisition, each with the
/// new owner and token. The expiry is waited for by the database clock.
pub async fn history_tells_a_takeover_from_a_fresh_acquisition<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = recording(&db, "take:1:");
    let old = db
        .locker
        .try_acquire("h:old", SHORT)
        .await
        .unwrap()
        .unwrap();
    let old_multi = db
        .locker
        .try_acquire("h:m-old", SHORT)
        .await
        .unwrap()
        .unwrap();
    for key in ["h:old", "h:m-old"] {
        wait_until("the lease expired", PATIENCE, async || {
            let holder = db.locker.holder(key).await.unwrap();
            holder.expect("the row is still there").expired
        })
        .await;
    }
    let taker = locker.try_acquire("h:old", LONG).await.unwrap().unwrap();
    let fresh = locker.try_acquire("h:new", LONG).await.unwrap().unwrap();
    let both = (locker
        .try_acquire_all(&["h:m-old", "h:m-new"], LONG)
        .await
        .unwrap())
    .expect("an expired row and a free key");
    locker.shutdown().await;

    let events = all(&db.locker).await;
    let only = |key: &str| -> (EventKind, String, Option<i64>) {
        let on_key = of_key(&events, key);
        assert_eq!(on_key.len(), 1, "{key}: {on_key:#?}");
        let event = on_key[0];
        (event.kind, event.owner.clone(), event.fencing_token)
    };
    let held = |owner: &str, token: i64| (owner.to_owned(), Some(token));
    let (kind, owner, token) = only("h:old");
    assert_eq!(kind, EventKind::TakenOver);
    assert_eq!((owner, token), held(taker.owner(), taker.fencing_token()));
    let (kind, owner, token) = only("h:new");
    assert_eq!(kind, EventKind::Acquired);
    assert_eq!((owner, token), held(fresh.owner(), fresh.fencing_token()));
    for (key, expected) in [
        ("h:m-old", EventKind::TakenOver),
        ("h:m-new", EventKind::Acquired),
    ] {
        let (kind, owner, token) = only(key);
        assert_eq!(kind, expected, "{key}");
        let token_of_key = both.fencing_token(key).expect("the guard holds the key");
        let expected = held(both.guards()[0].owner(), token_of_key);
        assert_eq!((owner, token), expected, "{key}");
    }
    assert!(old.owner() != taker.owner() && old_multi.owner() != both.guards()[0].owner());
}
