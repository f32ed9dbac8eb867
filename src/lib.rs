#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod config;
mod dialect;
mod error;
mod guard;
mod lease;
mod locker;
mod migrate;
mod owner;
mod reaper;
mod stats;

pub use config::{
    DEFAULT_LEASE, DEFAULT_REAP_BATCH, DEFAULT_REAP_INTERVAL, DEFAULT_RENEW_INTERVAL,
    DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX, DEFAULT_TABLE, MAX_KEY_BYTES, MAX_LEASE,
    MAX_OWNER_PREFIX_BYTES, MAX_TABLE_NAME_BYTES, MAX_WAIT, MIN_LEASE, RetryPolicy,
};
pub use dialect::{Backend, LockId};
pub use error::{Error, LostReason, Result};
pub use guard::LockGuard;
pub use locker::{Holder, Locker, LockerBuilder};
pub use owner::Owner;
pub use reaper::{ReaperConfig, ReaperHandle};
pub use stats::Stats;

#[cfg(feature = "mysql")]
pub use sqlx::MySql;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;

// Row locks, optimistic updates and fencing inside the caller's transaction.
mod fencing;
mod ident;
mod optimistic;
mod row_lock;

pub use dialect::SqlValue;
pub use optimistic::{DEFAULT_MAX_ATTEMPTS, Decision, Outcome, Versioned, VersionedBuilder};
pub use row_lock::{MAX_ROW_LOCK_KEYS, RowLockMode, RowLocker};
