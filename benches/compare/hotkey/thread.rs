//! Cell 3.1's ceiling: what a queue's handoff costs beside polling's. Polling's releaser
//! mostly takes the key straight back (no other task runs in between); a queue hands the
//! key to another task, so each handoff costs its statements (on PostgreSQL one: the
//! release gives the row to the next waiter; elsewhere two: the release, then the next
//! holder's acquisition) plus one task wake-up, which on a multi-thread runtime can be a
//! wake-up of another worker thread. The same 8 tasks on a one-thread runtime, where
//! that wake-up crosses no threads, show what is left of the difference.

use std::sync::Arc;
use std::time::Duration;

use dblock::Locker;

use super::round::{Round, interleaved};
use super::tasks::Side;
use crate::measure::{median, spread};
use crate::report::{count, ratio};
use crate::servers::{BenchDb, Server};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_hot_thread";

/// Runs dblock against polling, 8 tasks, on a current-thread runtime of its own (its
/// own pool of the bench's settings) in interleaved rounds; returns the report's line.
/// `retakes`: the share of polling's handoffs on the multi-thread runtime in which the
/// releaser took the key again.
pub async fn ceiling<DB: BenchDb>(settings: &Settings, url: &str, retakes: f64) -> String {
    let (rounds, length, url) = (settings.rounds, settings.round, url.to_owned());
    let (send, receive) = tokio::sync::oneshot::channel();
    // A thread of its own: a runtime cannot be started on a runtime's thread.
    std::thread::spawn(move || {
        let measured = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
            .and_then(|runtime| runtime.block_on(one_thread::<DB>(rounds, length, &url)));
        let _ = send.send(measured);
    });
    let measured = receive
        .await
        .unwrap_or_else(|_| Err("the thread died".into()));
    match measured {
        Ok((dblock, poll)) => {
            let speed: Vec<f64> = dblock
                .iter()
                .zip(&poll)
                .map(|(d, p)| d.per_sec() / p.per_sec())
                .collect();
            format!(
                "- What a queue's handoff costs: polling's releaser took the key \
                 straight back in {:.0}% of its handoffs above (no other task runs in \
                 between); dblock's queue hands it to the next waiter: on PostgreSQL in the \
                 release's own statement, elsewhere by the waiter's own acquisition, plus \
                 one task wake-up per handoff, which on a multi-thread runtime can be a \
                 wake-up of another worker thread. \
                 The same 8 tasks on a one-thread runtime (`current_thread`, own pool, {} \
                 interleaved rounds), where no wake-up crosses threads: dblock {} handoffs/s, \
                 polling {}, dblock / polling {} per round (releaser re-takes: dblock \
                 {:.0}%, polling {:.0}%).\n",
                100.0 * retakes,
                dblock.len(),
                count(median(dblock.iter().map(Round::per_sec))),
                count(median(poll.iter().map(Round::per_sec))),
                ratio(median(speed.iter().copied()), spread(speed.iter().copied())),
                100.0 * median(dblock.iter().map(Round::retake_share)),
                100.0 * median(poll.iter().map(Round::retake_share)),
            )
        }
        Err(e) => format!("- One-thread runtime comparison not measured: {e}\n"),
    }
}

async fn one_thread<DB: BenchDb>(
    rounds: usize,
    length: Duration,
    url: &str,
) -> Result<(Vec<Round>, Vec<Round>), String> {
    let pool = DB::dedicated_pool(url, 8)
        .await
        .map_err(|e| e.to_string())?;
    let server = Server {
        pool,
        label: "one-thread runtime".into(),
        url: url.to_owned(),
    };
    let locker = server
        .fresh_locker(TABLE)
        .await
        .map_err(|e| e.to_string())?;
    let polling = Locker::builder(server.pool.clone())
        .table(TABLE)
        .build()
        .map_err(|e| e.to_string())?;
    let sides = [
        Arc::new(Side::Dblock(locker.clone())),
        Arc::new(Side::Poll(polling)),
    ];
    let mut measured = interleaved(&sides, &server.pool, rounds, length, |_| {}).await;
    DB::drop_lock_table(&server.pool, TABLE)
        .await
        .map_err(|e| e.to_string())?;
    locker.shutdown().await;
    server.pool.close().await;
    let poll = measured.pop().unwrap_or_default();
    let dblock = measured.pop().unwrap_or_default();
    Ok((dblock, poll))
}
