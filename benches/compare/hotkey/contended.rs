//! Cells 3.1 and 3.1b: 8 tasks through one Locker on one hot key, each holder keeping
//! it 2 ms, on a quiet machine (3.1) and with the CPU contended (3.1b): two busy-loop
//! processes run beside the bench from the cell's first round to its last
//! (`Burners`), so that the bench's threads, the server's and the loops compete for
//! the cores. A queue that hands the key to another task pays for that task's wake-up,
//! and on a busy machine a woken thread waits for a core; the server-side queue's
//! waiters wait in the server instead. The contenders take turns in rounds as in the
//! other cells (each round rotates who goes first), on a pool of their own that counts
//! the statements they send (one per connection given back; see `counting_pool`).
//!
//! Two more contenders put the targets against the server-side queue in context: an
//! in-process `tokio::sync::Mutex` ([`ceiling`](super::ceiling)), the
//! fastest a FIFO handoff can be with no database at all, and, on PostgreSQL, dblock on a
//! relaxed (`UNLOGGED`) lock table, which shows what the durable commit costs each
//! handoff. One more is dblock with the lock history on
//! ([`recording`](super::recording)), on the durable contender's table, for issue 44's
//! target: its handoffs/s within noise of the durable contender's.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dblock::{Locker, Stats};
use tokio::time::Instant;

use super::ceiling::{self, Ceiling};
use super::load::{Burners, counting_pool};
use super::queue::Queue;
use super::recording;
use super::round::{Counts, Round, TASKS, longest, measured, percentile, speed};
use super::tasks::{Side, contend};
use super::thread;
use crate::contenders::RELAXED;
use crate::measure::{median, new_owner, spread, turn_order};
use crate::report::{Table, count, ms, ms_f, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_hot";
const TABLE_CPU: &str = "bench_lock_hot_cpu";
/// The relaxed contender's tables (PostgreSQL only), beside the durable ones.
const RELAXED_TABLE: &str = "bench_lock_hot_relaxed";
const RELAXED_TABLE_CPU: &str = "bench_lock_hot_cpu_relaxed";
/// Busy loops in cell 3.1b: as many as the cores of the machine the bench was made on,
/// so every core has one more runnable thread than the bench and the server bring.
const BURNERS: usize = 2;

/// Issue 10's targets for cell 3.1.
const TARGET_P99: Duration = Duration::from_millis(50);
const TARGET_LONGEST: Duration = Duration::from_millis(100);
const TARGET_ATTEMPTS: f64 = 1.3;
/// Issue 31's targets against the server-side queue: dblock's handoffs/s at least this
/// many times the queue's, quiet (3.1) and CPU contended (3.1b); contended, dblock's
/// wait p99 and longest wait within this and within the queue's.
const QUEUE_QUIET: f64 = 1.15;
const QUEUE_CONTENDED: f64 = 1.0;
const CONTENDED_WAIT: Duration = Duration::from_millis(100);
/// Issue 29's target for cell 3.1: dblock's handoffs/s at least this many times polling's.
const POLL_QUIET: f64 = 1.3;

/// Who is who in the cell's list of contenders. The relaxed one is last, and there only
/// where the server has relaxed lock tables (PostgreSQL): elsewhere the list is one
/// shorter, so it is looked up with `get`.
const DBLOCK: usize = 0;
const POLL: usize = 1;
const QUEUE: usize = 3;
const CEILING: usize = 4;
const HISTORY: usize = 5;
const RELAXED_DBLOCK: usize = 6;

/// A contender of these cells: one of [`Side`]'s, on the lock table (or, `History`,
/// dblock recording the history on it; `Relaxed`, dblock on the relaxed one), the
/// server-side queue, on connections of its own, or the in-process mutex, on none.
enum Contender<DB: BenchDb> {
    Table(Arc<Side<DB>>),
    Queue(Arc<Queue>),
    Ceiling(Arc<Ceiling>),
    History(Arc<Side<DB>>),
    Relaxed(Arc<Side<DB>>),
}

impl<DB: BenchDb> Contender<DB> {
    fn name(&self) -> String {
        match self {
            Contender::Table(side) => side.name().to_owned(),
            Contender::Queue(_) => format!(
                "server-side queue: `{}`, a connection per task (hand-written)",
                DB::QUEUE_LOCK
            ),
            Contender::Ceiling(_) => ceiling::NAME.to_owned(),
            Contender::History(_) => recording::NAME.to_owned(),
            Contender::Relaxed(_) => RELAXED.to_owned(),
        }
    }
}

/// Cell 3.1 (`cpu_contended` false) or 3.1b on one server; its markdown.
pub async fn cell<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
    cpu_contended: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let (table, relaxed_table) = if cpu_contended {
        (TABLE_CPU, RELAXED_TABLE_CPU)
    } else {
        (TABLE, RELAXED_TABLE)
    };
    let (pool, given_back) = counting_pool::<DB>(&server.url).await?;
    let counted = Server {
        pool,
        label: server.label.clone(),
        url: server.url.clone(),
    };
    let locker = counted.fresh_locker(table).await?;
    let polling = Locker::builder(counted.pool.clone()).table(table).build()?;
    let history = recording::locker(&counted.pool, table)?;
    // On the counting pool, so that its statements are counted as the durable one's.
    let relaxed = DB::relaxed_locker(&counted.pool, relaxed_table).await?;
    let mut contenders = vec![
        Contender::Table(Arc::new(Side::Dblock(locker.clone()))),
        Contender::Table(Arc::new(Side::Poll(polling.clone()))),
        Contender::Table(Arc::new(Side::Spin {
            lock: DB::hand(&counted.pool, table),
            attempts: AtomicU64::new(0),
        })),
        Contender::Queue(Arc::new(Queue::default())),
        Contender::Ceiling(Arc::new(Ceiling::default())),
        Contender::History(Arc::new(Side::Dblock(history.clone()))),
    ];
    if let Some(relaxed) = &relaxed {
        contenders.push(Contender::Relaxed(Arc::new(Side::Dblock(relaxed.clone()))));
    }
    let burners = if cpu_contended {
        Some(Burners::start(BURNERS)?)
    } else {
        None
    };
    let started = Instant::now();
    let label = if cpu_contended {
        "8 tasks, CPU contended"
    } else {
        "8 tasks"
    };
    let mut rounds = interleaved(&contenders, server, &given_back, settings, label).await;
    let burned = burners.map(|loops| (loops.cpu(), started.elapsed()));
    locker.shutdown().await;
    polling.shutdown().await;
    history.shutdown().await;
    let history_stats = history.stats();
    DB::drop_lock_table(&counted.pool, table).await?;
    if let Some(relaxed) = relaxed {
        relaxed.shutdown().await;
        DB::drop_lock_table(&counted.pool, relaxed_table).await?;
    }
    counted.pool.close().await;

    let names: Vec<String> = contenders.iter().map(Contender::name).collect();
    let mut out = if cpu_contended {
        format!(
            "Cell 3.1's contenders and rounds while {BURNERS} busy loops (`sh -c 'while :; do \
             :; done'`, as many as the cores of the machine the bench was made on) ran beside \
             the bench from the first round to the last. Columns as in 3.1.\n\n"
        )
    } else {
        String::new()
    };
    out.push_str(&render(&names, &mut rounds));
    if !cpu_contended {
        out.push_str(PER_HANDOFF);
    }
    out.push('\n');
    if cpu_contended {
        contended_targets(&mut out, &mut rounds, &history_stats);
        if let Some((cpu, took)) = burned {
            let _ = writeln!(
                out,
                "- The busy loops had {:.1} s on a CPU over the cell's {:.1} s ({} cores).",
                cpu.as_secs_f64(),
                took.as_secs_f64(),
                std::thread::available_parallelism().map_or(0, |n| n.get()),
            );
        }
    } else {
        quiet_targets(&mut out, &mut rounds, &history_stats);
        let retakes = median(rounds[POLL].iter().map(Round::retake_share));
        out.push_str(&thread::ceiling::<DB>(settings, &server.url, retakes).await);
    }
    for (name, rs) in names.iter().zip(&rounds) {
        if let Some(err) = rs.iter().find_map(|r| r.first_error.as_ref()) {
            let _ = writeln!(out, "- first error of {name}: `{err}`");
        }
    }
    out.push('\n');
    Ok(out)
}

/// What the per-handoff columns count.
const PER_HANDOFF: &str = "\nPer handoff = per acquisition (each but a round's first is \
    one handoff). Statements: the lock-table contenders', counted as connections given \
    back to the cell's own pool (one per attempt, wake-up request or release; each one \
    statement on PostgreSQL; dblock history on's and dblock relaxed's too, on the same \
    pool, history on's with its history writes: one statement a second, the one after \
    each round's end included), except dblock's handoffs: a release that hands the row to \
    the next waiter sends its one statement on the lease engine's own connection, outside \
    the pool, which is not counted (so dblock's rows read about 0 where every grant is a \
    handoff); the server-side \
    queue's lock and unlock statements, counted as sent; the in-process mutex sends none. \
    Both include the statements of acquires cut off by a round's end. Task \
    wake-ups: polls of the 8 tasks after their first (not of tasks that dblock or sqlx \
    spawn). Thread wake-ups: context switches of all the bench's threads, as in section \
    1 (`measure::process_cpu`).\n";

/// Runs the cell's rounds: each round every contender in turn (the order rotated each
/// round) on a fresh key. The rounds, per contender.
async fn interleaved<DB: BenchDb>(
    contenders: &[Contender<DB>],
    server: &Server<DB>,
    given_back: &AtomicU64,
    settings: &Settings,
    label: &str,
) -> Vec<Vec<Round>> {
    let run = new_owner()[..8].to_owned();
    let length = settings.round;
    let mut rounds: Vec<Vec<Round>> = contenders.iter().map(|_| Vec::new()).collect();
    for r in 0..settings.rounds {
        eprintln!(
            "hotkey: {}, {label}, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        for i in turn_order(contenders.len(), r) {
            let key = format!("hot:{run}:{r}:{i}");
            // Deadlocks are read on the server's pool, not the counted one.
            let mut round = match &contenders[i] {
                Contender::Table(side) | Contender::History(side) | Contender::Relaxed(side) => {
                    let counts = || Counts {
                        attempts: side.attempts(),
                        statements: given_back.load(Ordering::Relaxed),
                    };
                    measured(&server.pool, length, counts, |deadline| {
                        contend(side, &key, TASKS, deadline)
                    })
                    .await
                }
                Contender::Queue(queue) => {
                    match Queue::open::<DB>(&server.url, &key, TASKS).await {
                        Ok(sessions) => {
                            measured(
                                &server.pool,
                                length,
                                || queue.counts(),
                                |deadline| queue.contend(sessions, deadline),
                            )
                            .await
                        }
                        Err(e) => Round {
                            acquire_errors: 1,
                            first_error: Some(format!("cannot open its connections: {e}")),
                            secs: length.as_secs_f64(),
                            ..Round::default()
                        },
                    }
                }
                Contender::Ceiling(mutex) => {
                    measured(
                        &server.pool,
                        length,
                        || mutex.counts(),
                        |deadline| mutex.contend(TASKS, deadline),
                    )
                    .await
                }
            };
            if let Contender::History(_) = &contenders[i] {
                // The write of the round's last events, waited out so that it lands in
                // no other contender's round, is this round's statement all the same.
                let before = given_back.load(Ordering::Relaxed);
                recording::drain().await;
                round.statements += given_back.load(Ordering::Relaxed) - before;
            }
            rounds[i].push(round);
        }
    }
    rounds
}

/// The cell's table: one row per contender, medians across rounds.
fn render(names: &[String], rounds: &mut [Vec<Round>]) -> String {
    let mut table = Table::new(&[
        "contender",
        "handoffs/s",
        "handoff p50 ms",
        "handoff p99 ms",
        "wait p99 ms",
        "longest wait ms",
        "attempts per acquisition",
        "statements per handoff",
        "task wake-ups per handoff",
        "thread wake-ups per handoff",
        "releaser re-takes",
        "server deadlocks/s",
        "errors to callers (acquire / release)",
    ]);
    for (name, rs) in names.iter().zip(rounds.iter_mut()) {
        let acquire_errors: u64 = rs.iter().map(|r| r.acquire_errors).sum();
        let release_errors: u64 = rs.iter().map(|r| r.release_errors).sum();
        let deadlocks = if rs.iter().all(|r| r.server_deadlocks.is_some()) {
            count(median(
                rs.iter()
                    .map(|r| r.server_deadlocks.unwrap_or(0) as f64 / r.secs),
            ))
        } else {
            "n/a".to_owned()
        };
        let handoff_p50 = percentile(rs, |r| &mut r.handoffs, 50.0);
        let handoff_p99 = percentile(rs, |r| &mut r.handoffs, 99.0);
        let wait_p99 = percentile(rs, |r| &mut r.waits, 99.0);
        let rs = &*rs;
        let per_handoff = |pick: fn(&Round) -> u64| {
            format!(
                "{:.2}",
                median(rs.iter().map(|r| r.per_acquisition(pick(r))))
            )
        };
        table.row(vec![
            name.clone(),
            count(median(rs.iter().map(Round::per_sec))),
            ms_f(handoff_p50),
            ms_f(handoff_p99),
            ms_f(wait_p99),
            ms(longest(rs)),
            format!(
                "{:.2}",
                median(rs.iter().map(Round::attempts_per_acquisition))
            ),
            per_handoff(|r| r.statements),
            per_handoff(|r| r.task_wakeups),
            per_handoff(|r| r.thread_wakeups),
            format!("{:.0}%", 100.0 * median(rs.iter().map(Round::retake_share))),
            deadlocks,
            format!("{acquire_errors} / {release_errors}"),
        ]);
    }
    table.render()
}

/// Cell 3.1's target lines: issue 10's, issue 31's against the server-side queue, and
/// issue 44's for the history-on contender (`history`: its Locker's stats).
fn quiet_targets(out: &mut String, rounds: &mut [Vec<Round>], history: &Stats) {
    let p99 = percentile(&mut rounds[DBLOCK], |r| &mut r.waits, 99.0);
    let dblock = &rounds[DBLOCK];
    let longest = longest(dblock);
    let (vs_poll, vs_poll_spread) = speed(dblock, &rounds[POLL]);
    let (vs_queue, vs_queue_spread) = speed(dblock, &rounds[QUEUE]);
    let attempts = median(dblock.iter().map(Round::attempts_per_acquisition));
    let errors: u64 = dblock
        .iter()
        .map(|r| r.acquire_errors + r.release_errors)
        .sum();
    let (lo, hi) = spread(dblock.iter().map(Round::per_sec));
    let _ = writeln!(
        out,
        "- Target: dblock's wait p99 <= {} ms -> {} ({} ms, median of rounds).",
        TARGET_P99.as_millis(),
        verdict(p99 <= TARGET_P99.as_secs_f64()),
        ms_f(p99),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's longest wait <= {} ms -> {} ({} ms, longest of all rounds).",
        TARGET_LONGEST.as_millis(),
        verdict(longest <= TARGET_LONGEST),
        ms(longest),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's handoffs/s >= polling's -> {} (dblock / polling {}, per round).",
        verdict(vs_poll >= 1.0),
        ratio(vs_poll, vs_poll_spread),
    );
    // Every grant holds the key for the same 2 ms sleep, one after another, so the
    // in-process mutex's rate bounds any lock's here, polling's rival included.
    let (ceiling_vs_poll, ceiling_vs_poll_spread) = speed(&rounds[CEILING], &rounds[POLL]);
    let _ = writeln!(
        out,
        "- Target: dblock's handoffs/s >= {POLL_QUIET:.2}x polling's -> {} (dblock / polling \
         {}, per round); the in-process mutex / polling = {} per round: the holds run one \
         after another, each the same 2 ms sleep, so no lock, with or without a database, \
         hands off faster than the mutex here{}.",
        verdict(vs_poll >= POLL_QUIET),
        ratio(vs_poll, vs_poll_spread),
        ratio(ceiling_vs_poll, ceiling_vs_poll_spread),
        if ceiling_vs_poll < POLL_QUIET {
            ": the target is above that ceiling on this machine"
        } else {
            ""
        },
    );
    let _ = writeln!(
        out,
        "- Target: dblock's handoffs/s >= {QUEUE_QUIET:.2}x the server-side queue's -> {} \
         (dblock / server-side queue {}, per round).",
        verdict(vs_queue >= QUEUE_QUIET),
        ratio(vs_queue, vs_queue_spread),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's attempts per acquisition <= {TARGET_ATTEMPTS} -> {} ({attempts:.2}).",
        verdict(attempts <= TARGET_ATTEMPTS),
    );
    let _ = writeln!(
        out,
        "- Target: zero errors returned to dblock's callers -> {} ({errors} in {} \
         acquisitions; handoffs/s ranged {}-{} across rounds).",
        verdict(errors == 0),
        dblock.iter().map(|r| r.acquisitions).sum::<u64>(),
        count(lo),
        count(hi),
    );
    history_target(out, rounds, history);
    context(out, rounds, QUEUE_QUIET);
}

/// Cell 3.1b's target lines: issue 31's, dblock against the server-side queue, and issue
/// 44's for the history-on contender, as in 3.1.
fn contended_targets(out: &mut String, rounds: &mut [Vec<Round>], history: &Stats) {
    let p99 = percentile(&mut rounds[DBLOCK], |r| &mut r.waits, 99.0);
    let queue_p99 = percentile(&mut rounds[QUEUE], |r| &mut r.waits, 99.0);
    let (dblock, queue) = (&rounds[DBLOCK], &rounds[QUEUE]);
    let (longest, queue_longest) = (longest(dblock), longest(queue));
    let (vs_queue, vs_queue_spread) = speed(dblock, queue);
    let limit = CONTENDED_WAIT.as_millis();
    let _ = writeln!(
        out,
        "- Target: dblock's handoffs/s >= {QUEUE_CONTENDED:.2}x the server-side queue's -> {} \
         (dblock / server-side queue {}, per round).",
        verdict(vs_queue >= QUEUE_CONTENDED),
        ratio(vs_queue, vs_queue_spread),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's wait p99 <= {limit} ms and <= the server-side queue's -> {} \
         (dblock {} ms, server-side queue {} ms, median of rounds).",
        verdict(p99 <= CONTENDED_WAIT.as_secs_f64() && p99 <= queue_p99),
        ms_f(p99),
        ms_f(queue_p99),
    );
    let _ = writeln!(
        out,
        "- Target: dblock's longest wait <= {limit} ms and <= the server-side queue's -> {} \
         (dblock {} ms, server-side queue {} ms, longest of all rounds).",
        verdict(longest <= CONTENDED_WAIT && longest <= queue_longest),
        ms(longest),
        ms(queue_longest),
    );
    history_target(out, rounds, history);
    context(out, rounds, QUEUE_CONTENDED);
}

/// Issue 44's target line: the history-on contender against durable dblock.
fn history_target(out: &mut String, rounds: &mut [Vec<Round>], history: &Stats) {
    let (off, on) = rounds.split_at_mut(HISTORY);
    recording::target(out, &mut on[0], &mut off[DBLOCK], history);
}

/// Lines after a cell's targets that put them in context (no targets themselves): the
/// in-process mutex, a bound on any lock that records each grant in the database, and
/// dblock relaxed, what the durable commit costs (where there is one). `asked`: the
/// cell's target for dblock / the server-side queue.
fn context(out: &mut String, rounds: &[Vec<Round>], asked: f64) {
    let (ceiling, queue, dblock) = (&rounds[CEILING], &rounds[QUEUE], &rounds[DBLOCK]);
    let (over_queue, over_queue_spread) = speed(ceiling, queue);
    let (dblock_share, dblock_spread) = speed(dblock, ceiling);
    let (queue_share, queue_spread) = speed(queue, ceiling);
    let _ = writeln!(
        out,
        "- Ceiling: the in-process mutex / server-side queue = {} per round (the target \
         above asks {asked:.2}x of dblock): a lock that records each grant in the database \
         cannot hand off faster than this; dblock reaches {} of the ceiling, the \
         server-side queue {}.",
        ratio(over_queue, over_queue_spread),
        ratio(dblock_share, dblock_spread),
        ratio(queue_share, queue_spread),
    );
    match rounds.get(RELAXED_DBLOCK) {
        Some(relaxed) => {
            let (vs_durable, vs_durable_spread) = speed(relaxed, dblock);
            let (vs_queue, vs_queue_spread) = speed(relaxed, queue);
            let _ = writeln!(
                out,
                "- Relaxed: dblock relaxed / durable dblock {}, relaxed / server-side \
                 queue {}, per round.",
                ratio(vs_durable, vs_durable_spread),
                ratio(vs_queue, vs_queue_spread),
            );
        }
        None => out.push_str(
            "- Relaxed: not measured on this server (relaxed lock tables are PostgreSQL's \
             `UNLOGGED` tables).\n",
        ),
    }
}
