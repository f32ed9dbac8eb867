//! The few raw statements `examples/idempotent_handler.rs` runs, for each database: binds
//! of `i64` and text, SQL written with `?` and numbered for PostgreSQL.

use std::future::Future;

use dblock::Backend;

/// One bind value.
pub enum Bind<'a> {
    Int(i64),
    Text(&'a str),
}

pub trait PaymentDb: Backend {
    /// The statement with this database's bind marks.
    fn sql(template: &str) -> String;

    /// Runs a statement; rows affected.
    fn execute(
        conn: &mut Self::Connection,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Runs a query; the first column (a BIGINT) of the first row.
    fn fetch_i64(
        conn: &mut Self::Connection,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;

    /// `DROP` statements for the tables `tables` and the lock table `lock_table` with its
    /// companions (migration history, and PostgreSQL's fencing sequence or MySQL's fencing
    /// counters; the triggers go with their tables).
    fn drop_statements(tables: &[&str], lock_table: &str) -> Vec<String>;
}

macro_rules! payment_db {
    ($db:ty, $numbered:expr, |$t:ident, $l:ident| $drops:expr) => {
        impl PaymentDb for $db {
            fn sql(template: &str) -> String {
                if !$numbered {
                    return template.to_owned();
                }
                let mut out = String::new();
                for (index, part) in template.split('?').enumerate() {
                    if index > 0 {
                        out.push_str(&format!("${index}"));
                    }
                    out.push_str(part);
                }
                out
            }

            async fn execute(
                conn: &mut Self::Connection,
                sql: &str,
                binds: &[Bind<'_>],
            ) -> sqlx::Result<u64> {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
                for bind in binds {
                    query = match bind {
                        Bind::Int(value) => query.bind(*value),
                        Bind::Text(value) => query.bind(value.to_string()),
                    };
                }
                Ok(query.execute(conn).await?.rows_affected())
            }

            async fn fetch_i64(
                conn: &mut Self::Connection,
                sql: &str,
                binds: &[Bind<'_>],
            ) -> sqlx::Result<Option<i64>> {
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
                for bind in binds {
                    query = match bind {
                        Bind::Int(value) => query.bind(*value),
                        Bind::Text(value) => query.bind(value.to_string()),
                    };
                }
                query.fetch_optional(conn).await
            }

            fn drop_statements($t: &[&str], $l: &str) -> Vec<String> {
                $drops
            }
        }
    };
}
payment_db!(sqlx::Postgres, true, |t, l| vec![
    format!(
        "DROP TABLE IF EXISTS {}, {l}, {l}_history, {l}_ticket, {l}_events",
        t.join(", ")
    ),
    format!("DROP SEQUENCE IF EXISTS {l}_fencing_seq, {l}_ticket_seq"),
    format!("DROP FUNCTION IF EXISTS {l}_take_write"),
]);
payment_db!(sqlx::MySql, false, |t, l| vec![format!(
    "DROP TABLE IF EXISTS {}, {l}, {l}_history, {l}_fencing, {l}_ticket, {l}_migrating, {l}_events",
    t.join(", ")
)]);
payment_db!(sqlx::Sqlite, false, |t, l| {
    // SQLite drops one table a statement.
    let locks = [
        l.to_owned(),
        format!("{l}_history"),
        format!("{l}_fencing"),
        format!("{l}_ticket"),
        format!("{l}_waiter"),
        format!("{l}_events"),
    ];
    t.iter()
        .map(|table| table.to_string())
        .chain(locks)
        .map(|table| format!("DROP TABLE IF EXISTS {table}"))
        .collect()
});
