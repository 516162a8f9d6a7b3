//! Whether the settings may serve beyond loopback: nothing is open to a
//! network unless someone said so knowingly.

use super::keys::{ADMIN_TOKEN, OPEN_NETWORK, SITE_ADDR, WORKER_TOKEN};
use super::{Settings, SettingsError};

/// Who can reach what the settings serve, once checked by
/// [`Settings::check_exposure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Bound to a loopback address: only this machine's users reach it.
    Loopback,
    /// Beyond loopback, with a token locking the workers' and operators'
    /// routes.
    Locked,
    /// Beyond loopback without any token, because `open_network` says so.
    OpenByChoice,
}

impl Settings {
    /// Refuses to serve a non-loopback address (`0.0.0.0`, `::`, a LAN
    /// address) with neither the admin nor the worker token set, unless
    /// `open_network` says that is meant: anyone on the network could
    /// otherwise complete, cancel and read every task. A pure check, made
    /// before anything is opened or created.
    pub fn check_exposure(&self) -> Result<Exposure, SettingsError> {
        let ip = self.site_addr.ip().to_canonical();
        if ip.is_loopback() {
            return Ok(Exposure::Loopback);
        }
        if self.admin_token.is_some() || self.worker_token.is_some() {
            return Ok(Exposure::Locked);
        }
        if self.open_network {
            return Ok(Exposure::OpenByChoice);
        }
        Err(SettingsError(format!(
            "{}: {} is not a loopback address and no token is set, so anyone who can reach it could use every route; \
             set {} (operators) and {} (workers), or set {}=true to serve it open knowingly, or listen on 127.0.0.1",
            SITE_ADDR.describe(),
            self.site_addr,
            ADMIN_TOKEN.env,
            WORKER_TOKEN.env,
            OPEN_NETWORK.env,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::Exposure;
    use crate::settings::{SettingArgs, Settings};

    fn at(addr: &str, adjust: impl FnOnce(&mut Settings)) -> Result<Exposure, String> {
        let args = SettingArgs {
            site_addr: Some(addr.into()),
            ..SettingArgs::default()
        };
        let mut s = Settings::resolve(None, std::path::Path::new("none"), &args).unwrap();
        adjust(&mut s);
        s.check_exposure().map_err(|e| e.to_string())
    }

    #[test]
    fn loopback_is_served_without_a_token() {
        for addr in [
            "127.0.0.1:3000",
            "127.0.0.2:3000",
            "[::1]:3000",
            "[::ffff:127.0.0.1]:3000",
        ] {
            assert_eq!(at(addr, |_| {}), Ok(Exposure::Loopback), "{addr}");
        }
    }

    #[test]
    fn beyond_loopback_without_a_token_is_refused_naming_the_settings() {
        for addr in [
            "0.0.0.0:3000",
            "[::]:3000",
            "192.168.1.5:3000",
            "10.0.0.1:80",
        ] {
            let err = at(addr, |_| {}).unwrap_err();
            for name in [
                "LEASEKEEPER_ADMIN_TOKEN",
                "LEASEKEEPER_WORKER_TOKEN",
                "LEASEKEEPER_OPEN_NETWORK",
            ] {
                assert!(err.contains(name), "{addr}: {err}");
            }
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn a_token_or_open_network_lets_it_start() {
        assert_eq!(
            at("0.0.0.0:3000", |s| s.admin_token =
                Some("admin-secret-0123456789".into())),
            Ok(Exposure::Locked)
        );
        assert_eq!(
            at("0.0.0.0:3000", |s| s.worker_token =
                Some("worker-secret-0123456789".into())),
            Ok(Exposure::Locked)
        );
        assert_eq!(
            at("[::]:3000", |s| s.open_network = true),
            Ok(Exposure::OpenByChoice)
        );
    }
}
