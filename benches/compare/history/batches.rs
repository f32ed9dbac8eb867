//! Cell 8.2: one recording Locker takes 10,000 guards, holds them (renewed) for five
//! ticks, then drops them all; the history statements it sends in each phase
//! (`stats().history_batches`, counted as sent) against the ticks the phase lasted.

use std::fmt::Write as _;
use std::time::Duration;

use dblock::{LockGuard, Locker, Stats};
use futures::StreamExt as _;
use tokio::time::Instant;

use crate::report::{Table, verdict};
use crate::servers::{BenchDb, POOL_SIZE, Server};

const TABLE: &str = "bench_lock_history_held";
const GUARDS: usize = 10_000;
const LEASE: Duration = Duration::from_secs(30);
const HELD_TICKS: u32 = 5;
/// Bound on waiting for every event of a phase to be written.
const PATIENCE: Duration = Duration::from_secs(60);

pub async fn markdown<DB: BenchDb>(server: &Server<DB>) -> String {
    let mut out = format!(
        "#### 8.2 History statements a tick, {GUARDS} guards\n\n\
         One Locker with `history(1 h)` and `renew_interval(1 s)` takes {GUARDS} locks \
         ({POOL_SIZE} at a time), holds them {HELD_TICKS} ticks, then drops every guard \
         (the engine releases them in batches). A phase ends when all its events are \
         written. Target: at most one history statement a tick \
         ({:?}).\n\n",
        dblock::HISTORY_FLUSH_INTERVAL
    );
    match run(server).await {
        Ok(table) => out.push_str(&table),
        Err(e) => {
            let _ = writeln!(out, "Not measured: {e}\n");
        }
    }
    if let Err(e) = DB::drop_lock_table(&server.pool, TABLE).await {
        let _ = writeln!(out, "(could not drop {TABLE}: {e})\n");
    }
    out
}

async fn run<DB: BenchDb>(server: &Server<DB>) -> Result<String, Box<dyn std::error::Error>> {
    eprintln!("history: {}, {GUARDS} guards", server.label);
    let locker = server
        .fresh_locker_with(TABLE, |b| {
            b.history(Duration::from_secs(3600))
                .renew_interval(Duration::from_secs(1))
        })
        .await?;
    let mut table = Table::new(&[
        "phase",
        "events",
        "statements",
        "ticks",
        "per tick",
        "target",
    ]);
    let mut phase = |name: &str, from: Stats, to: Stats, took: Duration| {
        let statements = to.history_batches - from.history_batches;
        let ticks = (took.as_secs_f64() / dblock::HISTORY_FLUSH_INTERVAL.as_secs_f64()).ceil();
        let ticks = ticks.max(1.0);
        table.row(vec![
            name.to_owned(),
            (to.history_events - from.history_events).to_string(),
            statements.to_string(),
            format!("{ticks:.0}"),
            format!("{:.2}", statements as f64 / ticks),
            verdict(statements as f64 <= ticks).to_owned(),
        ]);
    };

    let (start, started) = (locker.stats(), Instant::now());
    let mut held: Vec<LockGuard<DB>> = Vec::with_capacity(GUARDS);
    let mut acquisitions = futures::stream::iter(0..GUARDS)
        .map(|i| {
            let locker = locker.clone();
            async move { locker.try_acquire(&format!("held:{i}"), LEASE).await }
        })
        .buffer_unordered(POOL_SIZE as usize);
    while let Some(r) = acquisitions.next().await {
        if let Some(guard) = r? {
            held.push(guard);
        }
    }
    drop(acquisitions);
    let acquired = held.len() as u64;
    written(&locker, start.history_events + acquired).await?;
    let (taken, taken_at) = (locker.stats(), Instant::now());
    phase("acquire and write", start, taken, taken_at - started);

    tokio::time::sleep(dblock::HISTORY_FLUSH_INTERVAL * HELD_TICKS).await;
    let (holding, held_until) = (locker.stats(), Instant::now());
    phase("hold (renewed)", taken, holding, held_until - taken_at);

    drop(held);
    written(&locker, holding.history_events + acquired).await?;
    let released = locker.stats();
    phase("drop and write", holding, released, held_until.elapsed());
    locker.shutdown().await;
    Ok(format!(
        "{}\nEvents dropped: {}; renewal batches meanwhile: {}.\n\n",
        table.render(),
        released.history_dropped,
        released.renewals - start.renewals
    ))
}

/// Waits until `locker` has written `events` events in all.
async fn written<DB: BenchDb>(locker: &Locker<DB>, events: u64) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while locker.stats().history_events < events {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {events} events written after {PATIENCE:?}",
                locker.stats().history_events
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
