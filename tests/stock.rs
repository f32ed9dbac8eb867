//! Stock deduction, row locks, optimistic updates and fencing, on every backend.
//!
//! The cases are written once, generic over the backend, and instantiated per backend by
//! `suite!` at the bottom. Where the databases are, and when a missing one is skipped or
//! a failure (`DBLOCK_TEST_REQUIRE`), is the shared harness's business (`tests/common`).

// This binary uses part of the shared harness; the rest is for the conformance binaries.
#[allow(dead_code)]
mod common;
#[path = "../examples/stock/mod.rs"]
mod stock;

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dblock::{
    Decision, Error, LockGuard, Locker, Outcome, RetryPolicy, RowLockMode, RowLocker, SqlValue,
    Versioned,
};
use sqlx::Pool;
use tokio::sync::oneshot;

use common::{TestBackend, TestDb};
use stock::{Shop, StockDb, Strategy, Workload};

/// What a case needs of a backend: the harness's plumbing and the workload's statements.
trait Db: TestBackend + StockDb {}
impl<DB: TestBackend + StockDb> Db for DB {}

/// One test's tables: the harness's fresh lock table and, next to it, a product table
/// `<lock table>_stock` with products 1 and 2 of 10 units each.
struct Fixture<DB: Db> {
    shop: Shop<DB>,
    rows: RowLocker<DB>,
    /// On the harness's lock table, with short retry sleeps and no renewal (a lease
    /// that is meant to run out must not be renewed).
    locker: Locker<DB>,
    pool: Pool<DB>,
    products: String,
    // Fields drop in order: the product tables go before the harness drops the rest.
    _segments_table: DropTable<DB>,
    _products_table: DropTable<DB>,
    _db: TestDb<DB>,
}

async fn fixture<DB: Db>() -> Option<Fixture<DB>>
where
    i64: SqlValue<DB>,
{
    let db = TestDb::<DB>::open().await?;
    let products = format!("{}_stock", db.table);
    let drop_table = |table: String| DropTable {
        location: db.location.clone(),
        table,
        backend: PhantomData,
    };
    let drop_segments = drop_table(format!("{products}_segment"));
    let drop_products = drop_table(products.clone());
    let locker = Locker::builder(db.pool.clone())
        .table(&db.table)
        .retry(stock::RETRY)
        .auto_renew(false)
        .build()
        .unwrap();
    let shop = Shop::open(locker.clone(), &products).await.unwrap();
    shop.restock(2, 10).await.unwrap();
    Some(Fixture {
        rows: RowLocker::new(db.pool.clone(), &products, "id").unwrap(),
        pool: db.pool.clone(),
        shop,
        locker,
        products,
        _segments_table: drop_segments,
        _products_table: drop_products,
        _db: db,
    })
}

/// Drops a table when the test ends, also after a failed assertion, on a thread and
/// runtime of its own (the test's runtime may be unwinding), as the harness does.
struct DropTable<DB: Db> {
    location: String,
    table: String,
    backend: PhantomData<DB>,
}

impl<DB: Db> Drop for DropTable<DB> {
    fn drop(&mut self) {
        let (location, table) = (self.location.clone(), self.table.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for cleanup");
            runtime.block_on(async {
                let pool = DB::connect(&location, 1).await;
                let sql = format!("DROP TABLE IF EXISTS {table}");
                if let Err(err) = DB::exec(&pool, sql, vec![]).await {
                    eprintln!("cleanup of {table} failed: {err}");
                }
                pool.close().await;
            });
        });
        let _ = dropped.join();
    }
}

/// More orders than stock: every product sells out.
const SCARCE: Workload = Workload {
    workers: 6,
    orders: 120,
    products: 2,
    stock: 40,
    quantity: 1,
    // Enough that no order is given up on contention: the counts below are exact.
    max_attempts: 100_000,
};
/// Fewer orders than stock: every order is accepted.
const PLENTY: Workload = Workload {
    orders: 60,
    ..SCARCE
};

// ---- stock deduction -------------------------------------------------------------------

async fn keeps_the_books<DB: Db>(strategy: Strategy)
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    for workload in [SCARCE, PLENTY] {
        let report = fx.shop.run(strategy, workload, &|| {}).await.unwrap();
        assert_eq!(report.violations(), Vec::<String>::new(), "{report:?}");
        assert_eq!(report.gave_up, 0, "{report:?}");
        for product in 1..=workload.products {
            // One unit per order: exactly min(orders, stock) orders can be served.
            let expected = workload.orders_for(product).min(workload.stock as usize) as u64;
            assert_eq!(report.accepted[product - 1], expected, "{report:?}");
            assert_eq!(
                report.final_stock[product - 1],
                workload.stock - expected as i64,
                "{report:?}"
            );
        }
        let served = report.accepted_orders() + report.rejected;
        assert_eq!(served, workload.orders as u64, "{report:?}");
    }
}

async fn lock_table_keeps_the_books<DB: Db>()
where
    i64: SqlValue<DB>,
{
    keeps_the_books::<DB>(Strategy::LockTable).await;
}

async fn segmented_keeps_the_books<DB: Db>()
where
    i64: SqlValue<DB>,
{
    keeps_the_books::<DB>(Strategy::Segmented).await;
}

/// An order is refused only when the segments together cannot serve it. First orders
/// larger than any one segment: 10 units over 8 segments (2, 2, 1, 1, 1, 1, 1, 1), 3 an
/// order, six workers: no segment covers an order alone, so each takes every segment's
/// lease; exactly three are served (9 units) and 1 unit is left. Then 13 units (2 x 5,
/// 1 x 3), 2 an order: the 2s serve orders alone, the 1s only together; six served, 1 left.
/// A strategy that refused an order its picked segment could not cover would serve fewer.
async fn segmented_sells_what_no_single_segment_holds<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    assert_eq!(fx.shop.segment_count(), stock::segmented::SEGMENTS);
    let across = Workload {
        workers: 6,
        orders: 12,
        products: 1,
        stock: 10,
        quantity: 3,
        max_attempts: 1,
    };
    let uneven = Workload {
        orders: 30,
        stock: 13,
        quantity: 2,
        ..across
    };
    for workload in [across, uneven] {
        let report = fx
            .shop
            .run(Strategy::Segmented, workload, &|| {})
            .await
            .unwrap();
        assert_eq!(report.violations(), Vec::<String>::new(), "{report:?}");
        assert_eq!(report.gave_up, 0, "{report:?}");
        let served = (workload.stock / workload.quantity) as u64;
        assert_eq!(report.accepted, vec![served], "{report:?}");
        assert_eq!(
            report.final_stock,
            vec![workload.stock % workload.quantity],
            "{report:?}"
        );
        assert_eq!(
            report.rejected,
            workload.orders as u64 - served,
            "{report:?}"
        );
    }
}

async fn for_update_keeps_the_books<DB: Db>()
where
    i64: SqlValue<DB>,
{
    keeps_the_books::<DB>(Strategy::ForUpdate).await;
}

async fn optimistic_keeps_the_books<DB: Db>()
where
    i64: SqlValue<DB>,
{
    keeps_the_books::<DB>(Strategy::Optimistic).await;
}

async fn atomic_keeps_the_books<DB: Db>()
where
    i64: SqlValue<DB>,
{
    keeps_the_books::<DB>(Strategy::Atomic).await;
}

/// Runs without protection: it may oversell, and that is the point; only that it runs
/// to the end is checked.
async fn unprotected_runs<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let report = fx.shop.run(Strategy::None, SCARCE, &|| {}).await.unwrap();
    println!(
        "none: accepted {} oversold {} lost {}",
        report.accepted_orders(),
        report.oversold(),
        report.lost()
    );
}

// ---- row locks ---------------------------------------------------------------------------

fn is_sqlite<DB: sqlx::Database>() -> bool {
    DB::NAME == "SQLite"
}

/// Holds row 1 locked in one transaction while `contend` runs; the holder lets go only
/// when `contend` has finished, signalled over channels (no sleeps).
async fn while_row_1_is_held<DB, T>(rows: &RowLocker<DB>, contend: impl AsyncFnOnce() -> T) -> T
where
    DB: Db,
    i64: SqlValue<DB>,
{
    let (locked_tx, locked_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let holder = rows.lock(&[1_i64], RowLockMode::Wait, async move |_tx, keys| {
        locked_tx.send(keys).expect("the contender waits");
        release_rx.await.expect("the contender signals");
        Ok::<_, Error>(())
    });
    let contender = async move {
        assert_eq!(locked_rx.await.expect("the holder locked row 1"), vec![1]);
        let outcome = contend().await;
        release_tx.send(()).expect("the holder waits");
        outcome
    };
    let (held, outcome) = tokio::join!(holder, contender);
    held.unwrap();
    outcome
}

async fn try_lock<DB: Db>(
    rows: &RowLocker<DB>,
    keys: &[i64],
    mode: RowLockMode,
) -> Result<Vec<i64>, Error>
where
    i64: SqlValue<DB>,
{
    rows.lock(keys, mode, async |_tx, locked| Ok(locked)).await
}

async fn nowait_answers_row_locked<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let rows = &fx.rows;
    let (busy, free) = while_row_1_is_held(rows, async || {
        let busy = try_lock(rows, &[1], RowLockMode::NoWait).await;
        let free = try_lock(rows, &[2], RowLockMode::NoWait).await;
        (busy, free)
    })
    .await;
    assert!(matches!(busy, Err(Error::RowLocked(_))), "{busy:?}");
    if is_sqlite::<DB>() {
        // One write lock for the whole database: row 2 is just as busy.
        assert!(matches!(free, Err(Error::RowLocked(_))), "{free:?}");
    } else {
        assert_eq!(free.unwrap(), vec![2]);
    }
    // Once the holder committed, the row is free again.
    assert_eq!(
        try_lock(rows, &[1], RowLockMode::NoWait).await.unwrap(),
        vec![1]
    );
}

async fn skip_locked_leaves_held_rows_out<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let rows = &fx.rows;
    let got = while_row_1_is_held(rows, async || {
        try_lock(rows, &[1, 2, 3], RowLockMode::SkipLocked).await
    })
    .await;
    if is_sqlite::<DB>() {
        assert!(matches!(got, Err(Error::RowLocked(_))), "{got:?}");
    } else {
        // Row 1 is held, row 3 does not exist.
        assert_eq!(got.unwrap(), vec![2]);
    }
}

async fn timeout_answers_row_locked<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let rows = &fx.rows;
    let got = while_row_1_is_held(rows, async || {
        try_lock(rows, &[1], RowLockMode::Timeout(Duration::from_millis(200))).await
    })
    .await;
    assert!(matches!(got, Err(Error::RowLocked(_))), "{got:?}");
    let free = rows
        .lock(&[2_i64], RowLockMode::Timeout(Duration::from_millis(200)), async |tx, locked| {
            if DB::NAME == "PostgreSQL" {
                // The timeout was for taking the locks; the rest of the work runs without.
                let sql = "SELECT CAST(CASE WHEN current_setting('lock_timeout') = '0' THEN 1 ELSE 0 END AS BIGINT)";
                assert_eq!(<DB as StockDb>::fetch_i64(tx, sql, &[]).await?, Some(1));
            }
            Ok::<_, Error>(locked)
        })
        .await;
    assert_eq!(free.unwrap(), vec![2]);
    let out_of_range = try_lock(rows, &[2], RowLockMode::Timeout(Duration::ZERO)).await;
    assert!(
        matches!(out_of_range, Err(Error::InvalidDuration { .. })),
        "{out_of_range:?}"
    );
}

#[derive(Debug)]
enum Failure {
    Refused,
    Lock(Error),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure::Lock(err)
    }
}

async fn set_stock<DB: StockDb>(conn: &mut DB::Connection, table: &str, stock: i64) {
    let sql = DB::sql(&format!("UPDATE {table} SET stock = ? WHERE id = 1"));
    assert_eq!(DB::execute(conn, &sql, &[stock]).await.unwrap(), 1);
}

async fn work_error_rolls_back<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let (shop, rows, table) = (&fx.shop, &fx.rows, fx.products.as_str());
    let refused = rows
        .lock(&[1_i64], RowLockMode::Wait, async |tx, _keys| {
            set_stock::<DB>(tx, table, 0).await;
            Err::<(), _>(Failure::Refused)
        })
        .await;
    assert!(matches!(refused, Err(Failure::Refused)), "{refused:?}");
    assert_eq!(shop.stock(1).await.unwrap(), 10, "an Err must roll back");

    let done = rows
        .lock(&[1_i64], RowLockMode::Wait, async |tx, _keys| {
            set_stock::<DB>(tx, table, 7).await;
            Ok::<_, Failure>(())
        })
        .await;
    match done {
        Ok(()) => {}
        Err(Failure::Lock(err)) => panic!("the lock failed: {err}"),
        Err(Failure::Refused) => panic!("the work did not refuse"),
    }
    assert_eq!(shop.stock(1).await.unwrap(), 7, "an Ok must commit");
}

async fn dropped_work_rolls_back<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let (shop, rows, table) = (&fx.shop, &fx.rows, fx.products.as_str());
    let (written_tx, written_rx) = oneshot::channel();
    let mut work = Box::pin(
        rows.lock(&[1_i64], RowLockMode::Wait, async move |tx, _keys| {
            set_stock::<DB>(tx, table, 0).await;
            written_tx.send(()).expect("the test waits");
            std::future::pending::<()>().await;
            Ok::<_, Error>(())
        }),
    );
    tokio::select! {
        _ = &mut work => panic!("the work never returns"),
        _ = written_rx => {}
    }
    drop(work);
    assert_eq!(
        shop.stock(1).await.unwrap(),
        10,
        "a dropped lock must not commit"
    );
    // The row lock went with the transaction: it can be taken again (bounded, not timed).
    let again = try_lock(rows, &[1], RowLockMode::Timeout(Duration::from_secs(30))).await;
    assert_eq!(again.unwrap(), vec![1]);
}

// ---- optimistic updates ------------------------------------------------------------------

async fn version_of<DB: StockDb>(pool: &Pool<DB>, table: &str) -> i64 {
    let sql = DB::sql(&format!("SELECT version FROM {table} WHERE id = 1"));
    let mut conn = pool.acquire().await.unwrap();
    DB::fetch_i64(&mut conn, &sql, &[]).await.unwrap().unwrap()
}

/// Another writer's update of row 1, as the version protocol asks: version + 1.
async fn bump_version<DB: StockDb>(pool: &Pool<DB>, table: &str) {
    let sql = DB::sql(&format!(
        "UPDATE {table} SET version = version + 1 WHERE id = 1"
    ));
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(DB::execute(&mut conn, &sql, &[]).await.unwrap(), 1);
}

fn versioned<DB: StockDb>(pool: &Pool<DB>, table: &str, max_attempts: u32) -> Versioned<DB> {
    let quick = RetryPolicy {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(2),
    };
    Versioned::builder(pool.clone(), table, "stock")
        .max_attempts(max_attempts)
        .retry(quick)
        .build()
        .unwrap()
}

async fn optimistic_retries_after_a_conflict<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let (shop, pool, table) = (&fx.shop, &fx.pool, fx.products.as_str());
    let calls = AtomicU32::new(0);
    let outcome = versioned(pool, table, 5)
        .update(&1_i64, async |stock: i64| {
            // The first decision is overtaken by another writer before its write lands.
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                bump_version(pool, table).await;
            }
            Decision::<i64, ()>::Write(stock - 1)
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Written {
            value: 9,
            version: 2,
            attempts: 2
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(shop.stock(1).await.unwrap(), 9);
    assert_eq!(version_of(pool, table).await, 2);
}

async fn optimistic_gives_up_with_version_conflict<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let (shop, pool, table) = (&fx.shop, &fx.pool, fx.products.as_str());
    let calls = AtomicU32::new(0);
    let outcome = versioned(pool, table, 3)
        .update(&1_i64, async |stock: i64| {
            calls.fetch_add(1, Ordering::SeqCst);
            bump_version(pool, table).await;
            Decision::<i64, ()>::Write(stock - 1)
        })
        .await;
    match outcome {
        Err(Error::VersionConflict { table: t, attempts }) => {
            assert_eq!((t.as_str(), attempts), (table, 3));
        }
        other => panic!("expected a version conflict, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(shop.stock(1).await.unwrap(), 10, "no write may land");
    assert_eq!(version_of(pool, table).await, 3, "only the three bumps");
}

async fn optimistic_refusal_is_the_callers_outcome<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let (shop, pool, table) = (&fx.shop, &fx.pool, fx.products.as_str());
    let helper = versioned(pool, table, 3);
    let outcome = helper
        .update(&1_i64, async |stock: i64| {
            if stock >= 11 {
                Decision::Write(stock - 11)
            } else {
                Decision::Refuse(format!("only {stock} left"))
            }
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Refused {
            reason: "only 10 left".to_owned(),
            attempts: 1
        }
    );
    assert_eq!(shop.stock(1).await.unwrap(), 10);
    assert_eq!(version_of(pool, table).await, 0);

    let missing = helper
        .update(&99_i64, async |stock: i64| {
            Decision::<i64, ()>::Write(stock)
        })
        .await;
    assert!(
        matches!(missing, Err(Error::Database(sqlx::Error::RowNotFound))),
        "{missing:?}"
    );
}

// ---- fencing -----------------------------------------------------------------------------

/// Writes `stock` to product 1 in a transaction fenced by `guard`: write, check, commit.
/// The check comes after the write on purpose, to show the write is undone.
async fn fenced_write<DB: StockDb>(
    pool: &Pool<DB>,
    table: &str,
    guard: &LockGuard<DB>,
    stock: i64,
) -> Result<(), Error> {
    let mut tx = pool.begin().await?;
    set_stock::<DB>(&mut tx, table, stock).await;
    guard.assert_held(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

async fn assert_held_refuses_a_stale_token<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(fx) = fixture::<DB>().await else {
        return;
    };
    let (shop, pool, table) = (&fx.shop, &fx.pool, fx.products.as_str());
    let locker = &fx.locker;
    let key = "product:1";
    let old = locker
        .try_acquire(key, Duration::from_millis(50))
        .await
        .unwrap()
        .expect("the key is free");
    // Waits until the database clock says the old lease is over, then takes over.
    let new = locker
        .acquire(key, Duration::from_secs(60), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(new.fencing_token() > old.fencing_token());

    let stale = fenced_write(pool, table, &old, 0).await;
    match stale {
        Err(Error::NotHeld { key: k, owner }) => {
            assert_eq!((k.as_str(), owner.as_str()), (key, old.owner()));
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert_eq!(
        shop.stock(1).await.unwrap(),
        10,
        "the stale write must not commit"
    );

    fenced_write(pool, table, &new, 7).await.unwrap();
    assert_eq!(
        shop.stock(1).await.unwrap(),
        7,
        "the holder's write commits"
    );
    new.release().await.unwrap();
}

// ---- backends ----------------------------------------------------------------------------

/// One module per backend, one `#[tokio::test]` per case.
macro_rules! backend {
    ($backend:ident, $db:ty, [$($case:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case::<$db>().await;
                }
            )*
        }
    };
}

/// Every case on every backend.
/// The example cleans up after itself: `Shop::remove` drops the product table, the lock
/// table and every companion the migration made (history, fencing sequence or counter
/// table, triggers), so nothing with the tables' prefix is left in the database.
async fn shop_removes_what_it_created<DB: Db>()
where
    i64: SqlValue<DB>,
{
    let Some(db) = TestDb::<DB>::open_unmigrated().await else {
        return;
    };
    let prefix = db.table.clone();
    let locker = Locker::builder(db.pool.clone())
        .table(format!("{prefix}_lock"))
        .build()
        .unwrap();
    let shop = Shop::open(locker, &format!("{prefix}_goods"))
        .await
        .unwrap();
    shop.restock(1, 5).await.unwrap();
    let catalog = match DB::LABEL {
        "postgres" => format!("SELECT count(*) FROM pg_class WHERE relname LIKE '{prefix}%'"),
        "mysql" => format!(
            "SELECT (SELECT count(*) FROM information_schema.tables \
                      WHERE table_schema = DATABASE() AND table_name LIKE '{prefix}%') \
                  + (SELECT count(*) FROM information_schema.triggers \
                      WHERE trigger_schema = DATABASE() AND trigger_name LIKE '{prefix}%')"
        ),
        _ => format!("SELECT count(*) FROM sqlite_master WHERE name LIKE '{prefix}%'"),
    };
    let count = async || {
        <DB as TestBackend>::fetch_i64(&db.pool, catalog.clone(), vec![])
            .await
            .unwrap()
    };
    assert!(count().await.unwrap_or(0) >= 3, "the shop made its tables");
    shop.remove().await.unwrap();
    assert_eq!(count().await, Some(0), "left behind after remove()");
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        backend!(postgres, sqlx::Postgres, [$($case),*]);
        backend!(mysql, sqlx::MySql, [$($case),*]);
        backend!(sqlite, sqlx::Sqlite, [$($case),*]);
    };
}

suite!(
    lock_table_keeps_the_books,
    segmented_keeps_the_books,
    segmented_sells_what_no_single_segment_holds,
    for_update_keeps_the_books,
    optimistic_keeps_the_books,
    atomic_keeps_the_books,
    unprotected_runs,
    nowait_answers_row_locked,
    skip_locked_leaves_held_rows_out,
    timeout_answers_row_locked,
    work_error_rolls_back,
    dropped_work_rolls_back,
    optimistic_retries_after_a_conflict,
    optimistic_gives_up_with_version_conflict,
    optimistic_refusal_is_the_callers_outcome,
    assert_held_refuses_a_stale_token,
    shop_removes_what_it_created,
);
