//! The one error type of the crate.

use std::time::Duration;

/// Why a held lease stopped being ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out before it could be renewed.
    Expired,
    /// Another owner holds the row now (it took over after expiry).
    TakenOver,
    /// The row is gone: released by someone else, reaped, or deleted by hand.
    Deleted,
    /// The database could not be reached until the lease's own deadline passed.
    Unreachable,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired",
            LostReason::TakenOver => "another owner took the lock over",
            LostReason::Deleted => "the lock row was deleted",
            LostReason::Unreachable => "the database was unreachable until the lease ended",
        })
    }
}

/// Everything that can go wrong in dblock.
///
/// Losing a race is not an error: [`Locker::try_acquire`](crate::Locker::try_acquire)
/// answers `Ok(None)` for that. Input errors are raised before anything is written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock key is empty, longer than [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) bytes,
    /// or contains a NUL byte.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
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
    /// Another builder option is out of range (owner prefix, batch size, ...).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A waiting acquire ran out of time while someone else held the lock.
    #[error("timed out after {waited:?} waiting for lock {key:?} ({attempts} attempts)")]
    Timeout {
        /// The key that stayed held.
        key: String,
        /// How long the caller waited.
        waited: Duration,
        /// How many acquisition attempts were made.
        attempts: u32,
    },
    /// Release or extend found that the row is no longer ours: it expired and was taken
    /// over, or was deleted. Nothing was changed.
    #[error("lock {key:?} is not held by owner {owner:?}")]
    NotHeld {
        /// The key.
        key: String,
        /// The owner value this guard held.
        owner: String,
    },
    /// The lease was lost while the work under it was still running.
    #[error("lock {key:?} was lost: {reason}")]
    LockLost {
        /// The key.
        key: String,
        /// Why the lease ended.
        reason: LostReason,
    },
    /// A row is locked by another transaction (`NOWAIT`, lock-wait timeout, or SQLite busy).
    #[error("row is locked by another transaction: {0}")]
    RowLocked(#[source] sqlx::Error),
    /// An optimistic update kept conflicting until its attempts ran out.
    #[error("version conflict on {table} after {attempts} attempts")]
    VersionConflict {
        /// The table being updated.
        table: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The database reported an error, or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the migrations failed.
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
}

impl Error {
    /// Whether trying the same call again later may succeed: timeouts, busy rows, version
    /// conflicts and connection-level database failures. Input errors and lost or
    /// not-held locks are not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::RowLocked(_) | Error::VersionConflict { .. } => true,
            Error::Database(err) => is_transient(err),
            _ => false,
        }
    }
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

/// Shorthand for results whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
