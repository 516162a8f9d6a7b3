//! The `leasekeeper` binary: parse flags, load settings, run a subcommand
//! ([`leasekeeper::cli::main`]).

#[cfg(feature = "ssr")]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    leasekeeper::server::init_tracing();
    leasekeeper::cli::main(std::env::args_os()).await
}

#[cfg(not(feature = "ssr"))]
fn main() {
    // The browser bundle starts from `hydrate()` in lib.rs.
}
