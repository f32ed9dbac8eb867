//! Issue 10's fair mode: waiters of two Lockers (two pools, as two processes would be)
//! are granted in ticket order, which is their arrival order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dblock::Locker;
use tokio::time::{Instant, sleep, timeout};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb};

/// Live tickets for the test's table.
async fn tickets<DB: TestBackend>(db: &TestDb<DB>) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {}_ticket", db.table);
    DB::fetch_i64(&db.pool, sql, vec![]).await.unwrap().unwrap()
}

/// Waits until `n` tickets exist (polled: taking a ticket sends no signal to a test).
async fn ticketed<DB: TestBackend>(db: &TestDb<DB>, n: i64) {
    let give_up = Instant::now() + PATIENCE;
    while tickets(db).await != n {
        assert!(Instant::now() < give_up, "expected {n} tickets");
        sleep(Duration::from_millis(5)).await;
    }
}

/// Eight waiters, alternating between two fair Lockers with their own pools, each
/// started once the one before holds its ticket, while the key is held: they are granted
/// exactly in arrival order, their tickets rise in that order, and no ticket is left.
pub async fn fair_grants_follow_ticket_order<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const WAITERS: usize = 8;
    let key = "fair";
    let lockers = two_fair_lockers(&db).await;
    let holder = lockers[0].try_acquire(key, LONG).await.unwrap().unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..WAITERS {
        let (waiter, granted) = (lockers[n % 2].clone(), Arc::clone(&granted));
        tasks.push(tokio::spawn(async move {
            let guard = waiter.acquire(key, LONG, PATIENCE).await.unwrap();
            granted.lock().unwrap().push((n, guard.ticket()));
            guard.release().await.unwrap();
        }));
        ticketed(&db, n as i64 + 1).await;
    }
    // A newcomer without a ticket cannot go ahead of the queue.
    assert!(lockers[1].try_acquire(key, LONG).await.unwrap().is_none());
    holder.release().await.unwrap();
    for task in tasks {
        timeout(PATIENCE, task).await.unwrap().unwrap();
    }
    let granted = granted.lock().unwrap().clone();
    let order: Vec<usize> = granted.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "granted out of order"
    );
    let numbers: Vec<i64> = granted
        .iter()
        .map(|(_, t)| t.expect("waited on a ticket"))
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "tickets {numbers:?}"
    );
    assert_eq!(tickets(&db).await, 0, "every ticket was deleted");
}

/// Two fair Lockers on their own pools (two "processes").
async fn two_fair_lockers<DB: TestBackend>(db: &TestDb<DB>) -> [Locker<DB>; 2] {
    let fair = |pool| {
        Locker::builder(pool)
            .table(&db.table)
            .fair(true)
            .default_lease(LONG)
            .build()
            .unwrap()
    };
    [fair(db.pool.clone()), fair(db.another_pool().await)]
}

/// Five waiters queue with tickets, alternating between two fair Lockers; the one in the
/// middle is cancelled and the key released at once. Its ticket is deleted as it goes
/// (its lease, 30 s, would outlast the test's patience): the ones behind it are granted
/// in order right away, and no ticket is left.
pub async fn fair_skips_a_cancelled_waiter_at_once<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const WAITERS: usize = 5;
    const CANCELLED: usize = 2;
    let key = "fair-cancel";
    let lockers = two_fair_lockers(&db).await;
    let holder = lockers[0].try_acquire(key, LONG).await.unwrap().unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..WAITERS {
        let (waiter, granted) = (lockers[n % 2].clone(), Arc::clone(&granted));
        tasks.push(tokio::spawn(async move {
            let guard = waiter.acquire(key, LONG, PATIENCE).await.unwrap();
            granted.lock().unwrap().push((n, Instant::now()));
            guard.release().await.unwrap();
        }));
        ticketed(&db, n as i64 + 1).await;
    }
    tasks[CANCELLED].abort();
    let released = Instant::now();
    holder.release().await.unwrap();
    for (n, task) in tasks.into_iter().enumerate() {
        if n != CANCELLED {
            timeout(PATIENCE, task).await.unwrap().unwrap();
        }
    }
    let granted = granted.lock().unwrap().clone();
    let order: Vec<usize> = granted.iter().map(|(n, _)| *n).collect();
    let expected: Vec<usize> = (0..WAITERS).filter(|&n| n != CANCELLED).collect();
    assert_eq!(order, expected, "granted out of order");
    // Each grant is a release and a wake-up or a short poll; the cancelled ticket's
    // expiry would be 30 s.
    let chain = granted.last().unwrap().1 - released;
    assert!(chain < Duration::from_secs(5), "4 grants took {chain:?}");
    ticketed(&db, 0).await;
}

/// A waiter that died while queued (a ticket row that nobody renews, written by plain
/// SQL with a 2 s lease) holds up the waiters behind it until its lease ends, not longer,
/// and not the one ahead of it. Grants follow ticket order around it.
pub async fn fair_skips_a_dead_waiter_after_its_ticket_lease<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "fair-dead";
    let lockers = two_fair_lockers(&db).await;
    let holder = lockers[0].try_acquire(key, LONG).await.unwrap().unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let spawn = |n: usize| {
        let (waiter, granted) = (lockers[n % 2].clone(), Arc::clone(&granted));
        tokio::spawn(async move {
            let guard = waiter.acquire(key, LONG, PATIENCE).await.unwrap();
            granted
                .lock()
                .unwrap()
                .push((n, guard.ticket(), Instant::now()));
            guard.release().await.unwrap();
        })
    };
    let first = spawn(0);
    ticketed(&db, 1).await;
    // The dead waiter's ticket: the database's clock plus 2 s (SQLite's `datetime`
    // keeps whole seconds, so there it may end up to 1 s sooner).
    let dead_from = Instant::now();
    let insert = format!(
        "INSERT INTO {}_ticket (lock_key, expire_time) VALUES ({}, {})",
        db.table,
        DB::param(1),
        DB::now_plus(2)
    );
    DB::exec(&db.pool, insert, vec![key.into()]).await.unwrap();
    let max = format!("SELECT MAX(ticket) FROM {}_ticket", db.table);
    let dead = DB::fetch_i64(&db.pool, max, vec![]).await.unwrap().unwrap();
    let second = spawn(1);
    ticketed(&db, 3).await;
    let third = spawn(2);
    ticketed(&db, 4).await;

    holder.release().await.unwrap();
    timeout(PATIENCE, first).await.unwrap().unwrap();
    for task in [second, third] {
        timeout(PATIENCE, task).await.unwrap().unwrap();
    }
    let granted = granted.lock().unwrap().clone();
    let order: Vec<usize> = granted.iter().map(|(n, ..)| *n).collect();
    assert_eq!(order, [0, 1, 2], "granted out of order");
    let tickets: Vec<i64> = granted
        .iter()
        .map(|(_, t, _)| t.expect("a ticket"))
        .collect();
    assert!(
        tickets[0] < dead && dead < tickets[1] && tickets[1] < tickets[2],
        "tickets {tickets:?} around the dead one, {dead}"
    );
    let (ahead, next) = (granted[0].2 - dead_from, granted[1].2 - dead_from);
    assert!(
        ahead < Duration::from_secs(1),
        "the one ahead waited {ahead:?}"
    );
    assert!(
        next >= Duration::from_secs(1),
        "granted past a live ticket after {next:?}"
    );
    assert!(
        next < Duration::from_secs(4),
        "held up {next:?} by a ticket with a 2 s lease"
    );
    // The waiters' tickets are gone; the dead one stays until it is purged.
    ticketed(&db, 1).await;
}

/// A fair waiter that won but is cancelled while its ticket is being deleted (the test
/// holds the ticket row locked, so the DELETE waits) leaves no lock behind: the engine
/// releases the won lease it had no guard for yet, and stops renewing it. SQLite has no
/// row locks to hold the DELETE with, so it is left out there.
pub async fn fair_winner_cancelled_while_its_ticket_goes_leaves_no_lock<DB: TestBackend>()
where
    for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
{
    if DB::LABEL == "sqlite" {
        eprintln!("sqlite: no row locks to hold a ticket's DELETE with; case left out");
        return;
    }
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let key = "fair-cancel-won";
    let lockers = two_fair_lockers(&db).await;
    let holder = lockers[0].try_acquire(key, LONG).await.unwrap().unwrap();
    let first_owner = holder.owner().to_owned();
    let waiter = {
        let locker = lockers[1].clone();
        tokio::spawn(async move { locker.acquire(key, LONG, PATIENCE).await })
    };
    ticketed(&db, 1).await;
    let mut blocker = db.pool.acquire().await.unwrap();
    let lock_ticket = format!(
        "BEGIN; SELECT ticket FROM {}_ticket WHERE lock_key = '{key}' FOR UPDATE",
        db.table
    );
    sqlx::Executor::execute(
        &mut *blocker,
        sqlx::raw_sql(sqlx::AssertSqlSafe(lock_ticket)),
    )
    .await
    .unwrap();
    holder.release().await.unwrap();
    // The waiter won: the row is its own, and its ticket's DELETE waits for the blocker.
    crate::common::wait_until("the waiter won", PATIENCE, async || {
        let row = db.locker.holder(key).await.unwrap();
        row.is_some_and(|row| row.owner != first_owner)
    })
    .await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    sqlx::Executor::execute(&mut *blocker, sqlx::raw_sql("ROLLBACK"))
        .await
        .unwrap();
    crate::common::wait_until("the won lease is released", PATIENCE, async || {
        db.locker.holder(key).await.unwrap().is_none() && lockers[1].renewing() == 0
    })
    .await;
}
