//! [`LockGuard`]: a held lease. Explicit async release; drop as the documented fallback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{micros, validate_lease};
use crate::dialect::{Acquired, Backend};
use crate::error::{Error, Result};
use crate::locker::Shared;

/// Deletes `(key, owner)` in the background unless disarmed: covers every path where we
/// may hold a row but no guard says so (a dropped acquire, a lost reply, a dropped guard).
pub(crate) struct PendingRelease<DB: Backend> {
    shared: Arc<Shared<DB>>,
    key: String,
    owner: String,
    armed: bool,
}

impl<DB: Backend> PendingRelease<DB> {
    pub(crate) fn arm(shared: Arc<Shared<DB>>, key: &str, owner: &str) -> Self {
        PendingRelease {
            shared,
            key: key.to_owned(),
            owner: owner.to_owned(),
            armed: true,
        }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    pub(crate) fn into_guard(self, acquired: Acquired) -> LockGuard<DB> {
        LockGuard {
            fencing_token: acquired.fencing_token,
            expires_at: Mutex::new(acquired.expires_at),
            pending: self,
        }
    }
}

impl<DB: Backend> Drop for PendingRelease<DB> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %self.key, owner = %self.owner, "no tokio runtime: lock left to expire");
            return;
        };
        let shared = Arc::clone(&self.shared);
        let key = std::mem::take(&mut self.key);
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            match DB::release(&shared.pool, &shared.sql, &key, &owner).await {
                Ok(deleted) => tracing::debug!(key, owner, deleted, "background release"),
                Err(err) => tracing::warn!(key, owner, error = %err, "background release failed; the lease will expire"),
            }
        });
    }
}

/// A held lock. Release it with [`release`](Self::release).
///
/// # Drop
/// Dropping a guard that was not released spawns an owner-checked delete on the current
/// tokio runtime at once. That release is best effort and not awaited: if it cannot run
/// (no runtime, database unreachable) the lease simply expires at
/// [`expires_at`](Self::expires_at). Call `release().await` to know it happened.
#[must_use = "the lock is released as soon as the guard is dropped; keep it and call release().await"]
pub struct LockGuard<DB: Backend> {
    pending: PendingRelease<DB>,
    fencing_token: i64,
    expires_at: Mutex<DateTime<Utc>>,
}

impl<DB: Backend> std::fmt::Debug for LockGuard<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("owner", &self.owner())
            .field("fencing_token", &self.fencing_token)
            .field("expires_at", &self.expires_at())
            .finish()
    }
}

impl<DB: Backend> LockGuard<DB> {
    /// The locked key.
    pub fn key(&self) -> &str {
        &self.pending.key
    }

    /// This acquisition's owner value, as stored in `lock_value`.
    pub fn owner(&self) -> &str {
        &self.pending.owner
    }

    /// The fencing token: strictly greater than every token issued before for this key,
    /// across release, takeover, deletion and server restart. Pass it to the resource you
    /// protect so it can refuse writes from a holder whose lease has ended.
    pub fn fencing_token(&self) -> i64 {
        self.fencing_token
    }

    /// When the lease ends, as the database computed it from its own clock.
    pub fn expires_at(&self) -> DateTime<Utc> {
        *self.expires_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the lease to end `lease` from now (database clock), if the row is still ours
    /// and unexpired; returns the new expiry. [`Error::NotHeld`] when it is not (nothing
    /// is changed then).
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the lease was either extended or left as it was.
    pub async fn extend(&self, lease: Duration) -> Result<DateTime<Utc>> {
        validate_lease(lease)?;
        let shared = &self.pending.shared;
        match DB::extend(
            &shared.pool,
            &shared.sql,
            self.key(),
            self.owner(),
            micros(lease),
        )
        .await?
        {
            Some(expires_at) => {
                *self.expires_at.lock().unwrap_or_else(|e| e.into_inner()) = expires_at;
                Ok(expires_at)
            }
            None => Err(self.not_held()),
        }
    }

    /// Deletes the row if it is still ours. [`Error::NotHeld`] when it is not: it expired
    /// and was taken over, or was deleted; nothing else is deleted then.
    ///
    /// # Cancel safety
    /// If the future is dropped before the database answered, the guard's drop spawns the
    /// same release in the background.
    pub async fn release(mut self) -> Result<()> {
        let shared = Arc::clone(&self.pending.shared);
        let outcome = DB::release(&shared.pool, &shared.sql, self.key(), self.owner()).await;
        if let Err(err) = outcome {
            // Leave the drop armed: it tries once more in the background.
            return Err(err.into());
        }
        self.pending.armed = false;
        tracing::debug!(
            key = self.key(),
            owner = self.owner(),
            fencing_token = self.fencing_token,
            "lock released"
        );
        match outcome {
            Ok(true) => Ok(()),
            _ => Err(self.not_held()),
        }
    }

    fn not_held(&self) -> Error {
        Error::NotHeld {
            key: self.key().to_owned(),
            owner: self.owner().to_owned(),
        }
    }
}
