//! What the cells of sections 1 and 2 share: one run of the uncontended cycle's
//! contenders on a server ([`on_backend`]), interleaved in rounds, and its figures
//! ([`Comparison`]), which each cell reads its own way.

use std::sync::Arc;
use std::time::Duration;

use crate::contenders::{Dblock, DialectOnly, RELAXED, RedisLock};
use crate::handwritten::HandCycle;
use crate::measure::{Contender, Load, interleaved, median, spread};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_cycle";
const SEED_TABLE: &str = "bench_lock_seed";
/// Fast mode's table (`Durability::Relaxed`, PostgreSQL only).
const RELAXED_TABLE: &str = "bench_lock_cycle_relaxed";
/// The floor of two-statement locks (`handwritten::Floor`), the last contender.
pub const FLOOR: &str = "floor: two round trips, no table (`SELECT` of the binds)";
const TASKS: [usize; 2] = [1, 8];
/// Each contender runs this long before the rounds (connections, statement caches).
const WARM_UP: Duration = Duration::from_millis(200);
/// Each round's time per contender is split into this many legs, every contender running
/// once per leg, in the round's order and then in reverse (A B C, C B A, ...). So a
/// burst of the shared machine's load, or a drift such as InnoDB purge catching up,
/// lands on every contender of a round alike: with one slot each, the committed run's
/// MariaDB 1-task ratio of dblock's own statements (dialect only) to the same statements
/// by hand swung 0.71-1.07x from round to round.
pub const LEGS: u32 = 20;
/// Section 1 runs this many times the rounds of the others. Its targets sit a few percent
/// under the ratios it measures, and with five rounds the median of the same code's
/// ratios moved 0.93-1.02x between full runs (client CPU of the Locker layer, measured
/// with perf: 9-15 µs a cycle out of 100-250), so a cell's verdict was a coin toss at
/// the line. Ten rounds of twenty legs take about four minutes.
const ROUND_FACTOR: usize = 2;

/// Who is who in a comparison's list of contenders.
pub const DBLOCK: usize = 0;
pub const DIALECT: usize = 1;
pub const HAND: usize = 2;
pub const SEED: usize = 3;
pub const REDIS: usize = 4;

/// One comparison: every contender's loads, one per round.
pub struct Comparison {
    pub backend: String,
    pub tasks: usize,
    pub names: Vec<String>,
    pub rounds: Vec<Vec<Load>>,
}

impl Comparison {
    /// Whether Redis ran in this comparison (at its place, [`REDIS`]).
    pub fn has_redis(&self) -> bool {
        self.names
            .get(REDIS)
            .is_some_and(|n| n.starts_with("Redis"))
    }

    pub fn throughput(&self, who: usize) -> f64 {
        median(self.rounds[who].iter().map(Load::per_sec))
    }

    pub fn latency(&self, who: usize, p: f64) -> f64 {
        median(
            self.rounds[who]
                .iter()
                .map(|l| l.latencies.clone().percentile(p).as_secs_f64()),
        )
    }

    /// Median client CPU per cycle, in seconds.
    pub fn cpu_per_op(&self, who: usize) -> f64 {
        median(
            self.rounds[who]
                .iter()
                .map(|l| l.cpu_per_op().as_secs_f64()),
        )
    }

    /// Median client wake-ups (context switches) per cycle.
    pub fn wakeups(&self, who: usize) -> f64 {
        median(self.rounds[who].iter().map(Load::wakeups_per_op))
    }

    /// Per-round throughput ratios of `a` to `b`: (median, (lowest, highest)).
    pub fn ratio(&self, a: usize, b: usize) -> (f64, (f64, f64)) {
        let per_round: Vec<f64> = self.rounds[a]
            .iter()
            .zip(&self.rounds[b])
            .map(|(x, y)| x.per_sec() / y.per_sec())
            .collect();
        (median(per_round.iter().copied()), spread(per_round))
    }
}

/// Runs every contender of sections 1 and 2 on `server`, 1 and 8 tasks: one comparison
/// each.
pub async fn on_backend<DB: BenchDb>(
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
