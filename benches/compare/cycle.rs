//! Sections 1 and 2: the uncontended cycle (try_acquire + release on distinct keys) of
//! dblock, its dialect layer alone, the hand-written statements, the seeds' plain INSERT
//! and Redis, interleaved in rounds.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::anatomy;
use crate::contenders::{Dblock, DialectOnly, RedisLock};
use crate::handwritten::HandCycle;
use crate::measure::{Contender, Load, interleaved, median, spread};
use crate::report::{Table, count, ms_f, ratio, verdict};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_cycle";
const SEED_TABLE: &str = "bench_lock_seed";
/// Fast mode's table (`Durability::Relaxed`, PostgreSQL only) and its contender's name.
const RELAXED_TABLE: &str = "bench_lock_cycle_relaxed";
/// dblock on a relaxed lock table, here and in cells 3.1 and 3.1b.
pub(crate) const RELAXED: &str = "dblock relaxed (UNLOGGED)";
/// The floor of two-statement locks (`handwritten::Floor`), the last contender.
const FLOOR: &str = "floor: two round trips, no table (`SELECT` of the binds)";
const TASKS: [usize; 2] = [1, 8];
/// Each contender runs this long before the rounds (connections, statement caches).
const WARM_UP: Duration = Duration::from_millis(200);
/// Each round's time per contender is split into this many legs, every contender running
/// once per leg, in the round's order and then in reverse (A B C, C B A, ...). So a
/// burst of the shared machine's load, or a drift such as InnoDB purge catching up,
/// lands on every contender of a round alike: with one slot each, the committed run's
/// MariaDB 1-task ratio of dblock's own statements (dialect only) to the same statements
/// by hand swung 0.71-1.07x from round to round.
const LEGS: u32 = 20;
/// Section 1 runs this many times the rounds of the others. Its targets sit a few percent
/// under the ratios it measures, and with five rounds the median of the same code's
/// ratios moved 0.93-1.02x between full runs (client CPU of the Locker layer, measured
/// with perf: 9-15 µs a cycle out of 100-250), so a cell's verdict was a coin toss at
/// the line. Ten rounds of twenty legs take about four minutes.
const ROUND_FACTOR: usize = 2;

/// Who is who in a comparison's list of contenders.
const DBLOCK: usize = 0;
const DIALECT: usize = 1;
const HAND: usize = 2;
const SEED: usize = 3;
const REDIS: usize = 4;

/// Fast mode's targets (issue 29): relaxed dblock / durable dblock, and / Redis.
const RELAXED_VS_DURABLE: f64 = 3.0;
const RELAXED_VS_REDIS: f64 = 0.3;

/// Targets (issue 9): dblock / hand-written throughput, and extra wake-ups per cycle.
const RATIO_TARGET: f64 = 0.95;
/// Issue 29's target: dblock / the seeds' INSERT + DELETE.
const SEED_TARGET: f64 = 0.95;
const WAKEUP_MARGIN: f64 = 0.5;

/// One comparison: every contender's loads, one per round.
pub struct Comparison {
    pub backend: String,
    pub tasks: usize,
    pub names: Vec<String>,
    pub rounds: Vec<Vec<Load>>,
}

impl Comparison {
    /// Whether Redis ran in this comparison (at its place, [`REDIS`]).
    fn has_redis(&self) -> bool {
        self.names
            .get(REDIS)
            .is_some_and(|n| n.starts_with("Redis"))
    }

    fn throughput(&self, who: usize) -> f64 {
        median(self.rounds[who].iter().map(Load::per_sec))
    }

    fn latency(&self, who: usize, p: f64) -> f64 {
        median(
            self.rounds[who]
                .iter()
                .map(|l| l.latencies.clone().percentile(p).as_secs_f64()),
        )
    }

    /// Median client CPU per cycle, in seconds.
    fn cpu_per_op(&self, who: usize) -> f64 {
        median(
            self.rounds[who]
                .iter()
                .map(|l| l.cpu_per_op().as_secs_f64()),
        )
    }

    /// Median client wake-ups (context switches) per cycle.
    fn wakeups(&self, who: usize) -> f64 {
        median(self.rounds[who].iter().map(Load::wakeups_per_op))
    }

    /// Per-round throughput ratios of `a` to `b`: (median, (lowest, highest)).
    fn ratio(&self, a: usize, b: usize) -> (f64, (f64, f64)) {
        let per_round: Vec<f64> = self.rounds[a]
            .iter()
            .zip(&self.rounds[b])
            .map(|(x, y)| x.per_sec() / y.per_sec())
            .collect();
        (median(per_round.iter().copied()), spread(per_round))
    }
}

/// Runs sections 1 and 2 on every server given; returns their markdown.
pub async fn section(
    settings: &Settings,
    pg: Option<&Server<sqlx::Postgres>>,
    my: Option<&Server<sqlx::MySql>>,
    redis: Option<&redis::Client>,
) -> String {
    let mut comparisons = Vec::new();
    let mut anatomies = String::new();
    let mut problems = Vec::new();
    if let Some(pg) = pg {
        match on_backend(settings, pg, redis).await {
            Ok(mut c) => comparisons.append(&mut c),
            Err(e) => problems.push(format!("{}: {e}", pg.label)),
        }
        anatomies
            .push_str(&anatomy::markdown(&pg.label, sqlx::Postgres::select_one(&pg.pool)).await);
    }
    if let Some(my) = my {
        match on_backend(settings, my, redis).await {
            Ok(mut c) => comparisons.append(&mut c),
            Err(e) => problems.push(format!("{}: {e}", my.label)),
        }
        anatomies.push_str(&anatomy::markdown(&my.label, sqlx::MySql::select_one(&my.pool)).await);
    }
    let mut out = cycle_markdown(&comparisons);
    for p in problems {
        let _ = writeln!(out, "Not measured: {p}\n");
    }
    out.push_str(&overhead_markdown(&comparisons));
    out.push_str(&anatomies);
    out.push_str(&redis_markdown(&comparisons, redis.is_some()));
    out.push_str(&relaxed_markdown(&comparisons));
    out
}

async fn on_backend<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
    redis: Option<&redis::Client>,
) -> Result<Vec<Comparison>, Box<dyn std::error::Error>> {
    let locker = server.fresh_locker(TABLE).await?;
    let seed = DB::seed(&server.pool, SEED_TABLE).await?;
    let mut contenders: Vec<Arc<dyn Contender>> = vec![
        Arc::new(Dblock {
            name: "dblock".into(),
            locker,
        }),
        Arc::new(DialectOnly::new(
            "dblock dialect only",
            server.pool.clone(),
            TABLE,
        )),
        Arc::new(HandCycle {
            name: "hand-written (same SQL)".into(),
            lock: DB::hand(&server.pool, TABLE),
        }),
        Arc::new(HandCycle {
            name: "seeds' INSERT + DELETE".into(),
            lock: seed,
        }),
    ];
    if let Some(client) = redis {
        contenders.push(Arc::new(
            RedisLock::connect(client, *TASKS.iter().max().unwrap_or(&1)).await?,
        ));
    }
    // Last, so that the others keep their places (DBLOCK .. REDIS).
    let relaxed = DB::relaxed_locker(&server.pool, RELAXED_TABLE).await?;
    if let Some(locker) = relaxed.clone() {
        contenders.push(Arc::new(Dblock {
            name: RELAXED.into(),
            locker,
        }));
    }
    contenders.push(Arc::new(HandCycle {
        name: FLOOR.into(),
        lock: DB::floor(&server.pool),
    }));

    let mut out = Vec::new();
    for tasks in TASKS {
        out.push(compare(settings, &server.label, &contenders, tasks).await);
    }
    if relaxed.is_some() {
        DB::drop_lock_table(&server.pool, RELAXED_TABLE).await?;
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;
    DB::drop_table(&server.pool, SEED_TABLE).await?;
    Ok(out)
}

/// Warms every contender up, then runs the interleaved rounds.
async fn compare(
    settings: &Settings,
    backend: &str,
    contenders: &[Arc<dyn Contender>],
    tasks: usize,
) -> Comparison {
    let timing = (settings.round, LEGS, WARM_UP);
    let total = settings.rounds * ROUND_FACTOR;
    let label = format!("cycle: {backend}");
    let rounds = interleaved(contenders, tasks, total, timing, &label).await;
    Comparison {
        backend: backend.to_owned(),
        tasks,
        names: contenders.iter().map(|c| c.name().to_owned()).collect(),
        rounds,
    }
}

fn cycle_markdown(comparisons: &[Comparison]) -> String {
    let mut out = format!(
        "## 1. Uncontended cycle: dblock vs the same SQL by hand\n\n\
         One cycle = acquire a fresh key, release it; latency is the whole cycle. Each \
         round's time per contender is split into {LEGS} legs, the contenders running in \
         the round's order, then in reverse (A B C, C B A, ...), so that a burst of load \
         on the shared machine lands on all of them alike.\n\n",
    );
    let mut backends: Vec<&str> = comparisons.iter().map(|c| c.backend.as_str()).collect();
    backends.dedup();
    for backend in backends {
        let _ = writeln!(out, "### {backend}\n");
        let mut table = Table::new(&[
            "tasks",
            "contender",
            "cycles/s",
            "p50 ms",
            "p99 ms",
            "vs hand-written",
            "client CPU µs/cycle",
            "client wake-ups/cycle",
            "lost / errors",
        ])
        .words(1);
        for c in comparisons.iter().filter(|c| c.backend == backend) {
            for (i, name) in c.names.iter().enumerate() {
                let (lost, errors) = c.rounds[i]
                    .iter()
                    .fold((0, 0), |(l, e), r| (l + r.lost, e + r.errors));
                let versus = if i == HAND {
                    "1.00x".to_owned()
                } else {
                    let (m, s) = c.ratio(i, HAND);
                    ratio(m, s)
                };
                table.row(vec![
                    c.tasks.to_string(),
                    name.clone(),
                    count(c.throughput(i)),
                    ms_f(c.latency(i, 50.0)),
                    ms_f(c.latency(i, 99.0)),
                    versus,
                    format!("{:.0}", c.cpu_per_op(i) * 1e6),
                    format!("{:.2}", c.wakeups(i)),
                    format!("{lost} / {errors}"),
                ]);
            }
        }
        out.push_str(&table.render());
        out.push('\n');
    }
    if comparisons.is_empty() {
        out.push_str("No database server was reachable: nothing measured.\n\n");
    }
    let _ = writeln!(
        out,
        "Targets: dblock >= {RATIO_TARGET}x hand-written (median of per-round ratios), and \
         client wake-ups per cycle within +{WAKEUP_MARGIN} of hand-written (medians across \
         rounds). Issue 29's: dblock >= {SEED_TARGET}x the seeds' INSERT + DELETE, whose \
         scheme draws no fencing token and takes no expired row over (what those cost: \
         bench/PROFILE.md).\n"
    );
    for c in comparisons {
        let (m, s) = c.ratio(DBLOCK, HAND);
        let (seed, seed_s) = c.ratio(DBLOCK, SEED);
        let extra = c.wakeups(DBLOCK) - c.wakeups(HAND);
        let _ = writeln!(
            out,
            "- {}, {} task(s): dblock / hand-written = {} -> {}; wake-ups {:.2} vs {:.2} \
             ({extra:+.2}) -> {}; dblock / seeds' INSERT = {} -> {}",
            c.backend,
            c.tasks,
            ratio(m, s),
            verdict(m >= RATIO_TARGET),
            c.wakeups(DBLOCK),
            c.wakeups(HAND),
            verdict(extra <= WAKEUP_MARGIN),
            ratio(seed, seed_s),
            verdict(seed >= SEED_TARGET),
        );
        for (i, name) in c.names.iter().enumerate() {
            if let Some(err) = c.rounds[i].iter().find_map(|r| r.first_error.as_ref()) {
                let _ = writeln!(out, "  - first error of {name}: `{err}`");
            }
        }
    }
    out.push('\n');
    out
}

/// dblock's cycle next to its dialect layer, and that layer next to the hand-written
/// statements: where any difference in latency, client CPU and wake-ups comes from.
fn overhead_markdown(comparisons: &[Comparison]) -> String {
    if comparisons.is_empty() {
        return String::new();
    }
    let mut table = Table::new(&[
        "backend, tasks",
        "layer",
        "Δ p50 µs",
        "Δ client CPU µs/cycle",
        "Δ wake-ups/cycle",
    ])
    .words(1);
    // Per comparison and layer: (tasks, Δ CPU µs, Δ wake-ups), for the summary below.
    let mut locker_layer = Vec::new();
    let mut statement_layer = Vec::new();
    for c in comparisons {
        let wakeups = |who: usize| c.wakeups(who);
        for (layer, upper, lower) in [
            (
                "Locker + guard + lease engine (dblock - dialect only)",
                DBLOCK,
                DIALECT,
            ),
            (
                "statement layer (dialect only - hand-written)",
                DIALECT,
                HAND,
            ),
        ] {
            let cpu = (c.cpu_per_op(upper) - c.cpu_per_op(lower)) * 1e6;
            let wake = wakeups(upper) - wakeups(lower);
            if upper == DBLOCK {
                locker_layer.push((c.tasks, cpu, wake));
            } else {
                statement_layer.push((c.tasks, cpu, wake));
            }
            table.row(vec![
                format!("{}, {}", c.backend, c.tasks),
                layer.to_owned(),
                format!(
                    "{:+.0}",
                    (c.latency(upper, 50.0) - c.latency(lower, 50.0)) * 1e6
                ),
                format!("{cpu:+.0}"),
                format!("{wake:+.2}"),
            ]);
        }
    }
    type Layer = [(usize, f64, f64)];
    let one_task = |layer: &Layer, pick: fn(&(usize, f64, f64)) -> f64| {
        median(layer.iter().filter(|l| l.0 == 1).map(pick))
    };
    format!(
        "### Where dblock's difference goes\n\n\
         Medians from the table above, subtracted layer by layer. Client CPU and wake-ups \
         are the whole bench process's (all threads), per completed cycle.\n\n{}\n\
         With one task, dblock's layer above the statements costs about {:+.1} thread \
         wake-ups and {:+.0} µs of client CPU per cycle (median over the backends). In \
         this design `try_acquire` runs its statement on the caller's task (a drop guard \
         hands it to the engine only if the caller goes away mid-statement), registers \
         the lease with the Locker's engine (a mutex, and a wake-up of the engine's task \
         only when the new lease is due before its planned wake-up: with the 30 s default \
         lease that is the first lease after an idle spell), and `release` sends its \
         `DELETE` on the caller's task after taking the lease off the engine's list. The \
         statement layer itself (dialect only - hand-written, same SQL) adds {:+.1} \
         wake-ups and {:+.0} µs of client CPU per cycle. Wake-ups are context switches \
         (voluntary + nonvoluntary, all threads; see `measure::process_cpu`). A perf \
         profile (cpu-clock, 10 s of each alone, PostgreSQL and MariaDB, 1 and 8 tasks) \
         spreads the Locker layer's 9-15 µs of user CPU a cycle thinly: polling and \
         moving its nested futures (4-7 µs), allocations (1-2 µs), the engine's lease \
         list and the metrics keys (under 1 µs each); nothing over 3 µs. It also found a \
         watch channel per lease (eight wait lists, all woken at drop) and a set of own \
         releases kept with no listener running, both since removed. Callgrind (exact \
         instruction counts; MariaDB, one task, the difference of 3,001 and 1,001 cycles) \
         then put the layer at about 10,200 instructions and 12 allocations a cycle over \
         dialect only (97,800 against 87,600): metric keys rebuilt on every call (labels \
         and their hash, about 1,300 instructions and 4 allocations), disabled spans \
         entered at every poll (about 1,000), the key and owner copied twice, rare paths \
         held inline (`release`'s future was 2.0 KB, the boxed attempt's 2.2). With those \
         cut, and a retry's delays made only when it pauses (in both layers), it is about \
         6,100 instructions and 5 allocations (91,800 against 85,600). The tables below \
         time the old design's task pattern (before issue 9: a spawned task per \
         acquisition, a watchdog task per lease, cancel-and-await on release) around one \
         `SELECT 1`, for reference: that is the cost the engine removed.\n\n",
        table.render(),
        one_task(&locker_layer, |l| l.2),
        one_task(&locker_layer, |l| l.1),
        one_task(&statement_layer, |l| l.2),
        one_task(&statement_layer, |l| l.1),
    )
}

fn redis_markdown(comparisons: &[Comparison], have_redis: bool) -> String {
    let mut out = String::from(
        "## 2. Redis reference: SET NX PX + Lua check-and-delete\n\n\
         Run as one more contender inside the rounds of section 1, so each ratio below \
         compares neighbouring time slots.\n\n",
    );
    if !have_redis {
        out.push_str("Redis was off or not reachable: not measured.\n\n");
        return out;
    }
    let mut table = Table::new(&[
        "measured alongside",
        "tasks",
        "Redis cycles/s",
        "p50 ms",
        "p99 ms",
        "dblock / Redis",
        "hand-written / Redis",
    ]);
    for c in comparisons.iter().filter(|c| c.has_redis()) {
        let (d, ds) = c.ratio(DBLOCK, REDIS);
        let (h, hs) = c.ratio(HAND, REDIS);
        table.row(vec![
            c.backend.clone(),
            c.tasks.to_string(),
            count(c.throughput(REDIS)),
            ms_f(c.latency(REDIS, 50.0)),
            ms_f(c.latency(REDIS, 99.0)),
            ratio(d, ds),
            ratio(h, hs),
        ]);
    }
    out.push_str(&table.render());
    out.push('\n');
    out
}

/// Fast mode (`Durability::Relaxed`): its cycles next to durable dblock's and Redis's, in
/// the same rounds.
fn relaxed_markdown(comparisons: &[Comparison]) -> String {
    let mut out = String::from(
        "### Fast mode: `Durability::Relaxed` (PostgreSQL, an UNLOGGED lock table)\n\n\
         One more contender in the rounds of section 1: the same `try_acquire` + `release` \
         on a relaxed Locker's own table. Targets: >= 3x durable dblock and >= 0.3x Redis \
         (medians of per-round ratios). Beside them, the floor of section 1 (two round \
         trips of a `SELECT` that touches no table, on the same pool) against the same \
         two: a target above the floor's own ratio is out of reach of any lock of two \
         statements on this machine, relaxed or not.\n\n",
    );
    let mut table = Table::new(&[
        "backend",
        "tasks",
        "relaxed cycles/s",
        "p50 ms",
        "p99 ms",
        "relaxed / durable dblock",
        "relaxed / Redis",
        "floor / durable dblock",
        "floor / Redis",
    ]);
    let mut rows = 0;
    for c in comparisons {
        let Some(fast) = c.names.iter().position(|n| n == RELAXED) else {
            continue;
        };
        rows += 1;
        let (d, ds) = c.ratio(fast, DBLOCK);
        let versus_redis = |who: usize, target: Option<f64>| {
            if !c.has_redis() {
                return "Redis not measured".to_owned();
            }
            let (r, rs) = c.ratio(who, REDIS);
            match target {
                Some(t) => format!("{} {}", ratio(r, rs), verdict(r >= t)),
                None => floor_ratio(r, rs, RELAXED_VS_REDIS),
            }
        };
        let floor = c.names.iter().position(|n| n == FLOOR);
        let (floor_vs_durable, floor_vs_redis) = match floor {
            Some(floor) => {
                let (d, ds) = c.ratio(floor, DBLOCK);
                (
                    floor_ratio(d, ds, RELAXED_VS_DURABLE),
                    versus_redis(floor, None),
                )
            }
            None => ("not measured".to_owned(), "not measured".to_owned()),
        };
        table.row(vec![
            c.backend.clone(),
            c.tasks.to_string(),
            count(c.throughput(fast)),
            ms_f(c.latency(fast, 50.0)),
            ms_f(c.latency(fast, 99.0)),
            format!("{} {}", ratio(d, ds), verdict(d >= RELAXED_VS_DURABLE)),
            versus_redis(fast, Some(RELAXED_VS_REDIS)),
            floor_vs_durable,
            floor_vs_redis,
        ]);
    }
    if rows == 0 {
        out.push_str("No PostgreSQL server was measured.\n\n");
        return out;
    }
    out.push_str(&table.render());
    out.push('\n');
    out
}

/// The floor's ratio, marked where it is under the `target` asked of relaxed dblock.
fn floor_ratio(median: f64, spread: (f64, f64), target: f64) -> String {
    if median < target {
        format!("{} (under the {target}x target)", ratio(median, spread))
    } else {
        ratio(median, spread)
    }
}
