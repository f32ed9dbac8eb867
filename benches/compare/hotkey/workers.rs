//! The worker processes of section 3's cells 3.2 and 3.4: two real OS processes x 4
//! tasks on one hot key, each process with its own Locker and pool.
//!
//! The bench re-executes itself (`std::env::current_exe()`) as two workers. A worker is
//! told what to do by [`WORKER_ENV`] (`table key tasks duration_ms start_unix_ms mode`,
//! mode `default` or `fair`; the server URL comes apart in [`WORKER_URL_ENV`], so a
//! password never shows in a process list), which `main` checks before it reads any flag.
//! Each worker connects (a pool of [`POOL_SIZE`] named as the bench's dedicated pools, so
//! [`BenchDb::await_sessions_gone`] sees its sessions), opens its connections, sleeps
//! until the absolute start time both were given, runs the loop of cell 1 (`acquire`,
//! hold 2 ms, `release`) for the round's length, shuts its Locker down and closes its
//! pool, and prints one line on stdout (`hotkey-worker key=value ...`, waits as
//! nanoseconds, grants as `fencing_token:ticket`) that the parent reads. Cell 2
//! ([`procs`](super::procs)) and cell 4 ([`fair`](super::fair)) run them through
//! [`round`].

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dblock::Locker;
use sqlx::{MySql, Pool, Postgres};
use tokio::time::Instant;

use super::tasks::{Grant, Side, contend};
use crate::measure::Samples;
use crate::servers::{BenchDb, POOL_SIZE};

/// Set (to the job) in a worker's environment only.
pub const WORKER_ENV: &str = "DBLOCK_HOTKEY_WORKER";
pub const WORKER_URL_ENV: &str = "DBLOCK_HOTKEY_WORKER_URL";
/// The first word of a worker's report line.
const REPORT: &str = "hotkey-worker";

pub const PROCESSES: usize = 2;
pub const TASKS_PER_PROCESS: usize = 4;
/// Time for both workers to start, connect and open their connections before the start.
const START_AFTER: Duration = Duration::from_millis(2000);

/// How a worker's Locker waits: dblock's default, or fair mode (tickets).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Default,
    Fair,
}

impl Mode {
    /// Its word in the job.
    fn word(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::Fair => "fair",
        }
    }
}

/// What one worker reports.
#[derive(Default)]
pub struct Report {
    pub acquisitions: u64,
    pub attempts: u64,
    pub acquire_errors: u64,
    pub release_errors: u64,
    /// How late the worker was ready for the start (zero when on time).
    pub late: Duration,
    pub waits: Samples,
    /// Its grants, in its own order of acquisition.
    pub grants: Vec<Grant>,
    pub first_error: Option<String>,
}

/// Runs as a worker if this process was started as one: returns `false` at once when it
/// was not, and does not return (exits) when it was.
pub async fn worker_if_asked() -> bool {
    let Ok(job) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let url = std::env::var(WORKER_URL_ENV).unwrap_or_default();
    let outcome = if url.starts_with("postgres") {
        match Postgres::dedicated_pool(&url, POOL_SIZE).await {
            Ok(pool) => worker(pool, &job).await,
            Err(e) => Err(e.to_string()),
        }
    } else {
        match MySql::dedicated_pool(&url, POOL_SIZE).await {
            Ok(pool) => worker(pool, &job).await,
            Err(e) => Err(e.to_string()),
        }
    };
    match outcome {
        Ok(line) => {
            println!("{line}");
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("compare: hot-key worker: {e}");
            std::process::exit(1);
        }
    }
}

/// One worker's run; its report line.
async fn worker<DB: BenchDb>(pool: Pool<DB>, job: &str) -> Result<String, String> {
    let words: Vec<&str> = job.split_whitespace().collect();
    let &[table, key, tasks, duration_ms, start_ms, mode] = words.as_slice() else {
        return Err(format!("cannot read the job {job:?}"));
    };
    let fair = match mode {
        "fair" => true,
        "default" => false,
        _ => return Err(format!("unknown mode {mode:?} in the job {job:?}")),
    };
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let tasks = usize::try_from(number(tasks)?).map_err(|e| e.to_string())?;
    let length = Duration::from_millis(number(duration_ms)?);
    let start = UNIX_EPOCH + Duration::from_millis(number(start_ms)?);

    let locker = Locker::builder(pool.clone())
        .table(table)
        .fair(fair)
        .build()
        .map_err(|e| e.to_string())?;
    // Open the connections the tasks will use before the start, not inside the round.
    let mut open = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        open.push(pool.acquire().await.map_err(|e| e.to_string())?);
    }
    drop(open);
    let late = match start.duration_since(SystemTime::now()) {
        Ok(until) => {
            tokio::time::sleep(until).await;
            Duration::ZERO
        }
        Err(passed) => passed.duration(),
    };
    let side = Arc::new(Side::Dblock(locker.clone()));
    let done = contend(&side, key, tasks, Instant::now() + length).await;
    // The round's end cancelled the waiting acquires; let their background work (fair
    // mode: deleting their tickets) finish, and end the sessions, before reporting.
    let _ = tokio::time::timeout(Duration::from_secs(10), locker.shutdown()).await;
    pool.close().await;
    let waits: Vec<String> = done
        .turns
        .iter()
        .map(|t| t.waited.as_nanos().to_string())
        .collect();
    let grants: Vec<String> = done
        .turns
        .iter()
        .map(|t| match t.grant.ticket {
            Some(ticket) => format!("{}:{ticket}", t.grant.token),
            None => format!("{}:-", t.grant.token),
        })
        .collect();
    let mut line = format!(
        "{REPORT} acquisitions={} attempts={} acquire_errors={} release_errors={} late_ns={} \
         waits_ns={} grants={}",
        done.turns.len(),
        side.attempts(),
        done.acquire_errors,
        done.release_errors,
        late.as_nanos(),
        waits.join(","),
        grants.join(","),
    );
    if let Some(err) = done.first_error {
        // Last, as the rest of the line: it may hold spaces.
        let _ = write!(line, " first_error={}", err.replace('\n', " "));
    }
    Ok(line)
}

impl Report {
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
            match name {
                "acquisitions" => r.acquisitions = number(value)?,
                "attempts" => r.attempts = number(value)?,
                "acquire_errors" => r.acquire_errors = number(value)?,
                "release_errors" => r.release_errors = number(value)?,
                "late_ns" => r.late = Duration::from_nanos(number(value)?),
                "waits_ns" => {
                    for wait in value.split(',').filter(|w| !w.is_empty()) {
                        r.waits.push(Duration::from_nanos(number(wait)?));
                    }
                }
                "grants" => {
                    for grant in value.split(',').filter(|g| !g.is_empty()) {
                        r.grants.push(parse_grant(grant)?);
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

/// One round: both workers on `key` of `table` (which must exist), their Lockers in
/// `mode`, started together; their reports in spawn order. Returns once both have exited.
pub async fn round(
    url: &str,
    table: &str,
    key: &str,
    length: Duration,
    mode: Mode,
) -> Result<Vec<Report>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let start = SystemTime::now() + START_AFTER;
    let start_ms = start
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis();
    let job = format!(
        "{table} {key} {TASKS_PER_PROCESS} {} {start_ms} {}",
        length.as_millis(),
        mode.word(),
    );
    let mut children = Vec::with_capacity(PROCESSES);
    for _ in 0..PROCESSES {
        let child = tokio::process::Command::new(&exe)
            .env(WORKER_ENV, &job)
            .env(WORKER_URL_ENV, url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a worker ({}): {e}", exe.display()))?;
        children.push(child);
    }
    let limit = START_AFTER + length + Duration::from_secs(30);
    let outputs = tokio::time::timeout(
        limit,
        futures::future::join_all(children.into_iter().map(|c| c.wait_with_output())),
    )
    .await
    .map_err(|_| format!("the workers did not finish within {limit:?}"))?;
    let mut reports = Vec::with_capacity(PROCESSES);
    for output in outputs {
        let output = output.map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!("a worker failed ({})", output.status));
        }
        reports.push(Report::parse(&String::from_utf8_lossy(&output.stdout))?);
    }
    Ok(reports)
}
