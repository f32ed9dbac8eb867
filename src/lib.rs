#![doc = include_str!("../docs/crate.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!(
    "dblock needs a database: enable at least one of its cargo features `postgres`, `mysql` \
     and `sqlite` (the default features enable all three), for example \
     `dblock = { version = \"0.1\", default-features = false, features = [\"postgres\"] }`"
);

// The layers, top to bottom; no module imports from a layer above it (docs/architecture.md,
// for maintainers, not in the crate docs; tests/architecture.rs checks it).
// The web console (cargo feature `web`): pages over the API.
#[cfg(feature = "web")]
pub mod web;
// API: what users call.
mod admin;
mod any;
mod campaign;
mod election;
mod fencing;
mod guard;
mod history;
mod job;
mod locker;
mod multi;
mod optimistic;
mod owner;
mod primitive;
mod row_lock;
mod rwlock;
mod schedule;
mod semaphore;
// The core a Locker's clones, guards and owners share.
mod core;
// The lock algorithm: acquisition and its one waiting loop, the lines waiters join (the
// local queue, fair mode's tickets), the lease engine, leases, wake-ups, the reaper, and
// a resigned leader's stand-aside.
mod acquire;
mod engine;
mod fair;
mod lease;
mod line;
mod queue;
mod reaper;
mod recorder;
mod several;
mod stand_aside;
mod wakeups;
// The lock-table access layer (the only sender of lock-table SQL) and migrations.
mod migrate;
mod table;
// Per-database statements.
mod dialect;
// Leaves used by every layer.
mod config;
mod error;
mod ident;
mod inflight;
mod jobs;
mod key_label;
mod metrics;
mod retry;
mod stats;

pub use admin::{LockFilter, LockInfo, MAX_HELD_LONGER_THAN, MAX_LIST_LIMIT};
pub use any::{
    AnyElection, AnyGuard, AnyJob, AnyLeadership, AnyLocker, AnyLockerBuilder, AnyMultiGuard,
    AnyPermit, AnyReadGuard, AnyRwLock, AnySchedule, AnySemaphore, AnyTransaction, AnyWriteGuard,
    DEFAULT_ANY_MAX_CONNECTIONS,
};
pub use config::{
    DEFAULT_LEASE, DEFAULT_LEASE_MARGIN, DEFAULT_REAP_BATCH, DEFAULT_REAP_INTERVAL,
    DEFAULT_RELAXED_TABLE, DEFAULT_RENEW_INTERVAL, DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX,
    DEFAULT_TABLE, Durability, LEASE_DRIFT_DIVISOR, MAX_KEY_BYTES, MAX_LEASE,
    MAX_OWNER_PREFIX_BYTES, MAX_QUALIFIED_TABLE_NAME_BYTES, MAX_TABLE_NAME_BYTES, MAX_WAIT,
    MIN_LEASE, RetryPolicy,
};
// The bounds on every call (README, "Connections"), on a line of their own.
pub use campaign::{CampaignHandle, CampaignStats, WorkError};
pub use config::{
    DEFAULT_STATEMENT_TIMEOUT, MAX_STATEMENT_TIMEOUT, MIGRATION_TIMEOUT, MIN_STATEMENT_TIMEOUT,
    WAIT_SLACK,
};
pub use dialect::{Backend, LockId};
pub use election::{
    Election, Leader, LeaderWatch, Leadership, MAX_IDENTITY_BYTES, MIN_WATCH_INTERVAL,
};
pub use error::{Error, LostReason, PoolTimeoutCause, Result};
pub use guard::LockGuard;
pub use history::{HistoryFilter, LockEvent, MAX_HISTORY_LIMIT};
pub use job::Job;
pub use key_label::KeyLabel;
pub use locker::{Holder, Locker, LockerBuilder};
pub use migrate::MigrationScript;
pub use multi::{MAX_KEYS_AT_ONCE, MultiGuard};
pub use owner::Owner;
pub use reaper::{LEAK_CHECK_LIMIT, LeakReport, LongHeld, ReaperConfig, ReaperHandle};
pub use recorder::{
    EventKind, HISTORY_BATCH, HISTORY_BUFFER, HISTORY_FLUSH_INTERVAL, MAX_HISTORY_WITHIN,
};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use schedule::{
    MAX_PERIOD, MIN_PERIOD, Period, Schedule, ScheduleHandle, ScheduleStats, Tick, Turn,
};
pub use semaphore::{MAX_PERMITS, Permit, Semaphore};
pub use stand_aside::RESIGN_HOLD_OFF_SLACK;
pub use stats::Stats;

/// The sqlx that dblock is built on (0.9), so that an application can name the same
/// pool types without a version mismatch: `dblock::sqlx::PgPool`.
pub use sqlx;

#[cfg(feature = "mysql")]
pub use sqlx::MySql;
#[cfg(feature = "postgres")]
pub use sqlx::Postgres;
#[cfg(feature = "sqlite")]
pub use sqlx::Sqlite;

pub use dialect::SqlValue;
pub use optimistic::{DEFAULT_MAX_ATTEMPTS, Decision, Outcome, Versioned, VersionedBuilder};
pub use row_lock::{MAX_ROW_LOCK_KEYS, RowLockMode, RowLocker};

/// The README's examples, compiled (and run where they can) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// dblock's internals, public only for its own benchmarks (they time the lock-table layer
/// alone). Not part of the API: may change in any release.
#[doc(hidden)]
pub mod internals {
    pub use crate::dialect::{Acquired, HandOff, LockSql, TxSql};

    /// The lock-table access layer on its own: the statements dblock sends, without the
    /// lock algorithm around them.
    pub struct LockTable<DB: crate::dialect::Backend>(crate::table::LockTable<DB>);

    impl<DB: crate::dialect::Backend> LockTable<DB> {
        /// The table `name` on `pool`.
        pub fn new(pool: sqlx::Pool<DB>, name: &str) -> Self {
            LockTable(crate::table::LockTable::new(
                pool,
                name.to_owned(),
                crate::config::RetryPolicy::default(),
                crate::config::Durability::Durable,
            ))
        }

        /// One acquisition attempt.
        pub async fn acquire(
            &self,
            key: &str,
            owner: &str,
            lease: std::time::Duration,
        ) -> crate::error::Result<Option<Acquired>> {
            let until = tokio::time::Instant::now() + lease;
            let won = self.0.acquire(key, owner, lease, until).await?;
            Ok(won.map(|(won, _)| won))
        }

        /// Owner- and token-checked release; `true` when our row went.
        pub async fn release(&self, id: crate::dialect::LockId<'_>) -> crate::error::Result<bool> {
            let once = tokio::time::Instant::now();
            Ok(self.0.release(id, once).await?.is_some())
        }
    }
}
