//! Connecting to the servers, and the few per-database statements the bench itself needs
//! (creating and dropping its tables, filling the reaper's table, reading server counters,
//! the server-side queue's own locks, the peer's advisory read-write lock): what every
//! section shares, as [`BenchDb`], one file per database (`postgres`, `mysql`, `sqlite`)
//! for its statements. SQLite has only [`LockDb`], what the cells with worker processes
//! need: a lock table and pools of their own on one database file.

pub mod mysql;
pub mod postgres;
pub mod sqlite;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dblock::{Backend, Locker};
use futures::future::BoxFuture;
use sqlx::Pool;

use crate::handwritten::HandLock;
use crate::measure::Contender;

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

impl<DB: LockDb> Server<DB> {
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

/// Sends one cheap statement (`SELECT 1`) on the backend's pool.
pub type Statement = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// One task's session, which takes one key with the server's own lock.
pub trait QueueSession: Send {
    /// Waits in the server until the key is granted.
    fn lock(&mut self) -> BoxFuture<'_, Result<(), String>>;

    /// Gives the key back (an error if the session did not hold it).
    fn unlock(&mut self) -> BoxFuture<'_, Result<(), String>>;
}

/// What every cell needs of a database beyond dblock itself: a lock table it can drop
/// and pools of its own. Enough for the cells whose worker processes each build their
/// own Locker (3.2, 7.2, 7.3), which is all the bench runs on SQLite.
pub trait LockDb: Backend {
    /// Drops a dblock lock table and everything its migration created.
    fn drop_lock_table(
        pool: &Pool<Self>,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// A pool of its own for one section or worker process (same settings,
    /// `max_connections` of them), named where the server can show client names, so the
    /// section can close it and see its sessions gone.
    fn dedicated_pool(
        url: &str,
        max_connections: u32,
    ) -> impl Future<Output = Result<Pool<Self>, sqlx::Error>> + Send;
}

/// A reader-writer lock of another library, where the database has one to compare
/// with (cell 7.4): its read and its write, each taken and given back, as contenders.
pub struct PeerRwLock {
    /// Words for the report: what the peer is and what it sends.
    pub text: &'static str,
    pub read: Arc<dyn Contender>,
    pub write: Arc<dyn Contender>,
}

/// What the bench needs from each server beyond dblock itself.
pub trait BenchDb: LockDb {
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

    /// The same statements dblock sends, hand-written, on `table`.
    fn hand(pool: &Pool<Self>, table: &str) -> Arc<dyn HandLock>;

    /// The floor of two-statement locks ([`Floor`](crate::handwritten::floor::Floor)) on `pool`.
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
    fn select_one(pool: &Pool<Self>) -> Statement;

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
    /// cell 3.1 (`hotkey::queue`) takes the key with.
    const QUEUE_LOCK: &'static str;

    /// A connection of its own on `url` that takes `key` with [`QUEUE_LOCK`](Self::QUEUE_LOCK),
    /// waiting at most `wait` where the lock takes a timeout (MariaDB's `GET_LOCK`).
    fn queue_session(
        url: &str,
        key: &str,
        wait: Duration,
    ) -> impl Future<Output = Result<Box<dyn QueueSession>, sqlx::Error>> + Send;

    /// The peer reader-writer lock of cell 7.4 on `pool`, where there is one (PostgreSQL);
    /// `None` elsewhere.
    fn peer_rw_lock(_pool: &Pool<Self>) -> Option<PeerRwLock> {
        None
    }

    /// dblock's statements of a read-write lock's write and its release, hand-written on
    /// `table` (cell 7.4), where the write is one statement (PostgreSQL); `None` elsewhere.
    fn hand_write(_pool: &Pool<Self>, _table: &str) -> Option<Arc<dyn Contender>> {
        None
    }
}

/// The client name of the sessions of a dedicated pool.
const DEDICATED_APP: &str = "dblock-bench-dedicated";

/// A pool of one connection of its own for the statement readings (so nothing else is
/// counted on it), with `table` freshly migrated on it, after waiting out the server's
/// statistics lag (counts of earlier work still held by idle sessions must not land in
/// a round).
pub async fn counting_admin<DB: BenchDb>(
    server: &Server<DB>,
    table: &str,
) -> Result<Pool<DB>, Box<dyn std::error::Error>> {
    let admin: Pool<DB> = pool_settings::<DB>()
        .max_connections(1)
        .connect(&server.url)
        .await?;
    DB::drop_lock_table(&admin, table).await?;
    Locker::builder(admin.clone())
        .table(table)
        .build()?
        .migrate()
        .await?;
    tokio::time::sleep(DB::STATISTICS_LAG).await;
    Ok(admin)
}
