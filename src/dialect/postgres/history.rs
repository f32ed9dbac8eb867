//! PostgreSQL's lock-history statements (`<table>_events`, migration V6).

use sqlx::{PgConnection, Postgres};

use super::Statements;
use crate::dialect::{EventQuery, EventRow, HistorySql, NewEvent, audited};

// One statement for the whole batch: the arrays are the batch's columns, unnested in
// order (`WITH ORDINALITY`), so ids rise with the order events were recorded in. Every
// row's time is one database clock reading less the event's age.
pub(super) const RECORD_EVENTS: &str = "\
INSERT INTO {table}_events (at, kind, lock_key, owner, fencing_token, detail)
SELECT c.db_now - e.age * INTERVAL '1 microsecond', e.kind, e.k, e.o, e.tok, e.detail
  FROM (SELECT clock_timestamp() AS db_now) AS c,
       unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[])
         WITH ORDINALITY AS e(age, kind, k, o, tok, detail, n)
 ORDER BY e.n";

// Keys compare as bytes (`COLLATE "C"`), as the lock table's list does, so that the index
// on (lock_key COLLATE "C", at) serves an exact key and a prefix's range alike.
pub(super) const READ_EVENTS: &str = "\
SELECT id, at, kind, lock_key, owner, fencing_token, detail
  FROM {table}_events
 WHERE ($1::text IS NULL OR lock_key COLLATE \"C\" = $1)
   AND ($2::text IS NULL OR lock_key COLLATE \"C\" >= $2)
   AND ($3::text IS NULL OR lock_key COLLATE \"C\" < $3)
   AND ($4::text IS NULL OR starts_with(owner, $4))
   AND ($5::text[] IS NULL OR kind = ANY($5))
   AND ($6::timestamptz IS NULL OR at >= $6)
   AND ($7::bigint IS NULL OR at >= clock_timestamp() - $7 * INTERVAL '1 microsecond')
   AND ($8::timestamptz IS NULL OR at < $8)
 ORDER BY at {order}, id {order}
 LIMIT $9";

// Oldest first through the index on `at`; one bounded batch per reaper pass.
pub(super) const TRIM_EVENTS: &str = "\
DELETE FROM {table}_events WHERE id = ANY(ARRAY(
    SELECT id FROM {table}_events
     WHERE at < clock_timestamp() - $1 * INTERVAL '1 microsecond'
     ORDER BY at LIMIT $2))";

// FORCE_RELEASE, returning the row it deleted.
pub(super) const FORCE_RELEASE_ROW: &str = "\
DELETE FROM {table} WHERE lock_key = $1
RETURNING lock_value::text, fencing_token,
          CASE WHEN waiters THEN pg_notify('dblock:{table}', fencing_token || ':' || lock_key) IS NULL END";

/// READ_EVENTS newest first, or oldest first.
pub(super) fn read_events(oldest_first: bool) -> String {
    READ_EVENTS.replace("{order}", if oldest_first { "ASC" } else { "DESC" })
}

impl HistorySql for Postgres {
    async fn record_events(
        conn: &mut PgConnection,
        sql: &Statements,
        events: &[NewEvent<'_>],
    ) -> Result<u64, sqlx::Error> {
        let ages: Vec<i64> = events.iter().map(|e| e.age_micros).collect();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
        let keys: Vec<&str> = events.iter().map(|e| e.key).collect();
        let owners: Vec<&str> = events.iter().map(|e| e.owner).collect();
        let tokens: Vec<Option<i64>> = events.iter().map(|e| e.fencing_token).collect();
        let details: Vec<Option<&str>> = events.iter().map(|e| e.detail).collect();
        let done = sqlx::query(audited(&sql.record_events))
            .bind(ages)
            .bind(kinds)
            .bind(keys)
            .bind(owners)
            .bind(tokens)
            .bind(details)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn read_events(
        conn: &mut PgConnection,
        sql: &Statements,
        query: &EventQuery<'_>,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        let statement = query.ordered(&sql.read_events, &sql.read_events_oldest);
        sqlx::query_as(audited(statement))
            .bind(query.key)
            .bind(query.from)
            .bind(query.until)
            .bind(query.owner)
            .bind(query.kinds.clone())
            .bind(query.since)
            .bind(query.within_micros)
            .bind(query.before)
            .bind(query.limit)
            .fetch_all(conn)
            .await
    }

    async fn trim_events(
        conn: &mut PgConnection,
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
        conn: &mut PgConnection,
        sql: &Statements,
        key: &str,
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        let row: Option<(String, i64, Option<bool>)> =
            sqlx::query_as(audited(&sql.force_release_row))
                .bind(key)
                .fetch_optional(conn)
                .await?;
        Ok(row.map(|(owner, token, _)| (owner, token)))
    }
}
