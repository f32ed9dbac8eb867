//! The lock history's statements on `<table>_events`, sent as every caller's statement
//! is: on a pooled connection, bounded by the statement timeout.

use std::time::Duration;

use tokio::time::Instant;

use super::{Checkout, LockTable, prefix_end};
use crate::config::micros;
use crate::dialect::{Backend, EventQuery, EventRow, NewEvent};
use crate::error::Result;

impl<DB: Backend> LockTable<DB> {
    /// Writes `events` in one statement, each noted at its `Instant`; how many rows went
    /// in. Each event's age is taken once the connection is in hand, just before the
    /// statement reads the database clock: a pool checkout (a ping, a wait for a busy
    /// pool) would otherwise count as age the event did not have, and date it later.
    pub(crate) async fn record_events(&self, events: &[(NewEvent<'_>, Instant)]) -> Result<u64> {
        let aged = |now: Instant| -> Vec<NewEvent<'_>> {
            events
                .iter()
                .map(|(event, noted)| NewEvent {
                    age_micros: micros(now.saturating_duration_since(*noted)),
                    ..*event
                })
                .collect()
        };
        self.run(
            self.bounded(),
            pooled!(|conn| async {
                let events = aged(Instant::now());
                DB::record_events(conn, &self.sql, &events).await
            }),
        )
        .await
    }

    /// The events `query` selects; a prefix (`query.from`) gets its end here.
    pub(crate) async fn read_events(&self, mut query: EventQuery<'_>) -> Result<Vec<EventRow>> {
        let until = query.from.and_then(prefix_end);
        query.until = until.as_deref();
        let query = &query;
        self.run(
            self.bounded(),
            pooled!(|conn| DB::read_events(conn, &self.sql, query)),
        )
        .await
    }

    /// Deletes at most `batch` events older than `retention` (database clock).
    pub(crate) async fn trim_events(&self, retention: Duration, batch: u32) -> Result<u64> {
        let older = micros(retention);
        self.run(
            self.bounded(),
            pooled!(|conn| DB::trim_events(conn, &self.sql, older, i64::from(batch))),
        )
        .await
    }

    /// Deletes the row of `key` whoever holds it; its owner and token if there was one.
    pub(crate) async fn force_release_row(&self, key: &str) -> Result<Option<(String, i64)>> {
        self.run(
            self.bounded(),
            pooled!(|conn| DB::force_release_row(conn, &self.sql, key)),
        )
        .await
    }
}
