//! Reading the lock history, and the operator's force-release that writes to it: the
//! API over `<table>_events` (see [`LockerBuilder::history`](crate::LockerBuilder::history)
//! for what is recorded, when, and what a crash can lose).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{MAX_KEY_BYTES, micros, validate_key};
use crate::dialect::{Backend, EventQuery, EventRow, NewEvent};
use crate::error::{Error, Result};
use crate::locker::Locker;
use crate::recorder::{EventKind, MAX_HISTORY_WITHIN};

/// Most events one [`Locker::history`] call returns.
pub const MAX_HISTORY_LIMIT: u32 = 10_000;

/// One event of the lock history, as [`Locker::history`] read it. Its time is the
/// database clock's.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::{EventKind, HistoryFilter, Locker};
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker = Locker::builder(pool).history(Duration::from_secs(7 * 24 * 3600)).build()?;
/// locker.migrate().await?;
/// let guard = locker.try_acquire("invoice:42", Duration::from_secs(30)).await?.unwrap();
/// guard.release().await?;
/// locker.shutdown().await; // writes what is noted (else: within a second)
///
/// let events = locker.history(&HistoryFilter::new().key("invoice:42").oldest_first()).await?;
/// let kinds: Vec<EventKind> = events.iter().map(|event| event.kind).collect();
/// assert_eq!(kinds, [EventKind::Acquired, EventKind::Released]);
/// assert_eq!(events[0].row_kind(), "mutex");
/// assert!(events[0].at <= events[1].at);
/// # Ok(()) }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockEvent {
    /// Increasing within a table, in the order events were written: for one Locker's
    /// events, the order it noted them.
    pub id: i64,
    /// The database clock's time of the event: the clock's reading when the event was
    /// written, less the event's age by the recording process's monotonic clock. Late by
    /// the write's one-way delay (a loopback network's is tens of microseconds; more on a
    /// stalled machine): two events noted a moment apart and written in two statements
    /// may swap by time; [`id`](Self::id) keeps one Locker's events in the order it noted
    /// them.
    pub at: DateTime<Utc>,
    /// What happened.
    pub kind: EventKind,
    /// The lock key (a semaphore's permit, a leader's term: their row's key).
    pub key: String,
    /// The owner value (`lock_value`, `host:pid:<random>` for dblock's owners); for a
    /// skipped job, this process's prefix (`host:pid:`).
    pub owner: String,
    /// The fencing token of the acquisition the event is about, if any.
    pub fencing_token: Option<i64>,
    /// More: a loss's reason, an operator's name, a run's duration, a period's number.
    pub detail: Option<String>,
}

impl LockEvent {
    /// What the row is, from its key, as [`LockInfo::kind`](crate::LockInfo::kind) says:
    /// `"mutex"`, `"semaphore"`, `"read"`, `"write"` or `"leader"`.
    pub fn row_kind(&self) -> &'static str {
        crate::admin::kind_of(&self.key)
    }
}

impl TryFrom<EventRow> for LockEvent {
    type Error = Error;

    fn try_from((id, at, kind, key, owner, fencing_token, detail): EventRow) -> Result<Self> {
        Ok(LockEvent {
            id,
            at,
            kind: kind.parse()?,
            key,
            owner,
            fencing_token,
            detail,
        })
    }
}

/// Which events [`Locker::history`] returns: a key or a key prefix, an owner, kinds, a
/// time range (database clock), how many, in which order.
///
/// # Default
/// Every event, newest first, at most 100.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use dblock::{EventKind, HistoryFilter};
///
/// // The last hour's losses and force-releases of the `billing:` keys, oldest first.
/// let filter = HistoryFilter::new()
///     .prefix("billing:")
///     .kinds([EventKind::Lost, EventKind::ForceReleased])
///     .within(Duration::from_secs(3600))
///     .limit(500)
///     .oldest_first();
/// # let _ = filter;
/// ```
#[derive(Debug, Clone)]
pub struct HistoryFilter {
    key: Option<String>,
    prefix: Option<String>,
    owner: Option<String>,
    kinds: Option<Vec<EventKind>>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    within: Option<Duration>,
    limit: u32,
    oldest_first: bool,
}

impl Default for HistoryFilter {
    fn default() -> Self {
        HistoryFilter {
            key: None,
            prefix: None,
            owner: None,
            kinds: None,
            since: None,
            until: None,
            within: None,
            limit: 100,
            oldest_first: false,
        }
    }
}

impl HistoryFilter {
    /// Every event, newest first, at most 100.
    pub fn new() -> Self {
        HistoryFilter::default()
    }

    /// Only events of exactly this key.
    pub fn key(mut self, exact: impl Into<String>) -> Self {
        self.key = Some(exact.into());
        self
    }

    /// Only events of keys that start with `prefix` (compared as bytes).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Only events whose owner starts with `owner`: a whole owner value, or a process's
    /// prefix (`host:pid:`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Only events of these kinds (an empty list: none).
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = EventKind>) -> Self {
        self.kinds = Some(kinds.into_iter().collect());
        self
    }

    /// Only events at or after `at` (database clock).
    pub fn since(mut self, at: DateTime<Utc>) -> Self {
        self.since = Some(at);
        self
    }

    /// Only events before `at` (database clock).
    pub fn until(mut self, at: DateTime<Utc>) -> Self {
        self.until = Some(at);
        self
    }

    /// Only events of the `last` stretch of time before the read, by the database clock
    /// (at most [`MAX_HISTORY_WITHIN`]); with [`since`](Self::since) too, both hold.
    pub fn within(mut self, last: Duration) -> Self {
        self.within = Some(last);
        self
    }

    /// At most `n` events, between 1 and [`MAX_HISTORY_LIMIT`].
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = n;
        self
    }

    /// Oldest first (by time, then id); the default is newest first.
    pub fn oldest_first(mut self) -> Self {
        self.oldest_first = true;
        self
    }

    fn validate(&self) -> Result<()> {
        if let Some(key) = &self.key {
            validate_key(key)?;
        }
        if let Some(prefix) = &self.prefix
            && (prefix.len() > MAX_KEY_BYTES || prefix.contains('\0'))
        {
            validate_key(prefix)?;
        }
        if let Some(within) = self.within {
            crate::config::validate_range("within", within, Duration::ZERO, MAX_HISTORY_WITHIN)?;
        }
        if !(1..=MAX_HISTORY_LIMIT).contains(&self.limit) {
            return Err(Error::InvalidConfig(format!(
                "history limit {} must be between 1 and {MAX_HISTORY_LIMIT}",
                self.limit
            )));
        }
        Ok(())
    }

    fn query(&self) -> EventQuery<'_> {
        EventQuery {
            key: self.key.as_deref(),
            from: self.prefix.as_deref().filter(|prefix| !prefix.is_empty()),
            until: None,
            owner: self.owner.as_deref(),
            kinds: (self.kinds.as_ref()).map(|kinds| kinds.iter().map(EventKind::as_str).collect()),
            since: self.since,
            within_micros: self.within.map(micros),
            before: self.until,
            limit: i64::from(self.limit),
            oldest_first: self.oldest_first,
        }
    }
}

impl<DB: Backend> Locker<DB> {
    /// The lock history of this Locker's table (`<table>_events`), as `filter` selects
    /// it: what every recording Locker on the table wrote (see
    /// [`LockerBuilder::history`](crate::LockerBuilder::history)), whether or not this
    /// one records. Events a Locker noted in the last
    /// [`HISTORY_FLUSH_INTERVAL`](crate::HISTORY_FLUSH_INTERVAL) may not be written yet.
    ///
    /// Errors: [`Error::InvalidKey`] for a key or prefix no key can have,
    /// [`Error::InvalidConfig`] for a limit out of range, [`Error::InvalidDuration`] for a
    /// `within` over [`MAX_HISTORY_WITHIN`] (nothing is read); [`Error::MissingTable`]
    /// before [`migrate`](Self::migrate) made the events table.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn history(&self, filter: &HistoryFilter) -> Result<Vec<LockEvent>> {
        filter.validate()?;
        if filter.kinds.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let rows = self.core.table.read_events(filter.query()).await?;
        rows.into_iter().map(LockEvent::try_from).collect()
    }

    /// Whether this Locker records the lock history
    /// ([`LockerBuilder::history`](crate::LockerBuilder::history)).
    pub fn records_history(&self) -> bool {
        self.core.history.is_some()
    }

    /// [`force_release`](Self::force_release), naming the operator: deletes the row of
    /// `key` whoever holds it (`true` if there was one) and writes a
    /// [`ForceReleased`](EventKind::ForceReleased) event at once, in a statement of its
    /// own (not batched: an operator's action must not wait for a tick, nor be lost with
    /// a batch), with the deleted row's owner and token and `operator` as its detail;
    /// whether or not this Locker records history. The `dblock` CLI passes `cli:<user>`.
    /// When the event cannot be written (a table migrated before the history existed,
    /// the database gone after the delete), the row is deleted all the same and a warning
    /// is logged.
    ///
    /// Errors: [`Error::InvalidKey`] (nothing is deleted), [`Error::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe as `force_release`; dropped after the delete, the event may not be
    /// written.
    pub async fn force_release_by(&self, key: &str, operator: &str) -> Result<bool> {
        validate_key(key)?;
        let core = &self.core;
        let Some((owner, token)) = core.table.force_release_row(key).await? else {
            return Ok(false);
        };
        tracing::warn!(
            key,
            operator,
            owner,
            table = core.table.name(),
            "lock force-released"
        );
        core.queues.released(key);
        let event = NewEvent {
            kind: EventKind::ForceReleased.as_str(),
            key,
            owner: &owner,
            fencing_token: Some(token),
            detail: Some(operator),
            age_micros: 0,
        };
        let now = tokio::time::Instant::now();
        if let Err(err) = core.table.record_events(&[(event, now)]).await {
            tracing::warn!(key, operator, table = core.table.name(), error = %err, "the lock was force-released, but the event could not be written to the history");
        }
        Ok(true)
    }
}
