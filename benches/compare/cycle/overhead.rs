//! Section 1's "Where dblock's difference goes": the comparisons' figures subtracted
//! layer by layer (dblock - dialect only - hand-written).

use super::comparison::{Comparison, DBLOCK, DIALECT, HAND};
use crate::measure::median;
use crate::report::Table;

/// dblock's cycle next to its dialect layer, and that layer next to the hand-written
/// statements: where any difference in latency, client CPU and wake-ups comes from.
pub fn markdown(comparisons: &[Comparison]) -> String {
    if comparisons.is_empty() {
        return String::new();
    }
    let mut table = Table::new(&[
        "backend, tasks",
        "layer",
        "Δ p50 µs",
        "Δ client CPU µs/cycle",
        "Δ wake-ups/cycle",
    ])
    .words(1);
    // Per comparison and layer: (tasks, Δ CPU µs, Δ wake-ups), for the summary below.
    let mut locker_layer = Vec::new();
    let mut statement_layer = Vec::new();
    for c in comparisons {
        let wakeups = |who: usize| c.wakeups(who);
        for (layer, upper, lower) in [
            (
                "Locker + guard + lease engine (dblock - dialect only)",
                DBLOCK,
                DIALECT,
            ),
            (
                "statement layer (dialect only - hand-written)",
                DIALECT,
                HAND,
            ),
        ] {
            let cpu = (c.cpu_per_op(upper) - c.cpu_per_op(lower)) * 1e6;
            let wake = wakeups(upper) - wakeups(lower);
            if upper == DBLOCK {
                locker_layer.push((c.tasks, cpu, wake));
            } else {
                statement_layer.push((c.tasks, cpu, wake));
            }
            table.row(vec![
                format!("{}, {}", c.backend, c.tasks),
                layer.to_owned(),
                format!(
                    "{:+.0}",
                    (c.latency(upper, 50.0) - c.latency(lower, 50.0)) * 1e6
                ),
                format!("{cpu:+.0}"),
                format!("{wake:+.2}"),
            ]);
        }
    }
    type Layer = [(usize, f64, f64)];
    let one_task = |layer: &Layer, pick: fn(&(usize, f64, f64)) -> f64| {
        median(layer.iter().filter(|l| l.0 == 1).map(pick))
    };
    format!(
        "### Where dblock's difference goes\n\n\
         Medians from the table above, subtracted layer by layer. Client CPU and wake-ups \
         are the whole bench process's (all threads), per completed cycle.\n\n{}\n\
         With one task, dblock's layer above the statements costs about {:+.1} thread \
         wake-ups and {:+.0} µs of client CPU per cycle (median over the backends). In \
         this design `try_acquire` runs its statement on the caller's task (a drop guard \
         hands it to the engine only if the caller goes away mid-statement), registers \
         the lease with the Locker's engine (a mutex, and a wake-up of the engine's task \
         only when the new lease is due before its planned wake-up: with the 30 s default \
         lease that is the first lease after an idle spell), and `release` sends its \
         `DELETE` on the caller's task after taking the lease off the engine's list. The \
         statement layer itself (dialect only - hand-written, same SQL) adds {:+.1} \
         wake-ups and {:+.0} µs of client CPU per cycle. Wake-ups are context switches \
         (voluntary + nonvoluntary, all threads; see `measure::process_cpu`). A perf \
         profile (cpu-clock, 10 s of each alone, PostgreSQL and MariaDB, 1 and 8 tasks) \
         spreads the Locker layer's 9-15 µs of user CPU a cycle thinly: polling and \
         moving its nested futures (4-7 µs), allocations (1-2 µs), the engine's lease \
         list and the metrics keys (under 1 µs each); nothing over 3 µs. It also found a \
         watch channel per lease (eight wait lists, all woken at drop) and a set of own \
         releases kept with no listener running, both since removed. Callgrind (exact \
         instruction counts; MariaDB, one task, the difference of 3,001 and 1,001 cycles) \
         then put the layer at about 10,200 instructions and 12 allocations a cycle over \
         dialect only (97,800 against 87,600): metric keys rebuilt on every call (labels \
         and their hash, about 1,300 instructions and 4 allocations), disabled spans \
         entered at every poll (about 1,000), the key and owner copied twice, rare paths \
         held inline (`release`'s future was 2.0 KB, the boxed attempt's 2.2). With those \
         cut, and a retry's delays made only when it pauses (in both layers), it is about \
         6,100 instructions and 5 allocations (91,800 against 85,600). The tables below \
         time the old design's task pattern (before issue 9: a spawned task per \
         acquisition, a watchdog task per lease, cancel-and-await on release) around one \
         `SELECT 1`, for reference: that is the cost the engine removed.\n\n",
        table.render(),
        one_task(&locker_layer, |l| l.2),
        one_task(&locker_layer, |l| l.1),
        one_task(&statement_layer, |l| l.2),
        one_task(&statement_layer, |l| l.1),
    )
}
