//! dblock's benchmark: `cargo bench --bench compare` (see `-- --help`).
//!
//! A plain binary rather than a criterion suite: every comparison here must run its
//! contenders in alternating rounds within one run, because figures on a small shared
//! machine are not comparable across minutes. It writes `bench/RESULTS.md` and prints it.
//!
//! It reads one way down, as `src/` does (tests/architecture.rs checks it: no import
//! circle, no module importing from a layer above its own):
//!
//! 1. this file: flags, servers, the sections in the report's order, the page;
//! 2. one folder per section of the report: `cycle` (sections 1 and 2), `hotkey` (3),
//!    `stock` (4), `renewal` (5), `reaper` (6), `primitives` (7), `history` (8), `console`
//!    (9, with the cargo feature `web`); each folder's `mod.rs`
//!    runs its cells in the report's order;
//! 3. the cells, one file each (`hotkey/contended.rs` for cells 3.1 and 3.1b, ...), and
//!    the contenders and helpers they are built from (`hotkey/queue.rs`, ...);
//! 4. what a section's cells share (`cycle/comparison.rs`, `hotkey/round.rs`,
//!    `hotkey/tasks.rs`);
//! 5. what every section shares: `servers` (connections and the bench's own SQL, a file
//!    per database), `handwritten` (the baselines), `contenders` (dblock, its dialect
//!    layer, Redis), `workers` (the worker processes of cells 3.2, 3.4, 7.2 and 7.3: the
//!    bench re-executed, its job and report), the stock example's workload;
//! 6. leaves: `settings` (flags), `measure` (samples, rounds, timed loads), `report`
//!    (markdown), `heap` (a counting allocator), `trace` (keeps the engine's renewal
//!    failures).

#[cfg(feature = "web")]
mod console;
mod contenders;
mod cycle;
mod handwritten;
mod heap;
mod history;
mod hotkey;
mod measure;
mod primitives;
mod reaper;
mod renewal;
mod report;
mod servers;
mod settings;
mod stock;
mod trace;
mod workers;
// The stock example's workload and strategies, shared with the example and its tests.
#[path = "../../examples/stock/mod.rs"]
mod stock_example;

use std::time::{Duration, Instant};

use servers::LockDb;
use settings::{Section, Settings};
use workers::{Job, Mode, Report};

#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

#[tokio::main]
async fn main() {
    // A worker process takes no flags: it runs its job and exits.
    if let Some(asked) = Job::asked() {
        let outcome = match asked {
            Ok((job, url)) => match workers::connect(&url).await {
                Ok(workers::Pools::Postgres(pool)) => work(pool, &job).await,
                Ok(workers::Pools::MySql(pool)) => work(pool, &job).await,
                Ok(workers::Pools::Sqlite(pool)) => work(pool, &job).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        workers::exit_with(outcome);
    }
    let settings = Settings::from_env_and_args();
    trace::install();
    if let Err(drift) = handwritten::check_copies() {
        eprintln!("compare: {drift}");
        std::process::exit(1);
    }
    let started = Instant::now();
    let load_before = load_average();
    let mut notes = Vec::new();

    let pg = match &settings.postgres_url {
        None => None,
        Some(url) => within(CONNECT_TIMEOUT, servers::postgres::connect(url))
            .await
            .map_err(|e| {
                notes.push(format!(
                    "PostgreSQL (DBLOCK_BENCH_POSTGRES_URL) not reachable, skipped: {e}"
                ))
            })
            .ok(),
    };
    let my = match &settings.mysql_url {
        None => None,
        Some(url) => within(CONNECT_TIMEOUT, servers::mysql::connect(url))
            .await
            .map_err(|e| {
                notes.push(format!(
                    "MySQL (DBLOCK_BENCH_MYSQL_URL) not reachable, skipped: {e}"
                ))
            })
            .ok(),
    };
    let redis = match &settings.redis_url {
        None => None,
        Some(url) => within(CONNECT_TIMEOUT, redis_client(url))
            .await
            .map_err(|e| {
                notes.push(format!(
                    "Redis (DBLOCK_BENCH_REDIS_URL) not reachable, skipped: {e}"
                ))
            })
            .ok(),
    };

    // SQLite needs no server: a database file of its own, removed with `_scratch`, for
    // the cells whose worker processes share it.
    let sqlite_cells = settings.runs(Section::HotKey)
        || settings.runs(Section::Primitives)
        || settings.runs(Section::Console);
    let (lite, _scratch) = match &settings.sqlite_dir {
        Some(dir) if sqlite_cells => match servers::sqlite::open(dir).await {
            Ok((server, scratch)) => (Some(server), Some(scratch)),
            Err(e) => {
                notes.push(format!(
                    "SQLite (a file under DBLOCK_BENCH_SQLITE, {}) not opened, skipped: {e}",
                    dir.display()
                ));
                (None, None)
            }
        },
        _ => (None, None),
    };

    let mut body = String::new();
    if settings.runs(Section::Cycle) {
        body.push_str(&cycle::section(&settings, pg.as_ref(), my.as_ref(), redis.as_ref()).await);
    }
    if settings.runs(Section::HotKey) {
        body.push_str(hotkey::INTRO);
        if let Some(pg) = &pg {
            body.push_str(&hotkey::section(&settings, pg).await);
        }
        if let Some(my) = &my {
            body.push_str(&hotkey::section(&settings, my).await);
        }
        if let Some(lite) = &lite {
            body.push_str(&hotkey::file_section(&settings, lite).await);
        }
    }
    if settings.runs(Section::Stock) {
        body.push_str(
            "## 4. Stock deduction: each strategy, helper vs the same SQL by hand\n\n\
             8 workers, one hot product, one unit per order, stock for every order. The \
             helper side is the stock example's own `Shop::run`; the hand-written side \
             sends the statements the helper sends, with the same retry policy. Both sides \
             of a strategy place the same number of orders per run: what their warm-ups \
             managed, on average, in one round's time.\n\n",
        );
        if let Some(pg) = &pg {
            body.push_str(&stock::section(&settings, pg).await);
        }
        if let Some(my) = &my {
            body.push_str(&stock::section(&settings, my).await);
        }
    }
    if settings.runs(Section::Renewal) {
        body.push_str("## 5. Renewal cost: many auto-renewed guards\n\n");
        if let Some(pg) = &pg {
            body.push_str(&renewal::section(&settings, pg).await);
        }
        if let Some(my) = &my {
            body.push_str(&renewal::section(&settings, my).await);
        }
    }
    if settings.runs(Section::Reaper) {
        body.push_str(&format!(
            "## 6. Reaper: deleting {} expired rows\n\n",
            report::count(settings.reap_rows as f64)
        ));
        if let Some(pg) = &pg {
            body.push_str(&reaper::section(&settings, pg).await);
        }
        if let Some(my) = &my {
            body.push_str(&reaper::section(&settings, my).await);
        }
    }
    if settings.runs(Section::Primitives) {
        body.push_str(primitives::INTRO);
        if let Some(pg) = &pg {
            body.push_str(&primitives::section(&settings, pg).await);
        }
        if let Some(my) = &my {
            body.push_str(&primitives::section(&settings, my).await);
        }
        if let Some(lite) = &lite {
            body.push_str(&primitives::file_section(&settings, lite).await);
        }
    }

    if settings.runs(Section::History) {
        body.push_str("## 8. Lock history: its cost on the cycle, and its statements\n\n");
        if let Some(pg) = &pg {
            body.push_str(&history::section(&settings, pg).await);
        }
        if let Some(my) = &my {
            body.push_str(&history::section(&settings, my).await);
        }
    }
    if settings.runs(Section::Console) {
        body.push_str(&console_section(&settings, pg.as_ref(), my.as_ref(), lite.as_ref()).await);
    }

    let preamble = report::Preamble {
        command: command_line(&settings),
        when: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        commit: git_commit(),
        machine: format!(
            "{} cores; load average before: {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_before
        ),
        servers: [
            pg.as_ref().map(|s| s.label.clone()),
            my.as_ref().map(|s| s.label.clone()),
            lite.as_ref().map(|s| s.label.clone()),
            redis.as_ref().map(|_| "Redis".to_owned()),
        ]
        .into_iter()
        .flatten()
        .collect(),
        pool: servers::POOL_SETTINGS_TEXT,
        rounds: settings.rounds,
        round: settings.round,
        notes,
    };
    let page = report::document(&preamble, &body, started.elapsed(), &load_average());
    println!("{page}");
    if let Some(dir) = settings.out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    if let Err(e) = std::fs::write(&settings.out, page) {
        eprintln!("compare: cannot write {}: {e}", settings.out.display());
        std::process::exit(1);
    }
    eprintln!("compare: wrote {}", settings.out.display());
}

/// Section 9 on each server, when the bench is built with the console (feature `web`).
#[cfg(feature = "web")]
async fn console_section(
    settings: &Settings,
    pg: Option<&servers::Server<sqlx::Postgres>>,
    my: Option<&servers::Server<sqlx::MySql>>,
    lite: Option<&servers::Server<sqlx::Sqlite>>,
) -> String {
    let mut body = console::INTRO.to_owned();
    if let Some(pg) = pg {
        body.push_str(&console::section(settings, pg).await);
    }
    if let Some(my) = my {
        body.push_str(&console::section(settings, my).await);
    }
    if let Some(lite) = lite {
        body.push_str(&console::section(settings, lite).await);
    }
    body
}

/// Without the console built in, section 9 says how to build it.
#[cfg(not(feature = "web"))]
async fn console_section(
    _: &Settings,
    _: Option<&servers::Server<sqlx::Postgres>>,
    _: Option<&servers::Server<sqlx::MySql>>,
    _: Option<&servers::Server<sqlx::Sqlite>>,
) -> String {
    "## 9. Console

Not measured: the bench was built without the console \
     (`cargo bench --bench compare --features web`).\n\n"
        .to_owned()
}

/// A worker process's job, run by the section whose mode it is.
async fn work<DB: LockDb>(pool: sqlx::Pool<DB>, job: &Job) -> Result<Report, String> {
    match job.mode {
        Mode::HotKey | Mode::Fair => hotkey::work(pool, job).await,
        Mode::Semaphore | Mode::Election => primitives::work(pool, job).await,
    }
}

/// How long to try to reach a server before skipping it (sqlx keeps retrying a refused
/// connection until its acquire timeout, which is long).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `attempt`'s own error, or a timeout after `limit`, as a message.
async fn within<T, E: std::fmt::Display>(
    limit: Duration,
    attempt: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, attempt).await {
        Ok(outcome) => outcome.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// A Redis client whose server answered a PING.
async fn redis_client(url: &str) -> redis::RedisResult<redis::Client> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: String = redis::cmd("PING").query_async(&mut conn).await?;
    Ok(client)
}

/// The command that reproduces this report: the bench's environment variables (server
/// URLs left out: they may hold passwords) and flags.
fn command_line(settings: &Settings) -> String {
    let mut env: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("DBLOCK_BENCH_") && !k.ends_with("_URL"))
        .map(|(k, v)| format!("{k}={v} "))
        .collect();
    env.sort();
    let mut command = format!("{}cargo bench --bench compare", env.concat());
    if cfg!(feature = "web") {
        // Section 9 needs the console; a run without it says so instead.
        command.push_str(" --features web");
    }
    if !settings.args.is_empty() {
        command.push_str(" -- ");
        command.push_str(&settings.args.join(" "));
    }
    command
}

fn git_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "unknown (no git)".to_owned(),
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{head} with uncommitted changes")
            } else {
                head
            }
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let parts: Vec<&str> = s.split_whitespace().take(3).collect();
            (parts.len() == 3).then(|| parts.join(" "))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}
