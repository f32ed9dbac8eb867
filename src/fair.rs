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
//! Tickets are leases too. The engine renews every ticket of its Locker in one statement
//! per renew interval while their waiters wait (the ticket lease is the Locker's default
//! lease), so a waiter that dies stops blocking the queue when its ticket expires.
//!
//! A waiter that goes away (cancelled, timed out, or its future dropped while its ticket
//! was being taken) never holds up the queue: its ticket is deleted by the same job, in
//! one statement for every ticket given up since the last one, retried with backoff
//! until the ticket's lease ends. A ticket statement in flight when its waiter went away
//! is finished by the engine, and the ticket it returns is deleted too, as an abandoned
//! acquisition's row is. Expired tickets (of waiters that died) are purged now and then
//! by that job, and by every reaper pass ([`Locker::reap_expired`](crate::Locker::reap_expired)).
//! The job's statements run on the engine's own connection, outside the pool.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::acquire::{AfterLoss, Pacing, Statement, answer};
use crate::config::RetryPolicy;
use crate::dialect::Backend;
use crate::engine::Engine;
use crate::error::Result;
use crate::lease::Lease;
use crate::retry::{Retry, by, retry};
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

    /// Claims the start of the renewal job: `true` exactly once.
    pub(crate) fn claim_start(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }

    /// The ticket job, until `stop`: renews every held ticket each interval, deletes the
    /// tickets given up (retrying with `policy`'s backoff until each one's lease ends),
    /// and purges expired ones now and then. At `stop` it deletes what it was given,
    /// still each until its lease ends, and from then on givers delete their own.
    pub(crate) async fn run<DB: Backend>(
        &self,
        table: &LockTable<DB>,
        policy: &RetryPolicy,
        stop: &CancellationToken,
    ) {
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
                _ = stop.cancelled() => break,
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
                        by(now + self.interval, table.purge_tickets(Via::Engine)).await
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
        match by(deadline, table.renew_tickets(&numbers, self.lease)).await {
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
        match by(until, table.drop_tickets(&numbers, Via::Engine)).await {
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
        by(until, table.drop_tickets(&[number], Via::Engine))
            .await
            .map_err(Retry::Again)
    })
    .await;
    if dropped.is_err() {
        tracing::debug!(ticket = number, "could not delete a ticket; it will expire");
    }
}

/// A waiter's ticket, renewed while it lives; dropping it gives it up (the ticket job
/// deletes it), for a waiter that was cancelled or timed out.
struct Ticket<'e, DB: Backend> {
    engine: &'e Engine<DB>,
    tickets: &'e Tickets,
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
        self.tickets.queue.held().remove(&self.number);
        let until = Instant::now() + self.tickets.lease;
        if by(
            until,
            self.engine.table().drop_tickets(&[self.number], Via::Pool),
        )
        .await
        .is_ok()
        {
            self.deleted = true;
        }
    }
}

impl<DB: Backend> Drop for Ticket<'_, DB> {
    fn drop(&mut self) {
        let queue = &self.tickets.queue;
        queue.held().remove(&self.number);
        if self.deleted {
            return;
        }
        // The lease may have been renewed just now: it lasts at most this long.
        let until = Instant::now() + self.tickets.lease;
        if !queue.give_up(self.number, until) {
            let table = Arc::clone(self.engine.table());
            let (policy, number) = (*self.engine.retry_policy(), self.number);
            self.engine
                .spawn_job(async move { drop_alone(&table, &policy, number, until).await });
        }
    }
}

type TicketStatement = Statement<std::result::Result<i64, sqlx::Error>>;

/// A ticket statement in flight. Dropped before it answered (its waiter went away), it
/// hands the statement to the engine, which lets it finish and deletes the ticket it
/// returns: otherwise a committed ticket nobody owns would hold up every later waiter
/// until its lease ended.
struct TicketInFlight<'e, DB: Backend> {
    engine: &'e Engine<DB>,
    tickets: &'e Tickets,
    statement: Option<TicketStatement>,
    /// The end of the ticket's lease: past it, it no longer holds anyone up.
    until: Instant,
}

impl<DB: Backend> Drop for TicketInFlight<'_, DB> {
    fn drop(&mut self) {
        let Some(statement) = self.statement.take() else {
            return;
        };
        let queue = Arc::clone(&self.tickets.queue);
        let table = Arc::clone(self.engine.table());
        let (policy, until) = (*self.engine.retry_policy(), self.until);
        self.engine.spawn_job(async move {
            // An error or no answer: the ticket, if committed, lapses with its lease.
            if let Ok(Ok(number)) = tokio::time::timeout_at(until, statement).await
                && !queue.give_up(number, until)
            {
                drop_alone(&table, &policy, number, until).await;
            }
        });
    }
}

impl<DB: Backend> Engine<DB> {
    /// Takes a ticket for `key` and starts renewing it. Cancel safe: a ticket statement
    /// in flight when the future is dropped is finished by the engine, and its ticket
    /// deleted.
    async fn take_ticket<'e>(&'e self, key: &str, tickets: &'e Tickets) -> Result<Ticket<'e, DB>> {
        // Started first: a ticket of an abandoned statement is handed to it.
        self.renew_tickets_in_background();
        let until = Instant::now() + tickets.lease;
        let statement: TicketStatement = {
            let (table, key, lease) = (Arc::clone(self.table()), key.to_owned(), tickets.lease);
            Box::pin(async move { table.take_ticket(&key, lease).await })
        };
        let mut in_flight = TicketInFlight {
            engine: self,
            tickets,
            statement: Some(statement),
            until,
        };
        let number = answer(&mut in_flight.statement)
            .await
            .map_err(|err| self.table().explain(err))?;
        let lost = Arc::new(AtomicBool::new(false));
        tickets.queue.held().insert(number, Arc::clone(&lost));
        tickets.queue.changed.notify_one();
        Ok(Ticket {
            engine: self,
            tickets,
            number,
            lost,
            deleted: false,
        })
    }

    /// Fair mode's wait: like [`wait_for`](Engine::wait_for), but each waiter holds a
    /// ticket after its first lost attempt and attempts only when no earlier live ticket
    /// exists ([`Engine::attempt`] checks); every local waiter of the key is woken by a
    /// release, not only the first. Returns the lease and the ticket it waited on.
    pub(crate) async fn wait_fair<F>(
        &self,
        key: &str,
        wait: Duration,
        tickets: &Tickets,
        mut attempt: impl FnMut(Option<i64>) -> F,
    ) -> Result<Arc<Lease>>
    where
        F: Future<Output = Result<Option<Arc<Lease>>>>,
    {
        let started = Instant::now();
        let deadline = started + wait;
        let place = self.queues().join_fair(key);
        let mut pacing = Pacing::new(self.retry_policy(), deadline);
        let mut ticket: Option<Ticket<'_, DB>> = None;
        let mut attempts = 0u32;
        loop {
            if ticket.as_ref().is_some_and(Ticket::lost) {
                tracing::debug!(key, "a waiter's ticket lapsed; it queues again at the back");
                ticket = Some(self.take_ticket(key, tickets).await?);
            }
            attempts += 1;
            if let Some(lease) = attempt(ticket.as_ref().map(|t| t.number)).await? {
                let Some(ticket) = ticket else {
                    return Ok(lease);
                };
                lease.set_ticket(ticket.number);
                // Cancelled while the ticket goes, the won lease has no guard yet: the
                // engine releases it, as it does for an acquisition cancelled in flight.
                let unclaimed = Unclaimed {
                    engine: self,
                    lease: Some(lease),
                };
                ticket.delete().await;
                return Ok(unclaimed.claim());
            }
            if wait.is_zero() || Instant::now() >= deadline {
                break;
            }
            if ticket.is_none() {
                ticket = Some(self.take_ticket(key, tickets).await?);
            }
            let pause = match pacing.after_loss(self, key).await {
                AfterLoss::TryAgain => continue,
                AfterLoss::Sleep(pause) => pause,
                AfterLoss::GiveUp => break,
            };
            tokio::select! {
                _ = place.signalled() => {}
                _ = sleep(pause) => {}
            }
        }
        drop(place);
        drop(ticket);
        Err(self.timed_out(key, started, attempts).await)
    }
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
