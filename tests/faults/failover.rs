//! Scenario 8: the primary fails over to a standby while a lock is held (a replicated
//! PostgreSQL from replica.rs, a semi-synchronous MariaDB from semisync.rs; clients reach
//! "the primary" through a proxy that plays the virtual IP).
//!
//! - 8a, synchronous standby, failover shorter than the lease: an acquisition is answered
//!   only once the standby has it; after the failover the row is on the new primary with
//!   the same owner and token, a rival is refused, renewal resumes without `lost()`, and
//!   the next token is greater than every token drawn before.
//! - 8b, synchronous, the virtual IP moves later than the lease: `lost(Unreachable)` by
//!   the lease's end, and a rival on the new primary wins only once the lease has run
//!   out by its clock.
//! - 8c, asynchronous standby that missed the acquisition (its WAL stream held in the
//!   proxy): the new primary has no row, a rival acquires, the holder learns within a
//!   renewal interval, and `assert_held` refuses its write. Fencing tokens go backwards:
//!   the new primary continues the sequence from the last value the standby saw logged
//!   (async_failover.rs).
//! - 8d, synchronous, primary -> standby -> rebuilt standby -> back: tokens never go
//!   backwards.
//! - 8e, MariaDB with a semi-synchronous replica: as 8a, and the fallback to asynchronous
//!   replication when the replica does not acknowledge in time (semisync.rs).

use std::time::Duration;

use dblock::{Error, LockGuard, Locker, LostReason, MySql, Postgres};
use tokio::time::{Instant, sleep, timeout};

use crate::db::FaultDb;
use crate::holder::wall_micros;
use crate::proxy::{Direction, Proxy};
use crate::replica::{self, Mode, Pair};
use crate::report::{Report, before_or_after, ms, secs};
use crate::{Ctx, NotApplicable, Res, Selection, Skipped, renewed, required, scenario, take_over};
use crate::{async_failover, semisync};

/// The group, for rows that stand for all its cases.
pub const NAME: &str = "8 primary failover";

const NAMES: [&str; 5] = [
    "8a failover to a synchronous standby",
    "8b failover longer than the lease (synchronous)",
    "8c failover to an asynchronous standby that missed the lock",
    "8d repeated failovers (synchronous)",
    "8e failover to a semi-synchronous MariaDB replica",
];

/// The cases on PostgreSQL's replication tools (8e is MariaDB's).
pub const POSTGRES_NAMES: [&str; 4] = [NAMES[0], NAMES[1], NAMES[2], NAMES[3]];

/// Why the PostgreSQL cases cannot run here.
pub const NO_REPLICA_TOOLS: &str = "pg_basebackup / pg_ctl are not installed";

/// Short, so that 8b's failover outlasts it quickly; renewed every second.
pub const LEASE: Duration = Duration::from_secs(3);
/// The renewal interval the lockers use for [`LEASE`] (`lease / 3`).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(1);
/// How long after the lease's end (database clock) `lost()` may fire.
const LOST_SLACK: Duration = Duration::from_millis(150);
/// Tokens drawn before a failover: more than the 32 values PostgreSQL logs a sequence
/// ahead by, so the last of them needed a sequence WAL record of its own.
pub const DRAWS: usize = 40;
/// How long 8a watches an acquisition go unanswered while the standby receives nothing.
pub const UNANSWERED: Duration = Duration::from_millis(500);
/// How long any one step may take before it counts as hung.
pub const STEP: Duration = Duration::from_secs(10);
/// A key only [`draw`] uses.
const DRAW_KEY: &str = "fault:failover:draw";

pub async fn run_all<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    if DB::LABEL == <MySql as FaultDb>::LABEL {
        scenario(ctx, report, selection, NAMES[4], async |_: &mut Ctx<DB>| {
            semisync::run().await
        })
        .await;
        return;
    }
    if DB::LABEL != <Postgres as FaultDb>::LABEL {
        scenario(ctx, report, selection, NAME, async |_: &mut Ctx<DB>| {
            Err(NotApplicable("embedded: no replicas").into())
        })
        .await;
        return;
    }
    scenario(ctx, report, selection, NAMES[0], async |_: &mut Ctx<DB>| {
        ready()?;
        sync_failover().await
    })
    .await;
    scenario(ctx, report, selection, NAMES[1], async |_: &mut Ctx<DB>| {
        ready()?;
        longer_than_lease().await
    })
    .await;
    scenario(ctx, report, selection, NAMES[2], async |_: &mut Ctx<DB>| {
        ready()?;
        async_failover::run().await
    })
    .await;
    scenario(ctx, report, selection, NAMES[3], async |_: &mut Ctx<DB>| {
        ready()?;
        repeated().await
    })
    .await;
}

/// Fails (in CI) or skips when the replication tools are missing.
fn ready() -> Res<()> {
    if replica::installed() {
        return Ok(());
    }
    let reason = NO_REPLICA_TOOLS.to_owned();
    if required("postgres") {
        return Err(reason.into());
    }
    Err(Skipped(reason).into())
}

/// Takes and releases [`DRAW_KEY`] `n` times; returns the highest token drawn.
pub async fn draw<DB: FaultDb>(locker: &Locker<DB>, n: usize) -> Res<i64> {
    let mut highest = 0;
    for _ in 0..n {
        let guard = locker
            .try_acquire(DRAW_KEY, LEASE)
            .await?
            .ok_or("draw key held")?;
        highest = highest.max(guard.fencing_token());
        guard.release().await?;
    }
    Ok(highest)
}

/// A locker straight to the current primary (not through the virtual IP).
pub async fn direct(pair: &Pair) -> Res<Locker<Postgres>> {
    Ok(Locker::new(pair.primary_pool().await?))
}

/// The guard's row is on `at`, with its owner and token, and live.
pub async fn same_row<DB: FaultDb>(at: &Locker<DB>, guard: &LockGuard<DB>) -> Res<()> {
    let row = at
        .holder(guard.key())
        .await?
        .ok_or_else(|| format!("{:?}: no row on the new primary", guard.key()))?;
    ensure!(
        row.owner == guard.owner() && row.fencing_token == guard.fencing_token() && !row.expired,
        "{:?} on the new primary: {row:?}, expected owner {} token {}",
        guard.key(),
        guard.owner(),
        guard.fencing_token()
    );
    Ok(())
}

/// Acquires `key` while `link` (the replication stream) is held: the acquisition must
/// stay unanswered for [`UNANSWERED`] (its commit waits for the `replica`), and be
/// answered, won, once the stream flows again.
pub async fn answered_once_replicated<DB: FaultDb>(
    link: &Proxy,
    locker: &Locker<DB>,
    key: &'static str,
    replica: &str,
) -> Res<LockGuard<DB>> {
    link.hold(Direction::Down, true);
    let pending = tokio::spawn({
        let locker = locker.clone();
        async move { locker.try_acquire(key, LEASE).await }
    });
    sleep(UNANSWERED).await;
    ensure!(
        !pending.is_finished(),
        "the acquisition was answered while the {replica} received nothing"
    );
    link.hold(Direction::Down, false);
    let guard = timeout(STEP, pending)
        .await
        .map_err(|_| "the acquisition was not answered once replication flowed")???
        .ok_or("key held")?;
    Ok(guard)
}

async fn sync_failover() -> Res<String> {
    let key = "fault:failover:sync";
    let mut pair = Pair::start(Mode::Sync).await?;
    let locker = pair.locker().await?;
    let rival = pair.locker().await?;
    let drawn = draw(&locker, DRAWS).await?;
    // Synchronous: while the standby receives nothing, the acquisition is not answered
    // (its commit waits for the standby's flush); it is once the stream flows again.
    let guard = answered_once_replicated(&pair.link, &locker, key, "synchronous standby").await?;
    // Right after a renewal, so that almost the whole lease is left at the kill.
    renewed(&guard, LEASE).await?;
    let granted = guard.expires_at().timestamp_micros();
    let took = pair.fail_over().await?;
    renewed(&guard, LEASE).await?;
    let margin = granted - wall_micros();
    ensure!(
        guard.lost_reason().is_none(),
        "lost ({:?}) across a {} failover (lease {})",
        guard.lost_reason(),
        secs(took),
        secs(LEASE)
    );
    same_row(&direct(&pair).await?, &guard).await?;
    ensure!(
        rival.try_acquire(key, LEASE).await?.is_none(),
        "a rival got the lock on the new primary"
    );
    let token = guard.fencing_token();
    guard.release().await?;
    let next = rival
        .try_acquire(key, LEASE)
        .await?
        .ok_or("released key held")?;
    let next_token = next.fencing_token();
    next.release().await?;
    ensure!(
        next_token > token.max(drawn),
        "the next token {next_token} is not above {} (before the failover)",
        token.max(drawn)
    );
    Ok(format!(
        "acquisition unanswered while the standby received nothing; failover {} (kill, \
         promote, VIP moved), lease {}: renewed on the new primary with \
         {} of the granted lease left; same owner and token {token}, rival refused; next \
         token {next_token}",
        secs(took),
        secs(LEASE),
        ms(margin)
    ))
}

async fn longer_than_lease() -> Res<String> {
    let key = "fault:failover:long";
    let mut pair = Pair::start(Mode::Sync).await?;
    let locker = pair.locker().await?;
    let guard = locker.try_acquire(key, LEASE).await?.ok_or("key held")?;
    renewed(&guard, LEASE).await?;
    // The standby is promoted at once, but the virtual IP does not move: the holder
    // reaches no primary, a client with the new address does.
    let started = Instant::now();
    pair.vip.cut();
    pair.kill_primary().await?;
    pair.promote().await?;
    let promoted = started.elapsed();
    let rival = direct(&pair).await?;
    same_row(&rival, &guard).await?;
    let expiry = guard.expires_at().timestamp_micros();
    let rival_from = wall_micros();
    let rival_wins = tokio::spawn({
        let rival = rival.clone();
        async move { take_over(&rival, key, LEASE, Instant::now() + LEASE * 3).await }
    });

    let reason = timeout(LEASE + RENEW_INTERVAL, guard.lost())
        .await
        .map_err(|_| "lost() did not fire by the lease's end")?;
    let lost_wall = wall_micros();
    ensure!(
        reason == LostReason::Unreachable,
        "lost() fired with {reason:?}, expected Unreachable"
    );
    let lost_margin = expiry - lost_wall;
    ensure!(
        lost_margin >= -(LOST_SLACK.as_micros() as i64),
        "lost() fired {} after the lease ended (database clock)",
        ms(-lost_margin)
    );
    let (next, _, taken_wall) = rival_wins.await??;
    // The new primary's clock is this machine's (2 ms for rounding).
    ensure!(
        taken_wall >= expiry - 2_000,
        "the rival took the key {} before the lease ran out",
        ms(expiry - taken_wall)
    );
    ensure!(
        rival_from < expiry,
        "the rival started trying only after the expiry: nothing was refused"
    );
    ensure!(
        next.fencing_token() > guard.fencing_token(),
        "token {} after {}",
        next.fencing_token(),
        guard.fencing_token()
    );
    pair.move_vip();
    pair.vip.restore();
    let lost_token = guard.fencing_token();
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(Error::NotHeld { .. })),
        "releasing the lost guard returned {released:?}, expected NotHeld"
    );
    let token = next.fencing_token();
    next.release().await?;
    Ok(format!(
        "promoted in {}, VIP held back: lost(Unreachable) {} the DB expiry; the rival, \
         refused from {} before it, won {} after it; token {} -> {token}",
        secs(promoted),
        before_or_after(lost_margin),
        ms(expiry - rival_from).trim_start_matches('+'),
        ms(taken_wall - expiry),
        lost_token
    ))
}

async fn repeated() -> Res<String> {
    let key = "fault:failover:repeated";
    let mut pair = Pair::start(Mode::Sync).await?;
    let locker = pair.locker().await?;
    let rival = pair.locker().await?;
    let mut figures = Vec::new();
    let mut highest = 0;
    for round in 0..2 {
        if round > 0 {
            pair.rebuild().await?;
        }
        let from = pair.primary_name();
        highest = highest.max(draw(&locker, DRAWS).await?);
        let guard = locker.try_acquire(key, LEASE).await?.ok_or("key held")?;
        highest = highest.max(guard.fencing_token());
        renewed(&guard, LEASE).await?;
        let took = pair.fail_over().await?;
        renewed(&guard, LEASE).await?;
        ensure!(
            guard.lost_reason().is_none(),
            "lost ({:?}) across failover {}",
            guard.lost_reason(),
            round + 1
        );
        same_row(&direct(&pair).await?, &guard).await?;
        ensure!(
            rival.try_acquire(key, LEASE).await?.is_none(),
            "a rival got the lock after failover {}",
            round + 1
        );
        guard.release().await?;
        let next = rival
            .try_acquire(key, LEASE)
            .await?
            .ok_or("released key held")?;
        let token = next.fencing_token();
        next.release().await?;
        ensure!(
            token > highest,
            "after failover {} the token is {token}, not above {highest}",
            round + 1
        );
        figures.push(format!(
            "{from} -> {} in {}: tokens up to {highest}, then {token}",
            pair.primary_name(),
            secs(took)
        ));
        highest = token;
    }
    Ok(figures.join("; "))
}
