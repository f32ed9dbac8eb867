//! What the lease cases run on: the test's own table, a renewing locker whose connections
//! can be cut ([`Outage`]), and plain SQL to change rows behind a guard's back.

use std::time::Duration;

use dblock::{Locker, LockerBuilder};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{MySql, Pool, Postgres, Sqlite};
use tokio::sync::Mutex;

use crate::common::proxy::{Proxy, upstream_of, via_proxy};
use crate::common::{TestBackend, TestDb};

/// A backend whose database the tests can make unreachable and reachable again.
#[allow(async_fn_in_trait)]
pub trait Outage: TestBackend {
    /// What keeps the fault switchable.
    type Fault: Send + Sync;
    /// A pool on `db`'s database that the fault cuts off.
    async fn faulty_pool(db: &TestDb<Self>) -> (Pool<Self>, Self::Fault);
    /// Makes the database unreachable for that pool.
    async fn begin_outage(fault: &Self::Fault);
    /// Ends the outage.
    async fn end_outage(fault: &Self::Fault);
}

/// Server backends: the pool connects through a proxy that can be cut.
async fn proxied_pool<DB: TestBackend>(db: &TestDb<DB>) -> (Pool<DB>, Proxy) {
    let proxy = Proxy::start(upstream_of(&db.location)).await;
    let pool = DB::connect(&via_proxy(&db.location, proxy.addr()), 8).await;
    (pool, proxy)
}

/// PostgreSQL and MySQL: the fault is the proxy.
macro_rules! proxied_outage {
    ($db:ty) => {
        impl Outage for $db {
            type Fault = Proxy;
            async fn faulty_pool(db: &TestDb<Self>) -> (Pool<Self>, Proxy) {
                proxied_pool(db).await
            }
            async fn begin_outage(proxy: &Proxy) {
                proxy.cut();
            }
            async fn end_outage(proxy: &Proxy) {
                proxy.restore();
            }
        }
    };
}

proxied_outage!(Postgres);
proxied_outage!(MySql);

/// SQLite has no connection to cut; the nearest outage is another connection holding the
/// database's write lock, so every write of the locker's pool fails with SQLITE_BUSY.
pub struct SqliteFault {
    blocker: Mutex<PoolConnection<Sqlite>>,
}

impl Outage for Sqlite {
    type Fault = SqliteFault;
    async fn faulty_pool(db: &TestDb<Self>) -> (Pool<Self>, SqliteFault) {
        // Busy for 250 ms is an error here, so a blocked renewal fails fast and retries.
        let options = SqliteConnectOptions::new()
            .filename(&db.location)
            .busy_timeout(Duration::from_millis(250));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("open the SQLite file");
        let blocker = db.pool.acquire().await.expect("a blocking connection");
        (
            pool,
            SqliteFault {
                blocker: Mutex::new(blocker),
            },
        )
    }
    async fn begin_outage(fault: &SqliteFault) {
        let mut conn = fault.blocker.lock().await;
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut **conn)
            .await
            .expect("take the write lock");
    }
    async fn end_outage(fault: &SqliteFault) {
        let mut conn = fault.blocker.lock().await;
        sqlx::query("COMMIT")
            .execute(&mut **conn)
            .await
            .expect("give the write lock back");
    }
}

/// One lease case's world.
pub struct LeaseEnv<DB: Outage> {
    db: TestDb<DB>,
    locker: Locker<DB>,
    fault: DB::Fault,
}

impl<DB: Outage> LeaseEnv<DB> {
    /// A fresh, migrated table and a renewing locker on the faulty pool; `None` when the
    /// backend is skipped.
    pub async fn open() -> Option<Self> {
        let db = TestDb::<DB>::open().await?;
        let (pool, fault) = DB::faulty_pool(&db).await;
        let locker = Locker::builder(pool)
            .table(&db.table)
            .build()
            .expect("valid options");
        Some(LeaseEnv { db, locker, fault })
    }

    /// The renewing locker (renews every `min(10 s, lease / 3)`).
    pub fn locker(&self) -> &Locker<DB> {
        &self.locker
    }

    /// A renewing locker on the faulty pool, with `options` applied to its builder.
    pub fn faulty_locker(
        &self,
        options: impl FnOnce(LockerBuilder<DB>) -> LockerBuilder<DB>,
    ) -> Locker<DB> {
        let builder = Locker::builder(self.locker.pool().clone()).table(&self.db.table);
        options(builder).build().expect("valid options")
    }

    /// Another locker on the same table, through a pool of its own.
    pub async fn second_locker(&self) -> Locker<DB> {
        Locker::builder(self.db.another_pool().await)
            .table(&self.db.table)
            .build()
            .expect("valid options")
    }

    /// A renewing locker on the same table through a pool of its own, with a renew
    /// interval of `interval` (each guard renews every `min(interval, lease / 3)`): for
    /// cases that hold many guards through one locker.
    pub async fn locker_renewing_every(&self, interval: Duration) -> Locker<DB> {
        Locker::builder(self.db.another_pool().await)
            .table(&self.db.table)
            .renew_interval(interval)
            .build()
            .expect("valid options")
    }

    /// Plain SQL: deletes the row of `key`, whoever holds it.
    pub async fn delete_row(&self, key: &str) {
        assert_eq!(
            self.db.plain.delete(key).await,
            1,
            "the row to delete exists"
        );
    }

    /// Plain SQL: gives the row of `key` to `new_owner`, as a takeover would.
    pub async fn steal_row(&self, key: &str, new_owner: &str) {
        let sql = format!(
            "UPDATE {} SET lock_value = {} WHERE lock_key = {}",
            self.db.table,
            DB::param(1),
            DB::param(2)
        );
        let stolen = DB::exec(&self.db.pool, sql, vec![new_owner.into(), key.into()]).await;
        assert_eq!(stolen.expect("steal the row"), 1);
    }

    /// Rows in the lock table.
    pub async fn count_rows(&self) -> i64 {
        self.db.plain.row_count().await
    }

    /// Plain SQL: `expired` rows whose lease ended a minute ago and `live` rows whose
    /// lease ends in an hour, keys `bulk-<n>`, inserted 500 to a statement.
    pub async fn insert_bulk(&self, expired: i64, live: i64) {
        let rows: Vec<String> = (0..expired + live)
            .map(|n| {
                let expiry = DB::now_plus(if n < expired { -60 } else { 3600 });
                format!("('bulk-{n}', 'bulk-owner', {expiry})")
            })
            .collect();
        for chunk in rows.chunks(500) {
            let sql = format!(
                "INSERT INTO {} (lock_key, lock_value, expire_time) VALUES {}",
                self.db.table,
                chunk.join(", ")
            );
            DB::exec(&self.db.pool, sql, vec![])
                .await
                .expect("bulk insert");
        }
    }

    /// Makes the database unreachable for [`locker`](Self::locker).
    pub async fn outage_start(&self) {
        DB::begin_outage(&self.fault).await;
    }

    /// Ends the outage.
    pub async fn outage_end(&self) {
        DB::end_outage(&self.fault).await;
    }
}
