//! Renewal: one batched statement per interval for every due lease, and the verdict on
//! each lease the batch did not renew.
//!
//! The batch never waits for a row lock another transaction holds ([`RenewWait::Skip`]):
//! such a row (a caller's fenced transaction, `assert_held`, still open) comes back busy,
//! and only its lease is retried, on its own and with the retry policy's backoff, each
//! retry waiting for the lock briefly ([`RenewWait::Briefly`]: a rival's acquisition
//! attempt locks a held row for a moment, and a lease that only ever skipped would seldom
//! find it free), until the lease's deadline, where it is lost as `Unreachable`. The
//! other leases of the batch are renewed on time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::{Instant, sleep_until};

use super::{EngineState, RetryDelays};
use crate::config::micros;
use crate::dialect::{Backend, RenewWait, Renewal, RowState};
use crate::error::{Error, LostReason, Result};
use crate::lease::Lease;
use crate::metrics;
use crate::retry::timed_out;
use crate::stats::Counters;

/// How one lease came out of a batch.
enum Verdict {
    Renewed(DateTime<Utc>),
    /// Still ours and live, but another transaction held its row locked: renewed again
    /// soon.
    Busy,
    Lost(LostReason),
}

/// How long a busy lease's retry waits for its row at most (the dialects' SQL spells the
/// same bound: `lock_timeout`, `max_statement_time`).
const BUSY_WAIT: Duration = Duration::from_millis(100);

/// The leases whose row another transaction held locked at their last renewal, each with
/// its delays (the retry policy's backoff, from the first busy answer on).
pub(super) type BusyLeases = Mutex<HashMap<u64, RetryDelays>>;

impl<DB: Backend> EngineState<DB> {
    /// One renewal pass over every lease that is due.
    pub(super) async fn pass(&self, backoff: &mut RetryDelays) {
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

    /// Renews `batch`: the leases that were busy one at a time, waiting briefly for their
    /// row, and the others in one batch that waits for no row lock.
    async fn renew(&self, batch: &[Arc<Lease>], backoff: &mut RetryDelays) {
        let retries: Vec<Arc<Lease>> = {
            let busy = self.busy();
            if busy.is_empty() {
                Vec::new()
            } else {
                batch
                    .iter()
                    .filter(|lease| busy.contains_key(&lease.id))
                    .cloned()
                    .collect()
            }
        };
        if retries.is_empty() {
            return self.renew_batch(batch, RenewWait::Skip, backoff).await;
        }
        let fresh: Vec<Arc<Lease>> = batch
            .iter()
            .filter(|lease| !retries.iter().any(|busy| busy.id == lease.id))
            .cloned()
            .collect();
        if !fresh.is_empty() {
            self.renew_batch(&fresh, RenewWait::Skip, backoff).await;
        }
        // One at a time: a row that stays locked costs the wait to its own lease's
        // statement only, never to another busy lease's. The wait never reaches past the
        // lease's deadline (a lease past it is left to the next pass, which ends it).
        for lease in &retries {
            let left = lease.deadline().saturating_duration_since(Instant::now());
            let budget = left.min(BUSY_WAIT);
            if !budget.is_zero() {
                let wait = RenewWait::Briefly(budget);
                self.renew_batch(std::slice::from_ref(lease), wait, backoff)
                    .await;
            }
        }
        self.forget_gone_busy();
    }

    async fn renew_batch(&self, batch: &[Arc<Lease>], wait: RenewWait, backoff: &mut RetryDelays) {
        let sent_at = Instant::now();
        let outcome = self.renew_by_deadlines(batch, wait).await;
        let rows = match outcome {
            Ok(rows) => rows,
            Err(err) => {
                Counters::bump(&self.counters.renewal_errors);
                tracing::debug!(table = %self.table.name(), leases = batch.len(), error = %err, "renewal failed; retrying until each lease's deadline");
                let retry_at = Instant::now() + backoff.next().unwrap_or_default();
                let reason = self.unreachable();
                for lease in batch {
                    let mut timing = lease.timing();
                    timing.failing = true;
                    timing.failure = reason;
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
            match self.renew_by_deadlines(&unsure, wait).await {
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
                    let reason = self.unreachable();
                    for lease in &unsure {
                        let mut timing = lease.timing();
                        timing.failing = true;
                        timing.failure = reason;
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
                self.not_busy(lease);
                lease.renewed(expires_at, sent_at, lease.length);
                Counters::bump(&self.counters.renewed);
                tracing::trace!(key = %lease.key, owner = %lease.owner, fencing_token = lease.fencing_token, %expires_at, "lease renewed");
                1
            }
            Verdict::Busy => {
                let delay = {
                    let mut busy = self.busy();
                    let delays = busy
                        .entry(lease.id)
                        .or_insert_with(|| Box::new(self.retry.delays()));
                    delays.next().unwrap_or_default()
                };
                // Failing: reaching its deadline so, the lease is lost as `Unreachable`
                // (the renewal could not reach its row), not as an expiry it never had.
                let mut timing = lease.timing();
                timing.failing = true;
                timing.failure = LostReason::Unreachable;
                timing.next_renewal = Instant::now() + delay;
                drop(timing);
                tracing::debug!(key = %lease.key, owner = %lease.owner, fencing_token = lease.fencing_token, retry_in = ?delay, "lease row locked by another transaction; renewing it again soon");
                0
            }
            Verdict::Lost(reason) => {
                self.not_busy(lease);
                lease.mark_lost(reason);
                lost.push(lease.id);
                // The key may be free (or someone else's): a local waiter looks.
                self.queues.released(&lease.key);
                0
            }
        }
    }

    fn busy(&self) -> MutexGuard<'_, HashMap<u64, RetryDelays>> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the busy retries of `lease`, if it had any.
    fn not_busy(&self, lease: &Lease) {
        let mut busy = self.busy();
        if !busy.is_empty() {
            busy.remove(&lease.id);
        }
    }

    /// Forgets the busy retries of leases this engine no longer renews (lost at their
    /// deadline, released).
    fn forget_gone_busy(&self) {
        let state = self.state();
        self.busy().retain(|id, _| state.leases.contains_key(id));
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
    async fn renew_by_deadlines(
        &self,
        batch: &[Arc<Lease>],
        wait: RenewWait,
    ) -> Result<Vec<RowState>> {
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
        // In flight until this returns, however it returns (answered, failed, dropped):
        // a lease whose deadline passes meanwhile is lost as unreachable, not expired.
        let _in_flight = InFlight::mark(batch);
        let statement = self.table.renew(&renewals, wait);
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
        Err(Error::from(timed_out(
            "no answer before the last lease deadline of the batch",
        )))
    }
}

/// Marks a batch's leases as having a renewal in flight, until dropped.
struct InFlight<'b>(&'b [Arc<Lease>]);

impl<'b> InFlight<'b> {
    fn mark(batch: &'b [Arc<Lease>]) -> Self {
        for lease in batch {
            lease.timing().in_flight = true;
        }
        InFlight(batch)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        for lease in self.0 {
            lease.timing().in_flight = false;
        }
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
    let mut busy = false;
    for row in ours {
        if row.renewed {
            return Verdict::Renewed(row.expires_at);
        }
        found = true;
        busy |= row.busy;
    }
    if busy {
        return Verdict::Busy;
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
