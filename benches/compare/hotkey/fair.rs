//! Section 3, cell 4: fair mode against the default, 2 real OS processes x 4 tasks on one
//! hot key, each process with its own Locker and pool.
//!
//! The workers and their rounds are cell 2's ([`workers::round`]); the job's mode
//! says whether their Lockers are built with `fair(true)`. The two contenders take
//! turns in rounds ([`turn_order`]). Each worker reports its grants as
//! `fencing_token:ticket`: a key's fencing token rises with every grant, so the merged
//! grants of both workers sorted by token are the grant order across processes, and in
//! fair mode the grants that waited on a ticket must come in ticket order. The cell
//! counts the inversions, pairs of such grants where the earlier grant has the higher
//! ticket (0 is the target).
//!
//! Statements on the server, as in [`pool`](super::pool): a connection of
//! its own reads [`BenchDb::statements_seen`] before the workers start and again once
//! they have exited and their sessions are gone ([`BenchDb::await_sessions_gone`]: the
//! workers' pools carry the dedicated pools' name; PostgreSQL counts a session's
//! statements when it exits; the Locker's listener session is not awaited, it ends with
//! its process, and a reading 11 s later found the count settled), less what the
//! readings sent; divided by the acquisitions of both workers, so a figure per acquire +
//! hold + release cycle, including the workers' connection setup, cancelled waiters and
//! (fair mode) tickets.

use std::fmt::Write as _;
use std::time::Duration;

use sqlx::Pool;

use super::workers::{PROCESSES, TASKS_PER_PROCESS};
use crate::measure::{median, new_owner, spread, turn_order};
use crate::report::{Table, count, ms, ms_f, ratio, verdict};
use crate::servers::{BenchDb, Server, counting_admin};
use crate::settings::Settings;
use crate::workers::{self, Grant, Job, Mode, Report};

const TABLE: &str = "bench_lock_hot_fair";
const MODES: [Mode; 2] = [Mode::HotKey, Mode::Fair];

fn name(mode: Mode) -> &'static str {
    if mode == Mode::Fair {
        "fair mode (`fair(true)`, tickets)"
    } else {
        "default mode (local queue)"
    }
}

/// One contender's round: both workers' reports and what the parent made of them.
struct Round {
    reports: Vec<Report>,
    secs: f64,
    /// Statements the server saw, from before the workers started until their sessions
    /// had ended, less the readings' own.
    statements: u64,
    /// Grants that waited on a ticket.
    ticketed: u64,
    /// Pairs of ticketed grants granted against their tickets' order.
    inversions: u64,
    /// Grants whose fencing token another grant of the round had too (none should).
    same_token: u64,
}

impl Round {
    fn acquisitions(&self) -> u64 {
        self.reports.iter().map(|r| r.acquisitions).sum()
    }

    fn per_sec(&self) -> f64 {
        self.acquisitions() as f64 / self.secs
    }

    /// The share of the acquisitions of the less served process.
    fn least_share(&self) -> f64 {
        let all = self.acquisitions().max(1) as f64;
        self.reports
            .iter()
            .map(|r| r.acquisitions as f64 / all)
            .fold(1.0, f64::min)
    }

    /// The worse wait p99 of the two processes.
    fn worse_p99(&mut self) -> f64 {
        self.reports
            .iter_mut()
            .map(|r| r.waits.percentile(99.0).as_secs_f64())
            .fold(0.0, f64::max)
    }

    fn longest(&self) -> Duration {
        self.reports
            .iter()
            .map(|r| r.waits.max())
            .max()
            .unwrap_or_default()
    }

    fn statements_per_acquisition(&self) -> f64 {
        self.statements as f64 / self.acquisitions().max(1) as f64
    }

    fn errors(&self) -> u64 {
        self.reports
            .iter()
            .map(|r| r.acquire_errors + r.release_errors)
            .sum()
    }
}

/// In grant order (sorted by fencing token): how many grants waited on a ticket, how many
/// pairs of them (i before j) have ticket i > ticket j, and how many grants share a token.
fn order(mut grants: Vec<Grant>) -> (u64, u64, u64) {
    grants.sort_by_key(|g| g.token);
    let same_token = grants
        .windows(2)
        .filter(|w| w[0].token == w[1].token)
        .count() as u64;
    let tickets: Vec<i64> = grants.iter().filter_map(|g| g.ticket).collect();
    // A round has about a thousand grants: the plain count of pairs is quick enough.
    let mut inversions = 0u64;
    for (i, &earlier) in tickets.iter().enumerate() {
        inversions += tickets[i + 1..].iter().filter(|&&t| t < earlier).count() as u64;
    }
    (tickets.len() as u64, inversions, same_token)
}

async fn round<DB: BenchDb>(
    mode: Mode,
    server: &Server<DB>,
    admin: &Pool<DB>,
    key: &str,
    length: Duration,
) -> Result<Round, Box<dyn std::error::Error>> {
    let before = DB::statements_seen(admin).await?;
    let job = Job::new(mode, TABLE, key, TASKS_PER_PROCESS, length);
    let reports = workers::round(&server.url, &job, PROCESSES).await?;
    let sent = DB::await_sessions_gone(admin).await;
    let after = DB::statements_seen(admin).await?;
    let grants = reports
        .iter()
        .flat_map(|r| r.grants.iter().copied())
        .collect();
    let (ticketed, inversions, same_token) = order(grants);
    Ok(Round {
        reports,
        secs: length.as_secs_f64(),
        statements: after.saturating_sub(before + DB::STATEMENTS_PER_READING + sent),
        ticketed,
        inversions,
        same_token,
    })
}

/// Cell 4 on one server; its markdown.
pub async fn cell<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    // The workers build their own Lockers on the table.
    let admin = counting_admin(server, TABLE).await?;

    let run = new_owner()[..8].to_owned();
    let mut rounds: Vec<Vec<Round>> = MODES.iter().map(|_| Vec::new()).collect();
    for r in 0..settings.rounds {
        eprintln!(
            "hotkey: {}, fair mode, 2 processes, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        for i in turn_order(MODES.len(), r) {
            let key = format!("hot4:{run}:{r}:{i}");
            rounds[i].push(round(MODES[i], server, &admin, &key, settings.round).await?);
        }
    }
    DB::drop_lock_table(&admin, TABLE).await?;
    admin.close().await;

    let mut table = Table::new(&[
        "contender",
        "acquisitions/s (both processes)",
        "share of the less served process",
        "wait p99 ms (worse process)",
        "longest wait ms",
        "grants that waited on a ticket",
        "ticket-order inversions",
        "server statements per acquisition",
    ]);
    for (&mode, rs) in MODES.iter().zip(&mut rounds) {
        let shares: Vec<f64> = rs.iter().map(Round::least_share).collect();
        let (lo, hi) = spread(shares.iter().copied());
        let acquisitions: u64 = rs.iter().map(Round::acquisitions).sum();
        let ticketed: u64 = rs.iter().map(|r| r.ticketed).sum();
        let inversions: u64 = rs.iter().map(|r| r.inversions).sum();
        table.row(vec![
            name(mode).to_owned(),
            count(median(rs.iter().map(Round::per_sec))),
            format!(
                "{:.0} % ({:.0}-{:.0})",
                median(shares.iter().copied()) * 100.0,
                lo * 100.0,
                hi * 100.0
            ),
            ms_f(median(rs.iter_mut().map(Round::worse_p99))),
            ms(rs.iter().map(Round::longest).max().unwrap_or_default()),
            format!(
                "{} of {} ({:.0} %)",
                count(ticketed as f64),
                count(acquisitions as f64),
                ticketed as f64 * 100.0 / acquisitions.max(1) as f64
            ),
            if ticketed == 0 {
                "-".to_owned()
            } else {
                count(inversions as f64)
            },
            format!(
                "{:.2}",
                median(rs.iter().map(Round::statements_per_acquisition))
            ),
        ]);
    }
    let mut out = table.render();
    out.push('\n');

    let (default, fair) = (&rounds[0], &rounds[1]);
    let ticketed: u64 = fair.iter().map(|r| r.ticketed).sum();
    let inversions: u64 = fair.iter().map(|r| r.inversions).sum();
    let _ = writeln!(
        out,
        "- Target: fair mode grants in ticket order (inversions: 0) -> {} ({} inversions \
         among {} grants that waited on a ticket, all rounds; grant order = fencing token).",
        verdict(ticketed > 0 && inversions == 0),
        count(inversions as f64),
        count(ticketed as f64),
    );
    let ratios: Vec<f64> = fair
        .iter()
        .zip(default)
        .map(|(f, d)| f.statements_per_acquisition() / d.statements_per_acquisition())
        .collect();
    let _ = writeln!(
        out,
        "- Fair mode's server statements per acquisition against the default's: {} (fair / \
         default, per round; reported, no target).",
        ratio(
            median(ratios.iter().copied()),
            spread(ratios.iter().copied())
        ),
    );
    let _ = writeln!(
        out,
        "- Counted on the server: {}, from before the workers started until their sessions \
         had ended, less the readings' own, per acquisition of both processes (each one an \
         acquire + hold + release; the workers' connection setup and cancelled waiters \
         included). Shares, waits: as in 3.2; wait p99 is the worse process's, median of \
         rounds.",
        DB::STATEMENTS_SEEN_TEXT,
    );
    for (&mode, rs) in MODES.iter().zip(&rounds) {
        let errors: u64 = rs.iter().map(Round::errors).sum();
        let same_token: u64 = rs.iter().map(|r| r.same_token).sum();
        let late = rs
            .iter()
            .flat_map(|r| r.reports.iter().map(|w| w.late))
            .max()
            .unwrap_or_default();
        if errors > 0 {
            let _ = writeln!(out, "- {}: {errors} errors to callers.", name(mode));
        }
        if same_token > 0 {
            let _ = writeln!(
                out,
                "- {}: {same_token} grants had the fencing token of another grant.",
                name(mode)
            );
        }
        if !late.is_zero() {
            let _ = writeln!(
                out,
                "- {}: a worker was ready {} ms after the common start (not counted in its \
                 waits).",
                name(mode),
                ms(late)
            );
        }
        let first = rs
            .iter()
            .flat_map(|r| r.reports.iter())
            .find_map(|w| w.first_error.as_ref());
        if let Some(err) = first {
            let _ = writeln!(out, "- first error of {}: `{err}`", name(mode));
        }
    }
    out.push('\n');
    Ok(out)
}
