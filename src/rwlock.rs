//! [`RwLock`]: any number of readers or one writer, across processes, writers first.
//!
//! Rows (all leases, renewed and fenced as the mutex's): `<name>~write`, the writer's,
//! which keeps new readers out (writers are not starved); `<name>~read-<16 hex>`, one per
//! reader; `<name>~write-grant`, taken by the writer once no reader is left, whose fencing
//! token is the write guard's.
//!
//! A write with no reader in the way costs two commits, as a mutex's cycle: one
//! transaction takes the writer's and the grant's rows and looks for a live reader (kept
//! only if there is none), and one statement releases both rows. On PostgreSQL that
//! transaction is one statement, a call of the table's `_take_write` function (migration
//! V5; its looks are statements of their own, each seeing what committed before it):
//! one round trip instead of five. A reader writes its row
//! (one commit), then reads the writer's; that statement is ordered with every write's
//! transaction ([`LockSql::acquire_read`](crate::dialect::LockSql::acquire_read): on
//! PostgreSQL it holds the grant key's advisory lock shared, which the write's grant
//! insert holds exclusively until it commits; on MySQL it draws its token from the
//! grant's counter row, which that insert keeps locked; SQLite has one writer at a time).
//! So a reader's row commits either before the write's grant row was taken (the write's
//! look, a statement after that, sees it and rolls back) or after the write committed
//! (the reader's look sees the writer's row and steps back), and the write's token,
//! drawn after every such reader's, is above theirs.
//!
//! When readers hold, the writer waits as before, in steps each committed before the
//! next starts: it takes its row alone, then reads the readers' until none is left, then
//! takes the grant. Of a reader and a writer that overlap at least one sees the other's
//! row (if the reader's read missed the writer's row, that row was committed after the
//! read began, hence after the reader's row was, and the writer's later read finds it)
//! and steps back. On MariaDB Galera, whose row locks are each node's own, every write
//! takes that path.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::acquire::{self, Request};
use crate::config::{validate_lease, validate_wait};
use crate::dialect::{Backend, Listed};
use crate::error::{Error, LostReason, Result};
use crate::guard::LockGuard;
use crate::lease::Lease;
use crate::locker::Locker;
use crate::metrics::{self, Kind};
use crate::primitive::{group_key, member_key, validate_name};
use crate::retry::Backoff;
use crate::several::{self, WriteAttempt};

/// The longest suffix of the lock's rows: `read-` and 16 hex digits.
const LONGEST_SUFFIX: usize = "read-0123456789abcdef".len();

/// Most live readers a writer reads at once to know whether any is left.
const READERS_READ: u32 = 1;

/// A read-write lock across processes: Redisson's `RReadWriteLock`, Curator's
/// `InterProcessReadWriteLock`, DistributedLock's `DistributedReaderWriterLock`. Made by
/// [`Locker::rw_lock`]; cheap, it touches no database.
///
/// Any number of readers hold it at once, or one writer, never both. Writers go first:
/// once a writer waits, new readers wait behind it (as with tokio's `RwLock` and
/// Curator's), so a stream of readers cannot starve a writer. A
/// [`WriteGuard`]'s fencing token is greater than the token of every read or write
/// granted before it, so a resource can refuse a stale writer. Every guard is a lease
/// renewed with the Locker's other leases, with `lost()` and drop behaviour as a
/// [`LockGuard`]'s.
///
/// Waiters queue in this Locker (readers in arrival order; a release through this Locker
/// lets them try at once); releases elsewhere are found by paced attempts
/// ([`RetryPolicy`](crate::RetryPolicy), at most its `max` apart).
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
/// let config = locker.rw_lock("pricing-config");
/// let (lease, wait) = (Duration::from_secs(30), Duration::from_secs(5));
/// let reader_a = config.read(lease, wait).await?;
/// let reader_b = config.try_read(lease).await?.expect("readers share");
/// assert!(config.try_write(lease).await?.is_none()); // not while anyone reads
/// reader_a.release().await?;
/// reader_b.release().await?;
///
/// let writer = config.write(lease, wait).await?;
/// assert!(config.try_read(lease).await?.is_none()); // nor reads while it writes
/// assert!(writer.fencing_token() > 0);
/// writer.release().await?;
/// # Ok(()) }
/// ```
pub struct RwLock<DB: Backend> {
    locker: Locker<DB>,
    name: String,
}

impl<DB: Backend> Clone for RwLock<DB> {
    fn clone(&self) -> Self {
        RwLock {
            locker: self.locker.clone(),
            name: self.name.clone(),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for RwLock<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A held read of an [`RwLock`]: a [`LockGuard`] on the reader's row (it derefs to one).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let read = locker.rw_lock("catalog").try_read(Duration::from_secs(10)).await?.unwrap();
/// assert!(read.key().starts_with("catalog~read-"));
/// read.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the read is released as soon as it is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct ReadGuard<DB: Backend> {
    guard: LockGuard<DB>,
}

impl<DB: Backend> Deref for ReadGuard<DB> {
    type Target = LockGuard<DB>;

    fn deref(&self) -> &LockGuard<DB> {
        &self.guard
    }
}

impl<DB: Backend> ReadGuard<DB> {
    /// Ends the read: as [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}

/// A held write of an [`RwLock`]: two rows, the writer's (which keeps new readers out)
/// and the grant (taken once no reader was left, whose fencing token is the write's).
/// [`release`](Self::release) deletes both in one statement. Dropped, both are released
/// in the background as a guard's row is.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// # let pool = dblock::sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # let locker = dblock::Locker::new(pool);
/// # locker.migrate().await?;
/// let catalog = locker.rw_lock("catalog");
/// let write = catalog.try_write(Duration::from_secs(10)).await?.unwrap();
/// let token = write.fencing_token(); // pass it with the writes it protects
/// write.release().await?;
/// let next = catalog.try_write(Duration::from_secs(10)).await?.unwrap();
/// assert!(next.fencing_token() > token);
/// # next.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the write is released as soon as it is dropped; keep it and call release().await"]
#[derive(Debug)]
pub struct WriteGuard<DB: Backend> {
    grant: LockGuard<DB>,
    writer: LockGuard<DB>,
}

/// The guard on the grant row, whose token is the write's: [`assert_held`](LockGuard::assert_held),
/// [`commit`](LockGuard::commit) and the rest fence the write's transactions as any
/// guard's do. ([`ensure_held`](WriteGuard::ensure_held), [`remaining`](WriteGuard::remaining),
/// [`lost`](WriteGuard::lost) and [`lost_reason`](WriteGuard::lost_reason) are the
/// write's own: they look at both rows.)
impl<DB: Backend> Deref for WriteGuard<DB> {
    type Target = LockGuard<DB>;

    fn deref(&self) -> &LockGuard<DB> {
        &self.grant
    }
}

impl<DB: Backend> WriteGuard<DB> {
    /// The write's fencing token: greater than every earlier write's and read's, so a
    /// resource that keeps the highest token it saw refuses a stale writer. (On
    /// MySQL/MariaDB, which draw tokens from 16 counters by key, the readers' keys are
    /// picked on the write grant's counter.)
    pub fn fencing_token(&self) -> i64 {
        self.grant.fencing_token()
    }

    /// The guard on the grant row (for [`assert_held`](LockGuard::assert_held) in the
    /// transaction of the writes it protects).
    pub fn guard(&self) -> &LockGuard<DB> {
        &self.grant
    }

    /// Completes when either row's lease is lost, with why.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> LostReason {
        tokio::select! {
            reason = self.grant.lost() => reason,
            reason = self.writer.lost() => reason,
        }
    }

    /// Whether a lease was lost, and why.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.grant
            .lost_reason()
            .or_else(|| self.writer.lost_reason())
    }

    /// [`LockGuard::ensure_held`] for both rows: `Ok` while both leases are held by this
    /// process's clock, else [`Error::LockLost`](crate::Error::LockLost) for the first
    /// lost. No statement.
    pub fn ensure_held(&self) -> Result<()> {
        self.grant.ensure_held().and(self.writer.ensure_held())
    }

    /// [`LockGuard::remaining`] of the row whose lease ends first.
    pub fn remaining(&self) -> Duration {
        self.grant.remaining().min(self.writer.remaining())
    }

    /// Ends the write: deletes both rows, the grant's and the writer's (which lets
    /// readers in), in one statement, each owner- and token-checked. Errors as
    /// [`LockGuard::release`], the grant's first.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`]: if the future is dropped before the database answered,
    /// both rows are released in the background.
    pub async fn release(self) -> Result<()> {
        // In key order (`<name>~write` before `<name>~write-grant`), as every batch of
        // rows is deleted.
        let (writer, granted) = self.writer.release_with(self.grant).await;
        granted.and(writer)
    }
}

impl<DB: Backend> Locker<DB> {
    /// The read-write lock `name`: see [`RwLock`]. Touches no database; the name is
    /// checked by the first call that would (a key without `~`, at most 106 bytes).
    pub fn rw_lock(&self, name: &str) -> RwLock<DB> {
        RwLock {
            locker: self.clone(),
            name: name.to_owned(),
        }
    }
}

impl<DB: Backend> RwLock<DB> {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn writer_key(&self) -> String {
        member_key(&self.name, "write")
    }

    fn grant_key(&self) -> String {
        member_key(&self.name, "write-grant")
    }

    /// A write's attempt at both its rows in one transaction, unless the server certifies
    /// writes at commit (MariaDB Galera): there row locks are each node's own, and do not
    /// order a reader with the transaction; `None` then, and the write takes its rows in
    /// steps.
    async fn attempt_both(
        &self,
        owner: &str,
        lease: Duration,
        ticket: Option<i64>,
    ) -> Result<Option<WriteAttempt>> {
        let core = &self.locker.core;
        if core.table.certifies_writes().await? {
            return Ok(None);
        }
        let keys = [self.writer_key(), self.grant_key()];
        let readers = member_key(&self.name, "read-");
        let renew = self.locker.renew_every(lease);
        let attempt = several::attempt_write(core, &keys, &readers, owner, lease, renew, ticket);
        Ok(Some(Box::pin(attempt).await?))
    }

    /// One attempt to read for `lease`: `Ok(None)` when a writer holds or waits for the
    /// lock. Two statements when it wins (three on MySQL and SQLite), one more when it
    /// loses (its reader row is deleted again).
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::InvalidDuration`] (nothing is written),
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: a reader row written for a dropped future is released in the
    /// background.
    pub async fn try_read(&self, lease: Duration) -> Result<Option<ReadGuard<DB>>> {
        validate_name(&self.name, LONGEST_SUFFIX)?;
        validate_lease(lease)?;
        let owner = self.locker.core.new_owner();
        let attempt = Box::pin(self.attempt_read(&owner, lease));
        let metrics = &self.locker.core.metrics;
        let won = metrics::try_acquire(metrics, Kind::Read, &self.name, attempt).await?;
        Ok(won.map(|lease| ReadGuard {
            guard: self.locker.guard(lease),
        }))
    }

    /// Reads for `lease`, waiting up to `wait` (then [`Error::Timeout`]) while a writer
    /// holds or waits for the lock; zero makes a single attempt.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::acquire`].
    pub async fn read(&self, lease: Duration, wait: Duration) -> Result<ReadGuard<DB>> {
        validate_name(&self.name, LONGEST_SUFFIX)?;
        validate_lease(lease)?;
        validate_wait(wait)?;
        let owner = self.locker.core.new_owner();
        let queue = group_key(&self.name);
        let core = &self.locker.core;
        let writer = self.writer_key();
        // After a lost attempt, a live writer's row is read before a reader's row is
        // written: a reader that wrote its row and stepped back would release it, and that
        // release wakes this lock's queue, this reader first, which tried again at once
        // (about 1,100 attempts in 2 s behind a held write on SQLite).
        let lost_once = AtomicBool::new(false);
        let won = Box::pin(acquire::wait_in_queue(
            core,
            &queue,
            &writer,
            wait,
            async |_| {
                if lost_once.load(Ordering::Relaxed) && self.writer_waits().await? {
                    return Ok(None);
                }
                let read = self.attempt_read(&owner, lease).await;
                lost_once.store(matches!(read, Ok(None)), Ordering::Relaxed);
                read
            },
        ));
        let won = metrics::acquire(&core.metrics, Kind::Read, &self.name, wait, won).await?;
        // Readers share: the next one in the queue tries at once.
        core.queues.next_in_group(&queue);
        Ok(ReadGuard {
            guard: self.locker.guard(won),
        })
    }

    /// One attempt to write for `lease`: `Ok(None)` when a reader or another writer holds
    /// it (or a writer waits).
    ///
    /// Errors: as [`try_read`](Self::try_read).
    ///
    /// # Cancel safety
    /// Cancel safe: rows written for a dropped future are released in the background.
    pub async fn try_write(&self, lease: Duration) -> Result<Option<WriteGuard<DB>>> {
        validate_name(&self.name, LONGEST_SUFFIX)?;
        validate_lease(lease)?;
        let attempt = Box::pin(self.attempt_write(lease));
        let metrics = &self.locker.core.metrics;
        metrics::try_acquire(metrics, Kind::Write, &self.name, attempt).await
    }

    async fn attempt_write(&self, lease: Duration) -> Result<Option<WriteGuard<DB>>> {
        let owner = self.locker.core.new_owner();
        match self.attempt_both(&owner, lease, None).await? {
            Some(WriteAttempt::Won(leases)) => return Ok(Some(self.write_guard(leases))),
            Some(WriteAttempt::Held | WriteAttempt::Read) => return Ok(None),
            None => {}
        }
        let key = self.writer_key();
        let Some(writer) = self
            .locker
            .attempt(&key, &owner, lease, None, &mut None)
            .await?
        else {
            return Ok(None);
        };
        let writer = self.locker.guard(writer);
        if self.a_reader().await?.is_some() {
            writer.release().await.ok();
            return Ok(None);
        }
        self.grant(writer, &owner, lease).await
    }

    /// Writes for `lease`, waiting up to `wait` (then [`Error::Timeout`]): first for the
    /// writer's row (behind earlier writers), then, holding it (new readers now wait), for
    /// the readers to finish. If the wait runs out in the second part the writer's row is
    /// released and the error names a reader's row that stayed (`<name>~read-..`) and its holder.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::acquire`]: the writer's row of a dropped future is
    /// released in the background, and readers can go on.
    pub async fn write(&self, lease: Duration, wait: Duration) -> Result<WriteGuard<DB>> {
        validate_name(&self.name, LONGEST_SUFFIX)?;
        validate_lease(lease)?;
        validate_wait(wait)?;
        let write = Box::pin(self.wait_to_write(lease, wait));
        let metrics = &self.locker.core.metrics;
        metrics::acquire(metrics, Kind::Write, &self.name, wait, write).await
    }

    async fn wait_to_write(&self, lease: Duration, wait: Duration) -> Result<WriteGuard<DB>> {
        let started = Instant::now();
        let deadline = started + wait;
        let owner = self.locker.core.new_owner();
        let key = self.writer_key();
        let core = &self.locker.core;
        // The grant's guard, when an attempt took both rows at once (a guard at once: a
        // wait dropped after that attempt releases the row).
        let granted = std::sync::Mutex::new(None);
        let writer = Box::pin(acquire::wait_for(core, &key, wait, None, async |ticket| {
            match self.attempt_both(&owner, lease, ticket).await? {
                Some(WriteAttempt::Won(mut leases)) => {
                    let grant = leases.pop().expect("the grant's lease");
                    let grant = self.locker.guard(grant);
                    *granted.lock().unwrap_or_else(|e| e.into_inner()) = Some(grant);
                    return Ok(leases.pop());
                }
                Some(WriteAttempt::Held) => return Ok(None),
                // Readers hold: the writer's row alone, to keep new readers out while
                // they finish.
                Some(WriteAttempt::Read) | None => {}
            }
            self.locker
                .attempt(&key, &owner, lease, ticket, &mut None)
                .await
        }))
        .await?;
        let writer = self.locker.guard(writer);
        if let Some(grant) = granted.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Ok(WriteGuard { grant, writer });
        }
        // Woken by releases of the lock's rows through this Locker (a reader leaving).
        let group = group_key(&self.name);
        let place = core.queues.join_fair(&group);
        let mut backoff = Backoff::new(&core.retry, deadline);
        let mut reads = 0u32;
        loop {
            reads += 1;
            let Some(held) = self.a_reader().await? else {
                break;
            };
            let reader = held.key.clone();
            // PostgreSQL: that reader's release, in any process, wakes this writer (the
            // listener hears it, and it wakes the lock's queue, which this writer is in).
            if DB::NOTIFIES {
                core.start_listener();
                core.table.note_waiter(&reader).await.ok();
            }
            if let Some(reason) = writer.lost_reason() {
                return Err(Error::LockLost { key, reason });
            }
            let Some(pause) = backoff.next_pause() else {
                drop(place);
                writer.release().await.ok();
                // The row that stayed held: a reader's (the lock's queue `<name>~` names
                // no row), and who holds it.
                return Err(Error::Timeout {
                    key: held.key,
                    waited: started.elapsed(),
                    attempts: reads,
                    held_here: held.row.owner.starts_with(&core.owner_prefix),
                    held_until: Some(held.row.expires_at),
                    held_by: Some(held.row.owner),
                });
            };
            tokio::select! {
                _ = place.next_turn() => {}
                _ = sleep(pause) => {}
            }
        }
        drop(place);
        match self.grant(writer, &owner, lease).await? {
            Some(write) => Ok(write),
            None => Err(Error::Timeout {
                key: member_key(&self.name, "write-grant"),
                waited: started.elapsed(),
                attempts: reads,
                held_by: None,
                held_until: None,
                held_here: false,
            }),
        }
    }

    /// A reader's attempt: its row, then a look for a writer's; steps back if one is live.
    async fn attempt_read(&self, owner: &str, lease: Duration) -> Result<Option<Arc<Lease>>> {
        // A fresh row each attempt: a row that an earlier attempt could not delete again
        // must not stand in the way of this one. Its key draws its fencing token from the
        // write grant's counter (MySQL has 16), so that a write's token is above it.
        let grant = self.grant_key();
        let key = loop {
            let key = member_key(&self.name, &format!("read-{:016x}", fastrand::u64(..)));
            if DB::shares_token_counter(&key, &grant) {
                break key;
            }
        };
        // Ordered with a write's transaction over both its rows (see the module docs).
        let request = Request {
            key: &key,
            owner,
            lease,
            renew: self.locker.renew_every(lease),
            ticket: None,
            beside: Some(&grant),
        };
        let Some(read) = acquire::attempt(&self.locker.core, request, &mut None).await? else {
            return Ok(None);
        };
        let read = self.locker.guard(read);
        if self.writer_waits().await? {
            read.release().await.ok();
            return Ok(None);
        }
        Ok(Some(read.into_lease()))
    }

    /// The write guard of both leases won at once (the writer's, then the grant's).
    fn write_guard(&self, mut leases: Vec<Arc<Lease>>) -> WriteGuard<DB> {
        let grant = self.locker.guard(leases.pop().expect("the grant's lease"));
        let writer = self.locker.guard(leases.pop().expect("the writer's lease"));
        WriteGuard { grant, writer }
    }

    /// Whether a writer holds or waits for the lock: its row is live.
    async fn writer_waits(&self) -> Result<bool> {
        let writer = self.locker.core.table.inspect(&self.writer_key()).await?;
        Ok(writer.is_some_and(|row| !row.expired))
    }

    /// A live reader's row, if there is one.
    async fn a_reader(&self) -> Result<Option<Listed>> {
        let prefix = member_key(&self.name, "read-");
        let table = &self.locker.core.table;
        let live = table.list(&prefix, None, Some(false), READERS_READ).await?;
        Ok(live.into_iter().next())
    }

    /// Holding the writer's row with no reader left: takes the grant row, whose token is
    /// greater than every read's (each reader that got in wrote its row before the
    /// writer's read that found none).
    async fn grant(
        &self,
        writer: LockGuard<DB>,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<WriteGuard<DB>>> {
        let key = self.grant_key();
        match self
            .locker
            .attempt(&key, owner, lease, None, &mut None)
            .await
        {
            Ok(Some(grant)) => Ok(Some(WriteGuard {
                grant: self.locker.guard(grant),
                writer,
            })),
            Ok(None) => {
                // The grant of a writer that crashed, not expired yet although its
                // writer's row was: give way until it is.
                writer.release().await.ok();
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }
}
