//! Deleting expired rows: once ([`Locker::reap_expired`]) or in the background
//! ([`Locker::spawn_reaper`]). Takeover does not need it; it keeps the table small.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{DEFAULT_REAP_BATCH, DEFAULT_REAP_INTERVAL, MAX_LEASE, validate_range};
use crate::dialect::Backend;
use crate::error::{Error, Result};
use crate::locker::{Locker, Shared};

/// How a background reaper runs.
///
/// # Default
/// Every [`DEFAULT_REAP_INTERVAL`] (60 s), [`DEFAULT_REAP_BATCH`] (1000) rows per statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Pause between passes; a pass deletes batches until one comes back short.
    pub interval: Duration,
    /// Most rows one statement deletes.
    pub batch: u32,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            interval: DEFAULT_REAP_INTERVAL,
            batch: DEFAULT_REAP_BATCH,
        }
    }
}

/// A running reaper. Stop it with [`stop`](Self::stop); dropping the handle stops it too
/// (without waiting for it).
#[must_use = "dropping the handle stops the reaper"]
pub struct ReaperHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    deleted: watch::Receiver<u64>,
}

impl ReaperHandle {
    /// Rows this reaper has deleted so far.
    pub fn deleted(&self) -> u64 {
        *self.deleted.borrow()
    }

    /// A receiver of the running total, updated after every pass that deleted rows.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.deleted.clone()
    }

    /// Stops the reaper, waits until it has stopped, and returns its total.
    ///
    /// # Cancel safety
    /// Cancel safe: the reaper is told to stop at once; dropping this future only skips
    /// the wait. A statement in flight finishes on its own.
    pub async fn stop(mut self) -> u64 {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
        self.deleted()
    }
}

impl Drop for ReaperHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<DB: Backend> Locker<DB> {
    /// Deletes every expired row once, in batches of [`DEFAULT_REAP_BATCH`]; returns how
    /// many went. Live leases are never deleted; several reapers at once are safe (on
    /// PostgreSQL they skip rows another one is deleting).
    ///
    /// # Cancel safety
    /// Cancel safe: each batch commits on its own; dropping the future stops between or
    /// during batches, and what was deleted stays deleted.
    pub async fn reap_expired(&self) -> Result<u64> {
        reap_all(&self.shared, DEFAULT_REAP_BATCH).await
    }

    /// Starts a background task that deletes expired rows every `config.interval`, in
    /// batches of `config.batch`. Errors are logged and the next pass tries again.
    pub fn spawn_reaper(&self, config: ReaperConfig) -> Result<ReaperHandle> {
        validate_range(
            "reaper interval",
            config.interval,
            Duration::from_millis(1),
            MAX_LEASE,
        )?;
        if config.batch == 0 {
            return Err(Error::InvalidConfig(
                "reaper batch must be at least 1".into(),
            ));
        }
        let shared = Arc::clone(&self.shared);
        let stop = CancellationToken::new();
        let (total, deleted) = watch::channel(0u64);
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                match reap_all(&shared, config.batch).await {
                    Ok(0) => {}
                    Ok(n) => total.send_modify(|t| *t += n),
                    Err(err) => {
                        tracing::warn!(table = %shared.table, error = %err, "reaper pass failed")
                    }
                }
                tokio::select! {
                    _ = stopping.cancelled() => return,
                    _ = tokio::time::sleep(config.interval) => {}
                }
            }
        });
        Ok(ReaperHandle {
            stop,
            task: Some(task),
            deleted,
        })
    }
}

async fn reap_all<DB: Backend>(shared: &Shared<DB>, batch: u32) -> Result<u64> {
    let mut total = 0;
    loop {
        let deleted = DB::reap_batch(&shared.pool, &shared.sql, i64::from(batch)).await?;
        total += deleted;
        shared
            .counters
            .reaped
            .fetch_add(deleted, std::sync::atomic::Ordering::Relaxed);
        if deleted < u64::from(batch) {
            if total > 0 {
                tracing::info!(table = %shared.table, deleted = total, "reaped expired locks");
            }
            return Ok(total);
        }
    }
}
