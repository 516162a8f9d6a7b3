//! The demo's task generator, as this server configures it. The runtime,
//! its types and its SQL are the library's ([`leasekeeper_core::generator`]).

#[cfg(feature = "ssr")]
use crate::settings::Settings;
#[cfg(feature = "ssr")]
use leasekeeper_core::generator::runtime::GeneratorConfig;
#[cfg(feature = "ssr")]
use leasekeeper_core::lease::client::LeaseTiming;

/// The generator's configuration from the program's settings: the lease of
/// every other singleton here (TTL, renew interval, a tenth of the TTL as
/// safety margin), the interval and the generated tasks' limits; the tasks
/// are the simulated workers' kind.
#[cfg(feature = "ssr")]
pub fn config(settings: &Settings) -> GeneratorConfig {
    let timing = LeaseTiming {
        ttl: settings.lease_ttl,
        renew_interval: settings.renew_interval,
        safety_margin: settings.lease_ttl / 10,
    };
    GeneratorConfig::new(
        timing,
        settings.generator_interval,
        settings.max_attempts,
        settings.generator_max_sleep,
        leasekeeper_core::worker::simulated::KIND,
    )
}
