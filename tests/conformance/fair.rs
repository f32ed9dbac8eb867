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
    let fair = |pool| {
        Locker::builder(pool)
            .table(&db.table)
            .fair(true)
            .build()
            .unwrap()
    };
    let lockers = [fair(db.pool.clone()), fair(db.another_pool().await)];
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
