//! What the fault suite needs to say to each database besides the lock calls: the
//! fenced resource table, and listings to prove that nothing else was written.

use std::collections::BTreeSet;
use std::future::Future;

use dblock::Backend;
use sqlx::{AssertSqlSafe, MySql, Pool, Postgres, Sqlite};

use crate::Res;

/// A backend the suite runs on, with the SQL it needs spelled for it.
pub trait FaultDb: Backend {
    /// How the summary names this backend.
    const LABEL: &'static str;

    /// (Re)creates the row of `fault_resource`, the resource protected by the lock in
    /// scenario 2: value `init`, last token 0. It is written only with a fencing token at
    /// least the last one it saw (storage-side fencing): a holder may write more than once
    /// with its own token; an older token is refused.
    fn reset_resource(pool: &Pool<Self>) -> impl Future<Output = Res<()>> + Send;

    /// `UPDATE .. WHERE last_token <= token`: whether the write was applied.
    fn fenced_write(
        pool: &Pool<Self>,
        value: &str,
        token: i64,
    ) -> impl Future<Output = Res<bool>> + Send;

    /// The resource row: (value, last token).
    fn resource(pool: &Pool<Self>) -> impl Future<Output = Res<(String, i64)>> + Send;

    /// Every table, sequence, index and trigger in the current schema.
    fn objects(pool: &Pool<Self>) -> impl Future<Output = Res<BTreeSet<String>>> + Send;

    /// Rows in `table` (a name the suite chose).
    fn count(pool: &Pool<Self>, table: &str) -> impl Future<Output = Res<i64>> + Send;

    /// Creates a plain table, the canary a hostile table name would like to drop.
    fn create_canary(pool: &Pool<Self>, table: &str) -> impl Future<Output = Res<()>> + Send;

    /// Creates (or alters) the login `user`, allowed at most `connections` at a time and
    /// whatever it needs to make and use a lock table; its URL is the suite's with
    /// `user` in place of the administrator. Server backends only.
    fn limit_user(
        pool: &Pool<Self>,
        user: &str,
        connections: u32,
    ) -> impl Future<Output = Res<()>> + Send;

    /// The server's id of the session on `conn`.
    fn session_id(conn: &mut Self::Connection) -> impl Future<Output = Res<i64>> + Send;

    /// Ends every session of the login `user` but those in `keep` (as a restart or a
    /// firewall would cut them); how many it ended.
    fn kill_sessions_except(
        pool: &Pool<Self>,
        user: &str,
        keep: &[i64],
    ) -> impl Future<Output = Res<u64>> + Send;
}

/// The statements that read the same on every backend (sqlx's executor bounds do not
/// lend themselves to a generic body, so a macro spells them out per type).
macro_rules! same_everywhere {
    () => {
        async fn reset_resource(pool: &Pool<Self>) -> Res<()> {
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS fault_resource
                     (id INT PRIMARY KEY, value VARCHAR(64) NOT NULL, last_token BIGINT NOT NULL);
                 DELETE FROM fault_resource;
                 INSERT INTO fault_resource VALUES (1, 'init', 0)",
            )
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn resource(pool: &Pool<Self>) -> Res<(String, i64)> {
            Ok(
                sqlx::query_as("SELECT value, last_token FROM fault_resource WHERE id = 1")
                    .fetch_one(pool)
                    .await?,
            )
        }

        async fn count(pool: &Pool<Self>, table: &str) -> Res<i64> {
            let sql = format!("SELECT COUNT(*) FROM {table}");
            Ok(sqlx::query_scalar(AssertSqlSafe(sql))
                .fetch_one(pool)
                .await?)
        }

        async fn create_canary(pool: &Pool<Self>, table: &str) -> Res<()> {
            let sql = format!("CREATE TABLE IF NOT EXISTS {table} (id INT)");
            sqlx::query(AssertSqlSafe(sql)).execute(pool).await?;
            Ok(())
        }
    };
}

impl FaultDb for Postgres {
    const LABEL: &'static str = "postgres";

    async fn fenced_write(pool: &Pool<Self>, value: &str, token: i64) -> Res<bool> {
        let done = sqlx::query(
            "UPDATE fault_resource SET value = $1, last_token = $2 WHERE id = 1 AND last_token <= $2",
        )
        .bind(value)
        .bind(token)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn objects(pool: &Pool<Self>) -> Res<BTreeSet<String>> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = current_schema()
             UNION ALL
             SELECT tgname::text FROM pg_trigger WHERE NOT tgisinternal",
        )
        .fetch_all(pool)
        .await?;
        Ok(names.into_iter().collect())
    }

    async fn limit_user(pool: &Pool<Self>, user: &str, connections: u32) -> Res<()> {
        // Superusers are not held to a role's connection limit: this one is not one.
        let sql = format!(
            "DO $$ BEGIN CREATE ROLE {user} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             ALTER ROLE {user} CONNECTION LIMIT {connections};
             GRANT USAGE, CREATE ON SCHEMA public TO {user}"
        );
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
        Ok(())
    }

    async fn session_id(conn: &mut sqlx::PgConnection) -> Res<i64> {
        Ok(sqlx::query_scalar("SELECT pg_backend_pid()::bigint")
            .fetch_one(conn)
            .await?)
    }

    async fn kill_sessions_except(pool: &Pool<Self>, user: &str, keep: &[i64]) -> Res<u64> {
        // The call is in the select list: only the rows the condition picks are ended.
        let ended: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) AS ended FROM pg_stat_activity
                                    WHERE usename = $1 AND NOT pid::bigint = ANY($2)) AS s
              WHERE ended",
        )
        .bind(user)
        .bind(keep)
        .fetch_one(pool)
        .await?;
        Ok(u64::try_from(ended)?)
    }

    same_everywhere!();
}

impl FaultDb for MySql {
    const LABEL: &'static str = "mariadb";

    async fn fenced_write(pool: &Pool<Self>, value: &str, token: i64) -> Res<bool> {
        // CLIENT_FOUND_ROWS counts matched rows, which is what this needs.
        let done = sqlx::query(
            "UPDATE fault_resource SET value = ?, last_token = ? WHERE id = 1 AND last_token <= ?",
        )
        .bind(value)
        .bind(token)
        .bind(token)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn objects(pool: &Pool<Self>) -> Res<BTreeSet<String>> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables
              WHERE table_schema = DATABASE()
             UNION ALL
             SELECT CAST(trigger_name AS CHAR) FROM information_schema.triggers
              WHERE trigger_schema = DATABASE()
             UNION ALL
             SELECT CAST(CONCAT(table_name, '.', index_name) AS CHAR)
               FROM information_schema.statistics WHERE table_schema = DATABASE()",
        )
        .fetch_all(pool)
        .await?;
        Ok(names.into_iter().collect())
    }

    async fn limit_user(pool: &Pool<Self>, user: &str, connections: u32) -> Res<()> {
        let sql = format!(
            "CREATE USER IF NOT EXISTS '{user}'@'%';
             ALTER USER '{user}'@'%' WITH MAX_USER_CONNECTIONS {connections};
             GRANT ALL ON test.* TO '{user}'@'%'"
        );
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
        Ok(())
    }

    async fn session_id(conn: &mut sqlx::MySqlConnection) -> Res<i64> {
        Ok(sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
            .fetch_one(conn)
            .await?)
    }

    async fn kill_sessions_except(pool: &Pool<Self>, user: &str, keep: &[i64]) -> Res<u64> {
        let sessions: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE USER = ?",
        )
        .bind(user)
        .fetch_all(pool)
        .await?;
        let mut ended = 0;
        for id in sessions.into_iter().filter(|id| !keep.contains(id)) {
            sqlx::query(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .execute(pool)
                .await?;
            ended += 1;
        }
        Ok(ended)
    }

    same_everywhere!();
}

impl FaultDb for Sqlite {
    const LABEL: &'static str = "sqlite";

    async fn fenced_write(pool: &Pool<Self>, value: &str, token: i64) -> Res<bool> {
        let done = sqlx::query(
            "UPDATE fault_resource SET value = ?1, last_token = ?2 WHERE id = 1 AND last_token <= ?2",
        )
        .bind(value)
        .bind(token)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn objects(pool: &Pool<Self>) -> Res<BTreeSet<String>> {
        // Indexes (SQLite names some sqlite_autoindex_..) as table.index, as on MariaDB.
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT CASE type WHEN 'table' THEN name ELSE tbl_name || '.' || name END
               FROM sqlite_master",
        )
        .fetch_all(pool)
        .await?;
        Ok(names.into_iter().collect())
    }

    async fn limit_user(_: &Pool<Self>, _: &str, _: u32) -> Res<()> {
        Err("SQLite has no logins".into())
    }

    async fn session_id(_: &mut sqlx::SqliteConnection) -> Res<i64> {
        Err("SQLite has no sessions".into())
    }

    async fn kill_sessions_except(_: &Pool<Self>, _: &str, _: &[i64]) -> Res<u64> {
        Err("SQLite has no sessions".into())
    }

    same_everywhere!();
}
