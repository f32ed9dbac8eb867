//! What section 7's cells with worker processes (7.2, a semaphore; 7.3, an election)
//! share: what one worker does in each mode, on its own Locker and pool (the processes
//! themselves are the bench's one worker mechanism, [`crate::workers`]), and the shares
//! the cells read from the workers' reports.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dblock::Locker;
use sqlx::Pool;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use crate::measure::{Samples, in_tasks};
use crate::report::ms;
use crate::servers::LockDb;
use crate::workers::{Job, Lead, Mode, Report, wall_ns};

/// Permits of cell 7.2's semaphore.
pub const PERMITS: u32 = 3;
/// A permit's holder keeps it for a time drawn evenly from this range, in milliseconds.
pub const PERMIT_HOLD_MS: (u64, u64) = (5, 20);
/// A leader of cell 7.3 resigns after a time drawn evenly from this range, in
/// milliseconds, then campaigns again.
pub const LEAD_MS: (u64, u64) = (500, 1500);
/// A leader resigns by choice only when at least this much of the round is left after
/// it, time for a candidate to take over (RetryPolicy's default `max`, 500 ms, twice:
/// a candidate that polls looks again within that); otherwise it leads until the round's
/// end, and that last resignation is not counted.
pub const TAKE_OVER: Duration = Duration::from_millis(1000);
const LEASE: Duration = Duration::from_secs(30);
/// Longer than any round: a round's end cancels waiting acquires (they are cancel safe).
const WAIT: Duration = Duration::from_secs(30);

/// A worker of mode [`Mode::Semaphore`] or [`Mode::Election`]: its run and report.
pub async fn work<DB: LockDb>(pool: Pool<DB>, job: &Job) -> Result<Report, String> {
    let locker = Locker::builder(pool.clone())
        .table(&job.table)
        .build()
        .map_err(|e| e.to_string())?;
    let late = job.ready(&pool).await?;
    let end = Instant::now() + job.length;
    let mut report = match job.mode {
        Mode::Semaphore => permits(&locker, job, end).await,
        Mode::Election => leads(&locker, job, end).await,
        other => return Err(format!("not a primitives worker: {other:?}")),
    };
    report.late = late;
    report.attempts = locker.stats().attempts;
    let _ = tokio::time::timeout(Duration::from_secs(10), locker.shutdown()).await;
    pool.close().await;
    Ok(report)
}

/// How long this process went with a waiter and no grant: the stretches that start
/// when a task starts waiting while none did, or at a grant while others still wait,
/// and end at the next grant, or when the last waiter gives up (the round's end).
#[derive(Default)]
struct Drought {
    waiting: usize,
    since: Option<Instant>,
    longest: Duration,
}

impl Drought {
    fn waits(&mut self) {
        if self.waiting == 0 {
            self.since = Some(Instant::now());
        }
        self.waiting += 1;
    }

    fn granted(&mut self) {
        let now = Instant::now();
        self.close(now);
        self.waiting -= 1;
        if self.waiting > 0 {
            self.since = Some(now);
        }
    }

    fn gives_up(&mut self) {
        self.waiting -= 1;
        if self.waiting == 0 {
            self.close(Instant::now());
        }
    }

    fn close(&mut self, now: Instant) {
        if let Some(since) = self.since.take() {
            self.longest = self.longest.max(now - since);
        }
    }
}

/// `job.tasks` tasks that take a permit of the semaphore `job.key`, hold it
/// [`PERMIT_HOLD_MS`], give it back, until `end`.
async fn permits<DB: LockDb>(locker: &Locker<DB>, job: &Job, end: Instant) -> Report {
    let semaphore = locker.semaphore(&job.key, PERMITS);
    let drought = Arc::new(Mutex::new(Drought::default()));
    let note = |drought: &Mutex<Drought>, f: fn(&mut Drought)| {
        f(&mut drought.lock().unwrap_or_else(PoisonError::into_inner));
    };
    let per_task = in_tasks(job.tasks, |_| {
        let semaphore = semaphore.clone();
        let drought = Arc::clone(&drought);
        async move {
            let mut done = Report::default();
            while Instant::now() < end {
                let called = Instant::now();
                note(&drought, Drought::waits);
                let permit = loop {
                    match timeout_at(end, semaphore.acquire(LEASE, WAIT)).await {
                        Ok(Ok(permit)) => {
                            note(&drought, Drought::granted);
                            break Some(permit);
                        }
                        Ok(Err(err)) if Instant::now() < end => {
                            done.acquire_errors += 1;
                            done.first_error.get_or_insert(err.to_string());
                            sleep(Duration::from_millis(10)).await;
                        }
                        Ok(Err(_)) | Err(_) => {
                            note(&drought, Drought::gives_up);
                            break None;
                        }
                    }
                };
                let Some(permit) = permit else { break };
                done.acquisitions += 1;
                done.waits.push(called.elapsed());
                let (lo, hi) = PERMIT_HOLD_MS;
                sleep(Duration::from_millis(fastrand::u64(lo..=hi))).await;
                if let Err(err) = permit.release().await {
                    done.release_errors += 1;
                    done.first_error.get_or_insert(err.to_string());
                }
            }
            done
        }
    })
    .await;
    let mut report = Report::default();
    for done in per_task {
        report.acquisitions += done.acquisitions;
        report.acquire_errors += done.acquire_errors;
        report.release_errors += done.release_errors;
        report.waits.append(done.waits);
        report.first_error = report.first_error.or(done.first_error);
    }
    report.drought = drought
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .longest;
    report
}

/// One candidate that campaigns in the election `job.key`, leads [`LEAD_MS`], resigns
/// and campaigns again, until `end`.
async fn leads<DB: LockDb>(locker: &Locker<DB>, job: &Job, end: Instant) -> Report {
    let election = locker.election(&job.key);
    let identity = format!("pid-{}", std::process::id());
    let mut report = Report::default();
    // A timeout polls its future before its deadline: a campaign that fails at once
    // would loop past the end without this check.
    while Instant::now() < end {
        let called = Instant::now();
        let lead = match timeout_at(end, election.campaign(&identity, LEASE)).await {
            Err(_) => break,
            Ok(Err(err)) => {
                report.acquire_errors += 1;
                report.first_error.get_or_insert(err.to_string());
                sleep(Duration::from_millis(10)).await;
                continue;
            }
            Ok(Ok(lead)) => lead,
        };
        let granted = wall_ns();
        report.acquisitions += 1;
        report.waits.push(called.elapsed());
        let (lo, hi) = LEAD_MS;
        let lead_for = Duration::from_millis(fastrand::u64(lo..=hi));
        let at_will = Instant::now() + lead_for + TAKE_OVER <= end;
        if at_will {
            sleep(lead_for).await;
        } else {
            sleep_until(end).await;
        }
        let term = lead.term();
        let ended = wall_ns();
        if let Err(err) = lead.resign().await {
            report.release_errors += 1;
            report.first_error.get_or_insert(err.to_string());
        }
        report.leads.push(Lead {
            term,
            granted,
            ended,
            at_will,
        });
        if !at_will {
            break;
        }
    }
    report
}

/// Process `p`'s share of a round's acquisitions (grants, leads).
pub fn share(round: &[Report], p: usize) -> f64 {
    let all: u64 = round.iter().map(|r| r.acquisitions).sum();
    round[p].acquisitions as f64 / all.max(1) as f64
}

/// The share of a round's less (least) served process.
pub fn least_share(round: &[Report]) -> f64 {
    (0..round.len())
        .map(|p| share(round, p))
        .fold(1.0, f64::min)
}

/// A process's wait p99 in a round, in seconds.
pub fn p99(report: &Report) -> f64 {
    let mut waits: Samples = report.waits.clone();
    waits.percentile(99.0).as_secs_f64()
}

/// Lateness and the first error, where there were any; the cell's closing blank line.
pub fn push_notes(out: &mut String, rounds: &[Vec<Report>]) {
    let late = rounds
        .iter()
        .flatten()
        .map(|r| r.late)
        .max()
        .unwrap_or_default();
    if !late.is_zero() {
        let _ = writeln!(
            out,
            "- a worker was ready {} ms after the common start (not counted in its waits).",
            ms(late)
        );
    }
    if let Some(err) = rounds.iter().flatten().find_map(|r| r.first_error.as_ref()) {
        let _ = writeln!(out, "- first error: `{err}`");
    }
    out.push('\n');
}
