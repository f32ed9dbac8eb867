//! The stock-deduction workload: W workers place O one-product orders against P products
//! of S units each, with one of six strategies. Shared by `examples/stock_deduction.rs`
//! and `tests/stock.rs`, so the strategies the example shows are the ones the tests check.

// Each includer uses a different part of this module.
#![allow(dead_code)]

pub mod segmented;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dblock::{
    Backend, Decision, Error, LockGuard, Locker, Outcome, RetryPolicy, RowLockMode, RowLocker,
    SqlValue, Versioned,
};
use sqlx::Pool;

/// How an order is protected against the other workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Read, check, write back: no protection at all. Oversells; shown, never asserted.
    None,
    /// A dblock lease on the product around the read-modify-write, fenced with
    /// `assert_held` inside the write transaction.
    LockTable,
    /// The product's stock split over segment rows, each deducted under a dblock lease of
    /// its own (分段锁, a segmented lock): orders for one product spread over several
    /// keys instead of queueing for one. See `segmented.rs`.
    Segmented,
    /// `SELECT .. FOR UPDATE` through [`RowLocker`].
    ForUpdate,
    /// A version column through [`Versioned`].
    Optimistic,
    /// One conditional `UPDATE .. WHERE stock >= q`: the floor the others are measured by.
    Atomic,
}

impl Strategy {
    /// Every strategy, in the order the example runs them.
    pub const ALL: [Strategy; 6] = [
        Strategy::None,
        Strategy::LockTable,
        Strategy::Segmented,
        Strategy::ForUpdate,
        Strategy::Optimistic,
        Strategy::Atomic,
    ];

    /// The name used on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::LockTable => "lock-table",
            Strategy::Segmented => "segmented",
            Strategy::ForUpdate => "for-update",
            Strategy::Optimistic => "optimistic",
            Strategy::Atomic => "atomic",
        }
    }

    /// Whether the strategy claims never to oversell or lose stock.
    pub fn is_protected(self) -> bool {
        self != Strategy::None
    }
}

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Concurrent workers.
    pub workers: usize,
    /// Orders placed in all, order `i` for product `i % products + 1`.
    pub orders: usize,
    /// Products, with ids `1..=products`.
    pub products: usize,
    /// Units of each product at the start.
    pub stock: i64,
    /// Units per order.
    pub quantity: i64,
    /// Attempts of the optimistic strategy before it gives an order up.
    pub max_attempts: u32,
}

impl Workload {
    /// How many of the orders are for `product` (1-based).
    pub fn orders_for(&self, product: usize) -> usize {
        (0..self.orders)
            .filter(|i| i % self.products + 1 == product)
            .count()
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The strategy that ran.
    pub strategy: Strategy,
    /// The workload it ran.
    pub workload: Workload,
    /// Orders accepted, per product (index 0 is product 1).
    pub accepted: Vec<u64>,
    /// Orders refused for want of stock.
    pub rejected: u64,
    /// Orders given up on contention (lock wait or version attempts ran out).
    pub gave_up: u64,
    /// Optimistic retries (version conflicts), or segmented ones (a segment found short
    /// under its lease after a read said it had enough); `None` where the strategy has none.
    pub retries: Option<u64>,
    /// Lease releases that failed (left to the guard's background retry).
    pub failed_releases: u64,
    /// Stock left, per product, read after the run.
    pub final_stock: Vec<i64>,
    /// Wall time of the orders.
    pub elapsed: Duration,
}

impl Report {
    /// Orders accepted in all.
    pub fn accepted_orders(&self) -> u64 {
        self.accepted.iter().sum()
    }

    /// Units sold beyond the initial stock, summed over products.
    pub fn oversold(&self) -> i64 {
        self.sold_units()
            .map(|sold| (sold - self.workload.stock).max(0))
            .sum()
    }

    /// Units sold whose deduction went missing (lost updates), summed over products:
    /// accepted units + final stock - initial stock.
    pub fn lost(&self) -> i64 {
        self.sold_units()
            .zip(&self.final_stock)
            .map(|(sold, left)| sold + left - self.workload.stock)
            .sum()
    }

    /// Orders per second.
    pub fn rate(&self) -> f64 {
        self.workload.orders as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// What is wrong with the books, product by product: sold + left != initial, or
    /// stock below zero. Empty for a correct run.
    pub fn violations(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (index, (sold, left)) in self.sold_units().zip(&self.final_stock).enumerate() {
            let initial = self.workload.stock;
            if sold + left != initial {
                found.push(format!(
                    "product {}: sold {sold} + left {left} != initial {initial}",
                    index + 1
                ));
            }
            if *left < 0 {
                found.push(format!("product {}: stock {left} < 0", index + 1));
            }
        }
        found
    }

    fn sold_units(&self) -> impl Iterator<Item = i64> + '_ {
        let quantity = self.workload.quantity;
        self.accepted.iter().map(move |n| *n as i64 * quantity)
    }
}

/// The few raw statements the workload itself runs, for each database. The SQL is
/// written with `?` and numbered for PostgreSQL.
pub trait StockDb: Backend {
    /// The statement with this database's bind marks.
    fn sql(template: &str) -> String;

    /// Runs a statement with `i64` binds; rows affected.
    fn execute(
        conn: &mut Self::Connection,
        sql: &str,
        binds: &[i64],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// What `Shop::open` created for `table` and its lock table `lock_table`, as
    /// `DROP` statements: the tables (products, their segments, locks) and migration history, and what dropping a table
    /// leaves behind (PostgreSQL's fencing sequence, MySQL's fencing counter table; the
    /// triggers go with their tables).
    fn drop_statements(table: &str, lock_table: &str) -> Vec<String>;

    /// Runs a query with `i64` binds; the first column of the first row.
    fn fetch_i64(
        conn: &mut Self::Connection,
        sql: &str,
        binds: &[i64],
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;

    /// Runs a query with `i64` binds; the first column of every row.
    fn fetch_all_i64(
        conn: &mut Self::Connection,
        sql: &str,
        binds: &[i64],
    ) -> impl Future<Output = sqlx::Result<Vec<i64>>> + Send;
}

macro_rules! stock_db {
    ($db:ty, $numbered:expr, |$t:ident, $l:ident| $drops:expr) => {
        impl StockDb for $db {
            fn drop_statements($t: &str, $l: &str) -> Vec<String> {
                $drops
            }

            fn sql(template: &str) -> String {
                if !$numbered {
                    return template.to_owned();
                }
                let mut out = String::new();
                for (index, part) in template.split('?').enumerate() {
                    if index > 0 {
                        out.push_str(&format!("${index}"));
                    }
                    out.push_str(part);
                }
                out
            }

            async fn execute(
                conn: &mut Self::Connection,
                sql: &str,
                binds: &[i64],
            ) -> sqlx::Result<u64> {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
                for value in binds {
                    query = query.bind(*value);
                }
                Ok(query.execute(conn).await?.rows_affected())
            }

            async fn fetch_i64(
                conn: &mut Self::Connection,
                sql: &str,
                binds: &[i64],
            ) -> sqlx::Result<Option<i64>> {
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
                for value in binds {
                    query = query.bind(*value);
                }
                query.fetch_optional(conn).await
            }

            async fn fetch_all_i64(
                conn: &mut Self::Connection,
                sql: &str,
                binds: &[i64],
            ) -> sqlx::Result<Vec<i64>> {
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
                for value in binds {
                    query = query.bind(*value);
                }
                query.fetch_all(conn).await
            }
        }
    };
}
stock_db!(sqlx::Postgres, true, |t, l| vec![
    format!("DROP TABLE IF EXISTS {t}, {t}_segment, {l}, {l}_history, {l}_ticket, {l}_events"),
    format!("DROP SEQUENCE IF EXISTS {l}_fencing_seq, {l}_ticket_seq"),
    format!("DROP FUNCTION IF EXISTS {l}_take_write"),
]);
stock_db!(sqlx::MySql, false, |t, l| vec![format!(
    "DROP TABLE IF EXISTS {t}, {t}_segment, {l}, {l}_history, {l}_fencing, {l}_ticket, {l}_migrating, {l}_events"
)]);
stock_db!(sqlx::Sqlite, false, |t, l| vec![
    format!("DROP TABLE IF EXISTS {t}"),
    format!("DROP TABLE IF EXISTS {t}_segment"),
    format!("DROP TABLE IF EXISTS {l}"),
    format!("DROP TABLE IF EXISTS {l}_history"),
    format!("DROP TABLE IF EXISTS {l}_fencing"),
    format!("DROP TABLE IF EXISTS {l}_ticket"),
    format!("DROP TABLE IF EXISTS {l}_waiter"),
    format!("DROP TABLE IF EXISTS {l}_events"),
]);

/// Everything the workers share: the pool, the helpers and the statements.
pub struct Shop<DB: StockDb> {
    pool: Pool<DB>,
    table: String,
    locker: Locker<DB>,
    rows: RowLocker<DB>,
    failed_releases: AtomicU64,
    read: String,
    write: String,
    atomic: String,
    /// The segmented strategy's table, `<table>_segment`, and its statements.
    segments: segmented::Segments,
}

/// Short sleeps between lease and version attempts: one hot row, many contenders.
pub const RETRY: RetryPolicy = RetryPolicy {
    initial: Duration::from_millis(1),
    max: Duration::from_millis(20),
};
/// Far longer than one order takes.
const LEASE: Duration = Duration::from_secs(10);
/// How long a lock-table order waits for its product (a segmented one, for a segment)
/// before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(60);

// dblock's helpers take keys and values of any type the database can bind; code generic
// over the database says which one it uses.
impl<DB: StockDb> Shop<DB>
where
    i64: SqlValue<DB>,
{
    /// Creates the product table `table` and its segment table `<table>_segment` if
    /// needed (with [`segmented::SEGMENTS`] segments a product; see
    /// [`with_segments`](Self::with_segments)), and migrates `locker`'s lock table (the
    /// lease strategies' leases live there; same database as the products).
    pub async fn open(locker: Locker<DB>, table: &str) -> Result<Self, Error> {
        locker.migrate().await?;
        let pool = locker.pool().clone();
        let mut conn = pool.acquire().await?;
        DB::execute(
            &mut conn,
            &format!(
                "CREATE TABLE IF NOT EXISTS {table} \
                 (id BIGINT PRIMARY KEY, stock BIGINT NOT NULL, version BIGINT NOT NULL)"
            ),
            &[],
        )
        .await?;
        let segments = segmented::Segments::create::<DB>(&mut conn, table).await?;
        Ok(Shop {
            segments,
            rows: RowLocker::new(pool.clone(), table, "id")?,
            read: DB::sql(&format!("SELECT stock FROM {table} WHERE id = ?")),
            write: DB::sql(&format!("UPDATE {table} SET stock = ? WHERE id = ?")),
            atomic: DB::sql(&format!(
                "UPDATE {table} SET stock = stock - ? WHERE id = ? AND stock >= ?"
            )),
            table: table.to_owned(),
            failed_releases: AtomicU64::new(0),
            locker,
            pool,
        })
    }

    /// Drops everything [`open`](Self::open) created: the product table, the lock table
    /// and its companions.
    pub async fn remove(&self) -> Result<(), Error> {
        self.locker.shutdown().await;
        let mut conn = self.pool.acquire().await?;
        for statement in DB::drop_statements(&self.table, self.locker.table()) {
            DB::execute(&mut conn, &statement, &[]).await?;
        }
        Ok(())
    }

    /// Puts `stock` units of each of `products` products on the shelf, version 0.
    pub async fn restock(&self, products: usize, stock: i64) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        DB::execute(&mut conn, &format!("DELETE FROM {}", self.table), &[]).await?;
        let insert = DB::sql(&format!(
            "INSERT INTO {} (id, stock, version) VALUES (?, ?, 0)",
            self.table
        ));
        for id in 1..=products as i64 {
            DB::execute(&mut conn, &insert, &[id, stock]).await?;
        }
        self.segments
            .restock::<DB>(&mut conn, products, stock)
            .await?;
        Ok(())
    }

    /// The stock of `product` now.
    pub async fn stock(&self, product: i64) -> Result<i64, Error> {
        let mut conn = self.pool.acquire().await?;
        let stock = DB::fetch_i64(&mut conn, &self.read, &[product]).await?;
        Ok(stock.ok_or(sqlx::Error::RowNotFound)?)
    }

    /// Restocks, then runs the workload with `strategy`; `tick` is called once per order.
    pub async fn run(
        &self,
        strategy: Strategy,
        workload: Workload,
        tick: &(dyn Fn() + Sync),
    ) -> Result<Report, Error> {
        self.restock(workload.products, workload.stock).await?;
        self.failed_releases.store(0, Ordering::Relaxed);
        let versioned = Versioned::builder(self.pool.clone(), self.table.as_str(), "stock")
            .max_attempts(workload.max_attempts)
            .retry(RETRY)
            .build()?;
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        let worker = async || -> Result<tally::Tally, Error> {
            let mut tally = tally::Tally::new(workload.products);
            loop {
                let order = next.fetch_add(1, Ordering::Relaxed);
                if order >= workload.orders {
                    return Ok(tally);
                }
                let product = (order % workload.products + 1) as i64;
                let placed = self
                    .place(strategy, &versioned, product, workload.quantity)
                    .await?;
                tally.add(product, placed);
                tick();
            }
        };
        let tallies =
            futures::future::try_join_all((0..workload.workers).map(|_| worker())).await?;
        let elapsed = started.elapsed();
        let total = tally::Tally::sum(workload.products, tallies);
        let mut final_stock = Vec::new();
        for product in 1..=workload.products as i64 {
            final_stock.push(match strategy {
                // The segments are this strategy's stock; the product row is not touched.
                Strategy::Segmented => self.segmented_stock(product).await?,
                _ => self.stock(product).await?,
            });
        }
        Ok(Report {
            strategy,
            workload,
            accepted: total.accepted,
            rejected: total.rejected,
            gave_up: total.gave_up,
            retries: matches!(strategy, Strategy::Optimistic | Strategy::Segmented)
                .then_some(total.retries),
            final_stock,
            failed_releases: self.failed_releases.load(Ordering::Relaxed),
            elapsed,
        })
    }

    /// One order for `quantity` units of `product`.
    async fn place(
        &self,
        strategy: Strategy,
        versioned: &Versioned<DB>,
        product: i64,
        quantity: i64,
    ) -> Result<tally::Placed, Error> {
        use tally::Placed;
        let placed = match strategy {
            Strategy::None => {
                let mut conn = self.pool.acquire().await?;
                self.read_modify_write(&mut conn, product, quantity).await?
            }
            Strategy::LockTable => {
                let key = format!("{}:{product}", self.table);
                let guard = match self.locker.acquire(&key, LEASE, LOCK_WAIT).await {
                    Ok(guard) => guard,
                    Err(Error::Timeout { .. }) => return Ok(Placed::GaveUp),
                    Err(err) => return Err(err),
                };
                let sold = async {
                    let mut tx = self.pool.begin().await?;
                    // Fenced: the write below commits only if the lease is still ours.
                    guard.assert_held(&mut tx).await?;
                    let sold = self.read_modify_write(&mut tx, product, quantity).await?;
                    tx.commit().await?;
                    Ok::<_, Error>(sold)
                }
                .await;
                self.release(guard).await?;
                sold?
            }
            Strategy::Segmented => self.segmented(product, quantity).await?,
            Strategy::ForUpdate => {
                let sold = self
                    .rows
                    .lock(&[product], RowLockMode::Wait, async |tx, _locked| {
                        self.read_modify_write(tx, product, quantity).await
                    })
                    .await;
                match sold {
                    Err(Error::RowLocked(_)) => Placed::GaveUp,
                    other => other?,
                }
            }
            Strategy::Optimistic => {
                let outcome = versioned
                    .update(&product, async |stock: i64| {
                        if stock >= quantity {
                            Decision::Write(stock - quantity)
                        } else {
                            Decision::Refuse(())
                        }
                    })
                    .await;
                match outcome {
                    Ok(Outcome::Written { attempts, .. }) => Placed::Accepted(attempts - 1),
                    Ok(Outcome::Refused { attempts, .. }) => Placed::Rejected(attempts - 1),
                    Err(Error::VersionConflict { .. }) => Placed::GaveUp,
                    Err(err) => return Err(err),
                }
            }
            Strategy::Atomic => {
                let mut conn = self.pool.acquire().await?;
                let binds = [quantity, product, quantity];
                match DB::execute(&mut conn, &self.atomic, &binds).await? {
                    1 => Placed::Accepted(0),
                    _ => Placed::Rejected(0),
                }
            }
        };
        Ok(placed)
    }

    /// Releases a lease whose transaction has settled its order. The sale was settled by
    /// its commit: a release that fails does not undo it. The guard's drop retries the
    /// release, and the lease ends anyway, so a database error is only counted.
    async fn release(&self, guard: LockGuard<DB>) -> Result<(), Error> {
        match guard.release().await {
            Err(Error::Database(_)) => {
                self.failed_releases.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            settled => settled,
        }
    }

    /// Reads the stock, checks it, writes the difference back: correct only when
    /// something else keeps other writers out in between.
    async fn read_modify_write(
        &self,
        conn: &mut DB::Connection,
        product: i64,
        quantity: i64,
    ) -> Result<tally::Placed, Error> {
        let stock = DB::fetch_i64(conn, &self.read, &[product])
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        if stock < quantity {
            return Ok(tally::Placed::Rejected(0));
        }
        DB::execute(conn, &self.write, &[stock - quantity, product]).await?;
        Ok(tally::Placed::Accepted(0))
    }
}

mod tally {
    /// How one order ended; the number is the retries it took.
    pub enum Placed {
        Accepted(u32),
        Rejected(u32),
        GaveUp,
    }

    /// One worker's counts.
    pub struct Tally {
        pub accepted: Vec<u64>,
        pub rejected: u64,
        pub gave_up: u64,
        pub retries: u64,
    }

    impl Tally {
        pub fn new(products: usize) -> Self {
            Tally {
                accepted: vec![0; products],
                rejected: 0,
                gave_up: 0,
                retries: 0,
            }
        }

        pub fn add(&mut self, product: i64, placed: Placed) {
            match placed {
                Placed::Accepted(retries) => {
                    self.accepted[product as usize - 1] += 1;
                    self.retries += u64::from(retries);
                }
                Placed::Rejected(retries) => {
                    self.rejected += 1;
                    self.retries += u64::from(retries);
                }
                Placed::GaveUp => self.gave_up += 1,
            }
        }

        pub fn sum(products: usize, tallies: Vec<Tally>) -> Tally {
            let mut total = Tally::new(products);
            for tally in tallies {
                for (sum, n) in total.accepted.iter_mut().zip(tally.accepted) {
                    *sum += n;
                }
                total.rejected += tally.rejected;
                total.gave_up += tally.gave_up;
                total.retries += tally.retries;
            }
            total
        }
    }
}
