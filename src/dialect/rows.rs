//! The values that cross the boundary between the lock-table layer and the dialects:
//! what a statement is asked (a lock's id, a batch, a list query) and what it answers
//! (rows as dblock reads them), with the column orders every dialect's queries share.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::Database;

/// What the database answered to a successful acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The fencing token written with the row.
    pub fencing_token: i64,
    /// The expiry the database computed from its own clock.
    pub expires_at: DateTime<Utc>,
    /// The statement took over another acquisition's expired row rather than writing a
    /// row for a free key (the history's `taken_over`); always `false` for a row handed
    /// over by its holder or written by a read-write lock's write in one statement.
    pub taken_over: bool,
}

/// What a release that hands its row to a waiter of the same Locker answered
/// ([`LockSql::hand_off`](super::LockSql::hand_off)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOff {
    /// The row is the waiter's now: its owner value, a new fencing token, a new expiry.
    To(Acquired),
    /// The row was deleted, as a plain release does (a waiter of another process asked to
    /// be woken by it, or the lease had run out: `expired`).
    Released {
        /// The lease had run out by the database clock.
        expired: bool,
        /// A waiter had marked the row, and the statement notified the listeners.
        notified: bool,
    },
    /// The row was not ours any more.
    NotOurs,
}

/// What a read-write lock's write in one statement answered
/// ([`LockSql::acquire_write`](super::LockSql::acquire_write)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteInOne {
    /// Both rows committed: the writer's, then the grant's.
    Won(Acquired, Acquired),
    /// A row was held by another owner: nothing written.
    Held,
    /// Both rows were free but a reader holds: nothing written.
    Read,
}

/// The row a guard holds: key, owner value and the fencing token it was written with.
/// Checking the token too means a stale guard of a reused owner value (reentrant
/// [`Owner`](crate::Owner)) can never touch a newer acquisition.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::LockId;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let guard = locker.try_acquire("invoice:42", Duration::from_secs(30)).await?.unwrap();
/// let id = LockId {
///     key: guard.key(),
///     owner: guard.owner(),
///     fencing_token: guard.fencing_token(),
/// };
/// // The row it names is the one in the table: same owner value, same token.
/// let holder = locker.holder(id.key).await?.expect("held");
/// assert_eq!((holder.owner.as_str(), holder.fencing_token), (id.owner, id.fencing_token));
/// # guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LockId<'a> {
    /// The lock key.
    pub key: &'a str,
    /// The owner value.
    pub owner: &'a str,
    /// The fencing token of this acquisition.
    pub fencing_token: i64,
}

/// One lease to renew in a batch: its row and the lease length to set.
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    /// The row, owner- and token-checked.
    pub id: LockId<'a>,
    /// The new lease, counted from the database's clock when the statement runs.
    pub lease_micros: i64,
}

/// A lock-table row as a batched renewal or an inspection saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// The key.
    pub key: String,
    /// The owner value in the row.
    pub owner: String,
    /// The fencing token in the row.
    pub fencing_token: i64,
    /// The row's expiry (the new one, when `renewed`).
    pub expires_at: DateTime<Utc>,
    /// Whether this statement renewed the row (it was the requested owner's and token's,
    /// and unexpired by the database clock).
    pub renewed: bool,
    /// The row is the requested owner's and token's and unexpired, but was not renewed:
    /// another transaction held a lock on it (a fenced transaction of the caller's, most
    /// often), and the renewal skipped it, or gave up waiting, rather than wait on. Not a
    /// loss: the lease is renewed again soon.
    pub busy: bool,
}

/// A row a batched release deleted ([`LockSql::release_batch`](super::LockSql::release_batch)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedRow {
    /// The key, free now.
    pub key: String,
    /// The row's fencing token.
    pub fencing_token: i64,
    /// Whether its lease had already run out by the database clock.
    pub expired: bool,
}

/// Who holds one key, as [`LockSql::inspect`](super::LockSql::inspect) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspected {
    /// The owner value.
    pub owner: String,
    /// The fencing token.
    pub fencing_token: i64,
    /// When the row was written by its acquisition, by the database clock.
    pub acquired_at: DateTime<Utc>,
    /// The lease's end by the database clock.
    pub expires_at: DateTime<Utc>,
    /// Whether that end has passed, by the database clock.
    pub expired: bool,
}

/// Which rows [`LockSql::list`](super::LockSql::list) reads: keys from `from` (inclusive) up to `until`
/// (exclusive; `None`: no end), compared as bytes, in that order, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct ListQuery<'a> {
    /// The smallest key listed.
    pub from: &'a str,
    /// The first key past the range.
    pub until: Option<&'a str>,
    /// Only keys after this one (exclusive): the last key of the previous page.
    pub after: Option<&'a str>,
    /// Only rows acquired at least this many microseconds ago (database clock).
    pub held_micros: Option<i64>,
    /// `Some(true)`: only rows whose lease has run out (database clock); `Some(false)`:
    /// only live ones; `None`: both.
    pub expired: Option<bool>,
    /// Most rows returned.
    pub limit: i64,
}

/// One row as [`LockSql::list`](super::LockSql::list) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The key.
    pub key: String,
    /// The row as [`LockSql::inspect`](super::LockSql::inspect) would read it.
    pub row: Inspected,
    /// The database clock when the rows were read.
    pub read_at: DateTime<Utc>,
}

/// `(key, owner, fencing token, acquired at, expiry, expired, read at)`, the column order
/// of every dialect's list query.
pub(crate) type ListedRow = (
    String,
    String,
    i64,
    DateTime<Utc>,
    DateTime<Utc>,
    bool,
    DateTime<Utc>,
);

impl From<ListedRow> for Listed {
    fn from(
        (key, owner, fencing_token, acquired_at, expires_at, expired, read_at): ListedRow,
    ) -> Self {
        Listed {
            key,
            row: Inspected {
                owner,
                fencing_token,
                acquired_at,
                expires_at,
                expired,
            },
            read_at,
        }
    }
}

/// `(key, owner, fencing token, expiry, renewed)`, the column order of the dialects'
/// renewal answers.
impl From<(String, String, i64, DateTime<Utc>, bool)> for RowState {
    fn from(
        (key, owner, fencing_token, expires_at, renewed): (
            String,
            String,
            i64,
            DateTime<Utc>,
            bool,
        ),
    ) -> Self {
        RowState {
            key,
            owner,
            fencing_token,
            expires_at,
            renewed,
            busy: false,
        }
    }
}

/// `(key, owner, fencing token, expiry)`, the column order of a renewal's answer and of
/// its read-back where a dialect renews in one statement and reads back the rest.
pub(crate) type RenewedRow = (String, String, i64, DateTime<Utc>);

/// Rows a renewal's statement returned, as [`RowState`]s: `renewed` says whether that
/// statement renewed them (the UPDATE's own rows) or only read them (the read-back).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn row_states(rows: Vec<RenewedRow>, renewed: bool) -> impl Iterator<Item = RowState> {
    rows.into_iter()
        .map(move |(key, owner, token, expires_at)| {
            RowState::from((key, owner, token, expires_at, renewed))
        })
}

/// `(key, owner, fencing token, expiry, live)`, the column order of the read-back of
/// the keys a renewal left unrenewed: `live` is the database's `expire_time > now`.
pub(crate) type ReadBackRow = (String, String, i64, DateTime<Utc>, bool);

/// The rows read back after a renewal left some leases of `batch` unrenewed, as
/// [`RowState`]s. A row still the lease's own (owner and token) and live by the database
/// clock that the renewal did not renew was locked by another transaction: `busy`.
/// Nothing else can leave such a row unrenewed, since the renewal's own conditions
/// held for it (rows of an owner and token are never written by anyone else, and an
/// expired row never becomes live again).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn read_back_states(batch: &[Renewal<'_>], rows: Vec<ReadBackRow>) -> Vec<RowState> {
    let asked: std::collections::HashSet<(&str, &str, i64)> = batch
        .iter()
        .map(|r| (r.id.key, r.id.owner, r.id.fencing_token))
        .collect();
    rows.into_iter()
        .map(|(key, owner, fencing_token, expires_at, live)| {
            let busy = live && asked.contains(&(key.as_str(), owner.as_str(), fencing_token));
            RowState {
                key,
                owner,
                fencing_token,
                expires_at,
                renewed: false,
                busy,
            }
        })
        .collect()
}

/// The keys of `batch` that the renewed `rows` leave out: the ones to read back, to say
/// why they were not renewed.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn unrenewed<'a>(batch: &[Renewal<'a>], rows: &[RowState]) -> Vec<&'a str> {
    let renewed: std::collections::HashSet<&str> =
        rows.iter().map(|row| row.key.as_str()).collect();
    batch
        .iter()
        .map(|r| r.id.key)
        .filter(|key| !renewed.contains(key))
        .collect()
}

/// `(owner, fencing token, acquired at, expiry, expired)`, the column order of every
/// dialect's inspection query.
pub(crate) type InspectedRow = (String, i64, DateTime<Utc>, DateTime<Utc>, bool);

impl From<InspectedRow> for Inspected {
    fn from((owner, fencing_token, acquired_at, expires_at, expired): InspectedRow) -> Self {
        Inspected {
            owner,
            fencing_token,
            acquired_at,
            expires_at,
            expired,
        }
    }
}

/// Where a release listener connects, and what it listens for.
pub struct ListenerOptions<DB: Database> {
    /// The connect options.
    pub options: <DB::Connection as sqlx::Connection>::Options,
    /// Whether the caller named this address for the listener (trusted to be a session
    /// of its own), rather than dblock taking the pool's, which may lead to a pooler.
    pub given: bool,
    /// The keys this Locker's waiters wait for now: a listener that has to ask about
    /// keys (it hears no notifications of the whole table) asks about these.
    pub waiting: std::sync::Arc<dyn Waiting>,
    /// The Locker's number in the marks its waiters leave
    /// ([`NotifySql::note_waiter_in`](super::NotifySql::note_waiter_in)): a listener
    /// that reads marks (SQLite) reads its own.
    pub waiter: i64,
}

/// The keys a Locker's waiters wait for, as its listener sees them: the keys of its
/// local queues (a mutex's key; a primitive's group, `<name>~`), kept by the layer
/// above, which this one cannot name.
pub trait Waiting: Send + Sync {
    /// The keys with at least one waiter now, in no particular order.
    fn keys(&self) -> Vec<String>;

    /// Completes when a waiter may have joined a queue, or a queue emptied, since the
    /// last call (it may also complete spuriously): a listener with nothing to listen for
    /// sleeps on this, and one that registers the keys it waits for looks at them again.
    fn joined(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// A listener that registers its waiters in the database (MySQL/MariaDB's wait names)
    /// says under which session it does (the server's connection id; `None`: no longer),
    /// so that this Locker's own acquisitions can tell its registration from another
    /// process's ([`Watchers::besides`]).
    fn registered_as(&self, _session: Option<u64>) {}

    /// A listener that hears the releases of some rows only (MySQL/MariaDB's bells) says
    /// that the release of any of `rows` now wakes the waiters of `queue`, and that those
    /// are all the live rows `queue` waits for; empty: it hears none of them, or not all
    /// (the waiters then keep their own pace).
    fn hearing(&self, _queue: &str, _rows: &[String]) {}

    /// A listener that looks at the table from time to time (SQLite's) has seen every
    /// commit made before `at`: waiters held back for a release committed before then
    /// (so that waiters of other Lockers, whose listeners look as often, could see it
    /// free first) may try now.
    fn looked(&self, at: tokio::time::Instant) {
        let _ = at;
    }
}

/// The sessions registered as waiting for the queue of a row that an acquisition won
/// (MySQL/MariaDB: the holders of the queue's two wait names, as server connection ids),
/// read by the acquisition's own statement. Empty where a dialect has no such registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Watchers(pub [Option<u64>; 2]);

impl Watchers {
    /// Whether a session other than `own` (this Locker's registration) waits: a waiter of
    /// another process, whom the release must wake.
    pub fn besides(&self, own: Option<u64>) -> bool {
        self.0.iter().flatten().any(|session| Some(*session) != own)
    }
}

/// A release a listener heard: the row of `key` with `fencing_token` was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The key, free now.
    pub key: String,
    /// The token of the row that went (which tells a Locker's own releases apart).
    pub fencing_token: i64,
}

/// The releases a listener hears, one at a time.
pub trait Releases: Send {
    /// The next release. `Ok(None)`: the connection was lost and has been opened again,
    /// and releases in between may have been missed. An error: the listener is broken;
    /// drop it and listen anew.
    fn next(
        &mut self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Option<Released>, sqlx::Error>> + Send + '_>>;

    /// One round trip on the listener's connection: that it still answers. The caller
    /// bounds it; a listener that does not answer is dropped and opened anew (a
    /// black-holed connection never fails by itself, and would hear nothing for as long
    /// as TCP keeps it).
    fn check(
        &mut self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + '_>>;
}
