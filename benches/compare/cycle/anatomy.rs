//! The old design's task pattern (before issue 9's lease engine), timed around one cheap
//! real statement, for reference: what the engine removed from the cycle.
//!
//! Before the engine, dblock's work per cycle was (src/locker.rs and src/lease.rs at
//! 9d181ee): validate the input, make an owner value, run the statement in a task of
//! its own and await its reply on a oneshot channel (cancel safety), spawn a watchdog task
//! per lease (waiting on a cancellation token or its renewal timer), and on release
//! cancel the watchdog and wait until it has stopped.
//!
//! In a tight loop with no I/O those cost a microsecond or two. Between statements,
//! though, the runtime's workers park; a task spawned or woken then can wake a parked
//! worker on another thread, and on a busy machine that thread waits for a core. So each
//! part is timed here around a real `SELECT 1` (which parks the worker like the lock's
//! own statements do), interleaved in rounds, and compared with the bare statement.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::measure::{median, process_cpu, turn_order};
use crate::report::Table;
use crate::servers::Statement;

const ROUNDS: usize = 5;
const OPS_PER_ROUND: u32 = 400;

#[derive(Clone, Copy)]
enum Part {
    Bare,
    InTask,
    Watchdog,
    Both,
}

impl Part {
    const ALL: [Part; 4] = [Part::Bare, Part::InTask, Part::Watchdog, Part::Both];

    fn name(self) -> &'static str {
        match self {
            Part::Bare => "the statement alone",
            Part::InTask => "+ run it in a spawned task, await a oneshot reply",
            Part::Watchdog => "+ spawn a watchdog after it, cancel it, await its stop",
            Part::Both => "+ both, nested as the old design did (watchdog spawned by the task)",
        }
    }

    async fn once(self, statement: &Statement) {
        match self {
            Part::Bare => statement().await,
            Part::InTask => {
                let (reply, answer) = oneshot::channel();
                let run = statement();
                tokio::spawn(async move {
                    run.await;
                    let _ = reply.send(());
                });
                let _ = answer.await;
            }
            Part::Watchdog => {
                statement().await;
                let (stop, stopped) = spawn_watchdog();
                stop.cancel();
                stopped.cancelled().await;
            }
            Part::Both => {
                let (reply, answer) = oneshot::channel();
                let run = statement();
                tokio::spawn(async move {
                    run.await;
                    let _ = reply.send(spawn_watchdog());
                });
                if let Ok((stop, stopped)) = answer.await {
                    stop.cancel();
                    stopped.cancelled().await;
                }
            }
        }
    }
}

/// A watchdog as `Lease::start` spawns it: waits for its stop token or its timer, and
/// signals `stopped` when it ends.
fn spawn_watchdog() -> (CancellationToken, CancellationToken) {
    let (stop, stopped) = (CancellationToken::new(), CancellationToken::new());
    let (watch_stop, signal) = (stop.clone(), stopped.clone());
    tokio::spawn(async move {
        let _signal_stopped = signal.drop_guard();
        tokio::select! {
            biased;
            _ = watch_stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    });
    (stop, stopped)
}

/// Per-op figures of one part in one round: wall µs, CPU µs, wake-ups.
type Figures = (f64, f64, f64);

async fn round(part: Part, statement: &Statement) -> Figures {
    let before = process_cpu();
    let started = Instant::now();
    for _ in 0..OPS_PER_ROUND {
        part.once(statement).await;
    }
    let wall = started.elapsed();
    let after = process_cpu();
    let n = f64::from(OPS_PER_ROUND);
    (
        wall.as_secs_f64() * 1e6 / n,
        after.cpu.saturating_sub(before.cpu).as_secs_f64() * 1e6 / n,
        after.wakeups.saturating_sub(before.wakeups) as f64 / n,
    )
}

/// Times every part on `backend` from a task of the runtime, as application code runs;
/// returns the markdown.
pub async fn markdown(backend: &str, statement: Statement) -> String {
    let measured = tokio::spawn(async move {
        let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); Part::ALL.len()];
        for part in Part::ALL {
            part.once(&statement).await; // warm the connection and the statement cache
        }
        for r in 0..ROUNDS {
            for i in turn_order(Part::ALL.len(), r) {
                figures[i].push(round(Part::ALL[i], &statement).await);
            }
        }
        figures
    })
    .await;
    let Ok(figures) = measured else {
        return format!("The task pattern could not be timed on {backend}.\n\n");
    };
    let med = |i: usize, pick: fn(&Figures) -> f64| median(figures[i].iter().map(pick));
    let mut table = Table::new(&[
        "per statement",
        "wall µs",
        "Δ wall",
        "client CPU µs",
        "Δ CPU",
        "wake-ups",
        "Δ wake-ups",
    ]);
    for (i, part) in Part::ALL.iter().enumerate() {
        let (wall, cpu, wake) = (med(i, |f| f.0), med(i, |f| f.1), med(i, |f| f.2));
        let (wall0, cpu0, wake0) = (med(0, |f| f.0), med(0, |f| f.1), med(0, |f| f.2));
        table.row(vec![
            part.name().to_owned(),
            format!("{wall:.0}"),
            format!("{:+.0}", wall - wall0),
            format!("{cpu:.0}"),
            format!("{:+.0}", cpu - cpu0),
            format!("{wake:.2}"),
            format!("{:+.2}", wake - wake0),
        ]);
    }
    format!(
        "The old design's task pattern around one `SELECT 1` on {backend}, one task, {ROUNDS} \
         interleaved rounds of {OPS_PER_ROUND} (medians; `benches/compare/cycle/anatomy.rs`):\n\n{}\n",
        table.render()
    )
}
