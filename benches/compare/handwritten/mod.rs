//! The baselines dblock is measured against, written by hand with sqlx.
//!
//! *Hand-written*: the very statements dblock sends (copied below from
//! `src/dialect/{postgres,mysql}.rs`, and checked against that source at start-up so the
//! copy cannot drift), sent the way dblock's dialect sends them (same binds, same
//! deadlock retries on MySQL). The ratio dblock / hand-written then measures dblock's own
//! work (input validation, owner value, task spawn, guard, watchdog) and nothing else.
//!
//! *Seeds'*: the simpler scheme the tutorials in `shared/seeds` teach, on their
//! three-column table: a plain `INSERT` (a duplicate key means someone else holds the
//! lock; no takeover of expired rows, no fencing token) and an owner-checked `DELETE`
//! ([`seeds`]).
//!
//! *Floor*: two round trips that lock nothing ([`floor`]).
//!
//! *A read-write lock's write*: PostgreSQL's one call that takes both of a write's rows
//! and one DELETE of both, by hand ([`write`], cell 7.4).

pub mod floor;
pub mod seeds;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{AssertSqlSafe, MySqlPool, PgPool};

use crate::measure::{BoxError, Contender, new_owner};

/// The lease every uncontended cycle asks for (dblock's default lease).
pub const LEASE: Duration = dblock::DEFAULT_LEASE;

fn lease_micros(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).unwrap_or(i64::MAX)
}

// PostgreSQL, from src/dialect/postgres.rs.
const PG_ACQUIRE: &str = "\
WITH serialize AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended('{table}:' || $1, 0))
      FROM (SELECT set_config('lock_timeout', $4::bigint::text, true)) AS bound
)
INSERT INTO {table} AS held (lock_key, lock_value, expire_time, fencing_token, acquired_at)
SELECT $1, $2, clock_timestamp() + $3::bigint * INTERVAL '1 microsecond',
       nextval('{table}_fencing_seq'), clock_timestamp()
  FROM serialize
ON CONFLICT (lock_key) DO UPDATE
   SET lock_value = EXCLUDED.lock_value,
       expire_time = EXCLUDED.expire_time,
       fencing_token = EXCLUDED.fencing_token,
       acquired_at = EXCLUDED.acquired_at
 WHERE held.expire_time <= clock_timestamp()
RETURNING fencing_token, expire_time, held.xmax <> 0";

const PG_RELEASE: &str = "\
DELETE FROM {table} WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3
RETURNING expire_time <= clock_timestamp(),
          CASE WHEN waiters THEN pg_notify('dblock:{table}', fencing_token || ':' || lock_key) IS NULL END";

// MySQL / MariaDB, from src/dialect/mysql.rs.
const MY_ACQUIRE: &str = "\
INSERT INTO {table} (lock_key, lock_value, expire_time, acquired_at)
VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND, NOW(6))
ON DUPLICATE KEY UPDATE
    lock_value  = IF(expire_time <= NOW(6), VALUES(lock_value), lock_value),
    fencing_token = IF(lock_value = VALUES(lock_value), VALUES(fencing_token), fencing_token),
    acquired_at = IF(lock_value = VALUES(lock_value), VALUES(acquired_at), acquired_at),
    expire_time = IF(lock_value = VALUES(lock_value), VALUES(expire_time), expire_time)";

// MariaDB 10.5+: ACQUIRE with this tail is the whole attempt (dblock asks the server's
// version once per lock table, as `MyHand` does).
const MY_RETURNING_OWNER: &str = "\nRETURNING lock_value, fencing_token, expire_time,
          CAST(@dblock_taken_from IS NOT NULL AS SIGNED)";

const MY_READ_OWNER: &str =
    "SELECT lock_value, fencing_token, expire_time FROM {table} WHERE lock_key = ?";

// dblock's usual release: the DELETE of a live lease (a second DELETE follows in dblock
// only when that finds nothing, to tell an expired row of ours from none).
const MY_RELEASE: &str = "DELETE FROM {table}
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)";

// The fencing check `LockGuard::assert_held` runs inside the caller's transaction (the
// stock section's hand-written lock-table strategy sends it too).
const PG_CHECK_FENCE: &str = "\
SELECT f.fencing_token,
       set_config('idle_in_transaction_session_timeout',
                  (CASE WHEN b.was > 0 AND b.was < b.left_ms THEN b.was ELSE b.left_ms END)::text,
                  true)
  FROM (SELECT fencing_token, expire_time FROM {table}
         WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3
           AND expire_time > clock_timestamp()
           FOR SHARE) AS f,
       LATERAL (SELECT GREATEST(1, ceil(EXTRACT(EPOCH FROM f.expire_time - clock_timestamp()) * 1000))::bigint AS left_ms,
                       (EXTRACT(EPOCH FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint AS was) AS b";

const MY_CHECK_FENCE: &str = "\
SELECT fencing_token FROM {table}
 WHERE lock_key = ? AND lock_value = ? AND fencing_token = ? AND expire_time > NOW(6)
  LOCK IN SHARE MODE";

// A read-write lock's write on PostgreSQL, from src/dialect/postgres.rs: `take_write`'s
// format string as it stands there (`{{table}}`, and `{relaxed}` for the table's
// durability), so that the check below can find it in that source; [`write`] fills both in.
const PG_TAKE_WRITE: &str =
    "SELECT outcome, writer_token, writer_expires, grant_token, grant_expires
           FROM {{table}}_take_write($1, $2, $3, $4, $5, $6, $7, {relaxed})";

// The release of both of a write's rows in one statement (PostgreSQL's pair release is
// its batched one).
const PG_RELEASE_BATCH: &str = "\
DELETE FROM {table} AS t
 USING unnest($1::text[], $2::text[], $3::bigint[]) AS w(k, o, tok)
 WHERE t.lock_key = w.k AND t.lock_value = w.o AND t.fencing_token = w.tok
RETURNING t.lock_key::text, t.fencing_token, t.expire_time <= clock_timestamp(),
          CASE WHEN t.waiters THEN pg_notify('dblock:{table}', t.fencing_token || ':' || t.lock_key) IS NULL END";

/// dblock's fencing check on `table`, PostgreSQL's or MySQL's.
pub fn check_fence_sql(postgres: bool, table: &str) -> String {
    let template = if postgres {
        PG_CHECK_FENCE
    } else {
        MY_CHECK_FENCE
    };
    template.replace("{table}", table)
}

/// Fails when a statement above no longer matches the dialect source it was copied from.
pub fn check_copies() -> Result<(), String> {
    const PG_SOURCE: &str = include_str!("../../../src/dialect/postgres.rs");
    const MY_SOURCE: &str = include_str!("../../../src/dialect/mysql.rs");
    let copies = [
        ("postgres.rs", PG_SOURCE, "ACQUIRE", PG_ACQUIRE),
        ("postgres.rs", PG_SOURCE, "RELEASE", PG_RELEASE),
        ("mysql.rs", MY_SOURCE, "ACQUIRE", MY_ACQUIRE),
        ("mysql.rs", MY_SOURCE, "RETURNING_OWNER", MY_RETURNING_OWNER),
        ("mysql.rs", MY_SOURCE, "READ_OWNER", MY_READ_OWNER),
        ("mysql.rs", MY_SOURCE, "RELEASE_LIVE", MY_RELEASE),
        ("postgres.rs", PG_SOURCE, "CHECK_FENCE", PG_CHECK_FENCE),
        ("mysql.rs", MY_SOURCE, "CHECK_FENCE", MY_CHECK_FENCE),
        ("postgres.rs", PG_SOURCE, "RELEASE_BATCH", PG_RELEASE_BATCH),
    ];
    for (file, source, name, copy) in copies {
        let original = literal_after(source, &format!("const {name}: &str ="));
        same(file, name, original, copy)?;
    }
    // `take_write` formats its statement (the table's durability goes in): the copy is
    // its format string, the function's first literal.
    let original = literal_after(PG_SOURCE, "fn take_write(");
    same("postgres.rs", "take_write", original, PG_TAKE_WRITE)
}

/// Whether the `original` statement `name` of `src/dialect/{file}` is still `copy`.
fn same(file: &str, name: &str, original: Option<String>, copy: &str) -> Result<(), String> {
    match original {
        Some(original) if original == copy => Ok(()),
        Some(_) => Err(format!(
            "src/dialect/{file} changed its {name} statement: update the hand-written \
             copy in benches/compare/handwritten/mod.rs so the baseline sends the same SQL"
        )),
        None => Err(format!(
            "no {name} statement (a string literal) found in src/dialect/{file}"
        )),
    }
}

/// The value of the first string literal after `anchor` in Rust source: plain
/// characters, line continuations and the simple escapes (all the dialect files use).
fn literal_after(source: &str, anchor: &str) -> Option<String> {
    let at = source.find(anchor)?;
    let literal = &source[at..];
    let mut chars = literal[literal.find('"')? + 1..].chars().peekable();
    let mut value = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                '\n' => {
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                }
                'n' => value.push('\n'),
                '"' => value.push('"'),
                '\\' => value.push('\\'),
                _ => return None,
            },
            c => value.push(c),
        }
    }
    None
}

/// A statement with the table name spliced in, as dblock keeps its own.
fn statement(template: &str, table: &str) -> Arc<str> {
    template.replace("{table}", table).into()
}

/// Marks a statement as audited: the only identifier in it is a bench table name.
fn audited(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

/// A lock written by hand: what both baselines provide.
pub trait HandLock: Send + Sync {
    /// One attempt; the fencing token (0 where there is none) when it won.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>>;

    /// Owner-checked delete; `true` when the row was ours.
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>>;

    /// Whether an acquisition error only means "someone else got in the way" (duplicate
    /// key, deadlock, lock wait), as any careful hand-written code would read it.
    fn lost_race(&self, err: &sqlx::Error) -> bool;
}

/// Reports a [`HandLock`] as a [`Contender`] under `name`.
pub struct HandCycle {
    pub name: String,
    pub lock: Arc<dyn HandLock>,
}

impl Contender for HandCycle {
    fn name(&self) -> &str {
        &self.name
    }

    fn cycle<'a>(&'a self, _task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let owner = new_owner();
            let Some(token) = self.lock.acquire(key, &owner).await? else {
                return Ok(false);
            };
            Ok(self.lock.release(key, &owner, token).await?)
        })
    }
}

fn pg_lost_race(err: &sqlx::Error) -> bool {
    // unique violation, serialization failure, deadlock, lock not available
    matches!(err, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("23505" | "40001" | "40P01" | "55P03")))
}

fn my_lost_race(err: &sqlx::Error) -> bool {
    // duplicate key, lock wait timeout (1205), deadlock (1213)
    match err {
        sqlx::Error::Database(db) => {
            db.is_unique_violation()
                || db
                    .try_downcast_ref::<MySqlDatabaseError>()
                    .is_some_and(|e| matches!(e.number(), 1205 | 1213))
        }
        _ => false,
    }
}

/// dblock's PostgreSQL statements, by hand: one upsert, one owner-checked delete.
pub struct PgHand {
    pool: PgPool,
    acquire: Arc<str>,
    release: Arc<str>,
}

impl PgHand {
    pub fn new(pool: PgPool, table: &str) -> Self {
        PgHand {
            pool,
            acquire: statement(PG_ACQUIRE, table),
            release: statement(PG_RELEASE, table),
        }
    }
}

impl HandLock for PgHand {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let row: Option<(i64, DateTime<Utc>)> = sqlx::query_as(audited(&self.acquire))
                .bind(key)
                .bind(owner)
                .bind(lease_micros(LEASE))
                // dblock's server-side bound: the attempt's deadline, in whole ms.
                .bind(i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX))
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.map(|(token, _expires_at)| token))
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let done = sqlx::query(audited(&self.release))
                .bind(key)
                .bind(owner)
                .bind(token)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn lost_race(&self, err: &sqlx::Error) -> bool {
        pg_lost_race(err)
    }
}

/// dblock's MySQL statements, by hand, sent as dblock sends them: the upsert with
/// `RETURNING` on MariaDB 10.5+ (asked once, by the server's version), else the upsert and
/// the owner read on one pooled connection; then the owner-checked delete, with the upsert and
/// the delete repeated when InnoDB picks them as a deadlock victim (as a careful caller
/// must: see the hot-key section).
pub struct MyHand {
    pool: MySqlPool,
    acquire: Arc<str>,
    acquire_returning: Arc<str>,
    read_owner: Arc<str>,
    release: Arc<str>,
    returning: tokio::sync::OnceCell<bool>,
}

/// As dblock's dialect: how often a write rolled back as a deadlock victim is repeated.
const DEADLOCK_RETRIES: u32 = 10;

fn is_deadlock(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.try_downcast_ref::<MySqlDatabaseError>().is_some_and(|e| e.number() == 1213))
}

impl MyHand {
    pub fn new(pool: MySqlPool, table: &str) -> Self {
        MyHand {
            pool,
            acquire: statement(MY_ACQUIRE, table),
            acquire_returning: statement(&format!("{MY_ACQUIRE}{MY_RETURNING_OWNER}"), table),
            read_owner: statement(MY_READ_OWNER, table),
            release: statement(MY_RELEASE, table),
            returning: tokio::sync::OnceCell::new(),
        }
    }

    /// Whether the server is MariaDB 10.5 or later, asked on `conn` the first time.
    async fn returning(&self, conn: &mut sqlx::MySqlConnection) -> Result<bool, sqlx::Error> {
        let known = self.returning.get_or_try_init(|| async {
            let version: String = sqlx::query_scalar("SELECT VERSION()")
                .fetch_one(&mut *conn)
                .await?;
            let mut numbers = version.split(|c: char| !c.is_ascii_digit());
            let major: u32 = numbers.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            let minor: u32 = numbers.next().and_then(|n| n.parse().ok()).unwrap_or(0);
            Ok::<_, sqlx::Error>(version.contains("MariaDB") && (major, minor) >= (10, 5))
        });
        Ok(*known.await?)
    }

    /// Runs the upsert or the delete (both bind key, owner, then a number), again while
    /// it comes back as a deadlock victim.
    async fn write(
        conn: &mut sqlx::MySqlConnection,
        sql: &Arc<str>,
        key: &str,
        owner: &str,
        number: i64,
    ) -> Result<sqlx::mysql::MySqlQueryResult, sqlx::Error> {
        let mut retries = 0;
        loop {
            let query = sqlx::query(audited(sql)).bind(key).bind(owner).bind(number);
            match query.execute(&mut *conn).await {
                Err(err) if retries < DEADLOCK_RETRIES && is_deadlock(&err) => retries += 1,
                outcome => return outcome,
            }
        }
    }
}

impl MyHand {
    /// The upsert with `RETURNING`, again while it comes back as a deadlock victim.
    async fn returning_write(
        conn: &mut sqlx::MySqlConnection,
        sql: &Arc<str>,
        key: &str,
        owner: &str,
    ) -> Result<Option<(String, i64, DateTime<Utc>)>, sqlx::Error> {
        let mut retries = 0;
        loop {
            let query = sqlx::query_as(audited(sql))
                .bind(key)
                .bind(owner)
                .bind(lease_micros(LEASE));
            match query.fetch_optional(&mut *conn).await {
                Err(err) if retries < DEADLOCK_RETRIES && is_deadlock(&err) => retries += 1,
                outcome => return outcome,
            }
        }
    }
}

impl HandLock for MyHand {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            let row: Option<(String, i64, DateTime<Utc>)> = if self.returning(&mut conn).await? {
                Self::returning_write(&mut conn, &self.acquire_returning, key, owner).await?
            } else {
                Self::write(&mut conn, &self.acquire, key, owner, lease_micros(LEASE)).await?;
                sqlx::query_as(audited(&self.read_owner))
                    .bind(key)
                    .fetch_optional(&mut *conn)
                    .await?
            };
            Ok(match row {
                Some((holder, token, _expires_at)) if holder == owner => Some(token),
                _ => None,
            })
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            let done = Self::write(&mut conn, &self.release, key, owner, token).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn lost_race(&self, err: &sqlx::Error) -> bool {
        my_lost_race(err)
    }
}
