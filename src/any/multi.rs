//! [`AnyMultiGuard`]: several keys taken all or nothing through an [`AnyLocker`], the
//! backend's [`MultiGuard`].

use std::time::Duration;

use super::held::{any_from, take_tx, tx_of};
use super::{AnyLocker, AnyTransaction, dispatch};
use crate::error::{Error, LostReason, Result};
use crate::multi::MultiGuard;

/// Locks on several keys, taken together by [`AnyLocker::try_acquire_all`] or
/// [`AnyLocker::acquire_all`]: the backend's [`MultiGuard`], one lease and fencing token
/// per key (in key order), renewed, fenced and released as its guards are; dropped, each
/// is released in the background.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let locker = dblock::AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let lease = Duration::from_secs(30);
/// // A transfer locks both accounts, in one order whatever the order given.
/// let both = locker.acquire_all(&["account:7", "account:3"], lease, Duration::from_secs(5)).await?;
/// assert_eq!(both.keys(), ["account:3", "account:7"]);
/// assert!(locker.try_acquire_all(&["account:3", "account:9"], lease).await?.is_none());
///
/// let mut tx = locker.begin().await?;
/// both.assert_held(&mut tx).await?; // every key, in one statement
/// both.commit(tx).await?;
/// assert!(both.fencing_token("account:7").is_some());
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the locks are released as soon as the guard is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct AnyMultiGuard(MultiOf);

#[derive(Debug)]
enum MultiOf {
    #[cfg(feature = "postgres")]
    Postgres(MultiGuard<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(MultiGuard<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(MultiGuard<sqlx::Sqlite>),
}

any_from!(AnyMultiGuard, MultiOf, MultiGuard);

impl AnyLocker {
    /// [`Locker::try_acquire_all`](crate::Locker::try_acquire_all): every key of `keys`,
    /// all or nothing, in one attempt; `Ok(None)` (and nothing held) when any is held.
    ///
    /// # Cancel safety
    /// As [`Locker::try_acquire_all`](crate::Locker::try_acquire_all): cancel safe.
    pub async fn try_acquire_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        lease: Duration,
    ) -> Result<Option<AnyMultiGuard>> {
        dispatch!(self, AnyLocker, locker => {
            Ok(locker.try_acquire_all(keys, lease).await?.map(AnyMultiGuard::from))
        })
    }

    /// [`Locker::acquire_all`](crate::Locker::acquire_all): waits up to `wait`, then
    /// [`Error::Timeout`] naming the keys.
    ///
    /// # Cancel safety
    /// As [`Locker::acquire_all`](crate::Locker::acquire_all): cancel safe.
    pub async fn acquire_all<K: AsRef<str>>(
        &self,
        keys: &[K],
        lease: Duration,
        wait: Duration,
    ) -> Result<AnyMultiGuard> {
        dispatch!(self, AnyLocker, locker => {
            locker.acquire_all(keys, lease, wait).await.map(AnyMultiGuard::from)
        })
    }
}

impl AnyMultiGuard {
    /// [`MultiGuard::keys`]: in the order they were taken (sorted by bytes, without
    /// duplicates).
    pub fn keys(&self) -> Vec<&str> {
        dispatch!(&self.0, MultiOf, multi => multi.keys().collect())
    }

    /// [`MultiGuard::fencing_token`]: the fencing token of `key`, if it is one of the keys.
    pub fn fencing_token(&self, key: &str) -> Option<i64> {
        dispatch!(&self.0, MultiOf, multi => multi.fencing_token(key))
    }

    /// [`MultiGuard::lost_reason`]: the first lost key and why; `None` while all are held.
    pub fn lost_reason(&self) -> Option<(String, LostReason)> {
        dispatch!(&self.0, MultiOf, multi => multi.lost_reason())
    }

    /// [`MultiGuard::ensure_held`]: a local check of every key, no statement.
    pub fn ensure_held(&self) -> Result<()> {
        dispatch!(&self.0, MultiOf, multi => multi.ensure_held())
    }

    /// [`MultiGuard::remaining`]: the shortest lease left, by this process's clock.
    pub fn remaining(&self) -> Duration {
        dispatch!(&self.0, MultiOf, multi => multi.remaining())
    }

    /// [`MultiGuard::lost`]: completes when the first lease is lost, with its key.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> (String, LostReason) {
        dispatch!(&self.0, MultiOf, multi => multi.lost().await)
    }

    /// [`MultiGuard::assert_held`] in `tx`: every key still this guard's, in one
    /// statement, or [`Error::NotHeld`] naming one that is not.
    /// [`Error::InvalidConfig`] if `tx` is another database's (nothing is sent).
    ///
    /// # Cancel safety
    /// As [`MultiGuard::assert_held`]: a dropped check leaves `tx` to its owner.
    pub async fn assert_held(&self, tx: &mut AnyTransaction) -> Result<()> {
        dispatch!(&self.0, MultiOf, multi => multi.assert_held(tx_of(tx)?).await)
    }

    /// [`MultiGuard::commit`]: commits `tx`, reading a conflict rollback as
    /// [`Error::NotHeld`] when a key is gone. [`Error::InvalidConfig`] if `tx` is
    /// another database's (it is rolled back).
    ///
    /// # Cancel safety
    /// As [`MultiGuard::commit`]: dropped before the answer, the transaction may or may
    /// not have committed.
    pub async fn commit(&self, tx: AnyTransaction) -> Result<()> {
        dispatch!(&self.0, MultiOf, multi => multi.commit(take_tx(tx)?).await)
    }

    /// [`MultiGuard::explain`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn explain(&self, err: sqlx::Error) -> Error {
        dispatch!(&self.0, MultiOf, multi => multi.explain(err).await)
    }

    /// [`MultiGuard::release`]: every key; the first key's error, if any.
    ///
    /// # Cancel safety
    /// As [`MultiGuard::release`]: the guards not yet released are released in the
    /// background.
    pub async fn release(self) -> Result<()> {
        dispatch!(self.0, MultiOf, multi => multi.release().await)
    }
}
