//! The floor of two-statement locks: two round trips of a `SELECT` that touches no table.

use futures::future::BoxFuture;
use sqlx::AssertSqlSafe;

use super::HandLock;

/// The floor of any lock that takes two statements: each "statement" a `SELECT` of the
/// same two binds (key and owner) that touches no table, on the same pool. Nothing is
/// locked; it tells what the server's round trips alone allow on this machine, which
/// bounds every two-statement protocol here (dblock's, the seeds', relaxed or durable).
pub struct Floor<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    /// `SELECT` of the two binds, in the backend's bind marks.
    select: &'static str,
}

impl<DB: sqlx::Database> Floor<DB> {
    pub fn new(pool: sqlx::Pool<DB>, select: &'static str) -> Self {
        Floor { pool, select }
    }
}

impl<DB> Floor<DB>
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// One "statement" of the floor: the `SELECT` of the binds, its row read.
    async fn round_trip(&self, key: &str, owner: &str) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.select))
            .bind(key.to_owned())
            .bind(owner.to_owned())
            .fetch_one(&self.pool)
            .await?;
        Ok(())
    }
}

impl<DB> HandLock for Floor<DB>
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            self.round_trip(key, owner).await?;
            Ok(Some(0))
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
        _token: i64,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            self.round_trip(key, owner).await?;
            Ok(true)
        })
    }

    fn lost_race(&self, _err: &sqlx::Error) -> bool {
        false
    }
}
