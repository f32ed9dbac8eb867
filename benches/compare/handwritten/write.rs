//! A read-write lock's write on PostgreSQL, by hand (cell 7.4): the call of the table's
//! `<table>_take_write` function that takes the writer's and the grant's rows and looks
//! for readers, then the one owner- and token-checked DELETE of both rows, the very
//! statements dblock sends, each lock fresh. Against dblock's own write on fresh locks it
//! tells dblock's work (guard, lease engine, metrics) from its statements' cost.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::PgPool;

use super::{LEASE, PG_RELEASE_BATCH, PG_TAKE_WRITE, audited, lease_micros, statement};
use crate::measure::{BoxError, Contender, new_owner};

/// The contender's name in cell 7.4's table.
pub const NAME: &str = "hand-written write: dblock's statements by hand, a fresh lock each cycle";

/// What `<table>_take_write` answers: the outcome, then each row's token and expiry
/// (the same columns dblock reads).
type Taken = (
    String,
    Option<i64>,
    Option<DateTime<Utc>>,
    Option<i64>,
    Option<DateTime<Utc>>,
);

/// dblock's write and release of a read-write lock on PostgreSQL, written with sqlx.
pub struct PgHandWrite {
    pool: PgPool,
    take: Arc<str>,
    release: Arc<str>,
}

impl PgHandWrite {
    /// On `table`, a durable one (dblock formats `relaxed` false there).
    pub fn new(pool: PgPool, table: &str) -> Self {
        // `{{table}}` first: `{table}` is part of it.
        let take = PG_TAKE_WRITE
            .replace("{{table}}", table)
            .replace("{relaxed}", "false");
        PgHandWrite {
            pool,
            take: take.into(),
            release: statement(PG_RELEASE_BATCH, table),
        }
    }
}

impl Contender for PgHandWrite {
    fn name(&self) -> &str {
        NAME
    }

    /// `key` names the lock; its rows are keyed as dblock keys them (`src/rwlock.rs`).
    fn cycle<'a>(&'a self, _task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let owner = new_owner();
            let writer = format!("{key}~write");
            let grant = format!("{key}~write-grant");
            // The readers' rows, `<name>~read-<hex>`: from that prefix up to the first
            // string past it, which dblock computes as the prefix with its last
            // character moved on one code point ('-' -> '.').
            let (readers_from, readers_to) = (format!("{key}~read-"), format!("{key}~read."));
            let taken: Taken = sqlx::query_as(audited(&self.take))
                .bind(&writer)
                .bind(&grant)
                .bind(&owner)
                .bind(lease_micros(LEASE))
                // dblock's `try_write` bounds its wait by the attempt's deadline, a
                // lease away: in whole ms.
                .bind(i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX))
                .bind(&readers_from)
                .bind(&readers_to)
                .fetch_one(&self.pool)
                .await?;
            let (_, Some(writer_token), Some(_), Some(grant_token), Some(_)) = taken else {
                return Ok(false);
            };
            // Writer's row first, as dblock orders a pair (byte order).
            let released: Vec<(String, i64, bool, Option<bool>)> =
                sqlx::query_as(audited(&self.release))
                    .bind(vec![writer.as_str(), grant.as_str()])
                    .bind(vec![owner.as_str(), owner.as_str()])
                    .bind(vec![writer_token, grant_token])
                    .fetch_all(&self.pool)
                    .await?;
            Ok(released.len() == 2)
        })
    }
}
