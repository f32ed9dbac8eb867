//! A scheduled job run by several nodes, exactly once per tick, on embedded SQLite.
//!
//! `cargo run --example scheduled_job [-- --nodes 4 --ticks 8]`
//!
//! Every node (a task with a pool of its own, standing in for a process) wakes up on each
//! one-second tick, up to 300 ms late, and runs a 50 ms job under
//! `locker.job(key).lock_at_most_for(10 s).lock_at_least_for(650 ms)`. The first node of
//! a tick runs it; the key then stays locked until 650 ms after that acquisition by the
//! database clock, so the late nodes skip. The same run without `lock_at_least_for`
//! follows for comparison: the job ends before the late nodes wake, and they run it
//! again. The example exits non-zero if the first run had a tick that ran other than once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use clap::Parser;
use dblock::{Locker, Sqlite};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tokio::time::{Instant, sleep, sleep_until};

/// Nodes running one scheduled job.
#[derive(Parser)]
struct Options {
    /// How many nodes run the job.
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// How many one-second ticks to run.
    #[arg(long, default_value_t = 8)]
    ticks: u32,
}

const TICK: Duration = Duration::from_secs(1);
const JOB: Duration = Duration::from_millis(50);
/// Longer than the nodes' spread (300 ms), and short enough that the key is free again
/// by the next tick even when the first node of a tick fired 300 ms late.
const AT_LEAST: Duration = Duration::from_millis(650);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    let path = std::env::temp_dir().join(format!("dblock-jobs-{}.db", std::process::id()));
    let mut nodes = Vec::new();
    for _ in 0..options.nodes {
        let connect = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new().connect_with(connect).await?;
        nodes.push(Locker::new(pool));
    }
    nodes[0].migrate().await?;

    println!(
        "{} nodes, {} ticks, each node up to 300 ms late",
        options.nodes, options.ticks
    );
    let with = run(&nodes, options.ticks, Some(AT_LEAST)).await?;
    println!("with lock_at_least_for(650 ms):    runs per tick {with:?}");
    // Let the last tick's minimum hold end before the comparison run.
    sleep(AT_LEAST).await;
    let without = run(&nodes, options.ticks, None).await?;
    println!("without lock_at_least_for:         runs per tick {without:?}");
    std::fs::remove_file(&path).ok();

    if with.iter().any(|&runs| runs != 1) {
        return Err("a tick ran other than exactly once with lock_at_least_for".into());
    }
    println!("exactly once per tick with lock_at_least_for");
    Ok(())
}

/// Runs the nodes for `ticks` ticks; how many times the job ran in each tick.
async fn run(
    nodes: &[Locker<Sqlite>],
    ticks: u32,
    at_least: Option<Duration>,
) -> Result<Vec<u32>, dblock::Error> {
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..ticks).map(|_| AtomicU32::new(0)).collect());
    let start = Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    for locker in nodes {
        let (locker, runs) = (locker.clone(), Arc::clone(&runs));
        tasks.push(tokio::spawn(async move {
            for tick in 0..ticks {
                // A node's timer fires up to 300 ms late.
                let late = Duration::from_millis(fastrand::u64(0..=300));
                sleep_until(start + TICK * tick + late).await;
                let mut job = locker
                    .job("nightly-report")
                    .lock_at_most_for(Duration::from_secs(10));
                if let Some(at_least) = at_least {
                    job = job.lock_at_least_for(at_least);
                }
                let ran = job
                    .run(async |_guard| {
                        sleep(JOB).await; // the job's own work
                        Ok::<_, dblock::Error>(())
                    })
                    .await?;
                if ran.is_some() {
                    runs[tick as usize].fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok::<_, dblock::Error>(())
        }));
    }
    for task in tasks {
        task.await.expect("a node's task")?;
    }
    Ok(runs.iter().map(|r| r.load(Ordering::SeqCst)).collect())
}
