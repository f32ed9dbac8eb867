//! Section 3: one hot key, waiting acquires (issue 10). Five cells per server, each
//! holder keeping the key [`HOLD`](crate::hotkey_tasks::HOLD) (2 ms):
//!
//! 1. **8 tasks in one process**, one Locker
//!    ([`hotkey_contended`](crate::hotkey_contended)). Every task loops: acquire, hold,
//!    `release`. Each acquisition and each completed release is stamped with one shared
//!    clock; sorted by acquisition time (one key: holders follow each other), the
//!    handoff latency is the time from one holder's release completing to the next
//!    holder's acquire returning, which includes any backoff sleep of the waiter: what a
//!    caller experiences. Contenders, in interleaved rounds: dblock's `acquire` (local
//!    queue, a release wakes the next waiter); *polling*, the old design, reproduced with
//!    the public API: `try_acquire`, then sleep the retry policy's next jittered
//!    exponential delay, no local queue ([`poll_acquire`](crate::hotkey_tasks::poll_acquire));
//!    for scale, a hand-written contender that sends dblock's statements and retries at
//!    once without sleeping: a ceiling for handoffs per second, bought with a hot retry
//!    loop; and the *server-side queue* ([`hotkey_queue`](crate::hotkey_queue)), what a
//!    Rust user has today: a connection per task, blocked in `pg_advisory_lock` until
//!    the server grants the key. Beside them, to put the targets against that queue in
//!    context: the same tasks on an in-process `tokio::sync::Mutex`
//!    ([`hotkey_ceiling`](crate::hotkey_ceiling)), a handoff with no database at all,
//!    and (PostgreSQL) dblock on a relaxed (`UNLOGGED`) lock table.
//!
//!    1b. **The same, CPU contended**: cell 1's contenders while two busy-loop processes
//!    run beside the bench.
//! 2. **2 processes x 4 tasks** on the same key, each process with its own Locker and
//!    pool ([`hotkey_procs`](crate::hotkey_procs)): the bench re-executes itself as two
//!    workers that start at the same instant; shares of the acquisitions and waits per
//!    process.
//! 3. **100 waiters through a pool of 4** ([`hotkey_pool`](crate::hotkey_pool)): one
//!    holder keeps the key (short lease, renewed) for the whole round while 100 tasks
//!    wait for it; statements per second the server sees, dblock against polling.
//! 4. **Fair mode, 2 processes x 4 tasks** ([`hotkey_fair`](crate::hotkey_fair)): cell
//!    2's workers, in rounds with Lockers built `fair(true)` and with the default; each
//!    worker reports its grants (fencing token, ticket), and the parent merges them in
//!    grant order (by fencing token) and counts the grants against their tickets' order
//!    (target: none), with shares, waits and statements on the server per acquisition.
//!
//! This module keeps what the cells of one process share: a round's figures
//! ([`Round`]), how a round is measured ([`measured`]), and dblock against polling in
//! interleaved rounds ([`interleaved`], for the one-thread comparison).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::handwritten::new_owner;
use crate::hotkey_tasks::{Contended, Side, contend};
use crate::measure::{Samples, process_cpu, turn_order};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;
use crate::{hotkey_contended, hotkey_fair, hotkey_pool, hotkey_procs};

/// The section's introduction in the report (the same for every server).
pub const INTRO: &str = "## 3. Hot key: one key, waiting acquire\n\n\
    Issue 10's cells, then fair mode, each holder keeping the key 2 ms: (1) 8 tasks \
    through one Locker, against polling, a retry-at-once loop and a server-side queue \
    (a connection per task, blocked in the server's own lock until granted), with an \
    in-process mutex (no database: the ceiling of any FIFO handoff) and, on PostgreSQL, \
    dblock on a relaxed (`UNLOGGED`) table beside them, and (1b) the \
    same while two busy loops burn the CPU beside the bench, (2) 2 processes x 4 tasks, \
    each process with its own Locker and pool, (3) 100 waiters through a pool of 4 while \
    one holder keeps the key, (4) fair mode (`fair(true)`, tickets) against the default, \
    2 processes x 4 tasks as in (2), grants checked against ticket order. *Polling* is \
    the old design reproduced with the public API: `try_acquire`, then sleep the retry \
    policy's jittered exponential backoff (`RetryPolicy::default().delays()`), no local \
    queue. Wait = acquire called -> returned, for acquisitions that succeeded: a round's \
    end cancels the acquires still waiting (they are cancel safe), which counts neither \
    as an error nor as a wait, so the longest wait is capped by the round's length. \
    Handoff = release completed -> next acquire returned; releaser re-takes = the share \
    of handoffs in which the task that released the key took it again.\n\n";

pub(crate) const TASKS: usize = 8;

#[derive(Default)]
pub(crate) struct Round {
    pub(crate) acquisitions: u64,
    /// Handoffs in which the task that released the key took it again.
    pub(crate) retakes: u64,
    pub(crate) handoffs: Samples,
    pub(crate) waits: Samples,
    pub(crate) acquire_errors: u64,
    pub(crate) release_errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) attempts: u64,
    /// Statements the contender sent (zero where they are not counted).
    pub(crate) statements: u64,
    /// Wake-ups of the round's tasks ([`Contended::task_wakeups`]).
    pub(crate) task_wakeups: u64,
    /// Context switches of all the bench's threads over the round (see
    /// [`process_cpu`]): each one a thread woken back onto a CPU.
    pub(crate) thread_wakeups: u64,
    /// Deadlocks the server counted (MariaDB: global `Innodb_deadlocks`, whoever caused them).
    pub(crate) server_deadlocks: Option<u64>,
    pub(crate) secs: f64,
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

    pub(crate) fn per_sec(&self) -> f64 {
        self.acquisitions as f64 / self.secs
    }

    /// The share of handoffs in which the releasing task took the key again.
    pub(crate) fn retake_share(&self) -> f64 {
        self.retakes as f64 / self.acquisitions.saturating_sub(1).max(1) as f64
    }

    pub(crate) fn attempts_per_acquisition(&self) -> f64 {
        self.per_acquisition(self.attempts)
    }

    /// `n` per acquisition: each acquisition but the round's first is one handoff.
    pub(crate) fn per_acquisition(&self, n: u64) -> f64 {
        n as f64 / self.acquisitions.max(1) as f64
    }
}

/// A contender's own counters, read before and after a round: acquisition attempts and
/// statements sent.
#[derive(Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) attempts: u64,
    pub(crate) statements: u64,
}

/// Measures one round: `run` gets the round's deadline, `length` from now, and runs the
/// tasks until then. Around it: the contender's `counts`, the bench's thread wake-ups,
/// and the server's deadlocks (read on `pool`, which must not be the contender's own:
/// a reading would count as its statement).
pub(crate) async fn measured<DB: BenchDb, F>(
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
pub(crate) async fn interleaved<DB: BenchDb>(
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

/// Runs section 3 on one server; returns its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut out = format!("### {}\n\n", server.label);
    let cells = [
        "#### 3.1 8 tasks, one Locker\n\n",
        "#### 3.1b 8 tasks, one Locker, CPU contended\n\n",
        "#### 3.2 2 processes x 4 tasks\n\n",
        "#### 3.3 100 waiters through a pool of 4\n\n",
        "#### 3.4 Fair mode, 2 processes x 4 tasks\n\n",
    ];
    for (i, heading) in cells.into_iter().enumerate() {
        out.push_str(heading);
        let cell = match i {
            0 => hotkey_contended::cell(settings, server, false).await,
            1 => hotkey_contended::cell(settings, server, true).await,
            2 => hotkey_procs::cell(settings, server).await,
            3 => hotkey_pool::cell(settings, server).await,
            _ => hotkey_fair::cell(settings, server).await,
        };
        match cell {
            Ok(md) => out.push_str(&md),
            Err(e) => {
                let _ = writeln!(out, "Not measured: {e}\n");
            }
        }
    }
    out
}
