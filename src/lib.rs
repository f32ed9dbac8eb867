#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod config;
mod dialect;
mod error;
mod guard;
mod locker;
mod migrate;

pub use config::{
    DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX, DEFAULT_TABLE, MAX_KEY_BYTES, MAX_LEASE,
    MAX_OWNER_PREFIX_BYTES, MAX_TABLE_NAME_BYTES, MAX_WAIT, MIN_LEASE, RetryPolicy,
};
pub use dialect::Backend;
pub use error::{Error, LostReason, Result};
pub use guard::LockGuard;
pub use locker::{Holder, Locker, LockerBuilder};

#[cfg(feature = "mysql")]
pub use sqlx::MySql;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;
