//! Acquisition: one attempt, and the waiting loop around it. The attempt's statement runs
//! on the caller's task; only when the caller goes away mid-statement is the statement
//! handed to the engine to finish, so that a lock the database granted to nobody is
//! released at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::{Instant, sleep};

use crate::dialect::{Acquired, Backend, Contention, LockId};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::lease::{Lease, Won};
use crate::retry::{Backoff, Retry, by, retry};
use crate::stats::Counters;
use crate::table::LockTable;

/// What one attempt is asked to do.
pub(crate) struct Request<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    /// Renew every this often; `None`: no renewal.
    pub(crate) renew: Option<Duration>,
    /// Fair mode: the waiter's ticket (`None`: it has none, and any live ticket of the
    /// key is ahead of it).
    pub(crate) ticket: Option<i64>,
}

/// A reentrant owner's gate, shut while its owner value is in use by an attempt. An
/// attempt that fails or is abandoned takes it into its clean-up, so that the owner's
/// next attempt waits until no clean-up can delete it; otherwise the caller keeps it.
pub(crate) type Gate = Option<OwnedMutexGuard<()>>;

/// How long a timed-out wait may spend reading who held the key, for its error.
const HOLDER_READ: Duration = Duration::from_millis(500);

/// What the acquisition statement answered, with the key and owner it was sent for: the
/// statement owns copies of them (it must outlive a caller that goes away) and gives them
/// back for the lease.
struct Answer {
    outcome: Result<Option<Acquired>, sqlx::Error>,
    key: String,
    owner: String,
}

/// A statement that may have to outlive its caller: boxed, owning what it sends.
pub(crate) type Statement<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The answer of the statement kept in `slot`, which is emptied only once it answered: a
/// drop of the caller's future before that finds the statement still there, to hand it
/// over to the engine. Called once.
pub(crate) async fn answer<T>(slot: &mut Option<Statement<T>>) -> T {
    let statement = slot
        .as_mut()
        .expect("a statement in flight is awaited once");
    let answer = statement.as_mut().await;
    *slot = None;
    answer
}

/// The acquisition statement in flight. Dropped before it finished (the caller's future
/// was dropped), it hands the statement to the engine, which lets it finish and removes
/// a row it may have won.
struct InFlight<'e, DB: Backend> {
    engine: &'e Engine<DB>,
    statement: Option<Statement<Answer>>,
    /// The caller's, copied only if the statement is handed over (for the clean-up's
    /// warning when it cannot be done).
    key: &'e str,
    owner: &'e str,
    until: Instant,
    gate: &'e mut Gate,
}

impl<DB: Backend> Drop for InFlight<'_, DB> {
    fn drop(&mut self) {
        let Some(statement) = self.statement.take() else {
            return;
        };
        let table = Arc::clone(self.engine.table());
        let policy = *self.engine.retry_policy();
        let (key, owner) = (self.key.to_owned(), self.owner.to_owned());
        let (until, gate) = (self.until, self.gate.take());
        self.engine.spawn_job(async move {
            let token = match tokio::time::timeout_at(until, statement).await {
                // Lost the race: nothing of ours to remove.
                Ok(Answer {
                    outcome: Ok(None), ..
                }) => return drop(gate),
                Ok(Answer {
                    outcome: Ok(Some(won)),
                    ..
                }) => Some(won.fencing_token),
                // No answer (an error, or none by the time the lease would have ended):
                // whatever row this owner holds goes, while there is time; past the
                // deadline the clean-up says it could not be done, and the row expires.
                Ok(Answer {
                    outcome: Err(_), ..
                })
                | Err(_) => None,
            };
            remove_leftover(&table, &policy, &key, &owner, token, until).await;
            drop(gate);
        });
    }
}

/// Removes the row an acquisition nobody will use may have left: the won row by its
/// token, or (outcome unknown) whatever row `owner` holds for `key`; retried until
/// `until`, when the lease would have ended anyway.
async fn remove_leftover<DB: Backend>(
    table: &LockTable<DB>,
    policy: &crate::config::RetryPolicy,
    key: &str,
    owner: &str,
    token: Option<i64>,
    until: Instant,
) {
    let clean = retry(policy, until, |_| async move {
        let removed = match token {
            Some(fencing_token) => {
                let id = LockId {
                    key,
                    owner,
                    fencing_token,
                };
                by(until, table.release(id)).await.map(drop)
            }
            None => by(until, table.release_if_owned(key, owner)).await,
        };
        removed.map_err(Retry::Again)
    })
    .await;
    if let Err(err) = clean {
        tracing::warn!(key, owner, error = %err, "could not remove the row of an abandoned acquisition; it will expire");
    }
}

impl<DB: Backend> Engine<DB> {
    /// One acquisition attempt with validated input. `Ok(None)` when the key is held or
    /// the race was lost.
    pub(crate) async fn attempt(
        &self,
        request: Request<'_>,
        gate: &mut Gate,
    ) -> Result<Option<Arc<Lease>>> {
        // The fair-mode check and the failure clean-up below are boxed: held inline they
        // made every attempt's future 2.2 KB, too big for the allocator's fast path when
        // `try_acquire` boxes it, and copied on each move.
        if self.tickets().is_some() {
            let ahead = Box::pin(self.table().earlier_ticket(request.key, request.ticket));
            if ahead.await.map_err(|err| self.table().explain(err))? {
                return Ok(None);
            }
        }
        Counters::bump(&self.counters().attempts);
        let sent_at = Instant::now();
        let until = sent_at + request.lease;
        let statement: Statement<Answer> = {
            let table = Arc::clone(self.table());
            let (key, owner, lease) = (
                request.key.to_owned(),
                request.owner.to_owned(),
                request.lease,
            );
            Box::pin(async move {
                let outcome = table.acquire(&key, &owner, lease).await;
                Answer {
                    outcome,
                    key,
                    owner,
                }
            })
        };
        let mut in_flight = InFlight {
            engine: self,
            statement: Some(statement),
            key: request.key,
            owner: request.owner,
            until,
            gate,
        };
        let Answer {
            outcome,
            key,
            owner,
        } = answer(&mut in_flight.statement).await;
        match outcome {
            Ok(Some(won)) => {
                Counters::bump(&self.counters().acquired);
                tracing::debug!(key = request.key, owner = request.owner, fencing_token = won.fencing_token, expires_at = %won.expires_at, "lock acquired");
                Ok(Some(self.start_lease(Won {
                    key,
                    owner,
                    fencing_token: won.fencing_token,
                    expires_at: won.expires_at,
                    length: request.lease,
                    interval: request.renew,
                    sent_at,
                })))
            }
            Ok(None) => Ok(None),
            Err(err) if LockTable::<DB>::contention(&err) != Contention::Failure => {
                tracing::trace!(key = request.key, error = %err, "lost an acquisition race");
                Ok(None)
            }
            Err(err) if in_flight.gate.is_some() => {
                // A reentrant owner may try again with the same value as soon as it has
                // the answer: clean up once, before answering, so that no clean-up can
                // delete its next acquisition (the row expires if this try fails too).
                let clean = by(
                    until,
                    Box::pin(self.table().release_if_owned(request.key, request.owner)),
                );
                if clean.await.is_err() {
                    tracing::warn!(
                        key = request.key,
                        owner = request.owner,
                        "could not check for a row left by a failed acquisition; it will expire"
                    );
                }
                Err(self.table().explain(err))
            }
            Err(err) => {
                // The reply was lost, not necessarily the statement, and the connection
                // that lost it is likely down for a while. Answer now; the engine keeps
                // trying to remove a row this owner may have committed until its lease
                // would have ended anyway: nobody else will ever use this owner value.
                let table = Arc::clone(self.table());
                let policy = *self.retry_policy();
                self.spawn_job(async move {
                    remove_leftover(&table, &policy, &key, &owner, None, until).await;
                });
                Err(self.table().explain(err))
            }
        }
    }

    /// Calls `attempt` until it wins or `wait` has passed (holding no connection while
    /// it waits); a database error ends the wait at once: an outage is not contention.
    ///
    /// Waiters of this Locker for one key queue in arrival order ([`LocalQueues`]): only
    /// the head attempts, so one process sends at most one attempt at a time per key. A
    /// head that lost asks to be woken by the release ([`LockTable::note_waiter`]: a
    /// listener hears releases elsewhere on PostgreSQL, and releases through this Locker
    /// wake it on every backend), then sleeps until the holder's lease ends or its backoff
    /// runs out, whichever is sooner: the fallback when no wake-up comes. A waiter that
    /// becomes the head because the one ahead won waits for that release, without an
    /// attempt that must fail.
    ///
    /// [`LocalQueues`]: crate::queue::LocalQueues
    pub(crate) async fn wait_for<F>(
        &self,
        key: &str,
        wait: Duration,
        mut attempt: impl FnMut(Option<i64>) -> F,
    ) -> Result<Arc<Lease>>
    where
        F: Future<Output = Result<Option<Arc<Lease>>>>,
    {
        if let Some(tickets) = self.tickets() {
            return self.wait_fair(key, wait, tickets, attempt).await;
        }
        let started = Instant::now();
        let deadline = started + wait;
        let place = self.queues().join(key);
        let mut pacing = Pacing::new(self.retry_policy(), deadline);
        let mut attempts = 0u32;
        // Whether the head's next turn starts with an attempt: not while the key is held
        // by the waiter that was ahead (its release says when).
        let mut try_now = true;
        loop {
            let head = place.is_head();
            // A zero wait is one attempt, queue or not: `try` semantics.
            let pause = if (head && try_now) || (wait.is_zero() && attempts == 0) {
                attempts += 1;
                if let Some(lease) = attempt(None).await? {
                    place.won();
                    return Ok(lease);
                }
                if wait.is_zero() {
                    break;
                }
                match pacing.after_loss(self, key).await {
                    AfterLoss::TryAgain => continue,
                    AfterLoss::Sleep(pause) => pause,
                    AfterLoss::GiveUp => break,
                }
            } else if head {
                // Held by the waiter that was ahead: its release (or the engine, if that
                // lease is lost) wakes this one; the sleep only guards a signal never sent.
                if Instant::now() >= deadline {
                    break;
                }
                pacing.backoff.longest()
            } else if Instant::now() < deadline {
                deadline - Instant::now()
            } else {
                break;
            };
            try_now = tokio::select! {
                held_ahead = place.signalled() => !held_ahead,
                _ = sleep(pause) => true,
            };
            if Instant::now() >= deadline && !place.is_head() {
                break;
            }
        }
        drop(place);
        Err(self.timed_out(key, started, attempts).await)
    }

    /// The [`Error::Timeout`] of a wait for `key` that started at `started`.
    pub(crate) async fn timed_out(&self, key: &str, started: Instant, attempts: u32) -> Error {
        let waited = started.elapsed();
        // Who kept the key: worth one more read (briefly), the wait is over anyway.
        let read = by(Instant::now() + HOLDER_READ, self.table().inspect(key));
        let holder = read.await.ok().flatten();
        Error::Timeout {
            key: key.to_owned(),
            waited,
            attempts,
            held_by: holder.as_ref().map(|h| h.owner.clone()),
            held_until: holder.map(|h| h.expires_at),
        }
    }

    /// After a lost attempt: asks the holder's release to wake this waiter and reads how
    /// long the holder's lease has left, then says how long to sleep: the backoff's next
    /// pause, or until the lease ends (plus a little jitter, so that waiters of several
    /// processes do not all arrive at that instant) if that is sooner. A key found free
    /// is tried again at once if `retry_free` (not twice in a row).
    async fn after_loss(
        &self,
        key: &str,
        backoff: &mut Backoff,
        deadline: Instant,
        retry_free: bool,
    ) -> AfterLoss {
        let Some(pause) = backoff.next_pause() else {
            return AfterLoss::GiveUp;
        };
        // Only useful if a release can wake us; the listener is started by the first
        // waiter that has to sleep, and wakes every head once it is up.
        self.start_listener();
        let noted = by(deadline, self.table().note_waiter(key)).await;
        // With the listener up, the release wakes this waiter: the sleep is only the
        // fallback for a notification lost on the way, so take the policy's longest.
        let pause = match noted {
            Ok(Some(_)) if self.listening() => backoff.longest().max(pause),
            _ => pause,
        };
        match noted {
            Ok(None) if retry_free => AfterLoss::TryAgain,
            Ok(Some(left)) if left < pause => {
                let jitter = EXPIRY_JITTER.mul_f64(fastrand::f64());
                AfterLoss::Sleep(left + jitter)
            }
            // Held with a longer lease, free again soon after a short pause, or unknown
            // (an error here is not the caller's: the next attempt reports an outage).
            _ => AfterLoss::Sleep(pause),
        }
    }
}

/// How a waiter spaces its attempts: its backoff, and whether its last lost attempt
/// found the key free (such a key is tried again at once, but not twice in a row).
pub(crate) struct Pacing {
    backoff: Backoff,
    deadline: Instant,
    retried_free: bool,
}

impl Pacing {
    pub(crate) fn new(policy: &crate::config::RetryPolicy, deadline: Instant) -> Self {
        Pacing {
            backoff: Backoff::new(policy, deadline),
            deadline,
            retried_free: false,
        }
    }

    /// What to do after a lost attempt ([`Engine::after_loss`]).
    pub(crate) async fn after_loss<DB: Backend>(
        &mut self,
        engine: &Engine<DB>,
        key: &str,
    ) -> AfterLoss {
        let retry_free = !self.retried_free;
        let next = engine
            .after_loss(key, &mut self.backoff, self.deadline, retry_free)
            .await;
        self.retried_free = matches!(next, AfterLoss::TryAgain);
        next
    }
}

/// What a head waiter does after a lost attempt.
pub(crate) enum AfterLoss {
    TryAgain,
    Sleep(Duration),
    GiveUp,
}

/// Most jitter added to a sleep until the holder's lease ends.
const EXPIRY_JITTER: Duration = Duration::from_millis(5);
