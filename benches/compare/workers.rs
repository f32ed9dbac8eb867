//! The bench's worker processes, one mechanism for every cell that needs real OS
//! processes (3.2 and 3.4 on a hot key, 7.2 on a semaphore, 7.3 on an election): the
//! parent re-executes the bench (`std::env::current_exe()`) as workers that start at the
//! same instant, each with its own pool and Locker, and reads one report line back from
//! each.
//!
//! A worker is told what to do by [`WORKER_ENV`] (`mode table key tasks duration_ms
//! start_unix_ms`; the server URL comes apart in [`WORKER_URL_ENV`], so a password never
//! shows in a process list), which `main` reads ([`Job::asked`]) before any flag. It
//! connects ([`connect`]: a pool of [`POOL_SIZE`], named as the bench's dedicated pools so
//! that `BenchDb::await_sessions_gone` sees its sessions); `main` hands the pool to the
//! section whose mode it is (`hotkey::work`, `primitives::work`), whose body opens its
//! connections and sleeps until the common start ([`Job::ready`]), runs its tasks until
//! the round's end, and returns a [`Report`]; [`exit_with`] prints it as one line on
//! stdout (`bench-worker key=value ...`), which [`round`] reads back.

use std::fmt::Write as _;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{MySql, Pool, Postgres, Sqlite};

use crate::measure::Samples;
use crate::servers::{LockDb, POOL_SIZE};

/// Set (to the job) in a worker's environment only.
const WORKER_ENV: &str = "DBLOCK_BENCH_WORKER";
const WORKER_URL_ENV: &str = "DBLOCK_BENCH_WORKER_URL";
/// The first word of a worker's report line.
const REPORT: &str = "bench-worker";
/// Time for every worker to start, connect and open its connections before the common
/// start (a worker that was not ready by then reports how late it was).
const START_AFTER: Duration = Duration::from_millis(2000);

/// What the workers of a round do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Cells 3.2 and 3.4: tasks take one key, hold it 2 ms, release it, with dblock's
    /// default Locker.
    HotKey,
    /// Cell 3.4: the same, the Locker built `fair(true)`.
    Fair,
    /// Cell 7.2: tasks take a permit of one semaphore, hold it a while, give it back.
    Semaphore,
    /// Cell 7.3: one candidate campaigns, leads a while, resigns, campaigns again.
    Election,
}

const MODES: [(Mode, &str); 4] = [
    (Mode::HotKey, "default"),
    (Mode::Fair, "fair"),
    (Mode::Semaphore, "semaphore"),
    (Mode::Election, "election"),
];

/// One worker's job; the same for every worker of a round.
#[derive(Clone, Debug)]
pub struct Job {
    pub mode: Mode,
    /// A dblock lock table (it must exist: the parent migrates it).
    pub table: String,
    /// The key, semaphore or election the workers share.
    pub key: String,
    pub tasks: usize,
    /// From the common start to the round's end.
    pub length: Duration,
    start: SystemTime,
}

impl Job {
    pub fn new(mode: Mode, table: &str, key: &str, tasks: usize, length: Duration) -> Job {
        Job {
            mode,
            table: table.to_owned(),
            key: key.to_owned(),
            tasks,
            length,
            start: UNIX_EPOCH,
        }
    }

    /// The job and server URL of this process if it was started as a worker; `None` when
    /// it was not.
    pub fn asked() -> Option<Result<(Job, String), String>> {
        let job = std::env::var(WORKER_ENV).ok()?;
        let url = std::env::var(WORKER_URL_ENV).unwrap_or_default();
        Some(Job::decode(&job).map(|job| (job, url)))
    }

    fn encode(&self) -> String {
        let mode = MODES.iter().find(|(m, _)| *m == self.mode).map(|(_, w)| w);
        let start_ms = self
            .start
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!(
            "{} {} {} {} {} {start_ms}",
            mode.unwrap_or(&"default"),
            self.table,
            self.key,
            self.tasks,
            self.length.as_millis(),
        )
    }

    fn decode(job: &str) -> Result<Job, String> {
        let words: Vec<&str> = job.split_whitespace().collect();
        let &[mode, table, key, tasks, length_ms, start_ms] = words.as_slice() else {
            return Err(format!("cannot read the job {job:?}"));
        };
        let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
        Ok(Job {
            mode: MODES
                .iter()
                .find(|(_, w)| *w == mode)
                .map(|(m, _)| *m)
                .ok_or_else(|| format!("unknown mode {mode:?} in the job {job:?}"))?,
            table: table.to_owned(),
            key: key.to_owned(),
            tasks: usize::try_from(number(tasks)?).map_err(|e| e.to_string())?,
            length: Duration::from_millis(number(length_ms)?),
            start: UNIX_EPOCH + Duration::from_millis(number(start_ms)?),
        })
    }

    /// Opens the connections the tasks will use (so that none is opened inside the
    /// round), then sleeps until the common start. How late the worker was ready for it
    /// (zero when on time).
    pub async fn ready<DB: sqlx::Database>(&self, pool: &Pool<DB>) -> Result<Duration, String> {
        let mut open = Vec::with_capacity(self.tasks);
        for _ in 0..self.tasks {
            open.push(pool.acquire().await.map_err(|e| e.to_string())?);
        }
        drop(open);
        Ok(match self.start.duration_since(SystemTime::now()) {
            Ok(until) => {
                tokio::time::sleep(until).await;
                Duration::ZERO
            }
            Err(passed) => passed.duration(),
        })
    }
}

/// A worker's pool, of the database its URL names.
pub enum Pools {
    Postgres(Pool<Postgres>),
    MySql(Pool<MySql>),
    Sqlite(Pool<Sqlite>),
}

/// Connects a worker to `url`.
pub async fn connect(url: &str) -> Result<Pools, String> {
    let failed = |e: sqlx::Error| e.to_string();
    Ok(if url.starts_with("postgres") {
        Pools::Postgres(
            Postgres::dedicated_pool(url, POOL_SIZE)
                .await
                .map_err(failed)?,
        )
    } else if url.starts_with("sqlite") {
        Pools::Sqlite(
            Sqlite::dedicated_pool(url, POOL_SIZE)
                .await
                .map_err(failed)?,
        )
    } else {
        Pools::MySql(
            MySql::dedicated_pool(url, POOL_SIZE)
                .await
                .map_err(failed)?,
        )
    })
}

/// Prints a worker's report line and exits (non-zero, with the message on stderr, when
/// it failed).
pub fn exit_with(outcome: Result<Report, String>) -> ! {
    match outcome {
        Ok(report) => {
            println!("{}", report.line());
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("compare: worker: {e}");
            std::process::exit(1);
        }
    }
}

/// One grant of a key: its fencing token (rising with every grant of a key, so the grant
/// order across processes) and the fair-mode ticket it waited on, if any.
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    pub token: i64,
    pub ticket: Option<i64>,
}

/// One lead of an election's candidate: its term (rising with every lead, so the order
/// of leads across processes), and when it began and ended by the wall clock, which the
/// workers of one machine share (nanoseconds since the Unix epoch).
#[derive(Clone, Copy, Debug)]
pub struct Lead {
    pub term: i64,
    pub granted: u64,
    pub ended: u64,
    /// Resigned by choice (`true`), or at the round's end.
    pub at_will: bool,
}

/// Nanoseconds since the Unix epoch, now.
pub fn wall_ns() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(since.unwrap_or_default().as_nanos()).unwrap_or(u64::MAX)
}

/// What one worker reports; each mode fills what it measures.
#[derive(Default)]
pub struct Report {
    pub acquisitions: u64,
    pub attempts: u64,
    pub acquire_errors: u64,
    pub release_errors: u64,
    /// How late the worker was ready for the start (zero when on time).
    pub late: Duration,
    pub waits: Samples,
    /// Hot key: its grants, in its own order of acquisition.
    pub grants: Vec<Grant>,
    /// Semaphore: the longest time the process had a waiter and no grant.
    pub drought: Duration,
    /// Election: its leads, in its own order.
    pub leads: Vec<Lead>,
    pub first_error: Option<String>,
}

impl Report {
    fn line(&self) -> String {
        let list = |items: Vec<String>| items.join(",");
        let mut line = format!(
            "{REPORT} acquisitions={} attempts={} acquire_errors={} release_errors={} \
             late_ns={} drought_ns={} waits_ns={} grants={} leads={}",
            self.acquisitions,
            self.attempts,
            self.acquire_errors,
            self.release_errors,
            self.late.as_nanos(),
            self.drought.as_nanos(),
            list(self.waits.nanos().iter().map(u64::to_string).collect()),
            list(
                self.grants
                    .iter()
                    .map(|g| match g.ticket {
                        Some(ticket) => format!("{}:{ticket}", g.token),
                        None => format!("{}:-", g.token),
                    })
                    .collect()
            ),
            list(
                self.leads
                    .iter()
                    .map(|l| format!(
                        "{}:{}:{}:{}",
                        l.term,
                        l.granted,
                        l.ended,
                        if l.at_will { "w" } else { "e" }
                    ))
                    .collect()
            ),
        );
        if let Some(err) = &self.first_error {
            // Last, as the rest of the line: it may hold spaces.
            let _ = write!(line, " first_error={}", err.replace('\n', " "));
        }
        line
    }

    fn parse(stdout: &str) -> Result<Report, String> {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(REPORT))
            .ok_or_else(|| format!("no `{REPORT}` line in the worker's output {stdout:?}"))?;
        let (fields, first_error) = match line.split_once(" first_error=") {
            Some((fields, err)) => (fields, Some(err.to_owned())),
            None => (line, None),
        };
        let mut r = Report {
            first_error,
            ..Report::default()
        };
        for field in fields.split_whitespace() {
            let (name, value) = field
                .split_once('=')
                .ok_or_else(|| format!("cannot read {field:?}"))?;
            let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{field:?}: {e}"));
            let items = value.split(',').filter(|w| !w.is_empty());
            match name {
                "acquisitions" => r.acquisitions = number(value)?,
                "attempts" => r.attempts = number(value)?,
                "acquire_errors" => r.acquire_errors = number(value)?,
                "release_errors" => r.release_errors = number(value)?,
                "late_ns" => r.late = Duration::from_nanos(number(value)?),
                "drought_ns" => r.drought = Duration::from_nanos(number(value)?),
                "waits_ns" => {
                    for wait in items {
                        r.waits.push(Duration::from_nanos(number(wait)?));
                    }
                }
                "grants" => {
                    for grant in items {
                        r.grants.push(parse_grant(grant)?);
                    }
                }
                "leads" => {
                    for lead in items {
                        r.leads.push(parse_lead(lead)?);
                    }
                }
                _ => {}
            }
        }
        Ok(r)
    }
}

/// `fencing_token:ticket`, the ticket `-` when the grant waited on none.
fn parse_grant(grant: &str) -> Result<Grant, String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot read the grant {grant:?}: {e}");
    let (token, ticket) = grant.split_once(':').ok_or_else(|| fail(&"no `:`"))?;
    Ok(Grant {
        token: token.parse().map_err(|e| fail(&e))?,
        ticket: match ticket {
            "-" => None,
            t => Some(t.parse().map_err(|e| fail(&e))?),
        },
    })
}

/// `term:granted_ns:ended_ns:w` (resigned at will) or `...:e` (at the round's end).
fn parse_lead(lead: &str) -> Result<Lead, String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot read the lead {lead:?}: {e}");
    let &[term, granted, ended, how] = lead.split(':').collect::<Vec<_>>().as_slice() else {
        return Err(fail(&"not four fields"));
    };
    Ok(Lead {
        term: term.parse().map_err(|e| fail(&e))?,
        granted: granted.parse().map_err(|e| fail(&e))?,
        ended: ended.parse().map_err(|e| fail(&e))?,
        at_will: how == "w",
    })
}

/// One round: `processes` workers doing `job` (its table must exist), started together;
/// their reports in spawn order. Returns once all have exited.
pub async fn round(url: &str, job: &Job, processes: usize) -> Result<Vec<Report>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let job = Job {
        start: SystemTime::now() + START_AFTER,
        ..job.clone()
    };
    let mut children = Vec::with_capacity(processes);
    for _ in 0..processes {
        let child = tokio::process::Command::new(&exe)
            .env(WORKER_ENV, job.encode())
            .env(WORKER_URL_ENV, url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a worker ({}): {e}", exe.display()))?;
        children.push(child);
    }
    let limit = START_AFTER + job.length + Duration::from_secs(30);
    let outputs = tokio::time::timeout(
        limit,
        futures::future::join_all(children.into_iter().map(|c| c.wait_with_output())),
    )
    .await
    .map_err(|_| format!("the workers did not finish within {limit:?}"))?;
    let mut reports = Vec::with_capacity(processes);
    for output in outputs {
        let output = output.map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!("a worker failed ({})", output.status));
        }
        reports.push(Report::parse(&String::from_utf8_lossy(&output.stdout))?);
    }
    Ok(reports)
}
