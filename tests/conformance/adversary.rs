//! Issue 25's cases, found by running dblock against an adversary: waiters cancelled at
//! any await point (request timeouts, `select!`), an application that keeps its own pool
//! busy, ten thousand guards dropped at once, and a table of the right name but another
//! shape. Written once, generic over the backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{Error, LockGuard, Locker};
use futures::stream::{self, StreamExt};
use tokio::time::{Instant, sleep, timeout};

use super::{LONG, PATIENCE};
use crate::common::{TestBackend, TestDb, wait_until};

/// Rows in the test table's ticket table.
async fn ticket_rows<DB: TestBackend>(db: &TestDb<DB>) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {}_ticket", db.table);
    DB::fetch_i64(&db.pool, sql, vec![]).await.unwrap().unwrap()
}

/// A random budget below `max`: cuts a future at any of its await points.
fn budget(max: Duration) -> Duration {
    Duration::from_micros(fastrand::u64(0..max.as_micros() as u64))
}

/// The reproduction of the orphaned-ticket defect: 300 fair waiters, each cancelled after
/// a random 0-6 ms (many while their ticket `INSERT` is in flight), behind a holder; then
/// the holder releases. Nobody waits any more, so the free key must be granted at once:
/// every ticket, also one whose statement was still running when its waiter went away, is
/// deleted by the engine, long before its 20 s lease would have let it lapse (before the
/// fix, fair `try_acquire` answered `None` on the free key for about 20 s).
pub async fn fair_cancelled_ticket_takers_leave_no_ticket<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const TICKET_LEASE: Duration = Duration::from_secs(20);
    let key = "o";
    let fair = Locker::builder(db.pool.clone())
        .table(&db.table)
        .fair(true)
        .default_lease(TICKET_LEASE)
        .build()
        .unwrap();
    let holder = db.locker.try_acquire(key, LONG).await.unwrap().unwrap();
    let mut cancelled = 0;
    for _ in 0..300 {
        let waiting = fair.acquire(key, TICKET_LEASE, Duration::from_secs(5));
        match timeout(budget(Duration::from_millis(6)), waiting).await {
            Err(_) => cancelled += 1,
            Ok(outcome) => panic!("the key is held, yet the wait ended with {outcome:?}"),
        }
    }
    assert_eq!(cancelled, 300);
    assert_eq!(fair.waiting(key), 0, "cancelled waiters left the queue");
    holder.release().await.unwrap();
    // Far below the tickets' 20 s lease: only the engine's deletes can empty the table.
    wait_until(
        "every given-up ticket is deleted",
        PATIENCE / 2,
        async || ticket_rows(&db).await == 0,
    )
    .await;
    // A waiter cut mid-statement left that statement to a background job, which may
    // still be on its way to the server (under a whole suite's load): a ticket it inserts
    // late, or a row its attempt wins now that the key is free, goes once it answers.
    // The Locker's shutdown waits for those jobs; a fresh fair Locker then finds nothing.
    fair.shutdown().await;
    assert_eq!(ticket_rows(&db).await, 0, "a ticket outlived its waiter");
    assert_eq!(db.locker.holder(key).await.unwrap(), None);
    let fair = Locker::builder(db.pool.clone())
        .table(&db.table)
        .fair(true)
        .build()
        .unwrap();
    let guard = fair
        .try_acquire(key, LONG)
        .await
        .unwrap()
        .expect("nobody waits: the free key is granted at once");
    guard.release().await.unwrap();
}

/// A cancellation storm on a fair Locker with a small pool: two thousand tasks on four
/// keys, each cut after a random budget while waiting, while holding, or while its
/// `release()` runs. Once the engine is idle (`shutdown` waits for its background work)
/// no lock row and no ticket row is left: everything a cancelled task had, or had in
/// flight, was cleaned up.
pub async fn fair_cancellation_storm_leaves_no_rows<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    const TASKS: usize = 2_000;
    const LEASE: Duration = Duration::from_secs(3);
    let pool = DB::connect(&db.location, 5).await;
    let fair = Locker::builder(pool.clone())
        .table(&db.table)
        .fair(true)
        .default_lease(LEASE)
        .build()
        .unwrap();
    // Granted, released, release cut short.
    let counts: Arc<[AtomicUsize; 3]> = Arc::default();
    let tasks = stream::iter(0..TASKS)
        .map(|n| {
            let (fair, counts) = (fair.clone(), counts.clone());
            tokio::spawn(async move {
                let key = format!("storm-{}", n % 4);
                // One task in four waits long and releases in full; the others are cut
                // anywhere, their release too, now and then.
                let patient = n % 4 == 0;
                let work = async {
                    let guard = fair.acquire(&key, LEASE, Duration::from_secs(1)).await?;
                    counts[0].fetch_add(1, Ordering::Relaxed);
                    sleep(budget(Duration::from_millis(3))).await;
                    let release_budget = match patient {
                        true => PATIENCE,
                        false => budget(Duration::from_millis(30)),
                    };
                    let cut = timeout(release_budget, guard.release()).await;
                    counts[if cut.is_ok() { 1 } else { 2 }].fetch_add(1, Ordering::Relaxed);
                    Ok::<_, Error>(())
                };
                let budget = match patient {
                    true => PATIENCE,
                    false => budget(Duration::from_millis(400)),
                };
                let _ = timeout(budget, work).await;
            })
        })
        .buffer_unordered(100)
        .collect::<Vec<_>>();
    for joined in timeout(PATIENCE * 8, tasks).await.expect("the storm ends") {
        joined.unwrap();
    }
    let [granted, released, cut] = counts.each_ref().map(|n| n.load(Ordering::Relaxed));
    assert!(
        granted > 0 && released > 0 && cut > 0,
        "the storm cut every stage: {granted} granted, {released} released, {cut} releases cut"
    );
    eprintln!(
        "{}: storm of {TASKS}: {granted} granted, {released} released, {cut} releases cut",
        DB::LABEL
    );
    fair.shutdown().await;
    assert_eq!(
        db.plain.row_count().await,
        0,
        "lock rows left after the storm: stats {:?}",
        fair.stats()
    );
    assert_eq!(
        ticket_rows(&db).await,
        0,
        "ticket rows left after the storm"
    );
    pool.close().await;
}

/// Guards held by the test in its many-guard cases.
const GUARDS: usize = 10_000;
/// The pool's size.
const POOL: u32 = 2;
/// The guards' lease and the Locker's renew interval.
const GUARD_LEASE: Duration = Duration::from_secs(6);
const INTERVAL: Duration = Duration::from_secs(2);
/// Tasks that keep the pool busy while the guards are held.
const HAMMERS: usize = 16;

/// Takes `held-0` .. `held-<n-1>` through `locker`, [`HAMMERS`] at a time: the pool is
/// busy from the start, while the first guards already need renewing.
async fn hold<DB: TestBackend>(locker: &Locker<DB>, n: usize) -> Vec<LockGuard<DB>> {
    let acquiring = stream::iter(0..n)
        .map(|i| async move {
            let key = format!("held-{i}");
            locker
                .try_acquire(&key, GUARD_LEASE)
                .await
                .unwrap_or_else(|err| panic!("try_acquire {key}: {err}"))
                .unwrap_or_else(|| panic!("{key} is free"))
        })
        .buffer_unordered(HAMMERS)
        .collect();
    timeout(PATIENCE * 12, acquiring)
        .await
        .unwrap_or_else(|_| panic!("{n} acquisitions took too long: {:?}", locker.stats()))
}

/// Ten thousand guards held through a pool of two connections, while sixteen tasks keep
/// that pool busy with acquisitions and releases of their own for three renew intervals:
/// the engine renews on its own connection, so no lease is lost and the renewal still
/// takes one statement a tick (before the fix, thousands were lost as `Unreachable`,
/// their renewal queued behind the application's statements past their deadlines).
/// Then all ten thousand are dropped at once: the engine releases them in a few batched
/// statements, and no row is left long before their lease would have ended (before, ten
/// thousand single DELETEs queued on the two connections, most of them in vain).
pub async fn ten_thousand_guards_on_a_pool_of_two<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let pool = DB::connect(&db.location, POOL).await;
    let locker = Locker::builder(pool.clone())
        .table(&db.table)
        .default_lease(GUARD_LEASE)
        .renew_interval(INTERVAL)
        .build()
        .unwrap();
    let taking = Instant::now();
    let guards = hold(&locker, GUARDS).await;
    let taken_in = taking.elapsed();
    // The leases were taken over several seconds: one interval brings their renewals into
    // step; then a quiet window gives the statements a tick without the application.
    sleep(INTERVAL).await;
    let quiet = locker.stats().renewals;
    sleep(INTERVAL * 3).await;
    let quiet = locker.stats().renewals - quiet;

    // The application keeps every pooled connection busy.
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..HAMMERS)
        .map(|n| {
            let (locker, stop) = (locker.clone(), stop.clone());
            tokio::spawn(async move {
                let mut cycles = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("hammer-{n}");
                    if let Some(guard) = locker.try_acquire(&key, LONG).await.unwrap() {
                        guard.release().await.unwrap();
                        cycles += 1;
                    }
                }
                cycles
            })
        })
        .collect();
    let before = locker.stats();
    let window = Instant::now();
    sleep(INTERVAL * 3).await;
    let after = locker.stats();
    let window = window.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut cycles = 0;
    for hammer in hammers {
        cycles += hammer.await.unwrap();
    }
    let lost: Vec<_> = guards
        .iter()
        .filter_map(|g| g.lost_reason().map(|r| (g.key().to_owned(), r)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {GUARDS} guards lost while the pool was busy ({cycles} hammer cycles), first {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        cycles > HAMMERS as u64,
        "the pool was kept busy: {cycles} cycles"
    );
    // As many statements a tick as without the application (a tick may fall on either
    // edge of a window), and every lease renewed in them.
    let renewals = after.renewals - before.renewals;
    assert!(
        renewals <= quiet + 1 && after.renewed - before.renewed >= GUARDS as u64,
        "{renewals} renewal statements in {window:?} of a busy pool, {quiet} in as many ticks \
         without it; {} leases renewed",
        after.renewed - before.renewed
    );

    let rows = db.plain.row_count().await;
    assert_eq!(rows, GUARDS as i64, "every guard's row is there");
    let before = locker.stats();
    let dropping = Instant::now();
    drop(guards);
    // The lease (6 s) would still be running: only the engine's releases can empty it.
    wait_until(
        "every dropped guard's row is gone",
        GUARD_LEASE / 2,
        async || db.plain.row_count().await == 0,
    )
    .await;
    // Counted once the statement has answered, just after its commit.
    wait_until("the releases are counted", PATIENCE, async || {
        locker.stats().released - before.released == GUARDS as u64
    })
    .await;
    let gone_in = dropping.elapsed();
    let after = locker.stats();
    let batches = after.release_batches - before.release_batches;
    assert!(
        batches <= 20,
        "{GUARDS} dropped guards took {batches} release statements"
    );
    eprintln!(
        "{}: {GUARDS} guards taken in {taken_in:?} on a pool of {POOL}; held through \
         {cycles} hammer cycles, 0 lost, {renewals} renewal statements ({quiet} quiet); \
         dropped and gone in {gone_in:?} ({batches} statements)",
        DB::LABEL
    );
    locker.shutdown().await;
    pool.close().await;
}

/// A table of the configured name that dblock did not make: `try_acquire` and `migrate`
/// say so with a typed error naming the table and the missing column, and nothing is
/// written. Two shapes: another application's table, and the seeds' three columns (which
/// every migration step accepts, so the check after migrating must catch it).
pub async fn table_of_another_shape_is_a_typed_error<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let other = format!(
        "CREATE TABLE {} (lock_key VARCHAR(128) PRIMARY KEY, holder VARCHAR(64))",
        db.table
    );
    DB::exec(&db.pool, other, vec![]).await.unwrap();
    let acquired = db.locker.try_acquire("shape", LONG).await;
    assert_mismatch(&db.table, acquired.map(drop), MISSING);
    let migrated = db.locker.migrate().await;
    assert_mismatch(&db.table, migrated.map(drop), MISSING);
    assert_eq!(db.plain.row_count().await, 0, "nothing was written");

    let drop_it = format!("DROP TABLE {}", db.table);
    DB::exec(&db.pool, drop_it, vec![]).await.unwrap();
    let seeds = format!(
        "CREATE TABLE {} (lock_key VARCHAR(128) PRIMARY KEY, lock_value VARCHAR(64) NOT NULL, \
         expire_time TIMESTAMP NOT NULL)",
        db.table
    );
    DB::exec(&db.pool, seeds, vec![]).await.unwrap();
    let migrated = db.locker.migrate().await;
    assert_mismatch(&db.table, migrated.map(drop), &MISSING[2..]);
    let acquired = db.locker.try_acquire("shape", LONG).await;
    assert_mismatch(&db.table, acquired.map(drop), &MISSING[2..]);
    assert_eq!(db.plain.row_count().await, 0, "nothing was written");
}

/// The columns dblock adds to the first one, `lock_key`; which one a database names first
/// depends on the statement.
const MISSING: &[&str] = &["lock_value", "expire_time", "fencing_token", "acquired_at"];

fn assert_mismatch(table: &str, outcome: Result<(), Error>, columns: &[&str]) {
    match outcome {
        Err(
            ref err @ Error::SchemaMismatch {
                table: ref named,
                ref column,
                ..
            },
        ) => {
            assert_eq!(named, table);
            assert!(
                columns.contains(&column.as_str()),
                "column {column:?}, expected one of {columns:?}: {err}"
            );
            let text = err.to_string();
            assert!(
                text.contains(table)
                    && text.contains(column.as_str())
                    && text.contains("LockerBuilder::table")
                    && text.contains("migrate"),
                "{text}"
            );
            // PostgreSQL's error as sqlx shows it ends in " at line N" (of the server's C
            // source), which reads like a line of SQL: not in dblock's text.
            assert!(!text.contains(" at line "), "{text}");
        }
        other => panic!("expected SchemaMismatch on a missing {columns:?}, got {other:?}"),
    }
}

/// Tickets of waiters that died (rows nobody renews, written here by plain SQL, already
/// expired) are purged by `reap_expired`, whether or not any Locker of the table has
/// waiters (before, only a fair Locker with waiters purged them, every 60 renewal
/// passes). Live tickets stay.
pub async fn reaper_purges_expired_tickets<DB: TestBackend>() {
    let Some(db) = TestDb::<DB>::open().await else {
        return;
    };
    let insert = |key: &str, secs: i64| {
        let sql = format!(
            "INSERT INTO {}_ticket (lock_key, expire_time) VALUES ({}, {})",
            db.table,
            DB::param(1),
            DB::now_plus(secs)
        );
        DB::exec(&db.pool, sql, vec![key.into()])
    };
    for n in 0..3 {
        insert(&format!("dead-{n}"), -10).await.unwrap();
    }
    insert("alive", 60).await.unwrap();
    assert_eq!(ticket_rows(&db).await, 4);
    db.locker.reap_expired().await.unwrap();
    assert_eq!(
        ticket_rows(&db).await,
        1,
        "the expired tickets were purged, the live one kept"
    );
}
