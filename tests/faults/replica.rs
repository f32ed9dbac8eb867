//! A replicated PostgreSQL for the failover scenarios: a primary and a streaming standby
//! (private servers from the installed binaries, see server.rs), and two proxies in
//! front of the primary:
//! - `vip`, what clients connect to: the virtual IP (or DNS name, or PgBouncer) that an
//!   operator or a failover manager moves to the new primary;
//! - `link`, what the standby streams WAL through, so a scenario can hold the stream and
//!   make the standby miss what the primary commits.
//!
//! A failover is the three steps a failover manager takes: SIGKILL the primary, promote
//! the standby (`pg_ctl promote`), move both proxies to it. The dead node can come back
//! as a standby of the new primary, from a fresh base backup.

use std::time::Duration;

use dblock::{Locker, Postgres};
use sqlx::PgPool;
use sqlx::pool::PoolOptions;
use tokio::time::Instant;

use crate::proxy::{Proxy, via_proxy};
use crate::server::{Kind, PG_BIN, Server, Stop};
use crate::{Res, eventually};

/// How long a standby may take to stream, or to become synchronous, on a busy machine.
const ATTACH: Duration = Duration::from_secs(30);

/// The standby's names (`application_name`, which `synchronous_standby_names` names).
const NODES: [&str; 2] = ["node_a", "node_b"];

/// How long a standby whose stream broke waits before it looks for WAL again (default
/// 5 s). PostgreSQL 15 lets a promotion requested in that wait sit it out: with the
/// default, a failover here took 0.1 s or 5.1 s depending on that moment.
const RETRY: &str = "wal_retrieve_retry_interval=100ms";

/// How commits wait for the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `synchronous_standby_names` names the standby and `synchronous_commit = on`: a
    /// commit returns once the standby has flushed its WAL.
    Sync,
    /// No synchronous standby: a commit returns once the primary has it.
    Async,
}

/// Whether the replication tools are installed (the server binary is checked by
/// [`Server::installed`]).
pub fn installed() -> bool {
    Server::installed(Kind::Postgres)
        && ["pg_basebackup", "pg_ctl"]
            .iter()
            .all(|tool| std::path::Path::new(PG_BIN).join(tool).exists())
}

/// A primary, its standby (none between a failover and a rebuild) and the two proxies.
pub struct Pair {
    mode: Mode,
    primary: Server,
    primary_name: &'static str,
    standby: Option<(Server, &'static str)>,
    /// The node killed by the last failover, until it is rebuilt.
    dead: Option<(Server, &'static str)>,
    /// Clients' address of "the primary".
    pub vip: Proxy,
    /// The standby's address of the primary.
    pub link: Proxy,
}

impl Pair {
    /// Starts a primary and a streaming standby of it (synchronous in [`Mode::Sync`]).
    pub async fn start(mode: Mode) -> Res<Pair> {
        let primary = Server::start(Kind::Postgres).await?;
        let vip = Proxy::start(primary.addr()).await;
        let link = Proxy::start(primary.addr()).await;
        let mut pair = Pair {
            mode,
            primary,
            primary_name: NODES[0],
            standby: None,
            dead: None,
            vip,
            link,
        };
        pair.attach(NODES[1]).await?;
        Ok(pair)
    }

    /// A URL for clients: through the virtual IP.
    pub fn url(&self) -> String {
        via_proxy(self.primary.url(), self.vip.addr())
    }

    /// A migrated locker whose pool reaches the primary through the virtual IP.
    pub async fn locker(&self) -> Res<Locker<Postgres>> {
        let pool = PoolOptions::new()
            .max_connections(4)
            .connect(&self.url())
            .await?;
        let locker = Locker::new(pool);
        locker.migrate().await?;
        Ok(locker)
    }

    /// A pool straight to the current primary, to look at what it has.
    pub async fn primary_pool(&self) -> Res<PgPool> {
        Ok(PgPool::connect(self.primary.url()).await?)
    }

    /// A pool straight to the standby (read-only, hot standby).
    pub async fn standby_pool(&self) -> Res<PgPool> {
        let (standby, _) = self.standby.as_ref().ok_or("no standby")?;
        Ok(PgPool::connect(standby.url()).await?)
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn caught_up(&self) -> Res<Duration> {
        let primary = self.primary_pool().await?;
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&primary)
            .await?;
        let standby = self.standby_pool().await?;
        eventually(
            "the standby replays the primary's WAL",
            ATTACH,
            async || {
                Ok(
                    sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
                        .bind(&lsn)
                        .fetch_one(&standby)
                        .await?,
                )
            },
        )
        .await
    }

    /// SIGKILLs the primary (and every process it started) and waits until it is gone.
    pub async fn kill_primary(&mut self) -> Res<()> {
        self.primary.stop(Stop::Crash).await
    }

    /// Promotes the standby of a killed primary; returns once it takes writes.
    pub async fn promote(&mut self) -> Res<()> {
        let (standby, name) = self.standby.take().ok_or("no standby to promote")?;
        standby.promote().await?;
        let old = std::mem::replace(&mut self.primary, standby);
        self.dead = Some((old, std::mem::replace(&mut self.primary_name, name)));
        Ok(())
    }

    /// Points the virtual IP and the replication address at the (new) primary, closing
    /// the connections to the old one.
    pub fn move_vip(&self) {
        self.vip.retarget(self.primary.addr());
        self.link.retarget(self.primary.addr());
    }

    /// The whole failover: kill, promote, move. Returns how long it took from the kill.
    pub async fn fail_over(&mut self) -> Res<Duration> {
        let started = Instant::now();
        self.kill_primary().await?;
        self.promote().await?;
        self.move_vip();
        Ok(started.elapsed())
    }

    /// Brings the node killed by the last failover back as a standby of the new primary,
    /// from a fresh base backup (its old data directory is gone), in the pair's mode.
    pub async fn rebuild(&mut self) -> Res<()> {
        let (dead, name) = self.dead.take().ok_or("no node to rebuild")?;
        drop(dead);
        self.attach(name).await
    }

    /// Takes a base backup through `link`, starts the standby, waits until it streams,
    /// and in [`Mode::Sync`] makes it the synchronous standby.
    ///
    /// `synchronous_standby_names` is set with `ALTER SYSTEM` after the base backup, so
    /// the standby does not inherit it: promoted, it waits for no one (a primary whose
    /// synchronous standby is dead would block every commit).
    async fn attach(&mut self, name: &'static str) -> Res<()> {
        let standby = Server::standby(self.link.addr(), name, vec![RETRY.to_owned()]).await?;
        self.standby = Some((standby, name));
        let primary = self.primary_pool().await?;
        let state = async |wanted: &str| -> Res<bool> {
            Ok(sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_replication
                                 WHERE application_name = $1 AND state = 'streaming'
                                   AND ($2 = '' OR sync_state = $2))",
            )
            .bind(name)
            .bind(wanted)
            .fetch_one(&primary)
            .await?)
        };
        eventually("the standby streams", ATTACH, async || state("").await).await?;
        let names = match self.mode {
            Mode::Sync => format!("\"{name}\""),
            Mode::Async => String::new(),
        };
        // Two statements: ALTER SYSTEM refuses to run in the implicit transaction of a
        // multi-statement string.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        )))
        .execute(&primary)
        .await?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&primary)
            .await?;
        if self.mode == Mode::Sync {
            eventually("the standby is synchronous", ATTACH, async || {
                state("sync").await
            })
            .await?;
        }
        primary.close().await;
        Ok(())
    }

    /// The current primary's node name.
    pub fn primary_name(&self) -> &'static str {
        self.primary_name
    }
}
