//! Section 7: the coordination primitives.
//!
//! 1. **In one process, against the mutex**, interleaved in rounds as section 1 runs its
//!    contenders: a semaphore permit's cycle (try_acquire + release of a permit of a
//!    long-lived `Semaphore`) against the mutex's (a fresh key); reads of one read-write
//!    lock by 8 tasks that each hold 2 ms, against 8 tasks taking one mutex for 2 ms;
//!    under such a stream of readers, how long a writer waits; leader failovers.
//! 2. **A semaphore, 4 processes x 3 tasks** ([`permits_procs`]): shares of the grants
//!    and droughts per process.
//! 3. **An election, 4 processes** ([`election_procs`]): resignations, and how many
//!    handed the lead to another process.
//! 4. **The read-write lock against a peer's** ([`rw_peer`], PostgreSQL): writes and
//!    reads against session advisory locks, and writes (of one lock, of a fresh one each
//!    cycle, and dblock's write statements by hand) against dblock's mutex cycle, with
//!    the targets' ceilings ([`rw_lines`]).
//!
//! Cells 2 and 3 need no more of a database than a lock table, so they run on SQLite
//! too ([`file_section`]), the processes sharing one database file.
//!
//! One way down: this module runs the cells in the report's order; cell 1 is
//! [`throughput`] (permits, reads), [`writer`] and [`failover`] on one Locker, writing one
//! table; the cells use [`contenders`], and share [`loads`] (cells 1 and 4: interleaved
//! rounds and their figures) and [`procs`] (cells 2 and 3: what their worker processes
//! do, and the shares read from their reports).

mod contenders;
mod election_procs;
mod failover;
mod loads;
mod permits_procs;
mod procs;
mod rw_lines;
mod rw_peer;
mod throughput;
mod writer;

use std::fmt::Write as _;

use crate::report::Table;
use crate::servers::{BenchDb, LockDb, Server};
use crate::settings::Settings;

pub use procs::work;

const TABLE: &str = "bench_lock_primitives";

/// Section 7 on one server: its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut out = format!("### {}\n\n", server.label);
    if settings.runs_cell("7.1") {
        out.push_str("#### 7.1 In one process, against the mutex\n\n");
        match in_one_process(settings, server).await {
            Ok(markdown) => out.push_str(&markdown),
            Err(err) => {
                let _ = writeln!(out, "Not measured: {err}\n");
            }
        }
    }
    out.push_str(&in_processes(settings, server).await);
    if settings.runs_cell("7.4") {
        match rw_peer::cell(settings, server).await {
            Ok(None) => {}
            Ok(Some(markdown)) => {
                out.push_str("#### 7.4 Read-write lock against session advisory locks\n\n");
                out.push_str(&markdown);
            }
            Err(err) => {
                let _ = writeln!(
                    out,
                    "#### 7.4 Read-write lock against session advisory locks\n\n\
                     Not measured: {err}\n"
                );
            }
        }
    }
    out
}

/// Section 7 on a database file (SQLite): cells 2 and 3, their workers sharing the file.
/// Cell 1 stays with the servers, as sections 1 and 2 do; cell 4's peer is PostgreSQL's.
pub async fn file_section<DB: LockDb>(settings: &Settings, server: &Server<DB>) -> String {
    let cells = in_processes(settings, server).await;
    if cells.is_empty() {
        return cells;
    }
    format!(
        "### {}\n\nCells 7.2 and 7.3 only, {}.\n\n{cells}",
        server.label,
        crate::servers::sqlite::SETUP_TEXT,
    )
}

/// Cells 2 and 3, where picked: their markdown.
async fn in_processes<DB: LockDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut out = String::new();
    if settings.runs_cell("7.2") {
        out.push_str("#### 7.2 Semaphore, 4 processes x 3 tasks\n\n");
        push_cell(&mut out, permits_procs::cell(settings, server).await);
    }
    if settings.runs_cell("7.3") {
        out.push_str("#### 7.3 Election, 4 processes\n\n");
        push_cell(&mut out, election_procs::cell(settings, server).await);
    }
    out
}

fn push_cell(out: &mut String, cell: Result<String, Box<dyn std::error::Error>>) {
    match cell {
        Ok(md) => out.push_str(&md),
        Err(e) => {
            let _ = writeln!(out, "Not measured: {e}\n");
        }
    }
}

/// Cell 1: its table and target lines.
async fn in_one_process<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    let locker = server.fresh_locker(TABLE).await?;
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

    let mut out = table.render();
    out.push('\n');
    for line in verdicts {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    DB::drop_lock_table(&server.pool, TABLE).await?;
    Ok(out)
}

/// The section's heading and what it measures.
pub const INTRO: &str = "## 7. Coordination primitives\n\n\
    (1) In one process, against the mutex: a permit's cycle is `try_acquire` + `release` \
    of a permit of the task's own long-lived semaphore of 3 permits; the mutex's is \
    `try_acquire` + `release` of a fresh key (section 1's dblock row). Reads: 8 tasks each \
    take a read of one read-write lock, hold it 2 ms and release it, against 8 tasks \
    taking one mutex key for 2 ms. Interleaved in rounds as in section 1. The writer's \
    wait is measured among such readers afterwards, then leader failovers in one process \
    (the fault suite's scenario 9b does it with processes and SIGKILL). (2) One semaphore \
    of 3 permits, 4 processes x 3 tasks, each process with its own Locker and pool, \
    holding a permit 5-20 ms: each process's share of the grants and its longest \
    drought (time with a waiter and no grant). (3) One election, a candidate in each of \
    4 processes; the leader resigns after 0.5-1.5 s and campaigns again: how many \
    resignations handed the lead to another process. (2) and (3) also run on SQLite, the \
    processes sharing one database file. (4) PostgreSQL: the read-write lock's write and \
    read cycles, 1 and 8 tasks, against session advisory locks as the Rust \
    `distributed-lock` crate takes them, and the write against dblock's mutex cycle, \
    interleaved in rounds; beside them, where a write's time goes: a write of a fresh lock \
    each cycle, dblock's write statements sent by hand, and ceilings (those statements, a \
    mutex on one key, the mutex cycle against the peer). The segmented stock strategy is \
    in section 4.\n\n";
