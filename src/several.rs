//! Attempts at several rows in one transaction: a several-key lock's keys
//! ([`attempt_all`]) and a read-write lock's write, its writer's and grant's rows
//! ([`attempt_write`]). Each transaction runs on the caller's task as an
//! `inflight::Statement`, as a single attempt's statement does (see `acquire`): if the
//! caller goes away mid-transaction, a background job lets it finish and removes the rows
//! it won.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{late, remove_leftover, ring_for_others};
use crate::core::Core;
use crate::dialect::Backend;
use crate::error::Result;
use crate::inflight::{Statement, answer};
use crate::lease::{Lease, Won};
use crate::recorder::{EventKind, Record};
use crate::stats::Counters;
use crate::table::{WonRow, WriteTake};

/// The transaction of an attempt at several keys, in flight. Dropped before it answered,
/// it hands the transaction to a background job, which lets it finish and removes the
/// rows it may have won.
struct AllInFlight<'c, DB: Backend> {
    core: &'c Core<DB>,
    statement: Option<Statement<Result<Option<Vec<WonRow>>>>>,
    keys: &'c [String],
    owner: &'c str,
    until: Instant,
}

impl<DB: Backend> Drop for AllInFlight<'_, DB> {
    fn drop(&mut self) {
        let Some(statement) = self.statement.take() else {
            return;
        };
        let (table, policy) = (Arc::clone(&self.core.table), self.core.retry);
        let (keys, owner) = (self.keys.to_vec(), self.owner.to_owned());
        // As after a single attempt (see `InFlight`).
        let until = self.until + table.statement_timeout();
        self.core.jobs.spawn(async move {
            let tokens: Vec<Option<i64>> = match tokio::time::timeout_at(until, statement).await {
                Ok(Ok(None)) => return,
                Ok(Ok(Some(won))) => won.iter().map(|(won, _)| Some(won.fencing_token)).collect(),
                Ok(Err(_)) | Err(_) => vec![None; keys.len()],
            };
            for (key, token) in keys.iter().zip(tokens) {
                remove_leftover(&table, &policy, key, &owner, token, until).await;
            }
        });
    }
}

/// One attempt at all of `keys` (validated, sorted, distinct) for `owner`, all or
/// nothing in one transaction; the leases, in the keys' order, or `None` when a key was
/// held or the race lost. Cancel safe as [`acquire::attempt`](crate::acquire::attempt).
pub(crate) async fn attempt_all<DB: Backend>(
    core: &Core<DB>,
    keys: &[String],
    owner: &str,
    lease: Duration,
    renew: Option<Duration>,
) -> Result<Option<Vec<Arc<Lease>>>> {
    let statement = |until: Instant| -> Statement<Result<Option<Vec<WonRow>>>> {
        let table = Arc::clone(&core.table);
        let (sent_keys, sent_owner) = (keys.to_vec(), owner.to_owned());
        Box::pin(async move {
            table
                .acquire_all(&sent_keys, &sent_owner, lease, until)
                .await
        })
    };
    attempt_keys(core, keys, owner, lease, renew, statement).await
}

/// What a read-write lock's write attempt ([`attempt_write`]) came to.
pub(crate) enum WriteAttempt {
    /// The writer's and the grant's leases, in that order.
    Won(Vec<Arc<Lease>>),
    /// A row was held (or a fair-mode ticket is ahead, or the race was lost).
    Held,
    /// Both rows were free, but a reader holds.
    Read,
}

/// One attempt at a write of a read-write lock, in one transaction: the writer's row and
/// the grant's (`keys`, in that order), kept only if no row keyed with the prefix
/// `readers` is live. Fair mode: only if no ticket is ahead of `ticket` for the writer's
/// key. Cancel safe as [`acquire::attempt`](crate::acquire::attempt).
pub(crate) async fn attempt_write<DB: Backend>(
    core: &Core<DB>,
    keys: &[String],
    readers: &str,
    owner: &str,
    lease: Duration,
    renew: Option<Duration>,
    ticket: Option<i64>,
) -> Result<WriteAttempt> {
    if core.tickets.is_some() {
        let ahead = Box::pin(core.table.earlier_ticket(&keys[0], ticket));
        if ahead.await? {
            return Ok(WriteAttempt::Held);
        }
    }
    // Set by the statement when it found a reader (the rows were free).
    let read = Arc::new(AtomicBool::new(false));
    let statement = |until: Instant| -> Statement<Result<Option<Vec<WonRow>>>> {
        let table = Arc::clone(&core.table);
        let (sent_keys, sent_owner) = (keys.to_vec(), owner.to_owned());
        let (sent_readers, read) = (readers.to_owned(), Arc::clone(&read));
        Box::pin(async move {
            let taken = table.acquire_write(&sent_keys, &sent_readers, &sent_owner, lease, until);
            Ok(match taken.await? {
                WriteTake::Won(won) => Some(won),
                WriteTake::Held => None,
                WriteTake::Read => {
                    read.store(true, Ordering::Relaxed);
                    None
                }
            })
        })
    };
    Ok(
        match attempt_keys(core, keys, owner, lease, renew, statement).await? {
            Some(leases) => WriteAttempt::Won(leases),
            None if read.load(Ordering::Relaxed) => WriteAttempt::Read,
            None => WriteAttempt::Held,
        },
    )
}

/// [`attempt_all`] with the transaction `statement` makes (bounded by the instant it is
/// given: the lease's end if it won at once) taking `keys` for `owner`.
async fn attempt_keys<DB: Backend>(
    core: &Core<DB>,
    keys: &[String],
    owner: &str,
    lease: Duration,
    renew: Option<Duration>,
    statement: impl FnOnce(Instant) -> Statement<Result<Option<Vec<WonRow>>>>,
) -> Result<Option<Vec<Arc<Lease>>>> {
    core.margin.check(lease, renew)?;
    Counters::bump(&core.counters.attempts);
    let sent_at = Instant::now();
    let until = sent_at + lease;
    let statement = statement(until);
    let mut in_flight = AllInFlight {
        core,
        statement: Some(statement),
        keys,
        owner,
        until,
    };
    let outcome = answer(&mut in_flight.statement).await;
    match outcome {
        Ok(Some(won)) => {
            // Each row's watchers, and whether it was taken over (for its history event).
            let watchers: Vec<_> = won
                .iter()
                .map(|(won, watchers)| (*watchers, won.taken_over))
                .collect();
            let won: Vec<Won> = keys
                .iter()
                .zip(won)
                .map(|(key, (won, _))| Won {
                    key: key.clone(),
                    owner: owner.to_owned(),
                    fencing_token: won.fencing_token,
                    expires_at: won.expires_at,
                    length: lease,
                    interval: renew,
                    sent_at,
                    margin: core.margin,
                })
                .collect();
            if won
                .first()
                .is_some_and(|won| Instant::now() >= won.deadline())
            {
                return Err(late(core, won, until));
            }
            Counters::bump(&core.counters.acquired);
            for (won, (_, taken_over)) in won.iter().zip(&watchers) {
                (core.history).record(
                    EventKind::acquisition(*taken_over),
                    &won.key,
                    &won.owner,
                    Some(won.fencing_token),
                );
            }
            tracing::debug!(?keys, owner, "locks acquired");
            let leases = won
                .into_iter()
                .zip(watchers)
                .map(|(won, (watchers, _))| {
                    let lease = core.engine.start_lease(won);
                    ring_for_others(core, &lease, watchers);
                    lease
                })
                .collect();
            Ok(Some(leases))
        }
        Ok(None) => Ok(None),
        Err(err) => {
            // The answer was lost, not necessarily the commit: the rows this owner may
            // hold go in the background, as after a lost single attempt.
            let (table, policy) = (Arc::clone(&core.table), core.retry);
            let (keys, owner) = (keys.to_vec(), owner.to_owned());
            let until = until + table.statement_timeout();
            core.jobs.spawn(async move {
                for key in &keys {
                    remove_leftover(&table, &policy, key, &owner, None, until).await;
                }
            });
            Err(err)
        }
    }
}
