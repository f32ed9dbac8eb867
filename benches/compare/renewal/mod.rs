//! Section 5: what holding many auto-renewed guards through one Locker costs the database
//! and the client.
//!
//! For each `--guards` count (default 1,000 and 10,000) a fresh Locker on a pool of its
//! own takes that many locks with a 3 s lease and `renew_interval(1 s)`, lets two
//! intervals pass so the lease engine's batches are in their steady rhythm, then watches
//! for five intervals. Every 2 ms a sampler reads dblock's counters (`stats().renewals`,
//! one per batch, counted as it is sent; `stats().renewed`, one per lease renewed) and how
//! many pool connections are in use. The batch rate is taken between the first and the
//! last batch seen in the window (so a window's edges cannot add or drop a batch), times
//! the statements a batch sends on that backend. On the server, rows updated cross-check
//! the leases renewed. Memory per guard: the process's live heap bytes (a counting
//! allocator) and RSS, before the acquisitions and while the guards are held, divided by
//! the guards.

use std::fmt::Write as _;
use std::time::Duration;

use dblock::{LockGuard, Locker};
use futures::StreamExt as _;
use tokio::time::Instant;

use crate::heap::live_bytes;
use crate::measure::{Stop, resident_bytes};
use crate::report::{Table, count, verdict};
use crate::servers::{BenchDb, POOL_SIZE, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_renew";
const LEASE: Duration = Duration::from_secs(3);
const INTERVAL: Duration = Duration::from_secs(1);
const SETTLE_INTERVALS: u32 = 2;
const COUNTED_INTERVALS: u32 = 5;
/// Acquisitions and releases in flight at once while setting up and tearing down.
const PARALLEL: usize = POOL_SIZE as usize;
/// The target: statements per tick (one renew interval) per Locker.
const TARGET_PER_TICK: f64 = 2.0;
/// How far (in ticks) the span between batches may be from a whole number of ticks and
/// still count as one: the timer's jitter, far below a batch's worth.
const TICK_SNAP: f64 = 0.05;

/// Runs section 5 on one server; returns its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    let mut runs = Vec::new();
    let mut out = format!("### {}\n\n", server.label);
    for &guards in &settings.guards {
        match run(server, guards).await {
            Ok(m) => runs.push(m),
            Err(e) => {
                let _ = writeln!(out, "{guards} guards not measured: {e}\n");
            }
        }
    }
    if !runs.is_empty() {
        out.push_str(&markdown::<DB>(&runs, &server.label));
    }
    out
}

/// What one run measured.
struct Measured {
    guards: usize,
    held: usize,
    not_acquired: usize,
    acquiring: Duration,
    /// Batches seen inside the window, after the first one, and the time from the first
    /// to the last.
    batches: u64,
    batch_span: Duration,
    /// Leases renewed by those batches (from the first seen to the one before the last).
    batch_renewed: u64,
    /// Batches and leases renewed over the whole window, and its length.
    window_batches: u64,
    window_renewed: u64,
    window: Duration,
    /// Rows the server saw updated (see `server_rows_whole_run`) and, where current,
    /// UPDATE statements in the window.
    server_rows: u64,
    server_rows_whole_run: bool,
    renewed_whole_run: u64,
    server_updates: Option<u64>,
    pool_max: u32,
    pool_mean: f64,
    renewal_errors: u64,
    lost: u64,
    release_errors: usize,
    heap_per_guard: f64,
    rss_per_guard: f64,
    failures: Vec<String>,
}

impl Measured {
    /// Batches per interval, measured between batches: the ticks from the first batch
    /// seen to the last, taken as a whole number when within [`TICK_SNAP`] of one. The
    /// batches are timed by tokio's millisecond timer: 4 batches came 3.998 s after the
    /// first (2.001 statements per tick on MariaDB by the raw span, with exactly 2 a
    /// batch). One batch too many either adds a batch to the same whole ticks (2.5
    /// statements per tick) or ends the span away from a whole tick (read unrounded).
    fn batches_per_tick(&self) -> f64 {
        if self.batches == 0 || self.batch_span.is_zero() {
            // Fewer than two batches seen: fall back to the window's count.
            return self.window_batches as f64
                / (self.window.as_secs_f64() / INTERVAL.as_secs_f64());
        }
        let raw = self.batch_span.as_secs_f64() / INTERVAL.as_secs_f64();
        let whole = raw.round();
        let ticks = if whole >= 1.0 && (raw - whole).abs() <= TICK_SNAP {
            whole
        } else {
            raw
        };
        self.batches as f64 / ticks
    }
}

async fn run<DB: BenchDb>(
    server: &Server<DB>,
    guards: usize,
) -> Result<Measured, Box<dyn std::error::Error>> {
    eprintln!("renewal: {}, {guards} guards", server.label);
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
    crate::trace::take_failures();
    let before = locker.stats();
    let (heap_before, rss_before) = (live_bytes(), resident_bytes());
    let started = Instant::now();
    let mut held: Vec<LockGuard<DB>> = Vec::with_capacity(guards);
    let mut not_acquired = 0;
    let mut acquisitions = futures::stream::iter(0..guards)
        .map(|i| {
            let locker = locker.clone();
            async move { locker.try_acquire(&format!("renew:{i}"), LEASE).await }
        })
        .buffer_unordered(PARALLEL);
    while let Some(r) = acquisitions.next().await {
        match r {
            Ok(Some(g)) => held.push(g),
            _ => not_acquired += 1,
        }
    }
    drop(acquisitions);
    let acquiring = started.elapsed();

    tokio::time::sleep(INTERVAL * SETTLE_INTERVALS + Duration::from_millis(200)).await;
    let (heap_held, rss_held) = (live_bytes(), resident_bytes());
    let stop = Stop::default();
    let sampler = tokio::spawn({
        let (pool, locker, stop) = (pool.clone(), locker.clone(), stop.clone());
        async move {
            let mut s = Sampled::default();
            let mut last = locker.stats().renewals;
            while !stop.is_set() {
                let in_use = pool.size().saturating_sub(pool.num_idle() as u32);
                s.pool_max = s.pool_max.max(in_use);
                s.pool_sum += u64::from(in_use);
                s.samples += 1;
                let stats = locker.stats();
                let now = stats.renewals;
                if now != last {
                    // A batch was just sent; the one before it has been answered (batches
                    // go one at a time), so `renewed` now covers every earlier batch.
                    let at = Instant::now();
                    match s.first {
                        None => {
                            s.first = Some(at);
                            s.renewed_at_first = stats.renewed;
                        }
                        Some(_) => s.batches += now - last,
                    }
                    s.last = Some(at);
                    s.renewed_at_last = stats.renewed;
                    last = now;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            s
        }
    });
    let (w0, w0_stats, w0_server, w0_updates) = (
        Instant::now(),
        locker.stats(),
        DB::updates_seen(&server.pool, TABLE).await?,
        DB::update_statements_seen(&server.pool).await,
    );
    tokio::time::sleep(INTERVAL * COUNTED_INTERVALS).await;
    let (w1, w1_stats, w1_server, w1_updates) = (
        Instant::now(),
        locker.stats(),
        DB::updates_seen(&server.pool, TABLE).await?,
        DB::update_statements_seen(&server.pool).await,
    );
    stop.now();
    let sampled = sampler.await?;

    let held_count = held.len();
    let release_errors = futures::stream::iter(held)
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

    let per_guard = |delta: i64| delta as f64 / held_count.max(1) as f64;
    Ok(Measured {
        guards,
        held: held_count,
        not_acquired,
        acquiring,
        batches: sampled.batches,
        batch_span: match (sampled.first, sampled.last) {
            (Some(a), Some(b)) => b - a,
            _ => Duration::ZERO,
        },
        batch_renewed: sampled.renewed_at_last - sampled.renewed_at_first,
        window_batches: w1_stats.renewals - w0_stats.renewals,
        window_renewed: w1_stats.renewed - w0_stats.renewed,
        window: w1 - w0,
        server_rows: if DB::UPDATES_ARE_CURRENT {
            w1_server - w0_server
        } else {
            server_after.saturating_sub(server_before)
        },
        server_rows_whole_run: !DB::UPDATES_ARE_CURRENT,
        renewed_whole_run: after.renewed - before.renewed,
        server_updates: w0_updates.zip(w1_updates).map(|(a, b)| b - a),
        pool_max: sampled.pool_max,
        pool_mean: sampled.pool_sum as f64 / sampled.samples.max(1) as f64,
        renewal_errors: after.renewal_errors - before.renewal_errors,
        lost: after.lost - before.lost,
        release_errors,
        heap_per_guard: per_guard(heap_held - heap_before),
        rss_per_guard: per_guard(
            i64::try_from(rss_held).unwrap_or(0) - i64::try_from(rss_before).unwrap_or(0),
        ),
        failures: crate::trace::take_failures(),
    })
}

#[derive(Default)]
struct Sampled {
    pool_max: u32,
    pool_sum: u64,
    samples: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    batches: u64,
    renewed_at_first: u64,
    renewed_at_last: u64,
}

/// The old design's figures (a watchdog task and an `UPDATE` per guard), from
/// bench/RESULTS.md at 9d181ee: 1,000 guards, 3 s lease, 1 s interval.
struct OldDesign {
    statements_per_sec: &'static str,
    pool: &'static str,
}

fn old_design(label: &str) -> Option<OldDesign> {
    if label.starts_with("PostgreSQL") {
        Some(OldDesign {
            statements_per_sec: "998",
            pool: "8 / 1.59",
        })
    } else if label.starts_with("MariaDB") {
        Some(OldDesign {
            statements_per_sec: "1,000",
            pool: "8 / 1.50",
        })
    } else {
        None
    }
}

fn markdown<DB: BenchDb>(runs: &[Measured], label: &str) -> String {
    let old = old_design(label);
    let mut header: Vec<String> = vec!["measure".into()];
    for m in runs {
        header.push(format!("{} guards", count(m.guards as f64)));
    }
    if old.is_some() {
        header.push("old design, 1,000 guards (9d181ee)".into());
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header);
    for column in 1..header.len() {
        table = table.words(column);
    }
    let mut row = |name: &str, cells: &dyn Fn(&Measured) -> String, old_cell: &str| {
        let mut r = vec![name.to_owned()];
        r.extend(runs.iter().map(cells));
        if old.is_some() {
            r.push(old_cell.to_owned());
        }
        table.row(r);
    };
    let stmts = f64::from(DB::STATEMENTS_PER_BATCH);
    row(
        "guards held (time to acquire them; not acquired)",
        &|m| {
            format!(
                "{} ({:.2} s; {})",
                count(m.held as f64),
                m.acquiring.as_secs_f64(),
                m.not_acquired
            )
        },
        "1,000",
    );
    row(
        "lease / renew interval",
        &|_| format!("{} s / {} s", LEASE.as_secs_f64(), INTERVAL.as_secs_f64()),
        "3 s / 1 s",
    );
    row(
        "renewal batches seen (dblock's `renewals`), first to last",
        &|m| {
            format!(
                "{} in {:.2} s ({} in the {:.1} s window)",
                m.batches,
                m.batch_span.as_secs_f64(),
                m.window_batches,
                m.window.as_secs_f64()
            )
        },
        "-",
    );
    row(
        &format!(
            "renewal statements/s ({} per batch)",
            DB::STATEMENTS_PER_BATCH
        ),
        &|m| {
            format!(
                "{:.2}",
                m.batches_per_tick() * stmts / INTERVAL.as_secs_f64()
            )
        },
        old.as_ref().map_or("-", |o| o.statements_per_sec),
    );
    row(
        "**statements per tick per Locker** (target <= 2)",
        &|m| format!("{:.2}", m.batches_per_tick() * stmts),
        "~1,000",
    );
    row(
        "leases renewed per batch (dblock's `renewed`, between the batches above)",
        &|m| count(m.batch_renewed as f64 / m.batches.max(1) as f64),
        "1 (a statement per lease)",
    );
    row(
        "server-side check: rows updated",
        &|m| {
            if m.server_rows_whole_run {
                format!(
                    "{} in the table over the run (`n_tup_upd`) for {} leases renewed",
                    count(m.server_rows as f64),
                    count(m.renewed_whole_run as f64)
                )
            } else {
                format!(
                    "{}/s in the window (`Handler_update`, server-wide) for {}/s renewed",
                    count(m.server_rows as f64 / m.window.as_secs_f64()),
                    count(m.window_renewed as f64 / m.window.as_secs_f64())
                )
            }
        },
        "matched",
    );
    if runs.iter().any(|m| m.server_updates.is_some()) {
        row(
            "server-side check: UPDATE statements/s (`Com_update` + `Com_update_multi`, server-wide)",
            &|m| {
                m.server_updates.map_or("-".into(), |n| {
                    format!("{:.2}", n as f64 / m.window.as_secs_f64())
                })
            },
            "-",
        );
    }
    row(
        &format!("pool connections in use (max / mean, of {POOL_SIZE})"),
        &|m| format!("{} / {:.3}", m.pool_max, m.pool_mean),
        old.as_ref().map_or("-", |o| o.pool),
    );
    row(
        "renewal errors / **leases lost** / release errors",
        &|m| format!("{} / {} / {}", m.renewal_errors, m.lost, m.release_errors),
        "0 / 0 / 0",
    );
    row(
        "first renewal failures (the engine's debug log)",
        &|m| {
            if m.failures.is_empty() {
                "none".into()
            } else {
                m.failures
                    .iter()
                    .map(|f| format!("`{}`", f.replace('`', "'")))
                    .collect::<Vec<_>>()
                    .join("; ")
            }
        },
        "-",
    );
    row(
        "client memory per held guard: live heap / RSS",
        &|m| format!("{:.0} B / {:.0} B", m.heap_per_guard, m.rss_per_guard),
        "-",
    );
    let mut out = table.render();
    let _ = writeln!(
        out,
        "\nTargets: at most {TARGET_PER_TICK} statements per tick per Locker, no lease lost."
    );
    for m in runs {
        let per_tick = m.batches_per_tick() * stmts;
        let _ = writeln!(
            out,
            "- {} guards: {per_tick:.2} statements per tick -> {}; leases lost {} -> {}",
            count(m.guards as f64),
            verdict(per_tick <= TARGET_PER_TICK + 1e-9),
            m.lost,
            verdict(m.lost == 0 && m.not_acquired == 0)
        );
    }
    out.push('\n');
    out
}
