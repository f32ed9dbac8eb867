//! Ending leases: an explicit release on the caller's task, and the batched release of
//! leases given up without one (dropped guards, failed releases).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Engine, EngineState, RetryDelays, plan_wake};
use crate::dialect::{Backend, HandOff, LockId};
use crate::error::{LostReason, Result};
use crate::inflight::{Statement, answer};
use crate::jobs::Jobs;
use crate::lease::{Lease, Won};
use crate::line::{Handed, Offer};
use crate::recorder::{EventKind, Record};
use crate::retry::{Retry, by_deadline, retry};
use crate::stats::Counters;

/// A handoff's job in flight (see [`Engine::release`]): dropped before it finished, it
/// hands the job to the Locker's background work to finish.
struct HandingOff<'a> {
    jobs: &'a Jobs,
    job: Option<Statement<Result<HandOff>>>,
}

impl Drop for HandingOff<'_> {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            self.jobs.spawn(async move {
                job.await.ok();
            });
        }
    }
}

impl<DB: Backend> Engine<DB> {
    /// Stops renewing `lease`, waits for a batch in flight that includes it, then deletes
    /// the row if it is still ours (retrying while another session is in the way, until
    /// the lease's deadline). `Some(expired)` when our row was deleted, saying whether its
    /// lease had run out by the database clock; `None` when it was not ours any more.
    ///
    /// When the head of this Locker's queue for the key stands an offer, the row is handed
    /// to it instead where the backend can ([`LockTable::hand_off`]): one statement gives
    /// the row to the waiter's owner value, and the waiter wakes holding the lease,
    /// without an attempt of its own. Not for a lease with a minimum hold.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<Option<bool>> {
        if lease.min_hold().is_none()
            && self.inner.table.hands_off()
            && let Some(offer) = self.inner.queues.take_offer(&lease.key)
        {
            // Boxed: held inline it would grow every release's future.
            return Box::pin(self.hand_off(lease, offer)).await;
        }
        self.inner.release(lease).await
    }

    /// [`release`](Self::release) handing the row to the waiter that stood `offer`. The
    /// statement and what follows it (starting the waiter's lease, sending it) run as one
    /// boxed job: if this future is dropped while it is in flight, the job is finished in
    /// the background, so the waiter is never left with a row nobody knows it holds.
    async fn hand_off(
        &self,
        lease: &Lease,
        (offer, handed): (Arc<Offer>, Handed),
    ) -> Result<Option<bool>> {
        self.inner.stop_renewing_for_release(lease).await;
        let yielded_offer = Arc::clone(&offer);
        let job: Statement<Result<HandOff>> = {
            let engine = Engine {
                inner: Arc::clone(&self.inner),
            };
            let (key, owner) = (lease.key.clone(), lease.owner.clone());
            let (fencing_token, until) = (lease.fencing_token, lease.deadline());
            Box::pin(async move {
                let from = LockId {
                    key: &key,
                    owner: &owner,
                    fencing_token,
                };
                let sent_at = Instant::now();
                Counters::bump(&engine.inner.counters.releases);
                let terms = offer.terms;
                let table = &engine.inner.table;
                let outcome = table.hand_off(from, &offer.owner, terms.lease, until).await;
                match &outcome {
                    Ok(HandOff::To(won)) => {
                        Counters::bump(&engine.inner.counters.acquired);
                        Counters::bump(&engine.inner.counters.handoffs);
                        let won = Won {
                            key: key.clone(),
                            owner: offer.owner.clone(),
                            fencing_token: won.fencing_token,
                            expires_at: won.expires_at,
                            length: terms.lease,
                            interval: terms.renew,
                            sent_at,
                            margin: engine.inner.margin,
                        };
                        if Instant::now() >= won.deadline() {
                            // Answered after the handed lease's own deadline: the waiter
                            // could not act on it. It is told nothing was handed (it
                            // attempts on its own, with a new owner value) and the row goes.
                            drop(handed);
                            Counters::bump(&engine.inner.counters.late_answers);
                            let inner = Arc::clone(&engine.inner);
                            let until = sent_at + terms.lease;
                            engine.inner.jobs.spawn(async move {
                                inner.remove_handed_row(&won.key, &won.owner, until).await;
                            });
                            return outcome;
                        }
                        // Both ends of the handoff, dated at its answer, before the
                        // waiter holds the row (and may release it).
                        let (history, at) = (&engine.inner.history, engine.inner.history.now());
                        history.record_at(
                            at,
                            EventKind::Released,
                            &key,
                            &owner,
                            Some(fencing_token),
                        );
                        let (to, token) = (&offer.owner, Some(won.fencing_token));
                        history.record_detail_at(at, EventKind::HandedOff, &key, to, token, &owner);
                        let lease = engine.start_lease(won);
                        tracing::debug!(key, owner = %offer.owner, fencing_token = lease.fencing_token, "lock handed to the next waiter");
                        // The waiter went away meanwhile (cancelled, timed out): nobody
                        // holds the row, it goes as a dropped guard's does.
                        if let Err(lease) = handed.send(lease) {
                            engine.release_in_background(lease);
                        }
                    }
                    // Deleted for a waiter of another process, whose notification our
                    // listener hears too: our waiter waits for it as that one does.
                    Ok(HandOff::Released { notified: true, .. }) if engine.inner.wakeups.live() => {
                        offer.yielded.store(true, Ordering::Release);
                        drop(handed);
                    }
                    Ok(_) => drop(handed),
                    Err(_) => {
                        // The answer was lost, not necessarily the commit: the row may be
                        // the offer's owner's, a value nobody will use again (the waiter
                        // offers another one next). Removed while there is time.
                        drop(handed);
                        let until = sent_at + terms.lease;
                        let inner = Arc::clone(&engine.inner);
                        let (key, owner) = (key.clone(), offer.owner.clone());
                        engine.inner.jobs.spawn(async move {
                            inner.remove_handed_row(&key, &owner, until).await;
                        });
                    }
                }
                outcome
            })
        };
        let mut in_flight = HandingOff {
            jobs: &self.inner.jobs,
            job: Some(job),
        };
        let outcome = answer(&mut in_flight.job).await;
        let handed_over = matches!(outcome, Ok(HandOff::To(_)));
        // A handed-over row's events were recorded in the job.
        let answered = self.inner.history.now().filter(|_| !handed_over);
        lease.end_hold();
        // The waiter yielded to the notification (above): the listener wakes the queue.
        let yielded = yielded_offer.yielded.load(Ordering::Acquire);
        if !handed_over && !yielded {
            self.inner.queues.released(&lease.key);
        }
        let deleted = match outcome? {
            HandOff::To(_) => Some(false),
            HandOff::Released { expired, .. } => Some(expired),
            HandOff::NotOurs => None,
        };
        // A handed-over row notified nobody, and a yielded waiter's Locker must hear its
        // notification: both settled as a kept row is (no own release remembered).
        self.inner
            .settle(lease, deleted, handed_over || yielded, answered);
        Ok(deleted)
    }

    /// [`release`](Self::release) of several leases in one statement (one commit): a
    /// read-write lock's write, whose two rows go together. `leases` are in key order (two
    /// such releases lock rows in one order). Each answer as `release`'s, in `leases`'
    /// order; an error is the statement's, for all of them. No handoff, no minimum hold.
    pub(crate) async fn release_together(&self, leases: &[&Lease]) -> Result<Vec<Option<bool>>> {
        self.inner.release_together(leases).await
    }

    /// [`release`](Self::release) for callers nobody waits on (dropped guards, failed
    /// releases): queued for the engine's next batched release (see the module docs),
    /// retried until the lease's deadline; after that the row has expired and anyone may
    /// take it over. A lease with a minimum hold, or one given up after the engine
    /// stopped, is released on its own.
    pub(crate) fn release_in_background(&self, lease: Arc<Lease>) {
        if lease.min_hold().is_none() {
            let mut state = self.inner.state();
            // Once told to stop, the engine's task takes no more: it may have sent its
            // last batch already.
            if !state.stopped && !self.inner.jobs.is_stopping() {
                state.leases.remove(&lease.id);
                {
                    let mut timing = lease.timing();
                    timing.renewing = false;
                    timing.ended = true;
                }
                state.releasing.push(lease);
                let due = state.release_at.unwrap_or_else(Instant::now);
                let wake = plan_wake(&mut state, due);
                drop(state);
                self.ensure_started();
                if wake {
                    self.inner.wake.notify_one();
                }
                return;
            }
        }
        Arc::clone(&self.inner).release_alone(lease);
    }
}

impl<DB: Backend> EngineState<DB> {
    /// Releases one lease in a background job of its own (outside the batches), retrying
    /// failures until its deadline.
    pub(super) fn release_alone(self: Arc<Self>, lease: Arc<Lease>) {
        let inner = Arc::clone(&self);
        self.jobs.spawn(async move {
            let (engine, held) = (&*inner, &*lease);
            let deadline = held.deadline();
            let released = retry(&engine.retry, deadline, |_| async move {
                by_deadline(deadline, engine.release(held))
                    .await
                    .map_err(Retry::Again)
            })
            .await;
            match released {
                Ok(_) => {}
                // Lost already (its one WARN line said so): nothing failed that the lease
                // had not lost anyway, and its row is someone else's or gone.
                Err(err) if lease.was_lost() => {
                    tracing::debug!(key = %lease.key, owner = %lease.owner, error = %err, "background release of a lost lease found nothing to release");
                }
                Err(err) => {
                    tracing::warn!(key = %lease.key, owner = %lease.owner, error = %err, "background release failed; the lease will expire");
                }
            }
        });
    }

    /// Stops renewing `lease` before its row is released: waits for a batch in flight
    /// that includes it, so that no renewal of ours reaches the database after the
    /// release's statement.
    async fn stop_renewing_for_release(&self, lease: &Lease) {
        let in_pass = {
            let mut state = self.state();
            state.leases.remove(&lease.id);
            let mut timing = lease.timing();
            timing.renewing = false;
            timing.ended = true;
            timing.in_pass
        };
        // (Boxed, as the minimum hold's statement: rare, and held inline they would grow
        // every release's future, which is copied on each move.)
        if in_pass > *self.passes_done.borrow() {
            let mut done = self.passes_done.subscribe();
            Box::pin(done.wait_for(|done| *done >= in_pass)).await.ok();
        }
    }

    /// Removes the row a handoff whose answer was lost may have written for `owner`
    /// (nobody's: see [`Offer`]), retrying until `until`, when it would have expired.
    async fn remove_handed_row(&self, key: &str, owner: &str, until: Instant) {
        let removed = retry(&self.retry, until, |_| async move {
            by_deadline(until, self.table.release_if_owned(key, owner))
                .await
                .map_err(Retry::Again)
        })
        .await;
        if let Err(err) = removed {
            tracing::warn!(key, owner, error = %err, "could not remove the row of a failed handoff; it will expire");
        }
    }

    async fn release(&self, lease: &Lease) -> Result<Option<bool>> {
        self.stop_renewing_for_release(lease).await;
        // Sent again while another session is in the way, as long as the lease lasts.
        let outcome = self.release_once(lease).await;
        let answered = self.history.now();
        let kept = matches!(outcome, Ok(Ended { kept: true, .. }));
        // Held no more by this process: also when the DELETE failed (a background release
        // only repeats it), and when the row is kept for a job's minimum hold (nobody
        // works under it, it waits out its time). Before the next local waiter is woken
        // below, so that the held gauge never counts this lease and the waiter's at once.
        lease.end_hold();
        // The next local waiter tries at once rather than at the end of its backoff
        // (also when the DELETE failed: the lease may have ended anyway). A row kept for
        // a minimum hold is still held: the waiters sleep until its lease ends.
        if !kept {
            self.wake_local(lease);
        }
        // A waiter of another Locker marked the key (SQLite): this Locker's waiters, just
        // woken, hold back until this Locker's listener has looked at the table since, as
        // the other one's does, so that neither they nor a caller asking again at once
        // take the key before that waiter could see it free (a moment at most).
        if matches!(outcome, Ok(Ended { yielded: true, .. })) {
            let until = Instant::now() + DB::YIELD_FOR;
            self.queues.hold_back(&lease.key, until);
        }
        let Ended {
            deleted, yielded, ..
        } = outcome?;
        // A yielded release is not remembered as this Locker's own: its listener's report
        // of it is what lets this Locker's waiters go.
        self.settle(lease, deleted, kept || yielded, answered);
        Ok(deleted)
    }

    async fn release_together(&self, leases: &[&Lease]) -> Result<Vec<Option<bool>>> {
        for lease in leases {
            self.stop_renewing_for_release(lease).await;
        }
        // Sent again while another session is in the way, as long as every lease lasts.
        let until = leases.iter().map(|lease| lease.deadline()).min();
        let ids: Vec<LockId<'_>> = leases.iter().map(|lease| lease.lock_id()).collect();
        Counters::bump(&self.counters.releases);
        let until = until.unwrap_or_else(Instant::now);
        let outcome = self.table.release_together(&ids, until).await;
        let answered = self.history.now();
        // As in `release`: held no more, and local waiters try at once, whatever came of it.
        for lease in leases {
            lease.end_hold();
            self.wake_local(lease);
        }
        let rows = outcome?;
        let released: HashMap<(&str, i64), bool> = rows
            .iter()
            .map(|row| ((row.key.as_str(), row.fencing_token), row.expired))
            .collect();
        Ok(leases
            .iter()
            .map(|lease| {
                let deleted = released
                    .get(&(lease.key.as_str(), lease.fencing_token))
                    .copied();
                self.settle(lease, deleted, false, answered);
                deleted
            })
            .collect())
    }

    /// Records what a release found, once its statement answered: `deleted` is
    /// `Some(expired)` when our row went, `None` when it was not ours any more; `kept`
    /// when the row stays for a job's minimum hold, or when the listener's report of the
    /// release must not be taken for this Locker's own (a handoff, a release yielded to
    /// a waiter elsewhere).
    /// `answered`: when the statement answered, if the history records (its `Released`
    /// is dated then); `None` also when the release's events are recorded already (a
    /// handoff's).
    fn settle(&self, lease: &Lease, deleted: Option<bool>, kept: bool, answered: Option<Instant>) {
        // The release may be the first to see that the lease is gone (a guard that was not
        // renewed, a row deleted since the last renewal): a loss like any other, counted
        // and reported once.
        match deleted {
            Some(true) => lease.mark_lost(LostReason::Expired),
            None if Instant::now() < lease.deadline() => lease.mark_lost(LostReason::Deleted),
            None => lease.mark_lost(LostReason::TakenOver),
            Some(false) => {}
        }
        if deleted.is_some() {
            Counters::bump(&self.counters.released);
            let (key, owner, token) = (&lease.key, &lease.owner, Some(lease.fencing_token));
            (self.history).record_at(answered, EventKind::Released, key, owner, token);
        }
        if deleted.is_some() && !kept {
            self.wakeups.released_here(lease.fencing_token);
        }
        tracing::debug!(key = %lease.key, owner = %lease.owner, fencing_token = lease.fencing_token, deleted = deleted.is_some(), expired = deleted == Some(true), kept, "lock released");
    }

    /// Sends one batched release for every lease given up without a release, if its time
    /// has come (see the module docs). A failed batch is tried again after the backoff's
    /// next pause, without the leases whose deadline has passed meanwhile. Whether
    /// leases are still waiting to be released.
    pub(super) async fn release_due(&self, backoff: &mut RetryDelays) -> bool {
        let now = Instant::now();
        let mut batch = {
            let mut state = self.state();
            if state.releasing.is_empty() || state.release_at.is_some_and(|at| at > now) {
                return !state.releasing.is_empty();
            }
            std::mem::take(&mut state.releasing)
        };
        let (live, lapsed): (Vec<_>, Vec<_>) =
            batch.drain(..).partition(|lease| now < lease.deadline());
        for lease in lapsed {
            if lease.was_lost() {
                // Its loss was logged once already (lease.rs); this is no new failure.
                tracing::debug!(key = %lease.key, owner = %lease.owner, "lost lease given up without a release");
            } else {
                tracing::warn!(key = %lease.key, owner = %lease.owner, "background release failed until the lease's deadline; the row will expire");
            }
            lease.end_hold();
            self.wake_local(&lease);
        }
        let mut batch = live;
        if batch.is_empty() {
            return !self.state().releasing.is_empty();
        }
        // In key order: two batches (or a batch and a renewal) lock rows in one order.
        batch.sort_by(|a, b| a.key.cmp(&b.key));
        let ids: Vec<LockId<'_>> = batch.iter().map(|lease| lease.lock_id()).collect();
        // Bounded by the batch's last deadline, and by the first deadline of a lease the
        // engine renews: the statement shares the engine's connection with renewal.
        let last = batch.iter().map(|lease| lease.deadline()).max();
        let renewing = self.state().leases.values().map(|l| l.deadline()).min();
        let bound = last.into_iter().chain(renewing).min().unwrap_or(now);
        Counters::bump(&self.counters.release_batches);
        match by_deadline(bound, self.table.release_batch(&ids)).await {
            Ok(rows) => {
                let answered = self.history.now();
                *backoff = Box::new(self.retry.delays());
                let released: HashMap<(&str, i64), bool> = rows
                    .iter()
                    .map(|row| ((row.key.as_str(), row.fencing_token), row.expired))
                    .collect();
                for lease in &batch {
                    lease.end_hold();
                    self.wake_local(lease);
                    let deleted = released.get(&(lease.key.as_str(), lease.fencing_token));
                    self.settle(lease, deleted.copied(), false, answered);
                }
                drop(ids);
                let mut state = self.state();
                state.release_at = None;
                !state.releasing.is_empty()
            }
            Err(err) => {
                tracing::debug!(table = %self.table.name(), leases = batch.len(), error = %err, "batched release failed; retrying until each lease's deadline");
                let retry_at = Instant::now() + backoff.next().unwrap_or_default();
                drop(ids);
                let mut state = self.state();
                state.release_at = Some(retry_at);
                state.releasing.extend(batch);
                true
            }
        }
    }

    /// One release statement: the owner-checked DELETE, or, for a lease with a minimum
    /// hold that has not passed yet, the UPDATE that lets the row end then (`kept`; the
    /// row counts as released, not expired).
    async fn release_once(&self, lease: &Lease) -> Result<Ended> {
        let until = lease.deadline();
        Counters::bump(&self.counters.releases);
        if let Some(min_hold) = lease.min_hold()
            && Box::pin(self.table.keep_min_hold(lease.lock_id(), min_hold, until)).await?
        {
            return Ok(Ended {
                deleted: Some(false),
                kept: true,
                yielded: false,
            });
        }
        let released = self.table.release_marked(lease.lock_id(), until).await?;
        Ok(Ended {
            deleted: released.map(|(expired, _)| expired),
            kept: false,
            yielded: released.is_some_and(|(_, marked)| marked),
        })
    }
}

/// What one release statement did ([`EngineState::release_once`]).
struct Ended {
    /// `Some(expired)` when our row went, `None` when it was not ours any more.
    deleted: Option<bool>,
    /// The row stays until a job's minimum hold has passed.
    kept: bool,
    /// The row went, and a waiter of another Locker had marked its key
    /// ([`LockSql::release_marked`](crate::dialect::LockSql::release_marked)).
    yielded: bool,
}
