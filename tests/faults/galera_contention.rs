//! Scenarios 10a and 10e: one key, and a semaphore of two permits, contended from the
//! three Galera nodes at once (10a first checks that fair mode is refused there). Every win runs one transaction on its own node (`assert_held`,
//! a fenced counter update, a log row), so the checks are both in the process (no two
//! holds overlap, tokens rise in hold order) and in the database of every node (the
//! counter and the log count each hold once).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dblock::{LockGuard, Locker, MySql};
use sqlx::{AssertSqlSafe, MySqlPool};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};

use crate::Res;
use crate::galera::{Cluster, NODES};
use crate::galera_scenarios::lockers;
use crate::report::secs;

/// How long 10a's clients contend.
const CONTENTION: Duration = Duration::from_secs(10);
/// How long 10e's clients take permits.
const PERMITS_FOR: Duration = Duration::from_secs(6);
/// 10a's and 10e's leases: far above any hold, renewal off (the holds are brief).
const SHORT_HOLD_LEASE: Duration = Duration::from_secs(10);

/// The resource a scenario's lock protects: per id, a counter row (holds, last token)
/// that takes a write only with a token above the last one (storage-side fencing), and a
/// log row per hold.
pub struct Fenced {
    table: String,
    /// Fenced transactions rolled back as conflicts while the lock was held, sent again.
    conflicts: AtomicUsize,
}

/// How many times one fenced transaction is sent again after a conflict rollback.
const CONFLICT_RETRIES: u32 = 5;

/// One hold as its client saw it: `start` after the win, `end` before the release, so it
/// lies inside the database's hold (two that overlap mean two holders at once).
#[derive(Debug, Clone, Copy)]
struct Hold {
    node: usize,
    id: i64,
    token: i64,
    start: Instant,
    end: Instant,
}

impl Fenced {
    /// (Re)creates the tables through `pool` (DDL is replicated in total order) with a
    /// counter row for every id.
    pub async fn create(pool: &MySqlPool, table: &str, ids: &[i64]) -> Res<Fenced> {
        let rows: Vec<String> = ids.iter().map(|id| format!("({id}, 0, 0)")).collect();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {table}_counter, {table}_log;
             CREATE TABLE {table}_counter (id INT PRIMARY KEY, n BIGINT NOT NULL,
                                           last_token BIGINT NOT NULL);
             CREATE TABLE {table}_log (id INT NOT NULL, token BIGINT NOT NULL, node INT NOT NULL,
                                       PRIMARY KEY (id, token));
             INSERT INTO {table}_counter VALUES {}",
            rows.join(", ")
        )))
        .execute(pool)
        .await?;
        Ok(Fenced {
            table: table.to_owned(),
            conflicts: AtomicUsize::new(0),
        })
    }

    /// One transaction on `node` through `pool`: `assert_held`, the fenced counter update,
    /// a log row, commit. `Ok(false)` when the counter refused the token.
    ///
    /// On Galera a fenced transaction can be rolled back (1213) while the lock is still
    /// ours: another node's writeset touched a row it wrote. `guard.explain` tells that
    /// from a lost lock (`NotHeld`, which fails the scenario): it is sent again, as an
    /// application on Galera must, up to [`CONFLICT_RETRIES`] times, and counted.
    pub async fn write(
        &self,
        pool: &MySqlPool,
        guard: &LockGuard<MySql>,
        id: i64,
        node: usize,
    ) -> Res<bool> {
        let mut tries = 0;
        loop {
            match self.write_once(pool, guard, id, node).await {
                Err(dblock::Error::Database(_)) if tries < CONFLICT_RETRIES => {
                    tries += 1;
                    self.conflicts.fetch_add(1, Ordering::SeqCst);
                }
                outcome => return Ok(outcome?),
            }
        }
    }

    /// How many fenced transactions were rolled back as conflicts and sent again.
    pub fn conflicts(&self) -> usize {
        self.conflicts.load(Ordering::SeqCst)
    }

    async fn write_once(
        &self,
        pool: &MySqlPool,
        guard: &LockGuard<MySql>,
        id: i64,
        node: usize,
    ) -> Result<bool, dblock::Error> {
        let table = &self.table;
        let token = guard.fencing_token();
        let mut tx = pool.begin().await?;
        guard.assert_held(&mut tx).await?;
        let statements = async {
            let last: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT last_token FROM {table}_counter WHERE id = ? FOR UPDATE"
            )))
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
            if token <= last {
                return Ok(false);
            }
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {table}_counter SET n = n + 1, last_token = ? WHERE id = ?"
            )))
            .bind(token)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table}_log (id, token, node) VALUES (?, ?, ?)"
            )))
            .bind(id)
            .bind(token)
            .bind(i64::try_from(node).unwrap_or(0))
            .execute(&mut *tx)
            .await?;
            Ok::<bool, sqlx::Error>(true)
        };
        match statements.await {
            Ok(true) => guard.commit(tx).await.map(|()| true),
            Ok(false) => Ok(false),
            Err(err) => Err(guard.explain(err).await),
        }
    }

    /// For `id`: the counter's (holds, last token) and the number of log rows.
    pub async fn state(&self, pool: &MySqlPool, id: i64) -> Res<(i64, i64, i64)> {
        let table = &self.table;
        let (n, last): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT n, last_token FROM {table}_counter WHERE id = ?"
        )))
        .bind(id)
        .fetch_one(pool)
        .await?;
        let logged: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {table}_log WHERE id = ?"
        )))
        .bind(id)
        .fetch_one(pool)
        .await?;
        Ok((n, last, logged))
    }
}

/// Checks holds of one id: no two overlap, tokens strictly rise in hold order, and the
/// counter and log (read on every node) count each hold once.
async fn check_holds(
    lockers: &[Locker<MySql>],
    fenced: &Fenced,
    id: i64,
    holds: &[Hold],
) -> Res<()> {
    let mut mine: Vec<Hold> = holds.iter().copied().filter(|h| h.id == id).collect();
    mine.sort_by_key(|h| h.start);
    for pair in mine.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        ensure!(
            a.end <= b.start,
            "id {id}: overlapping holds: token {} (node {}) and token {} (node {})",
            a.token,
            a.node,
            b.token,
            b.node
        );
        ensure!(
            a.token < b.token,
            "id {id}: tokens not rising in hold order: {} then {}",
            a.token,
            b.token
        );
    }
    let highest = mine.last().map_or(0, |h| h.token);
    for (index, locker) in lockers.iter().enumerate() {
        let (n, last, logged) = fenced.state(locker.pool(), id).await?;
        ensure!(
            n == mine.len() as i64 && logged == n && last == highest,
            "id {id} on node {}: counter {n}, log rows {logged}, last token {last}; \
             expected {} holds up to token {highest}",
            index + 1,
            mine.len()
        );
    }
    Ok(())
}

/// Holds per node, as `n1 412, n2 ...`.
fn per_node(holds: &[Hold]) -> String {
    (1..=NODES)
        .map(|node| {
            format!(
                "n{node} {}",
                holds.iter().filter(|h| h.node == node).count()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

async fn join_all(mut tasks: JoinSet<Res<Vec<Hold>>>) -> Res<Vec<Hold>> {
    let mut holds = Vec::new();
    while let Some(done) = tasks.join_next().await {
        holds.extend(done??);
    }
    Ok(holds)
}

/// 10a: a client per node loops `try_acquire` on one key; a win runs one fenced
/// transaction on its node and releases.
pub async fn contention(cluster: &mut Cluster) -> Res<String> {
    let key = "galera:10a";
    let lockers = lockers(cluster, 3).await?;
    fair_refused(&lockers, key).await?;
    let fenced = Arc::new(Fenced::create(lockers[0].pool(), "galera_10a", &[0]).await?);
    let holding = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let until = started + CONTENTION;
    let mut tasks = JoinSet::new();
    for (index, locker) in lockers.iter().enumerate() {
        let (locker, fenced) = (locker.clone(), Arc::clone(&fenced));
        let (holding, overlaps) = (Arc::clone(&holding), Arc::clone(&overlaps));
        tasks.spawn(async move {
            let node = index + 1;
            let mut holds = Vec::new();
            while Instant::now() < until {
                let Some(guard) = locker.try_acquire(key, SHORT_HOLD_LEASE).await? else {
                    sleep(Duration::from_micros(fastrand::u64(0..2_000))).await;
                    continue;
                };
                let start = Instant::now();
                if holding.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let applied = fenced.write(locker.pool(), &guard, 0, node).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                let end = Instant::now();
                let token = guard.fencing_token();
                guard.release().await?;
                ensure!(
                    applied.map_err(|e| format!("node {node}, token {token}: {e}"))?,
                    "node {node}: the counter refused token {token} (a newer one was stored)"
                );
                holds.push(Hold {
                    node,
                    id: 0,
                    token,
                    start,
                    end,
                });
            }
            Ok(holds)
        });
    }
    let holds = join_all(tasks).await?;
    let elapsed = started.elapsed();
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(
        overlaps == 0,
        "{overlaps} holds began while another was held"
    );
    ensure!(!holds.is_empty(), "nobody ever won the key");
    check_holds(&lockers, &fenced, 0, &holds).await?;
    ensure!(
        (1..=NODES).all(|node| holds.iter().any(|h| h.node == node)),
        "a node never won: {}",
        per_node(&holds)
    );
    Ok(format!(
        "fair(true) refused on every node (InvalidConfig, nothing written); {} holds in {} \
         ({:.1}/s; {}), 0 overlaps, tokens rising (up to {}), counter = holds = log rows on \
         every node; {} fenced transactions rolled back as conflicts while held, sent again",
        holds.len(),
        secs(elapsed),
        holds.len() as f64 / elapsed.as_secs_f64(),
        per_node(&holds),
        holds.iter().map(|h| h.token).max().unwrap_or(0),
        fenced.conflicts()
    ))
}

/// Fair mode cannot keep its promise on Galera (ticket numbers come in per-node
/// strides): a fair Locker's first waiting acquisition on each node answers
/// `InvalidConfig`, and neither a lock row nor a ticket of `key` is on any node.
async fn fair_refused(lockers: &[Locker<MySql>], key: &str) -> Res<()> {
    for (index, locker) in lockers.iter().enumerate() {
        let node = index + 1;
        let fair = Locker::builder(locker.pool().clone()).fair(true).build()?;
        let refused = fair
            .acquire(key, SHORT_HOLD_LEASE, Duration::from_secs(1))
            .await;
        ensure!(
            matches!(&refused, Err(dblock::Error::InvalidConfig(why)) if why.contains("Galera")),
            "node {node}: a fair Locker's acquire returned {refused:?}, expected InvalidConfig"
        );
    }
    for (index, locker) in lockers.iter().enumerate() {
        let written: i64 = sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM distributed_lock WHERE lock_key = ?)
                  + (SELECT COUNT(*) FROM distributed_lock_ticket WHERE lock_key = ?)",
        )
        .bind(key)
        .bind(key)
        .fetch_one(locker.pool())
        .await?;
        ensure!(
            written == 0,
            "node {}: the refused fair acquisitions left {written} rows of {key:?}",
            index + 1
        );
    }
    Ok(())
}

/// 10e: two clients per node take permits of one semaphore of two, hold each briefly
/// (a fenced write on the permit's counter) and give it back.
pub async fn semaphore(cluster: &mut Cluster) -> Res<String> {
    const PERMITS: u32 = 2;
    let lockers = lockers(cluster, 4).await?;
    let fenced = Arc::new(Fenced::create(lockers[0].pool(), "galera_10e", &[0, 1]).await?);
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let timeouts = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let until = started + PERMITS_FOR;
    let mut tasks = JoinSet::new();
    for (index, locker) in lockers.iter().enumerate() {
        for _ in 0..2 {
            let locker = locker.clone();
            let fenced = Arc::clone(&fenced);
            let (holding, most, timeouts) = (
                Arc::clone(&holding),
                Arc::clone(&most),
                Arc::clone(&timeouts),
            );
            tasks.spawn(async move {
                let node = index + 1;
                let semaphore = locker.semaphore("galera-10e", PERMITS);
                let mut holds = Vec::new();
                while Instant::now() < until {
                    let permit = match semaphore
                        .acquire(SHORT_HOLD_LEASE, Duration::from_secs(5))
                        .await
                    {
                        Ok(permit) => permit,
                        Err(dblock::Error::Timeout { .. }) => {
                            timeouts.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        Err(err) => return Err(format!("node {node}: {err}").into()),
                    };
                    let start = Instant::now();
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let id = i64::from(permit.number());
                    let applied = fenced.write(locker.pool(), &permit, id, node).await;
                    sleep(Duration::from_millis(fastrand::u64(5..15))).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    let end = Instant::now();
                    let token = permit.fencing_token();
                    permit.release().await?;
                    ensure!(
                        applied.map_err(|e| format!("node {node}, permit {id}: {e}"))?,
                        "node {node}: permit {id}'s counter refused token {token}"
                    );
                    holds.push(Hold {
                        node,
                        id,
                        token,
                        start,
                        end,
                    });
                }
                Ok(holds)
            });
        }
    }
    let holds = join_all(tasks).await?;
    let elapsed = started.elapsed();
    let most = most.load(Ordering::SeqCst);
    ensure!(
        most <= PERMITS as usize,
        "{most} holders at once of a semaphore of {PERMITS}"
    );
    for id in 0..i64::from(PERMITS) {
        check_holds(&lockers, &fenced, id, &holds).await?;
    }
    Ok(format!(
        "{} grants in {} ({}; permit 0: {}, permit 1: {}), at most {most} holders at once, \
         tokens rising per permit, counters = grants = log rows on every node; {} waits timed out; \
         {} fenced transactions rolled back as conflicts while held, sent again",
        holds.len(),
        secs(elapsed),
        per_node(&holds),
        holds.iter().filter(|h| h.id == 0).count(),
        holds.iter().filter(|h| h.id == 1).count(),
        timeouts.load(Ordering::SeqCst),
        fenced.conflicts()
    ))
}
