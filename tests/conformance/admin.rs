//! Operators' tools: listing the rows of a table (whoever wrote them) and force-releasing
//! a stuck lock; the holder times they read are the database's.

use std::time::Duration;

use dblock::{Error, LockFilter, LockInfo, Locker, LostReason};
use tokio::time::timeout;

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// Sets a row's `acquired_at` an hour back, as a plain-SQL client can: a lock that has
/// been held for a long time, without waiting for one.
async fn age_by_an_hour<DB: TestBackend>(db: &TestDb<DB>, key: &str) {
    let sql = format!(
        "UPDATE {} SET acquired_at = {} WHERE lock_key = {}",
        db.table,
        DB::now_plus(-3600),
        DB::param(1)
    );
    assert_eq!(DB::exec(&db.pool, sql, vec![key.into()]).await.unwrap(), 1);
}

fn keys(rows: &[LockInfo]) -> Vec<&str> {
    rows.iter().map(|row| row.key.as_str()).collect()
}

/// `list` returns every row with the prefix, in byte order, dblock's and a plain-SQL
/// client's alike, with the database's times; its filters and limit hold exactly.
pub async fn list_shows_every_row_in_key_order<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    // Keys around the prefix `job:`: `job` and `job;` (the first string past the prefix)
    // and `jobz` are outside, `job:\u{7f}` and a non-ASCII key inside.
    let mut guards = Vec::new();
    for key in [
        "job:b",
        "job:a",
        "job",
        "job;",
        "jobz",
        "job:a:x",
        "job:\u{7f}",
        "job:ключ",
    ] {
        guards.push(locker.try_acquire(key, LONG).await.unwrap().unwrap());
    }
    db.plain
        .insert("job:plain", "plain-client", 30)
        .await
        .unwrap();
    db.plain
        .insert("job:old", "plain-client", -10)
        .await
        .unwrap();

    let rows = locker.list("job:", 100).await.unwrap();
    assert_eq!(
        keys(&rows),
        [
            "job:a",
            "job:a:x",
            "job:b",
            "job:old",
            "job:plain",
            "job:\u{7f}",
            "job:ключ"
        ]
    );
    for row in &rows {
        assert!(row.acquired_at <= row.read_at, "{row:?}");
        assert_eq!(row.expired, row.expires_at <= row.read_at, "{row:?}");
        assert_eq!(row.expired, row.key == "job:old", "{row:?}");
        assert!(row.held_for() < Duration::from_secs(60), "{row:?}");
        if let Some(guard) = guards.iter().find(|g| g.key() == row.key) {
            assert_eq!(row.owner, guard.owner());
            assert_eq!(row.fencing_token, guard.fencing_token());
            assert_eq!(row.expires_at, guard.expires_at());
        } else {
            assert_eq!(row.owner, "plain-client");
        }
        // `holder` reads the same row.
        let holder = locker.holder(&row.key).await.unwrap().unwrap();
        assert_eq!(
            (holder.owner.as_str(), holder.fencing_token),
            (row.owner.as_str(), row.fencing_token)
        );
        assert_eq!(
            (holder.acquired_at, holder.expires_at),
            (row.acquired_at, row.expires_at)
        );
    }

    // The limit cuts the list in key order; no prefix lists the whole table.
    assert_eq!(
        keys(&locker.list("job:", 2).await.unwrap()),
        ["job:a", "job:a:x"]
    );
    assert_eq!(locker.list("", 100).await.unwrap().len(), 10);
    let expired = LockFilter::new().prefix("job").expired_only();
    assert_eq!(
        keys(&locker.list_matching(&expired).await.unwrap()),
        ["job:old"]
    );

    // Held longer than an hour minus a minute: only the row made old.
    age_by_an_hour(&db, "job:b").await;
    let old = LockFilter::new().held_longer_than(Duration::from_secs(3540));
    let rows = locker.list_matching(&old).await.unwrap();
    assert_eq!(keys(&rows), ["job:b"]);
    let held = rows[0].held_for();
    assert!(
        held >= Duration::from_secs(3600) && held < Duration::from_secs(3660),
        "{held:?}"
    );

    // Bad input is refused before anything is read.
    for limit in [0, dblock::MAX_LIST_LIMIT + 1] {
        let err = locker.list("job:", limit).await.unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    }
    let err = locker.list("a\0b", 10).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
    let forever = LockFilter::new().held_longer_than(Duration::MAX);
    let err = locker.list_matching(&forever).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidDuration {
                what: "held_longer_than",
                ..
            }
        ),
        "{err}"
    );
}

/// `LockFilter::after` pages through a listing in key order (bytes): each page starts right
/// after the previous page's last key, with or without a prefix, whether or not that key
/// is still there; an `after` before the prefix leaves the prefix in charge.
pub async fn list_pages_after_a_key<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    let mut guards = Vec::new();
    for key in ["p:d", "p:a", "o:z", "p:ключ", "p:c", "q:x", "p:e", "p:b"] {
        guards.push(locker.try_acquire(key, LONG).await.unwrap().unwrap());
    }
    let page = async |prefix: &str, after: &str, limit: u32| {
        let filter = LockFilter::new().prefix(prefix).after(after).limit(limit);
        let rows = locker.list_matching(&filter).await.unwrap();
        rows.into_iter().map(|row| row.key).collect::<Vec<_>>()
    };
    assert_eq!(page("p:", "", 2).await, ["p:a", "p:b"]);
    assert_eq!(page("p:", "p:b", 2).await, ["p:c", "p:d"]);
    assert_eq!(page("p:", "p:d", 2).await, ["p:e", "p:ключ"]);
    assert!(page("p:", "p:ключ", 2).await.is_empty());
    // A key that is not (or no longer) there: the page starts at the next one.
    assert_eq!(page("p:", "p:bb", 2).await, ["p:c", "p:d"]);
    // Before the prefix, or the prefix itself: the prefix's first page.
    assert_eq!(page("p:", "a", 2).await, ["p:a", "p:b"]);
    assert_eq!(page("p:", "p:", 2).await, ["p:a", "p:b"]);
    // Without a prefix, past the last `p:` key.
    assert_eq!(page("", "p:ключ", 10).await, ["q:x"]);
    assert_eq!(page("", "o:z", 1).await, ["p:a"]);
    let bad = LockFilter::new().after("a\0b");
    assert!(matches!(
        locker.list_matching(&bad).await,
        Err(Error::InvalidKey { .. })
    ));
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// An operator deletes a lock another Locker holds: the holder's guard reports
/// `lost(Deleted)` at its next renewal, a waiter elsewhere gets the key (on PostgreSQL
/// woken at once, as by a release), and its fencing token is greater.
pub async fn force_release_fires_lost_and_wakes_a_waiter<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "stuck";
    let holder = Locker::builder(db.another_pool().await)
        .table(&db.table)
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let waiter_locker = Locker::builder(db.another_pool().await)
        .table(&db.table)
        .auto_renew(false)
        .build()
        .unwrap();
    let guard = holder.try_acquire(key, LONG).await.unwrap().unwrap();
    let waiter = {
        let locker = waiter_locker.clone();
        tokio::spawn(async move { locker.acquire(key, LONG, PATIENCE).await.unwrap() })
    };
    // The waiter has lost once and sleeps (on PostgreSQL with its listener up and the
    // row marked, so that deleting it notifies).
    let hears = db.hears_releases().await;
    crate::common::wait_until("the waiter sleeps", PATIENCE, async || {
        waiter_locker.stats().attempts >= 1
            && (!hears || (waiter_locker.listening() && db.plain.marked(key).await))
    })
    .await;

    let wakeups_before = waiter_locker.stats().wakeups;
    assert!(
        db.locker.force_release(key).await.unwrap(),
        "the row was there"
    );
    let reason = timeout(PATIENCE, guard.lost())
        .await
        .expect("the holder hears of it");
    assert_eq!(reason, LostReason::Deleted);
    let taken = timeout(PATIENCE, waiter).await.unwrap().unwrap();
    assert!(taken.fencing_token() > guard.fencing_token());
    if hears {
        // Woken by the notification of the delete, as by a release.
        let stats = waiter_locker.stats();
        assert!(stats.wakeups > wakeups_before, "{stats:?}");
    }
    assert!(
        guard.release().await.is_err(),
        "the old guard holds nothing"
    );
    taken.release().await.unwrap();

    // No row: nothing to do. A plain-SQL client's row goes like any other.
    assert!(!db.locker.force_release(key).await.unwrap());
    db.plain.insert("plain", "plain-client", 30).await.unwrap();
    assert!(db.locker.force_release("plain").await.unwrap());
    assert_eq!(db.locker.holder("plain").await.unwrap(), None);
    let err = db.locker.force_release("").await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err}");
}

/// The reaper's leak check reports the live rows held longer than its threshold, its own
/// Locker's and a plain-SQL client's alike, once per check, and forgets a row once it is
/// released.
pub async fn leak_check_reports_long_held_rows<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let locker = &db.locker;
    let leaked = locker.try_acquire("leaked", LONG).await.unwrap().unwrap();
    let fresh = locker.try_acquire("fresh", LONG).await.unwrap().unwrap();
    db.plain
        .insert("plain-leaked", "plain-client", 30)
        .await
        .unwrap();
    age_by_an_hour(&db, "leaked").await;
    age_by_an_hour(&db, "plain-leaked").await;
    let reaper = locker
        .spawn_reaper(dblock::ReaperConfig {
            interval: Duration::from_millis(50),
            leak_threshold: Some(Duration::from_secs(3540)),
            ..dblock::ReaperConfig::default()
        })
        .unwrap();
    let mut reports = reaper.long_held();
    let report = timeout(PATIENCE, reports.wait_for(|r| r.checks >= 1))
        .await
        .unwrap()
        .unwrap()
        .clone();
    let found: Vec<(&str, &str)> = report
        .rows
        .iter()
        .map(|row| (row.key.as_str(), row.owner.as_str()))
        .collect();
    assert_eq!(
        found,
        [("leaked", leaked.owner()), ("plain-leaked", "plain-client")]
    );
    assert_eq!(report.rows[0].fencing_token, leaked.fencing_token());
    for row in &report.rows {
        let held = row.held_for;
        assert!(
            held >= Duration::from_secs(3600) && held < Duration::from_secs(3660),
            "{held:?}"
        );
    }

    leaked.release().await.unwrap();
    let after = report.checks + 1;
    let report = timeout(PATIENCE, reports.wait_for(|r| r.checks > after))
        .await
        .unwrap()
        .unwrap()
        .clone();
    let found: Vec<&str> = report.rows.iter().map(|row| row.key.as_str()).collect();
    assert_eq!(
        found,
        ["plain-leaked"],
        "a released row is no longer reported"
    );
    reaper.stop().await;
    fresh.release().await.unwrap();

    let Err(err) = locker.spawn_reaper(dblock::ReaperConfig {
        leak_threshold: Some(Duration::ZERO),
        ..dblock::ReaperConfig::default()
    }) else {
        panic!("a zero leak threshold is refused");
    };
    assert!(
        matches!(
            err,
            Error::InvalidDuration {
                what: "leak threshold",
                ..
            }
        ),
        "{err}"
    );
}
