//! Section 7: the coordination primitives against the mutex, interleaved in rounds as
//! section 1 runs its contenders. A semaphore permit's cycle (try_acquire + release of a
//! permit of a long-lived `Semaphore`) against the mutex's (a fresh key); reads of one
//! read-write lock by 8 tasks that each hold 2 ms, against 8 tasks taking one mutex for
//! 2 ms; and, under such a stream of readers, how long a writer waits.

//!
//! One way down: this module runs the cells in the report's order on one Locker and
//! writes their table: [`throughput`] (permits, reads), [`writer`], [`failover`]; the
//! cells share [`contenders`].

mod contenders;
mod failover;
mod throughput;
mod writer;

use std::fmt::Write as _;

use crate::report::Table;
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_primitives";

/// Section 7 on one server: its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    match measure(settings, server).await {
        Ok(markdown) => markdown,
        Err(err) => format!("### {}\n\nNot measured: {err}\n\n", server.label),
    }
}

async fn measure<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    let locker = server.fresh_locker(TABLE).await?;
    let mut out = format!("### {}\n\n", server.label);
    let mut table = Table::new(&[
        "tasks",
        "contender",
        "ops/s",
        "p99 ms",
        "vs mutex",
        "lost / errors",
    ])
    .words(1);
    let mut verdicts = Vec::new();
    throughput::permits(settings, &locker, &mut table, &mut verdicts).await;
    let lock = locker.rw_lock("bench-rw");
    throughput::reads(settings, &locker, &lock, &mut table, &mut verdicts).await;
    verdicts.push(writer::line(settings, &lock).await);
    verdicts.push(failover::line(server, TABLE).await?);

    out.push_str(&table.render());
    out.push('\n');
    for line in verdicts {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    DB::drop_lock_table(&server.pool, TABLE).await?;
    Ok(out)
}

/// The section's heading and what it measures.
pub const INTRO: &str = "## 7. Coordination primitives against the mutex\n\n\
    A permit's cycle is `try_acquire` + `release` of a permit of the task's own long-lived \
    semaphore of 3 permits; the mutex's is `try_acquire` + `release` of a fresh key (section \
    1's dblock row). Reads: 8 tasks each take a read of one read-write lock, hold it 2 ms \
    and release it, against 8 tasks taking one mutex key for 2 ms. Interleaved in rounds as \
    in section 1. The writer's wait is measured among such readers afterwards, then leader \
    failovers in one process (the fault suite's scenario 9b does it with processes and \
    SIGKILL). The segmented stock strategy is in section 4.\n\n";
