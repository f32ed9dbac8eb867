//! Section 3: one hot key, waiting acquires (issue 10). Four cells per server, each
//! holder keeping the key [`HOLD`](crate::hotkey_tasks::HOLD) (2 ms):
//!
//! 1. **8 tasks in one process**, one Locker (this module). Every task loops:
//!    acquire, hold, `release`. Each acquisition and each completed release is stamped
//!    with one shared clock; sorted by acquisition time (one key: holders follow each
//!    other), the handoff latency is the time from one holder's release completing to
//!    the next holder's acquire returning, which includes any backoff sleep of the
//!    waiter: what a caller experiences. Contenders, in interleaved rounds: dblock's
//!    `acquire` (local queue, a release wakes the next waiter); *polling*, the old
//!    design, reproduced with the public API: `try_acquire`, then sleep the retry
//!    policy's next jittered exponential delay, no local queue
//!    ([`poll_acquire`](crate::hotkey_tasks::poll_acquire)); and,
//!    for scale, a hand-written contender that sends dblock's statements and retries at
//!    once without sleeping: a ceiling for handoffs per second, bought with a hot retry
//!    loop.
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

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dblock::Locker;
use tokio::time::Instant;

use crate::handwritten::new_owner;
use crate::hotkey_tasks::{Side, contend};
use crate::measure::{Samples, median, spread, turn_order};
use crate::report::{Table, count, ms, ms_f, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;
use crate::{hotkey_fair, hotkey_pool, hotkey_procs};

/// The section's introduction in the report (the same for every server).
pub const INTRO: &str = "## 3. Hot key: one key, waiting acquire\n\n\
    Issue 10's cells, then fair mode, each holder keeping the key 2 ms: (1) 8 tasks \
    through one Locker, (2) 2 processes x 4 tasks, each process with its own Locker and \
    pool, (3) 100 waiters through a pool of 4 while one holder keeps the key, (4) fair \
    mode (`fair(true)`, tickets) against the default, 2 processes x 4 tasks as in (2), \
    grants checked against ticket order. *Polling* is the old design reproduced with the \
    public API: `try_acquire`, then sleep the retry policy's jittered \
    exponential backoff (`RetryPolicy::default().delays()`), no local queue. Wait = acquire \
    called -> returned, for acquisitions that succeeded: a round's end cancels the acquires \
    still waiting (they are cancel safe), which counts neither as an error nor as a wait, \
    so the longest wait is capped by the round's length. Handoff = release completed -> \
    next acquire returned; releaser re-takes = the share of handoffs in which the task \
    that released the key took it again.\n\n";

const TABLE: &str = "bench_lock_hot";
const TASKS: usize = 8;

/// Issue 10's targets for cell 1.
const TARGET_P99: Duration = Duration::from_millis(50);
const TARGET_LONGEST: Duration = Duration::from_millis(100);
const TARGET_ATTEMPTS: f64 = 1.3;

#[derive(Default)]
pub(crate) struct Round {
    acquisitions: u64,
    /// Handoffs in which the task that released the key took it again.
    retakes: u64,
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

impl Round {
    pub(crate) fn per_sec(&self) -> f64 {
        self.acquisitions as f64 / self.secs
    }

    /// The share of handoffs in which the releasing task took the key again.
    pub(crate) fn retake_share(&self) -> f64 {
        self.retakes as f64 / self.acquisitions.saturating_sub(1).max(1) as f64
    }

    fn attempts_per_acquisition(&self) -> f64 {
        self.attempts as f64 / self.acquisitions.max(1) as f64
    }
}

async fn round<DB: BenchDb>(
    side: &Arc<Side<DB>>,
    pool: &sqlx::Pool<DB>,
    key: String,
    length: Duration,
) -> Round {
    let attempts_before = side.attempts();
    let deadlocks_before = DB::deadlocks(pool).await;
    let done = contend(side, &key, TASKS, Instant::now() + length).await;
    let mut r = Round {
        secs: length.as_secs_f64(),
        acquisitions: done.turns.len() as u64,
        acquire_errors: done.acquire_errors,
        release_errors: done.release_errors,
        first_error: done.first_error,
        ..Round::default()
    };
    for pair in done.turns.windows(2) {
        r.retakes += u64::from(pair[0].task == pair[1].task);
        if let Some(released) = pair[0].released {
            // Both instants are taken after a reply arrives; the next holder's reply can be
            // read a moment before the releasing task records its own, hence saturating.
            r.handoffs
                .push(pair[1].acquired.saturating_duration_since(released));
        }
    }
    for t in &done.turns {
        r.waits.push(t.waited);
    }
    r.attempts = side.attempts() - attempts_before;
    r.server_deadlocks = match (deadlocks_before, DB::deadlocks(pool).await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    r
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
        "#### 3.2 2 processes x 4 tasks\n\n",
        "#### 3.3 100 waiters through a pool of 4\n\n",
        "#### 3.4 Fair mode, 2 processes x 4 tasks\n\n",
    ];
    for (i, heading) in cells.into_iter().enumerate() {
        out.push_str(heading);
        let cell = match i {
            0 => one_locker(settings, server).await,
            1 => hotkey_procs::cell(settings, server).await,
            2 => hotkey_pool::cell(settings, server).await,
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

/// Cell 1: 8 tasks through one Locker.
async fn one_locker<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    let locker = server.fresh_locker(TABLE).await?;
    let sides: Vec<Arc<Side<DB>>> = vec![
        Arc::new(Side::Dblock(locker.clone())),
        Arc::new(Side::Poll(
            Locker::builder(server.pool.clone()).table(TABLE).build()?,
        )),
        Arc::new(Side::Spin {
            lock: DB::hand(&server.pool, TABLE),
            attempts: AtomicU64::new(0),
        }),
    ];
    let mut rounds = interleaved(&sides, &server.pool, settings.rounds, settings.round, |r| {
        eprintln!(
            "hotkey: {}, 8 tasks, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        )
    })
    .await;
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let mut out = String::new();
    let mut table = Table::new(&[
        "contender",
        "handoffs/s",
        "handoff p50 ms",
        "handoff p99 ms",
        "wait p99 ms",
        "longest wait ms",
        "attempts per acquisition",
        "releaser re-takes",
        "server deadlocks/s",
        "errors to callers (acquire / release)",
    ]);
    for (side, rs) in sides.iter().zip(&mut rounds) {
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
            count(median(rs.iter().map(Round::per_sec))),
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
                "{:.2}",
                median(rs.iter().map(Round::attempts_per_acquisition))
            ),
            format!("{:.0}%", 100.0 * median(rs.iter().map(Round::retake_share))),
            deadlocks,
            format!("{acquire_errors} / {release_errors}"),
        ]);
    }
    out.push_str(&table.render());
    out.push('\n');

    let (dblock, others) = rounds.split_at_mut(1);
    let (dblock, poll) = (&mut dblock[0], &others[0]);
    let p99 = median(
        dblock
            .iter_mut()
            .map(|r| r.waits.percentile(99.0).as_secs_f64()),
    );
    let longest = dblock
        .iter()
        .map(|r| r.waits.max())
        .max()
        .unwrap_or_default();
    let speed: Vec<f64> = dblock
        .iter()
        .zip(poll.iter())
        .map(|(d, p)| d.per_sec() / p.per_sec())
        .collect();
    let speed_median = median(speed.iter().copied());
    let attempts = median(dblock.iter().map(Round::attempts_per_acquisition));
    let errors: u64 = dblock
        .iter()
        .map(|r| r.acquire_errors + r.release_errors)
        .sum();
    let (lo, hi) = spread(dblock.iter().map(Round::per_sec));
    let _ = writeln!(
        out,
        "- Target: dblock's wait p99 <= {} ms -> {} ({} ms, median of rounds).",
        TARGET_P99.as_millis(),
        verdict(p99 <= TARGET_P99.as_secs_f64()),
        ms_f(p99),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's longest wait <= {} ms -> {} ({} ms, longest of all rounds).",
        TARGET_LONGEST.as_millis(),
        verdict(longest <= TARGET_LONGEST),
        ms(longest),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's handoffs/s >= polling's -> {} (dblock / polling {}, per round).",
        verdict(speed_median >= 1.0),
        ratio(speed_median, spread(speed.iter().copied())),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's attempts per acquisition <= {TARGET_ATTEMPTS} -> {} ({attempts:.2}).",
        verdict(attempts <= TARGET_ATTEMPTS),
    );
    let _ = writeln!(
        out,
        "- Target: zero errors returned to dblock's callers -> {} ({errors} in {} \
         acquisitions; handoffs/s ranged {}-{} across rounds).",
        verdict(errors == 0),
        dblock.iter().map(|r| r.acquisitions).sum::<u64>(),
        count(lo),
        count(hi),
    );
    let retakes = median(poll.iter().map(Round::retake_share));
    out.push_str(&crate::hotkey_thread::ceiling::<DB>(settings, &server.url, retakes).await);
    for (side, rs) in sides.iter().zip(&rounds) {
        if let Some(err) = rs.iter().find_map(|r| r.first_error.as_ref()) {
            let _ = writeln!(out, "- first error of {}: `{err}`", side.name());
        }
    }
    out.push('\n');
    Ok(out)
}
