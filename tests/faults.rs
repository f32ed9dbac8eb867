//! The fault-injection and abuse suite: `cargo test --test faults`.
//!
//! It starts what it breaks: private PostgreSQL and MariaDB servers from the installed
//! binaries (never the shared ones), holder processes (this binary started again in a
//! holder role), a TCP proxy that cuts, delays or drops traffic, and libfaketime for
//! skewed client clocks. SQLite runs where a scenario means something for it.
//!
//! The scenarios run one after another (they measure timings on a two-core machine and
//! restart servers), each under a time limit, and a failing one does not stop the others.
//! A summary table is printed at the end; the process exits non-zero if any failed.
//! Arguments that do not start with `-` select scenarios whose name contains them.
//!
//! Outside CI, a backend whose server binaries (or a scenario whose `faketime`) are not
//! installed is skipped with the reason; with `CI` set, or the backend named in
//! `DBLOCK_TEST_REQUIRE`, that is a failure. The run's first lines (preflight.rs) name
//! the selected groups that will be skipped, or fail, for that, and why. Group 11 runs PostgreSQL under Patroni (with
//! etcd and HAProxy, private processes too); it is named `patroni` there. Group 10 runs a
//! three-node MariaDB Galera cluster (galera-4, rsync); it is named `galera` there.
//! Group 12 (`partition`) black-holes holders at random phases of their renewal (200
//! trials a backend) and holds acquisitions' answers past their leases (issue 42).

use std::error::Error;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::Duration;

use dblock::{LockGuard, Locker, MySql, Postgres, Sqlite};
use futures::FutureExt;
use sqlx::Pool;
use sqlx::pool::PoolOptions;
use tokio::time::{Instant, sleep};

/// What scenarios and helpers return; failures are messages for the summary.
pub type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Fails the scenario with a message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+).into());
        }
    };
}

// The crate root is a file, so its modules are found in tests/; they live in tests/faults/.
#[path = "faults/abuse.rs"]
mod abuse;
#[path = "faults/async_failover.rs"]
mod async_failover;
#[path = "faults/db.rs"]
mod db;
#[path = "faults/failover.rs"]
mod failover;
#[path = "faults/galera.rs"]
mod galera;
#[path = "faults/galera_contention.rs"]
mod galera_contention;
#[path = "faults/galera_faults.rs"]
mod galera_faults;
#[path = "faults/galera_migrate.rs"]
mod galera_migrate;
#[path = "faults/galera_scenarios.rs"]
mod galera_scenarios;
#[path = "faults/galera_stale.rs"]
mod galera_stale;
#[path = "faults/holder.rs"]
mod holder;
#[path = "faults/kill.rs"]
mod kill;
#[path = "faults/no_connection.rs"]
mod no_connection;
#[path = "faults/outage.rs"]
mod outage;
#[path = "faults/partition.rs"]
mod partition;
#[path = "faults/partition_late.rs"]
mod partition_late;
#[path = "faults/patroni.rs"]
mod patroni;
#[path = "faults/patroni_config.rs"]
mod patroni_config;
#[path = "faults/patroni_election.rs"]
mod patroni_election;
#[path = "faults/patroni_io.rs"]
mod patroni_io;
#[path = "faults/patroni_scenarios.rs"]
mod patroni_scenarios;
#[path = "faults/pause.rs"]
mod pause;
#[path = "faults/pool.rs"]
mod pool;
#[path = "faults/preflight.rs"]
mod preflight;
#[path = "faults/primitives.rs"]
mod primitives;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "faults/relaxed.rs"]
mod relaxed;
#[path = "faults/replica.rs"]
mod replica;
#[path = "faults/report.rs"]
mod report;
#[path = "faults/restart.rs"]
mod restart;
#[path = "faults/semisync.rs"]
mod semisync;
#[path = "faults/server.rs"]
mod server;
#[path = "faults/skew.rs"]
mod skew;
#[path = "common/standalone.rs"]
mod standalone;

use db::FaultDb;
use report::{Outcome, Report, Row};
use server::{Kind, Server};

/// The longest any one scenario may take before it counts as hung.
const SCENARIO_LIMIT: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    if std::env::var_os(holder::ROLE_ENV).is_some() {
        return holder::child_main();
    }
    let Some(filter) = standalone::selection("faults") else {
        return ExitCode::SUCCESS;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = Instant::now();
    let report = Report::default();
    runtime.block_on(run_all(&report, &filter));
    // Holder processes and servers are gone with their handles; stray tasks go here.
    runtime.shutdown_timeout(Duration::from_secs(5));
    if report.print(started.elapsed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Everything a scenario gets for one backend.
pub struct Ctx<DB: FaultDb> {
    /// A direct URL (holder processes connect with it).
    pub url: String,
    /// A direct pool, for the suite's own rival and observer.
    pub pool: Pool<DB>,
    /// A locker on `pool`, default table, renewal on.
    pub locker: Locker<DB>,
    /// The private server, for restarts; `None` for SQLite.
    pub server: Option<Server>,
}

impl<DB: FaultDb> Ctx<DB> {
    async fn new(url: String, server: Option<Server>) -> Res<Ctx<DB>> {
        let pool = PoolOptions::<DB>::new()
            .max_connections(8)
            .connect(&url)
            .await?;
        let locker = Locker::new(pool.clone());
        locker.migrate().await?;
        DB::reset_resource(&pool).await?;
        Ok(Ctx {
            url,
            pool,
            locker,
            server,
        })
    }

    /// Whether this backend talks to a server over TCP (the proxy and restarts apply).
    pub fn networked(&self) -> bool {
        self.server.is_some()
    }
}

/// Which scenarios run, by name.
pub struct Selection<'a> {
    filter: &'a [String],
}

impl Selection<'_> {
    fn wants(&self, scenario: &str) -> bool {
        self.filter.is_empty() || self.filter.iter().any(|f| scenario.contains(f.as_str()))
    }
}

/// The scenarios (groups for 4 and 5) in the order they run: the rows reported for a
/// backend whose server could not be had.
const SCENARIOS: &[&str] = &[
    kill::NAME,
    pause::NAME,
    restart::NAME,
    relaxed::NAME,
    outage::NAME,
    skew::NAME,
    pool::NAME,
    no_connection::NAME,
    abuse::NAME,
    primitives::PERMIT_KILLED,
    primitives::LEADER_KILLED,
    primitives::LEADER_PAUSED,
    primitives::LEADER_RESIGNS,
    failover::NAME,
    partition::NAME,
];

async fn run_all(report: &Report, filter: &[String]) {
    let selection = Selection { filter };
    // What will be skipped, said before the servers start: the summary comes much later.
    preflight::print(&selection);
    let scratch = std::env::temp_dir().join(format!("dblock-faults-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch directory");

    let (pg, mariadb) = tokio::join!(
        start_server(Kind::Postgres, "postgres"),
        start_server(Kind::MariaDb, "mysql")
    );
    match pg {
        Ok(server) => {
            let url = server.url().to_owned();
            match Ctx::<Postgres>::new(url, Some(server)).await {
                Ok(mut ctx) => track(&mut ctx, report, &selection).await,
                Err(err) => unavailable(report, &selection, Postgres::LABEL, err.to_string(), true),
            }
        }
        Err((reason, required)) => {
            unavailable(report, &selection, Postgres::LABEL, reason, required)
        }
    }
    // Group 11: PostgreSQL again, as a Patroni cluster of its own (patroni.rs).
    patroni_scenarios::run_all(report, &selection).await;
    match mariadb {
        Ok(server) => {
            let url = server.url().to_owned();
            match Ctx::<MySql>::new(url, Some(server)).await {
                Ok(mut ctx) => track(&mut ctx, report, &selection).await,
                Err(err) => unavailable(report, &selection, MySql::LABEL, err.to_string(), true),
            }
        }
        Err((reason, required)) => unavailable(report, &selection, MySql::LABEL, reason, required),
    }
    // Group 10: a three-node Galera cluster of its own (galera_scenarios.rs).
    galera_scenarios::run_all(report, &selection).await;
    let file = scratch.join("locks.db");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    match Ctx::<Sqlite>::new(url, None).await {
        Ok(mut ctx) => track(&mut ctx, report, &selection).await,
        Err(err) => unavailable(report, &selection, Sqlite::LABEL, err.to_string(), true),
    }
    std::fs::remove_dir_all(&scratch).ok();
}

/// Starts a private server, or says why not and whether that is a failure.
async fn start_server(kind: Kind, require_name: &str) -> Result<Server, (String, bool)> {
    let required = required(require_name);
    if !Server::installed(kind) {
        return Err((not_installed(kind), required));
    }
    Server::start(kind)
        .await
        .map_err(|err| (format!("{kind:?} did not start: {err}"), true))
}

/// Why a backend's track cannot run here.
pub fn not_installed(kind: Kind) -> String {
    format!("{kind:?} binaries are not installed")
}

/// Whether a missing `what` (a backend or tool) fails the run instead of skipping.
pub fn required(what: &str) -> bool {
    std::env::var_os("CI").is_some()
        || std::env::var("DBLOCK_TEST_REQUIRE")
            .is_ok_and(|r| r.split(',').any(|n| n.trim() == what))
}

fn unavailable(
    report: &Report,
    selection: &Selection<'_>,
    backend: &'static str,
    reason: String,
    required: bool,
) {
    unavailable_rows(report, selection, SCENARIOS, backend, reason, required);
}

/// A row for each of `scenarios` selected: failed if `required`, else skipped.
pub fn unavailable_rows(
    report: &Report,
    selection: &Selection<'_>,
    scenarios: &[&str],
    backend: &'static str,
    reason: String,
    required: bool,
) {
    for scenario in scenarios.iter().filter(|s| selection.wants(s)) {
        report.add(Row {
            scenario: (*scenario).to_owned(),
            backend,
            outcome: if required {
                Outcome::Fail
            } else {
                Outcome::Skip
            },
            detail: reason.clone(),
            took: Duration::ZERO,
        });
    }
}

/// Every scenario on one backend, in order.
async fn track<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    scenario(ctx, report, selection, kill::NAME, kill::run).await;
    scenario(ctx, report, selection, pause::NAME, pause::run).await;
    scenario(ctx, report, selection, restart::NAME, restart::run).await;
    scenario(ctx, report, selection, relaxed::NAME, relaxed::run).await;
    outage::run_all(ctx, report, selection).await;
    skew::run_all(ctx, report, selection).await;
    scenario(ctx, report, selection, pool::NAME, pool::run).await;
    scenario(
        ctx,
        report,
        selection,
        no_connection::NAME,
        no_connection::run,
    )
    .await;
    scenario(ctx, report, selection, abuse::NAME, abuse::run).await;
    primitives::run_all(ctx, report, selection).await;
    failover::run_all(ctx, report, selection).await;
    partition::run_all(ctx, report, selection).await;
}

/// Runs one scenario under the time limit, catching panics, and records its row.
/// Scenarios that do not apply to a backend return [`NotApplicable`].
pub async fn scenario<DB, F>(
    ctx: &mut Ctx<DB>,
    report: &Report,
    selection: &Selection<'_>,
    name: &str,
    body: F,
) where
    DB: FaultDb,
    F: AsyncFnOnce(&mut Ctx<DB>) -> Res<String>,
{
    scenario_on(ctx, report, selection, name, DB::LABEL, body).await;
}

/// [`scenario`] with the row's backend named by the caller (a cluster of that backend's
/// servers, say).
pub async fn scenario_on<DB, F>(
    ctx: &mut Ctx<DB>,
    report: &Report,
    selection: &Selection<'_>,
    name: &str,
    backend: &'static str,
    body: F,
) where
    DB: FaultDb,
    F: AsyncFnOnce(&mut Ctx<DB>) -> Res<String>,
{
    if !selection.wants(name) {
        return;
    }
    let started = Instant::now();
    let outcome =
        tokio::time::timeout(SCENARIO_LIMIT, AssertUnwindSafe(body(ctx)).catch_unwind()).await;
    let (outcome, detail) = match outcome {
        Err(_) => (
            Outcome::Fail,
            format!("hung: no result within {SCENARIO_LIMIT:?}"),
        ),
        Ok(Err(panic)) => (
            Outcome::Fail,
            format!("panicked: {}", panic_message(&panic)),
        ),
        Ok(Ok(Ok(figures))) => (Outcome::Pass, figures),
        Ok(Ok(Err(err))) => match err.downcast::<NotApplicable>() {
            Ok(na) => (Outcome::NotApplicable, na.0.to_owned()),
            Err(err) => match err.downcast::<Skipped>() {
                Ok(skip) => (Outcome::Skip, skip.0.clone()),
                Err(err) => (Outcome::Fail, err.to_string()),
            },
        },
    };
    report.add(Row {
        scenario: name.to_owned(),
        backend,
        outcome,
        detail,
        took: started.elapsed(),
    });
}

/// A scenario that means nothing for this backend (the reason is printed).
#[derive(Debug)]
pub struct NotApplicable(pub &'static str);

impl std::fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Error for NotApplicable {}

/// A scenario that could not run here (a tool is missing outside CI).
#[derive(Debug)]
pub struct Skipped(pub String);

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Skipped {}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".to_owned())
}

// ---- helpers shared by the scenarios ------------------------------------------------

/// How long a holder process may take to start and acquire on a busy machine.
pub const HOLDER_START: Duration = Duration::from_secs(20);

/// Polls `try_acquire` every 10 ms until it wins or `until` passes. Returns the guard
/// with the instant and the wall clock (µs) at which the win was seen.
pub async fn take_over<DB: FaultDb>(
    locker: &Locker<DB>,
    key: &str,
    lease: Duration,
    until: Instant,
) -> Res<(LockGuard<DB>, Instant, i64)> {
    loop {
        if let Some(guard) = locker.try_acquire(key, lease).await? {
            return Ok((guard, Instant::now(), holder::wall_micros()));
        }
        ensure!(
            Instant::now() < until,
            "{key:?} could not be taken over in time"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the guard's expiry moves (a renewal landed), polling every 5 ms.
pub async fn renewed<DB: FaultDb>(guard: &LockGuard<DB>, within: Duration) -> Res<Instant> {
    let before = guard.expires_at();
    let until = Instant::now() + within;
    while guard.expires_at() == before {
        ensure!(
            Instant::now() < until,
            "no renewal of {:?} within {within:?} (lost: {:?})",
            guard.key(),
            guard.lost_reason()
        );
        sleep(Duration::from_millis(5)).await;
    }
    Ok(Instant::now())
}

/// Polls `check` every 20 ms until it returns true; fails after `within`.
pub async fn eventually<F>(what: &str, within: Duration, mut check: F) -> Res<Duration>
where
    F: AsyncFnMut() -> Res<bool>,
{
    let started = Instant::now();
    loop {
        if check().await? {
            return Ok(started.elapsed());
        }
        ensure!(started.elapsed() < within, "{what}: not within {within:?}");
        sleep(Duration::from_millis(20)).await;
    }
}
