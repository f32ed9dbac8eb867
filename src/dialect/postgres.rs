//! PostgreSQL: every statement dblock sends to PostgreSQL, and how its answers are read.
//!
//! Acquire is one statement: an upsert that inserts, or takes over an expired row, and
//! returns a row only when we won. The fencing token is drawn from a sequence while a
//! transaction-scoped advisory lock on the key is held, so a later winner of the same key
//! always draws later (a plain `DEFAULT nextval` would be drawn before the unique check,
//! and a slow inserter could win with an older number).

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{Pool, Postgres};

use super::{Acquired, Backend, Contention, LockId, Sql, audited, db_code, sql};

/// PostgreSQL's statements for one table.
#[doc(hidden)]
pub struct Statements {
    acquire: Sql,
    release: Sql,
    extend: Sql,
    inspect: Sql,
    reap: Sql,
}

const ACQUIRE: &str = "\
WITH serialize AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended('{table}:' || $1, 0))
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
RETURNING fencing_token, expire_time";

const RELEASE: &str =
    "DELETE FROM {table} WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3";

const EXTEND: &str = "\
UPDATE {table} SET expire_time = clock_timestamp() + $3::bigint * INTERVAL '1 microsecond'
 WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $4
   AND expire_time > clock_timestamp()
RETURNING expire_time";

const INSPECT: &str = "\
SELECT lock_value, fencing_token, expire_time <= clock_timestamp()
  FROM {table} WHERE lock_key = $1";

// The outer condition repeats the expiry test: a row renewed after the inner scan is kept.
const REAP: &str = "\
DELETE FROM {table} WHERE lock_key IN (
    SELECT lock_key FROM {table} WHERE expire_time < clock_timestamp()
     ORDER BY expire_time LIMIT $1 FOR UPDATE SKIP LOCKED)
  AND expire_time < clock_timestamp()";

const MIGRATION_LOCK: &str =
    "SELECT pg_advisory_lock(hashtextextended('dblock-migrate:' || $1, 0))";
const MIGRATION_UNLOCK: &str =
    "SELECT pg_advisory_unlock(hashtextextended('dblock-migrate:' || $1, 0))";

impl super::sealed::Sealed for Postgres {}

impl Backend for Postgres {
    type Statements = Statements;
    const MIGRATIONS: &'static [(&'static str, &'static str)] = &[(
        "V1__distributed_lock.sql",
        include_str!("../../migrations/postgres/V1__distributed_lock.sql"),
    )];

    fn statements(table: &str) -> Statements {
        Statements {
            acquire: sql(ACQUIRE, table),
            release: sql(RELEASE, table),
            extend: sql(EXTEND, table),
            inspect: sql(INSPECT, table),
            reap: sql(REAP, table),
        }
    }

    async fn try_acquire(
        pool: &Pool<Self>,
        sql: &Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
    ) -> Result<Option<Acquired>, sqlx::Error> {
        let row: Option<(i64, DateTime<Utc>)> = sqlx::query_as(audited(&sql.acquire))
            .bind(key)
            .bind(owner)
            .bind(lease_micros)
            .fetch_optional(pool)
            .await?;
        Ok(row.map(|(fencing_token, expires_at)| Acquired {
            fencing_token,
            expires_at,
        }))
    }

    async fn release(
        pool: &Pool<Self>,
        sql: &Statements,
        lock: LockId<'_>,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(audited(&sql.release))
            .bind(lock.key)
            .bind(lock.owner)
            .bind(lock.fencing_token)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn extend(
        pool: &Pool<Self>,
        sql: &Statements,
        lock: LockId<'_>,
        lease_micros: i64,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        sqlx::query_scalar(audited(&sql.extend))
            .bind(lock.key)
            .bind(lock.owner)
            .bind(lease_micros)
            .bind(lock.fencing_token)
            .fetch_optional(pool)
            .await
    }

    async fn inspect(
        pool: &Pool<Self>,
        sql: &Statements,
        key: &str,
    ) -> Result<Option<(String, i64, bool)>, sqlx::Error> {
        sqlx::query_as(audited(&sql.inspect))
            .bind(key)
            .fetch_optional(pool)
            .await
    }

    fn contention(err: &sqlx::Error) -> Contention {
        // unique violation, serialization failure, deadlock, lock not available
        match db_code(err).as_deref() {
            Some("23505" | "40001" | "40P01" | "55P03") => Contention::LostRace,
            _ => Contention::Failure,
        }
    }

    async fn lock_migrations(
        conn: &mut PoolConnection<Self>,
        table: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(MIGRATION_LOCK)
            .bind(table)
            .execute(&mut **conn)
            .await?;
        Ok(())
    }

    async fn unlock_migrations(
        conn: &mut PoolConnection<Self>,
        table: &str,
        _commit: bool,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(MIGRATION_UNLOCK)
            .bind(table)
            .execute(&mut **conn)
            .await?;
        Ok(())
    }

    scripts_and_history!();

    fn bind_mark(index: usize) -> String {
        format!("${index}")
    }

    fn row_lock_sql(select: &str, mode: crate::RowLockMode) -> String {
        format!("{select}{}", super::for_update(mode))
    }

    async fn lock_rows<K: crate::SqlValue<Self>>(
        conn: &mut sqlx::PgConnection,
        sql: &str,
        keys: &[K],
        mode: crate::RowLockMode,
    ) -> Result<Vec<K>, sqlx::Error> {
        let crate::RowLockMode::Timeout(timeout) = mode else {
            return Self::fetch_keys(conn, sql, keys).await;
        };
        // Transaction-local, and put back right after: the timeout is for taking these
        // row locks, not for whatever the caller runs next in the same transaction.
        let millis = timeout.as_millis().max(1);
        let (previous, _): (String, String) = sqlx::query_as(SET_LOCK_TIMEOUT)
            .bind(format!("{millis}ms"))
            .fetch_one(&mut *conn)
            .await?;
        let locked = Self::fetch_keys(conn, sql, keys).await?;
        sqlx::query(RESTORE_LOCK_TIMEOUT)
            .bind(previous)
            .execute(&mut *conn)
            .await?;
        Ok(locked)
    }

    fn is_row_locked(err: &sqlx::Error) -> bool {
        // lock_not_available: NOWAIT, or lock_timeout ran out
        db_code(err).as_deref() == Some("55P03")
    }

    super::portable_ops!();
}

// Returns the old value, read before the new one is set: OFFSET 0 keeps the subquery from
// being merged into the outer query, so its row exists before the outer list is computed.
const SET_LOCK_TIMEOUT: &str = "\
SELECT saved.previous, set_config('lock_timeout', $1, true)
  FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) AS saved";
const RESTORE_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

// FOR SHARE, not FOR KEY SHARE: a takeover or renewal updates non-key columns, which
// FOR KEY SHARE would let through. A takeover that raced us is waited for and re-checked
// (READ COMMITTED re-evaluates the WHERE on the new row version).
const CHECK_FENCE: &str = "\
SELECT fencing_token FROM {table}
 WHERE lock_key = $1 AND lock_value = $2 AND fencing_token = $3
   AND expire_time > clock_timestamp()
   FOR SHARE";
