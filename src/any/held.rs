//! The methods every Any guard shares with the backend's guard (a [`LockGuard`], or a
//! guard that derefs to one), written once: each matches the private enum's variant and
//! calls the backend's method, so no lock logic lives here. A guard type lists its own
//! extra methods (`release`, `number`, `term`, ...) beside them.
//!
//! [`LockGuard`]: crate::LockGuard

use sqlx::Transaction;

use super::AnyTransaction;
use super::tx::TxOf;
use crate::error::Result;

/// The backend's own transaction in `tx`, for a guard of `DB`; a typed error when `tx` is
/// another database's.
pub(super) fn tx_of<DB: TxOf>(tx: &mut AnyTransaction) -> Result<&mut Transaction<'static, DB>> {
    DB::borrow(tx)
}

/// `tx` moved out as `DB`'s transaction; a typed error (and `tx` rolled back, dropped)
/// when it is another database's.
pub(super) fn take_tx<DB: TxOf>(tx: AnyTransaction) -> Result<Transaction<'static, DB>> {
    DB::take(tx)
}

/// `impl From<$typed<DB>> for $any` for each compiled-in backend, wrapping it in the
/// private enum `$of`.
macro_rules! any_from {
    ($any:ident, $of:ident, $typed:ident) => {
        #[cfg(feature = "postgres")]
        impl From<$typed<sqlx::Postgres>> for $any {
            fn from(inner: $typed<sqlx::Postgres>) -> Self {
                $any($of::Postgres(inner))
            }
        }

        #[cfg(feature = "mysql")]
        impl From<$typed<sqlx::MySql>> for $any {
            fn from(inner: $typed<sqlx::MySql>) -> Self {
                $any($of::MySql(inner))
            }
        }

        #[cfg(feature = "sqlite")]
        impl From<$typed<sqlx::Sqlite>> for $any {
            fn from(inner: $typed<sqlx::Sqlite>) -> Self {
                $any($of::Sqlite(inner))
            }
        }
    };
}
pub(super) use any_from;

/// The lease's state: `fencing_token`, `lost_reason`, `ensure_held`, `remaining`, `lost`,
/// as the typed guard `$typed` (named in the docs) has them, on `$self_.0`'s enum `$of`.
macro_rules! lease_methods {
    ($of:ident, $typed:literal) => {
        #[doc = concat!("[`", $typed, "::fencing_token`](crate::", $typed, "::fencing_token): pass it to the resource the lock protects.")]
        pub fn fencing_token(&self) -> i64 {
            super::dispatch!(&self.0, $of, inner => inner.fencing_token())
        }

        #[doc = concat!("[`", $typed, "::lost_reason`](crate::", $typed, "::lost_reason): `None` while held.")]
        pub fn lost_reason(&self) -> Option<crate::error::LostReason> {
            super::dispatch!(&self.0, $of, inner => inner.lost_reason())
        }

        #[doc = concat!("[`", $typed, "::ensure_held`](crate::", $typed, "::ensure_held): a local check, no statement.")]
        pub fn ensure_held(&self) -> crate::error::Result<()> {
            super::dispatch!(&self.0, $of, inner => inner.ensure_held())
        }

        #[doc = concat!("[`", $typed, "::remaining`](crate::", $typed, "::remaining): the lease left by this process's clock.")]
        pub fn remaining(&self) -> std::time::Duration {
            super::dispatch!(&self.0, $of, inner => inner.remaining())
        }

        #[doc = concat!("[`", $typed, "::lost`](crate::", $typed, "::lost).")]
        ///
        /// # Cancel safety
        /// Cancel safe: it only watches.
        pub async fn lost(&self) -> crate::error::LostReason {
            super::dispatch!(&self.0, $of, inner => inner.lost().await)
        }
    };
}
pub(super) use lease_methods;

/// The row's calls, as [`LockGuard`](crate::LockGuard) has them (the typed guards deref
/// to one): `key`, `owner`, `expires_at`, `extend`, and the fencing in a transaction of
/// the caller's, `assert_held`, `commit`, `explain`.
macro_rules! row_methods {
    ($of:ident) => {
        /// [`LockGuard::key`](crate::LockGuard::key).
        pub fn key(&self) -> &str {
            super::dispatch!(&self.0, $of, inner => inner.key())
        }

        /// [`LockGuard::owner`](crate::LockGuard::owner).
        pub fn owner(&self) -> &str {
            super::dispatch!(&self.0, $of, inner => inner.owner())
        }

        /// [`LockGuard::expires_at`](crate::LockGuard::expires_at) (database clock).
        pub fn expires_at(&self) -> chrono::DateTime<chrono::Utc> {
            super::dispatch!(&self.0, $of, inner => inner.expires_at())
        }

        /// [`LockGuard::extend`](crate::LockGuard::extend).
        ///
        /// # Cancel safety
        /// As [`LockGuard::extend`](crate::LockGuard::extend): the lease was either
        /// extended or left as it was.
        pub async fn extend(
            &self,
            lease: std::time::Duration,
        ) -> crate::error::Result<chrono::DateTime<chrono::Utc>> {
            super::dispatch!(&self.0, $of, inner => inner.extend(lease).await)
        }

        /// [`LockGuard::assert_held`](crate::LockGuard::assert_held) in `tx`: `Ok` if the
        /// row is still this guard's, locking it until `tx` ends;
        /// [`Error::NotHeld`](crate::Error::NotHeld) if not (then roll `tx` back).
        /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) if `tx` is another
        /// database's (nothing is sent).
        ///
        /// # Cancel safety
        /// As [`LockGuard::assert_held`](crate::LockGuard::assert_held): a dropped check
        /// leaves `tx` to its owner, who should roll it back.
        pub async fn assert_held(
            &self,
            tx: &mut super::AnyTransaction,
        ) -> crate::error::Result<()> {
            super::dispatch!(&self.0, $of, inner => {
                inner.assert_held(super::held::tx_of(tx)?).await
            })
        }

        /// [`LockGuard::commit`](crate::LockGuard::commit): commits `tx`, reading a
        /// conflict rollback as [`Error::NotHeld`](crate::Error::NotHeld) when the lock
        /// is gone. [`Error::InvalidConfig`](crate::Error::InvalidConfig) if `tx` is
        /// another database's (it is rolled back).
        ///
        /// # Cancel safety
        /// As [`LockGuard::commit`](crate::LockGuard::commit): dropped before the answer,
        /// the transaction may or may not have committed.
        pub async fn commit(&self, tx: super::AnyTransaction) -> crate::error::Result<()> {
            super::dispatch!(&self.0, $of, inner => {
                inner.commit(super::held::take_tx(tx)?).await
            })
        }

        /// [`LockGuard::explain`](crate::LockGuard::explain): `err`, from a statement of
        /// your own in a fenced transaction, as [`Error::NotHeld`](crate::Error::NotHeld)
        /// when it is a conflict rollback and the lock is gone.
        ///
        /// # Cancel safety
        /// Cancel safe: it only reads.
        pub async fn explain(&self, err: sqlx::Error) -> crate::error::Error {
            super::dispatch!(&self.0, $of, inner => inner.explain(err).await)
        }
    };
}
pub(super) use row_methods;
