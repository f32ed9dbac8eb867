//! dblock behind a PgBouncer that does not track prepared statements (before 1.21, or
//! `max_prepared_statements = 0`) in transaction mode: the mix-up of sessions is a typed
//! error naming the fix, not a stray "prepared statement does not exist".
//!
//! Needs `DBLOCK_TEST_OLD_PGBOUNCER_URL`: a PgBouncer in transaction mode with
//! `max_prepared_statements = 0` and one server connection (`default_pool_size = 1`), so
//! that two clients' statements meet on it, in front of the server that
//! `DBLOCK_TEST_POSTGRES_URL` reaches directly (for the set-up). `.ci/run` starts one;
//! without it the test is skipped with a message, and `DBLOCK_TEST_REQUIRE=old-pgbouncer`
//! makes that a failure.
//!
//! The same pooler shows that waiting works behind a transaction pooler without the
//! release listener (it would take other clients' server connection), and with it when it
//! is given the server's direct address.
//!
//! The tests take turns ([`one_at_a_time`]): the first one mixes up prepared statements
//! on the one server connection on purpose, the others must not meet those.

use std::str::FromStr;
use std::time::Duration;

use dblock::{Error, Locker};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Row};
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::{Instant, sleep, timeout};

/// The pooler's URL, or `None` (after saying why) when the test is to be skipped.
fn pooler_url() -> Option<String> {
    let Some(url) = std::env::var("DBLOCK_TEST_OLD_PGBOUNCER_URL")
        .ok()
        .filter(|url| !url.is_empty())
    else {
        let required = std::env::var("DBLOCK_TEST_REQUIRE").unwrap_or_default();
        assert!(
            !required.split(',').any(|b| b.trim() == "old-pgbouncer"),
            "DBLOCK_TEST_OLD_PGBOUNCER_URL is unset but DBLOCK_TEST_REQUIRE names old-pgbouncer"
        );
        eprintln!("skipping: DBLOCK_TEST_OLD_PGBOUNCER_URL unset (an old-style PgBouncer)");
        return None;
    };
    Some(url)
}

/// The server behind the pooler, reached directly.
fn direct_url() -> String {
    std::env::var("DBLOCK_TEST_POSTGRES_URL")
        .expect("DBLOCK_TEST_POSTGRES_URL: the server behind the pooler, for the set-up")
}

/// The tests of this binary share the pooler's one server connection: one at a time.
async fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::const_new(());
    TURN.lock().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_up_prepared_statements_are_named() {
    let Some(url) = pooler_url() else {
        return;
    };
    let _turn = one_at_a_time().await;
    let pool = |n| {
        PgPoolOptions::new()
            .max_connections(n)
            .connect_lazy(&url)
            .unwrap()
    };
    let table = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // Migrated straight on the server: through this pooler any statement may meet a
    // stale prepared statement of an earlier client on its one server connection.
    let direct = PgPoolOptions::new().connect(&direct_url()).await.unwrap();
    let setup = Locker::builder(direct.clone())
        .table(&table)
        .build()
        .unwrap();
    setup.migrate().await.unwrap();
    // Two clients, one server connection: the second client's first statement finds the
    // first client's `sqlx_s_1` (or misses its own) there.
    let lockers: Vec<Locker<sqlx::Postgres>> = (0..2)
        .map(|_| Locker::builder(pool(1)).table(&table).build().unwrap())
        .collect();
    let mut mixups = 0;
    for round in 0..20 {
        for locker in &lockers {
            let key = format!("k{round}");
            match locker.try_acquire(&key, Duration::from_secs(5)).await {
                Ok(Some(guard)) => drop(guard.release().await),
                Ok(None) => {}
                Err(err @ Error::PoolerMixesSessions { .. }) => {
                    let text = err.to_string();
                    assert!(
                        text.contains("session mode") && text.contains("1.21"),
                        "{text}"
                    );
                    mixups += 1;
                }
                Err(other) => panic!("expected PoolerMixesSessions, got {other:?}"),
            }
        }
    }
    assert!(
        mixups > 0,
        "no mix-up seen in 40 attempts through the old-style pooler"
    );
    let cleanup = direct;
    for sql in [
        format!("DROP TABLE IF EXISTS {table}, {table}_history, {table}_ticket"),
        format!("DROP SEQUENCE IF EXISTS {table}_fencing_seq, {table}_ticket_seq"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&cleanup)
            .await
            .unwrap();
    }
}

/// A lock table migrated straight on the server, dropped by [`Table::drop_all`].
struct Table {
    name: String,
    direct: PgPool,
    /// A locker on the server directly: the holder of the tests.
    holder: Locker<sqlx::Postgres>,
}

impl Table {
    async fn new() -> Table {
        let name = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let direct = PgPoolOptions::new()
            .max_connections(2)
            .connect(&direct_url())
            .await
            .unwrap();
        let holder = Locker::builder(direct.clone())
            .table(&name)
            .auto_renew(false)
            .build()
            .unwrap();
        holder.migrate().await.unwrap();
        Table {
            name,
            direct,
            holder,
        }
    }

    /// Whether a waiter marked the key's row (asking its release to notify).
    async fn marked(&self, key: &str) -> bool {
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE lock_key = $1 AND waiters",
            self.name
        );
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(key)
            .fetch_one(&self.direct)
            .await
            .unwrap();
        n == 1
    }

    async fn drop_all(self) {
        let t = &self.name;
        for sql in [
            format!("DROP TABLE IF EXISTS {t}, {t}_history, {t}_ticket"),
            format!("DROP SEQUENCE IF EXISTS {t}_fencing_seq, {t}_ticket_seq"),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&self.direct)
                .await
                .unwrap();
        }
        self.direct.close().await;
    }
}

/// A client of the pooler that prepares nothing (simple protocol only): it can share
/// the server connection with a prepared-statement client without mixing them up.
async fn plain_client(url: &str) -> PgConnection {
    let mut conn = PgConnection::connect(url).await.unwrap();
    // Whatever earlier tests left prepared on the server connection is not ours.
    sqlx::raw_sql("DEALLOCATE ALL")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

async fn plain_i64(conn: &mut PgConnection, sql: &'static str) -> i64 {
    let row = sqlx::raw_sql(sql).fetch_one(&mut *conn).await.unwrap();
    row.get(0)
}

/// A locker on the pooler: one client connection, so its prepared statements stay
/// consistent on the pooler's one server connection.
fn pooled_locker(url: &str, table: &str) -> dblock::LockerBuilder<sqlx::Postgres> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy(url)
        .unwrap();
    Locker::builder(pool).table(table).auto_renew(false)
}

const LEASE: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(15);

/// Polls `check` every 10 ms until it holds; panics after `PATIENCE`.
async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// Through the transaction pooler, a Locker whose waiter has to sleep does not open its
/// release listener (PgBouncer refuses or drops the listener's session mark: a `LISTEN`
/// there would stay on a server connection that other clients get next). The waiter
/// polls and still gets the lock after the release, and a plain client of the same
/// pooler, on that same server connection, is not disturbed: no channel is listened to
/// there, and its queries run fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_behind_a_transaction_pooler_poll() {
    let Some(url) = pooler_url() else {
        return;
    };
    let _turn = one_at_a_time().await;
    let table = Table::new().await;
    let mut plain = plain_client(&url).await;
    let key = "pooled";
    let waiters = pooled_locker(&url, &table.name).build().unwrap();
    let held = table.holder.try_acquire(key, LEASE).await.unwrap().unwrap();
    let waiter = {
        let waiters = waiters.clone();
        tokio::spawn(async move { waiters.acquire(key, LEASE, PATIENCE).await })
    };
    // Four attempts: the waiter slept three times, the first time after starting the
    // listener, whose one try (a refused or checked connection) is long over by then.
    wait_until("the waiter tried four times", async || {
        waiters.stats().attempts >= 4
    })
    .await;
    assert!(table.marked(key).await, "the waiter marked the row");
    // Nothing signals that no listener is coming: give one a while to show up.
    sleep(Duration::from_millis(200)).await;
    assert!(
        !waiters.listening(),
        "a listener behind a transaction pooler"
    );
    assert_eq!(waiters.stats().listener_connects, 0);
    // The pooler's one server connection is the one the listener would have had.
    for _ in 0..3 {
        assert_eq!(plain_i64(&mut plain, "SELECT 1::bigint").await, 1);
        let channels = "SELECT COUNT(*) FROM pg_listening_channels()";
        assert_eq!(
            plain_i64(&mut plain, channels).await,
            0,
            "a LISTEN was left behind"
        );
    }
    assert!(!waiter.is_finished(), "the waiter got a held lock");

    held.release().await.unwrap();
    let guard = timeout(PATIENCE, waiter)
        .await
        .expect("the polling waiter gets the lock after the release")
        .unwrap()
        .unwrap();
    let stats = waiters.stats();
    assert_eq!(
        (stats.wakeups, stats.listener_connects),
        (0, 0),
        "{stats:?}"
    );
    assert!(!waiters.listening());
    guard.release().await.unwrap();
    assert_eq!(plain_i64(&mut plain, "SELECT 2::bigint").await, 2);
    plain.close().await.unwrap();
    waiters.pool().close().await;
    table.drop_all().await;
}

/// The same pooler, but the listener is given the server's direct address
/// (`listener_options`): it comes up, and a release elsewhere wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_with_a_direct_address_wakes_pooled_waiters() {
    let Some(url) = pooler_url() else {
        return;
    };
    let _turn = one_at_a_time().await;
    let table = Table::new().await;
    // Clears what earlier tests left prepared on the server connection.
    let plain = plain_client(&url).await;
    let direct = PgConnectOptions::from_str(&direct_url()).expect("a PostgreSQL URL");
    let waiters = pooled_locker(&url, &table.name)
        .listener_options(direct)
        .build()
        .unwrap();
    for (round, key) in ["warm-up", "woken"].into_iter().enumerate() {
        let held = table.holder.try_acquire(key, LEASE).await.unwrap().unwrap();
        let before = waiters.stats();
        let waiter = {
            let waiters = waiters.clone();
            tokio::spawn(async move {
                let guard = waiters.acquire(key, LEASE, PATIENCE).await.unwrap();
                (guard, Instant::now())
            })
        };
        wait_until("the listener is up", async || waiters.listening()).await;
        wait_until("the waiter marked the row", async || {
            table.marked(key).await
        })
        .await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (guard, acquired) = timeout(PATIENCE, waiter).await.unwrap().unwrap();
        let after = waiters.stats();
        assert_eq!(after.listener_connects, 1, "{after:?}");
        if round > 0 {
            // The warm-up's waiter may have marked the row before the listener was up
            // (and slept the short pause then); this one slept expecting the release.
            assert_eq!(after.wakeups - before.wakeups, 1, "{before:?} -> {after:?}");
            let took = acquired - released;
            assert!(took < Duration::from_millis(150), "woken after {took:?}");
        }
        guard.release().await.unwrap();
    }
    plain.close().await.unwrap();
    waiters.pool().close().await;
    table.drop_all().await;
}
