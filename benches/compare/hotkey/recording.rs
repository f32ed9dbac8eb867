//! Cells 3.1 and 3.1b's *history-on* contender: dblock's `acquire` on a Locker built with
//! `history(1 h)`, for issue 44's target that recording the lock history leaves the hot
//! key's handoffs unchanged beyond noise. It shares the durable dblock contender's lock
//! table: the events table comes with that table's migration and goes with
//! `drop_lock_table`, and its keys are fresh each round as every contender's are. The
//! two Lockers differ only in the history, so the per-round ratio of their handoffs/s
//! is what the history costs a handoff: the events noted in memory, and the one
//! statement a tick that writes them.

use std::fmt::Write as _;
use std::time::Duration;

use dblock::{HISTORY_FLUSH_INTERVAL, Locker, Stats};

use super::round::{Round, percentile, speed};
use crate::report::{count, ms_f, ratio, verdict};
use crate::servers::BenchDb;

/// The contender's name in the cells' tables.
pub const NAME: &str = "dblock acquire, history on";

/// The recording Locker's retention, as cell 8.1's: nothing is old enough to trim
/// during the cell (and no reaper runs to trim it).
const RETENTION: Duration = Duration::from_secs(3600);

/// Issue 44's target: history on / history off handoffs/s, median of per-round ratios.
const TARGET: f64 = 0.95;

/// How long after the tick that follows a round its one statement is given to finish.
const WRITE_GRACE: Duration = Duration::from_millis(250);

/// A Locker that records the history on `table`, which the durable contender's Locker
/// has just created and migrated (so this one is built, not migrated), on the same
/// counting `pool`, so its statements, the history's included, are counted as the
/// others'.
pub fn locker<DB: BenchDb>(
    pool: &sqlx::Pool<DB>,
    table: &str,
) -> Result<Locker<DB>, dblock::Error> {
    Locker::builder(pool.clone())
        .table(table)
        .history(RETENTION)
        .build()
}

/// Waits after one of the contender's rounds until what it noted in the round is
/// written. The Locker writes its events once a tick, so the round's last ones go out
/// within a tick after it: left alone, that statement would land in the next
/// contender's round (on MariaDB mostly durable dblock's, the one it is compared with).
pub async fn drain() {
    tokio::time::sleep(HISTORY_FLUSH_INTERVAL + WRITE_GRACE).await;
}

/// The target line under the cell's table: the history-on rounds (`on`) against durable
/// dblock's (`off`), their wait p99s, and what the recording Locker wrote over the cell
/// (`stats`, read after its shutdown, which writes what was left).
pub fn target(out: &mut String, on: &mut [Round], off: &mut [Round], stats: &Stats) {
    let (vs_off, vs_off_spread) = speed(on, off);
    let on_p99 = percentile(on, |r| &mut r.waits, 99.0);
    let off_p99 = percentile(off, |r| &mut r.waits, 99.0);
    let acquisitions: u64 = on.iter().map(|r| r.acquisitions).sum();
    let _ = writeln!(
        out,
        "- Target (issue 44): dblock history on / history off handoffs/s, per round, unchanged \
         beyond noise (median >= {TARGET:.2}x) -> {} (history on / off {}, per round; wait \
         p99 history on {} ms, off {} ms, median of rounds; {} events written in {} history \
         statements for {} acquisitions, {} dropped).",
        verdict(vs_off >= TARGET),
        ratio(vs_off, vs_off_spread),
        ms_f(on_p99),
        ms_f(off_p99),
        count(stats.history_events as f64),
        stats.history_batches,
        count(acquisitions as f64),
        stats.history_dropped,
    );
}
