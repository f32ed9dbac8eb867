//! Section 6: the reaper. Each round bulk-inserts `--reap-rows` expired rows (default
//! 100,000) in one statement and lets the server write them back, then runs one task of
//! dblock `try_acquire` + `release` cycles on other keys of the same table, first with no
//! reaper, then while `reap_expired()` deletes the expired rows (timed).

use std::fmt::Write as _;
use std::sync::Arc;

use tokio::time::Instant;

use crate::contenders::Dblock;
use crate::measure::{Contender, Load, Stop, cycles, median, spread};
use crate::report::{Table, count, ms_f, ratio};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_reap";

struct Round {
    inserted: u64,
    insert_secs: f64,
    reaped: u64,
    reap_secs: f64,
    during: Load,
    idle: Load,
}

/// Runs section 6 on one server; returns its markdown.
pub async fn section<DB: BenchDb>(settings: &Settings, server: &Server<DB>) -> String {
    match run(settings, server).await {
        Ok(md) => md,
        Err(e) => format!("### {}\n\nNot measured: {e}\n\n", server.label),
    }
}

async fn run<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    let locker = server.fresh_locker(TABLE).await?;
    let probe: Arc<dyn Contender> = Arc::new(Dblock {
        name: "probe".into(),
        locker: locker.clone(),
    });
    // Fewer rounds than the comparisons: each inserts and deletes a lot.
    let rounds = (settings.rounds / 2).max(1);
    let idle_for = settings.round * 2;
    let mut done = Vec::new();
    for r in 0..rounds {
        eprintln!(
            "reaper: {}, round {}/{rounds}: inserting {} expired rows",
            server.label,
            r + 1,
            settings.reap_rows
        );
        let t = Instant::now();
        let inserted = DB::insert_expired(&server.pool, TABLE, settings.reap_rows).await?;
        let insert_secs = t.elapsed().as_secs_f64();
        // Without this the "idle" probe would pay for writing the insert back.
        DB::settle(&server.pool).await;

        let idle = cycles(
            Arc::clone(&probe),
            1,
            format!("idle:{r}"),
            Stop::after(idle_for),
        )
        .await;
        let stop = Stop::default();
        let during = tokio::spawn(cycles(
            Arc::clone(&probe),
            1,
            format!("during:{r}"),
            stop.clone(),
        ));
        let t = Instant::now();
        let reaped = locker.reap_expired().await;
        let reap_secs = t.elapsed().as_secs_f64();
        stop.now();
        let during = during.await?;
        let reaped = reaped?;
        done.push(Round {
            inserted,
            insert_secs,
            reaped,
            reap_secs,
            during,
            idle,
        });
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let mut out = format!("### {}\n\n", server.label);
    let reap = median(done.iter().map(|r| r.reap_secs));
    let (lo, hi) = spread(done.iter().map(|r| r.reap_secs));
    let mut table = Table::measures();
    table.row(vec![
        "expired rows per round (inserted in one statement)".into(),
        format!(
            "{} (insert took {:.2} s, median)",
            count(median(done.iter().map(|r| r.inserted as f64))),
            median(done.iter().map(|r| r.insert_secs))
        ),
    ]);
    table.row(vec![
        "rows deleted by reap_expired()".into(),
        done.iter()
            .map(|r| count(r.reaped as f64))
            .collect::<Vec<_>>()
            .join(", "),
    ]);
    table.row(vec![
        "time to delete them (batches of 1,000)".into(),
        format!("{reap:.2} s (rounds: {lo:.2}-{hi:.2} s)"),
    ]);
    table.row(vec![
        "rows deleted per second".into(),
        count(median(done.iter().map(|r| r.reaped as f64 / r.reap_secs))),
    ]);
    out.push_str(&table.render());

    out.push_str("\nOne task's try_acquire + release cycles on other keys of the same table:\n\n");
    let mut table = Table::new(&["while", "cycles/s", "p50 ms", "p99 ms", "errors"]);
    table.row(probe_row("idle", done.iter_mut().map(|r| &mut r.idle)));
    table.row(probe_row(
        "reaper running",
        done.iter_mut().map(|r| &mut r.during),
    ));
    out.push_str(&table.render());
    let p99_ratio: Vec<f64> = done
        .iter_mut()
        .map(|r| {
            r.during.latencies.percentile(99.0).as_secs_f64()
                / r.idle.latencies.percentile(99.0).as_secs_f64()
        })
        .collect();
    let _ = writeln!(
        out,
        "\np99 while reaping / p99 idle: {}\n",
        ratio(median(p99_ratio.iter().copied()), spread(p99_ratio))
    );
    if let Some(err) = done.iter().find_map(|r| {
        r.during
            .first_error
            .as_ref()
            .or(r.idle.first_error.as_ref())
    }) {
        let _ = writeln!(out, "First probe error: `{err}`\n");
    }
    Ok(out)
}

/// One line of the probe table: medians across rounds.
fn probe_row<'a>(label: &str, loads: impl Iterator<Item = &'a mut Load>) -> Vec<String> {
    let (mut per_sec, mut p50, mut p99, mut errors) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for l in loads {
        per_sec.push(l.per_sec());
        p50.push(l.latencies.percentile(50.0).as_secs_f64());
        p99.push(l.latencies.percentile(99.0).as_secs_f64());
        errors += l.errors;
    }
    vec![
        label.to_owned(),
        count(median(per_sec)),
        ms_f(median(p50)),
        ms_f(median(p99)),
        errors.to_string(),
    ]
}
