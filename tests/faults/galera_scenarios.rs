//! Scenario group 10: dblock on a three-node MariaDB Galera cluster (multi-primary), one
//! Locker per node (galera.rs starts the cluster). Galera replicates writesets at commit
//! and certifies them cluster-wide, but row locks, `GET_LOCK` and reads are node-local:
//! these scenarios check what the single-server suite cannot.
//!
//! - 10a: one key contended from the three nodes: never two holders, tokens rising in
//!   hold order, every fenced write applied once (galera_contention.rs).
//! - 10b: the holder's node is SIGKILLed: `lost(Unreachable)`, a rival elsewhere only
//!   after the lease, the node rejoins (galera_faults.rs).
//! - 10c: a stale holder's transaction under `assert_held` on one node, the key taken
//!   over through another: nothing of it commits (galera_stale.rs).
//! - 10d: `migrate()` from the three nodes at once (galera_migrate.rs).
//! - 10e: a semaphore of two permits across the nodes: never more than two holders
//!   (galera_contention.rs).
//! - 10f: the leader's node is SIGKILLed: exactly one new leader, in a higher term
//!   (galera_faults.rs).
//! - 10g: as 10c, but the stale COMMIT is sent right after the takeover committed, before
//!   the holder's node has applied it: it must still be refused (galera_stale.rs).
//!
//! The scenarios share one cluster. Between them the runner repairs it (a killed node
//! restarted; a cluster with a node wedged by a DDL replaced), so one failure does not
//! cascade; what it had to do is printed.

use std::time::Duration;

use dblock::{Locker, MySql};
use tokio::time::{Instant, timeout};

use crate::galera::{self, Cluster, NODES};
use crate::report::{Report, secs};
use crate::{Ctx, Res, Selection, required, scenario_on, unavailable_rows};
use crate::{galera_contention, galera_faults, galera_migrate, galera_stale};

/// How the summary names the cluster.
pub const LABEL: &str = "galera";

/// The scenarios, in the order they run: the rows reported when the cluster cannot be had.
pub const NAMES: [&str; 7] = [
    "10a galera: contention across nodes",
    "10b galera: holder's node SIGKILLed",
    "10c galera: cross-node assert_held",
    "10d galera: concurrent migrate()",
    "10e galera: semaphore across nodes",
    "10f galera: leader's node SIGKILLed",
    "10g galera: stale commit racing a takeover",
];

/// How long starting the cluster may take.
const SETUP: Duration = Duration::from_secs(180);

pub async fn run_all(report: &Report, selection: &Selection<'_>) {
    if !NAMES.iter().any(|name| selection.wants(name)) {
        return;
    }
    if let Err(missing) = galera::installed() {
        unavailable_rows(
            report,
            selection,
            &NAMES,
            LABEL,
            missing,
            required("galera"),
        );
        return;
    }
    let started = Instant::now();
    let mut cluster = match start().await {
        Ok(cluster) => cluster,
        Err(first) => {
            // Setting up is not what the group tests (a free port taken by another
            // program in between, say): one failure is reported and the set-up made
            // anew in a fresh directory on fresh ports; a second failure is the error.
            eprintln!("faults: galera: {first}; trying once more");
            match start().await {
                Ok(cluster) => cluster,
                Err(err) => {
                    return unavailable_rows(report, selection, &NAMES, LABEL, err, true);
                }
            }
        }
    };
    eprintln!(
        "faults: galera: 3 nodes Synced in {}",
        secs(started.elapsed())
    );
    // The suite's context on node 1: the default lock table, migrated once from there.
    let mut ctx = match Ctx::<MySql>::new(cluster.url(1), None).await {
        Ok(ctx) => ctx,
        Err(err) => {
            let reason = format!("node 1: {err}");
            return unavailable_rows(report, selection, &NAMES, LABEL, reason, true);
        }
    };
    let mut broken: Option<String> = None;
    let mut first = true;
    for (index, name) in NAMES.iter().enumerate() {
        if !selection.wants(name) {
            continue;
        }
        // Repaired before each scenario but the first (not after the last: it would
        // only delay the end).
        if !first
            && broken.is_none()
            && let Err(err) = repair(&mut cluster).await
        {
            broken = Some(err.to_string());
        }
        first = false;
        let cluster = &mut cluster;
        let broken_now = broken.clone();
        scenario_on(
            &mut ctx,
            report,
            selection,
            name,
            LABEL,
            async |_: &mut Ctx<MySql>| {
                if let Some(why) = broken_now {
                    return Err(format!("the cluster is broken: {why}").into());
                }
                match index {
                    0 => galera_contention::contention(cluster).await,
                    1 => galera_faults::holder_node_killed(cluster).await,
                    2 => galera_stale::stale_holder(cluster).await,
                    3 => galera_migrate::concurrent_migrate(cluster).await,
                    4 => galera_contention::semaphore(cluster).await,
                    5 => galera_faults::leader_node_killed(cluster).await,
                    _ => galera_stale::stale_commit_race(cluster).await,
                }
            },
        )
        .await;
    }
}

/// Brings the cluster back to three `Synced` nodes after a scenario: a stopped node is
/// started again. A node with a session stuck waiting for a DDL's turn (10d before its
/// fix) cannot be repaired in place: killing it and restarting it worked for one such
/// node, but with two wedged, the restarted node found no donor, and killing two of
/// three nodes would leave the third without a quorum. So the whole cluster is replaced.
async fn repair(cluster: &mut Cluster) -> Res<()> {
    let mut wedged = Vec::new();
    for node in (1..=NODES).filter(|n| cluster.running(*n)) {
        let stuck = galera_migrate::stuck_sessions(cluster, node)
            .await
            .unwrap_or_default();
        if !stuck.is_empty() {
            wedged.push(format!("node {node}: {stuck:?}"));
        }
    }
    if !wedged.is_empty() {
        eprintln!(
            "faults: galera: wedged ({}): replacing the cluster",
            wedged.join("; ")
        );
        let started = Instant::now();
        *cluster = start().await?;
        Locker::new(cluster.pool(1, 2).await?).migrate().await?;
        eprintln!(
            "faults: galera: a new cluster Synced in {}",
            secs(started.elapsed())
        );
        return Ok(());
    }
    let stopped: Vec<usize> = (1..=NODES).filter(|n| !cluster.running(*n)).collect();
    for node in stopped {
        let took = cluster.restart(node).await?;
        eprintln!(
            "faults: galera: node {node} restarted, Synced in {}",
            secs(took)
        );
    }
    for node in 1..=NODES {
        cluster
            .wait_synced(node, NODES, galera::JOIN)
            .await
            .map_err(|err| format!("after repair: {err}"))?;
    }
    Ok(())
}

/// Starts a cluster within [`SETUP`].
async fn start() -> Result<Cluster, String> {
    match timeout(SETUP, Cluster::start()).await {
        Ok(Ok(cluster)) => Ok(cluster),
        Ok(Err(err)) => Err(format!("the cluster did not start: {err}")),
        Err(_) => Err(format!("the cluster did not start within {SETUP:?}")),
    }
}

/// One pool of `connections` per node, and a Locker on each (default table, no renewal).
pub async fn lockers(cluster: &Cluster, connections: u32) -> Res<Vec<Locker<MySql>>> {
    let mut lockers = Vec::new();
    for node in 1..=NODES {
        let pool = cluster.pool(node, connections).await?;
        lockers.push(Locker::builder(pool).auto_renew(false).build()?);
    }
    Ok(lockers)
}
