//! Section 5: what holding many auto-renewed guards costs the database.
//!
//! Takes `--guards` locks (default 1,000) with a 3 s lease, so each watchdog renews every
//! second, lets one interval pass so the renewals are in their steady rhythm, then counts
//! for four intervals: renewal statements from dblock's own counter (`stats().renewals`,
//! counted as they are sent) and, on the server, rows updated. Meanwhile it samples how
//! many pool connections are in use: watchdogs sleep without holding one.

use std::fmt::Write as _;
use std::time::Duration;

use dblock::{LockGuard, Locker};
use futures::StreamExt as _;
use tokio::time::Instant;

use crate::measure::Stop;
use crate::report::{Table, count};
use crate::servers::{BenchDb, POOL_SIZE, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_renew";
const LEASE: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_secs(1);
const COUNTED_INTERVALS: u32 = 4;
/// Acquisitions and releases in flight at once while setting up and tearing down.
const PARALLEL: usize = POOL_SIZE as usize;

/// Runs section 5 on one server; returns its markdown table row and notes.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    match run(settings, server).await {
        Ok(md) => md,
        Err(e) => format!("### {}\n\nNot measured: {e}\n\n", server.label),
    }
}

/// Connections in use, sampled every 2 ms.
#[derive(Default)]
struct PoolUse {
    max: u32,
    sum: u64,
    samples: u64,
}

async fn run<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    eprintln!("renewal: {}, {} guards", server.label, settings.guards);
    // A pool of its own, so closing it at the end flushes the server's statistics for
    // exactly the sessions that renewed.
    let pool = DB::dedicated_pool(&server.url, POOL_SIZE).await?;
    DB::drop_lock_table(&server.pool, TABLE).await?;
    let locker: Locker<DB> = Locker::builder(pool.clone())
        .table(TABLE)
        .default_lease(LEASE)
        .renew_interval(INTERVAL)
        .build()?;
    locker.migrate().await?;

    let server_before = DB::updates_seen(&server.pool, TABLE).await?;
    let before = locker.stats();
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..settings.guards)
        .map(|i| {
            let locker = locker.clone();
            async move { locker.try_acquire(&format!("renew:{i}"), LEASE).await }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let acquiring = started.elapsed();
    let mut guards: Vec<LockGuard<DB>> = Vec::with_capacity(settings.guards);
    let mut not_acquired = 0;
    for r in results {
        match r {
            Ok(Some(g)) => guards.push(g),
            _ => not_acquired += 1,
        }
    }

    tokio::time::sleep(INTERVAL + Duration::from_millis(500)).await;
    let stop = Stop::default();
    let sampler = tokio::spawn({
        let (pool, stop) = (pool.clone(), stop.clone());
        async move {
            let mut u = PoolUse::default();
            while !stop.is_set() {
                let in_use = pool.size().saturating_sub(pool.num_idle() as u32);
                u.max = u.max.max(in_use);
                u.sum += u64::from(in_use);
                u.samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            u
        }
    });
    let (w0, w0_stats, w0_server) = (
        Instant::now(),
        locker.stats(),
        DB::updates_seen(&server.pool, TABLE).await?,
    );
    tokio::time::sleep(INTERVAL * COUNTED_INTERVALS).await;
    let (w1, w1_stats, w1_server) = (
        Instant::now(),
        locker.stats(),
        DB::updates_seen(&server.pool, TABLE).await?,
    );
    stop.now();
    let pool_use = sampler.await?;

    let held = guards.len();
    let release_errors = futures::stream::iter(guards)
        .map(LockGuard::release)
        .buffer_unordered(PARALLEL)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    let after = locker.stats();
    drop(locker);
    pool.close().await;
    DB::await_sessions_gone(&server.pool).await;
    let server_after = DB::updates_seen(&server.pool, TABLE).await?;
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let window = (w1 - w0).as_secs_f64();
    let per_sec = (w1_stats.renewals - w0_stats.renewals) as f64 / window;
    let per_guard_min = per_sec / held.max(1) as f64 * 60.0;
    let renewals_total = after.renewals - before.renewals;
    let server_check = if DB::UPDATES_ARE_CURRENT {
        format!(
            "{}/s rows updated in the same window (`Handler_update`, server-wide)",
            count((w1_server - w0_server) as f64 / window)
        )
    } else {
        format!(
            "{} rows updated in the table over the whole run (`n_tup_upd`) for {} renewals sent",
            count(server_after.saturating_sub(server_before) as f64),
            count(renewals_total as f64)
        )
    };

    let mut out = format!("### {}\n\n", server.label);
    let mut table = Table::measures();
    table.row(vec![
        "guards held".into(),
        format!(
            "{} (acquired in {:.2} s; {not_acquired} not acquired)",
            count(held as f64),
            acquiring.as_secs_f64()
        ),
    ]);
    table.row(vec![
        "lease / renew interval".into(),
        format!("{} s / {} s", LEASE.as_secs_f64(), INTERVAL.as_secs_f64()),
    ]);
    table.row(vec![
        "renewal statements/s (dblock's count)".into(),
        format!("{} over {window:.1} s", count(per_sec)),
    ]);
    table.row(vec![
        "per guard per minute".into(),
        format!("{per_guard_min:.1}"),
    ]);
    table.row(vec!["server-side check".into(), server_check]);
    table.row(vec![
        format!("pool connections in use (max / mean, of {POOL_SIZE})"),
        format!(
            "{} / {:.2}",
            pool_use.max,
            pool_use.sum as f64 / pool_use.samples.max(1) as f64
        ),
    ]);
    table.row(vec![
        "renewal errors / leases lost / release errors".into(),
        format!(
            "{} / {} / {release_errors}",
            after.renewal_errors - before.renewal_errors,
            after.lost - before.lost
        ),
    ]);
    out.push_str(&table.render());
    let _ = writeln!(
        out,
        "\nWith dblock's defaults (30 s lease, renewed every 10 s) the same {} guards would \
         send about {} statements/s ({:.1} per guard per minute).\n",
        count(held as f64),
        count(per_sec / 10.0),
        per_guard_min / 10.0
    );
    Ok(out)
}
