//! PostgreSQL: connecting, and the statements the bench itself sends there.

use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;
use std::time::Duration;

use dblock::Locker;
use futures::future::BoxFuture;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool, Postgres};

use super::{
    BenchDb, DEDICATED_APP, LockDb, PeerRwLock, QueueSession, Server, Statement, pool_settings,
};
use crate::handwritten::floor::Floor;
use crate::handwritten::seeds::PgSeed;
use crate::handwritten::write::PgHandWrite;
use crate::handwritten::{HandLock, PgHand};
use crate::measure::{BoxError, Contender};

/// Connects to the PostgreSQL server at `url`.
pub async fn connect(url: &str) -> Result<Server<Postgres>, sqlx::Error> {
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

/// Runs the bench's own DDL (text built from its constant table names).
async fn run(pool: &PgPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

impl LockDb for Postgres {
    async fn drop_lock_table(pool: &PgPool, table: &str) -> Result<(), sqlx::Error> {
        run(
            pool,
            format!(
                "DROP TABLE IF EXISTS {table}, {table}_history, {table}_ticket, {table}_epoch, {table}_events; \
                 DROP SEQUENCE IF EXISTS {table}_fencing_seq, {table}_ticket_seq; \
                 DROP FUNCTION IF EXISTS {table}_new_epoch()"
            ),
        )
        .await
    }

    async fn dedicated_pool(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
        let options: PgConnectOptions = url.parse()?;
        pool_settings::<Postgres>()
            .max_connections(max_connections)
            .connect_with(options.application_name(DEDICATED_APP))
            .await
    }
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

    fn select_one(pool: &PgPool) -> Statement {
        let pool = pool.clone();
        Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move {
                let _ = sqlx::query("SELECT 1").execute(&pool).await;
            })
        })
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

    async fn queue_session(
        url: &str,
        key: &str,
        _wait: Duration,
    ) -> Result<Box<dyn QueueSession>, sqlx::Error> {
        // `pg_advisory_lock` takes no timeout: a round's end cuts it off.
        session(url, key).await
    }

    fn peer_rw_lock(pool: &PgPool) -> Option<PeerRwLock> {
        let side = |shared| {
            Arc::new(AdvisoryRwLock {
                pool: pool.clone(),
                key: advisory_key("bench-rw-peer"),
                shared,
            }) as Arc<dyn Contender>
        };
        Some(PeerRwLock {
            text: PEER_TEXT,
            read: side(true),
            write: side(false),
        })
    }

    fn hand_write(pool: &PgPool, table: &str) -> Option<Arc<dyn Contender>> {
        Some(Arc::new(PgHandWrite::new(pool.clone(), table)))
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

/// PostgreSQL: a session-level advisory lock on a 64-bit key.
struct PgSession {
    conn: PgConnection,
    key: i64,
}

impl QueueSession for PgSession {
    fn lock(&mut self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(self.key)
                .execute(&mut self.conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }

    fn unlock(&mut self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let released: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                .bind(self.key)
                .fetch_one(&mut self.conn)
                .await
                .map_err(|e| e.to_string())?;
            if released {
                Ok(())
            } else {
                Err("pg_advisory_unlock: the session did not hold the key".into())
            }
        })
    }
}

/// Opens a PostgreSQL session for `key`.
async fn session(url: &str, key: &str) -> Result<Box<dyn QueueSession>, sqlx::Error> {
    Ok(Box::new(PgSession {
        conn: PgConnection::connect(url).await?,
        key: advisory_key(key),
    }))
}

/// `key` hashed to an advisory lock's 64-bit key (the same in every session of this
/// process).
fn advisory_key(key: &str) -> i64 {
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    i64::from_ne_bytes(hasher.finish().to_ne_bytes())
}

const PEER_TEXT: &str = "the Rust `distributed-lock` crate's PostgreSQL reader-writer \
    lock, as its design is described (session advisory locks on a pooled connection that \
    the lock keeps for as long as it is held): a read is `SELECT \
    pg_advisory_lock_shared($1)` then `SELECT pg_advisory_unlock_shared($1)`, a write \
    `pg_advisory_lock` / `pg_advisory_unlock`, on one connection checked out of the pool \
    for the cycle. The crate is not available offline: these are its statements written \
    by hand with sqlx, not the crate (no timeout, keepalive or lost-lock watch of its own, \
    which would only add to its side). A version of it seen in a public repository \
    waits with `pg_try_advisory_lock*` and a sleep (50 ms doubling to 1 s) instead; the \
    blocking form, queued in the server, is the stronger peer for writers that contend";

/// A read or a write of the peer reader-writer lock ([`PEER_TEXT`]).
struct AdvisoryRwLock {
    pool: PgPool,
    key: i64,
    shared: bool,
}

impl Contender for AdvisoryRwLock {
    fn name(&self) -> &str {
        if self.shared {
            "peer read: pg_advisory_lock_shared + unlock"
        } else {
            "peer write: pg_advisory_lock + unlock"
        }
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let (lock, unlock) = if self.shared {
                (
                    "SELECT pg_advisory_lock_shared($1)",
                    "SELECT pg_advisory_unlock_shared($1)",
                )
            } else {
                (
                    "SELECT pg_advisory_lock($1)",
                    "SELECT pg_advisory_unlock($1)",
                )
            };
            // The lock keeps its connection until it is released: a session lock lives
            // in the session that took it.
            let mut conn = self.pool.acquire().await?;
            sqlx::query(lock).bind(self.key).execute(&mut *conn).await?;
            let released: bool = sqlx::query_scalar(unlock)
                .bind(self.key)
                .fetch_one(&mut *conn)
                .await?;
            Ok(released)
        })
    }
}
