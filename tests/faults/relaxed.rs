//! Scenario 3b (PostgreSQL): a relaxed lock table (`Durability::Relaxed`, `UNLOGGED`)
//! across a server crash. The crash empties the table: the rows are gone, each holder
//! learns `lost(Deleted)` at its next renewal, a rival acquires at once with a token
//! greater than every token drawn before the crash (the first acquisition after the
//! server's new start moves the logged sequence 2^32 ahead), and the stale holder's write
//! is refused by `assert_held` and by a resource that compares tokens.

use std::time::Duration;

use dblock::{Durability, Error, LockGuard, Locker, LostReason, Postgres};
use sqlx::postgres::PgPoolOptions;
use tokio::time::{Instant, timeout};

use crate::db::FaultDb;
use crate::report::secs;
use crate::server::Stop;
use crate::{Ctx, NotApplicable, Res, eventually};

pub const NAME: &str = "3b relaxed (UNLOGGED) lock table across a crash";

/// Outlasts the crash and restart: the locks are lost to the crash, not to expiry.
const LEASE: Duration = Duration::from_secs(60);
/// Renewal as often as this, so that holders learn soon after the server is back.
const RENEW: Duration = Duration::from_secs(1);
/// How long a step may take on a loaded machine (reconnecting pools included).
const STEP: Duration = Duration::from_secs(30);
const TABLE: &str = "fault_relaxed_lock";
/// How far the first acquisition after a server start moves the token sequence.
const EPOCH_STEP: i64 = 1 << 32;

pub async fn run<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    if DB::LABEL != <Postgres as FaultDb>::LABEL {
        return Err(NotApplicable("PostgreSQL only: no unlogged tables here").into());
    }
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&ctx.url)
        .await?;
    let relaxed = || {
        Locker::builder(pool.clone())
            .table(TABLE)
            .durability(Durability::Relaxed)
            .default_lease(LEASE)
            .renew_interval(RENEW)
            .build()
    };
    let (holder, rival) = (relaxed()?, relaxed()?);
    holder.migrate().await?;
    <Postgres as FaultDb>::reset_resource(&pool).await?;

    // Tokens drawn before the crash: a cycled key, and two held keys.
    let mut highest = 0;
    for _ in 0..3 {
        let guard = holder
            .try_acquire("relaxed:c", LEASE)
            .await?
            .ok_or("key held")?;
        highest = highest.max(guard.fencing_token());
        guard.release().await?;
    }
    let mut held: Vec<LockGuard<Postgres>> = Vec::new();
    for key in ["relaxed:a", "relaxed:b"] {
        let guard = holder.try_acquire(key, LEASE).await?.ok_or("key held")?;
        highest = highest.max(guard.fencing_token());
        held.push(guard);
    }
    let stale = &held[0];
    ensure!(
        <Postgres as FaultDb>::fenced_write(&pool, "holder", stale.fencing_token()).await?,
        "the holder's own fenced write was refused"
    );

    let server = ctx.server.as_mut().ok_or("no server to crash")?;
    let down = Instant::now();
    server.stop(Stop::Crash).await?;
    server.restart().await?;
    let downtime = down.elapsed();

    // Crash recovery emptied the table (the pool reconnects on its own).
    let gone = eventually("the relaxed rows are gone", STEP, async || {
        let rows = <Postgres as FaultDb>::count(&pool, TABLE).await;
        Ok(matches!(rows, Ok(0)))
    })
    .await?;

    // Each holder learns at its next renewal: Deleted, not expired, not unreachable.
    let back = Instant::now();
    for guard in &held {
        let reason = timeout(STEP, guard.lost())
            .await
            .map_err(|_| format!("{:?}: no loss signal within {STEP:?}", guard.key()))?;
        ensure!(
            reason == LostReason::Deleted,
            "{:?} lost({reason:?}), expected Deleted",
            guard.key()
        );
    }
    let learned = back.elapsed();

    // A rival takes the key at once, above every token drawn before the crash.
    let next = rival
        .try_acquire(stale.key(), LEASE)
        .await?
        .ok_or("the rival was refused after the crash")?;
    ensure!(
        next.fencing_token() > highest,
        "after the crash {:?} was acquired with token {}, not above {highest}",
        stale.key(),
        next.fencing_token()
    );
    // Moved past the new server start's epoch: the sequence jumped 2^32, which covers
    // draws whose WAL the crash lost (not reproduced here: this crash kept the sequence).
    ensure!(
        next.fencing_token() > highest + EPOCH_STEP,
        "token {} after the crash: the sequence was not moved past the new server start \
         (highest before {highest})",
        next.fencing_token()
    );
    ensure!(
        <Postgres as FaultDb>::fenced_write(&pool, "rival", next.fencing_token()).await?,
        "the rival's fenced write was refused"
    );

    // The stale holder's writes are refused, by assert_held and by the token compare.
    let mut tx = pool.begin().await?;
    let fenced = stale.assert_held(&mut tx).await;
    drop(tx);
    ensure!(
        matches!(fenced, Err(Error::NotHeld { .. })),
        "assert_held after the crash returned {fenced:?}, expected NotHeld"
    );
    ensure!(
        !<Postgres as FaultDb>::fenced_write(&pool, "stale", stale.fencing_token()).await?,
        "a token-compare write with the lost lock's token was accepted"
    );
    let (value, _) = <Postgres as FaultDb>::resource(&pool).await?;
    ensure!(
        value == "rival",
        "the resource says {value:?}, expected the rival's write"
    );
    let token = next.fencing_token();
    next.release().await?;
    drop(held);
    Ok(format!(
        "down {}; rows gone {} after; holders lost(Deleted) {} later; rival's token \
         {token} over {highest}; stale write refused by assert_held and by the token compare",
        secs(downtime),
        secs(gone),
        secs(learned)
    ))
}
