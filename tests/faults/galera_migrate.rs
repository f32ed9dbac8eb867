//! Scenario 10d: `migrate()` from the three nodes at the same instant, on a fresh table.
//!
//! With `GET_LOCK` alone, which Galera does not replicate, three nodes each got their own
//! lock, ran the same DDL at once and failed with 1213 or 1062, and left one or two
//! nodes' `CREATE TRIGGER` waiting "to execute in isolation" for good (ha-facts.md, A5;
//! this scenario, before main's b4496dc). Since then a run also claims the one row of
//! `<table>_migrating`, a write certified cluster-wide. Expected: every call returns Ok
//! in time, each migration is applied once, no session is left waiting, and the table
//! works through every node with its triggers everywhere.

use std::sync::Arc;
use std::time::Duration;

use dblock::{Locker, MySql};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use crate::Res;
use crate::galera::{Cluster, NODES};
use crate::report::secs;

/// Rounds, each on a fresh table.
const ROUNDS: usize = 3;
/// How long one node's `migrate()` may take.
const MIGRATE_LIMIT: Duration = Duration::from_secs(20);
/// The triggers a migrated lock table `t` has (migrations/mysql).
const TRIGGERS: [&str; 2] = ["{t}_fence_insert", "{t}_ticket_order"];

/// The migrations dblock applies on MySQL/MariaDB (one file each).
fn migrations() -> Res<usize> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/mysql");
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sql"))
        .count())
}

/// Sessions of `node` waiting for a DDL's turn (total order isolation), as
/// `id state: statement`.
pub async fn stuck_sessions(cluster: &Cluster, node: usize) -> Res<Vec<String>> {
    let mut conn = cluster.connect(node).await?;
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(ID AS SIGNED), CAST(STATE AS CHAR), CAST(LEFT(INFO, 60) AS CHAR)
           FROM information_schema.PROCESSLIST WHERE STATE LIKE '%isolation%'",
    )
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    Ok(rows
        .into_iter()
        .map(|(id, state, info)| format!("{id} {state}: {}", info.unwrap_or_default()))
        .collect())
}

pub async fn concurrent_migrate(cluster: &mut Cluster) -> Res<String> {
    let expected = migrations()?;
    let mut figures = Vec::new();
    for round in 1..=ROUNDS {
        let table = format!(
            "galera_mig_{}_{round}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let mut lockers = Vec::new();
        for node in 1..=NODES {
            let pool = cluster.pool(node, 2).await?;
            lockers.push(Locker::<MySql>::builder(pool).table(&table).build()?);
        }
        let barrier = Arc::new(Barrier::new(NODES));
        let mut calls = JoinSet::new();
        for (index, locker) in lockers.iter().enumerate() {
            let (locker, barrier) = (locker.clone(), Arc::clone(&barrier));
            calls.spawn(async move {
                barrier.wait().await;
                let started = Instant::now();
                let outcome = timeout(MIGRATE_LIMIT, locker.migrate()).await;
                (index + 1, outcome, started.elapsed())
            });
        }
        let mut outcomes = Vec::new();
        while let Some(done) = calls.join_next().await {
            outcomes.push(done?);
        }
        outcomes.sort_by_key(|(node, _, _)| *node);
        let mut applied = 0;
        let mut failures = Vec::new();
        let mut said = Vec::new();
        for (node, outcome, took) in &outcomes {
            match outcome {
                Ok(Ok(n)) => {
                    applied += n;
                    said.push(format!("n{node} Ok({n}) in {}", secs(*took)));
                }
                Ok(Err(err)) => failures.push(format!("n{node} Err after {}: {err}", secs(*took))),
                Err(_) => failures.push(format!("n{node} did not return within {MIGRATE_LIMIT:?}")),
            }
        }
        let mut stuck = Vec::new();
        for node in 1..=NODES {
            for session in stuck_sessions(cluster, node).await? {
                stuck.push(format!("n{node} {session}"));
            }
        }
        ensure!(
            failures.is_empty() && stuck.is_empty(),
            "round {round}: {}; {}; sessions waiting to execute in isolation: {stuck:?}",
            said.join(", "),
            failures.join("; ")
        );
        ensure!(
            applied == expected,
            "round {round}: {applied} migrations applied in all ({}), expected {expected}",
            said.join(", ")
        );
        for (index, locker) in lockers.iter().enumerate() {
            let node = index + 1;
            let guard = locker
                .try_acquire("galera:10d", Duration::from_secs(5))
                .await?
                .ok_or_else(|| format!("round {round}: node {node}: the key is held"))?;
            guard.release().await?;
            let triggers: Vec<String> = sqlx::query_scalar(
                "SELECT CAST(TRIGGER_NAME AS CHAR) FROM information_schema.TRIGGERS
                  WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME LIKE CONCAT(?, '%')",
            )
            .bind(&table)
            .fetch_all(locker.pool())
            .await?;
            for wanted in TRIGGERS.map(|t| t.replace("{t}", &table)) {
                ensure!(
                    triggers.contains(&wanted),
                    "round {round}: node {node} has no trigger {wanted} (has {triggers:?})"
                );
            }
            let history: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM {table}_history"
            )))
            .fetch_one(locker.pool())
            .await?;
            ensure!(
                history == expected as i64,
                "round {round}: node {node}'s history has {history} rows, expected {expected}"
            );
        }
        figures.push(format!("round {round}: {}", said.join(", ")));
    }
    Ok(format!(
        "{} migrations applied once per round, no session left waiting, acquire + release and \
         triggers on every node; {}",
        expected,
        figures.join("; ")
    ))
}
