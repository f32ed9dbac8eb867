//! The lease engine: one per Locker (a part of its [`Core`](crate::core::Core)). Its one
//! job is the life of held leases: it renews every lease held through that Locker in
//! batched statements and says which ones are lost (`renewal.rs`), and it ends them,
//! deleting their rows (`release.rs`): at once for an explicit release, in batches for
//! guards dropped without one.
//!
//! # Renewal
//! Each lease renews every `interval` (`min(renew interval, lease / 3)`), counted from
//! the send time of its last successful statement. The engine sleeps until the earliest
//! lease is due, then renews, in one batch, every lease due within half its own interval:
//! leases acquired at different moments fall into step after one interval, so a Locker
//! sends one batch per interval in the steady state, and never more than two, however
//! many leases it holds (a batch in which a lease looked changed under the statement is
//! asked once more, for those leases only). A batch is one statement for up to
//! [`RENEW_CHUNK`](crate::table::RENEW_CHUNK) leases; a second one (a read of the batch's
//! rows) follows only when some lease was not renewed, to say why, and on MySQL/MariaDB
//! two more when a row was locked (the rows free at that moment are renewed alone).
//!
//! Every row stays owner- and token-checked. A lease the batch did not renew is lost:
//! `TakenOver` (another owner or token in the row), `Deleted` (no row) or `Expired`. A
//! failed statement is retried with the retry policy's backoff until each lease's own
//! deadline (send time of its last success plus its lease, less its margin: see
//! [`LeaseMargin`](crate::config::LeaseMargin)), where that lease is declared
//! `Unreachable`, also while the statement is still in flight (it goes on for the
//! others, and is abandoned when the last lease of its batch reaches its deadline), so no
//! loss is reported late.
//!
//! The batch waits for no row lock: a row another transaction holds locked (a caller's
//! fenced transaction, `assert_held`, until it ends, or for hours when its connection
//! went half-open) is skipped, and comes back busy, not lost; the batch's other leases
//! are renewed on time, and nothing of the statement is left waiting on the server. A
//! busy lease is renewed again on its own, with the retry policy's backoff, each time
//! waiting briefly for its row (a rival's acquisition attempt locks a held row for a
//! moment), until its deadline, where it alone is lost as `Unreachable`
//! (`renewal.rs`).
//!
//! # Background releases
//! A guard dropped without `release()` (or whose release failed) hands its lease to the
//! engine, which deletes the rows of every such lease in one owner- and token-checked
//! statement per pass ([`LockTable::release_batch`]), retrying a failed batch with the
//! retry policy's backoff until each lease's deadline (after it the row has expired and
//! anyone may take it over). Ten thousand guards dropped at once are a handful of
//! statements, not ten thousand. A lease with a job's minimum hold is released on its
//! own (its row is kept, not deleted).
//!
//! Renewal and background releases run on the engine's own connection, outside the
//! application's pool (see [`crate::table`]): a busy pool cannot make a held lease miss
//! its deadline.
//!
//! # Life cycle
//! The engine's task, one of the Locker's background jobs, starts with the first renewed
//! lease (or background release) and stops when the Locker's jobs are told to stop (its
//! last clone and last guard dropped, or `Locker::shutdown`). Stopping ends renewal (held
//! leases then lapse at their deadline and say so through `lost()`) and first finishes
//! the background releases, each bounded by its lease's deadline.

mod bell;
mod release;
mod renewal;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep_until};

use crate::config::{LeaseMargin, RetryPolicy};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::jobs::Jobs;
use crate::lease::{Lease, Won};
use crate::metrics::{self, TableMetrics};
use crate::queue::LocalQueues;
use crate::recorder::Recorder;
use crate::stats::Counters;
use crate::table::LockTable;
use crate::wakeups::Wakeups;

/// An idle engine (no lease held) keeps waking at the last lease's pace this many times
/// before it sleeps until a lease arrives: a Locker that acquires and releases in a loop
/// then never has to wake it (the next lease is due after the planned wake-up).
const IDLE_WAKES: u32 = 3;
/// Shortest pause of an idle engine.
const MIN_IDLE: Duration = Duration::from_millis(100);

/// The lease engine of one Locker.
pub(crate) struct Engine<DB: Backend> {
    inner: Arc<EngineState<DB>>,
}

/// What the engine is given when its Locker is built: the parts of the Locker's core it
/// works with.
pub(crate) struct Parts<DB: Backend> {
    pub(crate) table: Arc<LockTable<DB>>,
    pub(crate) metrics: TableMetrics,
    pub(crate) counters: Arc<Counters>,
    pub(crate) retry: RetryPolicy,
    /// The Locker's waiters, told when a key they wait for may be free.
    pub(crate) queues: Arc<LocalQueues>,
    /// The release listener, told of this Locker's own releases.
    pub(crate) wakeups: Arc<Wakeups<DB>>,
    /// The Locker's background work, which the engine's task and its clean-ups join.
    pub(crate) jobs: Jobs,
    /// The Locker's lease margin, for leases the engine itself wins (handoffs).
    pub(crate) margin: LeaseMargin,
    /// The lock history's recorder, when the Locker records one.
    pub(crate) history: Option<Arc<Recorder>>,
}

struct EngineState<DB: Backend> {
    table: Arc<LockTable<DB>>,
    metrics: TableMetrics,
    counters: Arc<Counters>,
    retry: RetryPolicy,
    queues: Arc<LocalQueues>,
    wakeups: Arc<Wakeups<DB>>,
    jobs: Jobs,
    margin: LeaseMargin,
    history: Option<Arc<Recorder>>,
    state: Mutex<Schedule>,
    /// Wakes the engine's task when a lease is due before its planned wake-up.
    wake: Notify,
    /// The last pass whose results have been applied.
    passes_done: watch::Sender<u64>,
    /// Leases whose row another transaction held locked at their last renewal.
    busy: renewal::BusyLeases,
    /// Set once the task was spawned: every acquisition asks, and needs no lock to hear yes.
    started: AtomicBool,
    /// Held while the task is being spawned, so that it is spawned once.
    starting: Mutex<()>,
}

struct Schedule {
    /// The leases this engine renews, by id. Every acquisition inserts and every release
    /// removes one: foldhash hashes a `u64` id faster than std's SipHash, whose flooding
    /// defence buys nothing on ids of our own.
    leases: foldhash::HashMap<u64, Arc<Lease>>,
    next_id: u64,
    /// When the engine's task will wake next (`None`: only when told).
    planned: Option<Instant>,
    /// The interval of the last lease registered: an idle engine's pace.
    last_interval: Duration,
    idle_wakes: u32,
    pass: u64,
    stopped: bool,
    /// Leases given up without a release, for the next batched release.
    releasing: Vec<Arc<Lease>>,
    /// When the next batched release may be sent: after a failed one, its backoff.
    release_at: Option<Instant>,
}

/// Whether the engine's task must be woken for a lease due at `due`: only when that is
/// before its planned wake-up, which then moves to `due`.
fn plan_wake(state: &mut Schedule, due: Instant) -> bool {
    let wake = state.planned.is_none_or(|planned| due < planned);
    if wake {
        state.planned = Some(due);
    }
    wake
}

impl<DB: Backend> Engine<DB> {
    pub(crate) fn new(parts: Parts<DB>) -> Self {
        Engine {
            inner: Arc::new(EngineState {
                table: parts.table,
                metrics: parts.metrics,
                counters: parts.counters,
                retry: parts.retry,
                queues: parts.queues,
                wakeups: parts.wakeups,
                jobs: parts.jobs,
                margin: parts.margin,
                history: parts.history,
                state: Mutex::new(Schedule {
                    leases: foldhash::HashMap::default(),
                    next_id: 1,
                    planned: None,
                    last_interval: MIN_IDLE,
                    idle_wakes: 0,
                    pass: 0,
                    stopped: false,
                    releasing: Vec::new(),
                    release_at: None,
                }),
                wake: Notify::new(),
                passes_done: watch::channel(0).0,
                busy: Default::default(),
                started: AtomicBool::new(false),
                starting: Mutex::new(()),
            }),
        }
    }

    /// Leases this engine renews right now.
    pub(crate) fn renewing(&self) -> usize {
        self.inner.state().leases.len()
    }

    /// Wraps a won acquisition in a lease and, if it is to be renewed, starts renewing it.
    pub(crate) fn start_lease(&self, won: Won) -> Arc<Lease> {
        let inner = &self.inner;
        let mut state = inner.state();
        let id = state.next_id;
        state.next_id += 1;
        let lease = Arc::new(Lease::new(
            won,
            id,
            Arc::clone(&inner.counters),
            inner.metrics.clone(),
            inner.history.clone(),
        ));
        let Some(interval) = lease.interval.filter(|_| !state.stopped) else {
            return lease;
        };
        let due = {
            let mut timing = lease.timing();
            timing.renewing = true;
            timing.next_renewal
        };
        state.leases.insert(id, Arc::clone(&lease));
        state.last_interval = interval.max(MIN_IDLE);
        state.idle_wakes = 0;
        // Only a lease due before the planned wake-up needs the task woken; otherwise it
        // is picked up then, early enough (a lease is renewed up to half an interval
        // early), and a tight acquire/release loop costs the engine no wake-up at all.
        // Decided under the lock already held: one lock fewer per acquisition.
        let wake = plan_wake(&mut state, due);
        drop(state);
        self.ensure_started();
        if wake {
            self.inner.wake.notify_one();
        }
        lease
    }

    fn ensure_started(&self) {
        // Every acquisition asks: once the task runs, the answer needs no lock.
        if self.inner.started.load(Ordering::Acquire) {
            return;
        }
        let _starting = self
            .inner
            .starting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.inner.started.load(Ordering::Acquire) || self.inner.jobs.is_stopping() {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!("no tokio runtime: leases will not be renewed");
            return;
        }
        self.inner.jobs.spawn(Arc::clone(&self.inner).run());
        self.inner.started.store(true, Ordering::Release);
    }

    /// Sets the lease to end `length` from now (database clock) if the row is still ours
    /// and unexpired; the new expiry.
    pub(crate) async fn extend(
        &self,
        lease: &Lease,
        length: Duration,
    ) -> Result<Option<DateTime<Utc>>> {
        // A loss is never taken back: a lease past its deadline is not extended (its row
        // may be someone else's by now, or soon: not held, nothing sent), and one whose
        // answer comes back after the deadline it would have set is lost (its holder
        // could not have acted on it in time).
        let lost = |reason| Error::LockLost {
            key: lease.key.clone(),
            reason,
        };
        if lease.lost_reason().is_some() {
            return Ok(None);
        }
        let sent_at = Instant::now();
        let until = lease.deadline();
        let expiry = self
            .inner
            .table
            .extend(lease.lock_id(), length, until)
            .await?;
        if let Some(expires_at) = expiry {
            metrics::renewals(&self.inner.metrics, 1);
            let due = lease.renewed(expires_at, sent_at, length);
            if let Some(reason) = lease.lost_reason() {
                return Err(lost(reason));
            }
            // A shorter lease may be due before the engine's planned wake-up.
            if lease.interval.is_some() {
                self.wake_by(due);
            }
        }
        Ok(expiry)
    }

    /// Makes sure the engine's task wakes by `due`.
    fn wake_by(&self, due: Instant) {
        let wake = plan_wake(&mut self.inner.state(), due);
        if wake {
            self.inner.wake.notify_one();
        }
    }
}

/// Stops renewal when the engine's task ends, however it ends.
struct StopRenewing<'a, DB: Backend>(&'a EngineState<DB>);

impl<DB: Backend> Drop for StopRenewing<'_, DB> {
    fn drop(&mut self) {
        // Leases still waiting for a batch lapse at their deadlines (no task to send it).
        drop(self.0.stop_renewing());
    }
}

/// The engine's delays between failed statements (reset after a success).
type RetryDelays = Box<dyn Iterator<Item = Duration> + Send>;

impl<DB: Backend> EngineState<DB> {
    fn state(&self) -> MutexGuard<'_, Schedule> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run(self: Arc<Self>) {
        // However the task ends (stopped, panicked, or dropped with its runtime), its
        // leases stop counting on it: they lapse at their deadlines and say so, and no
        // release waits for a pass that will never come.
        let _stopped = StopRenewing(&self);
        let mut backoff: RetryDelays = Box::new(self.retry.delays());
        let mut release_backoff: RetryDelays = Box::new(self.retry.delays());
        // The first renewal is an interval away: have its connection ready by then.
        let ready_by = self.plan().unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            _ = self.jobs.stopping() => {}
            _ = self.table.open_engine_connection(ready_by) => {}
        }
        loop {
            let planned = self.plan();
            let sleep = async {
                match planned {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = self.jobs.stopping() => break,
                _ = self.wake.notified() => continue,
                _ = sleep => {}
            }
            self.pass(&mut backoff).await;
            self.release_due(&mut release_backoff).await;
        }
        // Leases given up before the stop still go, each until its deadline.
        loop {
            let next = self.state().release_at;
            if let Some(at) = next {
                sleep_until(at).await;
            }
            if !self.release_due(&mut release_backoff).await {
                break;
            }
        }
        self.finish();
    }

    /// Ends renewal of every lease (they lapse at their deadlines).
    fn finish(self: &Arc<Self>) {
        // Leases given up while the task was stopping go one by one, as jobs of the
        // Locker's that its shutdown waits for.
        for lease in self.stop_renewing() {
            Arc::clone(self).release_alone(lease);
        }
    }

    /// Ends renewal; the leases still waiting for a batched release, if any.
    fn stop_renewing(&self) -> Vec<Arc<Lease>> {
        let (leases, releasing) = {
            let mut state = self.state();
            state.stopped = true;
            let leases: Vec<Arc<Lease>> = state.leases.drain().map(|(_, lease)| lease).collect();
            (leases, std::mem::take(&mut state.releasing))
        };
        for lease in leases {
            lease.set_renewing(false);
        }
        self.passes_done.send_replace(u64::MAX);
        releasing
    }

    /// When to wake next: the earliest renewal or deadline; an idle engine keeps the last
    /// lease's pace for a few wake-ups, then waits to be told.
    fn plan(&self) -> Option<Instant> {
        let mut state = self.state();
        let earliest = state
            .leases
            .values()
            .map(|lease| {
                let timing = lease.timing();
                timing.next_renewal.min(timing.deadline)
            })
            .min();
        let releases =
            (!state.releasing.is_empty()).then(|| state.release_at.unwrap_or_else(Instant::now));
        let earliest = match (earliest, releases) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let planned = match earliest {
            Some(at) => Some(at),
            None if state.idle_wakes < IDLE_WAKES => {
                state.idle_wakes += 1;
                Some(Instant::now() + state.last_interval)
            }
            None => None,
        };
        state.planned = planned;
        planned
    }
}
