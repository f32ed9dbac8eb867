//! The one error type of the crate.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// Why a held lease stopped being ours.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::{Error, LostReason};
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let guard = locker.try_acquire("invoice:42", Duration::from_millis(300)).await?.unwrap();
/// assert_eq!(guard.lost_reason(), None); // held, and renewed every 100 ms
///
/// locker.force_release("invoice:42").await?; // an operator clears the lock
/// let reason = guard.lost().await; // completes at the next renewal
/// assert_eq!(reason, LostReason::Deleted);
/// assert_eq!(reason.to_string(), "the lock row was deleted");
/// assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out before it could be renewed.
    Expired,
    /// Another owner holds the row now (it took over after expiry).
    TakenOver,
    /// The row is gone, or was deleted while the lease lived and the key taken anew:
    /// force-released by an operator, deleted by hand, or reaped.
    Deleted,
    /// The database could not be reached until the lease's own deadline passed: the
    /// renewal got no answer (or an I/O error), or the lease's row stayed locked by
    /// another transaction (a fenced transaction that did not end: see
    /// [`LockGuard::assert_held`](crate::LockGuard::assert_held)), which renewal skips
    /// rather than wait on.
    Unreachable,
    /// The database answered, but refused the lease engine a connection until the
    /// lease's deadline passed (for example: its connection limit was reached). The
    /// engine renews on a connection of its own, outside the application's pool; see
    /// the README, "Connections".
    NoConnection,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired",
            LostReason::TakenOver => "another owner took the lock over",
            LostReason::Deleted => "the lock row was deleted",
            LostReason::Unreachable => "the database was unreachable until the lease ended",
            LostReason::NoConnection => {
                "the database refused the lease engine a connection until the lease ended"
            }
        })
    }
}

/// Why [`Error::PoolTimeout`]: no connection of the pool answered, or every one was
/// busy.
///
/// # Examples
/// ```
/// use dblock::{Error, PoolTimeoutCause};
///
/// /// What an operator should look at first.
/// fn advice(err: &Error) -> &'static str {
///     match err {
///         Error::PoolTimeout { cause: PoolTimeoutCause::Unanswered, .. } => "server or network",
///         Error::PoolTimeout { cause: PoolTimeoutCause::AllInUse, .. } => "pool size",
///         _ => "other",
///     }
/// }
/// # let _ = advice;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoolTimeoutCause {
    /// The pool had a connection to hand out or room to open one, and it did not answer
    /// in time: the liveness check of an idle connection, or the connect and handshake of
    /// a new one, got no reply (or was refused). The server is down or the network to it
    /// is cut or stalled; a bigger pool would not help.
    Unanswered,
    /// Every connection the pool may open was checked out by other callers for the whole
    /// wait: raise `max_connections`, or hold connections for shorter.
    AllInUse,
}

/// Everything that can go wrong in dblock.
///
/// Losing a race is not an error: [`Locker::try_acquire`](crate::Locker::try_acquire)
/// answers `Ok(None)` for that. Input errors are raised before anything is written.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::Error;
///
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let lease = Duration::from_secs(30);
/// // Bad input: refused before anything is written, and not worth retrying.
/// let bad = locker.try_acquire("", lease).await.unwrap_err();
/// assert!(matches!(bad, Error::InvalidKey { .. }) && !bad.is_retryable());
///
/// // A wait that runs out says who held the key: worth trying again later.
/// let guard = locker.try_acquire("invoice:42", lease).await?.unwrap();
/// let err = locker.acquire("invoice:42", lease, Duration::from_millis(50)).await.unwrap_err();
/// assert!(matches!(err, Error::Timeout { .. }) && err.is_retryable());
/// if let Error::Timeout { held_by, .. } = &err {
///     assert_eq!(held_by.as_deref(), Some(guard.owner()));
/// }
/// println!("{err}"); // timed out after 50ms waiting for lock "invoice:42" (...); held by ...
/// # guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock key is empty, longer than [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) bytes,
    /// or contains a NUL byte.
    #[error("invalid lock key {key:?} ({key_bytes} bytes): {reason}")]
    InvalidKey {
        /// The key as given, cut to its first 64 bytes (and `…`) when longer, so that a
        /// huge key does not flood logs.
        key: String,
        /// The length of the key as given, in bytes.
        key_bytes: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A lease, wait or interval is zero, too small or above its documented maximum.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidDuration {
        /// Which duration: "lease", "wait", "renew interval", ...
        what: &'static str,
        /// The value as given.
        value: Duration,
        /// What is wrong with it.
        reason: String,
    },
    /// The configured table name is not a plain SQL identifier, or is a reserved word.
    #[error("invalid table name {name:?}: {reason}")]
    InvalidTableName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another option or argument is out of range (owner prefix, batch size, list
    /// limit, ...).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A waiting acquire ran out of time while someone else held the lock.
    #[error(
        "timed out after {waited:?} waiting for lock {key:?} ({attempts} attempts){}",
        holder_text(held_by.as_deref(), held_until.as_ref(), *held_here)
    )]
    Timeout {
        /// The key that stayed held: for a semaphore or an election, the row waited for
        /// (`<name>~<part>`).
        key: String,
        /// How long the caller waited.
        waited: Duration,
        /// How many acquisition attempts were made.
        attempts: u32,
        /// The owner value (`lock_value`) of the holder when the wait ended, if it could
        /// be read.
        held_by: Option<String>,
        /// When the holder's lease ends, by the database clock, if it could be read.
        held_until: Option<DateTime<Utc>>,
        /// Whether the holder is this Locker itself (its owner value has this Locker's
        /// owner prefix, which names host and process by default): another guard of this
        /// process holds what the caller waited for, perhaps one it forgot to release.
        held_here: bool,
    },
    /// Release or extend found that the row is no longer ours: it expired and was taken
    /// over, or was deleted. Nothing was changed. (A release that finds its row still
    /// there but expired deletes it and answers [`Error::LockLost`] with
    /// [`LostReason::Expired`] instead.)
    #[error("lock {key:?} is not held by owner {owner:?}")]
    NotHeld {
        /// The key.
        key: String,
        /// The owner value this guard held.
        owner: String,
    },
    /// The lease was lost while the work under it was still running, or, from
    /// [`LockGuard::release`](crate::LockGuard::release), before the release: the work
    /// was not protected for its whole length.
    #[error("lock {key:?} was lost: {reason}")]
    LockLost {
        /// The key.
        key: String,
        /// Why the lease ended.
        reason: LostReason,
    },
    /// A row is locked by another transaction (`NOWAIT`, lock-wait timeout, or SQLite busy).
    #[error("row is locked by another transaction: {}", said(.0))]
    RowLocked(#[source] sqlx::Error),
    /// An optimistic update kept conflicting until its attempts ran out.
    #[error("version conflict on {table} after {attempts} attempts")]
    VersionConflict {
        /// The table being updated.
        table: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The lock table does not exist: [`Locker::migrate`](crate::Locker::migrate) has not
    /// been run on this database (or the builder names another table).
    #[error(
        "lock table {table:?} does not exist: run Locker::migrate() first ({})",
        said(source)
    )]
    MissingTable {
        /// The table's name.
        table: String,
        /// What the database said.
        #[source]
        source: sqlx::Error,
    },
    /// A table of the configured name exists but is not of dblock's shape: a column
    /// dblock needs is missing (a table of that name made by something else, or by hand
    /// with fewer columns). Nothing was written.
    #[error(
        "lock table {table:?} exists but has no column {column:?}, so it was not made by \
         Locker::migrate(): name another table (LockerBuilder::table), or rename that one \
         and run Locker::migrate() ({})",
        said_by(source.as_ref())
    )]
    SchemaMismatch {
        /// The table's name.
        table: String,
        /// The column the database said is missing.
        column: String,
        /// What the database (or the migration) said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A connection pooler between dblock and PostgreSQL hands one client's prepared
    /// statements to another: PgBouncer before 1.21 in transaction mode, or 1.21+ with
    /// `max_prepared_statements = 0`. Such a pooler can also run the wrong statement
    /// silently, so dblock is not safe behind it. Use session mode, or PgBouncer 1.21+
    /// with `max_prepared_statements` above 0 (see the README, "Connection poolers").
    #[error(
        "a connection pooler mixed up prepared statements between sessions ({}): dblock \
         needs PgBouncer in session mode, or PgBouncer >= 1.21 with max_prepared_statements > 0 \
         in transaction mode",
        said(source)
    )]
    PoolerMixesSessions {
        /// What the database (through the pooler) said.
        #[source]
        source: sqlx::Error,
    },
    /// No pooled connection could be had in time: within the call's bound (see the
    /// README, "Connections") or the pool's own acquire timeout, whichever came first.
    /// `cause` says whether the database did not answer or the pool was busy.
    #[error("{}", pool_timeout_text(*open_connections, *max_connections, *cause))]
    PoolTimeout {
        /// Connections the pool had open when it gave up.
        open_connections: u32,
        /// The pool's `max_connections`.
        max_connections: u32,
        /// Why no connection could be had.
        cause: PoolTimeoutCause,
    },
    /// A [`Semaphore`](crate::Semaphore) was asked for with another number of permits
    /// than the live permits of its name were taken with. Nothing was written: pass one
    /// count for a name everywhere (to change it, let the old permits end first).
    #[error("semaphore {name:?} is in use with {found} permits; this handle asks for {permits}")]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The count this handle was made with.
        permits: u32,
        /// The count of a live permit of the name.
        found: u32,
    },
    /// The database reported an error, or could not be reached.
    #[error("database error: {}", said(.0))]
    Database(#[from] sqlx::Error),
    /// Applying the migrations failed.
    #[error("migration failed: {}", without_source_lines(&.0.to_string()))]
    Migration(#[from] refinery::Error),
}

impl Error {
    /// Whether trying the same call again later may succeed: timeouts, busy rows, version
    /// conflicts and connection-level database failures. Input errors and lost or
    /// not-held locks are not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. }
            | Error::RowLocked(_)
            | Error::VersionConflict { .. }
            | Error::PoolTimeout { .. } => true,
            Error::Database(err) => is_transient(err),
            _ => false,
        }
    }
}

/// What the database said, for an error's text: sqlx's text without the " at line N"
/// that it appends to a PostgreSQL error. That is the line of the server's C source that
/// raised it, which reads like a line of the SQL and helps no one but a PostgreSQL
/// developer (`source()` still gives the whole sqlx error).
fn said(err: &sqlx::Error) -> String {
    without_source_lines(&err.to_string())
}

/// [`said`] for a boxed source (a database error, or a migration's error quoting one).
fn said_by(source: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    without_source_lines(&source.to_string())
}

/// `text` without each " at line N" (a migration's error carries the database's words
/// inside its own text).
fn without_source_lines(text: &str) -> String {
    const MARK: &str = " at line ";
    let mut kept = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        kept.push_str(&rest[..at]);
        if digits == 0 {
            kept.push_str(MARK);
        }
        rest = &after[digits..];
    }
    kept.push_str(rest);
    kept
}

/// Connection-level failures that say nothing about the lock itself.
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
    )
}

fn holder_text(owner: Option<&str>, until: Option<&DateTime<Utc>>, here: bool) -> String {
    let who = match owner {
        Some(owner) if here => format!("this process (owner {owner:?})"),
        Some(owner) => format!("{owner:?}"),
        None => return String::new(),
    };
    match until {
        Some(until) => format!("; held by {who} until {until}"),
        None => format!("; held by {who}"),
    }
}

fn pool_timeout_text(open: u32, max: u32, cause: PoolTimeoutCause) -> String {
    match cause {
        // sqlx retries refused connections silently until its acquire timeout, and does
        // not report the cause; with nothing open, that is the likely one.
        PoolTimeoutCause::Unanswered if open == 0 => format!(
            "timed out waiting for a database connection: none of the pool's connection \
             attempts succeeded (0 of at most {max} open) - is the server at the URL's host \
             and port up and accepting connections, and the network to it working?"
        ),
        PoolTimeoutCause::Unanswered => format!(
            "timed out waiting for a database connection: the pool's connections ({open} \
             open, at most {max}) did not answer (an idle connection's liveness check or a \
             new connection's handshake got no reply) - the server or the network to it is \
             down or stalled; a bigger pool would not help"
        ),
        PoolTimeoutCause::AllInUse => format!(
            "timed out waiting for a database connection: all {open} open connections \
             (at most {max}) were in use by other callers - raise max_connections or hold \
             connections for shorter"
        ),
    }
}

/// A key as error texts show it: whole when short, else its first 64 bytes (cut on a
/// character boundary) and `…`.
pub(crate) fn shown_key(key: &str) -> String {
    const SHOWN: usize = 64;
    if key.len() <= SHOWN {
        return key.to_owned();
    }
    let mut end = SHOWN;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &key[..end])
}

/// Shorthand for results whose error is [`Error`].
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use dblock::{Locker, Sqlite};
///
/// /// Whether `key` was free; dblock's errors pass through `?` unchanged.
/// async fn was_free(locker: &Locker<Sqlite>, key: &str) -> dblock::Result<bool> {
///     let guard = locker.try_acquire(key, Duration::from_secs(30)).await?;
///     match guard {
///         Some(guard) => guard.release().await.map(|()| true),
///         None => Ok(false),
///     }
/// }
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::{Error, PoolTimeoutCause, without_source_lines};

    #[test]
    fn pool_timeouts_say_which_cause() {
        let timeout = |open, cause| {
            Error::PoolTimeout {
                open_connections: open,
                max_connections: 4,
                cause,
            }
            .to_string()
        };
        let refused = timeout(0, PoolTimeoutCause::Unanswered);
        assert!(refused.contains("host and port"), "{refused}");
        let unanswered = timeout(2, PoolTimeoutCause::Unanswered);
        assert!(
            unanswered.contains("did not answer")
                && unanswered.contains("a bigger pool would not help")
                && !unanswered.contains("raise max_connections"),
            "{unanswered}"
        );
        let busy = timeout(4, PoolTimeoutCause::AllInUse);
        assert!(
            busy.contains("all 4 open connections (at most 4) were in use")
                && busy.contains("raise max_connections"),
            "{busy}"
        );
    }

    #[test]
    fn source_lines_are_cut_and_other_text_kept() {
        assert_eq!(
            without_source_lines("relation \"t\" does not exist at line 1392"),
            "relation \"t\" does not exist"
        );
        assert_eq!(
            without_source_lines("`a at line 1850`, `b at line 7`"),
            "`a`, `b`"
        );
        assert_eq!(without_source_lines("stop at line end"), "stop at line end");
    }
}
