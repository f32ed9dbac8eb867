//! Section 1's tables and targets: every contender's cycles per server, against the
//! hand-written statements.

use std::fmt::Write as _;

use super::comparison::{Comparison, DBLOCK, HAND, LEGS, SEED};
use crate::report::{Table, count, ms_f, ratio, verdict};

/// Targets (issue 9): dblock / hand-written throughput, and extra wake-ups per cycle.
const RATIO_TARGET: f64 = 0.95;
/// Issue 29's target: dblock / the seeds' INSERT + DELETE.
const SEED_TARGET: f64 = 0.95;
const WAKEUP_MARGIN: f64 = 0.5;

/// Section 1's heading, tables and target lines.
pub fn markdown(comparisons: &[Comparison]) -> String {
    let mut out = format!(
        "## 1. Uncontended cycle: dblock vs the same SQL by hand\n\n\
         One cycle = acquire a fresh key, release it; latency is the whole cycle. Each \
         round's time per contender is split into {LEGS} legs, the contenders running in \
         the round's order, then in reverse (A B C, C B A, ...), so that a burst of load \
         on the shared machine lands on all of them alike.\n\n",
    );
    let mut backends: Vec<&str> = comparisons.iter().map(|c| c.backend.as_str()).collect();
    backends.dedup();
    for backend in backends {
        let _ = writeln!(out, "### {backend}\n");
        let mut table = Table::new(&[
            "tasks",
            "contender",
            "cycles/s",
            "p50 ms",
            "p99 ms",
            "vs hand-written",
            "client CPU µs/cycle",
            "client wake-ups/cycle",
            "lost / errors",
        ])
        .words(1);
        for c in comparisons.iter().filter(|c| c.backend == backend) {
            for (i, name) in c.names.iter().enumerate() {
                let (lost, errors) = c.rounds[i]
                    .iter()
                    .fold((0, 0), |(l, e), r| (l + r.lost, e + r.errors));
                let versus = if i == HAND {
                    "1.00x".to_owned()
                } else {
                    let (m, s) = c.ratio(i, HAND);
                    ratio(m, s)
                };
                table.row(vec![
                    c.tasks.to_string(),
                    name.clone(),
                    count(c.throughput(i)),
                    ms_f(c.latency(i, 50.0)),
                    ms_f(c.latency(i, 99.0)),
                    versus,
                    format!("{:.0}", c.cpu_per_op(i) * 1e6),
                    format!("{:.2}", c.wakeups(i)),
                    format!("{lost} / {errors}"),
                ]);
            }
        }
        out.push_str(&table.render());
        out.push('\n');
    }
    if comparisons.is_empty() {
        out.push_str("No database server was reachable: nothing measured.\n\n");
    }
    let _ = writeln!(
        out,
        "Targets: dblock >= {RATIO_TARGET}x hand-written (median of per-round ratios), and \
         client wake-ups per cycle within +{WAKEUP_MARGIN} of hand-written (medians across \
         rounds). Issue 29's: dblock >= {SEED_TARGET}x the seeds' INSERT + DELETE, whose \
         scheme draws no fencing token and takes no expired row over (what those cost: \
         bench/PROFILE.md).\n"
    );
    for c in comparisons {
        let (m, s) = c.ratio(DBLOCK, HAND);
        let (seed, seed_s) = c.ratio(DBLOCK, SEED);
        let extra = c.wakeups(DBLOCK) - c.wakeups(HAND);
        let _ = writeln!(
            out,
            "- {}, {} task(s): dblock / hand-written = {} -> {}; wake-ups {:.2} vs {:.2} \
             ({extra:+.2}) -> {}; dblock / seeds' INSERT = {} -> {}",
            c.backend,
            c.tasks,
            ratio(m, s),
            verdict(m >= RATIO_TARGET),
            c.wakeups(DBLOCK),
            c.wakeups(HAND),
            verdict(extra <= WAKEUP_MARGIN),
            ratio(seed, seed_s),
            verdict(seed >= SEED_TARGET),
        );
        for (i, name) in c.names.iter().enumerate() {
            if let Some(err) = c.rounds[i].iter().find_map(|r| r.first_error.as_ref()) {
                let _ = writeln!(out, "  - first error of {name}: `{err}`");
            }
        }
    }
    out.push('\n');
    out
}
