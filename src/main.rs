//! The `leasekeeper` binary: parse flags, load settings, run a subcommand.

#[cfg(feature = "ssr")]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    use clap::Parser;
    use leasekeeper::cli::{Cli, Command};
    use leasekeeper::settings::Settings;

    leasekeeper::server::init_tracing();
    let cli = Cli::parse();
    let settings = match Settings::load(&cli.settings) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("leasekeeper: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => leasekeeper::server::serve(settings).await,
        Command::Db { action } => leasekeeper::server::db_command(settings, action).await,
        Command::Worker {
            server,
            id,
            history,
            trust_claims,
        } => {
            let faults = leasekeeper::worker::process::FaultOptions {
                history,
                trust_claims,
            };
            leasekeeper::worker::process::run(settings, &server, id, faults).await
        }
        Command::Chaos(args) => leasekeeper::fault::run(settings, args).await,
        Command::Cluster {
            instances,
            base_port,
        } => leasekeeper::cluster::run(settings, instances, base_port).await,
        Command::Bench {
            what,
            quick,
            json,
            charts,
        } => match what {
            None => {
                leasekeeper::bench::queue::suite(
                    settings,
                    leasekeeper::bench::Options {
                        quick,
                        json,
                        charts,
                    },
                )
                .await
            }
            Some(leasekeeper::cli::BenchWhat::Retention {
                tasks,
                prune_older_than_secs,
                prune_every_secs,
                no_baseline,
                json,
            }) => {
                leasekeeper::bench::retention::retention(
                    settings,
                    leasekeeper::bench::retention::RetentionOptions {
                        tasks,
                        retention: std::time::Duration::from_secs(prune_older_than_secs.max(1)),
                        interval: std::time::Duration::from_secs(prune_every_secs.max(1)),
                        baseline: !no_baseline,
                        json,
                    },
                )
                .await
            }
            Some(leasekeeper::cli::BenchWhat::Dashboard { quick, json }) => {
                leasekeeper::bench::dashboard::dashboard(
                    settings,
                    leasekeeper::bench::Options {
                        quick,
                        json,
                        charts: None,
                    },
                )
                .await
            }
        },
        Command::BenchRuntime {
            concurrency,
            seconds,
            id,
        } => {
            leasekeeper::bench::queue::runtime_process(
                &settings,
                usize::from(concurrency),
                seconds,
                &id,
            )
            .await
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasekeeper: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "ssr"))]
fn main() {
    // The browser bundle starts from `hydrate()` in lib.rs.
}
