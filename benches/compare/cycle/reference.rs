//! Section 2: Redis as one more contender of section 1's rounds, and fast mode
//! (`Durability::Relaxed`) beside durable dblock, Redis and the floor.

use super::comparison::{Comparison, DBLOCK, FLOOR, HAND, REDIS};
use crate::contenders::RELAXED;
use crate::report::{Table, count, ms_f, ratio, verdict};

/// Fast mode's targets (issue 29): relaxed dblock / durable dblock, and / Redis.
const RELAXED_VS_DURABLE: f64 = 3.0;
const RELAXED_VS_REDIS: f64 = 0.3;

/// Section 2's heading and the Redis table (or why it was not measured).
pub fn markdown(comparisons: &[Comparison], have_redis: bool) -> String {
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
pub fn relaxed_markdown(comparisons: &[Comparison]) -> String {
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
