//! Scenario 11d: leader election (src/election.rs) across a Patroni switchover and then a
//! crash failover.
//!
//! Two candidates, each with a pool of its own through HAProxy, loop as a service would:
//! `campaign`, lead until `lost()`, campaign again. A third client follows the election
//! with `watch`. First a switchover: the lease (4 s, renewed every 1.33 s) is about as
//! long as its write outage, so the lead is kept (renewed on the new primary, same term)
//! or moves to a greater term; both are right, the row says which. Then the primary's
//! Patroni and postmaster are SIGKILLed: the lease is shorter than that failover, so the
//! lead must end with `Unreachable` and a new term begin. Asserted throughout:
//! - at no time two leaders: every lead (from `campaign`'s return to `lost()`) ends before
//!   the next one starts, in the order the candidates saw them;
//! - terms only rise, in the candidates' view and in the watcher's (one identity per term).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dblock::{Leader, Locker, LostReason, Postgres};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::holder::wall_micros;
use crate::patroni::Cluster;
use crate::patroni_scenarios::pool;
use crate::report::{ms, secs};
use crate::{Ctx, Res, eventually};

const ELECTION: &str = "fault-patroni";
/// Shorter than any crash failover here (at least Patroni's `ttl`): the lead must move.
const LEASE: Duration = Duration::from_secs(4);
/// From the kill to the next term led.
const MOVED: Duration = Duration::from_secs(60);
/// How long the watcher may take to see a change the candidates saw.
const STEP: Duration = Duration::from_secs(10);

/// What a candidate saw: a lead began (`lost` None) or ended; wall clock in µs.
#[derive(Debug, Clone)]
struct Event {
    identity: &'static str,
    term: i64,
    lost: Option<LostReason>,
    at: i64,
}

type Log = Arc<Mutex<Vec<Event>>>;

fn events(log: &Log) -> Vec<Event> {
    log.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// campaign -> lead until lost -> campaign again, logging each start and end; aborted at
/// the end of the scenario (a lead dropped then is released in the background).
fn candidate(locker: Locker<Postgres>, identity: &'static str, log: &Log) -> JoinHandle<()> {
    let log = Arc::clone(log);
    tokio::spawn(async move {
        let election = locker.election(ELECTION);
        loop {
            let leading = match election.campaign(identity, LEASE).await {
                Ok(leading) => leading,
                // A database error ends a campaign at once (the outage): again, paced.
                Err(_) => {
                    sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let term = leading.term();
            let push = |lost| {
                let event = Event {
                    identity,
                    term,
                    lost,
                    at: wall_micros(),
                };
                log.lock().unwrap_or_else(|e| e.into_inner()).push(event);
            };
            push(None);
            let reason = leading.lost().await;
            push(Some(reason));
        }
    })
}

pub async fn run(ctx: &mut Ctx<Postgres>, cluster: &mut Cluster) -> Res<String> {
    let healthy = cluster.healthy().await?;
    let log: Log = Arc::default();
    let mut tasks = vec![candidate(
        Locker::new(pool(&ctx.url).await?),
        "node-a",
        &log,
    )];
    eventually("node-a leads", Duration::from_secs(10), async || {
        Ok(!events(&log).is_empty())
    })
    .await?;
    tasks.push(candidate(
        Locker::new(pool(&ctx.url).await?),
        "node-b",
        &log,
    ));
    let watcher = Locker::new(pool(&ctx.url).await?).election(ELECTION);
    let mut watch = watcher.watch(Duration::from_millis(100))?;
    let seen: Seen = Arc::default();
    tasks.push(tokio::spawn({
        let seen = Arc::clone(&seen);
        async move {
            loop {
                if let Some(leader) = watch.changed().await {
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push(leader);
                }
            }
        }
    }));
    // node-b campaigns against a live lead: refused, it waits.
    sleep(LEASE).await;
    let first = events(&log);
    let rounds = if first.len() == 1 {
        rounds(cluster, &log, &seen).await
    } else {
        Err(format!("node-b led while node-a renewed: {first:?}").into())
    };
    for task in &tasks {
        task.abort();
    }
    let (switched, crashed) = rounds?;
    let log = events(&log);
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    one_leader_at_a_time(&log)?;
    for pair in seen.windows(2) {
        ensure!(
            pair[1].term >= pair[0].term,
            "the watcher saw term {} after {}",
            pair[1].term,
            pair[0].term
        );
        ensure!(
            pair[1].term != pair[0].term || pair[1].identity == pair[0].identity,
            "term {} led by {} and {}",
            pair[0].term,
            pair[0].identity,
            pair[1].identity
        );
    }
    Ok(format!(
        "lease {}; switchover: {switched}; crash: {crashed}; one leader at a time, terms \
         rising in the candidates' view ({} leads) and the watcher's ({} changes seen); \
         healthy in {}",
        secs(LEASE),
        log.iter().filter(|e| e.lost.is_none()).count(),
        seen.len(),
        secs(healthy)
    ))
}

type Seen = Arc<Mutex<Vec<Leader>>>;

/// The lead now: the last one begun, if it has not ended.
fn current(log: &Log) -> Option<Event> {
    events(log).last().filter(|e| e.lost.is_none()).cloned()
}

/// A switchover, then a crash; what each did to the lead.
async fn rounds(cluster: &mut Cluster, log: &Log, seen: &Seen) -> Res<(String, String)> {
    let before = current(log).ok_or("nobody leads")?;
    let mark = events(log).len();
    let started = Instant::now();
    cluster.switchover().await?;
    // Settled once the watcher, reading after the switchover, sees the current lead: a
    // renewal (a new expiry) or a new term, both on the new primary.
    let seen_mark = seen.lock().unwrap_or_else(|e| e.into_inner()).len();
    eventually("a lead renewed on the new primary", MOVED, async || {
        let Some(now) = current(log) else {
            return Ok(false);
        };
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        Ok(seen[seen_mark..].iter().any(|l| l.term == now.term))
    })
    .await?;
    let settled = started.elapsed();
    let after = current(log).ok_or("nobody leads")?;
    let switched = match events(log)[mark..].iter().find(|e| e.lost.is_some()) {
        None => format!(
            "{} kept term {} (renewed on the new primary {} after the request)",
            before.identity,
            before.term,
            secs(settled)
        ),
        Some(lost) => {
            ensure!(
                after.term > before.term,
                "the lead was lost but no new term began"
            );
            format!(
                "{} lost term {} ({}), {} led term {} {} after the request",
                before.identity,
                before.term,
                lost.lost.map_or_else(String::new, |r| format!("{r:?}")),
                after.identity,
                after.term,
                secs(settled)
            )
        }
    };
    // The old primary rejoins as the synchronous standby, which a failover needs.
    cluster.healthy().await?;

    let before = current(log).ok_or("nobody leads")?;
    let mark = events(log).len();
    let killed = cluster.kill_primary().await?;
    let next = eventually("a new term is led", MOVED, async || {
        Ok(current(log).is_some_and(|e| e.term > before.term))
    })
    .await
    .map(|_| current(log))?
    .ok_or("nobody leads")?;
    let moved_after = killed.at.elapsed();
    // The watcher reads every 100 ms through a pool of its own that reconnects too.
    eventually("the watcher sees the new term", STEP, async || {
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        Ok(seen.iter().any(|l| l.term == next.term))
    })
    .await?;
    let log = events(log);
    let lost = log[mark..]
        .iter()
        .find(|e| e.lost.is_some())
        .ok_or("the lead survived a failover longer than its lease")?;
    ensure!(
        lost.identity == before.identity && lost.lost == Some(LostReason::Unreachable),
        "{} lost its lead with {:?}, expected {} with Unreachable",
        lost.identity,
        lost.lost,
        before.identity
    );
    let crashed = format!(
        "{} killed, {} (term {}) lost(Unreachable) {} after the kill, {} led term {} {} after \
         it ({} after the loss)",
        cluster.name(killed.node),
        before.identity,
        before.term,
        ms(lost.at - killed.wall),
        next.identity,
        next.term,
        secs(moved_after),
        ms(next.at - lost.at)
    );
    Ok((switched, crashed))
}

/// Leads alternate: begin, its end, the next begin, never a begin during a lead; terms
/// rise from one lead to the next.
fn one_leader_at_a_time(log: &[Event]) -> Res<()> {
    let mut current: Option<&Event> = None;
    let mut last_term = 0;
    for event in log {
        match (event.lost, current) {
            (None, None) => {
                ensure!(
                    event.term > last_term,
                    "term {} led after term {last_term}",
                    event.term
                );
                (current, last_term) = (Some(event), event.term);
            }
            (None, Some(leader)) => {
                return Err(format!(
                    "two leaders: {} (term {}) while {} (term {}) had not lost: {log:?}",
                    event.identity, event.term, leader.identity, leader.term
                )
                .into());
            }
            (Some(_), Some(leader)) if leader.identity == event.identity => current = None,
            (Some(_), _) => return Err(format!("a loss out of turn: {log:?}").into()),
        }
    }
    Ok(())
}
