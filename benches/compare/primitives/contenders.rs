//! Section 7's in-process contenders: a semaphore permit's cycle, a read and a write of
//! one read-write lock, a write of a fresh one and a mutex on one key, each a
//! [`Contender`] of the interleaved rounds (cells 7.1 and 7.4).

use std::time::Duration;

use dblock::{Backend, Locker, RwLock, Semaphore};
use futures::future::BoxFuture;

use crate::handwritten::LEASE;
use crate::measure::{BoxError, Contender};

/// How long a reader (or the mutex's holder) of cell 7.1 keeps what it took.
pub const HOLD: Duration = Duration::from_millis(2);
pub const READERS: usize = 8;
/// Longest a reader or writer may wait (far above what a round needs).
pub const WAIT: Duration = Duration::from_secs(30);

/// A permit of the task's own semaphore, taken and given back.
pub struct PermitCycle<DB: Backend> {
    pub semaphores: Vec<Semaphore<DB>>,
}

impl<DB: Backend> Contender for PermitCycle<DB> {
    fn name(&self) -> &str {
        "semaphore permit"
    }

    fn cycle<'a>(&'a self, task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            match self.semaphores[task].try_acquire(LEASE).await? {
                Some(permit) => {
                    permit.release().await?;
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }
}

/// A read of the one read-write lock, held `hold` (zero: released at once).
pub struct Read<DB: Backend> {
    pub lock: RwLock<DB>,
    pub hold: Duration,
}

impl<DB: Backend> Contender for Read<DB> {
    fn name(&self) -> &str {
        "rw_lock read"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let read = self.lock.read(LEASE, WAIT).await?;
            hold(self.hold).await;
            read.release().await?;
            Ok(true)
        })
    }
}

/// A write of the one read-write lock, released at once.
pub struct Write<DB: Backend> {
    pub lock: RwLock<DB>,
}

impl<DB: Backend> Contender for Write<DB> {
    fn name(&self) -> &str {
        "rw_lock write"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let write = self.lock.write(LEASE, WAIT).await?;
            write.release().await?;
            Ok(true)
        })
    }
}

/// A write of a read-write lock of its own each cycle (named by the cycle's fresh key),
/// released at once: tasks never meet, as the mutex cycle's fresh keys never do, so the
/// two cycles differ only in what a write does beyond a mutex.
pub struct FreshWrite<DB: Backend> {
    pub locker: Locker<DB>,
}

impl<DB: Backend> Contender for FreshWrite<DB> {
    fn name(&self) -> &str {
        "rw_lock write, a fresh lock"
    }

    fn cycle<'a>(&'a self, _task: usize, key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            // `try_write` as the mutex cycle's `try_acquire`: a fresh lock has nobody to
            // wait for.
            match self.locker.rw_lock(key).try_write(LEASE).await? {
                Some(write) => {
                    write.release().await?;
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }
}

/// The mutex on one key that every task takes (a waiting `acquire`), held `hold`.
pub struct Exclusive<DB: Backend> {
    pub locker: Locker<DB>,
    pub key: &'static str,
    pub hold: Duration,
}

impl<DB: Backend> Contender for Exclusive<DB> {
    fn name(&self) -> &str {
        "mutex on one key"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let guard = self.locker.acquire(self.key, LEASE, WAIT).await?;
            hold(self.hold).await;
            guard.release().await?;
            Ok(true)
        })
    }
}

/// Keeps what was taken for `hold`; no timer at all for zero, so that a back-to-back
/// cycle pays for none.
async fn hold(hold: Duration) {
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
}
