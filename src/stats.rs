//! Counters a [`Locker`](crate::Locker) keeps for operators and tests.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a locker's counters (shared by its clones, guards and tasks).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// assert_eq!(locker.stats(), dblock::Stats::default()); // all zero at first
///
/// let lease = Duration::from_secs(30);
/// let guard = locker.try_acquire("invoice:42", lease).await?.unwrap();
/// assert!(locker.try_acquire("invoice:42", lease).await?.is_none()); // a lost attempt
/// guard.release().await?;
///
/// let stats = locker.stats();
/// assert_eq!((stats.attempts, stats.acquired, stats.released), (2, 1, 1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquisition statements sent (`try_acquire` calls and `acquire` retries).
    pub attempts: u64,
    /// Acquisitions won.
    pub acquired: u64,
    /// Rows released by this locker's guards (explicitly or on drop).
    pub released: u64,
    /// Release statements sent outside the engine's batches (an explicit
    /// `release().await`, a handoff, a lease released on its own in the background), each
    /// one commit whatever its number of rows: a read-write lock's write releases its two
    /// rows in one. A statement sent again while another session was in the way is not
    /// counted again. With `attempts` (one statement or transaction each, whatever its
    /// number of keys) and `release_batches`, the commits this locker's locks cost.
    pub releases: u64,
    /// Renewal batches sent by the lease engine (counted before they are sent). One batch
    /// renews every due lease of the locker, up to 10,000 of them, in one statement; on
    /// MySQL/MariaDB and SQLite a second one (a read-back) follows only when a lease of
    /// the batch was not renewed.
    pub renewals: u64,
    /// Leases renewed (rows), over all batches.
    pub renewed: u64,
    /// Renewal batches that failed and were retried.
    pub renewal_errors: u64,
    /// Batched releases sent by the lease engine: one statement deletes the rows of every
    /// guard dropped without [`release`](crate::LockGuard::release) since the last one
    /// (up to 10,000 rows a statement).
    pub release_batches: u64,
    /// Leases reported lost through [`LockGuard::lost`](crate::LockGuard::lost).
    pub lost: u64,
    /// Expired rows deleted by [`reap_expired`](crate::Locker::reap_expired) and reapers.
    pub reaped: u64,
    /// Releases that handed their row straight to the next waiter of this locker in the
    /// same statement (PostgreSQL): each is also counted in `released` and `acquired`, and
    /// the waiter sent no attempt for it.
    pub handoffs: u64,
    /// Releases in other processes (or other Lockers) that the listener heard and that
    /// woke a waiter of this locker (PostgreSQL's `NOTIFY`; SQLite on a file; MySQL/MariaDB's
    /// bells, which also carry this locker's own releases of rows another process waits
    /// for, and a wake-up when a bell can no longer be heard). On SQLite also a release
    /// through this locker that it left to a waiter of another process first.
    pub wakeups: u64,
    /// Times the release listener connected (PostgreSQL, SQLite on a file, MySQL/MariaDB):
    /// 1 once it is up, more after it lost its connection and opened it again.
    pub listener_connects: u64,
    /// Acquisitions (and handoffs) whose answer came at or after their lease's local
    /// deadline ([`LockerBuilder::lease_margin`](crate::LockerBuilder::lease_margin)): no
    /// guard was made of them, and their rows were released in the background. Each one
    /// is a sign of a slow or lossy path to the database, or of a stalled client.
    pub late_answers: u64,
    /// Lock-history events written ([`LockerBuilder::history`](crate::LockerBuilder::history)).
    pub history_events: u64,
    /// Lock-history statements sent: at most one a
    /// [`HISTORY_FLUSH_INTERVAL`](crate::HISTORY_FLUSH_INTERVAL) whatever the number of
    /// events (more at shutdown, which writes what is left). A force-release's own event
    /// ([`Locker::force_release_by`](crate::Locker::force_release_by)) is not counted.
    pub history_batches: u64,
    /// Lock-history events dropped because [`HISTORY_BUFFER`](crate::HISTORY_BUFFER)
    /// events were already waiting to be written (the database down, or events noted
    /// faster than they can be written).
    pub history_dropped: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) attempts: AtomicU64,
    pub(crate) acquired: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) renewed: AtomicU64,
    pub(crate) renewal_errors: AtomicU64,
    pub(crate) release_batches: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) reaped: AtomicU64,
    pub(crate) handoffs: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) listener_connects: AtomicU64,
    pub(crate) late_answers: AtomicU64,
    pub(crate) history_events: AtomicU64,
    pub(crate) history_batches: AtomicU64,
    pub(crate) history_dropped: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            attempts: self.attempts.load(Relaxed),
            acquired: self.acquired.load(Relaxed),
            released: self.released.load(Relaxed),
            releases: self.releases.load(Relaxed),
            renewals: self.renewals.load(Relaxed),
            renewed: self.renewed.load(Relaxed),
            renewal_errors: self.renewal_errors.load(Relaxed),
            release_batches: self.release_batches.load(Relaxed),
            lost: self.lost.load(Relaxed),
            reaped: self.reaped.load(Relaxed),
            handoffs: self.handoffs.load(Relaxed),
            wakeups: self.wakeups.load(Relaxed),
            listener_connects: self.listener_connects.load(Relaxed),
            late_answers: self.late_answers.load(Relaxed),
            history_events: self.history_events.load(Relaxed),
            history_batches: self.history_batches.load(Relaxed),
            history_dropped: self.history_dropped.load(Relaxed),
        }
    }
}
