//! What the cells of section 3 that run in one process share: a round's figures
//! ([`Round`]) and a contender's across its rounds ([`percentile`], [`speed`],
//! [`longest`]), how a round is measured ([`measured`]), and dblock against polling in
//! interleaved rounds ([`interleaved`], for the one-thread comparison).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::tasks::{Contended, Side, contend};
use crate::measure::{Samples, median, new_owner, process_cpu, spread, turn_order};
use crate::servers::BenchDb;

pub const TASKS: usize = 8;

#[derive(Default)]
pub struct Round {
    pub acquisitions: u64,
    /// Handoffs in which the task that released the key took it again.
    pub retakes: u64,
    pub handoffs: Samples,
    pub waits: Samples,
    pub acquire_errors: u64,
    pub release_errors: u64,
    pub first_error: Option<String>,
    pub attempts: u64,
    /// Statements the contender sent (zero where they are not counted).
    pub statements: u64,
    /// Wake-ups of the round's tasks ([`Contended::task_wakeups`]).
    pub task_wakeups: u64,
    /// Context switches of all the bench's threads over the round (see
    /// [`process_cpu`]): each one a thread woken back onto a CPU.
    pub thread_wakeups: u64,
    /// Deadlocks the server counted (MariaDB: global `Innodb_deadlocks`, whoever caused them).
    pub server_deadlocks: Option<u64>,
    pub secs: f64,
}

impl Round {
    /// A round's figures from what its tasks did in `length`.
    fn of(done: Contended, length: Duration) -> Round {
        let mut r = Round {
            secs: length.as_secs_f64(),
            acquisitions: done.turns.len() as u64,
            acquire_errors: done.acquire_errors,
            release_errors: done.release_errors,
            first_error: done.first_error,
            task_wakeups: done.task_wakeups,
            ..Round::default()
        };
        for pair in done.turns.windows(2) {
            r.retakes += u64::from(pair[0].task == pair[1].task);
            if let Some(released) = pair[0].released {
                // Both instants are taken after a reply arrives; the next holder's reply
                // can be read a moment before the releasing task records its own, hence
                // saturating.
                r.handoffs
                    .push(pair[1].acquired.saturating_duration_since(released));
            }
        }
        for t in &done.turns {
            r.waits.push(t.waited);
        }
        r
    }

    pub fn per_sec(&self) -> f64 {
        self.acquisitions as f64 / self.secs
    }

    /// The share of handoffs in which the releasing task took the key again.
    pub fn retake_share(&self) -> f64 {
        self.retakes as f64 / self.acquisitions.saturating_sub(1).max(1) as f64
    }

    pub fn attempts_per_acquisition(&self) -> f64 {
        self.per_acquisition(self.attempts)
    }

    /// `n` per acquisition: each acquisition but the round's first is one handoff.
    pub fn per_acquisition(&self, n: u64) -> f64 {
        n as f64 / self.acquisitions.max(1) as f64
    }
}

/// A contender's own counters, read before and after a round: acquisition attempts and
/// statements sent.
#[derive(Clone, Copy, Default)]
pub struct Counts {
    pub attempts: u64,
    pub statements: u64,
}

/// Measures one round: `run` gets the round's deadline, `length` from now, and runs the
/// tasks until then. Around it: the contender's `counts`, the bench's thread wake-ups,
/// and the server's deadlocks (read on `pool`, which must not be the contender's own:
/// a reading would count as its statement).
pub async fn measured<DB: BenchDb, F>(
    pool: &sqlx::Pool<DB>,
    length: Duration,
    counts: impl Fn() -> Counts,
    run: impl FnOnce(Instant) -> F,
) -> Round
where
    F: Future<Output = Contended>,
{
    let deadlocks_before = DB::deadlocks(pool).await;
    let before = counts();
    let threads_before = process_cpu();
    let done = run(Instant::now() + length).await;
    let threads_after = process_cpu();
    // A pool counts a statement when its connection is given back, by a task of its
    // own, and an acquire cut off by the round's end finishes its statement in the
    // background: a moment for both, so they count in this round, not the next one's.
    tokio::time::sleep(SETTLE).await;
    let after = counts();
    let mut r = Round::of(done, length);
    r.attempts = after.attempts - before.attempts;
    r.statements = after.statements - before.statements;
    r.thread_wakeups = threads_after.wakeups.saturating_sub(threads_before.wakeups);
    r.server_deadlocks = match (deadlocks_before, DB::deadlocks(pool).await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    r
}

/// How long after a round its last statements are waited for (see [`measured`]).
const SETTLE: Duration = Duration::from_millis(20);

async fn round<DB: BenchDb>(
    side: &Arc<Side<DB>>,
    pool: &sqlx::Pool<DB>,
    key: String,
    length: Duration,
) -> Round {
    let counts = || Counts {
        attempts: side.attempts(),
        statements: 0,
    };
    measured(pool, length, counts, |deadline| {
        contend(side, &key, TASKS, deadline)
    })
    .await
}

/// Runs `rounds` rounds of `length` per side, the sides taking turns in an order rotated
/// each round, each round on a fresh key; `progress` hears each round's index first.
/// The rounds, per side.
pub async fn interleaved<DB: BenchDb>(
    sides: &[Arc<Side<DB>>],
    pool: &sqlx::Pool<DB>,
    rounds: usize,
    length: Duration,
    progress: impl Fn(usize),
) -> Vec<Vec<Round>> {
    let run = new_owner()[..8].to_owned();
    let mut measured: Vec<Vec<Round>> = sides.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        progress(r);
        for i in turn_order(sides.len(), r) {
            let key = format!("hot:{run}:{r}:{i}");
            measured[i].push(round(&sides[i], pool, key, length).await);
        }
    }
    measured
}

/// The median across rounds of one percentile of some samples, in seconds.
pub fn percentile(rounds: &mut [Round], samples: fn(&mut Round) -> &mut Samples, p: f64) -> f64 {
    median(
        rounds
            .iter_mut()
            .map(|r| samples(r).percentile(p).as_secs_f64()),
    )
}

/// Per round, `a`'s handoffs/s over `b`'s: (median, (lowest, highest)).
pub fn speed(a: &[Round], b: &[Round]) -> (f64, (f64, f64)) {
    let per_round: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.per_sec() / y.per_sec())
        .collect();
    (median(per_round.iter().copied()), spread(per_round))
}

/// The longest wait of all the rounds.
pub fn longest(rounds: &[Round]) -> Duration {
    rounds
        .iter()
        .map(|r| r.waits.max())
        .max()
        .unwrap_or_default()
}
