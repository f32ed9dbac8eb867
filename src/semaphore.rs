//! [`Semaphore`]: at most N holders of one name at once, each permit a lease of its own.
//!
//! A semaphore of N permits is N rows of the lock table at most, keyed
//! `<name>~permit-<i>-of-<N>`: a permit is one of those rows, taken, renewed, fenced and
//! released exactly as a mutex's row is (so no more than N can be live, and a crashed
//! holder's permit comes back when its lease ends, by the database clock).

use std::collections::HashSet;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::acquire::{self, Gate};
use crate::admin::LockInfo;
use crate::config::{validate_lease, validate_wait};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::locker::Locker;
use crate::metrics::{self, Kind};
use crate::primitive::{group_key, member_key, validate_name};

/// Most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1000;

/// The longest suffix of a permit's key: `permit-999-of-1000`.
const LONGEST_SUFFIX: usize = "permit-999-of-1000".len();

/// Up to `permits` holders of one name at once, across processes: Redisson's
/// `RPermitExpirableSemaphore`, Curator's `InterProcessSemaphoreV2`, DistributedLock's
/// `DistributedSemaphore`. Made by [`Locker::semaphore`]; cheap, it touches no database.
///
/// Each [`Permit`] is a lease of its own, renewed with the Locker's other leases, with
/// its own fencing token and `lost()` signal; a holder that crashes gives its permit back
/// when its lease ends. A semaphore of N permits is at most N rows of the lock table,
/// keyed `<name>~permit-<i>-of-<N>` (so [`Locker::list`] and the CLI show who holds
/// which permit).
///
/// # The number of permits
/// The count is part of every permit's row. Every handle reads the live permits before its
/// first acquisition, and every acquisition that finds its first choice taken reads them
/// again; one that finds a live permit taken with another count fails with
/// [`Error::PermitsMismatch`] and writes nothing. Two handles with different counts that
/// both start on an idle semaphore in the same instant are not caught: give a name one
/// count everywhere (a constant, or configuration shared by the services).
///
/// # Waiting
/// [`acquire`](Self::acquire) waits in this Locker's FIFO queue for the semaphore, also
/// on a [fair](crate::LockerBuilder::fair) Locker (tickets order the waiters of one row):
/// a permit released through this Locker hands the turn on at once. On PostgreSQL a
/// waiter also watches one permit (picked at random), whose release in any process wakes
/// it through the Locker's listener; other releases elsewhere are found by the waiting
/// loop's paced attempts ([`RetryPolicy`](crate::RetryPolicy), at most its `max` apart).
/// While nobody of this Locker waits, an acquisition first tries without queueing.
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
/// // At most two exports at a time, across every replica of the service.
/// let exports = locker.semaphore("exports", 2);
/// let lease = Duration::from_secs(30);
/// let first = exports.try_acquire(lease).await?.expect("2 free");
/// let second = exports.acquire(lease, Duration::from_secs(5)).await?;
/// assert!(exports.try_acquire(lease).await?.is_none()); // both permits are out
/// assert_eq!(exports.holders().await?.len(), 2);
///
/// let (number, token) = (first.number(), first.fencing_token());
/// first.release().await?; // a waiter of this Locker would get it at once
/// let third = exports.try_acquire(lease).await?.expect("one came back");
/// assert_eq!(third.number(), number);
/// assert!(third.fencing_token() > token); // each permit's tokens rise
/// # second.release().await?;
/// # third.release().await?;
/// # Ok(()) }
/// ```
pub struct Semaphore<DB: Backend> {
    locker: Locker<DB>,
    name: String,
    permits: u32,
    /// Whether this handle has read the live permits and found its count.
    checked: AtomicBool,
    /// The permit the next attempt tries first: handles start at random places and move
    /// on, so that they rarely try the same row.
    next: AtomicU32,
}

impl<DB: Backend> Clone for Semaphore<DB> {
    fn clone(&self) -> Self {
        Semaphore {
            locker: self.locker.clone(),
            name: self.name.clone(),
            permits: self.permits,
            checked: AtomicBool::new(self.checked.load(Ordering::Relaxed)),
            next: AtomicU32::new(fastrand::u32(..)),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Semaphore<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// A held permit of a [`Semaphore`]: a [`LockGuard`] on the permit's row (it derefs to
/// one, for [`fencing_token`](LockGuard::fencing_token), [`lost`](LockGuard::lost),
/// [`assert_held`](LockGuard::assert_held) and the rest), released with
/// [`release`](Self::release); dropped, it is released in the background as a guard is.
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
/// let calls = locker.semaphore("partner-api", 3);
/// let permit = calls.try_acquire(Duration::from_secs(10)).await?.expect("free");
/// assert!(permit.number() < 3);
/// assert_eq!(permit.key(), format!("partner-api~permit-{}-of-3", permit.number()));
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the permit is released as soon as it is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct Permit<DB: Backend> {
    guard: LockGuard<DB>,
    number: u32,
}

impl<DB: Backend> Deref for Permit<DB> {
    type Target = LockGuard<DB>;

    fn deref(&self) -> &LockGuard<DB> {
        &self.guard
    }
}

impl<DB: Backend> Permit<DB> {
    /// Which of the semaphore's permits this is, from 0.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Gives the permit back: as [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }

    /// The guard on the permit's row.
    pub fn into_guard(self) -> LockGuard<DB> {
        self.guard
    }
}

impl<DB: Backend> Locker<DB> {
    /// The semaphore `name` with `permits` permits (1 to [`MAX_PERMITS`]): see
    /// [`Semaphore`]. Touches no database; the name and count are checked by the first
    /// call that would (an invalid one fails it with [`Error::InvalidKey`] or
    /// [`Error::InvalidConfig`], writing nothing). The name is a key without `~`, at most
    /// 109 bytes.
    pub fn semaphore(&self, name: &str, permits: u32) -> Semaphore<DB> {
        Semaphore {
            locker: self.clone(),
            name: name.to_owned(),
            permits,
            checked: AtomicBool::new(false),
            next: AtomicU32::new(fastrand::u32(..)),
        }
    }
}

impl<DB: Backend> Semaphore<DB> {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn validate(&self) -> Result<()> {
        validate_name(&self.name, LONGEST_SUFFIX)?;
        if !(1..=MAX_PERMITS).contains(&self.permits) {
            return Err(Error::InvalidConfig(format!(
                "semaphore {:?}: permits must be between 1 and {MAX_PERMITS}, not {}",
                self.name, self.permits
            )));
        }
        Ok(())
    }

    fn permit_key(&self, number: u32) -> String {
        member_key(&self.name, &format!("permit-{number}-of-{}", self.permits))
    }

    /// One attempt at a permit for `lease`: `Ok(None)` when all are held.
    ///
    /// It tries one permit's row (one statement when that permit is free, two on MySQL
    /// and SQLite, as the mutex's attempt); if that one is held it reads the live permits
    /// and tries the free ones. A permit whose lease has run out is free.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidConfig`], [`Error::InvalidDuration`]
    /// and [`Error::PermitsMismatch`] (nothing is written), [`Error::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::try_acquire`]: a permit the database granted to a
    /// dropped future is released at once in the background.
    pub async fn try_acquire(&self, lease: Duration) -> Result<Option<Permit<DB>>> {
        self.validate()?;
        validate_lease(lease)?;
        let owner = self.locker.core.new_owner();
        let attempt = Box::pin(self.attempt(&owner, lease));
        let metrics = &self.locker.core.metrics;
        let won = metrics::try_acquire(metrics, Kind::Semaphore, &self.name, attempt).await?;
        Ok(won.map(|lease| self.permit(lease)))
    }

    /// A permit for `lease`, waiting up to `wait` (then [`Error::Timeout`], naming the
    /// queue `<name>~`); zero makes a single attempt. Holds no pool connection while it
    /// waits. See [Waiting](Semaphore#waiting).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::acquire`]: a cancelled waiter leaves the queue at once.
    pub async fn acquire(&self, lease: Duration, wait: Duration) -> Result<Permit<DB>> {
        self.validate()?;
        validate_lease(lease)?;
        validate_wait(wait)?;
        let owner = self.locker.core.new_owner();
        let queue = group_key(&self.name);
        let core = &self.locker.core;
        // After a lost attempt the waiting loop marks this permit's row (PostgreSQL), so
        // that its release in any process wakes the queue; one picked at random, so that
        // the waiters of several processes watch different permits.
        let watched = self.permit_key(fastrand::u32(..self.permits));
        let won = Box::pin(acquire::wait_in_queue(
            core,
            &queue,
            &watched,
            wait,
            async |_| self.attempt(&owner, lease).await,
        ));
        let won = metrics::acquire(&core.metrics, Kind::Semaphore, &self.name, wait, won).await?;
        // Another permit may be free: the next waiter tries at once rather than waiting
        // for a release.
        core.queues.next_in_group(&queue);
        Ok(self.permit(won))
    }

    /// The live permits, in key order: who holds which, with their fencing tokens and
    /// leases (database clock). Expired rows not yet taken over are left out.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holders(&self) -> Result<Vec<LockInfo>> {
        self.validate()?;
        let prefix = member_key(&self.name, "permit-");
        let core = &self.locker.core;
        let rows = core
            .table
            .list(&prefix, None, Some(false), MAX_PERMITS)
            .await?;
        Ok(rows.into_iter().map(LockInfo::from).collect())
    }

    /// How many permits are free now (a read: it may change at once).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn available(&self) -> Result<u32> {
        let taken = self.live_permits().await?.len();
        Ok(self
            .permits
            .saturating_sub(u32::try_from(taken).unwrap_or(u32::MAX)))
    }

    fn permit(&self, lease: Arc<Lease>) -> Permit<DB> {
        let number = permit_number(&lease.key).unwrap_or_default().0;
        Permit {
            guard: self.locker.guard(lease),
            number,
        }
    }

    /// The numbers of the live permits, after checking that each was taken with this
    /// handle's count.
    async fn live_permits(&self) -> Result<HashSet<u32>> {
        let mut live = HashSet::new();
        for holder in self.holders().await? {
            let Some((number, count)) = permit_number(&holder.key) else {
                continue; // not a permit's key (a plain-SQL client's row)
            };
            if count != self.permits {
                return Err(Error::PermitsMismatch {
                    name: self.name.clone(),
                    permits: self.permits,
                    found: count,
                });
            }
            live.insert(number);
        }
        self.checked.store(true, Ordering::Relaxed);
        Ok(live)
    }

    /// One attempt for `owner`: the next permit in turn, then, if that one is held, the
    /// free ones, in random order.
    async fn attempt(&self, owner: &str, lease: Duration) -> Result<Option<Arc<Lease>>> {
        let taken = if self.checked.load(Ordering::Relaxed) {
            None
        } else {
            Some(self.live_permits().await?)
        };
        let first = self.next.fetch_add(1, Ordering::Relaxed) % self.permits;
        let tried_first = match &taken {
            Some(live) if live.contains(&first) => false,
            _ => {
                if let Some(won) = self.try_permit(first, owner, lease).await? {
                    return Ok(Some(won));
                }
                true
            }
        };
        let live = match taken {
            Some(live) if !tried_first => live,
            _ => self.live_permits().await?,
        };
        let mut free: Vec<u32> = (0..self.permits)
            .filter(|number| !(live.contains(number) || (tried_first && *number == first)))
            .collect();
        fastrand::shuffle(&mut free);
        for number in free {
            if let Some(won) = self.try_permit(number, owner, lease).await? {
                self.next.store(number + 1, Ordering::Relaxed);
                return Ok(Some(won));
            }
        }
        Ok(None)
    }

    async fn try_permit(
        &self,
        number: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Arc<Lease>>> {
        let key = self.permit_key(number);
        let mut gate: Gate = None;
        self.locker
            .attempt(&key, owner, lease, None, &mut gate)
            .await
    }
}

/// `(number, count)` of a permit's key `<name>~permit-<number>-of-<count>`.
fn permit_number(key: &str) -> Option<(u32, u32)> {
    let (_, part) = key.rsplit_once(crate::queue::GROUP_MARK)?;
    let (number, count) = part.strip_prefix("permit-")?.split_once("-of-")?;
    Some((number.parse().ok()?, count.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_keys_read_back() {
        assert_eq!(permit_number("exports~permit-2-of-3"), Some((2, 3)));
        assert_eq!(permit_number("a~b~permit-0-of-1000"), Some((0, 1000)));
        assert_eq!(permit_number("exports~permit-x-of-3"), None);
        assert_eq!(permit_number("exports"), None);
        assert_eq!(LONGEST_SUFFIX, 18);
    }
}
