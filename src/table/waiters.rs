//! The console's read of who waits for a page of keys
//! ([`NotifySql::waiters`](crate::dialect::NotifySql::waiters)), sent as every caller's
//! statement is: on a pooled connection, bounded by the statement timeout.

use super::{Checkout, LockTable};
use crate::dialect::Backend;
use crate::error::Result;

impl<DB: Backend> LockTable<DB> {
    /// For each of `keys`, the Lockers other than this one waiting for it as the database
    /// knows them: the keys with any, each with how many (1 for a marked row where the
    /// backend does not count: `NotifySql::COUNTS_WAITERS`). `registration`: this
    /// Locker's listener's session (MySQL/MariaDB), whose registrations are its own. One
    /// statement, none for no keys.
    pub(crate) async fn waiters(
        &self,
        keys: &[&str],
        registration: Option<u64>,
    ) -> Result<Vec<(String, u32)>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .run(
                self.bounded(),
                pooled!(|conn| self.waiters_on(conn, keys, registration)),
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(key, n)| Some((key, u32::try_from(n).ok().filter(|&n| n > 0)?)))
            .collect())
    }

    /// [`waiters`](Self::waiters) on `conn`. On a Galera node nothing is asked: named
    /// locks are a node's own there, and no listener registers (its waiters poll).
    async fn waiters_on(
        &self,
        conn: &mut DB::Connection,
        keys: &[&str],
        registration: Option<u64>,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        if DB::RINGS_BELLS && self.certifies_writes_on(&mut *conn).await? {
            return Ok(Vec::new());
        }
        DB::waiters(conn, &self.sql, keys, self.waiter, registration).await
    }
}
