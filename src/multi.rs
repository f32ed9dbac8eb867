//! Several keys taken all or nothing: [`Locker::try_acquire_all`], [`Locker::acquire_all`]
//! and their [`MultiGuard`].

use std::time::Duration;

use crate::acquire;
use crate::config::{validate_key, validate_lease, validate_wait};
use crate::dialect::Backend;
use crate::error::{Error, LostReason, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::metrics::{self, Kind};
use crate::several;

/// Most keys one [`Locker::try_acquire_all`] takes.
pub const MAX_KEYS_AT_ONCE: usize = 100;

/// Locks on several keys, taken together by [`Locker::try_acquire_all`] or
/// [`Locker::acquire_all`]: Redisson's `RedissonMultiLock`. One [`LockGuard`] per key (in
/// key order), each with its own fencing token and lease, renewed with the Locker's other
/// leases; [`release`](Self::release) gives all of them back; dropped, each is released
/// in the background as a guard is.
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
/// // A transfer locks both accounts; another transfer between them, in either direction,
/// // waits (it never holds one of the two while waiting for the other).
/// let both = locker.acquire_all(&["account:7", "account:3"], lease, Duration::from_secs(5)).await?;
/// assert_eq!(both.keys().collect::<Vec<_>>(), ["account:3", "account:7"]);
/// assert!(locker.try_acquire_all(&["account:3", "account:9"], lease).await?.is_none());
/// assert!(locker.try_acquire("account:9", lease).await?.is_some()); // untouched by the loser
///
/// let token = both.fencing_token("account:7").expect("one of ours");
/// # let _ = token;
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the locks are released as soon as the guard is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct MultiGuard<DB: Backend> {
    guards: Vec<LockGuard<DB>>,
}

impl<DB: Backend> MultiGuard<DB> {
    /// The keys, in the order they were taken (sorted by bytes, without duplicates).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The guard of each key, in key order.
    pub fn guards(&self) -> &[LockGuard<DB>] {
        &self.guards
    }

    /// The fencing token of `key`, if it is one of the keys.
    pub fn fencing_token(&self, key: &str) -> Option<i64> {
        self.guards
            .iter()
            .find(|guard| guard.key() == key)
            .map(LockGuard::fencing_token)
    }

    /// Completes when the first of the leases is lost: its key and why.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> (String, LostReason) {
        let losses = self
            .guards
            .iter()
            .map(|guard| Box::pin(async move { (guard.key().to_owned(), guard.lost().await) }));
        futures_select_first(losses).await
    }

    /// Releases every key (each owner- and token-checked). `Ok` when every lease was still
    /// live; otherwise the first key's error (the others are released all the same).
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`], key by key: dropping the future drops the guards not yet
    /// released, which are then released in the background.
    pub async fn release(self) -> Result<()> {
        let mut first_error = None;
        for guard in self.guards {
            if let Err(err) = guard.release().await {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The guards, in key order, to release one by one.
    pub fn into_guards(self) -> Vec<LockGuard<DB>> {
        self.guards
    }
}

/// The output of the first of `futures` to complete.
async fn futures_select_first<T, F>(futures: impl Iterator<Item = F>) -> T
where
    F: std::future::Future<Output = T> + Unpin,
{
    let mut futures: Vec<F> = futures.collect();
    std::future::poll_fn(|cx| {
        for future in &mut futures {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(future).poll(cx) {
                return std::task::Poll::Ready(out);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

impl<DB: Backend> Locker<DB> {
    /// One attempt to take every key of `keys` for `lease`, all or nothing, in one
    /// transaction: `Ok(None)` (and nothing held) when any of them is held by another
    /// owner. Keys are taken in byte order whatever the order given, so two callers
    /// taking overlapping sets never wait for each other in a circle; duplicates count
    /// once. Each key gets its own row, lease and fencing token, exactly as
    /// [`try_acquire`](Self::try_acquire) would give them.
    ///
    /// Errors: [`Error::InvalidKey`] (any key), [`Error::InvalidConfig`] (no keys, or more
    /// than [`MAX_KEYS_AT_ONCE`]), [`Error::InvalidDuration`]: nothing is written.
    /// [`Error::Database`]: the transaction or its answer was lost; rows it may have
    /// committed are deleted in the background.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire): if the future is dropped while
    /// the transaction is in flight, it finishes in the background and what it won is
    /// released at once.
    pub async fn try_acquire_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        lease: Duration,
    ) -> Result<Option<MultiGuard<DB>>> {
        let keys = sorted_keys(keys)?;
        validate_lease(lease)?;
        let owner = self.core.new_owner();
        let renew = self.renew_every(lease);
        let attempt = Box::pin(several::attempt_all(
            &self.core, &keys, &owner, lease, renew,
        ));
        let shown = keys.join(", ");
        let won = metrics::try_acquire(&self.core.metrics, Kind::Multi, &shown, attempt).await?;
        Ok(won.map(|leases| self.multi_guard(leases)))
    }

    /// Takes every key of `keys` for `lease` as [`try_acquire_all`](Self::try_acquire_all)
    /// does, waiting up to `wait` (then [`Error::Timeout`], naming the keys); zero makes a
    /// single attempt. It waits in this Locker's queue for the first key (in byte order)
    /// and otherwise paces its attempts as [`acquire`](Self::acquire) does, holding no
    /// key and no pool connection while it waits.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        lease: Duration,
        wait: Duration,
    ) -> Result<MultiGuard<DB>> {
        let keys = sorted_keys(keys)?;
        validate_lease(lease)?;
        validate_wait(wait)?;
        let owner = self.core.new_owner();
        let renew = self.renew_every(lease);
        let core = &self.core;
        // The waiting loop hands back one lease, the first key's; the others wait here.
        // (No await point lies between the attempt's answer and the loop's return in the
        // FIFO queue, so a cancelled wait never drops them unguarded.)
        let others = std::sync::Mutex::new(Vec::new());
        let shown = keys.join(", ");
        let won = Box::pin(acquire::wait_in_queue(
            core,
            &keys[0],
            &keys[0],
            wait,
            async |_| {
                let won = several::attempt_all(core, &keys, &owner, lease, renew).await?;
                Ok(won.map(|mut leases| {
                    let first = leases.remove(0);
                    *others.lock().unwrap_or_else(|e| e.into_inner()) = leases;
                    first
                }))
            },
        ));
        let won = metrics::acquire(&core.metrics, Kind::Multi, &shown, wait, won).await;
        match won {
            Ok(first) => {
                let mut leases = vec![first];
                leases.append(&mut others.lock().unwrap_or_else(|e| e.into_inner()));
                Ok(self.multi_guard(leases))
            }
            Err(Error::Timeout {
                waited,
                attempts,
                held_by,
                held_until,
                held_here,
                ..
            }) => Err(Error::Timeout {
                key: shown,
                waited,
                attempts,
                held_by,
                held_until,
                held_here,
            }),
            Err(err) => Err(err),
        }
    }

    fn multi_guard(&self, leases: Vec<std::sync::Arc<crate::lease::Lease>>) -> MultiGuard<DB> {
        MultiGuard {
            guards: leases.into_iter().map(|lease| self.guard(lease)).collect(),
        }
    }
}

/// `keys`, validated, sorted by bytes and without duplicates.
fn sorted_keys<K: AsRef<str>>(keys: &[K]) -> Result<Vec<String>> {
    if keys.is_empty() || keys.len() > MAX_KEYS_AT_ONCE {
        return Err(Error::InvalidConfig(format!(
            "several-key locks take 1 to {MAX_KEYS_AT_ONCE} keys, not {}",
            keys.len()
        )));
    }
    let mut sorted = Vec::with_capacity(keys.len());
    for key in keys {
        let key = key.as_ref();
        validate_key(key)?;
        sorted.push(key.to_owned());
    }
    sorted.sort_unstable();
    sorted.dedup();
    Ok(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_in_one_order_whatever_the_callers() {
        // Two transfers in opposite directions insert their rows in the same order, so
        // neither waits for a row the other has yet to reach (a database deadlock, then
        // rolled back and sent again, would be the cost of any other order).
        let there = sorted_keys(&["account:7", "account:3", "account:7"]).unwrap();
        let back = sorted_keys(&["account:3", "account:7"]).unwrap();
        assert_eq!(there, ["account:3", "account:7"]);
        assert_eq!(there, back);
        assert!(sorted_keys::<&str>(&[]).is_err());
    }
}
