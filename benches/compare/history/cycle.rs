//! Cell 8.1: the uncontended cycle (try_acquire + release on fresh keys) of a Locker that
//! records history against one that does not, on one table, interleaved in the same
//! rounds (A B, B A, ...), 1 and 8 tasks.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::contenders::Dblock;
use crate::measure::{Contender, Load, interleaved, median, spread};
use crate::report::{Table, count, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_history";
const TASKS: [usize; 2] = [1, 8];
const LEGS: u32 = 10;
const WARM_UP: Duration = Duration::from_millis(200);
/// Issue 44's target: history on / history off, median of per-round ratios.
const TARGET: f64 = 0.95;
/// The retention of the recording Locker (nothing trims during the run).
const RETENTION: Duration = Duration::from_secs(3600);

pub async fn markdown<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut out = String::from(
        "#### 8.1 Uncontended cycle, history on vs off\n\n\
         Two Lockers on one table, one built with `history(1 h)`; each round runs both for \
         the round's time in legs, in alternating order.\n\n",
    );
    let off = match server.fresh_locker(TABLE).await {
        Ok(locker) => locker,
        Err(e) => return format!("{out}Not measured: {e}\n\n"),
    };
    let on = match off.migrate().await.and_then(|_| {
        dblock::Locker::builder(server.pool.clone())
            .table(TABLE)
            .history(RETENTION)
            .build()
    }) {
        Ok(locker) => locker,
        Err(e) => return format!("{out}Not measured: {e}\n\n"),
    };
    let contenders: Vec<Arc<dyn Contender>> = vec![
        Arc::new(Dblock {
            name: "history off".into(),
            locker: off.clone(),
        }),
        Arc::new(Dblock {
            name: "history on".into(),
            locker: on.clone(),
        }),
    ];
    let mut table = Table::new(&[
        "tasks",
        "off cycles/s",
        "on cycles/s",
        "on / off (median, range)",
        "history statements",
        "events written / dropped",
        "target",
    ]);
    let mut lines = Vec::new();
    for tasks in TASKS {
        let before = on.stats();
        let timing = (settings.round, LEGS, WARM_UP);
        let label = format!("history: {}", server.label);
        let rounds = interleaved(&contenders, tasks, settings.rounds, timing, &label).await;
        // What was noted in the rounds is written within a tick.
        tokio::time::sleep(2 * dblock::HISTORY_FLUSH_INTERVAL).await;
        let after = on.stats();
        let per_round: Vec<f64> = rounds[1]
            .iter()
            .zip(&rounds[0])
            .map(|(on, off)| on.per_sec() / off.per_sec())
            .collect();
        let (m, s) = (median(per_round.iter().copied()), spread(per_round));
        let seconds: f64 = rounds[1].iter().map(|l| l.elapsed.as_secs_f64()).sum();
        let batches = after.history_batches - before.history_batches;
        table.row(vec![
            tasks.to_string(),
            count(median(rounds[0].iter().map(Load::per_sec))),
            count(median(rounds[1].iter().map(Load::per_sec))),
            ratio(m, s),
            format!("{batches} over {seconds:.1} s of cycles (+2 s)"),
            format!(
                "{} / {}",
                after.history_events - before.history_events,
                after.history_dropped - before.history_dropped
            ),
            verdict(m >= TARGET).to_owned(),
        ]);
        lines.push(format!(
            "- {}, {tasks} task(s): history on / off = {} -> {}",
            server.label,
            ratio(m, s),
            verdict(m >= TARGET)
        ));
    }
    on.shutdown().await;
    out.push_str(&table.render());
    let _ = writeln!(out, "\nTarget: history on >= {TARGET}x history off.\n");
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    if let Err(e) = DB::drop_lock_table(&server.pool, TABLE).await {
        let _ = writeln!(out, "(could not drop {TABLE}: {e})\n");
    }
    out
}
