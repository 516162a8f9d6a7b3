//! The `leasekeeper-tools` binary: parse flags, load settings, run a tool;
//! or, as `leasekeeper-tools dashboard …`, be `leasekeeper …` (how the
//! harnesses start instances and workers of their own build).

use clap::Parser;
use leasekeeper::settings::Settings;
use leasekeeper_tools::cli::{BenchWhat, Cli, Command};
use leasekeeper_tools::{DASHBOARD, bench, cluster, fault};
use std::process::ExitCode;
use std::time::Duration;

#[tokio::main]
async fn main() -> ExitCode {
    leasekeeper::server::init_tracing();
    let mut args: Vec<_> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == DASHBOARD) {
        args.remove(1);
        return leasekeeper::cli::main(args).await;
    }
    let cli = Cli::parse_from(args);
    let settings = match Settings::load(&cli.settings) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("leasekeeper-tools: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Chaos(args) => fault::run(settings, args).await,
        Command::Cluster {
            instances,
            base_port,
        } => cluster::run(settings, instances, base_port).await,
        Command::Bench {
            what,
            quick,
            json,
            charts,
        } => match what {
            None => {
                bench::queue::suite(
                    settings,
                    bench::Options {
                        quick,
                        json,
                        charts,
                    },
                )
                .await
            }
            Some(BenchWhat::Retention {
                tasks,
                prune_older_than_secs,
                prune_every_secs,
                no_baseline,
                json,
            }) => {
                bench::retention::retention(
                    settings,
                    bench::retention::RetentionOptions {
                        tasks,
                        retention: Duration::from_secs(prune_older_than_secs.max(1)),
                        interval: Duration::from_secs(prune_every_secs.max(1)),
                        baseline: !no_baseline,
                        json,
                    },
                )
                .await
            }
            Some(BenchWhat::Peers {
                quick,
                bulk_only,
                json,
            }) => {
                bench::queue::peers::suite(
                    settings,
                    bench::Options::without_charts(quick, json),
                    bulk_only,
                )
                .await
            }
            Some(BenchWhat::Tune { quick, only, json }) => {
                bench::queue::tune::tune(
                    settings,
                    bench::Options::without_charts(quick, json),
                    only.as_deref(),
                )
                .await
            }
            Some(BenchWhat::Rescue { kills, json }) => {
                bench::queue::rescue_only(
                    settings,
                    usize::from(kills),
                    bench::Options::without_charts(false, json),
                )
                .await
            }
            Some(BenchWhat::Floor { quick, json }) => {
                bench::queue::peers::floor(settings, bench::Options::without_charts(quick, json))
                    .await
            }
            Some(BenchWhat::Limits { quick, json }) => {
                bench::queue::peers::limits(settings, bench::Options::without_charts(quick, json))
                    .await
            }
            Some(BenchWhat::Fleet { quick, json }) => {
                bench::queue::fleet_only(settings, bench::Options::without_charts(quick, json))
                    .await
            }
            Some(BenchWhat::Dashboard {
                quick,
                pixel_only,
                json,
            }) => {
                bench::dashboard::dashboard(
                    settings,
                    bench::Options::without_charts(quick, json),
                    pixel_only,
                )
                .await
            }
        },
        Command::BenchRuntime {
            concurrency,
            seconds,
            id,
            runtime_prefetch,
            runtime_linger_us,
            runtime_batch_max,
        } => {
            let runtime = bench::queue::RuntimeSettings::with(
                runtime_prefetch,
                runtime_linger_us,
                runtime_batch_max,
            );
            bench::queue::runtime_process(
                &settings,
                usize::from(concurrency),
                runtime,
                seconds,
                &id,
            )
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasekeeper-tools: {e:#}");
            ExitCode::FAILURE
        }
    }
}
