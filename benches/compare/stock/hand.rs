//! Section 4's hand-written side: the statements the stock example's helpers send, sent
//! by hand with sqlx, on the example's tables, with the same retry policy and lock wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dblock::SqlValue;
use sqlx::{AssertSqlSafe, MySql, Pool, Postgres};
use tokio::time::Instant;

use crate::handwritten::{HandLock, check_fence_sql};
use crate::measure::{BoxError, new_owner};
use crate::servers::BenchDb;
use crate::stock_example::{RETRY, Shop, StockDb, Strategy, Workload};

/// The example's product table and its lock table, as this section creates them.
pub const PRODUCTS: &str = "bench_stock_product";
pub const LOCK_TABLE: &str = "bench_stock_product_lock";
/// The example's own lock wait (`LOCK_WAIT` in examples/stock/mod.rs).
const LOCK_WAIT: Duration = Duration::from_secs(60);
/// The example's default for the optimistic strategy.
pub const MAX_ATTEMPTS: u32 = 1000;

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
pub struct Hand<DB: HandStock> {
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
    pub fn new(pool: Pool<DB>) -> Self {
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
    pub async fn run(
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
