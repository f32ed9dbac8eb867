//! Section 7, cell 2: one semaphore of 3 permits, 4 real OS processes x 3 tasks, each
//! process with its own Locker and pool; every task takes a permit, holds it 5-20 ms
//! (random), gives it back, again. Per process: its share of the grants, and its
//! longest drought, the longest time it had a waiter and got no permit.

use std::fmt::Write as _;

use super::procs::{self, PERMIT_HOLD_MS, PERMITS};
use crate::measure::{median, new_owner, spread};
use crate::report::{Table, count, ms, ms_f, verdict};
use crate::servers::{LockDb, Server};
use crate::settings::Settings;
use crate::workers::{self, Job, Mode, Report};

const TABLE: &str = "bench_lock_sem_procs";
const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 3;
/// A round is this many times the bench's round: a drought of a second must fit in it
/// several times over.
const ROUND_FACTOR: u32 = 5;

/// Issue 45's targets: each process's share of the grants at least this (an even share
/// is 25 %)...
const SHARE_TARGET: f64 = 0.15;
/// ... and no process without a grant for longer than this while it had a waiter.
const DROUGHT_TARGET: f64 = 1.0;

/// Cell 2 on one server; its markdown.
pub async fn cell<DB: LockDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    // Creates the table; the workers build their own Lockers on it.
    drop(server.fresh_locker(TABLE).await?);
    let run = new_owner()[..8].to_owned();
    let length = settings.round * ROUND_FACTOR;
    let mut rounds: Vec<Vec<Report>> = Vec::new();
    for r in 0..settings.rounds {
        eprintln!(
            "primitives: {}, semaphore, {PROCESSES} processes, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        let name = format!("sem-{run}-{r}");
        let job = Job::new(Mode::Semaphore, TABLE, &name, TASKS_PER_PROCESS, length);
        rounds.push(workers::round(&server.url, &job, PROCESSES).await?);
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let secs = length.as_secs_f64();
    let mut table = Table::new(&[
        "process",
        "grants/s",
        "share of all grants",
        "wait p99 ms",
        "longest wait ms",
        "longest drought ms (median of rounds; longest)",
        "errors to callers (acquire / release)",
    ]);
    for p in 0..PROCESSES {
        let shares: Vec<f64> = rounds.iter().map(|round| procs::share(round, p)).collect();
        let (lo, hi) = spread(shares.iter().copied());
        let droughts = rounds.iter().map(|round| round[p].drought);
        let acquire_errors: u64 = rounds.iter().map(|round| round[p].acquire_errors).sum();
        let release_errors: u64 = rounds.iter().map(|round| round[p].release_errors).sum();
        table.row(vec![
            format!("{} (own Locker, {TASKS_PER_PROCESS} tasks)", p + 1),
            count(median(
                rounds
                    .iter()
                    .map(|round| round[p].acquisitions as f64 / secs),
            )),
            format!(
                "{:.0} % ({:.0}-{:.0})",
                median(shares.iter().copied()) * 100.0,
                lo * 100.0,
                hi * 100.0
            ),
            ms_f(median(rounds.iter().map(|round| procs::p99(&round[p])))),
            ms(rounds
                .iter()
                .map(|round| round[p].waits.max())
                .max()
                .unwrap_or_default()),
            format!(
                "{} ({})",
                ms_f(median(droughts.clone().map(|d| d.as_secs_f64()))),
                ms(droughts.max().unwrap_or_default())
            ),
            format!("{acquire_errors} / {release_errors}"),
        ]);
    }
    let mut out = format!(
        "Semaphore of {PERMITS} permits; {PROCESSES} processes x {TASKS_PER_PROCESS} tasks, \
         each holding a permit {}-{} ms (random), {} rounds of {:.0} s. A drought: the time \
         from a grant to the process's next one (or from a first waiter to it) while one \
         of its tasks waited; one still waiting at the round's end ends there.\n\n",
        PERMIT_HOLD_MS.0, PERMIT_HOLD_MS.1, settings.rounds, secs,
    );
    out.push_str(&table.render());
    out.push('\n');
    // Judge each round by its least served process, and by its longest drought,
    // whichever process had them.
    let least: Vec<f64> = rounds
        .iter()
        .map(|round| procs::least_share(round))
        .collect();
    let least_median = median(least.iter().copied());
    let (lo, hi) = spread(least.iter().copied());
    let _ = writeln!(
        out,
        "- Target: each process's share of the grants >= {:.0} % -> {} (the least served \
         process of each round had {:.0} %, median of rounds; {:.0}-{:.0} % across rounds).",
        SHARE_TARGET * 100.0,
        verdict(least_median >= SHARE_TARGET),
        least_median * 100.0,
        lo * 100.0,
        hi * 100.0,
    );
    let worst: Vec<f64> = rounds
        .iter()
        .map(|round| {
            round
                .iter()
                .map(|r| r.drought.as_secs_f64())
                .fold(0.0, f64::max)
        })
        .collect();
    let worst_median = median(worst.iter().copied());
    let (lo, hi) = spread(worst.iter().copied());
    let _ = writeln!(
        out,
        "- Target: no process without a grant for more than {DROUGHT_TARGET:.0} s while it \
         had a waiter -> {} (the longest drought of each round: {} ms, median of rounds; \
         {}-{} ms across rounds).",
        verdict(worst_median <= DROUGHT_TARGET),
        ms_f(worst_median),
        ms_f(lo),
        ms_f(hi),
    );
    procs::push_notes(&mut out, &rounds);
    Ok(out)
}
