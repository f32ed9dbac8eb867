//! SQLite's lock-history statements (`<table>_events`, migration V4).

use chrono::{DateTime, Utc};
use sqlx::{Sqlite, SqliteConnection};

use super::{Statements, since_param};
use crate::dialect::{EventQuery, EventRow, HistorySql, NewEvent, audited};

// The batch is one JSON array, written in its order (ids rise with it). `'now'` is one
// value for the whole statement; each event's `$.a` is a date modifier going back its
// age ('-0.250000 seconds'). Times are UTC text with milliseconds, as the lock table's.
pub(super) const RECORD_EVENTS: &str = "\
INSERT INTO {table}_events (at, kind, lock_key, owner, fencing_token, detail)
SELECT strftime('%Y-%m-%d %H:%M:%f', 'now', e.value ->> '$.a'), e.value ->> '$.i',
       e.value ->> '$.k', e.value ->> '$.o', e.value ->> '$.t', e.value ->> '$.d'
  FROM json_each(?1) AS e
 ORDER BY e.key";

// Keys use the BINARY collation: a prefix is a byte range over the (lock_key, at) index.
pub(super) const READ_EVENTS: &str = "\
SELECT id, at, kind, lock_key, owner, fencing_token, detail
  FROM {table}_events
 WHERE (?1 IS NULL OR lock_key = ?1)
   AND (?2 IS NULL OR lock_key >= ?2)
   AND (?3 IS NULL OR lock_key < ?3)
   AND (?4 IS NULL OR substr(owner, 1, length(?4)) = ?4)
   AND (?5 IS NULL OR kind IN (SELECT value FROM json_each(?5)))
   AND (?6 IS NULL OR at >= ?6)
   AND (?7 IS NULL OR at >= strftime('%Y-%m-%d %H:%M:%f', 'now', ?7))
   AND (?8 IS NULL OR at < ?8)
 ORDER BY at {order}, id {order}
 LIMIT ?9";

// Oldest first through the index on `at`; ?1 a date modifier going back the retention.
pub(super) const TRIM_EVENTS: &str = "\
DELETE FROM {table}_events WHERE id IN (
    SELECT id FROM {table}_events
     WHERE at < strftime('%Y-%m-%d %H:%M:%f', 'now', ?1)
     ORDER BY at LIMIT ?2)";

// FORCE_RELEASE, returning the row it deleted (the waiters' poke trigger fires alike).
pub(super) const FORCE_RELEASE_ROW: &str =
    "DELETE FROM {table} WHERE lock_key = ?1 RETURNING lock_value, fencing_token";

/// READ_EVENTS newest first, or oldest first.
pub(super) fn read_events(oldest_first: bool) -> String {
    READ_EVENTS.replace("{order}", if oldest_first { "ASC" } else { "DESC" })
}

/// A time as the events table stores it: UTC text with milliseconds. A later instant
/// within the same millisecond compares equal, as SQLite's own clock does.
fn time_param(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

impl HistorySql for Sqlite {
    async fn record_events(
        conn: &mut SqliteConnection,
        sql: &Statements,
        events: &[NewEvent<'_>],
    ) -> Result<u64, sqlx::Error> {
        let rows: Vec<serde_json::Value> = events
            .iter()
            .map(|e| {
                serde_json::json!({
                    "a": since_param(e.age_micros), "i": e.kind, "k": e.key, "o": e.owner,
                    "t": e.fencing_token, "d": e.detail,
                })
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
        conn: &mut SqliteConnection,
        sql: &Statements,
        query: &EventQuery<'_>,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        let statement = query.ordered(&sql.read_events, &sql.read_events_oldest);
        let kinds = query.kinds_json();
        sqlx::query_as(audited(statement))
            .bind(query.key)
            .bind(query.from)
            .bind(query.until)
            .bind(query.owner)
            .bind(kinds)
            .bind(query.since.map(time_param))
            .bind(query.within_micros.map(since_param))
            .bind(query.before.map(time_param))
            .bind(query.limit)
            .fetch_all(conn)
            .await
    }

    async fn trim_events(
        conn: &mut SqliteConnection,
        sql: &Statements,
        older_micros: i64,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let trim = sqlx::query(audited(&sql.trim_events))
            .bind(since_param(older_micros))
            .bind(batch);
        Ok(trim.execute(conn).await?.rows_affected())
    }

    async fn force_release_row(
        conn: &mut SqliteConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        sqlx::query_as(audited(&sql.force_release_row))
            .bind(key)
            .fetch_optional(conn)
            .await
    }
}
