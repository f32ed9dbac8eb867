//! Fair mode ([`LockerBuilder::fair`](crate::LockerBuilder::fair)): strict first come,
//! first served across processes, like Curator's sequential nodes or Redisson's fair lock.
//!
//! A waiter that lost its first attempt takes a ticket: a row in `<table>_ticket` with a
//! number and a lease. Tickets of one key commit in the order of their numbers (each
//! dialect serializes them per key), and an attempt is made only when no live ticket of
//! that key has a lower number (an attempt without a ticket only when there is no live
//! ticket at all), so grants follow ticket order. The lock row itself is unchanged: a row
//! of a plain-SQL client still blocks everyone, and tickets only order dblock's waiters.
//!
//! Tickets are leases too. The Locker's ticket job renews every ticket of its waiters in
//! one statement per renew interval while they wait (the ticket lease is the Locker's
//! default lease), so a waiter that dies stops blocking the queue when its ticket expires.
//!
//! A waiter that goes away (cancelled, timed out, or its future dropped while its ticket
//! was being taken) never holds up the queue: its ticket is deleted by the same job, in
//! one statement for every ticket given up since the last one, retried with backoff
//! until the ticket's lease ends. A ticket statement in flight when its waiter went away
//! is finished in the background, and the ticket it returns is deleted too, as an abandoned
//! acquisition's row is. Expired tickets (of waiters that died) are purged now and then
//! by that job, and by every reaper pass ([`Locker::reap_expired`](crate::Locker::reap_expired)).
//! The job's statements run on the engine's own connection, outside the pool.
//!
//! Fair mode is a [`Line`] of the one waiting loop (`acquire.rs`): [`Fair`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use crate::config::RetryPolicy;
use crate::dialect::Backend;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::inflight::{Statement, answer};
use crate::jobs::Jobs;
use crate::lease::Lease;
use crate::line::{Line, Place, Step};
use crate::queue::{self, LocalQueues};
use crate::retry::{Retry, by_deadline, retry};
use crate::table::{LockTable, Via};

/// Every this many renewal passes, expired tickets (of waiters that died) are deleted.
const PURGE_EVERY: u32 = 60;

/// The tickets of one Locker's waiters, and how long they last.
pub(crate) struct Tickets {
    /// Shared with jobs that outlive a waiter (an abandoned ticket statement).
    queue: Arc<TicketQueue>,
    started: AtomicBool,
    /// The lease of a ticket, and how often it is renewed.
    pub(crate) lease: Duration,
    interval: Duration,
}

/// What the ticket job works on.
struct TicketQueue {
    /// Live tickets by number; the flag says the ticket was found expired or gone.
    held: Mutex<HashMap<i64, Arc<AtomicBool>>>,
    /// Tickets to delete, each with the end of its lease.
    dropping: Mutex<Dropping>,
    /// Wakes the job: a ticket arrived or is to be deleted.
    changed: Notify,
}

#[derive(Default)]
struct Dropping {
    tickets: Vec<(i64, Instant)>,
    /// The job has stopped taking tickets to delete: the giver deletes its own.
    closed: bool,
}

impl TicketQueue {
    fn held(&self) -> MutexGuard<'_, HashMap<i64, Arc<AtomicBool>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dropping(&self) -> MutexGuard<'_, Dropping> {
        self.dropping.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `ticket` (whose lease ends at `until`) to the job for deletion; `false` when
    /// the job has stopped and the caller must delete it itself.
    fn give_up(&self, ticket: i64, until: Instant) -> bool {
        self.held().remove(&ticket);
        let mut dropping = self.dropping();
        if dropping.closed {
            return false;
        }
        dropping.tickets.push((ticket, until));
        drop(dropping);
        self.changed.notify_one();
        true
    }
}

impl Tickets {
    /// Tickets with leases of `lease`, renewed every `min(interval, lease / 3)`.
    pub(crate) fn new(lease: Duration, interval: Duration) -> Self {
        Tickets {
            queue: Arc::new(TicketQueue {
                held: Mutex::new(HashMap::new()),
                dropping: Mutex::default(),
                changed: Notify::new(),
            }),
            started: AtomicBool::new(false),
            lease,
            interval: interval.min(lease / 3),
        }
    }

    /// Starts the ticket job if it does not run yet (it runs until the Locker's jobs
    /// stop). Before a ticket is taken: a ticket of an abandoned statement is handed to it.
    fn start<DB: Backend>(
        self: &Arc<Self>,
        table: &Arc<LockTable<DB>>,
        jobs: &Jobs,
        retry: RetryPolicy,
    ) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let (tickets, table, stop) = (Arc::clone(self), Arc::clone(table), jobs.clone());
        jobs.spawn(async move { tickets.run(&table, &retry, &stop).await });
    }

    /// The ticket job, until `stop`: renews every held ticket each interval, deletes the
    /// tickets given up (retrying with `policy`'s backoff until each one's lease ends),
    /// and purges expired ones now and then. At `stop` it deletes what it was given,
    /// still each until its lease ends, and from then on givers delete their own.
    async fn run<DB: Backend>(&self, table: &LockTable<DB>, policy: &RetryPolicy, jobs: &Jobs) {
        let queue = &*self.queue;
        let mut passes = 0u32;
        let mut next_renewal: Option<Instant> = None;
        let mut drops = DropPacing::new(policy);
        loop {
            let holding = !queue.held().is_empty();
            if !holding {
                next_renewal = None;
            } else if next_renewal.is_none() {
                next_renewal = Some(Instant::now() + self.interval);
            }
            let dropping = (!queue.dropping().tickets.is_empty()).then(|| drops.at());
            let wake = match (next_renewal, dropping) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                _ = jobs.stopping() => break,
                _ = queue.changed.notified() => {}
                _ = async { match wake {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                } } => {}
            }
            let now = Instant::now();
            if dropping.is_some_and(|at| at <= now) {
                drops.send(queue, table).await;
            }
            if next_renewal.is_some_and(|at| at <= now) {
                next_renewal = Some(now + self.interval);
                self.renew(table, now + self.interval).await;
                passes += 1;
                if passes.is_multiple_of(PURGE_EVERY)
                    && let Err(err) =
                        by_deadline(now + self.interval, table.purge_tickets(Via::Engine)).await
                {
                    tracing::debug!(error = %err, "could not purge expired tickets");
                }
            }
        }
        queue.dropping().closed = true;
        while !queue.dropping().tickets.is_empty() {
            sleep_until(drops.at()).await;
            drops.send(queue, table).await;
        }
    }

    /// Renews every held ticket in one statement (given up at `deadline`).
    async fn renew<DB: Backend>(&self, table: &LockTable<DB>, deadline: Instant) {
        let numbers: Vec<i64> = self.queue.held().keys().copied().collect();
        if numbers.is_empty() {
            return;
        }
        match by_deadline(deadline, table.renew_tickets(&numbers, self.lease)).await {
            Ok(renewed) => {
                let held = self.queue.held();
                for number in numbers.iter().filter(|n| !renewed.contains(n)) {
                    if let Some(lost) = held.get(number) {
                        lost.store(true, Ordering::Release);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not renew waiters' tickets; they lapse at the end of their lease");
            }
        }
    }
}

/// When the ticket job may send its next batched delete: at once, or after a failed one,
/// the retry policy's next pause.
struct DropPacing {
    policy: RetryPolicy,
    delays: Box<dyn Iterator<Item = Duration> + Send>,
    at: Option<Instant>,
}

impl DropPacing {
    fn new(policy: &RetryPolicy) -> Self {
        DropPacing {
            policy: *policy,
            delays: Box::new(policy.delays()),
            at: None,
        }
    }

    fn at(&self) -> Instant {
        self.at.unwrap_or_else(Instant::now)
    }

    /// Deletes every ticket given up whose lease has not ended, in one statement; on
    /// failure they are kept for the next try.
    async fn send<DB: Backend>(&mut self, queue: &TicketQueue, table: &LockTable<DB>) {
        let now = Instant::now();
        let batch: Vec<(i64, Instant)> = {
            let mut dropping = queue.dropping();
            dropping.tickets.retain(|(_, until)| *until > now);
            std::mem::take(&mut dropping.tickets)
        };
        if batch.is_empty() {
            return;
        }
        let numbers: Vec<i64> = batch.iter().map(|(n, _)| *n).collect();
        let until = batch.iter().map(|(_, u)| *u).max().unwrap_or(now);
        match by_deadline(until, table.drop_tickets(&numbers, Via::Engine)).await {
            Ok(()) => {
                self.delays = Box::new(self.policy.delays());
                self.at = None;
            }
            Err(err) => {
                tracing::debug!(tickets = numbers.len(), error = %err, "could not delete given-up tickets; trying again until their lease ends");
                self.at = Some(Instant::now() + self.delays.next().unwrap_or_default());
                queue.dropping().tickets.extend(batch);
            }
        }
    }
}

/// Deletes one ticket, retrying until `until` (its lease's end): for a ticket given up
/// after the ticket job stopped.
async fn drop_alone<DB: Backend>(
    table: &LockTable<DB>,
    policy: &RetryPolicy,
    number: i64,
    until: Instant,
) {
    let dropped = retry(policy, until, |_| async move {
        by_deadline(until, table.drop_tickets(&[number], Via::Engine))
            .await
            .map_err(Retry::Again)
    })
    .await;
    if dropped.is_err() {
        tracing::debug!(ticket = number, "could not delete a ticket; it will expire");
    }
}

/// Fair mode's line: the Locker's parts a fair waiter works with.
pub(crate) struct Fair<'c, DB: Backend> {
    pub(crate) table: &'c Arc<LockTable<DB>>,
    pub(crate) tickets: &'c Arc<Tickets>,
    pub(crate) queues: &'c LocalQueues,
    pub(crate) jobs: &'c Jobs,
    pub(crate) retry: &'c RetryPolicy,
    /// Releases a won lease whose waiter went away before it had it.
    pub(crate) engine: &'c Engine<DB>,
}

impl<DB: Backend> Fair<'_, DB> {
    /// Refuses fair mode, before any ticket is written, on a database that cannot keep
    /// tickets in arrival order: a multi-primary cluster (MariaDB Galera), asked once per
    /// lock table.
    pub(crate) async fn check_order(&self) -> Result<()> {
        if self.table.certifies_writes().await? {
            return Err(Error::InvalidConfig(TICKETS_ON_A_CLUSTER.to_owned()));
        }
        Ok(())
    }
}

/// Why fair mode is refused on a MariaDB Galera cluster.
const TICKETS_ON_A_CLUSTER: &str = "fair mode numbers its tickets with AUTO_INCREMENT, which \
    a MariaDB Galera cluster (wsrep_on) hands out in per-node strides, so tickets from \
    different nodes are not in arrival order; use the default FIFO mode (fair(false))";

impl<DB: Backend> Line for Fair<'_, DB> {
    fn join<'a>(&'a self, key: &str) -> Box<dyn Place<'a> + 'a> {
        Box::new(FairPlace {
            line: self,
            key: key.to_owned(),
            place: self.queues.join_fair(key),
            ticket: None,
        })
    }
}

/// A fair waiter's place: its place among this Locker's waiters (every one of them looks
/// on each release) and, after its first lost attempt, its ticket.
struct FairPlace<'a, DB: Backend> {
    line: &'a Fair<'a, DB>,
    key: String,
    place: queue::QueuePlace<'a>,
    ticket: Option<Ticket<'a, DB>>,
}

impl<'a, DB: Backend> Place<'a> for FairPlace<'a, DB> {
    fn may_attempt(&self) -> bool {
        // Every fair waiter may: the attempt itself checks for an earlier ticket.
        true
    }

    fn ticket(&mut self) -> Step<'_, Result<Option<i64>>> {
        Box::pin(async move {
            if self.ticket.as_ref().is_some_and(Ticket::lost) {
                tracing::debug!(key = %self.key, "a waiter's ticket lapsed; it queues again at the back");
                self.ticket = Some(take_ticket(self.line, &self.key).await?);
            }
            Ok(self.ticket.as_ref().map(|ticket| ticket.number))
        })
    }

    fn lost(&mut self) -> Step<'_, Result<()>> {
        Box::pin(async move {
            if self.ticket.is_none() {
                self.ticket = Some(take_ticket(self.line, &self.key).await?);
            }
            Ok(())
        })
    }

    fn won(mut self: Box<Self>, lease: Arc<Lease>) -> Step<'a, Arc<Lease>> {
        let ticket = self.ticket.take();
        let engine = self.line.engine;
        Box::pin(async move {
            let Some(ticket) = ticket else {
                return lease;
            };
            lease.set_ticket(ticket.number);
            // Cancelled while the ticket goes, the won lease has no guard yet: the engine
            // releases it, as it does for an acquisition cancelled in flight.
            let unclaimed = Unclaimed {
                engine,
                lease: Some(lease),
            };
            ticket.delete().await;
            unclaimed.claim()
        })
    }

    fn signalled(&self) -> Step<'_, bool> {
        Box::pin(async move {
            self.place.next_turn().await;
            // Nobody waits for a release behind a winner here: tickets order the attempts.
            false
        })
    }
}

/// A waiter's ticket, renewed while it lives; dropping it gives it up (the ticket job
/// deletes it), for a waiter that was cancelled or timed out.
struct Ticket<'a, DB: Backend> {
    line: &'a Fair<'a, DB>,
    number: i64,
    /// Set by the ticket job when the ticket was found expired or gone.
    lost: Arc<AtomicBool>,
    deleted: bool,
}

impl<DB: Backend> Ticket<'_, DB> {
    /// Whether the ticket expired or vanished (renewal failed for a whole lease): its
    /// waiter must take a new one, at the back.
    fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Deletes the ticket now (its waiter won): the next waiter must find no earlier
    /// ticket once the lease is released. On failure the drop gives it to the job.
    async fn delete(mut self) {
        let line = self.line;
        line.tickets.queue.held().remove(&self.number);
        let until = Instant::now() + line.tickets.lease;
        let numbers = [self.number];
        let deleted = by_deadline(until, line.table.drop_tickets(&numbers, Via::Pool));
        self.deleted = deleted.await.is_ok();
    }
}

impl<DB: Backend> Drop for Ticket<'_, DB> {
    fn drop(&mut self) {
        let line = self.line;
        let queue = &line.tickets.queue;
        queue.held().remove(&self.number);
        if self.deleted {
            return;
        }
        // The lease may have been renewed just now: it lasts at most this long.
        let until = Instant::now() + line.tickets.lease;
        if !queue.give_up(self.number, until) {
            let (table, policy, number) = (Arc::clone(line.table), *line.retry, self.number);
            line.jobs
                .spawn(async move { drop_alone(&table, &policy, number, until).await });
        }
    }
}

type TicketStatement = Statement<Result<i64>>;

/// A ticket statement in flight. Dropped before it answered (its waiter went away), it
/// hands the statement to a background job, which lets it finish and deletes the ticket
/// it returns: otherwise a committed ticket nobody owns would hold up every later waiter
/// until its lease ended.
struct TicketInFlight<'a, DB: Backend> {
    line: &'a Fair<'a, DB>,
    statement: Option<TicketStatement>,
    /// The end of the ticket's lease: past it, it no longer holds anyone up.
    until: Instant,
}

impl<DB: Backend> Drop for TicketInFlight<'_, DB> {
    fn drop(&mut self) {
        let Some(statement) = self.statement.take() else {
            return;
        };
        let line = self.line;
        let queue = Arc::clone(&line.tickets.queue);
        let (table, policy, until) = (Arc::clone(line.table), *line.retry, self.until);
        line.jobs.spawn(async move {
            // An error or no answer: the ticket, if committed, lapses with its lease.
            if let Ok(Ok(number)) = tokio::time::timeout_at(until, statement).await
                && !queue.give_up(number, until)
            {
                drop_alone(&table, &policy, number, until).await;
            }
        });
    }
}

/// Takes a ticket for `key` and starts renewing it. Cancel safe: a ticket statement in
/// flight when the future is dropped is finished in the background, and its ticket
/// deleted.
async fn take_ticket<'a, DB: Backend>(line: &'a Fair<'a, DB>, key: &str) -> Result<Ticket<'a, DB>> {
    let tickets = line.tickets;
    tickets.start(line.table, line.jobs, *line.retry);
    let until = Instant::now() + tickets.lease;
    let statement: TicketStatement = {
        let (table, key, lease) = (Arc::clone(line.table), key.to_owned(), tickets.lease);
        Box::pin(async move { table.take_ticket(&key, lease).await })
    };
    let mut in_flight = TicketInFlight {
        line,
        statement: Some(statement),
        until,
    };
    let number = answer(&mut in_flight.statement).await?;
    let lost = Arc::new(AtomicBool::new(false));
    tickets.queue.held().insert(number, Arc::clone(&lost));
    tickets.queue.changed.notify_one();
    Ok(Ticket {
        line,
        number,
        lost,
        deleted: false,
    })
}

/// A won lease not yet handed to its caller: released in the background if dropped.
struct Unclaimed<'a, DB: Backend> {
    engine: &'a Engine<DB>,
    lease: Option<Arc<Lease>>,
}

impl<DB: Backend> Unclaimed<'_, DB> {
    fn claim(mut self) -> Arc<Lease> {
        self.lease.take().expect("claimed once")
    }
}

impl<DB: Backend> Drop for Unclaimed<'_, DB> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.engine.release_in_background(lease);
        }
    }
}
