//! Scenario 8e: MariaDB with a semi-synchronous replica (`rpl_semi_sync_master_enabled`,
//! built in since 10.3, `AFTER_SYNC`): a primary and a replica started from the installed
//! binaries, the replica reading the binlog through one proxy (`link`) and clients
//! reaching the primary through another (`vip`, the virtual IP).
//!
//! While semi-sync is in force an acquisition is answered only once the replica has it;
//! when the replica does not acknowledge within `rpl_semi_sync_master_timeout`, the
//! primary commits alone (semi-sync turns itself off, and the replica does not have the
//! row) until the replica catches up. Then the failover: the primary SIGKILLed, the
//! replica applies what it received and stops replicating, the virtual IP moves. The
//! held lock is there with the same owner and token, a rival is refused, renewal resumes
//! without `lost()`, and the key's next token is greater.

use std::time::Duration;

use dblock::{Locker, MySql};
use sqlx::pool::PoolOptions;
use sqlx::{AssertSqlSafe, MySqlPool, Row};
use tokio::time::{Instant, timeout};

use crate::failover::{LEASE, STEP, answered_once_replicated, same_row};
use crate::holder::wall_micros;
use crate::proxy::{Direction, Proxy, via_proxy};
use crate::report::{ms, secs};
use crate::server::{Kind, Server, Stop};
use crate::{Res, Skipped, eventually, renewed, required};

/// The primary's wait for an acknowledgement in the main part: far above any hold here.
const ACK_TIMEOUT: Duration = Duration::from_secs(60);
/// The wait while the pair is set up.
const SETUP_ACK_TIMEOUT: Duration = Duration::from_millis(100);
/// The wait in the fallback part.
const SHORT_ACK_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the replica may take to start acknowledging, or to catch up.
const ATTACH: Duration = Duration::from_secs(30);

/// A primary, its semi-synchronous replica (none after the failover) and the proxies.
struct SemiSync {
    primary: Server,
    replica: Option<Server>,
    vip: Proxy,
    link: Proxy,
}

impl SemiSync {
    async fn start() -> Res<SemiSync> {
        // One after the other: two mariadb-install-db runs at once failed once in CI
        // (exit status 1 within half a second).
        let primary = Server::start_with(
            Kind::MariaDb,
            vec![
                "--log-bin=mysql-bin".to_owned(),
                "--server-id=1".to_owned(),
                "--binlog-format=ROW".to_owned(),
                "--rpl-semi-sync-master-enabled=ON".to_owned(),
                // Lossless: the commit becomes visible only after the replica has it.
                "--rpl-semi-sync-master-wait-point=AFTER_SYNC".to_owned(),
                // Short until the replica is attached: the database is created before
                // any replica is there, and the primary waits for one regardless
                // (`rpl_semi_sync_master_wait_no_slave`).
                format!(
                    "--rpl-semi-sync-master-timeout={}",
                    SETUP_ACK_TIMEOUT.as_millis()
                ),
            ],
        )
        .await?;
        let replica = Server::start_with(
            Kind::MariaDb,
            vec![
                "--server-id=2".to_owned(),
                "--rpl-semi-sync-slave-enabled=ON".to_owned(),
            ],
        )
        .await?;
        let vip = Proxy::start(primary.addr()).await;
        let link = Proxy::start(primary.addr()).await;
        // Both servers were made by mariadb-install-db alike, so the replica can start
        // from the primary's first binlog event (its own CREATE DATABASE went to no binlog).
        let admin = MySqlPool::connect(replica.url()).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'root',
                 MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
             START SLAVE",
            link.addr().port()
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        let pair = SemiSync {
            primary,
            replica: Some(replica),
            vip,
            link,
        };
        let primary = pair.primary_pool().await?;
        eventually("the replica acknowledges", ATTACH, async || {
            Ok(
                status(&primary, "Rpl_semi_sync_master_clients").await? == "1"
                    && status(&primary, "Rpl_semi_sync_master_status").await? == "ON",
            )
        })
        .await?;
        set_ack_timeout(&primary, ACK_TIMEOUT).await?;
        primary.close().await;
        Ok(pair)
    }

    /// A migrated locker through the virtual IP.
    async fn locker(&self) -> Res<Locker<MySql>> {
        let pool = PoolOptions::new()
            .max_connections(4)
            .connect(&via_proxy(self.primary.url(), self.vip.addr()))
            .await?;
        let locker = Locker::new(pool);
        locker.migrate().await?;
        Ok(locker)
    }

    async fn primary_pool(&self) -> Res<MySqlPool> {
        Ok(MySqlPool::connect(self.primary.url()).await?)
    }

    async fn replica_pool(&self) -> Res<MySqlPool> {
        let replica = self.replica.as_ref().ok_or("no replica")?;
        Ok(MySqlPool::connect(replica.url()).await?)
    }

    /// Kill the primary; the replica applies everything it received (all that was
    /// acknowledged), stops replicating and takes the virtual IP. Returns the time taken.
    async fn fail_over(&mut self) -> Res<Duration> {
        let started = Instant::now();
        self.primary.stop(Stop::Crash).await?;
        let admin = self.replica_pool().await?;
        sqlx::raw_sql("STOP SLAVE IO_THREAD")
            .execute(&admin)
            .await?;
        let received: String = sqlx::raw_sql("SHOW SLAVE STATUS")
            .fetch_one(&admin)
            .await?
            .try_get("Gtid_IO_Pos")?;
        let waited: i64 = sqlx::query_scalar("SELECT MASTER_GTID_WAIT(?, 30)")
            .bind(&received)
            .fetch_one(&admin)
            .await?;
        ensure!(
            waited == 0,
            "the replica did not apply what it received ({received})"
        );
        sqlx::raw_sql("STOP SLAVE; RESET SLAVE ALL")
            .execute(&admin)
            .await?;
        admin.close().await;
        self.primary = self.replica.take().ok_or("no replica")?;
        self.vip.retarget(self.primary.addr());
        Ok(started.elapsed())
    }
}

/// A global status variable of the server.
async fn status(pool: &MySqlPool, name: &str) -> Res<String> {
    Ok(sqlx::query_scalar(
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?",
    )
    .bind(name)
    .fetch_one(pool)
    .await?)
}

async fn set_ack_timeout(pool: &MySqlPool, timeout: Duration) -> Res<()> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET GLOBAL rpl_semi_sync_master_timeout = {}",
        timeout.as_millis()
    )))
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn run() -> Res<String> {
    if !Server::installed(Kind::MariaDb) {
        let reason = "MariaDB binaries are not installed".to_owned();
        if required("mysql") {
            return Err(reason.into());
        }
        return Err(Skipped(reason).into());
    }
    let key = "fault:failover:semisync";
    let mut pair = SemiSync::start().await?;
    let locker = pair.locker().await?;
    let rival = pair.locker().await?;

    // Semi-sync in force: while the replica receives nothing, no answer.
    let guard =
        answered_once_replicated(&pair.link, &locker, key, "semi-synchronous replica").await?;

    let (waited, back) = fallback(&pair, &locker).await?;

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
    same_row(&Locker::new(pair.primary_pool().await?), &guard).await?;
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
        next_token > token,
        "the key's next token {next_token} is not above {token}"
    );
    Ok(format!(
        "acquisition unanswered while the replica received nothing; with a {} timeout the \
         primary answered alone after {} (semi-sync OFF, row not on the replica), back ON {} \
         after the replica caught up; failover {} (kill, relay log applied, VIP moved), lease \
         {}: renewed with {} of the granted lease left; same owner and token {token}, rival \
         refused; next token {next_token}",
        secs(SHORT_ACK_TIMEOUT),
        secs(waited),
        secs(back),
        secs(took),
        secs(LEASE),
        ms(margin)
    ))
}

/// With a short acknowledgement timeout and the replica receiving nothing, the primary
/// answers once the timeout has passed, having turned semi-sync off: the row is on the
/// primary only. Semi-sync turns itself on again once the replica has caught up.
/// Returns how long the acquisition waited and how long semi-sync took to come back.
async fn fallback(pair: &SemiSync, locker: &Locker<MySql>) -> Res<(Duration, Duration)> {
    let key = "fault:failover:semisync-fallback";
    let primary = pair.primary_pool().await?;
    let replica = Locker::new(pair.replica_pool().await?);
    set_ack_timeout(&primary, SHORT_ACK_TIMEOUT).await?;
    pair.link.hold(Direction::Down, true);
    let started = Instant::now();
    let guard = timeout(STEP, locker.try_acquire(key, LEASE))
        .await
        .map_err(|_| "no answer after the semi-sync timeout")??
        .ok_or("fallback key held")?;
    let waited = started.elapsed();
    let off = status(&primary, "Rpl_semi_sync_master_status").await?;
    let on_replica = replica.holder(key).await?.is_some();
    pair.link.hold(Direction::Down, false);
    set_ack_timeout(&primary, ACK_TIMEOUT).await?;
    ensure!(
        waited + Duration::from_millis(50) >= SHORT_ACK_TIMEOUT,
        "answered after {} with the replica silent: semi-sync did not wait",
        secs(waited)
    );
    ensure!(
        off == "OFF" && !on_replica,
        "after the timeout: semi-sync {off}, row on the replica: {on_replica}"
    );
    let back = eventually("semi-sync comes back on", ATTACH, async || {
        Ok(status(&primary, "Rpl_semi_sync_master_status").await? == "ON")
    })
    .await?;
    guard.release().await?;
    Ok((waited, back))
}
