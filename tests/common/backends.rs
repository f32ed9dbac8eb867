//! The three [`TestBackend`]s: how to reach each database and the few SQL spellings that
//! differ. Running a statement is the same code for every sqlx type, so a macro writes it.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;
use sqlx::pool::PoolOptions;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, MySql, Pool, Postgres, Sqlite};
use tokio::time::Instant;

use super::{Arg, TestBackend, Unavailable, servers};

/// `exec` and `fetch_i64`, identical for every sqlx database type.
macro_rules! run_statements {
    () => {
        fn fenced_add<'a>(
            pool: &'a Pool<Self>,
            guard: &'a dblock::LockGuard<Self>,
            counter: &'a str,
            delta: i64,
        ) -> impl Future<Output = Result<i64, dblock::Error>> + Send + 'a {
            async move {
                let mut tx = pool.begin().await?;
                guard.assert_held(&mut tx).await?;
                let add = format!("UPDATE {counter} SET v = v + {delta} WHERE id = 1");
                sqlx::query(sqlx::AssertSqlSafe(add))
                    .execute(&mut *tx)
                    .await?;
                let read = format!("SELECT v FROM {counter} WHERE id = 1");
                let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(read))
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(now)
            }
        }

        fn fenced_add_after<'a>(
            pool: &'a Pool<Self>,
            guard: &'a dblock::LockGuard<Self>,
            counter: &'a str,
            meanwhile: std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>,
        ) -> impl Future<Output = Result<(), (&'static str, dblock::Error)>> + Send + 'a {
            async move {
                let db = |err: sqlx::Error| ("setup", dblock::Error::from(err));
                let mut conn = pool.acquire().await.map_err(db)?;
                // A session setting must not go back to the pool with the connection.
                conn.close_on_drop();
                let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db)?;
                if let Some(strict) = Self::STRICT_SNAPSHOT {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(strict))
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                }
                let read = format!("SELECT v FROM {counter} WHERE id = 1");
                let _: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(read))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                guard
                    .assert_held(&mut tx)
                    .await
                    .map_err(|err| ("check", err))?;
                meanwhile.await;
                let add = format!("UPDATE {counter} SET v = v + 1 WHERE id = 1");
                if let Err(err) = sqlx::query(sqlx::AssertSqlSafe(add))
                    .execute(&mut *tx)
                    .await
                {
                    return Err(("write", guard.explain(err).await));
                }
                guard.commit(tx).await.map_err(|err| ("commit", err))
            }
        }

        fn run_script(
            pool: &Pool<Self>,
            sql: String,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
            async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(pool)
                    .await?;
                Ok(())
            }
        }

        fn exec(
            pool: &Pool<Self>,
            sql: String,
            args: Vec<Arg>,
        ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for arg in args {
                query = match arg {
                    Arg::Text(text) => query.bind(text),
                    Arg::Int(int) => query.bind(int),
                };
            }
            async move { Ok(query.execute(pool).await?.rows_affected()) }
        }

        fn fetch_i64(
            pool: &Pool<Self>,
            sql: String,
            args: Vec<Arg>,
        ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send {
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            for arg in args {
                query = match arg {
                    Arg::Text(text) => query.bind(text),
                    Arg::Int(int) => query.bind(int),
                };
            }
            async move { query.fetch_optional(pool).await }
        }
    };
}

/// Connects to a server, retrying for a while: a container that was just started may
/// not accept connections yet.
async fn connect_server<DB: sqlx::Database>(options: PoolOptions<DB>, url: &str) -> Pool<DB> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match options.clone().connect(url).await {
            Ok(pool) => return pool,
            Err(err) if Instant::now() < deadline && matches!(err, sqlx::Error::Io(_)) => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(err) => panic!("cannot connect to {url}: {err}"),
        }
    }
}

impl TestBackend for Postgres {
    const LABEL: &'static str = "postgres";
    const STRICT_SNAPSHOT: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    const MIGRATION_FILES: usize = 5;
    const NOW: &'static str = "now()";
    const HEARS_RELEASES: bool = true;
    const LISTENER_SESSIONS: bool = true;
    const HANDOFF_IN_RELEASE: bool = true;

    fn locate() -> Result<String, Unavailable> {
        servers::postgres_url()
    }

    fn url(location: &str) -> String {
        location.to_owned()
    }

    async fn connect(location: &str, max: u32) -> Pool<Self> {
        connect_server(PgPoolOptions::new().max_connections(max), location).await
    }

    fn param(n: usize) -> String {
        format!("${n}")
    }

    fn now_plus(secs: i64) -> String {
        format!("now() + interval '{secs} seconds'")
    }

    fn cleanup_sql(t: &str) -> Vec<String> {
        vec![
            "SET lock_timeout = '10s'".to_owned(),
            format!(
                "DROP TABLE IF EXISTS {t}, {t}_history, {t}_counter, {t}_ticket, {t}_epoch, {t}_events"
            ),
            format!("DROP SEQUENCE IF EXISTS {t}_fencing_seq, {t}_ticket_seq"),
            format!("DROP FUNCTION IF EXISTS {t}_new_epoch()"),
        ]
    }

    fn forget(_: &str) {}

    /// Probed as the crate's documentation says its listener checks itself: a startup
    /// setting of our own must read back. PgBouncer refuses it ("unsupported startup
    /// parameter in options") or drops it. Simple-protocol statements only: nothing is
    /// prepared on a server connection a pooler may share.
    async fn sessions_of_their_own(location: &str) -> bool {
        let mark = uuid::Uuid::new_v4().simple().to_string();
        let options = PgConnectOptions::from_str(location)
            .expect("a PostgreSQL URL")
            .options([("dblock_test.session", mark.as_str())]);
        let mut conn = match PgConnection::connect_with(&options).await {
            Ok(conn) => conn,
            Err(sqlx::Error::Database(db))
                if db.message().contains("unsupported startup parameter") =>
            {
                return false;
            }
            Err(err) => panic!("cannot connect to {location}: {err}"),
        };
        let read = "SELECT current_setting('dblock_test.session', true)";
        let row = sqlx::raw_sql(read).fetch_one(&mut conn).await.unwrap();
        let seen: Option<String> = sqlx::Row::get(&row, 0);
        conn.close().await.unwrap();
        seen.as_deref() == Some(mark.as_str())
    }

    run_statements!();
}

impl TestBackend for MySql {
    const LABEL: &'static str = "mysql";
    // MariaDB 10.6.18+ (on by default from 11.6); MySQL 8 has no such setting.
    const STRICT_SNAPSHOT: Option<&'static str> =
        Some("SET SESSION innodb_snapshot_isolation = ON");
    const MIGRATION_FILES: usize = 3;
    const NOW: &'static str = "NOW()";
    const HEARS_RELEASES: bool = false;
    const HANDOFF_IN_RELEASE: bool = false;
    const WAKES_BY_BELLS: bool = true;

    fn locate() -> Result<String, Unavailable> {
        servers::mysql_url()
    }

    fn url(location: &str) -> String {
        location.to_owned()
    }

    async fn connect(location: &str, max: u32) -> Pool<Self> {
        connect_server(MySqlPoolOptions::new().max_connections(max), location).await
    }

    fn param(_: usize) -> String {
        "?".to_owned()
    }

    fn now_plus(secs: i64) -> String {
        format!("NOW() + INTERVAL {secs} SECOND")
    }

    fn cleanup_sql(t: &str) -> Vec<String> {
        vec![
            "SET SESSION lock_wait_timeout = 10".to_owned(),
            format!(
                "DROP TABLE IF EXISTS {t}, {t}_history, {t}_fencing, {t}_counter, {t}_ticket, {t}_migrating, {t}_events"
            ),
        ]
    }

    fn forget(_: &str) {}

    async fn sessions_of_their_own(_: &str) -> bool {
        true
    }

    run_statements!();
}

impl TestBackend for Sqlite {
    const LABEL: &'static str = "sqlite";
    const STRICT_SNAPSHOT: Option<&'static str> = None;
    const MIGRATION_FILES: usize = 4;
    const NOW: &'static str = "datetime('now')";
    const HEARS_RELEASES: bool = true;
    const HANDOFF_IN_RELEASE: bool = false;

    /// Every test gets a file of its own.
    fn locate() -> Result<String, Unavailable> {
        let name = format!("dblock-test-{}.sqlite3", uuid::Uuid::new_v4().simple());
        let path = std::env::temp_dir().join(name);
        Ok(path.to_str().expect("a UTF-8 temp dir").to_owned())
    }

    /// The file [`locate`](Self::locate) named, which [`connect`](Self::connect) creates.
    fn url(location: &str) -> String {
        format!("sqlite://{location}")
    }

    async fn connect(location: &str, max: u32) -> Pool<Self> {
        let options = SqliteConnectOptions::new()
            .filename(location)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        let opened = async {
            // Create the file once; the pool itself never creates it, so a connection
            // opened late (by a guard's background release) cannot resurrect it after
            // the test removed it.
            let created = options.clone().create_if_missing(true);
            SqliteConnection::connect_with(&created)
                .await?
                .close()
                .await?;
            SqlitePoolOptions::new()
                .max_connections(max)
                .connect_with(options)
                .await
        };
        opened
            .await
            .unwrap_or_else(|err| panic!("cannot open {location}: {err}"))
    }

    fn param(n: usize) -> String {
        format!("?{n}")
    }

    /// The marks are `<table>_waiter`'s, one per waiting Locker, on the key or its group
    /// (`<name>~`), each naming the row it was left for.
    fn marked_sql(table: &str) -> String {
        format!(
            "SELECT COUNT(*) FROM {table} AS t JOIN {table}_waiter AS w
                ON w.lock_key IN (t.lock_key, rtrim(t.lock_key, replace(t.lock_key, '~', '')))
               AND w.fencing_token = t.fencing_token
             WHERE t.lock_key = ?1"
        )
    }

    fn now_plus(secs: i64) -> String {
        format!("datetime('now', '{secs:+} seconds')")
    }

    fn cleanup_sql(_: &str) -> Vec<String> {
        Vec::new()
    }

    fn forget(location: &str) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(PathBuf::from(format!("{location}{suffix}")));
        }
    }

    async fn sessions_of_their_own(_: &str) -> bool {
        true
    }

    run_statements!();
}
