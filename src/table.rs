//! The lock-table access layer: [`LockTable`] is the only sender of lock-table SQL. It
//! takes a connection per operation, runs the dialect's statements on it, and repeats a
//! statement that the database rolled back as a deadlock victim. Above it sit the lock
//! algorithm (acquire, the lease engine, the reaper); below it, the dialects.
//!
//! # Two ways to the database
//! The caller's statements (acquisitions, explicit releases, reads) take a connection
//! from the application's pool. The lease engine's statements (batched renewal, batched
//! releases of dropped guards, ticket renewal and clean-up) run on the engine's own
//! connection instead, the *lane*: one connection per Locker, outside the pool, taken
//! when the engine first needs it (an idle connection of the pool, detached from it, or
//! else a new one with the pool's connect options) and opened again after it breaks. So
//! a pool kept busy by the application (or exhausted by it) delays the application's own
//! acquisitions, never the renewal of leases already held. One caller's statement uses
//! the lane too, when it is open and idle: a release that hands its row to the next
//! waiter (PostgreSQL), the hot-key path, which a pool connection makes slower (see
//! `hand_off_on_lane`).

use std::time::Duration;

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use chrono::{DateTime, Utc};

use sqlx::Pool;
use sqlx::pool::PoolConnection;
use tokio::time::Instant;

use crate::config::{Durability, RetryPolicy, micros};
use crate::dialect::{
    Acquired, Backend, Contention, HandOff, Inspected, ListQuery, Listed, ListenerOptions, LockId,
    ReleasedRow, Releases, RenewWait, Renewal, RowState, Waiting, Watchers, WriteGate, WriteInOne,
};
use crate::error::{Error, PoolTimeoutCause, Result};
use crate::retry::{Retry, retry, timed_out};

/// Most leases renewed by one batched statement. A batch travels as arrays (PostgreSQL)
/// or one JSON document (MySQL, SQLite) of about 100 bytes a lease, so 10,000 leases are
/// about 1 MB, well inside MySQL's default 16 MB packet; more leases take more chunks.
pub(crate) const RENEW_CHUNK: usize = 10_000;

/// The connect options of a backend's connections.
pub(crate) type ConnectOptions<DB> =
    <<DB as sqlx::Database>::Connection as sqlx::Connection>::Options;

/// A won row, with the sessions registered as waiting for its queue
/// ([`LockSql::acquire_watched`](crate::dialect::LockSql::acquire_watched)).
pub(crate) type WonRow = (Acquired, Watchers);

/// How an acquisition statement is sent on this table: whether the upsert takes
/// `RETURNING`, and whether it reads who waits ([`LockTable::watches_on`]).
#[derive(Clone, Copy)]
struct Sending {
    upsert_returns: bool,
    watch: bool,
}

/// The acquisition statement of each of `keys` in turn on `conn` (inside a transaction):
/// what each won, or `None` at the first key held by another owner. No statement waits
/// for a lock on the server past `until`.
async fn take_all<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &DB::Statements,
    keys: &[String],
    owner: &str,
    lease: Duration,
    until: Instant,
    sending: Sending,
) -> Result<Option<Vec<WonRow>>, sqlx::Error> {
    let Sending {
        upsert_returns,
        watch,
    } = sending;
    let mut won = Vec::with_capacity(keys.len());
    for key in keys {
        let wait = until.saturating_duration_since(Instant::now());
        let lease = micros(lease);
        let key = (key.as_str(), None);
        match DB::acquire_watched(conn, sql, key, owner, lease, wait, upsert_returns, watch).await?
        {
            Some(acquired) => won.push(acquired),
            None => return Ok(None),
        }
    }
    Ok(Some(won))
}

/// What a read-write lock's write attempt ([`LockTable::acquire_write`]) came to.
pub(crate) enum WriteTake {
    /// Both rows, the writer's and the grant's, committed.
    Won(Vec<WonRow>),
    /// A row was held by another owner, or another session got in the way: nothing kept.
    Held,
    /// Both rows were free but a reader holds: nothing kept.
    Read,
}

/// Ends an attempt's transaction, whatever happened: committed when `keep` says what it
/// took is to stay, rolled back otherwise. A transaction only dropped is rolled back when
/// its connection is next used, and until then (idle in the pool) it keeps the row locks
/// it took, which every other acquisition of those keys waits for.
async fn end_transaction<DB: Backend, T>(
    tx: sqlx::Transaction<'_, DB>,
    taken: Result<T, sqlx::Error>,
    keep: impl FnOnce(&T) -> bool,
) -> Result<T, sqlx::Error> {
    match taken {
        Ok(taken) if keep(&taken) => {
            tx.commit().await?;
            Ok(taken)
        }
        Ok(refused) => {
            tx.rollback().await?;
            Ok(refused)
        }
        Err(err) => {
            tx.rollback().await.ok();
            Err(err)
        }
    }
}

/// An acquisition attempt's bound on this side: its deadline, but at least `LEAST_TRY`
/// from now (a lease of a few milliseconds could not even be checked out for); the
/// server's wait is bounded by the deadline itself.
fn attempt_bound(until: Instant) -> Instant {
    until.max(Instant::now() + LEAST_TRY)
}

/// How many times a statement rolled back as a deadlock victim is sent again.
const DEADLOCK_RETRIES: u32 = 10;

/// One lock table on one pool, with its statements prepared once.
pub(crate) struct LockTable<DB: Backend> {
    pool: Pool<DB>,
    sql: DB::Statements,
    name: String,
    retry: RetryPolicy,
    /// Whether the table is logged (PostgreSQL `UNLOGGED` when relaxed).
    durability: Durability,
    /// A connection outside the pool that keeps an in-memory database alive.
    keep_alive: tokio::sync::Mutex<Option<DB::Connection>>,
    /// The lease engine's own connection (see the module docs).
    lane: Lane<DB>,
    /// SQLite: the database's write gate in this process (see [`WriteGate`]).
    gate: Option<WriteGate>,
    /// This table's (its Locker's) number in the marks its waiters leave, random
    /// ([`NotifySql::note_waiter_in`]).
    waiter: i64,
    /// Whether the server certifies writes across nodes (MariaDB Galera): asked once, at
    /// the first fence check or fair-mode start.
    certified: tokio::sync::OnceCell<bool>,
    /// Whether the acquisition's upsert is sent with `RETURNING` (MariaDB 10.5+ outside
    /// Galera; not MySQL 8): asked once, at the first acquisition.
    upsert_returns: tokio::sync::OnceCell<bool>,
    /// The bound on statements that no lease or wait bounds (see
    /// [`DEFAULT_STATEMENT_TIMEOUT`](crate::config::DEFAULT_STATEMENT_TIMEOUT)).
    statement_timeout: Duration,
    /// This table's pool checkouts under way that found a connection to take or room to
    /// open one: while one of them lasts, a checkout that times out was kept waiting by
    /// connections that did not answer, not by connections in use (see
    /// [`PoolTimeoutCause`]).
    testing: AtomicU32,
    /// Whether a read-write lock's write may be tried in one statement
    /// ([`LockSql::acquire_write`](crate::dialect::LockSql::acquire_write)): cleared when
    /// the dialect has none or the table lacks it (not migrated to PostgreSQL's V5), set
    /// again by [`migrate`](Self::migrate).
    writes_in_one: AtomicBool,
}

/// A pooled connection a statement runs on. Dropped before its statement answered (the
/// statement was abandoned at its deadline), it is detached from the pool and closed
/// rather than handed back: sqlx would ping it before putting it back, with no bound,
/// keeping a pool slot for as long as a black-holed network lets that ping hang (TCP
/// gives up after about 15 minutes), and a connection whose statement may still run on
/// the server is no connection to hand to the next caller anyway. The pool opens a
/// replacement when it needs one.
pub(crate) struct Checkout<DB: Backend> {
    conn: Option<PoolConnection<DB>>,
    answered: bool,
}

impl<DB: Backend> Checkout<DB> {
    /// Marks the statement answered (the connection goes back to the pool when
    /// dropped), passing its outcome through.
    fn answered<T>(&mut self, outcome: T) -> T {
        self.answered = true;
        outcome
    }
}

impl<DB: Backend> Deref for Checkout<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn
            .as_ref()
            .expect("a checkout holds its connection until dropped")
    }
}

impl<DB: Backend> DerefMut for Checkout<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn
            .as_mut()
            .expect("a checkout holds its connection until dropped")
    }
}

impl<DB: Backend> Drop for Checkout<DB> {
    fn drop(&mut self) {
        if !self.answered
            && let Some(conn) = self.conn.take()
        {
            // Closes the socket, no round trip: the link may be dead.
            drop(conn.detach());
        }
    }
}

/// `|conn| call` as a pool statement for [`LockTable::run`]: `conn` is the checked-out
/// connection (`&mut DB::Connection`), marked answered once `call` answered.
macro_rules! pooled {
    (|$conn:ident| $call:expr) => {
        |mut checkout: Checkout<DB>| async move {
            let $conn = &mut *checkout;
            let outcome = $call.await;
            checkout.answered(outcome)
        }
    };
}

/// Counts a checkout in [`LockTable::testing`] while it lives.
struct Testing<'a>(&'a AtomicU32);

impl<'a> Testing<'a> {
    fn new(count: &'a AtomicU32) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Testing(count)
    }
}

impl Drop for Testing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The payload of the I/O error a checkout that timed out is reported as, so that
/// [`LockTable::error_from`] can say why.
/// `open`: the pool's open connections when the checkout started (a connection that did
/// not answer is closed when the checkout gives up, so the count after says less).
#[derive(Debug)]
struct PoolWait {
    cause: PoolTimeoutCause,
    open: u32,
}

impl std::fmt::Display for PoolWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no pooled connection in time ({:?})", self.cause)
    }
}

impl std::error::Error for PoolWait {}

/// The lease engine's own connection. Its mutex is held for one statement at a time, and
/// the connection is taken out of the slot while a statement runs on it: a statement
/// abandoned half-way (its future dropped at a lease's deadline) drops the connection
/// with it, and the next statement opens a fresh one.
struct Lane<DB: Backend> {
    slot: tokio::sync::Mutex<Option<DB::Connection>>,
    /// Whether the last attempt to open it was refused by the database itself (an error
    /// answer such as "too many connections", as opposed to no answer at all).
    refused: AtomicBool,
}

/// Which connection a statement runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// One from the application's pool: the caller's own statements.
    Pool,
    /// The lease engine's own connection: background work that must not queue behind
    /// the application.
    Engine,
}

/// Runs `$call`, an expression that uses `$conn: &mut DB::Connection`, on the lane of
/// `$table`, again at once when the database rolled it back as a deadlock victim (such a
/// statement changed nothing), up to [`DEADLOCK_RETRIES`] times. Written as a macro, not a
/// generic function: the statement's future borrows the connection, which a closure
/// passed to a generic function could not express without losing the future's `Send`.
///
/// The whole (the wait for the lane, opening it, the statement) is bounded by the
/// statement timeout: a statement abandoned there drops the connection it took out of the
/// slot, and the next one opens a fresh lane.
macro_rules! on_lane {
    ($table:expr, |$conn:ident| $call:expr) => {{
        let table = $table;
        let until = Instant::now() + table.statement_timeout;
        let lane = async { on_lane_unbounded!(table, |$conn| $call) };
        tokio::time::timeout_at(until, lane)
            .await
            .unwrap_or_else(|_| Err(timed_out(NO_ANSWER)))
    }};
}

/// [`on_lane!`] without its bound in time.
macro_rules! on_lane_unbounded {
    ($table:expr, |$conn:ident| $call:expr) => {{
        let table = $table;
        let mut slot = table.lane.slot.lock().await;
        // Ahead of every statement of this process that comes after (SQLite).
        let _first = match &table.gate {
            Some(gate) => Some(gate.write().await),
            None => None,
        };
        let mut tries = 0u32;
        loop {
            tries += 1;
            let mut owned = match slot.take() {
                Some(conn) => conn,
                None => match table.open_lane().await {
                    Ok(conn) => conn,
                    Err(err) => break Err(err),
                },
            };
            let $conn = &mut owned;
            let outcome = $call.await;
            // A database's error answer leaves the connection usable; anything else
            // (I/O, protocol) may not: it is dropped, and the next statement reconnects.
            if !matches!(outcome, Err(ref err) if !matches!(err, sqlx::Error::Database(_))) {
                *slot = Some(owned);
            }
            match outcome {
                Err(err)
                    if DB::contention(&err) == Contention::Deadlock
                        && tries <= DEADLOCK_RETRIES =>
                {
                    tracing::trace!(error = %err, tries, "engine statement was a deadlock victim");
                }
                outcome => break outcome,
            }
        }
    }};
}

/// The least time a release, handoff or extension is given, even when sent at (or past)
/// its lease's deadline: a release of a lease that just ran out still deletes its row and
/// says so.
const LEAST_TRY: Duration = Duration::from_secs(1);

/// What a statement that got no answer by its bound fails with (an I/O error: retryable,
/// and for the lease engine "unreachable").
const NO_ANSWER: &str = "timed out: no answer from the database within the statement's bound";

impl<DB: Backend> LockTable<DB> {
    /// The table `name` (validated) on `pool`, logged or not as `durability` says.
    pub(crate) fn new(
        pool: Pool<DB>,
        name: String,
        retry: RetryPolicy,
        durability: Durability,
    ) -> Self {
        LockTable {
            sql: DB::statements(&name, durability),
            durability,
            gate: DB::write_gate(&pool.connect_options()),
            waiter: fastrand::i64(1..),
            pool,
            name,
            retry,
            keep_alive: tokio::sync::Mutex::new(None),
            certified: tokio::sync::OnceCell::new(),
            upsert_returns: tokio::sync::OnceCell::new(),
            statement_timeout: crate::config::DEFAULT_STATEMENT_TIMEOUT,
            testing: AtomicU32::new(0),
            writes_in_one: AtomicBool::new(true),
            lane: Lane {
                slot: tokio::sync::Mutex::new(None),
                refused: AtomicBool::new(false),
            },
        }
    }

    /// The same table with `bound` as its statement timeout.
    pub(crate) fn with_statement_timeout(mut self, bound: Duration) -> Self {
        self.statement_timeout = bound;
        self
    }

    /// The bound on statements that no lease or wait bounds.
    pub(crate) fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    /// The deadline of such a statement sent now.
    fn bounded(&self) -> Instant {
        Instant::now() + self.statement_timeout
    }

    /// Opens the lane: takes an idle connection of the pool if there is one nobody waits
    /// for (already connected, its statements maybe prepared; the pool opens a
    /// replacement when it needs one), else connects with the pool's connect options (not
    /// its `after_connect` hook).
    async fn open_lane(&self) -> Result<DB::Connection, sqlx::Error> {
        if let Some(idle) = self.pool.try_acquire() {
            self.lane.refused.store(false, Ordering::Relaxed);
            let mut conn = idle.detach();
            self.bound_lane(&mut conn).await;
            return Ok(conn);
        }
        let options = self.pool.connect_options();
        let mut opened = sqlx::ConnectOptions::connect(&*options).await;
        if let Ok(conn) = &mut opened {
            self.bound_lane(conn).await;
        }
        let refused = matches!(opened, Err(sqlx::Error::Database(_)));
        self.lane.refused.store(refused, Ordering::Relaxed);
        if let Err(err) = &opened {
            tracing::debug!(table = %self.name, error = %err, "could not open the lease engine's connection");
        }
        opened
    }

    /// Bounds the lane on the server's side ([`LockSql::bound_session`]), at the statement
    /// timeout: its statements are bounded by it on this side too, and a session left
    /// half-open by a dead network must not keep row locks for hours. Best effort.
    async fn bound_lane(&self, conn: &mut DB::Connection) {
        if let Err(err) = DB::bound_session(conn, self.statement_timeout).await {
            tracing::debug!(table = %self.name, error = %err, "could not bound the lease engine's session on the server");
        }
    }

    /// Opens the engine's connection ahead of its first statement if it is not open yet
    /// (an engine starts with its first lease, whose first renewal is due an interval
    /// later), giving up at `until`; a failure is left for that statement to meet.
    pub(crate) async fn open_engine_connection(&self, until: Instant) {
        let opening = async {
            let mut slot = self.lane.slot.lock().await;
            if slot.is_none()
                && let Ok(conn) = self.open_lane().await
            {
                *slot = Some(conn);
            }
        };
        tokio::time::timeout_at(until, opening).await.ok();
    }

    /// Whether the database refused the last attempt to open the engine's connection:
    /// the server answers, but will not give the engine a connection.
    pub(crate) fn engine_connection_refused(&self) -> bool {
        self.lane.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The error a caller of the lock table sees for a database error: a missing table,
    /// a table of another shape and a pool timeout are said so, with what to do.
    fn error_from(&self, err: sqlx::Error) -> Error {
        if let Some(column) = DB::missing_column(&err) {
            return Error::SchemaMismatch {
                table: self.name.clone(),
                column,
                source: Box::new(err),
            };
        }
        match err {
            err if DB::is_missing_table(&err) => Error::MissingTable {
                table: self.name.clone(),
                source: err,
            },
            err if DB::is_pooler_mixup(&err) => Error::PoolerMixesSessions { source: err },
            sqlx::Error::PoolTimedOut => self.pool_timeout(self.pool_wait_cause(false)),
            sqlx::Error::Io(ref io)
                if let Some(wait) = io
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<PoolWait>()) =>
            {
                let mut error = self.pool_timeout(wait.cause);
                if let Error::PoolTimeout {
                    open_connections, ..
                } = &mut error
                {
                    *open_connections = (*open_connections).max(wait.open);
                }
                error
            }
            err => Error::Database(err),
        }
    }

    fn pool_timeout(&self, cause: PoolTimeoutCause) -> Error {
        Error::PoolTimeout {
            open_connections: self.pool.size(),
            max_connections: self.pool.options().get_max_connections(),
            cause,
        }
    }

    /// Why a checkout timed out: `free` says whether the pool had an idle connection or
    /// room for a new one when it started (so it waited for a ping or a handshake, not
    /// for another caller to give one back); another such checkout of this table still
    /// under way says the same of the pool's connections.
    fn pool_wait_cause(&self, free: bool) -> PoolTimeoutCause {
        if free || self.testing.load(Ordering::Relaxed) > 0 {
            PoolTimeoutCause::Unanswered
        } else {
            PoolTimeoutCause::AllInUse
        }
    }

    /// A connection of the pool by `until`, behind the SQLite write gate's read side when
    /// there is one (held by the caller with the checkout).
    async fn checkout(
        &self,
        until: Instant,
    ) -> Result<(Checkout<DB>, Option<tokio::sync::RwLockReadGuard<'_, ()>>), sqlx::Error> {
        let max = self.pool.options().get_max_connections();
        let open = self.pool.size();
        let free = self.pool.num_idle() > 0 || open < max;
        let _testing = free.then(|| Testing::new(&self.testing));
        // Boxed: sqlx's futures are large (a checkout alone is about 8.6 KB), and each
        // layer above that holds one by value copies it on every move: unboxed, those
        // copies were most of a cycle's instructions (bench/RESULTS.md, "Figures behind
        // choices in the code").
        let checkout = Box::pin(async {
            // Behind the lease engine's statement, if it waits for the gate (SQLite).
            let gate = match &self.gate {
                Some(gate) => Some(gate.read().await),
                None => None,
            };
            self.pool.acquire().await.map(|conn| (conn, gate))
        });
        match tokio::time::timeout_at(until, checkout).await {
            Ok(Ok((conn, gate))) => Ok((
                Checkout {
                    conn: Some(conn),
                    answered: false,
                },
                gate,
            )),
            Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => {
                Err(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    PoolWait {
                        cause: self.pool_wait_cause(free),
                        open,
                    },
                )))
            }
            Ok(Err(err)) => Err(err),
        }
    }

    /// Runs one dialect call on a pooled connection through [`retry`], again on a fresh
    /// checkout when the database rolled it back as a deadlock victim (such a statement
    /// changed nothing), up to [`DEADLOCK_RETRIES`] times. Each try (checkout and
    /// statement) gives up at `until`: a statement abandoned there closes its connection
    /// (see [`Checkout`]).
    async fn run_raw<T, F>(
        &self,
        until: Instant,
        call: impl Fn(Checkout<DB>) -> F,
    ) -> Result<T, sqlx::Error>
    where
        F: Future<Output = Result<T, sqlx::Error>>,
    {
        // The count, not time, bounds deadlock retries; `until` bounds each try.
        retry(&self.retry, until, |tries| {
            // Boxed, as is the statement below (see `checkout`).
            let checkout = Box::pin(self.checkout(until));
            let call = &call;
            async move {
                let (conn, _gate) = checkout.await.map_err(Retry::Stop)?;
                let statement = tokio::time::timeout_at(until, Box::pin(call(conn)));
                let outcome = statement
                    .await
                    .unwrap_or_else(|_| Err(timed_out(NO_ANSWER)));
                match outcome {
                    Err(err)
                        if DB::contention(&err) == Contention::Deadlock
                            && tries <= DEADLOCK_RETRIES =>
                    {
                        tracing::trace!(error = %err, tries, "statement was a deadlock victim");
                        Err(Retry::Again(err))
                    }
                    outcome => outcome.map_err(Retry::Stop),
                }
            }
        })
        .await
    }

    /// [`run_raw`](Self::run_raw), its error explained.
    async fn run<T, F>(&self, until: Instant, call: impl Fn(Checkout<DB>) -> F) -> Result<T>
    where
        F: Future<Output = Result<T, sqlx::Error>>,
    {
        self.run_raw(until, call)
            .await
            .map_err(|err| self.error_from(err))
    }

    /// An attempt's answer: a race lost to another session (a conflict, a lock wait cut
    /// short) is `lost`, any other error explained ([`error_from`](Self::error_from)).
    fn race_outcome<T>(
        &self,
        won: Result<T, sqlx::Error>,
        lost: T,
        what: &dyn std::fmt::Debug,
        said: &str,
    ) -> Result<T> {
        match won {
            Err(err) if DB::contention(&err) != Contention::Failure => {
                tracing::trace!(lock = ?what, error = %err, "{said}");
                Ok(lost)
            }
            won => won.map_err(|err| self.error_from(err)),
        }
    }

    /// One acquisition attempt: insert, or take over an expired row. `Ok(None)` when the
    /// key is held, or another session got in the way (the race was lost).
    ///
    /// Bounded by `until`, the attempt's deadline, twice: the checkout and the statement
    /// are abandoned there (at least [`LEAST_TRY`] after the send; the connection is
    /// closed), and the statement carries what is left until then into the server
    /// ([`LockSql::acquire`]'s `wait`), so that it cannot wait for a row or advisory lock
    /// past it and commit for an owner nobody uses.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Result<Option<WonRow>> {
        let bound = attempt_bound(until);
        let won = self
            .run_raw(
                bound,
                pooled!(|conn| async {
                    let Sending {
                        upsert_returns,
                        watch,
                    } = self.sending_on(&mut *conn).await?;
                    let wait = until.saturating_duration_since(Instant::now());
                    let (lease, key) = (micros(lease), (key, None));
                    DB::acquire_watched(
                        conn,
                        &self.sql,
                        key,
                        owner,
                        lease,
                        wait,
                        upsert_returns,
                        watch,
                    )
                    .await
                }),
            )
            .await;
        self.race_outcome(won, None, &key, "lost an acquisition race")
    }

    /// One attempt at every key of `keys` (sorted, distinct) for `owner`, all or nothing
    /// in one transaction: the acquisition statement of each key in order, rolled back at
    /// the first key held by another owner. Taking keys in one order everywhere means two
    /// such transactions never wait for each other in a circle. `Ok(None)` when a key is
    /// held or another session got in the way. Bounded by `until` as
    /// [`acquire`](Self::acquire) is.
    pub(crate) async fn acquire_all(
        &self,
        keys: &[String],
        owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Result<Option<Vec<WonRow>>> {
        let bound = attempt_bound(until);
        let won = self
            .run_raw(
                bound,
                pooled!(|conn| async {
                    let sending = self.sending_on(&mut *conn).await?;
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    let taken =
                        take_all::<DB>(&mut tx, &self.sql, keys, owner, lease, until, sending)
                            .await;
                    end_transaction(tx, taken, Option::is_some).await
                }),
            )
            .await;
        self.race_outcome(won, None, &keys, "lost a race for several keys")
    }

    /// A read-write lock's reader: [`acquire`](Self::acquire) of `key`, ordered with the
    /// write transactions of the grant `grant` ([`LockSql::acquire_read`]). Bounded by
    /// `until` as `acquire` is.
    ///
    /// [`LockSql::acquire_read`]: crate::dialect::LockSql::acquire_read
    pub(crate) async fn acquire_read(
        &self,
        key: &str,
        grant: &str,
        owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Result<Option<WonRow>> {
        let bound = attempt_bound(until);
        let won = self
            .run_raw(
                bound,
                pooled!(|conn| async {
                    let Sending {
                        upsert_returns,
                        watch,
                    } = self.sending_on(&mut *conn).await?;
                    let wait = until.saturating_duration_since(Instant::now());
                    let (lease, keys) = (micros(lease), (key, Some(grant)));
                    DB::acquire_watched(
                        conn,
                        &self.sql,
                        keys,
                        owner,
                        lease,
                        wait,
                        upsert_returns,
                        watch,
                    )
                    .await
                }),
            )
            .await;
        self.race_outcome(won, None, &key, "lost a read's acquisition race")
    }

    /// A read-write lock's write in one transaction, one commit: the writer's row and the
    /// grant's (`keys`, in that order, which is byte order), then a look for a live reader
    /// (a row whose key starts with `readers`); committed only when both rows were won and
    /// no reader holds, rolled back otherwise. Bounded by `until` as
    /// [`acquire`](Self::acquire) is.
    pub(crate) async fn acquire_write(
        &self,
        keys: &[String],
        readers: &str,
        owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Result<WriteTake> {
        let readers_end = prefix_end(readers).unwrap_or_default();
        let readers = (readers, readers_end.as_str());
        if let [writer, grant] = keys
            && self.writes_in_one.load(Ordering::Relaxed)
        {
            let keys = (writer.as_str(), grant.as_str());
            match self
                .acquire_write_in_one(keys, readers, owner, lease, until)
                .await
            {
                Ok(Some(taken)) => return Ok(taken),
                Ok(None) => self.writes_in_one.store(false, Ordering::Relaxed),
                Err(err) => return Err(err),
            }
        }
        let bound = attempt_bound(until);
        let won = self
            .run_raw(
                bound,
                pooled!(|conn| async {
                    let sending = self.sending_on(&mut *conn).await?;
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    let taken =
                        take_all::<DB>(&mut tx, &self.sql, keys, owner, lease, until, sending)
                            .await;
                    let taken = match taken {
                        Ok(Some(won)) => {
                            let (from, to) = readers;
                            match DB::live_member(&mut tx, &self.sql, from, to).await {
                                Ok(false) => Ok(WriteTake::Won(won)),
                                Ok(true) => Ok(WriteTake::Read),
                                Err(err) => Err(err),
                            }
                        }
                        Ok(None) => Ok(WriteTake::Held),
                        Err(err) => Err(err),
                    };
                    end_transaction(tx, taken, |taken| matches!(taken, WriteTake::Won(_))).await
                }),
            )
            .await;
        self.race_outcome(won, WriteTake::Held, &keys, "lost a write's race")
    }

    /// [`acquire_write`](Self::acquire_write) in one statement
    /// ([`LockSql::acquire_write`](crate::dialect::LockSql::acquire_write)): `Ok(None)`
    /// where the dialect or the table has none. Nobody registers as waiting on a lock
    /// table whose dialect has one (PostgreSQL marks rows instead), so the won rows carry
    /// no watchers.
    async fn acquire_write_in_one(
        &self,
        keys: (&str, &str),
        readers: (&str, &str),
        owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Result<Option<WriteTake>> {
        let bound = attempt_bound(until);
        let won = self
            .run_raw(
                bound,
                pooled!(|conn| async {
                    let wait = until.saturating_duration_since(Instant::now());
                    DB::acquire_write(conn, &self.sql, keys, readers, owner, micros(lease), wait)
                        .await
                }),
            )
            .await;
        let taken = won.map(|won| {
            won.map(|won| match won {
                WriteInOne::Won(writer, grant) => WriteTake::Won(vec![
                    (writer, Watchers::default()),
                    (grant, Watchers::default()),
                ]),
                WriteInOne::Held => WriteTake::Held,
                WriteInOne::Read => WriteTake::Read,
            })
        });
        self.race_outcome(taken, Some(WriteTake::Held), &keys, "lost a write's race")
    }

    /// Owner- and token-checked delete of the rows of `ids` (sorted by key) in one
    /// statement (or one transaction: one commit) on a pool connection, waking waiters as
    /// a release does: the rows that were ours and went. Sent again while another session
    /// is in the way, until `until`, as [`release`](Self::release) is.
    pub(crate) async fn release_together(
        &self,
        ids: &[LockId<'_>],
        until: Instant,
    ) -> Result<Vec<ReleasedRow>> {
        self.contended_until(
            until,
            pooled!(|conn| async {
                match ids {
                    [a, b] => {
                        let returns = self.upsert_returns_on(&mut *conn).await?;
                        DB::release_pair(conn, &self.sql, [*a, *b], returns).await
                    }
                    _ => DB::release_batch(conn, &self.sql, ids).await,
                }
            }),
        )
        .await
    }

    /// Owner- and token-checked delete: `Some(expired)` when our row went, saying whether
    /// its lease had already run out by the database clock; `None` when it was not ours.
    /// Sent again, until `until`, while another session is in the way (busy, a lock wait:
    /// nothing was deleted, and the checked DELETE is safe to repeat).
    pub(crate) async fn release(&self, id: LockId<'_>, until: Instant) -> Result<Option<bool>> {
        self.contended_until(until, pooled!(|conn| DB::release(conn, &self.sql, id)))
            .await
    }

    /// [`release`](Self::release), saying also whether a waiter of another Locker marked
    /// the key ([`LockSql::release_marked`]): `Some((expired, marked))`.
    pub(crate) async fn release_marked(
        &self,
        id: LockId<'_>,
        until: Instant,
    ) -> Result<Option<(bool, bool)>> {
        self.contended_until(
            until,
            pooled!(|conn| DB::release_marked(conn, &self.sql, id, self.waiter)),
        )
        .await
    }

    /// Whether a release may hand its row to a waiter in one statement
    /// ([`hand_off`](Self::hand_off)) on this backend.
    pub(crate) fn hands_off(&self) -> bool {
        DB::HANDS_OFF
    }

    /// The release that gives our live row to `to_owner` for `lease` in one statement
    /// where the backend can ([`LockSql::hand_off`]), or deletes it as
    /// [`release`](Self::release) does (a waiter elsewhere marked it, the lease had run
    /// out); when that statement changed nothing, the plain release says what happened.
    /// Sent again while another session is in the way, until `until`: the statement
    /// checks owner and token, so a repeat cannot take anything twice.
    pub(crate) async fn hand_off(
        &self,
        from: LockId<'_>,
        to_owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Result<HandOff> {
        let handed = match self.hand_off_on_lane(from, to_owner, lease, until).await {
            Some(Ok(handed)) => handed,
            Some(Err(err)) if DB::contention(&err) == Contention::Failure => {
                return Err(self.error_from(err));
            }
            // Another session in the way, or the lane busy or closed: the pool's way.
            Some(Err(_)) | None => {
                self.contended_until(
                    until,
                    pooled!(|conn| DB::hand_off(
                        conn,
                        &self.sql,
                        from,
                        to_owner,
                        micros(lease),
                        until.saturating_duration_since(Instant::now())
                    )),
                )
                .await?
            }
        };
        if let Some(handed) = handed {
            return Ok(handed);
        }
        Ok(match self.release(from, until).await? {
            // Whether this one notified is not said: nobody is kept waiting for it.
            Some(expired) => HandOff::Released {
                expired,
                notified: false,
            },
            None => HandOff::NotOurs,
        })
    }

    /// [`hand_off`](Self::hand_off)'s statement on the lane, if the lane is open and idle:
    /// `None` otherwise (it is not opened or waited for here). A hot key's handoffs are
    /// what this is for: a pool connection given back is pinged by sqlx before it is
    /// idle again (a round trip and two task wake-ups per statement, measured in
    /// `benches/compare` cell 3.1), which the lane, never given back, does not pay. An
    /// abandoned statement drops the connection with it, as on the lane everywhere.
    async fn hand_off_on_lane(
        &self,
        from: LockId<'_>,
        to_owner: &str,
        lease: Duration,
        until: Instant,
    ) -> Option<Result<Option<HandOff>, sqlx::Error>> {
        // SQLite's write gate orders the lane's statements; SQLite has no handoff anyway.
        if self.gate.is_some() {
            return None;
        }
        let mut slot = self.lane.slot.try_lock().ok()?;
        let mut conn = slot.take()?;
        let until = until.max(Instant::now() + LEAST_TRY);
        let wait = until.saturating_duration_since(Instant::now());
        let statement = DB::hand_off(&mut conn, &self.sql, from, to_owner, micros(lease), wait);
        // Abandoned at `until`, the connection with it (it is out of the slot).
        let outcome = tokio::time::timeout_at(until, statement)
            .await
            .unwrap_or_else(|_| Err(timed_out(NO_ANSWER)));
        // As `on_lane!`: a database's error answer leaves the connection usable.
        if !matches!(outcome, Err(ref err) if !matches!(err, sqlx::Error::Database(_))) {
            *slot = Some(conn);
        }
        Some(outcome)
    }

    /// Runs `call` as [`run`](Self::run) does, and again after a pause while another
    /// session is in the way, until `until`.
    async fn contended_until<T, F>(
        &self,
        until: Instant,
        call: impl Fn(Checkout<DB>) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T, sqlx::Error>>,
    {
        let call = &call;
        retry(&self.retry, until, |_| async move {
            let bound = until.max(Instant::now() + LEAST_TRY);
            match self.run_raw(bound, call).await {
                Err(err) if DB::contention(&err) == Contention::LostRace => Err(Retry::Again(err)),
                outcome => outcome.map_err(Retry::Stop),
            }
        })
        .await
        .map_err(|err| self.error_from(err))
    }

    /// Inside the caller's transaction (`conn` is its connection): whether `id` still
    /// holds an unexpired lease, locking its row until the transaction ends. The error
    /// is the database's own: a conflict rollback needs [`still_held`](Self::still_held)
    /// to be read.
    pub(crate) async fn check_fence(
        &self,
        conn: &mut DB::Connection,
        id: LockId<'_>,
    ) -> Result<bool, sqlx::Error> {
        // Asked on the caller's connection, not a pool one: a caller holding the pool's
        // last connection in this transaction would wait for itself.
        let certified = self.certifies_writes_on(conn).await?;
        DB::check_fence(conn, &self.sql, id, certified).await
    }

    /// [`check_fence`](Self::check_fence) for several locks in one statement: how many of
    /// `ids` hold.
    pub(crate) async fn check_fences(
        &self,
        conn: &mut DB::Connection,
        ids: &[LockId<'_>],
    ) -> Result<u64, sqlx::Error> {
        let certified = self.certifies_writes_on(conn).await?;
        DB::check_fences(conn, &self.sql, ids, certified).await
    }

    /// Whether `id` still holds an unexpired lease by the database clock, read on a pool
    /// connection (outside any transaction of the caller's).
    pub(crate) async fn still_held(&self, id: LockId<'_>) -> Result<bool> {
        Ok(self.inspect(id.key).await?.is_some_and(|row| {
            row.owner == id.owner && row.fencing_token == id.fencing_token && !row.expired
        }))
    }

    /// [`error_from`](Self::error_from), but a lock another transaction holds is
    /// [`Error::RowLocked`].
    pub(crate) fn row_lock_error(&self, err: sqlx::Error) -> Error {
        if DB::is_row_locked(&err) {
            Error::RowLocked(err)
        } else {
            self.error_from(err)
        }
    }

    /// Owner- and token-checked extension of a live lease; the new expiry. Abandoned at
    /// `until` (the lease's deadline: an answer after it extends nothing we can use).
    pub(crate) async fn extend(
        &self,
        id: LockId<'_>,
        lease: Duration,
        until: Instant,
    ) -> Result<Option<DateTime<Utc>>> {
        let until = until.max(Instant::now() + LEAST_TRY);
        self.run(
            until,
            pooled!(|conn| DB::extend(conn, &self.sql, id, micros(lease))),
        )
        .await
    }

    /// Renews a batch in chunks of [`RENEW_CHUNK`], on the engine's connection, waiting
    /// for rows locked by other transactions as `wait` says; returns the state of every
    /// row of the batch's keys that exists.
    pub(crate) async fn renew(
        &self,
        batch: &[Renewal<'_>],
        wait: RenewWait,
    ) -> Result<Vec<RowState>> {
        let mut rows = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(RENEW_CHUNK) {
            let renewed: Result<_, sqlx::Error> =
                on_lane!(self, |conn| DB::renew(conn, &self.sql, chunk, wait));
            rows.extend(renewed.map_err(|err| self.error_from(err))?);
        }
        Ok(rows)
    }

    /// Owner- and token-checked delete of many rows at once, in chunks of
    /// [`RENEW_CHUNK`], on the engine's connection: the rows that were ours and went,
    /// each saying whether its lease had already run out by the database clock.
    pub(crate) async fn release_batch(&self, batch: &[LockId<'_>]) -> Result<Vec<ReleasedRow>> {
        let mut rows = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(RENEW_CHUNK) {
            let released: Result<_, sqlx::Error> =
                on_lane!(self, |conn| DB::release_batch(conn, &self.sql, chunk));
            rows.extend(released.map_err(|err| self.error_from(err))?);
        }
        Ok(rows)
    }

    /// The database clock now: what every expiry is measured against.
    pub(crate) async fn clock(&self) -> Result<DateTime<Utc>> {
        self.run(self.bounded(), pooled!(|conn| DB::clock(conn, &self.sql)))
            .await
    }

    /// Who holds `key`, by the database clock.
    pub(crate) async fn inspect(&self, key: &str) -> Result<Option<Inspected>> {
        self.run(
            self.bounded(),
            pooled!(|conn| DB::inspect(conn, &self.sql, key)),
        )
        .await
    }

    /// Rows whose key starts with `prefix`, in key order (bytes), at most `limit`, of
    /// those acquired at least `held` ago and, with `expired`, expired (`Some(true)`) or
    /// live (`Some(false)`), all by the database clock.
    pub(crate) async fn list(
        &self,
        prefix: &str,
        held: Option<Duration>,
        expired: Option<bool>,
        limit: u32,
    ) -> Result<Vec<Listed>> {
        self.list_after(prefix, None, held, expired, limit).await
    }

    /// [`list`](Self::list) of the keys after `after` (exclusive): the next page of a
    /// listing whose previous page ended at `after`.
    pub(crate) async fn list_after(
        &self,
        prefix: &str,
        after: Option<&str>,
        held: Option<Duration>,
        expired: Option<bool>,
        limit: u32,
    ) -> Result<Vec<Listed>> {
        let until = prefix_end(prefix);
        // The range starts at the later of the two bounds, so that MySQL's and SQLite's
        // primary key (a byte range) seeks to the page instead of reading up to it.
        let from = match after {
            Some(after) if after > prefix => after,
            _ => prefix,
        };
        let query = ListQuery {
            from,
            until: until.as_deref(),
            after,
            held_micros: held.map(micros),
            expired,
            limit: i64::from(limit),
        };
        self.run(
            self.bounded(),
            pooled!(|conn| DB::list(conn, &self.sql, query)),
        )
        .await
    }

    /// Deletes the row of `key`, whoever holds it; whether there was one.
    pub(crate) async fn force_release(&self, key: &str) -> Result<bool> {
        self.run(
            self.bounded(),
            pooled!(|conn| DB::force_release(conn, &self.sql, key)),
        )
        .await
    }

    /// Lets our live row end `min_hold` after its acquisition (database clock) instead of
    /// deleting it; `false` when that moment has passed or the row is not ours. Sent
    /// again while another session is in the way, until `until`, as a release is.
    pub(crate) async fn keep_min_hold(
        &self,
        id: LockId<'_>,
        min_hold: Duration,
        until: Instant,
    ) -> Result<bool> {
        self.contended_until(
            until,
            pooled!(|conn| DB::keep_min_hold(conn, &self.sql, id, micros(min_hold))),
        )
        .await
    }

    /// A waiter is about to sleep: asks that the holder's release wake it and reads how
    /// long the holder's lease has left by the database clock; `None` when the key has no
    /// row.
    pub(crate) async fn note_waiter(&self, key: &str) -> Result<Option<Duration>> {
        self.note_waiter_in(key, key).await
    }

    /// [`note_waiter`](Self::note_waiter) for a waiter of the local queue `queue` (the
    /// key, or a primitive's group): SQLite marks the queue's key for this Locker
    /// ([`NotifySql::note_waiter_in`]).
    pub(crate) async fn note_waiter_in(&self, key: &str, queue: &str) -> Result<Option<Duration>> {
        let left = self
            .run(
                self.bounded(),
                pooled!(|conn| DB::note_waiter_in(conn, &self.sql, key, queue, self.waiter)),
            )
            .await?;
        Ok(left.map(|micros| Duration::from_micros(u64::try_from(micros).unwrap_or(0))))
    }

    /// Whether the server certifies writes across nodes at commit (MariaDB Galera), asked
    /// on a pool connection unless known: once per lock table, whichever asks first (a
    /// fence check, fair mode's start).
    pub(crate) async fn certifies_writes(&self) -> Result<bool> {
        // Elsewhere, or once known, the answer needs no pool checkout.
        if let Some(known) = self.certified.get() {
            return Ok(*known);
        }
        if !DB::MAY_CERTIFY_WRITES {
            return Ok(false);
        }
        self.run(
            self.bounded(),
            pooled!(|conn| self.certifies_writes_on(conn)),
        )
        .await
    }

    /// [`certifies_writes`](Self::certifies_writes), asked on `conn` unless known.
    async fn certifies_writes_on(&self, conn: &mut DB::Connection) -> Result<bool, sqlx::Error> {
        if !DB::MAY_CERTIFY_WRITES {
            return Ok(false);
        }
        let known = self
            .certified
            .get_or_try_init(|| DB::certifies_writes(conn));
        Ok(*known.await?)
    }

    /// Whether the acquisition's upsert is sent with `RETURNING`: the server takes it
    /// (`SELECT VERSION()`: MariaDB 10.5+) and does not certify writes at commit (not
    /// Galera). Asked on `conn` the first time, known after that.
    async fn upsert_returns_on(&self, conn: &mut DB::Connection) -> Result<bool, sqlx::Error> {
        if !DB::MAY_RETURN_FROM_UPSERT {
            return Ok(false);
        }
        if let Some(known) = self.upsert_returns.get() {
            return Ok(*known);
        }
        // Not on a cluster that certifies writes at commit (MariaDB Galera): there a
        // commit refused after the RETURNING row arrives as an error packet after that
        // row, which sqlx 0.9's MySQL row reader takes for a row and panics on (seen in
        // fault group 10); the upsert + SELECT reads every error as an error.
        let known = self.upsert_returns.get_or_try_init(|| async {
            let returns = DB::upsert_returns(&mut *conn).await?;
            Ok::<_, sqlx::Error>(returns && !self.certifies_writes_on(&mut *conn).await?)
        });
        Ok(*known.await?)
    }

    /// How acquisitions are sent: with `RETURNING` ([`upsert_returns_on`](Self::upsert_returns_on)),
    /// and reading who waits where the backend rings bells and the server is not a
    /// Galera node (named locks are a node's own there). Asked on `conn` the first time.
    async fn sending_on(&self, conn: &mut DB::Connection) -> Result<Sending, sqlx::Error> {
        let upsert_returns = self.upsert_returns_on(&mut *conn).await?;
        let watch = DB::RINGS_BELLS && !self.certifies_writes_on(conn).await?;
        Ok(Sending {
            upsert_returns,
            watch,
        })
    }

    /// Takes the bell of the row `key` on the engine's connection, without waiting
    /// (see [`NotifySql::take_bell`](crate::dialect::NotifySql::take_bell)): `true` when
    /// taken. The engine's connection holds it until [`drop_bell`](Self::drop_bell), or
    /// until the connection is closed (after a failed statement), which rings it too.
    pub(crate) async fn take_bell(&self, key: &str) -> Result<bool> {
        let took: Result<_, sqlx::Error> =
            on_lane!(self, |conn| DB::take_bell(conn, &self.sql, key));
        took.map_err(|err| self.error_from(err))
    }

    /// Drops the bell of the row `key` that [`take_bell`](Self::take_bell) took.
    pub(crate) async fn drop_bell(&self, key: &str) -> Result<()> {
        let dropped: Result<_, sqlx::Error> =
            on_lane!(self, |conn| DB::drop_bell(conn, &self.sql, key));
        dropped.map_err(|err| self.error_from(err))
    }

    /// Fair mode: takes a ticket for `key` with a lease of `lease`; its number.
    pub(crate) async fn take_ticket(&self, key: &str, lease: Duration) -> Result<i64> {
        self.run(
            self.bounded(),
            pooled!(|conn| DB::take_ticket(conn, &self.sql, key, micros(lease))),
        )
        .await
    }

    /// Fair mode: whether a live ticket for `key` earlier than `ticket` exists (`None`:
    /// any live ticket).
    pub(crate) async fn earlier_ticket(&self, key: &str, ticket: Option<i64>) -> Result<bool> {
        let ticket = ticket.unwrap_or(i64::MAX);
        self.run(
            self.bounded(),
            pooled!(|conn| DB::earlier_ticket(conn, &self.sql, key, ticket)),
        )
        .await
    }

    /// Fair mode: renews the live tickets among `tickets`, on the engine's connection;
    /// the ones renewed.
    pub(crate) async fn renew_tickets(&self, tickets: &[i64], lease: Duration) -> Result<Vec<i64>> {
        let lease = micros(lease);
        let renewed: Result<_, sqlx::Error> = on_lane!(self, |conn| DB::renew_tickets(
            conn, &self.sql, tickets, lease
        ));
        renewed.map_err(|err| self.error_from(err))
    }

    /// Fair mode: deletes tickets (their waiters won or left).
    pub(crate) async fn drop_tickets(&self, tickets: &[i64], via: Via) -> Result<()> {
        match via {
            Via::Pool => {
                self.run(
                    self.bounded(),
                    pooled!(|conn| DB::drop_tickets(conn, &self.sql, tickets)),
                )
                .await
            }
            Via::Engine => {
                let dropped: Result<_, sqlx::Error> =
                    on_lane!(self, |conn| DB::drop_tickets(conn, &self.sql, tickets));
                dropped.map_err(|err| self.error_from(err))
            }
        }
    }

    /// Fair mode: deletes every expired ticket (of waiters that died); how many.
    pub(crate) async fn purge_tickets(&self, via: Via) -> Result<u64> {
        match via {
            Via::Pool => {
                self.run(
                    self.bounded(),
                    pooled!(|conn| DB::purge_tickets(conn, &self.sql)),
                )
                .await
            }
            Via::Engine => {
                let purged: Result<_, sqlx::Error> =
                    on_lane!(self, |conn| DB::purge_tickets(conn, &self.sql));
                purged.map_err(|err| self.error_from(err))
            }
        }
    }

    /// Opens a listener for this table's releases, on its own connection: at `given`
    /// options, or at the pool's (then checked to be a session of its own). `None` when
    /// the backend has no notifications or the connection is not a session of its own.
    pub(crate) async fn listen(
        &self,
        given: Option<&ConnectOptions<DB>>,
        waiting: Arc<dyn Waiting>,
    ) -> Result<Option<Box<dyn Releases>>> {
        let listener = match given {
            Some(options) => ListenerOptions {
                options: options.clone(),
                given: true,
                waiting,
                waiter: self.waiter,
            },
            None => ListenerOptions {
                options: (*self.pool.connect_options()).clone(),
                given: false,
                waiting,
                waiter: self.waiter,
            },
        };
        DB::listen(listener, &self.name)
            .await
            .map_err(|err| self.error_from(err))
    }

    /// How many times a reaper batch's duration the reaper pauses after it (the
    /// dialect's [`REAP_PACE`](crate::dialect::LockSql::REAP_PACE)).
    pub(crate) fn reap_pace(&self) -> u32 {
        DB::REAP_PACE
    }

    /// Deletes at most `batch` expired rows.
    pub(crate) async fn reap_batch(&self, batch: u32) -> Result<u64> {
        self.run(
            self.bounded(),
            pooled!(|conn| DB::reap_batch(conn, &self.sql, i64::from(batch))),
        )
        .await
    }

    /// Deletes the row of `key` if `owner` holds it, whatever its token: the clean-up
    /// after an acquisition whose answer was lost.
    pub(crate) async fn release_if_owned(&self, key: &str, owner: &str) -> Result<()> {
        if let Some(row) = self.inspect(key).await?
            && row.owner == owner
        {
            let id = LockId {
                key,
                owner,
                fencing_token: row.fencing_token,
            };
            self.release(id, self.bounded()).await?;
        }
        Ok(())
    }

    /// The scripts [`migrate`](Self::migrate) runs, for this table and durability.
    pub(crate) fn migration_sql(&self) -> Vec<crate::migrate::MigrationScript> {
        crate::migrate::scripts::<DB>(&self.name, self.durability)
    }

    /// Creates or upgrades the table (refinery migrations). On a database that lives
    /// only as long as a connection to it (in-memory SQLite), first opens a connection of
    /// the table's own that keeps it alive for as long as this table object lives.
    ///
    /// Bounded by [`MIGRATION_TIMEOUT`](crate::config::MIGRATION_TIMEOUT), not by the
    /// statement timeout: a migration may wait its turn behind another process's.
    pub(crate) async fn migrate(&self) -> Result<usize> {
        let bound = crate::config::MIGRATION_TIMEOUT;
        tokio::time::timeout(bound, self.migrate_unbounded())
            .await
            .unwrap_or_else(|_| Err(Error::Database(timed_out(NO_ANSWER))))
    }

    async fn migrate_unbounded(&self) -> Result<usize> {
        self.keep_alive().await?;
        let applied = crate::migrate::run(&self.pool, &self.name, self.durability)
            .await
            .map_err(|err| self.migration_error(err))?;
        self.writes_in_one.store(true, Ordering::Relaxed);
        if let Some(conn) = self.keep_alive.lock().await.as_mut() {
            // The keep-alive connection must see the table the pool's connection made;
            // it does not when every connection has a database of its own.
            DB::check_shared(conn, &self.name)
                .await
                .map_err(|err| match err {
                    sqlx::Error::Configuration(why) => Error::InvalidConfig(why.to_string()),
                    err => self.error_from(err),
                })?;
        }
        // A table of this name that existed before may lack columns no migration step
        // needed: say so now, not at the first acquisition.
        self.run(
            self.bounded(),
            pooled!(|conn| DB::check_shape(conn, &self.name)),
        )
        .await?;
        Ok(applied)
    }

    /// A failed migration, explained: a step that named a column the existing table
    /// lacks means the table is of another shape.
    fn migration_error(&self, err: Error) -> Error {
        let Error::Migration(failed) = err else {
            return err;
        };
        let column = match failed.kind() {
            refinery::error::Kind::Connection(_, source) => source
                .downcast_ref::<sqlx::Error>()
                .and_then(DB::missing_column),
            _ => None,
        };
        match column {
            Some(column) => Error::SchemaMismatch {
                table: self.name.clone(),
                column,
                source: Box::new(failed),
            },
            None => Error::Migration(failed),
        }
    }

    async fn keep_alive(&self) -> Result<()> {
        let mut slot = self.keep_alive.lock().await;
        if slot.is_none() {
            let options = self.pool.connect_options();
            let asked = async {
                let mut conn = self.pool.acquire().await?;
                DB::keep_alive(&mut conn, &options).await
            };
            *slot = asked.await.map_err(|err| self.error_from(err))?;
        }
        Ok(())
    }
}

mod history;
#[cfg(feature = "web")]
mod waiters;

/// The first string past every string that starts with `prefix`, in byte order (which for
/// UTF-8 is code point order): the prefix with its last character moved one code point on,
/// dropping trailing characters that have no successor. `None`: no such end (an empty
/// prefix), list to the end of the table.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // The next code point, skipping the surrogate gap, which is not a `char`.
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_the_first_string_past_the_prefix() {
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("job:").as_deref(), Some("job;"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
        // Every key with the prefix sorts before the end, bytewise (`str`'s order).
        let end = prefix_end("job:").unwrap();
        for key in ["job:", "job:\u{10FFFF}\u{10FFFF}", "job:~", "job:\u{0}"] {
            assert!(key >= "job:" && key < end.as_str(), "{key:?}");
        }
    }
}

/// Both ways of acquiring on MySQL / MariaDB, against the test server: the upsert with
/// `RETURNING` (MariaDB 10.5+, one statement) and the upsert followed by a `SELECT` (MySQL
/// 8, which has no `RETURNING`; MariaDB runs it too). No MySQL 8 server is at hand, so the
/// second path is forced here on MariaDB.
#[cfg(all(test, feature = "mysql"))]
mod mysql_paths {
    use std::time::Duration;

    use sqlx::{MySql, MySqlPool};

    use super::LockTable;
    use crate::config::{Durability, RetryPolicy};

    const LEASE: Duration = Duration::from_secs(30);

    use crate::dialect::test_mysql_server as server;

    /// How many `SELECT`s and `INSERT`s this pool's one session has run so far.
    async fn counts(pool: &MySqlPool) -> (i64, i64) {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Com_select', 'Com_insert')",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let count = |name: &str| {
            let (_, value) = rows.iter().find(|(n, _)| n == name).expect(name);
            value.parse::<i64>().unwrap()
        };
        (count("Com_select"), count("Com_insert"))
    }

    async fn expire(pool: &MySqlPool, table: &str, key: &str) {
        let expire = format!(
            "UPDATE {table} SET expire_time = NOW(6) - INTERVAL 1 SECOND WHERE lock_key = ?"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(expire))
            .bind(key)
            .execute(pool)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1);
    }

    #[tokio::test]
    async fn both_acquisition_paths_win_lose_and_take_over_alike() {
        let Some(pool) = server().await else {
            return;
        };
        let name = format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        crate::migrate::run(&pool, &name, Durability::Durable)
            .await
            .expect("migrate");
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&pool)
            .await
            .unwrap();

        // Detected at the first acquisition, once.
        let detected = LockTable::<MySql>::new(
            pool.clone(),
            name.clone(),
            RetryPolicy::default(),
            Durability::Durable,
        );
        assert!(
            detected
                .acquire("probe", "p", LEASE, tokio::time::Instant::now() + LEASE)
                .await
                .unwrap()
                .is_some()
        );
        let mariadb = version.contains("MariaDB");
        assert_eq!(detected.upsert_returns.get(), Some(&mariadb), "{version}");

        for returning in [true, false] {
            if returning && !mariadb {
                eprintln!("{version}: no RETURNING, only the two-statement path is tried");
                continue;
            }
            let table = LockTable::<MySql>::new(
                pool.clone(),
                name.clone(),
                RetryPolicy::default(),
                Durability::Durable,
            );
            table.upsert_returns.set(returning).unwrap();
            let key = format!("paths-{returning}");

            // A win: one INSERT, and a SELECT only without RETURNING (and, once per lock
            // table, the read of its database for the wait names).
            let before = counts(&pool).await;
            let database_read = i64::from(table.sql.database.get().is_none());
            let first = table
                .acquire(&key, "first", LEASE, tokio::time::Instant::now() + LEASE)
                .await
                .unwrap();
            let (first, _) = first.expect("a free key is won");
            let after = counts(&pool).await;
            let selects = i64::from(!returning);
            assert_eq!(
                after,
                (before.0 + selects + database_read, before.1 + 1),
                "returning {returning}"
            );

            // A loss, the same statements, the holder's row untouched.
            let before = counts(&pool).await;
            assert!(
                table
                    .acquire(&key, "second", LEASE, tokio::time::Instant::now() + LEASE)
                    .await
                    .unwrap()
                    .is_none()
            );
            let after = counts(&pool).await;
            assert_eq!(
                after,
                (before.0 + selects, before.1 + 1),
                "returning {returning}"
            );
            let holder = table.inspect(&key).await.unwrap().expect("a row");
            assert_eq!(holder.owner, "first");
            assert_eq!(holder.fencing_token, first.fencing_token);

            // Eight takers of the expired row: one wins, with a greater token.
            expire(&pool, &name, &key).await;
            let takers = (0..8).map(|i| {
                let (table, key) = (&table, &key);
                async move {
                    (
                        i,
                        table
                            .acquire(
                                key,
                                &format!("taker-{i}"),
                                LEASE,
                                tokio::time::Instant::now() + LEASE,
                            )
                            .await,
                    )
                }
            });
            let won: Vec<_> = futures::future::join_all(takers)
                .await
                .into_iter()
                .filter_map(|(i, outcome)| outcome.unwrap().map(|won| (i, won)))
                .collect();
            assert_eq!(won.len(), 1, "returning {returning}: {won:?}");
            let (winner, (taken, _)) = &won[0];
            assert!(taken.fencing_token > first.fencing_token);
            let holder = table.inspect(&key).await.unwrap().expect("a row");
            assert_eq!(holder.owner, format!("taker-{winner}"));
            assert_eq!(holder.fencing_token, taken.fencing_token);
        }
        let drop = format!(
            "DROP TABLE IF EXISTS {name}, {name}_history, {name}_fencing, {name}_ticket, {name}_migrating"
        );
        sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(&pool)
            .await
            .unwrap();
    }
}
