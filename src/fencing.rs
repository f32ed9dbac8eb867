//! Fencing inside the caller's own transaction: [`LockGuard::assert_held`].

use sqlx::Transaction;

use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::guard::LockGuard;

impl<DB: Backend> LockGuard<DB> {
    /// Checks, inside the caller's write transaction `tx`, that this lock is still held:
    /// the row has this guard's owner and fencing token and an unexpired lease by the
    /// database clock. It also locks that row until `tx` ends, so no takeover, release or
    /// renewal can commit in between: call it before the writes it protects, commit after
    /// it, and those writes commit only if the lock was still ours. If the lease runs out
    /// while `tx` is open, the next holder's acquisition waits for `tx` to end, so its
    /// writes come after yours.
    ///
    /// The row stays locked until `tx` ends, live lease or not: an acquisition attempt
    /// on this key from anywhere waits for `tx` (so a rival's `try_acquire` can take as
    /// long as your transaction; on MySQL/MariaDB at most `innodb_lock_wait_timeout`),
    /// and so does the batched renewal of every lease of this guard's Locker. Keep such
    /// transactions short against the lease.
    ///
    /// `tx` must be on the database that holds the lock table. PostgreSQL locks the row
    /// `FOR SHARE`, MySQL/MariaDB `LOCK IN SHARE MODE`; on SQLite the check is a write that
    /// changes nothing, which takes the database's write lock (begin `tx` with
    /// `BEGIN IMMEDIATE` to take it at the start instead).
    ///
    /// Errors: [`Error::NotHeld`] when the lock expired, was taken over, released or
    /// deleted (roll `tx` back: dropping it does); [`Error::RowLocked`] when the lock row
    /// (on SQLite, the database) stayed busy past the server's lock-wait limit;
    /// [`Error::Database`] otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads and locks inside `tx`; dropping `tx` undoes the lock.
    pub async fn assert_held(&self, tx: &mut Transaction<'_, DB>) -> Result<()> {
        let held = self.lock_table().check_fence(tx, self.lock_id()).await?;
        if held {
            Ok(())
        } else {
            Err(Error::NotHeld {
                key: self.key().to_owned(),
                owner: self.owner().to_owned(),
            })
        }
    }
}
