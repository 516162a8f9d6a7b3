//! The configuration files of the highly available database: each node's
//! Patroni file and libfaketime wrapper around `postgres`, HAProxy's file.

use super::{LIBFAKETIME, Node, PG_BIN, Replication, SUPERUSER};
use anyhow::Result;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use std::path::Path;

pub(super) fn options(port: u16, database: &str) -> PgConnectOptions {
    PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username(SUPERUSER)
        .database(database)
        .ssl_mode(PgSslMode::Disable)
        .application_name("leasekeeper-chaos")
}

pub(super) fn chown_tree(path: &Path, owner: (nix::unistd::Uid, nix::unistd::Gid)) -> Result<()> {
    // lchown: the links in `bin/` point at the system's binaries, which
    // must keep their owner.
    std::os::unix::fs::lchown(path, Some(owner.0.as_raw()), Some(owner.1.as_raw()))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), owner)?;
        }
    }
    Ok(())
}

/// A `bin/` folder whose `postgres` runs the real one under libfaketime
/// (offset from the node's `skew` file); the other binaries are links.
pub(super) fn write_postgres_wrapper(node: &Node) -> Result<()> {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let bin = node.dir.join("bin");
    for entry in std::fs::read_dir(PG_BIN)? {
        let entry = entry?;
        if entry.file_name() != "postgres" {
            symlink(entry.path(), bin.join(entry.file_name()))?;
        }
    }
    let wrapper = bin.join("postgres");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             # PostgreSQL under libfaketime: the clock offset comes from {skew}\n\
             export LD_PRELOAD={LIBFAKETIME}\n\
             export FAKETIME_TIMESTAMP_FILE={skew}\n\
             export FAKETIME_CACHE_DURATION=1\n\
             export FAKETIME_DONT_FAKE_MONOTONIC=1\n\
             export DONT_FAKE_MONOTONIC=1\n\
             exec {PG_BIN}/postgres \"$@\"\n",
            skew = node.skew_file().display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

pub(super) fn patroni_config(node: &Node, etcd_port: u16, replication: Replication) -> String {
    let sync = replication == Replication::Sync;
    format!(
        r#"scope: leasekeeper-chaos
name: {name}
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    # Fast failover on one machine: the leader key lives 5 s, each node
    # looks every second, and etcd and PostgreSQL calls give up after 2 s
    # (Patroni wants loop_wait + 2 x retry_timeout <= ttl).
    ttl: 5
    loop_wait: 1
    retry_timeout: 2
    maximum_lag_on_failover: 1048576
    synchronous_mode: {sync}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 200
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  remove_data_directory_on_rewind_failure: true
  authentication:
    superuser:
      username: {SUPERUSER}
      password: leasekeeper
    replication:
      username: replicator
      password: replicator
    rewind:
      username: {SUPERUSER}
      password: leasekeeper
  parameters:
    unix_socket_directories: {dir}
tags:
  nofailover: false
  noloadbalance: false
"#,
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        data = node.data_dir().display(),
        bin = node.dir.join("bin").display(),
        dir = node.dir.display(),
    )
}

pub(super) fn haproxy_config(port: u16, nodes: &[Node]) -> String {
    let mut servers = String::new();
    for node in nodes {
        servers.push_str(&format!(
            "    server {} 127.0.0.1:{} maxconn 500 check port {}\n",
            node.name, node.pg_port, node.rest_port
        ));
    }
    format!(
        "global\n    maxconn 1000\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n    timeout server 30m\n    timeout check 1s\n\n\
         listen primary\n    bind 127.0.0.1:{port}\n    option httpchk OPTIONS /primary\n    http-check expect status 200\n    \
         default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n{servers}"
    )
}
