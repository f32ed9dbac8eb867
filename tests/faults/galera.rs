//! A private three-node MariaDB Galera cluster (multi-primary) for scenario group 10,
//! started from the installed `mariadbd` and `galera-4` on free loopback ports, as
//! /work/shared/docs/ha-facts.md section A describes the recipe that worked here:
//!
//! - every node runs as the `mysql` OS user: as root, the rsync state transfer (SST)
//!   fails (the rsync daemon it starts drops to `nobody` and cannot write);
//! - node 1 is initialised and bootstrapped once (`--wsrep-new-cluster`), stopped, and its
//!   data directory copied to nodes 2 and 3 (without `gvwstate.dat`, with
//!   `safe_to_bootstrap: 0`), so that they join by incremental transfer (IST);
//! - readiness is Galera's own signal: `wsrep_local_state_comment = Synced` and the
//!   expected `wsrep_cluster_size`, never a fixed sleep.
//!
//! The shared servers on 3306 / 5432 are never touched. The processes are killed and the
//! directory removed on drop.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use sqlx::pool::PoolOptions;
use sqlx::{Connection, MySqlConnection, MySqlPool};
use tokio::process::Child;
use tokio::time::{Instant, sleep};

use crate::Res;
use crate::server::{
    MARIADB_INSTALL_DB, MARIADBD, dies_with_us, free_ports, group_alive, is_root, os_user, signal,
};

// Data directories and configuration files.
#[path = "galera_setup.rs"]
mod setup;

/// Galera's replication library (Debian's galera-4).
pub const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";
/// The state-transfer script the nodes run, and the tool it needs.
const SST_SCRIPT: &str = "/usr/bin/wsrep_sst_rsync";
const RSYNC: &str = "/usr/bin/rsync";

/// Nodes in the cluster.
pub const NODES: usize = 3;
/// How long a node may take to start, join and reach `Synced` on a busy two-core
/// machine (a join by IST took 8 s here, a rejoin after SIGKILL 17-24 s).
pub const JOIN: Duration = Duration::from_secs(75);

/// Whether everything a cluster needs is installed; `Err` says what is missing.
pub fn installed() -> Result<(), String> {
    let missing: Vec<&str> = [MARIADBD, MARIADB_INSTALL_DB, PROVIDER, SST_SCRIPT, RSYNC]
        .into_iter()
        .filter(|path| !Path::new(path).exists())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("not installed: {}", missing.join(", ")))
    }
}

/// One node: its ports and, while it runs, its process.
struct Node {
    /// The SQL port.
    port: u16,
    /// Galera's group communication (gcomm), incremental and full state transfer ports.
    gcomm: u16,
    ist: u16,
    sst: u16,
    child: Option<Child>,
}

/// Three MariaDB nodes in one Galera cluster. Nodes are numbered 1 to 3, as in the docs.
pub struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
    /// The `mysql` OS user the nodes run as (when the suite runs as root).
    user: Option<(u32, u32)>,
}

impl Cluster {
    /// Initialises, bootstraps and joins the three nodes; returns once all three are
    /// `Synced` in a cluster of three, with the database `test` on every node.
    pub async fn start() -> Res<Cluster> {
        let dir = std::env::temp_dir().join(format!(
            "dblock-faults-{}-galera-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        // SQL, gcomm, IST and SST for each node.
        let ports = free_ports(NODES * 4)?;
        let nodes = ports
            .chunks(4)
            .map(|p| Node {
                port: p[0],
                gcomm: p[1],
                ist: p[2],
                sst: p[3],
                child: None,
            })
            .collect();
        let user = if is_root() {
            Some(os_user("mysql")?)
        } else {
            None
        };
        let mut cluster = Cluster { dir, nodes, user };
        for node in 1..=NODES {
            cluster.write_config(node)?;
        }
        cluster.seed().await?;
        cluster.launch(1, true).await?;
        cluster.wait_synced(1, 1, JOIN).await?;
        // Both joiners at once: each receives its (tiny) IST from node 1.
        cluster.launch(2, false).await?;
        cluster.launch(3, false).await?;
        for node in 1..=NODES {
            cluster.wait_synced(node, NODES, JOIN).await?;
        }
        Ok(cluster)
    }

    fn node(&self, node: usize) -> &Node {
        &self.nodes[node - 1]
    }

    fn data(&self, node: usize) -> PathBuf {
        self.dir.join(format!("data{node}"))
    }

    fn config(&self, node: usize) -> PathBuf {
        self.dir.join(format!("n{node}.cnf"))
    }

    /// A URL of `node` for sqlx (the database `test` exists).
    pub fn url(&self, node: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.node(node).port)
    }

    /// A small pool on `node`.
    pub async fn pool(&self, node: usize, connections: u32) -> Res<MySqlPool> {
        Ok(PoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(20))
            .connect(&self.url(node))
            .await?)
    }

    /// Starts `node`'s mariadbd (as the `mysql` user, in a process group of its own, and
    /// killed if the suite dies); `bootstrap` starts a new cluster.
    async fn launch(&mut self, node: usize, bootstrap: bool) -> Res<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("n{node}.out")))?;
        let mut cmd = dies_with_us(MARIADBD);
        // --defaults-file must come first.
        cmd.arg(format!("--defaults-file={}", self.config(node).display()));
        if bootstrap {
            cmd.arg("--wsrep-new-cluster");
        }
        // Started as the user already: a uid change inside mariadbd would clear the
        // parent-death signal setpriv set.
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd.process_group(0)
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.nodes[node - 1].child = Some(cmd.spawn()?);
        Ok(())
    }

    /// Signals `node`'s process group (SIGTERM: a clean shutdown; SIGKILL: a crash) and
    /// waits until every process of it is gone.
    async fn stop(&mut self, node: usize, how: Signal) -> Res<()> {
        let Some(mut child) = self.nodes[node - 1].child.take() else {
            return Ok(());
        };
        let pid = child.id().ok_or("node already reaped")? as i32;
        signal(-pid, how);
        tokio::time::timeout(JOIN, child.wait())
            .await
            .map_err(|_| format!("node {node} did not stop within {JOIN:?}"))??;
        let deadline = Instant::now() + JOIN;
        while group_alive(pid) {
            ensure!(
                Instant::now() < deadline,
                "processes of node {node} outlived it"
            );
            sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// SIGKILLs `node`'s mariadbd (and whatever it started, such as a state transfer).
    pub async fn kill(&mut self, node: usize) -> Res<()> {
        self.stop(node, Signal::SIGKILL).await
    }

    /// Whether `node`'s process runs.
    pub fn running(&self, node: usize) -> bool {
        self.node(node).child.is_some()
    }

    /// Starts a stopped `node` again (it rejoins the running cluster; the state transfer
    /// it needs is Galera's choice) and waits until it is `Synced` in a cluster of three.
    /// Returns how long that took.
    pub async fn restart(&mut self, node: usize) -> Res<Duration> {
        let started = Instant::now();
        self.launch(node, false).await?;
        self.wait_synced(node, NODES, JOIN).await?;
        Ok(started.elapsed())
    }

    /// A connection of its own to `node`.
    pub async fn connect(&self, node: usize) -> Res<MySqlConnection> {
        Ok(MySqlConnection::connect(&self.url(node)).await?)
    }

    /// Waits until `node` says `Synced` in a cluster of `size`; fails early if its process
    /// exits. Returns how long it waited.
    pub async fn wait_synced(
        &mut self,
        node: usize,
        size: usize,
        within: Duration,
    ) -> Res<Duration> {
        let started = Instant::now();
        loop {
            let port = self.node(node).port;
            let state = async {
                let mut conn =
                    MySqlConnection::connect(&format!("mysql://root@127.0.0.1:{port}")).await?;
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
                      WHERE VARIABLE_NAME IN ('WSREP_LOCAL_STATE_COMMENT', 'WSREP_CLUSTER_SIZE',
                                              'WSREP_READY')",
                )
                .fetch_all(&mut conn)
                .await?;
                conn.close().await?;
                Ok::<_, sqlx::Error>(rows)
            };
            let last = match state.await {
                Ok(rows) => {
                    let get = |name: &str| {
                        rows.iter()
                            .find(|(n, _)| n.eq_ignore_ascii_case(name))
                            .map_or("?", |(_, v)| v.as_str())
                            .to_owned()
                    };
                    let (state, cluster, ready) = (
                        get("wsrep_local_state_comment"),
                        get("wsrep_cluster_size"),
                        get("wsrep_ready"),
                    );
                    if state == "Synced" && ready == "ON" && cluster == size.to_string() {
                        return Ok(started.elapsed());
                    }
                    format!("{state}, cluster size {cluster}, ready {ready}")
                }
                Err(err) => err.to_string(),
            };
            if let Some(status) = self.nodes[node - 1]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.nodes[node - 1].child = None;
                return Err(format!(
                    "node {node} exited ({status}) before it was Synced; its log ends: {}",
                    self.log_tail(node)
                )
                .into());
            }
            ensure!(
                started.elapsed() < within,
                "node {node} not Synced in a cluster of {size} within {within:?} (last: {last}); \
                 its log ends: {}",
                self.log_tail(node)
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines of `node`'s error log, for failure messages.
    pub fn log_tail(&self, node: usize) -> String {
        let log =
            std::fs::read_to_string(self.dir.join(format!("n{node}.err"))).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(3).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            if let Some(pid) = node.child.as_ref().and_then(|c| c.id()) {
                signal(-(pid as i32), Signal::SIGKILL);
            }
        }
        // Give the kernel a moment to close the files before removing them.
        std::thread::sleep(Duration::from_millis(200));
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A global status variable (`wsrep_cluster_size`, ...) of the node `pool` is on.
pub async fn status(pool: &MySqlPool, name: &str) -> Res<String> {
    let value: Option<String> = sqlx::query_scalar(
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?;
    Ok(value.unwrap_or_default())
}
