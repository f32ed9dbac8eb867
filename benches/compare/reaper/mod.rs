//! Section 6: the reaper. Each round, for each way of reaping (`reap_expired()`, then a
//! background reaper from `spawn_reaper`), bulk-inserts `--reap-rows` expired rows
//! (default 100,000) in one statement and lets the server write them back, then runs one
//! task of dblock `try_acquire` + `release` cycles on other keys of the same table with
//! no reaper, then while the reaper deletes the expired rows (timed), then with no reaper
//! again (the idle baseline is both idle spells together). Both reapers pace themselves
//! (src/reaper.rs: after a full batch they pause the dialect's `REAP_PACE` times the
//! batch's duration).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use dblock::{DEFAULT_REAP_BATCH, Locker, ReaperConfig};

use tokio::time::Instant;

use crate::contenders::Dblock;
use crate::measure::{Contender, Load, Stop, cycles, median, spread};
use crate::report::{Table, count, ms_f, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_reap";

/// What the development runs of this section showed, for reading the verdicts above.
const PACING_NOTE: &str = "\
How to read the p99 target: a cycle that overlaps a reaper batch waits for it, so p99 \
stays under 2x idle only while fewer than 1% of the cycles overlap one (column \
\"cycles slower than 2x idle p99\"). Pacing makes the reaper busy 1/(pace+1) of the \
time; it cannot shorten the stall of a batch. Development runs on PostgreSQL: pace 3: \
2.4-2.5% of cycles slowed, p99 4.5-5.1x idle; pace 9: 0.6-1.3% slowed, p99 1.5-3.2x; \
pace 19: 0.2-0.5% slowed on one machine, 0.7-1.2% on another; pace 39: 0.3-0.8% \
slowed, p99 0.9-1.6x. MariaDB at pace 39 was slowed more (1.0-1.4% of cycles, p99 \
2.1-2.3x idle in two of three full runs) because InnoDB deletes each reaped row twice: \
the DELETE marks it, and a purge thread removes it 0.2-0.5 s after the commit, taking \
about as long again (a batch of 1,000: DELETE 10-14 ms, purge 5-10 ms, read from \
INNODB_METRICS' purge_del_mark_records), in the middle of the reaper's pause. So \
MySQL / MariaDB pause 79 times a batch (the dialect's REAP_PACE): a fortieth of the \
server's time again. Smaller batches did not help there (250 rows: as many cycles \
slowed, in interleaved probes), and on PostgreSQL they cost more (250 rows: 1.5-1.7x \
idle p99 and twice the time, each batch paying its commit's WAL flush).\n\n";

/// How the expired rows are deleted.
#[derive(Clone, Copy)]
enum Way {
    /// `Locker::reap_expired()`, awaited.
    Once,
    /// `Locker::spawn_reaper` with this batch size, stopped once it has deleted every
    /// row.
    Background(u32),
}

impl Way {
    const ALL: [Way; 2] = [Way::Once, Way::Background(DEFAULT_REAP_BATCH)];

    fn name(self) -> String {
        match self {
            Way::Once => format!(
                "reap_expired() (batches of {})",
                count(f64::from(DEFAULT_REAP_BATCH))
            ),
            Way::Background(batch) => format!(
                "background reaper (spawn_reaper, batches of {})",
                count(f64::from(batch))
            ),
        }
    }

    fn batch(self) -> u32 {
        match self {
            Way::Once => DEFAULT_REAP_BATCH,
            Way::Background(batch) => batch,
        }
    }

    /// Deletes the expired rows (`expected` of them); how many it deleted.
    async fn reap<DB: BenchDb>(
        self,
        locker: &Locker<DB>,
        expected: u64,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        match self {
            Way::Once => Ok(locker.reap_expired().await?),
            Way::Background(batch) => {
                let reaper = locker.spawn_reaper(ReaperConfig {
                    // Long enough that the first pass (which starts at once) is the only
                    // one while it is measured.
                    interval: Duration::from_secs(600),
                    batch,
                    ..ReaperConfig::default()
                })?;
                let mut total = reaper.subscribe();
                // A pass reports its total when it ends: when a batch came back short.
                let waited = tokio::time::timeout(
                    Duration::from_secs(600),
                    total.wait_for(|deleted| *deleted >= expected),
                )
                .await;
                let deleted = reaper.stop().await;
                match waited {
                    Ok(_) => Ok(deleted),
                    Err(_) => Err(format!(
                        "background reaper deleted {deleted} of {expected} rows in 600 s"
                    )
                    .into()),
                }
            }
        }
    }
}

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
    // Fewer rounds than the comparisons (each inserts and deletes a lot), but at least
    // three by default: the verdict is a median of rounds, and the median of two is
    // their mean, which one disturbed round moves.
    let rounds = settings.rounds.div_ceil(2);
    // The idle baseline brackets the reaping: half before it, half after (once the
    // server has written back what the reaping left dirty), 10 round-lengths in all. With
    // 2 s before only, a round's idle p99 rested on some 20 cycles and moved 1.3-4.3 ms
    // between rounds of one run (MariaDB), swinging the ratio more than the reaper did.
    let idle_half = settings.round * 5;
    let mut by_way: Vec<Vec<Round>> = Way::ALL.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        for (w, way) in Way::ALL.into_iter().enumerate() {
            eprintln!(
                "reaper: {}, {}, round {}/{rounds}: inserting {} expired rows",
                server.label,
                way.name(),
                r + 1,
                settings.reap_rows
            );
            let t = Instant::now();
            let inserted = DB::insert_expired(&server.pool, TABLE, settings.reap_rows).await?;
            let insert_secs = t.elapsed().as_secs_f64();
            // Without this the "idle" probe would pay for writing the insert back.
            DB::settle(&server.pool).await;

            let mut idle = cycles(
                Arc::clone(&probe),
                1,
                format!("idle-before:{r}:{w}"),
                Stop::after(idle_half),
            )
            .await;
            let stop = Stop::default();
            let during = tokio::spawn(cycles(
                Arc::clone(&probe),
                1,
                format!("during:{r}:{w}"),
                stop.clone(),
            ));
            let t = Instant::now();
            let reaped = way.reap(&locker, inserted).await;
            let reap_secs = t.elapsed().as_secs_f64();
            stop.now();
            let during = during.await?;
            let reaped = reaped?;
            DB::settle(&server.pool).await;
            idle.merge(
                cycles(
                    Arc::clone(&probe),
                    1,
                    format!("idle-after:{r}:{w}"),
                    Stop::after(idle_half),
                )
                .await,
            );
            by_way[w].push(Round {
                inserted,
                insert_secs,
                reaped,
                reap_secs,
                during,
                idle,
            });
        }
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;

    let mut out = format!("### {}\n\n", server.label);
    let mut verdicts = Vec::new();
    for (way, mut done) in Way::ALL.into_iter().zip(by_way) {
        let (md, p99_ratio) = way_markdown(way, &mut done);
        out.push_str(&md);
        verdicts.push((way, p99_ratio));
    }
    out.push_str(
        "Target: acquirers' p99 while reaping <= 2x idle (median of per-round ratios).\n\n",
    );
    for (way, (m, s)) in verdicts {
        let met = if way.batch() == DEFAULT_REAP_BATCH {
            verdict(m <= 2.0).to_owned()
        } else {
            "(not the default batch: shown to tell the batch's length from the pacing)".to_owned()
        };
        let _ = writeln!(
            out,
            "- {}: p99 while reaping / p99 idle = {} -> {met}",
            way.name(),
            ratio(m, s),
        );
    }
    out.push('\n');
    out.push_str(PACING_NOTE);
    Ok(out)
}

/// One way's tables; the per-round p99 ratio (median, spread).
fn way_markdown(way: Way, done: &mut [Round]) -> (String, (f64, (f64, f64))) {
    let mut out = format!("#### {}\n\n", way.name());
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
        "rows deleted".into(),
        done.iter()
            .map(|r| count(r.reaped as f64))
            .collect::<Vec<_>>()
            .join(", "),
    ]);
    table.row(vec![
        format!(
            "time to delete them (batches of {}, paced)",
            count(f64::from(way.batch()))
        ),
        format!("{reap:.2} s (rounds: {lo:.2}-{hi:.2} s)"),
    ]);
    table.row(vec![
        "rows deleted per second".into(),
        count(median(done.iter().map(|r| r.reaped as f64 / r.reap_secs))),
    ]);
    out.push_str(&table.render());

    out.push_str("\nOne task's try_acquire + release cycles on other keys of the same table:\n\n");
    let mut table = Table::new(&[
        "while",
        "cycles/s",
        "p50 ms",
        "p99 ms",
        "cycles slower than 2x idle p99",
        "errors",
    ]);
    // Per round: the share of cycles slower than twice that round's idle p99. The p99
    // target holds only while that share stays under 1%.
    let slow = |loads: &mut dyn Iterator<Item = &mut Round>, during: bool| {
        let shares: Vec<f64> = loads
            .map(|r| {
                let limit = r.idle.latencies.percentile(99.0) * 2;
                let l = if during { &mut r.during } else { &mut r.idle };
                l.latencies.share_above(limit)
            })
            .collect();
        format!("{:.1}%", median(shares) * 100.0)
    };
    let idle_slow = slow(&mut done.iter_mut(), false);
    let during_slow = slow(&mut done.iter_mut(), true);
    table.row(probe_row(
        "idle",
        done.iter_mut().map(|r| &mut r.idle),
        idle_slow,
    ));
    table.row(probe_row(
        "reaper running",
        done.iter_mut().map(|r| &mut r.during),
        during_slow,
    ));
    out.push_str(&table.render());
    let p99_ratio: Vec<f64> = done
        .iter_mut()
        .map(|r| {
            r.during.latencies.percentile(99.0).as_secs_f64()
                / r.idle.latencies.percentile(99.0).as_secs_f64()
        })
        .collect();
    let m = median(p99_ratio.iter().copied());
    let s = spread(p99_ratio);
    let _ = writeln!(out, "\np99 while reaping / p99 idle: {}\n", ratio(m, s));
    if let Some(err) = done.iter().find_map(|r| {
        r.during
            .first_error
            .as_ref()
            .or(r.idle.first_error.as_ref())
    }) {
        let _ = writeln!(out, "First probe error: `{err}`\n");
    }
    (out, (m, s))
}

/// One line of the probe table: medians across rounds.
fn probe_row<'a>(
    label: &str,
    loads: impl Iterator<Item = &'a mut Load>,
    slow: String,
) -> Vec<String> {
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
        slow,
        errors.to_string(),
    ]
}
