//! Setting up the cluster's directory (part of galera.rs): one configuration file per
//! node, and node 1's data directory, bootstrapped once, copied to nodes 2 and 3.

use std::process::Stdio;

use nix::sys::signal::Signal;
use sqlx::{Connection, MySqlConnection};
use tokio::process::Command;

use super::{Cluster, JOIN, NODES, PROVIDER};
use crate::Res;
use crate::server::MARIADB_INSTALL_DB;

impl Cluster {
    pub(super) fn write_config(&self, node: usize) -> Res<()> {
        let n = self.node(node);
        let members: Vec<String> = self
            .nodes
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.gcomm))
            .collect();
        let dir = self.dir.display();
        let config = format!(
            "[mariadbd]
user=mysql
datadir={data}
socket={dir}/n{node}.sock
pid-file={dir}/n{node}.pid
log-error={dir}/n{node}.err
port={port}
bind-address=127.0.0.1
skip-name-resolve
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
# Linux AIO contexts are a machine-wide limit shared with others.
innodb_use_native_aio=0
innodb_flush_log_at_trx_commit=2
innodb_autoinc_lock_mode=2
default_storage_engine=InnoDB
binlog_format=ROW
max_connections=300
wsrep_on=ON
wsrep_provider={PROVIDER}
wsrep_cluster_name=dblock-faults
wsrep_cluster_address=gcomm://{members}
wsrep_node_name=n{node}
wsrep_node_address=127.0.0.1:{gcomm}
wsrep_provider_options=\"base_host=127.0.0.1;base_port={gcomm};ist.recv_addr=127.0.0.1:{ist};gcache.size=32M\"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:{sst}
",
            data = self.data(node).display(),
            port = n.port,
            members = members.join(","),
            gcomm = n.gcomm,
            ist = n.ist,
            sst = n.sst,
        );
        std::fs::write(self.config(node), config)?;
        Ok(())
    }

    /// Makes node 1's data directory (one bootstrap, so it carries the cluster's identity
    /// and the database `test`) and copies it to nodes 2 and 3.
    pub(super) async fn seed(&mut self) -> Res<()> {
        self.own()?;
        let mut install = Command::new(MARIADB_INSTALL_DB);
        install
            .arg(format!("--defaults-file={}", self.config(1).display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        self.run_tool(install, "mariadb-install-db").await?;
        self.launch(1, true).await?;
        self.wait_synced(1, 1, JOIN).await?;
        let mut admin =
            MySqlConnection::connect(&format!("mysql://root@127.0.0.1:{}", self.node(1).port))
                .await?;
        sqlx::query("CREATE DATABASE IF NOT EXISTS test")
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        self.stop(1, Signal::SIGTERM).await?;
        for node in 2..=NODES {
            let mut copy = Command::new("cp");
            copy.arg("-a").arg(self.data(1)).arg(self.data(node));
            self.run_tool(copy, "copying node 1's data directory")
                .await?;
            // The copies must not think they may bootstrap, nor remember a view.
            std::fs::remove_file(self.data(node).join("gvwstate.dat")).ok();
            let state = self.data(node).join("grastate.dat");
            let text = std::fs::read_to_string(&state)?;
            std::fs::write(
                &state,
                text.replace("safe_to_bootstrap: 1", "safe_to_bootstrap: 0"),
            )?;
        }
        std::fs::remove_file(self.data(1).join("gvwstate.dat")).ok();
        self.own()
    }

    /// Hands the whole directory to the `mysql` user (when running as root).
    fn own(&self) -> Res<()> {
        let Some((uid, gid)) = self.user else {
            return Ok(());
        };
        let mut pending = vec![self.dir.clone()];
        while let Some(path) = pending.pop() {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            if path.is_dir() && !path.is_symlink() {
                pending.extend(std::fs::read_dir(&path)?.flatten().map(|e| e.path()));
            }
        }
        Ok(())
    }

    /// Runs a set-up tool as the nodes' user; fails with the end of its output.
    pub(super) async fn run_tool(&self, mut cmd: Command, what: &str) -> Res<()> {
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd.stdin(Stdio::null()).output().await?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            return Err(format!(
                "{what} failed ({}): {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
            .into());
        }
        Ok(())
    }
}
