//! Section 7's contenders: a semaphore permit's cycle, a read of one read-write lock and
//! the one mutex key, each a [`Contender`] of the interleaved rounds.

use std::time::Duration;

use dblock::{Backend, Locker, RwLock, Semaphore};
use futures::future::BoxFuture;

use crate::handwritten::LEASE;
use crate::measure::{BoxError, Contender};

/// How long a reader (or the mutex's holder) keeps what it took.
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

/// A read of the one read-write lock, held [`HOLD`].
pub struct Read<DB: Backend> {
    pub lock: RwLock<DB>,
}

impl<DB: Backend> Contender for Read<DB> {
    fn name(&self) -> &str {
        "rw_lock read, 2 ms"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let read = self.lock.read(LEASE, WAIT).await?;
            tokio::time::sleep(HOLD).await;
            read.release().await?;
            Ok(true)
        })
    }
}

/// The one mutex key, held [`HOLD`].
pub struct Exclusive<DB: Backend> {
    pub locker: Locker<DB>,
}

impl<DB: Backend> Contender for Exclusive<DB> {
    fn name(&self) -> &str {
        "mutex, 2 ms"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let guard = self.locker.acquire("bench:hot", LEASE, WAIT).await?;
            tokio::time::sleep(HOLD).await;
            guard.release().await?;
            Ok(true)
        })
    }
}
