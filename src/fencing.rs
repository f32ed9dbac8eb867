//! Fencing inside the caller's own transaction: [`LockGuard::assert_held`], and
//! [`LockGuard::commit`] / [`LockGuard::explain`], which read a conflict rollback of that
//! transaction as the lost lock it may be; the same for all the keys of a [`MultiGuard`].

use sqlx::Transaction;

use crate::dialect::Backend;
use crate::error::{Error, LostReason, Result};
use crate::guard::LockGuard;
use crate::multi::MultiGuard;
use crate::retry::by_deadline;

impl<DB: Backend> LockGuard<DB> {
    /// Checks, inside the caller's write transaction `tx`, that this lock is still held:
    /// the row has this guard's owner and fencing token and an unexpired lease by the
    /// database clock. It also locks that row until `tx` ends, so no takeover, release or
    /// renewal can commit in between on the same server: call it before the writes it
    /// protects, commit after it (with [`commit`](Self::commit)), and those writes commit
    /// only if the lock was still ours. If the lease runs out while `tx` is open, the next
    /// holder's acquisition waits for `tx` to end, so its writes come after yours.
    ///
    /// The row stays locked until `tx` ends, live lease or not: an acquisition attempt
    /// on this key from anywhere waits for `tx` (so a rival's `try_acquire` can take as
    /// long as your transaction; on MySQL/MariaDB at most `innodb_lock_wait_timeout`),
    /// and this lease cannot be renewed meanwhile: the Locker's batched renewal skips
    /// the locked row (its other leases are renewed as usual) and retries it briefly
    /// until the lease's deadline, where this guard is lost as
    /// [`LostReason::Unreachable`](crate::LostReason::Unreachable). Keep such
    /// transactions shorter than what the lease has left.
    ///
    /// If `tx`'s connection goes half-open (a dead peer or a partition: nothing closes
    /// the socket), the server keeps the row locked until it notices, about two hours on
    /// default TCP keepalive settings. On PostgreSQL the check therefore sets
    /// `idle_in_transaction_session_timeout` for `tx` only (`set_config(.., true)`, in
    /// the same statement) to what the lease has left by the database clock, unless
    /// yours is shorter: a session that then sits idle in `tx` that long is ended by the
    /// server (your next statement fails, read by [`explain`](Self::explain) as
    /// [`Error::NotHeld`] once the lease is gone; the connection is closed), which frees the
    /// row; by that time the lease has run out, and the fence could no longer be
    /// trusted. On MariaDB set `idle_transaction_timeout` (seconds, at most your leases'
    /// length) on the connections you fence transactions on; MySQL 8 has no such
    /// setting (`wait_timeout` ends any idle session). On SQLite there is no connection
    /// to lose, but `tx` holds the database's write lock: every writer of the file,
    /// renewal of every lease included, waits until it ends.
    ///
    /// On a MariaDB Galera cluster the row lock is the node's own: a rival on another
    /// node takes an expired lock at once, and Galera's certification lets only one of
    /// the two transactions commit. When the takeover wins, `tx` is rolled back (error
    /// 1213 at its next statement or at `COMMIT`): your writes still commit only if the
    /// lock was ours, but the refusal arrives as a database error, so end `tx` with
    /// [`commit`](Self::commit) and pass errors of your own statements through
    /// [`explain`](Self::explain) to see it as [`Error::NotHeld`].
    ///
    /// `tx` must be on the database that holds the lock table. PostgreSQL locks the row
    /// `FOR SHARE`, MySQL/MariaDB `LOCK IN SHARE MODE`. On a MariaDB Galera cluster
    /// (`wsrep_on`, asked once per Locker at the first check) it writes the row instead
    /// (the lease's end moves by one microsecond): Galera certifies only rows written, and
    /// a read-only check let a stale holder's transaction commit after another node's
    /// takeover. (A write on one server would deadlock with a rival's acquisition attempt
    /// on the held key, which locks the row shared, then exclusive.) On SQLite the check is a write
    /// that changes nothing, which takes the database's write lock (begin `tx` with
    /// `BEGIN IMMEDIATE` to take it at the start instead).
    ///
    /// Errors: [`Error::NotHeld`] when the lock expired, was taken over, released or
    /// deleted (roll `tx` back: dropping it does), also when the check itself was rolled
    /// back by such a change; [`Error::RowLocked`] when the lock row (on SQLite, the
    /// database) stayed busy past the server's lock-wait limit; [`Error::Database`]
    /// otherwise, among them a check that got no answer within the Locker's
    /// [`statement_timeout`](crate::LockerBuilder::statement_timeout) (a timed-out I/O
    /// error): `tx` is then mid-statement, drop it. To bound the rest of your own
    /// transaction, see the README, "Connections".
    ///
    ///
    /// # Example
    /// ```
    /// # async fn demo(locker: dblock::Locker<dblock::Sqlite>) -> Result<(), dblock::Error> {
    /// let five = std::time::Duration::from_secs(5);
    /// let guard = locker.acquire("invoice:42", five, five).await?;
    /// let mut tx = locker.pool().begin().await?;
    /// guard.assert_held(&mut tx).await?;
    /// // ... the writes the lock protects, on `tx` ...
    /// guard.commit(tx).await?;
    /// guard.release().await
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads and locks inside `tx`; dropping `tx` undoes the lock.
    pub async fn assert_held(&self, tx: &mut Transaction<'_, DB>) -> Result<()> {
        // On the caller's connection, which dblock cannot close: abandoned at the bound,
        // the caller's transaction is left to its owner (it is dropped with the error).
        let table = self.lock_table();
        let until = tokio::time::Instant::now() + table.statement_timeout();
        match by_deadline(until, table.check_fence(tx, self.lock_id())).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.not_held()),
            Err(err) if DB::is_conflict_rollback(&err) => Err(self.explain(err).await),
            Err(err) => Err(self.lock_table().row_lock_error(err)),
        }
    }

    /// Commits `tx`, a transaction this guard's [`assert_held`](Self::assert_held)
    /// checked. When the database refuses the commit as a conflict (a deadlock victim, a
    /// serialization failure, a Galera certification failure or brute-force abort) and
    /// this lock is no longer held by the database clock, the answer is
    /// [`Error::NotHeld`]: nothing of `tx` was written, and the lock is gone (do not retry
    /// the work under this guard). A conflict while the lock is still held stays
    /// [`Error::Database`] (the transaction may be retried), as does any other error.
    ///
    /// # Example
    /// ```
    /// # async fn demo(locker: dblock::Locker<dblock::Sqlite>) -> Result<(), dblock::Error> {
    /// let five = std::time::Duration::from_secs(5);
    /// let guard = locker.acquire("invoice:42", five, five).await?;
    /// let mut tx = locker.pool().begin().await?;
    /// guard.assert_held(&mut tx).await?;
    /// guard.commit(tx).await?;
    /// # guard.release().await
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Not cancel safe in what it reports: dropped while `COMMIT` is on the wire, the
    /// transaction may or may not have committed (as with sqlx's own `commit`).
    pub async fn commit(&self, tx: Transaction<'_, DB>) -> Result<()> {
        match tx.commit().await {
            Ok(()) => Ok(()),
            Err(err) => Err(self.explain(err).await),
        }
    }

    /// Reads an error of a statement in a transaction fenced by
    /// [`assert_held`](Self::assert_held): [`Error::NotHeld`] when the database rolled the
    /// transaction back as a conflict and this lock is no longer held (expired, taken
    /// over, released or deleted, read on a pool connection by the database clock);
    /// otherwise the error as [`Error::Database`]. On one server a takeover waits for
    /// the fenced transaction; across MariaDB Galera nodes it rolls that transaction back
    /// instead, and this is how that rollback is told apart from an ordinary deadlock.
    ///
    /// # Example
    /// ```
    /// # async fn demo(locker: dblock::Locker<dblock::Sqlite>) -> Result<(), dblock::Error> {
    /// let five = std::time::Duration::from_secs(5);
    /// let guard = locker.acquire("invoice:42", five, five).await?;
    /// let mut tx = locker.pool().begin().await?;
    /// guard.assert_held(&mut tx).await?;
    /// let write = sqlx::query("SELECT 1").execute(&mut *tx).await;
    /// if let Err(err) = write {
    ///     return Err(guard.explain(err).await);
    /// }
    /// guard.commit(tx).await?;
    /// # guard.release().await
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn explain(&self, err: sqlx::Error) -> Error {
        if !DB::is_conflict_rollback(&err) {
            return Error::Database(err);
        }
        match self.lock_table().still_held(self.lock_id()).await {
            Ok(false) => self.not_held(),
            // Still ours: an ordinary conflict. Unreadable: the error is all we know.
            Ok(true) | Err(_) => Error::Database(err),
        }
    }
}

impl<DB: Backend> MultiGuard<DB> {
    /// [`LockGuard::assert_held`] for every key, in one statement: inside the caller's
    /// write transaction `tx`, checks that each row still has its guard's owner and
    /// fencing token and an unexpired lease by the database clock, and locks all of them
    /// until `tx` ends (what `assert_held` says of one row holds for each, the idle bound
    /// on PostgreSQL set by the lease that ends first).
    ///
    /// Errors: [`Error::NotHeld`] naming a key that is no longer held (roll `tx` back:
    /// dropping it does); otherwise as [`LockGuard::assert_held`].
    ///
    /// # Example
    /// ```
    /// # async fn demo(locker: dblock::Locker<dblock::Sqlite>) -> Result<(), dblock::Error> {
    /// let five = std::time::Duration::from_secs(5);
    /// let both = locker.acquire_all(&["account:3", "account:7"], five, five).await?;
    /// let mut tx = locker.pool().begin().await?;
    /// both.assert_held(&mut tx).await?; // both accounts' locks, one statement
    /// // ... debit one, credit the other, on `tx` ...
    /// both.commit(tx).await?;
    /// both.release().await
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads and locks inside `tx`; dropping `tx` undoes the locks.
    pub async fn assert_held(&self, tx: &mut Transaction<'_, DB>) -> Result<()> {
        let Some(first) = self.guards().first() else {
            return Ok(());
        };
        let table = first.lock_table();
        let ids: Vec<_> = self.guards().iter().map(LockGuard::lock_id).collect();
        let until = tokio::time::Instant::now() + table.statement_timeout();
        match by_deadline(until, table.check_fences(tx, &ids)).await {
            Ok(held) if held == ids.len() as u64 => Ok(()),
            Ok(_) => Err(self.which_not_held().await),
            Err(err) if DB::is_conflict_rollback(&err) => Err(self.explain(err).await),
            Err(err) => Err(table.row_lock_error(err)),
        }
    }

    /// [`LockGuard::commit`] for a transaction this guard's
    /// [`assert_held`](Self::assert_held) checked: a conflict refusal while any of the
    /// keys is no longer held is [`Error::NotHeld`] for that key.
    ///
    /// # Cancel safety
    /// As [`LockGuard::commit`].
    pub async fn commit(&self, tx: Transaction<'_, DB>) -> Result<()> {
        match tx.commit().await {
            Ok(()) => Ok(()),
            Err(err) => Err(self.explain(err).await),
        }
    }

    /// [`LockGuard::explain`] for every key: [`Error::NotHeld`] for the first key no
    /// longer held when `err` is a conflict rollback; otherwise `err` as
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn explain(&self, err: sqlx::Error) -> Error {
        if !DB::is_conflict_rollback(&err) {
            return Error::Database(err);
        }
        let not_held = self.first_not_held().await;
        not_held.unwrap_or(Error::Database(err))
    }

    /// [`LockGuard::ensure_held`] for every key: `Ok` while every lease is held by this
    /// process's clock, else [`Error::LockLost`] for the first key (in key order) that
    /// is lost. No statement.
    pub fn ensure_held(&self) -> Result<()> {
        self.guards().iter().try_for_each(LockGuard::ensure_held)
    }

    /// [`LockGuard::remaining`] of the lease that ends first (zero if any is lost).
    pub fn remaining(&self) -> std::time::Duration {
        let remaining = self.guards().iter().map(LockGuard::remaining);
        remaining.min().unwrap_or_default()
    }

    /// The first key (in key order) whose lease is lost, and why; `None` while all are
    /// held.
    pub fn lost_reason(&self) -> Option<(String, LostReason)> {
        self.guards()
            .iter()
            .find_map(|guard| Some((guard.key().to_owned(), guard.lost_reason()?)))
    }

    /// After a check that found fewer rows than keys: the first key not held; the first
    /// key if every read says held (a row changed meanwhile) or fails, since the check
    /// did not lock them all and `tx` must not go on.
    async fn which_not_held(&self) -> Error {
        let not_held = self.first_not_held().await;
        not_held.unwrap_or_else(|| self.guards()[0].not_held())
    }

    /// [`Error::NotHeld`] for the first key (in key order) that a read on a pool
    /// connection finds no longer held; `None` if none is (or a read fails).
    async fn first_not_held(&self) -> Option<Error> {
        for guard in self.guards() {
            if let Ok(false) = guard.lock_table().still_held(guard.lock_id()).await {
                return Some(guard.not_held());
            }
        }
        None
    }
}
