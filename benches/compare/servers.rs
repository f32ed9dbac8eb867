//! Connecting to the servers, and the few per-database statements the bench itself needs
//! (creating and dropping its tables, filling the reaper's table, reading server counters).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dblock::{Backend, Locker};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, PgPool, Pool, Postgres};

use crate::handwritten::{Floor, HandLock, MyHand, MySeed, PgHand, PgSeed};
use crate::hotkey_queue::{self, QueueSession};

/// Connections per pool, for dblock and the hand-written baselines alike: one per task of
/// the 8-task runs, so neither side ever waits for a connection.
pub const POOL_SIZE: u32 = 8;

/// The pool settings every contender gets. sqlx pings a connection before lending it out
/// unless told otherwise; that extra round trip per statement would hide the differences
/// this bench is after, for every contender alike, so it is turned off here.
pub fn pool_settings<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(POOL_SIZE)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(60))
}

/// Words for the report's "pool" line.
pub const POOL_SETTINGS_TEXT: &str = "max_connections 8, test_before_acquire off (no ping before each statement), sqlx 0.9 defaults otherwise";

/// A database server and what the bench knows about it.
pub struct Server<DB: sqlx::Database> {
    pub pool: Pool<DB>,
    /// For example "PostgreSQL 15.20" or "MariaDB 10.11.19".
    pub label: String,
    pub url: String,
}

impl<DB: BenchDb> Server<DB> {
    /// A dblock locker on `table`, created fresh (dropped first, in case an interrupted
    /// run left it behind, so every run starts from an empty, unbloated table).
    pub async fn fresh_locker(&self, table: &str) -> Result<Locker<DB>, dblock::Error> {
        self.fresh_locker_with(table, |b| b).await
    }

    /// As [`fresh_locker`](Self::fresh_locker), with builder options.
    pub async fn fresh_locker_with(
        &self,
        table: &str,
        options: impl FnOnce(dblock::LockerBuilder<DB>) -> dblock::LockerBuilder<DB>,
    ) -> Result<Locker<DB>, dblock::Error> {
        DB::drop_lock_table(&self.pool, table).await?;
        let locker = options(Locker::builder(self.pool.clone()).table(table)).build()?;
        locker.migrate().await?;
        Ok(locker)
    }
}

pub async fn postgres(url: &str) -> Result<Server<Postgres>, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    let pool: PgPool = pool_settings::<Postgres>()
        .connect_with(options.application_name("dblock-bench"))
        .await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await?;
    let version = version.split_whitespace().next().unwrap_or("").to_owned();
    Ok(Server {
        pool,
        label: format!("PostgreSQL {version}"),
        url: url.to_owned(),
    })
}

pub async fn mysql(url: &str) -> Result<Server<MySql>, sqlx::Error> {
    let options: MySqlConnectOptions = url.parse()?;
    let pool: MySqlPool = pool_settings::<MySql>().connect_with(options).await?;
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await?;
    let label = match version.split_once("-MariaDB") {
        Some((v, _)) => format!("MariaDB {v}"),
        None => format!("MySQL {version}"),
    };
    Ok(Server {
        pool,
        label,
        url: url.to_owned(),
    })
}

/// What the bench needs from each database beyond dblock itself.
pub trait BenchDb: Backend {
    /// Statements one renewal batch sends (per chunk of up to 10,000 leases): PostgreSQL's
    /// one `UPDATE .. RETURNING`, MySQL's `UPDATE` and its read-back.
    const STATEMENTS_PER_BATCH: u32;

    /// The server's count of `UPDATE` statements, where one is current (MariaDB's
    /// `Com_update` + `Com_update_multi`, server-wide); `None` where there is none to read (PostgreSQL without
    /// `pg_stat_statements`).
    fn update_statements_seen(admin: &Pool<Self>) -> impl Future<Output = Option<u64>> + Send;

    /// Whether [`updates_seen`](Self::updates_seen) is current (MariaDB's status
    /// counters) or lags until sessions report (PostgreSQL's statistics).
    const UPDATES_ARE_CURRENT: bool;

    /// Drops a dblock lock table and everything its migration created.
    fn drop_lock_table(
        pool: &Pool<Self>,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The same statements dblock sends, hand-written, on `table`.
    fn hand(pool: &Pool<Self>, table: &str) -> Arc<dyn HandLock>;

    /// The floor of two-statement locks ([`Floor`](crate::handwritten::Floor)) on `pool`.
    fn floor(pool: &Pool<Self>) -> Arc<dyn HandLock>;

    /// A Locker on a fresh relaxed (`UNLOGGED`) lock table `table`, where the backend has
    /// them (PostgreSQL); `None` elsewhere.
    fn relaxed_locker(
        _pool: &Pool<Self>,
        _table: &str,
    ) -> impl Future<Output = Result<Option<Locker<Self>>, dblock::Error>> + Send {
        async { Ok(None) }
    }

    /// The seeds' plain INSERT / DELETE on their own three-column table (created fresh).
    fn seed(
        pool: &Pool<Self>,
        table: &str,
    ) -> impl Future<Output = Result<Arc<dyn HandLock>, sqlx::Error>> + Send;

    /// Drops a table the bench created by itself.
    fn drop_table(
        pool: &Pool<Self>,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Inserts `rows` rows into a dblock table whose leases ended an hour ago, in one
    /// statement.
    fn insert_expired(
        pool: &Pool<Self>,
        table: &str,
        rows: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Deadlocks the server has counted so far, where that is cheap and current.
    fn deadlocks(pool: &Pool<Self>) -> impl Future<Output = Option<u64>> + Send;

    /// A pool of its own for one section (same settings, `max_connections` of them),
    /// named where the server can show client names, so the section can close it and see
    /// its sessions gone.
    fn dedicated_pool(
        url: &str,
        max_connections: u32,
    ) -> impl Future<Output = Result<Pool<Self>, sqlx::Error>> + Send;

    /// The server's own count of rows updated, for cross-checking renewals, and what it
    /// covers.
    fn updates_seen(
        admin: &Pool<Self>,
        table: &str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Waits (bounded) until the server has written out what a bulk statement left dirty,
    /// so a following measurement does not pay for that write-back.
    fn settle(pool: &Pool<Self>) -> impl Future<Output = ()> + Send;

    /// A cheap real statement (`SELECT 1`) on `pool`, for timing the task pattern alone.
    fn select_one(pool: &Pool<Self>) -> crate::anatomy::Statement;

    /// Waits (bounded) until the sessions of a closed [`dedicated_pool`](Self::dedicated_pool)
    /// are gone from the server, so their statistics have been flushed. Returns how many
    /// statements it sent on `admin` (for [`statements_seen`](Self::statements_seen)).
    fn await_sessions_gone(admin: &Pool<Self>) -> impl Future<Output = u64> + Send;

    /// Statements clients have sent the server so far, read on `admin`, a pool of one
    /// connection: PostgreSQL's transactions of the current database (`xact_commit +
    /// xact_rollback` in `pg_stat_database`; every autocommit statement is one), MariaDB's
    /// global `Questions`. Two readings differ by what was sent in between plus
    /// [`STATEMENTS_PER_READING`](Self::STATEMENTS_PER_READING); other clients of the
    /// server (or database) count too.
    fn statements_seen(admin: &Pool<Self>)
    -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// What one [`statements_seen`](Self::statements_seen) adds to the difference between
    /// two readings.
    const STATEMENTS_PER_READING: u64;

    /// Words for the report: what [`statements_seen`](Self::statements_seen) counts.
    const STATEMENTS_SEEN_TEXT: &'static str;

    /// How long a session may keep counts that [`statements_seen`](Self::statements_seen)
    /// does not show yet (PostgreSQL: an idle session reports its statistics up to 10 s
    /// late, `PGSTAT_IDLE_INTERVAL`; a session that exits reports them on its way out).
    const STATISTICS_LAG: Duration;

    /// The server's own queued lock, for the report: what the server-side queue of
    /// cell 3.1 ([`hotkey_queue`](crate::hotkey_queue)) takes the key with.
    const QUEUE_LOCK: &'static str;

    /// A connection of its own on `url` that takes `key` with [`QUEUE_LOCK`](Self::QUEUE_LOCK).
    fn queue_session(
        url: &str,
        key: &str,
    ) -> impl Future<Output = Result<Box<dyn QueueSession>, sqlx::Error>> + Send;
}

/// The client name of the sessions of a dedicated pool.
const DEDICATED_APP: &str = "dblock-bench-dedicated";

/// Reads one numeric `SHOW GLOBAL STATUS` variable (a text-protocol statement: `SHOW`
/// cannot always be prepared; `name` is one of the bench's own constants).
async fn global_status(pool: &MySqlPool, name: &'static str) -> Result<u64, sqlx::Error> {
    use sqlx::Row as _;
    let row = sqlx::raw_sql(AssertSqlSafe(format!("SHOW GLOBAL STATUS LIKE '{name}'")))
        .fetch_one(pool)
        .await?;
    let value: String = row.try_get(1)?;
    value
        .parse()
        .map_err(|e: std::num::ParseIntError| sqlx::Error::Decode(e.into()))
}

/// Runs the bench's own DDL (text built from its constant table names).
async fn run(pool: &PgPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

async fn run_my(pool: &MySqlPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

impl BenchDb for Postgres {
    const UPDATES_ARE_CURRENT: bool = false;
    const STATEMENTS_PER_BATCH: u32 = 1;

    async fn update_statements_seen(_admin: &PgPool) -> Option<u64> {
        None
    }

    async fn settle(pool: &PgPool) {
        // Needs superuser or pg_checkpoint; without it, a pause has to do.
        if sqlx::query("CHECKPOINT").execute(pool).await.is_err() {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    fn select_one(pool: &PgPool) -> crate::anatomy::Statement {
        let pool = pool.clone();
        Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let _ = sqlx::query("SELECT 1").execute(&pool).await;
            })
        })
    }

    async fn drop_lock_table(pool: &PgPool, table: &str) -> Result<(), sqlx::Error> {
        run(
            pool,
            format!(
                "DROP TABLE IF EXISTS {table}, {table}_history, {table}_ticket, {table}_epoch; \
                 DROP SEQUENCE IF EXISTS {table}_fencing_seq, {table}_ticket_seq; \
                 DROP FUNCTION IF EXISTS {table}_new_epoch()"
            ),
        )
        .await
    }

    fn hand(pool: &PgPool, table: &str) -> Arc<dyn HandLock> {
        Arc::new(PgHand::new(pool.clone(), table))
    }

    fn floor(pool: &PgPool) -> Arc<dyn HandLock> {
        Arc::new(Floor::new(pool.clone(), "SELECT $1::text, $2::text"))
    }

    async fn relaxed_locker(
        pool: &PgPool,
        table: &str,
    ) -> Result<Option<Locker<Postgres>>, dblock::Error> {
        Self::drop_lock_table(pool, table).await?;
        let locker = Locker::builder(pool.clone())
            .table(table)
            .durability(dblock::Durability::Relaxed)
            .build()?;
        locker.migrate().await?;
        Ok(Some(locker))
    }

    async fn seed(pool: &PgPool, table: &str) -> Result<Arc<dyn HandLock>, sqlx::Error> {
        Self::drop_table(pool, table).await?;
        run(pool, PgSeed::create_table(table)).await?;
        Ok(Arc::new(PgSeed::new(pool.clone(), table)))
    }

    async fn drop_table(pool: &PgPool, table: &str) -> Result<(), sqlx::Error> {
        run(pool, format!("DROP TABLE IF EXISTS {table}")).await
    }

    async fn insert_expired(pool: &PgPool, table: &str, rows: u64) -> Result<u64, sqlx::Error> {
        let sql = format!(
            "INSERT INTO {table} (lock_key, lock_value, expire_time, fencing_token, acquired_at)
             SELECT 'expired:' || g, 'bench', clock_timestamp() - INTERVAL '1 hour', g,
                    clock_timestamp() - INTERVAL '2 hours'
               FROM generate_series(1, $1) AS g"
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(i64::try_from(rows).unwrap_or(i64::MAX))
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn deadlocks(_pool: &PgPool) -> Option<u64> {
        // pg_stat_database lags by up to seconds; dblock's advisory lock serializes
        // attempts on a key, so PostgreSQL has none to report here anyway.
        None
    }

    async fn dedicated_pool(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
        let options: PgConnectOptions = url.parse()?;
        pool_settings::<Postgres>()
            .max_connections(max_connections)
            .connect_with(options.application_name(DEDICATED_APP))
            .await
    }

    async fn updates_seen(admin: &PgPool, table: &str) -> Result<u64, sqlx::Error> {
        // Exact and per table, but each session reports its counts when it goes idle for
        // a while or exits: read it after the sessions that did the updates have ended.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(admin)
            .await?;
        let updated: Option<i64> =
            sqlx::query_scalar("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = $1")
                .bind(table)
                .fetch_optional(admin)
                .await?;
        Ok(updated.unwrap_or(0).try_into().unwrap_or(0))
    }

    const STATEMENTS_PER_READING: u64 = 2;
    const STATEMENTS_SEEN_TEXT: &'static str = "transactions of the database (`xact_commit + \
        xact_rollback` in `pg_stat_database`; one per autocommit statement)";
    const STATISTICS_LAG: Duration = Duration::from_millis(10_500);
    const QUEUE_LOCK: &'static str = "pg_advisory_lock";

    async fn queue_session(url: &str, key: &str) -> Result<Box<dyn QueueSession>, sqlx::Error> {
        hotkey_queue::pg_session(url, key).await
    }

    async fn statements_seen(admin: &PgPool) -> Result<u64, sqlx::Error> {
        // This session's own counts are sent at the end of the next transaction; the
        // reading itself is then counted by the next reading's first statement: two
        // transactions per reading.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(admin)
            .await?;
        let seen: i64 = sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
              WHERE datname = current_database()",
        )
        .fetch_one(admin)
        .await?;
        Ok(seen.try_into().unwrap_or(0))
    }

    async fn await_sessions_gone(admin: &PgPool) -> u64 {
        let mut sent = 0;
        for _ in 0..100 {
            let left: Result<i64, _> = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(DEDICATED_APP)
            .fetch_one(admin)
            .await;
            sent += 1;
            if matches!(left, Ok(0) | Err(_)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Exiting sessions flush their statistics on the way out; give that a moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
        sent
    }
}

impl BenchDb for MySql {
    const UPDATES_ARE_CURRENT: bool = true;
    const STATEMENTS_PER_BATCH: u32 = 2;

    async fn update_statements_seen(admin: &MySqlPool) -> Option<u64> {
        // The renewal is a multi-table UPDATE (a JOIN with JSON_TABLE): those count in
        // Com_update_multi, single-table ones in Com_update.
        let single = global_status(admin, "Com_update").await.ok()?;
        let multi = global_status(admin, "Com_update_multi").await.ok()?;
        Some(single + multi)
    }

    async fn settle(pool: &MySqlPool) {
        // InnoDB writes dirty pages back in the background; wait for most of them.
        for _ in 0..150 {
            match global_status(pool, "Innodb_buffer_pool_pages_dirty").await {
                Ok(dirty) if dirty > 64 => tokio::time::sleep(Duration::from_millis(100)).await,
                _ => return,
            }
        }
    }

    fn select_one(pool: &MySqlPool) -> crate::anatomy::Statement {
        let pool = pool.clone();
        Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let _ = sqlx::query("SELECT 1").execute(&pool).await;
            })
        })
    }

    async fn drop_lock_table(pool: &MySqlPool, table: &str) -> Result<(), sqlx::Error> {
        // The fencing and ticket-order triggers go with their tables.
        run_my(
            pool,
            format!(
                "DROP TABLE IF EXISTS {table}, {table}_fencing, {table}_history, {table}_ticket"
            ),
        )
        .await
    }

    fn hand(pool: &MySqlPool, table: &str) -> Arc<dyn HandLock> {
        Arc::new(MyHand::new(pool.clone(), table))
    }

    fn floor(pool: &MySqlPool) -> Arc<dyn HandLock> {
        Arc::new(Floor::new(pool.clone(), "SELECT ?, ?"))
    }

    async fn seed(pool: &MySqlPool, table: &str) -> Result<Arc<dyn HandLock>, sqlx::Error> {
        Self::drop_table(pool, table).await?;
        run_my(pool, MySeed::create_table(table)).await?;
        Ok(Arc::new(MySeed::new(pool.clone(), table)))
    }

    async fn drop_table(pool: &MySqlPool, table: &str) -> Result<(), sqlx::Error> {
        run_my(pool, format!("DROP TABLE IF EXISTS {table}")).await
    }

    async fn insert_expired(pool: &MySqlPool, table: &str, rows: u64) -> Result<u64, sqlx::Error> {
        // Six cross-joined digit tables count to a million without the recursion limits
        // of a recursive CTE (MySQL's cte_max_recursion_depth is 1000 by default). The
        // fencing trigger still fires for every row, as it would for real acquisitions.
        let sql = format!(
            "INSERT INTO {table} (lock_key, lock_value, expire_time, acquired_at)
             WITH d(n) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
                           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6
                           UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
                  seq(n) AS (SELECT a.n + 10 * b.n + 100 * c.n + 1000 * e.n + 10000 * f.n
                                    + 100000 * g.n
                               FROM d a, d b, d c, d e, d f, d g)
             SELECT CONCAT('expired:', n), 'bench', NOW(6) - INTERVAL 1 HOUR,
                    NOW(6) - INTERVAL 2 HOUR
               FROM seq WHERE n < ?"
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(rows)
            .execute(pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn deadlocks(pool: &MySqlPool) -> Option<u64> {
        global_status(pool, "Innodb_deadlocks").await.ok()
    }

    async fn dedicated_pool(url: &str, max_connections: u32) -> Result<MySqlPool, sqlx::Error> {
        let options: MySqlConnectOptions = url.parse()?;
        pool_settings::<MySql>()
            .max_connections(max_connections)
            .connect_with(options)
            .await
    }

    async fn updates_seen(admin: &MySqlPool, _table: &str) -> Result<u64, sqlx::Error> {
        // Current, but server-wide: any other client's updates count too.
        global_status(admin, "Handler_update").await
    }

    async fn await_sessions_gone(_admin: &MySqlPool) -> u64 {
        0
    }

    const STATEMENTS_PER_READING: u64 = 1;
    const STATEMENTS_SEEN_TEXT: &'static str = "the server's `Questions` (`SHOW GLOBAL STATUS`: \
        statements sent by all clients, the reading itself included)";
    const STATISTICS_LAG: Duration = Duration::ZERO;
    const QUEUE_LOCK: &'static str = "GET_LOCK";

    async fn queue_session(url: &str, key: &str) -> Result<Box<dyn QueueSession>, sqlx::Error> {
        hotkey_queue::my_session(url, key).await
    }

    async fn statements_seen(admin: &MySqlPool) -> Result<u64, sqlx::Error> {
        global_status(admin, "Questions").await
    }
}
