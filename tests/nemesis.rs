//! A randomized history test with a nemesis (in the manner of Jepsen):
//! `cargo test --test nemesis`.
//!
//! Per server (PostgreSQL, MariaDB), eight worker processes (this binary started again
//! with `DBLOCK_NEMESIS_ROLE` set) increment a counter under one shared lock, each write
//! ONE transaction that checks the lock with `LockGuard::assert_held` and appends to a
//! history table; beside it, a control counter that takes no lock, and an "unfenced" one
//! under a lock whose check is not in the transaction. Meanwhile the nemesis, every
//! 150-600 ms, SIGSTOPs a worker for 0.1-2.5 s, SIGKILLs one and starts it again,
//! force-releases the keys, reaps expired rows, or kills a worker's database sessions.
//! At the end the checker reads the histories back: the guarded one must show no lost
//! update, no fencing-token inversion and no overlapping holds, and the control must show
//! lost updates (or the run proved nothing). See tests/nemesis/check.rs.
//!
//! `DBLOCK_NEMESIS_SECS` sets the time per server (default 60); arguments that do not
//! start with `-` pick servers (`postgres`, `mariadb`). Servers come from
//! `DBLOCK_TEST_POSTGRES_URL` / `DBLOCK_TEST_MYSQL_URL`; an unset one is skipped with the
//! reason, or fails the run with `CI` set or the backend named in `DBLOCK_TEST_REQUIRE`.
//! Each run works in tables of its own with random names and drops them at the end
//! (`DBLOCK_NEMESIS_KEEP` keeps them). The process exits non-zero on any violation.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use chrono::TimeDelta;
use dblock::{MySql, Postgres};

/// What helpers return; failures are messages for the summary.
pub type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

// The crate root is a file, so its modules are found in tests/; they live in tests/nemesis/.
#[path = "nemesis/check.rs"]
mod check;
#[path = "nemesis/db.rs"]
mod db;
#[path = "nemesis/run.rs"]
mod run;
#[path = "common/standalone.rs"]
mod standalone;
#[path = "nemesis/tally.rs"]
mod tally;
#[path = "nemesis/worker.rs"]
mod worker;

use db::{Kind, NemesisDb};
use run::{Action, Outcome};
use tally::Tally;

/// The time per server when `DBLOCK_NEMESIS_SECS` is not set: the CI run.
const DEFAULT_SECS: u64 = 60;

fn main() -> ExitCode {
    if std::env::var_os(worker::ROLE_ENV).is_some() {
        return worker::child_main();
    }
    let Some(filter) = standalone::selection("nemesis") else {
        return ExitCode::SUCCESS;
    };
    let wants =
        |label: &str| filter.is_empty() || filter.iter().any(|f| label.contains(f.as_str()));

    let secs = match std::env::var("DBLOCK_NEMESIS_SECS") {
        Err(_) => DEFAULT_SECS,
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(secs) if secs > 0 => secs,
            _ => {
                eprintln!(
                    "nemesis: DBLOCK_NEMESIS_SECS={s:?} is not a whole number of seconds above 0"
                );
                return ExitCode::FAILURE;
            }
        },
    };
    let duration = Duration::from_secs(secs);

    // The checker must catch what it is there to catch, or a clean verdict means nothing.
    if let Err(err) = check::self_check() {
        eprintln!("nemesis: the checker's self-check failed: {err}");
        return ExitCode::FAILURE;
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut verdicts = Vec::new();
    runtime.block_on(async {
        if wants(Postgres::LABEL) {
            verdicts.push(backend::<Postgres>(duration).await);
        }
        if wants(MySql::LABEL) {
            verdicts.push(backend::<MySql>(duration).await);
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));

    println!();
    let mut failed = false;
    for (label, verdict) in &verdicts {
        let word = match verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        failed |= matches!(verdict, Verdict::Fail);
        println!("nemesis: {label} {word}");
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

enum Verdict {
    Pass,
    Fail,
    Skip,
}

/// Whether a missing server fails the run instead of skipping it.
fn required(name: &str) -> bool {
    std::env::var_os("CI").is_some()
        || std::env::var("DBLOCK_TEST_REQUIRE")
            .is_ok_and(|r| r.split(',').any(|n| n.trim() == name))
}

async fn backend<DB: NemesisDb>(duration: Duration) -> (&'static str, Verdict) {
    let label = DB::LABEL;
    let Some(url) = std::env::var(DB::URL_VAR).ok().filter(|u| !u.is_empty()) else {
        let reason = format!("{} is unset", DB::URL_VAR);
        if required(DB::REQUIRE) {
            println!(
                "nemesis [{label}]: FAIL: {reason}, and the server is required (CI or \
                 DBLOCK_TEST_REQUIRE={})",
                DB::REQUIRE
            );
            return (label, Verdict::Fail);
        }
        println!(
            "nemesis [{label}]: skipped: {reason} (set DBLOCK_TEST_REQUIRE={} to fail instead)",
            DB::REQUIRE
        );
        return (label, Verdict::Skip);
    };
    eprintln!(
        "nemesis [{label}]: {} workers, nemesis for {} s ...",
        run::WORKERS,
        duration.as_secs()
    );
    match run::run::<DB>(&url, duration).await {
        Ok(outcome) => {
            print!("{}", summary(&outcome));
            let verdict = if outcome.problems.is_empty() {
                Verdict::Pass
            } else {
                Verdict::Fail
            };
            (label, verdict)
        }
        Err(err) => {
            println!("nemesis [{label}]: FAIL: the run could not be carried out: {err}");
            (label, Verdict::Fail)
        }
    }
}

fn kv<K: std::fmt::Display>(map: impl IntoIterator<Item = (K, u64)>) -> String {
    let parts: Vec<String> = map.into_iter().map(|(k, v)| format!("{k} {v}")).collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

fn of_kind<K: Clone + std::fmt::Display>(
    map: &BTreeMap<(Kind, K), u64>,
    kind: Kind,
) -> Vec<(K, u64)> {
    map.iter()
        .filter(|((k, _), _)| *k == kind)
        .map(|((_, what), n)| (what.clone(), *n))
        .collect()
}

fn spread(writes: &[usize]) -> String {
    let min = writes.iter().min().copied().unwrap_or(0);
    let max = writes.iter().max().copied().unwrap_or(0);
    format!("{min}-{max}")
}

/// The per-server summary block.
fn summary(o: &Outcome) -> String {
    let mut s = String::new();
    let verdict = if o.problems.is_empty() {
        "PASS"
    } else {
        "FAIL"
    };
    let f = |kind: Kind| &o.findings[&kind];
    let t = &o.tally;
    let _ = writeln!(
        s,
        "\nnemesis [{}]: {verdict}: nemesis for {:.1} s, {} workers, lease {:.1} s (renewed every \
         {:.1} s), table {}",
        o.backend,
        o.ran.as_secs_f64(),
        run::WORKERS,
        worker::LEASE.as_secs_f64(),
        worker::LEASE.as_secs_f64() / 3.0,
        o.table
    );

    let g = f(Kind::Guarded);
    let failed_guarded: Vec<(String, u64)> = t
        .failed
        .iter()
        .filter(|((_, k), _)| *k == Kind::Guarded)
        .map(|((phase, _), n)| (phase.clone(), *n))
        .collect();
    let _ = writeln!(
        s,
        "  guarded   {} writes committed in {} holds; acquisitions {}, writes refused by \
         assert_held {}, acquire timeouts {}, failed: {}",
        g.writes,
        g.holds,
        Tally::get(&t.acquisitions, Kind::Guarded),
        Tally::get(&t.refused, Kind::Guarded),
        Tally::get(&t.timeouts, Kind::Guarded),
        kv(failed_guarded)
    );
    let _ = writeln!(
        s,
        "            lost updates {}, token inversions {}, overlaps {}, shared tokens {}, \
         sequence gaps {}, bad increments {}, counter {}",
        g.lost_updates,
        g.token_inversions,
        g.overlaps,
        g.shared_tokens,
        g.seq_gaps,
        g.bad_increments,
        counter_words(o, Kind::Guarded, g.writes)
    );
    let _ = writeln!(
        s,
        "            releases: {}; leases lost by then: {}",
        kv(of_kind(&t.released, Kind::Guarded)),
        kv(of_kind(&t.lost, Kind::Guarded))
    );
    let c = f(Kind::Control);
    let _ = writeln!(
        s,
        "  control   {} writes with no lock: lost updates {} (must be > 0), counter {}",
        c.writes,
        c.lost_updates,
        counter_words(o, Kind::Control, c.writes)
    );
    let u = f(Kind::Unfenced);
    let _ = writeln!(
        s,
        "  unfenced  {} writes in {} holds, lock without assert_held (not judged): lost \
         updates {}, token inversions {}, overlaps {}; leases lost by their release {}",
        u.writes,
        u.holds,
        u.lost_updates,
        u.token_inversions,
        u.overlaps,
        of_kind(&t.lost, Kind::Unfenced)
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>()
    );
    let d = &o.deeds;
    let done = |a: Action| d.done.get(&a).copied().unwrap_or(0);
    let _ = writeln!(
        s,
        "  nemesis   {} actions: pause {} ({} of the guarded key's holder; {:.1} s stopped in \
         all), kill+restart {}, \
         force_release {} (rows deleted: guarded {}, unfenced {}), reap_expired {} ({} rows), \
         session kill {} ({} sessions; {} more found none)",
        d.done.values().sum::<u64>(),
        done(Action::Pause),
        d.holders_paused,
        d.paused_for.as_secs_f64(),
        done(Action::Kill),
        done(Action::ForceRelease),
        d.forced.0,
        d.forced.1,
        done(Action::Reap),
        d.reaped,
        done(Action::KillSessions),
        d.sessions_killed,
        d.sessions_missed
    );
    let _ = writeln!(
        s,
        "  workers   committed writes per worker: guarded {}, control {}, unfenced {}; \
         acknowledged writes {} ({} not in the history); restarts {}",
        spread(&o.per_worker[&Kind::Guarded]),
        spread(&o.per_worker[&Kind::Control]),
        spread(&o.per_worker[&Kind::Unfenced]),
        t.acked.len(),
        o.acked_missing.len(),
        o.restarts
    );
    if !t.samples.is_empty() {
        for (phase, samples) in &t.samples {
            let _ = writeln!(s, "  failures  {phase}, e.g.: {}", samples.join(" | "));
        }
    }
    for problem in &o.problems {
        let _ = writeln!(s, "  VIOLATION {problem}");
    }
    for (kind, found) in &o.findings {
        if *kind != Kind::Control && !found.examples.is_empty() {
            let _ = writeln!(s, "  {kind} examples: {}", found.examples.join("; "));
        }
    }
    if g.violations() > 0
        && let Some(first) = g.first_at
    {
        // The faults around the first violation (this machine's clock against the
        // database's: the same clock when the server is local).
        let (from, to) = (first - TimeDelta::seconds(3), first + TimeDelta::seconds(1));
        let _ = writeln!(
            s,
            "  nemesis actions from 3 s before to 1 s after the first guarded violation ({}):",
            first.format("%H:%M:%S%.6f")
        );
        let mut log: Vec<_> = o
            .deeds
            .log
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .collect();
        log.sort();
        for (at, what) in log {
            let _ = writeln!(s, "    {} {what}", at.format("%H:%M:%S%.6f"));
        }
    }
    s
}

fn counter_words(o: &Outcome, kind: Kind, writes: usize) -> String {
    let counter = o.counters.get(&kind).copied().unwrap_or_default();
    if usize::try_from(counter.value).ok() == Some(writes) {
        format!("{} = writes", counter.value)
    } else {
        format!("{} after {writes} writes", counter.value)
    }
}
