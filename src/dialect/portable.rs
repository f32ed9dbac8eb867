//! Statements that read the same on every supported database: standard SQL over
//! validated identifiers, with the bind marks (`$1` or `?`) and the row-locking clause
//! supplied by each dialect. Also [`portable_ops`], which spells out running them for
//! each concrete sqlx type (the same code three times, written once).

use sqlx::{Database, Decode, Encode, Type};

use super::{RowWait, Sql, TxSql};
use crate::ident::Ident;

/// A Rust value that can be bound to, and read back from, a statement on `DB`: the type of
/// a row key for [`RowLocker`](crate::RowLocker), and of the key and value columns for
/// [`Versioned`](crate::Versioned). Implemented for every type sqlx encodes and decodes on
/// `DB` (`i64`, `String`, `uuid::Uuid`, ...): pick the type sqlx maps to your column (on
/// PostgreSQL, `i64` for `BIGINT`, `i32` for `INTEGER`).
///
/// # Examples
/// ```
/// use dblock::{SqlValue, Sqlite};
///
/// fn usable_as_key_or_value<T: SqlValue<Sqlite>>() {}
///
/// usable_as_key_or_value::<i64>(); // INTEGER
/// usable_as_key_or_value::<String>(); // TEXT
/// usable_as_key_or_value::<uuid::Uuid>(); // a UUID column
/// ```
pub trait SqlValue<DB: Database>:
    for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB> + Send + Sync + Unpin + 'static
{
}

impl<DB: Database, T> SqlValue<DB> for T where
    T: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB> + Send + Sync + Unpin + 'static
{
}

/// `SELECT key FROM table WHERE key IN (..) ORDER BY key`: the rows to lock, in key order
/// so that two callers locking overlapping sets take their locks in the same order.
pub(crate) fn select_keys<DB: TxSql>(table: &Ident, key: &Ident, count: usize) -> String {
    let marks: Vec<String> = (1..=count).map(DB::bind_mark).collect();
    format!(
        "SELECT {key} FROM {table} WHERE {key} IN ({}) ORDER BY {key}",
        marks.join(", ")
    )
}

/// The standard row-locking clause, as PostgreSQL and MySQL 8 / MariaDB spell it. A lock
/// timeout is not part of it: each dialect sets that its own way.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))] // SQLite has no FOR UPDATE
pub(crate) fn for_update(mode: RowWait) -> &'static str {
    match mode {
        RowWait::NoWait => " FOR UPDATE NOWAIT",
        RowWait::SkipLocked => " FOR UPDATE SKIP LOCKED",
        RowWait::Wait | RowWait::Timeout(_) => " FOR UPDATE",
    }
}

/// Reads `(value, version)` of one row.
pub(crate) fn read_versioned<DB: TxSql>(
    table: &Ident,
    key: &Ident,
    value: &Ident,
    version: &Ident,
) -> Sql {
    format!(
        "SELECT {value}, {version} FROM {table} WHERE {key} = {}",
        DB::bind_mark(1)
    )
    .into()
}

/// Writes a new value if the version is still the one read; binds: value, key, version.
pub(crate) fn write_versioned<DB: TxSql>(
    table: &Ident,
    key: &Ident,
    value: &Ident,
    version: &Ident,
) -> Sql {
    format!(
        "UPDATE {table} SET {value} = {}, {version} = {version} + 1 \
         WHERE {key} = {} AND {version} = {}",
        DB::bind_mark(1),
        DB::bind_mark(2),
        DB::bind_mark(3)
    )
    .into()
}

/// The [`TxSql`] operations whose code is the same for every database, spelled out
/// inside each dialect's `impl` (sqlx's executor bounds do not lend themselves to
/// generics).
macro_rules! portable_ops {
    () => {
        async fn fetch_keys<K: $crate::dialect::SqlValue<Self>>(
            conn: &mut Self::Connection,
            sql: &str,
            keys: &[K],
        ) -> Result<Vec<K>, sqlx::Error> {
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()));
            for key in keys {
                query = query.bind(key);
            }
            query.fetch_all(conn).await
        }

        async fn read_versioned<
            K: $crate::dialect::SqlValue<Self>,
            V: $crate::dialect::SqlValue<Self>,
        >(
            conn: &mut Self::Connection,
            sql: &super::Sql,
            key: &K,
        ) -> Result<Option<(V, i64)>, sqlx::Error> {
            sqlx::query_as(super::audited(sql))
                .bind(key)
                .fetch_optional(conn)
                .await
        }

        async fn write_versioned<
            K: $crate::dialect::SqlValue<Self>,
            V: $crate::dialect::SqlValue<Self>,
        >(
            conn: &mut Self::Connection,
            sql: &super::Sql,
            value: &V,
            key: &K,
            version: i64,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(super::audited(sql))
                .bind(value)
                .bind(key)
                .bind(version)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }
    };
}
pub(crate) use portable_ops;

#[cfg(all(test, feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ident(name: &str) -> Ident {
        Ident::new(name).unwrap()
    }

    #[test]
    fn bind_marks_per_database() {
        let (t, k) = (ident("product"), ident("id"));
        assert_eq!(
            select_keys::<sqlx::Postgres>(&t, &k, 2),
            "SELECT id FROM product WHERE id IN ($1, $2) ORDER BY id"
        );
        assert!(select_keys::<sqlx::MySql>(&t, &k, 2).ends_with("IN (?, ?) ORDER BY id"));
        assert!(select_keys::<sqlx::Sqlite>(&t, &k, 2).ends_with("IN (?1, ?2) ORDER BY id"));
    }

    #[test]
    fn mysql_timeouts_round_up_to_whole_seconds() {
        let select = "SELECT id FROM product WHERE id IN (?) ORDER BY id";
        let sql = |ms| {
            <sqlx::MySql as TxSql>::row_lock_sql(
                select,
                RowWait::Timeout(Duration::from_millis(ms)),
            )
        };
        assert_eq!(
            sql(200),
            "SELECT /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ id FROM product \
             WHERE id IN (?) ORDER BY id FOR UPDATE /*M! WAIT 1 */"
        );
        assert!(sql(1001).ends_with("FOR UPDATE /*M! WAIT 2 */"));
        assert!(
            <sqlx::MySql as TxSql>::row_lock_sql(select, RowWait::NoWait)
                .ends_with("FOR UPDATE NOWAIT")
        );
    }

    #[test]
    fn versioned_write_checks_the_version_it_read() {
        let sql = write_versioned::<sqlx::Postgres>(
            &ident("product"),
            &ident("id"),
            &ident("stock"),
            &ident("version"),
        );
        assert_eq!(
            &*sql,
            "UPDATE product SET stock = $1, version = version + 1 WHERE id = $2 AND version = $3"
        );
    }
}
