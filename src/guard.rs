//! [`LockGuard`]: a held lock. Explicit async release; drop as the documented fallback.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::validate_lease;
use crate::core::Core;
use crate::dialect::{Backend, LockId};
use crate::error::{Error, LostReason, Result};
use crate::lease::Lease;
use crate::metrics;
use crate::table::LockTable;

/// A held lock. Release it with [`release`](Self::release).
///
/// While the guard lives, its lease is renewed by its Locker's lease engine (unless
/// renewal was turned off, see [`Locker::auto_renew`](crate::Locker::auto_renew));
/// [`lost`](Self::lost) tells when the lease is gone anyway. A guard keeps its Locker's
/// engine running: it needs no task and no connection of its own.
///
/// # Drop
/// Dropping a guard that was not released stops its renewal and hands the `DELETE` to the
/// Locker's engine, which sends it at once in the background, in one statement with every
/// other guard dropped meanwhile (owner- and token-checked row by row), retrying a failed
/// one until the lease would have ended anyway. That release is best effort and not
/// awaited: if it cannot run (no runtime, database unreachable) the lease simply expires
/// at [`expires_at`](Self::expires_at). Call `release().await` to know it happened.
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
/// let lease = Duration::from_secs(30);
/// let guard = locker.acquire("invoice:42", lease, Duration::from_secs(5)).await?;
/// println!(
///     "{} held by {} with fencing token {} until {}",
///     guard.key(),
///     guard.owner(),
///     guard.fencing_token(), // pass it on to the resource the lock protects
///     guard.expires_at(), // database clock; renewed in the background
/// );
/// let token = guard.fencing_token();
///
/// // Explicit release: Ok only if the lease was still live when the row was deleted.
/// guard.release().await?;
///
/// let next = locker.try_acquire("invoice:42", lease).await?.expect("free again");
/// assert!(next.fencing_token() > token);
/// next.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped; keep it and call release().await"]
pub struct LockGuard<DB: Backend> {
    core: Arc<Core<DB>>,
    lease: Arc<Lease>,
    hold: Hold,
}

/// Where a guard is in giving its hold back; decides what its drop must still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Holding: a drop gives the hold back and, if it was the last, ends the lease.
    Held,
    /// `release` gave the hold back and is ending the lease: a drop finishes that.
    Ending,
    /// Nothing left to do.
    Done,
}

impl<DB: Backend> std::fmt::Debug for LockGuard<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("owner", &self.owner())
            .field("fencing_token", &self.fencing_token())
            .field("expires_at", &self.expires_at())
            .finish()
    }
}

impl<DB: Backend> LockGuard<DB> {
    pub(crate) fn new(core: Arc<Core<DB>>, lease: Arc<Lease>) -> Self {
        LockGuard {
            core,
            lease,
            hold: Hold::Held,
        }
    }

    /// The lease, its hold handed to the caller (for a guard made again from it): the
    /// guard's drop does nothing.
    pub(crate) fn into_lease(mut self) -> Arc<Lease> {
        self.hold = Hold::Done;
        Arc::clone(&self.lease)
    }

    pub(crate) fn lock_id(&self) -> LockId<'_> {
        self.lease.lock_id()
    }

    /// Makes the release keep the row until `min_hold` after the acquisition (database
    /// clock): a job's `lock_at_least_for`.
    pub(crate) fn set_min_hold(&self, min_hold: Duration) {
        self.lease.set_min_hold(min_hold);
    }

    /// The lock table's access layer.
    pub(crate) fn lock_table(&self) -> &LockTable<DB> {
        &self.core.table
    }

    /// Fair mode ([`LockerBuilder::fair`](crate::LockerBuilder::fair)): the ticket this
    /// acquisition waited on; `None` when it won without queueing, or the locker is not
    /// fair. Grants of one key follow their tickets' order.
    pub fn ticket(&self) -> Option<i64> {
        self.lease.ticket()
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.lease.key
    }

    /// This acquisition's owner value, as stored in `lock_value`.
    pub fn owner(&self) -> &str {
        &self.lease.owner
    }

    /// The fencing token: strictly greater than every token issued before for this key,
    /// across release, takeover, deletion and server restart. Pass it to the resource you
    /// protect so it can refuse writes from a holder whose lease has ended.
    pub fn fencing_token(&self) -> i64 {
        self.lease.fencing_token
    }

    /// When the lease ends, as the database last computed it from its own clock (moves
    /// forward with every renewal).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.lease.expires_at()
    }

    /// Why the lease was lost, if it was; `None` while it is held. Past the lease's local
    /// deadline (see [`lost`](Self::lost)) it is `Some` at once, whoever looks.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lease.lost_reason()
    }

    /// `Ok` while the lease is held by this process's clock, [`Error::LockLost`] with the
    /// reason once it is lost (as [`lost_reason`](Self::lost_reason) says): a local check,
    /// no statement. Call it right before an action the database cannot fence, such as a
    /// call to another service: a process frozen past its lease (a GC pause, a stopped
    /// VM) finds out here, before the call, rather than after. Bound that action by
    /// [`remaining`](Self::remaining), and pass the [`fencing_token`](Self::fencing_token)
    /// where the callee can check it (see the README, "Calling another service under a
    /// lock").
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::time::Duration;
    /// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let locker = dblock::Locker::new(pool);
    /// # locker.migrate().await?;
    /// let guard = locker.try_acquire("partner-api", Duration::from_secs(10)).await?.unwrap();
    /// guard.ensure_held()?; // no statement: the lease's local deadline, margin included
    /// let bound = guard.remaining(); // under 10 s: the lease less its margin
    /// assert!(bound > Duration::from_secs(9) && bound < Duration::from_secs(10));
    /// // tokio::time::timeout(bound, partner.call(guard.fencing_token())).await
    /// # guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn ensure_held(&self) -> Result<()> {
        match self.lost_reason() {
            None => Ok(()),
            Some(reason) => Err(Error::LockLost {
                key: self.key().to_owned(),
                reason,
            }),
        }
    }

    /// How long the lease is still this guard's by this process's clock: until its local
    /// deadline, which comes a margin before the database may see it expire
    /// ([`Locker::lease_margin`](crate::Locker::lease_margin)), and moves on with every
    /// renewal. Zero once the lease is lost. Bound work that the database cannot fence by
    /// it (with [`ensure_held`](Self::ensure_held) just before).
    pub fn remaining(&self) -> Duration {
        if self.lost_reason().is_some() {
            return Duration::ZERO;
        }
        self.lease
            .deadline()
            .saturating_duration_since(tokio::time::Instant::now())
    }

    /// Completes with the reason when the lease is lost: the row expired, was taken over
    /// or deleted, or the database stayed unreachable until the lease's local deadline,
    /// which is a margin before the database can see it expire (send time of the last
    /// successful acquire or renewal + lease - [`Locker::lease_margin`](crate::Locker::lease_margin)):
    /// `Unreachable` then, even while a renewal is still in flight (`Expired` if no renewal
    /// had been sent by then: the process itself stalled, frozen or starved). A row taken over or
    /// deleted under a live lease is found at the next renewal. Pending forever while the
    /// lease is held.
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// Sets the lease to end `lease` from now (database clock), if the row is still ours
    /// and unexpired; returns the new expiry. [`Error::NotHeld`] when it is not (nothing is
    /// changed then), and also, without a statement, when the guard's lease has already
    /// ended locally ([`lost_reason`](Self::lost_reason) is `Some`: a loss is never taken
    /// back). [`Error::LockLost`] when the answer came back after the local deadline the
    /// new lease would have had (send time + `lease` - its margin): the guard is lost.
    /// Renewal goes on with the lease the guard was acquired with.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the lease was either extended or left as it was.
    pub async fn extend(&self, lease: Duration) -> Result<DateTime<Utc>> {
        validate_lease(lease)?;
        match self.core.engine.extend(&self.lease, lease).await? {
            Some(expires_at) => Ok(expires_at),
            None => Err(self.not_held()),
        }
    }

    /// Stops renewal (waiting for a renewal in flight), then deletes the row if it is
    /// still ours, on the caller's task.
    /// [`Error::NotHeld`] when it is not: it expired and was taken over, or was deleted;
    /// nothing else is deleted then. [`Error::LockLost`] with [`LostReason::Expired`] when
    /// the row was still ours but its lease had already run out by the database clock
    /// (nobody took it over): the row is deleted all the same, and the error says that
    /// the work under the lock was not protected for its whole length. A nested guard of
    /// a reentrant [`Owner`](crate::Owner) only gives up its hold (`Ok`); the row goes
    /// with the last one, which answers as above.
    ///
    /// # When it fails after the work succeeded
    /// The work is done and stays done: no answer of `release` undoes it, and doing the
    /// work again would do it twice. Log the error and move on.
    /// - Any other error ([`Error::Database`], [`Error::PoolTimeout`]: the statement
    ///   failed, or got no answer by the lease's deadline): renewal has stopped, and the
    ///   Locker keeps sending the release in the background until the lease's deadline.
    ///   If that fails too, the row stays until its lease ends by the database clock, so
    ///   a rival waits at most what was left of the lease (at most one lease), as for a
    ///   holder that crashed.
    /// - [`Error::LockLost`] (`Expired`): the row went, but the lease had run out before
    ///   the release, so a rival may have started in between: writes fenced with
    ///   [`assert_held`](Self::assert_held) and [`commit`](Self::commit) committed only
    ///   while it was held, others were not protected to their end.
    /// - [`Error::NotHeld`]: the lock was lost before the release (taken over or
    ///   deleted), and nothing was deleted. Fenced writes after the loss were refused
    ///   ([`Error::NotHeld`] from `assert_held` or `commit`), so what committed was written
    ///   while it was held.
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dblock::Error> {
    /// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let locker = dblock::Locker::new(pool);
    /// # locker.migrate().await?;
    /// let five = std::time::Duration::from_secs(5);
    /// let guard = locker.acquire("invoice:42", five, five).await?;
    /// // ... the work, done ...
    /// if let Err(err) = guard.release().await {
    ///     // The work stays done; the row goes in the background or at its lease's end.
    ///     eprintln!("release of invoice:42 failed: {err}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// If the future is dropped before the database answered, the guard's drop finishes
    /// the release in the background.
    pub async fn release(mut self) -> Result<()> {
        let span = metrics::release_span(self.key(), self.lock_table().name());
        if !self.lease.unnest() {
            self.hold = Hold::Done;
            span.record("outcome", metrics::NESTED);
            return Ok(());
        }
        self.hold = Hold::Ending;
        metrics::in_span(span, || self.end_lease(), metrics::release_outcome).await
    }

    /// Releases this guard's row and `other`'s in one statement (one commit; the keys in
    /// byte order, this guard's first), each answering as [`release`](Self::release)
    /// does (this guard's answer, then `other`'s; a failed statement's error is this
    /// guard's). Both rows go either way. Not for a reentrant owner's guards (never nested here).
    /// Cancel safe as `release`: a drop before the answer releases both in the background.
    pub(crate) async fn release_with(
        mut self,
        mut other: LockGuard<DB>,
    ) -> (Result<()>, Result<()>) {
        // Each the only hold of its lease (a read-write lock's guards are never a
        // reentrant owner's): given back, the rows go.
        self.lease.unnest();
        other.lease.unnest();
        self.hold = Hold::Ending;
        other.hold = Hold::Ending;
        let span = metrics::release_span(self.key(), self.lock_table().name());
        let release = async {
            let leases = [&*self.lease, &*other.lease];
            let outcome = self.core.engine.release_together(&leases).await;
            match outcome {
                Ok(deleted) => {
                    self.hold = Hold::Done;
                    other.hold = Hold::Done;
                    let first = self.answer(deleted.first().copied().flatten());
                    let second = other.answer(deleted.get(1).copied().flatten());
                    (first, second)
                }
                // Both kept trying in the background (`Ending`, dropped here) until their
                // leases would expire anyway; the statement's error is said once.
                Err(err) => (Err(err), Ok(())),
            }
        };
        let outcome = |(first, second): &(Result<()>, Result<()>)| match first {
            Ok(()) => metrics::release_outcome(second),
            Err(_) => metrics::release_outcome(first),
        };
        metrics::in_span(span, || release, outcome).await
    }

    /// What a release that found `deleted` answers (see [`release`](Self::release)).
    fn answer(&self, deleted: Option<bool>) -> Result<()> {
        match deleted {
            Some(false) => Ok(()),
            Some(true) => Err(Error::LockLost {
                key: self.key().to_owned(),
                reason: LostReason::Expired,
            }),
            None => Err(self.not_held()),
        }
    }

    /// The release of the last hold: renewal stops, the row goes.
    async fn end_lease(mut self) -> Result<()> {
        let outcome = self.core.engine.release(&self.lease).await;
        self.hold = Hold::Done;
        match outcome {
            Ok(Some(false)) => Ok(()),
            Ok(Some(true)) => Err(Error::LockLost {
                key: self.key().to_owned(),
                reason: LostReason::Expired,
            }),
            Ok(None) => Err(self.not_held()),
            Err(err) => {
                // Keep trying in the background until the lease would expire anyway.
                self.release_in_background();
                Err(err)
            }
        }
    }

    fn release_in_background(&self) {
        self.core
            .engine
            .release_in_background(Arc::clone(&self.lease));
    }

    pub(crate) fn not_held(&self) -> Error {
        Error::NotHeld {
            key: self.key().to_owned(),
            owner: self.owner().to_owned(),
        }
    }
}

impl<DB: Backend> Drop for LockGuard<DB> {
    fn drop(&mut self) {
        let last_hold = match self.hold {
            Hold::Held => self.lease.unnest(),
            Hold::Ending => true,
            Hold::Done => false,
        };
        if last_hold {
            self.release_in_background();
        }
    }
}
