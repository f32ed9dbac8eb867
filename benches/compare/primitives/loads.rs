//! What section 7's in-process cells (7.1, 7.4) share: interleaved rounds of their
//! contenders, as section 1 runs its own, and the figures read from the rounds' loads.

use std::sync::Arc;
use std::time::Duration;

use crate::measure::{Contender, Load, interleaved, median, spread};
use crate::settings::Settings;

const WARM_UP: Duration = Duration::from_millis(200);
/// Legs per round, run in the round's order and then reversed (see section 1).
const LEGS: u32 = 10;

/// Interleaved rounds of `contenders` with `tasks` tasks each; per contender, its loads.
pub async fn rounds(
    settings: &Settings,
    what: &str,
    contenders: &[Arc<dyn Contender>],
    tasks: usize,
) -> Vec<Vec<Load>> {
    let timing = (settings.round, LEGS, WARM_UP);
    let label = format!("primitives: {what}");
    interleaved(contenders, tasks, settings.rounds, timing, &label).await
}

/// Median and spread of the per-round throughput ratios of `a` to `b`.
pub fn ratio_of(a: &[Load], b: &[Load]) -> (f64, (f64, f64)) {
    let per_round: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.per_sec() / y.per_sec())
        .collect();
    (median(per_round.iter().copied()), spread(per_round))
}

/// Completed cycles per second, median of rounds.
pub fn throughput(loads: &[Load]) -> f64 {
    median(loads.iter().map(Load::per_sec))
}

/// A cycle's p99 in seconds, median of rounds.
pub fn p99(loads: &[Load]) -> f64 {
    median(
        loads
            .iter()
            .map(|l| l.latencies.clone().percentile(99.0).as_secs_f64()),
    )
}

/// Lost attempts and errors of all rounds, and the first error.
pub fn errors(loads: &[Load]) -> String {
    let (lost, errors) = loads
        .iter()
        .fold((0, 0), |(l, e), r| (l + r.lost, e + r.errors));
    let first = loads.iter().find_map(|l| l.first_error.as_deref());
    match first {
        Some(err) => format!("{lost} / {errors} (`{err}`)"),
        None => format!("{lost} / {errors}"),
    }
}
