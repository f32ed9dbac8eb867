//! Section 3: eight tasks contending on one key with a waiting acquire.
//!
//! Every task loops: `acquire(key, lease, wait)`, hold the lock 1 ms, `release`. Each
//! acquisition and each completed release is stamped with one shared clock; sorted by
//! acquisition time (one key: holders follow each other), the handoff latency is the time
//! from one holder's release completing to the next holder's acquire returning. That time
//! includes the waiter's backoff sleep, which is what a caller experiences.
//!
//! For scale, a hand-written contender sends dblock's statements and retries at once,
//! without sleeping: a ceiling for handoffs per second, bought with a hot retry loop.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dblock::{LockGuard, Locker};
use tokio::time::Instant;

use crate::handwritten::{HandLock, new_owner};
use crate::measure::{Samples, in_tasks, median, spread, turn_order};
use crate::report::{Table, count, ms, ms_f, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_hot";
const TASKS: usize = 8;
const HOLD: Duration = Duration::from_millis(1);
const LEASE: Duration = Duration::from_secs(30);
/// Longer than any round: a round's end cancels waiting acquires (they are cancel safe),
/// so a `Timeout` error would mean a waiter starved for this long.
const WAIT: Duration = Duration::from_secs(30);

/// How a contender takes the hot key.
enum Side<DB: BenchDb> {
    Dblock(Locker<DB>),
    Spin {
        lock: Arc<dyn HandLock>,
        attempts: AtomicU64,
    },
}

enum Held<DB: BenchDb> {
    Dblock(LockGuard<DB>),
    Spin { owner: String, token: i64 },
}

impl<DB: BenchDb> Side<DB> {
    fn name(&self) -> &'static str {
        match self {
            Side::Dblock(_) => "dblock acquire (backoff with jitter)",
            Side::Spin { .. } => "hand-written, retry at once",
        }
    }

    fn attempts(&self) -> u64 {
        match self {
            Side::Dblock(locker) => locker.stats().attempts,
            Side::Spin { attempts, .. } => attempts.load(Ordering::Relaxed),
        }
    }

    /// Waits for the key until `deadline`; `Ok(None)` when the deadline came first.
    async fn acquire(&self, key: &str, deadline: Instant) -> Result<Option<Held<DB>>, String> {
        match self {
            Side::Dblock(locker) => {
                match tokio::time::timeout_at(deadline, locker.acquire(key, LEASE, WAIT)).await {
                    Err(_deadline) => Ok(None),
                    Ok(Ok(guard)) => Ok(Some(Held::Dblock(guard))),
                    Ok(Err(err)) => Err(err.to_string()),
                }
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
                match tokio::time::timeout_at(deadline, spin).await {
                    Err(_deadline) => Ok(None),
                    Ok(Ok(token)) => Ok(Some(Held::Spin {
                        owner: owner.clone(),
                        token,
                    })),
                    Ok(Err(err)) => Err(err),
                }
            }
        }
    }

    async fn release(&self, key: &str, held: Held<DB>) -> Result<(), String> {
        match (self, held) {
            (_, Held::Dblock(guard)) => guard.release().await.map_err(|e| e.to_string()),
            (Side::Spin { lock, .. }, Held::Spin { owner, token }) => {
                match lock.release(key, &owner, token).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err("the row was no longer ours".into()),
                    Err(err) => Err(err.to_string()),
                }
            }
            (Side::Dblock(_), Held::Spin { .. }) => unreachable!("held by the other side"),
        }
    }
}

/// One holder's turn.
struct Turn {
    acquired: Instant,
    released: Option<Instant>,
    waited: Duration,
}

#[derive(Default)]
struct Round {
    acquisitions: u64,
    handoffs: Samples,
    waits: Samples,
    acquire_errors: u64,
    release_errors: u64,
    first_error: Option<String>,
    attempts: u64,
    /// Deadlocks the server counted (MariaDB: global `Innodb_deadlocks`, whoever caused them).
    server_deadlocks: Option<u64>,
    secs: f64,
}

async fn round<DB: BenchDb>(
    side: &Arc<Side<DB>>,
    pool: &sqlx::Pool<DB>,
    key: String,
    length: Duration,
) -> Round {
    let attempts_before = side.attempts();
    let deadlocks_before = DB::deadlocks(pool).await;
    let deadline = Instant::now() + length;
    let per_task = in_tasks(TASKS, |_| {
        let side = Arc::clone(side);
        let key = key.clone();
        async move {
            let mut turns = Vec::new();
            let (mut acquire_errors, mut release_errors, mut first_error) = (0, 0, None);
            while Instant::now() < deadline {
                let called = Instant::now();
                match side.acquire(&key, deadline).await {
                    Ok(None) => break,
                    Ok(Some(held)) => {
                        let acquired = Instant::now();
                        tokio::time::sleep(HOLD).await;
                        let released = match side.release(&key, held).await {
                            Ok(()) => Some(Instant::now()),
                            Err(err) => {
                                release_errors += 1;
                                first_error.get_or_insert(err);
                                None
                            }
                        };
                        turns.push(Turn {
                            acquired,
                            released,
                            waited: acquired - called,
                        });
                    }
                    Err(err) => {
                        acquire_errors += 1;
                        first_error.get_or_insert(err);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            (turns, acquire_errors, release_errors, first_error)
        }
    })
    .await;

    let mut r = Round {
        secs: length.as_secs_f64(),
        ..Round::default()
    };
    let mut turns = Vec::new();
    for (t, acquire_errors, release_errors, first_error) in per_task {
        turns.extend(t);
        r.acquire_errors += acquire_errors;
        r.release_errors += release_errors;
        if r.first_error.is_none() {
            r.first_error = first_error;
        }
    }
    turns.sort_by_key(|t| t.acquired);
    r.acquisitions = turns.len() as u64;
    for pair in turns.windows(2) {
        if let Some(released) = pair[0].released {
            // Both instants are taken after a reply arrives; the next holder's reply can be
            // read a moment before the releasing task records its own, hence saturating.
            r.handoffs
                .push(pair[1].acquired.saturating_duration_since(released));
        }
    }
    for t in &turns {
        r.waits.push(t.waited);
    }
    r.attempts = side.attempts() - attempts_before;
    r.server_deadlocks = match (deadlocks_before, DB::deadlocks(pool).await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    r
}

/// Runs section 3 on one server; returns its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    match run(settings, server).await {
        Ok(md) => md,
        Err(e) => format!("### {}\n\nNot measured: {e}\n\n", server.label),
    }
}

async fn run<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    let locker = server.fresh_locker(TABLE).await?;
    let sides: Vec<Arc<Side<DB>>> = vec![
        Arc::new(Side::Dblock(locker)),
        Arc::new(Side::Spin {
            lock: DB::hand(&server.pool, TABLE),
            attempts: AtomicU64::new(0),
        }),
    ];
    let run = new_owner()[..8].to_owned();
    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(), Vec::new()];
    for r in 0..settings.rounds {
        eprintln!(
            "hotkey: {}, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        for i in turn_order(sides.len(), r) {
            let key = format!("hot:{run}:{r}:{i}");
            rounds[i].push(round(&sides[i], &server.pool, key, settings.round).await);
        }
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let mut out = format!("### {}\n\n", server.label);
    let mut table = Table::new(&[
        "contender",
        "handoffs/s",
        "handoff p50 ms",
        "handoff p99 ms",
        "wait p99 ms",
        "longest wait ms",
        "attempts per acquisition",
        "server deadlocks/s",
        "errors to callers (acquire / release)",
    ]);
    for (side, rs) in sides.iter().zip(&mut rounds) {
        let per_sec = |r: &Round| r.acquisitions as f64 / r.secs;
        let acquire_errors: u64 = rs.iter().map(|r| r.acquire_errors).sum();
        let release_errors: u64 = rs.iter().map(|r| r.release_errors).sum();
        let deadlocks = if rs.iter().all(|r| r.server_deadlocks.is_some()) {
            count(median(
                rs.iter()
                    .map(|r| r.server_deadlocks.unwrap_or(0) as f64 / r.secs),
            ))
        } else {
            "n/a".to_owned()
        };
        let longest = rs.iter().map(|r| r.waits.max()).max().unwrap_or_default();
        table.row(vec![
            side.name().to_owned(),
            count(median(rs.iter().map(per_sec))),
            ms_f(median(
                rs.iter_mut()
                    .map(|r| r.handoffs.percentile(50.0).as_secs_f64()),
            )),
            ms_f(median(
                rs.iter_mut()
                    .map(|r| r.handoffs.percentile(99.0).as_secs_f64()),
            )),
            ms_f(median(
                rs.iter_mut()
                    .map(|r| r.waits.percentile(99.0).as_secs_f64()),
            )),
            ms(longest),
            format!(
                "{:.1}",
                median(
                    rs.iter()
                        .map(|r| r.attempts as f64 / r.acquisitions.max(1) as f64)
                )
            ),
            deadlocks,
            format!("{acquire_errors} / {release_errors}"),
        ]);
    }
    out.push_str(&table.render());

    let dblock = &rounds[0];
    let errors: u64 = dblock
        .iter()
        .map(|r| r.acquire_errors + r.release_errors)
        .sum();
    let (lo, hi) = spread(dblock.iter().map(|r| r.acquisitions as f64 / r.secs));
    let _ = writeln!(
        out,
        "\nTarget: zero errors returned to dblock's callers -> {} ({errors} in {} acquisitions; \
         handoffs/s ranged {}-{} across rounds).",
        verdict(errors == 0),
        dblock.iter().map(|r| r.acquisitions).sum::<u64>(),
        count(lo),
        count(hi),
    );
    for (side, rs) in sides.iter().zip(&rounds) {
        if let Some(err) = rs.iter().find_map(|r| r.first_error.as_ref()) {
            let _ = writeln!(out, "- first error of {}: `{err}`", side.name());
        }
    }
    out.push('\n');
    Ok(out)
}
