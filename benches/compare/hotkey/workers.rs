//! The worker processes of section 3's cells 3.2 and 3.4: what one of them does, on one
//! hot key with its own Locker and pool. The processes themselves, their job and report
//! are the bench's one worker mechanism ([`crate::workers`]); cell 2
//! ([`procs`](super::procs)) and cell 4 ([`fair`](super::fair)) run them through
//! [`workers::round`](crate::workers::round).
//!
//! A worker builds its Locker (`fair(true)` in [`Mode::Fair`]), opens its connections,
//! sleeps until the common start, runs the loop of cell 1 (`acquire`, hold 2 ms,
//! `release`) for the round's length, shuts its Locker down and closes its pool, and
//! reports its acquisitions, waits and grants (`fencing_token:ticket`).

use std::sync::Arc;
use std::time::Duration;

use dblock::Locker;
use sqlx::Pool;
use tokio::time::Instant;

use super::tasks::{Side, contend};
use crate::servers::LockDb;
use crate::workers::{Job, Mode, Report};

pub const PROCESSES: usize = 2;
pub const TASKS_PER_PROCESS: usize = 4;

/// One hot-key worker's run (`job.mode` [`Mode::HotKey`] or [`Mode::Fair`]); its report.
pub async fn work<DB: LockDb>(pool: Pool<DB>, job: &Job) -> Result<Report, String> {
    let locker = Locker::builder(pool.clone())
        .table(&job.table)
        .fair(job.mode == Mode::Fair)
        .build()
        .map_err(|e| e.to_string())?;
    let late = job.ready(&pool).await?;
    let side = Arc::new(Side::Dblock(locker.clone()));
    let done = contend(&side, &job.key, job.tasks, Instant::now() + job.length).await;
    // The round's end cancelled the waiting acquires; let their background work (fair
    // mode: deleting their tickets) finish, and end the sessions, before reporting.
    let _ = tokio::time::timeout(Duration::from_secs(10), locker.shutdown()).await;
    pool.close().await;
    let mut report = Report {
        acquisitions: done.turns.len() as u64,
        attempts: side.attempts(),
        acquire_errors: done.acquire_errors,
        release_errors: done.release_errors,
        late,
        first_error: done.first_error,
        ..Report::default()
    };
    for turn in &done.turns {
        report.waits.push(turn.waited);
        report.grants.push(turn.grant);
    }
    Ok(report)
}
