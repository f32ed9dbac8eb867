//! Scenario group 11: dblock on a Patroni-managed PostgreSQL (patroni.rs: etcd, a primary
//! and a synchronous standby, HAProxy routing to the primary by Patroni's REST check).
//! Every client connects through HAProxy, as an application would; nothing is moved by
//! the test but the failover itself, which Patroni does.
//!
//! - 11a, planned switchover (REST `POST /switchover`, what `patronictl switchover`
//!   sends) with a held, renewed lock: renewal resumes on the new primary, `lost()` stays
//!   silent, a rival is refused throughout, and after the release the rival gets the key
//!   with a greater token. Reports the write outage seen by a probe writing every 100 ms.
//! - 11b, the primary's Patroni and postmaster SIGKILLed, lease longer than the failover:
//!   the same, with the crash failover's length (about Patroni's `ttl`).
//! - 11c, the same crash with a lease shorter than the failover: `lost(Unreachable)` at
//!   the lease's end, the rival gets the key only after it, and the old guard's
//!   `assert_held` and `release` answer `NotHeld`.
//! - 11d, leader election across a crash failover: at no time two leaders (each
//!   candidate's own view: from its `campaign` win to its `lost()`), terms only rise (also
//!   as a third client reads `leader()`), and the lead is kept or moves to a greater term.
//!
//! The killed node is started again (Patroni rewinds it into a standby) at the start of
//! the next scenario, whose time includes that rejoin.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dblock::{Error, Locker, LostReason, Postgres};
use sqlx::PgPool;
use sqlx::pool::PoolOptions;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::failover::same_row;
use crate::holder::wall_micros;
use crate::patroni::{Cluster, missing};
use crate::patroni_config::{CHECK, LOOP_WAIT, RETRY_TIMEOUT, TTL};
use crate::patroni_io::Probe;
use crate::report::{Report, ms, secs};
use crate::{Ctx, Res, Selection, patroni_election, renewed, required, scenario};

pub const NAMES: [&str; 4] = [
    "11a patroni switchover with a held lock",
    "11b patroni primary SIGKILLed, lease longer than the failover",
    "11c patroni primary SIGKILLed, lease shorter than the failover",
    "11d patroni leader election across a failover",
];

/// 11a: longer than a switchover's write outage (a few seconds), renewed every 4 s.
const SWITCH_LEASE: Duration = Duration::from_secs(12);
/// 11b: dblock's default, longer than a crash failover with `ttl` 10.
const LONG_LEASE: Duration = Duration::from_secs(30);
/// 11c and 11d: shorter than any crash failover here (at least `ttl`).
const SHORT_LEASE: Duration = Duration::from_secs(4);
/// How far from the lease's end (database clock) `lost()` may fire: generous, the box is
/// shared and the renewal that fails may wait for a connection.
const LOST_SLACK: Duration = Duration::from_secs(1);
/// A failover or switchover, from the kill or the request to HAProxy routing writes.
const FAILOVER: Duration = Duration::from_secs(60);

/// The group, after the PostgreSQL track: one cluster for all four, started once.
pub async fn run_all(report: &Report, selection: &Selection<'_>) {
    if !NAMES.iter().any(|name| selection.wants(name)) {
        return;
    }
    if let Some(reason) = unmet() {
        return unavailable(report, selection, reason, required("patroni"));
    }
    let started = Instant::now();
    let mut cluster = match Cluster::start().await {
        Ok(cluster) => cluster,
        Err(err) => return unavailable(report, selection, format!("cluster: {err}"), true),
    };
    let up = started.elapsed();
    // Migrated through HAProxy; the scenarios make pools of their own.
    let mut ctx = match Ctx::<Postgres>::new(cluster.url(), None).await {
        Ok(ctx) => ctx,
        Err(err) => return unavailable(report, selection, err.to_string(), true),
    };
    let settings = format!(
        "ttl {TTL}, loop_wait {LOOP_WAIT}, retry_timeout {RETRY_TIMEOUT}, HAProxy {CHECK}; \
         cluster up in {}",
        secs(up)
    );
    let c = &mut cluster;
    scenario(
        &mut ctx,
        report,
        selection,
        NAMES[0],
        async |ctx: &mut Ctx<Postgres>| Ok(format!("{}; {settings}", switchover(ctx, c).await?)),
    )
    .await;
    scenario(
        &mut ctx,
        report,
        selection,
        NAMES[1],
        async |ctx: &mut Ctx<Postgres>| crash_survived(ctx, c).await,
    )
    .await;
    scenario(
        &mut ctx,
        report,
        selection,
        NAMES[2],
        async |ctx: &mut Ctx<Postgres>| crash_lost(ctx, c).await,
    )
    .await;
    scenario(
        &mut ctx,
        report,
        selection,
        NAMES[3],
        async |ctx: &mut Ctx<Postgres>| patroni_election::run(ctx, c).await,
    )
    .await;
}

/// Why the group cannot run here: the packages missing, if any.
pub fn unmet() -> Option<String> {
    let missing = missing();
    (!missing.is_empty()).then(|| format!("not installed: {}", missing.join(", ")))
}

/// A row for each selected scenario: failed if `required`, else skipped.
fn unavailable(report: &Report, selection: &Selection<'_>, reason: String, required: bool) {
    crate::unavailable_rows(report, selection, &NAMES, "postgres", reason, required);
}

/// A pool through HAProxy whose checkouts give up after 2 s, so that a caller polling
/// through an outage keeps its pace.
pub async fn pool(url: &str) -> Res<PgPool> {
    Ok(PoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await?)
}

/// A rival that calls `try_acquire` every 100 ms until stopped; errors (the outage) are
/// counted, a win fails it. Returns (refusals, errors).
struct Rival {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Res<(u32, u32)>>,
}

impl Rival {
    fn start(locker: &Locker<Postgres>, key: &'static str, lease: Duration) -> Rival {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (locker, stop) = (locker.clone(), Arc::clone(&stop));
            async move {
                let (mut refused, mut errors) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    match timeout(Duration::from_secs(5), locker.try_acquire(key, lease)).await {
                        Ok(Ok(None)) => refused += 1,
                        Ok(Ok(Some(guard))) => {
                            let token = guard.fencing_token();
                            return Err(format!("the rival got {key:?} (token {token})").into());
                        }
                        Ok(Err(_)) | Err(_) => errors += 1,
                    }
                    sleep(Duration::from_millis(100)).await;
                }
                Ok((refused, errors))
            }
        });
        Rival { stop, task }
    }

    async fn stop(self) -> Res<(u32, u32)> {
        self.stop.store(true, Ordering::Relaxed);
        let (refused, errors) = self.task.await??;
        ensure!(refused > 0, "the rival was never refused ({errors} errors)");
        Ok((refused, errors))
    }
}

/// After the holder's release the rival gets the key, with a greater token.
async fn handed_over(rival: &Locker<Postgres>, key: &str, after: i64) -> Res<i64> {
    let next = rival
        .try_acquire(key, SHORT_LEASE)
        .await?
        .ok_or("the released key is held")?;
    let token = next.fencing_token();
    next.release().await?;
    ensure!(token > after, "token {token} after {after}");
    Ok(token)
}

async fn switchover(ctx: &mut Ctx<Postgres>, cluster: &mut Cluster) -> Res<String> {
    let key = "fault:patroni:switchover";
    let healthy = cluster.healthy().await?;
    let holder = Locker::new(pool(&ctx.url).await?);
    let rival = Locker::new(pool(&ctx.url).await?);
    let probe = Probe::start(&ctx.url).await?;
    let guard = holder
        .try_acquire(key, SWITCH_LEASE)
        .await?
        .ok_or("key held")?;
    let refusals = Rival::start(&rival, key, SWITCH_LEASE);
    let from = cluster.primary().await.ok_or("no primary")?;
    let started = Instant::now();
    // Every renewal seen while Patroni switches over (the guard cannot leave this task).
    let (mut renewals, mut expiry) = (Vec::new(), guard.expires_at());
    let switching = cluster.switchover();
    tokio::pin!(switching);
    let to = loop {
        tokio::select! {
            to = &mut switching => break to?,
            _ = sleep(Duration::from_millis(5)) => {
                if guard.expires_at() != expiry {
                    expiry = guard.expires_at();
                    renewals.push(secs(started.elapsed()));
                }
            }
        }
    };
    let switched = started.elapsed();
    // Patroni demoted the old primary before it promoted this one: a renewal from now on
    // landed on the new primary.
    renewals.push(secs(renewed(&guard, SWITCH_LEASE).await? - started));
    ensure!(
        guard.lost_reason().is_none(),
        "lost ({:?}) across a switchover",
        guard.lost_reason()
    );
    same_row(&rival, &guard).await?;
    let outage = probe.longest_gap(started).ok_or("the probe never wrote")?;
    let (refused, errors) = refusals.stop().await?;
    let token = guard.fencing_token();
    guard.release().await?;
    let next = handed_over(&rival, key, token).await?;
    Ok(format!(
        "{} -> {} in {} (request to HAProxy routing), write outage {} (probe every 100 ms); \
         lease {} renewed at {} after the request, lost() silent; rival \
         refused {refused} times ({errors} errors) until the release; token {token} -> {next}; \
         healthy in {}",
        cluster.name(from),
        cluster.name(to),
        secs(switched),
        secs(outage),
        secs(SWITCH_LEASE),
        renewals.join(", "),
        secs(healthy)
    ))
}

async fn crash_survived(ctx: &mut Ctx<Postgres>, cluster: &mut Cluster) -> Res<String> {
    let key = "fault:patroni:survived";
    let healthy = cluster.healthy().await?;
    let holder = Locker::new(pool(&ctx.url).await?);
    let rival = Locker::new(pool(&ctx.url).await?);
    let probe = Probe::start(&ctx.url).await?;
    // Just acquired: almost the whole lease is left at the kill.
    let guard = holder
        .try_acquire(key, LONG_LEASE)
        .await?
        .ok_or("key held")?;
    let refusals = Rival::start(&rival, key, LONG_LEASE);
    let killed = cluster.kill_primary().await?;
    let left = guard.expires_at().timestamp_micros() - killed.wall;
    let (killed_at, killed) = (killed.at, killed.node);
    cluster.wait_primary(1 - killed, FAILOVER).await?;
    let routed = killed_at.elapsed();
    let resumed = renewed(&guard, LONG_LEASE).await? - killed_at;
    ensure!(
        guard.lost_reason().is_none(),
        "lost ({:?}) across a crash failover",
        guard.lost_reason()
    );
    let first_write = probe.first_after(killed_at, FAILOVER).await?;
    same_row(&rival, &guard).await?;
    let (refused, errors) = refusals.stop().await?;
    let token = guard.fencing_token();
    guard.release().await?;
    let next = handed_over(&rival, key, token).await?;
    Ok(format!(
        "{} killed: failover {} (kill to the first write through HAProxy; {} to REST \
         /primary and routing); lease {} with {} left at the kill: renewed on {} {} after the \
         kill, lost() silent; rival refused {refused} times ({errors} errors); token {token} \
         -> {next}; healthy in {}",
        cluster.name(killed),
        secs(first_write),
        secs(routed),
        secs(LONG_LEASE),
        ms(left),
        cluster.name(1 - killed),
        secs(resumed),
        secs(healthy)
    ))
}

async fn crash_lost(ctx: &mut Ctx<Postgres>, cluster: &mut Cluster) -> Res<String> {
    let key = "fault:patroni:lost";
    let healthy = cluster.healthy().await?;
    let holder_pool = pool(&ctx.url).await?;
    let holder = Locker::new(holder_pool.clone());
    let rival = Locker::new(pool(&ctx.url).await?);
    let probe = Probe::start(&ctx.url).await?;
    let guard = holder
        .try_acquire(key, SHORT_LEASE)
        .await?
        .ok_or("key held")?;
    renewed(&guard, SHORT_LEASE).await?;
    ensure!(
        rival.try_acquire(key, SHORT_LEASE).await?.is_none(),
        "the rival got a held key"
    );
    let killed = cluster.kill_primary().await?;
    let (killed_at, killed) = (killed.at, killed.node);
    // Nothing renews it any more: the last lease the database granted.
    let expiry = guard.expires_at().timestamp_micros();
    let takeover = tokio::spawn({
        let rival = rival.clone();
        async move {
            let until = Instant::now() + FAILOVER;
            while Instant::now() < until {
                let attempt = timeout(Duration::from_secs(5), rival.try_acquire(key, SHORT_LEASE));
                if let Ok(Ok(Some(guard))) = attempt.await {
                    return Ok((guard, wall_micros()));
                }
                sleep(Duration::from_millis(20)).await;
            }
            Err::<_, Box<dyn std::error::Error + Send + Sync>>("the rival never got the key".into())
        }
    });
    let reason = timeout(SHORT_LEASE + LOST_SLACK, guard.lost())
        .await
        .map_err(|_| "lost() did not fire by the lease's end")?;
    let lost_at = wall_micros() - expiry;
    ensure!(
        reason == LostReason::Unreachable,
        "lost() fired with {reason:?}, expected Unreachable"
    );
    ensure!(
        lost_at.unsigned_abs() <= LOST_SLACK.as_micros() as u64,
        "lost() fired {} from the lease's end (database clock)",
        ms(lost_at)
    );
    let (next, taken_wall) = takeover.await??;
    let first_write = probe.first_after(killed_at, FAILOVER).await?;
    // The new primary's clock is this machine's (2 ms for rounding).
    ensure!(
        taken_wall >= expiry - 2_000,
        "the rival took the key {} BEFORE the lease ran out",
        ms(expiry - taken_wall)
    );
    let (token, next_token) = (guard.fencing_token(), next.fencing_token());
    ensure!(next_token > token, "token {next_token} after {token}");
    let mut tx = holder_pool.begin().await?;
    let held = guard.assert_held(&mut tx).await;
    drop(tx);
    ensure!(
        matches!(held, Err(Error::NotHeld { .. })),
        "assert_held on the lost guard returned {held:?}, expected NotHeld"
    );
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(Error::NotHeld { .. })),
        "releasing the lost guard returned {released:?}, expected NotHeld"
    );
    next.release().await?;
    Ok(format!(
        "{} killed: failover {} (kill to the first write); lease {}: lost(Unreachable) {} \
         from its end, the rival won {} after it (refused before the kill); token {token} -> \
         {next_token}; assert_held and release: NotHeld; healthy in {}",
        cluster.name(killed),
        secs(first_write),
        secs(SHORT_LEASE),
        ms(lost_at),
        ms(taken_wall - expiry),
        secs(healthy)
    ))
}
