//! Section 3: one hot key, waiting acquires (issue 10). Five cells per server, each
//! holder keeping the key [`HOLD`](tasks::HOLD) (2 ms):
//!
//! 1. **8 tasks in one process**, one Locker
//!    ([`contended`](contended)). Every task loops: acquire, hold,
//!    `release`. Each acquisition and each completed release is stamped with one shared
//!    clock; sorted by acquisition time (one key: holders follow each other), the
//!    handoff latency is the time from one holder's release completing to the next
//!    holder's acquire returning, which includes any backoff sleep of the waiter: what a
//!    caller experiences. Contenders, in interleaved rounds: dblock's `acquire` (local
//!    queue, a release wakes the next waiter); *polling*, the old design, reproduced with
//!    the public API: `try_acquire`, then sleep the retry policy's next jittered
//!    exponential delay, no local queue ([`poll_acquire`](tasks::poll_acquire));
//!    for scale, a hand-written contender that sends dblock's statements and retries at
//!    once without sleeping: a ceiling for handoffs per second, bought with a hot retry
//!    loop; and the *server-side queue* ([`queue`](queue)), what a
//!    Rust user has today: a connection per task, blocked in `pg_advisory_lock` until
//!    the server grants the key. Beside them, to put the targets against that queue in
//!    context: the same tasks on an in-process `tokio::sync::Mutex`
//!    ([`ceiling`](ceiling)), a handoff with no database at all,
//!    and (PostgreSQL) dblock on a relaxed (`UNLOGGED`) lock table. And dblock's
//!    `acquire` on a Locker that records the lock history (`history(1 h)`, on the
//!    durable contender's table; [`recording`](recording)), for issue 44's target: its
//!    handoffs/s unchanged beyond noise.
//!
//!    1b. **The same, CPU contended**: cell 1's contenders while two busy-loop processes
//!    run beside the bench.
//! 2. **2 processes x 4 tasks** on the same key, each process with its own Locker and
//!    pool ([`procs`](procs)): the bench re-executes itself as two
//!    workers that start at the same instant; shares of the acquisitions and waits per
//!    process. The one cell that also runs on SQLite ([`file_section`]): the workers
//!    share one database file.
//! 3. **100 waiters through a pool of 4** ([`pool`](pool)): one
//!    holder keeps the key (short lease, renewed) for the whole round while 100 tasks
//!    wait for it; statements per second the server sees, dblock against polling.
//! 4. **Fair mode, 2 processes x 4 tasks** ([`fair`](fair)): cell
//!    2's workers, in rounds with Lockers built `fair(true)` and with the default; each
//!    worker reports its grants (fencing token, ticket), and the parent merges them in
//!    grant order (by fencing token) and counts the grants against their tickets' order
//!    (target: none), with shares, waits and statements on the server per acquisition.
//!
//! The section reads one way down: this module runs the cells in the report's order;
//! each cell (`contended`, `procs`, `pool`, `fair`) builds on the contenders and helpers
//! beside it (`ceiling`, `queue`, `recording`, `load`, `thread`, `workers`: what a
//! worker process of cells 2 and 4 does), and all of them on what the cells share
//! (`round`: a round's figures and how it is measured; `tasks`: the contenders' task
//! loop), which in turn uses only the bench's shared modules (the worker processes
//! themselves: [`crate::workers`]).

mod ceiling;
mod contended;
mod fair;
mod load;
mod pool;
mod procs;
mod queue;
mod recording;
mod round;
mod tasks;
mod thread;
mod workers;

use std::fmt::Write as _;

use crate::servers::{BenchDb, LockDb, Server};
use crate::settings::Settings;

pub use workers::work;

/// The section's introduction in the report (the same for every server).
pub const INTRO: &str = "## 3. Hot key: one key, waiting acquire\n\n\
    Issue 10's cells, then fair mode, each holder keeping the key 2 ms: (1) 8 tasks \
    through one Locker, against polling, a retry-at-once loop and a server-side queue \
    (a connection per task, blocked in the server's own lock until granted), with an \
    in-process mutex (no database: the ceiling of any FIFO handoff), dblock with the lock \
    history on (`history(1 h)`, on dblock's table; issue 44's target: its handoffs/s \
    unchanged beyond noise) and, on PostgreSQL, dblock on a relaxed (`UNLOGGED`) table \
    beside them, and (1b) the \
    same while two busy loops burn the CPU beside the bench, (2) 2 processes x 4 tasks, \
    each process with its own Locker and pool (also on SQLite, the processes sharing one \
    database file: the section's only cell there), (3) 100 waiters through a pool of 4 while \
    one holder keeps the key, (4) fair mode (`fair(true)`, tickets) against the default, \
    2 processes x 4 tasks as in (2), grants checked against ticket order. *Polling* is \
    the old design reproduced with the public API: `try_acquire`, then sleep the retry \
    policy's jittered exponential backoff (`RetryPolicy::default().delays()`), no local \
    queue. Wait = acquire called -> returned, for acquisitions that succeeded: a round's \
    end cancels the acquires still waiting (they are cancel safe), which counts neither \
    as an error nor as a wait, so the longest wait is capped by the round's length. \
    Handoff = release completed -> next acquire returned; releaser re-takes = the share \
    of handoffs in which the task that released the key took it again.\n\n";

/// Runs section 3 on one server; returns its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut out = format!("### {}\n\n", server.label);
    let cells = [
        ("3.1", "8 tasks, one Locker"),
        ("3.1b", "8 tasks, one Locker, CPU contended"),
        ("3.2", "2 processes x 4 tasks"),
        ("3.3", "100 waiters through a pool of 4"),
        ("3.4", "Fair mode, 2 processes x 4 tasks"),
    ];
    for (id, heading) in cells {
        if !settings.runs_cell(id) {
            continue;
        }
        let _ = write!(out, "#### {id} {heading}\n\n");
        let cell = match id {
            "3.1" => contended::cell(settings, server, false).await,
            "3.1b" => contended::cell(settings, server, true).await,
            "3.2" => procs::cell(settings, server).await,
            "3.3" => pool::cell(settings, server).await,
            _ => fair::cell(settings, server).await,
        };
        push_cell(&mut out, cell);
    }
    out
}

/// Section 3 on a database file (SQLite): cell 2 alone, its workers sharing the file.
/// The other cells' contenders (hand-written SQL, the server's own queue, statement
/// counts read on the server) are written for servers.
pub async fn file_section<DB: LockDb>(settings: &Settings, server: &Server<DB>) -> String {
    if !settings.runs_cell("3.2") {
        return String::new();
    }
    let mut out = format!(
        "### {}\n\nCell 3.2 only, {}.\n\n#### 3.2 2 processes x 4 tasks\n\n",
        server.label,
        crate::servers::sqlite::SETUP_TEXT,
    );
    push_cell(&mut out, procs::cell(settings, server).await);
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
