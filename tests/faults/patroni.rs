//! A Patroni-managed PostgreSQL for scenario group 11: one etcd (the DCS), two Patroni
//! nodes running PostgreSQL 15 as the `postgres` user (a primary and, with
//! `synchronous_mode: true`, a synchronous standby), and HAProxy in front as "the address
//! that follows the primary": it sends new connections to the node whose Patroni REST API
//! answers 200 on `/primary`, and cuts the sessions of a node it marks down
//! (`on-marked-down shutdown-sessions`), so that pools reconnect instead of writing into
//! a demoted node.
//!
//! Everything runs as private processes on free loopback ports in a temporary directory,
//! from Debian's packages (patroni 3.0.2, etcd-server 3.4, haproxy 2.6), never touching
//! the machine's PostgreSQL. The [`Cluster`] kills every process it started (Patroni, the
//! postmasters Patroni starts in sessions of their own, etcd, HAProxy) and removes its
//! directory when dropped, also after a failed or hung scenario.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

use crate::holder::wall_micros;
use crate::patroni_config::{haproxy_cfg, patroni_yml};
use crate::patroni_io::http;
use crate::server::{PG_BIN, dies_with_us, free_ports, group_alive, is_root, os_user, signal};
use crate::{Res, eventually};

const PATRONI: &str = "/usr/bin/patroni";
const ETCD: &str = "/usr/bin/etcd";
const HAPROXY: &str = "/usr/sbin/haproxy";

/// Node names: Patroni's `name`, and `application_name` in `synchronous_standby_names`.
const NAMES: [&str; 2] = ["pg1", "pg2"];
/// Bootstrap (initdb, base backup) or a rejoin after a crash (pg_rewind) on a busy box.
const STARTUP: Duration = Duration::from_secs(75);

/// Whether patroni, etcd and haproxy are installed (the PostgreSQL binaries too).
pub fn missing() -> Vec<&'static str> {
    [
        (PATRONI, "patroni"),
        (ETCD, "etcd-server"),
        (HAPROXY, "haproxy"),
    ]
    .into_iter()
    .chain([(PG_BIN, "postgresql-15")])
    .filter(|(path, _)| !Path::new(path).exists())
    .map(|(_, package)| package)
    .collect()
}

/// One Patroni node.
struct Node {
    name: &'static str,
    pg_port: u16,
    rest_port: u16,
    /// Its configuration, logs and data directory.
    dir: PathBuf,
    /// `None` once killed, until [`Cluster::healthy`] starts it again.
    patroni: Option<Child>,
}

impl Node {
    /// The process group of the node's postmaster (and its backends), if one runs: Patroni
    /// starts it in a session of its own, so that it outlives a Patroni restart.
    fn postmaster_group(&self) -> Option<i32> {
        let pidfile = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        let pid: i32 = pidfile.lines().next()?.trim().parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // pid (comm) state ppid pgrp ...: a stale pid reused by another program is not it.
        let (comm, rest) = stat.split_once(") ")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        (comm.ends_with("(postgres") && fields.first() != Some(&"Z"))
            .then(|| fields.get(2)?.parse().ok())
            .flatten()
    }
}

/// A node [`Cluster::kill_primary`] killed, and when the signals went.
pub struct Killed {
    pub node: usize,
    pub at: Instant,
    /// The same instant by the wall clock (µs), which the database's clock is.
    pub wall: i64,
}

/// etcd, two Patroni nodes and HAProxy; see the module docs.
pub struct Cluster {
    dir: PathBuf,
    etcd: Option<Child>,
    haproxy: Option<Child>,
    nodes: Vec<Node>,
    /// HAProxy's port: what clients connect to.
    port: u16,
    etcd_port: u16,
    etcd_peer_port: u16,
}

impl Cluster {
    /// Starts etcd, both nodes and HAProxy; returns once there is a primary, a
    /// synchronous standby, and HAProxy routes to the primary.
    pub async fn start() -> Res<Cluster> {
        let dir = std::env::temp_dir().join(format!(
            "dblock-faults-{}-patroni-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut ports = free_ports(3 + 2 * NAMES.len())?.into_iter();
        let mut port = || ports.next().expect("a port for each");
        let mut cluster = Cluster {
            dir,
            etcd: None,
            haproxy: None,
            nodes: Vec::new(),
            port: port(),
            etcd_port: port(),
            etcd_peer_port: port(),
        };
        for name in NAMES {
            let node_dir = cluster.dir.join(name);
            std::fs::create_dir_all(&node_dir)?;
            cluster.nodes.push(Node {
                name,
                pg_port: port(),
                rest_port: port(),
                dir: node_dir,
                patroni: None,
            });
        }
        if is_root() {
            let (uid, gid) = os_user("postgres")?;
            for path in [&cluster.dir]
                .into_iter()
                .chain(cluster.nodes.iter().map(|n| &n.dir))
            {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
            }
        }
        cluster.start_etcd().await?;
        for index in 0..cluster.nodes.len() {
            cluster.write_config(index)?;
            cluster.start_node(index)?;
        }
        cluster.start_haproxy()?;
        cluster.healthy().await?;
        Ok(cluster)
    }

    /// The URL dblock uses: through HAProxy.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A node's name.
    pub fn name(&self, index: usize) -> &'static str {
        self.nodes[index].name
    }

    /// Starts the Patroni of every killed node again (it rewinds or re-clones its data and
    /// follows the primary), then waits until one node is the primary, the other its
    /// synchronous standby, and HAProxy sends new connections to the primary.
    pub async fn healthy(&mut self) -> Res<Duration> {
        let started = Instant::now();
        for index in 0..self.nodes.len() {
            if self.nodes[index].patroni.is_none() {
                self.start_node(index)?;
            }
        }
        eventually("a primary and a sync standby", STARTUP, async || {
            self.all_running()?;
            let Some(primary) = self.primary().await else {
                return Ok(false);
            };
            let standby = 1 - primary;
            Ok(self.answers(standby, "/sync").await && self.routes_to(primary).await)
        })
        .await
        .map_err(|err| self.with_logs(err))?;
        Ok(started.elapsed())
    }

    /// The node whose REST API answers 200 on `/primary`, if one does.
    pub async fn primary(&self) -> Option<usize> {
        for index in 0..self.nodes.len() {
            if self.answers(index, "/primary").await {
                return Some(index);
            }
        }
        None
    }

    /// Waits until `index` is the primary and HAProxy routes new connections to it.
    pub async fn wait_primary(&self, index: usize, within: Duration) -> Res<Duration> {
        let what = format!("{} as primary behind HAProxy", self.name(index));
        eventually(&what, within, async || {
            Ok(self.answers(index, "/primary").await && self.routes_to(index).await)
        })
        .await
        .map_err(|err| self.with_logs(err))
    }

    /// A planned switchover to the synchronous standby through the REST API (what
    /// `patronictl switchover` sends); returns the new primary once HAProxy routes to it.
    pub async fn switchover(&self) -> Res<usize> {
        let from = self
            .primary()
            .await
            .ok_or("no primary to switch over from")?;
        let to = 1 - from;
        let body = format!(
            r#"{{"leader": "{}", "candidate": "{}"}}"#,
            self.name(from),
            self.name(to)
        );
        // Patroni answers once the leader key moved (it polls up to 20 s); "status
        // unknown" (503) on a slow etcd is judged by the wait below.
        let (status, text) = http(
            self.nodes[from].rest_port,
            "POST",
            "/switchover",
            &body,
            Duration::from_secs(30),
        )
        .await?;
        ensure!(
            status == 200 || text.contains("status unknown"),
            "switchover refused ({status}): {text}"
        );
        self.wait_primary(to, STARTUP).await?;
        Ok(to)
    }

    /// SIGKILLs the primary's Patroni and its postmaster with its backends, as a crash of
    /// that machine would; returns once all of them are gone. The node stays down until
    /// [`healthy`](Self::healthy).
    pub async fn kill_primary(&mut self) -> Res<Killed> {
        let index = self.primary().await.ok_or("no primary to kill")?;
        let node = &mut self.nodes[index];
        let postmaster = node
            .postmaster_group()
            .ok_or("the primary has no live postmaster")?;
        let mut patroni = node.patroni.take().ok_or("the primary's Patroni is down")?;
        let pid = patroni.id().ok_or("Patroni already reaped")? as i32;
        let (at, wall) = (Instant::now(), wall_micros());
        signal(-pid, Signal::SIGKILL);
        signal(-postmaster, Signal::SIGKILL);
        timeout(Duration::from_secs(10), patroni.wait()).await??;
        eventually(
            "the killed postmaster is gone",
            Duration::from_secs(10),
            async || Ok(!group_alive(postmaster) && !group_alive(pid)),
        )
        .await?;
        Ok(Killed {
            node: index,
            at,
            wall,
        })
    }

    /// Fails at once (with the logs) when a node's Patroni has exited: waiting would not
    /// bring it back.
    fn all_running(&mut self) -> Res<()> {
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            if let Some(status) = node
                .patroni
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let err = format!("{}'s Patroni exited ({status})", node.name);
                return Err(self.with_logs(err.into()));
            }
        }
        Ok(())
    }

    /// Whether a node's REST API answers 200 on `path` (within 2 s).
    async fn answers(&self, index: usize, path: &str) -> bool {
        let port = self.nodes[index].rest_port;
        matches!(
            http(port, "GET", path, "", Duration::from_secs(2)).await,
            Ok((200, _))
        )
    }

    /// Whether a new connection through HAProxy reaches `index`, writable.
    async fn routes_to(&self, index: usize) -> bool {
        use sqlx::Connection;
        let probe = async {
            let mut conn = sqlx::PgConnection::connect(&self.url()).await?;
            let (port, standby): (i32, bool) =
                sqlx::query_as("SELECT inet_server_port(), pg_is_in_recovery()")
                    .fetch_one(&mut conn)
                    .await?;
            conn.close().await.ok();
            Ok::<_, sqlx::Error>(port == i32::from(self.nodes[index].pg_port) && !standby)
        };
        matches!(timeout(Duration::from_secs(3), probe).await, Ok(Ok(true)))
    }

    async fn start_etcd(&mut self) -> Res<()> {
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{}", self.etcd_peer_port);
        let mut cmd = dies_with_us(ETCD);
        cmd.args(["--name", "e1", "--data-dir"])
            .arg(self.dir.join("etcd"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("e1={peer}")]);
        self.etcd = Some(self.spawn(cmd, "etcd.log", false)?);
        let port = self.etcd_port;
        eventually("etcd answers", STARTUP, async || {
            Ok(matches!(
                http(port, "GET", "/health", "", Duration::from_secs(2)).await,
                Ok((200, _))
            ))
        })
        .await?;
        Ok(())
    }

    fn start_node(&mut self, index: usize) -> Res<()> {
        let node = &self.nodes[index];
        let mut cmd = dies_with_us(PATRONI);
        cmd.arg(node.dir.join("patroni.yml"))
            .env("HOME", &node.dir)
            .current_dir(&node.dir);
        let child = self.spawn(cmd, &format!("{}/patroni.log", node.name), true)?;
        self.nodes[index].patroni = Some(child);
        Ok(())
    }

    fn start_haproxy(&mut self) -> Res<()> {
        let servers: Vec<_> = self
            .nodes
            .iter()
            .map(|n| (n.name, n.pg_port, n.rest_port))
            .collect();
        let path = self.dir.join("haproxy.cfg");
        std::fs::write(&path, haproxy_cfg(self.port, &servers))?;
        let mut cmd = dies_with_us(HAPROXY);
        cmd.arg("-db").arg("-f").arg(path);
        self.haproxy = Some(self.spawn(cmd, "haproxy.log", false)?);
        Ok(())
    }

    fn write_config(&self, index: usize) -> Res<()> {
        let node = &self.nodes[index];
        let config = patroni_yml(
            node.name,
            node.rest_port,
            self.etcd_port,
            node.pg_port,
            &node.dir,
        );
        std::fs::write(node.dir.join("patroni.yml"), config)?;
        Ok(())
    }

    /// Starts `cmd` in a process group of its own with its output in `log` (under the
    /// cluster's directory), as the `postgres` user if `as_postgres` and we are root.
    fn spawn(&self, mut cmd: Command, log: &str, as_postgres: bool) -> Res<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(log))?;
        if as_postgres && is_root() {
            let (uid, gid) = os_user("postgres")?;
            cmd.uid(uid).gid(gid);
        }
        cmd.process_group(0)
            .kill_on_drop(true)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        Ok(cmd.spawn()?)
    }

    /// `err` with the last lines of each Patroni log: why a wait failed is in there, and
    /// the directory goes with the cluster.
    fn with_logs(
        &self,
        err: Box<dyn std::error::Error + Send + Sync>,
    ) -> Box<dyn std::error::Error + Send + Sync> {
        let tails: Vec<String> = self
            .nodes
            .iter()
            .map(|node| {
                let log = std::fs::read_to_string(node.dir.join("patroni.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                format!(
                    "{}: {}",
                    node.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )
            })
            .collect();
        format!("{err}; Patroni logs end: {}", tails.join(" || ")).into()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut groups = Vec::new();
        for node in &self.nodes {
            groups.extend(node.patroni.as_ref().and_then(Child::id).map(|p| p as i32));
            groups.extend(node.postmaster_group());
        }
        for child in [&self.haproxy, &self.etcd].into_iter().flatten() {
            groups.extend(child.id().map(|p| p as i32));
        }
        // Patroni first (in the same breath): it would start a killed postmaster again.
        for group in &groups {
            signal(-group, Signal::SIGKILL);
        }
        // The directories must not go while a postmaster still writes into them.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while groups.iter().any(|g| group_alive(*g)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
