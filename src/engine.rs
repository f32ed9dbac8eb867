//! The lease engine: one per [`Locker`](crate::Locker), shared by its clones, guards and
//! [`Owner`](crate::Owner)s. It renews every lease held through that Locker in batched
//! statements, reports lost leases, and owns the background work (releases of dropped
//! guards, clean-up after cancelled or failed acquisitions) so that stopping the engine
//! can wait for it.
//!
//! # Renewal
//! Each lease renews every `interval` (`min(renew interval, lease / 3)`), counted from
//! the send time of its last successful statement. The engine sleeps until the earliest
//! lease is due, then renews, in one batch, every lease due within half its own interval:
//! leases acquired at different moments fall into step after one interval, so a Locker
//! sends one batch per interval in the steady state, and never more than two, however
//! many leases it holds (a batch in which a lease looked changed under the statement is
//! asked once more, for those leases only). A batch is one statement for up to
//! [`RENEW_CHUNK`](crate::table::RENEW_CHUNK) leases; on MySQL/MariaDB and SQLite a second
//! one (a read of the batch's rows) follows only when some lease was not renewed, to say
//! why.
//!
//! Every row stays owner- and token-checked. A lease the batch did not renew is lost:
//! `TakenOver` (another owner or token in the row), `Deleted` (no row) or `Expired`. A
//! failed statement is retried with the retry policy's backoff until each lease's own
//! deadline (send time of its last success plus its lease), where that lease is declared
//! `Unreachable`, also while the statement is still in flight (it goes on for the
//! others, and is abandoned when the last lease of its batch reaches its deadline), so no
//! loss is reported late.
//!
//! A row locked by a transaction of the caller's (`assert_held`, until that transaction
//! ends) holds up the whole batch, not only its own lease: keep such transactions short
//! against the lease.
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
//! The engine's task starts with the first renewed lease (or background release) and
//! stops when the Locker (its last clone and last guard) is dropped, or at
//! [`Engine::shutdown`]. Stopping ends renewal (held leases then lapse at their deadline
//! and say so through `lost()`) and first finishes the background releases, each bounded
//! by its lease's deadline.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{RetryPolicy, micros};
use crate::dialect::{Backend, Contention, LockId, Renewal, RowState};
use crate::error::LostReason;
use crate::fair::Tickets;
use crate::lease::{Lease, Won};
use crate::metrics::{self, TableMetrics};
use crate::queue::LocalQueues;
use crate::retry::{Retry, by, retry};
use crate::stats::Counters;
use crate::table::{ConnectOptions, LockTable};
use crate::wakeups::Wakeups;

/// An idle engine (no lease held) keeps waking at the last lease's pace this many times
/// before it sleeps until a lease arrives: a Locker that acquires and releases in a loop
/// then never has to wake it (the next lease is due after the planned wake-up).
const IDLE_WAKES: u32 = 3;
/// Shortest pause of an idle engine.
const MIN_IDLE: Duration = Duration::from_millis(100);

/// The lease engine of one Locker. Dropping it stops the engine (without waiting).
pub(crate) struct Engine<DB: Backend> {
    inner: Arc<Inner<DB>>,
}

struct Inner<DB: Backend> {
    table: Arc<LockTable<DB>>,
    /// The table's metrics, shared with leases and queues.
    metrics: TableMetrics,
    counters: Arc<Counters>,
    retry: RetryPolicy,
    state: Mutex<State>,
    /// Wakes the engine's task when a lease is due before its planned wake-up.
    wake: Notify,
    /// The last pass whose results have been applied.
    passes_done: watch::Sender<u64>,
    stop: CancellationToken,
    jobs: TaskTracker,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Set once the task was spawned: every acquisition asks, and needs no lock to hear yes.
    started: AtomicBool,
    /// This Locker's waiters, by key.
    queues: LocalQueues,
    /// The listener that hears releases of other processes (PostgreSQL).
    wakeups: Wakeups<DB>,
    /// Fair mode: the tickets of this Locker's waiters.
    tickets: Option<Tickets>,
}

/// How an engine hears releases of other processes.
pub(crate) struct Listen<DB: Backend> {
    /// Whether to listen at all (only backends with notifications do).
    pub(crate) on: bool,
    /// The listener's own address; `None`: the pool's, if it is a session of its own.
    pub(crate) options: Option<ConnectOptions<DB>>,
}

struct State {
    /// The leases this engine renews, by id. Every acquisition inserts and every release
    /// removes one: foldhash hashes a `u64` id in a few instructions, std's SipHash in
    /// about 300 (callgrind); the ids are ours, so SipHash's flooding defence buys
    /// nothing.
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
fn plan_wake(state: &mut State, due: Instant) -> bool {
    let wake = state.planned.is_none_or(|planned| due < planned);
    if wake {
        state.planned = Some(due);
    }
    wake
}

impl<DB: Backend> Engine<DB> {
    pub(crate) fn new(
        table: LockTable<DB>,
        counters: Arc<Counters>,
        retry: RetryPolicy,
        listen: Listen<DB>,
        tickets: Option<Tickets>,
    ) -> Self {
        let metrics = TableMetrics::new(table.name());
        Engine {
            inner: Arc::new(Inner {
                table: Arc::new(table),
                metrics: metrics.clone(),
                counters,
                retry,
                state: Mutex::new(State {
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
                stop: CancellationToken::new(),
                jobs: TaskTracker::new(),
                task: Mutex::new(None),
                started: AtomicBool::new(false),
                queues: LocalQueues::new(metrics),
                wakeups: Wakeups::new(listen.on && DB::NOTIFIES, listen.options),
                tickets,
            }),
        }
    }

    pub(crate) fn table(&self) -> &Arc<LockTable<DB>> {
        &self.inner.table
    }

    /// The lock table's metrics.
    pub(crate) fn metrics(&self) -> &TableMetrics {
        &self.inner.metrics
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    pub(crate) fn counters_arc(&self) -> Arc<Counters> {
        Arc::clone(&self.inner.counters)
    }

    pub(crate) fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// This Locker's waiting queues.
    pub(crate) fn queues(&self) -> &LocalQueues {
        &self.inner.queues
    }

    /// Starts the release listener if it is not running yet (it lives until the engine
    /// stops); [`listening`](Self::listening) says when it is up.
    pub(crate) fn start_listener(&self) {
        let inner = &self.inner;
        if inner.wakeups.claim_start() {
            let job = Arc::clone(inner);
            self.spawn_job(async move {
                let inner = &*job;
                inner
                    .wakeups
                    .run(&inner.table, &inner.queues, &inner.counters, &inner.stop)
                    .await;
            });
        }
    }

    /// Fair mode's tickets; `None` when the Locker is not fair.
    pub(crate) fn tickets(&self) -> Option<&Tickets> {
        self.inner.tickets.as_ref()
    }

    /// Starts renewing the tickets of this Locker's waiters, if that is not running yet.
    pub(crate) fn renew_tickets_in_background(&self) {
        let inner = &self.inner;
        if inner.tickets.as_ref().is_some_and(Tickets::claim_start) {
            let job = Arc::clone(inner);
            self.spawn_job(async move {
                if let Some(tickets) = &job.tickets {
                    tickets.run(&job.table, &job.retry, &job.stop).await;
                }
            });
        }
    }

    /// Whether releases elsewhere wake this Locker's waiters right now.
    pub(crate) fn listening(&self) -> bool {
        self.inner.wakeups.live()
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
        let mut task = self.inner.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.is_some() || self.inner.stop.is_cancelled() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no tokio runtime: leases will not be renewed");
            return;
        };
        *task = Some(runtime.spawn(Arc::clone(&self.inner).run()));
        self.inner.started.store(true, Ordering::Release);
    }

    /// Stops renewing `lease`, waits for a batch in flight that includes it, then deletes
    /// the row if it is still ours (retrying while another session is in the way, until
    /// the lease's deadline). `Some(expired)` when our row was deleted, saying whether its
    /// lease had run out by the database clock; `None` when it was not ours any more.
    pub(crate) async fn release(&self, lease: &Lease) -> Result<Option<bool>, sqlx::Error> {
        self.inner.release(lease).await
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
            if !state.stopped && !self.inner.stop.is_cancelled() {
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

    /// Sets the lease to end `length` from now (database clock) if the row is still ours
    /// and unexpired; the new expiry.
    pub(crate) async fn extend(
        &self,
        lease: &Lease,
        length: Duration,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let sent_at = Instant::now();
        let expiry = self.inner.table.extend(lease.lock_id(), length).await?;
        if let Some(expires_at) = expiry {
            metrics::renewals(&self.inner.metrics, 1);
            let due = lease.renewed(expires_at, sent_at, length);
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

    /// Runs `job` in the background, owned by the engine: stopping the engine waits for it.
    pub(crate) fn spawn_job(&self, job: impl Future<Output = ()> + Send + 'static) {
        self.inner.spawn_job(job);
    }

    /// Stops renewal and waits until the engine's task and its background work are done.
    pub(crate) async fn shutdown(&self) {
        self.inner.stop.cancel();
        let task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match task {
            Some(task) => {
                task.await.ok();
            }
            None => self.inner.finish().await,
        }
    }
}

impl<DB: Backend> Drop for Engine<DB> {
    fn drop(&mut self) {
        self.inner.stop.cancel();
    }
}

/// Stops renewal when the engine's task ends, however it ends.
struct StopRenewing<'a, DB: Backend>(&'a Inner<DB>);

impl<DB: Backend> Drop for StopRenewing<'_, DB> {
    fn drop(&mut self) {
        // Leases still waiting for a batch lapse at their deadlines (no task to send it).
        drop(self.0.stop_renewing());
    }
}

/// The engine's delays between failed renewal batches (reset after a success).
type Backoff = Box<dyn Iterator<Item = Duration> + Send>;

/// How one lease came out of a batch.
enum Verdict {
    Renewed(DateTime<Utc>),
    Lost(LostReason),
}

impl<DB: Backend> Inner<DB> {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// See [`Engine::spawn_job`].
    fn spawn_job(&self, job: impl Future<Output = ()> + Send + 'static) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.jobs.track_future(job));
            }
            Err(_) => {
                tracing::warn!("no tokio runtime: background lock work dropped; leases will expire")
            }
        }
    }

    /// Releases one lease in a background job of its own (outside the batches), retrying
    /// failures until its deadline.
    fn release_alone(self: Arc<Self>, lease: Arc<Lease>) {
        let inner = Arc::clone(&self);
        self.spawn_job(async move {
            let (engine, held) = (&*inner, &*lease);
            let deadline = held.deadline();
            let released = retry(&engine.retry, deadline, |_| async move {
                by(deadline, engine.release(held))
                    .await
                    .map_err(Retry::Again)
            })
            .await;
            if let Err(err) = released {
                tracing::warn!(key = %lease.key, owner = %lease.owner, error = %err, "background release failed; the lease will expire");
            }
        });
    }

    async fn run(self: Arc<Self>) {
        // However the task ends (stopped, panicked, or dropped with its runtime), its
        // leases stop counting on it: they lapse at their deadlines and say so, and no
        // release waits for a pass that will never come.
        let _stopped = StopRenewing(&self);
        let mut backoff: Backoff = Box::new(self.retry.delays());
        let mut release_backoff: Backoff = Box::new(self.retry.delays());
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
                _ = self.stop.cancelled() => break,
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
        self.finish().await;
    }

    /// Ends renewal of every lease (they lapse at their deadlines) and waits for the
    /// background jobs.
    async fn finish(self: &Arc<Self>) {
        // Leases given up while the task was stopping (or with no task at all) go one
        // by one, as jobs this waits for.
        for lease in self.stop_renewing() {
            Arc::clone(self).release_alone(lease);
        }
        self.jobs.close();
        self.jobs.wait().await;
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

    /// One renewal pass over every lease that is due.
    async fn pass(&self, backoff: &mut Backoff) {
        let now = Instant::now();
        let mut lapsed = Vec::new();
        let mut batch = Vec::new();
        let pass = {
            let mut state = self.state();
            state.pass += 1;
            let pass = state.pass;
            state.leases.retain(|_, lease| {
                let mut timing = lease.timing();
                if now >= timing.deadline {
                    lapsed.push((Arc::clone(lease), timing.failing));
                    return false;
                }
                let interval = lease.interval.unwrap_or(Duration::ZERO);
                if timing.next_renewal <= now + interval / 2 {
                    timing.in_pass = pass;
                    batch.push(Arc::clone(lease));
                }
                true
            });
            pass
        };
        for (lease, failing) in lapsed {
            let reason = if failing {
                self.unreachable()
            } else {
                LostReason::Expired
            };
            lease.mark_lost(reason);
            lease.set_renewing(false);
        }
        if !batch.is_empty() {
            self.renew(&batch, backoff).await;
        }
        self.passes_done.send_replace(pass);
    }

    async fn renew(&self, batch: &[Arc<Lease>], backoff: &mut Backoff) {
        let sent_at = Instant::now();
        let outcome = self.renew_by_deadlines(batch).await;
        let rows = match outcome {
            Ok(rows) => rows,
            Err(err) => {
                Counters::bump(&self.counters.renewal_errors);
                tracing::debug!(table = %self.table.name(), leases = batch.len(), error = %err, "renewal failed; retrying until each lease's deadline");
                let retry_at = Instant::now() + backoff.next().unwrap_or_default();
                for lease in batch {
                    let mut timing = lease.timing();
                    timing.failing = true;
                    timing.next_renewal = retry_at;
                }
                self.forget_lost(batch);
                return;
            }
        };
        *backoff = Box::new(self.retry.delays());
        let mut lost = Vec::new();
        let mut unsure = Vec::new();
        let mut renewed = 0;
        let by_key = index_by_key(&rows);
        for lease in batch {
            if lease.lost_reason().is_some() {
                // Declared lost at its deadline while the statement was in flight.
                lost.push(lease.id);
                continue;
            }
            match judge(lease, by_key.get(lease.key.as_str()).map(Vec::as_slice)) {
                // Ours but not renewed, before the earliest moment the database may
                // consider it over: not an expiry, so the row changed under the
                // statement (PostgreSQL's read of the batch sees the rows as they were
                // when it began, a concurrent DELETE after). Ask once more, below.
                Verdict::Lost(LostReason::Expired) if Instant::now() < lease.deadline() => {
                    unsure.push(Arc::clone(lease));
                }
                verdict => renewed += self.apply(lease, verdict, sent_at, &mut lost),
            }
        }
        if !unsure.is_empty() {
            let sent_at = Instant::now();
            match self.renew_by_deadlines(&unsure).await {
                Ok(rows) => {
                    let by_key = index_by_key(&rows);
                    for lease in &unsure {
                        let rows = by_key.get(lease.key.as_str()).map(Vec::as_slice);
                        renewed += self.apply(lease, judge(lease, rows), sent_at, &mut lost);
                    }
                }
                // Left to the next pass, as after any failed batch.
                Err(_) => {
                    Counters::bump(&self.counters.renewal_errors);
                    let retry_at = Instant::now() + backoff.next().unwrap_or_default();
                    for lease in &unsure {
                        let mut timing = lease.timing();
                        timing.failing = true;
                        timing.next_renewal = retry_at;
                    }
                }
            }
        }
        metrics::renewals(&self.metrics, renewed);
        if !lost.is_empty() {
            let mut state = self.state();
            for id in lost {
                if let Some(lease) = state.leases.remove(&id) {
                    lease.set_renewing(false);
                }
            }
        }
    }

    /// Records what a batch said about one lease; a lost one goes on `lost`. How many
    /// leases it renewed (0 or 1).
    fn apply(&self, lease: &Lease, verdict: Verdict, sent_at: Instant, lost: &mut Vec<u64>) -> u64 {
        match verdict {
            Verdict::Renewed(expires_at) => {
                lease.renewed(expires_at, sent_at, lease.length);
                Counters::bump(&self.counters.renewed);
                tracing::trace!(key = %lease.key, owner = %lease.owner, fencing_token = lease.fencing_token, %expires_at, "lease renewed");
                1
            }
            Verdict::Lost(reason) => {
                lease.mark_lost(reason);
                lost.push(lease.id);
                // The key may be free (or someone else's): a local waiter looks.
                self.queues.released(&lease.key);
                0
            }
        }
    }

    /// Why a lease whose renewal kept failing until its deadline is lost: the database
    /// gave no answer, or answered by refusing the engine its connection.
    fn unreachable(&self) -> LostReason {
        if self.table.engine_connection_refused() {
            LostReason::NoConnection
        } else {
            LostReason::Unreachable
        }
    }

    /// Stops renewing the leases of `batch` that were declared lost.
    fn forget_lost(&self, batch: &[Arc<Lease>]) {
        let mut state = self.state();
        for lease in batch.iter().filter(|lease| lease.lost_reason().is_some()) {
            if state.leases.remove(&lease.id).is_some() {
                lease.set_renewing(false);
            }
        }
    }

    /// Sends the batch and waits for its answer, but no lease waits past its own
    /// deadline: past it an answer is worthless for that lease (the database may
    /// consider it over), so it is declared `Unreachable` then, while the statement goes
    /// on for the others. A statement still unanswered when the last lease of its batch
    /// reaches its deadline is abandoned (a black-holed connection never fails by itself).
    async fn renew_by_deadlines(&self, batch: &[Arc<Lease>]) -> Result<Vec<RowState>, sqlx::Error> {
        let renewals: Vec<Renewal<'_>> = batch
            .iter()
            .map(|lease| Renewal {
                id: lease.lock_id(),
                lease_micros: micros(lease.length),
            })
            .collect();
        Counters::bump(&self.counters.renewals);
        let mut deadlines: Vec<(Instant, &Arc<Lease>)> = batch
            .iter()
            .map(|lease| (lease.deadline(), lease))
            .collect();
        deadlines.sort_by_key(|(deadline, _)| *deadline);
        let mut pending = deadlines.as_slice();
        let statement = self.table.renew(&renewals);
        tokio::pin!(statement);
        while let Some(&(deadline, _)) = pending.first() {
            tokio::select! {
                outcome = &mut statement => return outcome,
                _ = sleep_until(deadline) => {}
            }
            let now = Instant::now();
            let lapsed = pending.partition_point(|(deadline, _)| *deadline <= now);
            for (_, lease) in &pending[..lapsed] {
                lease.mark_lost(self.unreachable());
            }
            pending = &pending[lapsed..];
        }
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer before the last lease deadline of the batch",
        )))
    }

    async fn release(&self, lease: &Lease) -> Result<Option<bool>, sqlx::Error> {
        let in_pass = {
            let mut state = self.state();
            state.leases.remove(&lease.id);
            let mut timing = lease.timing();
            timing.renewing = false;
            timing.ended = true;
            timing.in_pass
        };
        // A batch that includes this lease may be in flight: let it land first, so that
        // no renewal of ours reaches the database after the DELETE.
        // (Boxed, as the minimum hold's statement below: rare, and held inline they
        // would grow every release's future, which is copied on each move.)
        if in_pass > *self.passes_done.borrow() {
            let mut done = self.passes_done.subscribe();
            Box::pin(done.wait_for(|done| *done >= in_pass)).await.ok();
        }
        let outcome = retry(&self.retry, lease.deadline(), |_| async {
            match self.release_once(lease).await {
                // Busy (SQLite) or a lock wait: nothing was deleted, and the owner- and
                // token-checked DELETE is safe to repeat while the lease lasts.
                Err(err) if LockTable::<DB>::contention(&err) == Contention::LostRace => {
                    Err(Retry::Again(err))
                }
                outcome => outcome.map_err(Retry::Stop),
            }
        })
        .await;
        let kept = matches!(outcome, Ok((_, true)));
        // Held no more by this process: also when the DELETE failed (a background release
        // only repeats it), and when the row is kept for a job's minimum hold (nobody
        // works under it, it waits out its time). Before the next local waiter is woken
        // below, so that the held gauge never counts this lease and the waiter's at once.
        lease.end_hold();
        // The next local waiter tries at once rather than at the end of its backoff
        // (also when the DELETE failed: the lease may have ended anyway). A row kept for
        // a minimum hold is still held: the waiters sleep until its lease ends.
        if !kept {
            self.queues.released(&lease.key);
        }
        let (deleted, _) = outcome?;
        self.settle(lease, deleted, kept);
        Ok(deleted)
    }

    /// Records what a release found, once its statement answered: `deleted` is
    /// `Some(expired)` when our row went, `None` when it was not ours any more; `kept`
    /// when the row stays for a job's minimum hold.
    fn settle(&self, lease: &Lease, deleted: Option<bool>, kept: bool) {
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
    async fn release_due(&self, backoff: &mut Backoff) -> bool {
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
            tracing::warn!(key = %lease.key, owner = %lease.owner, "background release failed until the lease's deadline; the row will expire");
            lease.end_hold();
            self.queues.released(&lease.key);
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
        match by(bound, self.table.release_batch(&ids)).await {
            Ok(rows) => {
                *backoff = Box::new(self.retry.delays());
                let released: HashMap<(&str, i64), bool> = rows
                    .iter()
                    .map(|row| ((row.key.as_str(), row.fencing_token), row.expired))
                    .collect();
                for lease in &batch {
                    lease.end_hold();
                    self.queues.released(&lease.key);
                    let deleted = released.get(&(lease.key.as_str(), lease.fencing_token));
                    self.settle(lease, deleted.copied(), false);
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
    /// hold that has not passed yet, the UPDATE that lets the row end then (`true` in
    /// the answer's second half; the row counts as released, not expired).
    async fn release_once(&self, lease: &Lease) -> Result<(Option<bool>, bool), sqlx::Error> {
        if let Some(min_hold) = lease.min_hold()
            && Box::pin(self.table.keep_min_hold(lease.lock_id(), min_hold)).await?
        {
            return Ok((Some(false), true));
        }
        Ok((self.table.release(lease.lock_id()).await?, false))
    }
}

/// The rows of a batch by key (MySQL's read-back may list a key once per lease asking).
fn index_by_key(rows: &[RowState]) -> HashMap<&str, Vec<&RowState>> {
    let mut by_key: HashMap<&str, Vec<&RowState>> = HashMap::with_capacity(rows.len());
    for row in rows {
        by_key.entry(row.key.as_str()).or_default().push(row);
    }
    by_key
}

/// Whether the batch renewed `lease`, and if not, why it is lost.
fn judge(lease: &Lease, rows: Option<&[&RowState]>) -> Verdict {
    let Some(rows) = rows.filter(|rows| !rows.is_empty()) else {
        return Verdict::Lost(LostReason::Deleted);
    };
    let ours = rows
        .iter()
        .filter(|row| row.owner == lease.owner && row.fencing_token == lease.fencing_token);
    let mut found = false;
    for row in ours {
        if row.renewed {
            return Verdict::Renewed(row.expires_at);
        }
        found = true;
    }
    Verdict::Lost(if found {
        LostReason::Expired
    } else if Instant::now() < lease.deadline()
        && rows
            .iter()
            .any(|row| row.fencing_token > lease.fencing_token)
    {
        // A newer acquisition's row while ours cannot have run out yet by the database
        // clock (the deadline is counted from before our statement reached it): nobody
        // could take it over, so our row was deleted (force-released, by hand) and the
        // key acquired anew.
        LostReason::Deleted
    } else {
        LostReason::TakenOver
    })
}
