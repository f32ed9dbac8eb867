//! The configuration files of the Patroni cluster (patroni.rs): each node's patroni.yml
//! and HAProxy's, with the timings scenario group 11 reports. The recipe was verified on
//! this machine first (shared/docs/ha-facts.md, section B).

use std::path::Path;

use crate::server::PG_BIN;

/// How long the leader key lives in etcd unless the primary's Patroni renews it: a crash
/// failover takes about this long plus a loop. Patroni's default is 30 (10 for
/// `loop_wait` and `retry_timeout`); these keep its documented rule
/// `loop_wait + 2 * retry_timeout <= ttl`, so a primary whose etcd call times out once
/// and is retried is not demoted for it.
pub const TTL: u64 = 10;
/// Seconds between two runs of Patroni's HA loop.
pub const LOOP_WAIT: u64 = 1;
/// How long Patroni retries etcd and PostgreSQL calls before it gives up on them.
pub const RETRY_TIMEOUT: u64 = 4;
/// HAProxy's health check: every second, a node is down after 2 failed checks (about
/// 2 s) and up after 1 good one.
pub const CHECK: &str = "inter 1s fall 2 rise 1";

/// A node's patroni.yml: small timings, synchronous mode, pg_rewind for a crashed
/// primary's return, trust on loopback (the suite's servers use no passwords).
pub fn patroni_yml(name: &str, rest: u16, etcd: u16, pg: u16, dir: &Path) -> String {
    let dir = dir.display();
    format!(
        r#"scope: dblock-faults
name: {name}
restapi: {{listen: "127.0.0.1:{rest}", connect_address: "127.0.0.1:{rest}"}}
etcd3: {{hosts: "127.0.0.1:{etcd}"}}
watchdog: {{mode: "off"}}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters: {{synchronous_commit: "on", wal_level: replica, hot_standby: "on",
                   max_wal_senders: 10, max_replication_slots: 10, wal_log_hints: "on",
                   max_connections: 200}}
  initdb: [{{encoding: UTF8}}, {{locale: C}}]
postgresql:
  listen: "127.0.0.1:{pg}"
  connect_address: "127.0.0.1:{pg}"
  data_dir: {dir}/data
  bin_dir: {PG_BIN}
  pgpass: {dir}/pgpass
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  basebackup: [{{checkpoint: fast}}]
  pg_hba: ["local all all trust", "host replication all 127.0.0.1/32 trust",
           "host all all 127.0.0.1/32 trust"]
  authentication:
    replication: {{username: replicator, password: replicator}}
    superuser: {{username: postgres, password: postgres}}
    rewind: {{username: rewinder, password: rewinder}}
  # fsync off: only processes are killed here, never the machine, and the kernel still
  # has every write (as in server.rs).
  parameters: {{unix_socket_directories: "{dir}", shared_buffers: 16MB, fsync: "off"}}
"#
    )
}

/// HAProxy's configuration: `port` leads to whichever of `servers` (name, PostgreSQL
/// port, REST port) answers 200 on `/primary`; the sessions of a server marked down are
/// cut, so that pools reconnect to the new primary instead of writing into a standby.
pub fn haproxy_cfg(port: u16, servers: &[(&str, u16, u16)]) -> String {
    let servers: String = servers
        .iter()
        .map(|(name, pg, rest)| format!("    server {name} 127.0.0.1:{pg} check port {rest}\n"))
        .collect();
    format!(
        "global\n    maxconn 500\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n    \
         timeout server 30m\n    timeout check 2s\n\
         listen pg_primary\n    bind 127.0.0.1:{port}\n    option httpchk GET /primary\n    \
         http-check expect status 200\n    \
         default-server {CHECK} on-marked-down shutdown-sessions\n{servers}"
    )
}
