//! `leasekeeper-tools cluster`: several instances on consecutive ports against one
//! database, for the failover demo. Each instance is a separate process (so
//! `kill -9` of one is a real crash); the database is shared, started first
//! and owned by this command, so no instance takes it down when it dies.

use anyhow::Context;
use leasekeeper_core::db::Database;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::process::Child;

/// Starts the database (the configured one, or the embedded cluster), then
/// `instances` children of this binary on `base_port`, `base_port + 1`, ...,
/// and waits. A child that dies is reported and left dead: that is the
/// demo. Ctrl-C or SIGTERM stops every child, then the embedded cluster.
pub async fn run(
    settings: leasekeeper::settings::Settings,
    instances: u16,
    base_port: u16,
) -> anyhow::Result<()> {
    let last_port = base_port
        .checked_add(instances - 1)
        .context("--base-port plus --instances runs past port 65535")?;
    let db = Database::open(
        settings.database_url.as_ref().map(|u| u.expose()),
        &settings.data_dir,
        &settings.schema,
    )
    .await?;
    let url = match (&settings.database_url, &db.embedded) {
        (Some(url), _) => url.expose().to_string(),
        (None, Some(cluster)) => cluster.url(leasekeeper_core::db::EMBEDDED_DATABASE),
        (None, None) => anyhow::bail!("no database URL and no embedded cluster"),
    };
    let mut children: BTreeMap<u16, Child> = BTreeMap::new();
    for port in base_port..=last_port {
        let child = crate::dashboard_command()?
            .arg("serve")
            .arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .env("DATABASE_URL", &url)
            .envs(settings.to_env())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the instance on port {port}"))?;
        println!(
            "instance on http://127.0.0.1:{port}  (pid {})",
            child.id().unwrap_or_default()
        );
        children.insert(port, child);
    }
    println!("database: {url}");
    println!("Ctrl-C stops them all. Kill one (kill -9 <pid>) to watch another take over.");

    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let stop = leasekeeper::signals::shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                let mut gone = Vec::new();
                for (port, child) in children.iter_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        tracing::warn!(port, %status, "instance exited");
                        gone.push(*port);
                    }
                }
                for port in gone {
                    children.remove(&port);
                }
            }
        }
    }
    for (port, child) in children.iter_mut() {
        if let Some(pid) = child.id() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or_default());
            if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
                tracing::warn!(port, error = %e, "cannot signal instance");
            }
        }
    }
    for (port, mut child) in children {
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(port, "instance did not stop in 10 s; killing it");
                let _ = child.kill().await;
            }
        }
    }
    db.close().await
}
