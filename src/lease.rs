//! A held lease: its row, what holders can observe about it, and its timing. The lease
//! engine ([`crate::engine`]) renews it; the lease itself sends nothing.
//!
//! Loss is reported a margin *before* the earliest moment the database may consider the
//! lease over: the send time of the last successful acquire or renew statement, plus the
//! lease, minus the lease's margin ([`LeaseMargin`]). Whoever looks after that deadline
//! ([`Lease::lost`], [`Lease::lost_reason`]) finds the lease lost, whether or not a
//! renewal is in flight: `Unreachable` while an engine was renewing it (its statement got
//! no answer in time, or failed), `Expired` when nobody renews it (renewal off, or its
//! engine stopped) or its renewal was not sent in time (the process stalled). A waiter of `lost()` sleeps until the deadline itself rather than relying on
//! the engine's task to be woken and report it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, oneshot};
use tokio::time::{Instant, sleep_until};

use crate::config::LeaseMargin;
use crate::dialect::LockId;
use crate::error::LostReason;
use crate::metrics::{self, Failure, TableMetrics};
use crate::recorder::{EventKind, Record, Recorder};
use crate::stats::Counters;

/// What holders can observe about a lease.
#[derive(Debug, Clone, Copy)]
struct Status {
    expires_at: DateTime<Utc>,
    lost: Option<LostReason>,
}

/// The engine's bookkeeping for one lease, behind one lock.
#[derive(Debug)]
pub(crate) struct Timing {
    /// Earliest instant, on our clock, at which the database may consider the lease over.
    pub(crate) deadline: Instant,
    /// When the engine should renew next (the last successful send plus the interval,
    /// or a retry after a failed statement).
    pub(crate) next_renewal: Instant,
    /// Whether the last renewal statement failed (the database could not be reached).
    pub(crate) failing: bool,
    /// Whether a renewal statement for this lease was sent and has not been answered.
    pub(crate) in_flight: bool,
    /// What the lease is lost as if it is still failing at its deadline: `Unreachable`, or
    /// `NoConnection` when the database refused the engine its connection.
    pub(crate) failure: LostReason,
    /// Whether an engine is renewing this lease; when not, the deadline is final.
    pub(crate) renewing: bool,
    /// The engine pass that last included this lease (see `Engine::release`).
    pub(crate) in_pass: u64,
    /// The lease was released: nothing more is to be reported about it.
    pub(crate) ended: bool,
    /// When the latest statement recorded by [`Lease::renewed`] was sent.
    pub(crate) last_sent: Instant,
}

/// One acquisition's row, shared by its guard(s) and the engine.
pub(crate) struct Lease {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fencing_token: i64,
    /// The lease length renewals ask for.
    pub(crate) length: Duration,
    /// How often the engine renews it; `None` when it is not renewed.
    pub(crate) interval: Option<Duration>,
    /// How long before `send time + lease` the lease ends locally.
    margin: LeaseMargin,
    /// The engine's registry key.
    pub(crate) id: u64,
    /// Behind its own lock: holders read it without touching the engine's [`Timing`].
    status: Mutex<Status>,
    /// Wakes `lost()` waiters at every renewal, loss and change of who renews. A plain
    /// `Notify` rather than a `watch` channel: that one allocates a shared block with
    /// eight wait lists per lease and wakes them all when the lease is dropped, a cost
    /// every acquisition paid for a signal few callers wait on.
    changed: Notify,
    timing: Mutex<Timing>,
    /// Guards sharing this lease (more than one only for a reentrant [`Owner`](crate::Owner)).
    holds: AtomicUsize,
    counters: Arc<Counters>,
    /// Fair mode: the ticket the acquisition waited on.
    ticket: std::sync::OnceLock<i64>,
    /// A job's minimum hold: the release keeps the row until this long after the
    /// acquisition (database clock) rather than deleting it sooner.
    min_hold: std::sync::OnceLock<Duration>,
    /// The lock table's metrics.
    metrics: TableMetrics,
    /// When the acquisition statement was sent: the start of the hold time.
    acquired_at: Instant,
    /// Whether the lease stopped counting as held ([`Lease::end_hold`]).
    hold_ended: AtomicBool,
    /// Told when the hold ends, for the engine's job that keeps the row's bell
    /// (MySQL/MariaDB: see `engine::bell`).
    hold_end: Mutex<Option<oneshot::Sender<()>>>,
    /// Whether the row's bell is held for this lease: its release then reaches the
    /// waiters of other processes, and this Locker's (see `engine::bell`).
    belled: AtomicBool,
    /// The lock history's recorder, when the Locker records one: told of a loss.
    history: Option<Arc<Recorder>>,
}

/// What a won acquisition hands to [`Lease::new`].
pub(crate) struct Won {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fencing_token: i64,
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) length: Duration,
    pub(crate) interval: Option<Duration>,
    /// When the acquisition statement was sent.
    pub(crate) sent_at: Instant,
    /// The Locker's margin (see [`LeaseMargin`]).
    pub(crate) margin: LeaseMargin,
}

impl Won {
    /// When this acquisition's lease ends locally: its send time plus the lease, less the
    /// margin. An answer that arrives at or after it must not become a guard.
    pub(crate) fn deadline(&self) -> Instant {
        self.sent_at + self.length.saturating_sub(self.margin.of(self.length))
    }
}

impl Lease {
    /// Records the fair-mode ticket this acquisition waited on.
    pub(crate) fn set_ticket(&self, ticket: i64) {
        self.ticket.set(ticket).ok();
    }

    /// The fair-mode ticket this acquisition waited on, if it waited on one.
    pub(crate) fn ticket(&self) -> Option<i64> {
        self.ticket.get().copied()
    }

    /// Makes every release of this lease (explicit, failed and retried, or on drop) keep
    /// the row until `min_hold` after the acquisition, by the database clock.
    pub(crate) fn set_min_hold(&self, min_hold: Duration) {
        self.min_hold.set(min_hold).ok();
    }

    /// See [`set_min_hold`](Self::set_min_hold).
    pub(crate) fn min_hold(&self) -> Option<Duration> {
        self.min_hold.get().copied()
    }

    /// A won lease, recorded in `metrics`; it counts as held from now until
    /// [`end_hold`](Self::end_hold).
    pub(crate) fn new(
        won: Won,
        id: u64,
        counters: Arc<Counters>,
        metrics: TableMetrics,
        history: Option<Arc<Recorder>>,
    ) -> Self {
        let status = Mutex::new(Status {
            expires_at: won.expires_at,
            lost: None,
        });
        let deadline = won.deadline();
        metrics::held(&metrics, 1);
        Lease {
            key: won.key,
            owner: won.owner,
            fencing_token: won.fencing_token,
            length: won.length,
            interval: won.interval,
            margin: won.margin,
            id,
            status,
            changed: Notify::new(),
            timing: Mutex::new(Timing {
                deadline,
                next_renewal: won.interval.map_or(deadline, |i| won.sent_at + i),
                failing: false,
                in_flight: false,
                failure: LostReason::Unreachable,
                renewing: false,
                in_pass: 0,
                ended: false,
                last_sent: won.sent_at,
            }),
            holds: AtomicUsize::new(1),
            counters,
            ticket: std::sync::OnceLock::new(),
            min_hold: std::sync::OnceLock::new(),
            metrics,
            acquired_at: won.sent_at,
            hold_ended: AtomicBool::new(false),
            hold_end: Mutex::new(None),
            belled: AtomicBool::new(false),
            history,
        }
    }

    pub(crate) fn lock_id(&self) -> LockId<'_> {
        LockId {
            key: &self.key,
            owner: &self.owner,
            fencing_token: self.fencing_token,
        }
    }

    /// The engine's bookkeeping (held briefly, never across an await).
    pub(crate) fn timing(&self) -> MutexGuard<'_, Timing> {
        self.timing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn expires_at(&self) -> DateTime<Utc> {
        self.status().expires_at
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.timing().deadline
    }

    /// The local deadline of a statement sent at `sent_at` that asked for `length`.
    fn ends(&self, sent_at: Instant, length: Duration) -> Instant {
        sent_at + length.saturating_sub(self.margin.of(length))
    }

    /// Why the lease was lost, if it was. Once its deadline has passed the lease is lost,
    /// whoever looks and whether or not a renewal is in flight: the database may give the
    /// key away a margin later, and nothing may act on the lease by then.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        if let Some(reason) = self.status().lost {
            return Some(reason);
        }
        let lapsed = {
            let timing = self.timing();
            (!timing.ended && Instant::now() >= timing.deadline).then_some(
                // An engine that renews it sent a statement that did not come back in
                // time (or could not send one). A lease nobody renews simply ran out, as
                // does one whose renewal was not even sent by then: its process stalled
                // (frozen, starved), and the database was never found unreachable.
                if timing.renewing && timing.failing {
                    timing.failure
                } else if timing.renewing && timing.in_flight {
                    LostReason::Unreachable
                } else {
                    LostReason::Expired
                },
            )
        };
        if let Some(reason) = lapsed {
            self.mark_lost(reason);
        }
        self.status().lost
    }

    /// Whether the lease was declared lost (and its loss logged), without declaring it
    /// lost now if its deadline has passed, as [`lost_reason`](Self::lost_reason) does.
    pub(crate) fn was_lost(&self) -> bool {
        self.status().lost.is_some()
    }

    /// Completes when the lease is lost; pending forever while it is held.
    pub(crate) async fn lost(&self) -> LostReason {
        loop {
            // Made before the status is read: a change sent after that read wakes it.
            let changed = self.changed.notified();
            if let Some(reason) = self.lost_reason() {
                return reason;
            }
            let (deadline, ended) = {
                let timing = self.timing();
                (timing.deadline, timing.ended)
            };
            // Every renewal, loss and change of who renews notifies `changed`; the
            // deadline wakes it too, renewed or not: a renewal still in flight then has
            // come too late, and waiting for the engine's task to say so would add its
            // wake-up to the holder's learning time.
            tokio::select! {
                _ = changed => {}
                // A released lease is never lost: only a change can end this wait.
                _ = sleep_until(deadline), if !ended => {}
            }
        }
    }

    /// Records a new expiry reported by the database for a statement sent at `sent_at`
    /// that asked for `length`.
    ///
    /// An answer to a statement sent before the last one recorded (a renewal batch that
    /// crossed a manual `extend`) can only shorten the deadline: which of the two the
    /// database applied last is unknown, so the earlier end is assumed. The next renewal
    /// is due within `min(interval, length / 3)`, so a lease extended to less than the
    /// renewal interval is still renewed in time. Returns when that is.
    pub(crate) fn renewed(
        &self,
        expires_at: DateTime<Utc>,
        sent_at: Instant,
        length: Duration,
    ) -> Instant {
        // A lease whose deadline passed before this answer came stays lost: whoever
        // looked in between was told so, and a loss is never taken back.
        if self.lost_reason().is_some() {
            return Instant::now();
        }
        let latest;
        let due = {
            let mut timing = self.timing();
            let ends = self.ends(sent_at, length);
            latest = sent_at >= timing.last_sent;
            if latest {
                timing.last_sent = sent_at;
                timing.deadline = ends;
                timing.failing = false;
                if let Some(interval) = self.interval {
                    timing.next_renewal = sent_at + interval.min(length / 3);
                }
            } else {
                timing.deadline = timing.deadline.min(ends);
            }
            timing.next_renewal.min(timing.deadline)
        };
        {
            let mut status = self.status();
            status.expires_at = if latest {
                expires_at
            } else {
                status.expires_at.min(expires_at)
            };
        }
        self.changed.notify_waiters();
        due
    }

    /// Says whether an engine renews the lease from now on, and wakes `lost()` waiters
    /// so they start (or stop) watching the deadline themselves.
    pub(crate) fn set_renewing(&self, renewing: bool) {
        self.timing().renewing = renewing;
        self.changed.notify_waiters();
    }

    /// Reports the loss once: counters, metrics, event, and every `lost()` waiter.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let first = {
            let mut status = self.status();
            let first = status.lost.is_none();
            if first {
                status.lost = Some(reason);
                // Under the lock: whoever reads the loss also sees it counted.
                metrics::failure(&self.metrics, Failure::Lost(reason), &self.key);
                self.end_hold();
            }
            first
        };
        if first {
            self.changed.notify_waiters();
            Counters::bump(&self.counters.lost);
            let (key, owner, token) = (&self.key, &self.owner, Some(self.fencing_token));
            self.history
                .record_detail(EventKind::Lost, key, owner, token, reason);
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

    /// The lease stops counting as held by this process: at its release, its loss, or (if
    /// neither was seen) when the last reference to it goes, whichever comes first. Records
    /// the hold time and lowers the held gauge, once.
    pub(crate) fn end_hold(&self) {
        if !self.hold_ended.swap(true, Ordering::AcqRel) {
            metrics::held(&self.metrics, -1);
            metrics::hold_time(
                &self.metrics,
                &self.key,
                self.acquired_at.elapsed().as_secs_f64(),
            );
            let told = self
                .hold_end
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(told) = told {
                told.send(()).ok();
            }
        }
    }

    /// Completes when the hold ends ([`end_hold`](Self::end_hold): release, loss, or the
    /// lease dropped), at once if it has. One waiter at a time: a second call replaces
    /// the first, which then completes with an error.
    pub(crate) fn hold_ends(&self) -> oneshot::Receiver<()> {
        let (told, ends) = oneshot::channel();
        let mut slot = self.hold_end.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the slot's lock: `end_hold` sets the flag before it takes the slot.
        if self.hold_ended.load(Ordering::Acquire) {
            told.send(()).ok();
        } else {
            *slot = Some(told);
        }
        ends
    }

    /// Records that the row's bell is held for this lease (it stays so: the lease's
    /// release rings it).
    pub(crate) fn set_belled(&self) {
        self.belled.store(true, Ordering::Release);
    }

    /// Whether the row's bell is held for this lease.
    pub(crate) fn belled(&self) -> bool {
        self.belled.load(Ordering::Acquire)
    }
}

impl Drop for Lease {
    /// The backstop of [`end_hold`](Lease::end_hold): a lease whose release never ran (no
    /// runtime left for a dropped guard's background release) still stops counting.
    fn drop(&mut self) {
        self.end_hold();
    }
}
