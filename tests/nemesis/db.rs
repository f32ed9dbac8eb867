//! What the nemesis test says to each database besides the lock calls: its own tables
//! (a counter per history and the history itself), the read-increment-write, reading the
//! history back, and killing the workers' sessions.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dblock::Backend;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, MySql, PgConnection, Pool, Postgres};

use crate::Res;

/// The three histories a run writes, each with a counter row of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Under the lock, the write fenced by `assert_held` in its transaction: must be clean.
    Guarded,
    /// No lock at all: must show lost updates, or the run proved nothing.
    Control,
    /// Under the lock, but the write not fenced (no check in the transaction): shows what
    /// the nemesis does to a lock alone. Reported, not judged.
    Unfenced,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Guarded, Kind::Control, Kind::Unfenced];

    /// The counter row's id and the history's `kind` column.
    pub fn id(self) -> i32 {
        match self {
            Kind::Guarded => 1,
            Kind::Control => 2,
            Kind::Unfenced => 3,
        }
    }

    pub fn from_id(id: i32) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.id() == id)
    }

    /// The lock key (the control takes no lock).
    pub fn key(self) -> &'static str {
        match self {
            Kind::Guarded => "nemesis:guarded",
            Kind::Control => "nemesis:control",
            Kind::Unfenced => "nemesis:unfenced",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Guarded => "guarded",
            Kind::Control => "control",
            Kind::Unfenced => "unfenced",
        })
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Kind, String> {
        Kind::ALL
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| format!("no history kind {s:?}"))
    }
}

/// The names of one run's tables: the lock table (and what `migrate` adds to its name),
/// the counters and the history. Random, so a run shares a server with anything else.
#[derive(Debug, Clone)]
pub struct Names {
    pub lock: String,
    pub counter: String,
    pub history: String,
}

impl Names {
    pub fn random() -> Names {
        let random = uuid::Uuid::new_v4().simple().to_string();
        Names::from_lock(&format!("nem_{}", &random[..10]))
    }

    pub fn from_lock(lock: &str) -> Names {
        Names {
            lock: lock.to_owned(),
            counter: format!("{lock}_counter"),
            history: format!("{lock}_log"),
        }
    }
}

/// A write to append: the history row without its sequence number and time, which the
/// database assigns.
#[derive(Debug, Clone, Copy)]
pub struct Write {
    pub kind: Kind,
    pub worker: i32,
    pub incarnation: i32,
    /// The fencing token of the hold it was made under (0: no lock).
    pub token: i64,
    pub read: i64,
    pub written: i64,
}

/// One committed write, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// Its place in the commit order of its counter's writes: the counter row's write
    /// count (`n = n + 1`), taken under that row's lock in the writing transaction.
    pub seq: i64,
    pub worker: i32,
    pub incarnation: i32,
    pub token: i64,
    pub read: i64,
    pub written: i64,
    /// The database clock at the write (`clock_timestamp()`, `NOW(6)`).
    pub at: DateTime<Utc>,
}

/// A counter row at the end: the value, and how many writes it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    pub value: i64,
    pub writes: i64,
}

/// Whose sessions a session kill ends.
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    /// PostgreSQL: the `application_name` the worker's pool connects with.
    pub app: String,
    /// PostgreSQL: also the release listeners on this run's lock table.
    pub listeners: bool,
    /// MariaDB: the connection ids the worker reported (`CONNECTION_ID()`).
    pub ids: Vec<u64>,
}

/// A database the nemesis runs on, with the SQL it needs spelled for it.
pub trait NemesisDb: Backend {
    /// How the summary names it.
    const LABEL: &'static str;
    /// Its name in `DBLOCK_TEST_REQUIRE`.
    const REQUIRE: &'static str;
    /// Where its URL comes from.
    const URL_VAR: &'static str;

    /// A pool whose sessions carry `app` (PostgreSQL `application_name`); with `report`,
    /// each new connection prints `CONN <id>` on stdout (MariaDB, which has no
    /// application name a session can be picked by).
    fn connect(
        url: &str,
        app: &str,
        max: u32,
        report: bool,
    ) -> impl Future<Output = Res<Pool<Self>>> + Send;

    /// Creates the counters (three rows at 0) and the history table.
    fn create(pool: &Pool<Self>, names: &Names) -> impl Future<Output = Res<()>> + Send;

    /// Drops everything the run created, the lock table's too.
    fn drop_all(pool: &Pool<Self>, names: &Names) -> impl Future<Output = Res<()>> + Send;

    /// A plain (not locking) read of a counter.
    fn read_value(
        conn: &mut Self::Connection,
        names: &Names,
        kind: Kind,
    ) -> impl Future<Output = Res<i64>> + Send;

    /// Writes the counter and appends the history row, on `conn` (inside the caller's
    /// transaction): returns the write's sequence number.
    fn write(
        conn: &mut Self::Connection,
        names: &Names,
        write: &Write,
    ) -> impl Future<Output = Res<i64>> + Send;

    /// Every history row, by kind and sequence number.
    fn read_history(
        pool: &Pool<Self>,
        names: &Names,
    ) -> impl Future<Output = Res<Vec<Entry>>> + Send;

    /// The counters, by kind.
    fn counters(
        pool: &Pool<Self>,
        names: &Names,
    ) -> impl Future<Output = Res<Vec<(Kind, Counter)>>> + Send;

    /// Ends the sessions `which` picks, and no others; how many it ended.
    fn kill_sessions(
        pool: &Pool<Self>,
        names: &Names,
        which: &Sessions,
    ) -> impl Future<Output = Res<u64>> + Send;
}

/// How long a pool waits for a connection: long enough for a stalled server, short
/// enough that a wedged one is an error rather than a hang.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

fn counter_rows(names: &Names) -> String {
    let rows: Vec<String> = Kind::ALL
        .iter()
        .map(|k| format!("({}, 0, 0)", k.id()))
        .collect();
    format!(
        "INSERT INTO {} (id, v, n) VALUES {}",
        names.counter,
        rows.join(", ")
    )
}

type HistoryRow = (i32, i64, i32, i32, i64, i64, i64, DateTime<Utc>);

fn entries(rows: Vec<HistoryRow>) -> Res<Vec<Entry>> {
    rows.into_iter()
        .map(
            |(kind, seq, worker, incarnation, token, read, written, at)| {
                Ok(Entry {
                    kind: Kind::from_id(kind).ok_or_else(|| format!("history kind {kind}"))?,
                    seq,
                    worker,
                    incarnation,
                    token,
                    read,
                    written,
                    at,
                })
            },
        )
        .collect()
}

fn counters(rows: Vec<(i32, i64, i64)>) -> Res<Vec<(Kind, Counter)>> {
    rows.into_iter()
        .map(|(id, value, writes)| {
            let kind = Kind::from_id(id).ok_or_else(|| format!("counter id {id}"))?;
            Ok((kind, Counter { value, writes }))
        })
        .collect()
}

fn history_sql(names: &Names) -> String {
    format!(
        "SELECT kind, seq, worker, incarnation, token, value_read, value_written, written_at
           FROM {} ORDER BY kind, seq",
        names.history
    )
}

/// Appends the history row of write `w`, the `seq`-th of its counter, with `$insert`
/// (the server's spelling of the same eight columns, the last its clock).
macro_rules! append_history {
    ($conn:expr, $insert:expr, $w:expr, $seq:expr) => {
        sqlx::query(AssertSqlSafe($insert))
            .bind($w.kind.id())
            .bind($seq)
            .bind($w.worker)
            .bind($w.incarnation)
            .bind($w.token)
            .bind($w.read)
            .bind($w.written)
            .execute($conn)
            .await?
    };
}

/// The reads that are the same code for every server (sqlx's executor bounds do not lend
/// themselves to a generic body, so a macro spells them out per type).
macro_rules! same_everywhere {
    () => {
        async fn read_history(pool: &Pool<Self>, names: &Names) -> Res<Vec<Entry>> {
            let rows: Vec<HistoryRow> = sqlx::query_as(AssertSqlSafe(history_sql(names)))
                .fetch_all(pool)
                .await?;
            entries(rows)
        }

        async fn counters(pool: &Pool<Self>, names: &Names) -> Res<Vec<(Kind, Counter)>> {
            let sql = format!("SELECT id, v, n FROM {} ORDER BY id", names.counter);
            counters(sqlx::query_as(AssertSqlSafe(sql)).fetch_all(pool).await?)
        }
    };
}

impl NemesisDb for Postgres {
    const LABEL: &'static str = "postgres";
    const REQUIRE: &'static str = "postgres";
    const URL_VAR: &'static str = "DBLOCK_TEST_POSTGRES_URL";

    async fn connect(url: &str, app: &str, max: u32, _report: bool) -> Res<Pool<Self>> {
        let options = PgConnectOptions::from_str(url)?.application_name(app);
        Ok(PoolOptions::new()
            .max_connections(max)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?)
    }

    async fn create(pool: &Pool<Self>, names: &Names) -> Res<()> {
        let sql = format!(
            "CREATE TABLE {counter} (id INT PRIMARY KEY, v BIGINT NOT NULL, n BIGINT NOT NULL);
             {rows};
             CREATE TABLE {history} (
                 kind INT NOT NULL, seq BIGINT NOT NULL, worker INT NOT NULL,
                 incarnation INT NOT NULL, token BIGINT NOT NULL, value_read BIGINT NOT NULL,
                 value_written BIGINT NOT NULL, written_at TIMESTAMPTZ NOT NULL,
                 PRIMARY KEY (kind, seq))",
            counter = names.counter,
            rows = counter_rows(names),
            history = names.history,
        );
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
        Ok(())
    }

    async fn drop_all(pool: &Pool<Self>, names: &Names) -> Res<()> {
        let t = &names.lock;
        let sql = format!(
            "SET lock_timeout = '10s';
             DROP TABLE IF EXISTS {t}, {t}_history, {t}_ticket, {counter}, {history};
             DROP SEQUENCE IF EXISTS {t}_fencing_seq, {t}_ticket_seq;
             RESET lock_timeout",
            counter = names.counter,
            history = names.history,
        );
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
        Ok(())
    }

    async fn read_value(conn: &mut PgConnection, names: &Names, kind: Kind) -> Res<i64> {
        let sql = format!("SELECT v FROM {} WHERE id = $1", names.counter);
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(kind.id())
            .fetch_one(conn)
            .await?)
    }

    async fn write(conn: &mut PgConnection, names: &Names, w: &Write) -> Res<i64> {
        let update = format!(
            "UPDATE {} SET v = $1, n = n + 1 WHERE id = $2 RETURNING n",
            names.counter
        );
        let seq: i64 = sqlx::query_scalar(AssertSqlSafe(update))
            .bind(w.written)
            .bind(w.kind.id())
            .fetch_one(&mut *conn)
            .await?;
        let insert = format!(
            "INSERT INTO {} VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())",
            names.history
        );
        append_history!(conn, insert, w, seq);
        Ok(seq)
    }

    same_everywhere!();

    async fn kill_sessions(pool: &Pool<Self>, names: &Names, which: &Sessions) -> Res<u64> {
        // The worker's own sessions by their application name, which holds this run's
        // random name; release listeners (dblock names them itself) only when their
        // `LISTEN` is on this run's lock table. The call is in the select list, so only
        // the rows the condition picks are terminated.
        let listen = format!(r#"LISTEN "dblock:{}""#, names.lock);
        let killed: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (
                 SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
                  WHERE pid <> pg_backend_pid()
                    AND (application_name = $1
                         OR ($2 AND application_name = 'dblock-listener'
                                AND query IN ($3, $3 || ';')))) AS k
              WHERE killed",
        )
        .bind(&which.app)
        .bind(which.listeners)
        .bind(listen)
        .fetch_one(pool)
        .await?;
        Ok(u64::try_from(killed)?)
    }
}

/// ER_NO_SUCH_THREAD: the connection to kill is gone already.
const ER_NO_SUCH_THREAD: u16 = 1094;

impl NemesisDb for MySql {
    const LABEL: &'static str = "mariadb";
    const REQUIRE: &'static str = "mysql";
    const URL_VAR: &'static str = "DBLOCK_TEST_MYSQL_URL";

    async fn connect(url: &str, _app: &str, max: u32, report: bool) -> Res<Pool<Self>> {
        let options = MySqlConnectOptions::from_str(url)?;
        let mut pool = PoolOptions::new()
            .max_connections(max)
            .acquire_timeout(ACQUIRE_TIMEOUT);
        if report {
            pool = pool.after_connect(|conn: &mut MySqlConnection, _| {
                Box::pin(async move {
                    let id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
                        .fetch_one(conn)
                        .await?;
                    println!("CONN {id}");
                    Ok(())
                })
            });
        }
        Ok(pool.connect_with(options).await?)
    }

    async fn create(pool: &Pool<Self>, names: &Names) -> Res<()> {
        let create_counter = format!(
            "CREATE TABLE {} (id INT PRIMARY KEY, v BIGINT NOT NULL, n BIGINT NOT NULL)
             ENGINE = InnoDB",
            names.counter
        );
        let create_history = format!(
            "CREATE TABLE {} (
                 kind INT NOT NULL, seq BIGINT NOT NULL, worker INT NOT NULL,
                 incarnation INT NOT NULL, token BIGINT NOT NULL, value_read BIGINT NOT NULL,
                 value_written BIGINT NOT NULL, written_at TIMESTAMP(6) NOT NULL,
                 PRIMARY KEY (kind, seq)) ENGINE = InnoDB",
            names.history
        );
        for sql in [create_counter, counter_rows(names), create_history] {
            sqlx::query(AssertSqlSafe(sql)).execute(pool).await?;
        }
        Ok(())
    }

    async fn drop_all(pool: &Pool<Self>, names: &Names) -> Res<()> {
        let t = &names.lock;
        let mut conn = pool.acquire().await?;
        sqlx::query("SET SESSION lock_wait_timeout = 10")
            .execute(&mut *conn)
            .await?;
        let sql = format!(
            "DROP TABLE IF EXISTS {t}, {t}_history, {t}_fencing, {t}_ticket, {t}_migrating, {}, {}",
            names.counter, names.history
        );
        sqlx::query(AssertSqlSafe(sql)).execute(&mut *conn).await?;
        // The setting must not go back to the pool with the connection.
        conn.close().await?;
        Ok(())
    }

    async fn read_value(conn: &mut MySqlConnection, names: &Names, kind: Kind) -> Res<i64> {
        let sql = format!("SELECT v FROM {} WHERE id = ?", names.counter);
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(kind.id())
            .fetch_one(conn)
            .await?)
    }

    async fn write(conn: &mut MySqlConnection, names: &Names, w: &Write) -> Res<i64> {
        // No RETURNING for UPDATE: the new count comes back through LAST_INSERT_ID(expr),
        // which the server puts in the OK packet.
        let update = format!(
            "UPDATE {} SET v = ?, n = LAST_INSERT_ID(n + 1) WHERE id = ?",
            names.counter
        );
        let done = sqlx::query(AssertSqlSafe(update))
            .bind(w.written)
            .bind(w.kind.id())
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() != 1 {
            return Err(format!("counter {} not found", w.kind).into());
        }
        let seq = i64::try_from(done.last_insert_id())?;
        let insert = format!(
            "INSERT INTO {} VALUES (?, ?, ?, ?, ?, ?, ?, NOW(6))",
            names.history
        );
        append_history!(conn, insert, w, seq);
        Ok(seq)
    }

    same_everywhere!();

    async fn kill_sessions(pool: &Pool<Self>, _names: &Names, which: &Sessions) -> Res<u64> {
        // Only connections the worker reported as its own; of those, the ones still
        // connected to this database (MariaDB does not hand a thread id out twice while
        // it counts up, so a reported id names no one else's session meanwhile).
        if which.ids.is_empty() {
            return Ok(0);
        }
        let list: Vec<String> = which.ids.iter().map(u64::to_string).collect();
        let sql = format!(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST
              WHERE ID IN ({}) AND DB = DATABASE() AND ID <> CONNECTION_ID()",
            list.join(", ")
        );
        let live: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_all(pool)
            .await?;
        let mut killed = 0;
        for id in live {
            // Text protocol: KILL is not a statement the server prepares.
            match sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(pool)
                .await
            {
                Ok(_) => killed += 1,
                Err(sqlx::Error::Database(db))
                    if db
                        .try_downcast_ref::<MySqlDatabaseError>()
                        .is_some_and(|e| e.number() == ER_NO_SUCH_THREAD) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(killed)
    }
}
