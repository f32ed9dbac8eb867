//! What reads the same in several dialects, written once: the helpers every dialect
//! uses, and the macros that spell out, for each concrete sqlx type, the statements whose
//! code is the same (sqlx's executor bounds do not lend themselves to generic bodies).
//! The SQL stays in each dialect's `Statements`; where a bound value differs, the macro
//! calls the dialect's own function for it:
//! - `lease_param(micros)`: a lease or a duration as the dialect binds it (PostgreSQL and
//!   MySQL microseconds, SQLite a date modifier such as `+30.000000 seconds`);
//! - `since_param(micros)`: the same, going back in time (a list's minimum held time);
//! - `ticket_list(tickets)`: a list of tickets (PostgreSQL an array, else one JSON array);
//! - `key_list(keys)`: a list of keys, the same way.

use super::{LockId, Renewal, Sql};

/// Declares a dialect's `Statements`, one prepared text per statement, and
/// `build_statements(table)`, which splices the validated table name into every
/// template with `$splice`. The statements every dialect has are listed here once, by
/// the names of their templates (each dialect defines `ACQUIRE`, `RELEASE`, ...); a
/// dialect passes its own extra statements as `name: TEMPLATE` pairs.
macro_rules! statements {
    ($splice:path; $($name:ident: $template:expr),* $(,)?) => {
        statements! { @all $splice;
            acquire: ACQUIRE,
            release: RELEASE,
            release_batch: RELEASE_BATCH,
            extend: EXTEND,
            renew: RENEW,
            inspect: INSPECT,
            list: LIST,
            force_release: FORCE_RELEASE,
            keep_min_hold: KEEP_MIN_HOLD,
            reap: REAP,
            check_fence: CHECK_FENCE,
            check_fences: CHECK_FENCES,
            note_waiter: NOTE_WAITER,
            take_ticket: TAKE_TICKET,
            earlier_ticket: EARLIER_TICKET,
            renew_tickets: RENEW_TICKETS,
            drop_tickets: DROP_TICKETS,
            purge_tickets: PURGE_TICKETS,
            clock: CLOCK,
            $($name: $template,)*
        }
    };
    (@all $splice:path; $($name:ident: $template:expr,)*) => {
        /// This dialect's statements for one table.
        #[doc(hidden)]
        pub struct Statements {
            $($name: super::Sql,)*
            /// The sessions' current database (`DATABASE()`), read once, by the first
            /// statement that needs it: MySQL's wait names hash it (`dialect/mysql.rs`,
            /// "Bells"). The other dialects never read it.
            #[allow(dead_code)]
            pub(crate) database: std::sync::OnceLock<Option<String>>,
        }

        fn build_statements(table: &str) -> Statements {
            Statements {
                $($name: $splice($template, table),)*
                database: std::sync::OnceLock::new(),
            }
        }
    };
}

/// A dialect's migrations, in order: each file of `migrations/<dir>/` with its name.
macro_rules! migration_scripts {
    ($dir:literal; $($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../../migrations/", $dir, "/", $file))),)*]
    };
}

/// The end of a renewal on a database with `RETURNING`: the rows its `UPDATE` renewed,
/// and when some leases of `$batch` were not renewed, a read of those keys (bound with the
/// dialect's `key_list`) to say why: a row still the lease's and live was skipped as
/// locked (`busy`). Evaluates to the `renew` method's result.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(unused_macros)
)]
macro_rules! renewed_then_read_back {
    ($conn:expr, $sql:expr, $batch:expr, $renewed:expr) => {{
        let mut rows: Vec<RowState> = row_states($renewed, true).collect();
        let missing = unrenewed($batch, &rows);
        if missing.is_empty() {
            return Ok(rows);
        }
        let others: Vec<super::ReadBackRow> = sqlx::query_as(audited(&$sql.read_keys))
            .bind(key_list(missing))
            .fetch_all($conn)
            .await?;
        rows.extend(read_back_states($batch, others));
        Ok(rows)
    }};
}

/// The lock statements that read the same on every database.
macro_rules! common_lock_statements {
    () => {
        async fn clock(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
        ) -> Result<DateTime<Utc>, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.clock))
                .fetch_one(conn)
                .await
        }

        async fn force_release(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
        ) -> Result<bool, sqlx::Error> {
            // PostgreSQL's RETURNING (its notification) is evaluated all the same.
            let delete = sqlx::query(super::audited(&sql.force_release)).bind(key);
            Ok(delete.execute(conn).await?.rows_affected() > 0)
        }

        async fn reap_batch(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            batch: i64,
        ) -> Result<u64, sqlx::Error> {
            let reap = sqlx::query(super::audited(&sql.reap)).bind(batch);
            Ok(reap.execute(conn).await?.rows_affected())
        }
    };
}

/// The fence check of the databases whose check returns the row it found (PostgreSQL's
/// `SELECT .. FOR SHARE`, SQLite's `UPDATE .. RETURNING`).
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(unused_macros)
)]
macro_rules! fence_read_back {
    () => {
        async fn check_fence(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            lock: super::LockId<'_>,
            _certified: bool,
        ) -> Result<bool, sqlx::Error> {
            let found: Option<i64> = sqlx::query_scalar(super::audited(&sql.check_fence))
                .bind(lock.key)
                .bind(lock.owner)
                .bind(lock.fencing_token)
                .fetch_optional(conn)
                .await?;
            Ok(found.is_some())
        }
    };
}

/// The lock statements of the databases whose statements return their rows
/// (`RETURNING`) and take their parameters in the order written: PostgreSQL and SQLite.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(unused_macros)
)]
macro_rules! returning_lock_statements {
    () => {
        async fn release(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            lock: super::LockId<'_>,
        ) -> Result<Option<bool>, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.release))
                .bind(lock.key)
                .bind(lock.owner)
                .bind(lock.fencing_token)
                .fetch_optional(conn)
                .await
        }

        async fn extend(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            lock: super::LockId<'_>,
            lease_micros: i64,
        ) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.extend))
                .bind(lock.key)
                .bind(lock.owner)
                .bind(lease_param(lease_micros))
                .bind(lock.fencing_token)
                .fetch_optional(conn)
                .await
        }

        async fn inspect(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
        ) -> Result<Option<super::Inspected>, sqlx::Error> {
            let row: Option<super::InspectedRow> = sqlx::query_as(super::audited(&sql.inspect))
                .bind(key)
                .fetch_optional(conn)
                .await?;
            Ok(row.map(super::Inspected::from))
        }

        async fn list(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            query: super::ListQuery<'_>,
        ) -> Result<Vec<super::Listed>, sqlx::Error> {
            let rows: Vec<super::ListedRow> = sqlx::query_as(super::audited(&sql.list))
                .bind(query.from)
                .bind(query.until)
                .bind(query.held_micros.map(since_param))
                .bind(query.expired)
                .bind(query.limit)
                .bind(query.after)
                .fetch_all(conn)
                .await?;
            Ok(rows.into_iter().map(super::Listed::from).collect())
        }

        async fn keep_min_hold(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            lock: super::LockId<'_>,
            min_hold_micros: i64,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(super::audited(&sql.keep_min_hold))
                .bind(lock.key)
                .bind(lock.owner)
                .bind(lock.fencing_token)
                .bind(lease_param(min_hold_micros))
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }
    };
}

/// The ticket statements that read the same on every database.
macro_rules! common_ticket_statements {
    () => {
        async fn earlier_ticket(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
            ticket: i64,
        ) -> Result<bool, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.earlier_ticket))
                .bind(key)
                .bind(ticket)
                .fetch_one(conn)
                .await
        }

        async fn drop_tickets(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            tickets: &[i64],
        ) -> Result<(), sqlx::Error> {
            let query = sqlx::query(super::audited(&sql.drop_tickets)).bind(ticket_list(tickets));
            query.execute(conn).await.map(drop)
        }

        async fn purge_tickets(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
        ) -> Result<u64, sqlx::Error> {
            let query = sqlx::query(super::audited(&sql.purge_tickets));
            Ok(query.execute(conn).await?.rows_affected())
        }
    };
}

/// The ticket statements of the databases whose statements return their rows: PostgreSQL
/// and SQLite.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(unused_macros)
)]
macro_rules! returning_ticket_statements {
    () => {
        async fn take_ticket(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
            lease_micros: i64,
        ) -> Result<i64, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.take_ticket))
                .bind(key)
                .bind(lease_param(lease_micros))
                .fetch_one(conn)
                .await
        }

        async fn renew_tickets(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            tickets: &[i64],
            lease_micros: i64,
        ) -> Result<Vec<i64>, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.renew_tickets))
                .bind(ticket_list(tickets))
                .bind(lease_param(lease_micros))
                .fetch_all(conn)
                .await
        }
    };
}

/// The waiter's mark, which reads the same on PostgreSQL and MySQL (one key bound, how
/// long the holder's lease has left back; SQLite marks per Locker, its own way).
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_macros)
)]
macro_rules! note_waiter {
    () => {
        async fn note_waiter(
            conn: &mut <Self as sqlx::Database>::Connection,
            sql: &Self::Statements,
            key: &str,
        ) -> Result<Option<i64>, sqlx::Error> {
            sqlx::query_scalar(super::audited(&sql.note_waiter))
                .bind(key)
                .fetch_optional(conn)
                .await
        }
    };
}

/// The migration statements that read the same on every database: scripts, refinery's
/// history, and the check of the table's columns.
macro_rules! migration_io {
    () => {
        async fn run_script<'a>(
            conn: &'a mut <Self as sqlx::Database>::Connection,
            script: &'a str,
        ) -> Result<(), sqlx::Error> {
            sqlx::raw_sql(sqlx::AssertSqlSafe(script.to_owned()))
                .execute(conn)
                .await
                .map(|_| ())
        }

        async fn history<'a>(
            conn: &'a mut <Self as sqlx::Database>::Connection,
            query: &'a str,
        ) -> Result<Vec<(i64, String, String, String)>, sqlx::Error> {
            let rows: Vec<(i32, String, String, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(query.to_owned()))
                    .fetch_all(conn)
                    .await?;
            Ok(rows
                .into_iter()
                .map(|(version, name, applied_on, checksum)| {
                    (i64::from(version), name, applied_on, checksum)
                })
                .collect())
        }

        async fn check_shape<'a>(
            conn: &'a mut <Self as sqlx::Database>::Connection,
            table: &'a str,
        ) -> Result<(), sqlx::Error> {
            let more = Self::MORE_TABLES.iter().map(|(suffix, columns)| {
                format!("SELECT {columns} FROM {table}{suffix} WHERE 1 = 0")
            });
            let tables = [
                format!("SELECT {} FROM {table} WHERE 1 = 0", Self::COLUMNS),
                format!("SELECT ticket, lock_key, expire_time FROM {table}_ticket WHERE 1 = 0"),
            ];
            for select in tables.into_iter().chain(more) {
                sqlx::query(sqlx::AssertSqlSafe(select))
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }
    };
}

/// Splices a validated table name into a statement template.
pub(crate) fn sql(template: &str, table: &str) -> Sql {
    template.replace("{table}", table).into()
}

/// Marks dynamic SQL as audited: every identifier in it passed `validate_table_name`.
pub(crate) fn audited(sql: &Sql) -> sqlx::AssertSqlSafe<Sql> {
    sqlx::AssertSqlSafe(sql.clone())
}

/// The code of a database error, if the error came from the server.
#[cfg_attr(not(all(feature = "postgres", feature = "sqlite")), allow(dead_code))] // not every backend reads codes
pub(crate) fn db_code(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Whether the server reported a duplicate key.
#[cfg_attr(not(all(feature = "mysql", feature = "sqlite")), allow(dead_code))] // not every backend asks
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Lock ids as one JSON array of `{"k", "o", "t"}` objects (key, owner, token), for the
/// databases that take a batch as one JSON parameter.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn ids_json(batch: &[LockId<'_>]) -> String {
    let rows: Vec<serde_json::Value> = batch
        .iter()
        .map(|id| serde_json::json!({ "k": id.key, "o": id.owner, "t": id.fencing_token }))
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// The text between the first pair of `open` and `close` after `after` in `message`: the
/// name a database quoted in an error message.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn quoted_after(message: &str, after: &str, open: char, close: char) -> Option<String> {
    let rest = &message[message.find(after)? + after.len()..];
    let start = rest.find(open)? + open.len_utf8();
    let end = rest[start..].find(close)? + start;
    Some(rest[start..end].to_owned())
}

/// A batch as one JSON array of `{"k", "o", "t", "m"}` objects (key, owner, token, and
/// the lease as `lease` spells it), for the databases that take a batch as one JSON
/// parameter: no bind-parameter limit, and one statement text for any batch size.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn batch_json(
    batch: &[Renewal<'_>],
    lease: impl Fn(i64) -> serde_json::Value,
) -> String {
    let rows: Vec<serde_json::Value> = batch
        .iter()
        .map(|r| {
            serde_json::json!({
                "k": r.id.key, "o": r.id.owner, "t": r.id.fencing_token, "m": lease(r.lease_micros)
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// A list of numbers as one JSON array, for the databases that take a list as one JSON
/// parameter.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn json_list(numbers: &[i64]) -> String {
    serde_json::Value::from(numbers.to_vec()).to_string()
}
