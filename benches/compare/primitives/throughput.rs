//! Section 7's throughput cells: a semaphore permit's cycle against the mutex's, 1 and 8
//! tasks, and 8 readers of one read-write lock against 8 tasks on one mutex key, in
//! interleaved rounds; each adds its rows to the section's table and its target line.

use std::sync::Arc;
use std::time::Duration;

use dblock::{Backend, Locker, RwLock};

use super::contenders::{Exclusive, PermitCycle, READERS, Read};
use crate::contenders::Dblock;
use crate::measure::{Contender, Load, interleaved, median, spread};
use crate::report::{Table, count, ms_f, ratio, verdict};
use crate::settings::Settings;

const TASKS: [usize; 2] = [1, 8];
const WARM_UP: Duration = Duration::from_millis(200);
/// Legs per round, run in the round's order and then reversed (see section 1).
const LEGS: u32 = 10;
/// Permits of each task's semaphore.
const PERMITS: u32 = 3;

/// Targets (issue 27): a permit's cycle >= 0.8x the mutex's; reads with 8 readers
/// holding 2 ms >= 4x the mutex's acquisitions.
const PERMIT_TARGET: f64 = 0.8;
const READ_TARGET: f64 = 4.0;

/// The permit cycle against the mutex cycle, 1 and 8 tasks: rows of `table`, lines of
/// `verdicts`.
pub async fn permits<DB: Backend>(
    settings: &Settings,
    locker: &Locker<DB>,
    table: &mut Table,
    verdicts: &mut Vec<String>,
) {
    let mutex: Arc<dyn Contender> = Arc::new(Dblock {
        name: "mutex".into(),
        locker: locker.clone(),
    });
    for tasks in TASKS {
        let permit: Arc<dyn Contender> = Arc::new(PermitCycle {
            semaphores: (0..tasks)
                .map(|task| locker.semaphore(&format!("bench-sem-{task}"), PERMITS))
                .collect(),
        });
        let loads = rounds(
            settings,
            "permit cycle",
            &[Arc::clone(&mutex), permit],
            tasks,
        )
        .await;
        let (m, s) = ratio_of(&loads[1], &loads[0]);
        table.row(vec![
            tasks.to_string(),
            "mutex cycle".into(),
            count(throughput(&loads[0])),
            ms_f(p99(&loads[0])),
            "1.00x".into(),
            errors(&loads[0]),
        ]);
        table.row(vec![
            tasks.to_string(),
            "semaphore permit cycle".into(),
            count(throughput(&loads[1])),
            ms_f(p99(&loads[1])),
            ratio(m, s),
            errors(&loads[1]),
        ]);
        verdicts.push(format!(
            "- permit cycle / mutex cycle, {tasks} task(s): {} (target >= {PERMIT_TARGET}x) -> {}",
            ratio(m, s),
            verdict(m >= PERMIT_TARGET)
        ));
    }
}

/// Reads of `lock` by [`READERS`] tasks against as many on one mutex key, each holding
/// 2 ms: rows of `table`, a line of `verdicts`.
pub async fn reads<DB: Backend>(
    settings: &Settings,
    locker: &Locker<DB>,
    lock: &RwLock<DB>,
    table: &mut Table,
    verdicts: &mut Vec<String>,
) {
    let read: Arc<dyn Contender> = Arc::new(Read { lock: lock.clone() });
    let exclusive: Arc<dyn Contender> = Arc::new(Exclusive {
        locker: locker.clone(),
    });
    let loads = rounds(settings, "reads holding 2 ms", &[exclusive, read], READERS).await;
    let (m, s) = ratio_of(&loads[1], &loads[0]);
    table.row(vec![
        READERS.to_string(),
        "mutex held 2 ms".into(),
        count(throughput(&loads[0])),
        ms_f(p99(&loads[0])),
        "1.00x".into(),
        errors(&loads[0]),
    ]);
    table.row(vec![
        READERS.to_string(),
        "rw_lock read held 2 ms".into(),
        count(throughput(&loads[1])),
        ms_f(p99(&loads[1])),
        ratio(m, s),
        errors(&loads[1]),
    ]);
    verdicts.push(format!(
        "- reads / mutex acquisitions, {READERS} tasks holding 2 ms: {} (target >= {READ_TARGET}x) -> {}",
        ratio(m, s),
        verdict(m >= READ_TARGET)
    ));
}

/// Interleaved rounds of `contenders` with `tasks` tasks each; per contender, its loads.
async fn rounds(
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
fn ratio_of(a: &[Load], b: &[Load]) -> (f64, (f64, f64)) {
    let per_round: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.per_sec() / y.per_sec())
        .collect();
    (median(per_round.iter().copied()), spread(per_round))
}

fn throughput(loads: &[Load]) -> f64 {
    median(loads.iter().map(Load::per_sec))
}

fn p99(loads: &[Load]) -> f64 {
    median(
        loads
            .iter()
            .map(|l| l.latencies.clone().percentile(99.0).as_secs_f64()),
    )
}

fn errors(loads: &[Load]) -> String {
    let (lost, errors) = loads
        .iter()
        .fold((0, 0), |(l, e), r| (l + r.lost, e + r.errors));
    let first = loads.iter().find_map(|l| l.first_error.as_deref());
    match first {
        Some(err) => format!("{lost} / {errors} (`{err}`)"),
        None => format!("{lost} / {errors}"),
    }
}
