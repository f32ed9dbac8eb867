//! Section 7, cell 4: dblock's read-write lock against a peer's, where the database has
//! one to compare with ([`BenchDb::peer_rw_lock`]: PostgreSQL's session advisory locks,
//! as the Rust `distributed-lock` crate takes them). 1 and 8 tasks take a write, or a
//! read, of one lock and give it back at once, again; beside them, in the same
//! interleaved rounds, dblock's mutex cycle (`try_acquire` + `release` of a fresh key,
//! as in sections 1 and 7.1: the targets' reference), a mutex on one key that every task
//! takes with a waiting `acquire` (as every write of one lock excludes the others), and
//! where a write's time goes: dblock's write of a fresh lock each cycle (its tasks never
//! meet, as the mutex cycle's do not) and the same statements by hand
//! ([`BenchDb::hand_write`]). Its lines are in [`rw_lines`](super::rw_lines).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::contenders::{Exclusive, FreshWrite, Read, Write};
use super::loads::{errors, p99, ratio_of, rounds, throughput};
use super::rw_lines::{
    FRESH_WRITE, HAND_WRITE, MUTEX, ONE_KEY, PEER_READ, PEER_WRITE, READ, WRITE, lines,
};
use crate::contenders::Dblock;
use crate::handwritten::write::NAME as HAND_WRITE_NAME;
use crate::measure::Contender;
use crate::report::{Table, count, ms_f, ratio};
use crate::servers::{BenchDb, POOL_SIZE, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_rw_peer";
const TASKS: [usize; 2] = [1, 8];

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
    // On dblock's own pool, as section 1's hand-written cycle is (one contender runs at
    // a time).
    let Some(hand_write) = DB::hand_write(&server.pool, TABLE) else {
        peer_pool.close().await;
        return Err("no hand-written write of dblock's statements for this server".into());
    };
    let locker = server.fresh_locker(TABLE).await?;
    let lock = locker.rw_lock("bench-rw-peer");
    let contenders: [Arc<dyn Contender>; 8] = [
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
        Arc::new(FreshWrite {
            locker: locker.clone(),
        }),
        hand_write,
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
        "dblock rw_lock write + release, one lock shared by all tasks",
        "dblock rw_lock write + release, a fresh lock each cycle",
        HAND_WRITE_NAME,
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
            // Only like against like: the peer locks one key, as the shared-lock write
            // and the reads do.
            let peer_of = match i {
                WRITE => Some(PEER_WRITE),
                READ => Some(PEER_READ),
                _ => None,
            };
            let of_mutex = matches!(i, ONE_KEY | WRITE | FRESH_WRITE | HAND_WRITE);
            table.row(vec![
                tasks.to_string(),
                (*name).to_owned(),
                count(throughput(&loads[i])),
                ms_f(p99(&loads[i])),
                peer_of.map_or("-".to_owned(), |of| shown(vs(i, of))),
                if of_mutex {
                    shown(vs(i, MUTEX))
                } else {
                    "-".to_owned()
                },
                errors(&loads[i]),
            ]);
        }
        verdicts.extend(lines(tasks, t, vs));
    }
    DB::drop_lock_table(&server.pool, TABLE).await?;
    peer_pool.close().await;

    let mut out = format!(
        "Each task takes a write (or a read) of one lock and gives it back at once, again; \
         interleaved in rounds as in section 1 with dblock's mutex cycle (`try_acquire` + \
         `release` of a fresh key, as in sections 1 and 7.1: the reference of the write \
         target), a mutex on one key that every task takes with a waiting `acquire` \
         (reported: the like of an exclusive write when tasks contend), and where a write's \
         time goes: dblock's `try_write` + `release` of a fresh lock each cycle (`rw_lock` \
         of a new name, so its tasks never meet, as the mutex cycle's fresh keys do not), \
         and the same statements by hand with sqlx on dblock's pool (the `SELECT` of \
         `<table>_take_write(...)`, which takes the writer's and the grant's rows and looks \
         for readers in one call, then the one owner- and token-checked `DELETE` of both \
         rows; copied from dblock's source and checked against it at start-up). Ceiling \
         lines say what the statements, an exclusive lock, or any lock that commits a \
         row allow at best. The peer: {}.\n\n",
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
