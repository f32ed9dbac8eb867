//! Test harness shared by the backend test binaries: where each database is, a fresh
//! table per test, and a "plain SQL client" that talks to the lock table the way an
//! application without dblock would.

mod backends;
#[allow(dead_code)] // only the SQLite and console cases count writes
#[cfg(feature = "sqlite")]
pub mod counted;
pub mod proxy;
#[allow(dead_code)] // only the PostgreSQL cases make schemas
#[cfg(feature = "postgres")]
pub mod schemas;
mod servers;
/// Skips (or, when `DBLOCK_TEST_REQUIRE` names it, fails) what needs a missing tool.
#[allow(unused_imports)] // only the browser test skips something other than a backend
pub use servers::skip;

use std::future::Future;
use std::time::Duration;

use dblock::{Backend, Locker};
use sqlx::Pool;
use tokio::time::Instant;

/// A bind parameter of a plain-SQL statement.
pub enum Arg {
    Text(String),
    Int(i64),
}

impl From<&str> for Arg {
    fn from(s: &str) -> Self {
        Arg::Text(s.to_owned())
    }
}

impl From<i64> for Arg {
    fn from(i: i64) -> Self {
        Arg::Int(i)
    }
}

/// What the tests need from a backend beyond dblock itself. SQL text is assembled once,
/// in [`Plain`], from the few spellings that differ.
pub trait TestBackend: Backend {
    /// The name used in messages and in `DBLOCK_TEST_REQUIRE`.
    const LABEL: &'static str;
    /// How many migration files the backend has (`migrations/<backend>/`).
    const MIGRATION_FILES: usize;
    /// The database clock as a plain client writes it.
    const NOW: &'static str;
    /// Whether a release wakes waiters of other Lockers (PostgreSQL `LISTEN`/`NOTIFY`,
    /// SQLite's listener on a database file); elsewhere they poll, and a Locker never
    /// reports [`Locker::listening`].
    const HEARS_RELEASES: bool;
    /// Whether a listener is a server session the tests can count and end
    /// ([`Plain::listeners`], [`Plain::kill_listeners`]: PostgreSQL).
    const LISTENER_SESSIONS: bool = false;
    /// Whether a release hands the row to the next local waiter in its own statement
    /// (PostgreSQL); elsewhere the waiter acquires after the release.
    const HANDOFF_IN_RELEASE: bool;
    /// Whether waiters of other Lockers are woken by bells, the server-side named locks
    /// of MySQL/MariaDB (see `conformance/bells.rs`); a Locker then listens there too.
    const WAKES_BY_BELLS: bool = false;

    /// Where a test's database is: a server URL, or a fresh SQLite file. `Err` says why
    /// the backend is unavailable.
    fn locate() -> Result<String, Unavailable>;

    /// `location` as a database URL, whose scheme names the backend (what
    /// [`dblock::AnyLocker::connect`] takes).
    fn url(location: &str) -> String;

    /// A pool on `location` with at most `max` connections.
    fn connect(location: &str, max: u32) -> impl Future<Output = Pool<Self>> + Send;

    /// The placeholder of the `n`-th (1-based) bind parameter.
    fn param(n: usize) -> String;

    /// A query counting the marks that waiters left on the live row of the key bound
    /// first, for that row: PostgreSQL's `waiters` column by default.
    fn marked_sql(table: &str) -> String {
        format!(
            "SELECT COUNT(*) FROM {table} WHERE lock_key = {} AND waiters",
            Self::param(1)
        )
    }

    /// The database clock plus `secs` seconds (negative for the past), as a plain client
    /// writes it.
    fn now_plus(secs: i64) -> String;

    /// Statements that remove everything a test created for `table` (server backends).
    fn cleanup_sql(table: &str) -> Vec<String>;

    /// Removes whatever is left of `location` once its pools are gone (SQLite files).
    fn forget(location: &str);

    /// Whether a connection to `location` is a session of its own, so that a release
    /// listener may be opened there (see [`TestDb::hears_releases`]).
    fn sessions_of_their_own(location: &str) -> impl Future<Output = bool> + Send;

    /// In one transaction: checks that `guard` still holds its lock
    /// ([`LockGuard::assert_held`](dblock::LockGuard::assert_held)), adds `delta` to the
    /// one-row counter table `counter` (see [`TestDb::counter_create`]) and reads it back;
    /// the new value.
    fn fenced_add<'a>(
        pool: &'a Pool<Self>,
        guard: &'a dblock::LockGuard<Self>,
        counter: &'a str,
        delta: i64,
    ) -> impl Future<Output = Result<i64, dblock::Error>> + Send + 'a;

    /// A statement that, run first in a transaction, makes a write to a row that another
    /// transaction changed since this one's snapshot fail as a conflict rollback
    /// (PostgreSQL: REPEATABLE READ, 40001; MariaDB: `innodb_snapshot_isolation`, 1020).
    /// `None` where no such conflict exists (SQLite: one writer at a time).
    const STRICT_SNAPSHOT: Option<&'static str>;

    /// On a connection of its own, in one transaction: runs [`Self::STRICT_SNAPSHOT`],
    /// reads the counter (the snapshot), checks `guard` with `assert_held`, awaits
    /// `meanwhile`, adds 1 to the counter and ends with `guard.commit`. The first error
    /// with the step that gave it (`"check"`, `"write"`, `"commit"`), a write error read
    /// by `guard.explain`.
    fn fenced_add_after<'a>(
        pool: &'a Pool<Self>,
        guard: &'a dblock::LockGuard<Self>,
        counter: &'a str,
        meanwhile: std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
    ) -> impl Future<Output = Result<(), (&'static str, dblock::Error)>> + Send + 'a;

    /// Runs a script of several statements as one unit, as a migration tool would.
    fn run_script(
        pool: &Pool<Self>,
        sql: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Runs one statement; the number of rows it affected.
    fn exec(
        pool: &Pool<Self>,
        sql: String,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Runs one query returning at most one integer.
    fn fetch_i64(
        pool: &Pool<Self>,
        sql: String,
        args: Vec<Arg>,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;
}

/// Why a backend cannot be tested here.
#[derive(Clone)]
pub enum Unavailable {
    /// Nothing configured and no way to start one: skip (unless required).
    Skip(String),
    /// Configured or startable, but broken: always a failure.
    Broken(String),
}

/// One test's database: its own pool and its own, randomly named lock table.
pub struct TestDb<DB: TestBackend> {
    pub location: String,
    pub pool: Pool<DB>,
    pub table: String,
    /// A locker on `table` with default options, except that it does not renew.
    pub locker: Locker<DB>,
    /// The plain-SQL client on `table`.
    pub plain: Plain<DB>,
}

const POOL_SIZE: u32 = 16;

impl<DB: TestBackend> TestDb<DB> {
    /// A fresh table, migrated. `None` when the backend is skipped.
    pub async fn open() -> Option<Self> {
        let db = Self::open_unmigrated().await?;
        let applied = db.locker.migrate().await.expect("migrate a fresh table");
        assert_eq!(
            applied,
            DB::MIGRATION_FILES,
            "the first migrate of a fresh table applies every migration"
        );
        Some(db)
    }

    /// A fresh table name with nothing created yet.
    pub async fn open_unmigrated() -> Option<Self> {
        let location = match DB::locate() {
            Ok(location) => location,
            Err(Unavailable::Broken(reason)) => panic!("{}: {reason}", DB::LABEL),
            Err(Unavailable::Skip(reason)) => {
                servers::skip(DB::LABEL, &reason);
                return None;
            }
        };
        let pool = DB::connect(&location, POOL_SIZE).await;
        // 14 characters: derived names (`<t>_fencing_seq`, `<t>_history`) stay short.
        let table = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        // The core suite times leases itself (short leases must run out), so its locker
        // does not renew; the lease suite builds renewing lockers of its own.
        let locker = Locker::builder(pool.clone())
            .table(&table)
            .auto_renew(false)
            .build()
            .expect("a valid table name");
        let plain = Plain {
            pool: pool.clone(),
            table: table.clone(),
        };
        Some(TestDb {
            location,
            pool,
            table,
            locker,
            plain,
        })
    }

    /// Whether waiters of this database are woken by releases in other Lockers: the
    /// backend notifies ([`TestBackend::HEARS_RELEASES`]) and its address is a server
    /// session of its own. Behind a pooler (CI runs the PostgreSQL suite through
    /// PgBouncer too) dblock does not open its listener, and waiters poll.
    pub async fn hears_releases(&self) -> bool {
        DB::HEARS_RELEASES && DB::sessions_of_their_own(&self.location).await
    }

    /// A second, independent pool on the same database (another "process").
    pub async fn another_pool(&self) -> Pool<DB> {
        DB::connect(&self.location, POOL_SIZE).await
    }
}

impl<DB: TestBackend> Drop for TestDb<DB> {
    /// Drops the test's tables, also after a failed assertion. Runs on a thread of its
    /// own with its own runtime and connection: the test's runtime may be unwinding.
    fn drop(&mut self) {
        let location = self.location.clone();
        let statements = DB::cleanup_sql(&self.table);
        let cleanup = std::thread::spawn(move || {
            if !statements.is_empty() {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for cleanup");
                runtime.block_on(async {
                    let pool = DB::connect(&location, 1).await;
                    for sql in statements {
                        if let Err(err) = DB::exec(&pool, sql.clone(), vec![]).await {
                            eprintln!("cleanup `{sql}` failed: {err}");
                        }
                    }
                    pool.close().await;
                });
            }
            DB::forget(&location);
        });
        let _ = cleanup.join();
    }
}

/// A client that knows nothing of dblock: it reads and writes the lock table with
/// hand-written SQL and the database's own clock.
pub struct Plain<DB: TestBackend> {
    pool: Pool<DB>,
    table: String,
}

impl<DB: TestBackend> Clone for Plain<DB> {
    fn clone(&self) -> Self {
        Plain {
            pool: self.pool.clone(),
            table: self.table.clone(),
        }
    }
}

impl<DB: TestBackend> Plain<DB> {
    /// `INSERT` of the three documented columns, expiring `secs` seconds from the
    /// database's now.
    pub async fn insert(&self, key: &str, value: &str, secs: i64) -> Result<(), sqlx::Error> {
        let sql = format!(
            "INSERT INTO {} (lock_key, lock_value, expire_time) VALUES ({}, {}, {})",
            self.table,
            DB::param(1),
            DB::param(2),
            DB::now_plus(secs)
        );
        DB::exec(&self.pool, sql, vec![key.into(), value.into()])
            .await
            .map(|_| ())
    }

    /// Owner-checked release: deletes the row only if `value` owns it.
    pub async fn delete_owned(&self, key: &str, value: &str) -> u64 {
        let sql = format!(
            "DELETE FROM {} WHERE lock_key = {} AND lock_value = {}",
            self.table,
            DB::param(1),
            DB::param(2)
        );
        DB::exec(&self.pool, sql, vec![key.into(), value.into()])
            .await
            .expect("plain owner-checked delete")
    }

    /// Deletes the key's row whoever owns it (an operator's cleanup).
    pub async fn delete(&self, key: &str) -> u64 {
        let sql = format!(
            "DELETE FROM {} WHERE lock_key = {}",
            self.table,
            DB::param(1)
        );
        DB::exec(&self.pool, sql, vec![key.into()])
            .await
            .expect("plain delete")
    }

    /// Deletes every row that expired by the database clock.
    pub async fn reap(&self) -> u64 {
        let sql = format!("DELETE FROM {} WHERE expire_time < {}", self.table, DB::NOW);
        DB::exec(&self.pool, sql, vec![]).await.expect("plain reap")
    }

    /// Whether the key's row has expired as the plain client reads the clock.
    pub async fn is_expired(&self, key: &str) -> bool {
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE lock_key = {} AND expire_time < {}",
            self.table,
            DB::param(1),
            DB::NOW
        );
        let n = DB::fetch_i64(&self.pool, sql, vec![key.into()]).await;
        n.expect("plain expiry check") == Some(1)
    }

    /// Whether a waiter marked the key's row, asking its release to wake it (where
    /// releases are heard: [`TestBackend::marked_sql`]).
    pub async fn marked(&self, key: &str) -> bool {
        let sql = DB::marked_sql(&self.table);
        let n = DB::fetch_i64(&self.pool, sql, vec![key.into()]).await;
        n.expect("read the waiters mark").unwrap_or(0) > 0
    }

    /// The condition on `pg_stat_activity` that picks the release listeners of this
    /// table: dblock names them, and a listener's last statement is its `LISTEN` (sqlx
    /// appends a `;` when it listens again after reconnecting by itself).
    fn listener_sessions(&self) -> String {
        let listen = format!(r#"LISTEN "dblock:{}""#, self.table);
        format!("application_name = 'dblock-listener' AND query IN ('{listen}', '{listen};')")
    }

    /// How many release listeners of this table are connected (PostgreSQL only).
    pub async fn listeners(&self) -> i64 {
        let sql = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE {}",
            self.listener_sessions()
        );
        let n = DB::fetch_i64(&self.pool, sql, vec![]).await;
        n.expect("count listeners").expect("COUNT returns a row")
    }

    /// Terminates the release listeners of this table, as a server restart or an
    /// operator would (PostgreSQL only); how many it terminated. Only the rows the
    /// condition picks are terminated: the call is in the select list, not the WHERE.
    pub async fn kill_listeners(&self) -> i64 {
        let sql = format!(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) AS killed \
               FROM pg_stat_activity WHERE {}) AS k WHERE killed",
            self.listener_sessions()
        );
        let n = DB::fetch_i64(&self.pool, sql, vec![]).await;
        n.expect("terminate listeners")
            .expect("COUNT returns a row")
    }

    /// Rows in the lock table.
    pub async fn row_count(&self) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {}", self.table);
        let n = DB::fetch_i64(&self.pool, sql, vec![]).await;
        n.expect("count rows").expect("COUNT returns a row")
    }

    pub fn counter_table(&self) -> String {
        format!("{}_counter", self.table)
    }

    /// A one-row counter table next to the lock table, starting at zero.
    pub async fn counter_create(&self) {
        let table = self.counter_table();
        let create = format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, v BIGINT NOT NULL)");
        DB::exec(&self.pool, create, vec![])
            .await
            .expect("create counter");
        let insert = format!("INSERT INTO {table} (id, v) VALUES (1, 0)");
        DB::exec(&self.pool, insert, vec![])
            .await
            .expect("insert counter");
    }

    pub async fn counter_get(&self) -> i64 {
        let sql = format!("SELECT v FROM {} WHERE id = 1", self.counter_table());
        let v = DB::fetch_i64(&self.pool, sql, vec![]).await;
        v.expect("read counter").expect("the counter row")
    }

    pub async fn counter_set(&self, v: i64) {
        let sql = format!(
            "UPDATE {} SET v = {} WHERE id = 1",
            self.counter_table(),
            DB::param(1)
        );
        let n = DB::exec(&self.pool, sql, vec![v.into()]).await;
        assert_eq!(n.expect("write counter"), 1);
    }
}

/// Whether a plain-SQL error is a duplicate key.
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Polls `check` every 10 ms until it holds; fails the test after `limit`.
pub async fn wait_until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `per_backend!(case, ..)`: a `#[tokio::test]` for each case on PostgreSQL, MySQL/MariaDB
/// and SQLite, in modules named after them (for the binaries whose cases are generic
/// functions; the conformance binaries instantiate theirs one per backend file).
#[allow(unused_macros)]
macro_rules! per_backend {
    ($($case:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case::<dblock::Postgres>().await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case::<dblock::MySql>().await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() { super::$case::<dblock::Sqlite>().await } )* }
    };
}
