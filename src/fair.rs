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
//! lease), so a waiter that dies stops blocking the queue when its ticket expires, and a
//! waiter that is cancelled or times out deletes its ticket at once (in the background).
//! Expired tickets are purged now and then by the same job.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::acquire::{AfterLoss, Pacing};
use crate::dialect::Backend;
use crate::engine::Engine;
use crate::error::Result;
use crate::lease::Lease;
use crate::retry::by;
use crate::table::LockTable;

/// Every this many renewal passes, expired tickets (of waiters that died) are deleted.
const PURGE_EVERY: u32 = 60;

/// The tickets of one Locker's waiters, and how long they last.
pub(crate) struct Tickets {
    /// Live tickets by number; the flag says the ticket was found expired or gone.
    held: Mutex<HashMap<i64, Arc<AtomicBool>>>,
    /// Wakes the renewal job when the first ticket arrives.
    arrived: Notify,
    started: AtomicBool,
    /// The lease of a ticket, and how often it is renewed.
    pub(crate) lease: Duration,
    interval: Duration,
}

impl Tickets {
    /// Tickets with leases of `lease`, renewed every `min(interval, lease / 3)`.
    pub(crate) fn new(lease: Duration, interval: Duration) -> Self {
        Tickets {
            held: Mutex::new(HashMap::new()),
            arrived: Notify::new(),
            started: AtomicBool::new(false),
            lease,
            interval: interval.min(lease / 3),
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<i64, Arc<AtomicBool>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims the start of the renewal job: `true` exactly once.
    pub(crate) fn claim_start(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }

    /// The renewal job: renews every held ticket each interval, until `stop`.
    pub(crate) async fn renew<DB: Backend>(&self, table: &LockTable<DB>, stop: &CancellationToken) {
        let mut passes = 0u32;
        loop {
            let idle = self.held().is_empty();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.arrived.notified(), if idle => continue,
                _ = sleep(self.interval), if !idle => {}
            }
            let numbers: Vec<i64> = self.held().keys().copied().collect();
            if numbers.is_empty() {
                continue;
            }
            let deadline = Instant::now() + self.interval;
            match by(deadline, table.renew_tickets(&numbers, self.lease)).await {
                Ok(renewed) => {
                    let held = self.held();
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
            passes += 1;
            if passes.is_multiple_of(PURGE_EVERY)
                && let Err(err) = by(deadline, table.purge_tickets()).await
            {
                tracing::debug!(error = %err, "could not purge expired tickets");
            }
        }
    }
}

/// A waiter's ticket, renewed while it lives; dropping it deletes the row (in the
/// background, for a waiter that was cancelled or timed out).
struct Ticket<'e, DB: Backend> {
    engine: &'e Engine<DB>,
    tickets: &'e Tickets,
    number: i64,
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
    /// ticket once the lease is released. On failure the drop tries in the background.
    async fn delete(mut self) {
        self.tickets.held().remove(&self.number);
        let until = Instant::now() + self.tickets.lease;
        if by(until, self.engine.table().drop_ticket(self.number))
            .await
            .is_ok()
        {
            self.deleted = true;
        }
    }
}

impl<DB: Backend> Drop for Ticket<'_, DB> {
    fn drop(&mut self) {
        let tickets = self.tickets;
        tickets.held().remove(&self.number);
        if self.deleted {
            return;
        }
        let table = Arc::clone(self.engine.table());
        let (number, until) = (self.number, Instant::now() + tickets.lease);
        self.engine.spawn_job(async move {
            if by(until, table.drop_ticket(number)).await.is_err() {
                tracing::debug!(ticket = number, "could not delete a ticket; it will expire");
            }
        });
    }
}

impl<DB: Backend> Engine<DB> {
    /// Takes a ticket for `key` and starts renewing it.
    async fn take_ticket<'e>(&'e self, key: &str, tickets: &'e Tickets) -> Result<Ticket<'e, DB>> {
        let number = self
            .table()
            .take_ticket(key, tickets.lease)
            .await
            .map_err(|err| self.table().explain(err))?;
        let lost = Arc::new(AtomicBool::new(false));
        tickets.held().insert(number, Arc::clone(&lost));
        self.renew_tickets_in_background();
        tickets.arrived.notify_one();
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
