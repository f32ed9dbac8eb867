//! Acquisition: one attempt, and the one loop that waits for a key.
//!
//! The attempt's statement runs on the caller's task; only when the caller goes away
//! mid-statement is the statement handed to a background job to finish, so that a lock
//! the database granted to nobody is released at once.
//!
//! The waiting loop ([`wait_for`]) is written once. What differs between waiting modes is
//! the [`Line`] the waiter joins (the local FIFO queue, or fair mode's tickets): the loop
//! asks its place whether it may attempt, what the attempt carries, and what to do after a
//! loss and on a win. Between attempts it paces itself the same way in every mode: it
//! asks the holder's release to wake it (and reads how long the holder's lease has left),
//! then sleeps until the lease ends, its backoff runs out, or it is told to look again,
//! whichever is first.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, oneshot};
use tokio::time::{Instant, sleep, sleep_until};

use crate::config::{RetryPolicy, WAIT_SLACK};
use crate::core::Core;
use crate::dialect::{Backend, LockId, Watchers};
use crate::error::{Error, LostReason, Result};
use crate::inflight::{Statement, answer};
use crate::lease::{Lease, Won};
use crate::line::{Line, Offer, Terms};
use crate::queue::{Fifo, GROUP_MARK};
use crate::recorder::{EventKind, Record};
use crate::retry::{Backoff, Retry, by_deadline, retry};
use crate::stats::Counters;
use crate::table::{LockTable, WonRow};

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
    /// A read-write lock's reader: the grant key whose writes the acquisition is ordered
    /// with ([`LockTable::acquire_read`]).
    pub(crate) beside: Option<&'a str>,
}

/// A reentrant owner's gate, shut while its owner value is in use by an attempt. An
/// attempt that fails or is abandoned takes it into its clean-up, so that the owner's
/// next attempt waits until no clean-up can delete it; otherwise the caller keeps it.
pub(crate) type Gate = Option<OwnedMutexGuard<()>>;

/// How long a timed-out wait may spend reading who held the key, for its error.
const HOLDER_READ: Duration = Duration::from_millis(500);

/// Most jitter added to a sleep until the holder's lease ends.
const EXPIRY_JITTER: Duration = Duration::from_millis(5);

/// What the acquisition statement answered, with the key and owner it was sent for: the
/// statement owns copies of them (it must outlive a caller that goes away) and gives them
/// back for the lease.
struct Answer {
    outcome: Result<Option<WonRow>>,
    key: String,
    owner: String,
}

/// The acquisition statement in flight. Dropped before it finished (the caller's future
/// was dropped), it hands the statement to a background job, which lets it finish and
/// removes a row it may have won.
struct InFlight<'c, DB: Backend> {
    core: &'c Core<DB>,
    statement: Option<Statement<Answer>>,
    /// The caller's, copied only if the statement is handed over (for the clean-up's
    /// warning when it cannot be done).
    key: &'c str,
    owner: &'c str,
    until: Instant,
    gate: &'c mut Gate,
}

impl<DB: Backend> Drop for InFlight<'_, DB> {
    fn drop(&mut self) {
        let Some(statement) = self.statement.take() else {
            return;
        };
        let (table, policy) = (Arc::clone(&self.core.table), self.core.retry);
        let (key, owner) = (self.key.to_owned(), self.owner.to_owned());
        let (until, gate) = (self.until, self.gate.take());
        let grace = table.statement_timeout();
        self.core.jobs.spawn(async move {
            // The statement gives up at `until` on the client, and on the server it waits
            // for no lock past it (its `wait`); what is left is its commit and the answer.
            // So the clean-up waits for that answer and keeps trying to remove the row a
            // statement timeout past `until`, not only to `until`: a statement queued
            // behind a row lock that answered late was a row nobody would remove.
            let until = until + grace;
            let token = match tokio::time::timeout_at(until, statement).await {
                // Lost the race: nothing of ours to remove.
                Ok(Answer {
                    outcome: Ok(None), ..
                }) => return drop(gate),
                Ok(Answer {
                    outcome: Ok(Some((won, _))),
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
pub(crate) async fn remove_leftover<DB: Backend>(
    table: &LockTable<DB>,
    policy: &RetryPolicy,
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
                by_deadline(until, table.release(id, until)).await.map(drop)
            }
            None => by_deadline(until, table.release_if_owned(key, owner)).await,
        };
        removed.map_err(Retry::Again)
    })
    .await;
    if let Err(err) = clean {
        tracing::warn!(key, owner, error = %err, "could not remove the row of an abandoned acquisition; it will expire");
    }
}

/// One acquisition attempt with validated input. `Ok(None)` when the key is held or the
/// race was lost.
pub(crate) async fn attempt<DB: Backend>(
    core: &Core<DB>,
    request: Request<'_>,
    gate: &mut Gate,
) -> Result<Option<Arc<Lease>>> {
    // Before anything is sent: a lease that would end locally before its first renewal.
    core.margin.check(request.lease, request.renew)?;
    // The fair-mode check and the failure clean-up below are boxed: held inline they made
    // every attempt's future bigger, which the allocator and every move pay for.
    if core.tickets.is_some() {
        let ahead = Box::pin(core.table.earlier_ticket(request.key, request.ticket));
        if ahead.await? {
            return Ok(None);
        }
    }
    Counters::bump(&core.counters.attempts);
    let sent_at = Instant::now();
    let until = sent_at + request.lease;
    let statement: Statement<Answer> = {
        let table = Arc::clone(&core.table);
        let (key, owner, lease) = (
            request.key.to_owned(),
            request.owner.to_owned(),
            request.lease,
        );
        let beside = request.beside.map(str::to_owned);
        Box::pin(async move {
            let outcome = match &beside {
                Some(grant) => table.acquire_read(&key, grant, &owner, lease, until).await,
                None => table.acquire(&key, &owner, lease, until).await,
            };
            Answer {
                outcome,
                key,
                owner,
            }
        })
    };
    let mut in_flight = InFlight {
        core,
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
        Ok(Some((won, watchers))) => {
            let taken_over = won.taken_over;
            let won = Won {
                key,
                owner,
                fencing_token: won.fencing_token,
                expires_at: won.expires_at,
                length: request.lease,
                interval: request.renew,
                sent_at,
                margin: core.margin,
            };
            if Instant::now() >= won.deadline() {
                return Err(late(core, vec![won], until));
            }
            Counters::bump(&core.counters.acquired);
            (core.history).record(
                EventKind::acquisition(taken_over),
                &won.key,
                &won.owner,
                Some(won.fencing_token),
            );
            tracing::debug!(key = request.key, owner = request.owner, fencing_token = won.fencing_token, expires_at = %won.expires_at, "lock acquired");
            let lease = core.engine.start_lease(won);
            ring_for_others(core, &lease, watchers);
            Ok(Some(lease))
        }
        Ok(None) => Ok(None),
        Err(err) if in_flight.gate.is_some() => {
            // A reentrant owner may try again with the same value as soon as it has the
            // answer: clean up once, before answering, so that no clean-up can delete its
            // next acquisition (the row expires if this try fails too).
            let clean = Box::pin(core.table.release_if_owned(request.key, request.owner));
            if by_deadline(until, clean).await.is_err() {
                tracing::warn!(
                    key = request.key,
                    owner = request.owner,
                    "could not check for a row left by a failed acquisition; it will expire"
                );
            }
            Err(err)
        }
        Err(err) => {
            // The reply was lost, not necessarily the statement, and the connection that
            // lost it is likely down for a while. Answer now; a background job keeps
            // trying to remove a row this owner may have committed until its lease would
            // have ended anyway: nobody else will ever use this owner value.
            let (table, policy) = (Arc::clone(&core.table), core.retry);
            // As after an abandoned attempt (see `InFlight`).
            let until = until + table.statement_timeout();
            core.jobs.spawn(async move {
                remove_leftover(&table, &policy, &key, &owner, None, until).await;
            });
            Err(err)
        }
    }
}

/// After a win: when a waiter of another process was registered for the row's queue
/// (MySQL/MariaDB), the row's bell is taken, so that the release wakes it
/// ([`Engine::ring_at_end`](crate::engine::Engine::ring_at_end)).
pub(crate) fn ring_for_others<DB: Backend>(core: &Core<DB>, lease: &Arc<Lease>, seen: Watchers) {
    if seen.besides(core.queues.own_registration()) {
        core.engine.ring_at_end(lease);
    }
}

/// The error of an acquisition answered at or after its lease's local deadline (sent
/// before `until`, the lease's end at the earliest by the database clock): its holder
/// could not act on it, so it becomes no guard. Its rows (all of one owner) go in the
/// background, each by its token, while there is time; else they expire.
pub(crate) fn late<DB: Backend>(core: &Core<DB>, won: Vec<Won>, until: Instant) -> Error {
    Counters::bump(&core.counters.late_answers);
    let key = won.first().map(|won| won.key.clone()).unwrap_or_default();
    tracing::warn!(
        key,
        owner = won.first().map(|won| won.owner.as_str()),
        "acquisition answered after its lease's local deadline: no guard, the row is released"
    );
    let (table, policy) = (Arc::clone(&core.table), core.retry);
    // A statement timeout past `until`, as after an abandoned attempt (see `InFlight`):
    // the answer came late, and so may the release's.
    let until = until + table.statement_timeout();
    core.jobs.spawn(async move {
        for won in &won {
            let token = Some(won.fencing_token);
            remove_leftover(&table, &policy, &won.key, &won.owner, token, until).await;
        }
    });
    Error::LockLost {
        key,
        reason: LostReason::Expired,
    }
}

/// A lease a waiter won, as its caller's guard: unless its deadline has passed already
/// (a handed lease whose waiter ran late), when it is released in the background and the
/// wait ends with its loss, as a late answer's does.
fn fresh<DB: Backend>(core: &Core<DB>, lease: Arc<Lease>) -> Result<Arc<Lease>> {
    match lease.lost_reason() {
        None => Ok(lease),
        Some(reason) => {
            let key = lease.key.clone();
            core.engine.release_in_background(lease);
            Err(Error::LockLost { key, reason })
        }
    }
}

/// Calls `attempt` until it wins or `wait` has passed (holding no connection while it
/// waits), in the Locker's line for `key`: the local FIFO queue, or fair mode's tickets.
/// A database error ends the wait at once: an outage is not contention.
///
/// With an `offer` (a plain mutex waiter's lease terms), the head of the local
/// queue asks a release of `key` through this Locker to hand it the row in the release's
/// own statement (where the backend can: `LockSql::hand_off`) while it sleeps.
pub(crate) async fn wait_for<DB: Backend, F>(
    core: &Core<DB>,
    key: &str,
    wait: Duration,
    offer: Option<Terms>,
    attempt: impl FnMut(Option<i64>) -> F,
) -> Result<Arc<Lease>>
where
    F: Future<Output = Result<Option<Arc<Lease>>>>,
{
    match core.fair_line() {
        // Boxed: the rarer mode's state would otherwise grow every waiter's future.
        Some(fair) => {
            fair.check_order().await?;
            Box::pin(wait_in(core, &fair, key, key, wait, None, attempt)).await
        }
        None => {
            let offer = offer.filter(|_| core.table.hands_off());
            wait_in(core, &Fifo(&core.queues), key, key, wait, offer, attempt).await
        }
    }
}

/// [`wait_for`] in this Locker's FIFO queue `queue`, whatever its mode: the waiting of a
/// semaphore, a read-write lock or several keys, whose queue is not one row's (fair
/// mode's tickets order the waiters of one row), and whose `attempt` tries several rows.
/// After a lost attempt the waiter marks the row `note` (the row whose release it waits
/// for: a reader, the writer's) so that its release wakes it on PostgreSQL and SQLite,
/// and sleeps until that row's lease ends at the latest.
///
/// While nobody of this Locker waits in `queue`, the first attempt is made before joining
/// it: the rows these attempts take are many (permits, readers), so callers that find
/// one free need not take turns, and nobody is passed who was waiting. Not while a release
/// through this Locker holds the queue back for a waiter elsewhere (see
/// [`LocalQueues::hold_back`](crate::queue::LocalQueues::hold_back)): that one would be
/// passed.
pub(crate) async fn wait_in_queue<DB: Backend, F>(
    core: &Core<DB>,
    queue: &str,
    note: &str,
    wait: Duration,
    mut attempt: impl FnMut(Option<i64>) -> F,
) -> Result<Arc<Lease>>
where
    F: Future<Output = Result<Option<Arc<Lease>>>>,
{
    if !wait.is_zero()
        && core.queues.waiting(queue) == 0
        && core.queues.held_back(queue).is_none()
        && let Some(won) = attempt(None).await?
    {
        return Ok(won);
    }
    wait_in(core, &Fifo(&core.queues), queue, note, wait, None, attempt).await
}

/// The waiting loop. A waiter whose turn it is attempts; after a lost attempt it asks the
/// holder's release to wake it (`NotifySql::note_waiter_in`: a listener hears releases
/// elsewhere on PostgreSQL and SQLite, and releases through this Locker wake it on every
/// backend), then sleeps until the holder's lease ends or its backoff runs out, whichever
/// is sooner: the fallback when no wake-up comes. A waiter whose turn came because the one
/// ahead won waits for that release, without an attempt that must fail. A zero wait is
/// one attempt.
/// While it sleeps, a waiter with an `offer` that may attempt stands it (see
/// [`wait_for`]); it withdraws it when it wakes, and wins with the lease a release sent if
/// that release took it first.
async fn wait_in<DB: Backend, F>(
    core: &Core<DB>,
    line: &dyn Line,
    key: &str,
    note: &str,
    wait: Duration,
    offer: Option<Terms>,
    mut attempt: impl FnMut(Option<i64>) -> F,
) -> Result<Arc<Lease>>
where
    F: Future<Output = Result<Option<Arc<Lease>>>>,
{
    let started = Instant::now();
    let deadline = started + wait;
    let mut place = line.join(key);
    let mut pacing = Pacing::new(&core.retry, deadline);
    let mut attempts = 0u32;
    // Whether the next turn starts with an attempt: not while the key is held by the
    // waiter that was ahead (its release says when).
    let mut try_now = true;
    // The offer this waiter stands while it sleeps, once it had to.
    let mut standing: Option<Arc<Offer>> = None;
    loop {
        let turn = place.may_attempt();
        let pause = if (turn && try_now) || (wait.is_zero() && attempts == 0) {
            // A release through this Locker left the key to a waiter of another Locker
            // (SQLite, `LocalQueues::hold_back`): this waiter tries once this Locker's
            // listener has looked at the table since, as the other one's does, so that
            // the two start even (or after a moment at most).
            if !wait.is_zero()
                && let Some(until) = core.queues.held_back(key)
            {
                tokio::select! {
                    _ = place.signalled() => {}
                    _ = sleep_until(until.min(deadline)) => {}
                }
            }
            attempts += 1;
            let ticket = place.ticket().await?;
            // Each attempt within the wait plus a little: one sent just before the wait
            // ran out may still win, but a database that does not answer cannot keep the
            // caller past `deadline + WAIT_SLACK` (its lease would allow far longer). An
            // attempt cut here goes on in the background and removes what it won.
            let bounded = tokio::time::timeout_at(deadline + WAIT_SLACK, attempt(ticket));
            let Ok(won) = Box::pin(bounded).await else {
                break;
            };
            if let Some(lease) = won? {
                return fresh(core, place.won(lease).await);
            }
            if wait.is_zero() || Instant::now() >= deadline {
                break;
            }
            place.lost().await?;
            match pacing.after_loss(core, key, note).await {
                AfterLoss::TryAgain => continue,
                AfterLoss::Sleep(pause) => pause,
                AfterLoss::GiveUp => break,
            }
        } else if turn {
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
        let mut handed = offer.and_then(|terms| {
            let standing = standing.get_or_insert_with(|| {
                Arc::new(Offer {
                    owner: core.new_owner(),
                    terms,
                    yielded: AtomicBool::new(false),
                })
            });
            let receiver = place.offer(standing)?;
            Some(HandedTo { receiver, core })
        });
        try_now = tokio::select! {
            held_ahead = place.signalled() => !held_ahead,
            _ = sleep(pause) => true,
            lease = async { (&mut handed.as_mut().expect("offered").receiver).await }, if handed.is_some() => {
                handed = None;
                match lease {
                    Ok(lease) => return fresh(core, place.won(lease).await),
                    // The release took the offer but did not hand the row over (a waiter
                    // elsewhere, an expired lease, a failed statement): it woke this
                    // waiter too, to attempt at once, unless it deleted the row for a
                    // waiter of another process: then the release's notification (which
                    // wakes that waiter) wakes this one too, through the listener. The
                    // next offer gets an owner value of its own.
                    Err(_) => {
                        let yielded = standing.take().is_some_and(|offer| offer.yielded.load(Ordering::Acquire));
                        !yielded
                    }
                }
            }
        };
        // Woken otherwise: a release that took the offer meanwhile answers on the channel
        // (at once: the statement is already in flight).
        if let Some(mut handed) = handed
            && !place.withdraw()
        {
            match (&mut handed.receiver).await {
                Ok(lease) => return fresh(core, place.won(lease).await),
                Err(_) => standing = None,
            }
        }
        if Instant::now() >= deadline && !place.may_attempt() {
            break;
        }
    }
    drop(place);
    Err(timed_out(core, key, note, started, attempts).await)
}

/// The receiving end of a standing offer. Dropped with a lease in it (the waiter went away
/// after a release handed it the row, before it looked), it releases that lease in the
/// background: the release could not know, and nobody else holds the row.
struct HandedTo<'c, DB: Backend> {
    receiver: oneshot::Receiver<Arc<Lease>>,
    core: &'c Core<DB>,
}

impl<DB: Backend> Drop for HandedTo<'_, DB> {
    fn drop(&mut self) {
        if let Ok(lease) = self.receiver.try_recv() {
            self.core.engine.release_in_background(lease);
        }
    }
}

/// The [`Error::Timeout`] of a wait for `key` that started at `started`.
async fn timed_out<DB: Backend>(
    core: &Core<DB>,
    key: &str,
    held: &str,
    started: Instant,
    attempts: u32,
) -> Error {
    let waited = started.elapsed();
    // Who kept the row waited for: worth one more read (briefly), the wait is over anyway.
    let read = by_deadline(Instant::now() + HOLDER_READ, core.table.inspect(held));
    let holder = read.await.ok().flatten();
    // A primitive's waiters line up under its group (`<name>~`), which names no row: the
    // row waited for is the key that stayed held.
    let key = if key.ends_with(GROUP_MARK) { held } else { key };
    Error::Timeout {
        key: key.to_owned(),
        waited,
        attempts,
        held_here: holder
            .as_ref()
            .is_some_and(|h| h.owner.starts_with(&core.owner_prefix)),
        held_by: holder.as_ref().map(|h| h.owner.clone()),
        held_until: holder.map(|h| h.expires_at),
    }
}

/// How a waiter spaces its attempts: its backoff, and whether its last lost attempt
/// found the key free (such a key is tried again at once, but not twice in a row).
struct Pacing {
    backoff: Backoff,
    deadline: Instant,
    retried_free: bool,
}

/// What a waiter does after a lost attempt.
enum AfterLoss {
    TryAgain,
    Sleep(Duration),
    GiveUp,
}

impl Pacing {
    fn new(policy: &RetryPolicy, deadline: Instant) -> Self {
        Pacing {
            backoff: Backoff::new(policy, deadline),
            deadline,
            retried_free: false,
        }
    }

    /// After a lost attempt of a waiter in `queue`: asks the release of the row `key` to
    /// wake this waiter and reads how long the holder's lease has left, then says how
    /// long to sleep: the backoff's next pause, or until the lease ends (plus a little
    /// jitter, so that waiters of several processes do not all arrive at that instant) if
    /// that is sooner. A key found free is tried again at once (not twice in a row).
    /// `queue` is the waiter's local queue (the same key, or a primitive's group).
    async fn after_loss<DB: Backend>(
        &mut self,
        core: &Core<DB>,
        queue: &str,
        key: &str,
    ) -> AfterLoss {
        let Some(pause) = self.backoff.next_pause() else {
            return AfterLoss::GiveUp;
        };
        // Only useful if a release can wake us; the listener is started by the first
        // waiter that has to sleep, and wakes every head once it is up.
        core.start_listener();
        let noted = by_deadline(self.deadline, core.table.note_waiter_in(key, queue)).await;
        // With the listener up (and, for bells, hearing this queue's rows), the release
        // wakes this waiter: the sleep is only the fallback for a wake-up lost on the way,
        // so take the policy's longest.
        let pause = match noted {
            Ok(Some(_)) if core.hears(queue) => self.backoff.longest().max(pause),
            _ => pause,
        };
        let retry_free = !self.retried_free;
        let next = match noted {
            Ok(None) if retry_free => AfterLoss::TryAgain,
            Ok(Some(left)) if left < pause => {
                let jitter = EXPIRY_JITTER.mul_f64(fastrand::f64());
                AfterLoss::Sleep(left + jitter)
            }
            // Held with a longer lease, free again soon after a short pause, or unknown
            // (an error here is not the caller's: the next attempt reports an outage).
            _ => AfterLoss::Sleep(pause),
        };
        self.retried_free = matches!(next, AfterLoss::TryAgain);
        next
    }
}
