//! The segmented strategy (分段锁, a segmented lock): a product's stock is split over
//! `segments` rows of `<table>_segment (product_id, segment, stock)`, and each row is
//! deducted under a dblock lease of its own, key `<table>:<product>:seg:<i>`, fenced with
//! `assert_held` in the transaction that writes it. Orders for one hot product then spread
//! over several keys instead of queueing for one, as with `ConcurrentHashMap`'s segments.
//!
//! The price is the sold-out decision, which no single segment can make: an order is
//! refused only when the segments *together* hold less than it asks for, seen either by
//! one statement reading every segment (a consistent snapshot: the product was short at
//! that moment) or under every segment's lease at once. Never because the segment it
//! happened to pick was empty.

use dblock::{Error, SqlValue};

use super::tally::Placed;
use super::{LEASE, LOCK_WAIT, Shop, StockDb};

/// Segments a product by default.
pub const SEGMENTS: usize = 8;

/// The segment table and its statements.
pub struct Segments {
    table: String,
    count: usize,
    read_all: String,
    read_one: String,
    write: String,
    insert: String,
}

impl Segments {
    /// Creates `<products>_segment` if needed.
    pub(super) async fn create<DB: StockDb>(
        conn: &mut DB::Connection,
        products: &str,
    ) -> Result<Self, Error> {
        let table = format!("{products}_segment");
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (product_id BIGINT NOT NULL, \
             segment BIGINT NOT NULL, stock BIGINT NOT NULL, PRIMARY KEY (product_id, segment))"
        );
        DB::execute(conn, &create, &[]).await?;
        Ok(Segments {
            count: SEGMENTS,
            read_all: DB::sql(&format!(
                "SELECT stock FROM {table} WHERE product_id = ? ORDER BY segment"
            )),
            read_one: DB::sql(&format!(
                "SELECT stock FROM {table} WHERE product_id = ? AND segment = ?"
            )),
            write: DB::sql(&format!(
                "UPDATE {table} SET stock = ? WHERE product_id = ? AND segment = ?"
            )),
            insert: DB::sql(&format!(
                "INSERT INTO {table} (product_id, segment, stock) VALUES (?, ?, ?)"
            )),
            table,
        })
    }

    /// Splits `stock` units of each product over the segments, as evenly as it goes (the
    /// first `stock % count` segments get one unit more).
    pub(super) async fn restock<DB: StockDb>(
        &self,
        conn: &mut DB::Connection,
        products: usize,
        stock: i64,
    ) -> Result<(), Error> {
        DB::execute(conn, &format!("DELETE FROM {}", self.table), &[]).await?;
        let count = self.count as i64;
        for product in 1..=products as i64 {
            for segment in 0..count {
                let units = stock / count + i64::from(segment < stock % count);
                DB::execute(conn, &self.insert, &[product, segment, units]).await?;
            }
        }
        Ok(())
    }
}

impl<DB: StockDb> Shop<DB>
where
    i64: SqlValue<DB>,
{
    /// The same shop with `count` segments a product (from the next restock on).
    pub fn with_segments(mut self, count: usize) -> Self {
        assert!(count > 0, "a product needs at least one segment");
        self.segments.count = count;
        self
    }

    /// Segments a product.
    pub fn segment_count(&self) -> usize {
        self.segments.count
    }

    /// The stock of `product` summed over its segments now.
    pub async fn segmented_stock(&self, product: i64) -> Result<i64, Error> {
        Ok(self.segment_stocks(product).await?.iter().sum())
    }

    async fn segment_stocks(&self, product: i64) -> Result<Vec<i64>, Error> {
        let mut conn = self.pool.acquire().await?;
        Ok(DB::fetch_all_i64(&mut conn, &self.segments.read_all, &[product]).await?)
    }

    /// One order for `quantity` units of `product`, from the segments.
    pub(super) async fn segmented(&self, product: i64, quantity: i64) -> Result<Placed, Error> {
        // Without a lease: a hint of where the units are, and one consistent state of all
        // segments (one statement), short of `quantity` only if the product was.
        let stocks = self.segment_stocks(product).await?;
        if stocks.iter().sum::<i64>() < quantity {
            return Ok(Placed::Rejected(0));
        }
        // From a random segment on, so that the orders for one product spread over its
        // keys; only segments that covered the order at the read (the check under the
        // lease decides).
        let count = stocks.len();
        let start = fastrand::usize(..count);
        let mut short = 0;
        for segment in (start..start + count).map(|i| i % count) {
            if stocks[segment] < quantity {
                continue;
            }
            match self.deduct(product, &[segment], quantity).await? {
                // Another order took the units since the read: the next segment.
                Placed::Rejected(_) => short += 1,
                Placed::Accepted(_) => return Ok(Placed::Accepted(short)),
                Placed::GaveUp => return Ok(Placed::GaveUp),
            }
        }
        // No segment covers the order alone (or none does any more), though together they
        // did: every segment's lease, taken in segment order (so two such orders cannot
        // deadlock; single-segment orders never wait while holding one), and a decision
        // on the total.
        let every: Vec<usize> = (0..count).collect();
        Ok(match self.deduct(product, &every, quantity).await? {
            Placed::Accepted(_) => Placed::Accepted(short + 1),
            Placed::Rejected(_) => Placed::Rejected(short + 1),
            Placed::GaveUp => Placed::GaveUp,
        })
    }

    /// Takes the leases of `segments` of `product`, in the order given; then in one
    /// transaction fenced by each of them reads those segments and, if together they hold
    /// `quantity`, takes it from them in that order.
    async fn deduct(
        &self,
        product: i64,
        segments: &[usize],
        quantity: i64,
    ) -> Result<Placed, Error> {
        let mut guards = Vec::with_capacity(segments.len());
        for &segment in segments {
            let key = format!("{}:{product}:seg:{segment}", self.table);
            match self.locker.acquire(&key, LEASE, LOCK_WAIT).await {
                Ok(guard) => guards.push(guard),
                Err(Error::Timeout { .. }) => {
                    for guard in guards {
                        self.release(guard).await?;
                    }
                    return Ok(Placed::GaveUp);
                }
                // The guards taken so far are released in the background as they drop.
                Err(err) => return Err(err),
            }
        }
        let sold = async {
            let mut tx = self.pool.begin().await?;
            // Fenced: the writes below commit only if every lease is still ours.
            for guard in &guards {
                guard.assert_held(&mut tx).await?;
            }
            let mut stocks = Vec::with_capacity(segments.len());
            for &segment in segments {
                let binds = [product, segment as i64];
                let stock = DB::fetch_i64(&mut tx, &self.segments.read_one, &binds).await?;
                stocks.push(stock.ok_or(sqlx::Error::RowNotFound)?);
            }
            if stocks.iter().sum::<i64>() < quantity {
                // Nothing written: dropping `tx` rolls it back.
                return Ok::<_, Error>(Placed::Rejected(0));
            }
            let mut wanted = quantity;
            for (&segment, stock) in segments.iter().zip(stocks) {
                let taken = stock.min(wanted);
                if taken > 0 {
                    let binds = [stock - taken, product, segment as i64];
                    DB::execute(&mut tx, &self.segments.write, &binds).await?;
                    wanted -= taken;
                }
            }
            tx.commit().await?;
            Ok(Placed::Accepted(0))
        }
        .await;
        for guard in guards {
            self.release(guard).await?;
        }
        sold
    }
}
