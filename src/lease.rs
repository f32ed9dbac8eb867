//! A held lease and its watchdog: renews the row while it is ours, and says when it is not.
//!
//! Every held lease has one monitor task. With renewal on, it sends an owner- and
//! token-checked `UPDATE` every `min(interval, lease / 3)`, counted from when the last
//! successful statement was sent; a failed statement is retried with backoff until the
//! lease's own deadline, and only then is the lease declared lost. A statement still
//! unanswered at the deadline (a black-holed connection never fails by itself) is
//! abandoned, so the loss is reported on time. With renewal off, the monitor only fires
//! `Expired` at the deadline. Ending a lease stops the monitor and waits for it before the
//! `DELETE`: the monitor never abandons a statement half-way while the lease is live, so
//! no renewal reaches the database after the release. (One abandoned at the deadline can
//! only extend a row that is still ours and unexpired when it lands.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::config::micros;
use crate::dialect::{Acquired, Backend, Contention, LockId};
use crate::error::LostReason;
use crate::locker::Shared;
use crate::stats::Counters;

/// What holders can observe about a lease.
#[derive(Debug, Clone, Copy)]
struct Status {
    expires_at: DateTime<Utc>,
    lost: Option<LostReason>,
}

/// One acquisition's row, shared by its guard(s) and its monitor task.
pub(crate) struct Lease<DB: Backend> {
    pub(crate) shared: Arc<Shared<DB>>,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fencing_token: i64,
    /// The lease length renewals ask for.
    length: Duration,
    status: watch::Sender<Status>,
    /// Earliest instant, on our clock, at which the database may consider the lease over:
    /// when the last successful acquire or renew statement was *sent*, plus the lease.
    deadline: Mutex<Instant>,
    /// Guards sharing this lease (more than one only for a reentrant [`Owner`](crate::Owner)).
    holds: AtomicUsize,
    stop: CancellationToken,
    stopped: CancellationToken,
}

impl<DB: Backend> Lease<DB> {
    /// Wraps a won acquisition and starts its monitor.
    pub(crate) fn start(
        shared: Arc<Shared<DB>>,
        key: String,
        owner: String,
        acquired: Acquired,
        length: Duration,
        sent_at: Instant,
        renew: Option<Duration>,
    ) -> Arc<Self> {
        let (status, _) = watch::channel(Status {
            expires_at: acquired.expires_at,
            lost: None,
        });
        let lease = Arc::new(Lease {
            shared,
            key,
            owner,
            fencing_token: acquired.fencing_token,
            length,
            status,
            deadline: Mutex::new(sent_at + length),
            holds: AtomicUsize::new(1),
            stop: CancellationToken::new(),
            stopped: CancellationToken::new(),
        });
        let monitor = Arc::clone(&lease);
        tokio::spawn(async move {
            let _signal_stopped = monitor.stopped.clone().drop_guard();
            match renew {
                Some(interval) => monitor.renew_until_stopped(interval).await,
                None => monitor.expire_unless_stopped().await,
            }
        });
        lease
    }

    pub(crate) fn id(&self) -> LockId<'_> {
        LockId {
            key: &self.key,
            owner: &self.owner,
            fencing_token: self.fencing_token,
        }
    }

    pub(crate) fn expires_at(&self) -> DateTime<Utc> {
        self.status.borrow().expires_at
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.status.borrow().lost
    }

    /// Completes when the lease is lost; pending forever while it is held.
    pub(crate) async fn lost(&self) -> LostReason {
        let mut status = self.status.subscribe();
        match status.wait_for(|s| s.lost.is_some()).await {
            Ok(s) => s.lost.unwrap_or(LostReason::Expired),
            // The sender lives in `self`, so this cannot end while we borrow it.
            Err(_) => std::future::pending().await,
        }
    }

    /// Records a new expiry reported by the database for a statement sent at `sent_at`.
    pub(crate) fn renewed(&self, expires_at: DateTime<Utc>, sent_at: Instant, length: Duration) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = sent_at + length;
        self.status.send_modify(|s| s.expires_at = expires_at);
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_lost(&self, reason: LostReason) {
        let mut first = false;
        self.status.send_modify(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
                first = true;
            }
        });
        if first {
            Counters::bump(&self.shared.counters.lost);
            tracing::warn!(key = %self.key, owner = %self.owner, fencing_token = self.fencing_token, %reason, "lock lost");
        }
    }

    /// Adds a nested holder, unless the lease has already been given up.
    pub(crate) fn nest(&self) -> bool {
        self.lost_reason().is_none()
            && self
                .holds
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                    (h > 0).then_some(h + 1)
                })
                .is_ok()
    }

    /// Drops one holder; `true` when it was the last and the row must go.
    pub(crate) fn unnest(&self) -> bool {
        self.holds.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Stops the monitor, waits until it has stopped, then deletes the row if it is still
    /// ours. Safe to call more than once.
    pub(crate) async fn end(&self) -> Result<bool, sqlx::Error> {
        self.stop.cancel();
        self.stopped.cancelled().await;
        let mut delays = self.shared.retry.delays();
        let deleted = loop {
            match DB::release(&self.shared.pool, &self.shared.sql, self.id()).await {
                // MariaDB picks the DELETE as a deadlock victim under a storm of acquisition
                // attempts on the key (SQLite: busy). Nothing was deleted, and the owner-
                // and token-checked DELETE is safe to repeat while the lease lasts.
                Err(err)
                    if DB::contention(&err) == Contention::LostRace
                        && Instant::now() < self.deadline() =>
                {
                    tokio::time::sleep(delays.next().unwrap_or_default()).await;
                }
                outcome => break outcome?,
            }
        };
        if deleted {
            Counters::bump(&self.shared.counters.released);
        }
        tracing::debug!(key = %self.key, owner = %self.owner, fencing_token = self.fencing_token, deleted, "lock released");
        Ok(deleted)
    }

    /// [`end`](Self::end) for callers nobody waits on (dropped guards): a failed delete is
    /// retried with backoff until the lease's deadline; after that the row has expired
    /// and anyone may take it over, so there is nothing left to protect.
    pub(crate) async fn end_in_background(&self) {
        let mut delays = self.shared.retry.delays();
        loop {
            match self.end().await {
                Ok(_) => return,
                Err(err) if Instant::now() < self.deadline() => {
                    tracing::debug!(key = %self.key, error = %err, "background release failed; retrying");
                    let pause = delays.next().unwrap_or(Duration::from_millis(100));
                    sleep_until((Instant::now() + pause).min(self.deadline())).await;
                }
                Err(err) => {
                    tracing::warn!(key = %self.key, owner = %self.owner, error = %err, "background release failed; the lease will expire");
                    return;
                }
            }
        }
    }

    /// Sleeps until `at` or until stopped; `false` when stopped.
    async fn sleep_unless_stopped(&self, at: Instant) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            _ = sleep_until(at) => true,
        }
    }

    async fn expire_unless_stopped(&self) {
        loop {
            let deadline = self.deadline();
            if !self.sleep_unless_stopped(deadline).await {
                return;
            }
            // A manual extend may have moved the deadline while we slept.
            if Instant::now() >= self.deadline() {
                return self.mark_lost(LostReason::Expired);
            }
        }
    }

    async fn renew_until_stopped(&self, interval: Duration) {
        let shared = &self.shared;
        // Counted from when the acquisition was sent, like the deadline: a slow acquire
        // has already used up part of the interval.
        let mut next = self.deadline() - self.length + interval;
        let mut backoff = None;
        loop {
            if !self.sleep_unless_stopped(next.min(self.deadline())).await {
                return;
            }
            let sent_at = Instant::now();
            if sent_at >= self.deadline() {
                let reason = if backoff.is_some() {
                    LostReason::Unreachable
                } else {
                    LostReason::Expired
                };
                return self.mark_lost(reason);
            }
            // Counted before sending: after `end()` returns, this counter never moves.
            Counters::bump(&shared.counters.renewals);
            // Past the deadline an answer is worthless: the lease may be someone else's.
            let extend = DB::extend(&shared.pool, &shared.sql, self.id(), micros(self.length));
            let outcome = tokio::time::timeout_at(self.deadline(), extend)
                .await
                .unwrap_or_else(|_| {
                    Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no answer before the lease's deadline",
                    )))
                });
            match outcome {
                Ok(Some(expires_at)) => {
                    self.renewed(expires_at, sent_at, self.length);
                    tracing::trace!(key = %self.key, owner = %self.owner, fencing_token = self.fencing_token, %expires_at, "lease renewed");
                    backoff = None;
                    next = sent_at + interval;
                }
                Ok(None) => return self.mark_lost(self.why_not_ours().await),
                Err(err) => {
                    Counters::bump(&shared.counters.renewal_errors);
                    tracing::debug!(key = %self.key, error = %err, "renewal failed; retrying until the lease ends");
                    let delays = backoff.get_or_insert_with(|| shared.retry.delays());
                    next = Instant::now() + delays.next().unwrap_or(Duration::from_millis(100));
                }
            }
        }
    }

    /// After a renewal matched no row: who has it now?
    async fn why_not_ours(&self) -> LostReason {
        match DB::inspect(&self.shared.pool, &self.shared.sql, &self.key).await {
            Ok(None) => LostReason::Deleted,
            Ok(Some((owner, token, _))) if owner != self.owner || token != self.fencing_token => {
                LostReason::TakenOver
            }
            _ => LostReason::Expired,
        }
    }
}
