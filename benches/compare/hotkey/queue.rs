//! Cell 3.1's *server-side queue*, hand-written: what a Rust user has today (the
//! `distributed-lock` crate takes PostgreSQL locks this way). Each task keeps a
//! connection of its own and takes the key with the server's session lock, which blocks
//! in the server until granted, the server granting its waiters in arrival order:
//! PostgreSQL's `SELECT pg_advisory_lock($1)`, released with `pg_advisory_unlock($1)`;
//! MariaDB's `GET_LOCK(name, timeout)` and `RELEASE_LOCK(name)` (metadata locks, also
//! granted in arrival order). One statement to take the key, one to give it back, and no
//! lease: the lock lives as long as the session. Those statements are each database's
//! (`servers::postgres`, `servers::mysql`: [`QueueSession`]); this module runs them.
//!
//! The connections are opened before a round starts (not timed) and closed after it. A
//! lock statement cut off by the round's end leaves its session waiting in the server;
//! closing the connections ends those sessions and their locks one after another, and
//! every round takes a key of its own, so nothing carries over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::round::Counts;
use super::tasks::{Contended, HOLD, Turn, WAIT};
use crate::measure::counting_polls;
use crate::servers::{BenchDb, QueueSession};
use crate::workers::Grant;

/// The server-side queue's counters, kept across its rounds.
#[derive(Default)]
pub struct Queue {
    /// Locks granted: one attempt per acquisition, by construction.
    granted: AtomicU64,
    /// Statements sent: every lock (granted, failed, or cut off by the round's end) and
    /// every unlock.
    statements: AtomicU64,
}

impl Queue {
    pub fn counts(&self) -> Counts {
        Counts {
            attempts: self.granted.load(Ordering::Relaxed),
            statements: self.statements.load(Ordering::Relaxed),
        }
    }

    /// Opens one session per task for `key`, all at once.
    pub async fn open<DB: BenchDb>(
        url: &str,
        key: &str,
        tasks: usize,
    ) -> Result<Vec<Box<dyn QueueSession>>, sqlx::Error> {
        futures::future::try_join_all((0..tasks).map(|_| DB::queue_session(url, key, WAIT))).await
    }

    /// Runs a task per session that loops lock, hold [`HOLD`], unlock until `deadline`;
    /// the sessions are closed when their tasks end.
    pub async fn contend(
        self: &Arc<Self>,
        sessions: Vec<Box<dyn QueueSession>>,
        deadline: Instant,
    ) -> Contended {
        let handles: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(task, session)| {
                let counts = Arc::clone(self);
                tokio::spawn(async move {
                    let (mut done, polls) =
                        counting_polls(turns(&counts, task, session, deadline)).await;
                    done.task_wakeups = polls.saturating_sub(1);
                    done
                })
            })
            .collect();
        let mut per_task = Vec::with_capacity(handles.len());
        for handle in handles {
            per_task.push(handle.await.expect("a server-side queue task panicked"));
        }
        Contended::gather(per_task)
    }
}

/// One task's turns, as [`contend`](super::tasks::contend)'s loop takes them.
async fn turns(
    counts: &Queue,
    task: usize,
    mut session: Box<dyn QueueSession>,
    deadline: Instant,
) -> Contended {
    let mut done = Contended::default();
    while Instant::now() < deadline {
        let called = Instant::now();
        counts.statements.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout_at(deadline, session.lock()).await {
            // The round is over; the session still waits in the server until it is closed.
            Err(_deadline) => break,
            Ok(Err(err)) => {
                done.acquire_errors += 1;
                done.first_error.get_or_insert(err);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(Ok(())) => {
                let acquired = Instant::now();
                counts.granted.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(HOLD).await;
                counts.statements.fetch_add(1, Ordering::Relaxed);
                let released = match session.unlock().await {
                    Ok(()) => Some(Instant::now()),
                    Err(err) => {
                        done.release_errors += 1;
                        done.first_error.get_or_insert(err);
                        None
                    }
                };
                done.turns.push(Turn {
                    task,
                    acquired,
                    released,
                    waited: acquired - called,
                    // No fencing token: nothing here counts the grants.
                    grant: Grant {
                        token: 0,
                        ticket: None,
                    },
                });
            }
        }
    }
    done
}
