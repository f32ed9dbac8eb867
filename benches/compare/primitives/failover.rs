//! Section 7's failover cell: leader failover in one process, from the leader's stop to
//! the next leader's first fenced write.

use std::time::Duration;

use dblock::Locker;
use tokio::time::Instant;

use crate::measure::median;
use crate::report::{ms_f, verdict};
use crate::servers::{BenchDb, Server};

/// Lease of the failover cell's leader (renewed every third of it).
const FAILOVER_LEASE: Duration = Duration::from_secs(2);
const FAILOVERS: usize = 3;

/// The cell's report line, its elections on `table` (which must exist).
pub async fn line<DB: BenchDb>(
    server: &Server<DB>,
    table: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut failed_over = failovers(server, table, FAILOVERS).await?;
    failed_over.sort_by(f64::total_cmp);
    let target = FAILOVER_LEASE + FAILOVER_LEASE / 3 + Duration::from_millis(100);
    let worst = failed_over.last().copied().unwrap_or(f64::NAN);
    Ok(format!(
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
    ))
}

/// Leader failover in one process, as a SIGKILL leaves it: the leader's Locker stops (no
/// renewal, no release: its lead is forgotten) while a candidate of another Locker
/// campaigns. Per failover, seconds from the stop to the candidate's first fenced write
/// (`assert_held` in a committed transaction).
async fn failovers<DB: BenchDb>(
    server: &Server<DB>,
    table: &str,
    count: usize,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut times = Vec::new();
    for round in 0..count {
        let leader = Locker::builder(server.pool.clone()).table(table).build()?;
        let candidate = Locker::builder(server.pool.clone()).table(table).build()?;
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
