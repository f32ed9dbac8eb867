//! Cells 3.1 and 3.1b's *ceiling*: the same 8 tasks and the same turns, on one
//! `tokio::sync::Mutex` in this process instead of a database. tokio's mutex grants its
//! waiters in arrival order, as the server-side queue and dblock's local queue do, so a
//! handoff is what any such queue pays at the least: the holder's release and one task
//! wake-up, with no statement, no round trip and no commit. A lock that records each
//! grant in the database adds at least a round trip to that, so its handoffs/s stay
//! below this row's; the row bounds what issue 31's targets can ask of dblock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::round::Counts;
use super::tasks::{Contended, HOLD, Turn};
use crate::measure::{counting_polls, in_tasks};
use crate::workers::Grant;

/// The contender's name in the cells' tables.
pub const NAME: &str = "no database: tokio::sync::Mutex (FIFO), in-process";

/// The in-process mutex's counters, kept across its rounds.
#[derive(Default)]
pub struct Ceiling {
    /// Locks granted: one attempt per acquisition, by construction.
    granted: AtomicU64,
}

impl Ceiling {
    /// Acquisitions as attempts; no statements (nothing is sent anywhere).
    pub fn counts(&self) -> Counts {
        Counts {
            attempts: self.granted.load(Ordering::Relaxed),
            statements: 0,
        }
    }

    /// Runs `tasks` tasks on a fresh mutex (a round's fresh key) that loop lock, hold
    /// [`HOLD`], unlock until `deadline`, as
    /// [`contend`](super::tasks::contend)'s tasks do, wake-ups counted the same.
    pub async fn contend(self: &Arc<Self>, tasks: usize, deadline: Instant) -> Contended {
        let key = Arc::new(Mutex::new(()));
        let per_task = in_tasks(tasks, |task| {
            let (counts, key) = (Arc::clone(self), Arc::clone(&key));
            async move {
                let (mut done, polls) = counting_polls(turns(&counts, task, &key, deadline)).await;
                done.task_wakeups = polls.saturating_sub(1);
                done
            }
        })
        .await;
        Contended::gather(per_task)
    }
}

/// One task's turns. Taking the mutex cannot fail and letting it go is a drop, so there
/// are no errors: the round's end is the only way out of a wait.
async fn turns(counts: &Ceiling, task: usize, key: &Mutex<()>, deadline: Instant) -> Contended {
    let mut done = Contended::default();
    while Instant::now() < deadline {
        let called = Instant::now();
        let Ok(held) = tokio::time::timeout_at(deadline, key.lock()).await else {
            break;
        };
        let acquired = Instant::now();
        counts.granted.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(HOLD).await;
        drop(held);
        done.turns.push(Turn {
            task,
            acquired,
            released: Some(Instant::now()),
            waited: acquired - called,
            // No fencing token: nothing here counts the grants.
            grant: Grant {
                token: 0,
                ticket: None,
            },
        });
    }
    done
}
