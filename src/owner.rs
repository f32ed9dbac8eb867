//! [`Owner`]: a reentrant identity, so a holder can take a key it already holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::acquire;
use crate::config::{validate_acquire, validate_key, validate_lease};
use crate::dialect::Backend;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::locker::Locker;
use crate::metrics::{self, Kind};

impl<DB: Backend> Locker<DB> {
    /// A reentrant owner identity: guards it acquires for a key it already holds nest
    /// instead of waiting for themselves. See [`Owner`].
    pub fn owner(&self) -> Owner<DB> {
        Owner::new(self.clone(), self.core.new_owner())
    }
}

/// One lock-holding identity with a fixed owner value, like a thread in Redisson.
///
/// # The model
/// Every acquisition through a plain [`Locker`] uses a fresh owner value, so a task that
/// asks twice for a key it holds waits for itself. An `Owner` keeps one owner value: when
/// it asks for a key it already holds, it gets a *nested* guard at once, without a
/// database round trip, sharing the first guard's row, fencing token, lease and renewal.
/// The row is deleted only when the last of those guards is released (or dropped), in
/// whatever order. Any other owner (another `Owner`, a plain `Locker`, a plain-SQL
/// client) stays excluded throughout.
///
/// A nested acquisition does not change the lease: the first acquisition's lease and
/// renewal apply. If that lease was lost, the next acquisition goes to the database again.
/// Clones of an `Owner` are the same identity: share one between tasks only if they may
/// nest each other's locks. The owner's first acquisitions are made one at a time.
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
/// let (lease, wait) = (Duration::from_secs(30), Duration::from_secs(5));
/// let owner = locker.owner();
/// // Several keys under one owner value.
/// let from = owner.acquire("account:1", lease, wait).await?;
/// let to = owner.acquire("account:2", lease, wait).await?;
/// assert_eq!(from.owner(), owner.value());
///
/// // A key it already holds is granted at once, sharing the row and its token...
/// let nested = owner.acquire("account:1", lease, wait).await?;
/// assert_eq!(nested.fencing_token(), from.fencing_token());
/// // ...while every other owner stays excluded.
/// assert!(locker.try_acquire("account:1", lease).await?.is_none());
///
/// nested.release().await?; // gives back its hold: the row stays
/// assert!(locker.holder("account:1").await?.is_some());
/// from.release().await?; // the last guard of the key: the row goes
/// to.release().await?;
/// assert!(locker.holder("account:1").await?.is_none());
/// # Ok(()) }
/// ```
pub struct Owner<DB: Backend> {
    locker: Locker<DB>,
    value: Arc<str>,
    held: Arc<Mutex<HashMap<String, Weak<Lease>>>>,
    /// Makes "not held yet, ask the database" atomic per owner: two tasks of one owner
    /// racing for the same key must not both go to the database with the same value. An
    /// attempt that failed keeps it shut through its clean-up (see `acquire::Gate`).
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl<DB: Backend> Clone for Owner<DB> {
    fn clone(&self) -> Self {
        Owner {
            locker: self.locker.clone(),
            value: Arc::clone(&self.value),
            held: Arc::clone(&self.held),
            gate: Arc::clone(&self.gate),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Owner<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("value", &self.value)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Owner<DB> {
    pub(crate) fn new(locker: Locker<DB>, value: String) -> Self {
        Owner {
            locker,
            value: value.into(),
            held: Arc::default(),
            gate: Arc::default(),
        }
    }

    /// The owner value written to `lock_value` by this identity.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// As [`Locker::try_acquire`], but a key this owner already holds is granted at once
    /// as a nested guard.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::try_acquire`].
    pub async fn try_acquire(&self, key: &str, lease: Duration) -> Result<Option<LockGuard<DB>>> {
        validate_key(key)?;
        validate_lease(lease)?;
        // Boxed, as in `Locker::try_acquire`: each wrapper would otherwise hold a copy.
        let attempt = Box::pin(self.attempt(key, lease, None));
        let won =
            metrics::try_acquire(&self.locker.core.metrics, Kind::Mutex, key, attempt).await?;
        Ok(won.map(|lease| self.locker.guard(lease)))
    }

    /// As [`Locker::acquire`], but a key this owner already holds is granted at once as a
    /// nested guard.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::try_acquire`].
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard<DB>> {
        validate_acquire(key, lease, wait)?;
        let core = &self.locker.core;
        // Boxed, as in `Locker::acquire`: each wrapper would otherwise hold a copy.
        let won = Box::pin(async {
            // Nested at once, never queued behind waiters for a key this owner holds.
            if let Some(nested) = self.nest(key) {
                return Ok(nested);
            }
            let attempt = async |ticket| self.attempt(key, lease, ticket).await;
            acquire::wait_for(core, key, wait, None, attempt).await
        });
        let won = metrics::acquire(&core.metrics, Kind::Mutex, key, wait, won).await?;
        Ok(self.locker.guard(won))
    }

    /// A nested lease if this owner holds `key`, else one attempt at the database.
    async fn attempt(
        &self,
        key: &str,
        lease: Duration,
        ticket: Option<i64>,
    ) -> Result<Option<Arc<Lease>>> {
        if let Some(nested) = self.nest(key) {
            return Ok(Some(nested));
        }
        let mut gate = Some(Arc::clone(&self.gate).lock_owned().await);
        if let Some(nested) = self.nest(key) {
            return Ok(Some(nested));
        }
        let won = self
            .locker
            .attempt(key, &self.value, lease, ticket, &mut gate)
            .await?;
        if let Some(won) = &won {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|_, lease| lease.strong_count() > 0);
            held.insert(key.to_owned(), Arc::downgrade(won));
        }
        Ok(won)
    }

    /// A nested hold on a lease this owner still holds.
    fn nest(&self, key: &str) -> Option<Arc<Lease>> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let lease = held.get(key)?.upgrade()?;
        lease.nest().then_some(lease)
    }
}
