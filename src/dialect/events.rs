//! The lock history's statements ([`HistorySql`]) and the values that cross the boundary
//! with them: events to write ([`NewEvent`]), a read's conditions ([`EventQuery`]) and the
//! rows it returns ([`EventRow`]). Each dialect implements the trait in its own
//! `<database>/history.rs`.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::Dialect;

/// One event to write: what happened, to which row, and how long ago by the client's
/// monotonic clock (the statement writes `at = <database now> - age`, so no client wall
/// clock enters the table).
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    /// The kind, as stored (`"acquired"`, `"lost"`, ...).
    pub kind: &'static str,
    /// The lock key.
    pub key: &'a str,
    /// The owner value (a row's `lock_value`, or a process's `host:pid:` prefix).
    pub owner: &'a str,
    /// The fencing token of the acquisition the event is about, if any.
    pub fencing_token: Option<i64>,
    /// Free text: a loss's reason, an operator's name, a run's duration.
    pub detail: Option<&'a str>,
    /// How long before the statement's send the event happened, in microseconds (>= 0).
    pub age_micros: i64,
}

/// Which events a history read returns (every condition optional but the limit).
#[derive(Debug, Clone, Default)]
pub struct EventQuery<'a> {
    /// Exactly this key.
    pub key: Option<&'a str>,
    /// Keys from this one (a prefix) ...
    pub from: Option<&'a str>,
    /// ... up to this one, not included (the first string past the prefix).
    pub until: Option<&'a str>,
    /// Owners that start with this.
    pub owner: Option<&'a str>,
    /// Only these kinds (as stored); `None`: every kind.
    pub kinds: Option<Vec<&'static str>>,
    /// Events at or after this time (database clock).
    pub since: Option<DateTime<Utc>>,
    /// Events at or after the database's now less this many microseconds.
    pub within_micros: Option<i64>,
    /// Events before this time (database clock).
    pub before: Option<DateTime<Utc>>,
    /// Most rows returned.
    pub limit: i64,
    /// Oldest first (else newest first); ties by id, the insertion order.
    pub oldest_first: bool,
}

impl EventQuery<'_> {
    /// The read for this query's order: `oldest` or `newest` first.
    pub(crate) fn ordered<'s, T>(&self, newest: &'s T, oldest: &'s T) -> &'s T {
        if self.oldest_first { oldest } else { newest }
    }

    /// The kinds as one JSON array (MySQL's `JSON_TABLE`, SQLite's `json_each`).
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn kinds_json(&self) -> Option<String> {
        let kinds = self.kinds.as_ref()?;
        Some(serde_json::Value::from(kinds.clone()).to_string())
    }
}

/// `(id, at, kind, key, owner, fencing token, detail)`: one event as read.
pub(crate) type EventRow = (
    i64,
    DateTime<Utc>,
    String,
    String,
    String,
    Option<i64>,
    Option<String>,
);

/// The lock history's statements, on `<table>_events`.
#[doc(hidden)]
pub trait HistorySql: Dialect {
    /// Writes `events` in one statement, in their order (ids rise with it); how many.
    fn record_events(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        events: &[NewEvent<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The events `query` selects, ordered by time (then id) as it says.
    fn read_events(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        query: &EventQuery<'_>,
    ) -> impl Future<Output = Result<Vec<EventRow>, sqlx::Error>> + Send;

    /// Deletes at most `batch` events older than `older_micros` by the database clock,
    /// oldest first; how many went.
    fn trim_events(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        older_micros: i64,
        batch: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Deletes the row of `key` whoever holds it, as
    /// [`force_release`](super::LockSql::force_release) does; the deleted row's owner
    /// and token, for the history.
    fn force_release_row(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<Option<(String, i64)>, sqlx::Error>> + Send;
}
