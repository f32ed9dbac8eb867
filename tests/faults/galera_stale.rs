//! Scenarios 10c and 10g: a stale holder's transaction on one Galera node meets a takeover
//! committed through another.
//!
//! On one server `assert_held`'s share lock makes the rival's takeover wait for the
//! holder's transaction. Galera does not replicate that lock: the rival's takeover on
//! node 2 commits at once, and node 1 applies it by aborting the holder's transaction
//! (brute force, MariaDB error 1213), which `LockGuard::commit` / `explain` report as
//! `NotHeld` (10c). Between node 2's commit and node 1's apply there is a window in
//! which the holder's COMMIT is certified anyway (its writeset holds no key of the lock
//! row, so nothing conflicts with the takeover's): 10g commits right after the takeover
//! and counts what got through, with node 1 idle and with node 1 busy applying.

use std::time::Duration;

use dblock::{Error, Locker};
use sqlx::AssertSqlSafe;
use sqlx::mysql::MySqlDatabaseError;
use tokio::time::{Instant, sleep};

use crate::galera::{Cluster, NODES};
use crate::report::ms;
use crate::{Res, eventually, take_over};

/// 10c's lease: short, not renewed.
const STALE_LEASE: Duration = Duration::from_secs(2);
/// 10g's lease, for many rounds in little time.
const RACE_LEASE: Duration = Duration::from_millis(200);
/// 10g's rounds with node 1 idle: a stale commit got through in 0-5 % of them here, 25 %
/// with two CPU burners beside.
const IDLE_ROUNDS: usize = 40;
/// 10g's rounds with node 1 applying a bulk write: in 40-60 % of them here.
const BUSY_ROUNDS: usize = 20;
/// The bulk write's rows (about 50 ms to commit here).
const BULK_ROWS: usize = 20_000;
/// How long any one wait may take.
const STEP: Duration = Duration::from_secs(15);

/// The MariaDB error number of a failed statement, if the server sent one.
fn number(err: &sqlx::Error) -> Option<u16> {
    err.as_database_error()
        .and_then(|e| e.try_downcast_ref::<MySqlDatabaseError>())
        .map(|e| e.number())
}

/// 10c: the holder on node 1 (lease 2 s, no renewal) opens a transaction, `assert_held`,
/// and writes a counter row; a rival on node 2 takes the key after the lease; once node 1
/// has applied that takeover, the holder's COMMIT (case 1, `LockGuard::commit`) or next
/// statement (case 2, read by `LockGuard::explain`) fails with `NotHeld`, and nothing of
/// its transaction is on any node.
pub async fn stale_holder(cluster: &mut Cluster) -> Res<String> {
    let holder_pool = cluster.pool(1, 3).await?;
    let holder = Locker::builder(holder_pool.clone())
        .auto_renew(false)
        .build()?;
    let rival = Locker::new(cluster.pool(2, 3).await?);
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS galera_10c;
         CREATE TABLE galera_10c (id INT PRIMARY KEY, n BIGINT NOT NULL);
         INSERT INTO galera_10c VALUES (1, 0), (2, 0)",
    )
    .execute(&holder_pool)
    .await?;
    let mut figures = Vec::new();
    for (id, at_commit) in [(1_i64, true), (2, false)] {
        let key = format!("galera:10c:{id}");
        let guard = holder
            .try_acquire(&key, STALE_LEASE)
            .await?
            .ok_or("key held")?;
        let mut tx = holder_pool.begin().await?;
        guard.assert_held(&mut tx).await?;
        let write = format!("UPDATE galera_10c SET n = n + 1 WHERE id = {id}");
        if at_commit {
            sqlx::query(AssertSqlSafe(write.clone()))
                .execute(&mut *tx)
                .await?;
        }
        let (next, _, _) = take_over(&rival, &key, STEP, Instant::now() + STEP).await?;
        let row = rival
            .holder(&key)
            .await?
            .ok_or("no row after the takeover")?;
        let after_us = row.acquired_at.timestamp_micros() - guard.expires_at().timestamp_micros();
        ensure!(
            after_us >= 0,
            "the rival took the key {} BEFORE the lease ended",
            ms(after_us)
        );
        // Galera certifies the takeover at once but applies it on node 1 a moment later
        // (aborting the holder's transaction, whose share lock is in the way): wait for
        // node 1 to show the rival's row, so that the abort has happened.
        eventually("node 1 applies the takeover", STEP, async || {
            Ok(holder
                .holder(&key)
                .await?
                .is_some_and(|r| r.owner == next.owner()))
        })
        .await?;
        // dblock tells the lost lock from an ordinary deadlock: guard.commit for the
        // COMMIT, guard.explain for an error of the caller's own statement (MariaDB's
        // error is 1213, the brute-force abort).
        let (what, failed) = if at_commit {
            ("guard.commit(tx)", guard.commit(tx).await.err())
        } else {
            let failed = match sqlx::query(AssertSqlSafe(write)).execute(&mut *tx).await {
                Ok(_) => None,
                Err(err) => {
                    ensure!(
                        number(&err) == Some(1213),
                        "the stale holder's next statement failed with {err}, expected 1213"
                    );
                    Some(guard.explain(err).await)
                }
            };
            drop(tx);
            ("the next statement (guard.explain)", failed)
        };
        let failed = failed.ok_or_else(|| {
            format!("{what}: the stale holder's transaction went on after the takeover")
        })?;
        ensure!(
            matches!(failed, Error::NotHeld { .. }),
            "{what} failed with {failed:?}, expected NotHeld"
        );
        for node in 1..=NODES {
            let n: i64 = sqlx::query_scalar("SELECT n FROM galera_10c WHERE id = ?")
                .bind(id)
                .fetch_one(&cluster.pool(node, 1).await?)
                .await?;
            ensure!(
                n == 0,
                "node {node}: the stale holder's write committed (n = {n})"
            );
        }
        ensure!(
            next.fencing_token() > guard.fencing_token(),
            "token {} after {}",
            next.fencing_token(),
            guard.fencing_token()
        );
        let old_token = guard.fencing_token();
        let released = guard.release().await;
        ensure!(
            matches!(released, Err(Error::NotHeld { .. })),
            "releasing the stale guard returned {released:?}, expected NotHeld"
        );
        figures.push(format!(
            "{what}: NotHeld (rival won {} after the lease, token {} -> {}), nothing committed",
            ms(after_us),
            old_token,
            next.fencing_token()
        ));
        next.release().await?;
    }
    Ok(figures.join("; "))
}

/// 10g: as 10c's first case, but the holder's `guard.commit(tx)` is sent as soon as the
/// rival's takeover has committed on node 2, without waiting for node 1 to apply it. Every
/// such commit must be refused (`NotHeld`): a stale holder's write must not commit after
/// another holder's acquisition. Two phases: node 1 idle (the window is its apply lag for
/// one small writeset), and node 1 busy applying a bulk write that node 3 committed just
/// before the takeover (apply lag, as on a busy node).
pub async fn stale_commit_race(cluster: &mut Cluster) -> Res<String> {
    let holder_pool = cluster.pool(1, 3).await?;
    let holder = Locker::builder(holder_pool.clone())
        .auto_renew(false)
        .build()?;
    let rival = Locker::new(cluster.pool(2, 3).await?);
    let bulk = cluster.pool(3, 1).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS galera_10g, galera_10g_bulk;
         CREATE TABLE galera_10g (id INT PRIMARY KEY, n BIGINT NOT NULL);
         CREATE TABLE galera_10g_bulk (round INT, n INT, PRIMARY KEY (round, n));
         INSERT INTO galera_10g VALUES (1, 0)",
    )
    .execute(&holder_pool)
    .await?;
    let (mut committed, mut other, mut phases) = (Vec::new(), Vec::new(), Vec::new());
    let mut round = 0;
    for (phase, rounds, bulk_rows) in [
        ("node 1 idle", IDLE_ROUNDS, 0),
        ("node 1 applying", BUSY_ROUNDS, BULK_ROWS),
    ] {
        let mut got_through = 0;
        for _ in 0..rounds {
            round += 1;
            let key = format!("galera:10g:{round}");
            let guard = holder
                .try_acquire(&key, RACE_LEASE)
                .await?
                .ok_or("key held")?;
            let mut tx = holder_pool.begin().await?;
            guard.assert_held(&mut tx).await?;
            sqlx::query("UPDATE galera_10g SET n = n + 1 WHERE id = 1")
                .execute(&mut *tx)
                .await?;
            if bulk_rows > 0 {
                // After the lease, so that the rival's first attempt wins: node 3's bulk
                // write is ordered just before the takeover, and node 1 applies it first.
                let left = (guard.expires_at() - chrono::Utc::now())
                    .to_std()
                    .unwrap_or_default();
                sleep(left + Duration::from_millis(20)).await;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "INSERT INTO galera_10g_bulk (round, n) SELECT {round}, seq FROM seq_1_to_{bulk_rows}"
                )))
                .execute(&bulk)
                .await?;
            }
            let (next, _, _) = take_over(&rival, &key, STEP, Instant::now() + STEP).await?;
            match guard.commit(tx).await {
                Ok(()) => {
                    got_through += 1;
                    committed.push(format!(
                        "round {round} ({phase}): token {} after token {}'s takeover",
                        guard.fencing_token(),
                        next.fencing_token()
                    ));
                }
                Err(Error::NotHeld { .. }) => {}
                Err(err) => other.push(format!("round {round}: {err}")),
            }
            next.release().await?;
            drop(guard);
        }
        phases.push(format!("{phase}: {got_through} of {rounds}"));
    }
    let mut counts = Vec::new();
    for node in 1..=NODES {
        let n: i64 = sqlx::query_scalar("SELECT n FROM galera_10g WHERE id = 1")
            .fetch_one(&cluster.pool(node, 1).await?)
            .await?;
        counts.push(format!("n{node} {n}"));
        ensure!(
            n == committed.len() as i64,
            "node {node}: the counter is {n} while guard.commit said Ok {} times",
            committed.len()
        );
    }
    ensure!(
        committed.is_empty() && other.is_empty(),
        "stale transactions COMMITTED (guard.commit Ok) right after a rival's takeover on node \
         2: {} (first: {}; the rest NotHeld); other errors: {other:?}; counter {}",
        phases.join(", "),
        committed
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("; "),
        counts.join(", ")
    );
    Ok(format!(
        "stale COMMITs sent right after the takeover, all NotHeld ({}), counter 0 on every node",
        phases.join(", ")
    ))
}
