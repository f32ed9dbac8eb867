//! MySQL's and MariaDB's lock-history statements (`<table>_events`, migration V3).

use sqlx::{Connection, MySql, MySqlConnection};

use super::Statements;
use crate::dialect::{EventQuery, EventRow, HistorySql, NewEvent, audited};

// The batch is one JSON array (no bind-parameter limit, one statement text for any batch
// size), written in its order (ids rise with it). NOW(6) is one value for the whole
// statement; each event's time is it less the event's age. A missing member is NULL
// (NULL ON EMPTY, the default).
pub(super) const RECORD_EVENTS: &str = "\
INSERT INTO {table}_events (at, kind, lock_key, owner, fencing_token, detail)
SELECT NOW(6) - INTERVAL e.age MICROSECOND, e.kind, e.k, e.o, e.tok, e.detail
  FROM JSON_TABLE(?, '$[*]' COLUMNS (
        n FOR ORDINALITY, age BIGINT PATH '$.a', kind VARCHAR(32) PATH '$.i',
        k VARBINARY(128) PATH '$.k', o VARCHAR(255) PATH '$.o', tok BIGINT PATH '$.t',
        detail VARCHAR(1024) PATH '$.d')) AS e
 ORDER BY e.n";

// Keys are VARBINARY: exact bytes, and a prefix is a byte range over the (lock_key, at)
// index. Each parameter that is tested for NULL is bound twice (`?` cannot repeat).
pub(super) const READ_EVENTS: &str = "\
SELECT id, at, kind, lock_key, owner, fencing_token, detail
  FROM {table}_events
 WHERE (? IS NULL OR lock_key = ?)
   AND (? IS NULL OR lock_key >= ?)
   AND (? IS NULL OR lock_key < ?)
   AND (? IS NULL OR LEFT(owner, CHAR_LENGTH(?)) = ?)
   AND (? IS NULL OR JSON_CONTAINS(?, JSON_QUOTE(kind)))
   AND (? IS NULL OR at >= ?)
   AND (? IS NULL OR at >= NOW(6) - INTERVAL ? MICROSECOND)
   AND (? IS NULL OR at < ?)
 ORDER BY at {order}, id {order}
 LIMIT ?";

// Oldest first through the index on `at`; one bounded batch per reaper pass.
pub(super) const TRIM_EVENTS: &str = "\
DELETE FROM {table}_events WHERE at < NOW(6) - INTERVAL ? MICROSECOND ORDER BY at LIMIT ?";

// MySQL 8 has no DELETE .. RETURNING: the row is read locked, then deleted, in one
// transaction, so the owner read is the owner deleted.
pub(super) const READ_FOR_FORCE: &str =
    "SELECT lock_value, fencing_token FROM {table} WHERE lock_key = ? FOR UPDATE";

/// READ_EVENTS newest first, or oldest first.
pub(super) fn read_events(oldest_first: bool) -> String {
    READ_EVENTS.replace("{order}", if oldest_first { "ASC" } else { "DESC" })
}

type Row = (
    i64,
    chrono::DateTime<chrono::Utc>,
    String,
    Vec<u8>,
    String,
    Option<i64>,
    Option<String>,
);

impl HistorySql for MySql {
    async fn record_events(
        conn: &mut MySqlConnection,
        sql: &Statements,
        events: &[NewEvent<'_>],
    ) -> Result<u64, sqlx::Error> {
        let rows: Vec<serde_json::Value> = events
            .iter()
            .map(|e| {
                let mut row = serde_json::json!({
                    "a": e.age_micros, "i": e.kind, "k": e.key, "o": e.owner,
                });
                // Left out rather than JSON null: JSON_TABLE reads a missing member as
                // SQL NULL on both servers.
                if let Some(token) = e.fencing_token {
                    row["t"] = token.into();
                }
                if let Some(detail) = e.detail {
                    row["d"] = detail.into();
                }
                row
            })
            .collect();
        let batch = serde_json::Value::Array(rows).to_string();
        let done = sqlx::query(audited(&sql.record_events))
            .bind(batch)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn read_events(
        conn: &mut MySqlConnection,
        sql: &Statements,
        query: &EventQuery<'_>,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        let statement = query.ordered(&sql.read_events, &sql.read_events_oldest);
        let kinds = query.kinds_json();
        let bytes = |s: Option<&str>| s.map(|s| s.as_bytes().to_vec());
        let rows: Vec<Row> = sqlx::query_as(audited(statement))
            .bind(bytes(query.key))
            .bind(bytes(query.key))
            .bind(bytes(query.from))
            .bind(bytes(query.from))
            .bind(bytes(query.until))
            .bind(bytes(query.until))
            .bind(query.owner)
            .bind(query.owner)
            .bind(query.owner)
            .bind(kinds.clone())
            .bind(kinds)
            .bind(query.since)
            .bind(query.since)
            .bind(query.within_micros)
            .bind(query.within_micros)
            .bind(query.before)
            .bind(query.before)
            .bind(query.limit)
            .fetch_all(conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, at, kind, key, owner, token, detail)| {
                let key = String::from_utf8_lossy(&key).into_owned();
                (id, at, kind, key, owner, token, detail)
            })
            .collect())
    }

    async fn trim_events(
        conn: &mut MySqlConnection,
        sql: &Statements,
        older_micros: i64,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let trim = sqlx::query(audited(&sql.trim_events))
            .bind(older_micros)
            .bind(batch);
        Ok(trim.execute(conn).await?.rows_affected())
    }

    async fn force_release_row(
        conn: &mut MySqlConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        let mut tx = conn.begin().await?;
        let row: Option<(String, i64)> = sqlx::query_as(audited(&sql.read_for_force))
            .bind(key.as_bytes())
            .fetch_optional(&mut *tx)
            .await?;
        if row.is_some() {
            sqlx::query(audited(&sql.force_release))
                .bind(key.as_bytes())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(row)
    }
}
