//! Section 7's throughput cells: a semaphore permit's cycle against the mutex's, 1 and 8
//! tasks, and 8 readers of one read-write lock against 8 tasks on one mutex key, in
//! interleaved rounds; each adds its rows to the section's table and its target line.

use std::sync::Arc;

use dblock::{Backend, Locker, RwLock};

use super::contenders::{Exclusive, HOLD, PermitCycle, READERS, Read};
use super::loads::{errors, p99, ratio_of, rounds, throughput};
use crate::contenders::Dblock;
use crate::measure::Contender;
use crate::report::{Table, count, ms_f, ratio, verdict};
use crate::settings::Settings;

const TASKS: [usize; 2] = [1, 8];
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
    let read: Arc<dyn Contender> = Arc::new(Read {
        lock: lock.clone(),
        hold: HOLD,
    });
    let exclusive: Arc<dyn Contender> = Arc::new(Exclusive {
        locker: locker.clone(),
        key: "bench:hot",
        hold: HOLD,
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
