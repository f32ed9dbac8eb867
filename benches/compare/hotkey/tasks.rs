//! Section 3's contenders and their task loop, shared by the cells of
//! [`hotkey`](super) and by its worker processes
//! ([`workers`](super::workers)): dblock's `acquire`, the old design's polling
//! loop, and the hand-written retry-at-once loop; `contend` runs tasks that take the key,
//! hold it [`HOLD`] and release it, turn after turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dblock::{LockGuard, Locker, RetryPolicy};
use tokio::time::Instant;

use crate::handwritten::HandLock;
use crate::measure::{counting_polls, in_tasks, new_owner};
use crate::servers::LockDb;
use crate::workers::Grant;

/// How long every holder of every cell keeps the key.
pub const HOLD: Duration = Duration::from_millis(2);
pub const LEASE: Duration = Duration::from_secs(30);
/// Longer than any round: a round's end cancels waiting acquires (they are cancel safe),
/// so a `Timeout` error would mean a waiter starved for this long.
pub const WAIT: Duration = Duration::from_secs(30);

/// The old design's waiting acquire: one `try_acquire`, and while the key is taken a
/// sleep of the retry policy's next jittered exponential delay, then again. No local
/// queue: every waiter polls the database on its own. Runs until it wins or fails.
pub async fn poll_acquire<DB: LockDb>(
    locker: &Locker<DB>,
    key: &str,
    lease: Duration,
) -> Result<LockGuard<DB>, dblock::Error> {
    let mut delays = RetryPolicy::default().delays();
    loop {
        if let Some(guard) = locker.try_acquire(key, lease).await? {
            return Ok(guard);
        }
        tokio::time::sleep(delays.next().unwrap_or_default()).await;
    }
}

/// How a contender takes the hot key.
pub enum Side<DB: LockDb> {
    Dblock(Locker<DB>),
    /// The old design; a Locker of its own, so its attempts are counted apart.
    Poll(Locker<DB>),
    Spin {
        lock: Arc<dyn HandLock>,
        attempts: AtomicU64,
    },
}

pub enum Held<DB: LockDb> {
    Guard(LockGuard<DB>),
    Spin { owner: String, token: i64 },
}

impl<DB: LockDb> Held<DB> {
    /// The grant's fencing token and, in fair mode, the ticket it waited on.
    fn grant(&self) -> Grant {
        match self {
            Held::Guard(guard) => Grant {
                token: guard.fencing_token(),
                ticket: guard.ticket(),
            },
            Held::Spin { token, .. } => Grant {
                token: *token,
                ticket: None,
            },
        }
    }
}

impl<DB: LockDb> Side<DB> {
    pub fn name(&self) -> &'static str {
        match self {
            Side::Dblock(_) => "dblock acquire (local queue)",
            Side::Poll(_) => "polling: try_acquire + jittered backoff (old design)",
            Side::Spin { .. } => "hand-written, retry at once",
        }
    }

    pub fn attempts(&self) -> u64 {
        match self {
            Side::Dblock(locker) | Side::Poll(locker) => locker.stats().attempts,
            Side::Spin { attempts, .. } => attempts.load(Ordering::Relaxed),
        }
    }

    /// Waits for the key until `deadline`; `Ok(None)` when the deadline came first.
    async fn acquire(&self, key: &str, deadline: Instant) -> Result<Option<Held<DB>>, String> {
        let won = match self {
            Side::Dblock(locker) => {
                tokio::time::timeout_at(deadline, locker.acquire(key, LEASE, WAIT)).await
            }
            Side::Poll(locker) => {
                tokio::time::timeout_at(deadline, poll_acquire(locker, key, LEASE)).await
            }
            Side::Spin { lock, attempts } => {
                let owner = new_owner();
                let spin = async {
                    loop {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        match lock.acquire(key, &owner).await {
                            Ok(Some(token)) => return Ok(token),
                            Ok(None) => {}
                            Err(err) if lock.lost_race(&err) => {}
                            Err(err) => return Err(err.to_string()),
                        }
                    }
                };
                return match tokio::time::timeout_at(deadline, spin).await {
                    Err(_deadline) => Ok(None),
                    Ok(Ok(token)) => Ok(Some(Held::Spin {
                        owner: owner.clone(),
                        token,
                    })),
                    Ok(Err(err)) => Err(err),
                };
            }
        };
        match won {
            Err(_deadline) => Ok(None),
            Ok(Ok(guard)) => Ok(Some(Held::Guard(guard))),
            Ok(Err(err)) => Err(err.to_string()),
        }
    }

    async fn release(&self, key: &str, held: Held<DB>) -> Result<(), String> {
        match (self, held) {
            (_, Held::Guard(guard)) => guard.release().await.map_err(|e| e.to_string()),
            (Side::Spin { lock, .. }, Held::Spin { owner, token }) => {
                match lock.release(key, &owner, token).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err("the row was no longer ours".into()),
                    Err(err) => Err(err.to_string()),
                }
            }
            (_, Held::Spin { .. }) => unreachable!("held by the hand-written side"),
        }
    }
}

/// One holder's turn.
pub struct Turn {
    /// Which of the round's tasks held the key.
    pub task: usize,
    pub acquired: Instant,
    pub released: Option<Instant>,
    pub waited: Duration,
    pub grant: Grant,
}

/// What the tasks of one round did, turn by turn.
#[derive(Default)]
pub struct Contended {
    /// Sorted by acquisition time.
    pub turns: Vec<Turn>,
    pub acquire_errors: u64,
    pub release_errors: u64,
    pub first_error: Option<String>,
    /// Wake-ups of the round's tasks, all together (polls after each task's first; see
    /// [`counting_polls`]): only the caller's tasks, not the tasks a client library or
    /// dblock's engine spawns.
    pub task_wakeups: u64,
}

/// Runs `tasks` tasks that loop acquire, hold [`HOLD`], release on `key` until
/// `deadline`.
pub async fn contend<DB: LockDb>(
    side: &Arc<Side<DB>>,
    key: &str,
    tasks: usize,
    deadline: Instant,
) -> Contended {
    let per_task = in_tasks(tasks, |task| {
        let side = Arc::clone(side);
        let key = key.to_owned();
        let turns = async move {
            let mut done = Contended::default();
            while Instant::now() < deadline {
                let called = Instant::now();
                match side.acquire(&key, deadline).await {
                    Ok(None) => break,
                    Ok(Some(held)) => {
                        let acquired = Instant::now();
                        let grant = held.grant();
                        tokio::time::sleep(HOLD).await;
                        let released = match side.release(&key, held).await {
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
                            grant,
                        });
                    }
                    Err(err) => {
                        done.acquire_errors += 1;
                        done.first_error.get_or_insert(err);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            done
        };
        async move {
            let (mut done, polls) = counting_polls(turns).await;
            done.task_wakeups = polls.saturating_sub(1);
            done
        }
    })
    .await;
    Contended::gather(per_task)
}

impl Contended {
    /// What every task of a round did, together: turns sorted by acquisition time.
    pub fn gather(per_task: impl IntoIterator<Item = Contended>) -> Contended {
        let mut all = Contended::default();
        for done in per_task {
            all.turns.extend(done.turns);
            all.acquire_errors += done.acquire_errors;
            all.release_errors += done.release_errors;
            all.task_wakeups += done.task_wakeups;
            if all.first_error.is_none() {
                all.first_error = done.first_error;
            }
        }
        all.turns.sort_by_key(|t| t.acquired);
        all
    }
}
