//! The seeds' scheme, on their own three-column table: a plain `INSERT` (a duplicate key
//! means someone else holds the lock) and an owner-checked `DELETE`.

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::{MySqlPool, PgPool};

use super::{HandLock, audited, my_lost_race, pg_lost_race, statement};

/// The seeds' scheme on PostgreSQL.
pub struct PgSeed {
    pool: PgPool,
    insert: Arc<str>,
    delete: Arc<str>,
}

impl PgSeed {
    pub fn create_table(table: &str) -> String {
        format!(
            "CREATE TABLE {table} (
                 lock_key    VARCHAR(128) PRIMARY KEY,
                 lock_value  VARCHAR(64)  NOT NULL,
                 expire_time TIMESTAMPTZ  NOT NULL)"
        )
    }

    pub fn new(pool: PgPool, table: &str) -> Self {
        PgSeed {
            pool,
            insert: statement(
                "INSERT INTO {table} (lock_key, lock_value, expire_time) \
                 VALUES ($1, $2, NOW() + INTERVAL '30 seconds')",
                table,
            ),
            delete: statement(
                "DELETE FROM {table} WHERE lock_key = $1 AND lock_value = $2",
                table,
            ),
        }
    }
}

impl HandLock for PgSeed {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let inserted = sqlx::query(audited(&self.insert))
                .bind(key)
                .bind(owner)
                .execute(&self.pool)
                .await;
            match inserted {
                Ok(_) => Ok(Some(0)),
                Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(None),
                Err(err) => Err(err),
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        _token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let done = sqlx::query(audited(&self.delete))
                .bind(key)
                .bind(owner)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn lost_race(&self, err: &sqlx::Error) -> bool {
        pg_lost_race(err)
    }
}

/// The seeds' scheme on MySQL / MariaDB, with their DDL as written.
pub struct MySeed {
    pool: MySqlPool,
    insert: Arc<str>,
    delete: Arc<str>,
}

impl MySeed {
    pub fn create_table(table: &str) -> String {
        format!(
            "CREATE TABLE {table} (
                 lock_key    VARCHAR(128) NOT NULL,
                 lock_value  VARCHAR(64)  NOT NULL,
                 expire_time DATETIME     NOT NULL,
                 PRIMARY KEY (lock_key)) ENGINE = InnoDB"
        )
    }

    pub fn new(pool: MySqlPool, table: &str) -> Self {
        MySeed {
            pool,
            insert: statement(
                "INSERT INTO {table} (lock_key, lock_value, expire_time) \
                 VALUES (?, ?, NOW() + INTERVAL 30 SECOND)",
                table,
            ),
            delete: statement(
                "DELETE FROM {table} WHERE lock_key = ? AND lock_value = ?",
                table,
            ),
        }
    }
}

impl HandLock for MySeed {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let inserted = sqlx::query(audited(&self.insert))
                .bind(key)
                .bind(owner)
                .execute(&self.pool)
                .await;
            match inserted {
                Ok(_) => Ok(Some(0)),
                Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(None),
                Err(err) => Err(err),
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        _token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let done = sqlx::query(audited(&self.delete))
                .bind(key)
                .bind(owner)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn lost_race(&self, err: &sqlx::Error) -> bool {
        my_lost_race(err)
    }
}
