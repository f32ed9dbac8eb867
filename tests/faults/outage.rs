//! Scenario 4: the network between client and server fails, through the TCP proxy, while
//! a lock is acquired, renewed or released. Every failure is a typed `Error::Database`
//! (never a panic); no row is left that no live guard owns; renewal rides out an outage
//! shorter than the lease and reports `Unreachable` no later than the lease's end when
//! it is longer, whether the connection is cut or silently black-holed.
//!
//! Each case has its own proxy and pool. The pool does not ping connections before use
//! (`test_before_acquire(false)`), so the lock statement is the first thing on the wire
//! and the proxy can hold it or its answer.

use std::time::Duration;

use dblock::{Error, Locker, LostReason};
use sqlx::pool::PoolOptions;
use tokio::time::{Instant, sleep, timeout};

use crate::db::FaultDb;
use crate::holder::wall_micros;
use crate::proxy::{Direction, Proxy, upstream_of, via_proxy};
use crate::report::{Report, before_or_after, ms, secs};
use crate::{Ctx, NotApplicable, Res, Selection, eventually, renewed, scenario, take_over};

/// The group, for rows that stand for all its cases.
pub const NAME: &str = "4 network faults";

const NAMES: [&str; 8] = [
    "4a cut during acquire (statement lost)",
    "4b cut during acquire (answer lost)",
    "4c cut during renewal, shorter than lease",
    "4d cut during renewal, longer than lease",
    "4e black hole during renewal, longer than lease",
    "4f cut during release",
    "4g renewal with +300 ms round trips",
    "4h no row left held by nobody",
];

/// The key of each case; none may be left held by nobody when the cases are done.
const ACQUIRE_STATEMENT_KEY: &str = "fault:cut:acquire-statement";
const ACQUIRE_ANSWER_KEY: &str = "fault:cut:acquire-answer";
const SHORT_CUT_KEY: &str = "fault:cut:renew-short";
const LONG_CUT_KEY: &str = "fault:cut:renew-long";
const BLACK_HOLE_KEY: &str = "fault:blackhole:renew-long";
const RELEASE_KEY: &str = "fault:cut:release";
const SLOW_KEY: &str = "fault:slow";
const KEYS: [&str; 7] = [
    ACQUIRE_STATEMENT_KEY,
    ACQUIRE_ANSWER_KEY,
    SHORT_CUT_KEY,
    LONG_CUT_KEY,
    BLACK_HOLE_KEY,
    RELEASE_KEY,
    SLOW_KEY,
];

/// A lease far longer than any bound below: if a row goes away within the bound, it was
/// deleted, not left to expire.
const LONG_LEASE: Duration = Duration::from_secs(30);
/// A short lease for the renewal cases (renewed every 1 s).
const SHORT_LEASE: Duration = Duration::from_secs(3);
/// How long after the network heals a row that no guard owns may still exist.
const ORPHAN_BOUND: Duration = Duration::from_secs(5);
/// How late `lost()` may fire after the moment the holder's lease could have ended.
const LOST_SLACK: Duration = Duration::from_millis(150);
/// How long an outage goes on after the client saw its error: long enough that whatever
/// the library does about the error at once meets the outage too.
const OUTAGE_AFTER_ERROR: Duration = Duration::from_millis(500);
/// How long any one step may take before it counts as hung.
const STEP: Duration = Duration::from_secs(10);

pub async fn run_all<DB: FaultDb>(ctx: &mut Ctx<DB>, report: &Report, selection: &Selection<'_>) {
    if !ctx.networked() {
        scenario(ctx, report, selection, NAME, async |_: &mut Ctx<DB>| {
            Err(NotApplicable("embedded: no network between client and database").into())
        })
        .await;
        return;
    }
    scenario(ctx, report, selection, NAMES[0], acquire_statement_lost).await;
    scenario(ctx, report, selection, NAMES[1], acquire_answer_lost).await;
    scenario(ctx, report, selection, NAMES[2], short_cut).await;
    scenario(
        ctx,
        report,
        selection,
        NAMES[3],
        async |ctx: &mut Ctx<DB>| long_outage(ctx, Outage::Cut).await,
    )
    .await;
    scenario(
        ctx,
        report,
        selection,
        NAMES[4],
        async |ctx: &mut Ctx<DB>| long_outage(ctx, Outage::BlackHole).await,
    )
    .await;
    scenario(ctx, report, selection, NAMES[5], release_cut).await;
    scenario(ctx, report, selection, NAMES[6], slow_network).await;
    scenario(ctx, report, selection, NAMES[7], no_orphans).await;
}

/// A proxy in front of the server and a locker whose pool goes through it: one
/// connection, which has prepared every lock statement already (so what the proxy holds
/// is the statement's execution, not its preparation), and the engine's own connection,
/// open and renewing.
pub async fn proxied<DB: FaultDb>(ctx: &Ctx<DB>) -> Res<(Proxy, Locker<DB>)> {
    let proxy = Proxy::start(upstream_of(&ctx.url)).await;
    let locker = warmed_up(&via_proxy(&ctx.url, proxy.addr())).await?;
    Ok((proxy, locker))
}

/// A locker on `url` set up as [`proxied`] says (a holder process of partition_late.rs
/// uses it on its own proxy's URL).
pub async fn warmed_up<DB: FaultDb>(url: &str) -> Res<Locker<DB>> {
    let pool = PoolOptions::<DB>::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(url)
        .await?;
    let locker = Locker::new(pool);
    // First the engine's connection (it may take the pool's idle one, and the pool opens
    // another): a renewal shows it is open.
    let engine_warm_up = locker
        .try_acquire("fault:warm-up-engine", SHORT_LEASE)
        .await?
        .ok_or("warm-up key held")?;
    renewed(&engine_warm_up, SHORT_LEASE).await?;
    // Then the pool's one connection prepares every statement the scenarios send.
    let warm_up = "fault:warm-up";
    let quiet = locker.auto_renew(false);
    let guard = quiet
        .try_acquire(warm_up, LONG_LEASE)
        .await?
        .ok_or("warm-up key held")?;
    guard.extend(LONG_LEASE).await?;
    guard.release().await?;
    quiet.holder(warm_up).await?;
    engine_warm_up.release().await?;
    // sqlx hands a connection back to its pool after a ping, in a task of its own: wait
    // for it, or a scenario that holds the proxy's answers would hold that ping, and the
    // pool's one connection with it.
    let pool = locker.pool().clone();
    eventually("the pool's connection is back", STEP, async || {
        Ok(pool.size() == 1 && pool.num_idle() == 1)
    })
    .await?;
    Ok(locker)
}

/// The typed error a cut must produce: anything else (success, NotHeld, a panic) fails.
fn expect_database_error<T: std::fmt::Debug>(what: &str, outcome: dblock::Result<T>) -> Res<()> {
    match outcome {
        Err(Error::Database(_)) => Ok(()),
        other => Err(format!("{what} returned {other:?}, expected Error::Database").into()),
    }
}

/// Waits until `proxy` holds at least one chunk: the statement is on the wire.
async fn in_flight(proxy: &Proxy) -> Res<Duration> {
    eventually("a statement reaches the proxy", STEP, async || {
        Ok(proxy.in_flight() > 0)
    })
    .await
}

async fn acquire_statement_lost<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = ACQUIRE_STATEMENT_KEY;
    let (proxy, locker) = proxied(ctx).await?;
    proxy.hold(Direction::Up, true);
    let attempt = tokio::spawn({
        let locker = locker.clone();
        async move { locker.try_acquire(key, LONG_LEASE).await }
    });
    in_flight(&proxy).await?;
    proxy.cut();
    let outcome = timeout(STEP, attempt).await??;
    expect_database_error("try_acquire cut before the server saw it", outcome)?;
    proxy.heal();
    ensure!(
        ctx.locker.holder(key).await?.is_none(),
        "a row exists for a statement that never reached the server"
    );
    // The same locker works again once the network does (dead pooled connections may
    // fail a first attempt; that is the pool's business, not a lock error).
    let recovered = eventually("acquire through the healed network", STEP, async || {
        Ok(match locker.try_acquire(key, LONG_LEASE).await {
            Ok(Some(guard)) => guard.release().await.is_ok(),
            _ => false,
        })
    })
    .await?;
    Ok(format!(
        "Error::Database; no row; acquire works again {} after healing",
        secs(recovered)
    ))
}

async fn acquire_answer_lost<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = ACQUIRE_ANSWER_KEY;
    let (proxy, locker) = proxied(ctx).await?;
    proxy.hold(Direction::Down, true);
    let attempt = tokio::spawn({
        let locker = locker.clone();
        async move { locker.try_acquire(key, LONG_LEASE).await }
    });
    // The server ran the statement: the row is there while its answer waits in the proxy.
    eventually("the row appears", STEP, async || {
        Ok(ctx.locker.holder(key).await?.is_some())
    })
    .await?;
    proxy.cut();
    let outcome = timeout(STEP, attempt).await??;
    expect_database_error("try_acquire whose answer was cut", outcome)?;
    sleep(OUTAGE_AFTER_ERROR).await;
    proxy.heal();
    // No guard was handed out for that row, so nobody may keep it: it must be deleted
    // soon after the network heals, well before its 30 s lease would end.
    let gone = eventually(
        "the row no guard owns is removed after healing",
        ORPHAN_BOUND,
        async || Ok(ctx.locker.holder(key).await?.is_none()),
    )
    .await?;
    Ok(format!(
        "Error::Database; the orphan row (lease {}) deleted {} after healing",
        secs(LONG_LEASE),
        secs(gone)
    ))
}

async fn short_cut<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = SHORT_CUT_KEY;
    let (proxy, locker) = proxied(ctx).await?;
    let guard = locker
        .try_acquire(key, SHORT_LEASE)
        .await?
        .ok_or("key held")?;
    renewed(&guard, SHORT_LEASE).await?;
    let errors_before = locker.stats().renewal_errors;

    let outage = SHORT_LEASE * 2 / 5;
    proxy.cut();
    sleep(outage / 2).await;
    ensure!(
        ctx.locker.try_acquire(key, SHORT_LEASE).await?.is_none(),
        "a rival got the lock during the cut"
    );
    sleep(outage / 2).await;
    proxy.heal();
    let healed = Instant::now();
    let back = renewed(&guard, SHORT_LEASE).await? - healed;

    let errors = locker.stats().renewal_errors - errors_before;
    ensure!(
        errors > 0,
        "no renewal failed during the {} cut: the fault missed",
        secs(outage)
    );
    ensure!(
        guard.lost_reason().is_none(),
        "lost ({:?}) after a cut shorter than the lease",
        guard.lost_reason()
    );
    ensure!(
        ctx.locker.try_acquire(key, SHORT_LEASE).await?.is_none(),
        "a rival got the lock after the cut"
    );
    let row = ctx.locker.holder(key).await?.ok_or("row gone")?;
    ensure!(
        row.owner == guard.owner() && row.fencing_token == guard.fencing_token(),
        "the row changed hands: {row:?}"
    );
    // The cut closed the pool's idle connections, and this pool hands them out untested
    // (see `proxied`): statements on them fail until they are gone. That is the pool's
    // business (renewal has a connection of its own); the release goes on a live one.
    eventually("the pool works again", STEP, async || {
        Ok(locker.holder(key).await.is_ok())
    })
    .await?;
    guard.release().await?;
    Ok(format!(
        "cut {} < lease {}: {errors} renewal errors, renewed again {} after healing, held throughout",
        secs(outage),
        secs(SHORT_LEASE),
        secs(back)
    ))
}

#[derive(Debug, Clone, Copy)]
enum Outage {
    /// Connections closed, new ones refused.
    Cut,
    /// Everything swallowed, connections left open.
    BlackHole,
}

async fn long_outage<DB: FaultDb>(ctx: &mut Ctx<DB>, outage: Outage) -> Res<String> {
    let key = match outage {
        Outage::Cut => LONG_CUT_KEY,
        Outage::BlackHole => BLACK_HOLE_KEY,
    };
    let (proxy, locker) = proxied(ctx).await?;
    let guard = locker
        .try_acquire(key, SHORT_LEASE)
        .await?
        .ok_or("key held")?;
    renewed(&guard, SHORT_LEASE).await?;
    let started = Instant::now();
    match outage {
        Outage::Cut => proxy.cut(),
        Outage::BlackHole => proxy.set_drop(true),
    }
    let waited = timeout(SHORT_LEASE + Duration::from_secs(2), guard.lost()).await;
    let (lost_at, lost_wall) = (Instant::now(), wall_micros());
    // Whatever happens next, free the connections stuck in the black hole.
    proxy.cut();
    proxy.heal();
    let reason = waited.map_err(|_| {
        format!(
            "lost() did not fire within {} of a {outage:?} outage (lease {})",
            secs(started.elapsed()),
            secs(SHORT_LEASE)
        )
    })?;
    ensure!(
        reason == LostReason::Unreachable,
        "lost() fired with {reason:?}, expected Unreachable"
    );
    // The last expiry the database granted: a rival may take over from then on, so the
    // holder must know by then.
    let expiry = guard.expires_at().timestamp_micros();
    let margin = expiry - lost_wall;
    ensure!(
        margin >= -(LOST_SLACK.as_micros() as i64),
        "lost() fired {} after the lease ended (database clock)",
        ms(-margin)
    );

    let (rival, _, taken_wall) = take_over(
        &ctx.locker,
        key,
        SHORT_LEASE,
        Instant::now() + SHORT_LEASE * 2,
    )
    .await?;
    ensure!(
        taken_wall >= expiry - 2_000,
        "a rival took over {} before the expiry",
        ms(taken_wall - expiry)
    );
    drain_dead_connections(&locker).await;
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(Error::NotHeld { .. })),
        "releasing the lost guard returned {released:?}, expected NotHeld"
    );
    rival.release().await?;
    Ok(format!(
        "lost(Unreachable) {} into the outage, {} the DB expiry; rival took over after it; \
         release NotHeld",
        secs(lost_at - started),
        before_or_after(margin),
    ))
}

/// Gets rid of pooled connections the proxy closed: the first statement on each fails
/// with an I/O error (the pool then drops it), which is not what these cases test.
async fn drain_dead_connections<DB: FaultDb>(locker: &Locker<DB>) {
    for _ in 0..8 {
        locker.holder("fault:warm-up").await.ok();
    }
}

async fn release_cut<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = RELEASE_KEY;
    let (proxy, locker) = proxied(ctx).await?;
    let guard = locker
        .try_acquire(key, LONG_LEASE)
        .await?
        .ok_or("key held")?;
    proxy.hold(Direction::Up, true);
    let release = tokio::spawn(guard.release());
    in_flight(&proxy).await?;
    proxy.cut();
    let outcome = timeout(STEP, release).await??;
    expect_database_error("release cut before the server saw it", outcome)?;
    sleep(OUTAGE_AFTER_ERROR).await;
    proxy.heal();
    // The guard is gone and the caller was told the release failed; the row must not
    // stay behind for the rest of its 30 s lease.
    let gone = eventually(
        "the row of the failed release is removed after healing",
        ORPHAN_BOUND,
        async || Ok(ctx.locker.holder(key).await?.is_none()),
    )
    .await?;
    Ok(format!(
        "Error::Database; the row (lease {}) deleted {} after healing",
        secs(LONG_LEASE),
        secs(gone)
    ))
}

async fn slow_network<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let key = SLOW_KEY;
    let lease = Duration::from_secs(2);
    let (proxy, locker) = proxied(ctx).await?;
    proxy.set_delay(Duration::from_millis(150));
    let started = Instant::now();
    let guard = locker.try_acquire(key, lease).await?.ok_or("key held")?;
    let acquire = started.elapsed();
    // Three renewals: the lease is carried well past its first end.
    for _ in 0..3 {
        renewed(&guard, lease).await?;
        ensure!(
            ctx.locker.try_acquire(key, lease).await?.is_none(),
            "a rival got the lock on a slow network"
        );
    }
    ensure!(
        guard.lost_reason().is_none(),
        "lost ({:?}) on a slow network",
        guard.lost_reason()
    );
    let started = Instant::now();
    guard.release().await?;
    let release = started.elapsed();
    ensure!(
        ctx.locker.holder(key).await?.is_none(),
        "row left after release"
    );
    Ok(format!(
        "acquire {}, 3 renewals of a {} lease, release {}",
        secs(acquire),
        secs(lease),
        secs(release)
    ))
}

/// After every case: no key of theirs has a live row, though no guard is left.
async fn no_orphans<DB: FaultDb>(ctx: &mut Ctx<DB>) -> Res<String> {
    let took = eventually(
        "no live row is left by the network faults",
        ORPHAN_BOUND,
        async || {
            for key in KEYS {
                if ctx
                    .locker
                    .holder(key)
                    .await?
                    .is_some_and(|row| !row.expired)
                {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    Ok(format!(
        "{} keys of 4a-4g: no live row (clean {} after the last case)",
        KEYS.len(),
        secs(took)
    ))
}
