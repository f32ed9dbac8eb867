//! [`AnyTransaction`]: a transaction of an [`AnyLocker`]'s database, for fencing through
//! the Any guards (`assert_held`, `commit`) without naming the backend. The guards'
//! side takes the backend's own transaction back out of it ([`TxOf`]), or says that the
//! transaction is another database's.

use sqlx::Transaction;

use super::{AnyLocker, dispatch};
use crate::dialect::Backend;
use crate::error::{Error, Result};

/// A transaction on an [`AnyLocker`]'s database, begun by [`AnyLocker::begin`] (or made
/// from a transaction of your own: `AnyTransaction::from(tx)`). Run your writes in the
/// backend's transaction ([`as_postgres`](Self::as_postgres),
/// [`as_mysql`](Self::as_mysql), [`as_sqlite`](Self::as_sqlite), or a `match`: the SQL is
/// the database's own), and fence them with an Any guard's `assert_held(&mut tx)` and
/// `commit(tx)`, as [`LockGuard::assert_held`](crate::LockGuard::assert_held) and
/// [`LockGuard::commit`](crate::LockGuard::commit) do with the backend's transaction.
///
/// A guard given a transaction of another backend answers [`Error::InvalidConfig`]
/// and writes nothing (a transaction moved into `commit` is rolled back then).
/// Dropped without [`commit`](Self::commit), it is rolled back, as sqlx's is.
/// A variant exists only with its cargo feature, hence `#[non_exhaustive]`.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dblock::AnyLocker;
///
/// let locker = AnyLocker::connect("sqlite::memory:").await?;
/// locker.migrate().await?;
/// let guard = locker.try_acquire("invoice:42", Duration::from_secs(30)).await?.unwrap();
///
/// let mut tx = locker.begin().await?;
/// guard.assert_held(&mut tx).await?; // the row is ours, and stays so until the commit
/// if let Some(sqlite) = tx.as_sqlite() {
///     // The protected write, in the database's own SQL.
///     dblock::sqlx::query("SELECT 1").execute(&mut **sqlite).await?;
/// }
/// guard.commit(tx).await?; // a conflict rollback reads as NotHeld when the lock went
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyTransaction {
    /// A PostgreSQL transaction.
    #[cfg(feature = "postgres")]
    Postgres(Transaction<'static, sqlx::Postgres>),
    /// A MySQL / MariaDB transaction.
    #[cfg(feature = "mysql")]
    MySql(Transaction<'static, sqlx::MySql>),
    /// A SQLite transaction.
    #[cfg(feature = "sqlite")]
    Sqlite(Transaction<'static, sqlx::Sqlite>),
}

impl AnyTransaction {
    /// The database's name as sqlx gives it, as [`AnyLocker::backend`].
    pub fn backend(&self) -> &'static str {
        fn name<DB: Backend>(_: &Transaction<'static, DB>) -> &'static str {
            <DB as sqlx::Database>::NAME
        }
        dispatch!(self, AnyTransaction, tx => name(tx))
    }

    /// The PostgreSQL transaction, or `None` if it is another database's.
    #[cfg(feature = "postgres")]
    pub fn as_postgres(&mut self) -> Option<&mut Transaction<'static, sqlx::Postgres>> {
        sqlx::Postgres::borrow(self).ok()
    }

    /// The MySQL / MariaDB transaction, or `None` if it is another database's.
    #[cfg(feature = "mysql")]
    pub fn as_mysql(&mut self) -> Option<&mut Transaction<'static, sqlx::MySql>> {
        sqlx::MySql::borrow(self).ok()
    }

    /// The SQLite transaction, or `None` if it is another database's.
    #[cfg(feature = "sqlite")]
    pub fn as_sqlite(&mut self) -> Option<&mut Transaction<'static, sqlx::Sqlite>> {
        sqlx::Sqlite::borrow(self).ok()
    }

    /// Commits, without reading a failure as a lost lock (a guard's `commit` does that).
    ///
    /// # Cancel safety
    /// As sqlx's `Transaction::commit`: dropped before the answer, the transaction may
    /// or may not have committed.
    pub async fn commit(self) -> Result<()> {
        dispatch!(self, AnyTransaction, tx => Ok(tx.commit().await?))
    }

    /// Rolls back.
    ///
    /// # Cancel safety
    /// Cancel safe: a transaction whose rollback was dropped is rolled back when its
    /// connection is next used or closed, as sqlx's is.
    pub async fn rollback(self) -> Result<()> {
        dispatch!(self, AnyTransaction, tx => Ok(tx.rollback().await?))
    }
}

impl AnyLocker {
    /// Begins a transaction on this locker's database (a connection of its pool), for
    /// writes fenced by an Any guard: see [`AnyTransaction`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future returns its connection to the pool.
    pub async fn begin(&self) -> Result<AnyTransaction> {
        dispatch!(self, AnyLocker, locker => Ok(locker.pool().begin().await?.into()))
    }
}

/// A backend whose transactions an [`AnyTransaction`] carries: the guards' side of the
/// enum, so that a guard of database `DB` gets its own transaction back, or a typed error.
pub(crate) trait TxOf: Backend {
    /// The transaction, if it is this database's.
    fn borrow(tx: &mut AnyTransaction) -> Result<&mut Transaction<'static, Self>>;
    /// The transaction, moved out, if it is this database's.
    fn take(tx: AnyTransaction) -> Result<Transaction<'static, Self>>;
}

/// Implements [`TxOf`] and `From` for one backend's variant. With one backend compiled
/// in, the other-backend arm cannot happen (hence the `allow`).
macro_rules! tx_of {
    ($feature:literal, $db:ty, $variant:ident) => {
        #[cfg(feature = $feature)]
        impl TxOf for $db {
            #[allow(unreachable_patterns)]
            fn borrow(tx: &mut AnyTransaction) -> Result<&mut Transaction<'static, Self>> {
                match tx {
                    AnyTransaction::$variant(tx) => Ok(tx),
                    other => Err(mismatch::<Self>(other)),
                }
            }

            #[allow(unreachable_patterns)]
            fn take(tx: AnyTransaction) -> Result<Transaction<'static, Self>> {
                match tx {
                    AnyTransaction::$variant(tx) => Ok(tx),
                    other => Err(mismatch::<Self>(&other)),
                }
            }
        }

        #[cfg(feature = $feature)]
        impl From<Transaction<'static, $db>> for AnyTransaction {
            fn from(tx: Transaction<'static, $db>) -> Self {
                AnyTransaction::$variant(tx)
            }
        }
    };
}

tx_of!("postgres", sqlx::Postgres, Postgres);
tx_of!("mysql", sqlx::MySql, MySql);
tx_of!("sqlite", sqlx::Sqlite, Sqlite);

/// The error of a guard of `DB` handed a transaction of another database.
#[allow(dead_code)] // unused with one backend compiled in
fn mismatch<DB: Backend>(tx: &AnyTransaction) -> Error {
    Error::InvalidConfig(format!(
        "a {} lock cannot be fenced in a {} transaction: begin it with the same \
         AnyLocker (AnyLocker::begin)",
        <DB as sqlx::Database>::NAME,
        tx.backend()
    ))
}
