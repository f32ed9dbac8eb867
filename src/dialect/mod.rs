//! The one place that knows how each database spells dblock's statements: the bottom
//! layer. Nothing here imports from the rest of the crate except the leaf modules
//! (identifiers).
//!
//! The traits, one concern and one calling convention each (every lock-table function
//! takes one connection and the table's prepared `Statements`; only the lock-table access
//! layer, `table.rs`, calls them):
//! - [`Dialect`]: the table's statements, prepared once, and what a backend is like.
//! - [`LockSql`]: the lock statements (acquire, release, extend, batched renewal and
//!   release, inspection, reaping, the fencing check).
//! - [`TicketSql`]: fair mode's ticket statements.
//! - [`NotifySql`]: waking waiters (the waiter mark, `LISTEN`).
//! - [`MigrateSql`]: migrations (scripts, the migration lock, refinery's history).
//! - [`ErrorCodes`]: reading a database's errors.
//! - [`TxSql`]: the transaction helpers' statements (row locks, versioned updates), on the
//!   caller's own connection.
//! - [`HistorySql`]: the lock history's statements (`events.rs`).
//!
//! Each is implemented for `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite`, one file
//! each; what reads the same for several of them is written once, in `shared.rs`, and
//! the values that cross the boundary are in `rows.rs`. Adding a database is one more
//! file here.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Database, Transaction};

use crate::config::Durability;

#[macro_use]
mod shared;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

mod events;
mod portable;
mod rows;

pub(crate) use events::HistorySql;
pub(crate) use events::{EventQuery, EventRow, NewEvent};

pub use portable::SqlValue;
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_imports)
)] // SQLite has no FOR UPDATE
pub(crate) use portable::{for_update, portable_ops, read_versioned, select_keys, write_versioned};
pub(crate) use rows::WriteInOne;
pub use rows::{Acquired, HandOff, LockId};
pub(crate) use rows::{
    Inspected, ListQuery, Listed, ListenerOptions, Released, ReleasedRow, Releases, Renewal,
    RowState, Waiting, Watchers,
};
#[allow(unused_imports)] // which of them a build uses depends on its backends
pub(crate) use rows::{
    InspectedRow, ListedRow, ReadBackRow, RenewedRow, read_back_states, row_states, unrenewed,
};
#[allow(unused_imports)] // which helpers a build uses depends on its backends
pub(crate) use shared::{
    audited, batch_json, db_code, ids_json, is_unique_violation, json_list, quoted_after, sql,
};

/// A gate in front of a database that lets one writer in at a time and makes the others
/// poll for it (SQLite's busy handler sleeps and retries; it keeps no queue). dblock's
/// statements pass it shared; the lease engine's pass it exclusively, which tokio's
/// `RwLock` grants ahead of every statement that arrives after the engine asked. So the
/// engine's renewal waits for at most the statements already running in this process,
/// never for an endless stream of this process's own acquisitions. One gate per database
/// file and process, shared by every Locker on it.
pub(crate) type WriteGate = std::sync::Arc<tokio::sync::RwLock<()>>;

/// How long a batched renewal ([`LockSql::renew`]) waits for a row lock that another
/// transaction holds: a fenced transaction of the caller's
/// ([`assert_held`](crate::LockGuard::assert_held)) locks its row until it ends, and one
/// whose connection went half-open does so until the server notices (hours, on default
/// settings), so a renewal that waited would lose every lease of its batch and keep
/// their rows locked on the server for as long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewWait {
    /// Not at all: a locked row is skipped and comes back `busy`, the others are renewed.
    /// SQLite has no row locks: there the database's write lock is waited for as by any
    /// writer (its busy timeout).
    Skip,
    /// At most 100 ms (per lock on PostgreSQL, `lock_timeout`; for the whole statement on
    /// MariaDB, `max_statement_time`; one second on MySQL 8, whose lock waits are whole
    /// seconds: `innodb_lock_wait_timeout`, at least 1); when that runs out the statement
    /// renews nothing and the batch's live rows come back `busy`. A row is renewed only if
    /// its lock came within the given time of the statement's start (database clock), so
    /// that no renewal lands after the lease's own deadline, when its holder has been told
    /// it is lost. For a lease that was busy: a rival's acquisition attempt locks a held
    /// row for the length of its commit, and under a stream of them a row that is skipped
    /// whenever it is locked is seldom found free (39 of 100 tries on PostgreSQL with 8
    /// clients hammering the key), while one that waits briefly gets its turn.
    Briefly(Duration),
}

/// How an error from a lock-table statement is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// The statement was rolled back as a deadlock victim: nothing changed, and the same
    /// statement may be sent again at once.
    Deadlock,
    /// Another session got in the way (duplicate key, lock wait, busy): the lock was not
    /// acquired, try again later.
    LostRace,
    /// Anything else: report it.
    Failure,
}

/// What every dialect has: the table's statements, prepared once, and how the backend
/// behaves. Sealed and hidden: dblock's internals, as are the traits below.
#[doc(hidden)]
pub trait Dialect: Database + ErrorCodes {
    /// Every lock-table statement of this dialect, with the table name spliced in once.
    type Statements: Send + Sync + 'static;

    /// After a full reaper batch the reaper pauses this many times as long as the batch
    /// took, so that reaping a backlog takes a small share of the server's time, counting
    /// work the server does for a batch after the statement returned.
    const REAP_PACE: u32 = 39;

    /// Why a lock table may not be named `schema.table` on this backend; `None` where it
    /// may (the name's other checks are the same everywhere).
    const REFUSED_QUALIFIED: Option<&'static str>;

    /// Builds the statements for a validated table name, of a table logged or not as
    /// `durability` says (only PostgreSQL has relaxed tables).
    fn statements(table: &str, durability: Durability) -> Self::Statements;

    /// The process-wide [`WriteGate`] of the database `options` open, on backends whose
    /// writers wait for one another by polling (SQLite); `None` elsewhere.
    fn write_gate(_options: &<Self::Connection as sqlx::Connection>::Options) -> Option<WriteGate> {
        None
    }

    /// Whether rows keyed `a` and `b` draw their fencing tokens from one counter, so that
    /// a token taken later for either is greater than every token taken earlier for the
    /// other. One counter per table on PostgreSQL and SQLite; MySQL has 16.
    fn shares_token_counter(_a: &str, _b: &str) -> bool {
        true
    }
}

/// The lock statements. Each takes one connection and the table's statements.
#[doc(hidden)]
pub trait LockSql: Dialect {
    /// One attempt: insert the row, or take over an expired one, in one atomic step.
    /// `Ok(None)` when a live lease of another owner is in the way. `upsert_returns`: the
    /// server takes `RETURNING` on the upsert ([`LockSql::upsert_returns`]). `wait`: the
    /// longest the statement may wait on the server for a lock (a row's, an advisory
    /// one) before it gives up, changing nothing: the attempt's deadline carried into the
    /// statement, so that it cannot commit after its caller gave up (PostgreSQL
    /// `lock_timeout`, MariaDB `max_statement_time`, set on the statement itself; SQLite
    /// has no lock to wait for, and MySQL 8 gets no server-side bound).
    fn acquire(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        upsert_returns: bool,
    ) -> impl Future<Output = Result<Option<Acquired>, sqlx::Error>> + Send;

    /// Owner- and token-checked delete. `Some(expired)` when our row was deleted, saying
    /// whether its lease had already run out by the database clock; `None` when the row
    /// was not ours (any more).
    fn release(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
    ) -> impl Future<Output = Result<Option<bool>, sqlx::Error>> + Send;

    /// [`release`](Self::release) for the lease engine, saying also whether a waiter of
    /// another Locker (not `waiter`, the releasing Locker's number) waits for the key: it
    /// marked it ([`NotifySql::note_waiter_in`]) and learns of releases only through its
    /// listener, a moment later. `Some((expired, marked))`; the releasing Locker then
    /// leaves the key to that waiter first ([`NotifySql::YIELD_FOR`]). Never marked by
    /// default: PostgreSQL's release notifies the waiter itself (see
    /// [`hand_off`](Self::hand_off)), and MySQL has no listener.
    fn release_marked(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
        waiter: i64,
    ) -> impl Future<Output = Result<Option<(bool, bool)>, sqlx::Error>> + Send {
        let _ = waiter;
        async move {
            let expired = Self::release(conn, sql, lock).await?;
            Ok(expired.map(|expired| (expired, false)))
        }
    }

    /// Whether [`hand_off`](Self::hand_off) is this dialect's (PostgreSQL): a release
    /// may then give its row to the next waiter of its Locker in one statement.
    const HANDS_OFF: bool = false;

    /// Bounds on the server's side for a connection dblock opened for itself (the lease
    /// engine's): no statement of it runs, and no transaction of it stays open, past
    /// `bound`, and the server drops it when its client stops answering (TCP user timeout
    /// and keepalives where the database has them). Best effort: the caller ignores an
    /// error (a server without one of the settings).
    fn bound_session(
        conn: &mut Self::Connection,
        bound: std::time::Duration,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (conn, bound);
        std::future::ready(Ok(()))
    }

    /// The owner- and token-checked release that gives our live row to `to_owner` (a
    /// waiter of the same Locker) in one statement, with a fencing token drawn as an
    /// acquisition draws it and an expiry `lease_micros` from now by the database clock;
    /// unless a waiter elsewhere marked the row (`NotifySql::note_waiter`) or the lease
    /// has run out: then the row is deleted as [`release`](Self::release) deletes it,
    /// waking that waiter. `Ok(None)` when the statement changed nothing (the row is not
    /// ours, or changed while the statement ran): send [`release`](Self::release) to
    /// find out. Only where [`HANDS_OFF`](Self::HANDS_OFF); elsewhere it changes nothing.
    /// `wait`: as [`acquire`](Self::acquire)'s.
    fn hand_off(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        from: LockId<'_>,
        to_owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
    ) -> impl Future<Output = Result<Option<HandOff>, sqlx::Error>> + Send {
        let _ = (conn, sql, from, to_owner, lease_micros, wait);
        std::future::ready(Ok(None))
    }

    /// Owner- and token-checked delete of every row of `batch` in one statement (or one
    /// transaction), waking waiters as a release does: the rows that were ours and went.
    /// Rows that are not ours (any more) are left alone and not reported.
    fn release_batch(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        batch: &[LockId<'_>],
    ) -> impl Future<Output = Result<Vec<ReleasedRow>, sqlx::Error>> + Send;

    /// Owner- and token-checked extension of a live lease (never an upsert: it cannot take
    /// a lock back); the new expiry, or `None` when the row is no longer ours or expired.
    fn extend(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
        lease_micros: i64,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, sqlx::Error>> + Send;

    /// Renews every lease of `batch` that is still its owner's and unexpired, each
    /// owner- and token-checked, in one statement, and more only when some lease was not
    /// renewed (to read why; on MySQL/MariaDB, to renew the rows around a locked one);
    /// returns the state of every row of the batch's keys that exists (a key without a
    /// row was deleted). A row another transaction holds a lock on is waited for as
    /// `wait` says, never longer: it comes back `busy`, and the statement holds no lock
    /// after it answered (nothing of it waits on in the server).
    fn renew(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        batch: &[Renewal<'_>],
        wait: RenewWait,
    ) -> impl Future<Output = Result<Vec<RowState>, sqlx::Error>> + Send;

    /// The database clock now (UTC), as the other statements read it.
    fn clock(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
    ) -> impl Future<Output = Result<DateTime<Utc>, sqlx::Error>> + Send;

    /// Who holds `key` now, by the database clock.
    fn inspect(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<Option<Inspected>, sqlx::Error>> + Send;

    /// Rows of the table in key order (bytes), as `query` selects them.
    fn list(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        query: ListQuery<'_>,
    ) -> impl Future<Output = Result<Vec<Listed>, sqlx::Error>> + Send;

    /// Deletes the row of `key` whoever holds it (an operator's tool), waking waiters as
    /// a release does; whether there was one.
    fn force_release(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Instead of deleting it, lets our live row end at `acquired_at + min_hold_micros`
    /// (database clock), never later than it would have: `true` when that is still ahead,
    /// `false` when it has passed or the row is not ours (then release as usual).
    fn keep_min_hold(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
        min_hold_micros: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes at most `batch` expired rows; how many went.
    fn reap_batch(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        batch: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Inside the caller's transaction (`conn` is its connection): `true` if `lock` holds
    /// an unexpired lease by the database clock, after locking that row against takeover,
    /// release and renewal until the transaction ends. `certified`: the server certifies
    /// writes across nodes at commit ([`LockSql::certifies_writes`]), so the check must
    /// write the row, not only lock it.
    fn check_fence(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        lock: LockId<'_>,
        certified: bool,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// [`check_fence`](Self::check_fence) for several locks in one statement: how many of
    /// `locks` hold an unexpired lease, each of their rows locked as `check_fence` locks it.
    fn check_fences(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        locks: &[LockId<'_>],
        certified: bool,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Whether some servers of this dialect take `RETURNING` on the acquisition's upsert
    /// and others do not (MariaDB 10.5+ and MySQL 8), so that
    /// [`LockSql::upsert_returns`] must ask.
    const MAY_RETURN_FROM_UPSERT: bool = false;

    /// Whether the server `conn` talks to takes `RETURNING` on the acquisition's upsert,
    /// so that [`LockSql::acquire`] is one statement. Asked once per lock table.
    fn upsert_returns(
        _conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        async { Ok(false) }
    }

    /// Whether this dialect's servers may be a multi-primary cluster that certifies
    /// writes at commit (MariaDB Galera), so that [`LockSql::certifies_writes`] must ask.
    const MAY_CERTIFY_WRITES: bool = false;

    /// Whether the server `conn` talks to certifies writes across nodes at commit
    /// (MariaDB Galera, `wsrep_on`): there a row lock is the node's own, and only a
    /// written row stops a rival's commit on another node. Safe inside a transaction.
    fn certifies_writes(
        _conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        async { Ok(false) }
    }

    /// A read-write lock's reader: [`acquire`](Self::acquire) of the reader's row `key`
    /// (`(key, grant)`), ordered with every transaction that holds the write grant `grant` (see
    /// [`live_member`](Self::live_member)): a reader whose statement overlaps a write's
    /// transaction commits after it, so its look for the writer's row finds it. Where the
    /// plain acquisition is ordered that way already (MySQL: readers draw their tokens
    /// from the grant's counter, whose row the grant's insert locks until its commit;
    /// SQLite: one writer at a time), it is that acquisition.
    fn acquire_read(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        (key, grant): (&str, &str),
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        upsert_returns: bool,
    ) -> impl Future<Output = Result<Option<Acquired>, sqlx::Error>> + Send {
        let _ = grant;
        Self::acquire(conn, sql, key, owner, lease_micros, wait, upsert_returns)
    }

    /// [`acquire`](Self::acquire) (or, with a `grant`, [`acquire_read`](Self::acquire_read)),
    /// also reading in the same statement who is registered as waiting for the row's
    /// queue ([`Watchers`]), where the dialect registers waiters and `watch` says to
    /// (MySQL/MariaDB outside Galera, where named locks are a node's own). Elsewhere the
    /// acquisition alone, and nobody registered.
    #[allow(clippy::too_many_arguments)] // acquire's, and the two that choose the statement
    fn acquire_watched(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        (key, grant): (&str, Option<&str>),
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
        upsert_returns: bool,
        watch: bool,
    ) -> impl Future<Output = Result<Option<(Acquired, Watchers)>, sqlx::Error>> + Send {
        let _ = watch;
        async move {
            let won = match grant {
                Some(grant) => {
                    let keys = (key, grant);
                    Self::acquire_read(conn, sql, keys, owner, lease_micros, wait, upsert_returns)
                        .await?
                }
                None => {
                    Self::acquire(conn, sql, key, owner, lease_micros, wait, upsert_returns).await?
                }
            };
            Ok(won.map(|won| (won, Watchers::default())))
        }
    }

    /// Owner- and token-checked delete of a write's two rows (in key order) in one
    /// statement, waking waiters as a release does: the rows that were ours and went.
    /// `upsert_returns`: the server takes `RETURNING` ([`LockSql::upsert_returns`]).
    /// Elsewhere it is [`release_batch`](Self::release_batch).
    fn release_pair(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        pair: [LockId<'_>; 2],
        upsert_returns: bool,
    ) -> impl Future<Output = Result<Vec<ReleasedRow>, sqlx::Error>> + Send {
        let _ = upsert_returns;
        async move { Self::release_batch(conn, sql, &pair).await }
    }

    /// A read-write lock's write in one statement (one round trip, one commit), where the
    /// dialect has one (PostgreSQL: the `{table}_take_write` function, migration V5): the
    /// writer's row `keys.0` and the grant's `keys.1` both taken, or neither, and not while
    /// a live row keyed from `readers.0` up to `readers.1` (a reader's) exists; bounded by
    /// `wait` as [`acquire`](Self::acquire) is. `Ok(None)` where it has none (the function
    /// missing: a table not migrated yet), and the write takes a transaction instead
    /// ([`live_member`](Self::live_member)).
    #[allow(clippy::too_many_arguments)] // acquire's, and the rows it looks at
    fn acquire_write(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        keys: (&str, &str),
        readers: (&str, &str),
        owner: &str,
        lease_micros: i64,
        wait: std::time::Duration,
    ) -> impl Future<Output = Result<Option<WriteInOne>, sqlx::Error>> + Send {
        let _ = (conn, sql, keys, readers, owner, lease_micros, wait);
        async { Ok(None) }
    }

    /// Inside a write's transaction, after it took the writer's and the grant's rows:
    /// whether a live row keyed from `from` up to (not including) `until` exists (a
    /// reader's), read as committed now, not as of the transaction's start, so that every
    /// reader that committed before the grant's row was taken is seen.
    fn live_member(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        from: &str,
        until: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// Fair mode's ticket statements.
#[doc(hidden)]
pub trait TicketSql: Dialect {
    /// Takes a ticket for `key`, a lease of `lease_micros` in the ticket table; its
    /// number. Tickets of one key commit in the order of their numbers.
    fn take_ticket(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        lease_micros: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;

    /// Whether a live ticket for `key` numbered below `ticket` exists (`i64::MAX`: any
    /// live ticket).
    fn earlier_ticket(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        ticket: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Renews the live tickets among `tickets`; the ones renewed.
    fn renew_tickets(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        tickets: &[i64],
        lease_micros: i64,
    ) -> impl Future<Output = Result<Vec<i64>, sqlx::Error>> + Send;

    /// Deletes tickets (their waiters won or left), in one statement.
    fn drop_tickets(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        tickets: &[i64],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Deletes every expired ticket (of waiters that died); how many.
    fn purge_tickets(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}

/// Waking waiters: the mark a waiter leaves, and the listener that hears releases.
#[doc(hidden)]
pub trait NotifySql: Dialect {
    /// Whether a listener ([`NotifySql::listen`]) learns that a row a waiter marked was
    /// deleted: PostgreSQL's `NOTIFY`, SQLite's listener noticing the commit.
    const NOTIFIES: bool = false;

    /// How long a Locker whose release found the key marked by a waiter of another Locker
    /// ([`LockSql::release_marked`]) keeps its own waiters of that key from attempting,
    /// unless its listener tells them of the release sooner: time for the other Locker's
    /// listener to notice it (SQLite's polls every few milliseconds). Zero where no
    /// release reports marks.
    const YIELD_FOR: Duration = Duration::ZERO;

    /// A waiter is about to sleep: asks that the holder's release wake it (PostgreSQL
    /// marks the row, and deleting a marked row notifies) and reads how long the holder's
    /// lease has left by the database clock, in microseconds (0 once it has run out).
    /// `None` when the key has no row: it is free, try again at once.
    fn note_waiter(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

    /// Whether waiters of other processes are woken by *bells* (MySQL/MariaDB named
    /// locks): a listener registers the keys its waiters wait for, an acquisition that
    /// sees another process registered takes the row's bell ([`take_bell`](Self::take_bell))
    /// and drops it after the release ([`drop_bell`](Self::drop_bell)), and listeners
    /// blocked on that bell in the server hear the release.
    const RINGS_BELLS: bool = false;

    /// Takes the bell of the row `key` on this connection, without waiting: `true` when
    /// taken (then held until [`drop_bell`](Self::drop_bell) or the session's end),
    /// `false` when another session holds it.
    fn take_bell(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        let _ = (conn, sql, key);
        std::future::ready(Ok(false))
    }

    /// Drops a bell [`take_bell`](Self::take_bell) took on this connection: the listeners
    /// blocked on it hear the release.
    fn drop_bell(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (conn, sql, key);
        std::future::ready(Ok(()))
    }

    /// [`note_waiter`](Self::note_waiter) for a waiter of the local queue `queue` (the
    /// key, or a primitive's group, see `Waiting`) of the Locker numbered `waiter`.
    /// Where the mark is the Locker's rather than the row's (SQLite: one per queue and
    /// Locker, which tells a release that another process waits, and which its listener
    /// reads), it is left on `queue`. By default the row's mark, as `note_waiter`.
    fn note_waiter_in(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        key: &str,
        queue: &str,
        waiter: i64,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send {
        let _ = (queue, waiter);
        Self::note_waiter(conn, sql, key)
    }

    /// Whether [`waiters`](Self::waiters) counts the Lockers that wait (SQLite's marks,
    /// MySQL/MariaDB's wait names); `false`: it can only say that some waiter marked a row
    /// (PostgreSQL's `waiters` column), and says 1 for it.
    const COUNTS_WAITERS: bool = true;

    /// For each of `keys`, the Lockers other than the asking one waiting for it as the
    /// database knows them, in one statement: the keys with any, each with how many (see
    /// [`COUNTS_WAITERS`](Self::COUNTS_WAITERS)). The asking Locker's own are left out
    /// where the database can tell them: its marks' number `waiter` (SQLite), its
    /// listener's session `registration` (MySQL/MariaDB).
    fn waiters(
        conn: &mut Self::Connection,
        sql: &Self::Statements,
        keys: &[&str],
        waiter: i64,
        registration: Option<u64>,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, sqlx::Error>> + Send;

    /// Opens a connection of its own that hears the releases of `table` (PostgreSQL
    /// `LISTEN`; SQLite: a connection to the same file that notices other connections'
    /// commits and reads the Locker's marks; MySQL/MariaDB's bells, see
    /// [`RINGS_BELLS`](Self::RINGS_BELLS)). `Ok(None)` when the backend cannot (an
    /// in-memory SQLite database, MariaDB Galera), or when the connection turns out not to
    /// be a session of its own (a transaction pooler in between): then waiters poll.
    fn listen(
        _options: ListenerOptions<Self>,
        _table: &str,
    ) -> impl Future<Output = Result<Option<Box<dyn Releases>>, sqlx::Error>> + Send {
        std::future::ready(Ok(None))
    }
}

/// Migrations: the scripts, the lock that serializes runs, refinery's history, and the
/// checks around them.
#[doc(hidden)]
pub trait MigrateSql: Database {
    /// The migration files as `(refinery file name, SQL template with `{table}`)`.
    const MIGRATIONS: &'static [(&'static str, &'static str)];

    /// The steps a relaxed table ([`Durability::Relaxed`]) adds after
    /// [`MIGRATIONS`](Self::MIGRATIONS), whose `{unlogged}` becomes `UNLOGGED ` for it.
    const RELAXED_MIGRATIONS: &'static [(&'static str, &'static str)] = &[];

    /// Why `table`, if it exists, cannot be migrated for `durability`: it was made with
    /// the other one. `None` when it can (or does not exist yet).
    fn durability_mismatch(
        _conn: &mut Self::Connection,
        _table: &str,
        _durability: Durability,
    ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send {
        async { Ok(None) }
    }

    /// Every column of the lock table dblock reads or writes.
    const COLUMNS: &'static str = "lock_key, lock_value, expire_time, fencing_token, acquired_at";

    /// The tables this dialect's migrations add beside the lock table and its ticket
    /// table, as `(suffix of the lock table's name, the columns dblock uses)`.
    const MORE_TABLES: &'static [(&'static str, &'static str)] = &[];

    /// Serializes migration runs across processes, on this connection.
    fn lock_migrations(
        conn: &mut Self::Connection,
        table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Ends what [`MigrateSql::lock_migrations`] started; `commit` is false after a failure.
    fn unlock_migrations(
        conn: &mut Self::Connection,
        table: &str,
        commit: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Runs a multi-statement script as one simple query.
    fn run_script<'a>(
        conn: &'a mut Self::Connection,
        script: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Reads refinery's history rows: `(version, name, applied_on, checksum)`.
    fn history<'a>(
        conn: &'a mut Self::Connection,
        query: &'a str,
    ) -> impl Future<Output = Result<Vec<(i64, String, String, String)>, sqlx::Error>> + Send + 'a;

    /// Fails with the database's "no such column" error if the migrated `table` (or its
    /// ticket table) lacks a column dblock uses: a table of that name that existed
    /// before, of another shape.
    fn check_shape<'a>(
        conn: &'a mut Self::Connection,
        table: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;

    /// Asked on one of the pool's connections: a new connection, outside the pool (made
    /// from its `options`), that keeps the database alive when it lives only while a
    /// connection to it is open (in-memory SQLite); `None` elsewhere.
    fn keep_alive(
        _conn: &mut Self::Connection,
        _options: &<Self::Connection as sqlx::Connection>::Options,
    ) -> impl Future<Output = Result<Option<Self::Connection>, sqlx::Error>> + Send {
        std::future::ready(Ok(None))
    }

    /// On a [`MigrateSql::keep_alive`] connection, after migrating through the pool:
    /// fails with a configuration error if that connection cannot see `table`, i.e. every
    /// connection has a database of its own.
    fn check_shared(
        _conn: &mut Self::Connection,
        _table: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        std::future::ready(Ok(()))
    }
}

/// Reading a database's errors.
#[doc(hidden)]
pub trait ErrorCodes: Database {
    /// Reads an error of a lock-table statement.
    fn contention(err: &sqlx::Error) -> Contention;

    /// Whether the error says the lock table does not exist (not migrated yet).
    fn is_missing_table(err: &sqlx::Error) -> bool;

    /// The column the error says is missing, when a statement named a column the table
    /// does not have: a table of the configured name that dblock did not create.
    fn missing_column(err: &sqlx::Error) -> Option<String>;

    /// Whether the error is the mark of a connection pooler that hands one session's
    /// prepared statements to another (PgBouncer before 1.21 in transaction mode).
    fn is_pooler_mixup(_err: &sqlx::Error) -> bool {
        false
    }

    /// Whether the error means "a row (or SQLite's database) is locked by someone else".
    fn is_row_locked(err: &sqlx::Error) -> bool;

    /// Whether the server rolled the caller's transaction back because another one
    /// changed what it had read or locked: a deadlock victim, a serialization failure, a
    /// Galera certification failure or brute-force abort; on PostgreSQL also the end of a
    /// session idle in a fenced transaction until its lease could have run out (the idle
    /// timeout the fence check sets). Such an answer in a
    /// transaction fenced by [`assert_held`](crate::LockGuard::assert_held) may be a
    /// takeover of the lock (see [`LockGuard::explain`](crate::LockGuard::explain)).
    fn is_conflict_rollback(err: &sqlx::Error) -> bool {
        Self::contention(err) == Contention::Deadlock
    }
}

/// How a row lock treats rows another transaction has locked: the row-lock helper's
/// `RowLockMode`, as the dialects read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowWait {
    /// Wait until the rows are free.
    Wait,
    /// Fail at once if any row is locked.
    NoWait,
    /// Lock the free rows and leave out the others.
    SkipLocked,
    /// Wait at most this long.
    Timeout(Duration),
}

/// The transaction helpers' statements for one database: row locks and versioned
/// updates, on the caller's own connection (a transaction derefs to one) with the
/// statement text built by `portable.rs`.
#[doc(hidden)]
pub trait TxSql: Database + ErrorCodes {
    /// The bind mark of the `index`-th parameter, counting from 1: `$1` or `?`.
    fn bind_mark(index: usize) -> String;

    /// Turns the portable `SELECT .. ORDER BY key` into this database's row-locking query.
    fn row_lock_sql(select: &str, wait: RowWait) -> String;

    /// Opens the transaction a row lock runs in. SQLite overrides it: `BEGIN IMMEDIATE`.
    fn begin_row_lock(
        conn: &mut Self::Connection,
        _wait: RowWait,
    ) -> impl Future<Output = Result<Transaction<'_, Self>, sqlx::Error>> + Send {
        sqlx::Connection::begin(conn)
    }

    /// Runs the row-locking query of [`TxSql::row_lock_sql`] inside the transaction,
    /// applying the timeout where the query itself cannot carry it. By default the query
    /// carries it (MySQL's hints, SQLite's busy timeout): PostgreSQL overrides this.
    fn lock_rows<K: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &str,
        keys: &[K],
        _wait: RowWait,
    ) -> impl Future<Output = Result<Vec<K>, sqlx::Error>> + Send {
        Self::fetch_keys(conn, sql, keys)
    }

    /// Whether [`TxSql::begin_row_lock`] with `wait` changes the connection's settings,
    /// so that it must be closed afterwards rather than handed back to the pool.
    fn row_lock_changes_connection(_wait: RowWait) -> bool {
        false
    }

    /// Runs a portable key query; binds the keys in order.
    fn fetch_keys<K: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &str,
        keys: &[K],
    ) -> impl Future<Output = Result<Vec<K>, sqlx::Error>> + Send;

    /// Reads `(value, version)` of the row `key`.
    fn read_versioned<K: SqlValue<Self>, V: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &Sql,
        key: &K,
    ) -> impl Future<Output = Result<Option<(V, i64)>, sqlx::Error>> + Send;

    /// Writes `value` to the row `key` if its version is still `version`; `true` if it did.
    fn write_versioned<K: SqlValue<Self>, V: SqlValue<Self>>(
        conn: &mut Self::Connection,
        sql: &Sql,
        value: &V,
        key: &K,
        version: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// One of the three supported databases: every part of its dialect. Sealed: implemented
/// by dblock for `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite` only.
///
/// # Examples
/// Code generic over the database, written once for all three:
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::{Backend, Locker};
///
/// /// Runs the billing pass if no other node is running it; its fencing token if it ran.
/// async fn bill<DB: Backend>(locker: &Locker<DB>) -> dblock::Result<Option<i64>> {
///     let lease = Duration::from_secs(30);
///     locker
///         .try_with_lock("billing", lease, async |guard| Ok(guard.fencing_token()))
///         .await
/// }
///
/// let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let locker: Locker<dblock::Sqlite> = Locker::new(pool); // or a PgPool, a MySqlPool
/// locker.migrate().await?;
/// assert!(bill(&locker).await?.is_some());
/// # Ok(()) }
/// ```
pub trait Backend:
    LockSql + TicketSql + NotifySql + MigrateSql + ErrorCodes + TxSql + HistorySql + sealed::Sealed
{
}

impl<DB> Backend for DB where
    DB: LockSql
        + TicketSql
        + NotifySql
        + MigrateSql
        + ErrorCodes
        + TxSql
        + HistorySql
        + sealed::Sealed
{
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Statement text built at run time from a validated identifier.
pub(crate) type Sql = std::sync::Arc<str>;

/// The MySQL/MariaDB test server's pool of one connection (`DBLOCK_TEST_MYSQL_URL`), or
/// `None` (printed) when none is given: for the unit tests of this layer and the layers
/// above it.
#[cfg(all(test, feature = "mysql"))]
pub(crate) async fn test_mysql_server() -> Option<sqlx::MySqlPool> {
    let Ok(url) = std::env::var("DBLOCK_TEST_MYSQL_URL") else {
        let required = std::env::var("DBLOCK_TEST_REQUIRE").unwrap_or_default();
        assert!(
            !required.split(',').any(|name| name.trim() == "mysql"),
            "DBLOCK_TEST_REQUIRE names mysql, but DBLOCK_TEST_MYSQL_URL is not set"
        );
        eprintln!("skipped: DBLOCK_TEST_MYSQL_URL is not set");
        return None;
    };
    let options = sqlx::mysql::MySqlPoolOptions::new().max_connections(1);
    Some(
        options
            .connect(&url)
            .await
            .expect("connect to DBLOCK_TEST_MYSQL_URL"),
    )
}
