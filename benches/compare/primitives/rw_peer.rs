//! Section 7, cell 4: dblock's read-write lock against a peer's, where the database has
//! one to compare with ([`BenchDb::peer_rw_lock`]: PostgreSQL's session advisory locks,
//! as the Rust `distributed-lock` crate takes them). 1 and 8 tasks take a write, or a
//! read, of one lock and give it back at once, again; beside them, in the same
//! interleaved rounds, dblock's mutex cycle (`try_acquire` + `release` of a fresh key,
//! as in sections 1 and 7.1: the targets' reference) and, reported, a mutex on one key
//! that every task takes with a waiting `acquire` (as every write excludes the others).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::contenders::{Exclusive, Read, Write};
use super::loads::{errors, p99, ratio_of, rounds, throughput};
use crate::contenders::Dblock;
use crate::measure::Contender;
use crate::report::{Table, count, ms_f, ratio, verdict};
use crate::servers::{BenchDb, POOL_SIZE, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_rw_peer";
const TASKS: [usize; 2] = [1, 8];

/// Issue 45's targets: dblock's writes against the peer's, with 1 task and with 8...
const WRITE_VS_PEER: [f64; 2] = [0.4, 0.25];
/// ... each write within 1.2x of dblock's mutex cycle (at least 1 / 1.2 of its rate)...
const WRITE_VS_MUTEX: f64 = 1.0 / 1.2;
/// ... and reads no worse than 0.6x the peer's.
const READ_VS_PEER: f64 = 0.6;

/// The contenders, in the order of their loads.
const MUTEX: usize = 0;
const ONE_KEY: usize = 1;
const WRITE: usize = 2;
const PEER_WRITE: usize = 3;
const READ: usize = 4;
const PEER_READ: usize = 5;

/// Cell 4 on one server; its markdown, `None` where the server has no peer.
pub async fn cell<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<Option<String>, Box<dyn std::error::Error>> {
    // The peer's own pool, as large as dblock's: one connection per task.
    let peer_pool = DB::dedicated_pool(&server.url, POOL_SIZE).await?;
    let Some(peer) = DB::peer_rw_lock(&peer_pool) else {
        peer_pool.close().await;
        return Ok(None);
    };
    let locker = server.fresh_locker(TABLE).await?;
    let lock = locker.rw_lock("bench-rw-peer");
    let contenders: [Arc<dyn Contender>; 6] = [
        Arc::new(Dblock {
            name: "mutex cycle".into(),
            locker: locker.clone(),
        }),
        Arc::new(Exclusive {
            locker: locker.clone(),
            key: "bench:rw-mutex",
            hold: Duration::ZERO,
        }),
        Arc::new(Write { lock: lock.clone() }),
        peer.write,
        Arc::new(Read {
            lock,
            hold: Duration::ZERO,
        }),
        peer.read,
    ];
    let names = [
        "dblock mutex cycle: try_acquire + release, fresh key",
        "dblock mutex on one key: acquire + release",
        "dblock rw_lock write + release",
        "peer write: pg_advisory_lock + unlock",
        "dblock rw_lock read + release",
        "peer read: pg_advisory_lock_shared + unlock",
    ];
    let mut table = Table::new(&[
        "tasks",
        "contender",
        "cycles/s",
        "p99 ms",
        "vs peer",
        "vs mutex",
        "lost / errors",
    ])
    .words(1);
    let mut verdicts = Vec::new();
    for (t, tasks) in TASKS.into_iter().enumerate() {
        let loads = rounds(settings, "rw lock vs peer", &contenders, tasks).await;
        let vs = |i: usize, of: usize| ratio_of(&loads[i], &loads[of]);
        for (i, name) in names.iter().enumerate() {
            let peer_of = match i {
                WRITE => Some(PEER_WRITE),
                READ => Some(PEER_READ),
                _ => None,
            };
            table.row(vec![
                tasks.to_string(),
                (*name).to_owned(),
                count(throughput(&loads[i])),
                ms_f(p99(&loads[i])),
                peer_of.map_or("-".to_owned(), |of| shown(vs(i, of))),
                if i == WRITE || i == ONE_KEY {
                    shown(vs(i, MUTEX))
                } else {
                    "-".to_owned()
                },
                errors(&loads[i]),
            ]);
        }
        verdicts.push(line(
            &format!("writes / peer writes, {tasks} task(s)"),
            vs(WRITE, PEER_WRITE),
            WRITE_VS_PEER[t],
        ));
        verdicts.push(line(
            &format!("writes / dblock's mutex cycle, {tasks} task(s)"),
            vs(WRITE, MUTEX),
            WRITE_VS_MUTEX,
        ));
        verdicts.push(line(
            &format!("reads / peer reads, {tasks} task(s)"),
            vs(READ, PEER_READ),
            READ_VS_PEER,
        ));
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;
    peer_pool.close().await;

    let mut out = format!(
        "Each task takes a write (or a read) of one lock and gives it back at once, again; \
         interleaved in rounds as in section 1 with dblock's mutex cycle (`try_acquire` + \
         `release` of a fresh key, as in sections 1 and 7.1: the reference of the write \
         target) and a mutex on one key that every task takes with a waiting `acquire` \
         (reported: the like of an exclusive write when tasks contend). The peer: {}.\n\n",
        peer.text
    );
    out.push_str(&table.render());
    out.push('\n');
    for line in verdicts {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    Ok(Some(out))
}

/// A ratio of [`ratio_of`] as the table shows it.
fn shown((median, spread): (f64, (f64, f64))) -> String {
    ratio(median, spread)
}

/// A target line: `what` is `ratio` (median of per-round ratios), at least `target`.
fn line(what: &str, (median, spread): (f64, (f64, f64)), target: f64) -> String {
    format!(
        "- Target: {what} >= {target:.2}x -> {} ({})",
        verdict(median >= target),
        ratio(median, spread)
    )
}
