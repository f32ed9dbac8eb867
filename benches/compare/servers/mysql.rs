//! MariaDB / MySQL: connecting, and the statements the bench itself sends there.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{AssertSqlSafe, Connection as _, MySql, MySqlConnection, MySqlPool};

use super::{BenchDb, LockDb, QueueSession, Server, Statement, pool_settings};
use crate::handwritten::floor::Floor;
use crate::handwritten::seeds::MySeed;
use crate::handwritten::{HandLock, MyHand};

/// Connects to the MariaDB / MySQL server at `url`.
pub async fn connect(url: &str) -> Result<Server<MySql>, sqlx::Error> {
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
async fn run(pool: &MySqlPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

impl LockDb for MySql {
    async fn drop_lock_table(pool: &MySqlPool, table: &str) -> Result<(), sqlx::Error> {
        // The fencing and ticket-order triggers go with their tables; `migrate` also
        // leaves its claim table, `<table>_migrating`.
        run(
            pool,
            format!(
                "DROP TABLE IF EXISTS {table}, {table}_fencing, {table}_history, {table}_ticket, {table}_events, {table}_migrating"
            ),
        )
        .await
    }

    async fn dedicated_pool(url: &str, max_connections: u32) -> Result<MySqlPool, sqlx::Error> {
        let options: MySqlConnectOptions = url.parse()?;
        pool_settings::<MySql>()
            .max_connections(max_connections)
            .connect_with(options)
            .await
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

    fn select_one(pool: &MySqlPool) -> Statement {
        let pool = pool.clone();
        Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let _ = sqlx::query("SELECT 1").execute(&pool).await;
            })
        })
    }

    fn hand(pool: &MySqlPool, table: &str) -> Arc<dyn HandLock> {
        Arc::new(MyHand::new(pool.clone(), table))
    }

    fn floor(pool: &MySqlPool) -> Arc<dyn HandLock> {
        Arc::new(Floor::new(pool.clone(), "SELECT ?, ?"))
    }

    async fn seed(pool: &MySqlPool, table: &str) -> Result<Arc<dyn HandLock>, sqlx::Error> {
        Self::drop_table(pool, table).await?;
        run(pool, MySeed::create_table(table)).await?;
        Ok(Arc::new(MySeed::new(pool.clone(), table)))
    }

    async fn drop_table(pool: &MySqlPool, table: &str) -> Result<(), sqlx::Error> {
        run(pool, format!("DROP TABLE IF EXISTS {table}")).await
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

    async fn queue_session(
        url: &str,
        key: &str,
        wait: Duration,
    ) -> Result<Box<dyn QueueSession>, sqlx::Error> {
        session(url, key, wait).await
    }

    async fn statements_seen(admin: &MySqlPool) -> Result<u64, sqlx::Error> {
        global_status(admin, "Questions").await
    }
}

/// MariaDB / MySQL: a named user lock.
struct MySession {
    conn: MySqlConnection,
    name: String,
    /// `GET_LOCK`'s timeout.
    wait: Duration,
}

impl QueueSession for MySession {
    fn lock(&mut self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            // Seconds; longer than any round, so a timeout would mean a waiter starved.
            let timeout = i64::try_from(self.wait.as_secs()).unwrap_or(i64::MAX);
            let granted: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
                .bind(&self.name)
                .bind(timeout)
                .fetch_one(&mut self.conn)
                .await
                .map_err(|e| e.to_string())?;
            match granted {
                Some(1) => Ok(()),
                Some(_) => Err(format!("GET_LOCK timed out after {timeout} s")),
                None => Err("GET_LOCK returned NULL".into()),
            }
        })
    }

    fn unlock(&mut self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                .bind(&self.name)
                .fetch_one(&mut self.conn)
                .await
                .map_err(|e| e.to_string())?;
            match released {
                Some(1) => Ok(()),
                _ => Err("RELEASE_LOCK: the session did not hold the key".into()),
            }
        })
    }
}

/// Opens a MariaDB / MySQL session for `key` (a lock name, at most 64 characters).
async fn session(
    url: &str,
    key: &str,
    wait: Duration,
) -> Result<Box<dyn QueueSession>, sqlx::Error> {
    Ok(Box::new(MySession {
        conn: MySqlConnection::connect(url).await?,
        name: key.to_owned(),
        wait,
    }))
}
