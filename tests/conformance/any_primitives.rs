//! Every primitive through an [`AnyLocker`] built from the backend's URL, with no `match`
//! on the backend: semaphores, read-write locks, elections, several keys at once,
//! schedules, and fencing in an [`AnyTransaction`] for every Any guard. Each case reads
//! the lock table through the test's own typed `Locker` to check that the call reached
//! the URL's database.

use std::sync::Arc;
use std::time::Duration;

use dblock::{AnyLeadership, AnyLocker, AnyTransaction, Error, Turn};

use super::any::open;
use super::{LONG, PATIENCE, SHORT};
use crate::common::{TestBackend, wait_until};

/// Adds one to the counter in `tx`, in SQL every backend reads alike.
async fn add_one(tx: &mut AnyTransaction, counter: &str) {
    let sql = format!("UPDATE {counter} SET v = v + 1 WHERE id = 1");
    // One text, but each database's query is a type of its own.
    use dblock::sqlx::{AssertSqlSafe, query};
    let done = if let Some(tx) = tx.as_postgres() {
        query(AssertSqlSafe(sql.clone()))
            .execute(&mut **tx)
            .await
            .map(|r| r.rows_affected())
    } else if let Some(tx) = tx.as_mysql() {
        query(AssertSqlSafe(sql.clone()))
            .execute(&mut **tx)
            .await
            .map(|r| r.rows_affected())
    } else if let Some(tx) = tx.as_sqlite() {
        query(AssertSqlSafe(sql.clone()))
            .execute(&mut **tx)
            .await
            .map(|r| r.rows_affected())
    } else {
        panic!("a transaction of no known backend: {}", tx.backend())
    };
    assert_eq!(done.expect("the counter's update"), 1);
}

/// A semaphore of 3: three permits, the fourth attempt finds none (and a short wait times
/// out), the rows are the permits', and a permit given back is taken again.
pub async fn any_semaphore_admits_exactly_its_permits<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let exports = any.semaphore("exports", 3);
    assert_eq!((exports.name(), exports.permits()), ("exports", 3));
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(
            exports
                .try_acquire(LONG)
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    assert!(exports.try_acquire(LONG).await.unwrap().is_none(), "a 4th");
    let waited = exports.acquire(LONG, Duration::from_millis(100)).await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let mut numbers: Vec<u32> = permits.iter().map(|permit| permit.number()).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, [0, 1, 2]);
    assert_eq!(exports.available().await.unwrap(), 0);
    // Read by the test's own Locker: the rows are the permits', with their tokens.
    let rows = db.locker.list("exports~", 10).await.unwrap();
    assert_eq!(rows.len(), 3);
    for permit in &permits {
        let row = rows
            .iter()
            .find(|row| row.key == permit.key())
            .expect("its row");
        assert_eq!(
            (row.owner.as_str(), row.fencing_token),
            (permit.owner(), permit.fencing_token())
        );
    }
    assert_eq!(exports.holders().await.unwrap().len(), 3);

    let given_back = permits.pop().unwrap();
    let (number, token) = (given_back.number(), given_back.fencing_token());
    given_back.release().await.unwrap();
    assert_eq!(exports.available().await.unwrap(), 1);
    let again = exports.acquire(LONG, PATIENCE).await.unwrap();
    assert_eq!(again.number(), number);
    assert!(again.fencing_token() > token);
    again.release().await.unwrap();
    for permit in permits {
        permit.release().await.unwrap();
    }
    assert_eq!(db.plain.row_count().await, 0, "every permit released");
}

/// Readers share and keep a writer out; a write keeps readers and writers out; the write's
/// token is above the readers'.
pub async fn any_rw_lock_excludes<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let lock = any.rw_lock("prices");
    assert_eq!(lock.name(), "prices");
    let first = lock.try_read(LONG).await.unwrap().expect("free");
    let second = lock.read(LONG, PATIENCE).await.unwrap();
    assert!(first.key().starts_with("prices~read-"));
    assert_eq!(db.locker.list("prices~read-", 10).await.unwrap().len(), 2);
    assert!(
        lock.try_write(LONG).await.unwrap().is_none(),
        "a reader keeps the writer out"
    );
    let top_read = first.fencing_token().max(second.fencing_token());
    first.release().await.unwrap();
    second.release().await.unwrap();

    let write = lock.try_write(LONG).await.unwrap().expect("no reader left");
    assert_eq!(write.key(), "prices~write-grant");
    assert!(write.fencing_token() > top_read);
    let grant = db.locker.holder("prices~write-grant").await.unwrap();
    assert_eq!(
        grant.expect("the grant's row").fencing_token,
        write.fencing_token()
    );
    assert!(
        lock.try_read(LONG).await.unwrap().is_none(),
        "write excludes read"
    );
    assert!(lock.try_write(LONG).await.unwrap().is_none(), "and writes");
    write.ensure_held().unwrap();
    write.release().await.unwrap();
    assert_eq!(db.plain.row_count().await, 0, "both rows released");
    let read = lock.try_read(LONG).await.unwrap().expect("free again");
    read.release().await.unwrap();
}

/// Of two candidates one leads; the other's campaign waits until the leader resigns, then
/// leads in a greater term; `run` returns its work's value; a spawned candidate leads
/// once and resigns when stopped.
pub async fn any_election_has_one_leader_and_hands_over<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let election = any.election("relay");
    assert_eq!(
        (election.name(), election.key()),
        ("relay", "relay~leader".to_owned())
    );
    let a = election.campaign("node-a", LONG).await.unwrap();
    let (tx, mut led) = tokio::sync::mpsc::unbounded_channel();
    let other = election.clone();
    let b = tokio::spawn(async move {
        let leading = other.campaign("node-b", LONG).await.unwrap();
        tx.send(()).unwrap();
        leading
    });
    // Node B campaigns while A leads: it waits (A's lease is long and renewed by nobody,
    // so only A's resignation can let B in).
    let leader = election.leader().await.unwrap().expect("A leads");
    assert_eq!(
        (leader.identity.as_str(), leader.term),
        ("node-a", a.term())
    );
    assert!(led.try_recv().is_err(), "B leads while A does");
    let row = db
        .locker
        .holder("relay~leader")
        .await
        .unwrap()
        .expect("A's row");
    assert_eq!(
        (row.owner.as_str(), row.fencing_token),
        (a.owner(), a.term())
    );

    let a_term = a.term();
    a.resign().await.unwrap();
    let b = tokio::time::timeout(PATIENCE, b)
        .await
        .expect("B leads")
        .unwrap();
    assert_eq!(b.identity(), "node-b");
    assert!(b.term() > a_term);
    let leader = election.leader().await.unwrap().expect("B leads");
    assert_eq!(
        (leader.identity.as_str(), leader.term),
        ("node-b", b.term())
    );
    let b_term = b.term();
    b.resign().await.unwrap();

    let ran = election
        .run("node-c", LONG, async |leading: &AnyLeadership| {
            leading.ensure_held()?;
            Ok::<_, Error>(leading.term())
        })
        .await
        .unwrap();
    assert!(ran > b_term);
    assert_eq!(election.leader().await.unwrap(), None, "run resigned");

    let (terms, mut termed) = tokio::sync::mpsc::unbounded_channel();
    let spawned = election
        .spawn("node-d", LONG, move |leading: Arc<AnyLeadership>| {
            let terms = terms.clone();
            async move {
                terms.send(leading.term()).ok();
                std::future::pending::<()>().await;
                Ok(())
            }
        })
        .unwrap();
    let term = tokio::time::timeout(PATIENCE, termed.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(term > ran);
    let stats = spawned.stop().await;
    assert_eq!((stats.terms, stats.leading), (1, false));
    assert_eq!(
        election.leader().await.unwrap(),
        None,
        "resigned when stopped"
    );
}

/// All or nothing: an overlapping set gets nothing (and its free key stays free), a
/// waiting one times out naming the keys, and gets all once they are released.
pub async fn any_acquire_all_is_all_or_nothing<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    let both = any
        .acquire_all(&["acct:7", "acct:3"], LONG, PATIENCE)
        .await
        .unwrap();
    assert_eq!(both.keys(), ["acct:3", "acct:7"]);
    for key in ["acct:3", "acct:7"] {
        let row = db.locker.holder(key).await.unwrap().expect("its row");
        assert_eq!(Some(row.fencing_token), both.fencing_token(key));
    }
    assert_eq!(both.fencing_token("acct:9"), None);
    assert!(
        any.try_acquire_all(&["acct:3", "acct:9"], LONG)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        db.locker.holder("acct:9").await.unwrap(),
        None,
        "the loser took nothing"
    );
    let waited = any
        .acquire_all(&["acct:9", "acct:7"], LONG, Duration::from_millis(100))
        .await;
    assert!(
        matches!(&waited, Err(Error::Timeout { key, .. }) if key == "acct:7, acct:9"),
        "{waited:?}"
    );
    both.ensure_held().unwrap();
    assert_eq!(both.lost_reason(), None);
    both.release().await.unwrap();
    let later = any
        .try_acquire_all(&["acct:9", "acct:3"], LONG)
        .await
        .unwrap()
        .expect("free now");
    assert_eq!(later.keys(), ["acct:3", "acct:9"]);
    assert_eq!(db.plain.row_count().await, 2, "a row per key");
    later.release().await.unwrap();
    assert_eq!(db.plain.row_count().await, 0);
}

/// Two nodes' schedules of one name: one run per period (the other skips, the first
/// wakes early), and one started in the background runs the period at once.
pub async fn any_schedule_runs_once_per_period<DB: TestBackend>() {
    let Some((_db, any)) = open::<DB>().await else {
        return;
    };
    let hourly = || any.schedule("report", Duration::from_secs(3600));
    let (a, b) = (hourly(), hourly());
    assert_eq!(a.name(), "report");
    let tick = a
        .run_once(async |period| Ok::<_, Error>(period.number))
        .await
        .unwrap();
    assert!(matches!(tick.turn, Turn::Ran { output, .. } if output == tick.period));
    let skipped = b.run_once(async |_| Ok::<_, Error>(0)).await.unwrap();
    assert!(matches!(skipped.turn, Turn::Skipped), "{:?}", skipped.turn);
    let early = a.run_once(async |_| Ok::<_, Error>(0)).await.unwrap();
    assert!(
        matches!(early.turn, Turn::AlreadyHandled),
        "{:?}",
        early.turn
    );
    assert_eq!((a.stats().runs, b.stats().runs, b.stats().skips), (1, 0, 1));

    let (ran, mut periods) = tokio::sync::mpsc::unbounded_channel();
    let handle = any
        .schedule("rollup", Duration::from_secs(3600))
        .run(move |period| {
            let ran = ran.clone();
            async move {
                ran.send(period.number).ok();
                Ok::<_, Error>(())
            }
        })
        .unwrap();
    let period = tokio::time::timeout(PATIENCE, periods.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(period >= tick.period, "{period} {}", tick.period);
    assert_eq!(handle.stop().await.runs, 1);
}

/// Fencing through every Any guard: a write checked by `assert_held` and committed by
/// the guard counts once; after a force-release (or, for the mutex, a takeover of its
/// expired row) `assert_held` says `NotHeld` and the write in that transaction is never
/// committed. A transaction of another database is a typed error.
pub async fn any_guards_fence_writes_in_an_any_transaction<DB: TestBackend>() {
    let Some((db, any)) = open::<DB>().await else {
        return;
    };
    db.plain.counter_create().await;
    let counter = db.plain.counter_table();
    let mut committed = 0;

    // Each guard: its row (to force-release) and its two fencing calls, boxed alike.
    macro_rules! fence {
        ($guard:expr, $row:expr) => {{
            let guard = $guard;
            let row: String = $row;
            let mut tx = any.begin().await.unwrap();
            assert_eq!(tx.backend(), any.backend());
            guard.assert_held(&mut tx).await.expect("held");
            add_one(&mut tx, &counter).await;
            guard.commit(tx).await.expect("committed under the lock");
            committed += 1;
            assert_eq!(db.plain.counter_get().await, committed, "{row}");

            assert!(any.force_release(&row).await.unwrap(), "{row}");
            let mut tx = any.begin().await.unwrap();
            add_one(&mut tx, &counter).await;
            let refused = guard.assert_held(&mut tx).await;
            assert!(matches!(&refused, Err(Error::NotHeld { key, .. }) if *key == row), "{row}: {refused:?}");
            tx.rollback().await.unwrap(); // as the caller of a refused check does
            assert_eq!(db.plain.counter_get().await, committed, "{row}: nothing committed");
            guard
        }};
    }

    let mutex = fence!(
        any.try_acquire("fenced", LONG).await.unwrap().unwrap(),
        "fenced".into()
    );
    assert!(matches!(mutex.release().await, Err(Error::NotHeld { .. })));
    let permit = any
        .semaphore("sem", 2)
        .try_acquire(LONG)
        .await
        .unwrap()
        .unwrap();
    let row = permit.key().to_owned();
    fence!(permit, row).release().await.ok();
    let read = any.rw_lock("rw").try_read(LONG).await.unwrap().unwrap();
    let row = read.key().to_owned();
    fence!(read, row).release().await.ok();
    let write = any.rw_lock("rw2").try_write(LONG).await.unwrap().unwrap();
    fence!(write, "rw2~write-grant".into()).release().await.ok();
    let leading = any.election("boss").campaign("me", LONG).await.unwrap();
    fence!(leading, "boss~leader".into()).resign().await.ok();
    let multi = any
        .try_acquire_all(&["m:1", "m:2"], LONG)
        .await
        .unwrap()
        .unwrap();
    fence!(multi, "m:2".into()).release().await.ok();
    assert_eq!(committed, 6);

    // A takeover of an expired row: the old guard's check says NotHeld, nothing commits.
    let stale = any.try_acquire("taken", SHORT).await.unwrap().unwrap();
    wait_until("the short lease expired", PATIENCE, async || {
        db.locker.holder("taken").await.unwrap().unwrap().expired
    })
    .await;
    let taker = any
        .try_acquire("taken", LONG)
        .await
        .unwrap()
        .expect("takes over");
    let mut tx = any.begin().await.unwrap();
    add_one(&mut tx, &counter).await;
    let refused = stale.assert_held(&mut tx).await;
    assert!(matches!(refused, Err(Error::NotHeld { .. })), "{refused:?}");
    tx.rollback().await.unwrap();
    assert_eq!(db.plain.counter_get().await, committed);
    let mut tx = any.begin().await.unwrap();
    taker.assert_held(&mut tx).await.expect("the taker holds");
    taker.commit(tx).await.unwrap();

    // Another database's transaction: refused before anything is sent.
    if DB::LABEL != "sqlite" {
        let elsewhere = AnyLocker::connect("sqlite::memory:").await.unwrap();
        let mut tx = elsewhere.begin().await.unwrap();
        let mismatch = taker.assert_held(&mut tx).await;
        assert!(
            matches!(&mismatch, Err(Error::InvalidConfig(why)) if why.contains("SQLite transaction")),
            "{mismatch:?}"
        );
        let mismatch = taker.commit(tx).await;
        assert!(
            matches!(mismatch, Err(Error::InvalidConfig(_))),
            "{mismatch:?}"
        );
    }
    taker.release().await.unwrap();
}
