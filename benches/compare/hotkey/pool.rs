//! Section 3, cell 3: 100 waiters on one key through a pool of 4 connections, while one
//! holder keeps the key for the whole round.
//!
//! Each round builds a Locker on a dedicated pool of [`POOL`] connections (opened before
//! the measurement). The holder takes the key with a short lease ([`LEASE`], renewed by
//! the Locker's lease engine at its default pace, `min(10 s, lease / 3)` = 1 s) and keeps
//! it for the round; meanwhile [`WAITERS`] tasks wait for it, with a wait longer than the
//! round: dblock's `acquire` (a local queue: only its head sends attempts) or the old
//! design's polling loop ([`poll_acquire`]) on the same Locker and pool. At the round's
//! end the waiters are dropped (cancelled), then the holder releases. A third contender,
//! the holder alone, gives the floor: what the holder's own statements (and the pool's)
//! cost without any waiter.
//!
//! Statements per second on the server: the difference of two readings of
//! [`BenchDb::statements_seen`] on a connection of its own, one before the holder
//! acquires and one after the round's pool has been closed (PostgreSQL counts a
//! session's statements when it exits, or up to 10 s late while it idles), minus what the
//! readings themselves sent, divided by the holder's time. The count thus includes the
//! holder's acquisition, renewals and release, and the statements of cancelled waiters.
//! Renewal on time: the holder's lease is never lost, its release succeeds, the engine's
//! `renewed` count rose by one per second held, and the lease left (`expires_at` - now,
//! sampled every [`SAMPLE`]) never fell below [`LEAST_LEFT`].

use std::fmt::Write as _;
use std::time::Duration;

use dblock::Locker;
use sqlx::Pool;
use tokio::time::Instant;

use super::tasks::{WAIT, poll_acquire};
use crate::measure::{median, new_owner, spread, turn_order};
use crate::report::{Table, count, ms, ratio, verdict};
use crate::servers::{BenchDb, Server, counting_admin};
use crate::settings::Settings;

const TABLE: &str = "bench_lock_hot_pool";
const WAITERS: usize = 100;
const POOL: u32 = 4;
const LEASE: Duration = Duration::from_secs(3);
/// The Locker's default renewal pace for [`LEASE`]: `min(DEFAULT_RENEW_INTERVAL, lease / 3)`.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// Shortest round: renewal needs a few intervals to be seen.
const MIN_ROUND: Duration = Duration::from_secs(3);
/// How often the holder looks at its lease.
const SAMPLE: Duration = Duration::from_millis(50);
/// Least lease left for a renewal to count as on time: due at `LEASE - RENEW_EVERY` left,
/// at most 500 ms late.
const LEAST_LEFT: Duration = Duration::from_millis(1500);
/// Issue 10's target: dblock sends at least this many times fewer statements.
const TARGET_FACTOR: f64 = 10.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dblock,
    Poll,
    /// The holder without waiters: the floor (acquisition, renewals, release).
    Alone,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Dblock => "dblock acquire (local queue)",
            Mode::Poll => "polling: try_acquire + jittered backoff (old design)",
            Mode::Alone => "holder alone, no waiters (the floor)",
        }
    }

    fn waiters(self) -> usize {
        if self == Mode::Alone { 0 } else { WAITERS }
    }
}

#[derive(Default)]
struct Round {
    /// The holder's time: acquired to released.
    secs: f64,
    statements: u64,
    /// Acquisition statements the Locker sent for the waiters.
    attempts: u64,
    renewed: u64,
    expected_renewals: u64,
    renewal_errors: u64,
    least_left: Duration,
    lost: Option<String>,
    release_error: Option<String>,
    /// Waiters that got the key (none should: the holder keeps it).
    won: u64,
    waiter_errors: u64,
    first_error: Option<String>,
}

impl Round {
    fn statements_per_sec(&self) -> f64 {
        self.statements as f64 / self.secs
    }

    fn on_time(&self) -> bool {
        self.lost.is_none()
            && self.release_error.is_none()
            && self.renewal_errors == 0
            && self.renewed + 1 >= self.expected_renewals
            && self.least_left >= LEAST_LEFT
    }
}

/// What one waiter's task ended with, if it ended before it was cancelled.
enum Waited {
    Won,
    Failed(String),
}

async fn round<DB: BenchDb>(
    mode: Mode,
    server: &Server<DB>,
    admin: &Pool<DB>,
    key: &str,
    length: Duration,
) -> Result<Round, Box<dyn std::error::Error>> {
    let pool = DB::dedicated_pool(&server.url, POOL).await?;
    let locker = Locker::builder(pool.clone()).table(TABLE).build()?;
    let mut open = Vec::new();
    for _ in 0..POOL {
        open.push(pool.acquire().await?);
    }
    drop(open);

    let before = DB::statements_seen(admin).await?;
    let stats_before = locker.stats();
    let guard = locker
        .try_acquire(key, LEASE)
        .await?
        .ok_or("the holder did not get a fresh key")?;
    let held = Instant::now();
    let waiters: Vec<_> = (0..mode.waiters())
        .map(|_| {
            let locker = locker.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                let won = match mode {
                    Mode::Poll => poll_acquire(&locker, &key, LEASE).await,
                    _ => locker.acquire(&key, LEASE, WAIT).await,
                };
                match won {
                    Ok(guard) => {
                        let _ = guard.release().await;
                        Waited::Won
                    }
                    Err(err) => Waited::Failed(err.to_string()),
                }
            })
        })
        .collect();
    let mut r = Round {
        least_left: LEASE,
        ..Round::default()
    };
    while held.elapsed() < length {
        tokio::time::sleep(SAMPLE).await;
        let left = (guard.expires_at() - chrono::Utc::now())
            .to_std()
            .unwrap_or_default();
        r.least_left = r.least_left.min(left);
    }
    // Drop the waiters first (all marked before any runs again), then release.
    for waiter in &waiters {
        waiter.abort();
    }
    for waiter in waiters {
        match waiter.await {
            Err(_cancelled) => {}
            Ok(Waited::Won) => r.won += 1,
            Ok(Waited::Failed(err)) => {
                r.waiter_errors += 1;
                r.first_error.get_or_insert(err);
            }
        }
    }
    r.lost = guard.lost_reason().map(|reason| format!("{reason:?}"));
    let stats_held = locker.stats();
    r.release_error = guard.release().await.err().map(|e| e.to_string());
    let hold = held.elapsed();
    r.secs = hold.as_secs_f64();
    r.expected_renewals = (hold.as_millis() / RENEW_EVERY.as_millis()) as u64;
    r.renewed = stats_held.renewed - stats_before.renewed;
    r.renewal_errors = stats_held.renewal_errors - stats_before.renewal_errors;
    // Less the holder's own attempt.
    r.attempts = (stats_held.attempts - stats_before.attempts).saturating_sub(1);
    locker.shutdown().await;
    drop(locker);
    pool.close().await;
    let sent = DB::await_sessions_gone(admin).await;
    let after = DB::statements_seen(admin).await?;
    r.statements = after.saturating_sub(before + DB::STATEMENTS_PER_READING + sent);
    Ok(r)
}

/// Cell 3 on one server; its markdown.
pub async fn cell<DB: BenchDb>(
    settings: &Settings,
    server: &Server<DB>,
) -> Result<String, Box<dyn std::error::Error>> {
    let admin = counting_admin(server, TABLE).await?;

    let length = settings.round.max(MIN_ROUND);
    let modes = [Mode::Dblock, Mode::Poll, Mode::Alone];
    let run = new_owner()[..8].to_owned();
    let mut rounds: Vec<Vec<Round>> = modes.iter().map(|_| Vec::new()).collect();
    for r in 0..settings.rounds {
        eprintln!(
            "hotkey: {}, 100 waiters, round {}/{}",
            server.label,
            r + 1,
            settings.rounds
        );
        for i in turn_order(modes.len(), r) {
            let key = format!("hot3:{run}:{r}:{i}");
            rounds[i].push(round(modes[i], server, &admin, &key, length).await?);
        }
    }
    DB::drop_lock_table(&admin, TABLE).await?;
    admin.close().await;

    let mut table = Table::new(&[
        "contender",
        "statements/s on the server",
        "attempts/s",
        "statements per attempt",
        "holder's renewals (got / expected)",
        "least lease left ms",
        "holder's renewals on time (rounds)",
        "waiters that got the key",
        "errors to callers",
    ]);
    for (mode, rs) in modes.iter().zip(&rounds) {
        let renewed: u64 = rs.iter().map(|r| r.renewed).sum();
        let expected: u64 = rs.iter().map(|r| r.expected_renewals).sum();
        let errors: u64 = rs
            .iter()
            .map(|r| r.waiter_errors + u64::from(r.release_error.is_some()))
            .sum();
        table.row(vec![
            mode.name().to_owned(),
            count(median(rs.iter().map(Round::statements_per_sec))),
            count(median(rs.iter().map(|r| r.attempts as f64 / r.secs))),
            if mode.waiters() == 0 {
                "-".to_owned()
            } else {
                format!(
                    "{:.2}",
                    median(
                        rs.iter()
                            .map(|r| r.statements as f64 / r.attempts.max(1) as f64)
                    )
                )
            },
            format!("{renewed} / {expected}"),
            ms(rs.iter().map(|r| r.least_left).min().unwrap_or_default()),
            format!(
                "{} of {}",
                rs.iter().filter(|r| r.on_time()).count(),
                rs.len()
            ),
            if mode.waiters() == 0 {
                "-".to_owned()
            } else {
                rs.iter().map(|r| r.won).sum::<u64>().to_string()
            },
            errors.to_string(),
        ]);
    }
    let mut out = table.render();
    out.push('\n');
    let factors: Vec<f64> = rounds[0]
        .iter()
        .zip(&rounds[1])
        .map(|(d, p)| p.statements_per_sec() / d.statements_per_sec())
        .collect();
    let factor = median(factors.iter().copied());
    let _ = writeln!(
        out,
        "- Target: dblock's statements/s at least {TARGET_FACTOR:.0}x fewer than polling's -> {} \
         (polling / dblock {}, per round).",
        verdict(factor >= TARGET_FACTOR),
        ratio(factor, spread(factors.iter().copied())),
    );
    let on_time = |rs: &[Round]| rs.iter().all(Round::on_time);
    let _ = writeln!(
        out,
        "- Target: the holder's renewals on time in every round (lease never lost, release \
         succeeded, a renewal per second held, lease left >= {} ms) -> dblock: {}; polling: {}.",
        LEAST_LEFT.as_millis(),
        verdict(on_time(&rounds[0])),
        verdict(on_time(&rounds[1])),
    );
    let _ = writeln!(
        out,
        "- Counted on the server: {}, from before the holder's acquisition until the \
         round's pool had closed, less the readings' own; per second of the holder's time \
         ({:.1} s a round). Attempts/s: the Locker's `stats().attempts`, less the holder's.",
        DB::STATEMENTS_SEEN_TEXT,
        median(rounds[0].iter().map(|r| r.secs)),
    );
    for (mode, rs) in modes.iter().zip(&rounds) {
        if let Some(lost) = rs.iter().find_map(|r| r.lost.as_ref()) {
            let _ = writeln!(
                out,
                "- {}: the holder's lease was lost ({lost}).",
                mode.name()
            );
        }
        let first = rs
            .iter()
            .find_map(|r| r.release_error.as_ref().or(r.first_error.as_ref()));
        if let Some(err) = first {
            let _ = writeln!(out, "- first error of {}: `{err}`", mode.name());
        }
    }
    out.push('\n');
    Ok(out)
}
