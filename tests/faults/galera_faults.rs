//! Scenarios 10b and 10f: a Galera node dies under a holder or a leader.
//!
//! A node's SIGKILL stalls writes cluster-wide until the others evict it
//! (`evs.suspect_timeout`, 5 s, and a new view: about 6 s here), so the leases of 10b and
//! 10f are longer than that: a holder on a surviving node must not lose its lease to the
//! stall, and a rival must find the dead node's lease still live when writes resume.

use std::time::Duration;

use dblock::{Locker, LostReason, MySql};
use sqlx::MySqlPool;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

use crate::galera::{self, Cluster};
use crate::galera_scenarios::lockers;
use crate::holder::wall_micros;
use crate::report::{ms, secs};
use crate::{Res, eventually, renewed, take_over};

/// 10b's and 10f's lease: longer than the stall a node's death causes (about 6 s).
const KILL_LEASE: Duration = Duration::from_secs(9);
/// How long after the lease's end `lost()` may fire (the engine notices at a renewal
/// attempt; generous for a loaded machine).
const LOST_SLACK: Duration = Duration::from_secs(3);
/// How long after the lease's end a rival (or candidate) may take over: writes must have
/// resumed by then, the rest is polling on a loaded machine.
const TAKEOVER_SLACK: Duration = Duration::from_secs(5);
/// How long any one wait may take.
const STEP: Duration = Duration::from_secs(15);

/// 10b: the holder renews through node 3; node 3's mariadbd is SIGKILLed. The holder
/// hears `lost(Unreachable)` by its lease's end; a rival on node 1, trying from before
/// that end, wins only after it, with a higher token; node 3 rejoins.
pub async fn holder_node_killed(cluster: &mut Cluster) -> Res<String> {
    let key = "galera:10b";
    let holder = Locker::new(cluster.pool(3, 3).await?);
    let rival = Locker::new(cluster.pool(1, 3).await?);
    let guard = holder
        .try_acquire(key, KILL_LEASE)
        .await?
        .ok_or("key held")?;
    renewed(&guard, KILL_LEASE).await?;
    ensure!(
        rival.try_acquire(key, KILL_LEASE).await?.is_none(),
        "the rival on node 1 got the key while node 3's holder renews it"
    );
    // Right after a renewal: almost the whole lease is left at the kill.
    renewed(&guard, KILL_LEASE).await?;
    cluster.kill(3).await?;
    let killed = Instant::now();
    let expiry = guard.expires_at().timestamp_micros();
    let rival_from = wall_micros();
    let evicted = tokio::spawn({
        let pool = rival.pool().clone();
        async move { evicted_after(&pool, killed).await }
    });
    let rival_wins = tokio::spawn({
        let rival = rival.clone();
        let until = killed + KILL_LEASE + TAKEOVER_SLACK * 3;
        async move { take_over(&rival, key, KILL_LEASE, until).await }
    });

    let reason = timeout(KILL_LEASE + LOST_SLACK, guard.lost())
        .await
        .map_err(|_| "lost() did not fire by the lease's end")?;
    let lost_after = wall_micros() - expiry;
    ensure!(
        reason == LostReason::Unreachable,
        "lost() fired with {reason:?}, expected Unreachable"
    );
    ensure!(
        lost_after <= micros(LOST_SLACK),
        "lost() fired {} after the lease ended",
        ms(lost_after)
    );
    let (next, _, _) = rival_wins.await??;
    let row = rival
        .holder(key)
        .await?
        .ok_or("no row after the takeover")?;
    let rival_after = row.acquired_at.timestamp_micros() - expiry;
    ensure!(
        rival_after >= 0,
        "the rival took the key {} BEFORE the dead holder's lease ended",
        ms(rival_after)
    );
    ensure!(
        rival_after <= micros(TAKEOVER_SLACK),
        "the rival took the key only {} after the lease ended",
        ms(rival_after)
    );
    ensure!(
        rival_from < expiry,
        "the rival started trying only after the lease ended: nothing was refused"
    );
    ensure!(
        next.fencing_token() > guard.fencing_token(),
        "token {} after {}",
        next.fencing_token(),
        guard.fencing_token()
    );
    let evicted = evicted.await??;
    let (old_token, new_token) = (guard.fencing_token(), next.fencing_token());
    next.release().await?;
    drop(guard);
    let rejoined = cluster.restart(3).await?;
    Ok(format!(
        "lease {}; node 3 evicted (cluster size 2 on node 1) {} after SIGKILL; \
         lost(Unreachable) at the lease end {}; the rival on node 1 won at the lease end {} \
         (token {old_token} -> {new_token}); node 3 Synced again {} after its restart",
        secs(KILL_LEASE),
        secs(evicted),
        ms(lost_after),
        ms(rival_after),
        secs(rejoined)
    ))
}

/// How long after `since` the node of `pool` sees a cluster of two.
async fn evicted_after(pool: &MySqlPool, since: Instant) -> Res<Duration> {
    // Polled by hand: this runs in a task of its own, which `eventually`'s borrowing
    // closure cannot be sent to.
    loop {
        if galera::status(pool, "wsrep_cluster_size").await? == "2" {
            return Ok(since.elapsed());
        }
        ensure!(
            since.elapsed() < Duration::from_secs(60),
            "node 3 was not evicted within 60 s"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).expect("fits")
}

/// 10f: a candidate per node; the leader's node is SIGKILLed; exactly one survivor
/// leads next, in a higher term, after the dead leader's lease.
pub async fn leader_node_killed(cluster: &mut Cluster) -> Res<String> {
    let name = "galera-10f";
    let lockers: Vec<Locker<MySql>> = lockers(cluster, 3)
        .await?
        .into_iter()
        .map(|l| l.auto_renew(true))
        .collect();
    let mut campaigns = JoinSet::new();
    for (index, locker) in lockers.iter().enumerate() {
        let election = locker.election(name);
        campaigns.spawn(async move {
            let node = index + 1;
            (
                node,
                election.campaign(&format!("node-{node}"), KILL_LEASE).await,
            )
        });
    }
    let (first, leading) = timeout(STEP, campaigns.join_next())
        .await
        .map_err(|_| "nobody led")?
        .ok_or("no candidates")??;
    let leading = leading?;
    let term = leading.term();
    for (index, locker) in lockers.iter().enumerate() {
        let election = locker.election(name);
        eventually(
            &format!("node {} sees the leader", index + 1),
            STEP,
            async || {
                Ok(election
                    .leader()
                    .await?
                    .is_some_and(|l| l.identity == format!("node-{first}") && l.term == term))
            },
        )
        .await?;
    }
    renewed(&leading, KILL_LEASE).await?;
    cluster.kill(first).await?;
    let killed = Instant::now();
    let expiry = leading.expires_at().timestamp_micros();

    let (next_node, next) = timeout(KILL_LEASE + TAKEOVER_SLACK * 3, campaigns.join_next())
        .await
        .map_err(|_| "no new leader")?
        .ok_or("no candidates left")??;
    let failover = killed.elapsed();
    let next = next?;
    let reason = timeout(LOST_SLACK, leading.lost())
        .await
        .map_err(|_| "the dead node's leader did not hear lost()")?;
    ensure!(
        reason == LostReason::Unreachable,
        "the old leader lost with {reason:?}, expected Unreachable"
    );
    ensure!(
        next.term() > term,
        "the term went from {term} to {}",
        next.term()
    );
    let survivor = lockers[next_node - 1].election(name);
    let row = lockers[next_node - 1]
        .holder(&survivor.key())
        .await?
        .ok_or("no leader row")?;
    let after_us = row.acquired_at.timestamp_micros() - expiry;
    ensure!(
        after_us >= 0,
        "node {next_node} led {} BEFORE the dead leader's lease ended",
        ms(after_us)
    );
    // Exactly one: the other survivor is still campaigning, and reads the same leader.
    if let Ok(Some(second)) = timeout(Duration::from_secs(1), campaigns.join_next()).await {
        let (node, led) = second?;
        return Err(format!(
            "a second candidate, node {node}, returned from its campaign: {:?}",
            led.map(|l| l.term())
        )
        .into());
    }
    let other = (1..=3)
        .find(|n| *n != first && *n != next_node)
        .ok_or("no third node")?;
    let election = lockers[other - 1].election(name);
    eventually(
        &format!("node {other} sees the new leader"),
        STEP,
        async || {
            Ok(election.leader().await?.is_some_and(|l| {
                l.identity == format!("node-{next_node}") && l.term == next.term()
            }))
        },
    )
    .await?;
    let next_term = next.term();
    next.resign().await?;
    campaigns.abort_all();
    drop(leading);
    Ok(format!(
        "lease {}; node {first} led in term {term}, SIGKILLed; node {next_node} led {} after \
         the kill ({} after the lease end) in term {next_term}; node {other} still campaigning; \
         the old leader heard lost(Unreachable)",
        secs(KILL_LEASE),
        secs(failover),
        ms(after_us)
    ))
}
