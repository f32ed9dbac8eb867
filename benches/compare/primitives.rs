//! Section 7: the coordination primitives against the mutex, interleaved in rounds as
//! section 1 runs its contenders. A semaphore permit's cycle (try_acquire + release of a
//! permit of a long-lived `Semaphore`) against the mutex's (a fresh key); reads of one
//! read-write lock by 8 tasks that each hold 2 ms, against 8 tasks taking one mutex for
//! 2 ms; and, under such a stream of readers, how long a writer waits.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use dblock::{Backend, Locker, RwLock, Semaphore};
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::contenders::Dblock;
use crate::handwritten::LEASE;
use crate::measure::{BoxError, Contender, Load, Stop, interleaved, median, spread};
use crate::report::{Table, count, ms_f, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_primitives";
const TASKS: [usize; 2] = [1, 8];
const WARM_UP: Duration = Duration::from_millis(200);
/// Legs per round, run in the round's order and then reversed (see section 1).
const LEGS: u32 = 10;
/// Permits of each task's semaphore.
const PERMITS: u32 = 3;
/// How long a reader (or the mutex's holder) keeps what it took.
const HOLD: Duration = Duration::from_millis(2);
const READERS: usize = 8;
/// Longest a reader or writer may wait (far above what a round needs).
const WAIT: Duration = Duration::from_secs(30);
/// A writer arrives this often among the readers.
const WRITER_EVERY: Duration = Duration::from_millis(250);

/// Lease of the failover cell's leader (renewed every third of it).
const FAILOVER_LEASE: Duration = Duration::from_secs(2);
const FAILOVERS: usize = 3;

/// Targets (issue 27): a permit's cycle >= 0.8x the mutex's; reads with 8 readers
/// holding 2 ms >= 4x the mutex's acquisitions.
const PERMIT_TARGET: f64 = 0.8;
const READ_TARGET: f64 = 4.0;

/// A permit of the task's own semaphore, taken and given back.
struct PermitCycle<DB: Backend> {
    semaphores: Vec<Semaphore<DB>>,
}

impl<DB: Backend> Contender for PermitCycle<DB> {
    fn name(&self) -> &str {
        "semaphore permit"
    }

    fn cycle<'a>(&'a self, task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            match self.semaphores[task].try_acquire(LEASE).await? {
                Some(permit) => {
                    permit.release().await?;
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }
}

/// A read of the one read-write lock, held [`HOLD`].
struct Read<DB: Backend> {
    lock: RwLock<DB>,
}

impl<DB: Backend> Contender for Read<DB> {
    fn name(&self) -> &str {
        "rw_lock read, 2 ms"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let read = self.lock.read(LEASE, WAIT).await?;
            tokio::time::sleep(HOLD).await;
            read.release().await?;
            Ok(true)
        })
    }
}

/// The one mutex key, held [`HOLD`].
struct Exclusive<DB: Backend> {
    locker: Locker<DB>,
}

impl<DB: Backend> Contender for Exclusive<DB> {
    fn name(&self) -> &str {
        "mutex, 2 ms"
    }

    fn cycle<'a>(&'a self, _task: usize, _key: &'a str) -> BoxFuture<'a, Result<bool, BoxError>> {
        Box::pin(async move {
            let guard = self.locker.acquire("bench:hot", LEASE, WAIT).await?;
            tokio::time::sleep(HOLD).await;
            guard.release().await?;
            Ok(true)
        })
    }
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

/// How long writers wait among [`READERS`] streaming readers: one writer every
/// [`WRITER_EVERY`] for `length`; each write's wait, in seconds.
async fn writer_waits<DB: Backend>(lock: &RwLock<DB>, length: Duration) -> Vec<f64> {
    let stop = Stop::after(length);
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..READERS {
        let lock = lock.clone();
        let stop = stop.clone();
        readers.spawn(async move {
            while !stop.is_set() {
                if let Ok(read) = lock.read(LEASE, WAIT).await {
                    tokio::time::sleep(HOLD).await;
                    let _ = read.release().await;
                }
            }
        });
    }
    let mut waits = Vec::new();
    while !stop.is_set() {
        tokio::time::sleep(WRITER_EVERY).await;
        let asked = Instant::now();
        if let Ok(write) = lock.write(LEASE, WAIT).await {
            waits.push(asked.elapsed().as_secs_f64());
            tokio::time::sleep(HOLD).await;
            let _ = write.release().await;
        }
    }
    while readers.join_next().await.is_some() {}
    waits
}

/// Leader failover in one process, as a SIGKILL leaves it: the leader's Locker stops (no
/// renewal, no release: its lead is forgotten) while a candidate of another Locker
/// campaigns. Per failover, seconds from the stop to the candidate's first fenced write
/// (`assert_held` in a committed transaction).
async fn failovers<DB: BenchDb>(
    server: &Server<DB>,
    count: usize,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut times = Vec::new();
    for round in 0..count {
        let leader = Locker::builder(server.pool.clone()).table(TABLE).build()?;
        let candidate = Locker::builder(server.pool.clone()).table(TABLE).build()?;
        let name = format!("bench-failover-{round}");
        let lead = leader
            .election(&name)
            .campaign("leader", FAILOVER_LEASE)
            .await?;
        let election = candidate.election(&name);
        let pool = candidate.pool().clone();
        let campaign = tokio::spawn(async move {
            let lead = election.campaign("candidate", FAILOVER_LEASE).await?;
            let mut tx = pool.begin().await?;
            lead.assert_held(&mut tx).await?;
            tx.commit().await?;
            let written = Instant::now();
            lead.resign().await?;
            Ok::<_, dblock::Error>(written)
        });
        // The candidate has lost its first attempt and sleeps until the lease ends.
        tokio::time::sleep(FAILOVER_LEASE / 2).await;
        std::mem::forget(lead);
        leader.shutdown().await;
        let stopped = Instant::now();
        let written = campaign.await??;
        times.push((written - stopped).as_secs_f64());
    }
    Ok(times)
}

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

    let lock = locker.rw_lock("bench-rw");
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

    let length = settings.round * u32::try_from(settings.rounds).unwrap_or(5);
    let mut waits = writer_waits(&lock, length).await;
    waits.sort_by(f64::total_cmp);
    let longest = waits.last().copied().unwrap_or(f64::NAN);
    verdicts.push(format!(
        "- a writer among {READERS} streaming readers (each holding 2 ms), one every {} ms for {:.0} s: {} writes, wait p50 {} ms, longest {} ms (report)",
        WRITER_EVERY.as_millis(),
        length.as_secs_f64(),
        waits.len(),
        ms_f(median(waits.iter().copied())),
        ms_f(longest),
    ));

    let mut failed_over = failovers(server, FAILOVERS).await?;
    failed_over.sort_by(f64::total_cmp);
    let target = FAILOVER_LEASE + FAILOVER_LEASE / 3 + Duration::from_millis(100);
    let worst = failed_over.last().copied().unwrap_or(f64::NAN);
    verdicts.push(format!(
        "- leader failover, lease {} s (renewed every {} ms): from the leader's stop (a SIGKILL \
         in one process: no renewal, no release) to the next leader's first fenced write, \
         {FAILOVERS} failovers: p50 {} ms, longest {} ms (target <= lease + interval + 100 ms \
         = {} ms) -> {}",
        FAILOVER_LEASE.as_secs(),
        (FAILOVER_LEASE / 3).as_millis(),
        ms_f(median(failed_over.iter().copied())),
        ms_f(worst),
        target.as_millis(),
        verdict(worst <= target.as_secs_f64())
    ));

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
