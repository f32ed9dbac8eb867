//! The lock history's recorder (see [`LockerBuilder::history`](crate::LockerBuilder::history)):
//! the lock algorithm notes each event in memory, off the caller's path (no await, no
//! statement), and one task per Locker writes what was noted once a tick, in one
//! statement, through the lock-table access layer. Off, a Locker has no recorder: each
//! hook is one branch on `None`.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::dialect::{Backend, NewEvent};
use crate::error::{Error, Result};
use crate::jobs::Jobs;
use crate::stats::Counters;
use crate::table::LockTable;

/// How often a recording Locker writes the events it noted: one statement a tick at
/// most, whatever their number (up to [`HISTORY_BATCH`]).
pub const HISTORY_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Most events one history statement writes: about 250 bytes an event at most, so a
/// batch stays well inside MySQL's default 16 MB packet. More events wait for the next
/// tick.
pub const HISTORY_BATCH: usize = 10_000;

/// Most events a Locker keeps in memory while they wait to be written (the database
/// down, or events noted faster than [`HISTORY_BATCH`] a tick): past it new events are
/// dropped and counted in [`Stats::history_dropped`](crate::Stats::history_dropped), so a
/// dead database cannot grow the process's memory without bound.
pub const HISTORY_BUFFER: usize = 100_000;

/// The longest [`HistoryFilter::within`](crate::HistoryFilter::within) and history
/// retention ([`LockerBuilder::history`](crate::LockerBuilder::history)): as
/// [`MAX_HELD_LONGER_THAN`](crate::MAX_HELD_LONGER_THAN), a thousand years.
pub const MAX_HISTORY_WITHIN: Duration = Duration::from_secs(1000 * 366 * 24 * 3600);

/// What happened to a lock, as the history records it ([`LockEvent::kind`](crate::LockEvent::kind)).
///
/// A leader's term and a semaphore's permit are not kinds of their own: an `Acquired`,
/// `TakenOver`, `Released` or `Lost` of a `<name>~leader` key is a term, of a `<name>~permit-<i>-of-<n>`
/// key a permit ([`LockEvent::row_kind`](crate::LockEvent::row_kind) tells them apart).
///
/// # Examples
/// ```
/// use dblock::EventKind;
///
/// assert_eq!(EventKind::Lost.as_str(), "lost");
/// assert_eq!("force_released".parse::<EventKind>()?, EventKind::ForceReleased);
/// assert!("stolen".parse::<EventKind>().is_err());
/// # Ok::<(), dblock::Error>(())
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A row written for a free key: a mutex key, a semaphore permit, a read or write of
    /// a read-write lock, a leader's term. A row handed over by its holder is a
    /// [`HandedOff`](Self::HandedOff); an expired row taken over, a
    /// [`TakenOver`](Self::TakenOver).
    Acquired,
    /// An acquisition (as [`Acquired`](Self::Acquired)) that took over another
    /// acquisition's expired row, as the acquiring statement itself said (no read more).
    /// No detail: the previous owner is not read. A read-write lock's write taken in one
    /// statement (PostgreSQL) records `Acquired` for its rows either way.
    TakenOver,
    /// Released by its holder (a guard's release or drop, the end of `with_lock`). When
    /// the release handed the row to the next waiter, a [`HandedOff`](Self::HandedOff)
    /// event follows it.
    Released,
    /// Given to the next waiter of the releasing Locker in the release's own statement
    /// (PostgreSQL): the new owner and token, the previous owner as the detail.
    HandedOff,
    /// The holder lost its lease; the detail is the [`LostReason`](crate::LostReason)'s text.
    Lost,
    /// An operator deleted the row ([`Locker::force_release_by`](crate::Locker::force_release_by));
    /// the owner and token are the deleted row's, the detail the operator's name.
    ForceReleased,
    /// A [`Job`](crate::Job) ran; the detail is how long its work took.
    JobRan,
    /// A job (or a schedule's period) was skipped: another owner held it. The owner is
    /// this process's (`host:pid:`).
    JobSkipped,
    /// A schedule's run lasted past its period's end.
    JobOverran,
    /// A schedule claimed a period and runs it; the detail is the period's number.
    Period,
}

impl EventKind {
    /// Every kind, in declaration order.
    pub const ALL: [EventKind; 10] = [
        EventKind::Acquired,
        EventKind::TakenOver,
        EventKind::Released,
        EventKind::HandedOff,
        EventKind::Lost,
        EventKind::ForceReleased,
        EventKind::JobRan,
        EventKind::JobSkipped,
        EventKind::JobOverran,
        EventKind::Period,
    ];

    /// An acquisition's kind: [`TakenOver`](Self::TakenOver) when it took over an
    /// expired row, else [`Acquired`](Self::Acquired).
    pub(crate) fn acquisition(taken_over: bool) -> EventKind {
        if taken_over {
            EventKind::TakenOver
        } else {
            EventKind::Acquired
        }
    }

    /// The kind as stored in the `kind` column: `"acquired"`, `"taken_over"`,
    /// `"released"`, `"handed_off"`, `"lost"`, `"force_released"`, `"job_ran"`,
    /// `"job_skipped"`, `"job_overran"`, `"period"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::Acquired => "acquired",
            EventKind::TakenOver => "taken_over",
            EventKind::Released => "released",
            EventKind::HandedOff => "handed_off",
            EventKind::Lost => "lost",
            EventKind::ForceReleased => "force_released",
            EventKind::JobRan => "job_ran",
            EventKind::JobSkipped => "job_skipped",
            EventKind::JobOverran => "job_overran",
            EventKind::Period => "period",
        }
    }
}

impl Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EventKind {
    type Err = Error;

    /// The kind [`as_str`](Self::as_str) spells `text`; [`Error::InvalidConfig`] for any
    /// other text.
    fn from_str(text: &str) -> Result<Self> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                Error::InvalidConfig(format!(
                    "unknown event kind {text:?}: one of {}",
                    known.join(", ")
                ))
            })
    }
}

/// One event noted and not written yet.
struct Pending {
    /// When it was noted (monotonic): the statement turns it into the database's time.
    at: Instant,
    kind: EventKind,
    key: String,
    owner: String,
    fencing_token: Option<i64>,
    detail: Option<String>,
}

/// A recording Locker's noted events (shared by its clones, guards and tasks).
pub(crate) struct Recorder {
    pending: Mutex<Vec<Pending>>,
    counters: Arc<Counters>,
    /// How long the reaper keeps events.
    pub(crate) retention: Duration,
    /// Whether the last write failed (its warning said so; the next success says so too).
    failing: AtomicBool,
}

/// The hooks' one line: records when the Locker records, and costs one branch when not.
pub(crate) trait Record {
    /// Notes an event without a detail.
    fn record(&self, kind: EventKind, key: &str, owner: &str, fencing_token: Option<i64>);
    /// Now, when recording (for [`record_at`](Self::record_at)); `None` (and no clock
    /// read) when not.
    fn now(&self) -> Option<Instant>;
    /// Notes an event that happened at `at` (when its statement answered, before what
    /// followed it: a release's waking of the next waiter, whose own events come later).
    fn record_at(
        &self,
        at: Option<Instant>,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
    );
    /// [`record_at`](Self::record_at) with a detail (formatted only when recording).
    fn record_detail_at(
        &self,
        at: Option<Instant>,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
        detail: impl Display,
    );
    /// Notes an event with a detail (formatted only when recording).
    fn record_detail(
        &self,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
        detail: impl Display,
    );
}

impl Record for Option<Arc<Recorder>> {
    #[inline]
    fn record(&self, kind: EventKind, key: &str, owner: &str, fencing_token: Option<i64>) {
        if let Some(recorder) = self {
            recorder.note(Instant::now(), kind, key, owner, fencing_token, None);
        }
    }

    #[inline]
    fn now(&self) -> Option<Instant> {
        self.as_ref().map(|_| Instant::now())
    }

    #[inline]
    fn record_at(
        &self,
        at: Option<Instant>,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
    ) {
        if let (Some(recorder), Some(at)) = (self, at) {
            recorder.note(at, kind, key, owner, fencing_token, None);
        }
    }

    #[inline]
    fn record_detail_at(
        &self,
        at: Option<Instant>,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
        detail: impl Display,
    ) {
        if let (Some(recorder), Some(at)) = (self, at) {
            let detail = Some(detail.to_string());
            recorder.note(at, kind, key, owner, fencing_token, detail);
        }
    }

    #[inline]
    fn record_detail(
        &self,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
        detail: impl Display,
    ) {
        if let Some(recorder) = self {
            let detail = Some(detail.to_string());
            recorder.note(Instant::now(), kind, key, owner, fencing_token, detail);
        }
    }
}

impl Recorder {
    pub(crate) fn new(retention: Duration, counters: Arc<Counters>) -> Self {
        Recorder {
            pending: Mutex::new(Vec::new()),
            counters,
            retention,
            failing: AtomicBool::new(false),
        }
    }

    fn pending(&self) -> MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(
        &self,
        at: Instant,
        kind: EventKind,
        key: &str,
        owner: &str,
        fencing_token: Option<i64>,
        detail: Option<String>,
    ) {
        let event = Pending {
            at,
            kind,
            key: key.to_owned(),
            owner: owner.to_owned(),
            fencing_token,
            detail,
        };
        let mut pending = self.pending();
        if pending.len() >= HISTORY_BUFFER {
            drop(pending);
            Counters::bump(&self.counters.history_dropped);
            return;
        }
        pending.push(event);
    }

    /// Events noted and not written yet.
    pub(crate) fn waiting(&self) -> usize {
        self.pending().len()
    }

    /// Writes up to [`HISTORY_BATCH`] of the oldest noted events in one statement; how
    /// many. A failed write keeps them for the next one (ahead of newer events, up to
    /// [`HISTORY_BUFFER`]: the newest beyond it are dropped and counted).
    pub(crate) async fn flush<DB: Backend>(&self, table: &LockTable<DB>) -> Result<usize> {
        let batch: Vec<Pending> = {
            let mut pending = self.pending();
            let take = pending.len().min(HISTORY_BATCH);
            pending.drain(..take).collect()
        };
        if batch.is_empty() {
            return Ok(0);
        }
        let events: Vec<(NewEvent<'_>, Instant)> = batch
            .iter()
            .map(|event| {
                let new = NewEvent {
                    kind: event.kind.as_str(),
                    key: &event.key,
                    owner: &event.owner,
                    fencing_token: event.fencing_token,
                    detail: event.detail.as_deref(),
                    age_micros: 0,
                };
                (new, event.at)
            })
            .collect();
        Counters::bump(&self.counters.history_batches);
        let written = table.record_events(&events).await;
        drop(events);
        match written {
            Ok(_) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(table = %table.name(), "lock history written again");
                }
                let count = batch.len();
                let added = u64::try_from(count).unwrap_or(u64::MAX);
                self.counters
                    .history_events
                    .fetch_add(added, Ordering::Relaxed);
                Ok(count)
            }
            Err(err) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(table = %table.name(), events = batch.len(), error = %err, "could not write the lock history; kept for the next try");
                }
                let mut pending = self.pending();
                let newer = std::mem::replace(&mut *pending, batch);
                let room = HISTORY_BUFFER.saturating_sub(pending.len());
                let dropped = newer.len().saturating_sub(room);
                pending.extend(newer.into_iter().take(room));
                drop(pending);
                if dropped > 0 {
                    let dropped = u64::try_from(dropped).unwrap_or(u64::MAX);
                    self.counters
                        .history_dropped
                        .fetch_add(dropped, Ordering::Relaxed);
                }
                Err(err)
            }
        }
    }

    /// Writes every noted event now, a batch a statement, until none is left or a write
    /// fails (at shutdown).
    pub(crate) async fn flush_all<DB: Backend>(&self, table: &LockTable<DB>) {
        while self.waiting() > 0 {
            if self.flush(table).await.is_err() {
                return;
            }
        }
    }
}

/// Starts the task that writes `recorder`'s events every [`HISTORY_FLUSH_INTERVAL`] on
/// `jobs`; told to stop, it writes what is left (a batch at a time) and ends.
pub(crate) fn start_flusher<DB: Backend>(
    recorder: Arc<Recorder>,
    table: Arc<LockTable<DB>>,
    jobs: &Jobs,
) {
    let stop = jobs.clone();
    jobs.spawn(async move {
        let mut tick = tokio::time::interval(HISTORY_FLUSH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.stopping() => break,
                _ = tick.tick() => {}
            }
            // A failure was logged, and the events kept for the next tick.
            recorder.flush(&table).await.ok();
        }
        recorder.flush_all(&table).await;
    });
}

#[cfg(test)]
mod tests {
    use super::EventKind;

    #[test]
    fn every_kind_reads_back_from_its_text() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>().unwrap(), kind);
        }
        assert!("Acquired".parse::<EventKind>().is_err());
    }
}
