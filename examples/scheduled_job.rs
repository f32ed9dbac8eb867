//! A scheduled job run by several nodes, exactly once per one-second period, on embedded
//! SQLite, with `Locker::schedule`.
//!
//! `cargo run --example scheduled_job [-- --nodes 4 --ticks 8]`
//!
//! Every node (a task with a pool of its own, standing in for a process) starts its
//! schedule up to 300 ms late and runs `locker.schedule("nightly-report", 1 s).run(..)`;
//! the work (50 ms) records its period's number. Which period it is comes from the
//! database clock, and each period's row stays held until after the period's end, so a
//! node waking late in a period skips it. Once `--ticks` periods have run, the nodes stop
//! and the example checks that no period ran more than once (it exits non-zero if one
//! did), and that no period between the first and the last was left out.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use dblock::Locker;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tokio::sync::mpsc;
use tokio::time::sleep;

/// Nodes running one scheduled job.
#[derive(Parser)]
struct Options {
    /// How many nodes run the job.
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// How many one-second periods to run.
    #[arg(long, default_value_t = 8)]
    ticks: u32,
}

const PERIOD: Duration = Duration::from_secs(1);
const JOB: Duration = Duration::from_millis(50);

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
        "{} nodes, {} one-second periods, each node starting up to 300 ms late",
        options.nodes, options.ticks
    );

    let (ran, mut periods) = mpsc::unbounded_channel();
    let mut handles = Vec::new();
    for (node, locker) in nodes.iter().enumerate() {
        // A node's start (and so its first wake-up) is up to 300 ms late.
        sleep(Duration::from_millis(fastrand::u64(0..=300))).await;
        let ran = ran.clone();
        let handle = locker
            .schedule("nightly-report", PERIOD)
            .run(move |period| {
                let ran = ran.clone();
                async move {
                    sleep(JOB).await; // the job's own work
                    ran.send((period.number, node)).ok();
                    Ok::<_, dblock::Error>(())
                }
            })?;
        handles.push(handle);
    }
    drop(ran);

    // Who ran each period, until `ticks` periods have run.
    let mut runs: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    while runs.len() < options.ticks as usize {
        let (period, node) = periods.recv().await.expect("the nodes run");
        runs.entry(period).or_default().push(node);
    }
    for (node, handle) in handles.into_iter().enumerate() {
        let stats = handle.stop().await; // waits for a run in progress
        println!(
            "node {node}: {} runs, {} skips, {} missed",
            stats.runs, stats.skips, stats.missed
        );
    }
    // Runs that ended while the nodes stopped.
    while let Some((period, node)) = periods.recv().await {
        runs.entry(period).or_default().push(node);
    }
    for locker in &nodes {
        locker.shutdown().await;
        locker.pool().close().await;
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
    }

    for (period, nodes) in &runs {
        println!("period {period}: run by node(s) {nodes:?}");
    }
    let (first, last) = (runs.keys().next().unwrap(), runs.keys().last().unwrap());
    let left_out: Vec<i64> = (*first..=*last).filter(|p| !runs.contains_key(p)).collect();
    if !left_out.is_empty() {
        // Only a node asleep through a whole period (a stall over a second) leaves one
        // out: nobody was awake to run it.
        println!("periods no node woke up in: {left_out:?}");
    }
    if runs.values().any(|nodes| nodes.len() != 1) {
        return Err("a period ran more than once".into());
    }
    println!("exactly once per period");
    Ok(())
}
