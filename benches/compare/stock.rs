//! Section 4: stock deduction, each strategy of the stock example (`examples/stock`),
//! dblock's helper against the same SQL by hand.
//!
//! The helper side is the example's own `Shop::run`, strategies untouched: lock-table (a
//! dblock lease plus `assert_held` in the write transaction), for-update (`RowLocker`),
//! optimistic (`Versioned`). The hand-written side sends the statements those helpers
//! send, with the same retry policy and lock wait, from the same worker shape (the
//! workers as futures joined in one task, pulling order numbers from one counter). The
//! example's `atomic` and `none` strategies are plain SQL already, with no helper: they
//! run once per round, as the floor and as what no protection gives.
//!
//! One hot product (the case these strategies exist for), 8 workers, one unit per order
//! and enough stock that no order is refused, so every order does the full work. Each run
//! places a fixed number of orders, sized from a warm-up so it lasts about one round.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{Locker, SqlValue};
use sqlx::{AssertSqlSafe, MySql, Pool, Postgres};
use tokio::time::Instant;

use crate::handwritten::{HandLock, check_fence_sql, new_owner};
use crate::measure::{BoxError, median, spread, turn_order};
use crate::report::{Table, count, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;
use crate::stock_example::{RETRY, Shop, StockDb, Strategy, Workload};

const PRODUCTS: &str = "bench_stock_product";
const LOCK_TABLE: &str = "bench_stock_product_lock";
const WORKERS: usize = 8;
/// The example's own lock wait (`LOCK_WAIT` in examples/stock/mod.rs).
const LOCK_WAIT: Duration = Duration::from_secs(60);
/// The example's default for the optimistic strategy.
const MAX_ATTEMPTS: u32 = 1000;
const WARM_UP_ORDERS: usize = 100;

/// What the hand-written strategies need beyond the example's `StockDb`: the two reads
/// that bind or return more than one `i64`.
pub trait HandStock: BenchDb + StockDb {
    const IS_POSTGRES: bool;

    /// dblock's fencing check inside `conn`'s transaction: `true` if still held.
    fn fenced(
        conn: &mut Self::Connection,
        sql: &str,
        key: &str,
        owner: &str,
        token: i64,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// `(value, version)` of one row, through the pool.
    fn read_version_pair(
        pool: &Pool<Self>,
        sql: &str,
        id: i64,
    ) -> impl Future<Output = sqlx::Result<Option<(i64, i64)>>> + Send;
}

macro_rules! hand_stock {
    ($db:ty, $postgres:expr) => {
        impl HandStock for $db {
            const IS_POSTGRES: bool = $postgres;

            async fn fenced(
                conn: &mut Self::Connection,
                sql: &str,
                key: &str,
                owner: &str,
                token: i64,
            ) -> sqlx::Result<bool> {
                let found: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
                    .bind(key)
                    .bind(owner)
                    .bind(token)
                    .fetch_optional(conn)
                    .await?;
                Ok(found.is_some())
            }

            async fn read_version_pair(
                pool: &Pool<Self>,
                sql: &str,
                id: i64,
            ) -> sqlx::Result<Option<(i64, i64)>> {
                sqlx::query_as(AssertSqlSafe(sql.to_owned()))
                    .bind(id)
                    .fetch_optional(pool)
                    .await
            }
        }
    };
}
hand_stock!(Postgres, true);
hand_stock!(MySql, false);

/// How one hand-written order ended.
enum Placed {
    Accepted,
    Rejected,
    GaveUp,
}

/// The strategies written by hand, on the example's tables.
struct Hand<DB: HandStock> {
    pool: Pool<DB>,
    /// dblock's own lock statements on the example's lock table.
    lock: Arc<dyn HandLock>,
    fence: String,
    read: String,
    write: String,
    lock_row: String,
    read_versioned: String,
    write_versioned: String,
}

impl<DB: HandStock> Hand<DB> {
    fn new(pool: Pool<DB>) -> Self {
        Hand {
            lock: DB::hand(&pool, LOCK_TABLE),
            fence: check_fence_sql(DB::IS_POSTGRES, LOCK_TABLE),
            // The example's read-modify-write (Shop::read_modify_write).
            read: DB::sql(&format!("SELECT stock FROM {PRODUCTS} WHERE id = ?")),
            write: DB::sql(&format!("UPDATE {PRODUCTS} SET stock = ? WHERE id = ?")),
            // RowLocker's statement for one key in RowLockMode::Wait (src/dialect/portable.rs).
            lock_row: DB::sql(&format!(
                "SELECT id FROM {PRODUCTS} WHERE id IN (?) ORDER BY id FOR UPDATE"
            )),
            // Versioned's read and write (src/dialect/portable.rs).
            read_versioned: DB::sql(&format!(
                "SELECT stock, version FROM {PRODUCTS} WHERE id = ?"
            )),
            write_versioned: DB::sql(&format!(
                "UPDATE {PRODUCTS} SET stock = ?, version = version + 1 WHERE id = ? AND version = ?"
            )),
            pool,
        }
    }

    async fn read_modify_write(
        &self,
        conn: &mut DB::Connection,
        product: i64,
        quantity: i64,
    ) -> Result<Placed, BoxError> {
        let stock = DB::fetch_i64(conn, &self.read, &[product])
            .await?
            .ok_or("no product row")?;
        if stock < quantity {
            return Ok(Placed::Rejected);
        }
        DB::execute(conn, &self.write, &[stock - quantity, product]).await?;
        Ok(Placed::Accepted)
    }

    async fn place(
        &self,
        strategy: Strategy,
        product: i64,
        quantity: i64,
    ) -> Result<Placed, BoxError> {
        match strategy {
            Strategy::LockTable => self.lock_table(product, quantity).await,
            Strategy::ForUpdate => {
                let mut tx = self.pool.begin().await?;
                DB::fetch_i64(&mut tx, &self.lock_row, &[product]).await?;
                let placed = self.read_modify_write(&mut tx, product, quantity).await?;
                tx.commit().await?;
                Ok(placed)
            }
            Strategy::Optimistic => {
                let mut delays = RETRY.delays();
                for attempt in 1..=MAX_ATTEMPTS {
                    if attempt > 1 {
                        tokio::time::sleep(delays.next().unwrap_or_default()).await;
                    }
                    let (stock, version) =
                        DB::read_version_pair(&self.pool, &self.read_versioned, product)
                            .await?
                            .ok_or("no product row")?;
                    if stock < quantity {
                        return Ok(Placed::Rejected);
                    }
                    let mut conn = self.pool.acquire().await?;
                    let binds = [stock - quantity, product, version];
                    if DB::execute(&mut conn, &self.write_versioned, &binds).await? == 1 {
                        return Ok(Placed::Accepted);
                    }
                }
                Ok(Placed::GaveUp)
            }
            Strategy::None | Strategy::Atomic | Strategy::Segmented => {
                unreachable!("not measured against a hand-written twin")
            }
        }
    }

    /// A lease by hand (dblock's upsert, retried with the example's policy until its lock
    /// wait), the fencing check in the write transaction, then the owner-checked delete.
    async fn lock_table(&self, product: i64, quantity: i64) -> Result<Placed, BoxError> {
        let key = format!("{PRODUCTS}:{product}");
        let owner = new_owner();
        let deadline = Instant::now() + LOCK_WAIT;
        let mut delays = RETRY.delays();
        let token = loop {
            match self.lock.acquire(&key, &owner).await {
                Ok(Some(token)) => break token,
                Ok(None) => {}
                Err(err) if self.lock.lost_race(&err) => {}
                Err(err) => return Err(err.into()),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Placed::GaveUp);
            }
            let pause = delays.next().unwrap_or_default().min(deadline - now);
            tokio::time::sleep(pause).await;
        };
        let sold = async {
            let mut tx = self.pool.begin().await?;
            if !DB::fenced(&mut tx, &self.fence, &key, &owner, token).await? {
                return Err::<Placed, BoxError>("the lease was no longer held".into());
            }
            let placed = self.read_modify_write(&mut tx, product, quantity).await?;
            tx.commit().await?;
            Ok(placed)
        }
        .await;
        self.lock.release(&key, &owner, token).await?;
        sold
    }

    /// Places `workload.orders` orders with `strategy`, as `Shop::run` does (restock
    /// first, then the workers); returns orders per second and what is wrong with the
    /// books.
    async fn run(
        &self,
        shop: &Shop<DB>,
        strategy: Strategy,
        workload: Workload,
    ) -> Result<(f64, Vec<String>), BoxError>
    where
        i64: SqlValue<DB>,
    {
        shop.restock(workload.products, workload.stock).await?;
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        let worker = async || -> Result<u64, BoxError> {
            let mut accepted = 0;
            while next.fetch_add(1, Ordering::Relaxed) < workload.orders {
                if let Placed::Accepted = self.place(strategy, 1, workload.quantity).await? {
                    accepted += 1;
                }
            }
            Ok(accepted)
        };
        let sold: u64 = futures::future::try_join_all((0..workload.workers).map(|_| worker()))
            .await?
            .into_iter()
            .sum();
        let elapsed = started.elapsed();
        let left = shop.stock(1).await?;
        let sold = i64::try_from(sold)? * workload.quantity;
        let mut violations = Vec::new();
        if sold + left != workload.stock {
            violations.push(format!(
                "sold {sold} + left {left} != initial {}",
                workload.stock
            ));
        }
        Ok((workload.orders as f64 / elapsed.as_secs_f64(), violations))
    }
}

/// One side of one strategy in the rounds.
#[derive(Clone, Copy)]
enum Side {
    Helper(Strategy),
    Hand(Strategy),
}

#[derive(Default)]
struct Runs {
    rates: Vec<f64>,
    problems: Vec<String>,
}

/// Runs section 4 on one server; returns its markdown.
pub async fn section<DB: HandStock>(settings: &Settings, server: &Server<DB>) -> String
where
    i64: SqlValue<DB>,
{
    match run(settings, server).await {
        Ok(md) => md,
        Err(e) => format!("### {}\n\nNot measured: {e}\n\n", server.label),
    }
}

async fn run<DB: HandStock>(settings: &Settings, server: &Server<DB>) -> Result<String, BoxError>
where
    i64: SqlValue<DB>,
{
    // The example's pool size: a worker may hold a lease attempt and a transaction at once.
    let pool = DB::dedicated_pool(&server.url, 2 * WORKERS as u32 + 2).await?;
    DB::drop_lock_table(&server.pool, LOCK_TABLE).await?;
    DB::drop_table(&server.pool, PRODUCTS).await?;
    // The lock as the example builds it (examples/stock_deduction.rs).
    let locker = Locker::builder(pool.clone())
        .table(LOCK_TABLE)
        .retry(RETRY)
        .build()?;
    let shop = Shop::open(locker, PRODUCTS).await?;
    let hand = Hand::new(pool.clone());

    let mut sides = Vec::new();
    for strategy in [
        Strategy::LockTable,
        Strategy::ForUpdate,
        Strategy::Optimistic,
    ] {
        sides.push(Side::Helper(strategy));
        sides.push(Side::Hand(strategy));
    }
    sides.push(Side::Hand(Strategy::Atomic));
    sides.push(Side::Hand(Strategy::None));
    // The seeds' segmented lock (the example's `segmented`): reported against the single
    // hot lock (lock-table's helper side); it has no hand-written twin.
    sides.push(Side::Helper(Strategy::Segmented));

    let workload = |orders: usize| Workload {
        workers: WORKERS,
        orders,
        products: 1,
        stock: i64::try_from(orders).unwrap_or(i64::MAX),
        quantity: 1,
        max_attempts: MAX_ATTEMPTS,
    };
    let place = async |side: Side, orders: usize| -> Result<(f64, Vec<String>), BoxError> {
        match side {
            Side::Helper(strategy) | Side::Hand(strategy @ (Strategy::Atomic | Strategy::None)) => {
                let report = shop.run(strategy, workload(orders), &|| {}).await?;
                Ok((report.rate(), report.violations()))
            }
            Side::Hand(strategy) => hand.run(&shop, strategy, workload(orders)).await,
        }
    };

    // Orders per run: what each side placed in one round's time in a warm-up (after a
    // first one that only warms connections and caches); the two sides of a strategy
    // place the same number, from the mean of their rates.
    let mut rates = Vec::new();
    for &side in &sides {
        place(side, WARM_UP_ORDERS / 2).await?;
        rates.push(place(side, WARM_UP_ORDERS).await?.0);
    }
    for i in (0..6).step_by(2) {
        let mean = (rates[i] + rates[i + 1]) / 2.0;
        (rates[i], rates[i + 1]) = (mean, mean);
    }
    let orders: Vec<usize> = rates
        .iter()
        .map(|rate| ((rate * settings.round.as_secs_f64()) as usize).clamp(WARM_UP_ORDERS, 50_000))
        .collect();

    let mut runs: Vec<Runs> = (0..sides.len()).map(|_| Runs::default()).collect();
    for r in 0..settings.rounds {
        eprintln!(
            "stock: {}, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        for i in turn_order(sides.len(), r) {
            match place(sides[i], orders[i]).await {
                Ok((rate, violations)) => {
                    runs[i].rates.push(rate);
                    runs[i].problems.extend(violations);
                }
                Err(err) => runs[i].problems.push(format!("error: {err}")),
            }
        }
    }
    pool.close().await;
    DB::drop_lock_table(&server.pool, LOCK_TABLE).await?;
    DB::drop_table(&server.pool, PRODUCTS).await?;

    Ok(markdown(&server.label, &runs, &orders))
}

fn markdown(label: &str, runs: &[Runs], orders: &[usize]) -> String {
    let books = |r: &Runs| match r.problems.first() {
        None => "ok".to_owned(),
        Some(p) => format!("{} problem(s), first: {p}", r.problems.len()),
    };
    let mut table = Table::new(&[
        "strategy",
        "orders per run",
        "helper orders/s",
        "hand-written orders/s",
        "helper / hand-written",
        "books (helper; hand-written)",
    ])
    .words(5);
    let mut targets = Vec::new();
    for (i, (name, helper)) in [
        ("lock-table: dblock lease + assert_held", "Locker"),
        ("for-update: SELECT .. FOR UPDATE", "RowLocker"),
        ("optimistic: version column", "Versioned"),
    ]
    .into_iter()
    .enumerate()
    {
        let (h, s) = (&runs[2 * i], &runs[2 * i + 1]);
        let per_round: Vec<f64> = h.rates.iter().zip(&s.rates).map(|(a, b)| a / b).collect();
        let m = median(per_round.iter().copied());
        table.row(vec![
            name.to_owned(),
            count(orders[2 * i] as f64),
            count(median(h.rates.iter().copied())),
            count(median(s.rates.iter().copied())),
            ratio(m, spread(per_round)),
            format!("{}; {}", books(h), books(s)),
        ]);
        targets.push(format!(
            "- {helper} / hand-written = {m:.2}x -> {}",
            verdict(m >= 0.9)
        ));
    }
    for (i, name, expected) in [
        (6, "atomic: one conditional UPDATE (no helper)", ""),
        (
            7,
            "none: read, then write, unprotected (no helper)",
            " (expected: lost updates)",
        ),
    ] {
        table.row(vec![
            name.to_owned(),
            count(orders[i] as f64),
            "-".to_owned(),
            count(median(runs[i].rates.iter().copied())),
            "-".to_owned(),
            format!("-; {}{expected}", books(&runs[i])),
        ]);
    }
    let (segmented, single) = (&runs[8], &runs[0]);
    let per_round: Vec<f64> = (segmented.rates.iter())
        .zip(&single.rates)
        .map(|(a, b)| a / b)
        .collect();
    let versus_single = ratio(median(per_round.iter().copied()), spread(per_round));
    table.row(vec![
        "segmented: 8 segment rows, a lease each (no hand-written twin)".to_owned(),
        count(orders[8] as f64),
        count(median(segmented.rates.iter().copied())),
        "-".to_owned(),
        format!("{versus_single} of lock-table"),
        format!("{}; -", books(segmented)),
    ]);
    let mut out = format!("### {label}\n\n{}", table.render());
    out.push_str("\nTarget: helper >= 0.9x the same strategy by hand.\n\n");
    for t in targets {
        let _ = writeln!(out, "{t}");
    }
    let _ = writeln!(
        out,
        "- segmented / the single hot lock (lock-table, helper side) = {versus_single} (report)"
    );
    out.push('\n');
    out
}
