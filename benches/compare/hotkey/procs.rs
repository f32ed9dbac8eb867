//! Section 3, cell 2: two real OS processes x 4 tasks on one hot key, each process with
//! its own Locker and pool: the [`workers`](super::workers), started together on a
//! fresh key each round; shares of the acquisitions and waits per process. It needs no
//! more of a database than a lock table ([`LockDb`]), so it runs on SQLite too, the
//! workers sharing one database file.

use std::fmt::Write as _;
use std::time::Duration;

use super::workers::{PROCESSES, TASKS_PER_PROCESS};
use crate::measure::{median, new_owner, spread};
use crate::report::{Table, count, ms, ms_f, verdict};
use crate::servers::{LockDb, Server};
use crate::settings::Settings;
use crate::workers::{self, Job, Mode, Report};

const TABLE: &str = "bench_lock_hot_procs";

/// The cell's targets on one database (issue 10 for PostgreSQL, issue 45 for MariaDB and
/// SQLite): each process's share of the acquisitions within `share` (two processes: the
/// less served one has at least the low end, so both are in range), and the wait p99 of
/// each process at most `p99`.
struct Targets {
    share: (f64, f64),
    p99: Duration,
}

fn targets<DB: LockDb>() -> Targets {
    if DB::NAME == "SQLite" {
        Targets {
            share: (0.35, 0.65),
            p99: Duration::from_millis(150),
        }
    } else {
        Targets {
            share: (0.40, 0.60),
            p99: Duration::from_millis(100),
        }
    }
}

/// Cell 2 on one server; its markdown.
pub async fn cell<DB: LockDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    // Creates the table; the workers build their own Lockers on it.
    drop(server.fresh_locker(TABLE).await?);
    let run = new_owner()[..8].to_owned();
    let mut rounds: Vec<Vec<Report>> = Vec::new();
    for r in 0..settings.rounds {
        eprintln!(
            "hotkey: {}, 2 processes, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        let key = format!("hot2:{run}:{r}");
        let job = Job::new(Mode::HotKey, TABLE, &key, TASKS_PER_PROCESS, settings.round);
        rounds.push(workers::round(&server.url, &job, PROCESSES).await?);
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let targets = targets::<DB>();
    let secs = settings.round.as_secs_f64();
    let share = |round: &[Report], p: usize| {
        let all: u64 = round.iter().map(|r| r.acquisitions).sum();
        round[p].acquisitions as f64 / all.max(1) as f64
    };
    let mut table = Table::new(&[
        "process",
        "acquisitions/s",
        "share of all acquisitions",
        "wait p99 ms",
        "longest wait ms",
        "attempts per acquisition",
        "errors to callers (acquire / release)",
    ]);
    let mut p99s = Vec::new();
    for p in 0..PROCESSES {
        let shares: Vec<f64> = rounds.iter().map(|round| share(round, p)).collect();
        let share_median = median(shares.iter().copied());
        let (lo, hi) = spread(shares.iter().copied());
        let p99 = median(
            rounds
                .iter_mut()
                .map(|round| round[p].waits.percentile(99.0).as_secs_f64()),
        );
        p99s.push(p99);
        let longest = rounds.iter().map(|round| round[p].waits.max()).max();
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
                share_median * 100.0,
                lo * 100.0,
                hi * 100.0
            ),
            ms_f(p99),
            ms(longest.unwrap_or_default()),
            format!(
                "{:.2}",
                median(rounds.iter().map(|round| round[p].attempts as f64
                    / round[p].acquisitions.max(1) as f64))
            ),
            format!("{acquire_errors} / {release_errors}"),
        ]);
    }
    let mut out = table.render();
    out.push('\n');
    // Which process is favoured can change from round to round: judge each round by
    // its less served process, whichever that was.
    let least: Vec<f64> = rounds
        .iter()
        .map(|round| (0..PROCESSES).map(|p| share(round, p)).fold(1.0, f64::min))
        .collect();
    let least_median = median(least.iter().copied());
    let (lo, hi) = spread(least.iter().copied());
    let _ = writeln!(
        out,
        "- Target: each process's share of the acquisitions {:.0}-{:.0} % -> {} (the less \
         served process of each round had {:.0} %, median of rounds; {:.0}-{:.0} % across \
         rounds).",
        targets.share.0 * 100.0,
        targets.share.1 * 100.0,
        verdict(least_median >= targets.share.0),
        least_median * 100.0,
        lo * 100.0,
        hi * 100.0,
    );
    let p99_met = p99s.iter().all(|&p| p <= targets.p99.as_secs_f64());
    let _ = writeln!(
        out,
        "- Target: wait p99 <= {} ms in each process -> {} ({} ms, median of rounds).",
        targets.p99.as_millis(),
        verdict(p99_met),
        p99s.iter()
            .map(|&p| ms_f(p))
            .collect::<Vec<_>>()
            .join(" / "),
    );
    let late = rounds
        .iter()
        .flatten()
        .map(|r| r.late)
        .max()
        .unwrap_or_default();
    if !late.is_zero() {
        let _ = writeln!(
            out,
            "- a worker was ready {} ms after the common start (not counted in its waits).",
            ms(late)
        );
    }
    if let Some(err) = rounds.iter().flatten().find_map(|r| r.first_error.as_ref()) {
        let _ = writeln!(out, "- first error: `{err}`");
    }
    out.push('\n');
    Ok(out)
}
